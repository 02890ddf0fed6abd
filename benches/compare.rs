//! quorumlock against the least any Redlock client can do, on the same local nodes.
//!
//! ```text
//! cargo bench --bench compare                          # full run (COMPARE_ITERS=20000)
//! COMPARE_QUICK=1 cargo bench --bench compare          # small run while developing
//! cargo bench --bench compare -- --quick               # same
//! cargo bench --bench compare -- --count-mode floor|quorumlock N
//! ```
//!
//! Rows of the latency table run interleaved: for each iteration, one cycle of every row
//! in turn, so scheduling noise on a shared machine hits all rows alike. Ratios are
//! medians over iterations of `row_i / base_i` (per-pair ratios), and p50 over base p50.
//!
//! `floor` is the least work possible: 5 non-blocking sockets under one `mio::Poll`,
//! pre-encoded commands written to all 5, then polled until 5 CRLF-terminated replies are
//! in. `floor, quorum` (the quorum floor) is the same, returning from acquire and release
//! alike at 3 of 5 replies, as quorumlock does; its late replies are read during the next
//! round on those connections. The ratio columns compare every row with it first.
//! `sequential` is the same commands, node after node, on blocking sockets.
//!
//! Contention: 4 threads, ONE shared key, no backoff (one attempt; lost, the next at once;
//! won, the unlock at once), each thread its own client, fixed time, the rows' slices
//! alternating: the quorum floor as a lock (SET NX PX to all, won at 3 yes, lost at 3
//! nils; release returning at 3; after a lost attempt the compare-and-delete to every
//! node, not waited for), quorumlock (`try_lock` + `unlock`, retry_count 0), and for
//! reference the quorum floor whose lost attempt waits for its delete. Successful locks
//! per second, and quorumlock's over the quorum floor's.
//!
//! Built with the `tls` feature (`cargo bench --bench compare --features tls`), the latency
//! table has one more row, interleaved with the others: quorumlock over TLS on 5 more
//! nodes that listen with `--tls-port` only (certificates made at start-up), and
//! `--count-mode quorumlock-tls N` counts it (on nodes it starts itself: under
//! `strace -f` their system calls would count too, so take only its instructions).
//!
//! `--count-mode ROW N` runs only `ROW` (`floor`, `floor-quorum`, `quorumlock`, ...) for N cycles after a
//! fixed warm-up, against the nodes in `COMPARE_PORTS` (comma-separated; started by
//! `scripts/bench-counts.sh`, so they are not traced) or, if unset, 5 nodes it starts
//! itself. It prints the allocations of the measured phase. Run it with two values of N
//! under `strace -c` / `valgrind --tool=callgrind` and divide the difference.
//!
//! Environment: `COMPARE_ITERS` (interleaved iterations, default 20000; 2000 quick),
//! `COMPARE_SECS` (seconds per fixed-time run, default 2; 0.5 quick), `COMPARE_CONTEND_SECS`
//! (seconds per row of the contention run, default 6; 1 quick), `COMPARE_QUICK=1`,
//! `COMPARE_BENCH_N` (redis-benchmark requests, default 200000; 50000 quick).

#[path = "../tests/common/mod.rs"]
mod common;

use common::Cluster;
use mio::{Events, Interest, Poll, Token};
use quorumlock::__private::core::script::{RELEASE, RELEASE_SHA};
use quorumlock::__private::resp::encode;
use quorumlock::{Error, Lock, Redlock};
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::process::{Command, Stdio};

use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

#[path = "support/counting.rs"]
mod counting;

use counting::allocs;

// ---------------------------------------------------------------------------------------
// Settings.

const NODES: usize = 5;
const TTL: Duration = Duration::from_secs(10);
const TTL_MS: &[u8] = b"10000";
/// A fixed token for the raw clients (their keys are theirs alone).
const RAW_TOKEN: &[u8] = b"0123456789abcdef0123456789abcdef";
/// Cycles every count-mode run does before the measured phase.
const COUNT_WARMUP: usize = 500;

struct Config {
    quick: bool,
    iters: usize,
    secs: f64,
    /// Seconds per row of the contention run.
    contend_secs: f64,
    bench_n: u64,
}

fn env_num<T: std::str::FromStr>(name: &str) -> Option<T> {
    let v = std::env::var(name).ok()?;
    match v.trim().parse() {
        Ok(n) => Some(n),
        Err(_) => panic!("{name}={v:?} is not a number"),
    }
}

