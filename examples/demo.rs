//! The demo: five local Redis nodes, four workers contending for one lock.
//!
//! It starts its own `redis-server` processes on free loopback ports (in a temp dir,
//! stopped at the end, on a panic, and on Ctrl-C), then four workers, each with its own
//! client, take turns on `demo:invoice-batch`: one `try_lock` at a time, backing off a
//! few milliseconds when refused; a few milliseconds of "work" guarded by a shared
//! in-process flag that would catch any overlap; sometimes an extend; an unlock.
//!
//! It runs in three phases: all five nodes up; two of the five frozen with SIGSTOP (the
//! other three are still a majority, so the lock keeps working); the two thawed. Each
//! event line says when (seconds since the start), who, and what happened, refusals with
//! the error's own words. Only the first few events of each kind in each phase are
//! printed; the rest are counted, and a table sums everything up at the end.
//!
//! Run it with `scripts/demo.sh` (installs redis-server if missing), or
//! `cargo run --release --example demo`.

#[path = "../tests/common/mod.rs"]
mod common;

use quorumlock::{Error, Lock, Outcome, Redlock};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

const NODES: usize = 5;
const WORKERS: usize = 4;
const RESOURCE: &str = "demo:invoice-batch";
const TTL: Duration = Duration::from_secs(2);
const NODE_TIMEOUT: Duration = Duration::from_millis(50);
/// The two nodes frozen in the middle phase.
const FROZEN: [usize; 2] = [3, 4];
/// Phases: name and how long it runs.
const PHASES: [(&str, Duration); 3] = [
    ("all 5 nodes up", Duration::from_millis(600)),
    ("nodes 3 and 4 frozen", Duration::from_millis(800)),
    ("nodes 3 and 4 thawed", Duration::from_millis(600)),
];
/// Event lines printed per kind and phase; the rest are counted.
const SHOWN_PER_KIND: usize = 3;
/// Event lines wrap at this width.
const WIDTH: usize = 92;
/// No worker holds the lock (see [`Shared::holder`]).
const NOBODY: usize = usize::MAX;

/// What a worker did; event lines are sampled per kind.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Acquired,
    /// `Error::Taken`: other workers hold the key on too many nodes.
    Taken,
    /// `Error::Unavailable`: too few nodes answered for a majority.
    Unavailable,
    /// Any other error on acquire (`Error::Expired`, ...).
    OtherRefusal,
    Extended,
    ExtendFailed,
    Released,
    ReleaseFailed,
}

const KINDS: [(Kind, &str); 8] = [
    (Kind::Acquired, "acquired"),
    (Kind::Taken, "refused (held)"),
    (Kind::Unavailable, "refused (too few nodes)"),
    (Kind::OtherRefusal, "refused (other)"),
    (Kind::Extended, "extended"),
    (Kind::ExtendFailed, "extend failed"),
    (Kind::Released, "released"),
    (Kind::ReleaseFailed, "release failed"),
];

impl Kind {
    fn index(self) -> usize {
        // INVARIANT: KINDS lists every variant.
        KINDS.iter().position(|(k, _)| *k == self).unwrap()
    }
}

/// The event log: one line per event, the first few of each kind per phase.
struct Log {
    started: Instant,
    phase: usize,
    /// `[phase][kind]`: events of that kind in that phase.
    seen: [[usize; KINDS.len()]; PHASES.len()],
    /// One-time explanations already given, by key.
    explained: Vec<&'static str>,
}

impl Log {
    /// Prints `text` after the elapsed time and `who`, wrapped at [`WIDTH`].
    fn line(&self, who: &str, text: &str) {
        let head = format!("{:>6.3}s  {who:<8}  ", self.started.elapsed().as_secs_f64());
        println!("{}", wrap(&head, text));
    }

    /// Counts an event; prints it (built by `text`) if it is among the first few of its
    /// kind in this phase. Returns whether it was printed.
    fn event(&mut self, who: &str, kind: Kind, text: impl FnOnce() -> String) -> bool {
        let n = &mut self.seen[self.phase][kind.index()];
        *n += 1;
        if *n > SHOWN_PER_KIND {
            return false;
        }
        self.line(who, &text());
        true
    }

