//! The loop thread of the shared client: takes the queued requests, runs them in rounds
//! on a direct client's driver (the same protocol core), answers them, and keeps leases
//! alive.
//!
//! # Overview
//!
//! One pass of the loop: take every request queued ([`Queue`]); fire the timers that are
//! due (attempts to retry, leases to extend or to declare lost, `lock_within` deadlines);
//! then run one round per kind of work ready — releases first (they free resources
//! others wait for), then extends, then acquires, all acquires of one ttl in one round
//! (K commands, one write per node); answer; and sleep until the next timer or request.
//! Callers answered by one round often ask again at once (an unlock after a lock, a lock
//! after an unlock): the loop waits for them briefly ([`EventLoop::gather`]), after the
//! releases and again after the pass, so that they go out together in the next round.
//!
//! A round may also be begun by a future's poll while the loop is parked
//! ([`EventLoop::serve_briefly`]); if that poll gives up waiting for it, the round is left
//! in flight, and the loop's next pass finishes it before anything else.
//!
//! # Invariants
//!
//! - Every request taken is answered exactly once, or, when its caller is gone, what it
//!   acquired is released ([`Call::answer`]).
//! - A lease is extended only while it is not lost, and only ever with compare-and-pexpire
//!   on its own token: a key it lost is never taken back.
//! - The loop ends only when no handle is left, after the releases queued before then
//!   have left the process (a release round waits for its writes).
//! - Steady state (every node ready, requests of one ttl) allocates nothing per request:
//!   the scratch buffers of a round are kept between rounds.

use super::call::{Call, Done, Op};
use super::lease::{LeaseShared, Renewal, renew_at, renewal};
use super::notices::Notices;
use super::{Inner, Queue, loop_gone};
use crate::config::Settings;
use crate::core::engine::{Item, Request};
use crate::core::quorum::safe_span;
use crate::core::round::Decision;
use crate::driver::{Alarm, WAKER};
use crate::error::{Error, LostReason, OsError, Phase};
use crate::lock::Lock;
use crate::redlock::{MAX_BATCH_BYTES, Redlock, check_resource, ttl_millis};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Most commands one round of the loop carries: a burst of requests is cut into rounds
/// short enough to be answered well within `node_timeout` on a busy machine.
const SHARED_BATCH: usize = 256;

/// How long before a lease's deadline the loop reports it lost: waits are rounded up to
/// the millisecond (epoll), so a wake-up timed for the deadline itself would come after
/// it.
const LOST_EARLY: Duration = Duration::from_millis(2);

/// How long the loop lingers after a round for the next request before it sleeps.
const LINGER: Duration = Duration::from_micros(30);

/// How long the loop waits, at most, for the callers a round answered to come back
/// before it runs the next round without them (see [`EventLoop::gather`]).
const GATHER: Duration = Duration::from_micros(100);

/// A gathering stops once no request has come for this long.
const GATHER_GAP: Duration = Duration::from_micros(20);

/// How long a future's poll waits, at most, for the acquire round it runs itself
/// ([`EventLoop::serve_briefly`]) before it leaves the round to the loop thread: the
/// longest it blocks its executor. (`epoll_wait` counts whole milliseconds.)
const INLINE_WAIT: Duration = Duration::from_millis(1);

/// Futures run their acquire in their poll only while acquire rounds are decided this
/// fast: on slower nodes, a thread hand-off is small beside a round, and a poll should
/// not block for long.
const QUICK_ROUND: Duration = Duration::from_micros(500);

/// Starts the loop thread; returns what its handles share.
pub(crate) fn start(settings: Settings) -> Result<Arc<Inner>, Error> {
    let rl = Redlock::from_settings(settings.clone())?;
    let waker = mio::Waker::new(rl.driver.registry(), WAKER)
        .map_err(|e| Error::Os(OsError::new("creating the shared client's waker", e)))?;
    let inner = Arc::new(Inner {
        settings,
        queue: Mutex::new(Queue {
            calls: Vec::new(),
            dropped: Vec::new(),
            sleeping: false,
            parked: false,
            stopping: false,
            ended: false,
        }),
        waker,
        users: AtomicUsize::new(1),
        thread: Mutex::new(None),
        pending: AtomicUsize::new(0),
        state: Mutex::new(None),
        unparked: std::sync::Condvar::new(),
    });
    let notices = Notices::new(rl.driver.registry(), &inner.settings, Instant::now())
        .map_err(|e| Error::Os(OsError::new("creating the release notice connections", e)))?;
    *inner.state() = Some(EventLoop::new(rl, Arc::clone(&inner), notices));
    let shared = Arc::clone(&inner);
    let thread = std::thread::Builder::new()
        .name("quorumlock".into())
        .spawn(move || run(shared))
        .map_err(|e| {
            // The state holds the handles' `Inner`: let go of it, or neither is freed.
            inner.state().take();
            Error::Os(OsError::new("starting the shared client's loop thread", e))
        })?;
    *inner.thread.lock().unwrap_or_else(|e| e.into_inner()) = Some(thread);
    Ok(inner)
}

/// What a pass leaves the loop thread to do.
enum Pass {
    /// Work was done: another pass at once.
    Again,
    /// No handle is left and nothing remains to do.
    Stop,
    /// Idle: park, the state left free for callers.
    Park,
    /// Wait on the `Poll` for a request, a timer or a reply (the argument: stopping).
    Wait(bool),
}

/// The loop thread: passes while there is work, waits on the `Poll` while timers or
/// connections need watching, parks (its state free) while idle.
fn run(inner: Arc<Inner>) {
    // Whatever ends the loop (a return, or a panic unwinding through here), the handles
    // learn it and nothing queued waits forever.
    let _guard = EndGuard(Arc::clone(&inner));
    loop {
        let mut state = inner.state();
        let Some(l) = state.as_mut() else { break };
        match l.pass() {
            Pass::Again => {}
            Pass::Stop => break,
            Pass::Wait(stopping) => l.sleep(stopping),
            Pass::Park => {
                let mut q = inner.queue();
                if q.calls.is_empty() && q.dropped.is_empty() && !q.stopping {
                    q.parked = true;
                    drop(state);
                    while q.parked {
                        q = inner.unparked.wait(q).unwrap_or_else(|e| e.into_inner());
                    }
                }
            }
        }
    }
}

