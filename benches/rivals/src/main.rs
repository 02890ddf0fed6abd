//! quorumlock against two published Redlock clients, on the same 5 local redis-server
//! nodes (started here through the repository's test harness).
//!
//! ```text
//! cargo run --release --manifest-path benches/rivals/Cargo.toml
//! RIVALS_ITERS=2000 cargo run --release --manifest-path benches/rivals/Cargo.toml
//! ```
//!
//! Section 1 (healthy): after `WARMUP` cycles per client, `RIVALS_ITERS` iterations; each
//! iteration runs one acquire+release cycle of every client in turn (A B C A B C …), so
//! scheduling noise on a shared machine hits all rows alike. The ratio column is the
//! median over iterations of `row_cycle_i / quorumlock_cycle_i`.
//!
//! Section 2 (contention): `CONTEND_THREADS` threads, each with its own client, take turns
//! at ONE key with no backoff (one attempt; lost, the next at once; won, the unlock at
//! once), for quorumlock and rslock; their 0.5 s slices alternate, `RIVALS_CONTEND_SECS`
//! (default 6) per client in all. Reported: successful locks per second and the ratio.
//!
//! Section 3 (2 of 5 nodes frozen with SIGSTOP): each client, on its own thread, runs up
//! to `FROZEN_CYCLES` cycles within `FROZEN_BUDGET`; a client whose call has not returned
//! by the end of the budget (plus `FROZEN_GRACE` for a call already in flight) is
//! abandoned and reported as such.

#[path = "../../../tests/common/mod.rs"]
mod common;

use common::Cluster;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

const NODES: usize = 5;
const WARMUP: usize = 200;
const DEFAULT_ITERS: usize = 5000;
const TTL: Duration = Duration::from_secs(10);
const QUORUMLOCK_NODE_TIMEOUT: Duration = Duration::from_millis(50);
const FROZEN: [usize; 2] = [3, 4];
const FROZEN_CYCLES: usize = 20;
const FROZEN_BUDGET: Duration = Duration::from_secs(10);
const FROZEN_GRACE: Duration = Duration::from_secs(2);
const CONTEND_THREADS: usize = 4;
const DEFAULT_CONTEND_SECS: f64 = 6.0;
const CONTEND_SLICE_SECS: f64 = 0.5;

// ---------------------------------------------------------------------------------------
// The clients, behind one interface. Each holds at most one lock at a time.

trait Rival: Send {
    fn name(&self) -> &'static str;
    fn acquire(&mut self) -> Result<(), String>;
    fn release(&mut self) -> Result<(), String>;
}

/// quorumlock: `try_lock` (one attempt) + `unlock`.
struct Quorum {
    rl: quorumlock::Redlock,
    res: String,
    held: Option<quorumlock::Lock>,
}

impl Quorum {
    fn new(urls: &[String]) -> Result<Self, String> {
        let rl = quorumlock::Redlock::builder()
            .nodes(urls)
            .node_timeout(QUORUMLOCK_NODE_TIMEOUT)
            .retry_count(0)
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Quorum {
            rl,
            res: "rivals:quorumlock".into(),
            held: None,
        })
    }
}

impl Rival for Quorum {
    fn name(&self) -> &'static str {
        "quorumlock"
    }
    fn acquire(&mut self) -> Result<(), String> {
        let lock = self
            .rl
            .try_lock(&self.res, TTL)
            .map_err(|e| e.to_string())?;
        self.held = Some(lock);
        Ok(())
    }
    fn release(&mut self) -> Result<(), String> {
        let lock = self.held.take().ok_or("nothing held")?;
        self.rl.unlock(&lock).map(|_| ()).map_err(|e| e.to_string())
    }
}

