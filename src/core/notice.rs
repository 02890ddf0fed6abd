//! One subscriber connection to one node, without its socket: the side connection on
//! which a client hears the release notices of the resources its waiters want, so a
//! waiter tries again the moment the holder releases instead of at its next poll.
//!
//! The release scripts (`core::script`) publish an empty message on
//! [`RELEASED_PREFIX`] + key for each key they delete. A [`Subscriber`] keeps a count of
//! waiters per key ([`Subscriber::want`] / [`Subscriber::unwant`]), subscribes to a key's
//! channel when its count goes from 0 to 1 and unsubscribes when it falls back to 0, and
//! turns the node's `message` pushes into [`Notice`]s ([`Subscriber::next_notice`]).
//!
//! The driver owns the socket. After opening a connection it calls
//! [`Subscriber::opened`], writes what [`Subscriber::outbox`] holds whenever the socket is
//! writable and reports [`Subscriber::consumed`]; it reads into
//! [`Subscriber::read_room`] and reports [`Subscriber::received`], then drains
//! [`Subscriber::next_notice`]. On any error, or when the socket fails, it calls
//! [`Subscriber::closed`] and reconnects later; the wanted keys survive, and the next
//! [`Subscriber::opened`] subscribes them all again in one write. A notice is only ever a
//! hint: a missed one (the connection was down) costs the waiter its poll interval, never
//! safety, so nothing here needs to be exact about which notices arrive.
//!
//! # Invariants
//!
//! - Nothing here reads a clock or touches a socket.
//! - `wanted` holds every key with a count of at least 1, and only those. While open,
//!   the node has been sent (or the outbox holds) `SUBSCRIBE` for exactly the keys in
//!   `wanted`, in the order of the count changes, so the node's set matches once the
//!   outbox is written and the confirmations are in.
//! - `owed` counts the replies the node owes: the `AUTH` answer (always first, while
//!   `owed.auth`), one confirmation per channel named in a `SUBSCRIBE` or `UNSUBSCRIBE`,
//!   one answer per `PING`. A reply with nothing owed for it is out of step: an error.
//! - `inbox[head..tail]` holds bytes not yet parsed, `head <= tail <= inbox.len()`; the
//!   inbox never grows past what one reply within the bounds needs ([`Subscriber::cap`]).
//!   Every length read from the node is checked before it is trusted: a channel is at most
//!   [`RELEASED_PREFIX`] + [`MAX_RESOURCE`] bytes, a payload at most that and
//!   `Limits::max_bulk_len`, an array at most 3 elements, never nested; a status or error
//!   line at most `Limits::max_line_len`.
//! - At most one `PING` is owed at a time.
//! - The outbox grows past `MAX_OUTBOX` only by the resubscription of a fresh connection
//!   (bounded by the wanted set, which the caller bounds); a count change that would grow
//!   it further is reported as [`NodeError::Backlog`] (the count is kept: the reconnect
//!   resubscribes it).
//! - A [`Notice`] borrows the inbox: no allocation per notice once the buffers have
//!   reached their size.
//! - No input panics (the fuzz target `notice` checks it).

use crate::core::script::RELEASED_PREFIX;
use crate::core::session::Login;
use crate::error::NodeError;
use crate::redlock::MAX_RESOURCE;
use crate::resp::encode::{array, bulk, command, line};
use crate::resp::{Limits, Progress, ProtocolError, Reply, decode_resume};
use bytes::{Buf, BufMut, BytesMut};
use std::collections::HashMap;
use std::ops::Range;

/// The longest channel a notice may name: the prefix and the longest resource.
pub const MAX_CHANNEL: usize = RELEASED_PREFIX.len() + MAX_RESOURCE;

/// Unsent bytes allowed from count changes before a node that does not read is cut off.
const MAX_OUTBOX: usize = 1 << 20;

/// First read buffer: a notice for a resource of a few dozen bytes is about 60 bytes.
const INBOX: usize = 4 * 1024;

/// Channels per `SUBSCRIBE` when a fresh connection resubscribes: one write of several
/// commands, none of them huge.
const CHANNELS_PER_COMMAND: usize = 1024;

/// A release notice: `key` was deleted on this node by its holder's release. Borrows the
/// subscriber's read buffer until the next call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Notice<'a> {
    /// The resource released (the channel without [`RELEASED_PREFIX`]).
    pub key: &'a [u8],
}

