//! One node's protocol state, without the socket: connection lifecycle, handshake,
//! buffers, the FIFO of replies it is owed, reconnect backoff, and what marks a node as
//! suspect or lagging.
//!
//! The engine (`core::engine`) moves its bytes through a transport: it reads into
//! [`Session::read_room`] and reports [`Session::received`], writes what
//! [`Session::unsent`] holds (or a command directly, when [`Session::enqueue`] says the
//! line is idle) and reports [`Session::wrote`]. Everything the node's bytes mean is decided here. Nothing here
//! reads a clock or touches a socket: time comes in as `now`.
//!
//! # Invariants
//!
//! - `pending` lists, oldest first, one entry per command written (or queued) and not yet
//!   answered. Redis answers a connection's commands in order, so the front entry always
//!   names the next reply; a reply with no entry is a protocol violation.
//! - `inbox[head..tail]` holds received bytes not yet parsed; `head <= tail <= inbox.len()`.
//!   It grows only while a single reply is larger than it, up to what the limits allow.
//! - `outbox` holds bytes not yet accepted by the kernel. It is empty on the hot path: a
//!   command is written straight from the caller's buffer and copied only on a short
//!   write.
//! - When a connection fails it is dropped whole: buffers and `pending` are cleared, so no
//!   stale reply can ever be matched to a later command.
//! - `outbox` never exceeds `MAX_OUTBOX` bytes, nor `pending` `MAX_PENDING` entries.

use super::fifo::Fifo;
use super::round::{interpret, quick_vote};
use crate::error::{NodeError, Outcome, Phase};
use crate::resp::encode::command;
use crate::resp::{Limits, Progress, ProtocolError, Reply, decode_resume};
use bytes::{Buf, BytesMut};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Unsent bytes allowed before a node that does not read is cut off.
const MAX_OUTBOX: usize = 1 << 20;
/// Outstanding replies allowed before a node that does not answer is cut off.
const MAX_PENDING: usize = 1 << 16;
/// First read buffer size; enough for thousands of pipelined lock replies.
const INBOX: usize = 16 * 1024;
/// The longest `INFO server` text read whatever the limits (it is about 1.5 KiB; its
/// paths can make it longer): it fits the first read buffer.
const INFO_MAX: usize = INBOX - 64;
/// Owed replies the queue holds before it allocates: calls return at a majority, so a
/// healthy node is often a few rounds behind, and up to `MAX_ROUNDS_BEHIND` (64) of
/// single-command rounds before it counts as lagging; 128 entries (4 KiB) cover that
/// without a steady-state allocation.
const PENDING: usize = 128;

/// The tag of [`Expect::round`] for a reply that no round counts as a vote (handshake,
/// the fire-and-forget deletes). Round ids stay far below it, so a tagged `round` equals
/// no round id: comparing `round` with the round in progress is the whole test.
pub const UNCOUNTED: u64 = 1 << 63;

/// The largest fence counter a fenced acquire may answer: counters are Lua numbers
/// (doubles), exact only up to 2^53, and the fence (counter + 1) must stay exact when
/// the scripts compare it; a larger one is a reply out of step.
pub const MAX_COUNTER: i64 = (1 << 53) - 1;

/// What a queued reply belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Expect {
    /// The round in progress when the command was sent (0 for a handshake), what
    /// [`Session::rounds_behind`] measures from; tagged with [`UNCOUNTED`] when that
    /// round does not count the reply as a vote ([`Expect::counted`]).
    pub round: u64,
    /// Which resource of the round.
    pub slot: u32,
    /// The command it answers.
    pub kind: Expected,
    /// When the command was queued, to tell a lagging node.
    pub sent_at: Instant,
}

impl Expect {
    /// Whether its round counts the reply as a vote; false for replies nobody waits for
    /// (handshake, the fire-and-forget deletes).
    #[inline]
    pub fn counted(&self) -> bool {
        self.round & UNCOUNTED == 0
    }

    /// The round in progress when the command was sent, without the tag.
    #[inline]
    pub fn sent_in(&self) -> u64 {
        self.round & !UNCOUNTED
    }
}

/// The command a reply answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expected {
    /// A handshake command (AUTH, SELECT, INFO, PING) and what it must answer.
    Handshake(Handshake),
    /// A lock command.
    Command(Phase),
    /// An acquire that also reads the fence counters of its keys (`script::ACQUIRE`
    /// with counter keys): its yes is the largest counter, an integer, instead of `+OK`.
    FencedAcquire,
    /// A lock command sent as a script over keys (a multi-resource lock, a fenced
    /// release: `EVAL`, never `EVALSHA`): it answers as the plain command of its phase
    /// does, but says nothing of the extend script's cache, and takes the general path.
    Script(Phase),
}

/// What a handshake command must answer with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handshake {
    /// `+OK` (AUTH, SELECT).
    Ok,
    /// `INFO server`: the server's text, from which its [`Identity`] is read; an error
    /// reply (an ACL without `INFO`) leaves the identity unknown.
    Info,
    /// `SET quorumlock:marker <value> NX` (restart guard on): `+OK` when the marker was
    /// missing (the node is new: fresh, or it lost its data), nil when it was there; an
    /// error (an ACL, a read-only replica) leaves it unwritten.
    MarkerSet,
    /// `GET quorumlock:marker` (restart guard on): the node's marker, nil when it has
    /// none, an error when it cannot be read.
    MarkerGet,
    /// `+PONG` (PING).
    Pong,
}

impl Handshake {
    /// The status text it must answer with; empty for `INFO`, which answers text.
    pub fn text(self) -> &'static [u8] {
        match self {
            Handshake::Ok | Handshake::MarkerSet => b"OK",
            Handshake::Info | Handshake::MarkerGet => b"",
            Handshake::Pong => b"PONG",
        }
    }
}

/// The key of a node's marker (restart guard on): a value with no expiry that the first
/// client to connect writes, and every client reads in its handshake. A node that lost
/// its data has lost its marker; another server behind the same address has another.
pub const MARKER_KEY: &[u8] = b"quorumlock:marker";

/// Who a node is, read from `INFO server` on each connection, and with the restart guard
/// on, from its marker. (Its tests are below: an example would need a clock reading,
/// which nothing in `core` takes.)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The server's `run_id`: 40 hex characters, new at every start of the process.
    /// Some servers (Dragonfly, Kvrocks) have none.
    pub run_id: Option<[u8; 40]>,
    /// `uptime_in_seconds`, as the server says: the difference of two whole-second
    /// wall-clock readings, which can exceed the real uptime by up to a second (hence
    /// the restart guard's documented extra second) ...
    pub uptime: Option<Duration>,
    /// ... as of this moment on the client's clock: when its reply was read.
    pub read_at: Instant,
    /// The node's marker ([`MARKER_KEY`]) as read in the handshake, as a 64-bit hash of
    /// its value; `None` when none was read (guard off, missing, refused).
    pub marker: Option<Marker>,
    /// The server runs in cluster mode (`redis_mode:cluster`; Valkey's `server_mode`):
    /// a script may only touch keys of one hash slot there.
    pub cluster: bool,
}

/// A marker's value as kept: its FNV-1a hash. Small, so that identities stay cheap to
/// copy; two markers that differ read as equal only by a 2^-64 chance, which at worst
/// misses one failover that the `run_id` and the uptime did not show either.
pub type Marker = u64;

