//! Mutual-exclusion torture test: several OS processes, two threads each, contend for ONE
//! resource on five real `redis-server` nodes while the parent freezes, kills and restarts
//! a minority of the nodes; an offline checker then audits every holder's log.
//!
//! ```text
//! cargo test --test torture -- --nocapture                          # 20 s (CI)
//! TORTURE_SECS=600 cargo test --release --test torture -- --nocapture  # 10 min
//! TORTURE_SEED=1234 ...                  # replay the fault schedule (not the timing)
//! TORTURE_KEEP=1 ...                     # keep the logs (always kept on failure)
//! ```
//!
//! # Processes
//!
//! [`torture`] is the parent. It starts a 5-node [`Cluster`], then re-executes this very
//! test binary ([`std::env::current_exe`]) [`WORKERS`] times as
//! `<exe> torture_worker --exact --nocapture --test-threads=1` with `TORTURE_*`
//! environment variables (see [`WorkerConfig::from_env`]). **[`torture_worker`] is a
//! no-op that returns at once unless `TORTURE_WORKER` is set**, so in an ordinary
//! `cargo test` run it passes trivially; in a child it runs [`THREADS`] threads, each with
//! its own client, until the end time the parent chose. Every worker process and every
//! node is stopped on every path: workers by [`Workers`]' `Drop` (and by
//! `PR_SET_PDEATHSIG` should the parent die), nodes by the [`Cluster`]'s `Drop`.
//!
//! # One clock for every process
//!
//! `Instant` is CLOCK_MONOTONIC on Linux but its raw value is private, so holders stamp
//! events with `clock_gettime(CLOCK_MONOTONIC)` ([`mono_ns`]), which every process on the
//! machine shares. The lock's own deadline (an `Instant`) is mapped onto that clock through
//! one calibration pair per process ([`Clock`]): `Instant` is read first, CLOCK_MONOTONIC
//! second, so a mapped instant errs *late* by the few hundred ns between the two reads —
//! a mapped deadline can only widen a window, the safe direction. (`t_return +
//! lock.remaining()` would err *early*: `remaining()` reads the clock again, later.)
//!
//! # What a window is, and why
//!
//! A hold's window is `[acq, end)` where
//!
//! - `acq` is CLOCK_MONOTONIC read right after `lock()` returned;
//! - `end` is `min(deadline, rel)`: the latest deadline the holder was given (extends
//!   included), and CLOCK_MONOTONIC read right before it called `unlock()` (none if it let
//!   the lock expire).
//!
//! Widening a window makes overlaps more likely to be reported, which is the safe direction
//! for a checker — but only up to what the algorithm promises; past that it reports
//! violations in a correct run. Starting the window *before* the `lock()` call is past
//! that: `lock()` retries for up to seconds while the current holder is legitimately inside
//! its window, and even one attempt may start (B reads the clock) just before the holder's
//! `unlock()` and still win (A's DEL lands before B's SET NX). What Redlock does promise
//! concerns the time a client may *act*: it can act only once `lock()` has returned, and
//! B's `lock()` can only return once a majority has processed B's SET NX, so once A's key
//! was gone on at least one node of A's majority: deleted by A's `unlock()` (sent after
//! `rel`), or expired at ≥ A's start + ttl on the node's clock (later than A's deadline,
//! which subtracts the drift allowance). So `[acq, end)` is both the widest interval in
//! which a holder may act and exactly what must be exclusive; the start before the call is
//! still logged (`call`), and every write is checked to lie inside its window.
//!
//! # The critical section
//!
//! A read-modify-write of a counter file shared by all processes: read it, sleep 0–3 ms,
//! write value+1 (temp file + rename), log `W worker thread hold before after start end`.
//! It starts and writes only while `lock.remaining() >= MARGIN` ([`MARGIN`]: the check and
//! the write are not atomic, the margin covers the gap); otherwise the write is skipped and
//! logged (`S`): a holder never acts after validity. Holds also extend (~10 %, then do a
//! second increment), let the lock expire (~3 %), overstay their validity (~2 %) or run up
//! to the margin (~2 %).
//!
//! # Faults (parent)
//!
//! A seeded RNG (seed printed; `TORTURE_SEED` to replay) freezes (SIGSTOP/SIGCONT) or kills
//! and later restarts nodes, never more than [`MAX_DISTURBED`] of the 5 at once, so a
//! majority is always healthy. A killed node stays down at least `TTL + RESTART_MARGIN`
//! (the spec's *delayed restart*): it restarts empty (no persistence), and if it came back
//! at once, a lock held on a bare majority including it would lose its key there while its
//! holder still relies on it; another client could then win a majority made of the fresh
//! node and nodes that never had the key (frozen during the first acquire), and two holders
//! would overlap. Every key a node held when killed was set at most one ttl before the kill,
//! so once a ttl has passed every lock that counted on that node is past its deadline.
//! (`TORTURE_UNSAFE_RESTART=1` restarts at once instead, to watch the checker catch that.)
//!
//! # The checker
//!
//! [`check`] parses every log and proves (1) no two windows overlap, and every write lies
//! inside its hold's window; (2) no increment was lost: sorted by time, the logged
//! `before → after` values are exactly 0→1→2→…, and the final counter equals the number
//! of increments. Its own tests feed it overlapping and lost-update logs.

