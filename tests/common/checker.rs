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
//! One text line per event, fields separated by spaces, all times CLOCK_MONOTONIC ns; a
//! fence is a number, or `-` for a lock taken without fencing:
//!
//! - `H worker thread hold call started acq deadline rel extended fence`: one lock held.
//!   Its window is `[acq, min(deadline, rel))`: `acq` read right after `lock()` returned,
//!   `deadline` the latest deadline the holder was given, `rel` read right before it
//!   called `unlock()` (`u64::MAX` if it let the lock expire); `call` is read before the
//!   `lock()` call, `started` is the lock's own start (before its first write). See
//!   `tests/torture.rs` for why the window is exactly the interval that must be exclusive.
//! - `W worker thread hold fence before after start end`: one increment of the shared
//!   counter, accepted by the store; `start` read before the holder's first validity
//!   check, `end` after the write.
//! - `R worker thread hold fence op highest start end`: a store operation (`op` is `read`
//!   or `write`) refused because the store had already accepted fence `highest`, larger
//!   than the operation's; `start` as in `W`, `end` read after the refusal.
//! - `S worker thread hold before start why`: an increment skipped (validity too short).
//! - `F ...`: a failed `lock()` call, for diagnosis only.
//! - `E worker thread holds taken unavailable expired other extend_ok extend_failed
//!   unlock_errors try_contended stalls skew_ns`: a thread's final counters.
//!
//! # What it proves
//!
//! [`check`] and [`audit`] report as violations:
//!
//! 1. Two windows that overlap; a write or refused operation that starts before its
//!    hold's window or after it ended.
//! 2. A lost increment: sorted by time, the `before → after` values of the *accepted*
//!    writes must be exactly 0→1→2→…, and the final counter must equal their number. A
//!    refused write changed nothing and is not an increment.
//! 3. A store that let a smaller fence through: in store order (by value), accepted
//!    writes carry non-decreasing fences; a refusal names a `highest` above its fence.
//! 4. Fences out of order (when the run is fenced, [`Run::fencing`]): every hold has a
//!    fence, and sorted by window start, each window's fence is larger than the one
//!    before — for every consecutive pair that no node restart could have reordered (see
//!    [`Run`]); the others are counted apart ([`Report::fence_exempt`]).
//! 5. An operation refused while its hold was still valid (it returned before the window
//!    ended): a newer fence reached the store while an older lock was valid, which only a
//!    fence regression explains; so it is a violation unless one of the exempt pairs of
//!    (4) did regress.
//!
//! A write that starts inside its window but *ends* after it is a holder that was paused
//! between its last validity check and its write. Without fencing that is the limit of
//! every Redlock client; with the fenced store it is refused ([`Report::late_refused_writes`])
//! as soon as a newer holder has touched the store, and accepted otherwise — harmless
//! then, since the next holder's read comes after it ([`Report::late_writes`]). Either way,
//! (2) reports it if it lost an increment.

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

/// How far a mapped instant ([`Clock::map`]) may be off: the skew the `E` lines are
/// checked against.
const MAP_ERROR_NS: u64 = 1_000_000;

/// The `H` line of one hold taken without fencing (see the module docs).
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
    fenced_hold_line(
        worker,
        thread,
        hold,
        call_ns,
        started_ns,
        acq_ns,
        deadline_ns,
        rel_ns,
        extended,
        None,
    )
}

/// The `H` line of one hold, with its fence (`None`: taken without fencing).
#[allow(clippy::too_many_arguments)]
pub fn fenced_hold_line(
    worker: usize,
    thread: usize,
    hold: u64,
    call_ns: u64,
    started_ns: u64,
    acq_ns: u64,
    deadline_ns: u64,
    rel_ns: u64,
    extended: bool,
    fence: Option<u64>,
) -> String {
    format!(
        "H {worker} {thread} {hold} {call_ns} {started_ns} {acq_ns} {deadline_ns} {rel_ns} {} {}\n",
        extended as u8,
        Fence(fence)
    )
}

