//! One non-blocking connection to one node: connect, handshake, buffers, and the FIFO of
//! replies it is owed.
//!
//! # Invariants
//!
//! - `pending` lists, oldest first, one entry per command written (or queued) and not yet
//!   answered. Redis answers a connection's commands in order, so the front entry always
//!   names the next reply; a reply with no entry is a protocol violation.
//! - `inbox[head..tail]` holds received bytes not yet parsed; `head <= tail <= inbox.len()`.
//!   It grows only while a single reply is larger than it, up to `max_reply`.
//! - `outbox` holds bytes not yet accepted by the kernel. It is empty on the hot path: a
//!   command is written straight from the caller's buffer and copied only on a short
//!   write.
//! - When a connection fails it is dropped whole: buffers and `pending` are cleared, so no
//!   stale reply can ever be matched to a later command.

use super::fifo::Fifo;
use crate::config::{Address, Endpoint};
use crate::core::round::{Kind, quick_vote};
use crate::error::NodeError;
use crate::resp::encode::command;
use crate::resp::{Limits, Progress, ProtocolError, Reply, decode_resume};
use bytes::{Buf, BytesMut};
use mio::net::{TcpStream, UnixStream};
use mio::{Interest, Registry, Token};
use std::io::{self, Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Unsent bytes allowed before a node that does not read is cut off.
const MAX_OUTBOX: usize = 1 << 20;
/// Outstanding replies allowed before a node that does not answer is cut off.
const MAX_PENDING: usize = 1 << 16;
/// First read buffer size; enough for thousands of pipelined lock replies.
const INBOX: usize = 16 * 1024;

/// What a queued reply belongs to.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Expect {
    /// The round that counts this reply; 0 for replies nobody waits for.
    pub round: u64,
    /// Which resource of the round.
    pub slot: u32,
    /// The command it answers.
    pub kind: Expected,
    /// When the command was queued, to tell a lagging node.
    pub sent_at: Instant,
}

/// The command a reply answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Expected {
    /// A handshake command (AUTH, SELECT, PING) and the status it must answer.
    Status(Status),
    /// A lock command.
    Command(Kind),
}

/// The status line a handshake command must answer with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Status {
    /// `+OK` (AUTH, SELECT).
    Ok,
    /// `+PONG` (PING).
    Pong,
}

impl Status {
    pub fn text(self) -> &'static [u8] {
        match self {
            Status::Ok => b"OK",
            Status::Pong => b"PONG",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum State {
    Down,
    Connecting,
    Ready,
}

enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    fn as_source(&mut self) -> &mut dyn mio::event::Source {
        match self {
            Stream::Tcp(s) => s,
            Stream::Unix(s) => s,
        }
    }
}

pub(crate) struct NodeConn {
    pub endpoint: Endpoint,
    token: Token,
    pub state: State,
    /// Counts connections made, so a caller can tell whether the one it read from is
    /// still the current one.
    pub generation: u64,
    stream: Option<Stream>,
    outbox: BytesMut,
    inbox: Vec<u8>,
    // INVARIANT: head <= tail <= inbox.len()
    head: usize,
    tail: usize,
    /// Where parsing of the reply at `head` stopped, if it was incomplete. Offsets are
    /// relative to `head`, so compacting the inbox keeps it valid.
    // INVARIANT: cleared whenever a reply is consumed or the inbox is dropped.
    progress: Progress,
    pub pending: Fifo<Expect>,
    backoff: Duration,
    retry_at: Instant,
    connect_started: Instant,
    /// Why the connection last failed, ready to report without allocating each round.
    down: NodeError,
    /// Reset for lagging; not sent anything until a reply proves the new connection
    /// alive (a frozen server's kernel still accepts connections).
    pub suspect: bool,
    /// Not yet resent in the current round, so a connection found closed may be reopened
    /// once within the round.
    pub may_resend: bool,
    /// The current round's command was handed to this connection, so after a lost
    /// attempt the node may hold our key and gets the compare-and-delete.
    pub sent: bool,
    /// Until when a SET or extend written on this connection may still apply (the
    /// latest start + ttl among them). While such a reply is owed, the connection is
    /// not dropped for lagging or for a slow handshake: the bytes may already sit in the
    /// node's socket, and an unlock's delete must follow them on the same connection.
    owed_until: Option<Instant>,
    /// This connection has seen a script answer (not `NOSCRIPT`): the node has the
    /// scripts cached, so EVALSHA is safe. Until then scripts go as EVAL: a `NOSCRIPT`
    /// that comes back after its round (a frozen node) would leave the key behind.
    pub scripts_known: bool,
}

impl NodeConn {
    pub fn new(endpoint: Endpoint, index: usize, now: Instant) -> NodeConn {
        NodeConn {
            endpoint,
            token: Token(index),
            state: State::Down,
            generation: 0,
            stream: None,
            outbox: BytesMut::new(),
            inbox: vec![0; INBOX],
            head: 0,
            tail: 0,
            progress: Progress::default(),
            pending: Fifo::new(),
            backoff: Duration::ZERO,
            retry_at: now,
            connect_started: now,
            down: NodeError::Down(Arc::new(NodeError::Closed)),
            suspect: false,
            may_resend: false,
            sent: false,
            owed_until: None,
            scripts_known: false,
        }
    }

