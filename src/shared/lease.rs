//! Leases: locks the shared client's loop keeps alive, and the signals of their loss.
//!
//! # Invariants
//!
//! - A lease is lost at the latest at its local deadline (`start + ttl − drift` of the
//!   last successful extend), measured on the suspend-counting clock
//!   ([`crate::clock`]): [`Lease::is_lost`], [`Lease::remaining`] and
//!   [`LostSignal::is_lost`] read the clock against it themselves, so they never depend
//!   on hearing from the loop or a node.
//! - Every waiter is woken by the deadline itself, never only by the loop: a blocking
//!   wait ([`Lease::wait_lost`], [`LostSignal::wait`]) times its own sleep to the
//!   deadline (less its margin); a future ([`Lost`], [`LostSignalFuture`]) puts its lease
//!   on the process-wide timer thread (`timer`) for that moment. The loop, an observer
//!   callback or a round holding the loop thread cannot delay them. The loop marks a
//!   lease lost too (at its deadline, or when a majority says the key is gone), which
//!   wakes the waiters sooner when it knows sooner.
//! - A loss has one reason ([`LostReason`]), the first recorded: a majority's refusal
//!   (`TakenOver`), the maximum hold, a release, or — at the deadline — what the last
//!   failed renewal said (`TooFewNodes` when too few nodes answered, `Expired`
//!   otherwise).
//! - Once lost, a lease stays lost: the loop never extends it again and never re-takes
//!   its key.
//! - The deadline only moves when an extend succeeded (later) or failed in a way that
//!   may have shortened the key's life on some node (earlier), as [`Redlock::extend`]
//!   says.
//!
//! [`Redlock::extend`]: crate::Redlock::extend

use crate::clock::{self, Stamp};
use crate::core::quorum::extended_until;
use crate::core::round::Decision;
use crate::core::token::{Prefix, Token};
use crate::error::{Error, LostReason};
use crate::shared::SharedRedlock;
use crate::shared::timer;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// When a lease's term that began at `start` (its acquire's or last renewal's start) is
/// renewed: a third of its ttl on.
pub fn renew_at(start: Instant, ttl: Duration) -> Instant {
    start + ttl / 3
}

/// What one renewal round of a lease decides ([`renewal`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Renewal {
    /// Extended: the lease's new deadline, and when to renew it next.
    Renewed {
        /// `start + ttl − drift` of the renewal round.
        deadline: Instant,
        /// [`renew_at`] of the round's start.
        next: Instant,
    },
    /// Too few nodes answered: the deadline it keeps (never later than before), and when
    /// to try again while validity remains.
    Retry {
        /// The deadline kept.
        deadline: Instant,
        /// The next try.
        next: Instant,
    },
    /// A majority said the key is gone or someone else's, or agreed too late: lost for
    /// good, with the deadline it keeps.
    Lost {
        /// The deadline kept.
        deadline: Instant,
    },
}

/// The verdict of a lease's renewal round begun at `start` with the lease's `ttl` and
/// decided (`decision`) at `decided`, read at `now`, for a lease valid until `current`:
/// [`Redlock::extend`]'s verdict (`quorum::extended_until`), and when to renew next
/// (`pause` after `now` when too few nodes answered). The shared client's loop and the
/// random simulation (`tests/sim/world.rs`) both take a renewal's outcome from here.
///
/// [`Redlock::extend`]: crate::Redlock::extend
#[allow(clippy::too_many_arguments)]
pub fn renewal(
    decision: Decision,
    decided: Instant,
    start: Instant,
    now: Instant,
    ttl: Duration,
    drift_factor: f64,
    current: Instant,
    pause: Duration,
) -> Renewal {
    match extended_until(decision, decided, start, ttl, drift_factor, current) {
        Ok(end) => Renewal::Renewed {
            deadline: if crate::core::fault!(LeaseFromDecision) {
                end + decided.saturating_duration_since(start)
            } else {
                end
            },
            next: renew_at(start, ttl),
        },
        Err(keep) => {
            let deadline = current.min(keep);
            if matches!(decision, Decision::Won | Decision::Taken) {
                Renewal::Lost { deadline }
            } else {
                Renewal::Retry {
                    deadline,
                    next: now + pause,
                }
            }
        }
    }
}

/// What a lease's holder, its lost signals, the timer thread and the loop share.
pub(crate) struct LeaseShared {
    resource: Box<[u8]>,
    token: Token,
    /// The fence of the acquire, kept for the lease's whole life (extends do not change it).
    fence: Option<u64>,
    state: Mutex<LeaseState>,
    changed: Condvar,
}

