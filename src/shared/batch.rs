//! The shared client's batch calls, as the direct client's: [`SharedRedlock::try_lock_many`]
//! and [`SharedRedlock::unlock_many`] (and their `blocking_` twins).
//!
//! # Invariants
//!
//! - Every request of a batch is queued under one lock of the queue, then the loop is
//!   woken once: it takes them in one pass, and the loop's own batching (acquires and
//!   releases gathered into rounds of up to `SHARED_BATCH` resources) sends them in as
//!   few rounds as the direct client's batch would.
//! - Each resource keeps the full rules of a single call (its own quorum, validity,
//!   errors); a dropped batch future abandons every call still unanswered, whose locks the
//!   loop then releases (as for a dropped `try_lock`).

use super::call::{self, Call, Done};
use super::{Answer, SharedRedlock, fill_lock, fill_unlock, locked, loop_gone, released};
use crate::error::Error;
use crate::lock::Lock;
use std::sync::Arc;
use std::time::Duration;

impl SharedRedlock {
    /// One attempt on each resource in `resources` for `ttl`, as
    /// [`Redlock::try_lock_many`]: one result per resource, in order, each what
    /// [`SharedRedlock::try_lock`] would have returned. The requests go to the loop
    /// together, which sends them in shared rounds.
    ///
    /// [`Redlock::try_lock_many`]: crate::Redlock::try_lock_many
    ///
    /// # Example
    ///
    /// ```no_run
    /// # async fn f(shared: quorumlock::SharedRedlock) {
    /// use std::time::Duration;
    ///
    /// let results = shared.try_lock_many(&["a", "b", "c"], Duration::from_secs(5)).await;
    /// let held: Vec<_> = results.into_iter().filter_map(Result::ok).collect();
    /// let released = shared.unlock_many(&held).await;
    /// # }
    /// ```
    pub async fn try_lock_many<R: AsRef<[u8]>>(
        &self,
        resources: &[R],
        ttl: Duration,
    ) -> Vec<Result<Lock, Error>> {
        let answers = self.queue_all(lock_fills(resources, ttl));
        let mut results = Vec::with_capacity(answers.len());
        for answer in answers {
            results.push(match answer {
                Some(answer) => locked(answer.await),
                None => Err(loop_gone()),
            });
        }
        results
    }

    /// [`SharedRedlock::try_lock_many`], blocking the calling thread.
    pub fn blocking_try_lock_many<R: AsRef<[u8]>>(
        &self,
        resources: &[R],
        ttl: Duration,
    ) -> Vec<Result<Lock, Error>> {
        self.wait_all(lock_fills(resources, ttl))
            .into_iter()
            .map(locked)
            .collect()
    }

    /// Releases several locks, as [`Redlock::unlock_many`]: one result per lock, in
    /// order, each what [`SharedRedlock::unlock`] would have returned (a lock held
    /// nowhere any more is [`Error::Expired`], one already released
    /// [`Error::InvalidArgument`] with nothing sent); each lock released, or found held
    /// nowhere, is [released](Lock::is_released).
    ///
    /// [`Redlock::unlock_many`]: crate::Redlock::unlock_many
    pub async fn unlock_many(&self, locks: &[Lock]) -> Vec<Result<usize, Error>> {
        let (copies, refused) = unlock_copies(locks);
        let answers = self.queue_all(copies.into_iter().map(unlock_fill));
        let mut answers = answers.into_iter();
        let mut results = Vec::with_capacity(locks.len());
        for (lock, refused) in locks.iter().zip(refused) {
            let result = match refused {
                Some(e) => Err(e),
                None => match answers.next().flatten() {
                    Some(answer) => crate::redlock::released(lock, released(answer.await)),
                    None => Err(loop_gone()),
                },
            };
            results.push(result);
        }
        results
    }

    /// [`SharedRedlock::unlock_many`], blocking the calling thread.
    pub fn blocking_unlock_many(&self, locks: &[Lock]) -> Vec<Result<usize, Error>> {
        let (copies, refused) = unlock_copies(locks);
        let mut answers = self
            .wait_all(copies.into_iter().map(unlock_fill))
            .into_iter();
        locks
            .iter()
            .zip(refused)
            .map(|(lock, refused)| match refused {
                Some(e) => Err(e),
                None => match answers.next() {
                    Some(answer) => crate::redlock::released(lock, released(answer)),
                    None => Err(loop_gone()),
                },
            })
            .collect()
    }

    /// Makes one call per fill and queues them all at once; `None` for each when the
    /// loop has ended. The futures wait for the answers (and abandon their calls when
    /// dropped).
    fn queue_all<F: FnOnce(&mut call::Request)>(
        &self,
        fills: impl Iterator<Item = F>,
    ) -> Vec<Option<Answer>> {
        let calls = make_calls(fills);
        let queued = self.inner.submit_all(&calls);
        calls
            .into_iter()
            .map(|call| {
                queued.then(|| Answer {
                    call,
                    inner: Arc::clone(&self.inner),
                    done: false,
                })
            })
            .collect()
    }

    /// Makes one call per fill, queues them all at once, and waits for every answer.
    fn wait_all<F: FnOnce(&mut call::Request)>(
        &self,
        fills: impl Iterator<Item = F>,
    ) -> Vec<Result<Done, Error>> {
        let calls = make_calls(fills);
        if !self.inner.submit_all(&calls) {
            return calls.iter().map(|_| Err(loop_gone())).collect();
        }
        calls.iter().map(|call| call.wait()).collect()
    }
}

/// One attempt on each of `resources`, as `try_lock` asks for it.
fn lock_fills<R: AsRef<[u8]>>(
    resources: &[R],
    ttl: Duration,
) -> impl Iterator<Item = impl FnOnce(&mut call::Request)> + '_ {
    resources
        .iter()
        .map(move |r| move |q: &mut call::Request| fill_lock(q, r.as_ref(), ttl, 1, None))
}

fn make_calls<F: FnOnce(&mut call::Request)>(fills: impl Iterator<Item = F>) -> Vec<Arc<Call>> {
    fills
        .map(|fill| {
            let call = Call::new();
            {
                let mut r = call.lock();
                r.busy = true;
                fill(&mut r);
            }
            call
        })
        .collect()
}

/// A copy of each lock of `locks` not yet released, to unlock; and for each lock the
/// error that refuses it without a request (already released).
fn unlock_copies(locks: &[Lock]) -> (Vec<Lock>, Vec<Option<Error>>) {
    let mut copies = Vec::new();
    let mut refused = Vec::with_capacity(locks.len());
    for lock in locks {
        match lock.check_unreleased("unlocked again") {
            Ok(()) => {
                copies.push(lock.duplicate());
                refused.push(None);
            }
            Err(e) => refused.push(Some(e)),
        }
    }
    (copies, refused)
}

fn unlock_fill(copy: Lock) -> impl FnOnce(&mut call::Request) {
    move |r: &mut call::Request| fill_unlock(r, copy)
}