impl Config {
    fn from_env(quick_flag: bool) -> Config {
        let quick = quick_flag || std::env::var("COMPARE_QUICK").is_ok_and(|v| v == "1");
        Config {
            quick,
            iters: env_num("COMPARE_ITERS").unwrap_or(if quick { 2000 } else { 20_000 }),
            secs: env_num("COMPARE_SECS").unwrap_or(if quick { 0.5 } else { 2.0 }),
            contend_secs: env_num("COMPARE_CONTEND_SECS").unwrap_or(if quick { 1.0 } else { 6.0 }),
            bench_n: env_num("COMPARE_BENCH_N").unwrap_or(if quick { 50_000 } else { 200_000 }),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Raw commands.

fn set_cmd(key: &str, token: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    encode::command(
        &mut out,
        &[&b"SET"[..], key.as_bytes(), token, b"NX", b"PX", TTL_MS],
    );
    out
}

fn release_cmd(key: &str, token: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    encode::command(
        &mut out,
        &[&b"EVALSHA"[..], RELEASE_SHA, b"1", key.as_bytes(), token],
    );
    out
}

fn addr(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, port))
}

/// One blocking command on a fresh connection; returns the raw first reply line(s).
fn raw_command(port: u16, args: &[&[u8]]) -> Vec<u8> {
    let mut s = TcpStream::connect(addr(port)).expect("connect for setup");
    s.set_read_timeout(Some(Duration::from_secs(5))).ok();
    let mut cmd = Vec::new();
    encode::command(&mut cmd, args);
    s.write_all(&cmd).expect("write setup command");
    let mut reply = Vec::new();
    let mut buf = [0u8; 256];
    // Replies used here are one line, or a bulk string of one line.
    loop {
        let n = s.read(&mut buf).expect("read setup reply");
        assert!(n > 0, "node on port {port} closed during setup");
        reply.extend_from_slice(&buf[..n]);
        let lines = reply.windows(2).filter(|w| w == b"\r\n").count();
        if lines >= 2 || (lines == 1 && reply[0] != b'$') {
            return reply;
        }
    }
}

/// Loads the release script (the raw clients only ever use EVALSHA).
fn load_script(ports: &[u16]) {
    for &p in ports {
        let reply = raw_command(p, &[&b"SCRIPT"[..], b"LOAD", RELEASE]);
        assert!(
            reply.windows(RELEASE_SHA.len()).any(|w| w == RELEASE_SHA),
            "SCRIPT LOAD on {p} answered {:?}, not RELEASE_SHA",
            String::from_utf8_lossy(&reply)
        );
    }
}

// ---------------------------------------------------------------------------------------
// Rows: something that can do one acquire and one release.

trait Row {
    fn acquire(&mut self);
    fn release(&mut self);
    /// Bytes the client keeps buffered, where it says.
    fn buffered(&self) -> Option<usize> {
        None
    }
    /// Failed operations so far, and the first error (the raw clients panic instead).
    fn failures(&self) -> (u64, Option<&str>) {
        (0, None)
    }
}

/// The raw fan-out under every floor: 5 non-blocking sockets under one `Poll`,
/// pre-encoded commands written whole, replies counted as `\n`-terminated lines.
///
/// Every command is answered by exactly one line (`+OK`, `$-1` for a nil, `:1`, `:0`),
/// so a node's replies are told apart by counting: `owed[i]` is how many node `i` still
/// owes, and the line that brings it to 0 answers the latest command. The earlier lines
/// are late replies of commands that did not wait for them (a call that returned at 3
/// of 5, a release written after a lost attempt): they are read and checked, never
/// waited for, before that node's reply to the latest command, in the order Redis sent
/// them (it runs a connection's commands in order).
struct FanOut {
    poll: Poll,
    events: Events,
    streams: Vec<mio::net::TcpStream>,
    bufs: Vec<[u8; 256]>,
    /// Bytes of an incomplete line at the front of `bufs[i]`.
    len: Vec<usize>,
    /// Replies node i still owes.
    owed: Vec<u32>,
}

impl FanOut {
    fn connect(ports: &[u16]) -> FanOut {
        let poll = Poll::new().expect("epoll");
        let streams = ports
            .iter()
            .enumerate()
            .map(|(i, &p)| {
                let s = TcpStream::connect(addr(p)).expect("floor connect");
                s.set_nodelay(true).expect("TCP_NODELAY");
                s.set_nonblocking(true).expect("O_NONBLOCK");
                let mut s = mio::net::TcpStream::from_std(s);
                poll.registry()
                    .register(&mut s, Token(i), Interest::READABLE)
                    .expect("register");
                s
            })
            .collect();
        FanOut {
            poll,
            events: Events::with_capacity(16),
            streams,
            bufs: vec![[0; 256]; ports.len()],
            len: vec![0; ports.len()],
            owed: vec![0; ports.len()],
        }
    }

    /// Writes `cmd` to every node.
    #[inline]
    fn send(&mut self, cmd: &[u8]) {
        for (s, owed) in self.streams.iter_mut().zip(&mut self.owed) {
            // An empty loopback socket buffer always takes a ~100-byte command whole.
            let n = s.write(cmd).expect("floor write");
            assert_eq!(n, cmd.len(), "short write");
            *owed += 1;
        }
    }

    /// Reads until `reply(node, first byte)`, called once per node with the first byte of
    /// its reply to the latest command, returns true. Late replies before it are checked
    /// (no error) and skipped. The whole of every read is processed, so `reply` may be
    /// called again after it returned true, within the same wake-up.
    #[inline]
    fn read_until(&mut self, mut reply: impl FnMut(usize, u8) -> bool) {
        let mut decided = false;
        while !decided {
            self.poll
                .poll(&mut self.events, Some(Duration::from_secs(5)))
                .expect("poll");
            assert!(!self.events.is_empty(), "floor: no reply within 5 s");
            for ev in &self.events {
                let i = ev.token().0;
                let buf = &mut self.bufs[i];
                loop {
                    let free = buf.len() - self.len[i];
                    match self.streams[i].read(&mut buf[self.len[i]..]) {
                        Ok(0) => panic!("floor: node {i} closed"),
                        Ok(n) => {
                            let end = self.len[i] + n;
                            // Count complete lines; keep a partial one at the front.
                            let mut start = 0;
                            while let Some(nl) = memchr::memchr(b'\n', &buf[start..end]) {
                                let c = buf[start];
                                assert!(c != b'-', "floor: error reply from node {i}");
                                assert!(self.owed[i] > 0, "floor: node {i} sent unasked");
                                self.owed[i] -= 1;
                                if self.owed[i] == 0 && reply(i, c) {
                                    decided = true;
                                }
                                start += nl + 1;
                            }
                            buf.copy_within(start..end, 0);
                            self.len[i] = end - start;
                            if n < free {
                                break; // drained: a later byte raises a new edge
                            }
                        }
                        Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                        Err(e) if e.kind() == ErrorKind::Interrupted => {}
                        Err(e) => panic!("floor read: {e}"),
                    }
                }
            }
        }
    }

    /// Writes `cmd` to every node and reads until `need` nodes have answered it, each
    /// with a success (`+OK` or `:1`; a nil or `:0` here means another client's key).
    fn round(&mut self, cmd: &[u8], need: usize) {
        self.send(cmd);
        let mut done = 0;
        self.read_until(|i, c| {
            assert!(c == b'+' || c == b':', "floor: reply {c:?} from node {i}");
            done += 1;
            done >= need
        });
    }
}

/// The floor rows: a lock that is only its round trips.
///
/// The `floor` row waits, in acquire and release alike, for all 5 replies. The
/// `floor, quorum` row returns from both at 3 of 5, as quorumlock does (the fair floor
/// for a call that returns at a majority); its 2 late replies are read during the next
/// round on those connections, before their reply to it (see [`FanOut`]).
struct Floor {
    net: FanOut,
    set: Vec<u8>,
    rel: Vec<u8>,
    need: usize,
}

impl Floor {
    fn new(ports: &[u16], key: &str) -> Floor {
        Floor::with_quorum(ports, key, ports.len())
    }

