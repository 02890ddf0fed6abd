//! A held lock: plain data, no handle to the client that took it.

use crate::clock::{self, Stamp};
use crate::core::token::Token;
use crate::error::{ArgumentError, Error};
use std::fmt;
use std::num::NonZeroU64;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Resource names up to this many bytes are stored inline: taking a lock on them does not
/// allocate.
pub const INLINE_RESOURCE: usize = 64;

/// A lock held on a quorum of nodes, valid until [`Lock::deadline`].
///
/// `Lock` does not release itself on drop (it has no connection); pass it to
/// [`Redlock::unlock`](crate::Redlock::unlock), or let the keys expire with the ttl.
///
/// One `Lock` value stands for one hold: it is not `Clone` (a copy unlocked on one side
/// would look valid on the other). Once [`unlock`](crate::Redlock::unlock) has released
/// it (or found that no node still held it), it is [released](Lock::is_released): no
/// longer [valid](Lock::is_valid), and a second `unlock` or an `extend` of it is refused
/// with [`Error::InvalidArgument`] without sending anything.
///
/// # Example
///
/// ```no_run
/// use std::time::Duration;
/// use quorumlock::Redlock;
///
/// let mut rl = Redlock::builder().nodes(["redis://127.0.0.1:7001"]).build()?;
/// let lock = rl.lock("orders:42", Duration::from_secs(10))?;
/// assert_eq!(lock.resource(), b"orders:42");
/// if lock.is_valid() {
///     // work for at most lock.remaining()
/// }
/// rl.unlock(&lock)?;
/// # Ok::<(), quorumlock::Error>(())
/// ```
#[must_use = "a Lock dropped unused is not released: its keys stay held until their ttl ends; pass it to unlock"]
pub struct Lock {
    resource: Resource,
    token: Token,
    ttl: Duration,
    started: Instant,
    /// The nodes this lock's SET and extends were written to (a `core::engine::chases` mask):
    /// an unlock follows them there even while they lag.
    written: u64,
    // INVARIANT: deadline = start of the operation that last set the keys + ttl − drift.
    deadline: Instant,
    /// `deadline` on the suspend-counting clock ([`crate::clock`]): what
    /// [`Lock::remaining`] and [`Lock::is_valid`] compare against.
    // INVARIANT: clock::stamp_from(deadline, started), taken when `deadline` was set.
    until: Stamp,
    /// The resources after the first, for a lock taken by `lock_all` (`None` otherwise;
    /// one pointer, so a plain lock stays small to build and to move).
    // INVARIANT: never `Some` of an empty list.
    // The extra box is the point: 8 bytes instead of a `Vec`'s 24 (or a boxed slice's 16)
    // in every lock, and only `lock_all` pays for it.
    #[allow(clippy::box_collection)]
    more: Option<Box<Vec<Box<[u8]>>>>,
    /// The fence, when taken with fencing on. Fences start at 1 (one more than the
    /// largest counter read, which starts at 0), so `None` takes no extra word.
    fence: Option<NonZeroU64>,
    /// Set by the unlock that released it (or found it held nowhere): the lock can no
    /// longer be extended or released. Atomic, as `unlock` takes `&Lock` and a lock may
    /// be shared between threads.
    released: AtomicBool,
}

impl Lock {
    pub(crate) fn new(
        resource: &[u8],
        token: Token,
        ttl: Duration,
        started: Instant,
        deadline: Instant,
        written: u64,
    ) -> Lock {
        Lock {
            resource: Resource::new(resource),
            token,
            ttl,
            started,
            written,
            deadline,
            until: clock::stamp_from(deadline, started),
            more: None,
            fence: None,
            released: AtomicBool::new(false),
        }
    }

    /// A copy, for the shared client's loop (a lock is not `Clone`: one value per hold).
    pub(crate) fn duplicate(&self) -> Lock {
        Lock {
            resource: self.resource.clone(),
            token: self.token.clone(),
            ttl: self.ttl,
            started: self.started,
            written: self.written,
            deadline: self.deadline,
            until: self.until,
            more: self.more.clone(),
            fence: self.fence,
            released: AtomicBool::new(self.is_released()),
        }
    }

    /// With the resources after the first (a lock taken by `lock_all`).
    pub(crate) fn with_more(mut self, more: Vec<Box<[u8]>>) -> Lock {
        self.more = (!more.is_empty()).then(|| Box::new(more));
        self
    }

    /// With its fence (at least 1: see `fence_lock`).
    pub(crate) fn set_fence(&mut self, fence: NonZeroU64) {
        self.fence = Some(fence);
    }

    /// Whether it covers several resources (taken by `lock_all`).
    pub(crate) fn is_multi(&self) -> bool {
        self.more.is_some()
    }

    /// The nodes this lock's commands were written to.
    pub(crate) fn written(&self) -> u64 {
        self.written
    }

