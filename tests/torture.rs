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
//! Holders stamp events with CLOCK_MONOTONIC, which every process on the machine shares,
//! and map their lock's deadline onto it so that it errs late, never early (see
//! `tests/common/checker.rs`). (`t_return + lock.remaining()` would err *early*:
//! `remaining()` reads the clock again, later.)
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
//! logged (`S`): a holder never *starts* to act after validity. A holder descheduled
//! between its last check and its write (a loaded machine does that for tens of ms) writes
//! late: the paused-client limit of every Redlock without fencing tokens. The checker
//! counts those apart ("late writes by paused holders"); should one lose an increment, the
//! lost-update check still fails the run. Holds also extend (~10 %, then do a second
//! increment), let the lock expire (~3 %), overstay their validity (~2 %) or run up to the
//! margin (~2 %). One call in five is a single `try_lock` instead of `lock`: its refusals
//! with some node holding another client's token show the run was contended.
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
//! `common::checker::check` parses every log and proves (1) no two windows overlap, and
//! every write starts inside its hold's window; (2) no increment was lost: sorted by time,
//! the logged `before → after` values are exactly 0→1→2→…, and the final counter equals
//! the number of increments. Its own tests below feed it overlapping, lost-update and
//! late-write logs; `tests/scenarios.rs` shows it catching a real overlap.
//!
//! # Floors
//!
//! A run that injected no faults or saw no contention proves nothing, so the run also
//! fails unless it saw at least [`FAULT_FLOOR_PER_10S`] freezes and as many kills per
//! 10 s (every one recovered), [`MIN_TRY_CONTENDED`] contended `try_lock` refusals, holds
//! by at least two worker processes, and `max(20, secs)` acquisitions.

mod common;

