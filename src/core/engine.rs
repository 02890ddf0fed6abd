//! The protocol of a whole client, without sockets or a clock: rounds across the nodes,
//! which node is sent what, resend-once on a closed connection, NOSCRIPT → EVAL, lag and
//! reconnects, the release after a lost attempt and behind a stale write.
//!
//! The [`Engine`] owns one [`Session`] per node and the commands of the current round.
//! It reaches the outside world only through a [`Transport`]: open, close, write and
//! read a node's connection, and tell the time. The mio driver implements it with real
//! sockets and the system clock; the deterministic simulation (`tests/sim.rs`) with
//! in-memory pipes and a virtual clock. What to wait for, and for how long, is the
//! caller's loop: it calls [`Engine::begin`], feeds every readiness event to
//! [`Engine::on_event`] until the round is done (for a release, also until no delete
//! waits unwritten: [`Engine::writes_pending`]), or calls [`Round::time_out`].
//!
//! # Invariants
//!
//! - A reply is matched to its command through its session's FIFO, tagged with the round
//!   it belongs to; a reply of an earlier round is read and dropped, never counted in a
//!   later one (round ids start at 1; replies nobody waits for are tagged
//!   [`UNCOUNTED`], which no round id equals).
//! - A node that still owes replies older than `node_timeout`, or replies of a round
//!   more than [`MAX_ROUNDS_BEHIND`] rounds back, is "lagging": it is not
//!   waited for and is sent no new lock command, so a frozen minority costs nothing once
//!   it has been seen to lag. The one thing queued to it is an unlock's compare-and-delete
//!   for a lock whose SET or extend was written there: it runs right after the stale
//!   write when the node wakes.
//! - After a lost attempt, its compare-and-delete is written and not waited for (the
//!   call that lost has returned). An acquire of the same key that follows while some
//!   node still owes that delete's reply writes nothing until every such node has
//!   answered, or until `node_timeout / HOLD_DIVISOR` from its start, when it writes to
//!   the nodes that have; a node still behind then gets the SET once it answers, within
//!   the round. Otherwise a loser that goes straight back would have the node run its
//!   delete and its next SET back to back and retake the key before another client's
//!   SET could. A node not written casts no vote; the round's time bound is unchanged.
//! - A connection found closed during a round (server timeout, `CLIENT KILL`, restart)
//!   is reopened and the command resent once, within the round.
//! - A node lagging for `max(20 × node_timeout, 1 s)` has its connection reset (and a
//!   handshake unanswered after `connect_timeout` is dropped), unless the connection
//!   still owes the reply to a SET or extend whose ttl has not run out. A new connection
//!   after a reset or a connect timeout is sent nothing until its handshake is answered:
//!   a frozen server's kernel still accepts connections.
//! - The steady-state round (every node ready) allocates nothing and reads no clock: the
//!   caller passes `start` in, and the transport is asked for the time only on cold paths
//!   (a failure, a connection established).
//! - The engine calls out to no one: while [`Engine::observe`] is on, node changes
//!   (connected, down, lagging, caught up) are kept as [`Note`]s, in the order they
//!   happened, for the caller to drain once the engine's work of the moment is done.

use super::command::{self, Arg, Command, Frame, KeyList};
use super::round::Round;
use super::script;
use super::session::{Answer, Expect, Expected, Login, Session, State, UNCOUNTED};
use super::token::Token;
use crate::error::{NodeError, Outcome, Phase};
use crate::resp::Limits;
use std::time::{Duration, Instant};

/// What the engine needs from the outside world, per node.
pub trait Transport {
    /// The current time (the only clock the engine sees).
    fn now(&mut self) -> Instant;
    /// Starts opening a connection to `node` (non-blocking), replacing any old one.
    fn open(&mut self, node: usize) -> Result<(), NodeError>;
    /// Closes `node`'s connection, if it has one, dropping whatever was not sent.
    fn close(&mut self, node: usize);
    /// Whether the connection being opened is established: `Ok(false)` not yet.
    fn established(&mut self, node: usize) -> Result<bool, NodeError>;
    /// Writes to `node`'s connection; how many bytes were taken (0 when it is full).
    fn write(&mut self, node: usize, bytes: &[u8]) -> Result<usize, NodeError>;
    /// Reads from `node`'s connection into `buf`.
    fn read(&mut self, node: usize, buf: &mut [u8]) -> Result<Received, NodeError>;
    /// Writes out what the transport itself still holds for `node` (a TLS record its
    /// socket could not take): called on a writable event when the engine has nothing
    /// of its own to write. Nothing by default.
    fn flush(&mut self, node: usize) -> Result<(), NodeError> {
        let _ = node;
        Ok(())
    }
    /// The error for `node`'s connection whose connect timeout ran out (a TLS handshake
    /// with no answer says so). [`NodeError::ConnectTimeout`] by default.
    fn connect_timeout_error(&mut self, node: usize) -> NodeError {
        let _ = node;
        NodeError::ConnectTimeout
    }
}

/// What one read found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Received {
    /// This many bytes (at least 1).
    Bytes(usize),
    /// Nothing now (the read would block).
    Nothing,
    /// The peer closed the connection.
    Closed,
}

/// One resource of a request.
#[derive(Clone, Copy, Debug)]
pub struct Item<'a> {
    /// The key.
    pub key: &'a [u8],
    /// The lock's token, borrowed from whoever keeps it (the lock, or the attempt): a
    /// round copies no token.
    pub token: &'a Token,
}

/// What a round sends.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    /// The command.
    pub phase: Phase,
    /// Its ttl (acquire, extend).
    pub ttl_ms: u64,
    /// One command per item.
    pub items: &'a [Item<'a>],
    /// For a release: the nodes the items' SETs and extends were written to
    /// ([`Engine::written`]). Such a node gets the release even while it lags, queued
    /// behind whatever it has not run yet.
    pub chase: u64,
    /// All items in one command per node, decided as one slot (`lock_all`): every key or
    /// none, with the first item's token.
    pub atomic: bool,
    /// What the round does with fence counters.
    pub fencing: Fencing,
}

impl Request<'_> {
    /// A round of `phase` on `items`, one command and one slot each, without fencing.
    pub fn new<'a>(phase: Phase, ttl_ms: u64, items: &'a [Item<'a>], chase: u64) -> Request<'a> {
        Request {
            phase,
            ttl_ms,
            items,
            chase,
            atomic: false,
            fencing: Fencing::Off,
        }
    }

    /// How many commands (and slots) a node is sent.
    #[inline]
    pub fn commands(&self) -> usize {
        if self.atomic { 1 } else { self.items.len() }
    }

    /// Whether the round goes as the plain commands of [`Command`] (the hot path), not
    /// as scripts over keys.
    #[inline]
    fn plain(&self) -> bool {
        !self.atomic && self.fencing == Fencing::Off && self.phase != Phase::Fence
    }

    /// What a node's reply to this round's command answers: [`Expected::Command`]
    /// exactly when the round is [`Request::plain`].
    #[inline]
    fn expected(&self) -> Expected {
        // The plain commands first: the common case takes one test.
        if self.plain() {
            Expected::Command(self.phase)
        } else if self.phase == Phase::Acquire && self.fencing == Fencing::Read {
            Expected::FencedAcquire
        } else {
            Expected::Script(self.phase)
        }
    }
}

/// What a round does with the items' fence counters (`quorumlock:fence:{<resource>}` on
/// each node, see [`command::FENCE_PREFIX`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fencing {
    /// Nothing.
    Off,
    /// An acquire also reads them: each yes answers its node's largest counter, and
    /// [`Round::counter`] is the largest among the yes votes counted.
    Read,
    /// The fence write-back ([`Phase::Fence`]), or a fenced lock's release: raise them
    /// to this value (a release: where the key is still ours, before deleting it).
    Write(u64),
}

/// The round in progress, while events are dispatched.
pub struct Active<'r> {
    /// Its votes.
    pub round: &'r mut Round,
    /// What it sent.
    pub req: &'r Request<'r>,
}

/// Timing and bounds of an [`Engine`].
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// How long a round waits for a node.
    pub node_timeout: Duration,
    /// How long a connection (and its handshake) may take.
    pub connect_timeout: Duration,
    /// The cap of the doubling reconnect backoff.
    pub max_backoff: Duration,
    /// Bounds on what a server may send.
    pub limits: Limits,
    /// A node's yes to an acquire counts only once it has been up this long
    /// ([`Identity::up_for`](super::session::Identity::up_for)); zero: off.
    pub restart_guard: Duration,
}

