//! `try`, `status` and `bench`: short-lived direct clients, no child process.

use crate::args::{Args, show};
use crate::sys::Signals;
use crate::{EX_OSERR, EX_TEMPFAIL, failure_code};
use quorumlock::{Builder, Settings};
use std::io::Write;
use std::time::{Duration, Instant};

/// One attempt, released at once: 0 and a line on stdout if it got the lock.
pub fn try_once(builder: Builder, resource: &str, args: &Args) -> u8 {
    let fail = |e: &quorumlock::Error| {
        eprintln!("quorumlock: {e}");
        failure_code(e, args.conflict_code)
    };
    let mut rl = match builder.build() {
        Ok(rl) => rl,
        Err(e) => return fail(&e),
    };
    let lock = match rl.try_lock(resource, args.ttl) {
        Ok(lock) => lock,
        Err(e) => return fail(&e),
    };
    let got = match lock.fence() {
        Some(fence) => format!("validity {}, fence {fence}", show(lock.remaining())),
        None => format!("validity {}", show(lock.remaining())),
    };
    match rl.unlock(&lock) {
        Ok(n) => println!(
            "acquired {resource:?} ({got}) and released it on {n} of {} nodes",
            rl.settings().nodes.len()
        ),
        Err(e) => {
            println!("acquired {resource:?} ({got})");
            eprintln!("quorumlock: releasing it: {e}");
        }
    }
    0
}

fn fail(e: &quorumlock::Error) -> u8 {
    eprintln!("quorumlock: {e}");
    failure_code(e, EX_TEMPFAIL)
}

/// A holder's token as logs show it: its first 8 bytes and `…` (the whole token is a
/// credential: whoever has it can release or extend the lock). The same 8 characters
/// a command under `run` finds in `QUORUMLOCK_TOKEN_PREFIX`.
fn prefix(token: &[u8]) -> String {
    let shown = token[..token.len().min(8)].escape_ascii().to_string();
    if token.len() > 8 {
        format!("{shown}…")
    } else {
        shown
    }
}

/// One line per node, then a summary: 0 if one token is held on a majority, else 1.
pub fn status(settings: &Settings, resource: &str) -> u8 {
    let views = quorumlock::inspect(settings, resource.as_bytes());
    let mut tokens: Vec<(&[u8], usize)> = Vec::new();
    for (i, (node, view)) in settings.nodes.iter().zip(&views).enumerate() {
        let v = match view {
            Ok(v) => v,
            Err(e) => {
                println!("node {i} {node}: error: {e}");
                continue;
            }
        };
        let key = match (&v.value, v.pttl) {
            (Some(token), pttl) => {
                match tokens.iter_mut().find(|(t, _)| *t == token.as_slice()) {
                    Some((_, n)) => *n += 1,
                    None => tokens.push((token, 1)),
                }
                let pttl = pttl.map_or("none".to_string(), |p| format!("{}ms", p.as_millis()));
                format!("held token={} pttl={pttl}", prefix(token))
            }
            (None, _) => "free".to_string(),
        };
        let run_id = v.run_id.as_deref().unwrap_or("unknown");
        let uptime = v
            .uptime
            .map_or("unknown".to_string(), |u| format!("{}s", u.as_secs()));
        println!("node {i} {node}: {key} run_id={run_id} uptime={uptime}");
    }
    let quorum = views.len() / 2 + 1;
    match tokens.iter().max_by_key(|(_, n)| *n) {
        Some(&(token, n)) if n >= quorum => {
            println!(
                "{resource:?} is held: token {} on {n} of {} nodes (quorum {quorum})",
                prefix(token),
                views.len()
            );
            0
        }
        Some(&(_, n)) => {
            println!(
                "{resource:?} is not held on a majority: at most {n} of {} nodes share a token (quorum {quorum})",
                views.len()
            );
            1
        }
        None => {
            println!(
                "{resource:?} is not held: no node has the key (quorum {quorum} of {})",
                views.len()
            );
            1
        }
    }
}