    /// Starts a reconnect when the backoff has passed; gives up on a connect that takes
    /// too long. Never blocks.
    #[inline]
    pub fn maintain(
        &mut self,
        registry: &Registry,
        now: Instant,
        connect_timeout: Duration,
        max_backoff: Duration,
    ) {
        // The handshake is part of connecting: a host that accepts the TCP connection but
        // never answers PING (a silent service, a frozen server) has not connected.
        let connecting = self.state == State::Connecting || self.handshaking();
        match self.state {
            State::Down if now >= self.retry_at => self.connect(registry, now, max_backoff),
            // A handshaking connection that carries a lock write is kept (see
            // `owed_until`); one still in TCP connect has written nothing yet.
            State::Connecting | State::Ready
                if connecting
                    && now.saturating_duration_since(self.connect_started) > connect_timeout
                    && !self.holds_live_write(now) =>
            {
                self.fail(registry, NodeError::ConnectTimeout, now, max_backoff);
                // The next connection is sent nothing until its handshake is answered:
                // a silent host must not cost `node_timeout` at every reconnect.
                self.suspect = true;
            }
            _ => {}
        }
    }

    /// The handshake (AUTH, SELECT, PING) is not answered yet.
    #[inline]
    pub fn handshaking(&self) -> bool {
        matches!(
            self.pending.front(),
            Some(Expect {
                kind: Expected::Status(_),
                ..
            })
        )
    }

    /// Notes that a SET or extend that may apply until `until` was written here.
    #[inline]
    pub fn note_write(&mut self, until: Option<Instant>) {
        if let Some(u) = until {
            if self.owed_until.is_none_or(|o| o < u) {
                self.owed_until = Some(u);
            }
        }
    }

    /// Still owes the reply to a SET or an extend that could yet apply at `now`: such a
    /// connection must not be dropped, or the node could apply the write after our
    /// delete, sent on another connection, in any order.
    pub fn holds_live_write(&self, now: Instant) -> bool {
        self.owed_until.is_some_and(|u| now < u)
            && self
                .pending
                .iter()
                .any(|e| matches!(e.kind, Expected::Command(Kind::Acquire | Kind::Extend)))
    }

    /// The bytes received and not yet parsed (for error reports).
    pub fn unparsed(&self) -> &[u8] {
        &self.inbox[self.head..self.tail]
    }

    /// Why the node is down, for reports.
    pub fn down_error(&self) -> NodeError {
        self.down.clone()
    }

    /// True when the node owes a reply older than `node_timeout`: frozen, partitioned
    /// or badly overloaded. Such a node is not waited for until it catches up.
    ///
    /// `cutoff` is `now − node_timeout`, computed once per round by the caller.
    #[inline]
    pub fn is_lagging(&self, cutoff: Option<Instant>) -> bool {
        match (self.pending.front(), cutoff) {
            (Some(e), Some(cutoff)) => e.sent_at < cutoff,
            _ => false,
        }
    }

