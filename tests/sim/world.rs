//! The simulated world: a global virtual clock, simulated Redis nodes ([`SimNode`]) each on
//! its own clock, and several Redlock clients, each its own [`Engine`] over its own
//! [`SimTransport`], contending for a few resources. Every choice is drawn from one seed.
//!
//! # What is modelled
//!
//! - Time: one global clock in nanoseconds. Every node and every client reads its own
//!   clock, `offset + rate × global`; client rates are within ±0.25 % and node rates
//!   within ±0.5 % of the global rate, so any node runs at most 0.76 % faster than any
//!   client: inside the drift factor (1 %) the clients are configured with.
//! - Connections: one per (client, node), made by the engine through
//!   [`Transport::open`]. Bytes a client writes reach the node after the connection's
//!   latency, in order; the node's replies come back the same way. A read hands out what
//!   has arrived, often only part of it (a split anywhere); the rest raises a new
//!   readiness edge, as it would arriving later. A write may take only part of the bytes
//!   (the rest waits for a writable edge). A connection the client closes still delivers
//!   what was written before the close, then the node closes its side (a stale SET may
//!   still apply: the hazard the engine's chase of releases exists for).
//! - Faults, all seeded: slow links (latency above `node_timeout`), reply spikes (one
//!   reply delayed past `node_timeout`), freezes (the node processes nothing, its
//!   kernel still accepts connections and buffers bytes), resets (both sides see the
//!   connection close, bytes in flight are lost), restarts that lose every key and the
//!   script cache. In [`Mode::Safe`] a restarted node stays down (connections refused)
//!   for longer than any ttl, the delayed restart of `docs/GUARANTEES.md`; in [`Mode::UnsafeRestart`] a
//!   node that holds a live lock's key, on a bare majority, restarts empty at once.
//! - Clients: acquire (up to [`MAX_ATTEMPTS`] attempts, 1 to 5 ms apart), hold, then
//!   extend, unlock, or abandon the lock to expire (a client that crashed in its critical
//!   section), once or twice each; a failed attempt calls `release_lost` on what it
//!   wrote, and a next attempt held back for those deletes is released at
//!   `Engine::hold_until` as the driver does. The rules for a lock's validity are `Redlock::attempt`'s and
//!   `Redlock::extend`'s (`quorum::safe_span`, `quorum::deadline`). Patient waiters and
//!   abandoned locks put acquisitions right at the expiry boundary: a validity
//!   overstated by 1 ms is caught within a few hundred seeds. In half the scenarios the
//!   clients take fenced locks, as `Redlock` does with fencing on: the acquire reads the
//!   counters, the fence (largest counted counter + 1) is written back, and the lock is
//!   used only if a majority confirmed it in time (else it is released).
//! - `lock_all`: with two resources, a quarter of the locks are a `lock_all` of both, as
//!   `Redlock::lock_all` makes it: one atomic `script::ACQUIRE` over both keys per node
//!   (fenced too: the counters of both read, one fence written back over both), its
//!   extend one `EXTEND_ALL`, its unlock one `RELEASE_ALL` (fenced: `RELEASE_FENCED`
//!   over both), a lost attempt's deletes one per key. It contends with single locks of
//!   either resource and holds a validity window on each.
//! - Leases: a third of the single locks are leases, kept as the shared client's loop
//!   keeps them (its event loop does real I/O, so its arithmetic is taken from the pure
//!   `lease::renewal` it calls): renewed (an extend round) a third of the ttl after each
//!   term's start, 1 to 4 times; a renewal too few nodes answered is retried after a
//!   pause while validity remains; the lease is lost when a renewal is refused or won too
//!   late, or at its deadline (2 ms before it, as the loop reports); then released.
//! - Unlocks with deletes in flight: an unlock returns at a majority, its other deletes
//!   still in flight, and the client's next acquire follows within 3 ms; a node that lags
//!   (frozen, slow) when the unlock begins gets its delete queued behind its stale SET or
//!   extend, not waited for. Both are counted, with floors.
//!
//! # Invariants, checked as the world runs (a violation panics with the seed)
//!
//! - A slot is won only with yes votes of distinct nodes reaching the quorum, each from
//!   a node that really held that key with that token at some point (so no reply of
//!   another round, slot or client was counted).
//! - A lock's deadline is `start + ttl − drift` on the client's clock, and it was
//!   decided before it. An extend or a lease renewal gives a new deadline only when a
//!   quorum confirmed it in time: won before the lock's current deadline and before the
//!   new one, which is the round's `start + ttl − drift` (`quorum::extended_until`, and
//!   `lease::renewal`'s next renewal a third of the ttl after that start); otherwise the
//!   deadline never lengthens.
//! - A `lock_all`'s yes votes each come from a node that held every key of the set with
//!   its token: all or none.
//! - Every node the SET (or extend) was handed to gets the compare-and-delete after a
//!   lost attempt or an unlock (a lagging node's queued behind its stale write): its
//!   exact bytes are handed to that node's connection later, unless that connection
//!   broke meanwhile (then it could not be sent).
//! - Each engine's buffers stay under a fixed bound.
//! - Across all clients, no two validity windows of one resource overlap in global
//!   time (windows mapped from each client's clock rounded outwards; a `lock_all` has one
//!   on each resource, a lease one that each renewal moves), in
//!   [`Mode::Safe`]; in [`Mode::UnsafeRestart`] overlaps are counted instead.
//! - Fences of one resource rise strictly in the order the locks were handed out, unless
//!   a node restarted empty between the two (it lost its counters: a lower fence is then
//!   counted, the limit `src/fencing.rs` documents) or in [`Mode::UnsafeRestart`].

use crate::check::{Hold, overlaps};
use crate::node::{ConnId, SimNode, SimTime};
use quorumlock::__private::core::command::{Arg, Command, KeyList, encode, eval_over};
use quorumlock::__private::core::engine::{
    Active, Engine, Fencing, Item, Received, Request, Timing, Transport, chases,
};
use quorumlock::__private::core::quorum::{
    acquired_until, deadline, extended_until, quorum, safe_span,
};
use quorumlock::__private::core::round::{Decision, Round};
use quorumlock::__private::core::script::{RELEASE_ALL, RELEASE_FENCED};
use quorumlock::__private::core::session::Login;
use quorumlock::__private::core::token::{Token, TokenSource};
use quorumlock::__private::lease::{Renewal, renew_at, renewal};
use quorumlock::{Limits, NodeError, Outcome, Phase};
use std::collections::{HashSet, VecDeque};
use std::io::ErrorKind;
use std::time::{Duration, Instant};

/// Nanoseconds per microsecond.
pub const US: SimTime = 1_000;
/// Nanoseconds per millisecond.
pub const MS: SimTime = 1_000_000;
/// The clients' drift factor.
pub const DRIFT: f64 = 0.01;
/// The resources clients contend for.
pub const RESOURCES: [&[u8]; 2] = [b"sim:a", b"sim:b"];
/// Bytes an engine's buffers may grow beyond what they held when it was built.
pub const BUFFER_SLACK: usize = 64 * 1024;
/// Attempts per lock before a client gives up: patient enough to be there when a
/// lock it waits for expires.
pub const MAX_ATTEMPTS: u32 = 6;
/// Global time after which a scenario that has not finished is a bug (livelock).
const HORIZON: SimTime = 20_000 * MS;
/// Steps after which a scenario that has not finished is a bug.
const MAX_STEPS: u64 = 1_000_000;

/// Whether nodes may restart empty while a lock depends on them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Restarts keep the node down for longer than any ttl: no overlap may happen.
    Safe,
    /// Once per scenario, a node holding a live lock's key on a bare majority restarts
    /// empty at once: overlaps are possible, and counted.
    UnsafeRestart,
    /// The same restarts, with every client's restart guard longer than any ttl: no
    /// overlap may happen.
    GuardedRestart,
}

/// A clock that reads `offset + rate × global` nanoseconds.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    offset: SimTime,
    rate: f64,
}

impl Clock {
    /// This clock's reading at global time `g`.
    pub fn local(&self, g: SimTime) -> SimTime {
        self.offset + (g as f64 * self.rate) as SimTime
    }

    /// A global time at which this clock reads at least `local` (rounded late): the
    /// end of a window, mapped conservatively, or when a local timer fires.
    pub fn global(&self, local: SimTime) -> SimTime {
        if local <= self.offset {
            return 0;
        }
        ((local - self.offset) as f64 / self.rate).ceil() as SimTime + 1
    }
}