    fn with_quorum(ports: &[u16], key: &str, need: usize) -> Floor {
        Floor {
            net: FanOut::connect(ports),
            set: set_cmd(key, RAW_TOKEN),
            rel: release_cmd(key, RAW_TOKEN),
            need,
        }
    }
}

impl Row for Floor {
    fn acquire(&mut self) {
        self.net.round(&self.set, self.need);
    }
    fn release(&mut self) {
        self.net.round(&self.rel, self.need);
    }
}

/// The same commands, one node after another, blocking.
struct Sequential {
    streams: Vec<TcpStream>,
    buf: [u8; 64],
    set: Vec<u8>,
    rel: Vec<u8>,
}

impl Sequential {
    fn new(ports: &[u16], key: &str) -> Sequential {
        Sequential {
            streams: ports
                .iter()
                .map(|&p| {
                    let s = TcpStream::connect(addr(p)).expect("sequential connect");
                    s.set_nodelay(true).expect("TCP_NODELAY");
                    s.set_read_timeout(Some(Duration::from_secs(5))).ok();
                    s
                })
                .collect(),
            buf: [0; 64],
            set: set_cmd(key, RAW_TOKEN),
            rel: release_cmd(key, RAW_TOKEN),
        }
    }

    fn round(&mut self, which: bool, want: &[u8]) {
        let cmd = if which { &self.set } else { &self.rel };
        for s in &mut self.streams {
            s.write_all(cmd).expect("sequential write");
            let mut got = 0;
            while got < 2 || self.buf[got - 2..got] != *b"\r\n" {
                let n = s.read(&mut self.buf[got..]).expect("sequential read");
                assert!(n > 0, "sequential: node closed");
                got += n;
            }
            assert_eq!(&self.buf[..got], want, "sequential: unexpected reply");
        }
    }
}

impl Row for Sequential {
    fn acquire(&mut self) {
        self.round(true, b"+OK\r\n");
    }
    fn release(&mut self) {
        self.round(false, b":1\r\n");
    }
}

/// The library: `try_lock` then `unlock`.
struct Quorumlock {
    rl: Redlock,
    key: String,
    lock: Option<Lock>,
    /// Nodes the release must report (5, or 3 with two frozen).
    min_released: usize,
    /// Failed operations (counted, not fatal: node_timeout is the default 50 ms, and a
    /// shared machine can stall longer).
    failures: u64,
    first_error: Option<String>,
}

/// What a metrics observer does: counts every node's outcome, sums the latencies (the
/// `quorumlock-observed` row: the cost of an observer set).
#[derive(Default)]
struct Tally {
    outcomes: std::sync::atomic::AtomicU64,
    micros: std::sync::atomic::AtomicU64,
}

impl quorumlock::Observer for Tally {
    fn round(&self, e: &quorumlock::RoundEvent<'_>) {
        use std::sync::atomic::Ordering::Relaxed;
        for n in e.nodes() {
            self.outcomes.fetch_add(1, Relaxed);
            let micros = n.latency().map_or(0, |l| l.as_micros() as u64);
            self.micros.fetch_add(micros, Relaxed);
        }
    }
}

impl Quorumlock {
    fn new(urls: &[String], key: &str) -> Quorumlock {
        Quorumlock::built(Redlock::builder().nodes(urls), key)
    }

    fn built(builder: quorumlock::Builder, key: &str) -> Quorumlock {
        let mut rl = builder.build().expect("quorumlock client");
        // Connections open in the background: wait for the first full cycle.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match rl.try_lock(key, TTL) {
                Ok(lock) => {
                    rl.unlock(&lock).expect("first unlock");
                    break;
                }
                Err(e) if Instant::now() < deadline => {
                    eprintln!("quorumlock warm-up: {e}");
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => panic!("quorumlock never got a lock: {e}"),
            }
        }
        let min_released = rl.quorum();
        Quorumlock {
            rl,
            key: key.to_string(),
            lock: None,
            min_released,
            failures: 0,
            first_error: None,
        }
    }
}

impl Quorumlock {
    fn fail(&mut self, e: String) {
        self.failures += 1;
        if self.first_error.is_none() {
            eprintln!("{}: {e}", self.key);
            self.first_error = Some(e);
        }
    }
}

impl Row for Quorumlock {
    fn acquire(&mut self) {
        match self.rl.try_lock(&self.key, TTL) {
            Ok(lock) => self.lock = Some(lock),
            Err(e) => self.fail(format!("try_lock: {e}")),
        }
    }
    fn release(&mut self) {
        let Some(lock) = self.lock.take() else {
            return; // the acquire failed (counted)
        };
        match self.rl.unlock(&lock) {
            Ok(n) if n >= self.min_released => {}
            Ok(n) => self.fail(format!("unlock released on {n} nodes")),
            Err(e) => self.fail(format!("unlock: {e}")),
        }
    }
    fn failures(&self) -> (u64, Option<&str>) {
        (self.failures, self.first_error.as_deref())
    }
    fn buffered(&self) -> Option<usize> {
        Some(self.rl.buffered_bytes())
    }
}

/// The TLS nodes of a run and their certificates (dropped at its end).
#[cfg(feature = "tls")]
type TlsNodes = Option<(common::tls::Certs, Vec<common::tls::TlsNode>)>;

/// quorumlock over TLS: 5 nodes that listen with `--tls-port` only, started into `keep`.
#[cfg(feature = "tls")]
fn tls_row(keep: &mut TlsNodes, key: &str) -> Quorumlock {
    let certs = common::tls::Certs::new();
    let nodes: Vec<common::tls::TlsNode> = (0..NODES)
        .map(|_| common::tls::TlsNode::start(&certs, false))
        .collect();
    let urls: Vec<String> = nodes.iter().map(common::tls::TlsNode::url).collect();
    let builder = Redlock::builder()
        .nodes(&urls)
        .tls_ca_file(certs.path("ca.crt"));
    *keep = Some((certs, nodes));
    Quorumlock::built(builder, key)
}

// ---------------------------------------------------------------------------------------
// Contention: threads taking turns at ONE key, no backoff.

