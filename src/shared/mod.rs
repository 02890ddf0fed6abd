//! The shared client: one event loop thread for every thread and task of a process.
//!
//! [`SharedRedlock`] is a handle (cheap to clone) to a loop thread that owns one
//! connection per node and runs the same protocol core as the direct [`Redlock`] — it is
//! in fact a direct client's driver, run by the loop instead of by a caller. Callers queue
//! requests ([`call::Call`]) and wake the loop (a `mio::Waker` on its `Poll`); the loop
//! takes every request queued at once and writes them to each node in one round (K
//! commands, one write, one read pass; each with its own quorum and validity), so
//! requests that arrive while a round is in flight go out together in the next.
//!
//! # Invariants
//!
//! - The loop runs while any [`SharedRedlock`] clone or any [`Lease`] is alive. When the
//!   last is dropped it finishes the releases still queued (dropped leases, abandoned
//!   acquisitions), then closes every connection and ends; that last drop waits for it,
//!   so a process that drops its last handle before exiting does not cut its releases
//!   short.
//! - Every request queued is answered exactly once; if the loop thread dies (which no
//!   code path should allow), queued and later requests are answered with an error
//!   instead of waiting forever.
//! - A blocking request that finds the loop parked (idle: no lease, no waiter, nothing
//!   queued) runs on its caller's thread, under the lock of the loop's state, which the
//!   loop holds whenever it is not parked: one caller pays no hand-off, and a request
//!   that leaves timers behind (a retry, a lease) wakes the loop to keep them.
//! - A future's acquire or unlock that finds the loop parked writes its round in its
//!   poll and waits there at most `INLINE_WAIT` (1 ms), and only while acquire rounds have
//!   lately been quick; a round not decided by then is left in flight to the loop, which
//!   it wakes. A poll never blocks for a whole round.
//! - A request is queued (or begun in place, see above) on a future's first poll. A
//!   future dropped after that is the cancellation case: anything it acquired, or may
//!   have, is released in the background.
//! - A lease's lost signal never waits for this loop: `is_lost` reads the clock, and
//!   waiters are woken at the deadline by a process-wide timer thread or their own timed
//!   sleep ([`lease`]'s invariants), so an observer callback or a round holding the loop
//!   thread cannot delay them. [`SharedRedlock::with_lease`] drops its work at that
//!   signal.
//!
//! [`Redlock`]: crate::Redlock

mod batch;
pub(crate) mod call;
mod event_loop;
pub(crate) mod health;
pub(crate) mod lease;
mod notices;
mod timer;

use crate::config::Settings;
use crate::core::token::Token;
use crate::error::{Error, OsError};
use crate::lock::Lock;
use crate::redlock::{given_token, ttl_millis};
use call::{Call, Done, Op};
use lease::LeaseShared;
use std::cell::RefCell;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

pub use health::{NodeHealth, NodeState};
pub use lease::{Lease, Lost, LostSignal, LostSignalFuture};

/// A Redlock client shared by every thread and task of a process: one event loop thread,
/// one connection per node, whatever the number of callers.
///
/// Clones share the loop. Every operation of [`Redlock`](crate::Redlock) is here as an
/// `async fn` (runtime-agnostic: the futures only use `std::task::Waker`, and are `Send`)
/// and as a blocking twin (`blocking_lock`, …). Concurrent requests are coalesced: those
/// that arrive while a round is in flight go to each node in one write, each with its own
/// quorum and validity. Leases ([`SharedRedlock::lease`]) are locks the loop keeps alive.
///
/// Failure behaviour is the direct client's: bounded calls with a frozen minority,
/// [`Error::Unavailable`] within bounds with a frozen majority, typed per-node errors.
///
/// # Example
///
/// ```no_run
/// use std::time::Duration;
/// use quorumlock::{Redlock, SharedRedlock};
///
/// let shared: SharedRedlock = Redlock::builder()
///     .nodes(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
///     .build_shared()?;
/// let workers: Vec<_> = (0..8)
///     .map(|i| {
///         let shared = shared.clone();
///         std::thread::spawn(move || -> Result<(), quorumlock::Error> {
///             let lock = shared.blocking_lock(format!("job:{i}"), Duration::from_secs(5))?;
///             // ... work ...
///             shared.blocking_unlock(&lock)?;
///             Ok(())
///         })
///     })
///     .collect();
/// for w in workers {
///     w.join().unwrap()?;
/// }
/// # Ok::<(), quorumlock::Error>(())
/// ```
pub struct SharedRedlock {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for SharedRedlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedRedlock")
            .field("settings", &self.inner.settings)
            .finish_non_exhaustive()
    }
}