/// Counters over one or many scenarios.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    pub scenarios: u64,
    pub steps: u64,
    pub attempts: u64,
    pub locks: u64,
    /// Attempts decided `Taken`: another client held a blocking minority.
    pub contended: u64,
    pub unavailable: u64,
    /// Won, but too late to be valid.
    pub expired: u64,
    pub extends: u64,
    pub extends_failed: u64,
    pub unlocks: u64,
    /// Locks left to expire, never unlocked.
    pub abandoned: u64,
    pub freezes: u64,
    pub resets: u64,
    pub restarts: u64,
    pub slow_links: u64,
    pub spikes: u64,
    pub partial_writes: u64,
    pub split_reads: u64,
    pub round_timeouts: u64,
    /// Acquires that held their writes back for the last lost attempt's deletes.
    pub held_acquires: u64,
    /// Releases owed to a node and seen handed to its connection.
    pub releases_sent: u64,
    /// Releases owed to a node whose connection broke before they could go.
    pub releases_excused: u64,
    pub max_buffer_growth: usize,
    /// Overlapping windows found (only ever non-zero in [`Mode::UnsafeRestart`]).
    pub overlaps: u64,
    /// The smallest seed that showed an overlap.
    pub overlap_seed: Option<u64>,
    pub unsafe_restarts: u64,
    /// Yes votes the restart guard did not count ([`Mode::GuardedRestart`]).
    pub guard_held: u64,
    /// Yes votes of the restarted node counted once it was older than the guard
    /// ([`Mode::GuardedRestart`]).
    pub guard_passed: u64,
    /// Fenced locks handed out (their write-back confirmed in time).
    pub fenced: u64,
    /// Fenced acquires whose write-back was not confirmed in time (released).
    pub fence_failed: u64,
    /// Fenced locks whose fence was not above an earlier lock's on the resource, in a
    /// scenario where a node restarted empty (counters are lost with it; see
    /// `src/fencing.rs`). Without a restart, such a lock fails the scenario.
    pub fence_order_lost: u64,
    /// `lock_all` attempts (both resources in one atomic command per node).
    pub lock_all_attempts: u64,
    /// `lock_all` locks granted (both resources held).
    pub lock_alls: u64,
    /// Extends (of a lock or a lease) won only after the lock's deadline had passed:
    /// refused by `quorum::extended_until`.
    pub extends_late: u64,
    /// Leases taken (locks then kept by renewals every ttl/3).
    pub leases: u64,
    /// Lease renewals that gave a new deadline.
    pub lease_renewals: u64,
    /// Lease renewals too few nodes answered, tried again.
    pub lease_retries: u64,
    /// Leases lost (a renewal refused, or the deadline reached without one).
    pub leases_lost: u64,
    /// Acquires begun right after an unlock while some node still owed a reply (the
    /// unlock's deletes beyond its majority, still in flight or queued behind a stale
    /// write).
    pub acquires_behind_unlock: u64,
    /// Unlock deletes queued behind a lagging node's stale write (not waited for).
    pub deletes_behind_lag: u64,
}

impl Stats {
    pub fn add(&mut self, o: &Stats) {
        self.scenarios += o.scenarios;
        self.steps += o.steps;
        self.attempts += o.attempts;
        self.locks += o.locks;
        self.contended += o.contended;
        self.unavailable += o.unavailable;
        self.expired += o.expired;
        self.extends += o.extends;
        self.extends_failed += o.extends_failed;
        self.unlocks += o.unlocks;
        self.abandoned += o.abandoned;
        self.freezes += o.freezes;
        self.resets += o.resets;
        self.restarts += o.restarts;
        self.slow_links += o.slow_links;
        self.spikes += o.spikes;
        self.partial_writes += o.partial_writes;
        self.split_reads += o.split_reads;
        self.round_timeouts += o.round_timeouts;
        self.held_acquires += o.held_acquires;
        self.releases_sent += o.releases_sent;
        self.releases_excused += o.releases_excused;
        self.max_buffer_growth = self.max_buffer_growth.max(o.max_buffer_growth);
        self.overlaps += o.overlaps;
        self.overlap_seed = match (self.overlap_seed, o.overlap_seed) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.unsafe_restarts += o.unsafe_restarts;
        self.guard_held += o.guard_held;
        self.guard_passed += o.guard_passed;
        self.fenced += o.fenced;
        self.fence_failed += o.fence_failed;
        self.fence_order_lost += o.fence_order_lost;
        self.lock_all_attempts += o.lock_all_attempts;
        self.lock_alls += o.lock_alls;
        self.extends_late += o.extends_late;
        self.leases += o.leases;
        self.lease_renewals += o.lease_renewals;
        self.lease_retries += o.lease_retries;
        self.leases_lost += o.leases_lost;
        self.acquires_behind_unlock += o.acquires_behind_unlock;
        self.deletes_behind_lag += o.deletes_behind_lag;
    }

    /// Faults injected, all kinds.
    pub fn faults(&self) -> u64 {
        self.freezes
            + self.resets
            + self.restarts
            + self.slow_links
            + self.spikes
            + self.partial_writes
            + self.split_reads
            + self.unsafe_restarts
    }
}

// ---------------------------------------------------------------------------------------
// The transport

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ConnState {
    /// The SYN is in flight; resolved at this global time.
    Connecting(SimTime),
    Open(ConnId),
    Refused,
}

/// One client-side connection to one node, with the bytes in flight both ways.
#[derive(Debug)]
struct Conn {
    state: ConnState,
    /// One-way latency.
    lat: SimTime,
    to_node: VecDeque<(SimTime, Vec<u8>)>,
    last_up: SimTime,
    from_node: VecDeque<(SimTime, Vec<u8>)>,
    last_down: SimTime,
    /// Arrived and not read yet: `arrived[read..]`.
    arrived: Vec<u8>,
    read: usize,
    /// The node's side is gone (closed, reset, restarted): nothing more is delivered.
    broken: bool,
    /// When the client sees the close.
    fin_at: Option<SimTime>,
    /// The close has arrived (after every byte before it).
    fin: bool,
    /// A readable edge is pending.
    edge: bool,
    /// The connect was resolved (established or refused): an event is pending.
    wake: bool,
    writable_at: Option<SimTime>,
}

/// The engine's [`Transport`] for one client: in-memory pipes to the nodes, the client's
/// clock at the world's current global time.
pub struct SimTransport {
    now: SimTime,
    clock: Clock,
    base: Instant,
    rng: fastrand::Rng,
    conns: Vec<Option<Conn>>,
    /// Connections the client closed whose written bytes are still on their way.
    zombies: Vec<(usize, Conn)>,
    /// Every byte handed to each node's connections, in order, across connections.
    sent: Vec<Vec<u8>>,
    /// Connections to each node closed by the engine.
    closes: Vec<u32>,
    /// Releases written whole in one write, by node: (hash of the token, where in
    /// `sent`). The obligation check looks here first, and searches `sent` only for
    /// releases written in pieces.
    releases: Vec<Vec<(u128, usize)>>,
    p_partial_write: f64,
    p_split_read: f64,
    p_slow_link: f64,
    stats: Stats,
}

impl SimTransport {
    fn instant(&self) -> Instant {
        self.base + Duration::from_nanos(self.clock.local(self.now))
    }

    fn local_of(&self, i: Instant) -> SimTime {
        i.duration_since(self.base).as_nanos() as SimTime
    }

    /// The readiness event pending for `node`, if any: (readable, closed).
    fn take_event(&mut self, node: usize) -> Option<(bool, bool)> {
        let now = self.now;
        let conn = self.conns[node].as_mut()?;
        let readable = std::mem::take(&mut conn.edge);
        let woke = std::mem::take(&mut conn.wake);
        let writable = conn.writable_at.is_some_and(|t| t <= now);
        if writable {
            conn.writable_at = None;
        }
        if !(readable || woke || writable) {
            return None;
        }
        let refused = conn.state == ConnState::Refused;
        Some((readable || refused, conn.fin || refused))
    }
}

impl Transport for SimTransport {
    fn now(&mut self) -> Instant {
        self.instant()
    }

