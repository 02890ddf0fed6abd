//! The shared client (`SharedRedlock`, issue #11) against the direct `Redlock`, on the same
//! local nodes, in the same run.
//!
//! ```text
//! cargo bench --bench shared                    # full run (~1-2 min)
//! cargo bench --bench shared -- --quick         # CI-sized run (a few seconds)
//! SHARED_QUICK=1 cargo bench --bench shared     # same
//! ```
//!
//! Sections (stdout is Markdown; progress goes to stderr):
//!
//! 1. **One caller.** The direct `Redlock`, the shared client's blocking calls, and its
//!    futures (driven by a tokio current-thread runtime, one `block_on` per slice), in
//!    alternating slices of `SLICE_CYCLES` cycles within one run on the same nodes, so
//!    machine noise hits every row alike. Acquire (`try_lock`) and release (`unlock`) are
//!    timed separately; p50/p99 and the shared rows' ratios to the direct row.
//! 2. **Allocations per call** in steady state, counted by a global allocator that sees
//!    every thread (the shared client's loop thread too): blocking calls, futures (only the
//!    allocations inside the measured loop), and the direct client for reference.
//! 3. **64 threads**, each on its own key: one `SharedRedlock` for all of them vs 64
//!    independent `Redlock` clients, slices alternating between the two; lock+unlock cycles
//!    per second, medians over slices, and the ratio.
//! 4. **10,000 tokio tasks**, each `lock` + `unlock` on its own key through one
//!    `SharedRedlock` on a multi-thread runtime: failures, connections per node during the
//!    run (sampled from `INFO clients` by admin connections, each minus itself), wall time,
//!    and RSS (VmRSS / VmHWM from `/proc/self/status`; VmHWM is reset before the run via
//!    `/proc/self/clear_refs` where the kernel allows it).
//! 5. **Hand-off**: two clients pass one lock back and forth, the waiter woken by the
//!    release notice, against a waiter that polls.
//!
//! No timing is asserted; failed operations are counted and reported.
//!
//! Environment: `SHARED_ITERS` (one-caller cycles per row; default 20000, 2000 quick),
//! `SHARED_ALLOC_CYCLES` (default 10000, 1000 quick), `SHARED_SLICE_SECS` (64-thread slice
//! length, default 2, 0.25 quick), `SHARED_SLICES` (slices per row, default 10, 3 quick),
//! `SHARED_TASKS` (default 10000), `SHARED_TASK_RUNS` (default 3, 1 quick),
//! `SHARED_QUICK=1`, `SHARED_SECTIONS` (the digits of the sections to run, e.g. `13`;
//! all by default).

#[path = "../tests/common/mod.rs"]
mod common;

use common::{Admin, Cluster};
use quorumlock::{Error, Lock, Redlock, SharedRedlock};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

#[path = "support/counting.rs"]
mod counting;

use counting::allocs;

// ---------------------------------------------------------------------------------------
// Settings.

const NODES: usize = 5;
const TTL: Duration = Duration::from_secs(10);
/// Cycles of one row before the next row's slice (one-caller section).
const SLICE_CYCLES: usize = 50;
/// Threads of the many-threads section.
const THREADS: usize = 64;
/// Warm-up cycles before an allocation count.
const ALLOC_WARMUP: usize = 300;