mod common;

use common::Cluster;
use quorumlock::{Error, Lock, Redlock};
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::fs::{self, File};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Nodes in the cluster.
const NODES: usize = 5;
/// At most this many nodes are frozen or down at any moment (a minority of 5).
const MAX_DISTURBED: usize = 2;
/// Worker processes.
const WORKERS: usize = 4;
/// Threads (each with its own client) per worker process.
const THREADS: usize = 2;
/// Lock ttl (also the extend ttl, so the longest ttl in use).
const TTL: Duration = Duration::from_millis(300);
/// A holder starts or finishes a write only with at least this much validity left.
const MARGIN: Duration = Duration::from_millis(50);
/// Extra time a killed node stays down beyond the ttl (delayed restart).
const RESTART_MARGIN: Duration = Duration::from_millis(100);
/// Default run length; `TORTURE_SECS` overrides.
const DEFAULT_SECS: u64 = 20;
/// How long workers get to finish after the end time before they are killed.
const GRACE: Duration = Duration::from_secs(60);
/// The one contended resource.
const RESOURCE: &str = "torture:resource";

// ---------------------------------------------------------------------------------------
// The shared clock.

/// CLOCK_MONOTONIC in nanoseconds: one clock for every process on the machine.
fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, exclusively borrowed timespec; CLOCK_MONOTONIC exists on
    // every Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC)");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Maps this process's `Instant`s onto [`mono_ns`] (see the module docs).
#[derive(Clone, Copy)]
struct Clock {
    instant: Instant,
    ns: u64,
}

impl Clock {
    fn calibrate() -> Clock {
        let instant = Instant::now(); // first: the map errs late, never early
        let ns = mono_ns();
        Clock { instant, ns }
    }

    fn map(&self, i: Instant) -> u64 {
        match i.checked_duration_since(self.instant) {
            Some(d) => self.ns + d.as_nanos() as u64,
            None => self.ns - (self.instant - i).as_nanos() as u64,
        }
    }

    /// How far the map has drifted from CLOCK_MONOTONIC (should stay ~0).
    fn skew_ns(&self) -> i64 {
        let mapped = self.map(Instant::now());
        let real = mono_ns();
        mapped as i64 - real as i64
    }
}

// ---------------------------------------------------------------------------------------
// The worker side.

/// What the parent tells a worker process, through the environment.
#[derive(Clone, Debug)]
struct WorkerConfig {
    /// `TORTURE_WORKER`: this process's id.
    worker: usize,
    /// `TORTURE_URLS`: node URLs, comma-separated.
    urls: Vec<String>,
    /// `TORTURE_DIR`: where the counter and the logs live.
    dir: PathBuf,
    /// `TORTURE_END_NS`: CLOCK_MONOTONIC at which to stop taking the lock.
    end_ns: u64,
    /// `TORTURE_SEED`: the run's seed (each thread derives its own).
    seed: u64,
    /// `TORTURE_PARENT_PID`: the parent, to die with it.
    parent: u32,
}

impl WorkerConfig {
    /// `None` when `TORTURE_WORKER` is not set: not a worker process.
    fn from_env() -> Option<WorkerConfig> {
        let worker = std::env::var("TORTURE_WORKER").ok()?;
        let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("worker: {k} not set"));
        let num = |k: &str| -> u64 {
            var(k)
                .parse()
                .unwrap_or_else(|e| panic!("worker: {k}: {e}"))
        };
        Some(WorkerConfig {
            worker: worker.parse().expect("TORTURE_WORKER"),
            urls: var("TORTURE_URLS").split(',').map(str::to_string).collect(),
            dir: PathBuf::from(var("TORTURE_DIR")),
            end_ns: num("TORTURE_END_NS"),
            seed: num("TORTURE_SEED"),
            parent: num("TORTURE_PARENT_PID") as u32,
        })
    }
}

fn counter_path(dir: &Path) -> PathBuf {
    dir.join("counter")
}

fn log_path(dir: &Path, worker: usize, thread: usize) -> PathBuf {
    dir.join(format!("w{worker}-t{thread}.log"))
}

