//! Deliberate protocol faults, for the caught-bug tests of the model checker
//! (`tests/model_faults.rs`: the first four) and of the random simulation
//! (`tests/sim_faults.rs`: the last four) only: this module exists only with the
//! non-default cargo feature `model-faults`.
//!
//! # How
//!
//! Each fault is a switch read at one place of the production core through the crate's
//! `fault!` macro. Without the feature the macro is the constant `false`, so the branch is
//! removed at compile time: normal builds have neither the switch nor its test on the hot
//! path. With it, the switch is per thread (the test's explorer runs on the thread that
//! set it; the simulation runs a fault's scenarios on the thread that set it), all off
//! by default.

use std::cell::Cell;

/// A deliberate bug, one at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// `quorum::safe_span` returns the whole ttl: clock drift is not subtracted from a
    /// lock's validity.
    DriftNotSubtracted,
    /// `Engine` never recognises two endpoints of one server (same `run_id`): an alias's
    /// vote counts a second time.
    AliasCountedTwice,
    /// `Round::raise_counter` keeps the first counted yes's fence counter instead of the
    /// largest: the fence is read from one node instead of a quorum.
    FenceFromOneNode,
    /// The restart guard measures a node's age on the client's clock since the engine
    /// was made, not the node's reported uptime: a freshly restarted node counts.
    GuardWrongClock,
    /// `quorum::safe_span` returns a millisecond more than `ttl − drift`: a lock's
    /// validity is overstated by 1 ms.
    ValidityOverstated,
    /// `quorum::acquired_until` counts the validity from the round's decision instead of
    /// its start: the time the round took is not subtracted.
    ValidityFromDecision,
    /// `quorum::extended_until` keeps the new deadline of an extend won after the lock's
    /// current deadline had passed (only the new deadline is checked).
    ExtendLateWin,
    /// `shared::lease::renewal` dates a renewed lease's deadline from the renewal
    /// round's decision instead of its start.
    LeaseFromDecision,
    /// `Engine::start_node` does not queue an unlock's compare-and-delete behind a
    /// lagging node's stale SET or extend: the delete is dropped, the key left there.
    UnlockSkipsLagging,
    /// An atomic acquire (`lock_all`) sends `script::ACQUIRE` over its first key only: a
    /// node's yes then holds only part of the set.
    AcquireAllFirstKey,
}

thread_local! {
    static ON: Cell<Option<Fault>> = const { Cell::new(None) };
}

/// Switches `fault` on for this thread (`None`: every fault off).
pub fn set(fault: Option<Fault>) {
    ON.with(|on| on.set(fault));
}

/// Whether `fault` is on for this thread.
#[inline]
pub fn on(fault: Fault) -> bool {
    ON.with(|on| on.get() == Some(fault))
}