/// One node's subscriber connection: the wanted keys, the handshake, the buffers. (Not
/// `Debug`: it holds the password.)
pub struct Subscriber {
    login: Login,
    /// The bounds the decoder applies (see the module's invariants).
    decode: Limits,
    /// The payload bound (the caller's `max_bulk_len`, at most [`MAX_CHANNEL`]).
    max_payload: usize,
    /// Waiters per key; only keys with a count of at least 1.
    wanted: HashMap<Box<[u8]>, usize>,
    /// A connection is open (from `opened` to `closed`).
    open: bool,
    outbox: BytesMut,
    inbox: Vec<u8>,
    // INVARIANT: head <= tail <= inbox.len()
    head: usize,
    tail: usize,
    /// Where parsing of the reply at `head` stopped; cleared whenever `head` moves.
    progress: Progress,
    /// The replies the node owes on this connection.
    owed: Owed,
    /// Some reply has been read on this connection (so bytes that are not RESP come from
    /// a server that answered in RESP before: a protocol error, not "not Redis").
    heard: bool,
}

/// The replies a node owes its subscriber connection, by kind (the `AUTH` answer comes
/// first; the others interleave as their commands were queued).
#[derive(Clone, Copy, Debug, Default)]
struct Owed {
    /// The `AUTH` answer: it is the next reply.
    auth: bool,
    /// Subscribe and unsubscribe confirmations (one per channel named).
    confirms: usize,
    /// `PING` answers.
    pongs: usize,
}

impl Subscriber {
    /// A subscriber with no connection and no wanted key. `login`'s user and password are
    /// sent on each connection (its database is not: channels are global); `limits`
    /// bounds what the node may send, within the subscriber's own bounds.
    pub fn new(login: &Login, limits: Limits) -> Subscriber {
        Subscriber {
            login: Login {
                db: 0,
                ..login.clone()
            },
            decode: Limits {
                max_bulk_len: MAX_CHANNEL,
                max_array_len: 3,
                max_depth: 1,
                max_line_len: limits.max_line_len.min(MAX_CHANNEL),
            },
            max_payload: limits.max_bulk_len.min(MAX_CHANNEL),
            wanted: HashMap::new(),
            open: false,
            outbox: BytesMut::new(),
            inbox: vec![0; INBOX],
            head: 0,
            tail: 0,
            progress: Progress::default(),
            owed: Owed::default(),
            heard: false,
        }
    }

    /// Adds a waiter for `key`. The first one subscribes to its channel (at once when a
    /// connection is open, else on the next [`Subscriber::opened`]). A key that cannot be
    /// a resource (empty, or over [`MAX_RESOURCE`]) is ignored: no lock has it.
    ///
    /// `Err(Backlog)`: the node has not read what was sent so far; the count is kept,
    /// and the caller resets the connection ([`Subscriber::closed`]).
    pub fn want(&mut self, key: &[u8]) -> Result<(), NodeError> {
        if key.is_empty() || key.len() > MAX_RESOURCE {
            return Ok(());
        }
        if let Some(count) = self.wanted.get_mut(key) {
            *count += 1;
            return Ok(());
        }
        self.wanted.insert(key.into(), 1);
        self.send_one(b"SUBSCRIBE", key)
    }

    /// Removes a waiter for `key`. The last one unsubscribes from its channel while a
    /// connection is open. A key not wanted is ignored. `Err(Backlog)` as for
    /// [`Subscriber::want`].
    pub fn unwant(&mut self, key: &[u8]) -> Result<(), NodeError> {
        let Some(count) = self.wanted.get_mut(key) else {
            return Ok(());
        };
        *count -= 1;
        if *count > 0 {
            return Ok(());
        }
        self.wanted.remove(key);
        self.send_one(b"UNSUBSCRIBE", key)
    }

    /// How many waiters want `key`.
    pub fn waiters(&self, key: &[u8]) -> usize {
        self.wanted.get(key).copied().unwrap_or(0)
    }

    /// How many distinct keys are wanted: with none, the caller may close the connection.
    pub fn wanted(&self) -> usize {
        self.wanted.len()
    }

    /// Whether a connection is open (between [`Subscriber::opened`] and
    /// [`Subscriber::closed`]).
    pub fn is_open(&self) -> bool {
        self.open
    }

    /// Queues a `PING`, whose answer proves the node alive (the caller times it with
    /// [`Subscriber::owes`]). Only while open, and one at a time: while an answer is owed
    /// another proves nothing more (and the outbox stays bounded).
    pub fn ping(&mut self) {
        if self.open && self.owed.pongs == 0 {
            command(&mut self.outbox, &[b"PING"]);
            self.owed.pongs += 1;
        }
    }

    /// Whether the node owes any reply (the `AUTH` answer, a confirmation, a `PING`
    /// answer): while it does and it stays silent too long, the caller resets it.
    pub fn owes(&self) -> bool {
        self.owed.auth || self.owed.confirms > 0 || self.owed.pongs > 0
    }