/// redlock-rs 2.0 (crate `redlock`): blocking, one node after the other, a new TCP
/// connection per command. `set_retry(1, 1)`: one attempt (a delay of 0 would panic in
/// `gen_range(0..0)`; a failed attempt sleeps `0..1` ms = 0 ms). `unlock` returns `()`,
/// so release failures cannot be seen.
struct RedlockRs {
    rl: redlock::RedLock,
    res: Vec<u8>,
    held: Option<(Vec<u8>, Vec<u8>)>,
}

impl RedlockRs {
    fn new(urls: &[String]) -> Self {
        let mut rl = redlock::RedLock::new(urls.to_vec());
        rl.set_retry(1, 1);
        RedlockRs {
            rl,
            res: b"rivals:redlock-rs".to_vec(),
            held: None,
        }
    }
}

impl Rival for RedlockRs {
    fn name(&self) -> &'static str {
        "redlock-rs 2.0.0"
    }
    fn acquire(&mut self) -> Result<(), String> {
        let held = match self.rl.lock(&self.res, TTL.as_millis() as usize) {
            Ok(Some(lock)) => (lock.resource.clone(), lock.val.clone()),
            Ok(None) => return Err("not acquired (no quorum)".into()),
            Err(e) => return Err(e.to_string()),
        };
        self.held = Some(held);
        Ok(())
    }
    fn release(&mut self) -> Result<(), String> {
        let (resource, val) = self.held.take().ok_or("nothing held")?;
        let lock = redlock::Lock {
            resource,
            val,
            validity_time: 0,
            lock_manager: &self.rl,
        };
        self.rl.unlock(&lock);
        Ok(())
    }
}

/// rslock 0.10 (`tokio-comp`) on a current-thread tokio runtime: one multiplexed
/// connection per node, the 5 commands concurrently (`join_all`). `set_retry(1, 1 ms)`:
/// one attempt, no sleep. `unlock` returns `()`, so release failures cannot be seen.
struct Rslock {
    rt: tokio::runtime::Runtime,
    lm: rslock::LockManager,
    res: Vec<u8>,
    held: Option<rslock::Lock>,
}

impl Rslock {
    fn new(urls: &[String]) -> Result<Self, String> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        let mut lm = rslock::LockManager::new(urls.to_vec());
        lm.set_retry(1, Duration::from_millis(1));
        Ok(Rslock {
            rt,
            lm,
            res: b"rivals:rslock".to_vec(),
            held: None,
        })
    }
}

impl Rival for Rslock {
    fn name(&self) -> &'static str {
        "rslock 0.10.0"
    }
    fn acquire(&mut self) -> Result<(), String> {
        let lock = self
            .rt
            .block_on(self.lm.lock(self.res.as_slice(), TTL))
            .map_err(|e| e.to_string())?;
        self.held = Some(lock);
        Ok(())
    }
    fn release(&mut self) -> Result<(), String> {
        let lock = self.held.take().ok_or("nothing held")?;
        self.rt.block_on(self.lm.unlock(&lock));
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// Statistics.

/// Nearest-rank percentile of sorted nanosecond samples, in µs.
fn pct_us(sorted: &[u64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1] as f64 / 1e3)
}

