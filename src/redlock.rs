//! The client: Redlock's acquire, extend and release on top of the driver's rounds.

use crate::config::{Builder, Settings};
use crate::core::engine::{Fencing, Item, Request};
use crate::core::quorum::{acquired_until, drift, extended_until, quorum, safe_span};
use crate::core::round::{Decision, Round};
use crate::core::token::{Token, TokenSource};
use crate::driver::Driver;
use crate::error::{ArgumentError, Error, Failure, NodeError, NodeReport, OsError, Outcome, Phase};
use crate::lock::Lock;
use crate::lock_all::lock_items;
use std::time::{Duration, Instant};

/// A Redlock client over N independent Redis masters.
///
/// One client owns one event loop and one connection per node, and runs one operation
/// at a time (`&mut self`), on the caller's thread. For many threads or tasks, use the
/// shared client, [`SharedRedlock`](crate::SharedRedlock)
/// ([`Builder::build_shared`]): `Clone + Send + Sync`, one loop and one connection per
/// node for every clone, with `async` and `blocking_` calls; its blocking path costs
/// about as much as this one. (A `Redlock` behind a `Mutex` would serialize every
/// caller behind one round at a time; a `Redlock` per thread opens one connection per
/// node per thread.)
///
/// # Example
///
/// ```no_run
/// use std::time::Duration;
/// use quorumlock::{Redlock, Lock, Error};
///
/// let mut rl = Redlock::builder()
///     .nodes(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
///     .node_timeout(Duration::from_millis(50))
///     .retry_count(3)
///     .retry_delay(Duration::from_millis(200))
///     .retry_jitter(Duration::from_millis(100))
///     .drift_factor(0.01)
///     .build()?;
/// let mut lock: Lock = rl.lock("orders:42", Duration::from_secs(10))?;
/// // ... critical section, at most lock.remaining() long ...
/// rl.extend(&mut lock, Duration::from_secs(10))?;
/// let released_on: usize = rl.unlock(&lock)?;
/// # Ok::<(), Error>(())
/// ```
pub struct Redlock {
    pub(crate) settings: Settings,
    pub(crate) driver: Driver,
    pub(crate) round: Round,
    pub(crate) tokens: TokenSource,
    pub(crate) lost: Vec<usize>,
    /// The last ttl (whole ms) an attempt used and its `ttl − drift`: services lock with
    /// one ttl, and the float arithmetic of the drift is then done once.
    safe_ttl: (u64, Option<Duration>),
}