/// The worker process's entry point. **Returns at once (passes) unless `TORTURE_WORKER`
/// is set**, i.e. unless [`torture`] started this process as one of its workers.
#[test]
fn torture_worker() {
    let Some(cfg) = WorkerConfig::from_env() else {
        return;
    };
    die_with_parent(cfg.parent);
    let clock = Clock::calibrate();
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let cfg = cfg.clone();
            thread::Builder::new()
                .name(format!("w{}-t{t}", cfg.worker))
                .spawn(move || run_thread(&cfg, t, clock))
                .expect("spawn worker thread")
        })
        .collect();
    for (t, h) in threads.into_iter().enumerate() {
        match h.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => panic!("worker {} thread {t}: {e}", cfg.worker),
            Err(_) => panic!("worker {} thread {t} panicked", cfg.worker),
        }
    }
}

/// Asks the kernel to SIGKILL this process when the parent's spawning thread dies, so a
/// crashed or killed parent leaves no worker behind.
fn die_with_parent(parent: u32) {
    // SAFETY: plain syscalls with integer arguments.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
        if libc::getppid() as u32 != parent {
            // The parent died before the prctl took effect.
            libc::_exit(3);
        }
    }
}

/// Counters of one worker thread, logged as its `E` line.
#[derive(Default)]
struct ThreadStats {
    holds: u64,
    taken: u64,
    unavailable: u64,
    expired: u64,
    other: u64,
    extend_ok: u64,
    extend_failed: u64,
    unlock_errors: u64,
}

/// One worker thread: a client of its own, taking the lock until the end time.
fn run_thread(cfg: &WorkerConfig, thread: usize, clock: Clock) -> io::Result<()> {
    let mut rng = fastrand::Rng::with_seed(
        cfg.seed ^ ((cfg.worker as u64 + 1) << 32) ^ ((thread as u64 + 1) * 0x9E37_79B9),
    );
    let mut rl = Redlock::builder()
        .nodes(&cfg.urls)
        .node_timeout(Duration::from_millis(30))
        .retry_count(150)
        .retry_delay(Duration::from_millis(10))
        .retry_jitter(Duration::from_millis(8))
        .build()
        .map_err(|e| io::Error::other(e.to_string()))?;
    let mut log = BufWriter::new(File::create(log_path(&cfg.dir, cfg.worker, thread))?);
    let mut cs = CriticalSection {
        counter: counter_path(&cfg.dir),
        tmp: cfg
            .dir
            .join(format!("counter.w{}-t{thread}.tmp", cfg.worker)),
        who: (cfg.worker, thread),
    };
    let mut stats = ThreadStats::default();
    while mono_ns() < cfg.end_ns {
        let call_ns = mono_ns();
        let result = rl.lock(RESOURCE, TTL);
        let acq_ns = mono_ns();
        let mut lock = match result {
            Ok(lock) => lock,
            Err(e) => {
                let kind = match e {
                    Error::Taken(_) => &mut stats.taken,
                    Error::Unavailable(_) => &mut stats.unavailable,
                    Error::Expired(_) => &mut stats.expired,
                    _ => &mut stats.other,
                };
                *kind += 1;
                // For diagnosis only; the checker does not read it.
                writeln!(log, "F {} {thread} {call_ns} {acq_ns} {e}", cfg.worker)?;
                continue;
            }
        };
        stats.holds += 1;
        let hold = stats.holds;
        let started_ns = clock.map(lock.started());
        let mut deadline_ns = clock.map(lock.deadline());
        let plan = rng.u32(0..100);
        let mut extended = false;
        let mut release = true;
        match plan {
            // Extend, then a second increment under the new validity.
            0..10 => {
                cs.increment(&lock, hold, &mut rng, &mut log)?;
                match rl.extend(&mut lock, TTL) {
                    Ok(()) => {
                        stats.extend_ok += 1;
                        extended = true;
                    }
                    Err(_) => stats.extend_failed += 1,
                }
                // The latest deadline the holder was ever given (a failed extend only
                // ever moves it earlier).
                deadline_ns = deadline_ns.max(clock.map(lock.deadline()));
                cs.increment(&lock, hold, &mut rng, &mut log)?;
            }
            // Let the lock expire: no unlock.
            10..13 => {
                cs.increment(&lock, hold, &mut rng, &mut log)?;
                release = false;
            }
            // Overstay: wake up after the validity and try to act (must be skipped).
            13..15 => {
                thread::sleep(lock.remaining() + Duration::from_millis(2));
                cs.increment(&lock, hold, &mut rng, &mut log)?;
            }
            // Start just above the margin: the write is often skipped at the last check.
            15..17 => {
                let wait = lock
                    .remaining()
                    .saturating_sub(MARGIN + Duration::from_micros(rng.u64(0..3000)));
                thread::sleep(wait);
                cs.increment(&lock, hold, &mut rng, &mut log)?;
            }
            _ => cs.increment(&lock, hold, &mut rng, &mut log)?,
        }
        let rel_ns = if release {
            let rel_ns = mono_ns();
            if rl.unlock(&lock).is_err() {
                stats.unlock_errors += 1;
            }
            rel_ns
        } else {
            u64::MAX
        };
        writeln!(
            log,
            "H {} {thread} {hold} {call_ns} {started_ns} {acq_ns} {deadline_ns} {rel_ns} {}",
            cfg.worker, extended as u8
        )?;
        // After every hold, so a worker that dies loses at most the hold in progress.
        log.flush()?;
    }
    writeln!(
        log,
        "E {} {thread} {} {} {} {} {} {} {} {} {}",
        cfg.worker,
        stats.holds,
        stats.taken,
        stats.unavailable,
        stats.expired,
        stats.other,
        stats.extend_ok,
        stats.extend_failed,
        stats.unlock_errors,
        clock.skew_ns()
    )?;
    log.flush()
}

