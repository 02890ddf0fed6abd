//! The world around the core, as a model to explore exhaustively: simulated Redis servers
//! (`tests/sim/node.rs`, the byte-level node of the simulation), clients that each run the
//! production [`Engine`] and [`Round`] through a [`Transport`] of in-memory connections,
//! and discrete time. Every choice is an [`Action`]; the explorer takes each in turn.
//!
//! # What is modelled
//!
//! - Time: global ticks of [`TICK`] (25 ms), up to [`Config::ticks`], and where a
//!   configuration allows them ([`Config::edges`]), steps to the next instant at a
//!   validity edge before the next tick ([`Action::Edge`]: a key's expiry on its server's
//!   clock, the last nanosecond of a holder's window, a round's time-out), so that a window
//!   a millisecond too long is seen. Each clock (client
//!   or server) reads `offset + rate × global` with its own rate in per mille: clients
//!   run slow or exact, servers exact or fast (`Config::client_rates`, `server_rates`),
//!   within the drift factor [`DRIFT`] the clients use. Keys expire on each server's own
//!   clock (the node works in whole milliseconds, as Redis does).
//! - Connections: one per (client, endpoint), in order both ways, as TCP gives. Each
//!   write is one message to the server; each reply batch one message back. Actions:
//!   a server runs the next message of any connection (so the order in which a server
//!   handles different connections is every order), a client reads the next reply (any
//!   time: a reply may wait past `node_timeout`, a client may pause), a connection is
//!   accepted, time ticks.
//! - Faults, bounded per config: a connection lost with everything in flight
//!   (`Config::resets`), a server restarting empty at any time (`Config::restarts`: keys,
//!   fence counters, script cache and connections lost, a new run id, uptime from zero), with
//!   the clients' restart guard on or off. A frozen server, or a paused client, is one
//!   that takes no action while time ticks: every such schedule is explored already.
//! - Clients run what `Redlock::lock` (retries), `Redlock::unlock` and, with fencing,
//!   `Redlock::fence_lock` run, with the library's own functions for each verdict
//!   (`acquired_until`, `safe_span`): begin a round, feed readiness events, stamp
//!   decisions, time the round out at `node_timeout` on the client's clock, stop holding
//!   an acquire back at `Engine::hold_until`, `release_lost` after a lost attempt.
//!   A release or fence round ends when decided and no write is pending, as the driver's.
//! - Endpoints map to servers (`Config::endpoints`): two endpoints of one server are an
//!   alias, which the engine must count once.
//! - Bounds that make a longer horizon fit: `Config::urgent` (time moves only once nothing
//!   is in flight) except on the connections of `Config::late`; a fixed prefix of actions
//!   (`Config::prefix`) explored from; clients that begin no earlier than a tick
//!   (`Config::begin_from`).
//!
//! Not modelled (the random simulation `tests/sim.rs` covers them): partial writes and
//! split reads, refused connects and servers that stay down, extends, lease renewals,
//! `lock_all` (batches: neither; they are tested against redis-server).
//!
//! # Properties
//!
//! Always (every state): no two validity windows of one resource overlap in global time
//! (unless a server restarted empty with the guard off: then it is the counterexample,
//! a "sometimes"); fenced locks' fences rise strictly in the order of their windows (no
//! restart: counters are lost with one, `src/fencing.rs`); a slot is won only with yes
//! votes from at least a quorum of distinct servers, each of which held that key with
//! that token (no reply counted for another round, slot or client); after a lost attempt
//! or an unlock, every connection the SET went out on is written the compare-and-delete
//! (unless the world broke that connection), judged on every state where a client is idle
//! or done with nothing left unwritten, and on every finished trace; buffers and messages
//! in flight stay bounded.

use crate::explore::Fingerprinter;
use crate::node::{ConnId, SimNode};
use quorumlock::__private::core::command::FENCE_PREFIX;
use quorumlock::__private::core::engine::{
    Active, Engine, Fencing, Item, Received, Request, Timing, Transport, chases,
};
use quorumlock::__private::core::quorum::{acquired_until, next_fence, safe_span};
use quorumlock::__private::core::round::{Decision, Round};
use quorumlock::__private::core::session::{Login, debug_hash};
use quorumlock::__private::core::token::Token;
use quorumlock::{Limits, NodeError, Outcome, Phase};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::io::ErrorKind;
use std::time::{Duration, Instant};

/// Nanoseconds per millisecond.
pub const MS: u64 = 1_000_000;
/// One tick of global time: past `node_timeout`, and two of them reach past a key's
/// life on a fast server (the ttl is 50 ms).
pub const TICK: u64 = 25 * MS;
/// The locks' ttl.
pub const TTL_MS: u64 = 50;
/// The clients' `node_timeout`, below one tick (a fenced ttl must be 4 of them).
pub const NODE_TIMEOUT: Duration = Duration::from_millis(10);
/// The clients' drift factor: clocks here differ by up to 10.5 %, so the validity
/// (`ttl − ttl × 0.1 − 2 ms` = 43 ms) is what keeps a slow client inside the life of a
/// key on a fast server; without it the window outlives the key.
pub const DRIFT: f64 = 0.1;
/// The restart guard when on: the ttl plus a second, as the docs ask.
pub const GUARD: Duration = Duration::from_millis(TTL_MS + 1000);
/// The resources: client `c` locks `RESOURCES[c % resources]`.
pub const RESOURCES: [&[u8]; 2] = [b"m:a", b"m:b"];
/// Messages one connection may have in flight one way.
pub const MAX_IN_FLIGHT: usize = 8;
/// Bytes an engine's buffers may grow past their size once connected.
pub const BUFFER_SLACK: usize = 64 * 1024;

/// One configuration to explore.
#[derive(Clone, Debug)]
pub struct Config {
    pub name: &'static str,
    pub clients: usize,
    /// Endpoint `e` reaches server `endpoints[e]`.
    pub endpoints: Vec<usize>,
    pub resources: usize,
    /// Ticks of global time.
    pub ticks: u32,
    /// Acquire attempts per client (the first and its retries).
    pub attempts: u32,
    pub guard: bool,
    pub fencing: bool,
    /// Server restarts (empty, at once) allowed in a trace.
    pub restarts: u32,
    /// The one server that may restart (`None`: any).
    pub restart_only: Option<usize>,
    /// Connections lost allowed in a trace.
    pub resets: u32,
    /// The one connection that may be lost, (client, endpoint) (`None`: any).
    pub reset_only: Option<(usize, usize)>,
    /// Clock rates, per mille.
    pub client_rates: Vec<u64>,
    pub server_rates: Vec<u64>,
    /// Time moves on only once every message in flight has been handled: no reply
    /// waits past `node_timeout` (a smaller state space, for long horizons).
    pub urgent: bool,
    /// With `urgent`, the connections, (client, endpoint), whose messages (both ways)
    /// may still wait while time moves on: late requests and replies between these
    /// clients and nodes.
    pub late: Vec<(usize, usize)>,
    /// Client `c` begins its first attempt no earlier than tick `begin_from[c]` (missing:
    /// tick 0): a bound on when clients start, to fit a longer horizon.
    pub begin_from: Vec<u32>,
    /// Actions taken from the warm start before the exploration begins (a fixed
    /// prefix: the search explores every continuation of it, nothing before it).
    pub prefix: Vec<Action>,
    /// Time may also move to the next instant at a validity edge ([`Action::Edge`]):
    /// just after a key expires on a server's clock, at the last instant of a holder's
    /// window, at a round's time-out. Up to this many such steps per trace (0: none).
    pub edges: u32,
    /// A search, not a proof: stop once every `expect` bit is reached.
    pub stop: bool,
    /// The "sometimes" bits that must be reached.
    pub expect: u32,
    /// Test the fingerprints on this configuration (as `MODEL_CHECK_FINGERPRINTS=1` does
    /// on every one): the explorer's `Options::check_fingerprints`.
    pub check_fingerprints: bool,
}

/// Clock rates in per mille. Slow and exact clients, fast servers: 1050 / 950 is inside
/// the drift factor.
pub const SLOW: u64 = 950;
pub const EXACT: u64 = 1000;
pub const FAST: u64 = 1050;
/// A client at the edge of what the validity allows against a fast server at a 50 ms
/// ttl: its 43 ms of validity are 47.25 ms of global time, and a key set on a fast server
/// lives at least 50 of its milliseconds (whole milliseconds, expired once past), 47.62
/// ms: 0.37 ms to spare. A validity 1 ms longer (48.35 ms) outlives a key set at tick 0
/// (48.10 ms, the servers' clocks half a millisecond into one): only a time step between
/// the two sees it (`Config::edges`).
#[allow(dead_code)] // tests/model_faults.rs's
pub const SLOWEST: u64 = 910;

