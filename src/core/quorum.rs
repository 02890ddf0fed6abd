//! Quorum size, clock drift and lock validity (the arithmetic of the Redlock spec, step 3-4).

use super::round::Decision;
use std::num::NonZeroU64;
use std::time::{Duration, Instant};

/// The majority of `n` nodes: `n / 2 + 1`.
///
/// # Example
///
/// ```
/// assert_eq!(quorumlock::__private::core::quorum::quorum(5), 3);
/// assert_eq!(quorumlock::__private::core::quorum::quorum(4), 3);
/// assert_eq!(quorumlock::__private::core::quorum::quorum(1), 1);
/// ```
pub const fn quorum(n: usize) -> usize {
    n / 2 + 1
}

/// The spec's allowance for clocks running at slightly different rates:
/// `ttl × drift_factor + 2 ms`.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use quorumlock::__private::core::quorum::drift;
///
/// assert_eq!(drift(Duration::from_secs(10), 0.01), Duration::from_millis(102));
/// ```
pub fn drift(ttl: Duration, drift_factor: f64) -> Duration {
    // Whole microseconds: the factor is a float, the result must not be.
    // Through u64, not u128: a u128-to-float conversion is a library call on the hot path.
    let micros = u64::try_from(ttl.as_micros()).unwrap_or(u64::MAX);
    let scaled = (micros as f64 * drift_factor) as u64;
    Duration::from_micros(scaled) + Duration::from_millis(2)
}

/// When a lock taken at `start` with `ttl` stops being safe to rely on:
/// `start + ttl − drift`. Validity at any later `now` is this deadline minus `now`, which
/// is the spec's `ttl − elapsed − drift`.
///
/// Returns `None` when drift alone eats the whole ttl.
pub fn deadline(start: Instant, ttl: Duration, drift_factor: f64) -> Option<Instant> {
    start.checked_add(safe_span(ttl, drift_factor)?)
}

/// How long after its start a lock with `ttl` stays safe: `ttl − drift`, or `None` when
/// drift alone eats the whole ttl.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use quorumlock::__private::core::quorum::safe_span;
///
/// assert_eq!(safe_span(Duration::from_secs(10), 0.01), Some(Duration::from_millis(9_898)));
/// assert_eq!(safe_span(Duration::from_millis(2), 0.0), None);
/// ```
pub fn safe_span(ttl: Duration, drift_factor: f64) -> Option<Duration> {
    if super::fault!(DriftNotSubtracted) {
        return Some(ttl);
    }
    if super::fault!(ValidityOverstated) {
        return ttl
            .checked_sub(drift(ttl, drift_factor))
            .map(|safe| safe + Duration::from_millis(1));
    }
    ttl.checked_sub(drift(ttl, drift_factor))
        .filter(|safe| !safe.is_zero())
}

/// An acquire's verdict: the lock's deadline, `start + safe`, when the round was won
/// (`decision`) at `decided`, before that deadline; `None` otherwise (lost, or won too
/// late to leave any validity). `safe` is [`safe_span`] of the ttl.
///
pub fn acquired_until(
    decision: Decision,
    decided: Instant,
    start: Instant,
    safe: Option<Duration>,
) -> Option<Instant> {
    if decision != Decision::Won {
        return None;
    }
    let start = if super::fault!(ValidityFromDecision) {
        decided
    } else {
        start
    };
    let end = start.checked_add(safe?)?;
    (decided < end).then_some(end)
}

/// A fenced lock's fence: one more than the largest counter its winning round read
/// (`largest`, `None` when no yes carried one), so at least 1 and above every fence a
/// majority has confirmed before. The one formula for every fenced acquire (single,
/// batched) and for the model checker, which calls it rather than restating it.
pub fn next_fence(largest: Option<u64>) -> NonZeroU64 {
    NonZeroU64::MIN.saturating_add(largest.unwrap_or(0))
}

/// An extend's verdict, for a lock valid until `current`: `Ok(new deadline)` when the
/// round was won at `decided`, before both `current` and the new deadline
/// (`start + ttl − drift`); otherwise `Err(deadline the lock keeps)`, which is never
/// later than `current`, and earlier when nodes that took the new ttl may now expire
/// sooner.
///
pub fn extended_until(
    decision: Decision,
    decided: Instant,
    start: Instant,
    ttl: Duration,
    drift_factor: f64,
    current: Instant,
) -> Result<Instant, Instant> {
    let new_deadline = deadline(start, ttl, drift_factor);
    match new_deadline {
        Some(end)
            if decision == Decision::Won
                && (decided < current || super::fault!(ExtendLateWin))
                && decided < end =>
        {
            Ok(end)
        }
        _ => Err(new_deadline.unwrap_or(start).min(current)),
    }
}