/// The client's protocol over every node. `Clone` (plain data) lets the model checker
/// (`tests/model.rs`) fork a world at each choice.
#[derive(Clone)]
pub struct Engine {
    sessions: Vec<Session>,
    /// The commands of the current round (`frames[round_id % 2]`; slot `k`'s is
    /// `command(k)`), encoded once for every node, and of the previous round: a `NOSCRIPT`
    /// that arrives after its round was decided is still answered with `EVAL` from there.
    /// Alternating by parity means no buffer is ever moved or swapped.
    frames: [Frame; 2],
    /// Scratch for per-node extras: EVAL after NOSCRIPT, releases after a lost attempt.
    extra: Vec<u8>,
    /// Round ids start at 1 (and stay below [`UNCOUNTED`], the tag of replies that no
    /// round waits for).
    round_id: u64,
    timing: Timing,
    /// A node lagging this long has its connection reset: a stream that lost bytes (a
    /// broken middlebox) would never catch up, and a new connection starts in step.
    stale_after: Duration,
    /// The limits admit the common replies (`+OK` is a 2-byte line), so the fast path
    /// may take them without the general parser.
    fast_votes: bool,
    /// Set by the slow paths (general parser, connection events): work a caller's wait
    /// budget does not count, so its next wait should be sized by the clock.
    slow_work: bool,
    /// For the current round's SET or extend: its start + ttl, past which our lock can no
    /// longer be valid whatever happens to a copy stuck in a node's socket (one that runs
    /// on thawing sets the key for a whole ttl from then: the unlock's delete, queued
    /// behind it, is what removes it).
    write_until: Option<Instant>,
    /// When the current round started: the restart guard measures uptime from there.
    round_start: Option<Instant>,
    /// Nodes whose votes go through [`Engine::screen`] before they count: an endpoint
    /// that reaches the same server as another, and with a restart guard, one not yet
    /// known to have been up for it. Empty in steady state: the hot path pays one test.
    watch: u64,
    /// Nodes whose replies skip the fast path ([`Session::take_vote`]): `watch`, or every
    /// node when `fast_votes` is off. One test per reply on the hot path.
    slow_votes: u64,
    /// Hashes of the keys of the last lost attempt ([`Engine::release_lost`]), sorted (a
    /// batch may lose many): an acquire of one of them waits for that attempt's deletes before it writes (see the module's
    /// invariants).
    lost_keys: Vec<u64>,
    /// How many nodes hold the current round's command back: exactly those with
    /// [`Session::held`] set.
    held: usize,
    /// While the current round writes nothing yet, waiting for the deletes of the last
    /// lost attempt: when it stops waiting for the stragglers.
    hold_until: Option<Instant>,
    /// A superset of the nodes whose outbox holds bytes: set wherever bytes are queued
    /// ([`Engine::send`] past a short write, a connection opened with its handshake),
    /// narrowed by [`Engine::writes_pending`]. Empty in steady state, so that test is one
    /// compare.
    queued: u64,
    /// The nodes the current round's command was handed to (those with [`Session::sent`]
    /// set), as a [`chases`] mask: cleared when a round begins, a node's bit set wherever
    /// its `sent` is.
    written: u64,
    /// See [`Engine::take_foreign`].
    foreign: u64,
    /// Whether node changes are kept as [`Note`]s ([`Engine::observe`]): off, the cold
    /// paths that would note one pay a test of this flag, and nothing else does.
    observed: bool,
    /// The node changes noted since the caller last drained them
    /// ([`Engine::drain_notes`]).
    notes: Vec<Note>,
    /// How many sessions have [`Session::lag_noted`] set.
    lag_noted: usize,
    /// When the engine was made (the `GuardWrongClock` fault's wrong clock).
    #[cfg(feature = "model-faults")]
    born: Instant,
}

/// A change in a node's standing, kept as data for the caller while
/// [`Engine::observe`] is on (the engine calls out to nothing): the driver hands these
/// to the user's observer once the engine's work of the moment is done.
#[derive(Clone, Debug)]
pub enum Note {
    /// A connection's handshake was answered: the node takes part again. `first`: its
    /// first connection answered since the engine started (not a reconnect).
    Connected {
        /// The node.
        node: usize,
        /// Not a reconnect.
        first: bool,
    },
    /// The connection failed, or was dropped (a connect that failed or timed out
    /// included): the node is down until it reconnects after its backoff. `error` is
    /// [`NodeError::Down`] with the cause.
    Down {
        /// The node.
        node: usize,
        /// [`NodeError::Down`] with why.
        error: NodeError,
    },
    /// Found to owe replies older than `node_timeout` (or too many rounds back): not
    /// asked, nor waited for, until it catches up. Noted once until then.
    Lagging {
        /// The node.
        node: usize,
    },
    /// A node noted lagging was written a round's command again. (One whose connection
    /// is dropped meanwhile is noted down instead.)
    CaughtUp {
        /// The node.
        node: usize,
    },
}

impl Engine {
    /// An engine for nodes with these logins, none connected yet; [`Engine::maintain`]
    /// starts connecting.
    pub fn new(logins: Vec<Login>, timing: Timing, now: Instant) -> Engine {
        Engine {
            sessions: logins.into_iter().map(|l| Session::new(l, now)).collect(),
            frames: [Frame::default(), Frame::default()],
            extra: Vec::with_capacity(512),
            round_id: 0,
            stale_after: timing
                .node_timeout
                .saturating_mul(20)
                .max(Duration::from_secs(1)),
            fast_votes: timing.limits.max_line_len >= 2,
            timing,
            slow_work: false,
            write_until: None,
            round_start: None,
            watch: 0,
            slow_votes: 0,
            lost_keys: Vec::with_capacity(4),
            held: 0,
            hold_until: None,
            queued: 0,
            written: 0,
            foreign: 0,
            observed: false,
            notes: Vec::new(),
            lag_noted: 0,
            #[cfg(feature = "model-faults")]
            born: now,
        }
        .watching(now)
    }

    /// `self` with its watch list computed as of `now`.
    fn watching(mut self, now: Instant) -> Engine {
        self.refresh_watch(now);
        self
    }

    /// Recomputes which nodes' votes must be screened, as of `at`.
    #[cold]
    fn refresh_watch(&mut self, at: Instant) {
        let guard = self.timing.restart_guard;
        let mut watch = 0;
        for (node, s) in self.sessions.iter().enumerate() {
            let young = !guard.is_zero() && s.up_for(at).is_none_or(|up| up < guard);
            if young || self.twin_of(node).is_some() {
                watch |= node_bit(node);
            }
        }
        self.watch = watch;
        self.slow_votes = if self.fast_votes { watch } else { !0 };
    }