/// A fence as the log writes it: the number, or `-`.
pub struct Fence(pub Option<u64>);

impl std::fmt::Display for Fence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(n) => write!(f, "{n}"),
            None => f.write_str("-"),
        }
    }
}

fn parse_fence(s: &str) -> Option<Option<u64>> {
    if s == "-" {
        Some(None)
    } else {
        s.parse().ok().map(Some)
    }
}

/// One lock held, as logged by its holder (`H` line).
#[derive(Clone, Copy, Debug)]
pub struct Hold {
    pub call_ns: u64,
    pub started_ns: u64,
    pub acq_ns: u64,
    pub deadline_ns: u64,
    pub rel_ns: u64,
    pub extended: bool,
    pub fence: Option<u64>,
}

impl Hold {
    /// End of the window: the deadline, or the unlock call if earlier.
    pub fn end_ns(&self) -> u64 {
        self.deadline_ns.min(self.rel_ns)
    }
}

/// One increment accepted by the store (`W` line).
#[derive(Clone, Copy, Debug)]
pub struct Increment {
    pub who: HoldId,
    pub fence: Option<u64>,
    pub before: u64,
    pub after: u64,
    pub start_ns: u64,
    pub end_ns: u64,
}

/// A store operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Read,
    Write,
}

/// One store operation refused for its stale fence (`R` line).
#[derive(Clone, Copy, Debug)]
pub struct Refusal {
    pub who: HoldId,
    pub fence: Option<u64>,
    pub op: Op,
    /// The largest fence the store had accepted.
    pub highest: u64,
    pub start_ns: u64,
    pub end_ns: u64,
}

/// (worker, thread, hold number).
pub type HoldId = (usize, usize, u64);

/// A node killed and restarted empty, on the shared clock.
#[derive(Clone, Copy, Debug)]
pub struct Restart {
    pub node: usize,
    /// Read once the killed process had been reaped: at or after its death.
    pub killed_ns: u64,
    /// Read before the new process was spawned: at or before it came up.
    pub restarted_ns: u64,
}

/// What the fence-order check needs to know of the run besides the logs.
///
/// # Which consecutive windows must have increasing fences
///
/// A fence is the largest counter among the nodes whose yes won the lock, plus one, and
/// it is written back to a majority before the lock is returned. For two locks A then B
/// (in window order), a node of A's write-back majority that is also among B's counted
/// voters hands B a counter at least A's fence — unless that node lost its counters in
/// between: killed after A's write-back (which comes after A's `started`) and restarted
/// before its yes for B counted (before B's `acq`; with the restart guard, at least
/// `guard_ns` before, since a younger node's yes does not count). Whether a majority
/// still carried A's fence then depends on how many nodes A's write-back reached, which
/// the log does not say. So a pair is asserted unless some restart has
/// `killed_ns > A.started` and `restarted_ns + guard_ns <= B.acq`; with delayed restarts
/// (down ≥ ttl + margin) or a guard longer than the ttl, that takes two locks much
/// further apart than consecutive holds usually are, so nearly every pair is asserted,
/// including those with kills and restarts in between.
#[derive(Clone, Debug, Default)]
pub struct Run {
    /// Every lock was taken with fencing on: every hold must carry a fence.
    pub fencing: bool,
    /// The clients' restart guard, in ns (0: off).
    pub guard_ns: u64,
    /// Every kill and restart of a node during the run.
    pub restarts: Vec<Restart>,
}