impl Identity {
    /// Reads `run_id` and `uptime_in_seconds` from the text of an `INFO server` reply
    /// read at `read_at`; `None` when both are missing or malformed.
    pub fn parse(info: &[u8], read_at: Instant) -> Option<Identity> {
        let mut run_id = None;
        let mut uptime = None;
        let mut cluster = false;
        for line in info.split(|&b| b == b'\n') {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if let Some(v) = line.strip_prefix(b"run_id:") {
                run_id = <[u8; 40]>::try_from(v)
                    .ok()
                    .filter(|id| id.iter().all(u8::is_ascii_hexdigit));
            } else if let Some(v) = line
                .strip_prefix(b"redis_mode:")
                .or_else(|| line.strip_prefix(b"server_mode:"))
            {
                cluster |= v == b"cluster";
            } else if let Some(v) = line.strip_prefix(b"uptime_in_seconds:") {
                uptime = std::str::from_utf8(v)
                    .ok()
                    .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
                    .and_then(|v| v.parse::<u64>().ok())
                    .map(Duration::from_secs);
            }
        }
        if run_id.is_none() && uptime.is_none() {
            return None;
        }
        Some(Identity {
            run_id,
            uptime,
            read_at,
            marker: None,
            cluster,
        })
    }

    /// How long the node has been up at `now`, at least: its uptime when the reply was
    /// read plus the time since, on the client's clock; `None` when it gave no uptime.
    pub fn up_for(&self, now: Instant) -> Option<Duration> {
        let since = now.saturating_duration_since(self.read_at);
        self.uptime.map(|u| u.saturating_add(since))
    }

    /// Whether `self` and `other` are one server: the same `run_id`, or where either has
    /// none, the same marker.
    pub fn same_server(&self, other: &Identity) -> bool {
        match (self.run_id, other.run_id) {
            (Some(a), Some(b)) => a == b,
            _ => self.marker.is_some() && self.marker == other.marker,
        }
    }
}

/// A marker value as kept ([`Marker`]).
fn marker_of(value: &[u8]) -> Marker {
    value.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Where the connection stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// No connection; one is opened once the backoff has passed.
    Down,
    /// Opened, not yet established.
    Connecting,
    /// Established (the handshake may still be unanswered: see
    /// [`Session::handshaking`]).
    Ready,
}

/// The next reply in a node's inbox, read whole: the command it answers and what it
/// means ([`interpret`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    /// The lock command answered (its round and slot); `None` when the stream broke
    /// before a reply could be matched to one (bytes that are not RESP, a reply nobody
    /// asked for, a handshake answered wrongly).
    pub to: Option<Expect>,
    /// What the reply means. `Failed` with an error that
    /// [breaks the stream](NodeError::breaks_stream) leaves the reply unconsumed: the
    /// connection must be dropped. [`NodeError::NoScript`]: the command must go again,
    /// as `EVAL`. Anything else is the node's vote for `to`'s round and slot (which may
    /// be over: the caller drops it then).
    pub outcome: Outcome,
    /// With the yes to a fenced acquire: the largest fence counter the node holds for
    /// the keys.
    pub counter: Option<u64>,
}

impl Answer {
    fn broken(to: Option<Expect>, error: NodeError) -> Answer {
        Answer {
            to,
            outcome: Outcome::Failed(error),
            counter: None,
        }
    }
}

/// The login a new connection sends before anything else.
#[derive(Clone, Debug, Default)]
pub struct Login {
    /// ACL user, if any.
    pub user: Option<String>,
    /// Password, if any.
    pub password: Option<String>,
    /// Database selected after connecting.
    pub db: u32,
    /// With the restart guard on, the marker this client writes where a node has none
    /// (unique per client and node); `None` with the guard off: no marker is written or
    /// read.
    pub marker: Option<[u8; 32]>,
}

/// One node's protocol state.
#[derive(Clone)]
pub struct Session {
    login: Login,
    /// Where the connection stands.
    pub state: State,
    /// Counts connections made, so a caller can tell whether the one it read from is
    /// still the current one.
    pub generation: u64,
    outbox: BytesMut,
    inbox: Vec<u8>,
    // INVARIANT: head <= tail <= inbox.len()
    head: usize,
    tail: usize,
    /// Where parsing of the reply at `head` stopped, if it was incomplete. Offsets are
    /// relative to `head`, so compacting the inbox keeps it valid.
    // INVARIANT: cleared whenever a reply is consumed or the inbox is dropped.
    progress: Progress,
    /// The replies owed, oldest first.
    pub(crate) pending: Fifo<Expect>,
    backoff: Duration,
    retry_at: Instant,
    connect_started: Instant,
    /// Why the connection last failed, ready to report without allocating each round.
    down: NodeError,
    /// Reset for lagging, or reopened after a connect timeout: sent nothing until a reply
    /// proves the new connection alive (a frozen server's kernel still accepts
    /// connections).
    pub suspect: bool,
    /// Not yet resent in the current round, so a connection found closed may be reopened
    /// once within the round.
    pub may_resend: bool,
    /// The current round's command was handed to this connection, so after a lost
    /// attempt the node may hold our key and gets the compare-and-delete.
    pub sent: bool,
    /// The latest start + ttl among the SETs and extends written on this connection: our
    /// lock can be valid until then. While such a reply is owed before it, the
    /// connection is not dropped for lagging or for a slow handshake: the bytes may sit
    /// in the node's socket, and an unlock's delete must follow them on the same
    /// connection.
    owed_until: Option<Instant>,
    /// This connection has seen the extend script answered (not `NOSCRIPT`): the node
    /// has it cached, so EVALSHA is safe. Until then extends go as EVAL: a `NOSCRIPT`
    /// that comes back after its round is decided could be left unanswered. (Releases
    /// always go as EVAL: an unlock does not wait for every reply.)
    pub extend_script_known: bool,
    /// Who the server on this connection is, once its `INFO server` is answered; `None`
    /// before, or when it was refused or had no `run_id` and uptime.
    pub identity: Option<Identity>,
    /// Compare-and-deletes written on this connection whose replies no round waits for
    /// (after a lost attempt, behind a stale write) and that are not answered yet. Until
    /// they are, the node may still hold a key of ours that the delete is about to free.
    pub(crate) deletes_owed: usize,
    /// The current round's command is held back from this node until its deletes are
    /// answered (see `Engine::begin`): not written, so it votes only once it is.
    pub(crate) held: bool,
    /// Noted lagging for an observer (`engine::Note::Lagging`), not yet caught up.
    pub(crate) lag_noted: bool,
    /// A connection of this node has answered its handshake before.
    pub(crate) connected_before: bool,
    /// The round trip of the last handshake answered (sent to `PONG`), for health
    /// reports: the hot path reads no clock, so this is the latency measured last.
    pub(crate) handshake_rtt: Option<std::time::Duration>,
    /// The marker was missing when this connection's handshake wrote it.
    marker_created: bool,
    /// The `run_id` and marker this client last saw at this endpoint (restart guard on),
    /// kept across connections.
    seen: Option<(Option<[u8; 40]>, Option<Marker>)>,
    /// Since when the server at this endpoint counts as new (restart guard on): its
    /// marker was missing or changed, or its `run_id` changed, as seen at that moment.
    /// Kept across connections: the guard runs from it whatever the next one reads.
    pub(crate) new_since: Option<Instant>,
}