/// What the handles and the loop share.
pub(crate) struct Inner {
    settings: Settings,
    queue: Mutex<Queue>,
    waker: mio::Waker,
    /// Live handles: `SharedRedlock` clones and leases. The loop ends when it drops to 0.
    users: AtomicUsize,
    /// Requests queued since the loop last took the queue: what the loop watches while
    /// it waits after a round for the callers it just answered (`event_loop`).
    pending: AtomicUsize,
    /// The loop thread, joined by whoever drops the last handle.
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// The loop's state. Its thread holds this lock while it works or waits on its
    /// `Poll`, and lets go of it only while parked (idle: see [`Queue::parked`]); then a
    /// blocking caller may take it and run its request on its own thread.
    state: Mutex<Option<event_loop::EventLoop>>,
    /// Where the parked loop waits (with the queue's lock).
    unparked: std::sync::Condvar,
}

/// The requests not yet taken by the loop.
pub(crate) struct Queue {
    calls: Vec<Arc<Call>>,
    /// Leases dropped without release: the loop releases them.
    dropped: Vec<Arc<LeaseShared>>,
    /// The loop is waiting on its `Poll` (or about to): a request must wake it (the
    /// `mio::Waker`).
    sleeping: bool,
    /// The loop is idle and parked on [`Inner::unparked`], its state left free: a request
    /// must wake it there, unless its caller runs it itself.
    parked: bool,
    /// No handle is left: the loop finishes what is queued and ends.
    stopping: bool,
    /// The loop has ended; nothing queued now would be answered.
    ended: bool,
}