    /// A connection was opened: it starts empty, with `AUTH` (if a password is set) and a
    /// `SUBSCRIBE` of every wanted channel queued, in one write. A connection still open
    /// is taken as closed first.
    pub fn opened(&mut self) {
        self.closed();
        self.open = true;
        if let Some(pw) = &self.login.password {
            match &self.login.user {
                Some(u) => command(&mut self.outbox, &[b"AUTH", u.as_bytes(), pw.as_bytes()]),
                None => command(&mut self.outbox, &[b"AUTH", pw.as_bytes()]),
            }
            self.owed.auth = true;
        }
        let mut keys = self.wanted.keys();
        let mut left = self.wanted.len();
        while left > 0 {
            let n = left.min(CHANNELS_PER_COMMAND);
            array(&mut self.outbox, 1 + n);
            bulk(&mut self.outbox, b"SUBSCRIBE");
            for key in keys.by_ref().take(n) {
                put_channel(&mut self.outbox, key);
            }
            self.owed.confirms += n;
            left -= n;
        }
    }

    /// The connection is gone (or the caller dropped it after an error): every buffer
    /// and owed reply is forgotten; the wanted keys stay, for the next
    /// [`Subscriber::opened`].
    pub fn closed(&mut self) {
        self.open = false;
        self.outbox.clear();
        self.head = 0;
        self.tail = 0;
        self.progress.clear();
        self.owed = Owed::default();
        self.heard = false;
    }

    /// The bytes to write next (empty when closed).
    pub fn outbox(&self) -> &[u8] {
        &self.outbox
    }

    /// The socket took `n` bytes of [`Subscriber::outbox`].
    pub fn consumed(&mut self, n: usize) {
        self.outbox.advance(n.min(self.outbox.len()));
    }

    /// Free space at the end of the read buffer (after compacting or growing it when it
    /// is full, never past [`Subscriber::cap`]). `Err` when one reply would not fit: the
    /// node breaks the bounds.
    pub fn read_room(&mut self) -> Result<&mut [u8], NodeError> {
        if self.tail == self.inbox.len() {
            if self.head > 0 {
                self.inbox.copy_within(self.head..self.tail, 0);
                self.tail -= self.head;
                self.head = 0;
            } else if self.inbox.len() >= self.cap() {
                return Err(NodeError::Protocol(ProtocolError::BulkTooLong));
            } else {
                let grown = (self.inbox.len() * 2).min(self.cap());
                self.inbox.resize(grown, 0);
            }
        }
        Ok(&mut self.inbox[self.tail..])
    }

    /// `n` bytes were read into the space [`Subscriber::read_room`] gave.
    pub fn received(&mut self, n: usize) {
        self.tail = (self.tail + n).min(self.inbox.len());
    }

    /// Copies `bytes` in as if read from the socket (tests, simulations, fuzzing).
    pub fn feed(&mut self, mut bytes: &[u8]) -> Result<(), NodeError> {
        while !bytes.is_empty() {
            let room = self.read_room()?;
            let n = room.len().min(bytes.len());
            room[..n].copy_from_slice(&bytes[..n]);
            self.received(n);
            bytes = &bytes[n..];
        }
        Ok(())
    }

    /// The size of the read buffer now: at most [`Subscriber::cap`].
    pub fn buffer_size(&self) -> usize {
        self.inbox.len()
    }

    /// The most the read buffer holds: one reply within the bounds, with its framing
    /// (a `message` of the longest channel and payload), or the longest line.
    pub fn cap(&self) -> usize {
        let message = 3 * 24 + b"message".len() + MAX_CHANNEL + self.max_payload;
        message.max(self.decode.max_line_len + 3).max(INBOX)
    }

