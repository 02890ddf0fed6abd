//! Observing the client: per-round events (what each node answered, how fast, what was
//! decided) and node changes (connected, down, lagging), for metrics and logs without
//! this crate depending on a logging or metrics crate.
//!
//! Set an [`Observer`] with [`Builder::observer`](crate::Builder::observer); it sees
//! every round of the client built from that builder, direct ([`Redlock`](crate::Redlock))
//! or shared ([`SharedRedlock`](crate::SharedRedlock)).
//!
//! # What is reported
//!
//! - [`Observer::round`]: one [`RoundEvent`] per **decision**: a round is one command
//!   written to every node, and most rounds decide one thing (an acquire attempt of
//!   `lock` or `try_lock`, each retry its own round; an extend; an unlock; the fence
//!   write-back of a fenced lock; a `lock_all` attempt, whose one decision covers all its
//!   resources). A round that carries several independent items (`try_lock_many`,
//!   `unlock_many`, the shared client's rounds, which batch many callers' requests and
//!   leases' extends) decides each item apart: it is reported as one event per item,
//!   with the same [`RoundEvent::round`] id, numbered by [`RoundEvent::item`] out of
//!   [`RoundEvent::items`].
//! - [`Observer::node`]: a [`NodeEvent`] when a node's connection answers its handshake
//!   (its first one, or a reconnect), fails or is dropped, is found lagging (it owes
//!   replies older than `node_timeout`, so it is neither asked nor waited for), or
//!   catches up.
//!
//! # Invariants
//!
//! - Every round event lists **every node exactly once**, in configuration order
//!   ([`RoundEvent::nodes`]), with the one outcome the round recorded for it, in the
//!   crate's vocabulary ([`Outcome`]): a yes (`Locked`, `Released`, `Fenced`), a no
//!   (`Held`, `NotHeld`), `NoReply` (no answer within `node_timeout`), `NotNeeded` (the
//!   decision came first), or `Failed` with why (among them the nodes not asked:
//!   [`NodeError::Lagging`], [`NodeError::Down`], [`NodeError::Connecting`],
//!   [`NodeError::Duplicate`], [`NodeError::YoungerThanGuard`]). It is the outcome an
//!   error's [`Failure::nodes`](crate::Failure::nodes) would show (a duplicate's
//!   `endpoint` is left empty here: [`NodeOutcome::endpoint`] names the node).
//! - Every round that is decided is reported once, when it is decided, before the call
//!   that ran it returns (or, in the shared client, before its callers are answered). Node
//!   changes seen during a round are reported before that round's event.
//! - Latency ([`NodeOutcome::latency`]) is the time from the round's start (read before
//!   its commands are written) to the clock reading taken right after the batch of
//!   readiness events in which the node's reply was handled: the client reads the clock
//!   at most once per batch (one `epoll_wait`) that recorded a reply, never per reply,
//!   and shares the reading it takes anyway to time a decision, so the resolution is
//!   that of a batch (microseconds on an idle machine) and a reading is never earlier
//!   than the reply's arrival in the process. Nodes that gave no reply in the round (not
//!   asked, `NoReply`, `NotNeeded`) have none.
//! - **Zero cost when unset**: without an observer nothing is recorded and no clock is
//!   read for it (the hot path pays a test of an `Option` per wait). With one, events
//!   borrow the client's own state and allocate nothing; each batch of replies costs a
//!   few bit operations and at most one more clock reading (`docs/OBSERVING.md`
//!   gives the count per lock and unlock).
//!
//! # Where observers run, and what they must not do
//!
//! Observer methods run **synchronously, inside the client**: for the direct client on
//! the thread of the call (`lock`, `extend`, `unlock`, ...); for the shared client on its
//! loop thread, or on the thread of a blocking call or a future's poll that runs its
//! round itself. The client waits for them, and, in the shared client, so do all its
//! callers: they must be quick (count, push to a channel, format into a preallocated
//! buffer) and must not block.
//!
//! They must not call back into the client. A [`SharedRedlock`](crate::SharedRedlock)
//! request made from inside an observer method (of any client) is refused with a panic:
//! it would wait for the loop thread, which may be the one running the observer (a
//! deadlock). A direct client can only be reached through something that locks it (a
//! `Mutex` its caller holds), which would deadlock: do not. An observer that keeps a
//! handle of the shared client it observes keeps that client alive (a cycle): let go of
//! the handle when done.
//!
//! A panic in an observer method is caught where the client called it: the panic hook
//! runs as usual (by default it prints the message), the method's remaining work is
//! lost, and the client carries on as if it had returned; later events are still
//! delivered. (With `panic = "abort"`, the process aborts.)
//!
//! # Example: counting outcomes
//!
//! ```no_run
//! use quorumlock::{Observer, Outcome, Redlock, RoundEvent};
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
//! use std::time::Duration;
//!
//! #[derive(Default)]
//! struct Counts {
//!     rounds: AtomicU64,
//!     yes: AtomicU64,
//!     refused: AtomicU64,
//!     no_reply: AtomicU64,
//!     failed: AtomicU64,
//! }
//!
//! impl Observer for Counts {
//!     fn round(&self, e: &RoundEvent<'_>) {
//!         self.rounds.fetch_add(1, Relaxed);
//!         for n in e.nodes() {
//!             let counter = match n.outcome() {
//!                 Outcome::Locked | Outcome::Released | Outcome::Fenced => &self.yes,
//!                 Outcome::Held | Outcome::NotHeld => &self.refused,
//!                 Outcome::NoReply => &self.no_reply,
//!                 Outcome::Failed(_) => &self.failed,
//!                 _ => continue, // NotNeeded
//!             };
//!             counter.fetch_add(1, Relaxed);
//!         }
//!     }
//! }
//!
//! let counts = Arc::new(Counts::default());
//! let mut rl = Redlock::builder()
//!     .nodes(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
//!     .observer(Arc::clone(&counts))
//!     .build()?;
//! let lock = rl.lock("orders:42", Duration::from_secs(10))?;
//! rl.unlock(&lock)?;
//! assert_eq!(counts.rounds.load(Relaxed), 2);
//! # Ok::<(), quorumlock::Error>(())
//! ```
//!
//! # Example: a latency histogram
//!
//! ```no_run
//! use quorumlock::{Observer, Phase, Redlock, RoundEvent};
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
//!
//! /// Per-node reply latency of acquires, in fixed power-of-two buckets from 16 µs up.
//! struct Histogram {
//!     buckets: [AtomicU64; 16],
//! }
//!
//! impl Observer for Histogram {
//!     fn round(&self, e: &RoundEvent<'_>) {
//!         if e.phase() != Phase::Acquire {
//!             return;
//!         }
//!         for latency in e.nodes().filter_map(|n| n.latency()) {
//!             let micros = latency.as_micros().max(1) as u64;
//!             let bucket = (micros.ilog2() as usize).saturating_sub(4).min(15);
//!             self.buckets[bucket].fetch_add(1, Relaxed);
//!         }
//!     }
//! }
//!
//! let histogram = Arc::new(Histogram { buckets: Default::default() });
//! let rl = Redlock::builder()
//!     .nodes(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
//!     .observer(Arc::clone(&histogram))
//!     .build()?;
//! # drop(rl);
//! # Ok::<(), quorumlock::Error>(())
//! ```