fn median_f64(v: &mut [f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

fn fmt_opt(v: Option<f64>, prec: usize) -> String {
    v.map_or_else(|| "–".to_string(), |x| format!("{x:.prec$}"))
}

#[derive(Default)]
struct Samples {
    acquire: Vec<u64>,
    release: Vec<u64>,
    /// Per iteration: acquire+release ns if both succeeded.
    cycle: Vec<Option<u64>>,
    acquire_failures: usize,
    release_failures: usize,
    first_error: Option<String>,
}

/// One acquire+release cycle; returns the cycle time if both succeeded.
fn cycle(r: &mut dyn Rival, s: &mut Samples) -> Option<u64> {
    let t = Instant::now();
    let a = r.acquire();
    let acq = t.elapsed().as_nanos() as u64;
    if let Err(e) = a {
        s.acquire_failures += 1;
        s.first_error.get_or_insert(format!("acquire: {e}"));
        return None;
    }
    s.acquire.push(acq);
    let t = Instant::now();
    let rel_res = r.release();
    let rel = t.elapsed().as_nanos() as u64;
    if let Err(e) = rel_res {
        s.release_failures += 1;
        s.first_error.get_or_insert(format!("release: {e}"));
        return None;
    }
    s.release.push(rel);
    Some(acq + rel)
}

// ---------------------------------------------------------------------------------------
// Machine description.

fn machine_line() -> String {
    let nproc = thread::available_parallelism()
        .map(|n| n.get().to_string())
        .unwrap_or_else(|_| "?".into());
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let redis = Command::new(common::redis_server_path())
        .arg("--version")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "redis-server --version failed".into());
    format!("machine: nproc={nproc}; CPU: {cpu}; {redis}")
}

// ---------------------------------------------------------------------------------------
// Section 2: contention. CONTEND_THREADS threads take turns at ONE key, no backoff: one
// attempt; lost, the next at once; won, the unlock at once. Each thread its own client.

/// One contending client: one attempt at the shared key, and if it won, the unlock at once.
trait Contender: Send {
    /// `Ok(true)` won (then released), `Ok(false)` lost to another thread, `Err` anything
    /// else.
    fn attempt(&mut self) -> Result<bool, String>;
}

/// quorumlock: `try_lock` with `retry_count(0)`; `Error::Taken` is a lost attempt.
struct QuorumContender {
    rl: quorumlock::Redlock,
    res: String,
}

impl QuorumContender {
    fn new(urls: &[String], res: &str, thread: usize) -> Result<Self, String> {
        let mut rl = quorumlock::Redlock::builder()
            .nodes(urls)
            .node_timeout(QUORUMLOCK_NODE_TIMEOUT)
            .retry_count(0)
            .build()
            .map_err(|e| e.to_string())?;
        // Connections open in the background: a first cycle on a key of its own.
        let own = format!("{res}:warm:{thread}");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match rl.try_lock(&own, TTL) {
                Ok(lock) => {
                    rl.unlock(&lock).map_err(|e| e.to_string())?;
                    break;
                }
                Err(_) if Instant::now() < deadline => thread::sleep(Duration::from_millis(20)),
                Err(e) => return Err(format!("warm-up: {e}")),
            }
        }
        Ok(QuorumContender {
            rl,
            res: res.into(),
        })
    }
}

impl Contender for QuorumContender {
    fn attempt(&mut self) -> Result<bool, String> {
        match self.rl.try_lock(&self.res, TTL) {
            Ok(lock) => self
                .rl
                .unlock(&lock)
                .map(|_| true)
                .map_err(|e| format!("unlock: {e}")),
            Err(quorumlock::Error::Taken(_)) => Ok(false),
            Err(e) => Err(format!("try_lock: {e}")),
        }
    }
}

/// rslock 0.10: `lock` with `set_retry(1, 1 ms)` (one attempt; a lost one is released on
/// every node, waited for, and no sleep follows it), then `unlock`, on a current-thread
/// runtime of its own. `LockError::Unavailable` is a lost attempt (rslock does not tell
/// it from too few nodes answering).
struct RslockContender {
    rt: tokio::runtime::Runtime,
    lm: rslock::LockManager,
    res: Vec<u8>,
}

impl RslockContender {
    fn new(urls: &[String], res: &str, thread: usize) -> Result<Self, String> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        let mut lm = rslock::LockManager::new(urls.to_vec());
        lm.set_retry(1, Duration::from_millis(1));
        // Connections open on first use: a few cycles on a key of its own.
        let own = format!("{res}:warm:{thread}");
        for _ in 0..10 {
            if let Ok(lock) = rt.block_on(lm.lock(own.as_bytes(), TTL)) {
                rt.block_on(lm.unlock(&lock));
            }
        }
        Ok(RslockContender {
            rt,
            lm,
            res: res.as_bytes().to_vec(),
        })
    }
}

