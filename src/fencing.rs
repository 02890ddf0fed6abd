//! Fencing tokens across the quorum: a number per lock that only ever rises, per resource.
//!
//! # How
//!
//! A fence counter is kept per resource on every node (`quorumlock:fence:{<resource>}`,
//! no expiry). A fenced acquire reads the counters with its `SET`s, atomically on each
//! node (`script::ACQUIRE`); the lock's fence is the largest counter among the nodes
//! whose yes counted, plus one. Before the lock is returned, that fence is written back to
//! every node whose connection is up (queued behind what a lagging one owes) by
//! `script::FENCE`, which raises the node's counter where lower and answers yes only if
//! the node still holds the lock's key with the lock's token (all of its keys, for
//! `lock_all`): a node that does not hold it keeps the raised counter (one more copy to
//! outlive a restart) but does not count. The call waits for a majority of distinct
//! nodes to confirm it while the lock is valid. The cost over an unfenced lock is that
//! one write-back round; no more.
//!
//! # Why fences never repeat
//!
//! The property: let A and B be two holders of one resource whose validity windows are
//! ordered, A's local deadline before B's acquire returns. Then B's fence is larger than
//! A's, unless a node restarted empty or lost its counter in between (below).
//!
//! Let `W` be the set of nodes that confirmed A's write-back (a majority; counted before
//! A's lock was returned, so before A's deadline), and `R` the set whose yes votes B's
//! acquire counted (a majority). Two majorities share a node `x`. On `x`, scripts run
//! one at a time, so these events have one order there:
//!
//! - `sA`: A's `SET` of its key (the one `FENCE` then found there),
//! - `wA`: A's write-back, which found A's key with A's token, so after `sA` and before
//!   that key left `x`, and left the counter at least A's fence (raise and check are one
//!   script),
//! - `rB`: B's acquire, which found the key free, set B's key and read the counter.
//!
//! `rB` cannot fall between `sA` and `wA`: A's key was there all along. So either
//!
//! 1. `rB` follows `wA`: B read a counter at least A's fence (counters only rise), and
//!    B's fence, one more than the largest counter it counted, is larger; or
//! 2. `rB` precedes `sA`: B's key, set at `rB`, left `x` before A's `SET NX` there. Keys
//!    leave a node by expiry or by a compare-and-delete of their token, and tokens are
//!    unique per acquire (the crate's own are 128 random bits per attempt; caller-chosen
//!    ones must be unique per call, [`Redlock::lock_with_token`], whose retries rely on
//!    a failed attempt's cleanup reaching each node ahead of the next attempt). So B's
//!    key is deleted only by B's release, after B's acquire returned. And it expires no
//!    earlier than B's deadline: that is B's start plus `ttl − drift`, and `rB` is after
//!    B's start (the Redlock drift argument mutual exclusion rests on). Either way `sA`
//!    comes after B's acquire returned (B returns only while valid). But `sA` precedes
//!    A's deadline (A's write-back counted before A returned, while valid), and A's
//!    deadline precedes B's return: a contradiction. Case 2 cannot happen.
//!
//! Nothing here bounds how long a round lasts, so none of these can break it:
//!
//! - **Late replies and stalls.** A reply read late (a paused process, the driver's last
//!   look after a stall, a loaded machine) still reports one script run at one point of
//!   `x`'s order. The ordering above is of script runs on `x`, not of when anyone read
//!   their replies. (The earlier write-back raised counters unconditionally and relied on
//!   rounds lasting at most `node_timeout`; a read counted late could precede a write-back
//!   on one node and follow the expiry of the earlier key on another: a repeated fence.)
//! - **Resends.** Each counted reply is one run of the script on one node; a resent
//!   command is another run, judged by what it found when it ran.
//! - **Lagging nodes.** A write-back queued behind a lagging node's backlog runs when it
//!   runs: if A's key is gone by then it answers no and does not count for `W` (its
//!   raise there is harmless: a counter only rises, so later fences only grow).
//! - **"Not needed" votes.** B's fence is taken over every yes it counted (at least `R`);
//!   a yes counted after the decision only adds counters to the maximum, and a write-back
//!   confirmation after the decision only adds nodes that hold the counter.
//! - **Aliases and the restart guard.** `R` and `W` count distinct servers (an alias's
//!   second endpoint never counts), and a young node's yes does not count for `R`.
//!
//! # Invariants
//!
//! - A fence is returned only with a lock that is still valid once a majority has
//!   confirmed it with the lock's key in place.
//! - A lock whose write-back was not confirmed in time is released and never returned:
//!   its caller sees [`Phase::Fence`] in the error.
//! - A fenced lock's release raises each node's counter to its fence in the same script
//!   that deletes its key (`script::RELEASE_FENCED`), so no node frees the key without
//!   the fence, even one the write-back missed.
//! - Counters are Lua numbers (doubles) on the nodes, exact up to 2^53: a node that
//!   answers a counter of 2^53 or more is treated as out of step, so every fence, one
//!   more, stays exact where the scripts compare it.
//! - Counters are permanent state: a node that restarts empty, fails over to a replica
//!   that lacks the last write, or evicts or flushes the counter loses it (the exception
//!   to the property). The restart guard keeps such a node's yes from counting for a
//!   while, which protects exclusivity (keys expire anyway) but not counters; strict
//!   order across restarts needs persistence on the nodes (AOF with `appendfsync always`),
//!   or a write-back that reached more nodes than restarted.