    fn open(&mut self, node: usize) -> Result<(), NodeError> {
        self.close_conn(node);
        let mut lat = self.rng.u64(20 * US..200 * US);
        if self.rng.f64() < self.p_slow_link {
            lat = self.rng.u64(MS..4 * MS);
            self.stats.slow_links += 1;
        }
        self.conns[node] = Some(Conn {
            state: ConnState::Connecting(self.now + 2 * lat),
            lat,
            to_node: VecDeque::new(),
            last_up: 0,
            from_node: VecDeque::new(),
            last_down: 0,
            arrived: Vec::new(),
            read: 0,
            broken: false,
            fin_at: None,
            fin: false,
            edge: false,
            wake: false,
            writable_at: None,
        });
        Ok(())
    }

    fn close(&mut self, node: usize) {
        self.close_conn(node);
    }

    fn established(&mut self, node: usize) -> Result<bool, NodeError> {
        match self.conns[node].as_ref().map(|c| c.state) {
            Some(ConnState::Open(_)) => Ok(true),
            Some(ConnState::Connecting(_)) => Ok(false),
            Some(ConnState::Refused) => Err(refused()),
            None => Err(NodeError::Closed),
        }
    }

    fn write(&mut self, node: usize, bytes: &[u8]) -> Result<usize, NodeError> {
        let now = self.now;
        let Some(conn) = self.conns[node].as_mut() else {
            return Err(NodeError::Closed);
        };
        match conn.state {
            ConnState::Connecting(_) => return Ok(0),
            ConnState::Refused => return Err(refused()),
            ConnState::Open(_) => {}
        }
        if conn.fin {
            return Err(NodeError::Io(ErrorKind::BrokenPipe, "broken pipe".into()));
        }
        if bytes.is_empty() {
            return Ok(0);
        }
        let mut n = bytes.len();
        if self.rng.f64() < self.p_partial_write {
            n = self.rng.usize(0..bytes.len());
            self.stats.partial_writes += 1;
            conn.writable_at = Some(now + self.rng.u64(5 * US..100 * US));
        }
        if n > 0 {
            let at = self.sent[node].len();
            if n == bytes.len() && n > 34 && bytes.starts_with(b"*5\r\n$4\r\nEVAL\r\n") {
                let token = &bytes[n - 34..n - 2];
                self.releases[node].push((tag(token), at));
            }
            self.sent[node].extend_from_slice(&bytes[..n]);
            if !conn.broken {
                let at = (now + conn.lat + self.rng.u64(0..=conn.lat / 4)).max(conn.last_up);
                conn.last_up = at;
                conn.to_node.push_back((at, bytes[..n].to_vec()));
            }
        }
        Ok(n)
    }

    fn read(&mut self, node: usize, buf: &mut [u8]) -> Result<Received, NodeError> {
        let Some(conn) = self.conns[node].as_mut() else {
            return Err(NodeError::Closed);
        };
        match conn.state {
            ConnState::Connecting(_) => return Ok(Received::Nothing),
            ConnState::Refused => return Err(refused()),
            ConnState::Open(_) => {}
        }
        let avail = conn.arrived.len() - conn.read;
        if avail == 0 {
            return Ok(if conn.fin {
                Received::Closed
            } else {
                Received::Nothing
            });
        }
        let mut k = avail;
        if avail > 1 && self.rng.f64() < self.p_split_read {
            k = self.rng.usize(1..avail);
            self.stats.split_reads += 1;
        }
        let k = k.min(buf.len());
        if k == 0 {
            return Ok(Received::Nothing);
        }
        buf[..k].copy_from_slice(&conn.arrived[conn.read..conn.read + k]);
        conn.read += k;
        if conn.read == conn.arrived.len() {
            conn.arrived.clear();
            conn.read = 0;
        } else {
            // The rest "arrives" later: a new edge.
            conn.edge = true;
        }
        Ok(Received::Bytes(k))
    }
}

impl SimTransport {
    fn close_conn(&mut self, node: usize) {
        if let Some(mut conn) = self.conns[node].take() {
            self.closes[node] += 1;
            // Whatever the node still sends is discarded: only the bytes written go on.
            conn.from_node.clear();
            conn.fin_at = None;
            conn.writable_at = None;
            if matches!(conn.state, ConnState::Open(_)) && !conn.broken {
                self.zombies.push((node, conn));
            }
        }
    }
}

fn refused() -> NodeError {
    NodeError::Io(ErrorKind::ConnectionRefused, "connection refused".into())
}

// ---------------------------------------------------------------------------------------
// Clients

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// Starts its next operation at this global time.
    Idle(SimTime),
    /// A round is in progress; times out at this global time.
    Round {
        start: Instant,
        timeout: SimTime,
    },
    /// Holds the lock until this global time, then extends or unlocks.
    Holding(SimTime),
    Done,
}

#[derive(Clone, Debug)]
struct Held {
    token: Token,
    deadline: Instant,
    written: u64,
    /// Indices into the world's holds: one per resource held (two for a `lock_all`).
    holds: Vec<usize>,
    /// A lease: kept by renewals (see [`LeaseTerm`]) instead of one extend.
    lease: Option<LeaseTerm>,
    /// Each node's close count when the SET was handed over.
    closes: Vec<u32>,
    extended: bool,
    /// Its fence, once written back.
    fence: Option<u64>,
}

/// A lease's renewals, as the shared client's loop keeps them
/// (`quorumlock::__private::lease`, the loop's own arithmetic).
#[derive(Clone, Copy, Debug)]
struct LeaseTerm {
    /// When to renew next, on the client's clock.
    next: Instant,
    /// Renewals left before the holder releases the lease.
    left: u32,
}

/// The items of a round on `res`; with `multi` (a `lock_all`), the other resource too.
fn items(res: usize, multi: bool, token: &Token) -> ([Item<'_>; 2], usize) {
    let item = |r: usize| Item {
        key: RESOURCES[r],
        token,
    };
    ([item(res), item(1 - res)], if multi { 2 } else { 1 })
}

/// The resources of a round on `res` (with `multi`, both).
fn keys(res: usize, multi: bool) -> impl Iterator<Item = usize> + Clone {
    [res, 1 - res].into_iter().take(if multi { 2 } else { 1 })
}

/// A round's request, as `Redlock` makes it: a `lock_all`'s rounds are atomic.
fn request<'a>(
    phase: Phase,
    ttl_ms: u64,
    items: &'a [Item<'a>],
    chase: u64,
    fencing: Fencing,
) -> Request<'a> {
    Request {
        fencing,
        atomic: items.len() > 1,
        ..Request::new(phase, ttl_ms, items, chase)
    }
}

struct Client {
    engine: Engine,
    transport: SimTransport,
    round: Round,
    tokens: TokenSource,
    rng: fastrand::Rng,
    /// The token of the current round's items (the resource is `res`).
    token: Token,
    res: usize,
    /// The current lock is a `lock_all` of both resources (`res` first).
    multi: bool,
    /// The last operation was an unlock (its deletes beyond the majority may be in
    /// flight when the next acquire begins).
    unlocked: bool,
    phase: Phase,
    /// What the current round does with fence counters.
    fencing: Fencing,
    ttl_ms: u64,
    chase: u64,
    stage: Stage,
    lock: Option<Held>,
    /// A lock won by a fenced acquire, waiting for its fence write-back: its fence, and
    /// the global time the acquire was decided (the write-back starts then).
    fence: Option<(u64, SimTime)>,
    /// Takes fenced locks.
    fenced: bool,
    ops_left: u32,
    attempt: u32,
    /// Close counts and sent positions when the current round began.
    round_closes: Vec<u32>,
    round_sent: Vec<usize>,
    buffered_base: usize,
    /// The earliest global time anything of this client (its timers, its connections'
    /// bytes) is due; 0 after a fault touched it.
    due: SimTime,
}

impl Client {
    fn on_event(&mut self, node: usize, readable: bool, closed: bool) {
        let Client {
            engine,
            transport,
            round,
            token,
            res,
            multi,
            phase,
            ttl_ms,
            chase,
            stage,
            fencing,
            ..
        } = self;
        if matches!(stage, Stage::Round { .. }) && !round.is_done() {
            let (items, n) = items(*res, *multi, token);
            let req = request(*phase, *ttl_ms, &items[..n], *chase, *fencing);
            let mut active = Active { round, req: &req };
            engine.on_event(transport, node, readable, closed, Some(&mut active));
        } else {
            engine.on_event(transport, node, readable, closed, None);
        }
    }