/// Threads of the contention runs.
const CONTEND_THREADS: usize = 4;
/// Length of one slice of a contention run; the rows' slices alternate.
const CONTEND_SLICE_SECS: f64 = 0.5;

/// One contending client: one attempt at the shared key, and if it won, the unlock at once.
trait Contender: Send {
    /// Whether the attempt won (it was then released).
    fn attempt(&mut self) -> bool;
    /// Operations that failed other than by losing to another thread, and the first error.
    fn failures(&self) -> (u64, Option<&str>) {
        (0, None)
    }
}

/// The quorum floor as a lock: `SET NX PX` to all 5, won at 3 `+OK`, lost at 3 nils (3
/// yes can no longer come). Won: the compare-and-delete to all 5, returning at 3 replies.
/// Lost: the compare-and-delete to every node the SET was written to (all 5), written
/// and not waited for; its replies are read by the next round (see [`FanOut`]). No token
/// per attempt, no clock, no validity: one fixed token per thread (a connection runs its
/// commands in order, so an earlier attempt's delete cannot meet a later attempt's key).
///
/// With `wait_cleanup`, a lost attempt waits for all 5 replies to its delete before the
/// next attempt (what rslock does, and quorumlock did before issue #9 section 4): a
/// reference row, to show what not waiting does under contention.
struct FloorLock {
    net: FanOut,
    set: Vec<u8>,
    rel: Vec<u8>,
    quorum: usize,
    wait_cleanup: bool,
}

impl FloorLock {
    fn new(ports: &[u16], key: &str, thread: usize, wait_cleanup: bool) -> FloorLock {
        let token = format!("{thread:032x}");
        FloorLock {
            net: FanOut::connect(ports),
            set: set_cmd(key, token.as_bytes()),
            rel: release_cmd(key, token.as_bytes()),
            quorum: ports.len() / 2 + 1,
            wait_cleanup,
        }
    }
}

impl Contender for FloorLock {
    fn attempt(&mut self) -> bool {
        let quorum = self.quorum;
        let n = self.net.streams.len();
        let nays_to_lose = n - quorum + 1;
        let (mut yes, mut no) = (0, 0);
        self.net.send(&self.set);
        self.net.read_until(|i, c| {
            match c {
                b'+' => yes += 1,
                b'$' => no += 1, // `$-1`: the key is another thread's
                _ => panic!("floor lock: SET reply {c:?} from node {i}"),
            }
            yes >= quorum || no >= nays_to_lose
        });
        let won = yes >= quorum;
        self.net.send(&self.rel);
        let need = match (won, self.wait_cleanup) {
            (true, _) => quorum,
            (false, true) => n,
            (false, false) => return false,
        };
        let mut answered = 0;
        self.net.read_until(|i, c| {
            assert_eq!(c, b':', "floor lock: release reply from node {i}");
            answered += 1;
            answered >= need
        });
        won
    }
}

/// quorumlock: `try_lock` (retry_count 0, one attempt) and, if won, `unlock`.
struct QlContender {
    rl: Redlock,
    key: String,
    failures: u64,
    first_error: Option<String>,
}

impl QlContender {
    fn new(urls: &[String], key: &str, thread: usize) -> QlContender {
        let mut rl = Redlock::builder()
            .nodes(urls)
            .retry_count(0)
            .build()
            .expect("quorumlock client");
        // Connections open in the background: wait for a first cycle on a key of its own.
        let own = format!("{key}:warm:{thread}");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match rl.try_lock(&own, TTL) {
                Ok(lock) => {
                    rl.unlock(&lock).expect("first unlock");
                    break;
                }
                Err(e) if Instant::now() < deadline => {
                    eprintln!("quorumlock contender warm-up: {e}");
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => panic!("quorumlock never got a lock: {e}"),
            }
        }
        QlContender {
            rl,
            key: key.to_string(),
            failures: 0,
            first_error: None,
        }
    }

    fn fail(&mut self, e: String) {
        self.failures += 1;
        self.first_error.get_or_insert(e);
    }
}

impl Contender for QlContender {
    fn attempt(&mut self) -> bool {
        match self.rl.try_lock(&self.key, TTL) {
            Ok(lock) => match self.rl.unlock(&lock) {
                Ok(_) => true,
                Err(e) => {
                    self.fail(format!("unlock: {e}"));
                    false
                }
            },
            Err(Error::Taken(_)) => false,
            Err(e) => {
                self.fail(format!("try_lock: {e}"));
                false
            }
        }
    }
    fn failures(&self) -> (u64, Option<&str>) {
        (self.failures, self.first_error.as_deref())
    }
}

#[derive(Default, Clone, Copy)]
struct Contention {
    /// Attempts that won (and were released).
    won: u64,
    attempts: u64,
    /// Wall time, mean over the threads.
    secs: f64,
}

fn add(a: Contention, b: Contention) -> Contention {
    Contention {
        won: a.won + b.won,
        attempts: a.attempts + b.attempts,
        secs: a.secs + b.secs,
    }
}

impl Contention {
    fn locks_per_s(&self) -> f64 {
        self.won as f64 / self.secs.max(1e-9)
    }
    fn attempts_per_s(&self) -> f64 {
        self.attempts as f64 / self.secs.max(1e-9)
    }
}

/// Every client in `clients` on its own thread, attempting without pause for `secs`.
fn contend_slice<C: Contender>(clients: &mut [C], secs: f64) -> Contention {
    let barrier = Barrier::new(clients.len());
    let total = Mutex::new(Contention::default());
    std::thread::scope(|s| {
        for c in clients.iter_mut() {
            let (barrier, total) = (&barrier, &total);
            s.spawn(move || {
                barrier.wait();
                let start = Instant::now();
                let until = start + Duration::from_secs_f64(secs);
                let (mut won, mut attempts) = (0, 0);
                while Instant::now() < until {
                    attempts += 1;
                    won += u64::from(c.attempt());
                }
                let el = start.elapsed().as_secs_f64();
                let mut t = total.lock().unwrap_or_else(|e| e.into_inner());
                t.won += won;
                t.attempts += attempts;
                t.secs += el;
            });
        }
    });
    let mut t = total.into_inner().unwrap_or_else(|e| e.into_inner());
    t.secs /= clients.len() as f64;
    t
}