    /// The nodes other than `node` whose server, as last identified, is `node`'s (the
    /// same `run_id`, or where one has none, the same marker).
    fn twins(&self, node: usize) -> impl Iterator<Item = usize> + '_ {
        let identity = self.sessions[node].identity;
        self.sessions
            .iter()
            .enumerate()
            .filter(move |&(m, o)| {
                m != node
                    && matches!((identity, o.identity), (Some(a), Some(b)) if a.same_server(&b))
                    && !super::fault!(AliasCountedTwice)
            })
            .map(|(m, _)| m)
    }

    /// The first node other than `node` that reaches the same server.
    fn twin_of(&self, node: usize) -> Option<usize> {
        self.twins(node).next()
    }

    /// What `node`'s reply `outcome` for `slot` counts as. An endpoint that reaches the
    /// same server as an earlier one in the configuration (a DNS alias, a port forward, a
    /// proxy) never counts: one server, one vote. Should the earlier one's identity have
    /// been learned only after the later one voted in this round, the later one's vote
    /// stands and the earlier one's is the one dropped: never two. With a restart guard,
    /// a yes to an acquire from a node not known to have been up for the guard (at the
    /// round's start) is not counted yet; its no counts, which is the safe direction.
    #[cold]
    fn screen(
        &self,
        node: usize,
        slot: usize,
        phase: Phase,
        outcome: Outcome,
        round: &Round,
    ) -> Outcome {
        // A recorded yes or no (a fence write-back's `Fenced` included) counted.
        let counts = |o: &Option<Outcome>| matches!(o, Some(o) if !matches!(o, Outcome::Failed(_) | Outcome::NoReply | Outcome::NotNeeded));
        if matches!(
            outcome,
            Outcome::Failed(_) | Outcome::NoReply | Outcome::NotNeeded
        ) {
            return outcome;
        }
        for m in self.twins(node) {
            if m < node || counts(&round.vote(m, slot)) {
                return Outcome::Failed(NodeError::Duplicate {
                    of: m,
                    endpoint: String::new(),
                });
            }
        }
        let guard = self.timing.restart_guard;
        let yes = matches!(outcome, Outcome::Locked | Outcome::Released);
        if yes && phase == Phase::Acquire && !guard.is_zero() {
            let s = &self.sessions[node];
            let Some(id) = s.identity else {
                return Outcome::Failed(NodeError::Unidentified);
            };
            let at = self.round_start.unwrap_or(id.read_at);
            let Some(up_for) = s.up_for(at) else {
                return Outcome::Failed(NodeError::Unidentified);
            };
            #[cfg(feature = "model-faults")]
            let up_for = if super::fault!(GuardWrongClock) {
                at.saturating_duration_since(self.born)
            } else {
                up_for
            };
            if up_for < guard {
                return Outcome::Failed(NodeError::YoungerThanGuard { up_for });
            }
        }
        outcome
    }

    /// The nodes' sessions, in configuration order.
    pub fn sessions(&self) -> &[Session] {
        &self.sessions
    }

    /// The number of the current round (what `Session::rounds_behind` measures from).
    pub fn round_id(&self) -> u64 {
        self.round_id
    }

    /// The timing it runs with.
    pub fn timing(&self) -> &Timing {
        &self.timing
    }

    /// From now on, notes node changes ([`Note`]) for [`Engine::drain_notes`].
    pub fn observe(&mut self) {
        self.observed = true;
        // Room for a burst of changes on every node without allocating.
        self.notes.reserve(4 * self.sessions.len());
    }

    /// Whether node changes wait to be drained ([`Engine::drain_notes`]).
    #[inline]
    pub fn has_notes(&self) -> bool {
        !self.notes.is_empty()
    }

    /// The node changes noted since the last call, oldest first.
    pub fn drain_notes(&mut self) -> std::vec::Drain<'_, Note> {
        self.notes.drain(..)
    }

    /// Readiness of tokens that are not nodes' since the last call: bit `i` for token
    /// `nodes + i` (`i < 63`), bit 63 for any other (a waker's).
    pub fn take_foreign(&mut self) -> u64 {
        std::mem::take(&mut self.foreign)
    }

    /// True (once) when slow-path work ran since the last call: the caller's wait budget
    /// did not count it.
    #[inline]
    pub fn take_slow_work(&mut self) -> bool {
        // A store only when it was set: the common answer is a load and a test.
        if self.slow_work {
            self.slow_work = false;
            return true;
        }
        false
    }

    /// Opens connections whose backoff has passed; drops connects that take too long.
    pub fn maintain<T: Transport>(&mut self, t: &mut T, now: Instant) {
        for node in 0..self.sessions.len() {
            self.maintain_node(t, node, now);
        }
    }

    fn maintain_node<T: Transport>(&mut self, t: &mut T, node: usize, now: Instant) {
        let s = &mut self.sessions[node];
        if s.wants_connect(now) {
            self.connect(t, node, now);
        } else if s.connect_expired(now, self.timing.connect_timeout) {
            let why = t.connect_timeout_error(node);
            self.drop_conn(t, node, why, now);
            // The next connection is sent nothing until its handshake is answered:
            // a silent host must not cost `node_timeout` at every reconnect.
            self.sessions[node].suspect = true;
        }
    }

    fn connect<T: Transport>(&mut self, t: &mut T, node: usize, now: Instant) {
        match t.open(node) {
            Ok(()) => {
                // The handshake waits in the outbox until the connection is established.
                self.sessions[node].opened(now);
                self.queued |= node_bit(node);
                // A new connection's server is unknown until its `INFO` is answered (it
                // may have restarted, or refuse `INFO`): under the guard its votes are
                // screened until then, whatever the old connection's server was.
                if !self.timing.restart_guard.is_zero() {
                    self.watch |= node_bit(node);
                    self.slow_votes |= node_bit(node);
                }
            }
            Err(e) => self.drop_conn(t, node, e, now),
        }
    }

    /// Drops `node`'s connection and everything queued on it.
    fn drop_conn<T: Transport>(&mut self, t: &mut T, node: usize, error: NodeError, now: Instant) {
        t.close(node);
        self.sessions[node].fail(error, now, self.timing.max_backoff);
        if self.observed {
            self.note_down(node);
        }
    }

    /// Notes that `node`'s connection is gone (it is no longer lagging: it is down).
    #[cold]
    fn note_down(&mut self, node: usize) {
        let s = &mut self.sessions[node];
        if std::mem::take(&mut s.lag_noted) {
            self.lag_noted -= 1;
        }
        self.notes.push(Note::Down {
            node,
            error: s.down_error(),
        });
    }

    /// Notes that `node`'s new connection answered its handshake, if it just did.
    #[cold]
    fn note_connected(&mut self, node: usize) {
        let s = &mut self.sessions[node];
        if s.state == State::Ready && !s.handshaking() {
            let first = !std::mem::replace(&mut s.connected_before, true);
            self.notes.push(Note::Connected { node, first });
        }
    }

    /// Notes the nodes noted lagging that the round just begun was written to.
    #[cold]
    fn note_caught_up(&mut self) {
        for (node, s) in self.sessions.iter_mut().enumerate() {
            if s.lag_noted && s.sent {
                s.lag_noted = false;
                self.lag_noted -= 1;
                self.notes.push(Note::CaughtUp { node });
            }
        }
    }

    /// Queues `count` commands on `node`, for slots `expect.slot..`, writing them at once
    /// if the line is idle.
    /// Bytes left in the outbox mark `node` in `queued` (the engine's superset of the
    /// nodes with bytes queued).
    #[inline(always)]
    fn send<T: Transport>(
        t: &mut T,
        s: &mut Session,
        queued: &mut u64,
        node: usize,
        bytes: &[u8],
        expect: Expect,
        count: usize,
    ) -> Result<(), NodeError> {
        if s.enqueue(expect, count)? {
            let n = t.write(node, bytes)?;
            if n == bytes.len() {
                return Ok(());
            }
            *queued |= node_bit(node);
            return s.queue(&bytes[n..]);
        }
        *queued |= node_bit(node);
        s.queue(bytes)
    }

    /// Writes as much of `node`'s outbox as the transport takes.
    fn flush<T: Transport>(t: &mut T, s: &mut Session, node: usize) -> Result<(), NodeError> {
        while !s.unsent().is_empty() {
            let n = t.write(node, s.unsent())?;
            if n == 0 {
                break;
            }
            s.wrote(n);
        }
        Ok(())
    }

    /// Reads what `node`'s connection has; `Ok(true)` when the peer closed after it.
    /// Reads on to the end when `drain` (a close that came with the data raises no new
    /// readiness event); otherwise a short read means the connection was drained.
    fn read<T: Transport>(
        t: &mut T,
        s: &mut Session,
        node: usize,
        limits: &Limits,
        drain: bool,
    ) -> Result<bool, NodeError> {
        loop {
            let buf = s.read_room(limits)?;
            let free = buf.len();
            match t.read(node, buf)? {
                Received::Closed => return Ok(true),
                Received::Nothing => return Ok(false),
                Received::Bytes(n) => {
                    s.received(n);
                    if n < free && !drain {
                        return Ok(false);
                    }
                }
            }
        }
    }

    /// Starts a round of `req` at `start` (read before anything is encoded or sent):
    /// writes its command to every node that can take it and records why each other node
    /// cannot.
    pub fn begin<T: Transport>(&mut self, t: &mut T, active: &mut Active<'_>, start: Instant) {
        let req = active.req;
        self.round_id += 1;
        self.round_start = Some(start);
        // Every node's `sent` is set again below (or cleared, by `start_node`).
        self.written = 0;
        if self.watch != 0 {
            // Uptime only grows: a node the guard held back may count from this round.
            self.refresh_watch(start);
        }
        self.write_until = match req.phase {
            Phase::Acquire | Phase::Extend => start.checked_add(Duration::from_millis(req.ttl_ms)),
            _ => None,
        };
        let commands = req.commands();
        active.round.begin(req.phase, self.sessions.len(), commands);
        let frame = &mut self.frames[(self.round_id & 1) as usize];
        frame.clear();
        // What the replies answer; plain commands exactly when `req.plain()`.
        let kind = req.expected();
        match Command::new(req.phase, req.ttl_ms, req.phase != Phase::Release) {
            // An unlock returns at a majority and may never read the other replies, so a
            // `NOSCRIPT` there would go unanswered and leave the key: releases carry the
            // script itself. Extends use its digest once a connection has shown it cached.
            Some(cmd) if matches!(kind, Expected::Command(_)) => {
                for item in req.items {
                    frame.push(cmd, item.key, item.token);
                }
            }
            _ => encode_scripts(frame, req),
        }
        // `start − node_timeout`, computed only if some node owes replies.
        let mut lag_cutoff: Option<Option<Instant>> = None;
        if self.held != 0 {
            // Held by the last round, which was decided before it wrote them: `held`
            // counts the nodes that have `Session::held` set.
            for s in &mut self.sessions {
                s.held = false;
            }
            self.held = 0;
        }
        self.hold_until = None;
        let hold = !self.lost_keys.is_empty() && self.holds_back(req);
        if hold {
            self.hold_until = start.checked_add(self.timing.node_timeout / HOLD_DIVISOR);
        }
        let expect = Expect {
            round: self.round_id,
            slot: 0,
            kind,
            sent_at: start,
        };
        // Node by node, in order: the common ones in passes of `send_common`, each node
        // it stops at (one that is not simply ready, or whose write failed) here.
        let mut node = 0;
        while node < self.sessions.len() {
            let stop = if hold {
                Some((node, None))
            } else {
                self.send_common(t, node, req, expect, &mut lag_cutoff)
            };
            let Some((at, failed)) = stop else {
                break;
            };
            match failed {
                Some(e) => self.fail_conn(t, at, e, Some(active)),
                None => {
                    let cutoff = start.checked_sub(self.timing.node_timeout);
                    self.start_node(t, at, active, start, cutoff, hold);
                }
            }
            node = at + 1;
        }
        if self.held != 0 {
            // Nothing to wait for if no node that takes part owes a delete.
            self.send_held(t, Some(active), None);
        }
        if self.watch != 0 {
            self.fail_known_duplicates(active);
        }
        if self.lag_noted != 0 {
            self.note_caught_up();
        }
    }

    /// Writes the round's command (`expect` its entry in each node's queue) to the nodes
    /// from `from` on that take the common path: a healthy connection with nothing in the
    /// way (ready, not suspect, not lagging, and for an extend, the script known). Stops
    /// at the first node that does not, or whose write fails (with the error), and says
    /// which: the caller handles it and goes on from the next. One pass in steady state,
    /// with the frame's bytes and the round's constants held throughout.
    #[inline(always)]
    fn send_common<T: Transport>(
        &mut self,
        t: &mut T,
        from: usize,
        req: &Request<'_>,
        expect: Expect,
        lag_cutoff: &mut Option<Option<Instant>>,
    ) -> Option<(usize, Option<NodeError>)> {
        let bytes = self.frames[(self.round_id & 1) as usize].bytes();
        let commands = req.commands();
        let (round_id, write_until) = (self.round_id, self.write_until);
        let (start, node_timeout) = (expect.sent_at, self.timing.node_timeout);
        for (node, s) in self.sessions.iter_mut().enumerate().skip(from) {
            let lagging = s.pending.front().is_some_and(|_| {
                let cutoff = *lag_cutoff.get_or_insert_with(|| start.checked_sub(node_timeout));
                s.is_lagging(cutoff) || s.rounds_behind(round_id) > MAX_ROUNDS_BEHIND
            });
            let frame_ok = req.phase != Phase::Extend || s.extend_script_known;
            if s.state != State::Ready || s.suspect || lagging || !frame_ok {
                return Some((node, None));
            }
            s.may_resend = true;
            s.sent = true;
            self.written |= node_bit(node);
            s.note_write(write_until);
            if let Err(e) = Self::send(t, s, &mut self.queued, node, bytes, expect, commands) {
                return Some((node, Some(e)));
            }
        }
        None
    }

    /// An endpoint known to reach the same server as an earlier one votes "failed" at
    /// once: its votes never count, and its report says so even when the round is
    /// decided before it answers. (It was still sent the command, as any other node.)
    #[cold]
    fn fail_known_duplicates(&self, active: &mut Active<'_>) {
        for node in 0..self.sessions.len() {
            if self.watch & node_bit(node) == 0 {
                continue;
            }
            let Some(of) = self.twins(node).find(|&m| m < node) else {
                continue;
            };
            let duplicate = NodeError::Duplicate {
                of,
                endpoint: String::new(),
            };
            for slot in 0..active.round.slots() {
                active
                    .round
                    .record(node, slot, Outcome::Failed(duplicate.clone()));
            }
        }
    }

    /// Whether `req` is an acquire of a key of the last lost attempt while some node still
    /// owes that attempt's delete; forgets the lost keys once no node owes one.
    #[cold]
    fn holds_back(&mut self, req: &Request<'_>) -> bool {
        if !self.sessions.iter().any(|s| s.deletes_owed != 0) {
            self.lost_keys.clear();
            return false;
        }
        req.phase == Phase::Acquire
            && req
                .items
                .iter()
                .any(|item| self.lost_keys.binary_search(&key_hash(item.key)).is_ok())
    }

    /// While the current round holds its writes back for the last lost attempt's
    /// deletes: when the caller should call [`Engine::release_held`] if no reply has
    /// ended the wait by then.
    #[inline]
    pub fn hold_until(&self) -> Option<Instant> {
        self.hold_until
    }

    /// Whether the current round holds its writes back ([`Engine::hold_until`] is set):
    /// one test for the caller's loop, which otherwise never looks at the hold.
    #[inline]
    pub fn holding(&self) -> bool {
        self.hold_until.is_some()
    }

    /// At `now`, past [`Engine::hold_until`]: stops waiting for the deletes that are not
    /// answered yet. The round's command goes to every node that has answered its deletes
    /// (or owed none); a node still owing one gets it once it answers, within the round.
    pub fn release_held<T: Transport>(&mut self, t: &mut T, active: &mut Active<'_>, now: Instant) {
        if self.hold_until.is_some_and(|until| now >= until) {
            self.send_held(t, Some(active), Some(now));
        }
    }

    /// Sends the round's command to a node that is not simply ready, holds it back
    /// (`hold`: an acquire of a key of the last lost attempt, whose deletes some node
    /// still owes), or records why the node cannot take part.
    #[cold]
    fn start_node<T: Transport>(
        &mut self,
        t: &mut T,
        node: usize,
        active: &mut Active<'_>,
        now: Instant,
        lag_cutoff: Option<Instant>,
        hold: bool,
    ) {
        self.sessions[node].may_resend = false;
        self.sessions[node].sent = false;
        let s = &self.sessions[node];
        if s.is_lagging(lag_cutoff) || s.rounds_behind(self.round_id) > MAX_ROUNDS_BEHIND {
            // The caller may simply not have polled for a while (it was busy in its
            // critical section) while the replies sit unread in the socket: read them
            // before calling the node lagging.
            self.on_event(t, node, true, false, None);
        }
        let s = &self.sessions[node];
        // A stream that lags this long may have lost bytes (a broken middlebox): start
        // afresh. Not a handshake (the connect timeout bounds it), and not while a lock
        // write may still apply there (see `Session::holds_live_write`).
        if !s.handshaking()
            && s.is_lagging(now.checked_sub(self.stale_after))
            && !s.holds_live_write(now)
        {
            self.drop_conn(t, node, NodeError::Lagging, now);
            self.sessions[node].suspect = true;
        }
        let s = &self.sessions[node];
        if s.state != State::Ready || s.handshaking() {
            self.maintain_node(t, node, now);
        }
        let s = &self.sessions[node];
        if s.state == State::Down {
            active.round.fail_node(node, &s.down_error());
            return;
        }
        if s.suspect
            || s.is_lagging(lag_cutoff)
            || s.rounds_behind(self.round_id) > MAX_ROUNDS_BEHIND
        {
            // A connection that has not finished its handshake is connecting, whatever
            // made it slow; one that answered it and then fell behind is lagging.
            let why = if s.handshaking() {
                NodeError::Connecting
            } else {
                NodeError::Lagging
            };
            if self.observed && why == NodeError::Lagging && !s.lag_noted {
                self.sessions[node].lag_noted = true;
                self.lag_noted += 1;
                self.notes.push(Note::Lagging { node });
            }
            // A fence write-back goes to every node whose connection is up, a lagging one
            // too: it raises the counter there whenever the node runs it.
            let behind = match active.req.phase {
                Phase::Release => {
                    chases(active.req.chase, node) && !super::fault!(UnlockSkipsLagging)
                }
                Phase::Fence => true,
                _ => false,
            };
            if behind {
                self.queue_behind_stale(t, node, active.req, now);
            }
            // Nothing else new is queued for a node that does not read: its backlog would
            // only grow. A lock command queued there earlier may apply when it wakes up;
            // the holder's unlock follows it there (above), or the key expires with the
            // ttl under a token nobody reuses.
            active.round.fail_node(node, &why);
            return;
        }
        let s = &mut self.sessions[node];
        if hold {
            // Written once the deletes are answered (`send_held`): were the SET right
            // behind its delete, the node would run the two back to back and the key we
            // just freed there would be ours again before any other client's SET could
            // take it. Not a vote until then; the round's time bound stands.
            s.held = true;
            self.held += 1;
            return;
        }
        s.may_resend = true;
        s.sent = true;
        self.written |= node_bit(node);
        s.note_write(self.write_until);
        if let Err(e) = self.send_round(t, node, active.req, now) {
            self.fail_conn(t, node, e, Some(active));
        }
    }

    /// Sends the current round's command to `node` off the hot path (a node just
    /// (re)connected, or found not simply ready): the frame, or for an extend on a
    /// connection that has not answered one yet, the script itself.
    fn send_round<T: Transport>(
        &mut self,
        t: &mut T,
        node: usize,
        req: &Request<'_>,
        now: Instant,
    ) -> Result<(), NodeError> {
        let s = &mut self.sessions[node];
        let expect = Expect {
            round: self.round_id,
            slot: 0,
            kind: req.expected(),
            sent_at: now,
        };
        let bytes = command_for(
            &self.frames[(self.round_id & 1) as usize],
            &mut self.extra,
            req,
            s.extend_script_known,
        );
        Self::send(t, s, &mut self.queued, node, bytes, expect, req.commands())
    }

    /// An unlock still queues its compare-and-delete on a connection that lags (a frozen
    /// or stalled node), not waited for: a SET or an extend queued there earlier applies
    /// when the node wakes, and Redis runs one connection's commands in order, so the
    /// delete behind it removes the key instead of leaving it for a whole ttl. A fence
    /// write-back is queued there the same way. Bounded by the connection's backlog
    /// limits; EVAL, not EVALSHA, since no one will read a NOSCRIPT.
    #[cold]
    fn queue_behind_stale<T: Transport>(
        &mut self,
        t: &mut T,
        node: usize,
        req: &Request<'_>,
        now: Instant,
    ) {
        self.extra.clear();
        if req.plain() {
            for item in req.items {
                command::encode(
                    &mut self.extra,
                    Command::release(false),
                    item.key,
                    item.token,
                );
            }
        } else {
            // A fenced or multi-resource release: the round's own scripts (EVAL already),
            // so a fenced lock's key is never freed without its fence there.
            let frame = &self.frames[(self.round_id & 1) as usize];
            self.extra.extend_from_slice(frame.bytes());
        }
        let count = req.commands();
        let expect = Expect {
            round: self.round_id | UNCOUNTED,
            slot: 0,
            kind: req.expected(),
            sent_at: now,
        };
        let s = &mut self.sessions[node];
        match Self::send(t, s, &mut self.queued, node, &self.extra, expect, count) {
            Ok(()) if req.phase == Phase::Release => s.deletes_owed += count,
            Ok(()) => {}
            Err(e) => self.drop_conn(t, node, e, now),
        }
    }

    /// Handles one readiness event of `node` (`closed`: the peer hung up or the socket
    /// errored); `active` is the round waiting for votes, if any.
    #[inline(always)]
    pub fn on_event<T: Transport>(
        &mut self,
        t: &mut T,
        node: usize,
        readable: bool,
        closed: bool,
        mut active: Option<&mut Active<'_>>,
    ) {
        // The hot path: replies on an established connection with nothing queued. The
        // session is looked up once, for the read and for the votes it brings.
        if readable && !closed {
            // Steady state watches no node: one test, no bit to compute.
            let fast = self.slow_votes == 0 || !chases(self.slow_votes, node);
            let round_id = self.round_id;
            if let Some(s) = self.sessions.get_mut(node) {
                if s.state == State::Ready && !s.has_unsent() {
                    let buf = s.free_tail();
                    let free = buf.len();
                    if free > 0 {
                        match t.read(node, buf) {
                            Ok(Received::Bytes(n)) => {
                                s.received(n);
                                // A short read drained the socket: any later byte raises a
                                // new edge. A full one may have left more behind.
                                if n < free {
                                    let more = Self::votes_of(
                                        s,
                                        node,
                                        fast,
                                        round_id,
                                        active.as_deref_mut(),
                                    );
                                    return self.dispatch_fresh(t, node, more, active);
                                }
                            }
                            Ok(Received::Nothing) => {
                                let more =
                                    Self::votes_of(s, node, fast, round_id, active.as_deref_mut());
                                return self.dispatch_fresh(t, node, more, active);
                            }
                            Ok(Received::Closed) => {
                                return self.dispatch_then_close(t, node, active);
                            }
                            Err(e) => return self.fail_conn(t, node, e, active),
                        }
                    }
                }
            }
        }
        self.on_event_slow(t, node, readable, closed, active);
    }

    #[cold]
    fn on_event_slow<T: Transport>(
        &mut self,
        t: &mut T,
        node: usize,
        readable: bool,
        closed: bool,
        active: Option<&mut Active<'_>>,
    ) {
        self.slow_work = true;
        let Some(s) = self.sessions.get_mut(node) else {
            // Not a node: a source its owner registered beside the nodes (the shared
            // client's waker and subscriber connections); kept for it (`take_foreign`).
            let n = self.sessions.len();
            self.foreign |= match node.checked_sub(n) {
                Some(i) if i < 63 => 1 << i,
                _ => 1 << 63,
            };
            return;
        };
        if s.state == State::Down {
            return; // an event for a connection already dropped
        }
        if s.state == State::Connecting {
            match t.established(node) {
                Ok(true) => {}
                Ok(false) => return,
                Err(e) => return self.fail_conn(t, node, e, active),
            }
            // Nothing has been written yet, so any byte already here is one no command
            // asked for: the session refuses it.
            let now = t.now();
            let read = Self::read(t, s, node, &Limits::default(), true);
            let ready = read.and_then(|_| s.established(now));
            if let Err(e) = ready {
                return self.fail_conn(t, node, e, active);
            }
        }
        let flushed = if s.has_unsent() {
            Self::flush(t, s, node)
        } else {
            // What the transport holds (a TLS record a full socket did not take).
            t.flush(node)
        };
        if let Err(e) = flushed {
            return self.fail_conn(t, node, e, active);
        }
        if !readable {
            return;
        }
        match Self::read(t, s, node, &self.timing.limits, closed) {
            Ok(false) => self.dispatch(t, node, active),
            Ok(true) => self.dispatch_then_close(t, node, active),
            Err(e) => self.fail_conn(t, node, e, active),
        }
    }

    /// Dispatches what was read before the peer closed, then drops the connection.
    #[cold]
    fn dispatch_then_close<T: Transport>(
        &mut self,
        t: &mut T,
        node: usize,
        mut active: Option<&mut Active<'_>>,
    ) {
        let generation = self.sessions[node].generation;
        self.dispatch(t, node, active.as_deref_mut());
        // Only the connection that was read can be declared closed: dispatch may have
        // replaced it (a resend after a failure) with a fresh one.
        let s = &self.sessions[node];
        if s.state != State::Down && s.generation == generation {
            self.fail_conn(t, node, NodeError::Closed, active);
        }
    }

    /// [`Engine::dispatch`] right after a read on a ready connection, once the common
    /// votes were taken ([`Engine::votes_of`]): `more` when input is left that needs the
    /// general path.
    #[inline(always)]
    fn dispatch_fresh<T: Transport>(
        &mut self,
        t: &mut T,
        node: usize,
        more: bool,
        active: Option<&mut Active<'_>>,
    ) {
        if more {
            self.dispatch(t, node, active);
        } else if self.held != 0 {
            self.send_held(t, active, None);
        }
    }

    /// Feeds every complete reply in `node`'s inbox to whoever waits for it.
    #[inline]
    fn dispatch<T: Transport>(
        &mut self,
        t: &mut T,
        node: usize,
        mut active: Option<&mut Active<'_>>,
    ) {
        loop {
            let s = &self.sessions[node];
            if s.state != State::Ready || !s.has_input() {
                break;
            }
            if !self.take_votes(node, active.as_deref_mut()) {
                break;
            }
            if !self.dispatch_one(t, node, active.as_deref_mut()) {
                break;
            }
        }
        if self.held != 0 {
            self.send_held(t, active, None);
        }
    }

    /// Writes the current round's command to the nodes that held it back, once every
    /// node that owes a delete has answered it (or at `now`, past [`Engine::hold_until`]:
    /// to those that have; the others get it as they answer). A node whose connection
    /// broke meanwhile fails. Only within the round: once it is decided, a held node is
    /// sent nothing, and never counts a vote.
    #[cold]
    fn send_held<T: Transport>(
        &mut self,
        t: &mut T,
        active: Option<&mut Active<'_>>,
        now: Option<Instant>,
    ) {
        let Some(active) = active else {
            return;
        };
        if active.round.is_done() {
            return;
        }
        if let Some(until) = self.hold_until {
            let waiting = self
                .sessions
                .iter()
                .any(|s| s.held && s.deletes_owed != 0 && s.state != State::Down);
            if waiting && now.is_none_or(|now| now < until) {
                return;
            }
            self.hold_until = None;
        }
        let mut sent_at = now;
        for node in 0..self.sessions.len() {
            // A failure below may decide the round: then nothing more is sent.
            if active.round.is_done() {
                break;
            }
            let s = &mut self.sessions[node];
            if !s.held || (s.deletes_owed != 0 && s.state != State::Down) {
                continue;
            }
            s.held = false;
            self.held -= 1;
            // Connecting: queued behind the handshake, as `start_node` would have.
            if s.state == State::Down {
                let why = s.down_error();
                active.round.fail_node(node, &why);
                continue;
            }
            s.may_resend = true;
            s.sent = true;
            self.written |= node_bit(node);
            s.note_write(self.write_until);
            let expect = Expect {
                round: self.round_id,
                slot: 0,
                kind: active.req.expected(),
                sent_at: *sent_at.get_or_insert_with(|| t.now()),
            };
            let bytes = self.frames[(self.round_id & 1) as usize].bytes();
            if let Err(e) = Self::send(
                t,
                s,
                &mut self.queued,
                node,
                bytes,
                expect,
                active.req.commands(),
            ) {
                self.fail_conn(t, node, e, Some(active));
            }
        }
    }

    /// Takes the replies at the front of `node`'s inbox that are common votes
    /// ([`Session::take_vote`]) and counts them; true when input is left that needs the
    /// general path.
    #[inline(always)]
    fn take_votes(&mut self, node: usize, active: Option<&mut Active<'_>>) -> bool {
        let fast = self.slow_votes & node_bit(node) == 0;
        let round_id = self.round_id;
        match self.sessions.get_mut(node) {
            Some(s) => Self::votes_of(s, node, fast, round_id, active),
            None => false,
        }
    }

    /// [`Engine::take_votes`] on `node`'s session `s`: with `fast` (the node's votes are
    /// not screened: see `slow_votes`), takes the common votes at the front of its inbox
    /// and counts those of round `round_id` in `active`; true when input is left that
    /// needs the general path.
    #[inline(always)]
    fn votes_of(
        s: &mut Session,
        node: usize,
        fast: bool,
        round_id: u64,
        mut active: Option<&mut Active<'_>>,
    ) -> bool {
        if !fast {
            return s.has_input();
        }
        let mut taken = false;
        while let Some((round, slot, yes)) = s.take_vote() {
            taken = true;
            // Votes count only in the round that is waiting for them; a late reply of
            // an earlier round is read and dropped.
            if round == round_id {
                if let Some(a) = active.as_deref_mut() {
                    a.round.tally(node, slot as usize, yes);
                }
            }
            if !s.has_input() {
                break;
            }
        }
        if taken {
            // Once per batch rather than per reply: nothing reads it in between.
            s.answered();
        }
        s.has_input()
    }

    /// Handles the next reply in `node`'s inbox in full generality; false when there is
    /// none (or the connection failed).
    #[cold]
    fn dispatch_one<T: Transport>(
        &mut self,
        t: &mut T,
        node: usize,
        mut active: Option<&mut Active<'_>>,
    ) -> bool {
        // Whatever happens next took parser time a wait budget did not see.
        self.slow_work = true;
        // The moment the bytes were read, at the earliest (an `INFO` reply is dated by it).
        let now = t.now();
        let before = self.sessions[node].identity;
        let handshaking = self.observed && self.sessions[node].handshaking();
        let answer = self.sessions[node].next_answer(&self.timing.limits, now);
        if handshaking {
            self.note_connected(node);
        }
        if self.sessions[node].identity != before {
            self.refresh_watch(self.round_start.unwrap_or(now));
        }
        let Some(answer) = answer else {
            return false;
        };
        // Votes count only in the round that is waiting for them; handshake and
        // fire-and-forget replies carry round 0, which never is.
        let round_id = self.round_id;
        // (A tagged round, `UNCOUNTED`, equals no round id.)
        let current = |e: &Expect| e.round == round_id;
        match answer {
            Answer {
                to,
                outcome: Outcome::Failed(error),
                ..
            } if error.breaks_stream() => {
                if let Some(expect) = to {
                    if let Some(a) = active.as_deref_mut().filter(|_| current(&expect)) {
                        a.round
                            .record(node, expect.slot as usize, Outcome::Failed(error.clone()));
                    }
                }
                self.fail_conn(t, node, error, active);
                return false;
            }
            Answer {
                to: Some(expect),
                outcome: Outcome::Failed(NodeError::NoScript),
                ..
            } => {
                let slot = expect.slot as usize;
                self.extra.clear();
                match active.as_deref_mut().filter(|_| current(&expect)) {
                    // The server lost its script cache (restart, SCRIPT FLUSH): send the
                    // script itself, once, in this same round.
                    Some(a) => {
                        let Some(item) = a.req.items.get(slot) else {
                            return true;
                        };
                        // Scripts over keys go as EVAL already: a NOSCRIPT to one is a
                        // server's confusion.
                        let Some(cmd) = Command::new(a.req.phase, a.req.ttl_ms, false)
                            .filter(|_| a.req.plain())
                        else {
                            return true;
                        };
                        command::encode(&mut self.extra, cmd, item.key, item.token);
                    }
                    // The round was decided before this node answered NOSCRIPT; it still
                    // gets the script (its vote no longer counts), so that every node the
                    // command reached ends up with the same key state. Only the current
                    // and the previous round's commands are kept.
                    None => {
                        // A fire-and-forget delete goes as EVAL already: a NOSCRIPT to
                        // it is a server's confusion, and its frame is not kept.
                        let kept = expect.counted()
                            && (expect.round == self.round_id || expect.round + 1 == self.round_id);
                        if !kept {
                            return true;
                        }
                        let frame = &self.frames[(expect.round & 1) as usize];
                        if !command::evalsha_to_eval(&mut self.extra, frame.command(slot)) {
                            return true;
                        }
                    }
                }
                let s = &mut self.sessions[node];
                if let Err(e) = Self::send(t, s, &mut self.queued, node, &self.extra, expect, 1) {
                    self.fail_conn(t, node, e, active);
                    return false;
                }
            }
            // A vote (yes, no, or refused by the server), or a NOSCRIPT to a command no
            // one asked for, which `next_answer` never returns.
            Answer {
                to,
                outcome,
                counter,
            } => {
                if let Some(expect) = to {
                    if let Some(a) = active.filter(|_| current(&expect)) {
                        let slot = expect.slot as usize;
                        let outcome = if self.watch & node_bit(node) != 0 {
                            self.screen(node, slot, a.req.phase, outcome, a.round)
                        } else {
                            outcome
                        };
                        // Only a counted yes reads a counter: a node whose yes does not
                        // count (an alias, a young node) may hold a stale or empty one,
                        // which could only lower the maximum anyway.
                        if a.round.record(node, slot, outcome) {
                            if let Some(counter) = counter {
                                a.round.raise_counter(slot, counter);
                            }
                        }
                    }
                }
            }
        }
        true
    }

    /// Drops `node`'s connection. Within a round, a connection found closed is reopened
    /// and the command resent once; otherwise the node's open votes fail. A resent lock
    /// command that the old connection had in fact delivered meets our own key and counts
    /// as "held": the safe direction.
    #[cold]
    fn fail_conn<T: Transport>(
        &mut self,
        t: &mut T,
        node: usize,
        error: NodeError,
        active: Option<&mut Active<'_>>,
    ) {
        let now = t.now();
        // Closed or reset: most likely the server dropped a connection we had not used
        // for a while (timeout, CLIENT KILL, restart). Anything else is the node's fault.
        let stale = matches!(error, NodeError::Closed | NodeError::Io(..));
        // A node whose SET was held back (see `Engine::begin`) has not had its one send
        // of the round yet: a closed connection gets it on the new one, behind the
        // handshake, which spaces it from the deletes as the hold would have.
        let was_held = std::mem::take(&mut self.sessions[node].held);
        if was_held {
            self.held -= 1;
        }
        let may_resend = std::mem::take(&mut self.sessions[node].may_resend);
        self.drop_conn(t, node, error.clone(), now);
        let Some(active) = active else {
            return;
        };
        // Once the round is decided, a held node is sent nothing.
        let resend = stale && (may_resend || (was_held && !active.round.is_done()));
        'failed: {
            if resend {
                self.connect(t, node, now);
                if self.sessions[node].state != State::Down {
                    if self.send_round(t, node, active.req, now).is_ok() {
                        let s = &mut self.sessions[node];
                        s.sent = true;
                        self.written |= node_bit(node);
                        s.note_write(self.write_until);
                        break 'failed;
                    }
                    self.drop_conn(t, node, NodeError::Backlog, now);
                }
            }
            active.round.fail_node(node, &error);
        }
        // The node may have been the last one the held nodes waited for.
        if self.held != 0 {
            self.send_held(t, Some(active), None);
        }
    }

    /// Fire-and-forget compare-and-delete of `lost` slots on every node the round's
    /// command was sent to (the spec: unlock all instances, even those believed not
    /// locked; a node that said "held" may have been answering a resend that met our own
    /// key). A connection that died meanwhile is reopened for it. Uses EVAL, not EVALSHA:
    /// no reply is read, so a NOSCRIPT could not be answered. Queued bytes go out now or
    /// at the next event.
    pub fn release_lost<T: Transport>(&mut self, t: &mut T, items: &[Item<'_>], lost: &[usize]) {
        if lost.is_empty() {
            return;
        }
        self.extra.clear();
        self.lost_keys.clear();
        for &slot in lost {
            let item = &items[slot];
            self.lost_keys.push(key_hash(item.key));
            command::encode(
                &mut self.extra,
                Command::release(false),
                item.key,
                item.token,
            );
        }
        self.lost_keys.sort_unstable();
        let now = t.now();
        for node in 0..self.sessions.len() {
            if !self.sessions[node].sent {
                continue;
            }
            if self.sessions[node].state == State::Down {
                self.connect(t, node, now);
            }
            let s = &mut self.sessions[node];
            if s.state == State::Down {
                continue;
            }
            let expect = Expect {
                round: self.round_id | UNCOUNTED,
                slot: 0,
                kind: Expected::Command(Phase::Release),
                sent_at: now,
            };
            match Self::send(
                t,
                s,
                &mut self.queued,
                node,
                &self.extra,
                expect,
                lost.len(),
            ) {
                Ok(()) => s.deletes_owed += lost.len(),
                Err(e) => self.drop_conn(t, node, e, now),
            }
        }
    }

    /// Whether a connection still owes the reply to a delete that nobody waits for (after
    /// a lost attempt, behind a stale write).
    /// Lagging nodes (owing replies older than `node_timeout` at `now`) are not counted:
    /// they may not answer for a long time.
    pub fn owes_deletes(&self, now: Instant) -> bool {
        let cutoff = now.checked_sub(self.timing.node_timeout);
        self.sessions
            .iter()
            .any(|s| s.deletes_owed != 0 && s.state != State::Down && !s.is_lagging(cutoff))
    }

    /// Some node that was sent the current round's command still holds it unwritten (a
    /// connection being reopened, a full socket buffer). An unlock is decided by a
    /// majority, but each delete should at least have left the process before it
    /// returns: its caller may make no further call that would flush it.
    #[inline]
    pub fn writes_pending(&mut self) -> bool {
        self.queued != 0 && self.writes_pending_slow()
    }

    /// [`Engine::writes_pending`] once some node may have bytes queued: looks, and
    /// narrows `queued` to the nodes that do.
    #[cold]
    fn writes_pending_slow(&mut self) -> bool {
        let mut queued = 0;
        for (node, s) in self.sessions.iter().enumerate() {
            if s.has_unsent() {
                queued |= node_bit(node);
            }
        }
        self.queued = queued;
        self.sessions
            .iter()
            .any(|s| s.sent && s.state != State::Down && s.has_unsent())
    }

    /// The nodes the last round's command was handed to, as a [`chases`] mask.
    #[inline]
    pub fn written(&self) -> u64 {
        debug_assert_eq!(
            self.written,
            self.sessions
                .iter()
                .enumerate()
                .filter(|(_, s)| s.sent)
                .fold(0, |mask, (i, _)| mask | node_bit(i))
        );
        self.written
    }

    /// Feeds into `h` everything that decides what the engine does next (each session's
    /// [`Session::fingerprint`], the frames, the round and hold state): the model
    /// checker (`tests/model.rs`) keeps states it has seen as such fingerprints. Off the
    /// production paths.
    #[doc(hidden)]
    pub fn fingerprint<H: std::hash::Hasher>(&self, h: &mut H) {
        use std::hash::Hash;
        for s in &self.sessions {
            s.fingerprint(h);
        }
        (
            self.frames[0].bytes(),
            self.frames[1].bytes(),
            self.round_id,
        )
            .hash(h);
        (
            self.write_until,
            self.round_start,
            self.watch,
            self.slow_votes,
        )
            .hash(h);
        (&self.lost_keys, self.held, self.hold_until, self.queued).hash(h);
        (self.written, self.foreign, self.slow_work).hash(h);
        // Notes are the caller's to drain: their count stands for them (the model never
        // turns observing on, so it is zero there).
        (self.observed, self.notes.len(), self.lag_noted).hash(h);
    }

    /// Sum of buffer capacities over all nodes (for tests of bounded memory).
    pub fn buffered(&self) -> usize {
        self.sessions.iter().map(Session::buffered).sum::<usize>()
            + self.frames[0].capacity()
            + self.frames[1].capacity()
            + self.extra.capacity()
    }
}