impl std::fmt::Debug for Redlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redlock")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl Redlock {
    /// Starts configuring a client.
    pub fn builder() -> Builder {
        Builder::default()
    }

    pub(crate) fn from_settings(settings: Settings) -> Result<Redlock, Error> {
        let urandom = |e| Error::Os(OsError::new("reading lock tokens from /dev/urandom", e));
        let mut tokens = TokenSource::from_os().map_err(urandom)?;
        // With the restart guard on, each node's marker, written where a node has none.
        let mut markers = Vec::with_capacity(settings.nodes.len());
        for _ in &settings.nodes {
            let marker = if settings.restart_guard.is_zero() {
                None
            } else {
                tokens.next_token().map_err(urandom)?.as_array().copied()
            };
            markers.push(marker);
        }
        let driver = Driver::new(&settings, markers)
            .map_err(|e| Error::Os(OsError::new("creating the event queue (epoll)", e)))?;
        Ok(Redlock {
            settings,
            driver,
            round: Round::default(),
            tokens,
            lost: Vec::new(),
            safe_ttl: (0, None),
        })
    }

    /// Every node's health, in configuration order: connected, connecting, lagging, or
    /// down with why, and the last round trip measured to it (see
    /// [`NodeHealth`](crate::NodeHealth)). Nothing is sent to the nodes: it takes in
    /// what already arrived on the connections (and reopens those whose backoff has
    /// passed) without waiting, then reads their state.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # let mut rl = quorumlock::Redlock::builder().nodes(["redis://127.0.0.1:7001"]).build()?;
    /// for node in rl.health() {
    ///     println!("{node}");
    /// }
    /// # Ok::<(), quorumlock::Error>(())
    /// ```
    pub fn health(&mut self) -> Vec<crate::NodeHealth> {
        self.driver.refresh();
        self.driver.health()
    }

    /// The validated settings.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Nodes needed for a majority: `N / 2 + 1`.
    pub fn quorum(&self) -> usize {
        quorum(self.settings.nodes.len())
    }

    /// Acquires `resource` for `ttl`, retrying up to `retry_count` times after a random
    /// delay of `retry_delay ± retry_jitter`. Every failed attempt releases what it may
    /// have set (compare-and-delete on every node it reached) before waiting.
    ///
    /// The returned lock is valid for `ttl − elapsed − drift`; see [`Lock::remaining`].
    /// The error is that of the last attempt: [`Error::Taken`], [`Error::Unavailable`] or
    /// [`Error::Expired`], with per-node detail. A `ttl` of zero, not longer than the drift
    /// allowance or over [`MAX_TTL`], and an empty `resource` or one over [`MAX_RESOURCE`]
    /// bytes, are [`Error::InvalidArgument`], with nothing sent.
    pub fn lock(&mut self, resource: impl AsRef<[u8]>, ttl: Duration) -> Result<Lock, Error> {
        let resource = resource.as_ref();
        self.retrying(|rl, attempt| rl.attempt(resource, ttl, attempt, None))
    }

    /// [`Redlock::lock`] with a value the caller chose instead of a random token (a
    /// system that names its holders, as redsync's `WithValue`): 1 to [`MAX_TOKEN`]
    /// bytes, any bytes; anything else is [`Error::InvalidArgument`], with nothing sent.
    /// The lock's [`Lock::token`] is that value; extend and unlock compare against it.
    ///
    /// The value must be unique per acquisition, as the crate's own tokens are (128
    /// random bits): whoever knows it can extend and release the lock, and a holder that
    /// reuses it for a later lock of the same resource can have that lock released by a
    /// late unlock of the earlier one. Every retry of this call uses the same value; the
    /// cleanup of a failed attempt reaches each node ahead of the next attempt on the same
    /// connection, in order.
    ///
    /// [`MAX_TOKEN`]: crate::MAX_TOKEN
    ///
    /// # Example
    ///
    /// ```no_run
    /// use quorumlock::Redlock;
    /// use std::time::Duration;
    ///
    /// let mut rl = Redlock::builder()
    ///     .nodes(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
    ///     .build()?;
    /// let lock = rl.lock_with_token("orders:42", Duration::from_secs(10), "host-3:pid-812:job-42")?;
    /// assert_eq!(lock.token(), b"host-3:pid-812:job-42");
    /// rl.unlock(&lock)?;
    /// # Ok::<(), quorumlock::Error>(())
    /// ```
    pub fn lock_with_token(
        &mut self,
        resource: impl AsRef<[u8]>,
        ttl: Duration,
        token: impl AsRef<[u8]>,
    ) -> Result<Lock, Error> {
        let resource = resource.as_ref();
        let token = given_token(token.as_ref())?;
        self.retrying(|rl, attempt| rl.attempt(resource, ttl, attempt, Some(&token)))
    }

    /// [`Redlock::try_lock`] with a value the caller chose: one attempt, the token rules
    /// of [`Redlock::lock_with_token`].
    pub fn try_lock_with_token(
        &mut self,
        resource: impl AsRef<[u8]>,
        ttl: Duration,
        token: impl AsRef<[u8]>,
    ) -> Result<Lock, Error> {
        let token = given_token(token.as_ref())?;
        self.attempt(resource.as_ref(), ttl, 1, Some(&token))
    }

    /// Runs `attempt` (numbered from 1) until it succeeds, fails with an error a retry
    /// cannot mend, or `retry_count` retries are spent, waiting `retry_delay ±
    /// retry_jitter` between attempts.
    pub(crate) fn retrying(
        &mut self,
        mut attempt: impl FnMut(&mut Redlock, u32) -> Result<Lock, Error>,
    ) -> Result<Lock, Error> {
        let attempts = self.settings.retry_count.saturating_add(1);
        let mut n = 1;
        loop {
            match attempt(self, n) {
                Ok(lock) => return Ok(lock),
                Err(Error::Taken(_) | Error::Unavailable(_) | Error::Expired(_))
                    if n < attempts => {}
                Err(e) => return Err(e),
            }
            let delay = self
                .tokens
                .jitter(self.settings.retry_delay, self.settings.retry_jitter);
            self.driver.idle(Instant::now() + delay);
            n += 1;
        }
    }

    /// One attempt to acquire `resource` for `ttl`, no retries. On failure, what the
    /// attempt may have set is released (compare-and-delete on every node it reached):
    /// the deletes are written before returning, not waited for. The client's next
    /// attempt on the same resource waits for their replies before it writes (at most
    /// `node_timeout / 8`), so that a caller retrying at once does not take back the keys
    /// it has just freed before other clients can take them.
    pub fn try_lock(&mut self, resource: impl AsRef<[u8]>, ttl: Duration) -> Result<Lock, Error> {
        self.attempt(resource.as_ref(), ttl, 1, None)
    }

    /// One attempt, with the caller's token if `given`, else a new one.
    fn attempt(
        &mut self,
        resource: &[u8],
        ttl: Duration,
        attempt: u32,
        given: Option<&Token>,
    ) -> Result<Lock, Error> {
        let ttl_ms = ttl_millis(ttl)?;
        self.check_key(resource)?;
        let whole_ms = Duration::from_millis(ttl_ms);
        if self.safe_ttl.0 != ttl_ms {
            self.safe_ttl = (ttl_ms, safe_span(whole_ms, self.settings.drift_factor));
        }
        let Some(safe) = self.safe_ttl.1 else {
            return Err(self.ttl_within_drift(ttl));
        };
        if self.settings.fencing {
            self.check_fenced_ttl(whole_ms)?;
        }
        let token = match given {
            None => self.next_token()?,
            Some(token) => token.clone(),
        };
        let items = [Item {
            key: resource,
            token: &token,
        }];
        let req = Request {
            fencing: self.fencing(),
            ..Request::new(Phase::Acquire, ttl_ms, &items, 0)
        };
        let start = self.driver.run(&mut self.round, &req);
        if let Some(end) = self.won_until(0, Some(safe), start) {
            // Built in place: a lock is 150 bytes, not worth a copy on the hot path.
            let written = self.driver.written();
            if self.settings.fencing {
                let lock = Lock::new(resource, token.clone(), whole_ms, start, end, written);
                return self.fence_lock(lock, &items, false, start, attempt);
            }
            // The token moves into the lock: the round is over with it.
            return Ok(Lock::new(resource, token, whole_ms, start, end, written));
        }
        let error = self.acquire_error(resource, 0, start, attempt);
        self.lost.clear();
        self.lost.push(0);
        self.driver.release_lost(&items, &self.lost);
        Err(error)
    }

    #[inline]
    pub(crate) fn next_token(&mut self) -> Result<Token, Error> {
        self.tokens
            .next_token()
            .map_err(|e| Error::Os(OsError::new("reading lock tokens from /dev/urandom", e)))
    }

    /// Such a lock could never be valid: say so instead of failing every attempt.
    #[cold]
    pub(crate) fn ttl_within_drift(&self, ttl: Duration) -> Error {
        Error::InvalidArgument(ArgumentError::new(
            "ttl",
            format!("{ttl:?}"),
            format!(
                "no longer than the clock-drift allowance ({:?}): the lock could never be valid",
                drift(ttl, self.settings.drift_factor)
            ),
        ))
    }

    /// When `slot` was won in time: the lock's deadline (`start + safe`).
    #[inline]
    pub(crate) fn won_until(
        &self,
        slot: usize,
        safe: Option<Duration>,
        start: Instant,
    ) -> Option<Instant> {
        // Every decision is stamped before `run` returns; were one not, "now" is the
        // safe reading (the latest the decision can have been), `start` would not be.
        let decided = self.round.decided_at(slot).unwrap_or_else(Instant::now);
        acquired_until(self.round.decision(slot), decided, start, safe)
    }

    /// Why `slot` was not won (or was won too late).
    #[cold]
    pub(crate) fn acquire_error(
        &self,
        resource: &[u8],
        slot: usize,
        start: Instant,
        attempt: u32,
    ) -> Error {
        let failure = self.failure(Phase::Acquire, resource, slot, attempt, start);
        match self.round.decision(slot) {
            Decision::Won => Error::Expired(failure),
            Decision::Taken => Error::Taken(failure),
            _ => Error::Unavailable(failure),
        }
    }

    /// Turns the decision of `slot` into a lock or an error. `ttl` is in whole
    /// milliseconds, `safe` is `ttl − drift` (`None` when drift eats it all).
    fn settle_acquire(
        &self,
        item: &Item<'_>,
        slot: usize,
        ttl: Duration,
        safe: Option<Duration>,
        start: Instant,
        attempt: u32,
    ) -> Result<Lock, Error> {
        match self.won_until(slot, safe, start) {
            Some(end) => Ok(Lock::new(
                item.key,
                item.token.clone(),
                ttl,
                start,
                end,
                self.driver.written(),
            )),
            None => Err(self.acquire_error(item.key, slot, start, attempt)),
        }
    }

    /// Extends a held lock to `ttl` from now, on a quorum, with compare-and-pexpire.
    ///
    /// Succeeds only if a quorum agrees while the lock is still valid; the new validity is
    /// `ttl − elapsed − drift` from this call's start. A lock that has already expired is
    /// [`Error::Expired`] at once. If the extend fails, the lock's deadline is moved
    /// earlier when nodes that did apply the new ttl could now expire sooner than before;
    /// it is never moved later. A `ttl` out of range is [`Error::InvalidArgument`], as for
    /// [`Redlock::lock`], with nothing sent.
    pub fn extend(&mut self, lock: &mut Lock, ttl: Duration) -> Result<(), Error> {
        lock.check_unreleased("extended")?;
        let ttl_ms = ttl_millis(ttl)?;
        let ttl = Duration::from_millis(ttl_ms);
        if safe_span(ttl, self.settings.drift_factor).is_none() {
            return Err(self.ttl_within_drift(ttl));
        }
        if !lock.is_valid() {
            return Err(Error::Expired(Failure {
                op: Phase::Extend,
                resource: lock.resource().to_vec(),
                attempts: 0,
                quorum: self.quorum(),
                elapsed: Duration::ZERO,
                nodes: Vec::new(),
            }));
        }
        let items = lock_items(lock);
        let req = Request {
            atomic: lock.is_multi(),
            ..Request::new(Phase::Extend, ttl_ms, &items, 0)
        };
        let start = self.driver.run(&mut self.round, &req);
        let written = self.driver.written();
        let decided = self.round.decided_at(0).unwrap_or_else(Instant::now);
        let decision = self.round.decision(0);
        let verdict = extended_until(
            decision,
            decided,
            start,
            ttl,
            self.settings.drift_factor,
            lock.deadline(),
        );
        let error = |rl: &Redlock| {
            let failure = rl.failure(Phase::Extend, items[0].key, 0, 1, start);
            match decision {
                Decision::Won | Decision::Taken => Error::Expired(failure),
                _ => Error::Unavailable(failure),
            }
        };
        let result = verdict.map_err(|keep| (keep, error(self)));
        // Succeeded or not, the extend may apply on these nodes: the unlock follows it.
        lock.add_written(written);
        match result {
            Ok(end) => {
                lock.renew(ttl, start, end);
                Ok(())
            }
            Err((keep, e)) => {
                lock.shorten(keep);
                Err(e)
            }
        }
    }

    /// Releases the lock on every node with compare-and-delete, and returns on how many
    /// nodes our key was deleted.
    ///
    /// The delete goes to every node, and the call returns as soon as a majority has
    /// answered (at most `node_timeout`): the lock is then free, since no majority holds
    /// its key any more. **The count is the deletions confirmed when `unlock` returned**
    /// (the decision, and whatever replies came in the same batch): with 5 healthy nodes
    /// it may be 3 while the other deletes are still in flight (they are sent, and their
    /// replies are read by later calls, never waited for). A node that
    /// lags (frozen, stalled, reconnecting) and was written this lock's SET or an extend
    /// is sent the compare-and-delete too: Redis runs a connection's commands in order, so when the
    /// node wakes the delete follows the stale write instead of leaving a key behind for a
    /// whole ttl.
    ///
    /// If fewer than a majority answer, [`Error::Unavailable`] says which did not; the
    /// keys there expire with the ttl, and the lock can be unlocked again.
    ///
    /// A lock that no node still held (it expired, or was taken over, everywhere that
    /// answered) is [`Error::Expired`] (its nodes' outcomes are
    /// [`Outcome::NotHeld`](crate::Outcome::NotHeld)), never `Ok(0)`: `Ok(n)` always
    /// means that `n ≥ 1` nodes deleted our key. (A lock over several resources, from
    /// [`Redlock::lock_all`], is held on a node only with every key there: one partly
    /// gone everywhere is `Expired`, its remaining keys deleted all the same.) Either
    /// way the lock is then
    /// [released](Lock::is_released): another `unlock` (or an `extend`) of it is
    /// [`Error::InvalidArgument`], and sends nothing.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// use quorumlock::Error;
    /// # let mut rl = quorumlock::Redlock::builder().nodes(["redis://127.0.0.1:7001"]).build()?;
    /// let lock = rl.lock("report:daily", Duration::from_secs(10))?;
    /// // ... the work ...
    /// match rl.unlock(&lock) {
    ///     Ok(n) => println!("released on {n} nodes"),
    ///     // The lock had run out before the release: the work may have overlapped
    ///     // another holder's.
    ///     Err(Error::Expired(f)) => eprintln!("held nowhere any more: {f}"),
    ///     Err(e) => eprintln!("release failed (the keys expire with the ttl): {e}"),
    /// }
    /// # Ok::<(), quorumlock::Error>(())
    /// ```
    pub fn unlock(&mut self, lock: &Lock) -> Result<usize, Error> {
        lock.check_unreleased("unlocked again")?;
        let items = lock_items(lock);
        let req = release_request(lock, &items);
        let start = self.driver.run(&mut self.round, &req);
        released(lock, self.settle_release(&items[0], 0, start))
    }

    /// The first half of [`Redlock::unlock`], for the shared client: writes the release
    /// round of `lock`; returns its start. [`Redlock::finish_unlock`] waits for it.
    pub(crate) fn begin_unlock(&mut self, lock: &Lock) -> Instant {
        let items = lock_items(lock);
        let req = release_request(lock, &items);
        self.driver.begin(&mut self.round, &req)
    }

    /// The second half: waits for the release round of `lock` (begun at `start`) until it
    /// is decided, and gives its result as [`Redlock::unlock`]; `None` once `give_up` has
    /// passed with the round undecided (another call takes it up again).
    pub(crate) fn finish_unlock(
        &mut self,
        lock: &Lock,
        start: Instant,
        give_up: Option<Instant>,
    ) -> Option<Result<usize, Error>> {
        let items = lock_items(lock);
        let req = release_request(lock, &items);
        if !self.driver.finish(&mut self.round, &req, give_up) {
            return None;
        }
        Some(self.settle_release(&items[0], 0, start))
    }

    pub(crate) fn settle_release(
        &self,
        item: &Item<'_>,
        slot: usize,
        start: Instant,
    ) -> Result<usize, Error> {
        if self.round.answered(slot) >= self.quorum() {
            match self.round.yes(slot) {
                // No node that answered still held it: told apart from a release.
                0 => Err(Error::Expired(self.failure(
                    Phase::Release,
                    item.key,
                    slot,
                    1,
                    start,
                ))),
                n => Ok(n),
            }
        } else {
            Err(Error::Unavailable(self.failure(
                Phase::Release,
                item.key,
                slot,
                1,
                start,
            )))
        }
    }

    /// Tries to acquire every resource in `resources` for `ttl` in one round: all the SETs
    /// are written to each node in one go and read back in one pass. Each resource keeps
    /// the full Redlock rules (its own quorum and validity); the result for each is what
    /// [`Redlock::try_lock`] would have returned. Resources that were not won are released.
    ///
    /// The whole batch is one round, so `node_timeout` bounds the whole batch: with
    /// hundreds of resources per call, choose it for the batch, not for one command (on
    /// the 2-core test machine a 256-resource round takes a few milliseconds).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # let mut rl = quorumlock::Redlock::builder().nodes(["redis://127.0.0.1:7001"]).build()?;
    /// let results = rl.try_lock_many(&["a", "b", "c"], Duration::from_secs(5));
    /// let held: Vec<_> = results.into_iter().filter_map(Result::ok).collect();
    /// let released = rl.unlock_many(&held);
    /// # Ok::<(), quorumlock::Error>(())
    /// ```
    pub fn try_lock_many<R: AsRef<[u8]>>(
        &mut self,
        resources: &[R],
        ttl: Duration,
    ) -> Vec<Result<Lock, Error>> {
        let ttl_ms = match ttl_millis(ttl) {
            Ok(ms) => ms,
            Err(e) => return resources.iter().map(|_| Err(e.clone())).collect(),
        };
        let mut results = Vec::with_capacity(resources.len());
        let mut rest = resources;
        while !rest.is_empty() {
            let (batch, tail) = rest.split_at(batch_len(rest));
            self.lock_batch(batch, ttl_ms, &mut results);
            rest = tail;
        }
        results
    }

    /// One round for one batch; appends one result per resource, in order.
    fn lock_batch<R: AsRef<[u8]>>(
        &mut self,
        resources: &[R],
        ttl_ms: u64,
        results: &mut Vec<Result<Lock, Error>>,
    ) {
        let whole = Duration::from_millis(ttl_ms);
        let safe = safe_span(whole, self.settings.drift_factor);
        if safe.is_none() {
            let e = self.ttl_within_drift(whole);
            results.extend(resources.iter().map(|_| Err(e.clone())));
            return;
        }
        let keys: Vec<&[u8]> = resources
            .iter()
            .map(AsRef::as_ref)
            .filter(|key| self.check_key(key).is_ok())
            .collect();
        let mut tokens = Vec::with_capacity(keys.len());
        for _ in &keys {
            match self.next_token() {
                Ok(token) => tokens.push(token),
                Err(e) => {
                    results.extend(resources.iter().map(|_| Err(e.clone())));
                    return;
                }
            }
        }
        let items: Vec<Item<'_>> = keys
            .iter()
            .zip(&tokens)
            .map(|(&key, token)| Item { key, token })
            .collect();
        let start = if items.is_empty() {
            Instant::now()
        } else {
            if self.settings.fencing {
                if let Err(e) = self.check_fenced_ttl(whole) {
                    results.extend(resources.iter().map(|_| Err(e.clone())));
                    return;
                }
            }
            let req = Request {
                fencing: self.fencing(),
                ..Request::new(Phase::Acquire, ttl_ms, &items, 0)
            };
            self.driver.run(&mut self.round, &req)
        };
        self.lost.clear();
        let mut settled = Vec::with_capacity(items.len());
        for (slot, item) in items.iter().enumerate() {
            let result = self.settle_acquire(item, slot, whole, safe, start, 1);
            if result.is_err() {
                self.lost.push(slot);
            }
            settled.push(result);
        }
        // Before any other round: the deletes go where this round's SETs went.
        self.driver.release_lost(&items, &self.lost);
        if self.settings.fencing {
            self.fence_batch(&items, &mut settled, start);
        }
        // One result per resource, in order: the refused ones were never sent.
        let mut settled = settled.into_iter();
        for resource in resources {
            match self.check_key(resource.as_ref()) {
                Err(e) => results.push(Err(e)),
                Ok(()) => results.extend(settled.next()),
            }
        }
    }

    /// Releases several locks in one round per batch; one result per lock, as
    /// [`Redlock::unlock`] (a lock held nowhere any more is [`Error::Expired`], a lock
    /// already released [`Error::InvalidArgument`]; each lock released or found held
    /// nowhere is [released](Lock::is_released)).
    pub fn unlock_many(&mut self, locks: &[Lock]) -> Vec<Result<usize, Error>> {
        if locks
            .iter()
            .any(|l| l.is_multi() || l.fence().is_some() || l.is_released())
        {
            // A lock over several resources, or a fenced one, is released by a script of
            // its own.
            return locks.iter().map(|lock| self.unlock(lock)).collect();
        }
        let mut results = Vec::with_capacity(locks.len());
        let mut rest = locks;
        while !rest.is_empty() {
            let resources: Vec<&[u8]> = rest.iter().map(Lock::resource).collect();
            let (batch, tail) = rest.split_at(batch_len(&resources));
            let items: Vec<Item<'_>> = batch
                .iter()
                .map(|l| Item {
                    key: l.resource(),
                    token: l.token_ref(),
                })
                .collect();
            let chase = batch.iter().fold(0, |mask, l| mask | l.written());
            let req = Request::new(Phase::Release, 0, &items, chase);
            let start = self.driver.run(&mut self.round, &req);
            for (slot, (item, lock)) in items.iter().zip(batch).enumerate() {
                results.push(released(lock, self.settle_release(item, slot, start)));
            }
            rest = tail;
        }
        results
    }

    /// Bytes of buffers held by the client's connections (inbox, outbox, reply queues).
    /// Constant in steady state; exposed so tests and monitoring can check it.
    pub fn buffered_bytes(&self) -> usize {
        self.driver.buffered()
    }

    pub(crate) fn failure(
        &self,
        op: Phase,
        resource: &[u8],
        slot: usize,
        attempts: u32,
        start: Instant,
    ) -> Failure {
        Failure {
            op,
            resource: resource.to_vec(),
            attempts,
            quorum: self.quorum(),
            elapsed: self
                .round
                .decided_at(slot)
                .unwrap_or(start)
                .saturating_duration_since(start),
            nodes: self
                .round
                .outcomes(slot)
                .zip(self.driver.endpoints())
                .map(|(outcome, endpoint)| NodeReport {
                    node: endpoint.to_string(),
                    outcome: self.named(outcome),
                })
                .collect(),
        }
    }
}