/// A task waiting for a lease's loss, or for `margin` before its deadline.
struct Waiter {
    id: u64,
    margin: Duration,
    waker: Waker,
}

pub(crate) struct LeaseState {
    /// The local validity deadline of the current term, as the loop times it.
    pub deadline: Instant,
    /// The same deadline on the suspend-counting clock ([`crate::clock`]): what every
    /// caller-side check compares against.
    until: Stamp,
    /// Lost for good, and why (a majority said the key is gone or someone else's, the
    /// deadline passed, the maximum hold was reached, the lease was released).
    why: Option<LostReason>,
    /// The last renewal's error, while renewals fail; cleared by a successful one.
    last_error: Option<Error>,
    /// Tasks waiting in [`Lease::lost`] or a [`LostSignal`], by the id of their future
    /// (removed when it is dropped, so a task that polls in a loop does not grow the
    /// list).
    wakers: Vec<Waiter>,
    next_id: u64,
    /// The moment of this lease's live entry on the timer thread, if it has one: a new
    /// waiter or an earlier deadline adds an entry only when it is due sooner, so that
    /// a task creating `lost()` futures in a loop does not pile up entries (an entry
    /// popped at another moment than this one is stale, and ignored).
    timer_at: Option<Stamp>,
}

impl LeaseShared {
    pub fn new(
        resource: &[u8],
        token: Token,
        fence: Option<u64>,
        deadline: Instant,
        until: Stamp,
    ) -> Arc<LeaseShared> {
        Arc::new(LeaseShared {
            resource: resource.into(),
            token,
            fence,
            state: Mutex::new(LeaseState {
                deadline,
                until,
                why: None,
                last_error: None,
                wakers: Vec::new(),
                next_id: 0,
                timer_at: None,
            }),
            changed: Condvar::new(),
        })
    }

    pub fn state(&self) -> MutexGuard<'_, LeaseState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new term: the deadline of the last successful extend (`failed` is `None`), or
    /// one shortened by a failed one (whose error is `failed`). False, and nothing
    /// changed, when the lease is already lost: marked, or its deadline passed (a
    /// renewal answered after the deadline never revives a lease a caller may have
    /// seen lost; it is then marked lost here, under the same lock callers read).
    /// `until` is `deadline` on the suspend-counting clock, as the lock's round converted
    /// it (`Lock::until`).
    pub fn set_deadline(
        self: &Arc<Self>,
        deadline: Instant,
        until: Stamp,
        failed: Option<Error>,
    ) -> bool {
        let (sooner, entry) = {
            let mut s = self.state();
            if s.is_lost(clock::now()) {
                drop(s);
                self.mark_expired();
                return false;
            }
            let before = s.until;
            s.deadline = deadline;
            s.until = until;
            s.last_error = failed;
            // Waiters timed for the old deadline: the timer comes back when it passes,
            // and finds the new one; one set earlier needs its own entry, and blocked
            // threads a new sleep.
            let sooner = s.until < before;
            let entry = if sooner {
                s.next_due().and_then(|at| s.arm(at))
            } else {
                None
            };
            (sooner, entry)
        };
        if sooner {
            self.changed.notify_all();
        }
        if let Some(at) = entry {
            timer::schedule(at, self);
        }
        true
    }

    /// Marks the lease lost for `why` and wakes every waiter. Idempotent: the first
    /// reason stays.
    pub fn mark_lost(&self, why: LostReason) {
        let wakers = {
            let mut s = self.state();
            if s.why.is_some() {
                return;
            }
            s.why = Some(why);
            std::mem::take(&mut s.wakers)
        };
        self.changed.notify_all();
        for w in wakers {
            super::call::wake(w.waker);
        }
    }

    /// Marks the lease lost at its deadline: why, from the renewals that failed.
    pub fn mark_expired(&self) {
        let why = self.state().at_deadline();
        self.mark_lost(why);
    }

    /// Whether the lease is marked lost.
    pub fn is_marked(&self) -> bool {
        self.state().why.is_some()
    }

    /// The timer thread's visit for its entry due `at` ([`timer`]): marks the lease
    /// lost if its deadline has passed, wakes the waiters whose margin has come; returns
    /// when to come back (the next waiter's moment), or `None` when no one waits any
    /// more (or the entry was stale).
    pub fn tick(&self, at: Stamp) -> Option<Stamp> {
        let now = clock::now();
        let mut s = self.state();
        if s.timer_at != Some(at) {
            return None;
        }
        s.timer_at = None;
        if s.why.is_some() {
            return None;
        }
        if now >= s.until {
            drop(s);
            self.mark_expired();
            return None;
        }
        let until = s.until;
        let mut due = Vec::new();
        s.wakers.retain(|w| {
            let fire = now.saturating_add(w.margin) >= until;
            if fire {
                due.push(w.waker.clone());
            }
            !fire
        });
        let next = s.next_due();
        s.timer_at = next;
        drop(s);
        if !due.is_empty() {
            self.changed.notify_all();
        }
        for w in due {
            super::call::wake(w);
        }
        next
    }