impl Inner {
    pub(crate) fn queue(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The loop's state, locked (taken as is after a panic: see `event_loop`).
    pub(crate) fn state(&self) -> MutexGuard<'_, Option<event_loop::EventLoop>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `call` and wakes the loop if it sleeps; false if the loop has ended.
    fn submit(&self, call: &Arc<Call>) -> bool {
        crate::observer::refuse_reentry();
        let mut q = self.queue();
        if q.ended {
            return false;
        }
        q.calls.push(Arc::clone(call));
        self.pending.fetch_add(1, Ordering::Release);
        self.nudge(q);
        true
    }

    /// Queues every one of `calls` under one lock of the queue (the loop takes them in
    /// one pass) and wakes the loop once; false if the loop has ended.
    fn submit_all(&self, calls: &[Arc<Call>]) -> bool {
        crate::observer::refuse_reentry();
        let mut q = self.queue();
        if q.ended {
            return false;
        }
        q.calls.extend(calls.iter().cloned());
        self.pending.fetch_add(calls.len(), Ordering::Release);
        self.nudge(q);
        true
    }

    /// Wakes the loop, wherever it waits, for what was just queued in `q`.
    pub(crate) fn nudge(&self, mut q: MutexGuard<'_, Queue>) {
        let wake = std::mem::take(&mut q.sleeping);
        let unpark = std::mem::take(&mut q.parked);
        drop(q);
        if unpark {
            self.unparked.notify_one();
        }
        if wake {
            // A failed wake (the eventfd is gone) means the loop has ended: the guard
            // that ends it answers what is queued.
            let _ = self.waker.wake();
        }
    }

    /// Runs `call` on the calling thread if the loop is parked and nothing else is
    /// queued: no hand-off to the loop thread and back. False when it must be queued.
    fn run_here(&self, call: &Arc<Call>) -> bool {
        self.with_idle_loop(|l| {
            l.serve(Arc::clone(call));
            true
        })
    }

    /// Starts a future's acquire or unlock in its poll, on the calling thread, if the
    /// loop is parked and nothing else is queued
    /// ([`event_loop::EventLoop::serve_briefly`]): answered there, or left in flight for
    /// the loop, which is then woken. False when it must be queued.
    fn start_here(&self, call: &Arc<Call>) -> bool {
        // Other requests never run in a poll: they need not touch the state.
        let op = call.lock().op;
        matches!(op, Op::Lock { .. } | Op::Lease { .. } | Op::Unlock)
            && self.with_idle_loop(|l| l.serve_briefly(call))
    }

    /// Runs `f` on the loop's state on the calling thread, if the loop is parked and
    /// nothing is queued; false if it is not, or if `f` declined (returned false, having
    /// changed nothing). The loop is woken after `f` if it left work only the loop
    /// keeps: a round in flight, a retry, a lease, a release to try again, bytes still to
    /// write.
    fn with_idle_loop(&self, f: impl FnOnce(&mut event_loop::EventLoop) -> bool) -> bool {
        crate::observer::refuse_reentry();
        let state = match self.state.try_lock() {
            Ok(state) => state,
            Err(_) => return false,
        };
        let mut guard = Serving {
            inner: self,
            state,
            armed: false,
        };
        {
            let q = self.queue();
            if !q.parked || q.ended || q.stopping || !q.calls.is_empty() || !q.dropped.is_empty() {
                return false;
            }
        }
        guard.armed = true;
        let Some(l) = guard.state.as_mut() else {
            return false;
        };
        let served = f(l);
        let idle = l.is_idle();
        guard.armed = false;
        if served && !idle {
            self.nudge(self.queue());
        }
        served
    }

    /// One handle fewer. The last one stops the loop and waits for it to end: the
    /// releases queued by then (a dropped lease, an abandoned acquisition) leave the
    /// process before it can exit (at most a release round, bounded by `node_timeout`).
    fn drop_user(&self) {
        if self.users.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        let mut q = self.queue();
        q.stopping = true;
        q.sleeping = true;
        self.nudge(q);
        let thread = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = thread {
            // Never on the loop thread itself (a waker run there could drop a handle).
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}

/// The loop's state while a caller runs its own request. Should that panic (a bug), the
/// state, perhaps half changed, is dropped (which answers what it held with an error and
/// reports every lease lost) and the loop woken, to find it gone and end: as a panic on
/// the loop thread ends the loop.
///
/// Only a panic inside the request counts (`armed`): a caller may well use the client
/// while its thread unwinds for another reason (a guard whose `Drop` unlocks).
struct Serving<'a> {
    inner: &'a Inner,
    state: MutexGuard<'a, Option<event_loop::EventLoop>>,
    /// Set while the request runs.
    armed: bool,
}

impl Drop for Serving<'_> {
    fn drop(&mut self) {
        if self.armed && std::thread::panicking() {
            drop(self.state.take());
            self.inner.nudge(self.inner.queue());
        }
    }
}

impl Clone for SharedRedlock {
    fn clone(&self) -> Self {
        self.inner.users.fetch_add(1, Ordering::Relaxed);
        SharedRedlock {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl Drop for SharedRedlock {
    fn drop(&mut self) {
        self.inner.drop_user();
    }
}

/// The error of a request the loop can no longer answer.
fn loop_gone() -> Error {
    Error::Os(OsError::new(
        "running the shared client's loop thread (it has ended)",
        io::Error::from(io::ErrorKind::BrokenPipe),
    ))
}

/// The answer a request of this kind cannot get (a bug, never a network input).
fn mismatched() -> Error {
    Error::Os(OsError::new(
        "reading the shared client's answer (it did not match the request)",
        io::Error::from(io::ErrorKind::InvalidData),
    ))
}

thread_local! {
    /// The call a thread's blocking requests reuse: no allocation per request.
    static BLOCKING: RefCell<Option<Arc<Call>>> = const { RefCell::new(None) };
}

impl SharedRedlock {
    pub(crate) fn from_settings(settings: Settings) -> Result<SharedRedlock, Error> {
        let inner = event_loop::start(settings)?;
        Ok(SharedRedlock { inner })
    }

    /// The validated settings.
    pub fn settings(&self) -> &Settings {
        &self.inner.settings
    }

    /// Runs one request on the calling thread's reusable call, blocking until answered.
    fn blocking(&self, fill: impl FnOnce(&mut call::Request)) -> Result<Done, Error> {
        let call = BLOCKING.with(|slot| {
            let mut slot = slot.borrow_mut();
            // The loop may still hold its reference for a moment after answering, but
            // never touches an answered call again (see `call`), so only a call still
            // busy (none, unless a request of this thread was left unanswered by a
            // panic) needs a new one.
            match slot.as_ref() {
                Some(c) if !c.lock().busy => Arc::clone(c),
                _ => {
                    let c = Call::new();
                    *slot = Some(Arc::clone(&c));
                    c
                }
            }
        });
        {
            let mut r = call.lock();
            r.answer = None;
            r.abandoned = false;
            r.waker = None;
            r.lock = None;
            r.lease = None;
            r.busy = true;
            fill(&mut r);
        }
        if !self.inner.run_here(&call) && !self.inner.submit(&call) {
            return Err(loop_gone());
        }
        call.wait()
    }

    /// Runs one request on a new call as a future: started in this poll when the loop is
    /// idle (see [`Inner::start_here`]), queued otherwise, and awaited.
    async fn run(&self, fill: impl FnOnce(&mut call::Request)) -> Result<Done, Error> {
        let call = Call::new();
        {
            let mut r = call.lock();
            r.busy = true;
            fill(&mut r);
        }
        if !self.inner.start_here(&call) && !self.inner.submit(&call) {
            return Err(loop_gone());
        }
        Answer {
            call,
            inner: Arc::clone(&self.inner),
            done: false,
        }
        .await
    }

    /// Every node's health, in configuration order: connected, connecting, lagging, or
    /// down with why, and the last round trip measured to it (see [`NodeHealth`]).
    ///
    /// The loop thread reads it from its connections' state when it takes the request
    /// (between two rounds, so at most one round's `node_timeout` later), after taking
    /// in what already arrived without waiting (an idle client's loop does no I/O):
    /// nothing is sent to the nodes, and it costs the loop microseconds. Fails only when
    /// the loop has stopped.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn f(shared: quorumlock::SharedRedlock) -> Result<(), quorumlock::Error> {
    /// let health = shared.health().await?;
    /// let up = health
    ///     .iter()
    ///     .filter(|n| n.state == quorumlock::NodeState::Connected)
    ///     .count();
    /// if up < shared.quorum() {
    ///     eprintln!("too few nodes up for a quorum: {health:?}");
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn health(&self) -> Result<Vec<NodeHealth>, Error> {
        health_of(self.run(fill_health).await)
    }

    /// [`SharedRedlock::health`], blocking the calling thread.
    pub fn blocking_health(&self) -> Result<Vec<NodeHealth>, Error> {
        health_of(self.blocking(fill_health))
    }

    /// Acquires `resource` for `ttl`, retrying as [`Redlock::lock`] does (up to
    /// `retry_count` retries, `retry_delay ± retry_jitter` apart); same errors.
    ///
    /// [`Redlock::lock`]: crate::Redlock::lock
    #[must_use = "dropping the returned Lock unused leaves its keys held until their ttl ends; the future does nothing unless awaited"]
    pub async fn lock(&self, resource: impl AsRef<[u8]>, ttl: Duration) -> Result<Lock, Error> {
        let attempts = self.settings().retry_count.saturating_add(1);
        let resource = resource.as_ref();
        locked(
            self.run(|r| fill_lock(r, resource, ttl, attempts, None))
                .await,
        )
    }

    /// [`SharedRedlock::lock`], blocking the calling thread.
    pub fn blocking_lock(&self, resource: impl AsRef<[u8]>, ttl: Duration) -> Result<Lock, Error> {
        let attempts = self.settings().retry_count.saturating_add(1);
        let resource = resource.as_ref();
        locked(self.blocking(|r| fill_lock(r, resource, ttl, attempts, None)))
    }

    /// One attempt to acquire `resource` for `ttl`, as [`Redlock::try_lock`].
    ///
    /// [`Redlock::try_lock`]: crate::Redlock::try_lock
    #[must_use = "dropping the returned Lock unused leaves its keys held until their ttl ends; the future does nothing unless awaited"]
    pub async fn try_lock(&self, resource: impl AsRef<[u8]>, ttl: Duration) -> Result<Lock, Error> {
        let resource = resource.as_ref();
        locked(self.run(|r| fill_lock(r, resource, ttl, 1, None)).await)
    }

    /// [`SharedRedlock::try_lock`], blocking the calling thread.
    pub fn blocking_try_lock(
        &self,
        resource: impl AsRef<[u8]>,
        ttl: Duration,
    ) -> Result<Lock, Error> {
        let resource = resource.as_ref();
        locked(self.blocking(|r| fill_lock(r, resource, ttl, 1, None)))
    }

    /// [`SharedRedlock::lock`] with a value the caller chose instead of a random token;
    /// the rules and caveats of [`Redlock::lock_with_token`].
    ///
    /// [`Redlock::lock_with_token`]: crate::Redlock::lock_with_token
    #[must_use = "dropping the returned Lock unused leaves its keys held until their ttl ends; the future does nothing unless awaited"]
    pub async fn lock_with_token(
        &self,
        resource: impl AsRef<[u8]>,
        ttl: Duration,
        token: impl AsRef<[u8]>,
    ) -> Result<Lock, Error> {
        let attempts = self.settings().retry_count.saturating_add(1);
        let (resource, token) = (resource.as_ref(), given_token(token.as_ref())?);
        locked(
            self.run(|r| fill_lock_as(r, resource, ttl, attempts, &token))
                .await,
        )
    }

    /// [`SharedRedlock::lock_with_token`], blocking the calling thread.
    pub fn blocking_lock_with_token(
        &self,
        resource: impl AsRef<[u8]>,
        ttl: Duration,
        token: impl AsRef<[u8]>,
    ) -> Result<Lock, Error> {
        let attempts = self.settings().retry_count.saturating_add(1);
        let (resource, token) = (resource.as_ref(), given_token(token.as_ref())?);
        locked(self.blocking(|r| fill_lock_as(r, resource, ttl, attempts, &token)))
    }

    /// [`SharedRedlock::try_lock`] with a value the caller chose: one attempt, the token
    /// rules of [`Redlock::lock_with_token`].
    ///
    /// [`Redlock::lock_with_token`]: crate::Redlock::lock_with_token
    #[must_use = "dropping the returned Lock unused leaves its keys held until their ttl ends; the future does nothing unless awaited"]
    pub async fn try_lock_with_token(
        &self,
        resource: impl AsRef<[u8]>,
        ttl: Duration,
        token: impl AsRef<[u8]>,
    ) -> Result<Lock, Error> {
        let (resource, token) = (resource.as_ref(), given_token(token.as_ref())?);
        locked(
            self.run(|r| fill_lock_as(r, resource, ttl, 1, &token))
                .await,
        )
    }

    /// [`SharedRedlock::try_lock_with_token`], blocking the calling thread.
    pub fn blocking_try_lock_with_token(
        &self,
        resource: impl AsRef<[u8]>,
        ttl: Duration,
        token: impl AsRef<[u8]>,
    ) -> Result<Lock, Error> {
        let (resource, token) = (resource.as_ref(), given_token(token.as_ref())?);
        locked(self.blocking(|r| fill_lock_as(r, resource, ttl, 1, &token)))
    }

    /// Acquires `resource` for `ttl`, trying until `wait` has passed: at once, then again
    /// whenever the holder releases it (the release notice wakes the attempt) and
    /// otherwise every `retry_delay ± retry_jitter`. No attempt starts after `wait`; a
    /// call that fails returns no earlier than `wait` from its start, and at most one
    /// attempt's bound (`node_timeout`) after it. The error is the last attempt's.
    #[must_use = "dropping the returned Lock unused leaves its keys held until their ttl ends; the future does nothing unless awaited"]
    pub async fn lock_within(
        &self,
        resource: impl AsRef<[u8]>,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Lock, Error> {
        let until = Instant::now().checked_add(wait);
        let resource = resource.as_ref();
        locked(
            self.run(|r| fill_lock(r, resource, ttl, u32::MAX, until))
                .await,
        )
    }

    /// [`SharedRedlock::lock_within`], blocking the calling thread.
    pub fn blocking_lock_within(
        &self,
        resource: impl AsRef<[u8]>,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Lock, Error> {
        let until = Instant::now().checked_add(wait);
        let resource = resource.as_ref();
        locked(self.blocking(|r| fill_lock(r, resource, ttl, u32::MAX, until)))
    }

    /// Acquires every resource in `resources` or none, as [`Redlock::lock_all`].
    ///
    /// [`Redlock::lock_all`]: crate::Redlock::lock_all
    #[must_use = "dropping the returned Lock unused leaves its keys held until their ttl ends; the future does nothing unless awaited"]
    pub async fn lock_all<R: AsRef<[u8]>>(
        &self,
        resources: &[R],
        ttl: Duration,
    ) -> Result<Lock, Error> {
        let keys: Vec<Box<[u8]>> = resources.iter().map(|r| r.as_ref().into()).collect();
        locked(self.run(|r| fill_all(r, keys, ttl)).await)
    }

    /// [`SharedRedlock::lock_all`], blocking the calling thread.
    pub fn blocking_lock_all<R: AsRef<[u8]>>(
        &self,
        resources: &[R],
        ttl: Duration,
    ) -> Result<Lock, Error> {
        let keys: Vec<Box<[u8]>> = resources.iter().map(|r| r.as_ref().into()).collect();
        locked(self.blocking(|r| fill_all(r, keys, ttl)))
    }

    /// Extends `lock` to `ttl` from now, as [`Redlock::extend`] (same rules for its
    /// deadline on failure).
    ///
    /// [`Redlock::extend`]: crate::Redlock::extend
    ///
    /// Dropping the future before it completes leaves the lock's deadline at the earliest
    /// the extend could have set it (`start + ttl − drift` from the moment it was queued,
    /// when that is earlier): it may have been applied on the nodes.
    pub async fn extend(&self, lock: &mut Lock, ttl: Duration) -> Result<(), Error> {
        lock.check_unreleased("extended")?;
        let copy = lock.duplicate();
        let mut guard = ExtendGuard {
            earliest: ttl_millis(ttl).ok().map(|ms| {
                let now = Instant::now();
                let whole = Duration::from_millis(ms);
                crate::core::quorum::deadline(now, whole, self.settings().drift_factor)
                    .unwrap_or(now)
            }),
            lock,
            done: false,
        };
        let done = self.run(|r| fill_extend(r, copy, ttl)).await;
        guard.done = true;
        extended(done, guard.lock)
    }

    /// [`SharedRedlock::extend`], blocking the calling thread.
    pub fn blocking_extend(&self, lock: &mut Lock, ttl: Duration) -> Result<(), Error> {
        lock.check_unreleased("extended")?;
        let copy = lock.duplicate();
        let done = self.blocking(|r| fill_extend(r, copy, ttl));
        extended(done, lock)
    }

    /// Releases `lock`, as [`Redlock::unlock`]: returns at a majority with the count of
    /// deletions confirmed by then (the other deletes are in flight, never waited for).
    /// A lock that no node still held is [`Error::Expired`], not `Ok(0)`; the lock is
    /// then [released](Lock::is_released), and another `unlock` or `extend` of it is
    /// [`Error::InvalidArgument`] with nothing sent.
    ///
    /// [`Redlock::unlock`]: crate::Redlock::unlock
    pub async fn unlock(&self, lock: &Lock) -> Result<usize, Error> {
        lock.check_unreleased("unlocked again")?;
        let copy = lock.duplicate();
        let result = released(self.run(|r| fill_unlock(r, copy)).await);
        crate::redlock::released(lock, result)
    }

    /// [`SharedRedlock::unlock`], blocking the calling thread.
    pub fn blocking_unlock(&self, lock: &Lock) -> Result<usize, Error> {
        lock.check_unreleased("unlocked again")?;
        let copy = lock.duplicate();
        let result = released(self.blocking(|r| fill_unlock(r, copy)));
        crate::redlock::released(lock, result)
    }

    /// Acquires `resource` for `ttl` with retries (as [`SharedRedlock::lock`]), then keeps
    /// it alive (see [`Lease`]) until the lease is released, dropped or lost.
    #[must_use = "dropping the returned Lease releases it at once; the future does nothing unless awaited"]
    pub async fn lease(&self, resource: impl AsRef<[u8]>, ttl: Duration) -> Result<Lease, Error> {
        let attempts = self.settings().retry_count.saturating_add(1);
        let resource = resource.as_ref();
        let done = self
            .run(|r| fill_lease(r, resource, ttl, attempts, None))
            .await;
        self.leased(done)
    }

    /// [`SharedRedlock::lease`], blocking the calling thread.
    pub fn blocking_lease(
        &self,
        resource: impl AsRef<[u8]>,
        ttl: Duration,
    ) -> Result<Lease, Error> {
        let attempts = self.settings().retry_count.saturating_add(1);
        let resource = resource.as_ref();
        let done = self.blocking(|r| fill_lease(r, resource, ttl, attempts, None));
        self.leased(done)
    }

    /// Acquires `resource` for `ttl` as [`SharedRedlock::lock_within`] does (trying
    /// until `wait` has passed, woken when the holder releases it), then keeps it alive
    /// as [`SharedRedlock::lease`] does. Same bounds and errors as `lock_within`.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # async fn f(shared: quorumlock::SharedRedlock) -> Result<(), quorumlock::Error> {
    /// let lease = shared
    ///     .lease_within("nightly-report", Duration::from_secs(10), Duration::from_secs(60))
    ///     .await?;
    /// lease.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    #[must_use = "dropping the returned Lease releases it at once; the future does nothing unless awaited"]
    pub async fn lease_within(
        &self,
        resource: impl AsRef<[u8]>,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Lease, Error> {
        let until = Instant::now().checked_add(wait);
        let resource = resource.as_ref();
        let done = self
            .run(|r| fill_lease(r, resource, ttl, u32::MAX, until))
            .await;
        self.leased(done)
    }

    /// [`SharedRedlock::lease_within`], blocking the calling thread.
    pub fn blocking_lease_within(
        &self,
        resource: impl AsRef<[u8]>,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Lease, Error> {
        let until = Instant::now().checked_add(wait);
        let resource = resource.as_ref();
        let done = self.blocking(|r| fill_lease(r, resource, ttl, u32::MAX, until));
        self.leased(done)
    }

    /// Runs `f` under a lease of `resource` (acquired with retries, kept alive meanwhile)
    /// and releases it when `f` returns (or, dropped while unwinding, in the background
    /// when `f` panics). `f` is given the lease, to check [`Lease::is_lost`] (or hand a
    /// [`Lease::lost_signal`] to other threads) between steps of long work: a closure
    /// cannot be stopped from outside.
    ///
    /// Returns `f`'s value when the lease was held until `f` returned and its release
    /// succeeded; [`Error::Lost`] (saying why) when the lease was lost before `f`
    /// returned — its value is dropped, since the work may have overlapped another
    /// holder's — or when the release found it held on no node (lost unseen: its keys
    /// flushed, failed over or evicted); the release's error when the release failed. A
    /// lost lease is released in the background: the loss is returned at once.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # let shared = quorumlock::Redlock::builder().nodes(["redis://127.0.0.1:7001"]).build_shared()?;
    /// let rows = shared.blocking_with_lease("import", Duration::from_secs(10), |lease| {
    ///     // ... long work, stopping early if lease.is_lost() ...
    ///     42
    /// })?;
    /// # let _ = rows;
    /// # Ok::<(), quorumlock::Error>(())
    /// ```
    pub fn blocking_with_lease<T>(
        &self,
        resource: impl AsRef<[u8]>,
        ttl: Duration,
        f: impl FnOnce(&Lease) -> T,
    ) -> Result<T, Error> {
        let lease = self.blocking_lease(resource, ttl)?;
        // On a panic, the lease is dropped while unwinding: released in the background.
        let out = f(&lease);
        if let Some(lost) = lease.lost_error() {
            // The loss is the news, at once: what remains of its key on a minority is
            // deleted in the background (the lease dropped).
            drop(lease);
            return Err(lost);
        }
        lease.blocking_release_after_work()?;
        Ok(out)
    }

    /// Runs the async work `f` under a lease of `resource` (acquired with retries, kept
    /// alive meanwhile), **raced against the lease's loss**, then releases the lease.
    ///
    /// - The lease lost first (see [`Lease`] for when the signal fires: at the latest at
    ///   its deadline, whatever the loop is doing): the work future is dropped at once —
    ///   at its next await — and the call returns [`Error::Lost`], saying why.
    /// - The work finished, but after the lease was lost: [`Error::Lost`] as well (its
    ///   result may have overlapped another holder's).
    /// - The work finished in time: the lease is released and `f`'s value returned; a
    ///   failed release is the error, and a release that finds the lease held on no node
    ///   (lost unseen: its keys flushed, failed over, evicted) is [`Error::Lost`] too.
    /// - A lost lease is released in the background: the loss is returned at once, not
    ///   after a release round.
    ///
    /// Dropping the returned future drops the work and the lease (released in the
    /// background). The race needs no runtime: the work and the loss are polled side by
    /// side in this future, which runs on any executor.
    ///
    /// Work that must finish cleanly before the deadline (a write to complete, a file to
    /// close) should watch [`Lease::lost_signal`]`.before(margin)` itself and wind down:
    /// this call cuts the work short only at the loss.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # async fn write(_: u64, _: &str) {}
    /// # async fn f(shared: quorumlock::SharedRedlock) -> Result<(), quorumlock::Error> {
    /// let n = shared
    ///     .with_lease("ledger", Duration::from_secs(10), async |lease| {
    ///         let fence = lease.fence().unwrap_or(0);
    ///         write(fence, "row").await;
    ///         1
    ///     })
    ///     .await?;
    /// # let _ = n;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn with_lease<T>(
        &self,
        resource: impl AsRef<[u8]>,
        ttl: Duration,
        f: impl AsyncFnOnce(&Lease) -> T,
    ) -> Result<T, Error> {
        let lease = self.lease(resource, ttl).await?;
        let out = {
            let mut work = std::pin::pin!(f(&lease));
            let mut lost = std::pin::pin!(lease.lost());
            // The loss is polled first: a lease already lost never gives the work
            // another step.
            std::future::poll_fn(|cx| {
                if lost.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(None);
                }
                work.as_mut().poll(cx).map(Some)
            })
            .await
            // The work future is dropped here, before the release is awaited.
        };
        if let Some(lost) = lease.lost_error() {
            // Returned at once, not after a release round (a frozen majority, a slow
            // loop): the lease dropped deletes what remains of its key in the background.
            drop(lease);
            return Err(lost);
        }
        match out {
            Some(out) => {
                // Held on no node at the release: lost before it, unseen (flushed,
                // failed over, evicted): `Error::Lost` too.
                lease.release_after_work().await?;
                Ok(out)
            }
            // Ready only once lost, and lost stays lost: `lost_error` said so above.
            None => Err(mismatched()),
        }
    }

    fn leased(&self, done: Result<Done, Error>) -> Result<Lease, Error> {
        match done? {
            // The lease's own handle keeps the loop running while it lives.
            Done::Leased(shared) => Ok(Lease::new(shared, self.clone())),
            _ => Err(mismatched()),
        }
    }

    pub(crate) async fn release_lease(&self, lease: Arc<LeaseShared>) -> Result<usize, Error> {
        lease_count(self.release_lease_exact(lease).await)
    }

    pub(crate) fn blocking_release_lease(&self, lease: Arc<LeaseShared>) -> Result<usize, Error> {
        lease_count(self.blocking_release_lease_exact(lease))
    }

    /// The release as `unlock` reports it: [`Error::Expired`] when no node held it.
    pub(crate) async fn release_lease_exact(
        &self,
        lease: Arc<LeaseShared>,
    ) -> Result<usize, Error> {
        released(self.run(|r| fill_release(r, lease)).await)
    }

    pub(crate) fn blocking_release_lease_exact(
        &self,
        lease: Arc<LeaseShared>,
    ) -> Result<usize, Error> {
        released(self.blocking(|r| fill_release(r, lease)))
    }

    /// A lease dropped without release: the loop releases it.
    pub(crate) fn release_in_background(&self, lease: Arc<LeaseShared>) {
        let wake = {
            let mut q = self.inner.queue();
            if q.ended {
                return;
            }
            q.dropped.push(lease);
            q
        };
        self.inner.nudge(wake);
    }

    /// Nodes needed for a majority: `N / 2 + 1`.
    pub fn quorum(&self) -> usize {
        crate::core::quorum::quorum(self.settings().nodes.len())
    }
}

fn fill_lock(
    r: &mut call::Request,
    key: &[u8],
    ttl: Duration,
    attempts: u32,
    until: Option<Instant>,
) {
    r.op = Op::Lock { attempts, until };
    r.key.clear();
    r.key.extend_from_slice(key);
    r.token = None;
    r.ttl = ttl;
}

fn fill_lock_as(r: &mut call::Request, key: &[u8], ttl: Duration, attempts: u32, token: &Token) {
    fill_lock(r, key, ttl, attempts, None);
    r.token = Some(token.clone());
}

fn fill_lease(
    r: &mut call::Request,
    key: &[u8],
    ttl: Duration,
    attempts: u32,
    until: Option<Instant>,
) {
    fill_lock(r, key, ttl, attempts, until);
    r.op = Op::Lease { attempts, until };
}

fn fill_all(r: &mut call::Request, keys: Vec<Box<[u8]>>, ttl: Duration) {
    r.op = Op::LockAll;
    r.keys = keys;
    r.ttl = ttl;
}

fn fill_extend(r: &mut call::Request, lock: Lock, ttl: Duration) {
    r.op = Op::Extend;
    r.lock = Some(lock);
    r.ttl = ttl;
}

fn fill_health(r: &mut call::Request) {
    r.op = Op::Health;
}

fn fill_unlock(r: &mut call::Request, lock: Lock) {
    r.op = Op::Unlock;
    r.lock = Some(lock);
}

fn fill_release(r: &mut call::Request, lease: Arc<LeaseShared>) {
    r.op = Op::Release;
    r.lease = Some(lease);
}

fn locked(done: Result<Done, Error>) -> Result<Lock, Error> {
    match done? {
        Done::Locked(lock) => Ok(lock),
        _ => Err(mismatched()),
    }
}

fn extended(done: Result<Done, Error>, lock: &mut Lock) -> Result<(), Error> {
    match done? {
        // Succeeded or not, the extend may have moved the deadline (earlier, on a
        // failure) and reached more nodes: the caller's lock follows.
        Done::Extended(updated, error) => {
            *lock = updated;
            error.map_or(Ok(()), Err)
        }
        _ => Err(mismatched()),
    }
}

/// A lease's release keeps its count: a lease held nowhere any more (lost) releases
/// nothing, which `Lease::release` reports as `Ok(0)`, where `unlock` says
/// [`Error::Expired`].
fn lease_count(result: Result<usize, Error>) -> Result<usize, Error> {
    match result {
        Err(Error::Expired(f)) if f.op == crate::error::Phase::Release => Ok(0),
        result => result,
    }
}

fn health_of(done: Result<Done, Error>) -> Result<Vec<NodeHealth>, Error> {
    match done? {
        Done::Health(health) => Ok(health),
        _ => Err(mismatched()),
    }
}

fn released(done: Result<Done, Error>) -> Result<usize, Error> {
    match done? {
        Done::Released(n) => Ok(n),
        _ => Err(mismatched()),
    }
}

/// Shortens a lock whose extend future was dropped unanswered: the extend may have
/// reached the nodes, and a shorter ttl there would end the lock sooner.
struct ExtendGuard<'a> {
    lock: &'a mut Lock,
    /// `start + ttl − drift` of the extend, from before it was queued (now when drift eats
    /// the whole ttl); `None` for a ttl that is refused, so nothing is sent.
    earliest: Option<Instant>,
    done: bool,
}

impl Drop for ExtendGuard<'_> {
    fn drop(&mut self) {
        if let (false, Some(earliest)) = (self.done, self.earliest) {
            self.lock.shorten(earliest);
        }
    }
}

/// The future of a queued call: ready when the loop has answered. Dropped before that,
/// it abandons the call (see [`call`]'s invariants).
struct Answer {
    call: Arc<Call>,
    inner: Arc<Inner>,
    done: bool,
}

impl Future for Answer {
    type Output = Result<Done, Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let answer = {
            let mut r = self.call.lock();
            match r.answer.take() {
                Some(a) => a,
                None => {
                    if !r.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                        r.waker = Some(cx.waker().clone());
                    }
                    return Poll::Pending;
                }
            }
        };
        self.done = true;
        Poll::Ready(answer)
    }
}

impl Drop for Answer {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let left = {
            let mut r = self.call.lock();
            r.abandoned = true;
            r.waker = None;
            r.answer.take()
        };
        // Answered after the last poll: what it acquired is released here. (Not yet
        // answered: the loop releases it when it answers.)
        match left {
            Some(Ok(Done::Locked(lock))) => {
                let call = Call::new();
                {
                    let mut r = call.lock();
                    r.busy = true;
                    fill_unlock(&mut r, lock);
                    r.abandoned = true;
                }
                self.inner.submit(&call);
            }
            Some(Ok(Done::Leased(lease))) => {
                let mut q = self.inner.queue();
                if !q.ended {
                    q.dropped.push(lease);
                }
                self.inner.nudge(q);
            }
            _ => {}
        }
    }
}
