//! Locks over several resources at once: every key or none, on each node.
//!
//! # Invariants
//!
//! - One command per node takes all the keys or none (`script::ACQUIRE`, atomic on the
//!   server): a node's yes means it holds every key under one token. The quorum counts
//!   such nodes; validity is computed as for one resource.
//! - Extend and release act on all the keys at once too (`script::EXTEND_ALL`,
//!   `script::RELEASE_ALL`; a fenced one's release is `script::RELEASE_FENCED`); a lost
//!   attempt deletes each key it may have set, and waits (at most `node_timeout`) for
//!   those deletes to be answered before it returns.
//! - No ordering between resources is needed to avoid deadlock: an attempt never holds
//!   part of the set while it waits for the rest.

use crate::core::engine::{Item, Request};
use crate::core::slot::slot;
use crate::error::{ArgumentError, Error, Phase};
use crate::lock::Lock;
use crate::redlock::{MAX_BATCH, MAX_BATCH_BYTES, Redlock, ttl_millis};
use std::ops::Deref;
use std::time::{Duration, Instant};

impl Redlock {
    /// Acquires every one of `resources` for `ttl`, or none: one [`Lock`] covers them
    /// all ([`Lock::resources`]; its [`Lock::resource`] is the first), and
    /// [`Redlock::extend`] and [`Redlock::unlock`] act on all of them at once. Retries as
    /// [`Redlock::lock`] does.
    ///
    /// On each node one script sets every key (with `NX` semantics) or none, so a node
    /// votes yes only if it holds the whole set; the lock is won by a quorum of such
    /// nodes. Nothing is ever held in part, so locking "account A and account B" needs no
    /// agreed order between callers. With fencing on, the lock's one fence is larger
    /// than the fence of every earlier lock on any of the resources.
    ///
    /// `resources` must be 1 to 1024 distinct, valid names (at most 256 KiB in all);
    /// anything else is [`Error::InvalidArgument`], with nothing sent.
    ///
    /// # Example
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// let mut rl = quorumlock::Redlock::builder()
    ///     .nodes(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
    ///     .build()?;
    /// let lock = rl.lock_all(&["account:a", "account:b"], Duration::from_secs(5))?;
    /// // ... move money from A to B ...
    /// rl.unlock(&lock)?;
    /// # Ok::<(), quorumlock::Error>(())
    /// ```
    pub fn lock_all<R: AsRef<[u8]>>(
        &mut self,
        resources: &[R],
        ttl: Duration,
    ) -> Result<Lock, Error> {
        self.retrying(|rl, attempt| rl.attempt_all(resources, ttl, attempt))
    }

    pub(crate) fn attempt_all<R: AsRef<[u8]>>(
        &mut self,
        resources: &[R],
        ttl: Duration,
        attempt: u32,
    ) -> Result<Lock, Error> {
        let ttl_ms = ttl_millis(ttl)?;
        let whole = Duration::from_millis(ttl_ms);
        self.check_set(resources)?;
        let Some(safe) = crate::core::quorum::safe_span(whole, self.settings.drift_factor) else {
            return Err(self.ttl_within_drift(whole));
        };
        if self.settings.fencing {
            self.check_fenced_ttl(whole)?;
        }
        let token = self.next_token()?;
        let items: Vec<Item<'_>> = resources
            .iter()
            .map(|r| Item {
                key: r.as_ref(),
                token: &token,
            })
            .collect();
        let req = Request {
            atomic: true,
            fencing: self.fencing(),
            ..Request::new(Phase::Acquire, ttl_ms, &items, 0)
        };
        let start = self.driver.run(&mut self.round, &req);
        if let Some(end) = self.won_until(0, Some(safe), start) {
            let written = self.driver.written();
            let more = items[1..].iter().map(|item| item.key.into()).collect();
            let lock =
                Lock::new(items[0].key, token.clone(), whole, start, end, written).with_more(more);
            if self.settings.fencing {
                return self.fence_lock(lock, &items, true, start, attempt);
            }
            return Ok(lock);
        }
        let error = self.acquire_error(items[0].key, 0, start, attempt);
        // Each key this attempt may have set, deleted where the attempt was written.
        self.lost.clear();
        self.lost.extend(0..items.len());
        self.driver.release_lost(&items, &self.lost);
        // A set is rare and large: unlike a single lock's lost attempt, whose caller goes
        // straight back, this call waits (at most `node_timeout`) for its deletes, so that
        // nothing of the set is left on a node when it returns.
        let until = Instant::now() + self.settings.node_timeout;
        self.driver.settle_deletes(until);
        Err(error)
    }
}

impl Redlock {
    /// A set `lock_all` accepts: 1 to `MAX_BATCH` distinct valid names, `MAX_BATCH_BYTES` in
    /// all.
    fn check_set<R: AsRef<[u8]>>(&self, resources: &[R]) -> Result<(), Error> {
        let refuse = |value: String, problem: &str| {
            Err(Error::InvalidArgument(ArgumentError::new(
                "resources",
                value,
                problem.to_string(),
            )))
        };
        if resources.is_empty() || resources.len() > MAX_BATCH {
            return refuse(
                format!("{} resources", resources.len()),
                "lock_all takes 1 to 1024 resources",
            );
        }
        let mut bytes = 0;
        for r in resources {
            self.check_key(r.as_ref())?;
            bytes += r.as_ref().len();
        }
        if bytes > MAX_BATCH_BYTES {
            return refuse(format!("{bytes} bytes"), "at most 256 KiB of names in all");
        }
        // A cluster-mode node runs a script over one hash slot only: refused here, with
        // what to do, rather than by every node with CROSSSLOT. (Before the first
        // connection's INFO no node is known to be one: that first call meets CROSSSLOT.)
        if resources.len() > 1 && self.driver.cluster_mode() {
            let first = resources[0].as_ref();
            if let Some(other) = resources
                .iter()
                .map(AsRef::as_ref)
                .find(|r| slot(r) != slot(first))
            {
                return refuse(
                    format!(
                        "{:?} and {:?} (hash slots {} and {})",
                        crate::error::Escaped(first),
                        crate::error::Escaped(other),
                        slot(first),
                        slot(other)
                    ),
                    "a node is in cluster mode, which runs one script over one hash slot \
                     only (CROSSSLOT): give the resources one hash tag, as {tag}a and {tag}b",
                );
            }
        }
        let mut sorted: Vec<&[u8]> = resources.iter().map(AsRef::as_ref).collect();
        sorted.sort_unstable();
        if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
            return refuse(
                format!("{:?} listed twice", crate::error::Escaped(w[0])),
                "each resource once",
            );
        }
        Ok(())
    }
}

/// The items a held lock's extend or release acts on: its one resource on the stack, or
/// all of a `lock_all`'s.
pub(crate) enum LockItems<'a> {
    One([Item<'a>; 1]),
    All(Vec<Item<'a>>),
}

impl<'a> Deref for LockItems<'a> {
    type Target = [Item<'a>];

    fn deref(&self) -> &[Item<'a>] {
        match self {
            LockItems::One(one) => one,
            LockItems::All(all) => all,
        }
    }
}

/// The items of `lock`, with its token.
#[inline]
pub(crate) fn lock_items(lock: &Lock) -> LockItems<'_> {
    let token = lock.token_ref();
    if lock.is_multi() {
        LockItems::All(lock.resources().map(|key| Item { key, token }).collect())
    } else {
        LockItems::One([Item {
            key: lock.resource(),
            token,
        }])
    }
}