    pub fn resource(&self) -> &[u8] {
        &self.resource
    }

    /// Whether the lease is lost, or within `margin` of its deadline.
    fn fired(&self, margin: Duration) -> bool {
        self.state().fired(clock::now(), margin)
    }

    fn reason(&self) -> Option<LostReason> {
        self.state().reason(clock::now())
    }

    fn remaining(&self) -> Duration {
        let s = self.state();
        if s.why.is_some() {
            return Duration::ZERO;
        }
        s.until.saturating_duration_since(clock::now())
    }

    /// Polls for the loss (or `margin` before the deadline): ready once it came;
    /// otherwise the task's waker is kept (under `id`) for the loop, which marks the loss,
    /// and the timer thread, which rings at the deadline less the margin.
    fn poll_fired(
        self: &Arc<Self>,
        margin: Duration,
        id: &mut Option<u64>,
        cx: &mut Context<'_>,
    ) -> Poll<()> {
        let mut s = self.state();
        if s.fired(clock::now(), margin) {
            return Poll::Ready(());
        }
        if let Some(id) = *id {
            if let Some(w) = s.wakers.iter_mut().find(|w| w.id == id) {
                if !w.waker.will_wake(cx.waker()) {
                    w.waker = cx.waker().clone();
                }
                return Poll::Pending;
            }
            // Woken by the timer (which took the entry) before the moment: waits again,
            // with a new entry.
        }
        let new = s.next_id;
        s.next_id += 1;
        s.wakers.push(Waiter {
            id: new,
            margin,
            waker: cx.waker().clone(),
        });
        *id = Some(new);
        let due = s.until.saturating_sub(margin);
        let at = s.arm(due);
        drop(s);
        if let Some(at) = at {
            timer::schedule(at, self);
        }
        Poll::Pending
    }

    fn forget(&self, id: Option<u64>) {
        if let Some(id) = id {
            self.state().wakers.retain(|w| w.id != id);
        }
    }