use crate::config::Endpoint;
use crate::core::engine::{Engine, Item, Note, Request};
use crate::core::quorum::safe_span;
use crate::core::round::{Decision as Core, Round};
use crate::core::session::Session;
use crate::error::{NodeError, Outcome, Phase};
use std::cell::Cell;
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Receives the client's events; every method has a default that does nothing, so an
/// observer implements only what it needs (and new kinds of events can be added without
/// breaking it).
///
/// See the [module documentation](crate::observer) for what is reported, on which thread,
/// and what an observer must not do (block, call back into the client).
///
/// An `Arc<O>` is an observer when `O` is: pass `Arc::clone(&o)` to
/// [`Builder::observer`](crate::Builder::observer) and keep `o` to read what it gathered.
///
/// # Example
///
/// ```
/// use quorumlock::{Decision, NodeChange, NodeEvent, Observer, RoundEvent};
///
/// /// Logs failed rounds and node changes to stderr.
/// struct Log;
///
/// impl Observer for Log {
///     fn round(&self, e: &RoundEvent<'_>) {
///         if !matches!(e.decision(), Decision::Won | Decision::Released) {
///             eprintln!("{e:?}");
///         }
///     }
///     fn node(&self, e: &NodeEvent<'_>) {
///         match e.change() {
///             NodeChange::Down(why) => eprintln!("{} down: {why}", e.endpoint()),
///             other => eprintln!("{}: {other:?}", e.endpoint()),
///         }
///     }
/// }
///
/// let builder = quorumlock::Redlock::builder().observer(Log);
/// # drop(builder);
/// ```
pub trait Observer: Send + Sync + 'static {
    /// A round was decided (one event per item it decided: see [`RoundEvent`]).
    fn round(&self, event: &RoundEvent<'_>) {
        let _ = event;
    }

    /// A node's standing changed: connected, down, lagging, caught up.
    fn node(&self, event: &NodeEvent<'_>) {
        let _ = event;
    }
}

