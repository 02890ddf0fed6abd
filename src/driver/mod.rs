//! The only I/O in the crate: one mio `Poll` over every node's socket, running the
//! protocol engine of `core::engine` on the caller's thread.
//!
//! # Overview
//!
//! A round ([`Driver::run`]) reads the clock once, hands the request to the engine, which
//! writes the command to every node straight away ("poor man's multiplexing": no waiting
//! for writability first), then waits on the `Poll` and feeds every readiness event to
//! the engine, returning the moment the round has decided every slot (for a release, once
//! every delete has also left the process) or `node_timeout` has passed.
//!
//! The hot path (a reply on a ready connection, a command to a ready connection) reads
//! no clock: waits are sized by a [`WaitBudget`] that reads it only every few waits, and
//! decisions are stamped with one reading after the batch of replies that made them.
//!
//! # Invariants
//!
//! - A round never waits past `node_timeout` counted from its start (taken before the
//!   commands are encoded and sent), give or take the microseconds spent handling
//!   replies between two clock readings and one late wakeup (see `core::budget`; a wait
//!   that ends with no event, and any slow-path work, re-read the clock). Connecting,
//!   reconnecting and handshakes never block the caller past that: a command for a node
//!   still connecting waits behind its handshake, and a node that cannot take part votes
//!   "failed".
//! - With an observer set (`crate::observer`), the engine's notes are handed to it
//!   between events, never in the middle of one, and a round's events once it is decided
//!   (at the end of [`Driver::finish`]); each batch of replies is then stamped with one
//!   more clock reading, for the nodes' latencies. Without one, each wait pays a test.
//! - Before any command goes out, one non-blocking poll takes in whatever arrived
//!   meanwhile, so a byte no command asked for is caught as such instead of being read
//!   as the answer to the new command, and a connection the server closed is replaced
//!   before the command is written to it.

pub(crate) mod conn;

use crate::config::{Endpoint, Settings};
use crate::core::budget::WaitBudget;
use crate::core::engine::{Active, Engine, Item, Request, Timing};
use crate::core::round::Round;
use crate::core::session::Login;
use crate::error::Phase;
use crate::observer::Watcher;
use conn::Net;
use mio::{Events, Poll};
use std::io;
use std::time::{Duration, Instant};

pub(crate) struct Driver {
    waits: Waits,
    engine: Engine,
    net: Net,
    /// The waits of a round, sliced once from `node_timeout` ([`WaitBudget::restart`]
    /// for each round).
    budget: WaitBudget,
    /// A deadline that must be acted on even in the middle of a round (the shared client's
    /// leases: their lost signal never waits for a round to end), and what to run then;
    /// it returns the next one. `None` for the direct client: one test per wait.
    alarm: Option<(Instant, Alarm)>,
    /// The user's observer and what it needs from the rounds (`None`: no observer, and
    /// no work for one: one test per wait).
    watcher: Option<Box<Watcher>>,
}

/// What an alarm runs: given the time, it returns the next alarm, if any.
pub(crate) type Alarm = std::sync::Arc<dyn Fn(Instant) -> Option<Instant> + Send + Sync>;

/// The token of a `mio::Waker` registered on the driver's `Poll` ([`Driver::registry`]).
pub(crate) const WAKER: mio::Token = mio::Token(usize::MAX);

/// The `Poll` and its event buffer: apart from the engine and the sockets, so that a
/// wait can hand its events to them without moving anything out of the driver.
struct Waits {
    poll: Poll,
    events: Events,
}

impl Driver {
    /// A driver for `settings`' nodes; `markers[i]` is node `i`'s marker (restart guard
    /// on: `session::Login::marker`).
    pub fn new(settings: &Settings, markers: Vec<Option<[u8; 32]>>) -> io::Result<Driver> {
        let now = Instant::now();
        let poll = Poll::new()?;
        let net = Net::new(poll.registry().try_clone()?, settings);
        let logins = settings
            .nodes
            .iter()
            .zip(markers)
            .map(|(e, marker)| Login {
                user: e.user.clone(),
                password: e.password.clone(),
                db: e.db,
                marker,
            })
            .collect();
        let timing = Timing {
            node_timeout: settings.node_timeout,
            connect_timeout: settings.connect_timeout,
            max_backoff: settings.max_backoff,
            limits: settings.limits,
            restart_guard: settings.restart_guard,
        };
        let mut driver = Driver {
            waits: Waits {
                events: Events::with_capacity(64.max(2 * settings.nodes.len())),
                poll,
            },
            engine: Engine::new(logins, timing, now),
            net,
            budget: WaitBudget::new(now, settings.node_timeout),
            alarm: None,
            watcher: None,
        };
        if let Some(observer) = &settings.observer {
            let nodes = settings.nodes.len();
            let watcher = Watcher::new(observer.get(), settings.drift_factor, nodes);
            driver.watcher = Some(Box::new(watcher));
            driver.engine.observe();
        }
        // Start connecting now, so the first call finds connections ready.
        driver.engine.maintain(&mut driver.net, now);
        driver.forward();
        Ok(driver)
    }