/// An acquire request between its attempts.
struct Acquire {
    call: Arc<Call>,
    /// Attempts made so far.
    made: u32,
    attempts: u32,
    /// No attempt starts at or after this (`lock_within`).
    until: Option<Instant>,
    /// When the next attempt may start (or, with `last` set, when to answer).
    due: Instant,
    ttl: Duration,
    ttl_ms: u64,
    lease: bool,
    /// The error of the last attempt: answered at `due` when `final_answer` is set (no
    /// attempt is left), or when `until` has passed by the time the next would start.
    last: Option<Error>,
    final_answer: bool,
    /// Subscribed to the key's release notices (from its first failed attempt until it
    /// is answered).
    subscribed: bool,
    /// The nodes whose release notice for the key came since the last attempt.
    heard: u64,
    /// A hash of the key, set when it subscribes: notices skip other waiters without
    /// locking their calls ([`key_hash`]).
    key_hash: u64,
}

/// A live lease, as the loop keeps it.
struct LeaseEntry {
    shared: Arc<LeaseShared>,
    lock: Lock,
    ttl: Duration,
    /// When to extend next.
    next: Instant,
    /// Past this the lease is released and lost ([`Settings::max_hold`]).
    hold_until: Option<Instant>,
    lost: bool,
}

pub(crate) struct EventLoop {
    rl: Redlock,
    inner: Arc<Inner>,
    /// Requests taken from the queue (swapped with it: both keep their capacity).
    taken: Vec<Arc<Call>>,
    dropped: Vec<Arc<LeaseShared>>,
    /// Acquires waiting for their next attempt, or their final answer.
    waiting: Vec<Acquire>,
    /// Acquires to attempt now.
    ready: Vec<Acquire>,
    /// Extends and unlocks asked for by callers, to run now.
    extends: Vec<Arc<Call>>,
    unlocks: Vec<Arc<Call>>,
    /// Locks to release with no one waiting for the answer (abandoned acquisitions,
    /// dropped leases, leases past their maximum hold or found lost).
    orphans: Vec<Lock>,
    leases: Vec<LeaseEntry>,
    /// The subscriber connections of the release notices waiters listen to.
    notices: Notices,
    /// Readiness of the subscriber connections (bit `i`: node `i`) not handled yet.
    foreign: u64,
    /// The leases kept, for the driver's alarm, which marks them lost at their deadline
    /// even in the middle of a round.
    watch: Arc<Mutex<Vec<Arc<LeaseShared>>>>,
    alarm: Alarm,
    /// Scratch of an acquire round: the keys, end to end, and each one's span.
    keys: Vec<u8>,
    spans: Vec<(usize, usize)>,
    tokens: Vec<crate::core::token::Token>,
    settled: Vec<Result<Lock, Error>>,
    batch: Vec<Acquire>,
    /// Scratch of an acquire round's items (kept empty between rounds).
    items: Vec<Item<'static>>,
    /// Scratch of a lease extend round: the leases due.
    due: Vec<usize>,
    /// Releases to run now: the locks, who waits for each answer (none for an orphan),
    /// and how many attempts each has had.
    locks: Vec<Lock>,
    owners: Vec<Option<Arc<Call>>>,
    made: Vec<u32>,
    /// Releases that too few nodes answered, tried again at their time.
    later: Vec<(Instant, Option<Arc<Call>>, Lock, u32)>,
    /// Callers answered since the queue was last taken: how many requests may come
    /// back at once ([`EventLoop::gather`]).
    answered: usize,
    /// An acquire round a future's poll wrote and stopped waiting for
    /// ([`EventLoop::serve_briefly`]): the loop finishes it before anything else.
    flight: Option<Flight>,
    /// The last acquire round was decided within [`QUICK_ROUND`]: a future's acquire
    /// may run in its poll.
    quick: bool,
}

/// A round in flight, begun by a future's poll: what it is for, and its start.
// One value per loop, moved rarely: boxing the `Lock` would put an allocation on the
// release path, which the allocation-counting tests keep at zero.
#[allow(clippy::large_enum_variant)]
enum Flight {
    /// The acquires in `EventLoop::batch`, all of one ttl.
    Acquire { ttl_ms: u64, start: Instant },
    /// The release of `lock`, for `owner`.
    Release {
        lock: Lock,
        owner: Arc<Call>,
        start: Instant,
    },
}

impl EventLoop {
    fn new(rl: Redlock, inner: Arc<Inner>, notices: Notices) -> EventLoop {
        let watch: Arc<Mutex<Vec<Arc<LeaseShared>>>> = Arc::default();
        let watched = Arc::clone(&watch);
        let alarm: Alarm = Arc::new(move |now| {
            let list = watched.lock().unwrap_or_else(|e| e.into_inner());
            let mut next: Option<Instant> = None;
            for lease in list.iter() {
                let deadline = {
                    let s = lease.state();
                    if s.is_marked() {
                        continue;
                    }
                    s.deadline
                };
                if now + LOST_EARLY >= deadline {
                    lease.mark_expired();
                } else {
                    let at = deadline - LOST_EARLY;
                    next = Some(next.map_or(at, |n| n.min(at)));
                }
            }
            next
        });
        EventLoop {
            notices,
            foreign: 0,
            watch,
            alarm,
            rl,
            inner,
            taken: Vec::new(),
            dropped: Vec::new(),
            waiting: Vec::new(),
            ready: Vec::new(),
            extends: Vec::new(),
            unlocks: Vec::new(),
            orphans: Vec::new(),
            leases: Vec::new(),
            keys: Vec::new(),
            spans: Vec::new(),
            tokens: Vec::new(),
            settled: Vec::new(),
            batch: Vec::new(),
            items: Vec::new(),
            due: Vec::new(),
            locks: Vec::new(),
            owners: Vec::new(),
            made: Vec::new(),
            later: Vec::new(),
            answered: 0,
            flight: None,
            quick: true,
        }
    }