impl Config {
    /// The common world: 2 clients (slow, exact; a third fast), 3 nodes (fast, fast,
    /// exact), 1 resource, 3 ticks, 2 attempts, no faults; a lock won and a waiter winning
    /// must be reached. Configurations change what they need.
    pub fn base(name: &'static str) -> Config {
        Config {
            name,
            clients: 2,
            endpoints: vec![0, 1, 2],
            resources: 1,
            ticks: 3,
            attempts: 2,
            guard: false,
            fencing: false,
            restarts: 0,
            restart_only: None,
            resets: 0,
            reset_only: None,
            client_rates: vec![SLOW, EXACT, FAST],
            server_rates: vec![FAST, FAST, EXACT],
            urgent: false,
            late: Vec::new(),
            begin_from: Vec::new(),
            prefix: Vec::new(),
            edges: 0,
            check_fingerprints: false,
            stop: false,
            expect: WON | WAITER_WINS,
        }
    }

    pub fn servers(&self) -> usize {
        self.server_rates.len()
    }
}

/// "Sometimes": a lock is handed out.
pub const WON: u32 = 1;
/// "Sometimes": a client refused earlier wins after another client's unlock.
pub const WAITER_WINS: u32 = 2;
/// "Sometimes" (guard off): a restart gives two holders at once.
pub const TWO_HOLDERS: u32 = 4;
/// "Sometimes" (guard on): the guard keeps a restarted server's yes from counting.
pub const GUARD_HELD: u32 = 8;
/// "Sometimes": a fenced lock is handed out.
pub const FENCED: u32 = 16;

pub fn bit_names(bits: u32) -> String {
    let names = [
        (WON, "a lock won"),
        (WAITER_WINS, "a waiter wins after a release"),
        (TWO_HOLDERS, "a restart gives two holders"),
        (GUARD_HELD, "the guard holds a young yes back"),
        (FENCED, "a fenced lock handed out"),
    ];
    names
        .iter()
        .filter(|(b, _)| bits & b != 0)
        .map(|(_, n)| *n)
        .collect::<Vec<_>>()
        .join(", ")
}

/// One choice of the world.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// Global time moves on to the next tick.
    Tick,
    /// Global time moves on to the next instant at a validity edge before the next tick
    /// ([`Config::edges`]): the first at which a key has expired on its server's clock,
    /// the last of a holder's window, or a round's time-out on its client's clock.
    Edge,
    /// Client `c` starts an acquire attempt.
    Begin(usize),
    /// Client `c` unlocks the lock it holds.
    Unlock(usize),
    /// Client `c`'s round has run `node_timeout` on its clock: it times out.
    Timeout(usize),
    /// Client `c` stops holding its acquire back for the last lost attempt's deletes.
    ReleaseHeld(usize),
    /// The server accepts client `c`'s connection to endpoint `e`.
    Accept(usize, usize),
    /// The server runs the next message on client `c`'s connection to endpoint `e`.
    Run(usize, usize),
    /// The server runs the next message of client `c`'s `i`-th closed connection (bytes
    /// written before the client closed it still arrive).
    RunClosed(usize, usize),
    /// Client `c` reads the next reply (or the close) from endpoint `e`.
    Deliver(usize, usize),
    /// Server `s` restarts empty.
    Restart(usize),
    /// Client `c`'s connection to endpoint `e` is lost, with everything in flight.
    Reset(usize, usize),
}

// ---------------------------------------------------------------------------------------
// Clocks

/// A clock reading `offset + rate × global / 1000` nanoseconds.
#[derive(Clone, Copy, Debug, Hash)]
pub struct Clock {
    pub offset: u64,
    pub rate: u64,
}

impl Clock {
    pub fn local(&self, global: u64) -> u64 {
        self.offset + global * self.rate / 1000
    }
    /// The first global time at which the clock reads at least `local`.
    pub fn global_of(&self, local: u64) -> u64 {
        local
            .saturating_sub(self.offset)
            .saturating_mul(1000)
            .div_ceil(self.rate)
    }
}

// ---------------------------------------------------------------------------------------
// Connections and the transport

#[derive(Clone, Debug)]
struct Conn {
    /// The client's number for this connection (per endpoint, never reused).
    conn: u32,
    /// The server's id once accepted.
    id: Option<ConnId>,
    to_server: VecDeque<Vec<u8>>,
    to_client: VecDeque<Vec<u8>>,
    /// Delivered, not read yet.
    arrived: Vec<u8>,
    /// The server's side is closed (after `to_client`).
    fin: bool,
    /// The close was handed to the client.
    fin_seen: bool,
}

impl Conn {
    fn hash_into(&self, h: &mut Fingerprinter) {
        (
            self.conn,
            self.id.is_some(),
            &self.to_server,
            &self.to_client,
            &self.arrived,
            self.fin,
            self.fin_seen,
        )
            .hash(h);
    }
}

/// One client's connections: the engine's [`Transport`].
#[derive(Clone, Debug)]
pub struct Net {
    base: Instant,
    /// The client's clock now, in nanoseconds.
    local: u64,
    conns: Vec<Option<Conn>>,
    /// Connections the client closed whose written bytes are still on their way.
    closed: Vec<(usize, Conn)>,
    next_gen: u32,
    /// Every write, per endpoint: (connection, bytes).
    log: Vec<Vec<(u32, Vec<u8>)>>,
    /// Connections the world broke (lost, server restarted or closed): (endpoint, conn).
    broken: Vec<(usize, u32)>,
    /// Every token this client has used.
    tokens: Vec<Vec<u8>>,
    /// (endpoint, conn, token) of every write of a token that no compare-and-delete of
    /// it followed on that connection, and whose connection the world did not break:
    /// what `World::unsent_delete` will judge, as a set, so that the fingerprint holds it
    /// (the log itself is not hashed).
    undeleted: BTreeSet<(usize, u32, Vec<u8>)>,
}

impl Net {
    /// The world broke connection `conn` to `endpoint`.
    fn broke(&mut self, endpoint: usize, conn: u32) {
        self.broken.push((endpoint, conn));
        self.undeleted
            .retain(|(e, c, _)| (*e, *c) != (endpoint, conn));
    }
}

impl Net {
    fn instant(&self) -> Instant {
        self.base + Duration::from_nanos(self.local)
    }
}

impl Transport for Net {
    fn now(&mut self) -> Instant {
        self.instant()
    }

    fn open(&mut self, node: usize) -> Result<(), NodeError> {
        self.close(node);
        self.conns[node] = Some(Conn {
            conn: self.next_gen,
            id: None,
            to_server: VecDeque::new(),
            to_client: VecDeque::new(),
            arrived: Vec::new(),
            fin: false,
            fin_seen: false,
        });
        self.next_gen += 1;
        Ok(())
    }

    fn close(&mut self, node: usize) {
        if let Some(mut c) = self.conns[node].take() {
            if c.id.is_some() && !c.fin {
                c.to_client.clear();
                c.arrived.clear();
                self.closed.push((node, c));
            }
        }
    }

    fn established(&mut self, node: usize) -> Result<bool, NodeError> {
        match &self.conns[node] {
            Some(c) => Ok(c.id.is_some()),
            None => Err(NodeError::Closed),
        }
    }

    fn write(&mut self, node: usize, bytes: &[u8]) -> Result<usize, NodeError> {
        match self.conns[node].as_mut() {
            None => Err(NodeError::Closed),
            Some(c) if c.id.is_none() => Ok(0),
            Some(c) if c.fin => Err(NodeError::Io(ErrorKind::BrokenPipe, "broken pipe".into())),
            Some(_) if bytes.is_empty() => Ok(0),
            Some(c) => {
                c.to_server.push_back(bytes.to_vec());
                let conn = c.conn;
                // What `World::unsent_delete` will judge, kept for the fingerprint.
                let delete = is_delete(bytes);
                // A connection the world broke is excused for good (as the log scan
                // excuses it), whatever is written on it after.
                let excused = self.broken.contains(&(node, conn));
                for token in &self.tokens {
                    if excused {
                        break;
                    }
                    if contains(bytes, token) {
                        if delete {
                            self.undeleted.remove(&(node, conn, token.clone()));
                        } else if is_set(bytes) {
                            self.undeleted.insert((node, conn, token.clone()));
                        }
                    }
                }
                self.log[node].push((conn, bytes.to_vec()));
                Ok(bytes.len())
            }
        }
    }