impl Contender for RslockContender {
    fn attempt(&mut self) -> Result<bool, String> {
        match self.rt.block_on(self.lm.lock(self.res.as_slice(), TTL)) {
            Ok(lock) => {
                self.rt.block_on(self.lm.unlock(&lock));
                Ok(true)
            }
            Err(rslock::LockError::Unavailable) => Ok(false),
            Err(e) => Err(e.to_string()),
        }
    }
}

#[derive(Default)]
struct Contention {
    won: u64,
    attempts: u64,
    failures: u64,
    first_error: Option<String>,
    /// Wall time, summed over slices (each slice: the mean over its threads).
    secs: f64,
}

impl Contention {
    fn locks_per_s(&self) -> f64 {
        self.won as f64 / self.secs.max(1e-9)
    }
    fn attempts_per_s(&self) -> f64 {
        self.attempts as f64 / self.secs.max(1e-9)
    }
}

/// Each client on its own thread, attempting without pause for `secs`; adds to `total`
/// and returns this slice's successful locks per second.
fn contend_slice<C: Contender>(clients: &mut [C], secs: f64, total: &mut Contention) -> f64 {
    let barrier = std::sync::Barrier::new(clients.len());
    let slice = std::sync::Mutex::new(Contention::default());
    thread::scope(|s| {
        for c in clients.iter_mut() {
            let (barrier, slice) = (&barrier, &slice);
            s.spawn(move || {
                barrier.wait();
                let start = Instant::now();
                let until = start + Duration::from_secs_f64(secs);
                let mut mine = Contention::default();
                while Instant::now() < until {
                    mine.attempts += 1;
                    match c.attempt() {
                        Ok(won) => mine.won += u64::from(won),
                        Err(e) => {
                            mine.failures += 1;
                            mine.first_error.get_or_insert(e);
                        }
                    }
                }
                let el = start.elapsed().as_secs_f64();
                let mut t = slice.lock().unwrap_or_else(|e| e.into_inner());
                t.won += mine.won;
                t.attempts += mine.attempts;
                t.failures += mine.failures;
                if t.first_error.is_none() {
                    t.first_error = mine.first_error;
                }
                t.secs += el;
            });
        }
    });
    let mut sl = slice.into_inner().unwrap_or_else(|e| e.into_inner());
    sl.secs /= clients.len() as f64;
    total.won += sl.won;
    total.attempts += sl.attempts;
    total.failures += sl.failures;
    if total.first_error.is_none() {
        total.first_error = sl.first_error.take();
    }
    total.secs += sl.secs;
    sl.locks_per_s()
}