impl<O: Observer + ?Sized> Observer for Arc<O> {
    fn round(&self, event: &RoundEvent<'_>) {
        (**self).round(event);
    }

    fn node(&self, event: &NodeEvent<'_>) {
        (**self).node(event);
    }
}

/// What a round decided for one item, as its caller sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Decision {
    /// A quorum said yes in time: an acquire or extend left validity
    /// ([`RoundEvent::validity`]), a fence write-back was confirmed by a majority. (An
    /// extend is judged against its new ttl only: one whose lock's previous validity ran
    /// out before the quorum agreed is still `Won` here, and the call reports
    /// [`Error::Expired`](crate::Error::Expired).)
    Won,
    /// A quorum said yes, but too late: no validity was left (the call reports
    /// [`Error::Expired`](crate::Error::Expired)).
    Expired,
    /// So many nodes said no that no quorum is possible: held by another client (an
    /// acquire), or no longer ours on a majority (an extend).
    Taken,
    /// Too few nodes answered (down, frozen, slow, erroring) for a quorum.
    Unavailable,
    /// A release that a majority answered: the lock is free.
    Released,
}

/// One decided item of a round: what every node answered, how fast, and what it came to.
///
/// Borrowed from the client for the duration of [`Observer::round`]; copy out what you
/// keep.
///
/// # Example
///
/// ```
/// use quorumlock::{Observer, RoundEvent};
///
/// struct Slowest;
///
/// impl Observer for Slowest {
///     fn round(&self, e: &RoundEvent<'_>) {
///         let slowest = e.nodes().filter_map(|n| n.latency().map(|l| (l, n.index()))).max();
///         if let Some((latency, node)) = slowest {
///             eprintln!("{} {:?}: slowest reply from node {node} after {latency:?}",
///                 e.phase(), e.resource().escape_ascii().to_string());
///         }
///     }
/// }
/// # let _ = quorumlock::Redlock::builder().observer(Slowest);
/// ```
pub struct RoundEvent<'a> {
    phase: Phase,
    round: u64,
    item: usize,
    items: usize,
    keys: &'a [Item<'a>],
    endpoints: &'a [Endpoint],
    votes: &'a Round,
    sessions: &'a [Session],
    slot: usize,
    replied: Replied<'a>,
    decision: Decision,
    started: Instant,
    /// When the item was decided (the clock reading after the batch that decided it).
    decided: Option<Instant>,
    deadline: Option<Instant>,
}

impl<'a> RoundEvent<'a> {
    /// The operation: acquire, extend, release, or a fenced lock's fence write-back.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// The round's id within this client (increasing, from 1): the events of one round's
    /// items share it.
    pub fn round(&self) -> u64 {
        self.round
    }

    /// Which of the round's items this event reports, from 0.
    pub fn item(&self) -> usize {
        self.item
    }

    /// How many items the round decided (one event each).
    pub fn items(&self) -> usize {
        self.items
    }

