//! The only I/O in the crate: one mio `Poll` over every node's socket.
//!
//! # Overview
//!
//! A round ([`Driver::run`]) encodes its command once, writes it to every node straight
//! away ("poor man's multiplexing": no waiting for writability first), then waits on the
//! `Poll` and feeds each reply to the [`Round`], returning the moment the round has
//! decided every slot or `node_timeout` has passed.
//!
//! The hot path (a reply on a ready connection, a command to a ready connection) reads
//! no clock: waits are sized by a [`WaitBudget`] that reads it only every few waits, and
//! decisions are stamped with one reading after the batch of replies that made them.
//! Cold paths (failures, reconnects) read the clock themselves.
//!
//! # Invariants
//!
//! - A round never waits past `node_timeout` counted from its start (taken before the
//!   commands are encoded and sent), give or take the microseconds spent handling
//!   replies between two clock readings and one late wakeup (see `core::budget`; a wait
//!   that ends with no event, and any slow-path work, re-read the clock). Connecting,
//!   reconnecting and handshakes never block: a node that is not ready just votes
//!   "failed".
//! - Replies are matched through each connection's FIFO of expected replies, tagged with
//!   the round they belong to; replies of earlier rounds are read and discarded, never
//!   counted in a later one.
//! - A node that still owes replies older than `node_timeout` is "lagging": it is not
//!   waited for and is sent no new lock command, so a frozen minority costs nothing once
//!   it has been seen to lag. The one thing queued to it is an unlock's compare-and-delete
//!   for a lock whose SET or extend was written there: it runs right after the stale
//!   write when the node wakes.
//! - A connection found closed during a round (server timeout, `CLIENT KILL`, restart)
//!   is reopened and the command resent once, within the round.
//! - Before a lock or extend command goes out, one non-blocking poll takes in whatever
//!   arrived meanwhile, so a byte no command asked for is caught as such instead of
//!   being read as the answer to the new command.
//! - A node lagging for `max(20 × node_timeout, 1 s)` has its connection reset (and a
//!   handshake unanswered after `connect_timeout` is dropped), unless the connection
//!   still owes the reply to a SET or extend whose ttl has not run out: dropping it would
//!   let that write apply after our delete, sent on another connection. A new connection
//!   after a reset or a connect timeout is sent nothing until its handshake is answered:
//!   a frozen server's kernel still accepts connections, and waiting on one would cost
//!   `node_timeout`.

pub(crate) mod conn;

use crate::config::Settings;
use crate::core::budget::WaitBudget;
use crate::core::command::{self, Cmd, Frame};
use crate::core::round::{Kind, Round};
use crate::core::session::{Answer, Expect, Expected, State};
use crate::core::token::Token;
use crate::error::{NodeError, Outcome};
use crate::resp::Limits;
use conn::{NodeConn, ReadFast};
use mio::{Events, Poll};
use std::io;
use std::time::{Duration, Instant};

/// One resource of a request.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Item<'a> {
    pub key: &'a [u8],
    pub token: Token,
}

/// What a round sends.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Request<'a> {
    pub kind: Kind,
    pub ttl_ms: u64,
    pub items: &'a [Item<'a>],
    /// For a release: the nodes the items' SETs and extends were written to
    /// ([`Driver::written`]). Such a node gets the release even while it lags, queued
    /// behind whatever it has not run yet.
    pub chase: u64,
}

/// The round in progress, while events are dispatched.
struct Active<'r> {
    round: &'r mut Round,
    req: &'r Request<'r>,
}

pub(crate) struct Driver {
    poll: Poll,
    events: Events,
    pub conns: Vec<NodeConn>,
    /// The commands of the current round (`frames[round_id % 2]`; slot `k`'s is
    /// `command(k)`), encoded once for every node, and of the previous round: a `NOSCRIPT`
    /// that arrives after its round was decided is still answered with `EVAL` from there.
    /// Alternating by parity means no buffer is ever moved or swapped.
    frames: [Frame; 2],
    /// Scratch for per-node extras: EVAL after NOSCRIPT, releases after a lost attempt.
    extra: Vec<u8>,
    /// Round ids start at 1; 0 tags replies that no round waits for.
    round_id: u64,
    node_timeout: Duration,
    /// A node lagging this long has its connection reset: a stream that lost bytes (a
    /// broken middlebox) would never catch up, and a new connection starts in step.
    stale_after: Duration,
    connect_timeout: Duration,
    max_backoff: Duration,
    limits: Limits,
    /// The limits admit the common replies (`+OK` is a 2-byte line), so the fast path
    /// may take them without the general parser.
    fast_votes: bool,
    /// Set by the slow paths (general parser, connection events): work the wait budget
    /// does not count, so the next wait is sized by the clock.
    slow_work: bool,
    /// For the current round's SET or extend: its start + ttl, after which a copy of it
    /// stuck in a node's socket can no longer leave a key behind.
    write_until: Option<Instant>,
}