    /// The next release notice for a wanted key among the bytes read, consuming every
    /// reply before it (handshake answers, confirmations, `PING` answers, notices for
    /// keys no longer wanted). `Ok(None)`: nothing more until more bytes are read.
    ///
    /// `Err`: the node refused `AUTH` ([`NodeError::Handshake`]) or a subscription
    /// ([`NodeError::Server`]), sent something out of step or out of bounds, or is not a
    /// Redis server; the caller drops the connection ([`Subscriber::closed`]).
    pub fn next_notice(&mut self) -> Result<Option<Notice<'_>>, NodeError> {
        loop {
            let Some(key) = self.next_reply()? else {
                return Ok(None);
            };
            if let Some(key) = key
                && self.wanted.contains_key(&self.inbox[key.clone()])
            {
                return Ok(Some(Notice {
                    key: &self.inbox[key],
                }));
            }
        }
    }

    /// Reads one reply: `None` when none is complete; `Some(Some(range))` for a notice,
    /// the key's place in the inbox (still there: consuming only moves `head`);
    /// `Some(None)` for a reply consumed silently.
    fn next_reply(&mut self) -> Result<Option<Option<Range<usize>>>, NodeError> {
        if self.head == self.tail || !self.open {
            return Ok(None);
        }
        let base = self.head;
        let buf = &self.inbox[base..self.tail];
        let (reply, used) = match decode_resume(buf, &self.decode, &mut self.progress) {
            Ok(None) => return Ok(None),
            Ok(Some(parsed)) => parsed,
            Err(ProtocolError::UnknownType(_)) if !self.heard => {
                return Err(NodeError::not_redis(buf));
            }
            Err(e) => return Err(NodeError::Protocol(e)),
        };
        // Decide from the borrowed reply first; consume after.
        let key = interpret(&mut self.owed, self.max_payload, reply)?.map(|key| {
            // The key is a slice of the reply, which is a slice of the inbox at `base`.
            let start = base + (key.as_ptr() as usize - buf.as_ptr() as usize);
            start..start + key.len()
        });
        self.heard = true;
        self.head += used;
        if self.head == self.tail {
            // Everything read is parsed: start the buffer over, so it is rarely
            // compacted. The bytes stay where they are until the next read, so the
            // notice's key is still at `key`.
            self.head = 0;
            self.tail = 0;
        }
        Ok(Some(key))
    }

    /// Queues `verb` (`SUBSCRIBE` or `UNSUBSCRIBE`) of `key`'s channel, if open.
    fn send_one(&mut self, verb: &[u8], key: &[u8]) -> Result<(), NodeError> {
        if !self.open {
            return Ok(());
        }
        if self.outbox.len() > MAX_OUTBOX {
            return Err(NodeError::Backlog);
        }
        array(&mut self.outbox, 2);
        bulk(&mut self.outbox, verb);
        put_channel(&mut self.outbox, key);
        self.owed.confirms += 1;
        Ok(())
    }
}

/// What one reply means: for a notice, its key (a slice of the reply); `None` for a
/// reply consumed silently, having counted it off what was `owed`.
fn interpret<'a>(
    owed: &mut Owed,
    max_payload: usize,
    reply: Reply<'a>,
) -> Result<Option<&'a [u8]>, NodeError> {
    if owed.auth {
        owed.auth = false;
        return match reply {
            Reply::Simple(b"OK") => Ok(None),
            Reply::Error(msg) => Err(NodeError::Handshake(
                String::from_utf8_lossy(msg).into_owned(),
            )),
            _ => Err(NodeError::UnexpectedReply("AUTH was answered out of step")),
        };
    }
    let elements = match reply {
        // PING outside subscribed mode (no channel wanted yet) answers as usual.
        Reply::Simple(b"PONG") if owed.pongs > 0 => {
            owed.pongs -= 1;
            return Ok(None);
        }
        Reply::Error(msg) => {
            return Err(NodeError::Server(String::from_utf8_lossy(msg).into_owned()));
        }
        Reply::Array(Some(a)) => a,
        _ => {
            return Err(NodeError::UnexpectedReply(
                "a subscriber was sent a reply it did not ask for",
            ));
        }
    };
    let mut it = elements.iter();
    let Some(Reply::Bulk(Some(kind))) = it.next() else {
        return Err(NodeError::UnexpectedReply("a push without its kind"));
    };
    match (kind, elements.len(), it.next(), it.next()) {
        (b"message", 3, Some(Reply::Bulk(Some(channel))), Some(Reply::Bulk(Some(payload)))) => {
            // The payload is empty from our scripts; anyone may publish, so it is only
            // bounded, never read.
            if payload.len() > max_payload {
                return Err(NodeError::Protocol(ProtocolError::BulkTooLong));
            }
            released_key(channel).map(Some)
        }
        (
            b"subscribe" | b"unsubscribe",
            3,
            Some(Reply::Bulk(Some(channel))),
            Some(Reply::Integer(0..)),
        ) if owed.confirms > 0 => {
            released_key(channel)?;
            owed.confirms -= 1;
            Ok(None)
        }
        // PING in subscribed mode (RESP2): `*2 pong <message>`.
        (b"pong", 2, Some(Reply::Bulk(Some(_))), None) if owed.pongs > 0 => {
            owed.pongs -= 1;
            Ok(None)
        }
        _ => Err(NodeError::UnexpectedReply(
            "a subscriber was sent a push it did not ask for",
        )),
    }
}

/// Appends `key`'s channel as one bulk string, without building it first.
fn put_channel(out: &mut BytesMut, key: &[u8]) {
    line(out, b'$', (RELEASED_PREFIX.len() + key.len()) as u64, false);
    out.put_slice(RELEASED_PREFIX);
    out.put_slice(key);
    out.put_slice(b"\r\n");
}