    /// Prints `text` as a note, the first time `key` comes up.
    fn explain(&mut self, key: &'static str, text: &str) {
        if self.explained.contains(&key) {
            return;
        }
        self.explained.push(key);
        self.line("", &format!("  ^ {text}"));
    }

    /// Ends the current phase: says how many event lines it did not show.
    fn end_phase(&mut self) {
        let hidden: Vec<String> = KINDS
            .iter()
            .zip(self.seen[self.phase])
            .filter(|&(_, n)| n > SHOWN_PER_KIND)
            .map(|((_, name), n)| format!("{} {name}", n - SHOWN_PER_KIND))
            .collect();
        if !hidden.is_empty() {
            let text = format!("(not shown in this phase: {})", hidden.join(", "));
            self.line("demo", &text);
        }
    }
}

/// Word-wraps `text` behind `head`; continuation lines are indented to match.
fn wrap(head: &str, text: &str) -> String {
    let indent = head.chars().count();
    let room = WIDTH.saturating_sub(indent).max(20);
    let mut out = String::from(head);
    let mut used = 0;
    for word in text.split(' ') {
        let len = word.chars().count();
        if used > 0 && used + 1 + len > room {
            let _ = write!(out, "\n{:indent$}", "");
            used = 0;
        }
        if used > 0 {
            out.push(' ');
            used += 1;
        }
        out.push_str(word);
        used += len;
    }
    out
}

/// What the workers and the main thread share.
struct Shared {
    log: Mutex<Log>,
    /// Set when the last phase is over (or the main thread unwinds).
    stop: AtomicBool,
    /// Who is inside the critical section, by the workers' own account: `NOBODY`, or a
    /// worker index. Set after `try_lock` returns a lock, cleared before `unlock`.
    holder: AtomicUsize,
    /// Times a worker entered while another was inside (must stay 0).
    overlaps: AtomicUsize,
    stats: Mutex<Vec<Stats>>,
}