    /// One pass: takes the queue, fires the timers, runs the rounds due.
    fn pass(&mut self) -> Pass {
        let stopping = self.take_queue();
        let now = Instant::now();
        self.hear(now);
        self.fire_timers(now);
        if self.has_work(now) {
            self.run_rounds(true);
            // A caller just answered often asks again at once (an unlock after its
            // lock): waiting a moment spares it the loop's wake-up, and many callers
            // answered together go out together in the next round.
            match std::mem::take(&mut self.answered) {
                0 | 1 => self.linger(),
                n => self.gather(n),
            }
            return Pass::Again;
        }
        if stopping && self.later.is_empty() {
            return Pass::Stop;
        }
        if !stopping && self.is_idle() {
            return Pass::Park;
        }
        // Stopping, only the retries of releases remain: they are waited for.
        Pass::Wait(stopping)
    }

    /// Nothing for the loop to watch or time: no request between attempts, no lease, no
    /// release to try again, no waiter listening, nothing left to write. Its thread may park, and a caller run
    /// its own request ([`EventLoop::serve`]).
    pub(crate) fn is_idle(&mut self) -> bool {
        self.flight.is_none()
            && self.waiting.is_empty()
            && self.leases.is_empty()
            && self.later.is_empty()
            && self.ready.is_empty()
            && self.extends.is_empty()
            && self.unlocks.is_empty()
            && self.orphans.is_empty()
            && self.locks.is_empty()
            && !self.notices.any_wanted()
            && self.notices.next_timer().is_none()
            && self.notices.quiet()
            // Bytes still to write (a delete queued on a connection being reopened) go
            // out on the Poll's next event: the loop must be there to take it.
            && !self.rl.driver.writes_pending()
    }

    /// Runs `call` on the calling thread (the loop is parked, the queue empty): what a
    /// pass would do with it, without the hand-off.
    pub(crate) fn serve(&mut self, call: Arc<Call>) {
        self.accept(call, Instant::now());
        self.run_rounds(false);
        self.answered = 0;
    }

    fn has_work(&self, now: Instant) -> bool {
        self.flight.is_some()
            || !self.ready.is_empty()
            || !self.extends.is_empty()
            || !self.unlocks.is_empty()
            || !self.orphans.is_empty()
            || !self.locks.is_empty()
            || self.leases_due(now)
    }

    /// Takes every queued request; true once no handle is left.
    fn take_queue(&mut self) -> bool {
        let stopping = {
            let mut q = self.inner.queue();
            q.sleeping = false;
            self.inner.pending.store(0, Ordering::Relaxed);
            self.answered = 0;
            std::mem::swap(&mut q.calls, &mut self.taken);
            std::mem::swap(&mut q.dropped, &mut self.dropped);
            q.stopping
        };
        let now = Instant::now();
        let mut taken = std::mem::take(&mut self.taken);
        for call in taken.drain(..) {
            self.accept(call, now);
        }
        self.taken = taken;
        let mut dropped = std::mem::take(&mut self.dropped);
        for lease in dropped.drain(..) {
            if let Some(i) = self
                .leases
                .iter()
                .position(|e| Arc::ptr_eq(&e.shared, &lease))
            {
                let entry = self.leases.swap_remove(i);
                entry.shared.mark_lost(LostReason::Released);
                self.unwatch(&entry.shared);
                self.orphans.push(entry.lock);
            }
        }
        self.dropped = dropped;
        stopping
    }

    /// Sorts one request into the work of this pass; refuses bad arguments at once.
    fn accept(&mut self, call: Arc<Call>, now: Instant) {
        let r = call.lock();
        match r.op {
            Op::Lock { attempts, until } | Op::Lease { attempts, until } => {
                let lease = matches!(r.op, Op::Lease { .. });
                let ttl = r.ttl;
                let checked = ttl_millis(ttl).and_then(|ms| {
                    self.rl.check_key(&r.key)?;
                    check_resource(&r.key)?;
                    let whole = Duration::from_millis(ms);
                    if safe_span(whole, self.rl.settings.drift_factor).is_none() {
                        return Err(self.rl.ttl_within_drift(ttl));
                    }
                    if self.rl.settings.fencing {
                        self.rl.check_fenced_ttl(whole)?;
                    }
                    Ok(ms)
                });
                drop(r);
                match checked {
                    Ok(ttl_ms) => self.ready.push(Acquire {
                        call,
                        made: 0,
                        attempts: attempts.max(1),
                        until,
                        due: now,
                        // Whole milliseconds, as the nodes are sent (`PX`): the validity
                        // arithmetic must not count the sub-millisecond rest.
                        ttl: Duration::from_millis(ttl_ms),
                        ttl_ms,
                        lease,
                        last: None,
                        final_answer: false,
                        subscribed: false,
                        heard: 0,
                        key_hash: 0,
                    }),
                    Err(e) => {
                        self.tell(&call, Err(e));
                    }
                }
            }
            Op::LockAll => {
                drop(r);
                self.ready.push(Acquire {
                    call,
                    made: 0,
                    attempts: self.rl.settings.retry_count.saturating_add(1),
                    until: None,
                    due: now,
                    ttl: Duration::ZERO,
                    ttl_ms: 0,
                    lease: false,
                    last: None,
                    final_answer: false,
                    subscribed: false,
                    heard: 0,
                    key_hash: 0,
                });
            }
            Op::Extend => {
                drop(r);
                self.extends.push(call);
            }
            Op::Unlock | Op::Release => {
                drop(r);
                self.unlocks.push(call);
            }
            Op::Health => {
                // Read from the sessions at once: no I/O, microseconds of the loop.
                drop(r);
                let health = self.rl.health();
                self.tell(&call, Ok(Done::Health(health)));
            }
        }
    }