impl Redlock {
    /// `outcome` with the endpoint a duplicate node duplicates named (the core knows
    /// nodes by index only).
    fn named(&self, outcome: Outcome) -> Outcome {
        match outcome {
            Outcome::Failed(NodeError::Duplicate { of, .. }) => {
                Outcome::Failed(NodeError::Duplicate {
                    of,
                    endpoint: self
                        .driver
                        .endpoints()
                        .get(of)
                        .map_or_else(String::new, |e| e.to_string()),
                })
            }
            other => other,
        }
    }
}

/// Longest resource name accepted, in bytes.
pub const MAX_RESOURCE: usize = 64 * 1024;
/// Most resources one batch round carries; larger batches are split into rounds.
pub(crate) const MAX_BATCH: usize = 1024;
/// Most key bytes one batch round carries (with a margin for each command's framing).
pub(crate) const MAX_BATCH_BYTES: usize = 256 * 1024;

/// How many of `resources` go into the next batch round: at least one.
fn batch_len<R: AsRef<[u8]>>(resources: &[R]) -> usize {
    let mut bytes = 0;
    for (i, r) in resources.iter().enumerate() {
        bytes += r.as_ref().len() + 128;
        if i == MAX_BATCH || (i > 0 && bytes > MAX_BATCH_BYTES) {
            return i;
        }
    }
    resources.len()
}