    /// Blocks until the lease is lost (or `margin` before its deadline) or `timeout`
    /// has passed; true if it came. Times its own sleeps: no loop or timer needed.
    fn wait(&self, margin: Duration, timeout: Duration) -> bool {
        let until = clock::now().saturating_add(timeout);
        let mut s = self.state();
        loop {
            let now = clock::now();
            if s.fired(now, margin) {
                return true;
            }
            if now >= until {
                return false;
            }
            // At most a second at a time: the condition variable's clock stops during a
            // suspend, this one does not.
            let wake_at = s.until.saturating_sub(margin).min(until);
            let sleep = wake_at
                .saturating_duration_since(now)
                .clamp(Duration::from_micros(100), Duration::from_secs(1));
            s = self
                .changed
                .wait_timeout(s, sleep)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

impl LeaseState {
    /// Marked lost (by the loop, the timer thread, or a release).
    pub fn is_marked(&self) -> bool {
        self.why.is_some()
    }

    /// Lost at `now` (marked, or past the deadline).
    fn is_lost(&self, now: Stamp) -> bool {
        self.why.is_some() || now >= self.until
    }

    fn fired(&self, now: Stamp, margin: Duration) -> bool {
        self.why.is_some() || now.saturating_add(margin) >= self.until
    }

    /// Why the lease is lost at `now`, if it is.
    fn reason(&self, now: Stamp) -> Option<LostReason> {
        match &self.why {
            Some(why) => Some(why.clone()),
            None if now >= self.until => Some(self.at_deadline()),
            None => None,
        }
    }

    /// Why a lease whose deadline passed is lost: the last renewal's error says.
    fn at_deadline(&self) -> LostReason {
        match &self.last_error {
            Some(e @ Error::Unavailable(_)) => LostReason::TooFewNodes {
                last: Box::new(e.clone()),
            },
            last => LostReason::Expired {
                last: last.clone().map(Box::new),
            },
        }
    }

    /// Records a timer entry due `at` if none is due sooner: `Some(at)` when one must be
    /// added, `None` when the live entry comes first.
    fn arm(&mut self, at: Stamp) -> Option<Stamp> {
        if self.timer_at.is_some_and(|t| t <= at) {
            return None;
        }
        self.timer_at = Some(at);
        Some(at)
    }

    /// The earliest moment a waiter is due, if any waits.
    fn next_due(&self) -> Option<Stamp> {
        self.wakers
            .iter()
            .map(|w| self.until.saturating_sub(w.margin))
            .min()
    }

    #[cfg(test)]
    fn for_test(deadline: Instant, why: Option<LostReason>) -> LeaseState {
        LeaseState {
            deadline,
            until: clock::stamp_of(deadline),
            why,
            last_error: None,
            wakers: Vec::new(),
            next_id: 0,
            timer_at: None,
        }
    }
}

impl std::fmt::Debug for LeaseShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (remaining, why) = (self.remaining(), self.state().why.clone());
        f.debug_struct("LeaseShared")
            .field("resource", &crate::error::Escaped(&self.resource))
            // A prefix to tell leases apart in logs; the whole token is a credential.
            .field("token", &Prefix(self.token.as_bytes()))
            .field("fence", &self.fence)
            .field("remaining", &remaining)
            .field("lost", &why)
            .finish()
    }
}

/// A lock that the shared client's loop keeps alive until it is released or dropped:
/// it extends it by its own ttl every ttl/3, retries a failed extend while validity
/// remains, and reports it lost when it can no longer vouch for it. Made by
/// [`SharedRedlock::lease`].
///
/// A lease is lost, for good, when a majority of nodes says its key is gone or someone
/// else's, when its local validity deadline passes without a successful extend (nodes
/// silent, frozen, unreachable), or at [`Builder::max_hold`](crate::Builder::max_hold);
/// [`Lease::lost_reason`] says which.
///
/// # When the lost signal fires
///
/// At the latest at the lease's local deadline, `start + ttl − drift` of the last
/// successful extend, whatever the nodes and the loop are doing:
///
/// - [`Lease::is_lost`] and [`Lease::remaining`] compare the deadline with the clock
///   themselves: true (zero) from the deadline on, with no wake-up needed.
/// - [`Lease::lost`], [`Lease::wait_lost`] and a [`LostSignal`] are woken by the deadline
///   itself (a process-wide timer thread, or the waiting thread's own timed sleep), not
///   by the loop: an observer callback or a slow round holding the loop thread does not
///   delay them. They come earlier when the loop learns of a loss first (a majority
///   says the key is someone else's).
/// - The deadline is measured on a clock that counts time the machine spent suspended
///   (see [`Lock::remaining`](crate::Lock::remaining)).
///
/// Work done under a lease must stop when the signal fires; to stop ahead of the
/// deadline (and finish writing before it), wait on [`LostSignal::before`] a margin.
/// [`SharedRedlock::with_lease`] stops async work for you.
///
/// Dropping a lease releases it in the background; [`Lease::release`] does it and says
/// on how many nodes. A live lease keeps the shared client's loop running.
///
/// # Example
///
/// ```no_run
/// use std::time::Duration;
/// # async fn job(_: &quorumlock::Lease) {}
/// # async fn run() -> Result<(), quorumlock::Error> {
/// let shared = quorumlock::Redlock::builder()
///     .nodes(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
///     .build_shared()?;
/// let lease = shared.lease("nightly-report", Duration::from_secs(10)).await?;
/// // Runs for as long as it needs; the lease is extended every ~3.3 s meanwhile. The
/// // work must stop if the lease is lost.
/// job(&lease).await;
/// let released_on = lease.release().await?;
/// # let _ = released_on;
/// # Ok(())
/// # }
/// ```
#[must_use = "dropping a Lease releases it at once: bind it (`let lease = ...`) for as long as the work runs"]
pub struct Lease {
    shared: Arc<LeaseShared>,
    client: SharedRedlock,
    released: bool,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("resource", &crate::error::Escaped(self.resource()))
            // A prefix to tell leases apart in logs; the whole token is a credential.
            .field("token", &Prefix(self.token()))
            .field("fence", &self.fence())
            .field("remaining", &self.remaining())
            .field("lost", &self.lost_reason())
            .finish_non_exhaustive()
    }
}

impl Lease {
    pub(crate) fn new(shared: Arc<LeaseShared>, client: SharedRedlock) -> Lease {
        Lease {
            shared,
            client,
            released: false,
        }
    }

    /// The resource held.
    pub fn resource(&self) -> &[u8] {
        self.shared.resource()
    }

    /// The random value stored on the nodes (a credential: do not log it; `Debug` shows
    /// a prefix only).
    pub fn token(&self) -> &[u8] {
        self.shared.token.as_bytes()
    }