    /// The nodes, in configuration order.
    pub fn endpoints(&self) -> &[Endpoint] {
        self.net.endpoints()
    }

    /// Runs one round of `req` on every node; returns when `round` has decided every slot
    /// (a release: and no delete waits unwritten) or `node_timeout` has passed. Returns
    /// the instant the round started.
    pub fn run(&mut self, round: &mut Round, req: &Request<'_>) -> Instant {
        let start = self.begin(round, req);
        self.finish(round, req, None);
        start
    }

    /// The first half of [`Driver::run`]: takes in what arrived meanwhile and writes the
    /// round's commands. Returns the instant the round started; [`Driver::finish`], with
    /// the same `round` and `req`, waits for it, on this thread or another.
    #[inline]
    pub fn begin(&mut self, round: &mut Round, req: &Request<'_>) -> Instant {
        let Driver {
            waits,
            engine,
            net,
            budget,
            watcher,
            ..
        } = self;
        // Before any command goes out, take in what arrived while the caller was away:
        // late replies, bytes no command asked for (which would otherwise be taken for
        // the answer to this command), and connections the server closed meanwhile (a
        // restart, a timeout), so the command goes on a fresh one. A release needs it as
        // much as a lock: it returns at a majority, so a delete written to a dead
        // connection would not be resent within the call. One non-blocking epoll_wait.
        waits.once(engine, net, Duration::ZERO, None);
        let start = Instant::now();
        // Deadlines counted from this start are converted with the gap as it is now
        // (`clock::stamp_from`): a suspend during the round counts against them.
        crate::clock::round_starts(start);
        let mut active = Active { round, req };
        engine.begin(net, &mut active, start);
        if let Some(w) = watcher {
            w.begin(active.round, start);
            w.forward(engine, net.endpoints());
        }
        // Waits come from a budget that reads the clock only every few waits (see
        // `core::budget`); the clock is otherwise read only to stamp a decision, once per
        // batch of replies that made one.
        budget.restart(start);
        start
    }

    /// The second half of [`Driver::run`]: waits for the round [`Driver::begin`] wrote
    /// until it is decided or `node_timeout` has passed, and returns true; or, given
    /// `give_up`, returns false once that instant has passed with the round undecided
    /// (nothing is lost: another `finish` takes it up where this one left it).
    #[inline]
    pub fn finish(
        &mut self,
        round: &mut Round,
        req: &Request<'_>,
        give_up: Option<Instant>,
    ) -> bool {
        let Driver {
            waits,
            engine,
            net,
            budget,
            alarm,
            watcher,
        } = self;
        let mut active = Active { round, req };
        // A release is decided by a majority, but does not return while a delete it
        // wrote is still waiting in the process (a connection being reopened): nothing
        // else might flush it. Bounded, like the round, by `node_timeout`.
        // A fence write-back likewise: it is meant for every node whose connection is up.
        let release = matches!(req.phase, Phase::Release | Phase::Fence);
        while !active.round.is_done()
            || (release && (engine.writes_pending() || net.holds_unsent()))
        {
            let timeout = match budget.next_wait() {
                Some(wait) => wait,
                None => {
                    let now = Instant::now();
                    match budget.resync(now) {
                        Some(wait) => wait,
                        None => {
                            // One last look, without waiting, at replies already in: a
                            // round taken up late (by another thread, or after a stall)
                            // may find its answers there rather than none.
                            waits.once(engine, net, Duration::ZERO, Some(&mut active));
                            let stamped = stamp(active.round);
                            if let Some(w) = watcher {
                                w.batch(active.round, stamped);
                            }
                            active.round.time_out(now);
                            break;
                        }
                    }
                }
            };
            let timeout = match alarm {
                Some((at, _)) => timeout.min(at.saturating_duration_since(Instant::now())),
                None => timeout,
            };
            let timeout = match give_up {
                Some(at) => {
                    let now = Instant::now();
                    if now >= at {
                        // The wait just counted was not made: the clock sizes the next.
                        budget.expire();
                        return false;
                    }
                    // A wait cut short: the budget, which counted it whole, is resynced.
                    budget.expire();
                    timeout.min(at - now)
                }
                None => timeout,
            };
            let woke = if engine.holding() {
                waits.holding(engine, net, timeout, &mut active, budget)
            } else {
                waits.once(engine, net, timeout, Some(&mut active))
            };
            if !woke || engine.take_slow_work() {
                // A wait that ended with nothing to show may have run late (timer slack,
                // a busy machine), and slow-path work (a hostile node's trickle, a
                // reconnect) takes time the budget does not count: let the clock size the
                // next wait, so neither can pile up past `node_timeout`.
                budget.expire();
            }
            let stamped = stamp(active.round);
            if let Some(w) = watcher {
                w.batch(active.round, stamped);
            }
            if alarm.is_some() {
                ring(alarm);
            }
        }
        // Decided before any wait (every node down, say): stamp those too.
        if active.round.has_unstamped() {
            active.round.stamp(Instant::now());
        }
        debug_assert!(!active.round.has_unstamped());
        if let Some(w) = watcher {
            w.decided(engine, net.endpoints(), active.round, req);
        }
        true
    }