use crate::core::command::FENCE_PREFIX;
use crate::core::engine::{Fencing, Item, Request};
use crate::core::quorum::next_fence;
use crate::core::round::Decision;
use crate::error::{ArgumentError, Error, Phase};
use crate::lock::Lock;
use crate::redlock::{Redlock, check_resource};
use std::time::{Duration, Instant};

/// With fencing on, a ttl must be at least this many `node_timeout`s. Not for the order
/// of fences (the proof above bounds no round): a fenced lock must outlive two rounds on
/// its nodes, the acquire and the write-back (each up to one `node_timeout`), and still
/// leave time to use it; a shorter ttl would mostly end in a write-back not confirmed in
/// time.
pub const FENCE_TTL_FACTOR: u32 = 4;

impl Redlock {
    /// What an acquire does with fence counters under these settings.
    #[inline]
    pub(crate) fn fencing(&self) -> Fencing {
        if self.settings.fencing {
            Fencing::Read
        } else {
            Fencing::Off
        }
    }

    /// A resource name as [`check_resource`] accepts it, and with fencing on, not one of
    /// the fence counters' own keys (`quorumlock:fence:...`): locking one would have its
    /// key overwritten, without expiry, by a write-back.
    #[inline]
    pub(crate) fn check_key(&self, resource: &[u8]) -> Result<(), Error> {
        check_resource(resource)?;
        if self.settings.fencing && resource.starts_with(FENCE_PREFIX) {
            return Err(Error::InvalidArgument(ArgumentError::new(
                "resource",
                format!("{:?}", crate::error::Escaped(resource)),
                "with fencing on, a name under quorumlock:fence: is a fence counter's key",
            )));
        }
        Ok(())
    }

    /// Refuses a ttl too short for a fenced lock to be of use ([`FENCE_TTL_FACTOR`]).
    pub(crate) fn check_fenced_ttl(&self, ttl: Duration) -> Result<(), Error> {
        let least = self.settings.node_timeout.saturating_mul(FENCE_TTL_FACTOR);
        if ttl >= least {
            return Ok(());
        }
        Err(Error::InvalidArgument(ArgumentError::new(
            "ttl",
            format!("{ttl:?}"),
            format!(
                "with fencing on, at least {FENCE_TTL_FACTOR} × node_timeout ({least:?}): \
                 a fenced lock must outlive its acquire and its fence write-back, one \
                 node_timeout each"
            ),
        )))
    }

    /// The fence of `lock`, just won in the round in `self.round` on `items` (one slot),
    /// written back to the nodes; the lock with its fence, or the error of a write-back
    /// that a majority did not confirm while the lock was valid (the lock is then
    /// released).
    pub(crate) fn fence_lock(
        &mut self,
        mut lock: Lock,
        items: &[Item<'_>],
        atomic: bool,
        start: Instant,
        attempt: u32,
    ) -> Result<Lock, Error> {
        let fence = next_fence(self.round.counter(0));
        let req = Request {
            atomic,
            fencing: Fencing::Write(fence.get()),
            ..Request::new(Phase::Fence, 0, items, 0)
        };
        self.driver.run(&mut self.round, &req);
        let decision = self.round.decision(0);
        if decision == Decision::Won && lock.is_valid() {
            lock.set_fence(fence);
            return Ok(lock);
        }
        let failure = self.failure(Phase::Fence, lock.resource(), 0, attempt, start);
        let error = if decision == Decision::Won {
            Error::Expired(failure)
        } else {
            Error::Unavailable(failure)
        };
        // Never handed out without its fence: free it for the next holder at once.
        let _ = self.unlock(&lock);
        Err(error)
    }

    /// The fences of a batch: every lock won in `results` (one per slot of `items`, in
    /// order, errors included) gets the same fence, larger than every counter read for
    /// any of them, written back in one round; a lock whose write-back a majority did not
    /// confirm while it was valid becomes an error, and is released.
    pub(crate) fn fence_batch(
        &mut self,
        items: &[Item<'_>],
        results: &mut [Result<Lock, Error>],
        start: Instant,
    ) {
        let won: Vec<usize> = results
            .iter()
            .enumerate()
            .filter(|(_, r)| r.is_ok())
            .map(|(slot, _)| slot)
            .collect();
        if won.is_empty() {
            return;
        }
        let highest = won
            .iter()
            .filter_map(|&slot| self.round.counter(slot))
            .max();
        let fence = next_fence(highest);
        let fenced: Vec<Item<'_>> = won.iter().map(|&slot| items[slot]).collect();
        let req = Request {
            fencing: Fencing::Write(fence.get()),
            ..Request::new(Phase::Fence, 0, &fenced, 0)
        };
        self.driver.run(&mut self.round, &req);
        let mut unfenced = Vec::new();
        for (k, &slot) in won.iter().enumerate() {
            let decision = self.round.decision(k);
            let Ok(lock) = &mut results[slot] else {
                continue;
            };
            if decision == Decision::Won && lock.is_valid() {
                lock.set_fence(fence);
                continue;
            }
            let failure = self.failure(Phase::Fence, items[slot].key, k, 1, start);
            let error = if decision == Decision::Won {
                Error::Expired(failure)
            } else {
                Error::Unavailable(failure)
            };
            if let Ok(lock) = std::mem::replace(&mut results[slot], Err(error)) {
                unfenced.push(lock);
            }
        }
        // Never handed out without their fence: free them for the next holders at once.
        if !unfenced.is_empty() {
            let _ = self.unlock_many(&unfenced);
        }
    }
}