    /// The fencing token of the acquire, `None` exactly when fencing is off
    /// ([`Builder::fencing`](crate::Builder::fencing)); the lease keeps it for its whole
    /// life, through every extend. Pass it with every write the lease protects, to a
    /// store that refuses a fence below the largest it has seen (`src/fencing.rs`'s
    /// guarantee: a later holder's fence is strictly larger).
    ///
    /// ```no_run
    /// # async fn f(shared: quorumlock::SharedRedlock) -> Result<(), quorumlock::Error> {
    /// let lease = shared.lease("ledger", std::time::Duration::from_secs(10)).await?;
    /// let fence = lease.fence().expect("built with .fencing(true)");
    /// // storage.write_if_fence_at_least(fence, ...)
    /// # let _ = fence;
    /// # Ok(())
    /// # }
    /// ```
    pub fn fence(&self) -> Option<u64> {
        self.shared.fence
    }

    /// The validity left in the current term: the time until the local deadline of the
    /// last successful extend (zero once lost).
    pub fn remaining(&self) -> Duration {
        self.shared.remaining()
    }

    /// Whether the lease is lost (see [`Lease`]): true from its deadline on at the latest.
    pub fn is_lost(&self) -> bool {
        self.shared.state().is_lost(clock::now())
    }

    /// Why the lease is lost, `None` while it is held (see [`LostReason`]).
    ///
    /// ```no_run
    /// # fn f(lease: quorumlock::Lease) {
    /// if lease.wait_lost(std::time::Duration::from_secs(60)) {
    ///     eprintln!("lost: {}", lease.lost_reason().expect("lost"));
    /// }
    /// # }
    /// ```
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.shared.reason()
    }

    /// Completes when the lease is lost, at the latest at its local deadline (see
    /// [`Lease`]: woken by the deadline itself, not by the loop).
    ///
    /// ```no_run
    /// # async fn f(lease: quorumlock::Lease) {
    /// lease.lost().await;
    /// assert!(lease.is_lost());
    /// # }
    /// ```
    pub fn lost(&self) -> Lost<'_> {
        Lost {
            lease: self,
            id: None,
        }
    }

    /// Blocks until the lease is lost or `timeout` has passed; true if it was lost.
    /// Returns at the latest at the lease's deadline (the thread times its own sleep).
    pub fn wait_lost(&self, timeout: Duration) -> bool {
        self.shared.wait(Duration::ZERO, timeout)
    }

    /// An owned handle on this lease's loss, for another thread or task to hold
    /// (`'static`, `Send`, cheap to clone; see [`LostSignal`]). It does not keep the
    /// lease: once the lease is released or dropped, the signal reports it lost
    /// ([`LostReason::Released`]).
    ///
    /// ```no_run
    /// # async fn f(shared: quorumlock::SharedRedlock) -> Result<(), quorumlock::Error> {
    /// let lease = shared.lease("nightly", std::time::Duration::from_secs(10)).await?;
    /// let stop = lease.lost_signal();
    /// let worker = std::thread::spawn(move || {
    ///     while !stop.is_lost() {
    ///         // ... one step of work ...
    ///     }
    /// });
    /// # let _ = worker;
    /// # Ok(())
    /// # }
    /// ```
    pub fn lost_signal(&self) -> LostSignal {
        LostSignal {
            shared: Arc::clone(&self.shared),
            margin: Duration::ZERO,
        }
    }

    /// Releases the lease: stops extending it and deletes its key with
    /// compare-and-delete; returns on how many nodes it was deleted (see
    /// [`Redlock::unlock`](crate::Redlock::unlock), whose count this is). A lease already
    /// lost is released all the same (its key may remain on a minority).
    pub async fn release(mut self) -> Result<usize, Error> {
        self.released = true;
        let client = self.client.clone();
        client.release_lease(Arc::clone(&self.shared)).await
    }

    /// [`Lease::release`], blocking the calling thread.
    pub fn blocking_release(mut self) -> Result<usize, Error> {
        self.released = true;
        self.client.blocking_release_lease(Arc::clone(&self.shared))
    }

    /// The release at the end of `with_lease`: a lease its release finds held on no
    /// node had been lost before it (its keys flushed, failed over, evicted, or expired
    /// unseen), which the work must hear: [`Error::Lost`], taken over, with the release's
    /// answers. [`Lease::release`] reports it as `Ok(0)`.
    pub(crate) async fn release_after_work(mut self) -> Result<usize, Error> {
        self.released = true;
        let client = self.client.clone();
        let done = client.release_lease_exact(Arc::clone(&self.shared)).await;
        held_at_release(self.resource(), done)
    }

    /// [`Lease::release_after_work`], blocking the calling thread.
    pub(crate) fn blocking_release_after_work(mut self) -> Result<usize, Error> {
        self.released = true;
        let done = (self.client).blocking_release_lease_exact(Arc::clone(&self.shared));
        held_at_release(self.resource(), done)
    }

    /// [`Error::Lost`] for this lease, if it is lost.
    pub(crate) fn lost_error(&self) -> Option<Error> {
        self.lost_reason().map(|why| Error::Lost {
            resource: self.resource().to_vec(),
            why,
        })
    }
}