/// How many rounds back a node may still owe a reply before it counts as lagging,
/// however young the reply: calls return at a majority, so a node slower than the caller
/// falls behind round after round; this bounds how far (and the memory its queue holds)
/// until it catches up. Counted in rounds, not replies, so a batch round of a thousand
/// commands is one round behind, not a thousand.
pub const MAX_ROUNDS_BEHIND: u64 = 64;

/// An acquire held back for the last lost attempt's deletes waits for the stragglers at
/// most `node_timeout / HOLD_DIVISOR` from its start; the rest of the round's time is for
/// the votes.
pub const HOLD_DIVISOR: u32 = 8;

/// A node's bit in a mask of nodes: nodes from 63 on share the last bit, so a mask is
/// exact for up to 63 nodes and errs on the side of including a node beyond.
#[inline]
pub fn node_bit(node: usize) -> u64 {
    1 << node.min(63)
}

/// Whether `mask` includes `node`.
#[inline]
pub fn chases(mask: u64, node: usize) -> bool {
    mask & node_bit(node) != 0
}

/// The bytes of the round's command for one connection: the frame encoded for every node,
/// or for an extend on a connection that has not answered one yet (a fresh connection, a
/// restarted server with an empty script cache), the script itself, encoded into `extra`.
fn command_for<'a>(
    frame: &'a Frame,
    extra: &'a mut Vec<u8>,
    req: &Request<'_>,
    extend_script_known: bool,
) -> &'a [u8] {
    // Scripts over keys always go as EVAL.
    let cmd = match Command::new(req.phase, req.ttl_ms, false) {
        Some(cmd) if req.plain() && req.phase == Phase::Extend && !extend_script_known => cmd,
        _ => return frame.bytes(),
    };
    extra.clear();
    for item in req.items {
        command::encode(extra, cmd, item.key, item.token);
    }
    extra
}