use common::Cluster;
use common::checker::{Clock, check, hold_line, mono_ns};
use quorumlock::{Error, Lock, Outcome, Redlock};
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
/// Freezes, and separately kills, the injector must have made per 10 s of run (at least
/// one each). The schedule (a fault every 20–400 ms, whenever fewer than 2 nodes are
/// disturbed; 60 % freezes of 5–1200 ms, 40 % kills of 400–1200 ms) gives a median of
/// ~28 freezes and ~19 kills in 20 s; simulated over 20,000 seeds with every restart
/// blocking the injector for 1 s (a badly loaded machine) the fewest seen were 2 freezes
/// and 5 kills. So 1 per 10 s (2 in the CI run) fails only if the injector did not run.
const FAULT_FLOOR_PER_10S: u64 = 1;
/// Percent of calls made with `try_lock` (one attempt) rather than `lock`.
const TRY_LOCK_PERCENT: u32 = 20;
/// `try_lock` refusals in which some node held another client's token, that the run must
/// see. Eight threads share one resource, ~7 % of holds keep it 250–300 ms, and ~20 % of
/// the ~1000 calls of a 20 s run are `try_lock`: a typical run sees ~40 (whatever the
/// error reads: with nodes down, "unavailable" more often than "taken"). Three is a floor
/// that only a run without contention misses.
const MIN_TRY_CONTENDED: u64 = 3;

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
    /// `try_lock` calls refused with some node holding another client's token.
    try_contended: u64,
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
        let single = rng.u32(0..100) < TRY_LOCK_PERCENT;
        let call_ns = mono_ns();
        let result = if single {
            rl.try_lock(RESOURCE, TTL)
        } else {
            rl.lock(RESOURCE, TTL)
        };
        let acq_ns = mono_ns();
        let mut lock = match result {
            Ok(lock) => lock,
            Err(e) if single => {
                // Contention seen: some node held another client's token. (With nodes
                // down the error may read "unavailable" rather than "taken".)
                let held = e
                    .failure()
                    .is_some_and(|f| f.count(|o| matches!(o, Outcome::Held)) > 0);
                if held {
                    stats.try_contended += 1;
                }
                // For diagnosis only.
                writeln!(
                    log,
                    "F {} {thread} {call_ns} {acq_ns} try_lock: {e}",
                    cfg.worker
                )?;
                continue;
            }
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
        log.write_all(
            hold_line(
                cfg.worker,
                thread,
                hold,
                call_ns,
                started_ns,
                acq_ns,
                deadline_ns,
                rel_ns,
                extended,
            )
            .as_bytes(),
        )?;
        // After every hold, so a worker that dies loses at most the hold in progress.
        log.flush()?;
    }
    writeln!(
        log,
        "E {} {thread} {} {} {} {} {} {} {} {} {} {}",
        cfg.worker,
        stats.holds,
        stats.taken,
        stats.unavailable,
        stats.expired,
        stats.other,
        stats.extend_ok,
        stats.extend_failed,
        stats.unlock_errors,
        stats.try_contended,
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

/// The run's directory (counter and logs): in memory (`/dev/shm`) when there is one. The
/// counter stands in for a resource the lock protects; on a disk, a busy machine stalls a
/// `write` or `rename` for hundreds of ms (seen: 800 ms under I/O pressure), and a holder
/// stalled inside its critical section is a paused client — which the lock cannot prevent
/// and which is not what this test is about.
fn temp_dir() -> PathBuf {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let name = format!("quorumlock-torture-{}-{nanos}", std::process::id());
    let shm = Path::new("/dev/shm");
    let in_memory = shm.join(&name);
    if shm.is_dir() && fs::create_dir_all(&in_memory).is_ok() {
        return in_memory;
    }
    let dir = std::env::temp_dir().join(name);
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
    // Floors: a run without faults or contention proves nothing (see the module docs).
    if !early_exit {
        let fault_floor = (FAULT_FLOOR_PER_10S * secs / 10).max(1);
        for (what, n) in [("freezes", faults.freeze), ("kills", faults.kill)] {
            if n < fault_floor {
                problems.push(format!(
                    "only {n} {what} injected in {secs} s (floor {fault_floor}): the run \
                     proves nothing"
                ));
            }
        }
        if faults.thaw != faults.freeze || faults.restart != faults.kill {
            problems.push(format!(
                "not every fault was recovered: {} freezes / {} thaws, {} kills / {} restarts",
                faults.freeze, faults.thaw, faults.kill, faults.restart
            ));
        }
    }
    if report.try_contended < MIN_TRY_CONTENDED {
        problems.push(format!(
            "only {} try_lock calls found the lock held elsewhere (floor {MIN_TRY_CONTENDED}): the run \
             saw no contention",
            report.try_contended
        ));
    }
    let holders = report.per_worker.values().filter(|&&n| n > 0).count();
    if holders < 2 {
        problems.push(format!(
            "only {holders} worker process(es) ever held the lock ({:?}): no mutual \
             exclusion was exercised",
            report.per_worker
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
        "torture: late writes by paused holders: {} (not violations; lost increments are)",
        report.late_writes
    );
    let _ = writeln!(
        summary,
        "torture: try_lock refused, lock held elsewhere={}, failed lock() calls={} (taken={} \
         unavailable={} expired={} other={}), extend failures={}, unlock errors={}",
        report.try_contended,
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
    for l in &report.late_examples {
        println!("  late write {l}");
    }
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
    hold_line(w, t, hold, acq - 5, acq - 3, acq, deadline, rel, false)
}

fn w_line(w: usize, t: usize, hold: u64, before: u64, start: u64, end: u64) -> String {
    format!("W {w} {t} {hold} {before} {} {start} {end}\n", before + 1)
}

const E_LINE: &str = "E 0 0 2 1 0 0 0 0 0 0 4 12\n";

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
    assert_eq!((r.taken, r.try_contended, r.late_writes), (1, 4, 0));
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
    // Started after the deadline (300), and before the acquire returned.
    let a = h_line(0, 0, 1, 100, 300, u64::MAX)
        + &w_line(0, 0, 1, 0, 310, 320)
        + &w_line(0, 0, 1, 1, 90, 95);
    let r = check(&[("a".into(), a)], 2);
    let outside = r
        .violations
        .iter()
        .filter(|v| v.starts_with("write outside validity"))
        .count();
    assert_eq!(outside, 2, "{:?}", r.violations);
    assert_eq!(r.late_writes, 0);
    let r = check(&[("a".into(), "W 0 0 1 zero\n".into())], 0);
    assert_eq!(r.violations.len(), 1, "{:?}", r.violations);
}

#[test]
fn checker_counts_late_writes_apart_unless_they_lose_an_increment() {
    // A paused holder: checked at 250 (inside [100, 300)), wrote at 320. The next holder
    // starts at 330 and reads the value it wrote: nothing lost, a late write.
    let a = h_line(0, 0, 1, 100, 300, u64::MAX) + &w_line(0, 0, 1, 0, 250, 320);
    let b = h_line(1, 0, 1, 330, 600, 400) + &w_line(1, 0, 1, 1, 340, 350);
    let r = check(&[("a".into(), a), ("b".into(), b)], 2);
    assert!(r.violations.is_empty(), "{:?}", r.violations);
    assert_eq!(r.late_writes, 1);
    assert_eq!(r.late_examples.len(), 1);
    // The same pause, but the next holder read the counter before the late write landed
    // (both wrote 1): the late write lost an increment, and that is a violation.
    let a = h_line(0, 0, 1, 100, 300, u64::MAX) + &w_line(0, 0, 1, 0, 250, 380);
    let b = h_line(1, 0, 1, 330, 600, 400) + &w_line(1, 0, 1, 0, 340, 350);
    let r = check(&[("a".into(), a), ("b".into(), b)], 1);
    assert_eq!(r.late_writes, 1);
    assert!(
        r.violations.iter().any(|v| v.starts_with("lost update")),
        "{:?}",
        r.violations
    );
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
