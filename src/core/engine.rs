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
//!   later one (round ids start at 1; 0 tags replies nobody waits for).
//! - A node that still owes replies older than `node_timeout`, or replies of a round
//!   more than [`MAX_ROUNDS_BEHIND`] rounds back, is "lagging": it is not
//!   waited for and is sent no new lock command, so a frozen minority costs nothing once
//!   it has been seen to lag. The one thing queued to it is an unlock's compare-and-delete
//!   for a lock whose SET or extend was written there: it runs right after the stale
//!   write when the node wakes.
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

use super::command::{self, Arg, Command, Frame, KeyList};
use super::round::Round;
use super::script;
use super::session::{Answer, Expect, Expected, Login, Session, State};
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
    /// The lock's token.
    pub token: Token,
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

    /// What a node's reply to this round's command answers.
    #[inline]
    fn expected(&self) -> Expected {
        if self.phase == Phase::Acquire && self.fencing == Fencing::Read {
            Expected::FencedAcquire
        } else {
            Expected::Command(self.phase)
        }
    }
}

/// What a round does with the items' fence counters (`quorumlock:fence:<resource>` on
/// each node, see [`command::FENCE_PREFIX`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fencing {
    /// Nothing.
    Off,
    /// An acquire also reads them: each yes answers its node's largest counter, and
    /// [`Round::counter`] is the largest among the yes votes counted.
    Read,
    /// The fence write-back ([`Phase::Fence`]): raise them to this value.
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