    /// The resources of this item: one, or every resource of a `lock_all` lock.
    pub fn resources(&self) -> Resources<'a> {
        Resources {
            items: self.keys.iter(),
        }
    }

    /// The (first) resource of this item.
    pub fn resource(&self) -> &'a [u8] {
        self.keys.first().map_or(&[], |item| item.key)
    }

    /// Every node's outcome in this round, once each, in configuration order.
    pub fn nodes(&self) -> Nodes<'a> {
        Nodes {
            event: self.parts(),
            next: 0,
        }
    }

    /// Node `index`'s outcome (in configuration order); `None` past the last node.
    pub fn node(&self, index: usize) -> Option<NodeOutcome<'a>> {
        self.parts().node(index)
    }

    /// What the round came to for this item.
    pub fn decision(&self) -> Decision {
        self.decision
    }

    /// Nodes needed for a majority.
    pub fn quorum(&self) -> usize {
        self.votes.quorum()
    }

    /// How many nodes had an outcome matching `pred`.
    ///
    /// ```
    /// # fn f(e: &quorumlock::RoundEvent<'_>) -> usize {
    /// e.count(|o| matches!(o, quorumlock::Outcome::Held))
    /// # }
    /// ```
    pub fn count(&self, pred: impl Fn(&Outcome) -> bool) -> usize {
        self.nodes().filter(|n| pred(n.outcome())).count()
    }

    /// The yes votes (locked, extended, released, fenced): those the quorum counts.
    pub fn yes(&self) -> usize {
        self.votes.yes(self.slot)
    }

    /// When the round started (read before its commands were written).
    pub fn started_at(&self) -> Instant {
        self.started
    }

    /// How long the round took to decide this item: to the clock reading after the
    /// batch of replies that decided it (or the timeout); `None` only when it was
    /// decided before any wait (every node down, say) and not timed.
    pub fn elapsed(&self) -> Option<Duration> {
        self.decided
            .map(|at| at.saturating_duration_since(self.started))
    }

    /// An acquire or extend that was won in time: the validity it left when it was
    /// decided, `ttl − elapsed − drift` (what [`Lock::remaining`](crate::Lock::remaining)
    /// was then). `None` for every other decision and phase. For an extend it is what
    /// the new ttl gives; the call still reports the lock expired if its previous
    /// validity ran out before the quorum agreed.
    pub fn validity(&self) -> Option<Duration> {
        self.deadline
            .zip(self.decided)
            .map(|(end, at)| end.saturating_duration_since(at))
    }

    /// With [`RoundEvent::validity`]: the instant the lock stops being valid, which is
    /// the lock's [`Lock::deadline`](crate::Lock::deadline) (for an extend, unless the
    /// call reported the lock expired: see [`Decision::Won`]).
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    fn parts(&self) -> Parts<'a> {
        Parts {
            endpoints: self.endpoints,
            votes: self.votes,
            sessions: self.sessions,
            slot: self.slot,
            replied: self.replied,
        }
    }
}

impl fmt::Debug for RoundEvent<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        struct Keys<'k>(Resources<'k>);
        impl fmt::Debug for Keys<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_list()
                    .entries(self.0.clone().map(crate::error::Escaped))
                    .finish()
            }
        }
        struct All<'k>(Nodes<'k>);
        impl fmt::Debug for All<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_list().entries(self.0.clone()).finish()
            }
        }
        f.debug_struct("RoundEvent")
            .field("phase", &self.phase)
            .field("round", &self.round)
            .field("item", &self.item)
            .field("items", &self.items)
            .field("resources", &Keys(self.resources()))
            .field("decision", &self.decision)
            .field("quorum", &self.quorum())
            .field("elapsed", &self.elapsed())
            .field("validity", &self.validity())
            .field("nodes", &All(self.nodes()))
            .finish()
    }
}

/// What a round event borrows to tell a node's outcome.
#[derive(Clone, Copy)]
struct Parts<'a> {
    endpoints: &'a [Endpoint],
    votes: &'a Round,
    sessions: &'a [Session],
    slot: usize,
    replied: Replied<'a>,
}

/// When an item's votes were handled: which nodes' were during the round (by word of 64
/// nodes), and when (nanoseconds from the round's start, by node).
#[derive(Clone, Copy)]
struct Replied<'a> {
    timed: &'a [u64],
    nanos: &'a [u64],
}

impl<'a> Parts<'a> {
    #[inline]
    fn node(&self, index: usize) -> Option<NodeOutcome<'a>> {
        let endpoint = self.endpoints.get(index)?;
        static NOT_NEEDED: Outcome = Outcome::NotNeeded;
        let outcome = self.votes.vote_ref(index, self.slot).unwrap_or(&NOT_NEEDED);
        let timed = self
            .replied
            .timed
            .get(index / 64)
            .is_some_and(|word| word >> (index % 64) & 1 != 0);
        // A vote recorded without a reply (a timeout's `NoReply`) has no latency.
        let nanos = match (timed, outcome) {
            (false, _) | (_, Outcome::NoReply | Outcome::NotNeeded) => None,
            (true, _) => self.replied.nanos.get(index).copied(),
        };
        Some(NodeOutcome {
            index,
            endpoint,
            outcome,
            nanos,
            written: self.sessions.get(index).is_some_and(|s| s.sent),
        })
    }
}