    /// Moves due retries to `ready`, answers `lock_within` calls whose time is up, and
    /// keeps leases: lost at their deadline or maximum hold, extended when due.
    fn fire_timers(&mut self, now: Instant) {
        let mut i = 0;
        while i < self.waiting.len() {
            if self.waiting[i].due > now {
                i += 1;
                continue;
            }
            let mut a = self.waiting.swap_remove(i);
            if is_abandoned(&a.call) {
                // Its caller is gone: no more attempts (they would only take the key
                // from live waiters, to release it again).
                self.unsubscribe(&a);
                continue;
            }
            // No attempt starts once `until` has passed: the call fails with the last
            // attempt's error.
            let expired = a.until.is_some_and(|u| now >= u) && a.made > 0;
            match a.last.take() {
                Some(e) if a.final_answer || expired => {
                    self.unsubscribe(&a);
                    self.answer_acquire(a.call, Err(e));
                }
                last => {
                    a.last = last;
                    a.heard = 0;
                    self.ready.push(a);
                }
            }
        }
        let mut i = 0;
        while i < self.later.len() {
            if self.later[i].0 > now {
                i += 1;
                continue;
            }
            let (_, owner, lock, made) = self.later.swap_remove(i);
            self.locks.push(lock);
            self.owners.push(owner);
            self.made.push(made);
        }
        for e in &mut self.leases {
            if e.lost {
                continue;
            }
            if e.shared.is_marked() || now + LOST_EARLY >= e.lock.deadline() {
                e.lost = true;
                e.shared.mark_expired();
                continue;
            }
            if e.hold_until.is_some_and(|h| now >= h) {
                e.lost = true;
                e.shared.mark_lost(LostReason::MaxHold);
                self.orphans.push(e.lock.duplicate());
            }
        }
    }

    /// Leases due for an extend now.
    fn leases_due(&self, now: Instant) -> bool {
        self.leases.iter().any(|e| !e.lost && now >= e.next)
    }

    /// One round per kind of work: releases, extends, acquires. On the loop thread
    /// (`regather`), callers answered by the releases and extends who ask again at once
    /// (a lock after an unlock) are waited for, briefly, and join the acquire round.
    fn run_rounds(&mut self, regather: bool) {
        self.arm();
        self.finish_flight();
        if !self.unlocks.is_empty() || !self.orphans.is_empty() || !self.locks.is_empty() {
            self.run_releases();
        }
        if !self.extends.is_empty() {
            self.run_extends();
        }
        if self.leases_due(Instant::now()) {
            self.extend_leases();
        }
        if regather && self.answered >= 2 {
            let n = std::mem::take(&mut self.answered);
            self.gather(n);
            // Stopping or not is the next pass's to see: the flag stays set.
            self.take_queue();
        }
        if !self.ready.is_empty() {
            self.run_acquires();
        }
    }

    /// The next moment a timer is due.
    fn next_timer(&self) -> Option<Instant> {
        let waits = self
            .waiting
            .iter()
            .map(|a| a.due)
            .chain(self.later.iter().map(|l| l.0));
        let leases = self
            .leases
            .iter()
            .filter(|e| !e.lost)
            .flat_map(|e| {
                let lost_at = e.lock.deadline().checked_sub(LOST_EARLY);
                [Some(e.next), lost_at, e.hold_until]
            })
            .flatten();
        waits.chain(leases).chain(self.notices.next_timer()).min()
    }

    /// Spins for a few microseconds, or until a request is queued.
    fn linger(&self) {
        let start = Instant::now();
        while self.inner.pending.load(Ordering::Acquire) == 0 && start.elapsed() < LINGER {
            std::hint::spin_loop();
        }
    }

    /// Waits, at most [`GATHER`], until `n` requests are queued: the callers just
    /// answered, who often ask again at once. Together they make one round of `n`
    /// commands instead of several small ones. The wait ends early once requests stop
    /// coming ([`GATHER_GAP`]), or when none came within [`LINGER`] (then the callers are
    /// busy elsewhere: waiting costs no more than a linger). It yields the CPU meanwhile:
    /// on a small machine, the callers it waits for need it.
    fn gather(&self, n: usize) {
        let start = Instant::now();
        let (mut seen, mut since) = (0, start);
        loop {
            let queued = self.inner.pending.load(Ordering::Acquire);
            if queued >= n {
                return;
            }
            let now = Instant::now();
            if queued != seen {
                (seen, since) = (queued, now);
            }
            // Nobody back within the linger: they are busy elsewhere, not on their way.
            let lingered = seen == 0 && now - start >= LINGER;
            if lingered || now - start >= GATHER || (seen > 0 && now - since >= GATHER_GAP) {
                return;
            }
            std::thread::yield_now();
        }
    }

    /// Waits for a request, a timer, or a late reply.
    fn sleep(&mut self, stopping: bool) {
        {
            let mut q = self.inner.queue();
            if !q.calls.is_empty() || !q.dropped.is_empty() || (q.stopping && !stopping) {
                return;
            }
            q.sleeping = true;
        }
        let timeout = self
            .next_timer()
            .map(|t| t.saturating_duration_since(Instant::now()));
        if timeout != Some(Duration::ZERO) {
            self.rl.driver.wait(timeout);
        }
    }

    /// Reads the subscriber connections that are ready and moves up the next attempt of
    /// every waiter whose key a majority of nodes has announced released; keeps the
    /// connections (opened while wanted, reopened with backoff).
    fn hear(&mut self, now: Instant) {
        self.foreign |= self.rl.driver.take_foreign();
        let ready = std::mem::take(&mut self.foreign) & !(1 << 63);
        if ready != 0 {
            let quorum = self.rl.quorum();
            let waiting = &mut self.waiting;
            self.notices.on_ready(ready, now, |node, key| {
                let hash = key_hash(key);
                for a in waiting.iter_mut() {
                    // The hash first: thousands of waiters cost no lock each.
                    if !a.subscribed || a.key_hash != hash || a.call.lock().key != key {
                        continue;
                    }
                    a.heard |= 1 << node;
                    if a.heard.count_ones() as usize >= quorum {
                        a.heard = 0;
                        // A small jitter, so that waiters woken together do not split
                        // the votes; an attempt never starts past `until`.
                        let at = now + Duration::from_micros(fastrand::u64(0..1000));
                        if a.until.is_none_or(|u| at < u) {
                            a.due = at;
                            a.final_answer = false;
                        }
                    }
                }
            });
        }
        self.notices.maintain(now);
    }

    /// Listens for `a`'s key's release notices, from its first failed attempt on.
    fn subscribe(&mut self, a: &mut Acquire, now: Instant) {
        if !a.subscribed && !is_lock_all(&a.call) {
            a.subscribed = true;
            let r = a.call.lock();
            a.key_hash = key_hash(&r.key);
            self.notices.want(&r.key, now);
        }
    }