/// The client's protocol over every node.
pub struct Engine {
    sessions: Vec<Session>,
    /// The commands of the current round (`frames[round_id % 2]`; slot `k`'s is
    /// `command(k)`), encoded once for every node, and of the previous round: a `NOSCRIPT`
    /// that arrives after its round was decided is still answered with `EVAL` from there.
    /// Alternating by parity means no buffer is ever moved or swapped.
    frames: [Frame; 2],
    /// Scratch for per-node extras: EVAL after NOSCRIPT, releases after a lost attempt.
    extra: Vec<u8>,
    /// Round ids start at 1; 0 tags replies that no round waits for.
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
            let young = !guard.is_zero() && s.identity.is_none_or(|id| id.up_for(at) < guard);
            if young || self.twin_of(node).is_some() {
                watch |= node_bit(node);
            }
        }
        self.watch = watch;
    }

    /// The nodes other than `node` whose server, as last identified, is `node`'s.
    fn twins(&self, node: usize) -> impl Iterator<Item = usize> + '_ {
        let run_id = self.sessions[node].identity.map(|id| id.run_id);
        self.sessions
            .iter()
            .enumerate()
            .filter(move |&(m, o)| {
                m != node && run_id.is_some() && o.identity.map(|id| id.run_id) == run_id
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
        let counts = |o: &Option<Outcome>| {
            matches!(
                o,
                Some(Outcome::Locked | Outcome::Held | Outcome::Released | Outcome::NotHeld)
            )
        };
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
            let up_for = id.up_for(self.round_start.unwrap_or(id.read_at));
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

    /// The timing it runs with.
    pub fn timing(&self) -> &Timing {
        &self.timing
    }

    /// True (once) when slow-path work ran since the last call: the caller's wait budget
    /// did not count it.
    #[inline]
    pub fn take_slow_work(&mut self) -> bool {
        std::mem::take(&mut self.slow_work)
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
            self.drop_conn(t, node, NodeError::ConnectTimeout, now);
            // The next connection is sent nothing until its handshake is answered:
            // a silent host must not cost `node_timeout` at every reconnect.
            self.sessions[node].suspect = true;
        }
    }

    fn connect<T: Transport>(&mut self, t: &mut T, node: usize, now: Instant) {
        match t.open(node) {
            Ok(()) => self.sessions[node].opened(now),
            Err(e) => self.drop_conn(t, node, e, now),
        }
    }

    /// Drops `node`'s connection and everything queued on it.
    fn drop_conn<T: Transport>(&mut self, t: &mut T, node: usize, error: NodeError, now: Instant) {
        t.close(node);
        self.sessions[node].fail(error, now, self.timing.max_backoff);
    }

    /// Queues `count` commands on `node`, for slots `expect.slot..`, writing them at once
    /// if the line is idle.
    #[inline(always)]
    fn send<T: Transport>(
        t: &mut T,
        s: &mut Session,
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
            return s.queue(&bytes[n..]);
        }
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
        match Command::new(req.phase, req.ttl_ms, req.phase != Phase::Release) {
            // An unlock returns at a majority and may never read the other replies, so a
            // `NOSCRIPT` there would go unanswered and leave the key: releases carry the
            // script itself. Extends use its digest once a connection has shown it cached.
            Some(cmd) if req.plain() => {
                for item in req.items {
                    frame.push(cmd, item.key, &item.token);
                }
            }
            _ => encode_scripts(frame, req),
        }
        // `start − node_timeout`, computed only if some node owes replies.
        let mut lag_cutoff: Option<Option<Instant>> = None;
        let expect = Expect {
            round: self.round_id,
            counted: true,
            slot: 0,
            kind: req.expected(),
            sent_at: start,
        };
        for node in 0..self.sessions.len() {
            let s = &mut self.sessions[node];
            // The common case inline: a healthy connection with nothing queued.
            let lagging = s.pending.front().is_some_and(|_| {
                let cutoff =
                    *lag_cutoff.get_or_insert_with(|| start.checked_sub(self.timing.node_timeout));
                s.is_lagging(cutoff) || s.rounds_behind(self.round_id) > MAX_ROUNDS_BEHIND
            });
            let frame_ok = req.phase != Phase::Extend || s.extend_script_known;
            if s.state == State::Ready && !s.suspect && !lagging && frame_ok {
                s.may_resend = true;
                s.sent = true;
                s.note_write(self.write_until);
                let bytes = self.frames[(self.round_id & 1) as usize].bytes();
                if let Err(e) = Self::send(t, s, node, bytes, expect, commands) {
                    self.fail_conn(t, node, e, Some(active));
                }
            } else {
                let cutoff = start.checked_sub(self.timing.node_timeout);
                self.start_node(t, node, active, start, cutoff);
            }
        }
    }

    /// Sends the round's command to a node that is not simply ready, or records why it
    /// cannot take part.
    #[cold]
    fn start_node<T: Transport>(
        &mut self,
        t: &mut T,
        node: usize,
        active: &mut Active<'_>,
        now: Instant,
        lag_cutoff: Option<Instant>,
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
            if active.req.phase == Phase::Release && chases(active.req.chase, node) {
                self.release_behind_stale(t, node, active.req.items, now);
            }
            // Nothing else new is queued for a node that does not read: its backlog would
            // only grow. A lock command queued there earlier may apply when it wakes up;
            // the holder's unlock follows it there (above), or the key expires with the
            // ttl under a token nobody reuses.
            active.round.fail_node(node, &why);
            return;
        }
        let s = &mut self.sessions[node];
        s.may_resend = true;
        s.sent = true;
        s.note_write(self.write_until);
        let expect = Expect {
            round: self.round_id,
            counted: true,
            slot: 0,
            kind: active.req.expected(),
            sent_at: now,
        };
        let bytes = command_for(
            &self.frames[(self.round_id & 1) as usize],
            &mut self.extra,
            active.req,
            s.extend_script_known,
        );
        if let Err(e) = Self::send(t, s, node, bytes, expect, active.req.commands()) {
            self.fail_conn(t, node, e, Some(active));
        }
    }

    /// An unlock still queues its compare-and-delete on a connection that lags (a frozen
    /// or stalled node), not waited for: a SET or an extend queued there earlier applies
    /// when the node wakes, and Redis runs one connection's commands in order, so the
    /// delete behind it removes the key instead of leaving it for a whole ttl. Bounded by
    /// the connection's backlog limits; EVAL, not EVALSHA, since no one will read a
    /// NOSCRIPT.
    #[cold]
    fn release_behind_stale<T: Transport>(
        &mut self,
        t: &mut T,
        node: usize,
        items: &[Item<'_>],
        now: Instant,
    ) {
        self.extra.clear();
        for item in items {
            command::encode(
                &mut self.extra,
                Command::release(false),
                item.key,
                &item.token,
            );
        }
        let expect = Expect {
            round: self.round_id,
            counted: false,
            slot: 0,
            kind: Expected::Command(Phase::Release),
            sent_at: now,
        };
        let s = &mut self.sessions[node];
        if let Err(e) = Self::send(t, s, node, &self.extra, expect, items.len()) {
            self.drop_conn(t, node, e, now);
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
        active: Option<&mut Active<'_>>,
    ) {
        // The hot path: replies on an established connection with nothing queued.
        if readable && !closed {
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
                                    return self.dispatch_fresh(t, node, active);
                                }
                            }
                            Ok(Received::Nothing) => {
                                return self.dispatch_fresh(t, node, active);
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
        if s.has_unsent() {
            if let Err(e) = Self::flush(t, s, node) {
                return self.fail_conn(t, node, e, active);
            }
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

    /// [`Engine::dispatch`] right after a read on a ready connection: the common votes
    /// are taken first, with nothing else in the way; the rest goes the general way.
    #[inline(always)]
    fn dispatch_fresh<T: Transport>(
        &mut self,
        t: &mut T,
        node: usize,
        mut active: Option<&mut Active<'_>>,
    ) {
        if self.take_votes(node, active.as_deref_mut()) {
            self.dispatch(t, node, active);
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
                return;
            }
            if !self.take_votes(node, active.as_deref_mut()) {
                return;
            }
            if !self.dispatch_one(t, node, active.as_deref_mut()) {
                return;
            }
        }
    }

    /// Takes the replies at the front of `node`'s inbox that are common votes
    /// ([`Session::take_vote`]) and counts them; true when input is left that needs the
    /// general path.
    #[inline(always)]
    fn take_votes(&mut self, node: usize, mut active: Option<&mut Active<'_>>) -> bool {
        let round_id = self.round_id;
        // A watched node's votes are screened on the general path.
        let fast = self.fast_votes && self.watch & node_bit(node) == 0;
        let Some(s) = self.sessions.get_mut(node) else {
            return false;
        };
        if fast {
            while let Some((round, slot, yes)) = s.take_vote() {
                // Votes count only in the round that is waiting for them; a late reply of
                // an earlier round is read and dropped.
                if round == round_id {
                    if let Some(a) = active.as_deref_mut() {
                        a.round.tally(node, slot as usize, yes);
                    }
                }
                if !s.has_input() {
                    return false;
                }
            }
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
        let answer = self.sessions[node].next_answer(&self.timing.limits, now);
        if self.sessions[node].identity != before {
            self.refresh_watch(self.round_start.unwrap_or(now));
        }
        let Some(answer) = answer else {
            return false;
        };
        // Votes count only in the round that is waiting for them; handshake and
        // fire-and-forget replies carry round 0, which never is.
        let round_id = self.round_id;
        let current = |e: &Expect| e.counted && e.round == round_id;
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
                        command::encode(&mut self.extra, cmd, item.key, &item.token);
                    }
                    // The round was decided before this node answered NOSCRIPT; it still
                    // gets the script (its vote no longer counts), so that every node the
                    // command reached ends up with the same key state. Only the current
                    // and the previous round's commands are kept.
                    None => {
                        // A fire-and-forget delete goes as EVAL already: a NOSCRIPT to
                        // it is a server's confusion, and its frame is not kept.
                        let kept =
                            expect.round == self.round_id || expect.round + 1 == self.round_id;
                        if !expect.counted || !kept {
                            return true;
                        }
                        let frame = &self.frames[(expect.round & 1) as usize];
                        if !command::evalsha_to_eval(&mut self.extra, frame.command(slot)) {
                            return true;
                        }
                    }
                }
                let s = &mut self.sessions[node];
                if let Err(e) = Self::send(t, s, node, &self.extra, expect, 1) {
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
        let resend = std::mem::take(&mut self.sessions[node].may_resend) && stale;
        self.drop_conn(t, node, error.clone(), now);
        let Some(active) = active else {
            return;
        };
        if resend {
            self.connect(t, node, now);
            let s = &mut self.sessions[node];
            if s.state != State::Down {
                let expect = Expect {
                    round: self.round_id,
                    counted: true,
                    slot: 0,
                    kind: active.req.expected(),
                    sent_at: now,
                };
                let bytes = command_for(
                    &self.frames[(self.round_id & 1) as usize],
                    &mut self.extra,
                    active.req,
                    s.extend_script_known,
                );
                if Self::send(t, s, node, bytes, expect, active.req.commands()).is_ok() {
                    s.sent = true;
                    s.note_write(self.write_until);
                    return;
                }
                self.drop_conn(t, node, NodeError::Backlog, now);
            }
        }
        active.round.fail_node(node, &error);
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
        for &slot in lost {
            let item = &items[slot];
            command::encode(
                &mut self.extra,
                Command::release(false),
                item.key,
                &item.token,
            );
        }
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
                round: self.round_id,
                counted: false,
                slot: 0,
                kind: Expected::Command(Phase::Release),
                sent_at: now,
            };
            if let Err(e) = Self::send(t, s, node, &self.extra, expect, lost.len()) {
                self.drop_conn(t, node, e, now);
            }
        }
    }

    /// Some node that was sent the current round's command still holds it unwritten (a
    /// connection being reopened, a full socket buffer). An unlock is decided by a
    /// majority, but each delete should at least have left the process before it
    /// returns: its caller may make no further call that would flush it.
    pub fn writes_pending(&self) -> bool {
        self.sessions
            .iter()
            .any(|s| s.sent && s.state != State::Down && s.has_unsent())
    }

    /// The nodes the last round's command was handed to, as a [`chases`] mask.
    pub fn written(&self) -> u64 {
        self.sessions
            .iter()
            .enumerate()
            .filter(|(_, s)| s.sent)
            .fold(0, |mask, (i, _)| mask | node_bit(i))
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
        command::encode(extra, cmd, item.key, &item.token);
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
                let n = Arg::Int(group.len() as u64);
                command::eval_over(out, script::ACQUIRE, keys, which, &[token, ttl, n]);
            }
            (Phase::Extend, _) => {
                command::eval_over(out, script::EXTEND_ALL, keys, KeyList::Locks, &[token, ttl]);
            }
            (Phase::Fence, Fencing::Write(fence)) => {
                let fence = Arg::Int(fence);
                command::eval_over(out, script::FENCE, keys, KeyList::Fences, &[fence]);
            }
            // A release, or a write-back without a value (which raises nothing: the
            // counters are only read, by a script that changes nothing).
            (Phase::Fence, _) => {
                command::eval_over(out, script::FENCE, keys, KeyList::Fences, &[Arg::Int(0)]);
            }
            _ => command::eval_over(out, script::RELEASE_ALL, keys, KeyList::Locks, &[token]),
        });
    }
}