struct Config {
    quick: bool,
    iters: usize,
    alloc_cycles: usize,
    slice_secs: f64,
    slices: usize,
    tasks: usize,
    task_runs: usize,
    /// The sections to run (`SHARED_SECTIONS=13`: sections 1 and 3); all by default.
    sections: Option<String>,
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
        let quick = quick_flag || std::env::var("SHARED_QUICK").is_ok_and(|v| v == "1");
        Config {
            quick,
            iters: env_num("SHARED_ITERS").unwrap_or(if quick { 2000 } else { 20_000 }),
            alloc_cycles: env_num("SHARED_ALLOC_CYCLES").unwrap_or(if quick {
                1000
            } else {
                10_000
            }),
            slice_secs: env_num("SHARED_SLICE_SECS").unwrap_or(if quick { 0.25 } else { 2.0 }),
            slices: env_num::<usize>("SHARED_SLICES")
                .unwrap_or(if quick { 3 } else { 10 })
                .max(1),
            tasks: env_num("SHARED_TASKS").unwrap_or(10_000),
            task_runs: env_num::<usize>("SHARED_TASK_RUNS")
                .unwrap_or(if quick { 1 } else { 3 })
                .max(1),
            sections: std::env::var("SHARED_SECTIONS").ok(),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Failures: counted, never fatal (node_timeout is the default 50 ms, and a shared 2-core
// machine can stall longer).
//
// A release that returns `Ok(n)` with `n` below the quorum is not a failure: `unlock`
// returns once a majority has *answered*, and a node where the acquire's SET timed out
// answers 0 (the lock was held on fewer than all nodes). Such releases are counted apart,
// as "short releases", with the first one reported.

#[derive(Default)]
struct Failures {
    count: u64,
    first: Option<String>,
    short: u64,
    first_short: Option<String>,
}

impl Failures {
    fn add(&mut self, what: impl FnOnce() -> String) {
        self.count += 1;
        if self.first.is_none() {
            let e = what();
            eprintln!("first failure: {e}");
            self.first = Some(e);
        }
    }

    fn add_short(&mut self, what: impl FnOnce() -> String) {
        self.short += 1;
        if self.first_short.is_none() {
            self.first_short = Some(what());
        }
    }

    fn merge(&mut self, other: Failures) {
        self.count += other.count;
        self.short += other.short;
        if self.first.is_none() {
            self.first = other.first;
        }
        if self.first_short.is_none() {
            self.first_short = other.first_short;
        }
    }

    /// Prints the first failure and the first short release, if any.
    fn print_firsts(&self, name: &str) {
        if let Some(e) = &self.first {
            println!("\n{name}, first failure: {e}");
        }
        if let Some(e) = &self.first_short {
            println!("\n{name}, first short release: {e}");
        }
    }
}

/// Whether the release succeeded (a short release did).
fn check_unlock(r: Result<usize, Error>, quorum: usize, f: &mut Failures, who: &str) -> bool {
    match r {
        Ok(n) if n >= quorum => true,
        Ok(n) => {
            f.add_short(|| {
                format!("{who}: unlock confirmed {n} deletions (quorum {quorum}) when it returned")
            });
            true
        }
        Err(e) => {
            f.add(|| format!("{who}: unlock: {e}"));
            false
        }
    }
}

// ---------------------------------------------------------------------------------------
// Clients.

fn direct(urls: &[String]) -> Redlock {
    Redlock::builder()
        .nodes(urls)
        .build()
        .expect("direct client")
}

fn shared(urls: &[String]) -> SharedRedlock {
    Redlock::builder()
        .nodes(urls)
        .build_shared()
        .expect("shared client")
}

/// Waits (up to 10 s) for a first full cycle: connections open in the background.
fn warm_direct(rl: &mut Redlock, key: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match rl.try_lock(key, TTL) {
            Ok(lock) => {
                let _ = rl.unlock(&lock);
                return;
            }
            Err(e) if Instant::now() < deadline => {
                eprintln!("direct warm-up on {key}: {e}");
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("direct client never got a lock: {e}"),
        }
    }
}

fn warm_shared(sh: &SharedRedlock, key: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match sh.blocking_try_lock(key, TTL) {
            Ok(lock) => {
                let _ = sh.blocking_unlock(&lock);
                return;
            }
            Err(e) if Instant::now() < deadline => {
                eprintln!("shared warm-up on {key}: {e}");
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("shared client never got a lock: {e}"),
        }
    }
}

fn current_thread_rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio current-thread runtime")
}

// ---------------------------------------------------------------------------------------
// Section 1: one caller, interleaved slices.

#[derive(Default)]
struct Samples {
    acq: Vec<u64>,
    rel: Vec<u64>,
    /// Per slice: the slice's acquire p50 (for per-slice ratios).
    slice_acq_p50: Vec<u64>,
    fails: Failures,
}

impl Samples {
    fn push(&mut self, t0: Instant, t1: Instant, t2: Instant) {
        self.acq.push((t1 - t0).as_nanos() as u64);
        self.rel.push((t2 - t1).as_nanos() as u64);
    }

    fn end_slice(&mut self, n: usize) {
        let start = self.acq.len().saturating_sub(n);
        let s = sorted(&self.acq[start..]);
        if !s.is_empty() {
            self.slice_acq_p50.push(pct(&s, 0.5));
        }
    }
}

fn slice_direct(rl: &mut Redlock, key: &str, n: usize, quorum: usize, s: &mut Samples) {
    for _ in 0..n {
        let t0 = Instant::now();
        let r = rl.try_lock(key, TTL);
        let t1 = Instant::now();
        match r {
            Ok(lock) => {
                let u = rl.unlock(&lock);
                let t2 = Instant::now();
                check_unlock(u, quorum, &mut s.fails, "direct");
                s.push(t0, t1, t2);
            }
            Err(e) => s.fails.add(|| format!("direct: try_lock: {e}")),
        }
    }
    s.end_slice(n);
}

fn slice_blocking(sh: &SharedRedlock, key: &str, n: usize, quorum: usize, s: &mut Samples) {
    for _ in 0..n {
        let t0 = Instant::now();
        let r = sh.blocking_try_lock(key, TTL);
        let t1 = Instant::now();
        match r {
            Ok(lock) => {
                let u = sh.blocking_unlock(&lock);
                let t2 = Instant::now();
                check_unlock(u, quorum, &mut s.fails, "shared blocking");
                s.push(t0, t1, t2);
            }
            Err(e) => s.fails.add(|| format!("shared blocking: try_lock: {e}")),
        }
    }
    s.end_slice(n);
}

fn slice_async(
    rt: &tokio::runtime::Runtime,
    sh: &SharedRedlock,
    key: &str,
    n: usize,
    quorum: usize,
    s: &mut Samples,
) {
    rt.block_on(async {
        for _ in 0..n {
            let t0 = Instant::now();
            let r = sh.try_lock(key, TTL).await;
            let t1 = Instant::now();
            match r {
                Ok(lock) => {
                    let u = sh.unlock(&lock).await;
                    let t2 = Instant::now();
                    check_unlock(u, quorum, &mut s.fails, "shared async");
                    s.push(t0, t1, t2);
                }
                Err(e) => s.fails.add(|| format!("shared async: try_lock: {e}")),
            }
        }
    });
    s.end_slice(n);
}

fn one_caller(cfg: &Config, urls: &[String]) {
    eprintln!("one caller: {} cycles per row, interleaved", cfg.iters);
    let mut rl = direct(urls);
    let sh = shared(urls);
    let rt = current_thread_rt();
    let quorum = rl.quorum();
    let (kd, kb, ka) = (
        "sh:one:direct",
        "sh:one:shared-blocking",
        "sh:one:shared-async",
    );
    warm_direct(&mut rl, kd);
    warm_shared(&sh, kb);
    let warm = (cfg.iters / 10).clamp(100, 2000);
    let mut scratch = Samples::default();
    slice_direct(&mut rl, kd, warm, quorum, &mut scratch);
    slice_blocking(&sh, kb, warm, quorum, &mut scratch);
    slice_async(&rt, &sh, ka, warm, quorum, &mut scratch);

    let mut rows: [Samples; 3] = Default::default();
    for r in rows.iter_mut() {
        r.acq.reserve(cfg.iters);
        r.rel.reserve(cfg.iters);
    }
    let slices = cfg.iters.div_ceil(SLICE_CYCLES);
    for i in 0..slices {
        let n = SLICE_CYCLES.min(cfg.iters - i * SLICE_CYCLES);
        // Rotate which row goes first, so no row always follows the same one.
        for k in 0..3 {
            match (i + k) % 3 {
                0 => slice_direct(&mut rl, kd, n, quorum, &mut rows[0]),
                1 => slice_blocking(&sh, kb, n, quorum, &mut rows[1]),
                _ => slice_async(&rt, &sh, ka, n, quorum, &mut rows[2]),
            }
        }
    }
    drop(rt);
    drop(sh);
    drop(rl);

    let names = [
        "direct `Redlock` (`try_lock` + `unlock`)",
        "`SharedRedlock`, blocking (`blocking_try_lock` + `blocking_unlock`)",
        "`SharedRedlock`, futures (`try_lock(..).await` + `unlock(..).await`, current-thread `block_on`)",
    ];
    println!(
        "#### 1. One caller: latency, µs ({} cycles per row in slices of {SLICE_CYCLES}, \
         rows alternating; {warm} warm-up cycles per row)\n",
        cfg.iters
    );
    println!(
        "| row | acquire p50 | p99 | release p50 | p99 | cycle p50 | cycles | failed ops | short releases |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (name, s) in names.iter().zip(&rows) {
        let a = sorted(&s.acq);
        let r = sorted(&s.rel);
        let c = sorted(
            &s.acq
                .iter()
                .zip(&s.rel)
                .map(|(x, y)| x + y)
                .collect::<Vec<_>>(),
        );
        println!(
            "| {name} | {} | {} | {} | {} | {} | {} | {} | {} |",
            us(pct(&a, 0.5)),
            us(pct(&a, 0.99)),
            us(pct(&r, 0.5)),
            us(pct(&r, 0.99)),
            us(pct(&c, 0.5)),
            s.acq.len(),
            s.fails.count,
            s.fails.short
        );
    }
    println!(
        "\nRatios to the direct client (p50/p50, p99/p99; per-slice: median over slices of the slice's acquire p50 ratio):\n"
    );
    println!(
        "| row | acquire p50 | acquire p99 | release p50 | release p99 | acquire, median per-slice p50 ratio |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    let base_a = sorted(&rows[0].acq);
    let base_r = sorted(&rows[0].rel);
    let ratio = |v: &[u64], b: &[u64], q: f64| pct(v, q) as f64 / pct(b, q).max(1) as f64;
    let mut acq_p50_ratios = Vec::new();
    for (name, s) in names.iter().zip(&rows).skip(1) {
        let a = sorted(&s.acq);
        let r = sorted(&s.rel);
        let per_slice = median_f(
            s.slice_acq_p50
                .iter()
                .zip(&rows[0].slice_acq_p50)
                .map(|(&x, &y)| x as f64 / y.max(1) as f64)
                .collect(),
        );
        acq_p50_ratios.push(ratio(&a, &base_a, 0.5));
        println!(
            "| {name} | {:.2} | {:.2} | {:.2} | {:.2} | {per_slice:.2} |",
            ratio(&a, &base_a, 0.5),
            ratio(&a, &base_a, 0.99),
            ratio(&r, &base_r, 0.5),
            ratio(&r, &base_r, 0.99),
        );
    }
    let goal = |x: f64| if x <= 1.15 { "met" } else { "not met" };
    println!(
        "\nShared-client acquire p50 over the direct client's: blocking {:.2}× ({}), \
         futures {:.2}× ({}); goal ≤ 1.15×.",
        acq_p50_ratios[0],
        goal(acq_p50_ratios[0]),
        acq_p50_ratios[1],
        goal(acq_p50_ratios[1]),
    );
    for (name, s) in names.iter().zip(&rows) {
        s.fails.print_firsts(name);
    }
    println!();
}

// ---------------------------------------------------------------------------------------
// Section 2: allocations per call.

struct AllocRow {
    name: &'static str,
    acq: (u64, u64),
    rel: (u64, u64),
    cycles: usize,
    fails: Failures,
}

/// Counts the allocations of `acquire` and `release` separately over `n` cycles.
fn count_cycles(
    n: usize,
    mut acquire: impl FnMut() -> Option<Lock>,
    mut release: impl FnMut(&Lock),
) -> ((u64, u64), (u64, u64)) {
    let (mut acq, mut rel) = ((0, 0), (0, 0));
    for _ in 0..n {
        let a0 = allocs();
        let lock = acquire();
        let a1 = allocs();
        if let Some(lock) = lock {
            release(&lock);
            let a2 = allocs();
            // The lock's own drop is outside the count (it never allocates anyway).
            drop(lock);
            rel.0 += a2.0 - a1.0;
            rel.1 += a2.1 - a1.1;
        }
        acq.0 += a1.0 - a0.0;
        acq.1 += a1.1 - a0.1;
    }
    (acq, rel)
}

/// `n` cycles of `try_lock(..).await` + `unlock(..).await`; the allocations of each
/// `.await` counted on its own.
async fn async_cycles(
    sh: &SharedRedlock,
    key: &str,
    quorum: usize,
    n: usize,
    fails: &mut Failures,
) -> ((u64, u64), (u64, u64)) {
    let (mut acq, mut rel) = ((0u64, 0u64), (0u64, 0u64));
    for _ in 0..n {
        let a0 = allocs();
        let r = sh.try_lock(key, TTL).await;
        let a1 = allocs();
        acq.0 += a1.0 - a0.0;
        acq.1 += a1.1 - a0.1;
        match r {
            Ok(lock) => {
                let u = sh.unlock(&lock).await;
                let a2 = allocs();
                rel.0 += a2.0 - a1.0;
                rel.1 += a2.1 - a1.1;
                check_unlock(u, quorum, fails, "shared async");
            }
            Err(e) => fails.add(|| format!("shared async: try_lock: {e}")),
        }
    }
    (acq, rel)
}

fn allocations(cfg: &Config, urls: &[String]) {
    let n = cfg.alloc_cycles;
    eprintln!("allocations: {n} steady-state cycles per row");
    let mut rows = Vec::new();

    // Direct client, for reference.
    {
        let mut rl = direct(urls);
        let quorum = rl.quorum();
        let key = "sh:alloc:direct";
        warm_direct(&mut rl, key);
        let rl = std::cell::RefCell::new(rl);
        let fails = std::cell::RefCell::new(Failures::default());
        let acquire = || match rl.borrow_mut().try_lock(key, TTL) {
            Ok(l) => Some(l),
            Err(e) => {
                fails.borrow_mut().add(|| format!("direct: try_lock: {e}"));
                None
            }
        };
        let release = |l: &Lock| {
            let r = rl.borrow_mut().unlock(l);
            check_unlock(r, quorum, &mut fails.borrow_mut(), "direct");
        };
        count_cycles(ALLOC_WARMUP, acquire, release);
        let (acq, rel) = count_cycles(n, acquire, release);
        rows.push(AllocRow {
            name: "direct `Redlock`: `try_lock` / `unlock`",
            acq,
            rel,
            cycles: n,
            fails: fails.into_inner(),
        });
    }

    let sh = shared(urls);
    let quorum = sh.quorum();

    // Blocking calls: the caller's thread and the loop thread both count.
    {
        let key = "sh:alloc:blocking";
        warm_shared(&sh, key);
        let fails = std::cell::RefCell::new(Failures::default());
        let acquire = || match sh.blocking_try_lock(key, TTL) {
            Ok(l) => Some(l),
            Err(e) => {
                fails
                    .borrow_mut()
                    .add(|| format!("shared blocking: try_lock: {e}"));
                None
            }
        };
        let release = |l: &Lock| {
            let r = sh.blocking_unlock(l);
            check_unlock(r, quorum, &mut fails.borrow_mut(), "shared blocking");
        };
        count_cycles(ALLOC_WARMUP, acquire, release);
        let (acq, rel) = count_cycles(n, acquire, release);
        rows.push(AllocRow {
            name: "`SharedRedlock`, blocking: `blocking_try_lock` / `blocking_unlock`",
            acq,
            rel,
            cycles: n,
            fails: fails.into_inner(),
        });
    }

    // Futures on a current-thread runtime: only the allocations inside the measured loop
    // (each `.await` counted on its own), not the runtime's setup.
    {
        let key = "sh:alloc:async";
        let rt = current_thread_rt();
        let (acq, rel, fails) = rt.block_on(async {
            let mut fails = Failures::default();
            async_cycles(&sh, key, quorum, ALLOC_WARMUP, &mut fails).await;
            let (acq, rel) = async_cycles(&sh, key, quorum, n, &mut fails).await;
            (acq, rel, fails)
        });
        rows.push(AllocRow {
            name: "`SharedRedlock`, futures: `try_lock(..).await` / `unlock(..).await`",
            acq,
            rel,
            cycles: n,
            fails,
        });
    }
    drop(sh);

    println!(
        "#### 2. Allocations per call, steady state ({n} cycles after {ALLOC_WARMUP} warm-up; \
         every thread counted, the shared client's loop thread included; keys ≤ {} bytes, inline)\n",
        quorumlock::INLINE_RESOURCE
    );
    println!(
        "| row | allocs per acquire | bytes | allocs per release | bytes | allocs per cycle | failed ops |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        let c = r.cycles.max(1) as f64;
        println!(
            "| {} | {:.2} | {:.0} | {:.2} | {:.0} | {:.2} | {} |",
            r.name,
            r.acq.0 as f64 / c,
            r.acq.1 as f64 / c,
            r.rel.0 as f64 / c,
            r.rel.1 as f64 / c,
            (r.acq.0 + r.rel.0) as f64 / c,
            r.fails.count
        );
    }
    let b = &rows[1];
    println!(
        "\nBlocking calls: {} allocations in {} cycles (goal 0: {}).",
        b.acq.0 + b.rel.0,
        b.cycles,
        if b.acq.0 + b.rel.0 == 0 {
            "met"
        } else {
            "not met"
        }
    );
    for r in &rows {
        r.fails.print_firsts(r.name);
    }
    println!();
}

// ---------------------------------------------------------------------------------------
// Section 3: 64 threads on distinct keys.

struct SliceResult {
    locks_per_s: f64,
    /// Per-cycle latencies (lock + unlock), ns, every thread.
    cycles: Vec<u64>,
    fails: Failures,
}

/// Every thread runs `cycle(t)` without pause for `secs`; cycles that succeeded per second.
fn thread_slice<S: Send>(
    states: &mut [S],
    secs: f64,
    cycle: impl Fn(&mut S, &mut Failures) -> bool + Sync,
) -> SliceResult {
    let barrier = Barrier::new(states.len());
    let total = Mutex::new((0u64, 0.0f64, Vec::new(), Failures::default()));
    std::thread::scope(|s| {
        for st in states.iter_mut() {
            let (barrier, total, cycle) = (&barrier, &total, &cycle);
            s.spawn(move || {
                let mut lat = Vec::with_capacity(4096);
                let mut fails = Failures::default();
                let mut ok = 0u64;
                barrier.wait();
                let start = Instant::now();
                let until = start + Duration::from_secs_f64(secs);
                let mut now = start;
                while now < until {
                    let ok_cycle = cycle(st, &mut fails);
                    let t = Instant::now();
                    if ok_cycle {
                        ok += 1;
                        lat.push((t - now).as_nanos() as u64);
                    }
                    now = t;
                }
                let el = start.elapsed().as_secs_f64();
                let mut t = total.lock().unwrap_or_else(|e| e.into_inner());
                t.0 += ok;
                t.1 += el;
                t.2.extend_from_slice(&lat);
                t.3.merge(fails);
            });
        }
    });
    let (ok, secs_sum, cycles, fails) = total.into_inner().unwrap_or_else(|e| e.into_inner());
    let mean_secs = secs_sum / states.len() as f64;
    SliceResult {
        locks_per_s: ok as f64 / mean_secs.max(1e-9),
        cycles,
        fails,
    }
}

fn many_threads(cfg: &Config, urls: &[String]) {
    eprintln!(
        "{THREADS} threads: {} slices of {} s per row, alternating",
        cfg.slices, cfg.slice_secs
    );
    let sh = shared(urls);
    let quorum = sh.quorum();
    let mut shared_keys: Vec<String> = (0..THREADS).map(|t| format!("sh:t64:shared:{t}")).collect();
    for k in &shared_keys {
        warm_shared(&sh, k);
    }
    eprintln!("building {THREADS} direct clients ...");
    let mut directs: Vec<(Redlock, String)> = (0..THREADS)
        .map(|t| {
            let key = format!("sh:t64:direct:{t}");
            let mut rl = direct(urls);
            warm_direct(&mut rl, &key);
            (rl, key)
        })
        .collect();

    let shared_cycle = |key: &mut String, f: &mut Failures| -> bool {
        match sh.blocking_try_lock(key.as_str(), TTL) {
            Ok(lock) => check_unlock(sh.blocking_unlock(&lock), quorum, f, "shared"),
            Err(e) => {
                f.add(|| format!("shared: try_lock: {e}"));
                false
            }
        }
    };
    let direct_cycle = |st: &mut (Redlock, String), f: &mut Failures| -> bool {
        let (rl, key) = st;
        match rl.try_lock(key.as_str(), TTL) {
            Ok(lock) => check_unlock(rl.unlock(&lock), quorum, f, "direct"),
            Err(e) => {
                f.add(|| format!("direct: try_lock: {e}"));
                false
            }
        }
    };
    // Warm-up slices (threads, buffers, the loop's scratch at this width).
    let warm = (cfg.slice_secs / 2.0).min(0.5);
    thread_slice(&mut shared_keys, warm, shared_cycle);
    thread_slice(&mut directs, warm, direct_cycle);

    let mut s_rates = Vec::new();
    let mut d_rates = Vec::new();
    let mut s_lat = Vec::new();
    let mut d_lat = Vec::new();
    let mut s_fails = Failures::default();
    let mut d_fails = Failures::default();
    for i in 0..cfg.slices {
        let mut run_shared = || {
            let r = thread_slice(&mut shared_keys, cfg.slice_secs, shared_cycle);
            s_rates.push(r.locks_per_s);
            s_lat.extend_from_slice(&r.cycles);
            s_fails.merge(r.fails);
        };
        let mut run_direct = || {
            let r = thread_slice(&mut directs, cfg.slice_secs, direct_cycle);
            d_rates.push(r.locks_per_s);
            d_lat.extend_from_slice(&r.cycles);
            d_fails.merge(r.fails);
        };
        if i % 2 == 0 {
            run_shared();
            run_direct();
        } else {
            run_direct();
            run_shared();
        }
        eprintln!(
            "  slice {i}: shared {} locks/s, direct {} locks/s",
            rate(*s_rates.last().unwrap_or(&0.0)),
            rate(*d_rates.last().unwrap_or(&0.0))
        );
    }
    drop(directs);
    drop(sh);

    let pair: Vec<f64> = s_rates
        .iter()
        .zip(&d_rates)
        .map(|(s, d)| s / d.max(1e-9))
        .collect();
    let (sm, dm) = (median_f(s_rates.clone()), median_f(d_rates.clone()));
    println!(
        "#### 3. {THREADS} threads, each on its own key: lock+unlock cycles/s \
         ({} slices of {} s per row, alternating)\n",
        cfg.slices, cfg.slice_secs
    );
    println!(
        "| row | locks/s, median of slices | min | max | cycle p50, µs | p99, µs | failed ops | short releases |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for (name, rates, lat, fails) in [
        (
            "one `SharedRedlock`, `blocking_try_lock` + `blocking_unlock`",
            &s_rates,
            &mut s_lat,
            &s_fails,
        ),
        (
            "64 independent `Redlock` clients, `try_lock` + `unlock`",
            &d_rates,
            &mut d_lat,
            &d_fails,
        ),
    ] {
        lat.sort_unstable();
        let min = rates.iter().copied().fold(f64::INFINITY, f64::min);
        let max = rates.iter().copied().fold(0.0, f64::max);
        println!(
            "| {name} | {} | {} | {} | {} | {} | {} | {} |",
            rate(median_f(rates.clone())),
            rate(min),
            rate(max),
            if lat.is_empty() {
                "-".into()
            } else {
                us(pct(lat, 0.5))
            },
            if lat.is_empty() {
                "-".into()
            } else {
                us(pct(lat, 0.99))
            },
            fails.count,
            fails.short
        );
    }
    let ratio = sm / dm.max(1e-9);
    println!(
        "\nShared / independent, locks/s: {ratio:.2}× (ratio of medians; median of per-slice \
         ratios {:.2}×); goal ≥ 5×: {}.",
        median_f(pair),
        if ratio >= 5.0 { "met" } else { "not met" }
    );
    for (name, f) in [("shared", &s_fails), ("independent", &d_fails)] {
        f.print_firsts(name);
    }
    println!();
}

// ---------------------------------------------------------------------------------------
// Section 4: 10,000 tokio tasks through one SharedRedlock.

/// `(VmRSS, VmHWM)` in KiB.
fn rss_kib() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn mib(kib: u64) -> String {
    format!("{:.1}", kib as f64 / 1024.0)
}

/// Samples `connected_clients - 1` (minus the admin connection itself) on every node
/// until stopped; keeps the per-node maximum.
struct ConnSampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<(Vec<i64>, u64)>,
}

impl ConnSampler {
    fn start(mut admins: Vec<Admin>) -> ConnSampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut max = vec![0i64; admins.len()];
            let mut samples = 0u64;
            loop {
                let last = flag.load(Ordering::SeqCst);
                for (m, a) in max.iter_mut().zip(admins.iter_mut()) {
                    *m = (*m).max(a.connected_clients() - 1);
                }
                samples += 1;
                if last {
                    return (max, samples);
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        ConnSampler { stop, thread }
    }

    fn finish(self) -> (Vec<i64>, u64) {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().expect("connection sampler")
    }
}

struct TaskRun {
    wall: Duration,
    ok: usize,
    lock_failed: usize,
    unlock_failed: usize,
    /// Releases that returned with fewer deletions confirmed than the quorum.
    short: u64,
    first_error: Option<String>,
    first_short: Option<String>,
    peak_held: usize,
    /// Per node: others' connections before the client was built.
    before: Vec<i64>,
    /// Per node: the most connections seen during the run (admin excluded).
    peak_conns: Vec<i64>,
    samples: u64,
    rss_before: (u64, u64),
    rss_during_peak: u64,
    rss_after: (u64, u64),
    rss_dropped: u64,
    hwm_reset: bool,
    allocs_per_task: f64,
}

fn task_run(cluster: &Cluster, tasks: usize, run: usize) -> TaskRun {
    let mut admins = cluster.admins();
    // Clients of earlier sections may still be closing: wait (up to 3 s) for the nodes to
    // see only the admin connections.
    common::wait_until(Duration::from_secs(3), || {
        admins.iter_mut().all(|a| a.connected_clients() <= 1)
    });
    let before: Vec<i64> = admins
        .iter_mut()
        .map(|a| a.connected_clients() - 1)
        .collect();
    let hwm_reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
    let rss_before = rss_kib();
    let sampler = ConnSampler::start(admins);

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let sh = Redlock::builder()
        .nodes(cluster.urls())
        .build_shared()
        .expect("shared client");
    let quorum = sh.quorum();
    let held = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let errors: Arc<Mutex<Failures>> = Arc::default();
    let a0 = allocs().0;
    let start = Instant::now();
    let (ok, lock_failed, unlock_failed) = rt.block_on(async {
        let handles: Vec<_> = (0..tasks)
            .map(|i| {
                let (sh, held, peak, errors) = (
                    sh.clone(),
                    Arc::clone(&held),
                    Arc::clone(&peak),
                    Arc::clone(&errors),
                );
                tokio::spawn(async move {
                    let key = format!("sh:10k:{run}:{i}");
                    let lock = match sh.lock(&key, TTL).await {
                        Ok(l) => l,
                        Err(e) => {
                            let mut f = errors.lock().unwrap_or_else(|e| e.into_inner());
                            f.add(|| format!("lock {key}: {e}"));
                            return (false, false);
                        }
                    };
                    let now = held.fetch_add(1, Ordering::SeqCst) + 1;
                    peak.fetch_max(now, Ordering::SeqCst);
                    let r = sh.unlock(&lock).await;
                    held.fetch_sub(1, Ordering::SeqCst);
                    let mut f = Failures::default();
                    let ok = check_unlock(r, quorum, &mut f, &key);
                    if f.count + f.short > 0 {
                        errors.lock().unwrap_or_else(|e| e.into_inner()).merge(f);
                    }
                    (true, ok)
                })
            })
            .collect();
        let (mut ok, mut lf, mut uf) = (0, 0, 0);
        for h in handles {
            match h.await {
                Ok((true, true)) => ok += 1,
                Ok((true, false)) => uf += 1,
                Ok((false, _)) => lf += 1,
                Err(e) => {
                    lf += 1;
                    errors
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .add(|| format!("task: {e}"));
                }
            }
        }
        (ok, lf, uf)
    });
    let wall = start.elapsed();
    let allocs_per_task = (allocs().0 - a0) as f64 / tasks.max(1) as f64;
    let rss_mid = rss_kib();
    let (peak_conns, samples) = sampler.finish();
    drop(sh);
    drop(rt);
    let rss_dropped = rss_kib().0;
    let fails = std::mem::take(&mut *errors.lock().unwrap_or_else(|e| e.into_inner()));
    TaskRun {
        wall,
        ok,
        lock_failed,
        unlock_failed,
        short: fails.short,
        first_error: fails.first,
        first_short: fails.first_short,
        peak_held: peak.load(Ordering::SeqCst),
        before,
        peak_conns,
        samples,
        rss_before,
        rss_during_peak: rss_mid.1,
        rss_after: rss_mid,
        rss_dropped,
        hwm_reset,
        allocs_per_task,
    }
}

fn many_tasks(cfg: &Config, cluster: &Cluster) {
    eprintln!("{} tokio tasks, {} run(s)", cfg.tasks, cfg.task_runs);
    let runs: Vec<TaskRun> = (0..cfg.task_runs)
        .map(|i| task_run(cluster, cfg.tasks, i))
        .collect();
    let workers = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "#### 4. {} concurrent tokio tasks (multi-thread runtime, {workers} workers), each \
         `lock` + `unlock` on its own key through one `SharedRedlock`\n",
        cfg.tasks
    );
    println!(
        "| run | wall, ms | succeeded | lock failed | unlock failed | short releases | most held at once | \
         connections per node, peak (others before) | samples | RSS before, MiB | \
         peak RSS (VmHWM), MiB | RSS after, MiB | RSS after drop, MiB | allocs per task |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|");
    for (i, r) in runs.iter().enumerate() {
        let conns: Vec<String> = r
            .peak_conns
            .iter()
            .zip(&r.before)
            .map(|(p, b)| format!("{p} ({b})"))
            .collect();
        println!(
            "| {i} | {:.1} | {} | {} | {} | {} | {} | {} | {} | {} | {}{} | {} | {} | {:.1} |",
            r.wall.as_secs_f64() * 1e3,
            r.ok,
            r.lock_failed,
            r.unlock_failed,
            r.short,
            r.peak_held,
            conns.join(", "),
            r.samples,
            mib(r.rss_before.0),
            mib(r.rss_during_peak),
            if r.hwm_reset { "" } else { " (HWM not reset)" },
            mib(r.rss_after.0),
            mib(r.rss_dropped),
            r.allocs_per_task,
        );
    }
    let all_ok = runs
        .iter()
        .all(|r| r.ok == cfg.tasks && r.lock_failed == 0 && r.unlock_failed == 0);
    let one_conn = runs
        .iter()
        .all(|r| r.peak_conns.iter().zip(&r.before).all(|(p, b)| p - b <= 1));
    println!(
        "\nAll {} tasks succeeded in every run: {}. At most one connection per node beyond \
         the others present before: {}. RSS before: VmRSS with VmHWM reset to it \
         (`/proc/self/clear_refs`); the peak is the VmHWM read right after the last task; \
         \"after\" is with the runtime and client still alive, \"after drop\" without them. \
         A short release (`Ok(n)`, n below the quorum) succeeded: `unlock` returns once a \
         majority has answered, and a node where the acquire's SET had timed out answers 0.",
        cfg.tasks,
        if all_ok { "yes" } else { "NO" },
        if one_conn { "yes" } else { "NO" },
    );
    for (i, r) in runs.iter().enumerate() {
        if let Some(e) = &r.first_error {
            println!("\nrun {i}, first failure: {e}");
        }
        if let Some(e) = &r.first_short {
            println!("\nrun {i}, first short release: {e}");
        }
    }
    println!();
}

// ---------------------------------------------------------------------------------------
// Section 5: HAND-OFF — PLACEHOLDER, to be filled in by the lead.
//
// Meant to measure lock hand-off under contention with default settings (`lock_within`
// woken by the release notice; goal: median < 5 ms) beside polling's figure. Not measured
// yet: this only prints the marker line.

/// One side of a hand-off run: acquire (waiting as the client does), and release.
trait Taker: Send {
    fn take(&mut self, key: &str) -> Option<Lock>;
    fn give(&mut self, lock: &Lock);
}

/// The shared client waiting with `lock_within` (woken by the release notice).
struct NoticeTaker(SharedRedlock);

impl Taker for NoticeTaker {
    fn take(&mut self, key: &str) -> Option<Lock> {
        self.0
            .blocking_lock_within(key, TTL, Duration::from_secs(10))
            .ok()
    }
    fn give(&mut self, lock: &Lock) {
        let _ = self.0.blocking_unlock(lock);
    }
}

/// The direct client waiting with `lock` (polling: retry_delay ± retry_jitter).
struct PollTaker(Redlock);

impl Taker for PollTaker {
    fn take(&mut self, key: &str) -> Option<Lock> {
        self.0.lock(key, TTL).ok()
    }
    fn give(&mut self, lock: &Lock) {
        let _ = self.0.unlock(lock);
    }
}

/// Two clients pass one lock back and forth `n` times: the holder keeps it `hold`, then
/// releases it while the other waits; a hand-off is the time from just before the
/// release to the waiter holding the lock. Returns the hand-offs, in µs, and the
/// attempts that failed.
fn pass_around(
    mut a: Box<dyn Taker>,
    mut b: Box<dyn Taker>,
    key: &str,
    n: usize,
    hold: Duration,
) -> (Vec<u64>, usize) {
    let base = Instant::now();
    let released_at = Arc::new(AtomicU64::new(0));
    let turn = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicUsize::new(0));
    let handoffs = Arc::new(Mutex::new(Vec::with_capacity(n)));
    let first = a.take(key).expect("the first lock");
    let run = |me: usize, mut c: Box<dyn Taker>, mut held: Option<Lock>| {
        let (released_at, turn, failed, handoffs) = (
            Arc::clone(&released_at),
            Arc::clone(&turn),
            Arc::clone(&failed),
            Arc::clone(&handoffs),
        );
        let key = key.to_string();
        std::thread::spawn(move || {
            loop {
                let t = turn.load(Ordering::Acquire);
                if t >= n {
                    break;
                }
                match held.take() {
                    // My turn to hold: keep it, then let it go.
                    Some(lock) => {
                        std::thread::sleep(hold);
                        released_at.store(base.elapsed().as_nanos() as u64, Ordering::Release);
                        c.give(&lock);
                    }
                    // Not my turn to wait: the lock I gave has not been taken yet.
                    None if t % 2 != me => {
                        std::thread::yield_now();
                    }
                    None => match c.take(&key) {
                        Some(lock) => {
                            let now = base.elapsed().as_nanos() as u64;
                            let from = released_at.load(Ordering::Acquire);
                            handoffs
                                .lock()
                                .unwrap()
                                .push(now.saturating_sub(from) / 1000);
                            turn.fetch_add(1, Ordering::AcqRel);
                            held = Some(lock);
                        }
                        None => {
                            failed.fetch_add(1, Ordering::Relaxed);
                        }
                    },
                }
            }
            if let Some(lock) = held {
                c.give(&lock);
            }
        })
    };
    // After t hand-offs, A holds when t is even (B waits), B when it is odd (A waits);
    // the waiter counts the hand-off once it holds the lock.
    let ta = run(1, std::mem::replace(&mut a, Box::new(Nobody)), Some(first));
    let tb = run(0, std::mem::replace(&mut b, Box::new(Nobody)), None);
    ta.join().unwrap();
    tb.join().unwrap();
    let v = std::mem::take(&mut *handoffs.lock().unwrap());
    (v, failed.load(Ordering::Relaxed))
}

struct Nobody;

impl Taker for Nobody {
    fn take(&mut self, _: &str) -> Option<Lock> {
        None
    }
    fn give(&mut self, _: &Lock) {}
}

fn handoff(cfg: &Config, urls: &[String]) {
    println!("#### 5. Hand-off under contention\n");
    let n = if cfg.quick { 10 } else { 60 };
    let hold = Duration::from_millis(5);
    println!(
        "Two clients pass one lock back and forth {n} times, each holding it {hold:?}; a \
         hand-off is the time from just before the holder's release to the waiter holding \
         the lock. Default settings (retry_delay 200 ms ± 100 ms).\n"
    );
    println!("| waiter | hand-offs | p50, ms | p90, ms | max, ms | failed waits |");
    println!("|---|---:|---:|---:|---:|---:|");
    let shared = || {
        Redlock::builder()
            .nodes(urls)
            .build_shared()
            .expect("shared client")
    };
    let direct = || Redlock::builder().nodes(urls).build().expect("client");
    type Row = (&'static str, Box<dyn Taker>, Box<dyn Taker>, &'static str);
    let rows: Vec<Row> = vec![
        (
            "`SharedRedlock::blocking_lock_within`, woken by the release notice",
            Box::new(NoticeTaker(shared())),
            Box::new(NoticeTaker(shared())),
            "sh:handoff:notice",
        ),
        (
            "direct `Redlock::lock`, polling",
            Box::new(PollTaker(direct())),
            Box::new(PollTaker(direct())),
            "sh:handoff:poll",
        ),
    ];
    let mut medians = Vec::new();
    for (name, a, b, key) in rows {
        let (mut v, failed) = pass_around(a, b, key, n, hold);
        v.sort_unstable();
        let ms = |us: u64| us as f64 / 1000.0;
        let p50 = pct(&v, 0.5);
        medians.push(p50);
        println!(
            "| {name} | {} | {:.2} | {:.2} | {:.2} | {failed} |",
            v.len(),
            ms(p50),
            ms(pct(&v, 0.9)),
            ms(v.last().copied().unwrap_or(0)),
        );
    }
    println!();
    if let [notice, poll] = medians[..] {
        println!(
            "Median hand-off: {:.2} ms woken by the notice (goal < 5 ms), {:.2} ms polling.\n",
            notice as f64 / 1000.0,
            poll as f64 / 1000.0
        );
    }
}

// ---------------------------------------------------------------------------------------
// Statistics and formatting (as in benches/compare.rs).

fn pct(sorted: &[u64], q: f64) -> u64 {
    let n = sorted.len();
    if n == 0 {
        return 0;
    }
    let rank = ((q * n as f64).ceil() as usize).clamp(1, n);
    sorted[rank - 1]
}

fn sorted(v: &[u64]) -> Vec<u64> {
    let mut s = v.to_vec();
    s.sort_unstable();
    s
}

fn median_f(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
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

fn machine() -> String {
    let nproc = std::thread::available_parallelism()
        .map(|n| n.get().to_string())
        .unwrap_or_else(|_| "?".into());
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

fn main() {
    let mut quick = false;
    for a in std::env::args().skip(1) {
        match a.as_str() {
            "--bench" => {} // added by `cargo bench`
            "--quick" => quick = true,
            other => eprintln!("shared: ignoring argument {other:?}"),
        }
    }
    let cfg = Config::from_env(quick);
    eprintln!("starting {NODES} redis-server nodes ...");
    let cluster = Cluster::start(NODES);
    let urls = cluster.urls();
    let started = Instant::now();

    println!(
        "### `SharedRedlock` vs direct `Redlock`: {NODES} local redis-server nodes, loopback\n"
    );
    println!("Machine: {}\n", machine());
    println!(
        "Settings: {}; ttl {} ms; every client with default settings (node_timeout 50 ms).\n",
        if cfg.quick { "quick run" } else { "full run" },
        TTL.as_millis()
    );
    let wanted = |n: char| cfg.sections.as_deref().is_none_or(|s| s.contains(n));
    if wanted('1') {
        one_caller(&cfg, &urls);
    }
    if wanted('2') {
        allocations(&cfg, &urls);
    }
    if wanted('3') {
        many_threads(&cfg, &urls);
    }
    if wanted('4') {
        many_tasks(&cfg, &cluster);
    }
    if wanted('5') {
        handoff(&cfg, &urls);
    }
    eprintln!("done in {:.1} s", started.elapsed().as_secs_f64());
}