    /// Adds the nodes an extend was written to, whether it succeeded or not.
    pub(crate) fn add_written(&mut self, nodes: u64) {
        self.written |= nodes;
    }

    /// Every resource the lock covers, in the order given: one for a lock from
    /// [`Redlock::lock`](crate::Redlock::lock), all of them for one from
    /// [`Redlock::lock_all`](crate::Redlock::lock_all). The first is [`Lock::resource`].
    ///
    /// # Example
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # let mut rl = quorumlock::Redlock::builder().nodes(["redis://127.0.0.1:7001"]).build()?;
    /// let lock = rl.lock_all(&["account:a", "account:b"], Duration::from_secs(5))?;
    /// let names: Vec<&[u8]> = lock.resources().collect();
    /// assert_eq!(names, [&b"account:a"[..], b"account:b"]);
    /// # Ok::<(), quorumlock::Error>(())
    /// ```
    pub fn resources(&self) -> impl Iterator<Item = &[u8]> + '_ {
        std::iter::once(self.resource()).chain(
            self.more
                .iter()
                .flat_map(|more| more.iter().map(|r| &r[..])),
        )
    }

    /// The fence: `Some` on every lock taken with fencing on
    /// ([`Builder::fencing`](crate::Builder::fencing)), `None` otherwise. It is strictly
    /// larger than the fence of every lock on the same resource granted before this one,
    /// so a storage that remembers the largest fence it has accepted, and refuses an
    /// operation (a write, and a read a write depends on) that carries a smaller one,
    /// turns away a holder that kept working after its lock expired (paused by GC,
    /// swapped out, partitioned). See [`Builder::fencing`](crate::Builder::fencing).
    ///
    /// # Example
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # let mut rl = quorumlock::Redlock::builder().nodes(["redis://127.0.0.1:7001"]).fencing(true).build()?;
    /// let lock = rl.lock("invoice:7", Duration::from_secs(5))?;
    /// let fence = lock.fence().expect("fencing is on");
    /// // storage.write_if_fence_at_least(fence, ...)
    /// # Ok::<(), quorumlock::Error>(())
    /// ```
    pub fn fence(&self) -> Option<u64> {
        self.fence.map(NonZeroU64::get)
    }

    /// The locked resource (the Redis key), exactly as given; for a lock from
    /// [`Redlock::lock_all`](crate::Redlock::lock_all), the first of them.
    pub fn resource(&self) -> &[u8] {
        self.resource.as_bytes()
    }

    /// The unique value stored under the key on every node.
    pub fn token(&self) -> &[u8] {
        self.token.as_bytes()
    }

    pub(crate) fn token_value(&self) -> Token {
        self.token.clone()
    }

    /// The token itself, for the items of a round on this lock.
    #[inline]
    pub(crate) fn token_ref(&self) -> &Token {
        &self.token
    }

    /// The ttl the keys were last set with.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// When the acquire (or the last successful extend) started.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// The instant the lock stops being safe to rely on: start + ttl − drift. An
    /// `Instant` does not count time the machine spent suspended (on Linux): ask
    /// [`Lock::remaining`] or [`Lock::is_valid`], which do, rather than comparing it
    /// with `Instant::now()`.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Validity left now; zero once expired or [released](Lock::is_released). Measured
    /// on a clock that counts time the machine spent suspended (`CLOCK_BOOTTIME` on
    /// Linux), as the nodes' keys keep expiring meanwhile: a lock held across a suspend
    /// longer than its validity is reported expired on resume. Not covered: a virtual
    /// machine paused by its host, whose clocks all stand still.
    pub fn remaining(&self) -> Duration {
        if self.is_released() {
            return Duration::ZERO;
        }
        self.until.saturating_duration_since(clock::now())
    }

    /// True while the lock is still valid (as [`Lock::remaining`] measures it): before
    /// its deadline, and not [released](Lock::is_released).
    pub fn is_valid(&self) -> bool {
        clock::now() < self.until && !self.is_released()
    }

    /// True once an `unlock` ([`Redlock::unlock`](crate::Redlock::unlock),
    /// [`SharedRedlock::unlock`](crate::SharedRedlock::unlock), or a batch of them)
    /// released this lock, or found that no node still held it. A released lock is no
    /// longer valid; another `unlock` or an `extend` of it returns
    /// [`Error::InvalidArgument`] and sends nothing. An unlock that failed
    /// ([`Error::Unavailable`]: too few nodes answered) leaves it unreleased, so it can
    /// be tried again.
    ///
    /// # Example
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # let mut rl = quorumlock::Redlock::builder().nodes(["redis://127.0.0.1:7001"]).build()?;
    /// let lock = rl.lock("orders:42", Duration::from_secs(10))?;
    /// rl.unlock(&lock)?;
    /// assert!(lock.is_released() && !lock.is_valid());
    /// assert!(matches!(rl.unlock(&lock), Err(quorumlock::Error::InvalidArgument(_))));
    /// # Ok::<(), quorumlock::Error>(())
    /// ```
    pub fn is_released(&self) -> bool {
        self.released.load(Ordering::Relaxed)
    }

    /// Marks it released (see [`Lock::is_released`]).
    pub(crate) fn mark_released(&self) {
        self.released.store(true, Ordering::Relaxed);
    }

    /// [`Error::InvalidArgument`] for a released lock (`what` it cannot be: "unlocked
    /// again", "extended"), nothing sent; `Ok` otherwise.
    #[inline]
    pub(crate) fn check_unreleased(&self, what: &str) -> Result<(), Error> {
        if self.is_released() {
            return Err(Error::InvalidArgument(ArgumentError::new(
                "lock",
                format!("{:?}", crate::error::Escaped(self.resource())),
                format!("already released by an unlock: it cannot be {what}; take a new lock"),
            )));
        }
        Ok(())
    }

    pub(crate) fn renew(&mut self, ttl: Duration, started: Instant, deadline: Instant) {
        self.ttl = ttl;
        self.started = started;
        self.deadline = deadline;
        self.until = clock::stamp_from(deadline, started);
    }

    pub(crate) fn shorten(&mut self, deadline: Instant) {
        if deadline < self.deadline {
            self.deadline = deadline;
            self.until = clock::stamp_from(deadline, self.started);
        }
    }

    /// [`Lock::deadline`] on the suspend-counting clock (`crate::clock`).
    pub(crate) fn until(&self) -> Stamp {
        self.until
    }
}