    /// Stops listening for `a`'s key (it is being answered).
    fn unsubscribe(&mut self, a: &Acquire) {
        if a.subscribed {
            let r = a.call.lock();
            self.notices.unwant(&r.key, Instant::now());
        }
    }

    // ---- acquires ----

    fn run_acquires(&mut self) {
        // One round for the acquires of the first one's ttl (and kind); the rest wait
        // for the next pass, which comes at once.
        // Rounds run before this one (releases, extends) took time: an acquire whose
        // `until` has passed since it was found due starts no attempt; one whose caller
        // is gone is dropped.
        let now = Instant::now();
        let mut i = 0;
        while i < self.ready.len() {
            let a = &self.ready[i];
            let gone = is_abandoned(&a.call);
            let expired = a.made > 0 && a.until.is_some_and(|u| now >= u);
            if !gone && !expired {
                i += 1;
                continue;
            }
            let mut a = self.ready.swap_remove(i);
            self.unsubscribe(&a);
            if let (false, Some(e)) = (gone, a.last.take()) {
                self.answer_acquire(a.call, Err(e));
            }
        }
        let Some(first) = self.ready.first() else {
            return;
        };
        let (ttl_ms, multi) = (first.ttl_ms, is_lock_all(&first.call));
        if multi {
            let a = self.ready.swap_remove(0);
            return self.attempt_all(a);
        }
        // Empty between rounds (a flight's acquires were landed first).
        debug_assert!(self.batch.is_empty());
        let mut bytes = 0;
        let mut i = 0;
        while i < self.ready.len() && self.batch.len() < SHARED_BATCH {
            let a = &self.ready[i];
            if a.ttl_ms != ttl_ms || is_lock_all(&a.call) {
                i += 1;
                continue;
            }
            let len = a.call.lock().key.len() + 128;
            if !self.batch.is_empty() && bytes + len > MAX_BATCH_BYTES {
                break;
            }
            bytes += len;
            let a = self.ready.swap_remove(i);
            self.batch.push(a);
        }
        self.attempt_batch(ttl_ms);
    }

    /// One attempt for every acquire of `batch` (all of `ttl_ms`), in one round.
    fn attempt_batch(&mut self, ttl_ms: u64) {
        let Some(start) = self.launch(ttl_ms) else {
            return;
        };
        self.await_batch(ttl_ms, None);
        self.land(ttl_ms, start);
    }

    /// Writes the round of one attempt for every acquire of `batch` (all of `ttl_ms`);
    /// returns its start, or `None` when no token could be drawn (each acquire is then
    /// answered with that error, and `batch` emptied). The acquires stay in `batch`
    /// until [`EventLoop::land`] answers them: should the loop die meanwhile, its drop
    /// answers them there.
    fn launch(&mut self, ttl_ms: u64) -> Option<Instant> {
        self.keys.clear();
        self.spans.clear();
        self.tokens.clear();
        let mut drawn = Ok(());
        for a in self.batch.iter_mut() {
            a.made += 1;
            let r = a.call.lock();
            self.spans.push((self.keys.len(), r.key.len()));
            self.keys.extend_from_slice(&r.key);
            let token = match &r.token {
                Some(given) => Ok(given.clone()),
                None => self.rl.next_token(),
            };
            match token {
                Ok(t) => self.tokens.push(t),
                Err(e) => {
                    drawn = Err(e);
                    break;
                }
            }
        }
        if let Err(e) = drawn {
            let mut batch = std::mem::take(&mut self.batch);
            for a in batch.drain(..) {
                self.unsubscribe(&a);
                self.answer_acquire(a.call, Err(e.clone()));
            }
            self.batch = batch;
            return None;
        }
        let items = items_of(&mut self.items, &self.keys, &self.spans, &self.tokens);
        let req = Request {
            fencing: self.rl.fencing(),
            ..Request::new(Phase::Acquire, ttl_ms, &items, 0)
        };
        let rl = &mut self.rl;
        let start = rl.driver.begin(&mut rl.round, &req);
        self.items = reborrow(items);
        Some(start)
    }

    /// Waits for the round [`EventLoop::launch`] wrote until it is decided (true), or
    /// until `give_up` (false: the round stays in flight, see `Driver::finish`).
    fn await_batch(&mut self, ttl_ms: u64, give_up: Option<Instant>) -> bool {
        let items = items_of(&mut self.items, &self.keys, &self.spans, &self.tokens);
        let req = Request {
            fencing: self.rl.fencing(),
            ..Request::new(Phase::Acquire, ttl_ms, &items, 0)
        };
        let rl = &mut self.rl;
        let done = rl.driver.finish(&mut rl.round, &req, give_up);
        self.items = reborrow(items);
        done
    }

    /// What a decided acquire round gives each acquire of `batch`: its lock, or its
    /// error and the deletes of what it may have set; then the answer or the next try.
    fn land(&mut self, ttl_ms: u64, start: Instant) {
        let whole = Duration::from_millis(ttl_ms);
        let safe = safe_span(whole, self.rl.settings.drift_factor);
        let items = items_of(&mut self.items, &self.keys, &self.spans, &self.tokens);
        let rl = &mut self.rl;
        let written = rl.driver.written();
        rl.lost.clear();
        self.settled.clear();
        for (slot, (item, a)) in items.iter().zip(self.batch.iter()).enumerate() {
            let result = match rl.won_until(slot, safe, start) {
                Some(end) => Ok(Lock::new(
                    item.key,
                    item.token.clone(),
                    whole,
                    start,
                    end,
                    written,
                )),
                None => {
                    rl.lost.push(slot);
                    Err(rl.acquire_error(item.key, slot, start, a.made))
                }
            };
            self.settled.push(result);
        }
        rl.driver.release_lost(&items, &rl.lost);
        if rl.settings.fencing {
            rl.fence_batch(&items, &mut self.settled, start);
        }
        self.items = reborrow(items);
        let now = Instant::now();
        self.quick = now.saturating_duration_since(start) < QUICK_ROUND;
        let mut settled = std::mem::take(&mut self.settled);
        let mut batch = std::mem::take(&mut self.batch);
        for (a, result) in batch.drain(..).zip(settled.drain(..)) {
            self.settle(a, result, now);
        }
        self.batch = batch;
        self.settled = settled;
    }