impl Shared {
    fn log(&self) -> MutexGuard<'_, Log> {
        // A panicking worker must not silence the others.
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn stats(&self) -> MutexGuard<'_, Vec<Stats>> {
        self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Sets `stop` when dropped, so that a panic in the main thread still ends the workers
/// (and the scope can unwind, which stops the nodes).
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[derive(Default, Clone)]
struct Stats {
    acquired: usize,
    taken: usize,
    unavailable: usize,
    extended: usize,
    released: usize,
    /// Releases whose count was below 5 when `unlock` returned.
    partial: usize,
    /// Other acquire errors, failed extends, failed unlocks.
    errors: usize,
    acquire_us: Vec<u64>,
    waited_ms: Vec<u64>,
}

fn main() {
    // Before any thread exists, so that every thread inherits the mask (see
    // `stop_nodes_on_signal`).
    let signals = block_stop_signals();
    println!(
        "{}",
        wrap(
            "",
            &format!(
                "quorumlock demo: {WORKERS} workers contend for the lock {RESOURCE:?} on \
                 {NODES} independent Redis nodes; a lock needs a majority, 3 of 5."
            )
        )
    );
    println!("starting {NODES} local redis-server nodes ...");
    let cluster = common::Cluster::start(NODES);
    stop_nodes_on_signal(signals, cluster.pids(), cluster.dir().to_path_buf());
    for (i, url) in cluster.urls().iter().enumerate() {
        println!("  node {i}: {url} (pid {})", cluster.node(i).pid());
    }
    println!(
        "{}",
        wrap(
            "",
            &format!(
                "Each worker loops: try_lock (ttl {TTL:?}, no retries; when refused, back \
                 off 2-10 ms and try again), work 5-15 ms, every 3rd time extend, unlock. \
                 Lines: seconds since the start, who, what; the first {SHOWN_PER_KIND} of \
                 each kind per phase are shown, the rest counted."
            )
        )
    );

    let urls = cluster.urls();
    let started = Instant::now();
    let shared = Arc::new(Shared {
        log: Mutex::new(Log {
            started,
            phase: 0,
            seen: [[0; KINDS.len()]; PHASES.len()],
            explained: Vec::new(),
        }),
        stop: AtomicBool::new(false),
        holder: AtomicUsize::new(NOBODY),
        overlaps: AtomicUsize::new(0),
        stats: Mutex::new(vec![Stats::default(); WORKERS]),
    });

    thread::scope(|s| {
        let _stop = StopOnDrop(&shared.stop);
        for w in 0..WORKERS {
            let (urls, shared) = (urls.clone(), shared.clone());
            s.spawn(move || worker(w, &urls, &shared));
        }
        for (phase, (name, length)) in PHASES.iter().enumerate() {
            {
                let mut log = shared.log();
                if phase > 0 {
                    log.end_phase();
                }
                log.phase = phase;
                println!();
                log.line("demo", &format!("---- phase {}: {name} ----", phase + 1));
                match phase {
                    1 => {
                        for i in FROZEN {
                            cluster.node(i).freeze();
                        }
                        log.line(
                            "demo",
                            "froze nodes 3 and 4 with SIGSTOP: their sockets stay open but \
                             they answer nothing. The other 3 are still a majority, so \
                             the workers carry on without them.",
                        );
                    }
                    2 => {
                        for i in FROZEN {
                            cluster.node(i).thaw();
                        }
                        log.line(
                            "demo",
                            "thawed nodes 3 and 4 (SIGCONT): they answer what was queued \
                             for them and vote again.",
                        );
                    }
                    _ => {}
                }
            }
            thread::sleep(*length);
        }
        shared.stop.store(true, Ordering::SeqCst);
    });
    shared.log().end_phase();
    summary(&shared, started);
    println!("stopping the nodes.");
    drop(cluster);
    if shared.overlaps.load(Ordering::SeqCst) != 0 {
        std::process::exit(1);
    }
}

/// One worker: contend, hold, sometimes extend, release, until `stop`.
fn worker(w: usize, urls: &[String], shared: &Shared) {
    let who = format!("worker {w}");
    let mut rl = Redlock::builder()
        .nodes(urls)
        .node_timeout(NODE_TIMEOUT)
        .retry_count(0)
        .build()
        .expect("valid settings");
    let mut mine = Stats::default();
    while !shared.stop.load(Ordering::SeqCst) {
        // Contend: one attempt at a time; when refused, say why, back off, try again
        // (`Redlock::lock` does this loop internally).
        let wait_start = Instant::now();
        let mut lock = loop {
            let t = Instant::now();
            let e = match rl.try_lock(RESOURCE, TTL) {
                Ok(lock) => {
                    mine.acquire_us.push(t.elapsed().as_micros() as u64);
                    break lock;
                }
                Err(e) => e,
            };
            refused(&who, &e, shared, &mut mine);
            if shared.stop.load(Ordering::SeqCst) {
                shared.stats()[w] = mine;
                return;
            }
            thread::sleep(Duration::from_millis(2 + fastrand::u64(..8)));
        };
        let waited = wait_start.elapsed();
        mine.waited_ms.push(waited.as_millis() as u64);
        mine.acquired += 1;
        if shared.holder.swap(w, Ordering::SeqCst) != NOBODY {
            shared.overlaps.fetch_add(1, Ordering::SeqCst);
            shared.log().line(&who, "OVERLAP: another worker is inside");
        }
        shared.log().event(&who, Kind::Acquired, || {
            format!(
                "acquired: token {}.., valid for {} ms (waited {} ms)",
                String::from_utf8_lossy(&lock.token()[..8]),
                lock.remaining().as_millis(),
                waited.as_millis()
            )
        });
        thread::sleep(Duration::from_millis(5 + fastrand::u64(..10)));
        if mine.acquired % 3 == 0 {
            let left = lock.remaining();
            let result = rl.extend(&mut lock, TTL);
            let mut log = shared.log();
            match result {
                Ok(()) => {
                    mine.extended += 1;
                    log.event(&who, Kind::Extended, || {
                        format!(
                            "extended: valid for {} ms again (had {} ms left)",
                            lock.remaining().as_millis(),
                            left.as_millis()
                        )
                    });
                }
                Err(e) => {
                    mine.errors += 1;
                    log.event(&who, Kind::ExtendFailed, || format!("extend failed: {e}"));
                }
            }
            drop(log);
            thread::sleep(Duration::from_millis(5));
        }
        shared.holder.store(NOBODY, Ordering::SeqCst);
        release(&who, &mut rl, &lock, shared, &mut mine);
        thread::sleep(Duration::from_millis(fastrand::u64(..5)));
    }
    shared.stats()[w] = mine;
}

/// Logs a refused `try_lock`: who holds the lock, and the error's own words.
fn refused(who: &str, e: &Error, shared: &Shared, mine: &mut Stats) {
    let holder = match shared.holder.load(Ordering::SeqCst) {
        NOBODY => "no worker is inside right now (a rival's lock was being taken or \
                   released)"
            .to_string(),
        h => format!("worker {h} holds it"),
    };
    // The Display names every node's answer after the counts; the counts say enough.
    let full = e.to_string();
    let said = full.split("; ").next().unwrap_or(&full);
    let kind = match e {
        Error::Taken(_) => {
            mine.taken += 1;
            Kind::Taken
        }
        Error::Unavailable(_) => {
            mine.unavailable += 1;
            Kind::Unavailable
        }
        _ => {
            mine.errors += 1;
            Kind::OtherRefusal
        }
    };
    let mut log = shared.log();
    let shown = log.event(who, kind, || format!("refused: {holder}. Error: {said}"));
    if !shown {
        return;
    }
    let locked = e
        .failure()
        .map_or(0, |f| f.count(|o| *o == Outcome::Locked));
    if locked > 0 {
        log.explain(
            "ok",
            "\"ok\": nodes where this worker did set its key; without a majority that is \
             no lock, so try_lock deletes them again at once.",
        );
    }
    match kind {
        Kind::Taken => log.explain(
            "taken",
            "Error::Taken: enough nodes hold another worker's key that no majority is \
             possible; the worker backs off and tries again.",
        ),
        Kind::Unavailable if log.phase == 1 => log.explain(
            "unavailable",
            "with 2 nodes frozen, the first node found holding another worker's key \
             already rules out a majority (2 frozen + 1 held leave at most 2), so the error \
             is Error::Unavailable (too few answers), not Taken; answers read in the same \
             batch are in the report too.",
        ),
        Kind::Unavailable if log.phase == 2 => log.explain(
            "catching-up",
            "nodes 3 and 4 are still working through what was queued for them while \
             frozen: until they catch up they are lagging and cannot vote, so for a moment \
             refusals are still Unavailable.",
        ),
        _ => {}
    }
}

/// Unlocks and logs how many nodes had confirmed the delete.
fn release(who: &str, rl: &mut Redlock, lock: &Lock, shared: &Shared, mine: &mut Stats) {
    let result = rl.unlock(lock);
    let mut log = shared.log();
    let n = match result {
        Ok(n) => n,
        Err(e) => {
            mine.errors += 1;
            log.event(who, Kind::ReleaseFailed, || format!("release failed: {e}"));
            return;
        }
    };
    mine.released += 1;
    if n < NODES {
        mine.partial += 1;
    }
    let shown = log.event(who, Kind::Released, || {
        format!("released: unlock confirmed on {n} of {NODES} nodes")
    });
    if !shown || n == NODES {
        return;
    }
    if log.phase == 1 && n <= NODES - FROZEN.len() {
        log.explain(
            "partial-frozen",
            "nodes 3 and 4 are frozen: they were sent the delete too, and run it when \
             they wake (their copy of the key would expire with the ttl anyway).",
        );
    } else {
        log.explain(
            "partial",
            "unlock returns as soon as a majority (3) has answered: the count is the \
             deletes confirmed by then. The other deletes are still in flight (and a \
             node where a rival's key stood when this lock was taken has none to do).",
        );
    }
}

/// The table at the end: one row per worker, then totals.
fn summary(shared: &Shared, started: Instant) {
    let stats = shared.stats();
    println!();
    let row = |cells: [&str; 8]| {
        let [who, a, b, c, d, e, f, g] = cells;
        println!("{who:<8}  {a:>8}  {b:>7}  {c:>9}  {d:>8}  {e:>9}  {f:>7}  {g:>7}");
    };
    row([
        "", "acquired", "refused", "refused", "extended", "released", "acquire", "longest",
    ]);
    row([
        "",
        "",
        "(held)",
        "(too few)",
        "",
        "(partial)",
        "p50",
        "wait",
    ]);
    let mut all_us = Vec::new();
    for (w, s) in stats.iter().enumerate() {
        let mut us = s.acquire_us.clone();
        us.sort_unstable();
        all_us.extend(&us);
        row([
            &format!("worker {w}"),
            &s.acquired.to_string(),
            &s.taken.to_string(),
            &s.unavailable.to_string(),
            &s.extended.to_string(),
            &format!("{} ({})", s.released, s.partial),
            &format!("{} µs", us.get(us.len() / 2).copied().unwrap_or(0)),
            &format!("{} ms", s.waited_ms.iter().max().copied().unwrap_or(0)),
        ]);
    }
    all_us.sort_unstable();
    let total: usize = stats.iter().map(|s| s.acquired).sum();
    let log = shared.log();
    let acquired = Kind::Acquired.index();
    let per_phase: Vec<String> = PHASES
        .iter()
        .zip(log.seen)
        .map(|((name, _), seen)| format!("{} with {name}", seen[acquired]))
        .collect();
    let errors: usize = stats.iter().map(|s| s.errors).sum();
    let legend = format!(
        "(too few: too few nodes answered for a majority; partial: fewer than {NODES} \
         deletes confirmed when unlock returned; longest wait: from the first try to the \
         lock.)"
    );
    println!("{}", wrap("", &legend));
    let text = format!(
        "{total} acquisitions in {:.2} s ({}); acquire p50 {} µs; other errors (acquire, \
         extend, unlock): {errors}; overlapping holders: {}.",
        started.elapsed().as_secs_f64(),
        per_phase.join(", "),
        all_us.get(all_us.len() / 2).copied().unwrap_or(0),
        shared.overlaps.load(Ordering::SeqCst)
    );
    println!("{}", wrap("", &text));
}

/// Blocks SIGINT, SIGTERM and SIGHUP in this thread (and so in every thread it starts
/// later); [`stop_nodes_on_signal`] waits for them. Child processes do not inherit the
/// mask: std resets it when it spawns one.
fn block_stop_signals() -> libc::sigset_t {
    // SAFETY: `set` is a plain C struct, initialised by `sigemptyset` before any other
    // use; the calls only read and write that local and this thread's signal mask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, sig);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

/// Starts a thread that waits for Ctrl-C (or SIGTERM, SIGHUP) and then stops the nodes by
/// pid (frozen ones are sent SIGCONT first, so they can die), removes their directory
/// and exits.
fn stop_nodes_on_signal(set: libc::sigset_t, pids: Vec<u32>, dir: PathBuf) {
    thread::spawn(move || {
        let mut sig = 0;
        // SAFETY: `set` is an initialised signal set and `sig` a valid out-pointer.
        if unsafe { libc::sigwait(&set, &mut sig) } != 0 {
            return;
        }
        for pid in &pids {
            // SAFETY: plain kill(2) calls on the pids of the nodes this demo started.
            unsafe {
                libc::kill(*pid as libc::pid_t, libc::SIGCONT);
                libc::kill(*pid as libc::pid_t, libc::SIGKILL);
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
        eprintln!(
            "\ninterrupted: stopped the {} redis-server nodes.",
            pids.len()
        );
        std::process::exit(130);
    });
}