/// What the checker found.
#[derive(Debug, Default)]
pub struct Report {
    pub holds: u64,
    pub extended: u64,
    /// Accepted increments.
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
    /// Holds in which the holder had itself stopped right before its write (`E` lines).
    pub stalls: u64,
    /// Holds per worker process.
    pub per_worker: BTreeMap<usize, u64>,
    /// Threads that logged their final `E` line.
    pub finished_threads: usize,
    /// Longest hold window, in µs.
    pub longest_window_us: u64,
    /// Accepted writes that started inside their window and ended after it: holders
    /// paused between their last check and their write, whom no newer holder had yet
    /// overtaken at the store (see the module docs). Not violations.
    pub late_writes: u64,
    /// The first few late writes, accepted or refused, for diagnosis.
    pub late_examples: Vec<String>,
    /// Store operations refused for a stale fence.
    pub refused_reads: u64,
    pub refused_writes: u64,
    /// Of those, the ones that ended after their hold's window: paused holders turned
    /// away by the store.
    pub late_refused_reads: u64,
    pub late_refused_writes: u64,
    /// Refused operations that returned while their hold was still valid.
    pub refused_in_window: u64,
    /// Holds with a fence.
    pub fenced_holds: u64,
    /// Consecutive windows whose fences were asserted to increase.
    pub fence_pairs: u64,
    /// Of those, pairs with a node kill or restart between the earlier lock's start and
    /// the later one's return.
    pub fence_pairs_across_restarts: u64,
    /// Consecutive windows not asserted: a node restart could have erased the earlier
    /// fence (see [`Run`]).
    pub fence_exempt: u64,
    /// Of those, pairs whose fence did not increase (allowed).
    pub fence_exempt_regressions: u64,
    /// The first few exempt regressions, for diagnosis.
    pub fence_examples: Vec<String>,
    /// Overlapping windows found (also listed in `violations`).
    pub overlaps: u64,
    /// Asserted pairs whose fence did not increase (also listed in `violations`).
    pub fence_violations: u64,
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

/// Audits the logs (`(name, content)` pairs) against the final counter value, for a run
/// without fencing facts (no fence is required, no restart is known).
pub fn check(logs: &[(String, String)], final_counter: u64) -> Report {
    audit(logs, final_counter, &Run::default())
}

/// Audits the logs (`(name, content)` pairs) against the final counter value and what
/// the run did to the nodes (see the module docs).
pub fn audit(logs: &[(String, String)], final_counter: u64, run: &Run) -> Report {
    let mut r = Report::default();
    let mut holds: HashMap<HoldId, Hold> = HashMap::new();
    let mut writes: Vec<Increment> = Vec::new();
    let mut refusals: Vec<Refusal> = Vec::new();
    for (name, text) in logs {
        for (n, line) in text.lines().enumerate() {
            let parts: Vec<&str> = line.split_whitespace().collect();
            let bad = || format!("{name}:{}: malformed line {line:?}", n + 1);
            match parts.first().copied() {
                Some("H") if parts.len() == 11 => {
                    let (Some(v), Some(fence)) =
                        (fields::<u64>(&parts[1..10]), parse_fence(parts[10]))
                    else {
                        r.violations.push(bad());
                        continue;
                    };
                    let id = (v[0] as usize, v[1] as usize, v[2]);
                    let hold = Hold {
                        call_ns: v[3],
                        started_ns: v[4],
                        acq_ns: v[5],
                        deadline_ns: v[6],
                        rel_ns: v[7],
                        extended: v[8] == 1,
                        fence,
                    };
                    r.holds += 1;
                    r.extended += hold.extended as u64;
                    r.fenced_holds += fence.is_some() as u64;
                    *r.per_worker.entry(id.0).or_default() += 1;
                    if hold.end_ns() > hold.acq_ns {
                        r.longest_window_us = r
                            .longest_window_us
                            .max((hold.end_ns() - hold.acq_ns) / 1000);
                    }
                    if run.fencing && fence.is_none() {
                        r.violations
                            .push(format!("{name}: hold {id:?} of a fenced run has no fence"));
                    }
                    if holds.insert(id, hold).is_some() {
                        r.violations
                            .push(format!("{name}: hold {id:?} logged twice"));
                    }
                }
                Some("W") if parts.len() == 9 => {
                    let (Some(a), Some(fence), Some(b)) = (
                        fields::<u64>(&parts[1..4]),
                        parse_fence(parts[4]),
                        fields::<u64>(&parts[5..]),
                    ) else {
                        r.violations.push(bad());
                        continue;
                    };
                    writes.push(Increment {
                        who: (a[0] as usize, a[1] as usize, a[2]),
                        fence,
                        before: b[0],
                        after: b[1],
                        start_ns: b[2],
                        end_ns: b[3],
                    });
                }
                Some("R") if parts.len() == 9 => {
                    let op = match parts[5] {
                        "read" => Op::Read,
                        "write" => Op::Write,
                        _ => {
                            r.violations.push(bad());
                            continue;
                        }
                    };
                    let (Some(a), Some(fence), Some(b)) = (
                        fields::<u64>(&parts[1..4]),
                        parse_fence(parts[4]),
                        fields::<u64>(&parts[6..]),
                    ) else {
                        r.violations.push(bad());
                        continue;
                    };
                    refusals.push(Refusal {
                        who: (a[0] as usize, a[1] as usize, a[2]),
                        fence,
                        op,
                        highest: b[0],
                        start_ns: b[1],
                        end_ns: b[2],
                    });
                }
                Some("S") if parts.len() == 7 => r.skipped += 1,
                Some("F") => {} // a failed lock() call, for diagnosis; counted from `E`
                Some("E") if parts.len() == 14 => {
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
                    r.stalls += v[11] as u64;
                    if v[12].unsigned_abs() > MAP_ERROR_NS {
                        r.violations.push(format!(
                            "{name}: Instant→CLOCK_MONOTONIC map drifted {} ns",
                            v[12]
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

    // (4) Fences increase in window order, for every pair no restart could reorder.
    check_fence_order(&windows, run, &mut r);

    // Every write starts inside its own hold's window; one that ends after it is late.
    for w in &writes {
        let Some(h) = inside_window(&holds, w.who, w.start_ns, &format!("{w:?}"), &mut r) else {
            continue;
        };
        if w.fence != h.fence {
            r.violations.push(format!(
                "write {w:?} carries fence {} but its hold has {}",
                Fence(w.fence),
                Fence(h.fence)
            ));
        }
        if w.end_ns > h.end_ns() {
            r.late_writes += 1;
            late_example(&mut r, "accepted", &format!("{w:?}"), w.end_ns, &h);
        }
    }

    // Refused operations: inside their window, for a reason (a larger fence), and late.
    let mut refused_in_window = Vec::new();
    for x in &refusals {
        match x.op {
            Op::Read => r.refused_reads += 1,
            Op::Write => r.refused_writes += 1,
        }
        let Some(h) = inside_window(&holds, x.who, x.start_ns, &format!("{x:?}"), &mut r) else {
            continue;
        };
        if x.fence != h.fence || x.fence.is_none_or(|f| f >= x.highest) {
            r.violations.push(format!(
                "store refusal {x:?} without a larger fence (its hold has fence {})",
                Fence(h.fence)
            ));
        }
        if x.end_ns > h.end_ns() {
            match x.op {
                Op::Read => r.late_refused_reads += 1,
                Op::Write => {
                    r.late_refused_writes += 1;
                    late_example(&mut r, "refused", &format!("{x:?}"), x.end_ns, &h);
                }
            }
        } else {
            r.refused_in_window += 1;
            refused_in_window.push(format!(
                "{x:?} returned {:.3} ms before its hold window [{}, {}) ended",
                (h.end_ns() - x.end_ns) as f64 / 1e6,
                h.acq_ns,
                h.end_ns()
            ));
        }
    }
    // (5) Refused while valid: only an (allowed) fence regression explains it.
    if r.fence_exempt_regressions == 0 {
        for x in refused_in_window {
            r.violations.push(format!(
                "refused while valid, with no fence regression to explain it: {x}"
            ));
        }
    }

    // (3) The store let no smaller fence through: in store order (the value written),
    // accepted writes carry non-decreasing fences.
    let mut by_value: Vec<&Increment> = writes.iter().filter(|w| w.fence.is_some()).collect();
    by_value.sort_by_key(|w| (w.after, w.start_ns));
    for pair in by_value.windows(2) {
        if pair[1].fence < pair[0].fence {
            r.violations.push(format!(
                "store accepted a stale fence: {:?} after {:?}",
                pair[1], pair[0]
            ));
        }
    }

    // (2) No lost update: in time order the accepted increments are 0→1, 1→2, ... and the
    // file ends at their count.
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

/// The hold of an operation that must start inside its window (`what` describes it);
/// `None`, with a violation, if the hold was never logged or the operation started
/// outside.
fn inside_window(
    holds: &HashMap<HoldId, Hold>,
    who: HoldId,
    start_ns: u64,
    what: &str,
    r: &mut Report,
) -> Option<Hold> {
    match holds.get(&who) {
        None => {
            r.violations
                .push(format!("{what} by a hold that was never logged"));
            None
        }
        Some(h) if start_ns < h.acq_ns || start_ns >= h.end_ns() => {
            r.violations.push(format!(
                "write outside validity: {what} does not start within hold window [{}, {})",
                h.acq_ns,
                h.end_ns()
            ));
            None
        }
        Some(h) => Some(*h),
    }
}

fn late_example(r: &mut Report, how: &str, what: &str, end_ns: u64, h: &Hold) {
    if r.late_examples.len() < 5 {
        r.late_examples.push(format!(
            "{how}: {what} ended {:.3} ms after its hold window [{}, {})",
            (end_ns - h.end_ns()) as f64 / 1e6,
            h.acq_ns,
            h.end_ns()
        ));
    }
}

/// (4): consecutive windows (sorted by start) with fences, asserted unless exempt (see
/// [`Run`]).
fn check_fence_order(windows: &[(HoldId, Hold)], run: &Run, r: &mut Report) {
    let fenced: Vec<(HoldId, Hold, u64)> = windows
        .iter()
        .filter_map(|&(id, h)| h.fence.map(|f| (id, h, f)))
        .collect();
    for pair in fenced.windows(2) {
        let (pid, p, pf) = pair[0];
        let (id, h, f) = pair[1];
        // A mapped `started` errs late by at most the map error: widen the interval by it
        // so that every restart that could matter counts.
        let from = p.started_ns.saturating_sub(MAP_ERROR_NS);
        let erased = run.restarts.iter().find(|x| {
            x.killed_ns > from && x.restarted_ns.saturating_add(run.guard_ns) <= h.acq_ns
        });
        if let Some(x) = erased {
            r.fence_exempt += 1;
            if f <= pf {
                r.fence_exempt_regressions += 1;
                if r.fence_examples.len() < 5 {
                    r.fence_examples.push(format!(
                        "hold {id:?} (fence {f}, acq {}) after hold {pid:?} (fence {pf}, \
                         started {}): node {} killed at {} and restarted at {} in between",
                        h.acq_ns, p.started_ns, x.node, x.killed_ns, x.restarted_ns
                    ));
                }
            }
            continue;
        }
        r.fence_pairs += 1;
        let across = run.restarts.iter().any(|x| {
            (from..=h.acq_ns).contains(&x.killed_ns) || (from..=h.acq_ns).contains(&x.restarted_ns)
        });
        r.fence_pairs_across_restarts += across as u64;
        if f <= pf {
            r.fence_violations += 1;
            r.violations.push(format!(
                "fence order: hold {id:?} window [{}, {}) has fence {f}, not above the {pf} of \
                 the window before it, hold {pid:?} [{}, {}), and no node restart in between \
                 can explain it",
                h.acq_ns,
                h.end_ns(),
                p.acq_ns,
                p.end_ns()
            ));
        }
    }
}