/// One node's part in a round: its outcome and how long it took.
#[derive(Clone, Copy)]
pub struct NodeOutcome<'a> {
    index: usize,
    endpoint: &'a Endpoint,
    outcome: &'a Outcome,
    nanos: Option<u64>,
    written: bool,
}

impl<'a> NodeOutcome<'a> {
    /// The node's index, in configuration order.
    pub fn index(&self) -> usize {
        self.index
    }

    /// The node.
    pub fn endpoint(&self) -> &'a Endpoint {
        self.endpoint
    }

    /// What it answered, or why it did not (see the module's invariants).
    pub fn outcome(&self) -> &'a Outcome {
        self.outcome
    }

    /// From the round's start to the handling of its reply (or of the failure of its
    /// connection), at the resolution of a batch of replies; `None` when it gave neither
    /// within the round (not asked, `NoReply`, `NotNeeded`).
    #[inline]
    pub fn latency(&self) -> Option<Duration> {
        self.nanos.map(Duration::from_nanos)
    }

    /// Whether the round's command was handed to the node's connection (false for a node
    /// not asked: down, lagging, still connecting, or held back).
    pub fn written(&self) -> bool {
        self.written
    }
}

impl fmt::Debug for NodeOutcome<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeOutcome")
            .field("index", &self.index)
            .field("endpoint", &self.endpoint)
            .field("outcome", &self.outcome)
            .field("latency", &self.latency())
            .field("written", &self.written)
            .finish()
    }
}

/// The nodes of a [`RoundEvent`], in configuration order.
#[derive(Clone)]
pub struct Nodes<'a> {
    event: Parts<'a>,
    next: usize,
}

impl<'a> Iterator for Nodes<'a> {
    type Item = NodeOutcome<'a>;

    #[inline]
    fn next(&mut self) -> Option<NodeOutcome<'a>> {
        let node = self.event.node(self.next)?;
        self.next += 1;
        Some(node)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.event.endpoints.len().saturating_sub(self.next);
        (left, Some(left))
    }
}

impl ExactSizeIterator for Nodes<'_> {}

/// The resources of a [`RoundEvent`].
#[derive(Clone)]
pub struct Resources<'a> {
    items: std::slice::Iter<'a, Item<'a>>,
}

impl<'a> Iterator for Resources<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        self.items.next().map(|item| item.key)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.items.size_hint()
    }
}

impl ExactSizeIterator for Resources<'_> {}

/// A change in a node's standing.
///
/// # Example
///
/// ```
/// use quorumlock::{NodeChange, NodeEvent, Observer};
/// use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
///
/// #[derive(Default)]
/// struct Reconnects(AtomicU64);
///
/// impl Observer for Reconnects {
///     fn node(&self, e: &NodeEvent<'_>) {
///         if let NodeChange::Connected { first: false } = e.change() {
///             self.0.fetch_add(1, Relaxed);
///         }
///     }
/// }
/// # let _ = quorumlock::Redlock::builder().observer(Reconnects::default());
/// ```
#[derive(Clone, Copy, Debug)]
pub struct NodeEvent<'a> {
    node: usize,
    endpoint: &'a Endpoint,
    change: NodeChange<'a>,
}

impl<'a> NodeEvent<'a> {
    /// The node's index, in configuration order.
    pub fn index(&self) -> usize {
        self.node
    }

    /// The node.
    pub fn endpoint(&self) -> &'a Endpoint {
        self.endpoint
    }

    /// What happened.
    pub fn change(&self) -> NodeChange<'a> {
        self.change
    }
}

/// What happened to a node ([`NodeEvent::change`]).
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub enum NodeChange<'a> {
    /// A connection answered its handshake: the node takes part in rounds again.
    /// `first`: the node's first connection; otherwise a reconnect.
    Connected {
        /// Its first connection (not a reconnect).
        first: bool,
    },
    /// The connection failed or was dropped (a connect refused or timed out, a reset, a
    /// close, a reply out of step, a connection reset for lagging too long): the node
    /// is down and is reconnected after a backoff (doubling from 10 ms up to
    /// `max_backoff`); every failed attempt is reported.
    Down(&'a NodeError),
    /// The node owes replies older than `node_timeout` (frozen, stalled, partitioned): it
    /// is neither asked nor waited for until it catches up. Reported once, then
    /// [`NodeChange::CaughtUp`] or [`NodeChange::Down`].
    Lagging,
    /// A node reported lagging answered what it owed and was asked again.
    CaughtUp,
}