    /// Hands the node changes noted since the last call to the observer, if any.
    #[inline]
    fn forward(&mut self) {
        if let Some(w) = &self.watcher {
            w.forward(&mut self.engine, self.net.endpoints());
        }
    }

    /// Waits until `until`, reading (and discarding) late replies meanwhile.
    pub fn idle(&mut self, until: Instant) {
        loop {
            let now = Instant::now();
            if now >= until {
                break;
            }
            self.waits
                .once(&mut self.engine, &mut self.net, until - now, None);
            self.forward();
        }
    }

    /// Waits, at most until `until`, for the replies to the deletes written after lost
    /// attempts (reading late replies meanwhile): for calls whose caller may look at the
    /// nodes right after a failure (`lock_all`).
    pub fn settle_deletes(&mut self, until: Instant) {
        loop {
            let now = Instant::now();
            if now >= until || !self.engine.owes_deletes(now) {
                break;
            }
            let mut wait = until - now;
            if let Some((at, _)) = &self.alarm {
                wait = wait.min(at.saturating_duration_since(now));
            }
            self.waits.once(&mut self.engine, &mut self.net, wait, None);
            self.forward();
            if self.alarm.is_some() {
                ring(&mut self.alarm);
            }
        }
    }

    /// The registry of the driver's `Poll`, for sources whose events the driver only
    /// collects ([`Driver::take_foreign`]): tokens from `nodes` up (`nodes + i` is bit `i`)
    /// and [`WAKER`].
    pub fn registry(&self) -> &mio::Registry {
        self.waits.poll.registry()
    }

    /// The foreign readiness collected since the last call (see [`Driver::registry`]).
    pub fn take_foreign(&mut self) -> u64 {
        self.engine.take_foreign()
    }

    /// One wait of at most `timeout` (none: an hour), between rounds: late replies are
    /// read (and dropped), foreign readiness collected. False when nothing came.
    pub fn wait(&mut self, timeout: Option<Duration>) -> bool {
        let timeout = timeout.unwrap_or(Duration::from_secs(3600));
        let woke = self
            .waits
            .once(&mut self.engine, &mut self.net, timeout, None);
        self.forward();
        woke
    }

    /// Whether some bytes wait in the process for a socket (see `Engine::writes_pending`).
    pub fn writes_pending(&mut self) -> bool {
        self.engine.writes_pending() || self.net.holds_unsent()
    }

    /// Sets (or clears) the alarm: `ring` runs, from inside rounds too, once `at` has
    /// passed.
    pub fn set_alarm(&mut self, alarm: Option<(Instant, Alarm)>) {
        self.alarm = alarm;
    }