    /// At the client's time, past [`Engine::hold_until`]: the round stops waiting for the
    /// last lost attempt's deletes (what the driver does when its wait ends).
    fn release_held(&mut self) {
        let Client {
            engine,
            transport,
            round,
            token,
            res,
            multi,
            phase,
            ttl_ms,
            chase,
            stage,
            fencing,
            ..
        } = self;
        if !matches!(stage, Stage::Round { .. }) || round.is_done() {
            return;
        }
        let (items, n) = items(*res, *multi, token);
        let req = request(*phase, *ttl_ms, &items[..n], *chase, *fencing);
        let mut active = Active { round, req: &req };
        let now = transport.instant();
        engine.release_held(transport, &mut active, now);
    }

    /// A lock just handed out: held for a while (up to past its deadline), or, for a
    /// lease, until its first renewal.
    fn hold_after_lock(&mut self, now: SimTime, safe: Duration) {
        let lease = self.lock.as_ref().and_then(|l| l.lease);
        self.stage = match lease {
            Some(lease) => {
                let at = self
                    .transport
                    .clock
                    .global(self.transport.local_of(lease.next));
                Stage::Holding(at.max(now))
            }
            None => Stage::Holding(now + self.rng.u64(0..safe.as_nanos() as SimTime * 6 / 5)),
        };
    }

    fn begin(&mut self, phase: Phase, token: Token, chase: u64, node_timeout: Duration) {
        self.phase = phase;
        self.chase = chase;
        let held_fence = self.lock.as_ref().and_then(|l| l.fence);
        self.fencing = match (phase, self.fenced, self.fence, held_fence) {
            (Phase::Acquire, true, _, _) => Fencing::Read,
            (Phase::Fence, _, Some((fence, _)), _) => Fencing::Write(fence),
            // A fenced lock's release raises the counters where it deletes the key.
            (Phase::Release, _, _, Some(fence)) => Fencing::Write(fence),
            _ => Fencing::Off,
        };
        self.token = token;
        self.round_closes.clone_from(&self.transport.closes);
        self.round_sent.clear();
        self.round_sent
            .extend(self.transport.sent.iter().map(Vec::len));
        let start = self.transport.instant();
        let Client {
            engine,
            transport,
            round,
            token,
            res,
            multi,
            ttl_ms,
            fencing,
            ..
        } = self;
        let (items, n) = items(*res, *multi, token);
        let req = request(phase, *ttl_ms, &items[..n], chase, *fencing);
        let mut active = Active { round, req: &req };
        engine.begin(transport, &mut active, start);
        let local_end = transport.local_of(start) + node_timeout.as_nanos() as SimTime;
        self.stage = Stage::Round {
            start,
            timeout: transport.clock.global(local_end),
        };
    }
}

// ---------------------------------------------------------------------------------------
// The world

struct NodeBox {
    node: SimNode,
    clock: Clock,
    frozen_until: SimTime,
    down_until: SimTime,
}

#[derive(Clone, Copy, Debug)]
enum Fault {
    Freeze { node: usize, dur: SimTime },
    Reset { client: usize, node: usize },
    Restart { node: usize },
}

/// A compare-and-delete owed to a node.
struct Owed {
    client: usize,
    node: usize,
    /// The exact bytes of the release.
    release: Vec<u8>,
    /// Where to look for it in the client's stream to the node.
    from: usize,
    /// The node's close count when the key was written.
    closes: u32,
}

/// One seeded scenario.
pub struct World {
    seed: u64,
    mode: Mode,
    rng: fastrand::Rng,
    now: SimTime,
    nodes: Vec<NodeBox>,
    clients: Vec<Client>,
    resources: usize,
    node_timeout: Duration,
    restart_delay: SimTime,
    p_spike: f64,
    faults: VecDeque<(SimTime, Fault)>,
    holds: Vec<Hold<usize>>,
    /// (node, resource, hash of a value) ever seen set on a node.
    observed: HashSet<(usize, usize, u128)>,
    /// Per node, each resource's value as last observed.
    seen: Vec<[Option<u128>; RESOURCES.len()]>,
    owed: Vec<Owed>,
    stats: Stats,
    unsafe_done: bool,
    /// Every fenced lock granted: (resource, global time its acquire was decided, global
    /// time it was handed out, fence).
    fences: Vec<(usize, SimTime, SimTime, u64)>,
    /// Global times of every restart that emptied a node.
    restarts_at: Vec<SimTime>,
    /// [`Mode::GuardedRestart`]: after the unsafe restart, the clients start nothing new
    /// until this time (past the guard), then lock twice more each, so the restarted
    /// node is seen to count again once old enough; and that node.
    resume_at: Option<(SimTime, usize)>,
    /// The clients' restart guard, in global nanoseconds.
    guard_ns: SimTime,
}

/// Notes every (resource, value) `node` holds at `now`.
/// `last` holds what was seen there before, so the set is touched only on a change.
fn observe(
    observed: &mut HashSet<(usize, usize, u128)>,
    last: &mut [Option<u128>; RESOURCES.len()],
    node: usize,
    n: &SimNode,
    now: SimTime,
) {
    for (r, key) in RESOURCES.iter().enumerate() {
        let v = n.value(0, key, now).map(tag);
        if v != last[r] {
            last[r] = v;
            if let Some(v) = v {
                observed.insert((node, r, v));
            }
        }
    }
}

/// A value's first 16 bytes: tokens are random hex, so this tells them apart.
fn tag(bytes: &[u8]) -> u128 {
    let mut b = [0u8; 16];
    let n = bytes.len().min(16);
    b[..n].copy_from_slice(&bytes[..n]);
    u128::from_le_bytes(b)
}