impl Driver {
    pub fn new(settings: &Settings) -> io::Result<Driver> {
        let now = Instant::now();
        let mut driver = Driver {
            poll: Poll::new()?,
            events: Events::with_capacity(64.max(2 * settings.nodes.len())),
            conns: settings
                .nodes
                .iter()
                .enumerate()
                .map(|(i, e)| NodeConn::new(e.clone(), i, now))
                .collect(),
            frames: [Frame::default(), Frame::default()],
            extra: Vec::with_capacity(512),
            round_id: 0,
            node_timeout: settings.node_timeout,
            stale_after: settings
                .node_timeout
                .saturating_mul(20)
                .max(Duration::from_secs(1)),
            connect_timeout: settings.connect_timeout,
            max_backoff: settings.max_backoff,
            limits: settings.limits,
            fast_votes: settings.limits.max_line_len >= 2,
            slow_work: false,
            write_until: None,
        };
        // Start connecting now, so the first call finds connections ready.
        for conn in &mut driver.conns {
            conn.maintain(
                driver.poll.registry(),
                now,
                driver.connect_timeout,
                driver.max_backoff,
            );
        }
        Ok(driver)
    }

    /// Runs one round of `req` on every node; returns when `round` has decided every slot
    /// or `node_timeout` has passed. Returns the instant the round started.
    pub fn run(&mut self, round: &mut Round, req: &Request<'_>) -> Instant {
        let start = if req.kind == Kind::Release {
            Instant::now()
        } else {
            // Before a lock or extend goes out, take in what arrived while the caller was
            // away: late replies, closed connections, and bytes no command asked for,
            // which would otherwise be taken for the answer to this command. One
            // non-blocking epoll_wait; a release, whose count is all it reports, skips it.
            let mut events = std::mem::replace(&mut self.events, Events::with_capacity(0));
            self.poll_once(&mut events, Duration::ZERO, None);
            self.events = events;
            Instant::now()
        };
        self.round_id += 1;
        self.write_until = match req.kind {
            Kind::Release => None,
            Kind::Acquire | Kind::Extend => start.checked_add(Duration::from_millis(req.ttl_ms)),
        };
        round.begin(req.kind, self.conns.len(), req.items.len());
        let frame = &mut self.frames[(self.round_id & 1) as usize];
        frame.clear();
        let cmd = cmd_of(req.kind, req.ttl_ms, true);
        for item in req.items {
            frame.push(cmd, item.key, &item.token);
        }
        let mut active = Active { round, req };
        // `start − node_timeout`, computed only if some node owes replies.
        let mut lag_cutoff: Option<Option<Instant>> = None;
        let expect = Expect {
            round: self.round_id,
            slot: 0,
            kind: Expected::Command(req.kind),
            sent_at: start,
        };
        for node in 0..self.conns.len() {
            let conn = &mut self.conns[node];
            // The common case inline: a healthy connection with nothing queued.
            let lagging = conn.session.pending.front().is_some_and(|_| {
                let cutoff =
                    *lag_cutoff.get_or_insert_with(|| start.checked_sub(self.node_timeout));
                conn.session.is_lagging(cutoff)
            });
            let by_sha_ok = req.kind == Kind::Acquire || conn.session.scripts_known;
            if conn.session.state == State::Ready && !conn.session.suspect && !lagging && by_sha_ok
            {
                conn.session.may_resend = true;
                conn.session.sent = true;
                conn.session.note_write(self.write_until);
                if let Err(e) = conn.send(
                    self.frames[(self.round_id & 1) as usize].bytes(),
                    expect,
                    req.items.len(),
                ) {
                    self.fail_conn(node, e, Some(&mut active));
                }
            } else {
                let cutoff = start.checked_sub(self.node_timeout);
                self.start_node(node, &mut active, start, cutoff);
            }
        }
        // Waits come from a budget that reads the clock only every few waits (see
        // `core::budget`); the clock is otherwise read only to stamp a decision, once per
        // batch of replies that made one.
        let mut budget = WaitBudget::new(start, self.node_timeout);
        // Taken out once per round, not once per wait: the event loop borrows `self`.
        let mut events = std::mem::replace(&mut self.events, Events::with_capacity(0));
        while !active.round.is_done() {
            let timeout = match budget.next_wait() {
                Some(wait) => wait,
                None => {
                    let now = Instant::now();
                    match budget.resync(now) {
                        Some(wait) => wait,
                        None => {
                            active.round.time_out(now);
                            break;
                        }
                    }
                }
            };
            let woke = self.poll_once(&mut events, timeout, Some(&mut active));
            if !woke || std::mem::take(&mut self.slow_work) {
                // A wait that ended with nothing to show may have run late (timer slack,
                // a busy machine), and slow-path work (a hostile node's trickle, a
                // reconnect) takes time the budget does not count: let the clock size the
                // next wait, so neither can pile up past `node_timeout`.
                budget.expire();
            }
            if active.round.has_unstamped() {
                active.round.stamp(Instant::now());
            }
        }
        // Decided before any wait (every node down, say): stamp those too.
        if active.round.has_unstamped() {
            active.round.stamp(Instant::now());
        }
        debug_assert!(!active.round.has_unstamped());
        self.events = events;
        start
    }