use crate::core::token::Prefix as TokenPrefix;

impl fmt::Debug for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lock")
            .field("resource", &crate::error::Escaped(self.resource()))
            .field("more", &self.more.as_ref().map_or(0, |more| more.len()))
            .field("fence", &self.fence)
            // A prefix to tell locks apart in logs; the whole token is a credential.
            .field("token", &TokenPrefix(self.token()))
            .field("ttl", &self.ttl)
            .field("remaining", &self.remaining())
            .finish()
    }
}

/// A lock as plain data ([`Lock::to_parts`]), for handing it to another process, which
/// makes it a [`Lock`] again with [`Lock::from_parts`] to extend or release it (a job
/// system's "the worker that finishes the job releases its lock").
///
/// How to send it is the caller's choice; every field is plain data. The token is a
/// credential: whoever has it can extend or release the lock, so send it over a channel
/// you trust, and never log it (`Debug` shows a prefix only).
///
/// **Validity travels as a duration.** Two processes share no clock, so
/// [`LockParts::remaining`] is the validity left when [`Lock::to_parts`] ran, on the
/// sender's clock. Before [`Lock::from_parts`], the receiver must take off the time the
/// parts spent in transit (at least the time since they were sent, as well as it can bound
/// it): the receiver's lock is valid for `remaining` from the moment `from_parts` runs.
///
/// # Example
///
/// ```no_run
/// use std::time::Duration;
/// use quorumlock::{Lock, Redlock};
///
/// // Process A takes the lock and hands it over.
/// let mut a = Redlock::builder().nodes(["redis://127.0.0.1:7001"]).build()?;
/// let lock = a.lock("job:17", Duration::from_secs(30))?;
/// let mut parts = lock.to_parts();
/// // ... parts travel to process B; it measured (or bounds) the transit at 40 ms ...
/// parts.remaining = parts.remaining.saturating_sub(Duration::from_millis(40));
/// let mut b = Redlock::builder().nodes(["redis://127.0.0.1:7001"]).build()?;
/// let mut lock = Lock::from_parts(parts)?;
/// b.extend(&mut lock, Duration::from_secs(30))?;
/// b.unlock(&lock)?;
/// # Ok::<(), quorumlock::Error>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct LockParts {
    /// The resources, in order: one, or every resource of a
    /// [`Redlock::lock_all`](crate::Redlock::lock_all).
    pub resources: Vec<Vec<u8>>,
    /// The value stored under the keys (a credential).
    pub token: Vec<u8>,
    /// The ttl the keys were last set with.
    pub ttl: Duration,
    /// The validity left when the parts were made, on the sender's clock (see above).
    pub remaining: Duration,
    /// The fence, for a lock taken with fencing on.
    pub fence: Option<u64>,
}

impl fmt::Debug for LockParts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockParts")
            .field(
                "resources",
                &self
                    .resources
                    .iter()
                    .map(|r| crate::error::Escaped(r))
                    .collect::<Vec<_>>(),
            )
            .field("token", &TokenPrefix(&self.token))
            .field("ttl", &self.ttl)
            .field("remaining", &self.remaining)
            .field("fence", &self.fence)
            .finish()
    }
}