/// The observer a [`Builder`](crate::Builder) was given, as [`Settings`](crate::Settings)
/// keep it.
///
/// Asserted unwind-safe, so that a builder and settings stay `UnwindSafe` and
/// `RefUnwindSafe` with an observer as without: the client calls an observer only through
/// `&`, each call behind `catch_unwind` (see `deliver`), and a builder or settings never
/// call it at all.
pub(crate) struct Attached(AssertUnwindSafe<Arc<dyn Observer>>);

impl Attached {
    pub(crate) fn new(observer: impl Observer) -> Attached {
        Attached(AssertUnwindSafe(Arc::new(observer)))
    }

    pub(crate) fn get(&self) -> Arc<dyn Observer> {
        Arc::clone(&self.0)
    }
}

impl Clone for Attached {
    fn clone(&self) -> Attached {
        Attached(AssertUnwindSafe(self.get()))
    }
}

impl fmt::Debug for Attached {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Observer")
    }
}

/// The driver's side of an observer: when the votes of the round in progress were
/// handled (allocated at build, grown only by a round larger than any before), and the
/// calls out, each behind `catch_unwind` and the re-entry guard.
///
/// A batch of events costs a few word operations per slot (bit masks of the nodes that
/// voted since the last batch), and a clock reading only when it recorded a vote and the
/// driver did not read the clock for it already.
pub(crate) struct Watcher {
    observer: Arc<dyn Observer>,
    drift_factor: f64,
    /// The last ttl (whole ms) and its `ttl − drift`.
    safe: (u64, Option<Duration>),
    start: Instant,
    nodes: usize,
    /// Words of 64 nodes: `nodes.div_ceil(64)`.
    words: usize,
    /// The bits of the nodes in the last word.
    last: u64,
    /// Per slot and word (`slot * words + word`): the votes already looked at (at the
    /// round's start, the votes recorded without asking the node).
    seen: Vec<u64>,
    /// Per slot and word: the votes handled during the round, whose time is in `nanos`.
    timed: Vec<u64>,
    /// Per slot and node (`slot * nodes + node`): nanoseconds from `start` to the batch
    /// that recorded the vote; meaningful where `timed` says so.
    nanos: Vec<u64>,
    /// Every vote was looked at and `done_at` is set: a batch has nothing left to do.
    settled: bool,
    /// The clock reading after the batch that decided the whole round.
    done_at: Option<Instant>,
    round: u64,
}

impl Watcher {
    pub(crate) fn new(observer: Arc<dyn Observer>, drift_factor: f64, nodes: usize) -> Watcher {
        let words = nodes.div_ceil(64).max(1);
        Watcher {
            observer,
            drift_factor,
            safe: (0, None),
            start: Instant::now(),
            nodes,
            words,
            last: match nodes % 64 {
                0 => u64::MAX,
                left => (1 << left) - 1,
            },
            seen: Vec::with_capacity(4 * words),
            timed: Vec::with_capacity(4 * words),
            nanos: Vec::with_capacity(4 * nodes),
            settled: false,
            done_at: None,
            round: 0,
        }
    }

    /// A round has begun at `start` (its commands written): votes already recorded were
    /// not replies.
    #[cold]
    #[inline(never)]
    pub(crate) fn begin(&mut self, round: &Round, start: Instant) {
        self.round += 1;
        self.start = start;
        self.done_at = None;
        self.settled = false;
        let slots = round.slots();
        if let (1, [seen], [timed]) = (slots, &mut self.seen[..], &mut self.timed[..]) {
            // Same shape as the last round, one word (the common case).
            *seen = round.voted_word(0, 0);
            *timed = 0;
            return;
        }
        self.seen.clear();
        for slot in 0..slots {
            for word in 0..self.words {
                self.seen.push(round.voted_word(slot, word));
            }
        }
        self.timed.clear();
        self.timed.resize(self.seen.len(), 0);
        if self.nanos.len() < slots * self.nodes {
            self.nanos.resize(slots * self.nodes, 0);
        }
    }