impl World {
    /// The scenario of `seed`, with every parameter drawn from it.
    pub fn new(seed: u64, mode: Mode, base: Instant) -> World {
        let mut rng = fastrand::Rng::with_seed(seed);
        let n = if rng.bool() { 3 } else { 5 };
        let clients = rng.usize(2..=4);
        let resources = if mode != Mode::Safe {
            1
        } else {
            rng.usize(1..=RESOURCES.len())
        };
        let mut ttl_ms = rng.u64(15..=40);
        let node_timeout = Duration::from_micros(rng.u64(2_000..=4_000));
        // Half the scenarios take fenced locks; their ttl is at least 4 × node_timeout,
        // as `Redlock` requires with fencing on.
        let fencing = rng.bool();
        if fencing {
            ttl_ms = ttl_ms.max(4 * node_timeout.as_millis() as u64 + 1);
        }
        let faulty = rng.u8(0..4) != 0;
        let p = |rng: &mut fastrand::Rng, p: f64| if faulty && rng.bool() { p } else { 0.0 };
        let p_partial_write = p(&mut rng, 0.2);
        let p_split_read = p(&mut rng, 0.3);
        let p_slow_link = p(&mut rng, 0.05);
        let p_spike = p(&mut rng, 0.03);
        let nodes = (0..n)
            .map(|i| {
                let mut node = SimNode::new(seed.wrapping_mul(31).wrapping_add(i as u64));
                // A deployment in use before the scenario: each node has the marker an
                // earlier client of the restart guard wrote (a restart loses it).
                let conn = node.accept();
                let marker = format!("earlier-client-node-{i}");
                let set = format!(
                    "*3\r\n$3\r\nSET\r\n$17\r\nquorumlock:marker\r\n${}\r\n{marker}\r\n",
                    marker.len()
                );
                node.feed(conn, set.as_bytes(), 0);
                node.close(conn);
                NodeBox {
                    node,
                    clock: Clock {
                        offset: rng.u64(0..1 << 40),
                        rate: 1.0 + (rng.f64() - 0.5) * 0.01,
                    },
                    frozen_until: 0,
                    down_until: 0,
                }
            })
            .collect();
        let mut faults = Vec::new();
        if faulty {
            for _ in 0..rng.usize(0..=3) {
                let at = rng.u64(0..80 * MS);
                let fault = match rng.u8(0..10) {
                    0..=3 => Fault::Freeze {
                        node: rng.usize(0..n),
                        dur: if rng.bool() {
                            rng.u64(MS..10 * MS)
                        } else {
                            rng.u64(10 * MS..60 * MS)
                        },
                    },
                    4..=7 => Fault::Reset {
                        client: rng.usize(0..clients),
                        node: rng.usize(0..n),
                    },
                    _ if mode == Mode::Safe => Fault::Restart {
                        node: rng.usize(0..n),
                    },
                    _ => Fault::Freeze {
                        node: rng.usize(0..n),
                        dur: rng.u64(MS..5 * MS),
                    },
                };
                faults.push((at, fault));
            }
        }
        faults.sort_by_key(|f| f.0);
        let timing = Timing {
            node_timeout,
            connect_timeout: Duration::from_millis(10),
            max_backoff: Duration::from_millis(20),
            limits: Limits::default(),
            // Longer than any ttl (40 ms) on any clock.
            // The longest ttl plus one second, as the library's docs ask (a node's
            // `uptime_in_seconds` can overstate by up to a second).
            restart_guard: if mode == Mode::GuardedRestart {
                Duration::from_millis(ttl_ms + 1000)
            } else {
                Duration::ZERO
            },
        };
        let clients = (0..clients)
            .map(|ci| {
                let clock = Clock {
                    offset: rng.u64(0..1 << 40),
                    rate: 1.0 + (rng.f64() - 0.5) * 0.005,
                };
                let mut transport = SimTransport {
                    now: 0,
                    clock,
                    base,
                    rng: fastrand::Rng::with_seed(rng.u64(..)),
                    conns: (0..n).map(|_| None).collect(),
                    zombies: Vec::new(),
                    sent: vec![Vec::new(); n],
                    closes: vec![0; n],
                    releases: vec![Vec::new(); n],
                    p_partial_write,
                    p_split_read,
                    p_slow_link,
                    stats: Stats::default(),
                };
                let now = transport.instant();
                // With the guard on, each client writes its own marker where a node
                // has none (after a restart).
                let logins = (0..n)
                    .map(|i| Login {
                        marker: (!timing.restart_guard.is_zero()).then(|| {
                            let mut m = [b'0'; 32];
                            m[..16].copy_from_slice(format!("{ci:016x}").as_bytes());
                            m[16..].copy_from_slice(format!("{i:016x}").as_bytes());
                            m
                        }),
                        ..Login::default()
                    })
                    .collect();
                let mut engine = Engine::new(logins, timing, now);
                engine.maintain(&mut transport, now);
                let buffered_base = engine.buffered();
                Client {
                    engine,
                    transport,
                    round: Round::default(),
                    tokens: TokenSource::from_seed(rng.u64(..), rng.u64(..)),
                    rng: fastrand::Rng::with_seed(rng.u64(..) ^ ci as u64),
                    token: Token::from_bits(0),
                    res: 0,
                    multi: false,
                    unlocked: false,
                    phase: Phase::Acquire,
                    fencing: Fencing::Off,
                    ttl_ms,
                    chase: 0,
                    stage: Stage::Idle(rng.u64(0..8 * MS)),
                    lock: None,
                    fence: None,
                    fenced: fencing,
                    ops_left: rng.u32(1..=2),
                    attempt: 0,
                    round_closes: vec![0; n],
                    round_sent: vec![0; n],
                    buffered_base,
                    due: 0,
                }
            })
            .collect();
        World {
            seed,
            mode,
            rng,
            now: 0,
            nodes,
            clients,
            resources,
            node_timeout,
            // Longer than any key can live on a node clock 0.5 % slow.
            restart_delay: ttl_ms * MS * 21 / 20 + 5 * MS,
            p_spike,
            faults: faults.into(),
            holds: Vec::new(),
            observed: HashSet::new(),
            seen: vec![[None; RESOURCES.len()]; n],
            owed: Vec::new(),
            stats: Stats::default(),
            unsafe_done: false,
            fences: Vec::new(),
            restarts_at: Vec::new(),
            resume_at: None,
            guard_ns: if mode == Mode::GuardedRestart {
                (ttl_ms + 1000) * MS
            } else {
                0
            },
        }
    }

    /// Runs the scenario to its end; returns its counters. Panics, naming the seed, on
    /// any violated invariant (except overlaps in [`Mode::UnsafeRestart`], counted).
    pub fn run(mut self) -> Stats {
        let mut steps = 0u64;
        loop {
            steps += 1;
            assert!(
                steps < MAX_STEPS && self.now < HORIZON,
                "seed {}: the scenario does not end (step {steps}, t = {} ns)",
                self.seed,
                self.now
            );
            self.apply_faults();
            for ci in 0..self.clients.len() {
                if self.clients[ci].due <= self.now {
                    self.deliver(ci);
                    self.client_step(ci);
                    self.due(ci);
                }
            }
            if self.mode != Mode::Safe && self.maybe_unsafe_restart() {
                for ci in 0..self.clients.len() {
                    self.due(ci);
                }
            }
            match self.next_time() {
                Some(t) => self.now = t.max(self.now + 1),
                None => break,
            }
        }
        self.stats.steps = steps;
        self.finish()
    }

    fn finish(mut self) -> Stats {
        let seed = self.seed;
        for c in &self.clients {
            assert_eq!(c.stage, Stage::Done, "seed {seed}: a client did not finish");
        }
        // Every release owed was handed to its node, unless the connection broke.
        for o in &self.owed {
            let t = &self.clients[o.client].transport;
            let token = tag(&o.release[o.release.len() - 34..o.release.len() - 2]);
            let whole = t.releases[o.node]
                .iter()
                .any(|&(h, at)| h == token && at >= o.from);
            // Written in pieces: look where commands start.
            let stream = &t.sent[o.node][o.from..];
            let pieces =
                || memchr::memchr_iter(b'*', stream).any(|at| stream[at..].starts_with(&o.release));
            if whole || pieces() {
                self.stats.releases_sent += 1;
            } else if t.closes[o.node] > o.closes {
                self.stats.releases_excused += 1;
            } else {
                panic!(
                    "seed {seed}: client {} never sent node {} the compare-and-delete it owes \
                     (its connection stayed up)",
                    o.client, o.node
                );
            }
        }
        self.check_fences();
        let found = overlaps(&self.holds);
        if self.mode != Mode::UnsafeRestart {
            if let Some(o) = found.first() {
                panic!(
                    "seed {seed}: two validity windows overlap: {:?} and {:?} share [{}, {}) ns",
                    self.holds[o.earlier], self.holds[o.later], o.from, o.to
                );
            }
        }
        self.stats.overlaps = found.len() as u64;
        if !found.is_empty() {
            self.stats.overlap_seed = Some(seed);
        }
        self.stats.scenarios = 1;
        for c in &self.clients {
            self.stats.add(&c.transport.stats);
        }
        self.stats
    }

    fn apply_faults(&mut self) {
        while self.faults.front().is_some_and(|f| f.0 <= self.now) {
            let (_, fault) = self.faults.pop_front().unwrap();
            for c in &mut self.clients {
                c.due = 0;
            }
            match fault {
                Fault::Freeze { node, dur } => {
                    let nb = &mut self.nodes[node];
                    nb.frozen_until = nb.frozen_until.max(self.now + dur);
                    self.stats.freezes += 1;
                }
                Fault::Reset { client, node } => {
                    let now = self.now;
                    let t = &mut self.clients[client].transport;
                    if let Some(conn) = t.conns[node].as_mut() {
                        if let (ConnState::Open(id), false) = (conn.state, conn.broken) {
                            self.nodes[node].node.close(id);
                            conn.to_node.clear();
                            conn.from_node.clear();
                            conn.broken = true;
                            conn.fin_at = Some(now + conn.lat);
                            self.stats.resets += 1;
                        }
                    }
                }
                Fault::Restart { node } => {
                    self.restart(node, self.restart_delay);
                    self.stats.restarts += 1;
                }
            }
        }
    }

    /// Restarts `node` empty, down for `delay`: every connection to it is reset.
    fn restart(&mut self, node: usize, delay: SimTime) {
        let now = self.now;
        self.restarts_at.push(now);
        let nb = &mut self.nodes[node];
        let node_now = nb.clock.local(now);
        nb.node.restart(node_now);
        nb.down_until = now + delay;
        nb.frozen_until = 0;
        for c in &mut self.clients {
            let t = &mut c.transport;
            t.zombies.retain(|(n, _)| *n != node);
            if let Some(conn) = t.conns[node].as_mut() {
                if matches!(conn.state, ConnState::Open(_)) && !conn.broken {
                    conn.to_node.clear();
                    conn.broken = true;
                    conn.fin_at = Some((now + conn.lat).max(conn.last_down));
                }
            }
        }
    }