    /// Sends the round's command to a node that is not simply ready, or records why it
    /// cannot take part.
    #[cold]
    fn start_node(
        &mut self,
        node: usize,
        active: &mut Active<'_>,
        now: Instant,
        lag_cutoff: Option<Instant>,
    ) {
        self.conns[node].session.may_resend = false;
        self.conns[node].session.sent = false;
        if self.conns[node].session.is_lagging(lag_cutoff) {
            // The caller may simply not have polled for a while (it was busy in its
            // critical section) while the replies sit unread in the socket: read them
            // before calling the node lagging.
            self.on_event(node, true, false, None);
        }
        let conn = &mut self.conns[node];
        // A stream that lags this long may have lost bytes (a broken middlebox): start
        // afresh. Not a handshake (the connect timeout bounds it), and not while a lock
        // write may still apply there (see `NodeConn::holds_live_write`).
        if !conn.session.handshaking()
            && conn.session.is_lagging(now.checked_sub(self.stale_after))
            && !conn.session.holds_live_write(now)
        {
            conn.fail(
                self.poll.registry(),
                NodeError::Lagging,
                now,
                self.max_backoff,
            );
            conn.session.suspect = true;
        }
        if conn.session.state != State::Ready || conn.session.handshaking() {
            conn.maintain(
                self.poll.registry(),
                now,
                self.connect_timeout,
                self.max_backoff,
            );
        }
        if conn.session.state == State::Down {
            active.round.fail_node(node, &conn.session.down_error());
            return;
        }
        if conn.session.suspect || conn.session.is_lagging(lag_cutoff) {
            // A connection that has not finished its handshake is connecting, whatever
            // made it slow; one that answered it and then fell behind is lagging.
            let why = if conn.session.handshaking() {
                NodeError::Connecting
            } else {
                NodeError::Lagging
            };
            if active.req.kind == Kind::Release && chases(active.req.chase, node) {
                self.release_behind_stale(node, active.req.items, now);
            }
            // Nothing else new is queued for a node that does not read: its backlog would
            // only grow. A lock command queued there earlier may apply when it wakes up;
            // the holder's unlock follows it there (above), or the key expires with the
            // ttl under a token nobody reuses.
            active.round.fail_node(node, &why);
            return;
        }
        conn.session.may_resend = true;
        conn.session.sent = true;
        conn.session.note_write(self.write_until);
        let expect = Expect {
            round: self.round_id,
            slot: 0,
            kind: Expected::Command(active.req.kind),
            sent_at: now,
        };
        let bytes = if active.req.kind == Kind::Acquire || conn.session.scripts_known {
            self.frames[(self.round_id & 1) as usize].bytes()
        } else {
            // The scripts themselves until this connection has seen one answered.
            self.extra.clear();
            let cmd = cmd_of(active.req.kind, active.req.ttl_ms, false);
            for item in active.req.items {
                command::encode(&mut self.extra, cmd, item.key, &item.token);
            }
            &self.extra
        };
        if let Err(e) = conn.send(bytes, expect, active.req.items.len()) {
            self.fail_conn(node, e, Some(active));
        }
    }