    /// Runs a future's acquire or unlock in its poll, on the caller's thread (the loop
    /// is parked, the queue empty): writes its round and waits for it at most
    /// [`INLINE_WAIT`]. If the round is not decided by then, it is left in flight for the
    /// loop thread to finish ([`EventLoop::finish_flight`]), and the caller must wake the
    /// loop. Returns false, having done nothing, when the request is not one to run so
    /// (another kind, fencing on for an acquire) or the nodes have lately been slow to
    /// decide.
    pub(crate) fn serve_briefly(&mut self, call: &Arc<Call>) -> bool {
        if !self.quick || self.flight.is_some() {
            return false;
        }
        let op = call.lock().op;
        match op {
            Op::Lock { .. } | Op::Lease { .. }
                if !self.rl.settings.fencing && self.ready.is_empty() =>
            {
                self.acquire_briefly(call)
            }
            Op::Unlock => self.unlock_briefly(call),
            _ => false,
        }
    }

    fn acquire_briefly(&mut self, call: &Arc<Call>) -> bool {
        self.accept(Arc::clone(call), Instant::now());
        // Refused at once (a bad argument): answered already.
        let Some(a) = self.ready.pop() else {
            return true;
        };
        let ttl_ms = a.ttl_ms;
        // Empty between rounds; a flight's acquires wait in it (see `Flight`).
        self.batch.push(a);
        self.arm();
        let Some(start) = self.launch(ttl_ms) else {
            return true;
        };
        if self.await_batch(ttl_ms, start.checked_add(INLINE_WAIT)) {
            self.land(ttl_ms, start);
        } else {
            self.flight = Some(Flight::Acquire { ttl_ms, start });
        }
        self.answered = 0;
        true
    }

    fn unlock_briefly(&mut self, call: &Arc<Call>) -> bool {
        let Some(lock) = call.lock().lock.take() else {
            return false;
        };
        self.arm();
        let start = self.rl.begin_unlock(&lock);
        let give_up = start.checked_add(INLINE_WAIT);
        match self.rl.finish_unlock(&lock, start, give_up) {
            Some(result) => self.settle_one_release(lock, Arc::clone(call), result),
            None => {
                self.flight = Some(Flight::Release {
                    lock,
                    owner: Arc::clone(call),
                    start,
                })
            }
        }
        self.answered = 0;
        true
    }

    /// Finishes the round a future's poll left in flight, if any.
    fn finish_flight(&mut self) {
        match self.flight.take() {
            None => {}
            Some(Flight::Acquire { ttl_ms, start }) => {
                self.await_batch(ttl_ms, None);
                self.land(ttl_ms, start);
            }
            Some(Flight::Release { lock, owner, start }) => {
                let result = self.rl.finish_unlock(&lock, start, None);
                // Without a deadline to give up at, the round is always finished.
                let result = result.unwrap_or_else(|| Err(super::mismatched()));
                self.settle_one_release(lock, owner, result);
            }
        }
    }

    /// Answers one release decided outside [`EventLoop::run_releases`], or schedules it
    /// again, as that would.
    fn settle_one_release(&mut self, lock: Lock, owner: Arc<Call>, result: Result<usize, Error>) {
        self.locks.push(lock);
        self.owners.push(Some(owner));
        self.made.push(0);
        let i = self.locks.len() - 1;
        self.settle_release(i, result);
        self.locks.pop();
        self.owners.pop();
        self.made.pop();
    }

    /// A `lock_all` attempt: rare and large, it runs alone (see `Redlock::lock_all`).
    fn attempt_all(&mut self, mut a: Acquire) {
        a.made += 1;
        let (keys, ttl) = {
            let r = a.call.lock();
            (r.keys.clone(), r.ttl)
        };
        let result = self.rl.attempt_all(&keys, ttl, a.made);
        let now = Instant::now();
        self.settle(a, result, now);
    }

    /// What follows an attempt: the answer, or the next attempt's time.
    fn settle(&mut self, mut a: Acquire, result: Result<Lock, Error>, now: Instant) {
        let retryable = matches!(
            result,
            Err(Error::Taken(_) | Error::Unavailable(_) | Error::Expired(_))
        );
        if !retryable || a.made >= a.attempts {
            self.unsubscribe(&a);
        }
        let e = match result {
            Ok(lock) if a.lease => return self.start_lease(a.call, lock, a.ttl),
            Ok(lock) => return self.answer_acquire(a.call, Ok(lock)),
            Err(e) => e,
        };
        if !retryable || a.made >= a.attempts {
            return self.answer_acquire(a.call, Err(e));
        }
        let settings = &self.rl.settings;
        let next = now
            + self
                .rl
                .tokens
                .jitter(settings.retry_delay, settings.retry_jitter);
        match a.until {
            // The last attempt has been made: the call fails at its deadline, not before.
            Some(until) if next >= until => {
                if now >= until {
                    self.unsubscribe(&a);
                    return self.answer_acquire(a.call, Err(e));
                }
                a.due = until;
                a.last = Some(e);
                a.final_answer = true;
            }
            _ => {
                a.due = next;
                a.last = Some(e);
            }
        }
        self.subscribe(&mut a, now);
        self.waiting.push(a);
    }

    /// Answers `call`, counting the callers answered (see [`EventLoop::gather`]); gives
    /// the answer back when its caller is gone ([`Call::answer`]).
    fn tell(&mut self, call: &Call, answer: Result<Done, Error>) -> Option<Result<Done, Error>> {
        let back = call.answer(answer);
        if back.is_none() {
            self.answered += 1;
        }
        back
    }

    /// Answers an acquire (not a lease's: see `start_lease`); a lock whose caller is
    /// gone is released.
    fn answer_acquire(&mut self, call: Arc<Call>, result: Result<Lock, Error>) {
        if let Some(Ok(Done::Locked(lock))) = self.tell(&call, result.map(Done::Locked)) {
            self.orphans.push(lock);
        }
    }

    // ---- leases ----