    /// After a batch of events: the votes it recorded are stamped with one clock reading
    /// (`now`, the driver's own when it read the clock after the batch), and so is the
    /// round's end if it came.
    #[cold]
    #[inline(never)]
    pub(crate) fn batch(&mut self, round: &Round, now: Option<Instant>) {
        if self.settled {
            return;
        }
        // One item over at most 64 nodes (the common round): one word to look at.
        let now = match (&mut self.seen[..], &mut self.timed[..]) {
            ([seen], [timed]) => {
                let voted = round.voted_word(0, 0);
                let new = voted & !*seen;
                let now = if new != 0 {
                    *seen = voted;
                    *timed |= new;
                    let now = now.unwrap_or_else(Instant::now);
                    let ns = nanos_since(self.start, now);
                    stamp_bits(&mut self.nanos, new, ns);
                    Some(now)
                } else {
                    now
                };
                self.settled = voted == self.last;
                now
            }
            _ => self.batch_wide(round, now),
        };
        if self.done_at.is_none() && round.is_done() {
            self.done_at = Some(now.unwrap_or_else(Instant::now));
        }
        self.settled &= self.done_at.is_some();
    }

    /// [`Watcher::batch`] for a round of several items, or over more than 64 nodes:
    /// returns the clock reading if one was taken; `settled` says whether every vote was
    /// looked at.
    #[inline(never)]
    fn batch_wide(&mut self, round: &Round, mut now: Option<Instant>) -> Option<Instant> {
        let mut at = None;
        let mut all = true;
        let mut i = 0;
        for slot in 0..self.seen.len() / self.words {
            for word in 0..self.words {
                let voted = round.voted_word(slot, word);
                let (Some(seen), Some(timed)) = (self.seen.get_mut(i), self.timed.get_mut(i))
                else {
                    return now;
                };
                let new = voted & !*seen;
                if new != 0 {
                    *seen = voted;
                    *timed |= new;
                    let ns = *at.get_or_insert_with(|| {
                        nanos_since(self.start, *now.get_or_insert_with(Instant::now))
                    });
                    let from = slot * self.nodes + word * 64;
                    stamp_bits(self.nanos.get_mut(from..).unwrap_or_default(), new, ns);
                }
                let full = if word + 1 == self.words {
                    self.last
                } else {
                    u64::MAX
                };
                all &= voted == full;
                i += 1;
            }
        }
        self.settled = all;
        now
    }

    /// Hands the node changes the engine noted to the observer.
    #[inline]
    pub(crate) fn forward(&self, engine: &mut Engine, endpoints: &[Endpoint]) {
        if engine.has_notes() {
            self.forward_notes(engine, endpoints);
        }
    }

    #[cold]
    #[inline(never)]
    fn forward_notes(&self, engine: &mut Engine, endpoints: &[Endpoint]) {
        for note in engine.drain_notes() {
            let (node, change) = match &note {
                Note::Connected { node, first } => (*node, NodeChange::Connected { first: *first }),
                Note::Down { node, error } => {
                    let cause = match error {
                        NodeError::Down(why) => &**why,
                        other => other,
                    };
                    (*node, NodeChange::Down(cause))
                }
                Note::Lagging { node } => (*node, NodeChange::Lagging),
                Note::CaughtUp { node } => (*node, NodeChange::CaughtUp),
            };
            let Some(endpoint) = endpoints.get(node) else {
                continue;
            };
            let event = NodeEvent {
                node,
                endpoint,
                change,
            };
            deliver(|| self.observer.node(&event));
        }
    }