    /// Moves `ci`'s bytes: client → node (the node runs them), node → client, connects.
    fn deliver(&mut self, ci: usize) {
        let now = self.now;
        let spike = self.p_spike;
        let nt = self.node_timeout.as_nanos() as SimTime;
        {
            let t = &mut self.clients[ci].transport;
            for node in 0..self.nodes.len() {
                let nb = &mut self.nodes[node];
                let Some(conn) = t.conns[node].as_mut() else {
                    continue;
                };
                if let ConnState::Connecting(at) = conn.state {
                    if at > now {
                        continue;
                    }
                    conn.state = if nb.down_until > now {
                        ConnState::Refused
                    } else {
                        ConnState::Open(nb.node.accept())
                    };
                    conn.wake = true;
                }
                let ConnState::Open(id) = conn.state else {
                    continue;
                };
                if nb.frozen_until <= now && nb.down_until <= now {
                    while conn.to_node.front().is_some_and(|d| d.0 <= now) && !conn.broken {
                        let (_, bytes) = conn.to_node.pop_front().unwrap();
                        let node_now = nb.clock.local(now);
                        let fed = nb.node.feed(id, &bytes, node_now);
                        observe(
                            &mut self.observed,
                            &mut self.seen[node],
                            node,
                            &nb.node,
                            node_now,
                        );
                        let mut lat = conn.lat + t.rng.u64(0..=conn.lat / 4);
                        if t.rng.f64() < spike {
                            lat += t.rng.u64(nt..3 * nt);
                            self.stats.spikes += 1;
                        }
                        let at = (now + lat).max(conn.last_down);
                        if !fed.reply.is_empty() {
                            conn.last_down = at;
                            conn.from_node.push_back((at, fed.reply));
                        }
                        if fed.closed.is_some() {
                            conn.broken = true;
                            conn.to_node.clear();
                            conn.fin_at = Some(at);
                        }
                    }
                }
                while conn.from_node.front().is_some_and(|d| d.0 <= now) {
                    let (_, bytes) = conn.from_node.pop_front().unwrap();
                    conn.arrived.extend_from_slice(&bytes);
                    conn.edge = true;
                }
                if !conn.fin && conn.from_node.is_empty() && conn.fin_at.is_some_and(|f| f <= now) {
                    conn.fin = true;
                    conn.edge = true;
                }
            }
            // Connections the client closed: deliver what was written, then close.
            let nodes = &mut self.nodes;
            let seen = &mut self.seen;
            t.zombies.retain_mut(|(node, conn)| {
                let nb = &mut nodes[*node];
                let ConnState::Open(id) = conn.state else {
                    return false;
                };
                if nb.down_until > now {
                    return false;
                }
                if nb.frozen_until > now {
                    return true;
                }
                while conn.to_node.front().is_some_and(|d| d.0 <= now) {
                    let (_, bytes) = conn.to_node.pop_front().unwrap();
                    let node_now = nb.clock.local(now);
                    nb.node.feed(id, &bytes, node_now);
                    observe(
                        &mut self.observed,
                        &mut seen[*node],
                        *node,
                        &nb.node,
                        node_now,
                    );
                }
                if conn.to_node.is_empty() {
                    nb.node.close(id);
                    return false;
                }
                true
            });
        }
    }

    /// The next global time anything is due: a fault, or some client's [`World::due`].
    fn next_time(&self) -> Option<SimTime> {
        let clients = self.clients.iter().map(|c| c.due);
        let next = self
            .faults
            .front()
            .map(|f| f.0)
            .into_iter()
            .chain(clients)
            .min()?;
        (next != SimTime::MAX).then_some(next)
    }

    /// Recomputes when client `ci` next has something due: a timer, or its connections'
    /// bytes, connects, closes and writable edges.
    fn due(&mut self, ci: usize) {
        let nodes = &self.nodes;
        let c = &mut self.clients[ci];
        let t = &c.transport;
        let mut due = match c.stage {
            Stage::Idle(t) | Stage::Holding(t) => t,
            // A round holding its writes for the last lost attempt's deletes stops
            // waiting for them in time.
            Stage::Round { timeout, .. } => match c.engine.hold_until() {
                Some(until) => timeout.min(t.clock.global(t.local_of(until))),
                None => timeout,
            },
            Stage::Done => SimTime::MAX,
        };
        let conns = t
            .conns
            .iter()
            .enumerate()
            .filter_map(|(i, c)| c.as_ref().map(|c| (i, c)))
            .chain(t.zombies.iter().map(|(i, c)| (*i, c)));
        for (node, conn) in conns {
            if let ConnState::Connecting(t) = conn.state {
                due = due.min(t);
            }
            if let Some(d) = conn.to_node.front() {
                due = due.min(d.0.max(nodes[node].frozen_until));
            }
            if let Some(d) = conn.from_node.front() {
                due = due.min(d.0);
            }
            if let (Some(f), false) = (conn.fin_at, conn.fin) {
                due = due.min(f);
            }
            if let Some(w) = conn.writable_at {
                due = due.min(w);
            }
        }
        c.due = due;
    }

    fn client_step(&mut self, ci: usize) {
        let seed = self.seed;
        let n = self.nodes.len();
        let c = &mut self.clients[ci];
        c.transport.now = self.now;
        let mut rounds = 0;
        loop {
            let mut any = false;
            for node in 0..n {
                if let Some((readable, closed)) = c.transport.take_event(node) {
                    any = true;
                    c.on_event(node, readable, closed);
                }
            }
            if !any {
                break;
            }
            rounds += 1;
            assert!(rounds < 100_000, "seed {seed}: events never stop");
        }
        let c = &mut self.clients[ci];
        if c.engine
            .hold_until()
            .is_some_and(|until| c.transport.instant() >= until)
        {
            c.release_held();
        }
        loop {
            let c = &mut self.clients[ci];
            match c.stage {
                Stage::Round { timeout, .. } => {
                    let now = c.transport.instant();
                    if c.round.has_unstamped() {
                        c.round.stamp(now);
                    }
                    if !c.round.is_done() {
                        if self.now < timeout {
                            break;
                        }
                        c.round.time_out(now);
                        self.stats.round_timeouts += 1;
                    }
                    self.finish_round(ci);
                }
                Stage::Idle(t) if t <= self.now => self.start_op(ci),
                Stage::Holding(t) if t <= self.now => self.after_hold(ci),
                _ => break,
            }
        }
        let c = &self.clients[ci];
        let growth = c.engine.buffered().saturating_sub(c.buffered_base);
        assert!(
            growth <= BUFFER_SLACK,
            "seed {seed}: client {ci}'s buffers grew by {growth} bytes"
        );
        self.stats.max_buffer_growth = self.stats.max_buffer_growth.max(growth);
    }

    fn start_op(&mut self, ci: usize) {
        let nt = self.node_timeout;
        let resources = self.resources;
        let resume = self.resume_at.map(|(at, _)| at).filter(|&at| self.now < at);
        let c = &mut self.clients[ci];
        if let Some(at) = resume {
            c.stage = Stage::Idle(at);
            return;
        }
        if c.ops_left == 0 {
            c.stage = Stage::Done;
            return;
        }
        if c.attempt == 0 {
            c.res = c.rng.usize(0..resources);
            // With two resources, a quarter of the locks are a `lock_all` of both.
            c.multi = resources == 2 && c.rng.u8(0..4) == 0;
        }
        c.attempt += 1;
        let token = c.tokens.next_token().unwrap();
        self.stats.attempts += 1;
        if c.multi {
            self.stats.lock_all_attempts += 1;
        }
        if std::mem::take(&mut c.unlocked) && c.engine.sessions().iter().any(|s| s.owed() > 0) {
            self.stats.acquires_behind_unlock += 1;
        }
        c.begin(Phase::Acquire, token, 0, nt);
        if c.engine.hold_until().is_some() {
            self.stats.held_acquires += 1;
        }
    }

    fn after_hold(&mut self, ci: usize) {
        let nt = self.node_timeout;
        let now = self.now;
        let c = &mut self.clients[ci];
        let lock = c.lock.as_ref().expect("holding without a lock");
        let valid = c.transport.instant() < lock.deadline;
        if let Some(lease) = lock.lease {
            // The shared client's loop: lost at its deadline (reported `LOST_EARLY`, 2 ms,
            // before it), else renewed while renewals are left, else released.
            let lost = c.transport.instant() + Duration::from_millis(2) >= lock.deadline;
            if lost {
                self.stats.leases_lost += 1;
            } else if lease.left > 0 {
                let token = lock.token.clone();
                c.begin(Phase::Extend, token, 0, nt);
                return;
            } else if c.rng.bool() {
                // The holder's process dies after its last renewal: nothing releases the
                // lease, which ends with its renewed deadline; the others, patient, take
                // the keys right after.
                c.lock = None;
                c.ops_left -= 1;
                c.stage = Stage::Idle(now + c.rng.u64(0..3 * MS));
                self.stats.abandoned += 1;
                return;
            }
            self.unlock(ci, now);
            return;
        }
        match c.rng.u8(0..12) {
            0..=3 if valid && !lock.extended => {
                let token = lock.token.clone();
                c.begin(Phase::Extend, token, 0, nt);
                return;
            }
            // Never unlocked (the client lost interest, or crashed in the critical
            // section): the lock ends with its deadline, the keys with their ttl, and the
            // others, patient, take it right after.
            4..=6 => {
                c.lock = None;
                c.ops_left -= 1;
                c.stage = Stage::Idle(now + c.rng.u64(0..3 * MS));
                self.stats.abandoned += 1;
                return;
            }
            _ => {}
        }
        self.unlock(ci, now);
    }