/// Longest ttl accepted: a day. Longer jobs hold a shorter lock and extend it.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 3600);

/// A resource name is one to `MAX_RESOURCE` bytes. An empty name is refused: it is almost
/// always an unset variable, and every such caller would contend for the same key.
#[inline]
/// A caller's token ([`Redlock::lock_with_token`]), or why it cannot be one.
pub(crate) fn given_token(bytes: &[u8]) -> Result<Token, Error> {
    Token::given(bytes).map_err(|problem| {
        // The length only: the value is a credential.
        Error::InvalidArgument(ArgumentError::new(
            "token",
            format!("{} bytes", bytes.len()),
            problem.to_string(),
        ))
    })
}

pub(crate) fn check_resource(resource: &[u8]) -> Result<(), Error> {
    if resource.is_empty() || resource.len() > MAX_RESOURCE {
        return Err(bad_resource(resource.len()));
    }
    Ok(())
}

#[cold]
fn bad_resource(len: usize) -> Error {
    let problem = if len == 0 {
        "empty: name the resource to lock".to_string()
    } else {
        format!("longer than MAX_RESOURCE ({MAX_RESOURCE} bytes)")
    };
    Error::InvalidArgument(ArgumentError::new(
        "resource",
        format!("{len} bytes"),
        problem,
    ))
}