    /// Fire-and-forget compare-and-delete of `lost` slots; see `Engine::release_lost`.
    pub fn release_lost(&mut self, items: &[Item<'_>], lost: &[usize]) {
        self.engine.release_lost(&mut self.net, items, lost);
        self.forward();
    }

    /// Brings the connections up to date without waiting: opens those whose backoff has
    /// passed, drops connects past their timeout, and takes in whatever already arrived
    /// (connects completed, handshake replies, late replies), in a few non-blocking
    /// polls. For a health report from a client that made no call lately.
    pub fn refresh(&mut self) {
        self.engine.maintain(&mut self.net, Instant::now());
        // A handshake is a few steps (connected, written, answered): a few polls, each
        // taking what is there, none waiting.
        for _ in 0..4 {
            if !self
                .waits
                .once(&mut self.engine, &mut self.net, Duration::ZERO, None)
            {
                break;
            }
        }
        self.forward();
    }

    /// Every node's health, read from the sessions (no I/O).
    pub fn health(&self) -> Vec<crate::shared::health::NodeHealth> {
        use crate::core::engine::MAX_ROUNDS_BEHIND;
        use crate::core::session::State;
        use crate::shared::health::{NodeHealth, NodeState};
        let now = Instant::now();
        let cutoff = now.checked_sub(self.engine.timing().node_timeout);
        let round = self.engine.round_id();
        self.engine
            .sessions()
            .iter()
            .zip(self.net.endpoints())
            .map(|(s, e)| NodeHealth {
                node: e.to_string(),
                state: match s.state {
                    State::Down => NodeState::Down(match s.down_error() {
                        // "Down, reconnecting" is what `NodeState::Down` says already.
                        crate::error::NodeError::Down(why) => (*why).clone(),
                        why => why,
                    }),
                    State::Connecting => NodeState::Connecting,
                    State::Ready if s.handshaking() => NodeState::Connecting,
                    State::Ready
                        if s.is_lagging(cutoff) || s.rounds_behind(round) > MAX_ROUNDS_BEHIND =>
                    {
                        NodeState::Lagging
                    }
                    State::Ready => NodeState::Connected,
                },
                latency: s.handshake_rtt,
            })
            .collect()
    }

    /// Whether a node, as last identified, runs in cluster mode.
    pub fn cluster_mode(&self) -> bool {
        self.engine
            .sessions()
            .iter()
            .any(|s| s.identity.is_some_and(|id| id.cluster))
    }

    /// The nodes the last round's command was handed to.
    pub fn written(&self) -> u64 {
        self.engine.written()
    }

    /// Sum of buffer capacities over all nodes (for tests of bounded memory).
    pub fn buffered(&self) -> usize {
        self.engine.buffered()
    }
}

impl Waits {
    /// Waits for events at most `timeout` and hands them to `engine`; false when the
    /// wait brought none (it timed out, or failed). Reads no clock.
    #[inline(always)]
    fn once(
        &mut self,
        engine: &mut Engine,
        net: &mut Net,
        timeout: Duration,
        mut active: Option<&mut Active<'_>>,
    ) -> bool {
        let polled = self.poll.poll(&mut self.events, Some(timeout));
        // An interrupted or failed wait just loops again; the round's budget bounds it.
        if polled.is_err() || self.events.is_empty() {
            return false;
        }
        // A token that is not a node's (see `Driver::registry`) misses the engine's
        // session lookup and is kept there, on its cold path: no test here.
        for ev in self.events.iter() {
            let closed = ev.is_read_closed() || ev.is_error();
            let readable = ev.is_readable() || closed;
            engine.on_event(net, ev.token().0, readable, closed, active.as_deref_mut());
        }
        true
    }

    /// [`Waits::once`] for an acquire holding its writes back for the last lost
    /// attempt's deletes (see `Engine::hold_until`): the wait ends in time to stop
    /// waiting for them, and the budget, which counted a wait that may have been cut
    /// short, lets the clock size the next one.
    #[cold]
    fn holding(
        &mut self,
        engine: &mut Engine,
        net: &mut Net,
        timeout: Duration,
        active: &mut Active<'_>,
        budget: &mut WaitBudget,
    ) -> bool {
        let timeout = match engine.hold_until() {
            Some(until) => timeout.min(until.saturating_duration_since(Instant::now())),
            None => timeout,
        };
        let woke = self.once(engine, net, timeout, Some(active));
        let now = Instant::now();
        engine.release_held(net, active, now);
        budget.expire();
        woke
    }
}

/// After a batch of replies: stamps the decisions it took with one clock reading, which
/// it returns (`None`: none taken, the clock not read).
#[inline(always)]
fn stamp(round: &mut Round) -> Option<Instant> {
    if round.has_unstamped() {
        let now = Instant::now();
        round.stamp(now);
        Some(now)
    } else {
        None
    }
}

/// Runs the alarm if its time has come, and sets the next one.
#[cold]
fn ring(alarm: &mut Option<(Instant, Alarm)>) {
    if let Some((at, run)) = alarm.take() {
        let now = Instant::now();
        if now < at {
            *alarm = Some((at, run));
        } else if let Some(next) = run(now) {
            *alarm = Some((next, run));
        }
    }
}