/// Locks and releases keys `quorumlock:bench:<random>:<i>` one after the other.
pub fn bench(builder: Builder, args: &Args) -> u8 {
    // ^C (or SIGTERM, SIGHUP) ends the run between two locks: each lock taken is
    // released before the next check, so nothing is left on the nodes; the numbers so
    // far are printed and the exit status is 128 + the signal.
    let signals = match Signals::install() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("quorumlock: {e}");
            return EX_OSERR;
        }
    };
    let mut rl = match builder.build() {
        Ok(rl) => rl,
        Err(e) => return fail(&e),
    };
    let prefix = format!("quorumlock:bench:{:016x}:", fastrand::u64(..));
    let (mut acquire, mut release) = (Vec::new(), Vec::new());
    let (mut failed, mut last_error) = (0u64, None);
    let start = Instant::now();
    let mut shown = start;
    let done = |i: u64, now: Instant| match args.duration {
        Some(d) => now.duration_since(start) >= d,
        None => i >= args.count,
    };
    let mut i = 0u64;
    let mut key = String::new();
    let mut interrupted = None;
    while !done(i, Instant::now()) {
        if let Some(&sig) = signals.take().first() {
            interrupted = Some(sig);
            break;
        }
        key.clear();
        key.push_str(&prefix);
        key.push_str(&i.to_string());
        i += 1;
        let t0 = Instant::now();
        match rl.try_lock(&key, args.ttl) {
            Ok(lock) => {
                let t1 = Instant::now();
                acquire.push(t1 - t0);
                if let Err(e) = rl.unlock(&lock) {
                    failed += 1;
                    last_error = Some(e);
                } else {
                    release.push(t1.elapsed());
                }
            }
            Err(e) => {
                failed += 1;
                last_error = Some(e);
            }
        }
        let now = Instant::now();
        if now.duration_since(shown) >= Duration::from_millis(100) {
            shown = now;
            let secs = now.duration_since(start).as_secs_f64();
            let target = match args.duration {
                Some(d) => format!("{:.1}s of {}", secs, show(d)),
                None => format!("{i} of {}", args.count),
            };
            eprint!(
                "\rbench: {target}, {:.0} locks/s, {failed} failed   ",
                acquire.len() as f64 / secs
            );
            let _ = std::io::stderr().flush();
        }
    }
    let elapsed = start.elapsed();
    match interrupted {
        Some(sig) => eprintln!(
            "\rbench: stopped by signal {sig} after {i} attempts in {}{:20}",
            show(elapsed),
            ""
        ),
        None => eprintln!("\rbench: done: {i} attempts in {}{:20}", show(elapsed), ""),
    }
    if acquire.is_empty() {
        if let Some(e) = &last_error {
            return fail(e);
        }
    }
    if let Some(e) = &last_error {
        eprintln!("quorumlock: {failed} failed; the last: {e}");
    }
    let nodes = rl.settings().nodes.len();
    println!("nodes            {nodes} (quorum {})", nodes / 2 + 1);
    println!("locks            {} ({failed} failed)", acquire.len());
    println!("elapsed          {}", show(elapsed));
    println!(
        "locks/s          {:.0}",
        acquire.len() as f64 / elapsed.as_secs_f64().max(1e-9)
    );
    println!("                 p50        p99        max");
    for (name, samples) in [("acquire", &mut acquire), ("release", &mut release)] {
        samples.sort_unstable();
        println!(
            "{name:<16} {:<10} {:<10} {}",
            micros(percentile(samples, 50)),
            micros(percentile(samples, 99)),
            micros(samples.last().copied().unwrap_or_default())
        );
    }
    interrupted.map_or(0, |sig| 128 + sig as u8)
}

fn percentile(sorted: &[Duration], p: usize) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) * p).div_ceil(100)]
}

fn micros(d: Duration) -> String {
    format!("{}us", d.as_micros())
}
