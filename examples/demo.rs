//! The demo: five local Redis nodes, four threads contending for one lock.
//!
//! It starts its own `redis-server` processes on free loopback ports (in a temp dir,
//! stopped at the end), then four workers, each with its own client, take turns on
//! `demo:invoice-batch`: acquire (with retries), do a few milliseconds of "work" guarded
//! by a shared in-process flag that would catch any overlap, sometimes extend, release.
//! Halfway through, two of the five nodes are frozen with SIGSTOP to show that a
//! minority of dead nodes does not slow the quorum down; then they are thawed.
//!
//! Run it with `scripts/demo.sh` (installs redis-server if missing), or
//! `cargo run --release --example demo`.

#[path = "../tests/common/mod.rs"]
mod common;

use quorumlock::{Error, NodeError, Outcome, Redlock};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

const WORKERS: usize = 4;
const ROUNDS: usize = 12;
const RESOURCE: &str = "demo:invoice-batch";

#[derive(Default, Clone)]
struct Stats {
    acquired: usize,
    refused_attempts: usize,
    extended: usize,
    released_nodes: usize,
    acquire_us: Vec<u64>,
    waited_ms: Vec<u64>,
}

fn main() {
    println!("starting 5 local redis-server nodes ...");
    let cluster = common::Cluster::start(5);
    for (i, url) in cluster.urls().iter().enumerate() {
        println!("  node {i}: {url} (pid {})", cluster.node(i).pid());
    }
    let urls = cluster.urls();
    let inside = Arc::new(AtomicBool::new(false));
    let violations = Arc::new(AtomicU64::new(0));
    let stats = Arc::new(Mutex::new(vec![Stats::default(); WORKERS]));
    let started = Instant::now();
    let say = move |who: usize, what: String| {
        println!(
            "{:>7.1} ms  worker {who}  {what}",
            started.elapsed().as_secs_f64() * 1e3
        );
    };

    thread::scope(|s| {
        for w in 0..WORKERS {
            let (urls, inside, violations, stats) = (
                urls.clone(),
                inside.clone(),
                violations.clone(),
                stats.clone(),
            );
            s.spawn(move || {
                let mut rl = Redlock::builder()
                    .nodes(&urls)
                    .node_timeout(Duration::from_millis(50))
                    .retry_count(0)
                    .build()
                    .expect("valid settings");
                let mut mine = Stats::default();
                for round in 0..ROUNDS {
                    // Contend: try once, and on Taken back off briefly and try again,
                    // counting the refusals (Redlock::lock does this loop internally).
                    let wait_start = Instant::now();
                    let mut lock = loop {
                        let t = Instant::now();
                        match rl.try_lock(RESOURCE, Duration::from_secs(2)) {
                            Ok(lock) => {
                                mine.acquire_us.push(t.elapsed().as_micros() as u64);
                                break lock;
                            }
                            Err(Error::Taken(_)) => {
                                mine.refused_attempts += 1;
                                thread::sleep(Duration::from_millis(2 + fastrand::u64(..8)));
                            }
                            Err(e) => {
                                // Not enough nodes could say yes (e.g. held on one node
                                // while two are frozen): short line here, full detail in
                                // the error's Display.
                                let f = e.failure().expect("lock errors carry detail");
                                let frozen = f.count(|o| matches!(o, Outcome::Failed(NodeError::Lagging)));
                                say(w, format!("refused   (no quorum possible: {} held elsewhere, {frozen} nodes lagging)", f.count(|o| *o == Outcome::Held)));
                                mine.refused_attempts += 1;
                                thread::sleep(Duration::from_millis(2 + fastrand::u64(..8)));
                            }
                        }
                    };
                    mine.waited_ms.push(wait_start.elapsed().as_millis() as u64);
                    mine.acquired += 1;
                    if inside.swap(true, Ordering::SeqCst) {
                        violations.fetch_add(1, Ordering::SeqCst);
                        say(w, "VIOLATION: someone else is inside".into());
                    }
                    say(w, format!("acquired  (validity {:>4} ms, token {})", lock.remaining().as_millis(), String::from_utf8_lossy(&lock.token()[..8])));
                    thread::sleep(Duration::from_millis(5 + fastrand::u64(..10)));
                    if round % 4 == 3 {
                        match rl.extend(&mut lock, Duration::from_secs(2)) {
                            Ok(()) => {
                                mine.extended += 1;
                                say(w, format!("extended  (validity {:>4} ms)", lock.remaining().as_millis()));
                            }
                            Err(e) => say(w, format!("extend failed: {e}")),
                        }
                        thread::sleep(Duration::from_millis(5));
                    }
                    inside.store(false, Ordering::SeqCst);
                    match rl.unlock(&lock) {
                        Ok(n) => {
                            mine.released_nodes += n;
                            say(w, format!("released  on {n} of 5 nodes"));
                        }
                        Err(e) => say(w, format!("release incomplete: {e}")),
                    }
                    thread::sleep(Duration::from_millis(fastrand::u64(..5)));
                }
                stats.lock().unwrap()[w] = mine;
            });
        }
        // Halfway: freeze a minority, then thaw it.
        thread::sleep(Duration::from_millis(250));
        println!("---- freezing nodes 3 and 4 (SIGSTOP): the other 3 are still a quorum ----");
        cluster.node(3).freeze();
        cluster.node(4).freeze();
        thread::sleep(Duration::from_millis(400));
        println!("---- thawing nodes 3 and 4 ----");
        cluster.node(3).thaw();
        cluster.node(4).thaw();
    });

    let stats = stats.lock().unwrap();
    println!();
    println!("| worker | acquired | refused attempts | extended | acquire p50 | longest wait |");
    println!("|---|---|---|---|---|---|");
    let mut all_us = Vec::new();
    for (w, s) in stats.iter().enumerate() {
        let mut us = s.acquire_us.clone();
        us.sort_unstable();
        all_us.extend(&us);
        println!(
            "| {w} | {} | {} | {} | {} µs | {} ms |",
            s.acquired,
            s.refused_attempts,
            s.extended,
            us.get(us.len() / 2).copied().unwrap_or(0),
            s.waited_ms.iter().max().copied().unwrap_or(0)
        );
    }
    all_us.sort_unstable();
    let total: usize = stats.iter().map(|s| s.acquired).sum();
    println!();
    println!(
        "{total} acquisitions in {:.2} s, acquire p50 {} µs over all workers, overlapping holders: {}",
        started.elapsed().as_secs_f64(),
        all_us.get(all_us.len() / 2).copied().unwrap_or(0),
        violations.load(Ordering::SeqCst)
    );
    println!("stopping the nodes.");
    drop(cluster);
    if violations.load(Ordering::SeqCst) != 0 {
        std::process::exit(1);
    }
}