    fn unlock(&mut self, ci: usize, now: SimTime) {
        let nt = self.node_timeout;
        let c = &mut self.clients[ci];
        let lock = c.lock.as_ref().expect("unlock without a lock");
        for &h in &lock.holds {
            let h = &mut self.holds[h];
            h.valid_until = h.valid_until.min(now);
        }
        let (token, written) = (lock.token.clone(), lock.written);
        c.begin(Phase::Release, token, written, nt);
        // Nodes written the lock's SET or an extend that lag: the delete is queued behind
        // the stale write there, not waited for.
        self.stats.deletes_behind_lag += (0..self.nodes.len())
            .filter(|&node| {
                chases(written, node)
                    && c.round.vote(node, 0) == Some(Outcome::Failed(NodeError::Lagging))
            })
            .count() as u64;
    }

    /// Owes `node`s in `mask` the compare-and-delete of the current item.
    fn owe(&mut self, ci: usize, mask: u64, closes: &[u32]) {
        let c = &self.clients[ci];
        // A lost attempt deletes each of its keys, one command each.
        for r in keys(c.res, c.multi) {
            let mut release = Vec::new();
            encode(
                &mut release,
                Command::release(false),
                RESOURCES[r],
                &c.token,
            );
            for (node, &closes) in closes.iter().enumerate() {
                if chases(mask, node) {
                    self.owed.push(Owed {
                        client: ci,
                        node,
                        release: release.clone(),
                        from: c.transport.sent[node].len(),
                        closes,
                    });
                }
            }
        }
    }

    /// The yes votes of a won slot: at least a quorum, of distinct nodes, each from a node
    /// that held this key with this token (for a `lock_all`, every key of the set: all or
    /// none).
    fn check_won(&self, ci: usize) {
        let seed = self.seed;
        let c = &self.clients[ci];
        let n = self.nodes.len();
        let token = tag(c.token.as_bytes());
        let yes: Vec<usize> = (0..n)
            .filter(|&node| c.round.vote(node, 0) == Some(Outcome::Locked))
            .collect();
        assert!(
            yes.len() >= quorum(n) && c.round.yes(0) == yes.len(),
            "seed {seed}: client {ci} won {:?} with yes votes from {yes:?} (tally {})",
            c.phase,
            c.round.yes(0)
        );
        for &node in &yes {
            for r in keys(c.res, c.multi) {
                assert!(
                    self.observed.contains(&(node, r, token)),
                    "seed {seed}: client {ci}'s {:?} counted a yes from node {node}, which never \
                     held the key of resource {r} with its token{}",
                    c.phase,
                    if c.multi { " (a lock_all)" } else { "" }
                );
            }
        }
    }