impl Session {
    /// Feeds into `h` every part of the session's state that decides what it does next
    /// (not the login, a constant; the inbox only between its head and tail): the model
    /// checker (`tests/model.rs`) keeps states it has seen as such fingerprints. Off the
    /// production paths.
    #[doc(hidden)]
    pub fn fingerprint<H: std::hash::Hasher>(&self, h: &mut H) {
        use std::hash::Hash;
        (self.state as u8, self.generation, &self.outbox[..]).hash(h);
        self.inbox[self.head..self.tail].hash(h);
        self.progress.hash(h);
        self.pending.len().hash(h);
        for e in self.pending.iter() {
            (e.round, e.slot, e.sent_at).hash(h);
            debug_hash(h, &e.kind);
        }
        (self.backoff, self.retry_at, self.connect_started).hash(h);
        debug_hash(h, &self.down);
        (self.suspect, self.may_resend, self.sent, self.owed_until).hash(h);
        (self.extend_script_known, self.deletes_owed, self.held).hash(h);
        self.identity
            .map(|i| (i.run_id, i.uptime, i.read_at))
            .hash(h);
        (self.lag_noted, self.connected_before).hash(h);
        (self.identity.map(|i| i.marker), self.marker_created).hash(h);
        (self.seen, self.new_since).hash(h);
    }

    /// A node not connected yet, to be connected at once.
    pub fn new(login: Login, now: Instant) -> Session {
        Session {
            login,
            state: State::Down,
            generation: 0,
            outbox: BytesMut::new(),
            inbox: vec![0; INBOX],
            head: 0,
            tail: 0,
            progress: Progress::default(),
            pending: Fifo::with_capacity(PENDING),
            backoff: Duration::ZERO,
            retry_at: now,
            connect_started: now,
            down: NodeError::Down(Arc::new(NodeError::Closed)),
            suspect: false,
            may_resend: false,
            sent: false,
            owed_until: None,
            extend_script_known: false,
            identity: None,
            deletes_owed: 0,
            held: false,
            lag_noted: false,
            connected_before: false,
            handshake_rtt: None,
            marker_created: false,
            seen: None,
            new_since: None,
        }
    }

    /// Down, and the backoff has passed: time to open a connection.
    #[inline]
    pub fn wants_connect(&self, now: Instant) -> bool {
        self.state == State::Down && now >= self.retry_at
    }

    /// Connecting (TCP connect and the AUTH/SELECT/PING handshake) for longer than
    /// `connect_timeout`, with nothing that forbids dropping it.
    #[inline]
    pub fn connect_expired(&self, now: Instant, connect_timeout: Duration) -> bool {
        // The handshake is part of connecting: a host that accepts the TCP connection but
        // never answers PING (a silent service, a frozen server) has not connected.
        let connecting = self.state == State::Connecting || self.handshaking();
        // A handshaking connection that carries a lock write is kept (see `owed_until`);
        // one still in TCP connect (or in its TLS handshake) has written nothing yet: what
        // is queued waits in the outbox until the connection is established.
        connecting
            && self.state != State::Down
            && now.saturating_duration_since(self.connect_started) > connect_timeout
            && (self.state == State::Connecting || !self.holds_live_write(now))
    }

    /// A connection was opened at `now`: the handshake goes first in the outbox, and
    /// commands queue behind it.
    pub fn opened(&mut self, now: Instant) {
        self.generation += 1;
        self.extend_script_known = false;
        self.identity = None;
        self.marker_created = false;
        self.state = State::Connecting;
        self.connect_started = now;
        let marker = self.login.marker;
        let Login {
            user, password, db, ..
        } = &self.login;
        let mut expects = 0;
        if let Some(pw) = password {
            match user {
                Some(u) => command(&mut self.outbox, &[b"AUTH", u.as_bytes(), pw.as_bytes()]),
                None => command(&mut self.outbox, &[b"AUTH", pw.as_bytes()]),
            }
            expects += 1;
        }
        if *db != 0 {
            let db = db.to_string();
            command(&mut self.outbox, &[b"SELECT", db.as_bytes()]);
            expects += 1;
        }
        for _ in 0..expects {
            self.expect_handshake(Handshake::Ok, now);
        }
        // Who the server is (and since when): a restarted node, or a second endpoint
        // that reaches the same server, must not count like a node that kept its keys.
        command(&mut self.outbox, &[b"INFO", b"server"]);
        self.expect_handshake(Handshake::Info, now);
        // With the guard on, the node's marker: written where missing (which makes the
        // node new), then read. A node without `run_id` is known by it alone.
        if let Some(marker) = marker {
            command(&mut self.outbox, &[b"SET", MARKER_KEY, &marker[..], b"NX"]);
            self.expect_handshake(Handshake::MarkerSet, now);
            command(&mut self.outbox, &[b"GET", MARKER_KEY]);
            self.expect_handshake(Handshake::MarkerGet, now);
        }
        // PING last: its PONG proves the stream is in step before any lock reply is
        // counted. Bytes a server sends unasked right after accepting meet the PING's
        // entry, not a lock command's, and fail the connection.
        command(&mut self.outbox, &[b"PING"]);
        self.expect_handshake(Handshake::Pong, now);
    }

    /// With the marker read (`Ok(None)`: missing; `Err`: not readable), at `now`: whether
    /// the server at this endpoint is new to this client. It is when its marker was
    /// missing (this handshake wrote it) or differs from the one last seen here, or its
    /// `run_id` differs from the one last seen here: another server (a failover behind
    /// the address), or this one without the data it had. Then its yes waits out the
    /// guard from `now`, across reconnects (`Session::new_since`).
    fn judge(&mut self, marker: Result<Option<Marker>, ()>, now: Instant) {
        let identity = self.identity.get_or_insert(Identity {
            run_id: None,
            uptime: None,
            read_at: now,
            marker: None,
            cluster: false,
        });
        identity.marker = marker.ok().flatten();
        let current = (identity.run_id, identity.marker);
        // Both known and not equal: one unknown side (not read, or never seen) is no news.
        fn differs<T: PartialEq>(a: Option<T>, b: Option<T>) -> bool {
            matches!((a, b), (Some(a), Some(b)) if a != b)
        }
        let changed = self.seen.is_some_and(|(run_id, seen_marker)| {
            differs(run_id, current.0) || differs(seen_marker, current.1)
        });
        let missing = matches!(marker, Ok(None));
        if self.marker_created || missing || changed {
            self.new_since = Some(now);
        }
        self.seen = Some(current);
    }