struct ContentionResult {
    floor: Contention,
    /// The floor whose lost attempts wait for their delete.
    floor_wait: Contention,
    ql: Contention,
    /// Per slice pair: quorumlock's locks/s over the floor's.
    slice_ratios: Vec<f64>,
    slices: usize,
    ql_failures: (u64, Option<String>),
}

/// `CONTEND_THREADS` threads on one key, the rows' slices alternating (each row its own
/// key), `secs` per row in all.
fn contention(ports: &[u16], urls: &[String], secs: f64) -> ContentionResult {
    let mut floor: Vec<FloorLock> = (0..CONTEND_THREADS)
        .map(|t| FloorLock::new(ports, "cmp:contend:floor", t, false))
        .collect();
    let mut floor_wait: Vec<FloorLock> = (0..CONTEND_THREADS)
        .map(|t| FloorLock::new(ports, "cmp:contend:floor-wait", t, true))
        .collect();
    let mut ql: Vec<QlContender> = (0..CONTEND_THREADS)
        .map(|t| QlContender::new(urls, "cmp:contend:ql", t))
        .collect();
    contend_slice(&mut floor, 0.25);
    contend_slice(&mut floor_wait, 0.25);
    contend_slice(&mut ql, 0.25);
    let slices = ((secs / CONTEND_SLICE_SECS).round() as usize).max(1);
    let slice = secs / slices as f64;
    let (mut f, mut fw, mut q) = Default::default();
    let mut slice_ratios = Vec::with_capacity(slices);
    for _ in 0..slices {
        let a = contend_slice(&mut floor, slice);
        let b = contend_slice(&mut ql, slice);
        fw = add(fw, contend_slice(&mut floor_wait, slice));
        slice_ratios.push(b.locks_per_s() / a.locks_per_s().max(1e-9));
        f = add(f, a);
        q = add(q, b);
    }
    let mut ql_failures = (0, None);
    for c in &ql {
        let (n, e) = c.failures();
        ql_failures.0 += n;
        if ql_failures.1.is_none() {
            ql_failures.1 = e.map(str::to_string);
        }
    }
    ContentionResult {
        floor: f,
        floor_wait: fw,
        ql: q,
        slice_ratios,
        slices,
        ql_failures,
    }
}

// ---------------------------------------------------------------------------------------
// Statistics.

#[derive(Default)]
struct Samples {
    acq: Vec<u64>,
    rel: Vec<u64>,
    allocs: u64,
}

fn pct(sorted: &[u64], q: f64) -> u64 {
    let n = sorted.len();
    let rank = ((q * n as f64).ceil() as usize).clamp(1, n);
    sorted[rank - 1]
}

fn sorted(v: &[u64]) -> Vec<u64> {
    let mut s = v.to_vec();
    s.sort_unstable();
    s
}

fn median_f(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn pair_ratio(a: &[u64], b: &[u64]) -> f64 {
    median_f(
        a.iter()
            .zip(b)
            .map(|(&x, &y)| x as f64 / y.max(1) as f64)
            .collect(),
    )
}

fn us(ns: u64) -> String {
    format!("{:.1}", ns as f64 / 1000.0)
}

fn rate(x: f64) -> String {
    if x >= 100.0 {
        format!("{:.0}", x)
    } else {
        format!("{:.1}", x)
    }
}

// ---------------------------------------------------------------------------------------
// Machine description.

fn machine() -> String {
    let nproc = Command::new("nproc")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get().to_string())
                .unwrap_or_else(|_| "?".into())
        });
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|l| l.trim_start_matches([' ', '\t', ':']).trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let redis = Command::new(common::redis_server_path())
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| "redis-server ?".into());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    format!("nproc={nproc}; CPU: {cpu}; Linux {kernel}; {redis}")
}

// ---------------------------------------------------------------------------------------
// Sections.

fn ports_of(c: &Cluster) -> Vec<u16> {
    (0..c.len())
        .map(|i| c.node(i).port().expect("tcp node"))
        .collect()
}

fn urls_of(ports: &[u16]) -> Vec<String> {
    ports
        .iter()
        .map(|p| format!("redis://127.0.0.1:{p}"))
        .collect()
}

/// Cycles per second with `threads` threads, each with its own client from `make(t)`,
/// for `secs` seconds.
fn threaded<R: Row>(threads: usize, secs: f64, make: impl Fn(usize) -> R + Sync) -> (f64, u64) {
    let barrier = Barrier::new(threads);
    let total = Mutex::new((0.0f64, 0u64));
    std::thread::scope(|s| {
        for t in 0..threads {
            let (barrier, total, make) = (&barrier, &total, &make);
            s.spawn(move || {
                let mut row = make(t);
                for _ in 0..200 {
                    row.acquire();
                    row.release();
                }
                barrier.wait();
                let start = Instant::now();
                let until = start + Duration::from_secs_f64(secs);
                let mut n = 0u64;
                while Instant::now() < until {
                    row.acquire();
                    row.release();
                    n += 1;
                }
                let r = n as f64 / start.elapsed().as_secs_f64();
                let mut t = total.lock().unwrap_or_else(|e| e.into_inner());
                t.0 += r;
                t.1 += row.failures().0;
            });
        }
    });
    total.into_inner().unwrap_or_else(|e| e.into_inner())
}

struct BatchResult {
    /// Locks acquired and released without error, per second.
    locks_per_s: f64,
    us_per_batch: f64,
    batches: u64,
    /// Per-resource errors of try_lock_many / unlock_many (not panics: node_timeout is
    /// the library's default, and bounds a whole K-item round).
    failed: u64,
    first_error: Option<String>,
}