    /// Reconnects at once, ignoring the backoff (for a connection found stale).
    pub fn reconnect_now(&mut self, registry: &Registry, now: Instant, max_backoff: Duration) {
        if self.state == State::Down {
            self.connect(registry, now, max_backoff);
        }
    }

    fn connect(&mut self, registry: &Registry, now: Instant, max_backoff: Duration) {
        let stream = match &self.endpoint.addr {
            Address::Tcp(addr) => TcpStream::connect(*addr).and_then(|s| {
                // Lock commands are tiny and latency-bound: never let Nagle hold them.
                s.set_nodelay(true)?;
                Ok(Stream::Tcp(s))
            }),
            Address::Unix(path) => UnixStream::connect(path).map(Stream::Unix),
        };
        let mut stream = match stream {
            Ok(s) => s,
            Err(e) => return self.fail(registry, e.into(), now, max_backoff),
        };
        // Both interests for the connection's whole life: edge-triggered writable events
        // only fire after a full buffer drains, so this costs nothing, and it saves an
        // epoll_ctl per short write.
        if let Err(e) = registry.register(
            stream.as_source(),
            self.token,
            Interest::READABLE | Interest::WRITABLE,
        ) {
            return self.fail(registry, e.into(), now, max_backoff);
        }
        self.stream = Some(stream);
        self.generation += 1;
        self.scripts_known = false;
        self.state = State::Connecting;
        self.connect_started = now;
        // The handshake goes first in the outbox; commands queue behind it.
        let (user, password) = (self.endpoint.user.clone(), self.endpoint.password.clone());
        if let Some(pw) = password {
            match &user {
                Some(u) => command(&mut self.outbox, &[b"AUTH", u.as_bytes(), pw.as_bytes()]),
                None => command(&mut self.outbox, &[b"AUTH", pw.as_bytes()]),
            }
            self.expect_status(Status::Ok, now);
        }
        if self.endpoint.db != 0 {
            let db = self.endpoint.db.to_string();
            command(&mut self.outbox, &[b"SELECT", db.as_bytes()]);
            self.expect_status(Status::Ok, now);
        }
        // PING last: its PONG proves the stream is in step before any lock reply is
        // counted. Bytes a server sends unasked right after accepting meet the PING's
        // entry, not a lock command's, and fail the connection.
        command(&mut self.outbox, &[b"PING"]);
        self.expect_status(Status::Pong, now);
    }

    fn expect_status(&mut self, status: Status, now: Instant) {
        self.pending.push_back(Expect {
            round: 0,
            slot: 0,
            kind: Expected::Status(status),
            sent_at: now,
        });
    }

    /// After an event on a connecting socket: `Ok(true)` once connected.
    pub fn finish_connect(&mut self, now: Instant) -> Result<bool, NodeError> {
        match &self.stream {
            Some(Stream::Tcp(s)) => {
                if let Some(e) = s.take_error()? {
                    return Err(e.into());
                }
                match s.peer_addr() {
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotConnected => return Ok(false),
                    Err(e) => return Err(e.into()),
                }
            }
            Some(Stream::Unix(s)) => {
                if let Some(e) = s.take_error()? {
                    return Err(e.into());
                }
            }
            None => return Err(NodeError::Closed),
        }
        // Nothing has been written yet, so any byte already here is one no command asked
        // for; matched to our first command, it would be taken for its answer.
        if !self.outbox.is_empty() {
            self.read(&Limits::default(), true)?;
            if self.tail > self.head {
                // A Redis server never speaks first; an SSH or SMTP server does.
                return Err(NodeError::not_redis(self.unparsed()));
            }
        }
        self.state = State::Ready;
        // What was queued while connecting is only written now: the lag clock starts here.
        for expect in self.pending.iter_mut() {
            expect.sent_at = now;
        }
        self.flush()?;
        Ok(true)
    }

    /// Queues `count` commands, for slots `expect.slot..expect.slot + count`, and writes
    /// them at once if the connection is idle.
    #[inline(always)]
    pub fn send(&mut self, bytes: &[u8], expect: Expect, count: usize) -> Result<(), NodeError> {
        if self.pending.len() + count > MAX_PENDING {
            return Err(NodeError::Backlog);
        }
        if count == 1 {
            self.pending.push_back(expect);
        } else {
            self.expect_many(expect, count);
        }
        if self.state == State::Ready && self.outbox.is_empty() {
            let n = write_to(&mut self.stream, bytes)?;
            if n == bytes.len() {
                return Ok(());
            }
            return self.queue(&bytes[n..]);
        }
        self.queue(bytes)
    }