/// A release's result, with "held on no node" as the loss it is.
fn held_at_release(resource: &[u8], done: Result<usize, Error>) -> Result<usize, Error> {
    match done {
        Err(Error::Expired(f)) if f.op == crate::error::Phase::Release => Err(Error::Lost {
            resource: resource.to_vec(),
            why: LostReason::TakenOver {
                last: Box::new(Error::Expired(f)),
            },
        }),
        done => done,
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if !self.released {
            self.client.release_in_background(Arc::clone(&self.shared));
        }
    }
}

/// The future of [`Lease::lost`].
#[derive(Debug)]
#[must_use = "futures do nothing unless awaited"]
pub struct Lost<'a> {
    lease: &'a Lease,
    /// Its entry among the lease's wakers, once polled.
    id: Option<u64>,
}

impl Future for Lost<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let shared = &self.lease.shared;
        let mut id = self.id;
        let poll = shared.poll_fired(Duration::ZERO, &mut id, cx);
        self.id = id;
        poll
    }
}

impl Drop for Lost<'_> {
    fn drop(&mut self) {
        self.lease.shared.forget(self.id);
    }
}

/// An owned handle on a lease's loss ([`Lease::lost_signal`]): `'static`, `Send` and
/// `Sync`, cheap to clone, for a spawned task or thread that must stop when the lease
/// is lost. It fires as [`Lease::lost`] does — at the latest at the lease's deadline,
/// woken by the deadline itself, not by the loop — or `margin` earlier
/// ([`LostSignal::before`]).
///
/// Await it (`signal.lost().await`, or `signal.await`), block on it
/// ([`LostSignal::wait`]), or poll [`LostSignal::is_lost`].
///
/// # Example
///
/// ```no_run
/// use std::time::Duration;
/// # async fn step() {}
/// # async fn f(shared: quorumlock::SharedRedlock) -> Result<(), quorumlock::Error> {
/// let lease = shared.lease("import", Duration::from_secs(30)).await?;
/// // Stop 5 s before the deadline: time enough to finish the write in flight.
/// let stop = lease.lost_signal().before(Duration::from_secs(5));
/// while !stop.is_lost() {
///     step().await;
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct LostSignal {
    shared: Arc<LeaseShared>,
    margin: Duration,
}

impl std::fmt::Debug for LostSignal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LostSignal")
            .field("lease", &self.shared)
            .field("margin", &self.margin)
            .finish()
    }
}

impl LostSignal {
    /// The same signal, firing `margin` before the lease's deadline (or at its loss,
    /// if that comes first): the stop line of a job that needs `margin` to wind down.
    /// [`LostSignal::reason`] stays `None` until the lease is actually lost. Unlike the
    /// loss itself, the margin is measured against the current deadline: a renewal that
    /// succeeds after the line was crossed (a retry, late) moves the deadline, and
    /// `is_lost()` reads false again; a job that must not resume once told to stop keeps
    /// its own record of having been told.
    pub fn before(&self, margin: Duration) -> LostSignal {
        LostSignal {
            shared: Arc::clone(&self.shared),
            margin,
        }
    }

    /// The margin this signal fires ahead of the deadline ([`LostSignal::before`]).
    pub fn margin(&self) -> Duration {
        self.margin
    }

    /// Whether the signal has fired: the lease is lost, or within the margin of its
    /// deadline. True from `deadline − margin` on at the latest.
    pub fn is_lost(&self) -> bool {
        self.shared.fired(self.margin)
    }

    /// Why the lease is lost; `None` while it is held (also inside the margin).
    pub fn reason(&self) -> Option<LostReason> {
        self.shared.reason()
    }

    /// The lease's validity left, zero once lost (as [`Lease::remaining`]).
    pub fn remaining(&self) -> Duration {
        self.shared.remaining()
    }

    /// Blocks until the signal fires or `timeout` has passed; true if it fired.
    pub fn wait(&self, timeout: Duration) -> bool {
        self.shared.wait(self.margin, timeout)
    }

    /// A future that completes when the signal fires (owned: it may be moved into a
    /// spawned task).
    pub fn lost(&self) -> LostSignalFuture {
        LostSignalFuture {
            signal: self.clone(),
            id: None,
        }
    }
}