/// The read-modify-write of the shared counter file.
struct CriticalSection {
    counter: PathBuf,
    tmp: PathBuf,
    who: (usize, usize),
}

impl CriticalSection {
    /// One increment, only while the lock is valid (with [`MARGIN`] to spare); logs `W`
    /// when written, `S` when skipped.
    fn increment(
        &mut self,
        lock: &Lock,
        hold: u64,
        rng: &mut fastrand::Rng,
        log: &mut impl Write,
    ) -> io::Result<()> {
        let (w, t) = self.who;
        let start_ns = mono_ns();
        if lock.remaining() < MARGIN {
            return writeln!(log, "S {w} {t} {hold} - {start_ns} expired-before-read");
        }
        let text = fs::read_to_string(&self.counter)?;
        let before: u64 = text
            .trim()
            .parse()
            .map_err(|e| io::Error::other(format!("counter file {text:?}: {e}")))?;
        thread::sleep(Duration::from_micros(rng.u64(0..=3000)));
        if lock.remaining() < MARGIN {
            return writeln!(
                log,
                "S {w} {t} {hold} {before} {start_ns} expired-before-write"
            );
        }
        fs::write(&self.tmp, format!("{}\n", before + 1))?;
        fs::rename(&self.tmp, &self.counter)?;
        let end_ns = mono_ns();
        writeln!(
            log,
            "W {w} {t} {hold} {before} {} {start_ns} {end_ns}",
            before + 1
        )
    }
}

// ---------------------------------------------------------------------------------------
// The checker.

/// One lock held, as logged by its holder (`H` line).
#[derive(Clone, Copy, Debug)]
struct Hold {
    acq_ns: u64,
    deadline_ns: u64,
    rel_ns: u64,
    extended: bool,
}

impl Hold {
    /// End of the window: the deadline, or the unlock call if earlier.
    fn end_ns(&self) -> u64 {
        self.deadline_ns.min(self.rel_ns)
    }
}

/// One increment (`W` line).
#[derive(Clone, Copy, Debug)]
struct Increment {
    who: HoldId,
    before: u64,
    after: u64,
    start_ns: u64,
    end_ns: u64,
}

/// (worker, thread, hold number).
type HoldId = (usize, usize, u64);

/// What the checker found.
#[derive(Debug, Default)]
struct Report {
    holds: u64,
    extended: u64,
    increments: u64,
    skipped: u64,
    taken: u64,
    unavailable: u64,
    expired: u64,
    other_errors: u64,
    extend_ok: u64,
    extend_failed: u64,
    unlock_errors: u64,
    /// Holds per worker process.
    per_worker: BTreeMap<usize, u64>,
    /// Threads that logged their final `E` line.
    finished_threads: usize,
    /// Longest hold window and the shortest gap between two windows, in µs.
    longest_window_us: u64,
    violations: Vec<String>,
}

impl Report {
    fn contended_failures(&self) -> u64 {
        self.taken + self.unavailable + self.expired + self.other_errors
    }
}

fn fields<T: std::str::FromStr>(parts: &[&str]) -> Option<Vec<T>> {
    parts.iter().map(|p| p.parse().ok()).collect()
}