/// Section 2: quorumlock's and rslock's slices alternate, each client its own key.
fn contention(urls: &[String], secs: f64) {
    let mut ql: Vec<QuorumContender> = (0..CONTEND_THREADS)
        .map(|t| QuorumContender::new(urls, "rivals:contend:quorumlock", t))
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("quorumlock contender: {e}"));
    let mut rs: Vec<RslockContender> = match (0..CONTEND_THREADS)
        .map(|t| RslockContender::new(urls, "rivals:contend:rslock", t))
        .collect::<Result<_, _>>()
    {
        Ok(v) => v,
        Err(e) => {
            println!("\nrslock 0.10.0 contention: skipped, runtime could not be built: {e}");
            return;
        }
    };
    let mut discard = Contention::default();
    contend_slice(&mut ql, 0.25, &mut discard);
    contend_slice(&mut rs, 0.25, &mut discard);
    let slices = ((secs / CONTEND_SLICE_SECS).round() as usize).max(1);
    let slice = secs / slices as f64;
    let (mut q, mut r) = (Contention::default(), Contention::default());
    let mut ratios = Vec::with_capacity(slices);
    for _ in 0..slices {
        let a = contend_slice(&mut ql, slice, &mut q);
        let b = contend_slice(&mut rs, slice, &mut r);
        ratios.push(a / b.max(1e-9));
    }

    println!();
    println!(
        "## Contention: {CONTEND_THREADS} threads, one key, no backoff ({secs:.1} s per client, \
         in {slices} slices of {slice:.2} s alternating between the clients)"
    );
    println!();
    println!("| client | successful locks/s | attempts/s | won | attempts | failures |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (name, c) in [("quorumlock", &q), ("rslock 0.10.0", &r)] {
        println!(
            "| {name} | {:.0} | {:.0} | {} | {} | {} |",
            c.locks_per_s(),
            c.attempts_per_s(),
            c.won,
            c.attempts,
            c.failures
        );
    }
    let ratio = q.locks_per_s() / r.locks_per_s().max(1e-9);
    println!(
        "- quorumlock / rslock, successful locks/s: {ratio:.2}× (median of per-slice ratios \
         {}×; goal ≥ 1.2×: {})",
        fmt_opt(median_f64(&mut ratios), 2),
        if ratio >= 1.2 { "met" } else { "not met" }
    );
    for (name, c) in [("quorumlock", &q), ("rslock 0.10.0", &r)] {
        if let Some(e) = &c.first_error {
            println!("- {name}: first failure: {e}");
        }
    }
}

// ---------------------------------------------------------------------------------------
// Section 3: one client, on its own thread, against a cluster with frozen nodes.