    fn read(&mut self, node: usize, buf: &mut [u8]) -> Result<Received, NodeError> {
        match self.conns[node].as_mut() {
            None => Err(NodeError::Closed),
            Some(c) if c.id.is_none() => Ok(Received::Nothing),
            Some(c) if !c.arrived.is_empty() => {
                let k = c.arrived.len().min(buf.len());
                buf[..k].copy_from_slice(&c.arrived[..k]);
                c.arrived.drain(..k);
                Ok(Received::Bytes(k))
            }
            Some(c) if c.fin && c.to_client.is_empty() => Ok(Received::Closed),
            Some(_) => Ok(Received::Nothing),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Clients

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Stage {
    /// May start an attempt from this tick on.
    Idle(u32),
    /// A round is in progress: its start and, on the client's clock, its time-out.
    Round {
        start: Instant,
        until: u64,
    },
    /// Holds its lock.
    Holding,
    Done,
}

#[derive(Clone, Debug, Hash)]
struct Held {
    token: Token,
    deadline: Instant,
    written: u64,
    fence: Option<u64>,
    /// The key of its window in `World::windows`; `None` while its fence is written
    /// back, or when the write-back failed (it is then only released).
    hold: Option<WindowKey>,
}

#[derive(Clone)]
struct Client {
    engine: Engine,
    net: Net,
    round: Round,
    clock: Clock,
    res: usize,
    /// The key of the current round's one item (`RESOURCES[res]`) and its token.
    key: &'static [u8],
    token: Token,
    phase: Phase,
    fencing: Fencing,
    chase: u64,
    stage: Stage,
    lock: Option<Held>,
    attempt: u32,
    /// An attempt of this client was refused (`Taken`).
    refused: bool,
    buffered_base: usize,
}

impl Client {
    fn ttl_ms(&self) -> u64 {
        if self.phase == Phase::Acquire {
            TTL_MS
        } else {
            0
        }
    }

    /// Calls into the engine with the round in progress (if any), then stamps any
    /// decision, as the driver does after each batch of replies.
    fn drive(&mut self, f: impl FnOnce(&mut Engine, &mut Net, Option<&mut Active<'_>>)) {
        let ttl_ms = self.ttl_ms();
        let Client {
            engine,
            net,
            round,
            key,
            token,
            phase,
            fencing,
            chase,
            stage,
            ..
        } = self;
        if matches!(stage, Stage::Round { .. }) {
            let items = [Item { key, token }];
            let req = Request {
                fencing: *fencing,
                ..Request::new(*phase, ttl_ms, &items[..], *chase)
            };
            let mut active = Active { round, req: &req };
            f(engine, net, Some(&mut active));
            if round.has_unstamped() {
                let now = net.instant();
                round.stamp(now);
            }
        } else {
            f(engine, net, None);
        }
    }

    fn begin(&mut self, phase: Phase, token: Token, fencing: Fencing, chase: u64) {
        self.phase = phase;
        self.fencing = fencing;
        self.chase = chase;
        let start = self.net.instant();
        let until = self.net.local + NODE_TIMEOUT.as_nanos() as u64;
        self.stage = Stage::Round { start, until };
        if !self.net.tokens.iter().any(|t| t == token.as_bytes()) {
            self.net.tokens.push(token.as_bytes().to_vec());
        }
        self.token = token;
        self.drive(|e, t, a| e.begin(t, a.expect("a round"), start));
    }
}

// ---------------------------------------------------------------------------------------
// The world

/// A validity window in global time: `[from, until)`.
#[derive(Clone, Copy, Debug, Hash)]
struct Window {
    client: usize,
    res: usize,
    from: u64,
    until: u64,
    fence: Option<u64>,
    /// Ended by an unlock.
    unlocked: bool,
}

/// A window's key: its client and the attempt that won it (one window per attempt at
/// most). The world's records are keyed, not kept in the order clients wrote them, so
/// that two clients' actions taken in either order leave one state (`World::independent`).
type WindowKey = (usize, u32);

/// A compare-and-delete owed: wherever a SET of `token` went out to `endpoint`, the
/// delete must go out on the same connection.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
struct Owed {
    client: usize,
    endpoint: usize,
    token: Vec<u8>,
}

#[derive(Clone)]
pub struct World {
    pub config: Config,
    tick: u32,
    /// Global time, in nanoseconds: `tick × TICK`, or later by edge steps.
    now: u64,
    edges_left: u32,
    servers: Vec<SimNode>,
    server_clocks: Vec<Clock>,
    clients: Vec<Client>,
    restarts_left: u32,
    resets_left: u32,
    restarted: bool,
    windows: BTreeMap<WindowKey, Window>,
    /// (server, resource, value) ever seen set on a server.
    observed: BTreeSet<(usize, usize, Vec<u8>)>,
    owed: BTreeSet<Owed>,
    reached: u32,
    violation: Option<String>,
    /// A readable account of each step, when replaying a trace.
    pub log: Option<Vec<String>>,
}

/// The majority of `n` endpoints, restated from the Redlock spec rather than taken from
/// the core's `quorum::quorum`: the properties judge the core, so they must not share a
/// formula a planted bug could break in both.
fn majority(n: usize) -> usize {
    n / 2 + 1
}

fn token_of(client: usize, attempt: u32) -> Token {
    Token::from_bits(((client as u128 + 1) << 8) | (attempt as u128 + 1))
}

impl World {
    /// The world of `config` at tick 0: every client connected to every endpoint, each
    /// handshake answered (a warm start: reconnects after faults are explored).
    pub fn new(config: Config) -> World {
        assert!(
            config.guard || config.restarts == 0 || config.stop,
            "a restart with the guard off must be a search (stop): two holders are its goal"
        );
        let base = Instant::now();
        let n = config.endpoints.len();
        let servers = (0..config.servers())
            .map(|s| SimNode::new(1000 + s as u64))
            .collect();
        let server_clocks = config
            .server_rates
            .iter()
            .enumerate()
            .map(|(s, &rate)| Clock {
                // Half a millisecond past the whole: key expiry rounds on each server.
                offset: (s as u64 + 1) * 3_600_000 * MS + 500_000,
                rate,
            })
            .collect();
        let timing = Timing {
            node_timeout: NODE_TIMEOUT,
            connect_timeout: Duration::from_millis(100),
            max_backoff: Duration::from_millis(20),
            limits: Limits::default(),
            restart_guard: if config.guard { GUARD } else { Duration::ZERO },
        };
        let clients = (0..config.clients)
            .map(|c| {
                // The engine was made at client time 0, ten seconds (and more) ago.
                let clock = Clock {
                    offset: (10_000 + 1_000 * c as u64) * MS + 300_000,
                    rate: config.client_rates[c],
                };
                let net = Net {
                    base,
                    local: 0,
                    conns: vec![None; n],
                    closed: Vec::new(),
                    next_gen: 0,
                    log: vec![Vec::new(); n],
                    broken: Vec::new(),
                    tokens: Vec::new(),
                    undeleted: BTreeSet::new(),
                };
                let engine = Engine::new(vec![Login::default(); n], timing, base);
                let res = c % config.resources;
                Client {
                    engine,
                    net,
                    round: Round::default(),
                    clock,
                    res,
                    key: RESOURCES[res],
                    token: token_of(c, 0),
                    phase: Phase::Acquire,
                    fencing: Fencing::Off,
                    chase: 0,
                    stage: Stage::Idle(config.begin_from.get(c).copied().unwrap_or(0)),
                    lock: None,
                    attempt: 0,
                    refused: false,
                    buffered_base: 0,
                }
            })
            .collect();
        let mut w = World {
            tick: 0,
            now: 0,
            edges_left: config.edges,
            servers,
            server_clocks,
            clients,
            restarts_left: config.restarts,
            resets_left: config.resets,
            restarted: false,
            windows: BTreeMap::new(),
            observed: BTreeSet::new(),
            owed: BTreeSet::new(),
            reached: 0,
            violation: None,
            log: None,
            config,
        };
        // Warm start: connect, run the handshakes, read their replies.
        for c in 0..w.clients.len() {
            w.set_time(c);
            let cl = &mut w.clients[c];
            let now = cl.net.instant();
            cl.engine.maintain(&mut cl.net, now);
            for e in 0..n {
                w.step(&Action::Accept(c, e));
                while w.clients[c].net.conns[e]
                    .as_ref()
                    .is_some_and(|k| !k.to_server.is_empty())
                {
                    w.step(&Action::Run(c, e));
                }
                while w.clients[c].net.conns[e]
                    .as_ref()
                    .is_some_and(|k| !k.to_client.is_empty())
                {
                    w.step(&Action::Deliver(c, e));
                }
            }
            let cl = &mut w.clients[c];
            cl.buffered_base = cl.engine.buffered();
            assert!(
                cl.engine.sessions().iter().all(|s| !s.handshaking()),
                "client {c}: a handshake is unanswered after the warm start"
            );
        }
        for a in w.config.prefix.clone() {
            let mut enabled = Vec::new();
            crate::explore::Model::actions(&w, &mut enabled);
            assert!(
                enabled.contains(&a),
                "the prefix's {a:?} is not enabled (enabled: {enabled:?})"
            );
            w.step(&a);
        }
        w
    }

    fn global(&self) -> u64 {
        self.now
    }

    /// The next instant at a validity edge ([`Action::Edge`]) after now and before the
    /// next tick, if any.
    fn next_edge(&self) -> Option<u64> {
        if self.edges_left == 0 || self.tick >= self.config.ticks {
            return None;
        }
        let g = self.now;
        let limit = u64::from(self.tick + 1) * TICK;
        let mut next: Option<u64> = None;
        let mut consider = |t: u64| {
            if t > g && t < limit && next.is_none_or(|n| t < n) {
                next = Some(t);
            }
        };
        // A key expires once its server's whole milliseconds pass its expiry.
        for (s, node) in self.servers.iter().enumerate() {
            let clock = self.server_clocks[s];
            let now_ms = clock.local(g) / MS;
            for k in node.keys(clock.local(g)) {
                if let Some(pttl) = k.pttl_ms {
                    consider(clock.global_of((now_ms + pttl + 1) * MS));
                }
            }
        }
        // The last instant of a holder's window.
        for w in self.windows.values() {
            consider(w.until.saturating_sub(1));
        }
        // A round's time-out on its client's clock.
        for cl in &self.clients {
            if let Stage::Round { until, .. } = cl.stage {
                consider(cl.clock.global_of(until));
            }
        }
        next
    }

    fn server_now(&self, s: usize) -> u64 {
        self.server_clocks[s].local(self.global())
    }

    /// Sets client `c`'s clock to the present.
    fn set_time(&mut self, c: usize) {
        let g = self.global();
        let cl = &mut self.clients[c];
        cl.net.local = cl.clock.local(g);
    }

    fn note(&mut self, f: impl FnOnce(&World) -> String) {
        if self.log.is_some() {
            let line = f(self);
            let t = self.global() / MS;
            if let Some(log) = self.log.as_mut() {
                log.push(format!("[{t:>3} ms] {line}"));
            }
        }
    }

    fn fail(&mut self, what: String) {
        if self.violation.is_none() {
            self.violation = Some(what);
        }
    }

    /// Takes one action (the explorer's step); when replaying, tells what it wrote.
    pub fn step(&mut self, action: &Action) {
        if self.log.is_none() {
            return self.act(action);
        }
        let before: Vec<Vec<usize>> = self
            .clients
            .iter()
            .map(|cl| cl.net.log.iter().map(Vec::len).collect())
            .collect();
        self.act(action);
        for (c, cl) in self.clients.iter().enumerate() {
            for (e, log) in cl.net.log.iter().enumerate() {
                for (conn, bytes) in &log[before[c][e]..] {
                    let line = format!(
                        "    client {c} writes to endpoint {e} (connection {conn}): {}",
                        show(bytes)
                    );
                    if let Some(l) = self.log.as_mut() {
                        l.push(line);
                    }
                }
            }
        }
    }

    fn act(&mut self, action: &Action) {
        self.act_on(action);
        // Every compare-and-delete owed, judged as soon as it can be: once a client is
        // idle or done (no round of its own), with nothing left unwritten, it has written
        // every delete it ever will. Only the acting client's writes, stage and records
        // can have changed (time, a restart or another client's action touch none of
        // them; a broken connection only excuses), so judging it alone judges every
        // state.
        let c = match *action {
            Action::Tick | Action::Edge | Action::Restart(_) => return,
            Action::Begin(c)
            | Action::Unlock(c)
            | Action::Timeout(c)
            | Action::ReleaseHeld(c)
            | Action::Accept(c, _)
            | Action::Run(c, _)
            | Action::RunClosed(c, _)
            | Action::Deliver(c, _)
            | Action::Reset(c, _) => c,
        };
        let cl = &mut self.clients[c];
        if matches!(cl.stage, Stage::Idle(_) | Stage::Done) && !cl.engine.writes_pending() {
            if let Some(v) = self.undeleted_of(c) {
                self.fail(v);
            }
        }
    }

    /// [`World::unsent_delete`] for client `c`, from the set its writes keep
    /// (`Net::undeleted`) instead of a scan of every write it made: the same verdict
    /// (every finished trace scans the log as well, `Model::at_end`), at a fraction of
    /// the cost of judging it on every step.
    fn undeleted_of(&self, c: usize) -> Option<String> {
        let net = &self.clients[c].net;
        let (endpoint, conn, token) = net
            .undeleted
            .iter()
            .find(|(_, _, token)| self.owed.iter().any(|o| o.client == c && o.token == *token))?;
        Some(format!(
            "client {c} never wrote the compare-and-delete of {} to endpoint {endpoint} on \
             connection {conn}, which its SET went out on (and which was not broken)",
            tok_bytes(token),
        ))
    }

    fn act_on(&mut self, action: &Action) {
        match *action {
            Action::Tick => {
                self.tick += 1;
                self.now = u64::from(self.tick) * TICK;
                self.note(|_| "-- time moves one tick on --".into());
            }
            Action::Edge => {
                self.now = self.next_edge().expect("an edge");
                self.edges_left -= 1;
                self.note(|w| {
                    format!(
                        "-- time moves on to an edge: {:.6} ms --",
                        w.now as f64 / MS as f64
                    )
                });
            }
            Action::Begin(c) => {
                self.set_time(c);
                let cl = &mut self.clients[c];
                let token = token_of(c, cl.attempt);
                let fencing = if self.config.fencing {
                    Fencing::Read
                } else {
                    Fencing::Off
                };
                cl.begin(Phase::Acquire, token.clone(), fencing, 0);
                let attempt = cl.attempt + 1;
                self.note(|w| {
                    format!(
                        "client {c}: acquire attempt {attempt} on {}, token {}",
                        show_key(RESOURCES[w.clients[c].res]),
                        tok(&token),
                    )
                });
                self.settle(c);
            }
            Action::Unlock(c) => {
                self.set_time(c);
                self.unlock(c);
            }
            Action::Timeout(c) => {
                self.set_time(c);
                let cl = &mut self.clients[c];
                let now = cl.net.instant();
                cl.round.time_out(now);
                self.note(|_| format!("client {c}: the round times out (node_timeout)"));
                self.settle_as(c, true);
            }
            Action::ReleaseHeld(c) => {
                self.set_time(c);
                let cl = &mut self.clients[c];
                let now = cl.net.instant();
                cl.drive(|e, t, a| {
                    if let Some(a) = a {
                        e.release_held(t, a, now);
                    }
                });
                self.note(|_| format!("client {c}: stops holding its SET back for the deletes"));
                self.settle(c);
            }
            Action::Accept(c, e) => {
                self.set_time(c);
                let s = self.config.endpoints[e];
                let id = self.servers[s].accept();
                let cl = &mut self.clients[c];
                if let Some(k) = cl.net.conns[e].as_mut() {
                    k.id = Some(id);
                }
                cl.drive(|en, t, a| en.on_event(t, e, false, false, a));
                self.note(|_| {
                    format!("client {c}: connection to endpoint {e} (server {s}) established")
                });
                self.after_client(c);
            }
            Action::Run(c, e) => {
                let s = self.config.endpoints[e];
                let now = self.server_now(s);
                let cl = &mut self.clients[c];
                let k = cl.net.conns[e].as_mut().expect("a connection");
                let msg = k.to_server.pop_front().expect("a message");
                let id = k.id.expect("accepted");
                let fed = self.servers[s].feed(id, &msg, now);
                let k = self.clients[c].net.conns[e].as_mut().expect("a connection");
                if !fed.reply.is_empty() {
                    k.to_client.push_back(fed.reply.clone());
                }
                if fed.closed.is_some() {
                    k.fin = true;
                    let conn = k.conn;
                    self.clients[c].net.broke(e, conn);
                }
                self.observe(s);
                self.note(|_| {
                    format!(
                        "server {s} runs client {c}'s {} -> {}",
                        show(&msg),
                        show(&fed.reply)
                    )
                });
            }
            Action::RunClosed(c, i) => {
                let (e, msg, id) = {
                    let (e, k) = &mut self.clients[c].net.closed[i];
                    (*e, k.to_server.pop_front().expect("a message"), k.id)
                };
                let s = self.config.endpoints[e];
                let now = self.server_now(s);
                let id = id.expect("accepted");
                let fed = self.servers[s].feed(id, &msg, now);
                self.observe(s);
                self.note(|_| {
                    format!(
                        "server {s} runs client {c}'s {} from a connection the client closed -> \
                         (not read) {}",
                        show(&msg),
                        show(&fed.reply)
                    )
                });
                self.flush_closed(c);
            }
            Action::Deliver(c, e) => {
                self.set_time(c);
                let cl = &mut self.clients[c];
                let k = cl.net.conns[e].as_mut().expect("a connection");
                let msg = k.to_client.pop_front();
                if let Some(m) = &msg {
                    k.arrived.extend_from_slice(m);
                }
                let closed = k.fin && k.to_client.is_empty();
                if closed {
                    k.fin_seen = true;
                }
                cl.drive(|en, t, a| en.on_event(t, e, true, closed, a));
                self.note(|w| {
                    let what = match &msg {
                        Some(m) => format!("reads {}", show(m)),
                        None => "sees the connection closed".into(),
                    };
                    let votes = w.votes_of(c);
                    format!(
                        "client {c}: from endpoint {e} {what}{}{votes}",
                        if closed && msg.is_some() {
                            " and the close"
                        } else {
                            ""
                        },
                    )
                });
                self.after_client(c);
            }
            Action::Restart(s) => {
                self.restarts_left -= 1;
                self.restarted = true;
                let now = self.server_now(s);
                self.servers[s].restart(now);
                for cl in &mut self.clients {
                    let mut broke = Vec::new();
                    for (e, k) in cl.net.conns.iter_mut().enumerate() {
                        if let Some(k) = k {
                            if self.config.endpoints[e] == s && k.id.is_some() && !k.fin {
                                k.to_server.clear();
                                k.to_client.clear();
                                k.fin = true;
                                broke.push((e, k.conn));
                            }
                        }
                    }
                    for (e, conn) in broke {
                        cl.net.broke(e, conn);
                    }
                    let eps = &self.config.endpoints;
                    cl.net.closed.retain(|(e, _)| eps[*e] != s);
                }
                self.observe(s);
                self.note(|_| {
                    format!("server {s} RESTARTS EMPTY: every key and connection there is lost")
                });
            }
            Action::Reset(c, e) => {
                self.resets_left -= 1;
                let s = self.config.endpoints[e];
                let cl = &mut self.clients[c];
                let k = cl.net.conns[e].as_mut().expect("a connection");
                k.to_server.clear();
                k.to_client.clear();
                k.fin = true;
                let (conn, id) = (k.conn, k.id.expect("accepted"));
                cl.net.broke(e, conn);
                self.servers[s].close(id);
                self.note(|_| {
                    format!(
                        "client {c}'s connection to endpoint {e} is lost, with what was in flight"
                    )
                });
            }
        }
    }

    /// After an event handled by client `c`: closed connections with nothing left to
    /// deliver are closed at the server; a round that is over is settled.
    fn after_client(&mut self, c: usize) {
        self.flush_closed(c);
        self.settle(c);
    }

    fn flush_closed(&mut self, c: usize) {
        let closed = std::mem::take(&mut self.clients[c].net.closed);
        let mut keep = Vec::new();
        for (e, k) in closed {
            if k.to_server.is_empty() {
                if let Some(id) = k.id {
                    self.servers[self.config.endpoints[e]].close(id);
                }
            } else {
                keep.push((e, k));
            }
        }
        self.clients[c].net.closed = keep;
    }

    /// Notes every (resource, value) server `s` holds now.
    fn observe(&mut self, s: usize) {
        let now = self.server_now(s);
        for (r, key) in RESOURCES.iter().enumerate() {
            if let Some(v) = self.servers[s].value(0, key, now) {
                let v = v.to_vec();
                self.observed.insert((s, r, v));
            }
        }
    }

    fn votes_of(&self, c: usize) -> String {
        let cl = &self.clients[c];
        if !matches!(cl.stage, Stage::Round { .. }) {
            return String::new();
        }
        let votes: Vec<String> = cl
            .round
            .outcomes(0)
            .map(|o| match o {
                Outcome::NotNeeded => "-".to_string(),
                Outcome::Failed(e) => format!("failed({e})"),
                o => format!("{o:?}"),
            })
            .collect();
        format!(" (votes [{}])", votes.join(", "))
    }

    /// Once client `c`'s round is over (decided, and for a release or a write-back no
    /// write pending), what the library does next.
    fn settle(&mut self, c: usize) {
        self.settle_as(c, false);
    }

    /// [`World::settle`]; `timed_out`: the round is over whatever is pending.
    fn settle_as(&mut self, c: usize, timed_out: bool) {
        let cl = &mut self.clients[c];
        let Stage::Round { start, .. } = cl.stage else {
            return;
        };
        let release = matches!(cl.phase, Phase::Release | Phase::Fence);
        if !cl.round.is_done() || (release && !timed_out && cl.engine.writes_pending()) {
            return;
        }
        let now = cl.net.instant();
        let decision = cl.round.decision(0);
        if cl
            .round
            .outcomes(0)
            .any(|o| matches!(o, Outcome::Failed(NodeError::YoungerThanGuard { .. })))
        {
            self.reached |= GUARD_HELD;
        }
        let cl = &mut self.clients[c];
        match cl.phase {
            Phase::Acquire => {
                if decision == Decision::Won {
                    self.check_won(c);
                }
                let cl = &mut self.clients[c];
                let ttl = Duration::from_millis(TTL_MS);
                let decided = cl.round.decided_at(0).unwrap_or(now);
                let token = cl.token.clone();
                if let Some(end) = acquired_until(decision, decided, start, safe_span(ttl, DRIFT)) {
                    let written = cl.engine.written();
                    if self.config.fencing {
                        // One more than the largest counter read, written back before
                        // the lock is handed out (`Redlock::fence_lock`).
                        let fence = next_fence(cl.round.counter(0)).get();
                        cl.lock = Some(Held {
                            token: token.clone(),
                            deadline: end,
                            written,
                            fence: Some(fence),
                            hold: None,
                        });
                        cl.begin(Phase::Fence, token, Fencing::Write(fence), 0);
                        self.note(|_| format!("client {c}: WON; writes its fence {fence} back"));
                        self.settle(c);
                    } else {
                        self.hand_out(c, token, end, written, None);
                    }
                    return;
                }
                // A round won too late (no validity left) is lost without being refused:
                // only a round that lost its vote is judged here.
                if !timed_out && decision != Decision::Won {
                    self.check_lost(c, decision);
                }
                let cl = &mut self.clients[c];
                if decision == Decision::Taken {
                    cl.refused = true;
                }
                let written = cl.engine.written();
                self.note(|_| {
                    format!("client {c}: attempt lost ({decision:?}); releases what it wrote")
                });
                self.owe(c, written);
                let cl = &mut self.clients[c];
                let Client {
                    engine,
                    net,
                    key,
                    token,
                    ..
                } = cl;
                engine.release_lost(net, &[Item { key, token }], &[0]);
                let cl = &mut self.clients[c];
                cl.attempt += 1;
                cl.stage = if cl.attempt < self.config.attempts {
                    Stage::Idle(self.tick)
                } else {
                    Stage::Done
                };
                self.flush_closed(c);
            }
            Phase::Fence => {
                if decision == Decision::Won {
                    self.check_won(c);
                }
                let cl = &mut self.clients[c];
                let lock = cl.lock.clone().expect("a write-back without a lock");
                if decision == Decision::Won && now < lock.deadline {
                    self.hand_out(c, lock.token, lock.deadline, lock.written, lock.fence);
                } else {
                    // Not confirmed in time: released, never handed out.
                    cl.lock = Some(Held {
                        fence: None,
                        ..lock
                    });
                    self.note(|_| format!("client {c}: fence not confirmed in time; releases"));
                    self.unlock(c);
                }
            }
            Phase::Release => {
                cl.lock = None;
                cl.stage = Stage::Done;
                self.note(|_| format!("client {c}: unlocked"));
            }
            other => unreachable!("no {other:?} round here"),
        }
    }

    /// Client `c` holds the lock `token` until `end` (its clock): its window opens.
    fn hand_out(&mut self, c: usize, token: Token, end: Instant, written: u64, fence: Option<u64>) {
        let g = self.global();
        let cl = &mut self.clients[c];
        let until = cl
            .clock
            .global_of(end.duration_since(cl.net.base).as_nanos() as u64);
        let w = Window {
            client: c,
            res: cl.res,
            from: g,
            until,
            fence,
            unlocked: false,
        };
        cl.lock = Some(Held {
            token,
            deadline: end,
            written,
            fence,
            hold: Some((c, cl.attempt)),
        });
        cl.stage = Stage::Holding;
        let refused = cl.refused;
        self.reached |= WON;
        if fence.is_some() {
            self.reached |= FENCED;
        }
        self.note(|_| {
            format!(
                "client {c}: HOLDS {} until {:.2} ms (global){}",
                show_key(RESOURCES[w.res]),
                until as f64 / MS as f64,
                fence.map_or(String::new(), |f| format!(", fence {f}"))
            )
        });
        for (&(oc, i), o) in self.windows.clone().iter() {
            if o.res != w.res {
                continue;
            }
            if o.until > w.from && w.until > o.from && w.until > w.from && o.until > o.from {
                if self.restarted && !self.config.guard {
                    self.reached |= TWO_HOLDERS;
                    self.note(|_| {
                        format!(
                            "TWO HOLDERS: client {} holds it until {:.2} ms and client {c} from {:.2} ms",
                            o.client,
                            o.until as f64 / MS as f64,
                            w.from as f64 / MS as f64
                        )
                    });
                } else {
                    let what = format!(
                        "two holders of {}: client {} in [{}, {}) ns and client {c} in [{}, {}) ns \
                         (client {oc}'s attempt {})",
                        show_key(RESOURCES[w.res]),
                        o.client,
                        o.from,
                        o.until,
                        w.from,
                        w.until,
                        i + 1
                    );
                    self.fail(what);
                }
            }
            if let (Some(a), Some(b)) = (o.fence, w.fence) {
                if b <= a && !self.restarted {
                    self.fail(format!(
                        "fence {b} of client {c}'s lock is not above fence {a} of client {}'s \
                         earlier lock on {}",
                        o.client,
                        show_key(RESOURCES[w.res])
                    ));
                }
            }
            if refused && o.unlocked && o.client != c {
                self.reached |= WAITER_WINS;
            }
        }
        self.windows.insert((c, self.clients[c].attempt), w);
    }

    fn unlock(&mut self, c: usize) {
        let g = self.global();
        let cl = &mut self.clients[c];
        let lock = cl.lock.clone().expect("unlock without a lock");
        if let Some(h) = lock.hold {
            let w = self.windows.get_mut(&h).expect("its window");
            w.until = w.until.min(g);
            w.unlocked = true;
        }
        let fencing = lock.fence.map_or(Fencing::Off, Fencing::Write);
        self.owe(c, lock.written);
        let cl = &mut self.clients[c];
        cl.begin(Phase::Release, lock.token, fencing, lock.written);
        self.note(|_| format!("client {c}: unlocks"));
        self.flush_closed(c);
        self.settle(c);
    }

    /// Client `c` owes the delete of its current token on the endpoints of `mask`.
    fn owe(&mut self, c: usize, mask: u64) {
        let token = &self.clients[c].token;
        for e in 0..self.config.endpoints.len() {
            if chases(mask, e) {
                self.owed.insert(Owed {
                    client: c,
                    endpoint: e,
                    token: token.as_bytes().to_vec(),
                });
            }
        }
    }

    /// The first delete owed and not sent: on every connection a SET of its token went
    /// out on (the engine may still have held it, to go out behind a handshake), a
    /// compare-and-delete of that token followed, unless the world broke that connection.
    /// Every endpoint's log is read, not only those of the engine's own `written` mask
    /// that `owe` recorded: an endpoint the engine forgot it wrote to still owes.
    fn unsent_delete(&self) -> Option<String> {
        let tokens: BTreeSet<(usize, &[u8])> =
            self.owed.iter().map(|o| (o.client, &o.token[..])).collect();
        let every = tokens.into_iter().flat_map(|(client, token)| {
            (0..self.config.endpoints.len()).map(move |endpoint| Owed {
                client,
                endpoint,
                token: token.to_vec(),
            })
        });
        for o in every {
            let net = &self.clients[o.client].net;
            let log = &net.log[o.endpoint];
            for (i, (conn, b)) in log.iter().enumerate() {
                if !contains(b, &o.token) || is_delete(b) || !is_set(b) {
                    continue;
                }
                let followed = log[i + 1..]
                    .iter()
                    .any(|(g, d)| g == conn && contains(d, &o.token) && is_delete(d));
                if !followed && !net.broken.contains(&(o.endpoint, *conn)) {
                    return Some(format!(
                        "client {} never wrote the compare-and-delete of {} to endpoint {} on \
                         connection {conn}, which its SET went out on (and which was not broken)",
                        o.client,
                        tok_bytes(&o.token),
                        o.endpoint
                    ));
                }
            }
        }
        None
    }

    /// A won slot: yes votes from at least a quorum of distinct servers (one server, one
    /// vote), each of which held this key with this token (acquire).
    fn check_won(&mut self, c: usize) {
        let cl = &self.clients[c];
        let n = self.config.endpoints.len();
        let yes: Vec<usize> = (0..n)
            .filter(|&e| matches!(cl.round.vote(e, 0), Some(Outcome::Locked | Outcome::Fenced)))
            .collect();
        let servers: BTreeSet<usize> = yes.iter().map(|&e| self.config.endpoints[e]).collect();
        let phase = cl.phase;
        if servers.len() < majority(n) || cl.round.yes(0) != yes.len() {
            let tally = cl.round.yes(0);
            self.fail(format!(
                "client {c}: {phase:?} won with yes votes of endpoints {yes:?} (servers \
                 {servers:?}, tally {tally}): fewer than {} distinct servers",
                majority(n)
            ));
            return;
        }
        if phase == Phase::Acquire {
            let token = cl.token.as_bytes().to_vec();
            let res = cl.res;
            for &e in &yes {
                let s = self.config.endpoints[e];
                if !self.observed.contains(&(s, res, token.clone())) {
                    self.fail(format!(
                        "client {c}: counted a yes of endpoint {e}, whose server {s} never held \
                         the key with its token (a reply of another round, slot or client)"
                    ));
                }
            }
        }
    }

    /// An acquire lost before its time-out: no quorum was possible any more. `Taken`:
    /// more than `n − quorum` endpoints said held; `Unavailable`: more than that said
    /// held or failed (an alias's second endpoint fails as a duplicate).
    fn check_lost(&mut self, c: usize, decision: Decision) {
        let cl = &self.clients[c];
        let n = self.config.endpoints.len();
        let (mut held, mut failed) = (0, 0);
        for e in 0..n {
            match cl.round.vote(e, 0) {
                Some(Outcome::Held) => held += 1,
                Some(Outcome::Failed(_)) => failed += 1,
                _ => {}
            }
        }
        let spare = n - majority(n);
        let enough = match decision {
            Decision::Taken => held > spare,
            _ => held + failed > spare,
        };
        if !enough {
            self.fail(format!(
                "client {c}: acquire decided {decision:?} with {held} held and {failed} failed \
                 of {n} endpoints, while a quorum of {} was still possible",
                majority(n)
            ));
        }
    }

    /// Who owns server `s`'s connection that `is` picks: (client, endpoint, the
    /// client's connection number), open or closed by the client.
    fn owner(&self, s: usize, is: impl Fn(ConnId) -> bool) -> Option<(usize, usize, u32)> {
        for (c, cl) in self.clients.iter().enumerate() {
            let all = cl
                .net
                .conns
                .iter()
                .enumerate()
                .filter_map(|(e, k)| k.as_ref().map(|k| (e, k)))
                .chain(cl.net.closed.iter().map(|(e, k)| (*e, k)));
            for (e, k) in all {
                if k.id.is_some_and(&is) && self.config.endpoints[e] == s {
                    return Some((c, e, k.conn));
                }
            }
        }
        None
    }

    fn hash_into(&self, h: &mut Fingerprinter) {
        (
            self.tick,
            self.now,
            self.edges_left,
            self.restarts_left,
            self.resets_left,
            self.restarted,
        )
            .hash(h);
        for (s, node) in self.servers.iter().enumerate() {
            // Connections by owner: (client, endpoint, conn).
            let label = |id: ConnId| {
                self.owner(s, |i| i == id).map_or(u64::MAX, |(c, e, conn)| {
                    ((c as u64) << 40) | ((e as u64) << 32) | u64::from(conn)
                })
            };
            node.fingerprint(h, label);
        }
        for cl in &self.clients {
            // The engine and its round: their own fingerprints (what decides the future),
            // so two orders of independent replies that end in one state merge.
            cl.engine.fingerprint(h);
            cl.round.fingerprint(h);
            (cl.phase as u8, cl.chase, &cl.token).hash(h);
            debug_hash(h, &cl.fencing);
            for k in cl.net.conns.iter().flatten() {
                k.hash_into(h);
            }
            for (e, k) in &cl.net.closed {
                e.hash(h);
                k.hash_into(h);
            }
            (cl.stage, &cl.lock, cl.attempt, cl.refused).hash(h);
            cl.net.undeleted.hash(h);
        }
        self.windows.hash(h);
        self.observed.hash(h);
        self.owed.hash(h);
        (self.reached, &self.violation).hash(h);
    }

    /// Every validity window handed out so far: (client, from, until, fence), in global
    /// nanoseconds.
    #[allow(dead_code)] // tests/model.rs's, not tests/model_faults.rs's
    pub fn windows(&self) -> Vec<(usize, u64, u64, Option<u64>)> {
        self.windows
            .values()
            .map(|w| (w.client, w.from, w.until, w.fence))
            .collect()
    }

    /// The whole state, every field rendered (`Debug`), for the explorer's test of the
    /// fingerprints (`MODEL_CHECK_FINGERPRINTS=1`). Left out, each for its reason:
    /// - the configuration and the clocks' offsets and rates: constant in a run;
    /// - `log` (the replay's account): `None` when exploring;
    /// - a client's `Net::local`: its clock's last reading, set anew from global time
    ///   before every call into its engine;
    /// - a node's `next_conn`, `commands`, `published` and `notices`: counters and a
    ///   record of what ran, which no command the model sends reads; and its connection
    ///   ids, numbered in the order the node accepted them: replaced by the connection's
    ///   owner (client, endpoint, connection), as the fingerprint does.
    ///
    /// The engine is rendered by its own `Engine::fingerprint` (it has no `Debug`, and
    /// `src/` is not the model's to change): a field that one leaves out is not caught
    /// here. The round is rendered whole (`Debug`).
    pub fn whole(&self) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "tick {} now {} edges {} restarts {} resets {} restarted {}",
            self.tick,
            self.now,
            self.edges_left,
            self.restarts_left,
            self.resets_left,
            self.restarted
        );
        for (s, node) in self.servers.iter().enumerate() {
            let label = |id: u64| {
                // The node's `Debug` shows a connection as `ConnId(<n>)`.
                let shown = format!("ConnId({id})");
                self.owner(s, |i| format!("{i:?}") == shown)
                    .map_or(format!("unowned#{id}"), |(c, e, conn)| {
                        format!("c{c}e{e}#{conn}")
                    })
            };
            let _ = writeln!(
                out,
                "server {s}: {}",
                node_whole(&format!("{node:?}"), label)
            );
        }
        for (c, cl) in self.clients.iter().enumerate() {
            let mut h = DefaultHasher::new();
            cl.engine.fingerprint(&mut h);
            let net = &cl.net;
            let _ = writeln!(
                out,
                "client {c}: engine {:x} round {:?} res {} key {:?} token {:?} phase {:?} \
                 fencing {:?} chase {} stage {:?} lock {:?} attempt {} refused {} base {}",
                h.finish(),
                cl.round,
                cl.res,
                cl.key,
                cl.token,
                cl.phase,
                cl.fencing,
                cl.chase,
                cl.stage,
                cl.lock,
                cl.attempt,
                cl.refused,
                cl.buffered_base
            );
            let _ = writeln!(
                out,
                "  net: conns {:?} closed {:?} next {} log {:?} broken {:?} tokens {:?} \
                 undeleted {:?}",
                net.conns, net.closed, net.next_gen, net.log, net.broken, net.tokens, net.undeleted
            );
        }
        let _ = writeln!(
            out,
            "windows {:?}\nobserved {:?}\nowed {:?}\nreached {} violation {:?}",
            self.windows, self.observed, self.owed, self.reached, self.violation
        );
        out
    }

    /// Replays `trace` from `config`'s initial state, with every step told.
    pub fn replay(config: Config, trace: &[Action]) -> Vec<String> {
        let mut w = World::new(config);
        w.log = Some(Vec::new());
        for a in trace {
            w.step(a);
        }
        w.log.take().unwrap_or_default()
    }
}

/// What an action touches, for [`World::independent`].
#[derive(Clone, Copy, PartialEq, Eq)]
enum Touch {
    /// Anything: time, a fault, a closed connection's bytes (conservatively).
    All,
    /// Server `s` and client `c`'s connection to endpoint `e` (`Run`): the server's
    /// state, that connection's queues.
    Server { s: usize, c: usize, e: usize },
    /// Client `c`: its engine, its round and every connection of its own, and the
    /// world's records (windows, owed deletes); `Accept` also server `server`'s state.
    /// A client's action may close its own connections at their servers.
    Client { c: usize, server: Option<usize> },
}

impl World {
    fn touch(&self, a: &Action) -> Touch {
        let server = |e: usize| self.config.endpoints[e];
        match *a {
            Action::Tick
            | Action::Edge
            | Action::Restart(_)
            | Action::Reset(..)
            | Action::RunClosed(..) => Touch::All,
            Action::Run(c, e) => Touch::Server { s: server(e), c, e },
            Action::Accept(c, e) => Touch::Client {
                c,
                server: Some(server(e)),
            },
            Action::Begin(c)
            | Action::Unlock(c)
            | Action::Timeout(c)
            | Action::ReleaseHeld(c)
            | Action::Deliver(c, _) => Touch::Client { c, server: None },
        }
    }
}

impl crate::explore::Model for World {
    type Action = Action;

    fn actions(&self, out: &mut Vec<Action>) {
        // A violation, or the counterexample found, ends the search in the explorer (at
        // once, or by its `stop` bits): actions stay enabled here, so that independence,
        // which the explorer may test on such a state's pairs, is not broken by the end.
        let g = self.global();
        // Faults first while a lock is held (the restarts that can lose a key): a
        // depth-first search then reaches them early. A restart at other times (before a
        // round, it is a node that comes back young to the next one) comes last.
        let restarts = |out: &mut Vec<Action>| {
            if self.restarts_left > 0 {
                for s in 0..self.servers.len() {
                    if self.config.restart_only.is_none_or(|only| only == s) {
                        out.push(Action::Restart(s));
                    }
                }
            }
        };
        let held = self.windows.values().any(|w| w.until > g);
        if held {
            restarts(out);
        }
        for (c, cl) in self.clients.iter().enumerate() {
            let local = cl.clock.local(g);
            match cl.stage {
                // A first attempt at once; a retry, and an unlock, after the tick (a
                // depth-first search then tries waiting first).
                Stage::Idle(from) if self.tick >= from && cl.attempt == 0 => {
                    out.push(Action::Begin(c));
                }
                Stage::Round { until, .. } => {
                    if local >= until {
                        out.push(Action::Timeout(c));
                    }
                    if cl
                        .engine
                        .hold_until()
                        .is_some_and(|t| t.duration_since(cl.net.base).as_nanos() as u64 <= local)
                    {
                        out.push(Action::ReleaseHeld(c));
                    }
                }
                _ => {}
            }
            for (e, k) in cl.net.conns.iter().enumerate() {
                let Some(k) = k else { continue };
                if k.id.is_none() {
                    out.push(Action::Accept(c, e));
                    continue;
                }
                if !k.to_server.is_empty() {
                    out.push(Action::Run(c, e));
                }
                if !k.to_client.is_empty() || (k.fin && !k.fin_seen) {
                    out.push(Action::Deliver(c, e));
                }
                if self.resets_left > 0
                    && !k.fin
                    && self.config.reset_only.is_none_or(|only| only == (c, e))
                {
                    out.push(Action::Reset(c, e));
                }
            }
            for (i, (_, k)) in cl.net.closed.iter().enumerate() {
                if !k.to_server.is_empty() {
                    out.push(Action::RunClosed(c, i));
                }
            }
        }
        // Time moves on only while something is left to happen (and, when urgent, once
        // nothing is in flight).
        let busy = self.clients.iter().any(|cl| cl.stage != Stage::Done);
        let late = |c: usize, e: usize| self.config.late.contains(&(c, e));
        let quiet = !self.config.urgent
            || !out.iter().any(|a| match *a {
                Action::Run(c, e) | Action::Deliver(c, e) => !late(c, e),
                Action::Accept(..) | Action::RunClosed(..) => true,
                _ => false,
            });
        if busy && quiet {
            if self.next_edge().is_some() {
                out.push(Action::Edge);
            }
            if self.tick < self.config.ticks {
                out.push(Action::Tick);
            }
        }
        for (c, cl) in self.clients.iter().enumerate() {
            match cl.stage {
                Stage::Idle(from) if self.tick >= from && cl.attempt > 0 => {
                    out.push(Action::Begin(c));
                }
                Stage::Holding => out.push(Action::Unlock(c)),
                _ => {}
            }
        }
        if !held {
            restarts(out);
        }
    }

    fn step(&mut self, action: &Action) {
        World::step(self, action);
    }

    /// Two servers' runs commute; so do a server's run of one client's message and
    /// another client's action (which may close that client's own connections at the
    /// server: the node drops one connection, touching nothing another one holds), and
    /// two clients' actions (the world's records they write are keyed by client, not
    /// kept in order), unless both accept a connection at one server or one unlocks a
    /// resource the other may be handed. Time, faults and
    /// a closed connection's bytes are dependent on everything. The explorer's
    /// `check_independence` tests this claim state by state.
    fn independent(&self, a: &Action, b: &Action) -> bool {
        match (self.touch(a), self.touch(b)) {
            (Touch::All, _) | (_, Touch::All) => false,
            (Touch::Server { s, .. }, Touch::Server { s: t, .. }) => s != t,
            (Touch::Server { s, c, e }, Touch::Client { c: d, server })
            | (Touch::Client { c: d, server }, Touch::Server { s, c, e }) => {
                // The client's own other actions too: its reads of other connections,
                // and writes that go behind the message the server takes off the front.
                let reads_e = matches!((a, b), (Action::Deliver(_, x), _) | (_, Action::Deliver(_, x)) if *x == e);
                server != Some(s) && (c != d || !reads_e)
            }
            (Touch::Client { c, server }, Touch::Client { c: d, server: t }) => {
                // An unlock ends its window, which another client's hand-out of that
                // resource checks its own against: in that order or the other, two
                // holders or not.
                let res = |x: usize| self.clients[x].res;
                let unlock = matches!((a, b), (Action::Unlock(_), _) | (_, Action::Unlock(_)));
                c != d && (server.is_none() || server != t) && !(unlock && res(c) == res(d))
            }
        }
    }

    fn fingerprint(&self) -> u64 {
        let mut a = Fingerprinter::new();
        self.hash_into(&mut a);
        a.finish()
    }

    fn full_state(&self) -> String {
        self.whole()
    }

    fn violation(&self) -> Option<String> {
        if let Some(v) = &self.violation {
            return Some(v.clone());
        }
        for (c, cl) in self.clients.iter().enumerate() {
            let grown = cl.engine.buffered().saturating_sub(cl.buffered_base);
            if grown > BUFFER_SLACK {
                return Some(format!("client {c}: buffers grew by {grown} bytes"));
            }
            let conns = cl
                .net
                .conns
                .iter()
                .flatten()
                .chain(cl.net.closed.iter().map(|(_, k)| k));
            for k in conns {
                if k.to_server.len() > MAX_IN_FLIGHT || k.to_client.len() > MAX_IN_FLIGHT {
                    return Some(format!(
                        "client {c}: more than {MAX_IN_FLIGHT} messages in flight"
                    ));
                }
            }
        }
        None
    }

    fn at_end(&self) -> Option<String> {
        let scanned = self.unsent_delete();
        // The per-step judge (`undeleted_of`) must agree with the scan of every write.
        let kept = (0..self.clients.len()).find_map(|c| self.undeleted_of(c));
        match (scanned, kept) {
            (None, Some(v)) => Some(format!(
                "model bug: the writes' record of owed deletes finds what their log does \
                 not: {v}"
            )),
            (Some(v), None) => Some(format!(
                "model bug: the log of writes finds an owed delete their record does not: {v}"
            )),
            (scanned, _) => scanned,
        }
    }

    fn reached(&self) -> u32 {
        self.reached
    }
}

/// A message that carries a compare-and-delete (plain or fenced).
fn is_delete(b: &[u8]) -> bool {
    use quorumlock::__private::core::script::{RELEASE, RELEASE_FENCED};
    contains(b, RELEASE) || contains(b, RELEASE_FENCED)
}

/// A message that can set a lock key: a plain `SET` or the acquire script. (A fence
/// write-back carries the token too, only to compare it: it sets no key.)
fn is_set(b: &[u8]) -> bool {
    use quorumlock::__private::core::script::ACQUIRE;
    contains(b, b"$3\r\nSET\r\n") || contains(b, ACQUIRE)
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    memchr::memmem::find(hay, needle).is_some()
}

/// A token as the trace shows it: `c<client>#<attempt>`.
fn tok(t: &Token) -> String {
    tok_bytes(t.as_bytes())
}

fn tok_bytes(t: &[u8]) -> String {
    let s = String::from_utf8_lossy(t).to_string();
    let bits = u128::from_str_radix(&s, 16).unwrap_or(0);
    format!("c{}#{}", (bits >> 8) - 1, bits & 0xff)
}

fn show_key(k: &[u8]) -> String {
    String::from_utf8_lossy(k).into_owned()
}

/// RESP bytes as the trace shows them: commands as words (scripts by name, tokens as
/// `c<client>#<attempt>`), replies as their lines.
pub fn show(bytes: &[u8]) -> String {
    use quorumlock::__private::core::script;
    let scripts: [(&[u8], &str); 7] = [
        (script::RELEASE, "<release>"),
        (script::ACQUIRE, "<acquire+fence read>"),
        (script::FENCE, "<fence write-back>"),
        (script::RELEASE_FENCED, "<release fenced>"),
        (script::RELEASE_ALL, "<release all>"),
        (script::EXTEND, "<extend>"),
        (script::EXTEND_ALL, "<extend all>"),
    ];
    let word = |a: &[u8]| -> String {
        if let Some((_, name)) = scripts.iter().find(|(s, _)| *s == a) {
            return (*name).to_string();
        }
        if a.len() == 32 && a.iter().all(u8::is_ascii_hexdigit) {
            if let Ok(t) = <[u8; 32]>::try_from(a) {
                let s = String::from_utf8_lossy(&t).to_string();
                if let Ok(bits) = u128::from_str_radix(&s, 16) {
                    if bits >> 8 > 0 {
                        return format!("c{}#{}", (bits >> 8) - 1, bits & 0xff);
                    }
                }
            }
        }
        if a.starts_with(FENCE_PREFIX) {
            return format!(
                "fence:{}",
                String::from_utf8_lossy(&a[FENCE_PREFIX.len()..])
            );
        }
        if a.len() > 60 {
            return format!("<{} bytes>", a.len());
        }
        String::from_utf8_lossy(a).into_owned()
    };
    let mut out = Vec::new();
    let mut rest = bytes;
    while !rest.is_empty() {
        let Some(eol) = memchr::memmem::find(rest, b"\r\n") else {
            out.push(word(rest));
            break;
        };
        let line = &rest[..eol];
        match line.first() {
            Some(b'*') => {
                let n: usize = std::str::from_utf8(&line[1..])
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0);
                let mut at = &rest[eol + 2..];
                let mut args = Vec::new();
                for _ in 0..n {
                    let Some(e) = memchr::memmem::find(at, b"\r\n") else {
                        break;
                    };
                    let len: usize = std::str::from_utf8(&at[1..e])
                        .ok()
                        .and_then(|s| s.parse().ok())
                        .unwrap_or(0);
                    let arg = &at[e + 2..(e + 2 + len).min(at.len())];
                    args.push(word(arg));
                    at = &at[(e + 4 + len).min(at.len())..];
                }
                out.push(format!("[{}]", args.join(" ")));
                rest = at;
            }
            Some(b'$') if line != b"$-1" => {
                let len: usize = std::str::from_utf8(&line[1..])
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0);
                let body = &rest[eol + 2..(eol + 2 + len).min(rest.len())];
                if memchr::memmem::find(body, b"run_id:").is_some() {
                    out.push("<INFO>".into());
                } else {
                    out.push(format!("${}", word(body)));
                }
                rest = &rest[(eol + 4 + len).min(rest.len())..];
            }
            _ => {
                out.push(String::from_utf8_lossy(line).into_owned());
                rest = &rest[eol + 2..];
            }
        }
    }
    out.join(" ")
}