/// The ttl in whole milliseconds, as `PX` takes it: 1 ms to [`MAX_TTL`].
pub(crate) fn ttl_millis(ttl: Duration) -> Result<u64, Error> {
    // In u64: no u128 arithmetic on the hot path.
    let ms = ttl
        .as_secs()
        .saturating_mul(1000)
        .saturating_add(u64::from(ttl.subsec_millis()));
    if ms == 0 || ttl > MAX_TTL {
        return Err(bad_ttl(ttl));
    }
    Ok(ms)
}

#[cold]
fn bad_ttl(ttl: Duration) -> Error {
    let problem = if ttl < Duration::from_millis(1) {
        "must be at least 1 ms".to_string()
    } else {
        format!("longer than MAX_TTL ({MAX_TTL:?}): hold a shorter lock and extend it")
    };
    Error::InvalidArgument(ArgumentError::new("ttl", format!("{ttl:?}"), problem))
}

/// `result` of unlocking `lock`, which is released when no node holds it any more
/// (deleted where it was held, or held nowhere); a failed unlock can be tried again.
#[inline]
pub(crate) fn released(lock: &Lock, result: Result<usize, Error>) -> Result<usize, Error> {
    if matches!(result, Ok(_) | Err(Error::Expired(_))) {
        lock.mark_released();
    }
    result
}

/// The release round of `lock` over its `items`, as [`Redlock::unlock`] sends it.
#[inline]
fn release_request<'a>(lock: &Lock, items: &'a [Item<'a>]) -> Request<'a> {
    Request {
        atomic: lock.is_multi(),
        // A fenced lock's key is freed on a node only with its fence raised there.
        fencing: lock.fence().map_or(Fencing::Off, Fencing::Write),
        ..Request::new(Phase::Release, 0, items, lock.written())
    }
}