/// try_lock_many + unlock_many of `k` resources, repeated for `secs` seconds.
fn batch(rl: &mut Redlock, k: usize, secs: f64) -> BatchResult {
    let resources: Vec<String> = (0..k).map(|i| format!("cmp:batch:{k}:{i}")).collect();
    let quorum = rl.quorum();
    let mut failed = 0u64;
    let mut first_error = None;
    let mut cycle = |rl: &mut Redlock| -> u64 {
        let mut locks = Vec::with_capacity(k);
        for r in rl.try_lock_many(&resources, TTL) {
            match r {
                Ok(l) => locks.push(l),
                Err(e) => {
                    failed += 1;
                    first_error.get_or_insert_with(|| format!("try_lock_many: {e}"));
                }
            }
        }
        let mut ok = 0;
        for r in rl.unlock_many(&locks) {
            match r {
                Ok(n) if n >= quorum => ok += 1,
                Ok(n) => {
                    failed += 1;
                    first_error.get_or_insert_with(|| format!("unlock_many released on {n}"));
                }
                Err(e) => {
                    failed += 1;
                    first_error.get_or_insert_with(|| format!("unlock_many: {e}"));
                }
            }
        }
        ok
    };
    for _ in 0..20 {
        cycle(rl);
    }
    let start = Instant::now();
    let until = start + Duration::from_secs_f64(secs);
    let (mut batches, mut locked) = (0u64, 0u64);
    while Instant::now() < until {
        locked += cycle(rl);
        batches += 1;
    }
    let el = start.elapsed().as_secs_f64();
    BatchResult {
        locks_per_s: locked as f64 / el,
        us_per_batch: el * 1e6 / batches as f64,
        batches,
        failed,
        first_error,
    }
}