enum Event {
    /// A call (acquire or release) is about to start.
    Start(&'static str, Instant),
    Acquire(Result<Duration, String>),
    Release(Result<Duration, String>),
    Done,
}

struct FrozenResult {
    name: &'static str,
    acquire_ok: Vec<Duration>,
    release_ok: Vec<Duration>,
    acquire_failures: usize,
    release_failures: usize,
    cycles: usize,
    elapsed: Duration,
    first_error: Option<String>,
    /// `Some((call, how long it had been running))` if abandoned.
    hung: Option<(&'static str, Duration)>,
}

fn run_frozen(mut r: Box<dyn Rival>) -> FrozenResult {
    let name = r.name();
    let (tx, rx) = mpsc::channel::<Event>();
    let abandon = Arc::new(AtomicBool::new(false));
    let stop = abandon.clone();
    let start = Instant::now();
    let deadline = start + FROZEN_BUDGET;
    // Detached: if a call never returns, the thread (and the client) are left behind.
    thread::Builder::new()
        .name(format!("frozen-{name}"))
        .spawn(move || {
            for _ in 0..FROZEN_CYCLES {
                if Instant::now() >= deadline || stop.load(Ordering::Relaxed) {
                    break;
                }
                let _ = tx.send(Event::Start("acquire", Instant::now()));
                let t = Instant::now();
                let a = r.acquire().map(|()| t.elapsed());
                let ok = a.is_ok();
                let _ = tx.send(Event::Acquire(a));
                if !ok || stop.load(Ordering::Relaxed) {
                    continue;
                }
                let _ = tx.send(Event::Start("release", Instant::now()));
                let t = Instant::now();
                let rel = r.release().map(|()| t.elapsed());
                let _ = tx.send(Event::Release(rel));
            }
            let _ = tx.send(Event::Done);
        })
        .expect("spawn client thread");

    let mut res = FrozenResult {
        name,
        acquire_ok: Vec::new(),
        release_ok: Vec::new(),
        acquire_failures: 0,
        release_failures: 0,
        cycles: 0,
        elapsed: Duration::ZERO,
        first_error: None,
        hung: None,
    };
    let mut in_flight: Option<(&'static str, Instant)> = None;
    let hard_deadline = deadline + FROZEN_GRACE;
    loop {
        let now = Instant::now();
        if now >= hard_deadline {
            abandon.store(true, Ordering::Relaxed);
            res.hung = in_flight.map(|(call, t0)| (call, now - t0));
            break;
        }
        match rx.recv_timeout(hard_deadline - now) {
            Ok(Event::Start(call, t0)) => in_flight = Some((call, t0)),
            Ok(Event::Acquire(a)) => {
                in_flight = None;
                match a {
                    Ok(d) => res.acquire_ok.push(d),
                    Err(e) => {
                        res.acquire_failures += 1;
                        res.first_error.get_or_insert(format!("acquire: {e}"));
                    }
                }
            }
            Ok(Event::Release(r)) => {
                in_flight = None;
                match r {
                    Ok(d) => {
                        res.release_ok.push(d);
                        res.cycles += 1;
                    }
                    Err(e) => {
                        res.release_failures += 1;
                        res.first_error.get_or_insert(format!("release: {e}"));
                    }
                }
            }
            Ok(Event::Done) | Err(RecvTimeoutError::Disconnected) => break,
            Err(RecvTimeoutError::Timeout) => {}
        }
    }
    res.elapsed = start.elapsed();
    res
}

fn median_ms(v: &[Duration]) -> Option<f64> {
    let mut ms: Vec<f64> = v.iter().map(|d| d.as_secs_f64() * 1e3).collect();
    median_f64(&mut ms)
}

// ---------------------------------------------------------------------------------------

fn main() {
    let iters: usize = match std::env::var("RIVALS_ITERS") {
        Ok(s) => s
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("RIVALS_ITERS must be a positive integer, got {s:?}")),
        Err(_) => DEFAULT_ITERS,
    };
    assert!(iters > 0, "RIVALS_ITERS must be > 0");
    let contend_secs: f64 = match std::env::var("RIVALS_CONTEND_SECS") {
        Ok(s) => s
            .trim()
            .parse()
            .ok()
            .filter(|x: &f64| *x > 0.0)
            .unwrap_or_else(|| panic!("RIVALS_CONTEND_SECS must be a positive number, got {s:?}")),
        Err(_) => DEFAULT_CONTEND_SECS,
    };

    println!("{}", machine_line());
    let cluster = Cluster::start(NODES);
    let urls = cluster.urls();
    println!(
        "nodes: {NODES} local redis-server ({}); ttl {TTL:?}; quorumlock node_timeout \
         {QUORUMLOCK_NODE_TIMEOUT:?}; one client each, one attempt per acquire (no retries)",
        urls.join(", ")
    );

    let mut rivals: Vec<Box<dyn Rival>> = Vec::new();
    match Quorum::new(&urls) {
        Ok(q) => rivals.push(Box::new(q)),
        Err(e) => panic!("quorumlock client: {e}"),
    }
    rivals.push(Box::new(RedlockRs::new(&urls)));
    match Rslock::new(&urls) {
        Ok(r) => rivals.push(Box::new(r)),
        Err(e) => println!("rslock 0.10.0: skipped, runtime could not be built: {e}"),
    }

    // ---- Section 1: healthy cluster, interleaved rows.
    let mut warm: Vec<Samples> = rivals.iter().map(|_| Samples::default()).collect();
    for _ in 0..WARMUP {
        for (r, s) in rivals.iter_mut().zip(warm.iter_mut()) {
            cycle(r.as_mut(), s);
        }
    }
    let mut samples: Vec<Samples> = rivals.iter().map(|_| Samples::default()).collect();
    let t_all = Instant::now();
    for _ in 0..iters {
        for (r, s) in rivals.iter_mut().zip(samples.iter_mut()) {
            let c = cycle(r.as_mut(), s);
            s.cycle.push(c);
        }
    }
    let wall = t_all.elapsed();

    println!();
    println!(
        "## Healthy: 5 of 5 nodes up ({iters} interleaved iterations after {WARMUP} warm-up \
         cycles each; {:.1} s)",
        wall.as_secs_f64()
    );
    println!();
    println!(
        "| client | acquire p50 µs | acquire p99 µs | release p50 µs | release p99 µs | \
         cycle p50 µs | cycle ratio vs quorumlock (median) | failures |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    let base: Vec<Option<u64>> = samples[0].cycle.clone();
    for (r, s) in rivals.iter().zip(samples.iter_mut()) {
        s.acquire.sort_unstable();
        s.release.sort_unstable();
        let mut cycles: Vec<u64> = s.cycle.iter().flatten().copied().collect();
        cycles.sort_unstable();
        let mut ratios: Vec<f64> = s
            .cycle
            .iter()
            .zip(&base)
            .filter_map(|(c, b)| match (c, b) {
                (Some(c), Some(b)) if *b > 0 => Some(*c as f64 / *b as f64),
                _ => None,
            })
            .collect();
        let failures = s.acquire_failures + s.release_failures;
        let fail_text = if failures == 0 {
            "0".to_string()
        } else {
            format!(
                "{failures} ({} acquire, {} release)",
                s.acquire_failures, s.release_failures
            )
        };
        println!(
            "| {} | {} | {} | {} | {} | {} | {}× | {} |",
            r.name(),
            fmt_opt(pct_us(&s.acquire, 0.50), 1),
            fmt_opt(pct_us(&s.acquire, 0.99), 1),
            fmt_opt(pct_us(&s.release, 0.50), 1),
            fmt_opt(pct_us(&s.release, 0.99), 1),
            fmt_opt(pct_us(&cycles, 0.50), 1),
            fmt_opt(median_f64(&mut ratios), 2),
            fail_text
        );
    }
    for ((r, s), w) in rivals.iter().zip(&samples).zip(&warm) {
        let wf = w.acquire_failures + w.release_failures;
        if let Some(e) = s.first_error.as_ref().or(w.first_error.as_ref()) {
            println!("- {}: {wf} warm-up failures; first error: {e}", r.name());
        }
    }
    println!(
        "- release failures of redlock-rs and rslock cannot be observed: their `unlock` \
         returns `()`."
    );

    // ---- Section 2: contention, 4 threads on one key.
    contention(&urls, contend_secs);

    // ---- Section 3: 2 of 5 nodes frozen.
    for &i in &FROZEN {
        cluster.node(i).freeze();
    }
    println!();
    println!(
        "## 2 of 5 nodes frozen (SIGSTOP nodes {} and {}): up to {FROZEN_CYCLES} cycles or \
         {} s per client, each client on its own thread, one client at a time",
        FROZEN[0],
        FROZEN[1],
        FROZEN_BUDGET.as_secs()
    );
    println!();
    println!(
        "| client | median acquire ms | median release ms | cycles completed | \
         failures | time used s | note |"
    );
    println!("|---|---:|---:|---:|---:|---:|---|");
    let mut errors = Vec::new();
    for r in rivals {
        let f = run_frozen(r);
        let note = match f.hung {
            Some((call, d)) => format!(
                "{call} did not return within {:.1} s (thread abandoned)",
                d.as_secs_f64()
            ),
            None if f.elapsed >= FROZEN_BUDGET => "budget exhausted".to_string(),
            None => String::new(),
        };
        println!(
            "| {} | {} | {} | {}/{} | {} | {:.2} | {} |",
            f.name,
            fmt_opt(median_ms(&f.acquire_ok), 2),
            fmt_opt(median_ms(&f.release_ok), 2),
            f.cycles,
            FROZEN_CYCLES,
            f.acquire_failures + f.release_failures,
            f.elapsed.as_secs_f64(),
            note
        );
        if let Some(e) = f.first_error {
            errors.push(format!("- {}: first error: {e}", f.name));
        }
    }
    for e in errors {
        println!("{e}");
    }

    for &i in &FROZEN {
        cluster.node(i).thaw();
    }
    drop(cluster); // kills every redis-server it started
}
