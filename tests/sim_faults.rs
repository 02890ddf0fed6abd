//! The random simulation catches deliberate protocol bugs in what it claims to cover
//! beyond a single lock (issue 24): extends, lease renewals, an unlock whose deletes are
//! still queued behind a lagging node, and `lock_all`. Each fault of
//! `src/core/faults.rs` that the simulation is answerable for is switched into the
//! production code in turn (on this thread, which runs the scenarios), and the scenarios
//! of `tests/sim.rs` (seeds from 0, [`Mode::Safe`]) must fail within [`MAX_SEEDS`]
//! seeds; the seed that caught it must then pass with the fault off (what fails it is the
//! fault, not the scenario). Prints, per fault, after how many seeds it was caught and
//! the check that caught it.
//!
//! Needs the non-default feature: `cargo test --features model-faults --test sim_faults`
//! (`scripts/test.sh` runs it). Without the feature this file is empty.
#![cfg(feature = "model-faults")]

#[path = "sim/check.rs"]
#[allow(dead_code)]
mod check;
#[path = "sim/node.rs"]
#[allow(dead_code)]
mod node;
#[path = "sim/world.rs"]
#[allow(dead_code)]
mod world;

use quorumlock::__private::core::faults::{self, Fault};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Instant;
use world::{Mode, World};

/// Seeds tried per fault before it counts as not caught.
const MAX_SEEDS: u64 = 3_000;

/// The faults the simulation must catch, and the feature each proves it reaches.
const CASES: [(Fault, &str); 4] = [
    (Fault::ExtendLateWin, "extends"),
    (Fault::LeaseFromDecision, "lease renewals"),
    (
        Fault::UnlockSkipsLagging,
        "unlock with deletes queued behind a lagging node",
    ),
    (Fault::AcquireAllFirstKey, "lock_all"),
];

/// Runs `seed`'s scenario on this thread: the panic message of its first violated
/// invariant, if any.
fn violation(seed: u64) -> Option<String> {
    let run = catch_unwind(AssertUnwindSafe(|| {
        World::new(seed, Mode::Safe, Instant::now()).run()
    }));
    let e = run.err()?;
    Some(
        match (e.downcast_ref::<String>(), e.downcast_ref::<&str>()) {
            (Some(s), _) => s.clone(),
            (_, Some(s)) => (*s).to_string(),
            _ => "a panic without a message".into(),
        },
    )
}

#[test]
fn every_fault_is_caught() {
    // The scenarios' panics are the expected outcome here: keep their messages (printed
    // below, one line each) instead of the default hook's backtrace hints.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let only = std::env::var("SIM_FAULT").ok();
    let mut missed = Vec::new();
    for (fault, what) in CASES {
        if only
            .as_ref()
            .is_some_and(|o| !format!("{fault:?}").contains(o))
        {
            continue;
        }
        let t = Instant::now();
        faults::set(Some(fault));
        let caught = (0..MAX_SEEDS).find_map(|seed| violation(seed).map(|m| (seed, m)));
        faults::set(None);
        let secs = t.elapsed().as_secs_f64();
        match caught {
            Some((seed, message)) => {
                let clean = violation(seed);
                eprintln!(
                    "fault {fault:?} ({what}): CAUGHT at seed {seed}, after {} seeds, \
                     {secs:.2} s: {message}; with the fault off seed {seed} {}",
                    seed + 1,
                    match &clean {
                        None => "passes".to_string(),
                        Some(m) => format!("FAILS too: {m}"),
                    }
                );
                if clean.is_some() {
                    missed.push(format!("{fault:?}: seed {seed} fails without the fault"));
                }
            }
            None => {
                eprintln!("fault {fault:?} ({what}): not caught in {MAX_SEEDS} seeds, {secs:.2} s");
                missed.push(format!("{fault:?}: not caught in {MAX_SEEDS} seeds"));
            }
        }
    }
    std::panic::set_hook(hook);
    assert!(missed.is_empty(), "{missed:?}");
}