/// Audits the logs (`(name, content)` pairs) against the final counter value.
fn check(logs: &[(String, String)], final_counter: u64) -> Report {
    let mut r = Report::default();
    let mut holds: HashMap<HoldId, Hold> = HashMap::new();
    let mut writes: Vec<Increment> = Vec::new();
    for (name, text) in logs {
        for (n, line) in text.lines().enumerate() {
            let parts: Vec<&str> = line.split_whitespace().collect();
            let bad = || format!("{name}:{}: malformed line {line:?}", n + 1);
            match parts.first().copied() {
                Some("H") if parts.len() == 10 => {
                    let Some(v) = fields::<u64>(&parts[1..]) else {
                        r.violations.push(bad());
                        continue;
                    };
                    let id = (v[0] as usize, v[1] as usize, v[2]);
                    let hold = Hold {
                        acq_ns: v[5],
                        deadline_ns: v[6],
                        rel_ns: v[7],
                        extended: v[8] == 1,
                    };
                    r.holds += 1;
                    r.extended += hold.extended as u64;
                    *r.per_worker.entry(id.0).or_default() += 1;
                    if hold.end_ns() > hold.acq_ns {
                        r.longest_window_us = r
                            .longest_window_us
                            .max((hold.end_ns() - hold.acq_ns) / 1000);
                    }
                    if holds.insert(id, hold).is_some() {
                        r.violations
                            .push(format!("{name}: hold {id:?} logged twice"));
                    }
                }
                Some("W") if parts.len() == 8 => {
                    let Some(v) = fields::<u64>(&parts[1..]) else {
                        r.violations.push(bad());
                        continue;
                    };
                    writes.push(Increment {
                        who: (v[0] as usize, v[1] as usize, v[2]),
                        before: v[3],
                        after: v[4],
                        start_ns: v[5],
                        end_ns: v[6],
                    });
                }
                Some("S") if parts.len() == 7 => r.skipped += 1,
                Some("F") => {} // a failed lock() call, for diagnosis; counted from `E`
                Some("E") if parts.len() == 12 => {
                    let Some(v) = fields::<i64>(&parts[1..]) else {
                        r.violations.push(bad());
                        continue;
                    };
                    r.finished_threads += 1;
                    r.taken += v[3] as u64;
                    r.unavailable += v[4] as u64;
                    r.expired += v[5] as u64;
                    r.other_errors += v[6] as u64;
                    r.extend_ok += v[7] as u64;
                    r.extend_failed += v[8] as u64;
                    r.unlock_errors += v[9] as u64;
                    if v[10].abs() > 1_000_000 {
                        r.violations.push(format!(
                            "{name}: Instant→CLOCK_MONOTONIC map drifted {} ns",
                            v[10]
                        ));
                    }
                }
                _ => r.violations.push(bad()),
            }
        }
    }
    r.increments = writes.len() as u64;

    // (1) No two windows overlap: sorted by start, each starts at or after the latest end
    // so far. Empty windows (validity gone by the time lock() returned) cannot overlap.
    let mut windows: Vec<(HoldId, Hold)> = holds
        .iter()
        .filter(|(_, h)| h.end_ns() > h.acq_ns)
        .map(|(id, h)| (*id, *h))
        .collect();
    windows.sort_by_key(|(id, h)| (h.acq_ns, *id));
    let mut latest: Option<(HoldId, Hold)> = None;
    for &(id, h) in &windows {
        if let Some((pid, ph)) = latest {
            if h.acq_ns < ph.end_ns() {
                r.violations.push(format!(
                    "overlap: hold {id:?} window [{}, {}) starts {:.3} ms before hold \
                     {pid:?} window [{}, {}) ends",
                    h.acq_ns,
                    h.end_ns(),
                    (ph.end_ns() - h.acq_ns) as f64 / 1e6,
                    ph.acq_ns,
                    ph.end_ns(),
                ));
            }
        }
        if latest.is_none_or(|(_, ph)| h.end_ns() > ph.end_ns()) {
            latest = Some((id, h));
        }
    }

    // Every write inside its own hold's window.
    for w in &writes {
        match holds.get(&w.who) {
            None => r
                .violations
                .push(format!("write {w:?} by a hold that was never logged")),
            Some(h) if w.start_ns < h.acq_ns || w.end_ns > h.end_ns() => {
                r.violations.push(format!(
                    "write outside validity: {w:?} not within hold window [{}, {})",
                    h.acq_ns,
                    h.end_ns()
                ));
            }
            Some(_) => {}
        }
    }

    // (2) No lost update: in time order the increments are 0→1, 1→2, ... and the file ends
    // at their count.
    writes.sort_by_key(|w| (w.start_ns, w.who));
    for (i, w) in writes.iter().enumerate() {
        if w.before != i as u64 || w.after != w.before + 1 {
            r.violations.push(format!(
                "lost update: increment #{i} (in time order) is {} -> {} by {:?}, expected \
                 {i} -> {}",
                w.before,
                w.after,
                w.who,
                i + 1
            ));
        }
    }
    if final_counter != writes.len() as u64 {
        r.violations.push(format!(
            "lost update: counter file holds {final_counter}, but {} increments were logged",
            writes.len()
        ));
    }
    r
}

// ---------------------------------------------------------------------------------------
// The parent.

/// Worker processes, killed and reaped on drop (also while unwinding).
struct Workers(Vec<Child>);

impl Drop for Workers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            if matches!(c.try_wait(), Ok(None)) {
                let _ = c.kill();
            }
            let _ = c.wait();
        }
    }
}

/// Fault state of one node in the injector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NodeFault {
    Healthy,
    Frozen { until: Instant },
    Down { until: Instant },
}