impl Lock {
    /// The lock as plain data, to hand to another process (see [`LockParts`]).
    /// `remaining` is the validity left now.
    pub fn to_parts(&self) -> LockParts {
        LockParts {
            resources: self.resources().map(<[u8]>::to_vec).collect(),
            token: self.token().to_vec(),
            ttl: self.ttl,
            remaining: self.remaining(),
            fence: self.fence(),
        }
    }

    /// A lock handed over as [`LockParts`], valid for `parts.remaining` from now: the
    /// receiver must have taken the transit time off it (see [`LockParts`]). Extend and
    /// release it as any lock, with a client on the same nodes; both reach every node,
    /// since which nodes the sender's commands reached is not known here.
    /// [`Lock::started`] is the moment of this call.
    ///
    /// Refused with [`Error::InvalidArgument`], and nothing made, when the parts cannot
    /// be a lock: no resource, an empty or too long one, one named twice; an empty token
    /// or one over [`MAX_TOKEN`](crate::MAX_TOKEN) bytes; a ttl of zero or over
    /// [`MAX_TTL`](crate::MAX_TTL); `remaining` over the ttl (a clock or transit
    /// mistake); a fence of 0 (fences start at 1).
    pub fn from_parts(parts: LockParts) -> Result<Lock, Error> {
        let bad = |what: &'static str, value: String, problem: &str| {
            Error::InvalidArgument(ArgumentError::new(what, value, problem.to_string()))
        };
        let Some((first, rest)) = parts.resources.split_first() else {
            return Err(bad(
                "resources",
                "[]".into(),
                "a lock has one resource at least",
            ));
        };
        for (i, r) in parts.resources.iter().enumerate() {
            crate::redlock::check_resource(r)?;
            if parts.resources[..i].contains(r) {
                return Err(bad(
                    "resources",
                    format!("{:?}", crate::error::Escaped(r)),
                    "named twice",
                ));
            }
        }
        let token = Token::given(&parts.token).map_err(|problem| {
            bad(
                "token",
                format!("{} bytes", parts.token.len()),
                &problem.to_string(),
            )
        })?;
        crate::redlock::ttl_millis(parts.ttl)?;
        if parts.remaining > parts.ttl {
            return Err(bad(
                "remaining",
                format!("{:?}", parts.remaining),
                "more than the ttl: a clock or transit mistake",
            ));
        }
        let fence = match parts.fence {
            None => None,
            Some(f) => Some(
                NonZeroU64::new(f).ok_or_else(|| bad("fence", "0".into(), "fences start at 1"))?,
            ),
        };
        let now = Instant::now();
        let deadline = now.checked_add(parts.remaining).unwrap_or(now);
        // Every node: an unlock or extend follows the lock wherever it may be.
        let mut lock = Lock::new(first, token, parts.ttl, now, deadline, u64::MAX);
        lock.fence = fence;
        Ok(lock.with_more(rest.iter().map(|r| r[..].into()).collect()))
    }
}

/// Resource bytes, inline up to [`INLINE_RESOURCE`] bytes.
#[derive(Clone)]
enum Resource {
    Inline {
        len: u8,
        bytes: [u8; INLINE_RESOURCE],
    },
    Heap(Box<[u8]>),
}

impl Resource {
    fn new(data: &[u8]) -> Resource {
        if data.len() <= INLINE_RESOURCE {
            let mut bytes = [0u8; INLINE_RESOURCE];
            bytes[..data.len()].copy_from_slice(data);
            Resource::Inline {
                len: data.len() as u8,
                bytes,
            }
        } else {
            Resource::Heap(data.into())
        }
    }

    fn as_bytes(&self) -> &[u8] {
        match self {
            Resource::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Resource::Heap(b) => b,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resources_round_trip_inline_and_on_the_heap() {
        let now = Instant::now();
        for len in [0, 1, 63, 64, 65, 1000] {
            let data: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
            let lock = Lock::new(
                &data,
                Token::from_bits(1),
                Duration::from_secs(1),
                now,
                now,
                0,
            );
            assert_eq!(lock.resource(), &data[..]);
        }
    }

    #[test]
    fn validity_follows_the_deadline() {
        let now = Instant::now();
        let mut lock = Lock::new(
            b"r",
            Token::from_bits(1),
            Duration::from_secs(1),
            now,
            now + Duration::from_secs(60),
            0,
        );
        assert!(lock.is_valid());
        assert!(lock.remaining() > Duration::from_secs(59));
        lock.shorten(now);
        assert!(!lock.is_valid());
        assert_eq!(lock.remaining(), Duration::ZERO);
        lock.shorten(now + Duration::from_secs(100));
        assert!(!lock.is_valid(), "shorten never lengthens");
    }
}
