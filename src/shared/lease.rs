//! Leases: locks the shared client's loop keeps alive.
//!
//! # Invariants
//!
//! - A lease is lost at the latest at its local deadline (`start + ttl − drift` of the
//!   last successful extend): [`Lease::is_lost`] and [`Lease::wait_lost`] read the clock
//!   against it themselves, so they never depend on hearing from the loop or a node; the
//!   loop also marks it lost then, to wake [`Lease::lost`] futures.
//! - Once lost, a lease stays lost: the loop never extends it again and never re-takes
//!   its key.
//! - The deadline only moves when an extend succeeded (later) or failed in a way that
//!   may have shortened the key's life on some node (earlier), as [`Redlock::extend`]
//!   says.
//!
//! [`Redlock::extend`]: crate::Redlock::extend

use crate::core::quorum::extended_until;
use crate::core::round::Decision;
use crate::core::token::{Prefix, Token};
use crate::error::Error;
use crate::shared::SharedRedlock;
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

/// What a lease's holder and the loop share.
pub(crate) struct LeaseShared {
    resource: Box<[u8]>,
    token: Token,
    /// The fence of the acquire, kept for the lease's whole life (extends do not change it).
    fence: Option<u64>,
    state: Mutex<LeaseState>,
    changed: Condvar,
}

pub(crate) struct LeaseState {
    /// The local validity deadline of the current term.
    pub deadline: Instant,
    /// Lost for good (a majority said the key is gone or someone else's, the deadline
    /// passed, or the maximum hold was reached).
    pub lost: bool,
    /// Tasks waiting in [`Lease::lost`], by the id of their future (removed when it is
    /// dropped, so a task that polls `lost()` in a loop does not grow the list).
    wakers: Vec<(u64, Waker)>,
    next_id: u64,
}

impl LeaseShared {
    pub fn new(
        resource: &[u8],
        token: Token,
        fence: Option<u64>,
        deadline: Instant,
    ) -> Arc<LeaseShared> {
        Arc::new(LeaseShared {
            resource: resource.into(),
            token,
            fence,
            state: Mutex::new(LeaseState {
                deadline,
                lost: false,
                wakers: Vec::new(),
                next_id: 0,
            }),
            changed: Condvar::new(),
        })
    }

    pub fn state(&self) -> MutexGuard<'_, LeaseState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new term: the deadline of the last successful extend (or a shortened one).
    pub fn set_deadline(&self, deadline: Instant) {
        self.state().deadline = deadline;
    }

    /// Marks the lease lost and wakes every waiter. Idempotent.
    pub fn mark_lost(&self) {
        let wakers = {
            let mut s = self.state();
            if s.lost {
                return;
            }
            s.lost = true;
            std::mem::take(&mut s.wakers)
        };
        self.changed.notify_all();
        for (_, w) in wakers {
            super::call::wake(w);
        }
    }

    pub fn resource(&self) -> &[u8] {
        &self.resource
    }
}

impl LeaseState {
    fn is_lost(&self, now: Instant) -> bool {
        self.lost || now >= self.deadline
    }
}

/// A lock that the shared client's loop keeps alive until it is released or dropped:
/// it extends it by its own ttl every ttl/3, retries a failed extend while validity
/// remains, and reports it lost when it can no longer vouch for it. Made by
/// [`SharedRedlock::lease`].
///
/// A lease is lost, for good, when a majority of nodes says its key is gone or someone
/// else's, when its local validity deadline passes without a successful extend (nodes
/// silent, frozen, unreachable), or at [`Builder::max_hold`](crate::Builder::max_hold).
/// The lost signal fires at the latest at that deadline, `start + ttl − drift` of the last
/// successful extend, whatever the nodes do: work done under a lease must stop when it
/// fires.
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

impl std::fmt::Debug for LeaseShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (deadline, lost) = {
            let s = self.state();
            (s.deadline, s.lost)
        };
        f.debug_struct("LeaseShared")
            .field("resource", &crate::error::Escaped(&self.resource))
            // A prefix to tell leases apart in logs; the whole token is a credential.
            .field("token", &Prefix(self.token.as_bytes()))
            .field("fence", &self.fence)
            .field("deadline", &deadline)
            .field("lost", &lost)
            .finish()
    }
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("resource", &crate::error::Escaped(self.resource()))
            // A prefix to tell leases apart in logs; the whole token is a credential.
            .field("token", &Prefix(self.token()))
            .field("fence", &self.fence())
            .field("remaining", &self.remaining())
            .field("lost", &self.is_lost())
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

    /// The random value stored on the nodes (a credential: do not log it).
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
        let s = self.shared.state();
        if s.lost {
            return Duration::ZERO;
        }
        s.deadline.saturating_duration_since(Instant::now())
    }

    /// Whether the lease is lost (see [`Lease`]): true from its deadline on at the latest.
    pub fn is_lost(&self) -> bool {
        self.shared.state().is_lost(Instant::now())
    }

    /// Completes when the lease is lost, at the latest at its local deadline.
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
    pub fn wait_lost(&self, timeout: Duration) -> bool {
        let until = Instant::now().checked_add(timeout);
        let mut s = self.shared.state();
        loop {
            let now = Instant::now();
            if s.is_lost(now) {
                return true;
            }
            let mut wake_at = s.deadline;
            if let Some(u) = until {
                if now >= u {
                    return false;
                }
                wake_at = wake_at.min(u);
            }
            let (next, _) = self
                .shared
                .changed
                .wait_timeout(s, wake_at.saturating_duration_since(now))
                .unwrap_or_else(|e| e.into_inner());
            s = next;
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
        let shared = Arc::clone(&self.lease.shared);
        let mut s = shared.state();
        if s.is_lost(Instant::now()) {
            return Poll::Ready(());
        }
        // The loop marks the lease lost by its deadline, and wakes these.
        match self.id {
            Some(id) => {
                if let Some((_, w)) = s.wakers.iter_mut().find(|(i, _)| *i == id) {
                    if !w.will_wake(cx.waker()) {
                        *w = cx.waker().clone();
                    }
                }
            }
            None => {
                let id = s.next_id;
                s.next_id += 1;
                s.wakers.push((id, cx.waker().clone()));
                self.id = Some(id);
            }
        }
        Poll::Pending
    }
}

impl Drop for Lost<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            self.lease.shared.state().wakers.retain(|(i, _)| *i != id);
        }
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

    fn state(deadline: Instant, lost: bool) -> LeaseState {
        LeaseState {
            deadline,
            lost,
            wakers: Vec::new(),
            next_id: 0,
        }
    }

    /// A lease is lost from its deadline on, whatever the loop has heard, and at any time
    /// once marked lost; before its deadline and unmarked, it is held.
    #[test]
    fn a_lease_is_lost_from_its_deadline_on_or_once_marked() {
        let base = Instant::now();
        let deadline = at(base, 1000);
        let held = state(deadline, false);
        assert!(!held.is_lost(base));
        assert!(!held.is_lost(at(base, 999)));
        assert!(held.is_lost(deadline));
        assert!(held.is_lost(at(base, 1001)));
        let marked = state(deadline, true);
        assert!(marked.is_lost(base));
        assert!(marked.is_lost(at(base, 1001)));
    }
}