    /// How long, at `at`, the server at this endpoint has been known to be up with its
    /// data, at least (restart guard): its uptime, but no longer than since it was last
    /// found new (`Session::new_since`); with no uptime, since then, or where it was
    /// never found new, as long as it has a marker. `None` when nothing identifies it
    /// (no `INFO` answered, or neither uptime nor marker): no yes of it counts.
    pub fn up_for(&self, at: Instant) -> Option<Duration> {
        let id = self.identity?;
        let by_news = self.new_since.map(|t| at.saturating_duration_since(t));
        match (id.up_for(at), by_news) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (Some(a), None) => Some(a),
            (None, Some(b)) => Some(b),
            (None, None) => id.marker.map(|_| Duration::MAX),
        }
    }

    fn expect_handshake(&mut self, status: Handshake, now: Instant) {
        self.pending.push_back(Expect {
            round: UNCOUNTED,
            slot: 0,
            kind: Expected::Handshake(status),
            sent_at: now,
        });
    }

    /// The connection is established at `now` (the driver has read whatever arrived
    /// first). Bytes received before any command was written are an error: a Redis
    /// server never speaks first; an SSH or SMTP server does.
    pub fn established(&mut self, now: Instant) -> Result<(), NodeError> {
        if self.tail > self.head {
            return Err(NodeError::not_redis(self.unparsed()));
        }
        self.state = State::Ready;
        // What was queued while connecting is only written now: the lag clock starts here.
        for expect in self.pending.iter_mut() {
            expect.sent_at = now;
        }
        Ok(())
    }

    /// Records `count` commands owed, for slots `expect.slot..expect.slot + count`. True
    /// when the line is idle, so the caller writes the bytes straight away (and hands
    /// what the kernel did not take to [`Session::queue`]); false when they must wait in
    /// the outbox behind earlier bytes (the caller then passes them to `queue` whole).
    #[inline(always)]
    pub fn enqueue(&mut self, expect: Expect, count: usize) -> Result<bool, NodeError> {
        if self.pending.len() + count > MAX_PENDING {
            return Err(NodeError::Backlog);
        }
        if count == 1 {
            self.pending.push_back(expect);
        } else {
            for k in 0..count as u32 {
                self.pending.push_back(Expect {
                    slot: expect.slot + k,
                    ..expect
                });
            }
        }
        Ok(self.state == State::Ready && self.outbox.is_empty())
    }

    /// Keeps bytes the kernel did not take, to be written when the socket is writable.
    #[cold]
    pub fn queue(&mut self, rest: &[u8]) -> Result<(), NodeError> {
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

    /// What to write next, once established.
    #[inline]
    pub fn unsent(&self) -> &[u8] {
        if self.state == State::Ready {
            &self.outbox
        } else {
            &[]
        }
    }

    /// The kernel took `n` bytes of [`Session::unsent`].
    #[inline]
    pub fn wrote(&mut self, n: usize) {
        self.outbox.advance(n.min(self.outbox.len()));
    }

    /// Free space at the end of the inbox to read into (after compacting or growing it
    /// if it is full; never past what the limits allow).
    pub fn read_room(&mut self, limits: &Limits) -> Result<&mut [u8], NodeError> {
        if self.tail == self.inbox.len() {
            self.make_room(limits)?;
        }
        Ok(&mut self.inbox[self.tail..])
    }

    /// The free space at the end of the inbox as it is (possibly empty): the hot-path
    /// read, which leaves compaction to [`Session::read_room`].
    #[inline]
    pub fn free_tail(&mut self) -> &mut [u8] {
        &mut self.inbox[self.tail..]
    }

    /// `n` bytes were read into the space given by `read_room` or `free_tail`.
    #[inline]
    pub fn received(&mut self, n: usize) {
        self.tail = (self.tail + n).min(self.inbox.len());
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
    /// [`Session::peek`]. The caller calls [`Session::answered`] once it has taken the
    /// votes of a batch.
    #[inline(always)]
    pub fn take_vote(&mut self) -> Option<(u64, u32, bool)> {
        let expect = self.pending.front()?;
        let Expected::Command(phase) = expect.kind else {
            return None;
        };
        let buf = self.inbox.get(self.head..self.tail)?;
        let (yes, used) = quick_vote(phase, buf)?;
        // A reply nobody waits for carries `UNCOUNTED`, which no round id equals: the
        // caller reads and drops it.
        let vote = (expect.round, expect.slot, yes);
        if phase == Phase::Extend {
            // The extend script answered 0 or 1: the node has it cached. A branch, not
            // a store on every vote.
            self.extend_script_known = true;
        }
        self.take(used);
        Some(vote)
    }

    /// Reads the next complete reply to a lock command in the inbox, in full generality,
    /// and says what it means; `None` while it is incomplete (or the inbox is empty). A
    /// handshake reply answered as it must be is consumed on the way. Everything but an
    /// answer that breaks the stream consumes the reply and its entry in `pending`.
    /// `now` is when the bytes were read, at the earliest: the `INFO` reply's moment.
    pub fn next_answer(&mut self, limits: &Limits, now: Instant) -> Option<Answer> {
        loop {
            if !self.has_input() {
                return None;
            }
            let Some(expect) = self.pending.front().copied() else {
                return Some(Answer::broken(
                    None,
                    NodeError::UnexpectedReply("a reply nobody asked for"),
                ));
            };
            // The server's `INFO` text is not bounded by the limits set for lock replies
            // (a user may set `max_bulk_len` far below it), only by the first read
            // buffer: it is read once per connection.
            let info_limits;
            let limits = if expect.kind == Expected::Handshake(Handshake::Info) {
                info_limits = Limits {
                    max_bulk_len: limits.max_bulk_len.max(INFO_MAX),
                    ..*limits
                };
                &info_limits
            } else {
                limits
            };
            let (reply, used) = match self.peek(limits) {
                Ok(None) => return None,
                Ok(Some(parsed)) => parsed,
                Err(e) => {
                    let error = match (e, expect.kind) {
                        // The first reply is not RESP at all: say what the peer is not.
                        (ProtocolError::UnknownType(_), Expected::Handshake(_)) => {
                            NodeError::not_redis(self.unparsed())
                        }
                        _ => NodeError::Protocol(e),
                    };
                    return Some(Answer::broken(None, error));
                }
            };
            // The reply borrows the inbox: decide, then consume; copy only what a failure
            // reports.
            let phase = match expect.kind {
                Expected::Handshake(Handshake::Info) => {
                    self.identity = match reply {
                        Reply::Bulk(Some(text)) => Identity::parse(text, now),
                        // An ACL may forbid INFO: the node still locks, unidentified.
                        Reply::Error(_) => None,
                        _ => {
                            return Some(Answer::broken(
                                None,
                                NodeError::UnexpectedReply(
                                    "INFO answered with neither text nor an error",
                                ),
                            ));
                        }
                    };
                    self.consume(used);
                    continue;
                }
                Expected::Handshake(Handshake::MarkerSet) => {
                    match reply {
                        Reply::Simple(b"OK") => self.marker_created = true,
                        // There already; or not writable here (an ACL, a read-only
                        // replica, out of memory): the read that follows tells.
                        Reply::Bulk(None) | Reply::Error(_) => {}
                        _ => {
                            return Some(Answer::broken(
                                None,
                                NodeError::UnexpectedReply(
                                    "SET NX of the marker answered with neither OK nor nil",
                                ),
                            ));
                        }
                    }
                    self.consume(used);
                    continue;
                }
                Expected::Handshake(Handshake::MarkerGet) => {
                    let marker = match reply {
                        Reply::Bulk(Some(value)) => Ok(Some(marker_of(value))),
                        Reply::Bulk(None) => Ok(None),
                        // Not readable (an ACL on the key): the node is judged without it.
                        Reply::Error(_) => Err(()),
                        _ => {
                            return Some(Answer::broken(
                                None,
                                NodeError::UnexpectedReply(
                                    "GET of the marker answered with neither a value nor nil",
                                ),
                            ));
                        }
                    };
                    self.consume(used);
                    self.judge(marker, now);
                    continue;
                }
                Expected::Handshake(want) => {
                    let error = match reply {
                        Reply::Simple(got) if got == want.text() => {
                            self.consume(used);
                            if want == Handshake::Pong {
                                // The handshake's round trip: the one latency measured
                                // off the hot path (health reports).
                                self.handshake_rtt =
                                    Some(now.saturating_duration_since(expect.sent_at));
                            }
                            continue;
                        }
                        Reply::Error(msg) => {
                            NodeError::Handshake(String::from_utf8_lossy(msg).into_owned())
                        }
                        _ => NodeError::UnexpectedReply(
                            "the handshake (AUTH, SELECT, INFO, PING) was answered out of step",
                        ),
                    };
                    return Some(Answer::broken(None, error));
                }
                Expected::Command(phase) | Expected::Script(phase) => phase,
                Expected::FencedAcquire => {
                    let (outcome, counter) = match reply {
                        // Counters are Lua numbers (doubles): exact only up to 2^53.
                        Reply::Integer(n) if (0..=MAX_COUNTER).contains(&n) => {
                            (Outcome::Locked, Some(n as u64))
                        }
                        // `+OK` is the unfenced answer: not this command's.
                        Reply::Simple(_) | Reply::Integer(_) => (
                            Outcome::Failed(NodeError::UnexpectedReply(
                                "a fenced acquire answered with neither a counter nor nil",
                            )),
                            None,
                        ),
                        _ => (interpret(Phase::Acquire, &reply), None),
                    };
                    if !matches!(&outcome, Outcome::Failed(e) if e.breaks_stream()) {
                        self.consume(used);
                    }
                    return Some(Answer {
                        to: Some(expect),
                        outcome,
                        counter,
                    });
                }
            };
            let outcome = interpret(phase, &reply);
            match &outcome {
                Outcome::Failed(e) if e.breaks_stream() => {}
                Outcome::Failed(_) => self.consume(used),
                _ => {
                    self.consume(used);
                    // The extend script answered 0 or 1: the node has it cached.
                    self.extend_script_known |= expect.kind == Expected::Command(Phase::Extend);
                }
            }
            return Some(Answer {
                to: Some(expect),
                outcome,
                counter: None,
            });
        }
    }

    /// How many rounds before `round` the oldest reply the node owes was sent in (counted
    /// or not: a fire-and-forget delete at the front lags like a vote); 0 when it owes
    /// none, or only its handshake.
    #[inline]
    pub fn rounds_behind(&self, round: u64) -> u64 {
        match self.pending.front() {
            Some(e) if e.sent_in() != 0 => round.saturating_sub(e.sent_in()),
            _ => 0,
        }
    }

    /// How many replies the node owes.
    pub fn owed(&self) -> usize {
        self.pending.len()
    }

    /// True when unparsed bytes wait in the inbox.
    #[inline]
    pub fn has_input(&self) -> bool {
        self.head != self.tail
    }

    /// The bytes received and not yet parsed (for error reports).
    pub fn unparsed(&self) -> &[u8] {
        &self.inbox[self.head..self.tail]
    }

    /// Drops a parsed reply from the inbox and its entry from `pending`, and notes that
    /// the node answered.
    #[inline(always)]
    pub fn consume(&mut self, used: usize) {
        self.take(used);
        self.answered();
    }

    /// [`Session::consume`] without [`Session::answered`], for a batch of replies.
    #[inline(always)]
    fn take(&mut self, used: usize) {
        self.progress.clear();
        self.head += used;
        if self.head >= self.tail {
            self.head = 0;
            self.tail = 0;
        }
        if self.deletes_owed != 0
            && self.pending.front().is_some_and(|e| {
                // The uncounted deletes; a fence write-back queued behind a stale write is
                // uncounted too, but no delete.
                !e.counted()
                    && matches!(
                        e.kind,
                        Expected::Command(Phase::Release) | Expected::Script(Phase::Release)
                    )
            })
        {
            self.deletes_owed -= 1;
        }
        self.pending.pop_front();
    }

    /// The node answered: it is healthy again, and the next failure reconnects at once.
    #[inline(always)]
    pub fn answered(&mut self) {
        self.backoff = Duration::ZERO;
        self.suspect = false;
    }

    /// The handshake (AUTH, SELECT, PING) is not answered yet.
    #[inline]
    pub fn handshaking(&self) -> bool {
        matches!(
            self.pending.front(),
            Some(Expect {
                kind: Expected::Handshake(_),
                ..
            })
        )
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
            && self.pending.iter().any(|e| {
                matches!(
                    e.kind,
                    Expected::Command(Phase::Acquire | Phase::Extend)
                        | Expected::Script(Phase::Acquire | Phase::Extend)
                        | Expected::FencedAcquire
                )
            })
    }

    /// The connection is gone: everything queued on it is dropped; a new one is opened
    /// after the backoff, which doubles (from 10 ms) up to `max_backoff`.
    pub fn fail(&mut self, error: NodeError, now: Instant, max_backoff: Duration) {
        self.state = State::Down;
        self.outbox.clear();
        self.head = 0;
        self.tail = 0;
        self.progress.clear();
        self.pending.clear();
        self.deletes_owed = 0;
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

/// Feeds `value`'s `Debug` text into `h` (for fingerprints of values without `Hash`).
#[doc(hidden)]
pub fn debug_hash<H: std::hash::Hasher>(h: &mut H, value: &impl std::fmt::Debug) {
    struct Into<'a, H>(&'a mut H);
    impl<H: std::hash::Hasher> std::fmt::Write for Into<'_, H> {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            self.0.write(s.as_bytes());
            Ok(())
        }
    }
    let _ = std::fmt::write(&mut Into(h), format_args!("{value:?}|"));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one clock reading of these tests: every other instant is built from it.
    fn base() -> Instant {
        static BASE: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        *BASE.get_or_init(Instant::now)
    }
    fn login() -> Login {
        Login {
            user: Some("app".into()),
            password: Some("pw".into()),
            db: 2,
            marker: None,
        }
    }

    fn command_expect(round: u64, kind: Phase, at: Instant) -> Expect {
        Expect {
            round: if round == 0 { UNCOUNTED } else { round },
            slot: 0,
            kind: Expected::Command(kind),
            sent_at: at,
        }
    }

    /// An `INFO server` reply as Redis 7 writes it (abridged), up 42 s.
    const INFO: &[u8] = b"$121\r\n# Server\r\nredis_version:7.0.15\r\nrun_id:7a1f0c3b9d2e4f5a6b7c8d9e0f1a2b3c4d5e6f70\r\nuptime_in_seconds:42\r\nuptime_in_days:0\r\n\r\n";

    fn feed(s: &mut Session, bytes: &[u8]) {
        let room = s.read_room(&Limits::default()).unwrap();
        room[..bytes.len()].copy_from_slice(bytes);
        s.received(bytes.len());
    }

    #[test]
    fn a_new_connection_sends_its_login_first_and_owes_one_status_each() {
        let now = base();
        let mut s = Session::new(login(), now);
        assert!(s.wants_connect(now));
        s.opened(now);
        assert_eq!(s.state, State::Connecting);
        assert!(
            s.unsent().is_empty(),
            "nothing is written before the connect completes"
        );
        assert!(s.handshaking());
        s.established(now).unwrap();
        let sent = s.unsent().to_vec();
        assert_eq!(
            sent,
            b"*3\r\n$4\r\nAUTH\r\n$3\r\napp\r\n$2\r\npw\r\n*2\r\n$6\r\nSELECT\r\n$1\r\n2\r\n*2\r\n$4\r\nINFO\r\n$6\r\nserver\r\n*1\r\n$4\r\nPING\r\n"
        );
        s.wrote(sent.len());
        assert!(!s.has_unsent());
        assert_eq!(s.pending.len(), 4);
        // A command is pipelined right behind the written handshake: the line is idle.
        assert!(
            s.enqueue(command_expect(1, Phase::Acquire, now), 1)
                .unwrap()
        );
    }

    #[test]
    fn a_server_that_speaks_first_is_not_redis() {
        let now = base();
        let mut s = Session::new(Login::default(), now);
        s.opened(now);
        feed(&mut s, b"SSH-2.0-OpenSSH_9.2\r\n");
        let e = s.established(now).unwrap_err();
        assert!(matches!(e, NodeError::NotRedis(ref shown) if shown.starts_with("SSH-2.0-")));
    }

    #[test]
    fn votes_are_matched_to_their_round_and_slot_in_order() {
        let now = base();
        let mut s = Session::new(Login::default(), now);
        s.opened(now);
        s.established(now).unwrap();
        feed(&mut s, INFO);
        feed(&mut s, b"+PONG\r\n");
        assert_eq!(s.next_answer(&Limits::default(), base()), None);
        assert!(!s.handshaking());
        s.enqueue(command_expect(7, Phase::Acquire, now), 1)
            .unwrap();
        s.enqueue(
            Expect {
                slot: 0,
                ..command_expect(8, Phase::Release, now)
            },
            2,
        )
        .unwrap();
        feed(&mut s, b"+OK\r\n:0\r\n:1");
        assert_eq!(s.take_vote(), Some((7, 0, true)));
        assert_eq!(s.take_vote(), Some((8, 0, false)));
        assert!(
            !s.extend_script_known,
            "a release says nothing of the extend script"
        );
        assert_eq!(s.take_vote(), None, "incomplete");
        feed(&mut s, b"\r\n");
        assert_eq!(s.take_vote(), Some((8, 1, true)));
        assert_eq!(s.pending.len(), 0);
        assert!(!s.has_input());
    }

    #[test]
    fn lag_connect_expiry_and_live_writes() {
        let t0 = base();
        let ms = Duration::from_millis;
        let mut s = Session::new(Login::default(), t0);
        s.opened(t0);
        s.established(t0).unwrap();
        // Handshake unanswered past the connect timeout: expired.
        assert!(s.connect_expired(t0 + ms(1001), ms(1000)));
        // ...unless a SET that may still apply was written behind it.
        s.enqueue(command_expect(1, Phase::Acquire, t0), 1).unwrap();
        s.note_write(Some(t0 + ms(5000)));
        assert!(s.holds_live_write(t0 + ms(4999)));
        assert!(!s.connect_expired(t0 + ms(1001), ms(1000)));
        assert!(s.connect_expired(t0 + ms(5001), ms(1000)));
        // Lagging: the oldest owed reply is older than the cutoff.
        assert!(s.is_lagging(Some(t0 + ms(1))));
        assert!(!s.is_lagging(Some(t0)));
        // Failing drops everything and backs off.
        s.fail(NodeError::Closed, t0, ms(1000));
        assert_eq!(
            (s.state, s.pending.len(), s.has_unsent()),
            (State::Down, 0, false)
        );
        assert!(!s.holds_live_write(t0));
        assert!(s.wants_connect(t0));
        s.opened(t0);
        s.fail(NodeError::Closed, t0, ms(1000));
        assert!(!s.wants_connect(t0 + ms(9)));
        assert!(s.wants_connect(t0 + ms(10)));
    }

    #[test]
    fn a_connection_not_yet_established_expires_whatever_it_queued() {
        // Still in TCP connect (or its TLS handshake): the SET queued behind the login
        // waits in the outbox, unwritten, so nothing can apply it later.
        let t0 = base();
        let ms = Duration::from_millis;
        let mut s = Session::new(Login::default(), t0);
        s.opened(t0);
        s.enqueue(command_expect(1, Phase::Acquire, t0), 1).unwrap();
        s.note_write(Some(t0 + ms(5000)));
        assert_eq!(s.state, State::Connecting);
        assert!(!s.connect_expired(t0 + ms(999), ms(1000)));
        assert!(s.connect_expired(t0 + ms(1001), ms(1000)));
    }

    #[test]
    fn backlogs_are_bounded() {
        let now = base();
        let mut s = Session::new(Login::default(), now);
        s.opened(now);
        assert!(s.queue(&vec![0; MAX_OUTBOX]).is_err());
        assert!(
            s.enqueue(command_expect(1, Phase::Release, now), MAX_PENDING)
                .is_err()
        );
    }

    /// A session past its handshake, owing the given commands (round 1, slots 0..).
    fn ready_owing(kinds: &[Phase]) -> Session {
        let now = base();
        let mut s = Session::new(Login::default(), now);
        s.opened(now);
        s.established(now).unwrap();
        feed(&mut s, INFO);
        feed(&mut s, b"+PONG\r\n");
        // The handshake's answers are consumed on the way: no lock command is answered.
        assert_eq!(s.next_answer(&Limits::default(), base()), None);
        assert!(!s.handshaking());
        for (slot, &kind) in kinds.iter().enumerate() {
            let expect = Expect {
                slot: slot as u32,
                ..command_expect(1, kind, now)
            };
            s.enqueue(expect, 1).unwrap();
        }
        s
    }

    #[test]
    fn every_reply_means_one_thing_and_nothing_is_counted_twice() {
        let limits = Limits::default();
        let mut s = ready_owing(&[
            Phase::Acquire,
            Phase::Extend,
            Phase::Release,
            Phase::Release,
        ]);
        feed(
            &mut s,
            b"-OOM command not allowed\r\n:1\r\n-NOSCRIPT No matching script\r\n+OK\r\n",
        );
        let answer = |s: &mut Session| {
            let a = s.next_answer(&limits, base()).expect("a complete reply");
            (a.to.map(|e| (e.round, e.slot)), a.outcome)
        };
        assert_eq!(
            answer(&mut s),
            (
                Some((1, 0)),
                Outcome::Failed(NodeError::Server("OOM command not allowed".into()))
            )
        );
        assert_eq!(answer(&mut s), (Some((1, 1)), Outcome::Locked));
        assert!(s.extend_script_known);
        assert_eq!(
            answer(&mut s),
            (Some((1, 2)), Outcome::Failed(NodeError::NoScript))
        );
        // `+OK` to a script: the stream is out of step; the vote of that command fails
        // and the reply stays where it is (the connection is dropped).
        let unexpected =
            NodeError::UnexpectedReply("script answered with something other than 0 or 1");
        assert_eq!(
            answer(&mut s),
            (Some((1, 3)), Outcome::Failed(unexpected.clone()))
        );
        assert_eq!(answer(&mut s), (Some((1, 3)), Outcome::Failed(unexpected)));
    }

    #[test]
    fn a_reply_nobody_asked_for_breaks_the_stream() {
        let limits = Limits::default();
        let mut s = ready_owing(&[Phase::Acquire]);
        feed(&mut s, b"$-1\r\n+OK\r\n");
        let vote = s.next_answer(&limits, base()).unwrap();
        assert_eq!((vote.to.unwrap().round, vote.outcome), (1, Outcome::Held));
        assert_eq!(
            s.next_answer(&limits, base()),
            Some(Answer {
                to: None,
                outcome: Outcome::Failed(NodeError::UnexpectedReply("a reply nobody asked for")),
                counter: None,
            })
        );
    }

    #[test]
    fn a_handshake_answered_wrongly_names_the_peer() {
        let limits = Limits::default();
        let now = base();
        let mut s = Session::new(Login::default(), now);
        s.opened(now);
        s.established(now).unwrap();
        feed(&mut s, b"HTTP/1.1 400 Bad Request\r\n");
        assert!(matches!(
            s.next_answer(&limits, base()),
            Some(Answer { to: None, outcome: Outcome::Failed(NodeError::NotRedis(ref shown)), .. })
                if shown.starts_with("HTTP/1.1 400")
        ));
        let mut s = Session::new(
            Login {
                password: Some("wrong".into()),
                ..Login::default()
            },
            now,
        );
        s.opened(now);
        s.established(now).unwrap();
        feed(&mut s, b"-WRONGPASS invalid username-password pair\r\n");
        assert!(matches!(
            s.next_answer(&limits, base()),
            Some(Answer { to: None, outcome: Outcome::Failed(NodeError::Handshake(ref m)), .. })
                if m.starts_with("WRONGPASS")
        ));
        // An incomplete reply is no answer yet.
        let mut s = ready_owing(&[Phase::Acquire]);
        feed(&mut s, b"+O");
        assert_eq!(s.next_answer(&limits, base()), None);
    }

    #[test]
    fn how_far_behind_counts_rounds_not_replies() {
        let now = base();
        let mut s = ready_owing(&[]);
        assert_eq!(s.rounds_behind(9), 0);
        // A batch of 1,000 commands in round 3 is one round, however many replies.
        s.enqueue(command_expect(3, Phase::Acquire, now), 1000)
            .unwrap();
        assert_eq!(s.rounds_behind(4), 1);
        assert_eq!(s.rounds_behind(70), 67);
        // Fire-and-forget replies (round 0) at the front say nothing of rounds.
        let mut s = ready_owing(&[]);
        s.enqueue(command_expect(0, Phase::Release, now), 1)
            .unwrap();
        assert_eq!(s.rounds_behind(70), 0);
    }

    #[test]
    fn the_handshake_reads_who_the_server_is_and_since_when() {
        let t0 = base();
        let mut s = Session::new(Login::default(), t0);
        s.opened(t0);
        s.established(t0).unwrap();
        assert_eq!(s.identity, None);
        feed(&mut s, INFO);
        feed(&mut s, b"+PONG\r\n");
        let read_at = t0 + Duration::from_millis(5);
        // Read whatever the limits on lock replies (the 121-byte text is over this one).
        let tight = Limits {
            max_bulk_len: 64,
            ..Limits::default()
        };
        assert_eq!(s.next_answer(&tight, read_at), None);
        let id = s.identity.expect("INFO server read");
        let run_id = id.run_id.expect("a run_id");
        assert_eq!(&run_id[..], b"7a1f0c3b9d2e4f5a6b7c8d9e0f1a2b3c4d5e6f70");
        assert_eq!(id.up_for(read_at), Some(Duration::from_secs(42)));
        assert_eq!(
            id.up_for(read_at + Duration::from_secs(3)),
            Some(Duration::from_secs(45))
        );
        // A new connection knows nothing until its own INFO is answered.
        s.fail(NodeError::Closed, t0, Duration::from_secs(1));
        s.opened(t0);
        assert_eq!(s.identity, None);
        // An ACL without INFO: the node still locks, unidentified.
        s.established(t0).unwrap();
        feed(
            &mut s,
            b"-NOPERM this user has no permissions to run the 'info' command\r\n+PONG\r\n",
        );
        assert_eq!(s.next_answer(&Limits::default(), t0), None);
        assert!(!s.handshaking());
        assert_eq!(s.identity, None);
    }

    #[test]
    fn identities_are_read_strictly() {
        let t = base();
        let id = |text: &[u8]| Identity::parse(text, t);
        let run = b"run_id:0123456789abcdef0123456789abcdef01234567";
        let with = |extra: &[u8]| [&run[..], b"\r\n", extra, b"\r\n"].concat();
        let uptime = |text: &[u8]| id(text).and_then(|i| i.uptime);
        assert_eq!(uptime(&with(b"uptime_in_seconds:0")), Some(Duration::ZERO));
        // A malformed uptime is no uptime; the run_id still identifies the server.
        for bad in [
            &b"uptime_in_seconds:"[..],
            b"uptime_in_seconds:-1",
            b"uptime_in_seconds:1e3",
        ] {
            assert_eq!(uptime(&with(bad)), None);
            assert!(id(&with(bad)).and_then(|i| i.run_id).is_some());
        }
        assert_eq!(
            uptime(&with(b"uptime_in_seconds:99999999999999999999999")),
            None
        );
        // A malformed run_id is no run_id (a server without one, as Dragonfly and
        // Kvrocks are, is known by its uptime and marker).
        let no_run = id(b"run_id:abc\r\nuptime_in_seconds:5\r\n").expect("the uptime");
        assert_eq!(
            (no_run.run_id, no_run.uptime),
            (None, Some(Duration::from_secs(5)))
        );
        assert_eq!(id(b"uptime_in_seconds:5\r\n").map(|i| i.run_id), Some(None));
        // Neither: nothing identifies it.
        assert_eq!(id(b"redis_version:7.0.15\r\n"), None);
        // Cluster mode, as Redis and Valkey say it.
        let mode = |m: &[u8]| id(&with(m)).is_some_and(|i| i.cluster);
        assert!(mode(b"redis_mode:cluster"));
        assert!(mode(b"server_mode:cluster"));
        assert!(!mode(b"redis_mode:standalone"));
        assert!(!mode(b"redis_mode:clusterx"));
        assert!(!mode(b""));
        // Bare LF line ends are read too.
        let lf = [&run[..], b"\nuptime_in_seconds:7\n"].concat();
        assert_eq!(uptime(&lf), Some(Duration::from_secs(7)));
    }

    /// A session with the guard on (a marker to write), its handshake written and
    /// established at `t`.
    fn guarded(t: Instant) -> Session {
        let login = Login {
            marker: Some([b'm'; 32]),
            ..Login::default()
        };
        let mut s = Session::new(login, t);
        s.opened(t);
        s.established(t).unwrap();
        s
    }

    fn info(run_id: Option<&str>, uptime: u64) -> Vec<u8> {
        let mut text = format!("# Server\r\nuptime_in_seconds:{uptime}\r\n");
        if let Some(r) = run_id {
            text.push_str(&format!("run_id:{r}\r\n"));
        }
        format!("${}\r\n{text}\r\n", text.len()).into_bytes()
    }

    /// Answers the handshake of `s`: INFO, the marker's SET NX (`created`) and GET
    /// (`marker`, nil for `None`), PING; read at `at`.
    fn answer(s: &mut Session, info: &[u8], created: bool, marker: Option<&[u8]>, at: Instant) {
        feed(s, info);
        feed(s, if created { b"+OK\r\n" } else { b"$-1\r\n" });
        match marker {
            Some(m) => feed(s, format!("${}\r\n", m.len()).as_bytes()),
            None => feed(s, b"$-1\r\n"),
        }
        if let Some(m) = marker {
            feed(s, m);
            feed(s, b"\r\n");
        }
        feed(s, b"+PONG\r\n");
        assert_eq!(s.next_answer(&Limits::default(), at), None);
        assert!(!s.handshaking());
    }

    const RUN_A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const RUN_B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

    #[test]
    fn the_guard_writes_then_reads_the_marker_in_the_handshake() {
        let t = base();
        let s = guarded(t);
        let sent = s.unsent().to_vec();
        let set = b"*4\r\n$3\r\nSET\r\n$17\r\nquorumlock:marker\r\n$32\r\nmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmmm\r\n$2\r\nNX\r\n";
        let get = b"*2\r\n$3\r\nGET\r\n$17\r\nquorumlock:marker\r\n";
        let info_at = memchr::memmem::find(&sent, b"INFO").expect("INFO");
        let set_at = memchr::memmem::find(&sent, set).expect("SET NX of the marker");
        let get_at = memchr::memmem::find(&sent, get).expect("GET of the marker");
        let ping_at = memchr::memmem::find(&sent, b"PING").expect("PING");
        assert!(info_at < set_at && set_at < get_at && get_at < ping_at);
        // Without the guard: no marker written or read.
        let mut plain = Session::new(Login::default(), t);
        plain.opened(t);
        assert!(memchr::memmem::find(plain.unsent(), MARKER_KEY).is_none());
    }

    #[test]
    fn a_node_is_new_when_its_marker_is_missing_or_changed_or_its_run_id_changed() {
        let t = base();
        let s10 = Duration::from_secs(10);
        let day = 86_400;
        // Never seen, marker there, up a day: counts from its uptime.
        let mut s = guarded(t);
        answer(&mut s, &info(Some(RUN_A), day), false, Some(b"m1"), t);
        assert_eq!(s.up_for(t), Some(Duration::from_secs(day)));
        // Reconnected: the same server, the same marker: still up a day.
        s.fail(NodeError::Closed, t, Duration::ZERO);
        s.opened(t + s10);
        s.established(t + s10).unwrap();
        answer(
            &mut s,
            &info(Some(RUN_A), day + 10),
            false,
            Some(b"m1"),
            t + s10,
        );
        assert_eq!(s.up_for(t + s10), Some(Duration::from_secs(day + 10)));
        // Another server behind the address (a failover), long up, the marker copied
        // by replication: its run_id differs from the one seen: new from now.
        let t2 = t + 2 * s10;
        s.fail(NodeError::Closed, t2, Duration::ZERO);
        s.opened(t2);
        s.established(t2).unwrap();
        answer(&mut s, &info(Some(RUN_B), day), false, Some(b"m1"), t2);
        assert_eq!(s.up_for(t2), Some(Duration::ZERO));
        assert_eq!(s.up_for(t2 + s10), Some(s10));
        // ... and stays new across a reconnect that sees it again as it is now.
        let t3 = t2 + Duration::from_secs(1);
        s.fail(NodeError::Closed, t3, Duration::ZERO);
        s.opened(t3);
        s.established(t3).unwrap();
        answer(&mut s, &info(Some(RUN_B), day), false, Some(b"m1"), t3);
        assert_eq!(s.up_for(t3), Some(Duration::from_secs(1)));
        // A marker that differs from the one seen: new again.
        let t4 = t3 + s10;
        s.fail(NodeError::Closed, t4, Duration::ZERO);
        s.opened(t4);
        s.established(t4).unwrap();
        answer(&mut s, &info(Some(RUN_B), day), false, Some(b"m2"), t4);
        assert_eq!(s.up_for(t4), Some(Duration::ZERO));
        // A marker missing (this handshake wrote it): new again, whatever the uptime.
        let t5 = t4 + s10;
        s.fail(NodeError::Closed, t5, Duration::ZERO);
        s.opened(t5);
        s.established(t5).unwrap();
        answer(&mut s, &info(Some(RUN_B), day), true, Some(b"mmmm"), t5);
        assert_eq!(s.up_for(t5), Some(Duration::ZERO));
        // A node never seen before whose marker is missing is new too.
        let mut fresh = guarded(t);
        answer(&mut fresh, &info(Some(RUN_A), day), true, Some(b"mmmm"), t);
        assert_eq!(fresh.up_for(t), Some(Duration::ZERO));
    }

    #[test]
    fn a_server_without_run_id_is_known_by_its_marker() {
        let t = base();
        let s10 = Duration::from_secs(10);
        // No run_id, no uptime (a Dragonfly-like INFO): the marker alone.
        let no_id = b"$15\r\n# Server\r\nx:1\r\n\r\n";
        let mut s = guarded(t);
        answer(&mut s, no_id, false, Some(b"m1"), t);
        let id = s.identity.expect("known by its marker");
        assert_eq!((id.run_id, id.uptime), (None, None));
        assert_eq!(s.up_for(t), Some(Duration::MAX));
        // Its marker changed: new, for the guard from now.
        s.fail(NodeError::Closed, t, Duration::ZERO);
        s.opened(t + s10);
        s.established(t + s10).unwrap();
        answer(&mut s, no_id, false, Some(b"m2"), t + s10);
        assert_eq!(s.up_for(t + 2 * s10), Some(s10));
        // Neither INFO's run_id and uptime nor a marker (an ACL on both): unidentified.
        let mut blind = guarded(t);
        feed(
            &mut blind,
            b"-NOPERM info\r\n-NOPERM set\r\n-NOPERM get\r\n+PONG\r\n",
        );
        assert_eq!(blind.next_answer(&Limits::default(), t), None);
        assert!(!blind.handshaking());
        assert_eq!(blind.up_for(t), None);
        // An uptime but no readable marker: judged by the uptime alone.
        let mut no_marker = guarded(t);
        feed(&mut no_marker, &info(Some(RUN_A), 7));
        feed(&mut no_marker, b"-NOPERM set\r\n-NOPERM get\r\n+PONG\r\n");
        assert_eq!(no_marker.next_answer(&Limits::default(), t), None);
        assert_eq!(no_marker.up_for(t), Some(Duration::from_secs(7)));
    }

    #[test]
    fn one_server_is_one_run_id_or_where_there_is_none_one_marker() {
        let t = base();
        let mk = |run_id: Option<u8>, marker: Option<u8>| Identity {
            run_id: run_id.map(|b| [b; 40]),
            uptime: None,
            read_at: t,
            marker: marker.map(u64::from),
            cluster: false,
        };
        assert!(mk(Some(b'a'), Some(1)).same_server(&mk(Some(b'a'), Some(2))));
        // Two servers with one marker (one restored from the other's snapshot) are two.
        assert!(!mk(Some(b'a'), Some(1)).same_server(&mk(Some(b'b'), Some(1))));
        // A run_id hidden on one side (a proxy that strips it): the marker decides.
        assert!(mk(None, Some(1)).same_server(&mk(Some(b'a'), Some(1))));
        assert!(!mk(None, Some(1)).same_server(&mk(None, Some(2))));
        assert!(!mk(None, None).same_server(&mk(None, None)));
    }

    #[test]
    fn a_fenced_acquire_answers_a_counter_that_stays_exact() {
        let limits = Limits::default();
        let mut s = ready_owing(&[]);
        for slot in 0..3 {
            let expect = Expect {
                slot,
                kind: Expected::FencedAcquire,
                ..command_expect(1, Phase::Acquire, base())
            };
            s.enqueue(expect, 1).unwrap();
        }
        feed(&mut s, b":9007199254740991\r\n$-1\r\n:9007199254740992\r\n");
        let a = s.next_answer(&limits, base()).unwrap();
        assert_eq!(
            (a.outcome, a.counter),
            (Outcome::Locked, Some((1 << 53) - 1))
        );
        // Not the fast path: a fenced acquire's reply carries more than a vote.
        assert_eq!(s.take_vote(), None);
        let a = s.next_answer(&limits, base()).unwrap();
        assert_eq!((a.outcome, a.counter), (Outcome::Held, None));
        // 2^53: its fence would not be exact in the node's Lua: out of step.
        let a = s.next_answer(&limits, base()).unwrap();
        assert!(matches!(a.outcome, Outcome::Failed(ref e) if e.breaks_stream()));
    }
}