/// Remaining validity at `now`, or `None` when the lock is no longer valid.
pub fn validity(deadline: Instant, now: Instant) -> Option<Duration> {
    deadline
        .checked_duration_since(now)
        .filter(|d| !d.is_zero())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fence_is_one_above_the_largest_counter_read() {
        assert_eq!(next_fence(None).get(), 1);
        assert_eq!(next_fence(Some(0)).get(), 1);
        assert_eq!(next_fence(Some(41)).get(), 42);
        assert_eq!(next_fence(Some(u64::MAX)).get(), u64::MAX);
    }

    /// The one clock reading of these tests: every other instant is built from it.
    fn base() -> Instant {
        static BASE: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        *BASE.get_or_init(Instant::now)
    }
    #[test]
    fn validity_is_ttl_minus_elapsed_minus_drift() {
        let start = base();
        let ttl = Duration::from_millis(1000);
        let end = deadline(start, ttl, 0.01).unwrap();
        // drift = 10 ms + 2 ms
        assert_eq!(end - start, Duration::from_millis(988));
        let now = start + Duration::from_millis(88);
        assert_eq!(validity(end, now), Some(Duration::from_millis(900)));
        assert_eq!(validity(end, end), None);
        assert_eq!(validity(end, end + Duration::from_millis(1)), None);
    }

    #[test]
    fn a_ttl_no_longer_than_drift_is_never_valid() {
        let start = base();
        assert_eq!(deadline(start, Duration::from_millis(2), 0.0), None);
        assert_eq!(deadline(start, Duration::from_millis(1), 0.5), None);
        assert!(deadline(start, Duration::from_millis(3), 0.0).is_some());
    }

    #[test]
    fn quorum_is_a_strict_majority() {
        for n in 1..100 {
            let q = quorum(n);
            assert!(2 * q > n, "two quorums of {n} must overlap");
            assert!(2 * (q - 1) <= n, "quorum of {n} is the smallest majority");
        }
    }

    #[test]
    fn an_acquire_is_valid_only_if_won_before_its_deadline() {
        let start = base();
        let safe = Some(Duration::from_millis(98));
        let early = start + Duration::from_millis(5);
        assert_eq!(
            acquired_until(Decision::Won, early, start, safe),
            Some(start + Duration::from_millis(98))
        );
        let late = start + Duration::from_millis(98);
        assert_eq!(acquired_until(Decision::Won, late, start, safe), None);
        assert_eq!(acquired_until(Decision::Taken, early, start, safe), None);
        assert_eq!(acquired_until(Decision::Won, early, start, None), None);
    }

    #[test]
    fn a_failed_extend_never_lengthens_the_lock() {
        let t = base();
        let ms = Duration::from_millis;
        let current = t + ms(50);
        // Won in time: the new deadline, start + 100 ms − 3 ms of drift.
        assert_eq!(
            extended_until(Decision::Won, t + ms(1), t, ms(100), 0.01, current),
            Ok(t + ms(97))
        );
        // Won after the lock had already run out: the lock keeps its old deadline.
        assert_eq!(
            extended_until(Decision::Won, t + ms(60), t, ms(100), 0.01, current),
            Err(current)
        );
        // Lost with a shorter ttl: the earlier of the two deadlines.
        assert_eq!(
            extended_until(Decision::Taken, t + ms(1), t, ms(20), 0.01, current),
            Err(t + ms(17) + Duration::from_micros(800))
        );
        // Lost with a ttl the drift eats whole: nothing is left.
        assert_eq!(
            extended_until(Decision::Unavailable, t + ms(1), t, ms(2), 0.0, current),
            Err(t)
        );
    }

    /// An extend decided at the very instant the lock runs out, by its current deadline
    /// or by the new one, gains nothing: a validity window ends at its deadline, it does
    /// not include it.
    #[test]
    fn an_extend_decided_as_the_lock_runs_out_keeps_the_old_deadline() {
        let t = base();
        let ms = Duration::from_millis;
        // Decided at the current deadline, with a new one later still.
        let current = t + ms(50);
        assert_eq!(
            extended_until(Decision::Won, current, t, ms(100), 0.01, current),
            Err(current)
        );
        // Decided at the new deadline (t + 97 ms), before the current one: the nodes
        // that took the new ttl may expire the key from then on.
        let current = t + ms(200);
        assert_eq!(
            extended_until(Decision::Won, t + ms(97), t, ms(100), 0.01, current),
            Err(t + ms(97))
        );
        // One tick earlier, both are still ahead: the extend holds.
        let just_before = t + ms(97) - Duration::from_nanos(1);
        assert_eq!(
            extended_until(Decision::Won, just_before, t, ms(100), 0.01, current),
            Ok(t + ms(97))
        );
    }
}