    fn expect_many(&mut self, expect: Expect, count: usize) {
        for k in 0..count as u32 {
            self.pending.push_back(Expect {
                slot: expect.slot + k,
                ..expect
            });
        }
    }

    /// Keeps what the kernel did not take, to be written when the socket is writable.
    #[cold]
    fn queue(&mut self, rest: &[u8]) -> Result<(), NodeError> {
        if self.outbox.len() + rest.len() > MAX_OUTBOX {
            return Err(NodeError::Backlog);
        }
        self.outbox.extend_from_slice(rest);
        Ok(())
    }

    /// Bytes wait in the outbox (a short write, or a connection still connecting).
    #[inline]
    pub fn has_unsent(&self) -> bool {
        !self.outbox.is_empty()
    }

    /// Writes as much of the outbox as the kernel takes.
    #[inline]
    pub fn flush(&mut self) -> Result<(), NodeError> {
        while self.state == State::Ready && !self.outbox.is_empty() {
            let n = write_to(&mut self.stream, &self.outbox)?;
            if n == 0 {
                break;
            }
            self.outbox.advance(n);
        }
        Ok(())
    }

    /// Reads what the socket has. `Ok(true)` means the peer closed after what was read.
    ///
    /// A read that returns less than the free space means the socket was drained at that
    /// moment, and any later byte raises a new edge: that saves the extra `read` that
    /// would only return `WouldBlock`. A close that came with the data raises no new edge,
    /// so when the event says the peer closed (`drain`), read on to the end.
    #[inline]
    pub fn read(&mut self, limits: &Limits, drain: bool) -> Result<bool, NodeError> {
        loop {
            if self.tail == self.inbox.len() {
                self.make_room(limits)?;
            }
            let buf = &mut self.inbox[self.tail..];
            let free = buf.len();
            let r = match &mut self.stream {
                Some(Stream::Tcp(s)) => s.read(buf),
                Some(Stream::Unix(s)) => s.read(buf),
                None => return Err(NodeError::Closed),
            };
            match r {
                Ok(0) => return Ok(true),
                Ok(n) => {
                    self.tail += n;
                    if n < free && !drain {
                        return Ok(false);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// The hot-path read: one `recv` into the free end of the inbox. Anything unusual
    /// (no room left, a full buffer that may hold more, an interrupted call) is
    /// [`ReadFast::Slow`]: the caller goes on with [`NodeConn::read`], which picks up
    /// where this left off.
    #[inline]
    pub fn read_fast(&mut self) -> ReadFast {
        let free = self.inbox.len() - self.tail;
        if free == 0 {
            return ReadFast::Slow;
        }
        let buf = &mut self.inbox[self.tail..];
        let r = match &mut self.stream {
            Some(Stream::Tcp(s)) => s.read(buf),
            Some(Stream::Unix(s)) => s.read(buf),
            None => return ReadFast::Slow,
        };
        match r {
            Ok(0) => ReadFast::Closed,
            Ok(n) => {
                self.tail += n;
                // A short read drained the socket (see `read`); a full one may have left
                // more behind.
                if n < free {
                    ReadFast::Drained
                } else {
                    ReadFast::Slow
                }
            }
            Err(e) => match e.kind() {
                io::ErrorKind::WouldBlock => ReadFast::Drained,
                io::ErrorKind::Interrupted => ReadFast::Slow,
                _ => ReadFast::Failed(e),
            },
        }
    }

    /// Frees space at the end of the inbox: slide unparsed bytes to the front, or grow
    /// when one unparsed reply already fills it (never past what the limits allow).
    fn make_room(&mut self, limits: &Limits) -> Result<(), NodeError> {
        if self.head > 0 {
            self.inbox.copy_within(self.head..self.tail, 0);
            self.tail -= self.head;
            self.head = 0;
            return Ok(());
        }
        // The largest reply worth buffering: one bulk string at the limit plus framing.
        let cap = limits
            .max_bulk_len
            .max(limits.max_line_len)
            .saturating_add(64)
            .max(INBOX);
        if self.inbox.len() >= cap {
            return Err(NodeError::Protocol(ProtocolError::BulkTooLong));
        }
        let grown = (self.inbox.len() * 2).min(cap);
        self.inbox.resize(grown, 0);
        Ok(())
    }

    /// The next complete reply in the inbox and its length, without consuming it. An
    /// incomplete reply is resumed where the last call stopped (see `decode_resume`).
    #[inline]
    pub fn peek(&mut self, limits: &Limits) -> Result<Option<(Reply<'_>, usize)>, ProtocolError> {
        if self.head == self.tail {
            return Ok(None);
        }
        decode_resume(
            &self.inbox[self.head..self.tail],
            limits,
            &mut self.progress,
        )
    }

    /// The hot path of every round: when the next reply answers a lock command with one
    /// of its two common forms (`+OK` / `$-1` to `SET NX`, `:1` / `:0` to a script),
    /// consumes it and returns the round and slot it answers and the vote (yes or no),
    /// without the general parser. Anything else (`None`, nothing consumed) goes through
    /// [`NodeConn::peek`].
    #[inline(always)]
    pub fn take_vote(&mut self) -> Option<(u64, u32, bool)> {
        let expect = self.pending.front()?;
        let Expected::Command(kind) = expect.kind else {
            return None;
        };
        let buf = self.inbox.get(self.head..self.tail)?;
        let (yes, used) = quick_vote(kind, buf)?;
        let vote = (expect.round, expect.slot, yes);
        self.scripts_known |= kind != Kind::Acquire;
        self.consume(used);
        Some(vote)
    }

    /// True when unparsed bytes wait in the inbox.
    #[inline]
    pub fn has_input(&self) -> bool {
        self.head != self.tail
    }

    /// Drops a parsed reply from the inbox and its entry from `pending`.
    #[inline(always)]
    pub fn consume(&mut self, used: usize) {
        self.progress.clear();
        self.head += used;
        if self.head == self.tail {
            self.head = 0;
            self.tail = 0;
        }
        self.pending.pop_front();
        // A node that answers is healthy again: the next failure reconnects at once.
        self.backoff = Duration::ZERO;
        self.suspect = false;
    }

    /// Drops the connection and everything queued on it; reconnects after the backoff.
    pub fn fail(
        &mut self,
        registry: &Registry,
        error: NodeError,
        now: Instant,
        max_backoff: Duration,
    ) {
        if let Some(mut s) = self.stream.take() {
            let _ = registry.deregister(s.as_source());
        }
        self.state = State::Down;
        self.outbox.clear();
        self.head = 0;
        self.tail = 0;
        self.progress.clear();
        self.pending.clear();
        self.owed_until = None;
        self.down = NodeError::Down(Arc::new(error));
        self.retry_at = now + self.backoff;
        self.backoff = if self.backoff.is_zero() {
            Duration::from_millis(10).min(max_backoff)
        } else {
            (self.backoff * 2).min(max_backoff)
        };
    }

    /// Bytes held by the read buffer, the write buffer and the reply queue.
    pub fn buffered(&self) -> usize {
        self.inbox.len()
            + self.outbox.capacity()
            + self.pending.capacity() * std::mem::size_of::<Expect>()
    }
}

/// What [`NodeConn::read_fast`] did.
pub(crate) enum ReadFast {
    /// Read what there was; the socket is drained.
    Drained,
    /// The peer closed the connection (after what was read before).
    Closed,
    /// The socket failed.
    Failed(io::Error),
    /// Not finished: continue with [`NodeConn::read`].
    Slow,
}

/// One write; `Ok(0)` when the kernel buffer is full.
#[inline]
fn write_to(stream: &mut Option<Stream>, bytes: &[u8]) -> Result<usize, NodeError> {
    loop {
        let r = match stream {
            Some(Stream::Tcp(s)) => s.write(bytes),
            Some(Stream::Unix(s)) => s.write(bytes),
            None => return Err(NodeError::Closed),
        };
        match r {
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(0),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        }
    }
}
