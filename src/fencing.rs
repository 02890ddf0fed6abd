//! Fencing tokens across the quorum: a number per lock that only ever rises, per resource.
//!
//! # How
//!
//! A fence counter is kept per resource on every node (`quorumlock:fence:<resource>`,
//! no expiry). A fenced acquire reads the counters with its `SET`s, atomically on each
//! node (`script::ACQUIRE`); the lock's fence is the largest counter among the nodes
//! whose yes counted, plus one. Before the lock is returned, that fence is written back
//! (raised where lower, `script::FENCE`) to every node whose connection is up (queued
//! behind what a lagging one owes), and the call waits for a majority to confirm it: a quorum
//! max-register, as in ABD.
//!
//! # Invariants
//!
//! - A fence is returned only with a lock that is still valid once a majority holds a
//!   counter at least as large. The next lock on the resource wins its own majority,
//!   which shares a node with that one, and reads it: its fence is larger. (Its read can
//!   only precede our write-back on the shared node if its round spanned our whole
//!   write-back and the life of our key there; a ttl of at least
//!   [`FENCE_TTL_FACTOR`] × `node_timeout` rules that out, and shorter ones are refused.)
//! - A lock whose write-back was not confirmed in time is released and never returned:
//!   its caller sees [`Phase::Fence`] in the error.
//! - A fenced lock's release raises each node's counter to its fence in the same script
//!   that deletes its key (`script::RELEASE_FENCED`), so no node frees the key without
//!   the fence, even one the write-back missed: the next holder needs the key free on a
//!   majority, and reads the counter there.
//! - Counters are Lua numbers (doubles) on the nodes, exact up to 2^53: a node that
//!   answers a counter of 2^53 or more is treated as out of step, so every fence, one
//!   more, stays exact where the scripts compare it.
//! - Counters are permanent state: a node that restarts empty loses them. The restart
//!   guard keeps such a node's yes from counting for a while, which protects exclusivity
//!   (keys expire anyway) but not counters; strict order across restarts needs
//!   persistence on the nodes (AOF), or a write-back that reached more nodes than
//!   restarted.

use crate::core::command::FENCE_PREFIX;
use crate::core::engine::{Fencing, Item, Request};
use crate::core::quorum::next_fence;
use crate::core::round::Decision;
use crate::error::{ArgumentError, Error, Phase};
use crate::lock::Lock;
use crate::redlock::{Redlock, check_resource};
use std::time::{Duration, Instant};

/// With fencing on, a ttl must be at least this many `node_timeout`s: an acquire round
/// lasts at most one, and a lock's own acquire and write-back at most two more, so no
/// round can read a counter before the write-back of a lock whose key it then takes.
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

    /// Refuses a ttl too short for fencing to order fences (see the module docs).
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
                 a shorter lock could read a fence counter before an earlier holder's \
                 write-back"
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