    fn start_lease(&mut self, call: Arc<Call>, lock: Lock, ttl: Duration) {
        let shared = LeaseShared::new(
            lock.resource(),
            lock.token_value(),
            lock.fence(),
            lock.deadline(),
            lock.until(),
        );
        let hold_until = self
            .rl
            .settings
            .max_hold
            .and_then(|h| lock.started().checked_add(h));
        let entry = LeaseEntry {
            shared: Arc::clone(&shared),
            next: renew_at(lock.started(), ttl),
            lock,
            ttl,
            hold_until,
            lost: false,
        };
        if let Some(Ok(Done::Leased(_))) = self.tell(&call, Ok(Done::Leased(shared))) {
            // Its caller is gone: released at once.
            self.orphans.push(entry.lock);
            return;
        }
        self.watch().push(Arc::clone(&entry.shared));
        self.leases.push(entry);
    }

    fn watch(&self) -> std::sync::MutexGuard<'_, Vec<Arc<LeaseShared>>> {
        self.watch.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn unwatch(&self, lease: &Arc<LeaseShared>) {
        self.watch().retain(|l| !Arc::ptr_eq(l, lease));
    }

    /// Arms the driver's alarm for the earliest deadline of a lease not lost yet.
    fn arm(&mut self) {
        let next = self
            .leases
            .iter()
            .filter(|e| !e.lost)
            .map(|e| e.lock.deadline())
            .min();
        self.rl.driver.set_alarm(next.map(|at| {
            (
                at.checked_sub(LOST_EARLY).unwrap_or(at),
                Arc::clone(&self.alarm),
            )
        }));
    }

    /// Extends every lease that is due: one round per ttl, every lease of it one
    /// command (and slot) in that round.
    fn extend_leases(&mut self) {
        let now = Instant::now();
        let mut due = std::mem::take(&mut self.due);
        loop {
            due.clear();
            let mut ttl = None;
            for (i, e) in self.leases.iter().enumerate() {
                if e.lost || now < e.next || due.len() >= SHARED_BATCH {
                    continue;
                }
                match ttl {
                    None => ttl = Some(e.ttl),
                    Some(t) if t != e.ttl => continue,
                    Some(_) => {}
                }
                due.push(i);
            }
            let Some(ttl) = ttl else { break };
            self.extend_batch(&due, ttl);
        }
        self.due = due;
    }

    /// One extend round for the leases at `due` (indices into `leases`), all of `ttl`;
    /// each lease's verdict as [`Redlock::extend`] gives it.
    fn extend_batch(&mut self, due: &[usize], ttl: Duration) {
        let ttl_ms = ttl.as_millis() as u64;
        let mut items = reborrow(std::mem::take(&mut self.items));
        items.extend(due.iter().map(|&i| {
            let lock = &self.leases[i].lock;
            Item {
                key: lock.resource(),
                token: lock.token_ref(),
            }
        }));
        let rl = &mut self.rl;
        let start = rl.driver.run(
            &mut rl.round,
            &Request::new(Phase::Extend, ttl_ms, &items, 0),
        );
        self.items = reborrow(items);
        let written = rl.driver.written();
        let drift_factor = rl.settings.drift_factor;
        let settings = &rl.settings;
        let pause = (ttl / 10).clamp(
            settings.node_timeout,
            settings.retry_delay.max(settings.node_timeout),
        );
        let now = Instant::now();
        for (slot, &i) in due.iter().enumerate() {
            let e = &mut self.leases[i];
            // Reported lost meanwhile (the alarm rang inside the round): lost it stays,
            // whatever the round says; never extended again.
            if e.lost || e.shared.is_marked() {
                e.lost = true;
                e.lock.add_written(written);
                self.orphans.push(e.lock.duplicate());
                continue;
            }
            let decided = rl.round.decided_at(slot).unwrap_or(now);
            let decision = rl.round.decision(slot);
            // Succeeded or not, the extend may apply on these nodes: the release follows.
            e.lock.add_written(written);
            let current = e.lock.deadline();
            match renewal(
                decision,
                decided,
                start,
                now,
                ttl,
                drift_factor,
                current,
                pause,
            ) {
                Renewal::Renewed { deadline, next } => {
                    e.lock.renew(ttl, start, deadline);
                    if !e.shared.set_deadline(deadline, e.lock.until(), None) {
                        // Its deadline passed before this verdict was read: lost it
                        // stays (its holder may have seen it lost); the keys go.
                        e.lost = true;
                        self.orphans.push(e.lock.duplicate());
                        continue;
                    }
                    e.next = next;
                }
                Renewal::Lost { deadline } => {
                    // A majority says the key is gone or someone else's (or agreed too
                    // late): lost for good, never re-taken. What remains of it on a
                    // minority is deleted.
                    e.lock.shorten(deadline);
                    let failure = rl.failure(Phase::Extend, e.lock.resource(), slot, 1, start);
                    let why = if decision == Decision::Taken {
                        LostReason::TakenOver {
                            last: Box::new(Error::Expired(failure)),
                        }
                    } else {
                        // Agreed, but too late to extend the term.
                        LostReason::Expired {
                            last: Some(Box::new(Error::Expired(failure))),
                        }
                    };
                    e.shared.mark_lost(why);
                    e.lost = true;
                    self.orphans.push(e.lock.duplicate());
                }
                Renewal::Retry { deadline, next } => {
                    // Too few nodes answered: tried again while validity remains; the
                    // deadline declares it lost otherwise.
                    e.lock.shorten(deadline);
                    let failure = rl.failure(Phase::Extend, e.lock.resource(), slot, 1, start);
                    if !e.shared.set_deadline(
                        e.lock.deadline(),
                        e.lock.until(),
                        Some(Error::Unavailable(failure)),
                    ) {
                        e.lost = true;
                        self.orphans.push(e.lock.duplicate());
                        continue;
                    }
                    e.next = next;
                }
            }
        }
    }

    // ---- extends and releases asked for by callers ----

    fn run_extends(&mut self) {
        let mut extends = std::mem::take(&mut self.extends);
        for call in extends.drain(..) {
            let (lock, ttl) = {
                let mut r = call.lock();
                (r.lock.take(), r.ttl)
            };
            let Some(mut lock) = lock else {
                self.tell(&call, Err(super::mismatched()));
                continue;
            };
            let error = self.rl.extend(&mut lock, ttl).err();
            self.tell(&call, Ok(Done::Extended(lock, error)));
        }
        self.extends = extends;
    }