/// `redis-benchmark -p PORT -t set -n N -P 16 -q`: SET requests per second.
fn redis_benchmark(port: u16, n: u64) -> Result<f64, String> {
    let out = Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(["-t", "set", "-n", &n.to_string(), "-P", "16", "-q"])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("redis-benchmark: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    // Progress lines are separated by '\r'; the result is "SET: 123.45 requests per second, ...".
    text.split(['\r', '\n'])
        .filter_map(|l| l.trim().strip_prefix("SET:"))
        .filter_map(|l| {
            l.split_whitespace()
                .collect::<Vec<_>>()
                .windows(2)
                .find_map(|w| {
                    (w[1] == "requests")
                        .then(|| w[0].parse::<f64>().ok())
                        .flatten()
                })
        })
        .next_back()
        .ok_or_else(|| format!("cannot parse redis-benchmark output: {text:?}"))
}

fn full(cfg: &Config) {
    eprintln!("starting 2 x {NODES} redis-server nodes ...");
    let main = Cluster::start(NODES);
    let frozen = Cluster::start(NODES);
    let ports = ports_of(&main);
    let urls = main.urls();
    load_script(&ports);
    load_script(&ports_of(&frozen));

    #[cfg_attr(not(feature = "tls"), allow(unused_mut, clippy::useless_vec))]
    let mut names = vec![
        "floor",
        "floor, quorum (returns at 3 of 5)",
        "sequential",
        "quorumlock",
        "quorumlock, 2 of 5 frozen",
    ];
    const FLOOR_Q: usize = 1;
    const QL: usize = 3;
    const FROZEN: usize = 4;
    let mut rows: Vec<Box<dyn Row>> = vec![
        Box::new(Floor::new(&ports, "cmp:floor")),
        Box::new(Floor::with_quorum(&ports, "cmp:floor-q", NODES / 2 + 1)),
        Box::new(Sequential::new(&ports, "cmp:seq")),
        Box::new(Quorumlock::new(&urls, "cmp:ql")),
        Box::new(Quorumlock::new(&frozen.urls(), "cmp:ql-frozen")),
    ];
    // With the `tls` feature: quorumlock over TLS (`rediss://`, 5 more nodes with
    // `--tls-port` only, certificates made here), interleaved with the plain rows.
    #[cfg(feature = "tls")]
    let mut tls_nodes = None;
    #[cfg(feature = "tls")]
    {
        names.push("quorumlock, TLS (rediss://)");
        rows.push(Box::new(tls_row(&mut tls_nodes, "cmp:ql-tls")));
    }
    let warmup = (cfg.iters / 10).clamp(100, 2000);
    eprintln!("warm-up: {warmup} interleaved cycles");
    for _ in 0..warmup {
        for r in rows.iter_mut() {
            r.acquire();
            r.release();
        }
    }
    // Freeze two nodes of the second cluster; its client was built and warmed on all 5.
    frozen.node(3).freeze();
    frozen.node(4).freeze();
    let frozen_buf_before = rows[FROZEN].buffered();

    eprintln!("measuring: {} interleaved iterations", cfg.iters);
    let mut samples: Vec<Samples> = (0..rows.len())
        .map(|_| Samples {
            acq: Vec::with_capacity(cfg.iters),
            rel: Vec::with_capacity(cfg.iters),
            allocs: 0,
        })
        .collect();
    for _ in 0..cfg.iters {
        for (r, s) in rows.iter_mut().zip(samples.iter_mut()) {
            let (a0, _) = allocs();
            let t0 = Instant::now();
            r.acquire();
            let t1 = Instant::now();
            r.release();
            let t2 = Instant::now();
            let (a1, _) = allocs();
            s.acq.push((t1 - t0).as_nanos() as u64);
            s.rel.push((t2 - t1).as_nanos() as u64);
            s.allocs += a1 - a0;
        }
    }
    let frozen_buf_after = rows[FROZEN].buffered();
    let failures: Vec<(u64, Option<String>)> = rows
        .iter()
        .map(|r| {
            let (n, e) = r.failures();
            (n, e.map(str::to_string))
        })
        .collect();
    drop(rows);
    frozen.node(3).thaw();
    frozen.node(4).thaw();
    drop(frozen);

    // Contention: 4 threads, one key, no backoff; floor and quorumlock slices alternate.
    eprintln!(
        "contention: {CONTEND_THREADS} threads, one key, {} s per row",
        cfg.contend_secs
    );
    let contended = contention(&ports, &urls, cfg.contend_secs);

    // Fixed-time throughput, 1 and 4 threads, each thread its own client and keys.
    eprintln!("threads: {} s per run", cfg.secs);
    let mut thr = Vec::new();
    for threads in [1usize, 4] {
        let f = threaded(threads, cfg.secs, |t| {
            Floor::new(&ports, &format!("cmp:thr:floor:{t}"))
        });
        let q = threaded(threads, cfg.secs, |t| {
            Quorumlock::new(&urls, &format!("cmp:thr:ql:{t}"))
        });
        thr.push((threads, f, q));
    }

    // Batches.
    eprintln!("batches: {} s per K", cfg.secs);
    let mut rl = Quorumlock::new(&urls, "cmp:batch:warm").rl;
    let batches: Vec<(usize, BatchResult)> = [1usize, 16, 256]
        .into_iter()
        .map(|k| (k, batch(&mut rl, k, cfg.secs)))
        .collect();
    drop(rl);
    eprintln!("redis-benchmark -n {} on node 0 ...", cfg.bench_n);
    let ceiling = redis_benchmark(ports[0], cfg.bench_n);
    drop(main);

    // ---- Report (stdout, Markdown) ----
    println!("### quorumlock vs floor: 5 local redis-server nodes, loopback\n");
    println!("Machine: {}\n", machine());
    println!(
        "Settings: {} interleaved iterations after {warmup} warm-up cycles{}; fixed-time runs {} s; \
         ttl {} ms; node_timeout default (50 ms).\n",
        cfg.iters,
        if cfg.quick { " (quick)" } else { "" },
        cfg.secs,
        TTL.as_millis()
    );
    println!("#### Latency, µs (rows interleaved per iteration)\n");
    println!(
        "| row | acquire p50 | p99 | p99.9 | release p50 | p99 | p99.9 | max cycle | cycles > 10 ms | failed ops | cycles/s | allocs/cycle |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for ((name, s), (failed, _)) in names.iter().zip(&samples).zip(&failures) {
        let a = sorted(&s.acq);
        let r = sorted(&s.rel);
        let cyc: Vec<u64> = s.acq.iter().zip(&s.rel).map(|(x, y)| x + y).collect();
        let total: u64 = cyc.iter().sum();
        let max = cyc.iter().copied().max().unwrap_or(0);
        let stalls = cyc.iter().filter(|&&c| c > 10_000_000).count();
        println!(
            "| {name} | {} | {} | {} | {} | {} | {} | {} | {stalls} | {failed} | {} | {:.2} |",
            us(pct(&a, 0.5)),
            us(pct(&a, 0.99)),
            us(pct(&a, 0.999)),
            us(pct(&r, 0.5)),
            us(pct(&r, 0.99)),
            us(pct(&r, 0.999)),
            us(max),
            rate(s.acq.len() as f64 / (total as f64 / 1e9)),
            s.allocs as f64 / s.acq.len() as f64,
        );
    }
    for (name, (_, e)) in names.iter().zip(&failures) {
        if let Some(e) = e {
            println!("\n{name}, first failure: {e}");
        }
    }
    println!(
        "\n#### Ratios (median of per-iteration ratios row_i / base_i, and p50 / base p50); \
         base: the quorum floor (returns at 3 of 5), then the floor (waits for 5)\n"
    );
    println!(
        "| row | acquire vs quorum floor: median(row_i/fq_i) | p50/p50 | release vs quorum floor: median(row_i/fq_i) | p50/p50 | cycle vs quorum floor | acquire vs floor: median(row_i/floor_i) | release vs floor | cycle vs floor |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let cyc = |s: &Samples| -> Vec<u64> { s.acq.iter().zip(&s.rel).map(|(x, y)| x + y).collect() };
    let floor_cyc = cyc(&samples[0]);
    let fq = &samples[FLOOR_Q];
    let fq_cyc = cyc(fq);
    let fq_acq = sorted(&fq.acq);
    let fq_rel = sorted(&fq.rel);
    let p50_ratio = |v: &[u64], base: &[u64]| pct(v, 0.5) as f64 / pct(base, 0.5).max(1) as f64;
    for (name, s) in names.iter().zip(&samples) {
        let a = sorted(&s.acq);
        let r = sorted(&s.rel);
        println!(
            "| {name} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
            pair_ratio(&s.acq, &fq.acq),
            p50_ratio(&a, &fq_acq),
            pair_ratio(&s.rel, &fq.rel),
            p50_ratio(&r, &fq_rel),
            pair_ratio(&cyc(s), &fq_cyc),
            pair_ratio(&s.acq, &samples[0].acq),
            pair_ratio(&s.rel, &samples[0].rel),
            pair_ratio(&cyc(s), &floor_cyc),
        );
    }
    let ql_rel = sorted(&samples[QL].rel);
    let rel_goal = p50_ratio(&ql_rel, &fq_rel);
    println!(
        "\nRelease p50: quorumlock {} µs, quorum floor {} µs: {rel_goal:.2}× \
         (median of per-iteration ratios {:.2}×; goal ≤ 1.05×: {}).",
        us(pct(&ql_rel, 0.5)),
        us(pct(&fq_rel, 0.5)),
        pair_ratio(&samples[QL].rel, &fq.rel),
        if rel_goal <= 1.05 { "met" } else { "not met" }
    );
    if let (Some(b), Some(a)) = (frozen_buf_before, frozen_buf_after) {
        println!(
            "\nFrozen-row client: `buffered_bytes()` = {b} before freezing, {a} after {} cycles.",
            cfg.iters
        );
    }
    let c = &contended;
    println!(
        "\n#### Contention: {CONTEND_THREADS} threads, one key, no backoff ({:.1} s per row, \
         in {} slices of {:.2} s alternating between the rows)\n",
        cfg.contend_secs,
        c.slices,
        cfg.contend_secs / c.slices as f64
    );
    println!("| row | successful locks/s | attempts/s | won | attempts | failed ops |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (name, r, failed) in [
        (
            "quorum floor (raw fan-out lock, decides at 3 of 5)",
            &c.floor,
            0,
        ),
        ("quorumlock (`try_lock` + `unlock`)", &c.ql, c.ql_failures.0),
        (
            "reference: quorum floor whose lost attempt waits for its delete (5 of 5)",
            &c.floor_wait,
            0,
        ),
    ] {
        println!(
            "| {name} | {} | {} | {} | {} | {failed} |",
            rate(r.locks_per_s()),
            rate(r.attempts_per_s()),
            r.won,
            r.attempts
        );
    }
    let contend_ratio = c.ql.locks_per_s() / c.floor.locks_per_s().max(1e-9);
    println!(
        "\nquorumlock / quorum floor, successful locks/s: {contend_ratio:.2}× \
         (median of per-slice ratios {:.2}×; goal ≥ 0.9×: {}).",
        median_f(c.slice_ratios.clone()),
        if contend_ratio >= 0.9 {
            "met"
        } else {
            "not met"
        }
    );
    if let Some(e) = &c.ql_failures.1 {
        println!("\nquorumlock contention, first failure: {e}");
    }
    println!(
        "\n#### Throughput, acquire+release cycles/s (each thread its own client and key; {} s each)\n",
        cfg.secs
    );
    println!("| threads | floor | quorumlock | quorumlock / floor | quorumlock failed ops |");
    println!("|---:|---:|---:|---:|---:|");
    for (t, (f, _), (q, qf)) in &thr {
        println!(
            "| {t} | {} | {} | {:.2} | {qf} |",
            rate(*f),
            rate(*q),
            q / f
        );
    }
    println!(
        "\n#### Batches: try_lock_many + unlock_many, 5 nodes ({} s each)\n",
        cfg.secs
    );
    println!("| K | locks/s | µs per K-batch (lock+unlock) | batches | failed |");
    println!("|---:|---:|---:|---:|---:|");
    for (k, b) in &batches {
        println!(
            "| {k} | {} | {:.1} | {} | {} |",
            rate(b.locks_per_s),
            b.us_per_batch,
            b.batches,
            b.failed
        );
    }
    for (k, b) in &batches {
        if let Some(e) = &b.first_error {
            println!("\nK={k}, first failure: {e}");
        }
    }
    match ceiling {
        Ok(rps) => println!(
            "\nCeiling: `redis-benchmark -t set -n {} -P 16 -q` on one node of the same cluster: \
             {} SET/s (a lock costs 5 SETs + 5 EVALSHAs over the 5 nodes sharing the cores).",
            cfg.bench_n,
            rate(rps)
        ),
        Err(e) => println!("\nCeiling: redis-benchmark failed: {e}"),
    }
}

/// `--count-mode ROW N`: N cycles of one row after a fixed warm-up; nothing else.
///
/// Rows: `floor`, `floor-quorum`, `sequential`, `quorumlock`, `quorumlock-observed` (with a
/// counting observer set), and `quorumlock-frozen`
/// (a soak test, own nodes only: nodes 3 and 4 are frozen after the warm-up, and the
/// slow cycles and client buffers are reported).
fn count_mode(row: &str, n: usize) {
    let mut own: Option<Cluster> = None;
    // The TLS row's own nodes (and certificates), kept until the end.
    #[cfg(feature = "tls")]
    let mut tls_nodes = None;
    let ports: Vec<u16> = match std::env::var("COMPARE_PORTS") {
        Ok(list) if row != "quorumlock-frozen" => list
            .split(',')
            .map(|p| {
                p.trim()
                    .parse()
                    .expect("COMPARE_PORTS: comma-separated ports")
            })
            .collect(),
        _ => ports_of(own.insert(Cluster::start(NODES))),
    };
    load_script(&ports);
    let mut r: Box<dyn Row> = match row {
        "floor" => Box::new(Floor::new(&ports, "cnt:floor")),
        "floor-quorum" => Box::new(Floor::with_quorum(&ports, "cnt:floor-q", NODES / 2 + 1)),
        "sequential" => Box::new(Sequential::new(&ports, "cnt:seq")),
        "quorumlock" | "quorumlock-frozen" => Box::new(Quorumlock::new(&urls_of(&ports), "cnt:ql")),
        "quorumlock-observed" => {
            let builder = Redlock::builder()
                .nodes(urls_of(&ports))
                .observer(Tally::default());
            Box::new(Quorumlock::built(builder, "cnt:ql-obs"))
        }
        #[cfg(feature = "tls")]
        "quorumlock-tls" => Box::new(tls_row(&mut tls_nodes, "cnt:ql-tls")),
        other => panic!(
            "--count-mode: unknown row {other:?} \
             (floor|floor-quorum|sequential|quorumlock|quorumlock-observed|quorumlock-frozen, \
             and with the tls feature quorumlock-tls)"
        ),
    };
    for _ in 0..COUNT_WARMUP {
        r.acquire();
        r.release();
    }
    let soak = row == "quorumlock-frozen";
    if let (true, Some(c)) = (soak, &own) {
        c.node(3).freeze();
        c.node(4).freeze();
    }
    let buf0 = r.buffered();
    let (a0, b0) = allocs();
    let (mut max, mut slow, mut worst_at) = (Duration::ZERO, 0u64, 0usize);
    let start = Instant::now();
    for i in 0..n {
        let t = soak.then(Instant::now);
        r.acquire();
        r.release();
        if let Some(t) = t {
            let d = t.elapsed();
            if d > Duration::from_millis(10) {
                slow += 1;
                eprintln!("cycle {i}: {d:?}");
            }
            if d > max {
                (max, worst_at) = (d, i);
            }
        }
    }
    let elapsed = start.elapsed();
    let (a1, b1) = allocs();
    println!(
        "count-mode row={row} n={n} allocs={} alloc_bytes={} failed_ops={}",
        a1 - a0,
        b1 - b0,
        r.failures().0
    );
    if soak {
        println!(
            "soak: {n} cycles in {elapsed:?}; {slow} cycles over 10 ms; worst {max:?} at cycle {worst_at}; \
             buffered_bytes() {:?} -> {:?}",
            buf0,
            r.buffered()
        );
        if let Some(c) = &own {
            c.node(3).thaw();
            c.node(4).thaw();
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut quick = false;
    let mut count: Option<(String, usize)> = None;
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--bench" => {} // added by `cargo bench`
            "--quick" => quick = true,
            "--count-mode" => {
                let row = args.get(i + 1).expect("--count-mode ROW N").clone();
                let n = args
                    .get(i + 2)
                    .and_then(|s| s.parse().ok())
                    .expect("--count-mode ROW N: N cycles");
                count = Some((row, n));
                i += 2;
            }
            other => eprintln!("compare: ignoring argument {other:?}"),
        }
        i += 1;
    }
    match count {
        Some((row, n)) => count_mode(&row, n),
        None => full(&Config::from_env(quick)),
    }
}