/// The round's commands as scripts over keys (`EVAL`, see [`command::eval_over`]): for an
/// atomic round one command over every item, with the first item's token; otherwise one
/// per item.
#[cold]
fn encode_scripts(frame: &mut Frame, req: &Request<'_>) {
    let groups = if req.atomic {
        req.items.chunks(req.items.len().max(1))
    } else {
        req.items.chunks(1)
    };
    for group in groups {
        let Some(first) = group.first() else {
            continue;
        };
        let keys = group.iter().map(|item| item.key);
        let token = Arg::Bytes(first.token.as_bytes());
        let ttl = Arg::Int(req.ttl_ms);
        frame.push_encoded(|out| match (req.phase, req.fencing) {
            (Phase::Acquire, fencing) => {
                let which = if fencing == Fencing::Read {
                    KeyList::Both
                } else {
                    KeyList::Locks
                };
                let group = if super::fault!(AcquireAllFirstKey) {
                    &group[..1]
                } else {
                    group
                };
                let n = Arg::Int(group.len() as u64);
                let keys = group.iter().map(|item| item.key);
                command::eval_over(out, script::ACQUIRE, keys, which, &[token, ttl, n]);
            }
            (Phase::Extend, _) => {
                command::eval_over(out, script::EXTEND_ALL, keys, KeyList::Locks, &[token, ttl]);
            }
            // Raised only where the lock keys still hold the token (`script::FENCE`).
            (Phase::Fence, Fencing::Write(fence)) => {
                let fence = Arg::Int(fence);
                command::eval_over(out, script::FENCE, keys, KeyList::Both, &[token, fence]);
            }
            // A fenced lock's release raises each counter to its fence, then deletes.
            (Phase::Release, Fencing::Write(fence)) => {
                let fence = Arg::Int(fence);
                command::eval_over(
                    out,
                    script::RELEASE_FENCED,
                    keys,
                    KeyList::Both,
                    &[token, fence],
                );
            }
            // A write-back is always given its value; without one, 0 raises nothing.
            (Phase::Fence, _) => {
                let zero = Arg::Int(0);
                command::eval_over(out, script::FENCE, keys, KeyList::Both, &[token, zero]);
            }
            _ => command::eval_over(out, script::RELEASE_ALL, keys, KeyList::Locks, &[token]),
        });
    }
}