impl std::future::IntoFuture for LostSignal {
    type Output = ();
    type IntoFuture = LostSignalFuture;

    fn into_future(self) -> LostSignalFuture {
        LostSignalFuture {
            signal: self,
            id: None,
        }
    }
}

/// The future of [`LostSignal::lost`]: completes when the signal fires.
#[derive(Debug)]
#[must_use = "futures do nothing unless awaited"]
pub struct LostSignalFuture {
    signal: LostSignal,
    id: Option<u64>,
}

impl Future for LostSignalFuture {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        this.signal
            .shared
            .poll_fired(this.signal.margin, &mut this.id, cx)
    }
}

impl Drop for LostSignalFuture {
    fn drop(&mut self) {
        self.signal.shared.forget(self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::quorum::deadline;

    const TTL: Duration = Duration::from_millis(300);
    const PAUSE: Duration = Duration::from_millis(30);

    fn at(base: Instant, ms: u64) -> Instant {
        base + Duration::from_millis(ms)
    }

    #[test]
    fn a_lease_is_renewed_a_third_of_its_ttl_after_its_term_began() {
        let base = Instant::now();
        assert_eq!(renew_at(at(base, 7), TTL), at(base, 107));
    }

    /// A renewal won in time: the deadline of its start (not of its decision), the next
    /// renewal a third of the ttl after that start.
    #[test]
    fn a_renewal_won_in_time_dates_its_deadline_from_its_start() {
        let base = Instant::now();
        let (start, decided, current) = (at(base, 100), at(base, 104), at(base, 200));
        let got = renewal(
            Decision::Won,
            decided,
            start,
            decided,
            TTL,
            0.01,
            current,
            PAUSE,
        );
        assert_eq!(
            got,
            Renewal::Renewed {
                deadline: deadline(start, TTL, 0.01).unwrap(),
                next: at(base, 200),
            }
        );
    }

    /// Won after the current deadline, or refused by a majority: lost, the deadline never
    /// later than before. Too few answers: tried again after the pause, same bound.
    #[test]
    fn a_renewal_late_or_refused_is_lost_and_one_unanswered_is_retried() {
        let base = Instant::now();
        let (start, current) = (at(base, 100), at(base, 103));
        let late = renewal(
            Decision::Won,
            at(base, 104),
            start,
            at(base, 104),
            TTL,
            0.01,
            current,
            PAUSE,
        );
        assert_eq!(late, Renewal::Lost { deadline: current });
        let taken = renewal(
            Decision::Taken,
            at(base, 101),
            start,
            at(base, 101),
            TTL,
            0.01,
            current,
            PAUSE,
        );
        assert_eq!(taken, Renewal::Lost { deadline: current });
        let unanswered = renewal(
            Decision::Unavailable,
            at(base, 102),
            start,
            at(base, 102),
            TTL,
            0.01,
            current,
            PAUSE,
        );
        assert_eq!(
            unanswered,
            Renewal::Retry {
                deadline: current,
                next: at(base, 132),
            }
        );
    }

    /// A lease is lost from its deadline on, whatever the loop has heard, and at any time
    /// once marked lost; before its deadline and unmarked, it is held.
    #[test]
    fn a_lease_is_lost_from_its_deadline_on_or_once_marked() {
        let base = Instant::now();
        let deadline = at(base, 1000);
        let held = LeaseState::for_test(deadline, None);
        let now = clock::stamp_of(base);
        let until = held.until;
        assert!(!held.is_lost(now));
        assert!(!held.is_lost(until.saturating_sub(Duration::from_millis(1))));
        assert!(held.is_lost(until));
        assert!(held.is_lost(until.saturating_add(Duration::from_millis(1))));
        // A margin fires that much earlier.
        let margin = Duration::from_millis(100);
        assert!(!held.fired(
            until.saturating_sub(margin + Duration::from_millis(1)),
            margin
        ));
        assert!(held.fired(until.saturating_sub(margin), margin));
        let marked = LeaseState::for_test(deadline, Some(LostReason::MaxHold));
        assert!(marked.is_lost(now));
        assert!(matches!(marked.reason(now), Some(LostReason::MaxHold)));
    }

    /// Wakes the test thread.
    struct Unpark(std::thread::Thread);

    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }

    /// Polls `lease`'s loss (with `margin`) until it fires, parked in between; false if
    /// nothing woke it within 30 s (a bound far beyond every deadline used here).
    fn woken(lease: &Arc<LeaseShared>, margin: Duration) -> bool {
        let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
        let mut cx = Context::from_waker(&waker);
        let mut id = None;
        let give_up = Instant::now() + Duration::from_secs(30);
        loop {
            if lease.poll_fired(margin, &mut id, &mut cx).is_ready() {
                lease.forget(id);
                return true;
            }
            let now = Instant::now();
            if now >= give_up {
                return false;
            }
            std::thread::park_timeout(give_up - now);
        }
    }

    /// A renewal's failure, with no node detail.
    fn failure() -> crate::error::Failure {
        crate::error::Failure {
            op: crate::error::Phase::Extend,
            resource: b"r".to_vec(),
            attempts: 1,
            quorum: 2,
            elapsed: Duration::ZERO,
            nodes: Vec::new(),
        }
    }

    /// A lease of no loop, valid for `valid` from now.
    fn lease_for(valid: Duration) -> Arc<LeaseShared> {
        let deadline = Instant::now() + valid;
        LeaseShared::new(
            b"r",
            Token::from_bits(1),
            None,
            deadline,
            clock::stamp_of(deadline),
        )
    }

    /// With no loop at all, the timer thread wakes a waiter at the lease's deadline, and
    /// one with a margin that much before it (while the lease is still held).
    #[test]
    fn the_timer_thread_wakes_waiters_by_the_deadline_without_any_loop() {
        let lease = lease_for(Duration::from_millis(400));
        assert!(
            woken(&lease, Duration::from_millis(300)),
            "the margin's waiter"
        );
        assert!(woken(&lease, Duration::ZERO), "the deadline's waiter");
        assert!(lease.state().is_lost(clock::now()));
        assert!(matches!(
            lease.reason(),
            Some(LostReason::Expired { last: None })
        ));
    }

    /// A deadline moved earlier (a failed renewal) wakes the waiters by the new one, not
    /// the old: here 60 s, beyond the 30 s the test waits.
    #[test]
    fn a_deadline_moved_earlier_wakes_waiters_by_the_new_one() {
        let lease = lease_for(Duration::from_secs(60));
        let waiter = {
            let lease = Arc::clone(&lease);
            std::thread::spawn(move || woken(&lease, Duration::ZERO))
        };
        let blocked = {
            let lease = Arc::clone(&lease);
            std::thread::spawn(move || lease.wait(Duration::ZERO, Duration::from_secs(30)))
        };
        // Once both wait (or not: either way they must see the new deadline).
        std::thread::sleep(Duration::from_millis(50));
        let sooner = Instant::now() + Duration::from_millis(100);
        assert!(lease.set_deadline(
            sooner,
            clock::stamp_of(sooner),
            Some(Error::Unavailable(failure()))
        ));
        assert!(waiter.join().unwrap(), "the future's waker was rung");
        assert!(blocked.join().unwrap(), "the blocked thread woke");
        assert!(matches!(
            lease.reason(),
            Some(LostReason::TooFewNodes { .. })
        ));
        // Lost stays lost: a later deadline does not revive it.
        let later = Instant::now() + Duration::from_secs(60);
        assert!(!lease.set_deadline(later, clock::stamp_of(later), None));
        assert!(lease.state().is_lost(clock::now()));
    }

    /// A lease keeps one timer entry: a waiter due later than the live entry adds none
    /// (a task polling new `lost()` futures in a loop piles nothing up); one due sooner
    /// replaces it.
    #[test]
    fn a_lease_adds_a_timer_entry_only_when_due_sooner() {
        let base = Instant::now();
        let mut s = LeaseState::for_test(at(base, 1000), None);
        let until = s.until;
        assert_eq!(s.arm(until), Some(until));
        for _ in 0..1000 {
            assert_eq!(s.arm(until), None);
        }
        let sooner = until.saturating_sub(Duration::from_millis(100));
        assert_eq!(s.arm(sooner), Some(sooner));
        assert_eq!(s.arm(until), None);
    }

    /// At the deadline, the reason is what the last failed renewal said: too few nodes
    /// for an unanswered one, expired otherwise (with no renewal failed, or one decided
    /// too late).
    #[test]
    fn a_lease_lost_at_its_deadline_says_what_its_last_renewal_said() {
        let base = Instant::now();
        let mut s = LeaseState::for_test(at(base, 1000), None);
        assert!(s.reason(clock::stamp_of(base)).is_none());
        let past = s.until;
        assert!(matches!(
            s.reason(past),
            Some(LostReason::Expired { last: None })
        ));
        s.last_error = Some(Error::Unavailable(failure()));
        assert!(matches!(
            s.reason(past),
            Some(LostReason::TooFewNodes { .. })
        ));
        s.last_error = Some(Error::Expired(failure()));
        assert!(matches!(
            s.reason(past),
            Some(LostReason::Expired { last: Some(_) })
        ));
    }
}