    /// Every release asked for, and every orphan: plain locks in rounds of up to
    /// [`SHARED_BATCH`], locks over several resources or with a fence each by its own
    /// script. A release that too few nodes answered is answered at once (bounded as the
    /// direct client's), then tried again in the background (compare-and-delete is
    /// idempotent) up to `retry_count` times, `node_timeout` apart: a burst that outran
    /// `node_timeout` should not leave keys behind until their ttl.
    fn run_releases(&mut self) {
        let mut calls = std::mem::take(&mut self.unlocks);
        for call in calls.drain(..) {
            let (lock, lease) = {
                let mut r = call.lock();
                (r.lock.take(), r.lease.take())
            };
            let lock = match (lock, lease) {
                (Some(lock), _) => Some(lock),
                (None, Some(lease)) => self.take_lease(&lease),
                (None, None) => None,
            };
            match lock {
                Some(lock) => {
                    self.locks.push(lock);
                    self.owners.push(Some(call));
                    self.made.push(0);
                }
                // A lease released twice: nothing left to delete.
                None => {
                    self.tell(&call, Ok(Done::Released(0)));
                }
            }
        }
        self.unlocks = calls;
        for lock in self.orphans.drain(..) {
            self.locks.push(lock);
            self.owners.push(None);
            self.made.push(0);
        }
        while !self.locks.is_empty() {
            let k = self.locks.len().min(SHARED_BATCH);
            let plain = self.locks[..k]
                .iter()
                .all(|l| !l.is_multi() && l.fence().is_none());
            if plain && k > 1 {
                let results = self.rl.unlock_many(&self.locks[..k]);
                for (i, result) in results.into_iter().enumerate() {
                    self.settle_release(i, result);
                }
            } else {
                for i in 0..k {
                    let result = self.rl.unlock(&self.locks[i]);
                    self.settle_release(i, result);
                }
            }
            // Settled ones left `None` owners and placeholder locks behind: drop the
            // first k entries (those to retry were moved to `later`).
            self.locks.drain(..k);
            self.owners.drain(..k);
            self.made.drain(..k);
        }
    }

    /// Answers release `i` of the current round, or schedules it again.
    fn settle_release(&mut self, i: usize, result: Result<usize, Error>) {
        self.made[i] += 1;
        if matches!(result, Err(Error::Unavailable(_)))
            && self.made[i] <= self.rl.settings.retry_count
        {
            // The caller has its answer now, bounded as the direct client's is; the
            // delete is tried again in the background.
            if let Some(call) = self.owners[i].take() {
                self.tell(&call, result.map(Done::Released));
            }
            let lock = self.locks[i].duplicate();
            let due = Instant::now() + self.rl.settings.node_timeout;
            self.later.push((due, None, lock, self.made[i]));
            return;
        }
        if let Some(call) = self.owners[i].take() {
            self.tell(&call, result.map(Done::Released));
        }
    }

    /// The lock of a lease being released; the lease stops being kept.
    fn take_lease(&mut self, lease: &Arc<LeaseShared>) -> Option<Lock> {
        let i = self
            .leases
            .iter()
            .position(|e| Arc::ptr_eq(&e.shared, lease))?;
        let entry = self.leases.swap_remove(i);
        entry.shared.mark_lost(LostReason::Released);
        self.unwatch(&entry.shared);
        Some(entry.lock)
    }
}

/// A hash of a resource name, to tell waiters apart cheaply (equal hashes are then
/// compared in full: a collision costs a comparison, never a wrong match).
fn key_hash(key: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    h.finish()
}

fn is_abandoned(call: &Call) -> bool {
    call.lock().abandoned
}

fn is_lock_all(call: &Call) -> bool {
    call.lock().op == Op::LockAll
}

impl Drop for EventLoop {
    /// Normally everything is answered by now; after a panic in the loop, every request
    /// it held is answered with an error and every lease reported lost, so that no
    /// caller waits forever.
    fn drop(&mut self) {
        if let Some(Flight::Release { owner, .. }) = self.flight.take() {
            owner.answer(Err(loop_gone()));
        }
        let acquires = self
            .waiting
            .drain(..)
            .chain(self.ready.drain(..))
            .chain(self.batch.drain(..));
        for a in acquires {
            a.call.answer(Err(loop_gone()));
        }
        for call in self.extends.drain(..).chain(self.unlocks.drain(..)) {
            call.answer(Err(loop_gone()));
        }
        for call in self.owners.drain(..).flatten() {
            call.answer(Err(loop_gone()));
        }
        for e in &self.leases {
            e.shared.mark_lost(LostReason::Expired {
                last: Some(Box::new(loop_gone())),
            });
        }
    }
}

/// Marks the loop ended when it stops, normally or by a panic, and answers what is left
/// in the queue.
struct EndGuard(Arc<Inner>);

impl Drop for EndGuard {
    fn drop(&mut self) {
        // The loop's state goes with it: its drop answers whatever it still held and
        // closes every connection (before the last handle's drop returns).
        let state = self.0.state().take();
        drop(state);
        let calls = {
            let mut q = self.0.queue();
            q.ended = true;
            q.dropped.clear();
            std::mem::take(&mut q.calls)
        };
        for call in calls {
            call.answer(Err(loop_gone()));
        }
    }
}

/// `items`, emptied, refilled with the items of an acquire round: each key's span of
/// `keys` with its token.
fn items_of<'k>(
    items: &mut Vec<Item<'static>>,
    keys: &'k [u8],
    spans: &[(usize, usize)],
    tokens: &'k [crate::core::token::Token],
) -> Vec<Item<'k>> {
    let mut out = reborrow(std::mem::take(items));
    out.extend(spans.iter().zip(tokens).map(|(&(at, len), token)| Item {
        key: &keys[at..at + len],
        token,
    }));
    out
}

/// An emptied vector of items, for items of another lifetime: the same allocation, kept
/// from round to round (collecting a vector's own `into_iter` through a `map` reuses its
/// buffer when the element layout is the same, as here, where only a lifetime differs).
fn reborrow<'a, 'b>(mut items: Vec<Item<'a>>) -> Vec<Item<'b>> {
    items.clear();
    items.into_iter().map(|_| unreachable!()).collect()
}