    /// An unlock still queues its compare-and-delete on a connection that lags (a frozen
    /// or stalled node), not waited for: a SET or an extend queued there earlier applies
    /// when the node wakes, and Redis runs one connection's commands in order, so the
    /// delete behind it removes the key instead of leaving it for a whole ttl. Bounded by
    /// the connection's backlog limits; EVAL, not EVALSHA, since no one will read a
    /// NOSCRIPT.
    #[cold]
    fn release_behind_stale(&mut self, node: usize, items: &[Item<'_>], now: Instant) {
        self.extra.clear();
        for item in items {
            command::encode(
                &mut self.extra,
                Cmd::Release { by_sha: false },
                item.key,
                &item.token,
            );
        }
        let expect = Expect {
            round: 0,
            slot: 0,
            kind: Expected::Command(Kind::Release),
            sent_at: now,
        };
        let conn = &mut self.conns[node];
        if let Err(e) = conn.send(&self.extra, expect, items.len()) {
            conn.fail(self.poll.registry(), e, now, self.max_backoff);
        }
    }

    /// Waits for events at most `timeout` and handles them; false when the wait brought
    /// none (it timed out, or failed). Reads no clock: the hot path does not need one, and
    /// the cold paths read it themselves.
    #[inline(always)]
    fn poll_once(
        &mut self,
        events: &mut Events,
        timeout: Duration,
        mut active: Option<&mut Active<'_>>,
    ) -> bool {
        let polled = self.poll.poll(events, Some(timeout));
        // An interrupted or failed wait just loops again; the round's budget bounds it.
        if polled.is_err() || events.is_empty() {
            return false;
        }
        for ev in events.iter() {
            let node = ev.token().0;
            let closed = ev.is_read_closed() || ev.is_error();
            let readable = ev.is_readable() || closed;
            // The hot path: replies on an established connection with nothing queued.
            if readable && !closed {
                if let Some(conn) = self.conns.get_mut(node) {
                    if conn.session.state == State::Ready && !conn.session.has_unsent() {
                        let active = active.as_deref_mut();
                        match conn.read_fast() {
                            ReadFast::Drained => self.dispatch_fresh(node, active),
                            ReadFast::Closed => self.dispatch_then_close(node, active),
                            ReadFast::Failed(e) => self.fail_conn(node, e.into(), active),
                            ReadFast::Slow => self.on_event(node, true, false, active),
                        }
                        continue;
                    }
                }
            }
            self.on_event(node, readable, closed, active.as_deref_mut());
        }
        true
    }

    #[cold]
    fn on_event(
        &mut self,
        node: usize,
        readable: bool,
        closed: bool,
        active: Option<&mut Active<'_>>,
    ) {
        self.slow_work = true;
        let Some(conn) = self.conns.get_mut(node) else {
            return;
        };
        if conn.session.state == State::Down {
            return; // an event for a socket already dropped
        }
        if conn.session.state == State::Connecting {
            match conn.finish_connect(Instant::now()) {
                Ok(true) => {}
                Ok(false) => return,
                Err(e) => return self.fail_conn(node, e, active),
            }
        }
        if conn.session.has_unsent() {
            if let Err(e) = conn.flush() {
                return self.fail_conn(node, e, active);
            }
        }
        if !readable {
            return;
        }
        match conn.read(&self.limits, closed) {
            Ok(false) => self.dispatch(node, active),
            Ok(true) => self.dispatch_then_close(node, active),
            Err(e) => self.fail_conn(node, e, active),
        }
    }

    /// Dispatches what was read before the peer closed, then drops the connection.
    #[cold]
    fn dispatch_then_close(&mut self, node: usize, mut active: Option<&mut Active<'_>>) {
        let generation = self.conns[node].session.generation;
        self.dispatch(node, active.as_deref_mut());
        // Only the connection that was read can be declared closed: dispatch may have
        // replaced it (a resend after a failure) with a fresh one.
        let conn = &self.conns[node];
        if conn.session.state != State::Down && conn.session.generation == generation {
            self.fail_conn(node, NodeError::Closed, active);
        }
    }

    /// [`Driver::dispatch`] right after a read on a ready connection: the common votes
    /// are taken first, with nothing else in the way; the rest goes the general way.
    #[inline(always)]
    fn dispatch_fresh(&mut self, node: usize, mut active: Option<&mut Active<'_>>) {
        if self.take_votes(node, active.as_deref_mut()) {
            self.dispatch(node, active);
        }
    }

    /// Feeds every complete reply in `node`'s inbox to whoever waits for it.
    #[inline]
    fn dispatch(&mut self, node: usize, mut active: Option<&mut Active<'_>>) {
        loop {
            let conn = &self.conns[node];
            if conn.session.state != State::Ready || !conn.session.has_input() {
                return;
            }
            if !self.take_votes(node, active.as_deref_mut()) {
                return;
            }
            if !self.dispatch_one(node, active.as_deref_mut()) {
                return;
            }
        }
    }

    /// Takes the replies at the front of `node`'s inbox that are common votes
    /// ([`NodeConn::take_vote`]) and counts them; true when input is left that needs the
    /// general path.
    #[inline(always)]
    fn take_votes(&mut self, node: usize, mut active: Option<&mut Active<'_>>) -> bool {
        let round_id = self.round_id;
        let Some(conn) = self.conns.get_mut(node) else {
            return false;
        };
        if self.fast_votes {
            while let Some((round, slot, yes)) = conn.session.take_vote() {
                // Votes count only in the round that is waiting for them; a late reply of
                // an earlier round is read and dropped.
                if round == round_id {
                    if let Some(a) = active.as_deref_mut() {
                        a.round.tally(node, slot as usize, yes);
                    }
                }
                if !conn.session.has_input() {
                    return false;
                }
            }
        }
        conn.session.has_input()
    }

    /// Handles the next reply in `node`'s inbox in full generality; false when there is
    /// none (or the connection failed).
    #[cold]
    fn dispatch_one(&mut self, node: usize, mut active: Option<&mut Active<'_>>) -> bool {
        // Whatever happens next took parser time the wait budget did not see.
        self.slow_work = true;
        let Some(answer) = self.conns[node].session.next_answer(&self.limits) else {
            return false;
        };
        // Votes count only in the round that is waiting for them; handshake and
        // fire-and-forget replies carry round 0, which never is.
        let round_id = self.round_id;
        let current = |round: u64| round == round_id;
        match answer {
            Answer::Handshake => {}
            Answer::Vote { round, slot, yes } => {
                if let Some(a) = active.as_deref_mut().filter(|_| current(round)) {
                    a.round.tally(node, slot as usize, yes);
                }
            }
            Answer::Refused { round, slot, error } => {
                if let Some(a) = active.as_deref_mut().filter(|_| current(round)) {
                    a.round.record(node, slot as usize, Outcome::Failed(error));
                }
            }
            Answer::Broken { error, failed } => {
                if let Some((round, slot)) = failed {
                    if let Some(a) = active.as_deref_mut().filter(|_| current(round)) {
                        a.round
                            .record(node, slot as usize, Outcome::Failed(error.clone()));
                    }
                }
                self.fail_conn(node, error, active);
                return false;
            }
            Answer::NoScript(expect) => {
                let slot = expect.slot as usize;
                self.extra.clear();
                match active.as_deref_mut().filter(|_| current(expect.round)) {
                    // The server lost its script cache (restart, SCRIPT FLUSH): send the
                    // script itself, once, in this same round.
                    Some(a) => {
                        let Some(item) = a.req.items.get(slot) else {
                            return true;
                        };
                        let cmd = cmd_of(a.req.kind, a.req.ttl_ms, false);
                        command::encode(&mut self.extra, cmd, item.key, &item.token);
                    }
                    // The round was decided before this node answered NOSCRIPT; it still
                    // gets the script (its vote no longer counts), so that every node the
                    // command reached ends up with the same key state. Only the current
                    // and the previous round's commands are kept.
                    None => {
                        if expect.round != self.round_id && expect.round + 1 != self.round_id {
                            return true;
                        }
                        let frame = &self.frames[(expect.round & 1) as usize];
                        if !command::evalsha_to_eval(&mut self.extra, frame.command(slot)) {
                            return true;
                        }
                    }
                }
                if let Err(e) = self.conns[node].send(&self.extra, expect, 1) {
                    self.fail_conn(node, e, active);
                    return false;
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
    fn fail_conn(&mut self, node: usize, error: NodeError, active: Option<&mut Active<'_>>) {
        let now = Instant::now();
        // Closed or reset: most likely the server dropped a connection we had not used
        // for a while (timeout, CLIENT KILL, restart). Anything else is the node's fault.
        let stale = matches!(error, NodeError::Closed | NodeError::Io(..));
        let resend = std::mem::take(&mut self.conns[node].session.may_resend) && stale;
        let conn = &mut self.conns[node];
        conn.fail(self.poll.registry(), error.clone(), now, self.max_backoff);
        let Some(active) = active else {
            return;
        };
        if resend {
            conn.reconnect_now(self.poll.registry(), now, self.max_backoff);
            if conn.session.state != State::Down {
                let expect = Expect {
                    round: self.round_id,
                    slot: 0,
                    kind: Expected::Command(active.req.kind),
                    sent_at: now,
                };
                if conn
                    .send(
                        self.frames[(self.round_id & 1) as usize].bytes(),
                        expect,
                        active.req.items.len(),
                    )
                    .is_ok()
                {
                    conn.session.sent = true;
                    conn.session.note_write(self.write_until);
                    return;
                }
                conn.fail(
                    self.poll.registry(),
                    NodeError::Backlog,
                    now,
                    self.max_backoff,
                );
            }
        }
        active.round.fail_node(node, &error);
    }

    /// Waits until `until`, reading (and discarding) late replies meanwhile.
    pub fn idle(&mut self, until: Instant) {
        loop {
            let now = Instant::now();
            if now >= until {
                return;
            }
            let mut events = std::mem::replace(&mut self.events, Events::with_capacity(0));
            self.poll_once(&mut events, until - now, None);
            self.events = events;
        }
    }

    /// Fire-and-forget compare-and-delete of `lost` slots on every node the round's
    /// command was sent to (the spec: unlock all instances, even those believed not
    /// locked; a node that said "held" may have been answering a resend that met our own
    /// key). A connection that died meanwhile is reopened for it. Uses EVAL, not EVALSHA:
    /// no reply is read, so a NOSCRIPT could not be answered. Queued bytes go out now or
    /// at the next call that polls.
    pub fn release_lost(&mut self, items: &[Item<'_>], lost: &[usize]) {
        if lost.is_empty() {
            return;
        }
        self.extra.clear();
        for &slot in lost {
            let item = &items[slot];
            command::encode(
                &mut self.extra,
                Cmd::Release { by_sha: false },
                item.key,
                &item.token,
            );
        }
        let now = Instant::now();
        for node in 0..self.conns.len() {
            let conn = &mut self.conns[node];
            if !conn.session.sent {
                continue;
            }
            conn.reconnect_now(self.poll.registry(), now, self.max_backoff);
            if conn.session.state == State::Down {
                continue;
            }
            let expect = Expect {
                round: 0,
                slot: 0,
                kind: Expected::Command(Kind::Release),
                sent_at: now,
            };
            if let Err(e) = conn.send(&self.extra, expect, lost.len()) {
                conn.fail(self.poll.registry(), e, now, self.max_backoff);
            }
        }
    }

    /// The nodes the last round's command was handed to, as a [`chases`] mask.
    pub fn written(&self) -> u64 {
        self.conns
            .iter()
            .enumerate()
            .filter(|(_, c)| c.session.sent)
            .fold(0, |mask, (i, _)| mask | node_bit(i))
    }

    /// Sum of buffer capacities over all nodes (for tests of bounded memory).
    pub fn buffered(&self) -> usize {
        self.conns.iter().map(NodeConn::buffered).sum::<usize>()
            + self.frames[0].capacity()
            + self.frames[1].capacity()
            + self.extra.capacity()
    }
}

/// A node's bit in a mask of nodes: nodes from 63 on share the last bit, so a mask is
/// exact for up to 63 nodes and errs on the side of including a node beyond.
#[inline]
pub(crate) fn node_bit(node: usize) -> u64 {
    1 << node.min(63)
}

/// Whether `mask` includes `node`.
#[inline]
pub(crate) fn chases(mask: u64, node: usize) -> bool {
    mask & node_bit(node) != 0
}

fn cmd_of(kind: Kind, ttl_ms: u64, by_sha: bool) -> Cmd {
    match kind {
        Kind::Acquire => Cmd::Acquire { ttl_ms },
        Kind::Extend => Cmd::Extend { ttl_ms, by_sha },
        Kind::Release => Cmd::Release { by_sha },
    }
}