/// The key a release channel names; an error for any other channel (the subscriber
/// subscribes to no other).
fn released_key(channel: &[u8]) -> Result<&[u8], NodeError> {
    match channel.strip_prefix(RELEASED_PREFIX) {
        Some(key) if !key.is_empty() && key.len() <= MAX_RESOURCE => Ok(key),
        _ => Err(NodeError::UnexpectedReply(
            "a push on a channel that is not a release notice's",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn login(user: Option<&str>, password: Option<&str>) -> Login {
        Login {
            user: user.map(String::from),
            password: password.map(String::from),
            db: 3,
            marker: None,
        }
    }

    fn subscriber(password: Option<&str>) -> Subscriber {
        Subscriber::new(&login(None, password), Limits::default())
    }

    fn channel(key: &[u8]) -> Vec<u8> {
        [RELEASED_PREFIX, key].concat()
    }

    fn cmd(args: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        command(&mut out, args);
        out
    }

    fn push(kind: &[u8], ch: &[u8], last: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        array(&mut out, 3);
        bulk(&mut out, kind);
        bulk(&mut out, ch);
        out.extend_from_slice(last);
        out
    }

    fn message(key: &[u8]) -> Vec<u8> {
        push(b"message", &channel(key), b"$0\r\n\r\n")
    }

    fn confirm(verb: &[u8], key: &[u8], count: usize) -> Vec<u8> {
        push(verb, &channel(key), format!(":{count}\r\n").as_bytes())
    }

    /// Every notice available now, copied; or the error.
    fn drain(s: &mut Subscriber) -> Result<Vec<Vec<u8>>, NodeError> {
        let mut out = Vec::new();
        while let Some(n) = s.next_notice()? {
            out.push(n.key.to_vec());
        }
        Ok(out)
    }

    /// Takes the outbox whole, as a socket that accepts everything.
    fn written(s: &mut Subscriber) -> Vec<u8> {
        let out = s.outbox().to_vec();
        s.consumed(out.len());
        out
    }

    #[test]
    fn a_fresh_connection_authenticates_then_subscribes_every_wanted_key_in_one_write() {
        let mut s = Subscriber::new(&login(Some("u"), Some("pw")), Limits::default());
        s.want(b"a").unwrap();
        s.want(b"b").unwrap();
        s.want(b"a").unwrap();
        // Nothing is sent while closed; the counts are kept.
        assert!(s.outbox().is_empty() && !s.owes());
        assert_eq!((s.waiters(b"a"), s.waiters(b"b"), s.wanted()), (2, 1, 2));
        s.opened();
        let out = written(&mut s);
        let auth = cmd(&[b"AUTH", b"u", b"pw"]);
        assert!(out.starts_with(&auth), "{}", out.escape_ascii());
        // The order of the keys is the map's: either is right. No SELECT: channels are
        // global.
        let ab = cmd(&[b"SUBSCRIBE", &channel(b"a"), &channel(b"b")]);
        let ba = cmd(&[b"SUBSCRIBE", &channel(b"b"), &channel(b"a")]);
        let rest = &out[auth.len()..];
        assert!(rest == ab || rest == ba, "{}", rest.escape_ascii());
        assert!(s.owes());
        let mut replies = b"+OK\r\n".to_vec();
        replies.extend(confirm(b"subscribe", b"a", 1));
        replies.extend(confirm(b"subscribe", b"b", 2));
        replies.extend(message(b"b"));
        s.feed(&replies).unwrap();
        assert_eq!(drain(&mut s).unwrap(), vec![b"b".to_vec()]);
        assert!(!s.owes());
    }

    #[test]
    fn without_a_password_or_a_wanted_key_nothing_is_sent() {
        let mut s = subscriber(None);
        s.opened();
        assert!(s.outbox().is_empty() && !s.owes());
        s.want(b"k").unwrap();
        assert_eq!(written(&mut s), cmd(&[b"SUBSCRIBE", &channel(b"k")]));
        // The default user: AUTH with the password alone.
        let mut s = subscriber(Some("secret"));
        s.opened();
        assert_eq!(written(&mut s), cmd(&[b"AUTH", b"secret"]));
    }

    #[test]
    fn counts_subscribe_on_the_first_waiter_and_unsubscribe_after_the_last() {
        let mut s = subscriber(None);
        s.opened();
        s.want(b"k").unwrap();
        s.want(b"k").unwrap();
        assert_eq!(written(&mut s), cmd(&[b"SUBSCRIBE", &channel(b"k")]));
        s.unwant(b"k").unwrap();
        assert!(s.outbox().is_empty());
        assert_eq!(s.waiters(b"k"), 1);
        s.unwant(b"k").unwrap();
        assert_eq!(written(&mut s), cmd(&[b"UNSUBSCRIBE", &channel(b"k")]));
        assert_eq!((s.waiters(b"k"), s.wanted()), (0, 0));
        // An unwanted key, or one that cannot be a resource: nothing.
        s.unwant(b"k").unwrap();
        s.want(b"").unwrap();
        s.want(&vec![b'x'; MAX_RESOURCE + 1]).unwrap();
        assert!(s.outbox().is_empty());
        assert_eq!(s.wanted(), 0);
        // A notice in flight when the unsubscribe ran is skipped; the confirmations are
        // consumed.
        let mut replies = confirm(b"subscribe", b"k", 1);
        replies.extend(message(b"k"));
        replies.extend(confirm(b"unsubscribe", b"k", 0));
        s.feed(&replies).unwrap();
        assert_eq!(drain(&mut s).unwrap(), Vec::<Vec<u8>>::new());
        assert!(!s.owes());
    }

    #[test]
    fn a_reconnect_resubscribes_every_wanted_key_and_forgets_the_old_stream() {
        let mut s = subscriber(Some("pw"));
        s.opened();
        s.want(b"a").unwrap();
        s.feed(b"+OK\r\n").unwrap();
        // Half a reply, and replies owed, when the connection fails.
        s.feed(&message(b"a")[..7]).unwrap();
        assert_eq!(drain(&mut s).unwrap(), Vec::<Vec<u8>>::new());
        s.want(b"b").unwrap();
        s.closed();
        assert!(!s.is_open() && !s.owes() && s.outbox().is_empty());
        assert_eq!(drain(&mut s).unwrap(), Vec::<Vec<u8>>::new());
        s.unwant(b"a").unwrap();
        s.want(b"c").unwrap();
        s.opened();
        let out = written(&mut s);
        let auth = cmd(&[b"AUTH", b"pw"]);
        let bc = cmd(&[b"SUBSCRIBE", &channel(b"b"), &channel(b"c")]);
        let cb = cmd(&[b"SUBSCRIBE", &channel(b"c"), &channel(b"b")]);
        assert!(out == [&auth[..], &bc].concat() || out == [&auth[..], &cb].concat());
        // The new stream starts at its first byte: the old half reply is gone.
        let mut replies = b"+OK\r\n".to_vec();
        replies.extend(confirm(b"subscribe", b"b", 1));
        replies.extend(confirm(b"subscribe", b"c", 2));
        replies.extend(message(b"c"));
        s.feed(&replies).unwrap();
        assert_eq!(drain(&mut s).unwrap(), vec![b"c".to_vec()]);
    }

    #[test]
    fn auth_refused_is_a_handshake_error() {
        let mut s = subscriber(Some("wrong"));
        s.want(b"k").unwrap();
        s.opened();
        s.feed(b"-WRONGPASS invalid username-password pair or user is disabled.\r\n-NOAUTH x\r\n")
            .unwrap();
        match s.next_notice() {
            Err(NodeError::Handshake(m)) => assert!(m.starts_with("WRONGPASS"), "{m}"),
            other => panic!("{other:?}"),
        }
        // Anything but +OK to AUTH is out of step.
        let mut s = subscriber(Some("pw"));
        s.opened();
        s.feed(b"+PONG\r\n").unwrap();
        assert!(matches!(
            s.next_notice(),
            Err(NodeError::UnexpectedReply(_))
        ));
    }

    #[test]
    fn a_refused_subscription_is_a_server_error() {
        let mut s = subscriber(None);
        s.opened();
        s.want(b"k").unwrap();
        s.feed(b"-NOPERM this user has no permissions to access one of the channels\r\n")
            .unwrap();
        assert!(matches!(s.next_notice(), Err(NodeError::Server(m)) if m.starts_with("NOPERM")));
    }

    #[test]
    fn ping_is_answered_in_either_mode() {
        let mut s = subscriber(None);
        s.opened();
        s.ping();
        assert_eq!(written(&mut s), cmd(&[b"PING"]));
        assert!(s.owes());
        s.feed(b"+PONG\r\n").unwrap();
        assert_eq!(drain(&mut s).unwrap(), Vec::<Vec<u8>>::new());
        assert!(!s.owes());
        s.want(b"k").unwrap();
        s.ping();
        s.feed(&confirm(b"subscribe", b"k", 1)).unwrap();
        s.feed(b"*2\r\n$4\r\npong\r\n$0\r\n\r\n").unwrap();
        assert_eq!(drain(&mut s).unwrap(), Vec::<Vec<u8>>::new());
        assert!(!s.owes());
        // One at a time.
        written(&mut s);
        s.ping();
        s.ping();
        assert_eq!(written(&mut s), cmd(&[b"PING"]));
        s.feed(b"*2\r\n$4\r\npong\r\n$0\r\n\r\n").unwrap();
        assert_eq!(drain(&mut s).unwrap(), Vec::<Vec<u8>>::new());
        // A PONG not owed is out of step.
        s.feed(b"+PONG\r\n").unwrap();
        assert!(matches!(
            s.next_notice(),
            Err(NodeError::UnexpectedReply(_))
        ));
        // A PING while closed is not queued.
        s.closed();
        s.ping();
        assert!(s.outbox().is_empty() && !s.owes());
    }

    /// A stream with every kind of reply, and the notices it must give.
    fn stream() -> (Subscriber, Vec<u8>, Vec<Vec<u8>>) {
        let mut s = subscriber(Some("pw"));
        s.want(b"a").unwrap();
        s.want(b"b\r\nc").unwrap();
        s.opened();
        s.ping();
        s.consumed(usize::MAX);
        let mut replies = b"+OK\r\n".to_vec();
        replies.extend(confirm(b"subscribe", b"a", 1));
        replies.extend(message(b"a"));
        replies.extend(confirm(b"subscribe", b"b\r\nc", 2));
        replies.extend(b"*2\r\n$4\r\npong\r\n$0\r\n\r\n");
        replies.extend(message(b"gone"));
        replies.extend(message(b"b\r\nc"));
        replies.extend(push(b"message", &channel(b"a"), b"$5\r\nhello\r\n"));
        let want = vec![b"a".to_vec(), b"b\r\nc".to_vec(), b"a".to_vec()];
        (s, replies, want)
    }

    #[test]
    fn a_stream_split_at_every_byte_gives_the_same_notices() {
        let (_, replies, want) = stream();
        for cut in 0..=replies.len() {
            let (mut s, _, _) = stream();
            s.feed(&replies[..cut]).unwrap();
            let mut got = drain(&mut s).unwrap();
            s.feed(&replies[cut..]).unwrap();
            got.extend(drain(&mut s).unwrap());
            assert_eq!(got, want, "cut at {cut}");
            assert!(!s.owes());
        }
        // One byte at a time.
        let (mut s, _, _) = stream();
        let mut got = Vec::new();
        for b in &replies {
            s.feed(std::slice::from_ref(b)).unwrap();
            got.extend(drain(&mut s).unwrap());
        }
        assert_eq!(got, want);
    }

    #[test]
    fn notices_for_a_long_key_are_read_whole_and_the_buffer_stays_bounded() {
        let key = vec![b'k'; MAX_RESOURCE];
        let mut s = subscriber(None);
        s.opened();
        s.want(&key).unwrap();
        s.feed(&confirm(b"subscribe", &key, 1)).unwrap();
        for _ in 0..3 {
            s.feed(&message(&key)).unwrap();
            assert_eq!(drain(&mut s).unwrap(), vec![key.clone()]);
        }
        assert!(s.inbox.len() <= s.cap());
    }

    fn fails(bytes: &[u8]) -> NodeError {
        let mut s = subscriber(None);
        s.opened();
        s.want(b"k").unwrap();
        s.feed(&confirm(b"subscribe", b"k", 1)).unwrap();
        assert_eq!(drain(&mut s).unwrap(), Vec::<Vec<u8>>::new());
        let fed = s.feed(bytes);
        let err = match fed {
            Err(e) => e,
            Ok(()) => drain(&mut s).expect_err("must fail"),
        };
        assert!(s.inbox.len() <= s.cap());
        err
    }

    #[test]
    fn hostile_replies_are_typed_errors() {
        let too_long_channel = push(
            b"message",
            &channel(&vec![b'x'; MAX_RESOURCE + 1]),
            b"$0\r\n\r\n",
        );
        let too_long_payload = push(
            b"message",
            &channel(b"k"),
            format!("${}\r\n", MAX_CHANNEL + 1).as_bytes(),
        );
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("channel over the bound", too_long_channel),
            ("payload over the bound", too_long_payload),
            (
                "bulk length overflow",
                b"*3\r\n$99999999999999999999999\r\n".to_vec(),
            ),
            ("negative bulk", b"*3\r\n$-5\r\n".to_vec()),
            ("four elements", b"*4\r\n".to_vec()),
            ("nested", b"*3\r\n*1\r\n".to_vec()),
            ("huge array", b"*1000000000\r\n".to_vec()),
            ("endless line", vec![b'+'; 200_000]),
            ("endless error", [&b"-"[..], &vec![b'E'; 200_000]].concat()),
            ("not RESP", b"HTTP/1.1 400\r\n".to_vec()),
            ("other channel", push(b"message", b"news", b"$0\r\n\r\n")),
            ("empty key", message(b"")),
            ("confirmation not owed", confirm(b"subscribe", b"k", 1)),
            (
                "unknown push",
                push(b"pmessage", &channel(b"k"), b"$0\r\n\r\n"),
            ),
            (
                "short message",
                b"*2\r\n$7\r\nmessage\r\n$1\r\nk\r\n".to_vec(),
            ),
            ("null bulk", b"*3\r\n$-1\r\n$1\r\nk\r\n$0\r\n\r\n".to_vec()),
            ("integer", b":1\r\n".to_vec()),
            ("bulk", b"$1\r\nk\r\n".to_vec()),
            ("null array", b"*-1\r\n".to_vec()),
            ("empty array", b"*0\r\n".to_vec()),
            ("pong not owed", b"*2\r\n$4\r\npong\r\n$0\r\n\r\n".to_vec()),
            ("bad terminator", b"*3\r\n$7\r\nmessageXX".to_vec()),
        ];
        for (what, bytes) in cases {
            let e = fails(&bytes);
            assert!(
                matches!(e, NodeError::Protocol(_) | NodeError::UnexpectedReply(_)),
                "{what}: {e:?}"
            );
        }
        // A negative count, with a confirmation owed.
        let mut s = subscriber(None);
        s.opened();
        s.want(b"k").unwrap();
        s.feed(&push(b"subscribe", &channel(b"k"), b":-1\r\n"))
            .unwrap();
        assert!(matches!(
            s.next_notice(),
            Err(NodeError::UnexpectedReply(_))
        ));
        // A server that speaks something else before any RESP: not Redis.
        let mut s = subscriber(None);
        s.opened();
        s.want(b"k").unwrap();
        s.feed(b"SSH-2.0-OpenSSH\r\n").unwrap();
        assert!(matches!(s.next_notice(), Err(NodeError::NotRedis(_))));
    }

    #[test]
    fn payload_bound_follows_the_callers_limits() {
        let limits = Limits {
            max_bulk_len: 4,
            ..Limits::default()
        };
        let mut s = Subscriber::new(&login(None, None), limits);
        s.opened();
        // A channel longer than the caller's bulk bound is still read: it is ours.
        s.want(b"a-long-resource-name").unwrap();
        s.feed(&confirm(b"subscribe", b"a-long-resource-name", 1))
            .unwrap();
        s.feed(&message(b"a-long-resource-name")).unwrap();
        assert_eq!(
            drain(&mut s).unwrap(),
            vec![b"a-long-resource-name".to_vec()]
        );
        s.feed(&push(
            b"message",
            &channel(b"a-long-resource-name"),
            b"$5\r\nhello\r\n",
        ))
        .unwrap();
        assert_eq!(
            s.next_notice(),
            Err(NodeError::Protocol(ProtocolError::BulkTooLong))
        );
    }

    #[test]
    fn a_node_that_does_not_read_is_a_backlog() {
        let mut s = subscriber(None);
        s.opened();
        let key = vec![b'k'; MAX_RESOURCE];
        let mut result = Ok(());
        for i in 0..100u32 {
            let mut k = key.clone();
            k[..4].copy_from_slice(&i.to_be_bytes());
            result = s.want(&k);
            if result.is_err() {
                break;
            }
        }
        assert_eq!(result, Err(NodeError::Backlog));
        assert!(s.outbox().len() <= MAX_OUTBOX + 2 * MAX_CHANNEL);
        // The count was kept: a reconnect subscribes it with the others.
        let wanted = s.wanted();
        s.closed();
        s.opened();
        assert_eq!(s.owed.confirms, wanted);
    }

    #[test]
    fn steady_state_reads_reuse_the_buffer() {
        let mut s = subscriber(None);
        s.opened();
        s.want(b"k").unwrap();
        s.feed(&confirm(b"subscribe", b"k", 1)).unwrap();
        drain(&mut s).unwrap();
        let before = s.inbox.capacity();
        for _ in 0..10_000 {
            let room = s.read_room().unwrap();
            let m = message(b"k");
            room[..m.len()].copy_from_slice(&m);
            s.received(m.len());
            assert_eq!(s.next_notice().unwrap(), Some(Notice { key: b"k" }));
            assert_eq!(s.next_notice().unwrap(), None);
        }
        assert_eq!(s.inbox.capacity(), before);
        assert_eq!((s.head, s.tail), (0, 0));
    }
}