    /// The round `req` is decided: node changes first, then one event per item.
    #[cold]
    #[inline(never)]
    pub(crate) fn decided(
        &mut self,
        engine: &mut Engine,
        endpoints: &[Endpoint],
        round: &Round,
        req: &Request<'_>,
    ) {
        self.forward(engine, endpoints);
        if self.done_at.is_none() {
            self.done_at = Some(Instant::now());
        }
        let safe = match req.phase {
            Phase::Acquire | Phase::Extend => {
                if self.safe.0 != req.ttl_ms {
                    let ttl = Duration::from_millis(req.ttl_ms);
                    self.safe = (req.ttl_ms, safe_span(ttl, self.drift_factor));
                }
                self.safe.1
            }
            _ => None,
        };
        // The deadline a win gives, `start + safe` (what `acquired_until` checks against).
        let end = safe.and_then(|safe| self.start.checked_add(safe));
        let items = round.slots();
        for slot in 0..items {
            let decided = round.decided_at(slot).or(self.done_at);
            let (decision, deadline) = match round.decision(slot) {
                Core::Won if matches!(req.phase, Phase::Acquire | Phase::Extend) => {
                    match (end, decided) {
                        (Some(end), Some(at)) if at < end => (Decision::Won, Some(end)),
                        _ => (Decision::Expired, None),
                    }
                }
                Core::Won => (Decision::Won, None),
                Core::Taken => (Decision::Taken, None),
                Core::Done if round.answered(slot) >= round.quorum() => (Decision::Released, None),
                Core::Done | Core::Unavailable | Core::Open => (Decision::Unavailable, None),
            };
            let keys = if req.atomic {
                req.items
            } else {
                req.items.get(slot..=slot).unwrap_or(&[])
            };
            let nodes = slot * self.nodes..(slot + 1) * self.nodes;
            let words = slot * self.words..(slot + 1) * self.words;
            let event = RoundEvent {
                phase: req.phase,
                round: self.round,
                item: slot,
                items,
                keys,
                endpoints,
                votes: round,
                sessions: engine.sessions(),
                slot,
                replied: Replied {
                    timed: self.timed.get(words).unwrap_or(&[]),
                    nanos: self.nanos.get(nodes).unwrap_or(&[]),
                },
                decision,
                started: self.start,
                decided,
                deadline,
            };
            deliver(|| self.observer.round(&event));
        }
    }
}

/// Nanoseconds from `start` to `now` (saturating).
fn nanos_since(start: Instant, now: Instant) -> u64 {
    u64::try_from(now.saturating_duration_since(start).as_nanos()).unwrap_or(u64::MAX)
}

/// Sets `nanos[n]` to `ns` for every bit `n` of `bits`.
#[inline]
fn stamp_bits(nanos: &mut [u64], mut bits: u64, ns: u64) {
    while bits != 0 {
        if let Some(n) = nanos.get_mut(bits.trailing_zeros() as usize) {
            *n = ns;
        }
        bits &= bits - 1;
    }
}

thread_local! {
    /// Set while an observer method runs on this thread.
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

/// Calls an observer method: marked as inside an observer for its duration (see
/// [`refuse_reentry`]), its panic caught.
fn deliver(f: impl FnOnce()) {
    /// Restores the mark however `deliver` is left.
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            let outer = self.0;
            INSIDE.with(|inside| inside.set(outer));
        }
    }
    let _restore = Restore(INSIDE.with(|inside| inside.replace(true)));
    // The client's state is consistent whenever an observer is called (between events,
    // never in the middle of one), and the observer sees it only through `&`: nothing
    // it can break by unwinding.
    if let Err(payload) = catch_unwind(AssertUnwindSafe(f)) {
        drop_payload(payload);
    }
}

/// Drops a caught panic's payload, whose own `Drop` may panic too (`panic_any` of
/// anything): that second panic is caught as well, and its payload leaked rather than
/// dropped, so that nothing unwinds into the client.
#[cold]
#[inline(never)]
fn drop_payload(payload: Box<dyn std::any::Any + Send>) {
    if let Err(again) = catch_unwind(AssertUnwindSafe(move || drop(payload))) {
        std::mem::forget(again);
    }
}

/// Panics when called from inside an observer method: the shared client's requests
/// would wait for the loop that is running the observer.
#[inline]
pub(crate) fn refuse_reentry() {
    if INSIDE.with(Cell::get) {
        reentered();
    }
}

#[cold]
#[inline(never)]
fn reentered() -> ! {
    panic!(
        "quorumlock: a SharedRedlock request was made from inside an Observer method; \
         it would wait for the loop that runs the observer (a deadlock): refused"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panicking_observer_is_contained_and_the_guard_restored() {
        deliver(|| panic!("observer bug"));
        assert!(!INSIDE.with(Cell::get));
        deliver(|| {
            assert!(INSIDE.with(Cell::get));
            let reentry = catch_unwind(refuse_reentry);
            assert!(reentry.is_err());
        });
        refuse_reentry();
    }

    #[test]
    fn a_panic_whose_payload_panics_when_dropped_is_contained_too() {
        struct Bomb;
        impl Drop for Bomb {
            fn drop(&mut self) {
                panic!("payload dropped");
            }
        }
        deliver(|| std::panic::panic_any(Bomb));
        assert!(!INSIDE.with(Cell::get));
        let mut later = false;
        deliver(|| later = true);
        assert!(later);
    }
}