/// A node's `Debug` rendering without its counters and records of what ran (`next_conn`,
/// `commands`, `published`, `notices`), its connections renamed by `label` (from their
/// ids) and sorted by it: see [`World::whole`].
fn node_whole(debug: &str, label: impl Fn(u64) -> String) -> String {
    // The field `name: value` at the top level of the struct, as (start, end) of the
    // whole `name: value` text.
    let field = |name: &str| -> Option<(usize, usize)> {
        let start = debug.find(&format!(", {name}: "))?;
        let from = start + name.len() + 4;
        let mut depth = 0i32;
        for (i, ch) in debug[from..].char_indices() {
            match ch {
                '[' | '{' | '(' => depth += 1,
                ']' | '}' | ')' if depth > 0 => depth -= 1,
                ',' | '}' if depth == 0 => return Some((start, from + i)),
                _ => {}
            }
        }
        None
    };
    let mut out = debug.to_string();
    // From the last field to the first, so that earlier positions stay valid.
    let mut cuts: Vec<(usize, usize, String)> = Vec::new();
    for name in ["next_conn", "commands", "published", "notices"] {
        let (a, b) = field(name).unwrap_or_else(|| panic!("a node without {name}: {debug}"));
        cuts.push((a, b, String::new()));
    }
    let (a, b) = field("conns").expect("a node's connections");
    let map = &debug[a + ", conns: {".len()..b - 1];
    let mut entries: Vec<String> = Vec::new();
    let (mut depth, mut begin) = (0i32, 0usize);
    let mut push = |text: &str| {
        let text = text.trim();
        if let Some((id, rest)) = text.split_once(": ") {
            let id: u64 = id.parse().expect("a connection id");
            entries.push(format!("{}: {rest}", label(id)));
        }
    };
    for (i, ch) in map.char_indices() {
        match ch {
            '[' | '{' | '(' => depth += 1,
            ']' | '}' | ')' => depth -= 1,
            ',' if depth == 0 => {
                push(&map[begin..i]);
                begin = i + 1;
            }
            _ => {}
        }
    }
    push(&map[begin..]);
    entries.sort();
    cuts.push((a, b, format!(", conns: {{{}}}", entries.join(", "))));
    cuts.sort_by_key(|c| std::cmp::Reverse(c.0));
    for (a, b, with) in cuts {
        out.replace_range(a..b, &with);
    }
    out
}