#[derive(Debug, Default)]
struct FaultStats {
    freeze: u64,
    thaw: u64,
    kill: u64,
    restart: u64,
    max_disturbed: usize,
    /// Shortest time a killed node stayed down.
    min_down: Option<Duration>,
}

fn env_u64(key: &str) -> Option<u64> {
    let v = std::env::var(key).ok()?;
    Some(
        v.trim()
            .parse()
            .unwrap_or_else(|e| panic!("{key}={v:?}: {e}")),
    )
}

fn temp_dir() -> PathBuf {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let dir =
        std::env::temp_dir().join(format!("quorumlock-torture-{}-{nanos}", std::process::id()));
    fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    dir
}

fn tail(path: &Path, lines: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The torture test itself (the parent): see the module docs.
#[test]
fn torture() {
    let secs = env_u64("TORTURE_SECS").unwrap_or(DEFAULT_SECS);
    let seed = env_u64("TORTURE_SEED").unwrap_or_else(|| fastrand::u64(..));
    let unsafe_restart = std::env::var("TORTURE_UNSAFE_RESTART").is_ok_and(|v| v == "1");
    println!(
        "torture: seed={seed} secs={secs} nodes={NODES} workers={WORKERS}x{THREADS} \
         ttl={TTL:?} margin={MARGIN:?} max_disturbed={MAX_DISTURBED} \
         unsafe_restart={unsafe_restart}"
    );
    let dir = temp_dir();
    fs::write(counter_path(&dir), "0\n").expect("write counter");
    let cluster = Cluster::start(NODES);
    let exe = std::env::current_exe().expect("current_exe");

    let duration = Duration::from_secs(secs);
    let started = Instant::now();
    let end = started + duration;
    let end_ns = mono_ns() + duration.as_nanos() as u64;
    let mut workers = Workers(Vec::with_capacity(WORKERS));
    for w in 0..WORKERS {
        let out = File::create(dir.join(format!("w{w}.out"))).expect("worker output file");
        let err = out.try_clone().expect("clone output file");
        let child = Command::new(&exe)
            .args([
                "torture_worker",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("TORTURE_WORKER", w.to_string())
            .env("TORTURE_URLS", cluster.urls().join(","))
            .env("TORTURE_DIR", &dir)
            .env("TORTURE_END_NS", end_ns.to_string())
            .env("TORTURE_SEED", seed.to_string())
            .env("TORTURE_PARENT_PID", std::process::id().to_string())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("spawn worker process");
        workers.0.push(child);
    }

    // Inject faults until the end, then let every disturbed node recover on schedule
    // (the delayed-restart rule holds until the very end).
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut state = [NodeFault::Healthy; NODES];
    let mut killed_at = [None::<Instant>; NODES];
    let mut faults = FaultStats::default();
    // The fault timeline on the shared clock, for diagnosis (`<ns> <node> <action>`).
    let mut fault_log = BufWriter::new(File::create(dir.join("faults.log")).expect("faults.log"));
    let mut note = |node: usize, what: &str| {
        let _ = writeln!(fault_log, "{} {node} {what}", mono_ns());
    };
    let mut next_fault = Instant::now() + Duration::from_millis(rng.u64(50..300));
    let mut early_exit = false;
    loop {
        let now = Instant::now();
        for (i, st) in state.iter_mut().enumerate() {
            match *st {
                NodeFault::Frozen { until } if now >= until => {
                    cluster.node(i).thaw();
                    faults.thaw += 1;
                    note(i, "thaw");
                    *st = NodeFault::Healthy;
                }
                NodeFault::Down { until } if now >= until => {
                    let down = killed_at[i].take().map(|k| k.elapsed());
                    cluster.node(i).restart();
                    faults.restart += 1;
                    note(i, "restart");
                    faults.min_down = match (faults.min_down, down) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                    *st = NodeFault::Healthy;
                }
                _ => {}
            }
        }
        // A worker that exits before the end stops the injection (the run has failed);
        // disturbed nodes still recover on schedule, since the other workers go on.
        if !early_exit
            && now < end
            && workers
                .0
                .iter_mut()
                .any(|c| !matches!(c.try_wait(), Ok(None)))
        {
            early_exit = true;
        }
        let healthy = state.iter().filter(|s| **s == NodeFault::Healthy).count();
        if (now >= end || early_exit) && healthy == NODES {
            break;
        }
        if now < end && !early_exit && now >= next_fault {
            if NODES - healthy < MAX_DISTURBED {
                let candidates: Vec<usize> = (0..NODES)
                    .filter(|&i| state[i] == NodeFault::Healthy)
                    .collect();
                let i = candidates[rng.usize(..candidates.len())];
                if rng.u32(0..100) < 60 {
                    let hold = Duration::from_millis(rng.u64(5..1200));
                    cluster.node(i).freeze();
                    faults.freeze += 1;
                    note(i, "freeze");
                    state[i] = NodeFault::Frozen { until: now + hold };
                } else {
                    // Delayed restart: down for at least the longest ttl, plus a margin.
                    let down = if unsafe_restart {
                        Duration::from_millis(rng.u64(0..20))
                    } else {
                        TTL + RESTART_MARGIN + Duration::from_millis(rng.u64(0..800))
                    };
                    cluster.node(i).kill();
                    faults.kill += 1;
                    note(i, "kill");
                    killed_at[i] = Some(Instant::now());
                    state[i] = NodeFault::Down {
                        until: Instant::now() + down,
                    };
                }
                let disturbed = state.iter().filter(|s| **s != NodeFault::Healthy).count();
                faults.max_disturbed = faults.max_disturbed.max(disturbed);
            }
            next_fault = now + Duration::from_millis(rng.u64(20..400));
        }
        thread::sleep(Duration::from_millis(5));
    }

    // Wait for every worker, bounded.
    let hard_stop = end + GRACE;
    let mut statuses = [None; WORKERS];
    while statuses.iter().any(Option::is_none) && Instant::now() < hard_stop {
        for (w, c) in workers.0.iter_mut().enumerate() {
            if statuses[w].is_none() {
                statuses[w] = c.try_wait().expect("try_wait worker");
            }
        }
        thread::sleep(Duration::from_millis(20));
    }
    let elapsed = started.elapsed();
    drop(workers); // kills any still running
    let mut problems = Vec::new();
    for (w, st) in statuses.iter().enumerate() {
        let ok = st.is_some_and(|s| s.success());
        if !ok {
            problems.push(format!(
                "worker {w} {}; its output:\n{}",
                match st {
                    Some(s) => format!("exited with {s}"),
                    None => format!("still running after {GRACE:?} of grace: killed"),
                },
                tail(&dir.join(format!("w{w}.out")), 30)
            ));
        }
    }

    // Audit.
    let mut logs = Vec::new();
    for w in 0..WORKERS {
        for t in 0..THREADS {
            let path = log_path(&dir, w, t);
            match fs::read_to_string(&path) {
                Ok(text) => logs.push((format!("w{w}-t{t}.log"), text)),
                Err(e) => problems.push(format!("read {}: {e}", path.display())),
            }
        }
    }
    let counter_text = fs::read_to_string(counter_path(&dir)).expect("read counter");
    let final_counter: u64 = counter_text
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("counter file {counter_text:?}: {e}"));
    let report = check(&logs, final_counter);
    if report.finished_threads != WORKERS * THREADS {
        problems.push(format!(
            "only {} of {} worker threads logged their summary",
            report.finished_threads,
            WORKERS * THREADS
        ));
    }
    let min_holds = 20.max(secs);
    if report.holds < min_holds {
        problems.push(format!(
            "only {} acquisitions in {secs} s (expected at least {min_holds}): the run proves \
             nothing",
            report.holds
        ));
    }
    if faults.max_disturbed > MAX_DISTURBED {
        problems.push(format!(
            "injector disturbed {} nodes at once",
            faults.max_disturbed
        ));
    }

    let mut summary = String::new();
    let _ = writeln!(
        summary,
        "torture: ran {:.1} s; acquisitions={} (per worker {:?}), extended={}, \
         increments={} (final counter {final_counter}), skipped writes={}, \
         longest window={} ms",
        elapsed.as_secs_f64(),
        report.holds,
        report.per_worker,
        report.extend_ok,
        report.increments,
        report.skipped,
        report.longest_window_us / 1000,
    );
    let _ = writeln!(
        summary,
        "torture: contended failures={} (taken={} unavailable={} expired={} other={}), \
         extend failures={}, unlock errors={}",
        report.contended_failures(),
        report.taken,
        report.unavailable,
        report.expired,
        report.other_errors,
        report.extend_failed,
        report.unlock_errors,
    );
    let _ = writeln!(
        summary,
        "torture: faults injected={} (freeze={} thaw={} kill={} restart={}), max disturbed \
         at once={}, shortest downtime={:?}",
        faults.freeze + faults.kill,
        faults.freeze,
        faults.thaw,
        faults.kill,
        faults.restart,
        faults.max_disturbed,
        faults.min_down,
    );
    let _ = write!(
        summary,
        "torture: violations={} problems={}",
        report.violations.len(),
        problems.len()
    );
    println!("{summary}");
    for v in report.violations.iter().take(20) {
        println!("  VIOLATION {v}");
    }
    if report.violations.is_empty() && problems.is_empty() {
        if std::env::var_os("TORTURE_KEEP").is_some() {
            println!("torture: logs kept in {}", dir.display());
        } else {
            let _ = fs::remove_dir_all(&dir);
        }
    } else {
        drop(cluster);
        panic!(
            "torture failed (seed {seed}; logs kept in {}):\n{summary}\n{}{}\n{}",
            dir.display(),
            problems.join("\n"),
            if problems.is_empty() {
                ""
            } else {
                "\n(violations after a worker failure may only mean its last hold went unlogged)"
            },
            report
                .violations
                .iter()
                .take(20)
                .map(|v| format!("VIOLATION {v}"))
                .collect::<Vec<_>>()
                .join("\n"),
        );
    }
}

// ---------------------------------------------------------------------------------------
// Tests of the checker itself: it must be able to fail.

fn h_line(w: usize, t: usize, hold: u64, acq: u64, deadline: u64, rel: u64) -> String {
    format!(
        "H {w} {t} {hold} {} {} {acq} {deadline} {rel} 0\n",
        acq - 5,
        acq - 3
    )
}

fn w_line(w: usize, t: usize, hold: u64, before: u64, start: u64, end: u64) -> String {
    format!("W {w} {t} {hold} {before} {} {start} {end}\n", before + 1)
}

const E_LINE: &str = "E 0 0 2 1 0 0 0 0 0 0 12\n";

#[test]
fn checker_accepts_a_clean_log() {
    let a = h_line(0, 0, 1, 100, 400, 200) + &w_line(0, 0, 1, 0, 110, 150) + E_LINE;
    let b = h_line(1, 0, 1, 200, 500, 300)
        + &w_line(1, 0, 1, 1, 210, 250)
        + "S 1 0 1 - 260 expired-before-read\n";
    let r = check(&[("a".into(), a), ("b".into(), b)], 2);
    assert!(r.violations.is_empty(), "{:?}", r.violations);
    assert_eq!((r.holds, r.increments, r.skipped), (2, 2, 1));
    assert_eq!(r.finished_threads, 1);
}

#[test]
fn checker_reports_overlapping_windows() {
    // Hold b starts at 150, inside hold a's [100, 200).
    let a = h_line(0, 0, 1, 100, 400, 200) + &w_line(0, 0, 1, 0, 110, 120);
    let b = h_line(1, 1, 1, 150, 500, 300) + &w_line(1, 1, 1, 1, 160, 170);
    let r = check(&[("a".into(), a), ("b".into(), b)], 2);
    assert!(
        r.violations.iter().any(|v| v.starts_with("overlap")),
        "{:?}",
        r.violations
    );
    // An expired, never released hold's window runs to its deadline.
    let a = h_line(0, 0, 1, 100, 400, u64::MAX);
    let b = h_line(1, 1, 1, 390, 700, 500);
    let r = check(&[("a".into(), a), ("b".into(), b)], 0);
    assert_eq!(r.violations.len(), 1, "{:?}", r.violations);
}

#[test]
fn checker_reports_lost_updates() {
    // Both read 0 and wrote 1: one increment lost; the file says 1.
    let a = h_line(0, 0, 1, 100, 400, 200) + &w_line(0, 0, 1, 0, 110, 150);
    let b = h_line(1, 0, 1, 200, 500, 300) + &w_line(1, 0, 1, 0, 210, 250);
    let r = check(&[("a".into(), a), ("b".into(), b)], 1);
    let lost = r
        .violations
        .iter()
        .filter(|v| v.starts_with("lost update"))
        .count();
    assert_eq!(lost, 2, "{:?}", r.violations);
    // A counter that does not match the logged increments.
    let a = h_line(0, 0, 1, 100, 400, 200) + &w_line(0, 0, 1, 0, 110, 150);
    let r = check(&[("a".into(), a)], 3);
    assert_eq!(r.violations.len(), 1, "{:?}", r.violations);
}

#[test]
fn checker_reports_writes_outside_validity_and_garbage() {
    // Written after the deadline (300), and before the acquire returned.
    let a = h_line(0, 0, 1, 100, 300, u64::MAX)
        + &w_line(0, 0, 1, 0, 250, 320)
        + &w_line(0, 0, 1, 1, 90, 95);
    let r = check(&[("a".into(), a)], 2);
    let outside = r
        .violations
        .iter()
        .filter(|v| v.starts_with("write outside validity"))
        .count();
    assert_eq!(outside, 2, "{:?}", r.violations);
    let r = check(&[("a".into(), "W 0 0 1 zero\n".into())], 0);
    assert_eq!(r.violations.len(), 1, "{:?}", r.violations);
}

#[test]
fn shared_clock_maps_instants_consistently() {
    let clock = Clock::calibrate();
    let a = mono_ns();
    let i = Instant::now();
    let b = mono_ns();
    let mapped = clock.map(i);
    // The map errs late by at most the calibration gap.
    assert!(
        mapped + 1_000_000 >= a && mapped <= b + 1_000_000,
        "{a} {mapped} {b}"
    );
    assert!(clock.skew_ns().abs() < 1_000_000);
}
