//! The offline mutual-exclusion checker shared by `tests/torture.rs` and
//! `tests/scenarios.rs`, and the one clock it needs.
//!
//! # One clock for every process
//!
//! `Instant` is CLOCK_MONOTONIC on Linux but its raw value is private, so holders stamp
//! events with `clock_gettime(CLOCK_MONOTONIC)` ([`mono_ns`]), which every process on the
//! machine shares. A lock's own deadline (an `Instant`) is mapped onto that clock through
//! one calibration pair per process ([`Clock`]): `Instant` is read first, CLOCK_MONOTONIC
//! second, so a mapped instant errs *late* by the few hundred ns between the two reads —
//! a mapped deadline can only widen a window, the safe direction.
//!
//! # The log
//!
//! One text line per event, fields separated by spaces, all times CLOCK_MONOTONIC ns:
//!
//! - `H worker thread hold call started acq deadline rel extended`: one lock held. Its
//!   window is `[acq, min(deadline, rel))`: `acq` read right after `lock()` returned,
//!   `deadline` the latest deadline the holder was given, `rel` read right before it
//!   called `unlock()` (`u64::MAX` if it let the lock expire). See `tests/torture.rs`
//!   for why this is exactly the interval that must be exclusive.
//! - `W worker thread hold before after start end`: one increment of the shared counter,
//!   `start` read before the holder's first validity check, `end` after the write.
//! - `S worker thread hold before start why`: an increment skipped (validity too short).
//! - `F ...`: a failed `lock()` call, for diagnosis only.
//! - `E worker thread holds taken unavailable expired other extend_ok extend_failed
//!   unlock_errors try_contended skew_ns`: a thread's final counters.
//!
//! # What it proves
//!
//! [`check`] reports as violations: (1) two windows that overlap; a write that starts
//! before its hold's window or after it ended; (2) a lost increment: sorted by time, the
//! logged `before → after` values must be exactly 0→1→2→…, and the final counter must
//! equal the number of increments. A write that starts inside its window but *ends* after
//! it is a holder that was paused between its last validity check and its write: the limit
//! every Redlock client has without fencing tokens, not a broken lock. Such writes are
//! counted apart ([`Report::late_writes`]); if one lost an increment, (2) still reports it.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

/// CLOCK_MONOTONIC in nanoseconds: one clock for every process on the machine.
pub fn mono_ns() -> u64 {
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
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    instant: Instant,
    ns: u64,
}

impl Clock {
    pub fn calibrate() -> Clock {
        let instant = Instant::now(); // first: the map errs late, never early
        let ns = mono_ns();
        Clock { instant, ns }
    }

    pub fn map(&self, i: Instant) -> u64 {
        match i.checked_duration_since(self.instant) {
            Some(d) => self.ns + d.as_nanos() as u64,
            None => self.ns - (self.instant - i).as_nanos() as u64,
        }
    }

    /// How far the map has drifted from CLOCK_MONOTONIC (should stay ~0).
    pub fn skew_ns(&self) -> i64 {
        let mapped = self.map(Instant::now());
        let real = mono_ns();
        mapped as i64 - real as i64
    }
}

/// The `H` line of one hold (see the module docs).
#[allow(clippy::too_many_arguments)]
pub fn hold_line(
    worker: usize,
    thread: usize,
    hold: u64,
    call_ns: u64,
    started_ns: u64,
    acq_ns: u64,
    deadline_ns: u64,
    rel_ns: u64,
    extended: bool,
) -> String {
    format!(
        "H {worker} {thread} {hold} {call_ns} {started_ns} {acq_ns} {deadline_ns} {rel_ns} {}\n",
        extended as u8
    )
}

/// One lock held, as logged by its holder (`H` line).
#[derive(Clone, Copy, Debug)]
pub struct Hold {
    pub acq_ns: u64,
    pub deadline_ns: u64,
    pub rel_ns: u64,
    pub extended: bool,
}

impl Hold {
    /// End of the window: the deadline, or the unlock call if earlier.
    pub fn end_ns(&self) -> u64 {
        self.deadline_ns.min(self.rel_ns)
    }
}

/// One increment (`W` line).
#[derive(Clone, Copy, Debug)]
pub struct Increment {
    pub who: HoldId,
    pub before: u64,
    pub after: u64,
    pub start_ns: u64,
    pub end_ns: u64,
}

/// (worker, thread, hold number).
pub type HoldId = (usize, usize, u64);

/// What the checker found.
#[derive(Debug, Default)]
pub struct Report {
    pub holds: u64,
    pub extended: u64,
    pub increments: u64,
    pub skipped: u64,
    /// Whole `lock()` calls that failed, by error.
    pub taken: u64,
    pub unavailable: u64,
    pub expired: u64,
    pub other_errors: u64,
    /// `try_lock()` calls refused with some node holding another client's token.
    pub try_contended: u64,
    pub extend_ok: u64,
    pub extend_failed: u64,
    pub unlock_errors: u64,
    /// Holds per worker process.
    pub per_worker: BTreeMap<usize, u64>,
    /// Threads that logged their final `E` line.
    pub finished_threads: usize,
    /// Longest hold window, in µs.
    pub longest_window_us: u64,
    /// Writes that started inside their window and ended after it: holders paused
    /// between their last check and their write (see the module docs). Not violations.
    pub late_writes: u64,
    /// The first few late writes, for diagnosis.
    pub late_examples: Vec<String>,
    /// Overlapping windows found (also listed in `violations`).
    pub overlaps: u64,
    pub violations: Vec<String>,
}

impl Report {
    pub fn contended_failures(&self) -> u64 {
        self.taken + self.unavailable + self.expired + self.other_errors
    }
}

fn fields<T: std::str::FromStr>(parts: &[&str]) -> Option<Vec<T>> {
    parts.iter().map(|p| p.parse().ok()).collect()
}

/// Audits the logs (`(name, content)` pairs) against the final counter value.
pub fn check(logs: &[(String, String)], final_counter: u64) -> Report {
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
                Some("E") if parts.len() == 13 => {
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
                    r.try_contended += v[10] as u64;
                    if v[11].abs() > 1_000_000 {
                        r.violations.push(format!(
                            "{name}: Instant→CLOCK_MONOTONIC map drifted {} ns",
                            v[11]
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
                r.overlaps += 1;
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

    // Every write starts inside its own hold's window; one that ends after it is late.
    for w in &writes {
        match holds.get(&w.who) {
            None => r
                .violations
                .push(format!("write {w:?} by a hold that was never logged")),
            Some(h) if w.start_ns < h.acq_ns || w.start_ns >= h.end_ns() => {
                r.violations.push(format!(
                    "write outside validity: {w:?} does not start within hold window [{}, {})",
                    h.acq_ns,
                    h.end_ns()
                ));
            }
            Some(h) if w.end_ns > h.end_ns() => {
                r.late_writes += 1;
                if r.late_examples.len() < 5 {
                    r.late_examples.push(format!(
                        "{w:?} ended {:.3} ms after its hold window [{}, {})",
                        (w.end_ns - h.end_ns()) as f64 / 1e6,
                        h.acq_ns,
                        h.end_ns()
                    ));
                }
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