    fn finish_round(&mut self, ci: usize) {
        let seed = self.seed;
        let now = self.now;
        let c = &mut self.clients[ci];
        let Stage::Round { start, .. } = c.stage else {
            unreachable!()
        };
        // Every decision is stamped but a release that a majority answered (the lock is
        // free, and no one reads its time: see `core::round`); a release's time is not
        // read below.
        let unstamped_release =
            c.phase == Phase::Release && c.round.answered(0) >= c.round.quorum();
        let decided = match c.round.decided_at(0) {
            Some(at) => at,
            None if unstamped_release => start,
            None => panic!("seed {seed}: client {ci}: a decision was not stamped"),
        };
        let ttl = Duration::from_millis(c.ttl_ms);
        let decision = c.round.decision(0);
        match c.phase {
            Phase::Acquire => {
                self.stats.guard_held += c
                    .round
                    .outcomes(0)
                    .filter(|o| matches!(o, Outcome::Failed(NodeError::YoungerThanGuard { .. })))
                    .count() as u64;
                if let Some((at, victim)) = self.resume_at {
                    if now >= at && c.round.vote(victim, 0) == Some(Outcome::Locked) {
                        self.stats.guard_passed += 1;
                    }
                }
                if decision == Decision::Won {
                    self.check_won(ci);
                }
                let c = &mut self.clients[ci];
                let safe = safe_span(ttl, DRIFT).expect("ttl within drift");
                // The library's own verdict (`Redlock::try_lock` uses the same function).
                if let Some(end) = acquired_until(decision, decided, start, Some(safe)) {
                    let limit = deadline(start, ttl, DRIFT).unwrap();
                    assert!(
                        end <= limit,
                        "seed {seed}: deadline past start + ttl − drift"
                    );
                    assert!(
                        end <= start + ttl - quorumlock::__private::core::quorum::drift(ttl, DRIFT)
                    );
                    let valid_until = c.transport.clock.global(c.transport.local_of(end));
                    // One window per resource: a `lock_all` holds both until its deadline.
                    let mut holds = Vec::new();
                    for resource in keys(c.res, c.multi) {
                        holds.push(self.holds.len());
                        self.holds.push(Hold {
                            client: ci,
                            resource,
                            acquired_at: now,
                            valid_until,
                        });
                    }
                    // A third of the single locks are leases: renewed every ttl/3 as the
                    // shared client's loop does, a few times, then released.
                    let lease = (!c.multi && c.rng.u8(0..3) == 0).then(|| LeaseTerm {
                        next: renew_at(start, ttl),
                        left: c.rng.u32(1..=4),
                    });
                    c.lock = Some(Held {
                        token: c.token.clone(),
                        deadline: end,
                        written: c.engine.written(),
                        holds,
                        lease,
                        closes: c.round_closes.clone(),
                        extended: false,
                        fence: None,
                    });
                    c.attempt = 0;
                    self.stats.locks += 1;
                    self.stats.lock_alls += u64::from(c.multi);
                    self.stats.leases += u64::from(lease.is_some());
                    if c.fenced {
                        // The fence: the largest counter among the counted yes votes,
                        // plus one, written back before the lock may be used.
                        let counter = c.round.counter(0).unwrap_or_else(|| {
                            panic!("seed {seed}: a fenced acquire won without a counter")
                        });
                        c.fence = Some((counter + 1, now));
                        let token = c.token.clone();
                        c.begin(Phase::Fence, token, 0, self.node_timeout);
                        return;
                    }
                    c.hold_after_lock(now, safe);
                    return;
                }
                match decision {
                    Decision::Won => self.stats.expired += 1,
                    Decision::Taken => self.stats.contended += 1,
                    _ => self.stats.unavailable += 1,
                }
                let written = c.engine.written();
                let closes = c.round_closes.clone();
                self.owe(ci, written, &closes);
                let c = &mut self.clients[ci];
                let Client {
                    engine,
                    transport,
                    token,
                    res,
                    multi,
                    ..
                } = c;
                let (items, n) = items(*res, *multi, token);
                engine.release_lost(transport, &items[..n], &[0, 1][..n]);
                if c.attempt >= MAX_ATTEMPTS {
                    c.attempt = 0;
                    c.ops_left -= 1;
                }
                let wait = c
                    .tokens
                    .jitter(Duration::from_millis(3), Duration::from_millis(2));
                c.stage = Stage::Idle(now + wait.as_nanos() as SimTime);
            }
            Phase::Extend => {
                if decision == Decision::Won {
                    self.check_won(ci);
                }
                let c = &mut self.clients[ci];
                let written = c.engine.written();
                let lock = c.lock.as_mut().unwrap();
                lock.extended = true;
                lock.written |= written;
                let current = lock.deadline;
                if decision == Decision::Won && decided >= current {
                    self.stats.extends_late += 1;
                }
                // A new deadline only from a quorum that confirmed it in time: before the
                // lock's deadline, and before the new one, which is the round's start +
                // ttl − drift.
                let what = if lock.lease.is_some() {
                    "a lease renewal"
                } else {
                    "Redlock::extend"
                };
                let good = |end: Instant| {
                    assert!(
                        decision == Decision::Won
                            && decided < current
                            && Some(end) == deadline(start, ttl, DRIFT)
                            && decided < end,
                        "seed {seed}: client {ci}: an extend ({}) gave a new deadline {} ms \
                         after its start, decided {:?} ({} ms after its start, the lock's \
                         deadline {} ms after it)",
                        what,
                        end.duration_since(start).as_secs_f64() * 1e3,
                        decision,
                        decided.duration_since(start).as_secs_f64() * 1e3,
                        current.saturating_duration_since(start).as_secs_f64() * 1e3,
                    );
                };
                // Whatever the verdict, the lock never lengthens but by a good extend.
                let shorter = |keep: Instant| {
                    assert!(keep <= current, "seed {seed}: a failed extend lengthened");
                };
                if let Some(lease) = lock.lease.as_mut() {
                    // A lease's renewal: the shared client's loop's own verdict.
                    let nt = self.node_timeout;
                    let pause = (ttl / 10).clamp(nt, nt.max(Duration::from_millis(3)));
                    let at = c.transport.instant();
                    let verdict = renewal(decision, decided, start, at, ttl, DRIFT, current, pause);
                    match verdict {
                        Renewal::Renewed {
                            deadline: end,
                            next,
                        } => {
                            good(end);
                            assert_eq!(next, renew_at(start, ttl), "seed {seed}");
                            lock.deadline = end;
                            lease.next = next;
                            lease.left -= 1;
                            self.stats.lease_renewals += 1;
                        }
                        Renewal::Retry {
                            deadline: keep,
                            next,
                        } => {
                            shorter(keep);
                            assert!(
                                !matches!(decision, Decision::Won | Decision::Taken),
                                "seed {seed}: a decided renewal retried"
                            );
                            lock.deadline = keep;
                            lease.next = next;
                            self.stats.lease_retries += 1;
                        }
                        Renewal::Lost { deadline: keep } => {
                            shorter(keep);
                            lock.deadline = keep;
                            self.stats.leases_lost += 1;
                        }
                    }
                    let lost = !matches!(verdict, Renewal::Renewed { .. } | Renewal::Retry { .. });
                    let end = c
                        .transport
                        .clock
                        .global(c.transport.local_of(lock.deadline));
                    for &h in &lock.holds {
                        let h = &mut self.holds[h];
                        h.valid_until = if matches!(verdict, Renewal::Renewed { .. }) {
                            end
                        } else {
                            h.valid_until.min(end.max(now))
                        };
                    }
                    if lost {
                        self.unlock(ci, now);
                    } else {
                        let next = c.transport.clock.global(c.transport.local_of(lease.next));
                        c.stage = Stage::Holding(next.max(now));
                    }
                    return;
                }
                // The library's own verdict (`Redlock::extend` uses the same function).
                let verdict = extended_until(decision, decided, start, ttl, DRIFT, current);
                match verdict {
                    Ok(end) => {
                        good(end);
                        lock.deadline = end;
                        let end = c.transport.clock.global(c.transport.local_of(end));
                        for &h in &lock.holds {
                            self.holds[h].valid_until = end;
                        }
                        self.stats.extends += 1;
                        let safe = safe_span(ttl, DRIFT).unwrap();
                        let hold_for = c.rng.u64(0..safe.as_nanos() as SimTime);
                        c.stage = Stage::Holding(now + hold_for);
                    }
                    Err(keep) => {
                        shorter(keep);
                        lock.deadline = keep;
                        let end = c.transport.clock.global(c.transport.local_of(keep));
                        for &h in &lock.holds {
                            let h = &mut self.holds[h];
                            h.valid_until = h.valid_until.min(end.max(now));
                        }
                        self.stats.extends_failed += 1;
                        self.unlock(ci, now);
                    }
                }
            }
            Phase::Release => {
                let lock = c.lock.take().unwrap();
                let chase = c.chase;
                self.stats.unlocks += 1;
                // Owed from where the stream stood when the unlock began: the release as
                // `Redlock::unlock` sends it (a `lock_all`'s one script over its keys).
                let item = Item {
                    key: RESOURCES[c.res],
                    token: &c.token,
                };
                let keys = keys(c.res, c.multi).map(|r| RESOURCES[r]);
                let token = Arg::Bytes(item.token.as_bytes());
                let mut release = Vec::new();
                match lock.fence {
                    Some(fence) => eval_over(
                        &mut release,
                        RELEASE_FENCED,
                        keys,
                        KeyList::Both,
                        &[token, Arg::Int(fence)],
                    ),
                    None if c.multi => {
                        eval_over(&mut release, RELEASE_ALL, keys, KeyList::Locks, &[token]);
                    }
                    None => encode(&mut release, Command::release(false), item.key, item.token),
                }
                for node in 0..self.nodes.len() {
                    if chases(chase, node) {
                        self.owed.push(Owed {
                            client: ci,
                            node,
                            release: release.clone(),
                            from: c.round_sent[node],
                            closes: lock.closes[node],
                        });
                    }
                }
                c.ops_left -= 1;
                c.unlocked = true;
                c.stage = Stage::Idle(now + c.rng.u64(0..3 * MS));
            }
            Phase::Fence => {
                let (fence, decided) = c.fence.take().expect("a write-back without a fence");
                let lock = c.lock.as_ref().expect("a write-back without a lock");
                // As `Redlock` does: the lock is handed out only if a majority confirmed
                // its fence while it was still valid; otherwise it is released.
                if decision == Decision::Won && c.transport.instant() < lock.deadline {
                    for r in keys(c.res, c.multi) {
                        self.fences.push((r, decided, now, fence));
                    }
                    if let Some(lock) = c.lock.as_mut() {
                        lock.fence = Some(fence);
                    }
                    self.stats.fenced += 1;
                    let safe = safe_span(ttl, DRIFT).expect("ttl within drift");
                    c.hold_after_lock(now, safe);
                } else {
                    self.stats.fence_failed += 1;
                    self.unlock(ci, now);
                }
            }
            other => panic!("seed {seed}: the sim runs no {other:?} round"),
        }
    }

    /// Fences rise strictly, per resource, in the order the locks were handed out. A node
    /// that restarted empty between the earlier lock's write-back and the later lock's
    /// hand-out lost its counters: then a lower fence is counted (the documented limit),
    /// not a failure; so is any in [`Mode::UnsafeRestart`], where two holders can overlap.
    fn check_fences(&mut self) {
        let seed = self.seed;
        let mut fences = self.fences.clone();
        fences.sort_by_key(|&(res, _, handed, _)| (res, handed));
        for pair in fences.windows(2) {
            let ((r0, decided0, t0, f0), (r1, _, t1, f1)) = (pair[0], pair[1]);
            if r0 != r1 || f1 > f0 {
                continue;
            }
            // An unsafe restart breaks exclusivity itself: two holders at once can read
            // the same counter. Only the guarded and safe modes promise the order.
            let restarted = self.restarts_at.iter().any(|&t| decided0 <= t && t <= t1);
            assert!(
                restarted || self.mode == Mode::UnsafeRestart,
                "seed {seed}: resource {r0}: the lock handed out at {t1} ns has fence {f1}, \
                 not above {f0} of the one handed out at {t0} ns, and no node restarted \
                 between them"
            );
            self.stats.fence_order_lost += 1;
        }
    }

    /// Once per scenario: a node holding a live lock's key, when only a bare majority
    /// holds it, restarts empty at once.
    fn maybe_unsafe_restart(&mut self) -> bool {
        if self.unsafe_done {
            return false;
        }
        let q = quorum(self.nodes.len());
        for ci in 0..self.clients.len() {
            let c = &self.clients[ci];
            let Some(lock) = &c.lock else { continue };
            if c.transport.instant() >= lock.deadline {
                continue;
            }
            let holders: Vec<usize> = (0..self.nodes.len())
                .filter(|&i| {
                    let nb = &self.nodes[i];
                    nb.node.value(0, RESOURCES[c.res], nb.clock.local(self.now))
                        == Some(lock.token.as_bytes())
                })
                .collect();
            if holders.len() == q {
                let victim = holders[self.rng.usize(0..holders.len())];
                self.restart(victim, 0);
                self.unsafe_done = true;
                self.stats.unsafe_restarts += 1;
                if self.mode == Mode::GuardedRestart {
                    self.resume_at = Some((self.now + self.guard_ns + 100 * MS, victim));
                    for c in &mut self.clients {
                        c.ops_left += 2;
                    }
                }
                return true;
            }
        }
        false
    }
}