/// FNV-1a: a collision only holds a SET back for a round trip.
fn key_hash(key: &[u8]) -> u64 {
    key.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one clock reading of these tests: every other instant is built from it.
    fn base() -> Instant {
        static BASE: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        *BASE.get_or_init(Instant::now)
    }

    const NODES: usize = 5;

    /// Connections that always take what is written and hand out what a test feeds.
    struct Pipes {
        now: Instant,
        written: Vec<Vec<u8>>,
        replies: Vec<Vec<u8>>,
        /// Nodes whose peer closes once what was fed is read.
        closing: Vec<bool>,
    }

    impl Transport for Pipes {
        fn now(&mut self) -> Instant {
            self.now
        }
        fn open(&mut self, _: usize) -> Result<(), NodeError> {
            Ok(())
        }
        fn close(&mut self, _: usize) {}
        fn established(&mut self, _: usize) -> Result<bool, NodeError> {
            Ok(true)
        }
        fn write(&mut self, node: usize, bytes: &[u8]) -> Result<usize, NodeError> {
            self.written[node].extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn read(&mut self, node: usize, buf: &mut [u8]) -> Result<Received, NodeError> {
            let r = &mut self.replies[node];
            if r.is_empty() {
                if std::mem::take(&mut self.closing[node]) {
                    return Ok(Received::Closed);
                }
                return Ok(Received::Nothing);
            }
            let n = r.len().min(buf.len());
            buf[..n].copy_from_slice(&r[..n]);
            r.drain(..n);
            Ok(Received::Bytes(n))
        }
    }

    const TIMEOUT: Duration = Duration::from_millis(40);
    const KEY: &[u8] = b"k";

    /// An engine whose five connections have answered their handshake.
    fn ready() -> (Engine, Pipes) {
        ready_with(false)
    }

    /// [`ready`], noting node changes from the start when `observed`.
    fn ready_with(observed: bool) -> (Engine, Pipes) {
        let t0 = base();
        let timing = Timing {
            node_timeout: TIMEOUT,
            connect_timeout: Duration::from_secs(1),
            max_backoff: Duration::from_secs(1),
            limits: Limits::default(),
            restart_guard: Duration::ZERO,
        };
        let mut e = Engine::new(vec![Login::default(); NODES], timing, t0);
        if observed {
            e.observe();
        }
        let mut t = Pipes {
            now: t0,
            written: vec![Vec::new(); NODES],
            replies: vec![Vec::new(); NODES],
            closing: vec![false; NODES],
        };
        e.maintain(&mut t, t0);
        for node in 0..NODES {
            e.on_event(&mut t, node, false, false, None); // established: INFO, PING go out
            // Distinct servers, up for a day.
            let info = format!("run_id:{node:040}\r\nuptime_in_seconds:86400\r\n");
            let info = format!("${}\r\n{info}\r\n+PONG\r\n", info.len());
            t.replies[node].extend_from_slice(info.as_bytes());
            e.on_event(&mut t, node, true, false, None);
            assert!(e.sessions()[node].state == State::Ready && !e.sessions()[node].handshaking());
        }
        (e, t)
    }

    /// One round in progress, driven the way the driver and the simulation drive it.
    struct Attempt {
        round: Round,
        items: [Item<'static>; 1],
    }

    impl Attempt {
        fn new(key: &'static [u8], token: u128) -> Attempt {
            Attempt {
                round: Round::default(),
                items: [Item {
                    key,
                    // A few per test: leaked so that the attempt owns its items.
                    token: Box::leak(Box::new(Token::from_bits(token))),
                }],
            }
        }
        fn with<R>(&mut self, f: impl FnOnce(&mut Active<'_>) -> R) -> R {
            let req = Request::new(Phase::Acquire, 10_000, &self.items, 0);
            let mut active = Active {
                round: &mut self.round,
                req: &req,
            };
            f(&mut active)
        }
        fn begin(&mut self, e: &mut Engine, t: &mut Pipes) {
            let start = t.now;
            self.with(|a| e.begin(t, a, start));
        }
        /// Feeds `bytes` to `node` and hands the engine its readiness event.
        fn feed(&mut self, e: &mut Engine, t: &mut Pipes, node: usize, bytes: &[u8]) {
            t.replies[node].extend_from_slice(bytes);
            self.with(|a| e.on_event(t, node, true, false, Some(a)));
        }
        /// Whether `node` has been written this attempt's SET since `mark`.
        fn set_written(&self, t: &Pipes, node: usize, mark: &[usize]) -> bool {
            let token = self.items[0].token;
            let since = &t.written[node][mark[node]..];
            since.starts_with(b"*") && memchr::memmem::find(since, token.as_bytes()).is_some()
        }
    }

    fn marks(t: &Pipes) -> Vec<usize> {
        t.written.iter().map(Vec::len).collect()
    }

    /// Round 1 on `KEY`: nodes 0 and 1 locked for us, 2..4 held by another client; node 1's
    /// reply has not arrived when the third nil decides the round. The lost attempt's
    /// deletes go to all five nodes, as `Redlock::try_lock` sends them.
    fn lost_attempt(e: &mut Engine, t: &mut Pipes) {
        let mut a = Attempt::new(KEY, 1);
        a.begin(e, t);
        a.feed(e, t, 0, b"+OK\r\n");
        for node in 2..NODES {
            a.feed(e, t, node, b"$-1\r\n");
        }
        assert_eq!(a.round.decision(0), crate::core::round::Decision::Taken);
        let before = marks(t);
        e.release_lost(t, &a.items, &[0]);
        for (node, &mark) in before.iter().enumerate() {
            assert!(t.written[node].len() > mark, "node {node}: no delete");
            assert_eq!(e.sessions()[node].deletes_owed, 1);
        }
    }

    /// The notes drained, by kind and node.
    fn notes(e: &mut Engine) -> Vec<String> {
        e.drain_notes()
            .map(|n| match n {
                Note::Connected { node, first } => format!("connected {node} {first}"),
                Note::Down { node, .. } => format!("down {node}"),
                Note::Lagging { node } => format!("lagging {node}"),
                Note::CaughtUp { node } => format!("caught up {node}"),
            })
            .collect()
    }

    #[test]
    fn node_changes_are_noted_only_when_observed() {
        let (mut e, _) = ready();
        assert!(notes(&mut e).is_empty());
        let (mut e, mut t) = ready_with(true);
        let connected: Vec<String> = (0..NODES).map(|n| format!("connected {n} true")).collect();
        assert_eq!(notes(&mut e), connected);
        // Node 4 does not answer round 1; past node_timeout it lags in round 2, once.
        let mut a = Attempt::new(KEY, 1);
        a.begin(&mut e, &mut t);
        for node in 0..4 {
            a.feed(&mut e, &mut t, node, b"+OK\r\n");
        }
        t.now += TIMEOUT + Duration::from_millis(1);
        let mut b = Attempt::new(b"other", 2);
        b.begin(&mut e, &mut t);
        assert_eq!(
            b.round.vote(4, 0),
            Some(Outcome::Failed(NodeError::Lagging))
        );
        for node in 0..4 {
            b.feed(&mut e, &mut t, node, b"+OK\r\n");
        }
        let mut c = Attempt::new(b"third", 3);
        c.begin(&mut e, &mut t);
        assert_eq!(notes(&mut e), ["lagging 4"]);
        // It answers what it owed: written again in the next round, caught up.
        t.replies[4].extend_from_slice(b"+OK\r\n");
        e.on_event(&mut t, 4, true, false, None);
        let mut d = Attempt::new(b"fourth", 4);
        d.begin(&mut e, &mut t);
        assert_eq!(notes(&mut e), ["caught up 4"]);
        // Its server closes the connection: down.
        t.closing[4] = true;
        e.on_event(&mut t, 4, true, true, None);
        assert_eq!(notes(&mut e), ["down 4"]);
    }

    #[test]
    fn after_a_lost_attempt_the_next_set_waits_for_the_deletes() {
        let (mut e, mut t) = ready();
        lost_attempt(&mut e, &mut t);
        t.now += Duration::from_micros(50);
        let mark = marks(&t);
        let mut a = Attempt::new(KEY, 2);
        a.begin(&mut e, &mut t);
        // Nothing is written while the deletes are owed: a SET right behind its delete
        // would take back the key the delete just freed.
        assert_eq!(marks(&t), mark, "a SET went out behind its delete");
        assert_eq!(e.hold_until(), Some(t.now + TIMEOUT / HOLD_DIVISOR));
        // Node 0 answers its delete, nodes 2..4 theirs; node 1 still owes the SET's reply
        // and the delete. Still nothing goes out: the round waits for every delete.
        a.feed(&mut e, &mut t, 0, b":1\r\n");
        for node in 2..NODES {
            a.feed(&mut e, &mut t, node, b":0\r\n");
        }
        assert_eq!(marks(&t), mark);
        // Not yet time to stop waiting.
        a.with(|x| e.release_held(&mut t, x, base() + Duration::from_micros(50)));
        assert_eq!(marks(&t), mark);
        // Node 1 answers both: now every node is written, at once.
        a.feed(&mut e, &mut t, 1, b"+OK\r\n:1\r\n");
        for node in 0..NODES {
            assert!(a.set_written(&t, node, &mark), "node {node} not written");
            assert_eq!(e.sessions()[node].deletes_owed, 0);
        }
        assert_eq!(e.hold_until(), None);
        for node in 0..3 {
            a.feed(&mut e, &mut t, node, b"+OK\r\n");
        }
        assert_eq!(a.round.decision(0), crate::core::round::Decision::Won);
        assert_eq!(a.round.yes(0), 3);
    }

    #[test]
    fn a_held_node_whose_connection_closes_gets_its_set_on_the_new_one_and_frees_the_others() {
        let (mut e, mut t) = ready();
        lost_attempt(&mut e, &mut t);
        t.now += Duration::from_micros(50);
        let mark = marks(&t);
        let mut a = Attempt::new(KEY, 2);
        a.begin(&mut e, &mut t);
        for node in [0, 2, 3, 4] {
            a.feed(&mut e, &mut t, node, b":0\r\n");
        }
        assert_eq!(marks(&t), mark, "node 1 still owes its delete: all held");
        // Node 1's server closes the connection (its delete is lost with it): the others
        // no longer wait for it, and node 1 gets its SET on a new connection, behind the
        // handshake, instead of failing its vote.
        t.closing[1] = true;
        a.with(|x| e.on_event(&mut t, 1, true, true, Some(x)));
        for node in [0, 2, 3, 4] {
            assert!(a.set_written(&t, node, &mark), "node {node} still held");
        }
        assert!(a.round.is_pending(1, 0), "the closed node's vote failed");
        a.with(|x| e.on_event(&mut t, 1, false, false, Some(x))); // established
        assert!(a.set_written(&t, 1, &mark), "no SET on the new connection");
        assert_eq!(e.held, 0);
    }

    #[test]
    fn a_straggler_is_left_behind_in_time_and_written_once_it_answers() {
        let (mut e, mut t) = ready();
        lost_attempt(&mut e, &mut t);
        let start = t.now + Duration::from_micros(50);
        t.now = start;
        let mark = marks(&t);
        let mut a = Attempt::new(KEY, 2);
        a.begin(&mut e, &mut t);
        for node in [0, 2, 3] {
            a.feed(&mut e, &mut t, node, b":0\r\n");
        }
        assert_eq!(marks(&t), mark);
        // Past `hold_until`: the nodes that answered are written; 1 and 4 still owe
        // their deletes and stay held.
        let until = e.hold_until().unwrap();
        t.now = until;
        a.with(|x| e.release_held(&mut t, x, until));
        let written: Vec<bool> = (0..NODES).map(|n| a.set_written(&t, n, &mark)).collect();
        assert_eq!(written, [true, false, true, true, false]);
        assert_eq!(
            e.written(),
            0b01101,
            "a held node is not among those written"
        );
        // A reply of a node never sent the SET is not a vote: node 1's `+OK` answers the
        // lost attempt's SET.
        a.feed(&mut e, &mut t, 1, b"+OK\r\n");
        assert!(a.round.is_pending(1, 0));
        assert!(!a.set_written(&t, 1, &mark));
        // Its delete answered, node 1 gets the SET, within the round.
        a.feed(&mut e, &mut t, 1, b":1\r\n");
        assert!(a.set_written(&t, 1, &mark));
        a.feed(&mut e, &mut t, 0, b"$-1\r\n");
        a.feed(&mut e, &mut t, 2, b"$-1\r\n");
        a.feed(&mut e, &mut t, 3, b"$-1\r\n");
        assert_eq!(a.round.decision(0), crate::core::round::Decision::Taken);
        // Decided: node 4 is never written, however late its delete is answered, and is
        // not chased by the release of this lost attempt.
        assert_eq!(e.written(), 0b01111);
        a.feed(&mut e, &mut t, 4, b":0\r\n");
        assert!(!a.set_written(&t, 4, &mark));
        let mark = marks(&t);
        e.release_lost(&mut t, &a.items, &[0]);
        assert_eq!(t.written[4].len(), mark[4], "node 4 was never sent the SET");
        // Nodes 0..3 owe this attempt's deletes, node 4 none: the next round still writes
        // to no node before the deletes are in. One that times out meanwhile records no
        // reply for the nodes never written, not a vote.
        let mark = marks(&t);
        let mut b = Attempt::new(KEY, 3);
        b.begin(&mut e, &mut t);
        assert!((0..NODES).all(|n| e.sessions()[n].held));
        assert_eq!(marks(&t), mark);
        b.round.time_out(t.now + TIMEOUT);
        assert!((0..NODES).all(|n| b.round.vote(n, 0) == Some(Outcome::NoReply)));
    }

    #[test]
    fn another_key_or_a_node_that_lags_is_not_held() {
        let (mut e, mut t) = ready();
        lost_attempt(&mut e, &mut t);
        // Another key: written at once, deletes or not.
        let mark = marks(&t);
        let mut other = Attempt::new(b"other", 5);
        other.begin(&mut e, &mut t);
        assert_eq!(e.hold_until(), None);
        assert!((0..NODES).all(|n| other.set_written(&t, n, &mark)));
        for node in 0..NODES {
            // Node 1 first answers the lost attempt's SET.
            let replies: &[u8] = if node == 1 {
                b"+OK\r\n:1\r\n"
            } else {
                b":1\r\n"
            };
            other.feed(&mut e, &mut t, node, replies);
            other.feed(&mut e, &mut t, node, b"+OK\r\n");
        }
        assert_eq!(other.round.decision(0), crate::core::round::Decision::Won);
        // A new lost attempt on `KEY`; node 4 then never answers (frozen). Once its delete
        // is older than `node_timeout` it lags: the next round neither waits for it nor
        // writes to it, and the others are written at once.
        lost_attempt(&mut e, &mut t);
        for node in 0..4 {
            let replies: &[u8] = if node == 1 {
                b"+OK\r\n:1\r\n"
            } else {
                b":1\r\n"
            };
            t.replies[node].extend_from_slice(replies);
            e.on_event(&mut t, node, true, false, None);
        }
        t.now += TIMEOUT + Duration::from_millis(1);
        let mark = marks(&t);
        let mut a = Attempt::new(KEY, 6);
        a.begin(&mut e, &mut t);
        let written: Vec<bool> = (0..NODES).map(|n| a.set_written(&t, n, &mark)).collect();
        assert_eq!(written, [true, true, true, true, false]);
        assert_eq!(
            a.round.vote(4, 0),
            Some(Outcome::Failed(NodeError::Lagging))
        );
    }
}
