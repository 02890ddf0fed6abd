//! A held lock: plain data, no handle to the client that took it.

use crate::core::token::Token;
use std::fmt;
use std::num::NonZeroU64;
use std::time::{Duration, Instant};

/// Resource names up to this many bytes are stored inline: taking a lock on them does not
/// allocate.
pub const INLINE_RESOURCE: usize = 64;

/// A lock held on a quorum of nodes, valid until [`Lock::deadline`].
///
/// `Lock` does not release itself on drop (it has no connection); pass it to
/// [`Redlock::unlock`](crate::Redlock::unlock), or let the keys expire with the ttl.
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
#[derive(Clone)]
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
            more: None,
            fence: None,
        }
    }

    /// With the resources after the first (a lock taken by `lock_all`).
    /// A copy, for the shared client's loop (a lock is not `Clone`: one value per hold).
    pub(crate) fn duplicate(&self) -> Lock {
        Lock {
            resource: self.resource.clone(),
            token: self.token,
            ttl: self.ttl,
            started: self.started,
            written: self.written,
            deadline: self.deadline,
            more: self.more.clone(),
            fence: self.fence,
        }
    }

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
        self.token
    }

    /// The ttl the keys were last set with.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// When the acquire (or the last successful extend) started.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// The instant the lock stops being safe to rely on: start + ttl − drift.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Validity left now; zero once expired.
    pub fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// True while the lock is still valid.
    pub fn is_valid(&self) -> bool {
        Instant::now() < self.deadline
    }

    pub(crate) fn renew(&mut self, ttl: Duration, started: Instant, deadline: Instant) {
        self.ttl = ttl;
        self.started = started;
        self.deadline = deadline;
    }

    pub(crate) fn shorten(&mut self, deadline: Instant) {
        self.deadline = self.deadline.min(deadline);
    }
}

impl fmt::Debug for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lock")
            .field("resource", &crate::error::Escaped(self.resource()))
            .field("more", &self.more.as_ref().map_or(0, |more| more.len()))
            .field("fence", &self.fence)
            // A prefix to tell locks apart in logs; the whole token is a credential.
            .field("token", &format_args!("{}…", &self.token.to_string()[..8]))
            .field("ttl", &self.ttl)
            .field("remaining", &self.remaining())
            .finish()
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
