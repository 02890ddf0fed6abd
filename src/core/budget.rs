//! How long a round may wait next, reading the clock as rarely as possible.
//!
//! A round must not outlive `node_timeout`. The obvious way, reading the clock after every
//! wait and waiting at most the remainder, costs a clock read and a subtraction per wait,
//! and a healthy round is little more than its waits. Instead, a round waits in slices of
//! `node_timeout / 8` (rounded up to whole milliseconds, as `epoll_wait` takes them), and
//! counts each slice as if it had been waited in full: without reading the clock, the
//! slices handed out can never add up to more than `node_timeout`. When the budget cannot
//! cover another slice, the clock is read and the budget reset to what is really left.
//! A wait that ends with no event at all may have overslept (timer slack, a busy
//! machine), so the caller then [`WaitBudget::expire`]s the budget and the next wait is
//! sized by the clock: late wakeups cannot pile up.
//!
//! # Invariants
//!
//! - The waits handed out since the last clock reading, each counted as its full length
//!   rounded up to a whole millisecond, never exceed what was left at that reading.
//! - [`WaitBudget::resync`] returns `None` exactly when the round's time is up.
//! - The time spent between waits is not counted until the next clock reading. On the
//!   fast path (a common reply on a ready connection) it is microseconds, and at most
//!   eight slices pass between two readings. Any slow-path work (the general parser, a
//!   connection event, a hostile node trickling a reply) makes the caller
//!   [`WaitBudget::expire`] the budget, so the next wait is sized by the clock and such
//!   work cannot push a round past `node_timeout`.
//!
//! The test `eight_slices_then_the_clock` below walks through one budget.

use std::time::{Duration, Instant};

/// Slices per `node_timeout`.
const SLICES: u64 = 8;

/// The waits left to a round that started at `start` and may last `timeout`.
#[derive(Clone, Copy, Debug)]
pub struct WaitBudget {
    start: Instant,
    timeout: Duration,
    slice: Duration,
    slice_ms: u64,
    /// Whole milliseconds that may still be handed out without reading the clock.
    left_ms: u64,
    /// `timeout` in whole milliseconds: what `left_ms` starts from.
    total_ms: u64,
}

impl WaitBudget {
    /// A budget of `timeout` from `start`.
    #[inline]
    pub fn new(start: Instant, timeout: Duration) -> WaitBudget {
        let total_ms = floor_ms(timeout);
        let slice_ms = total_ms.div_ceil(SLICES).max(1);
        WaitBudget {
            start,
            timeout,
            slice: Duration::from_millis(slice_ms),
            slice_ms,
            left_ms: total_ms,
            total_ms,
        }
    }

    /// Makes the budget whole again, for a round that starts at `start`: a client's
    /// rounds share one timeout, so the division into slices is done once, by
    /// [`WaitBudget::new`].
    #[inline]
    pub fn restart(&mut self, start: Instant) {
        self.start = start;
        self.left_ms = self.total_ms;
    }

    /// The next wait, if the budget covers it without reading the clock.
    #[inline]
    pub fn next_wait(&mut self) -> Option<Duration> {
        if self.left_ms >= self.slice_ms {
            self.left_ms -= self.slice_ms;
            Some(self.slice)
        } else {
            None
        }
    }

    /// Forgets what is left without a clock reading, so that the next wait is sized by
    /// the clock: for a wait that may have run late.
    #[inline]
    pub fn expire(&mut self) {
        self.left_ms = 0;
    }

    /// With the clock read at `now`: the next wait, or `None` when the time is up.
    pub fn resync(&mut self, now: Instant) -> Option<Duration> {
        let elapsed = now.saturating_duration_since(self.start);
        let left = self.timeout.checked_sub(elapsed).filter(|d| !d.is_zero())?;
        let left_ms = floor_ms(left);
        let wait = if left_ms >= self.slice_ms {
            self.slice
        } else {
            left
        };
        self.left_ms = left_ms.saturating_sub(ceil_ms(wait));
        Some(wait)
    }
}

fn floor_ms(d: Duration) -> u64 {
    d.as_secs()
        .saturating_mul(1000)
        .saturating_add(u64::from(d.subsec_millis()))
}

fn ceil_ms(d: Duration) -> u64 {
    floor_ms(d) + u64::from(d.subsec_nanos() % 1_000_000 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one clock reading of these tests: every other instant is built from it.
    fn base() -> Instant {
        static BASE: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        *BASE.get_or_init(Instant::now)
    }
    /// Waits handed out between clock readings, rounded up as `epoll_wait` rounds them,
    /// never add up past the deadline; and the budget ends exactly at the deadline.
    #[test]
    fn waits_never_add_up_past_the_deadline() {
        for timeout_us in [
            1,
            999,
            1_000,
            1_001,
            7_500,
            50_000,
            50_300,
            1_000_000,
            3_600_000_000,
        ] {
            let timeout = Duration::from_micros(timeout_us);
            let start = base();
            let mut budget = WaitBudget::new(start, timeout);
            // Worst case: every wait runs to its full (rounded-up) length.
            let mut clock = start;
            let mut waits = 0;
            loop {
                let wait = match budget.next_wait() {
                    Some(w) => w,
                    None => match budget.resync(clock) {
                        Some(w) => w,
                        None => break,
                    },
                };
                assert!(!wait.is_zero());
                clock += Duration::from_millis(ceil_ms(wait));
                // Counted per wait, not per reading: a budget that never runs dry must
                // fail here too, not hang.
                waits += 1;
                assert!(waits < 10_000, "{timeout:?} never ends");
            }
            let over = clock.duration_since(start).saturating_sub(timeout);
            // Only the last wait, shorter than a millisecond, may be rounded up past it.
            assert!(
                over < Duration::from_millis(1),
                "{timeout:?} overran by {over:?}"
            );
            assert!(clock.duration_since(start) >= timeout);
        }
    }

    #[test]
    fn early_replies_cost_no_clock_reading_for_up_to_eight_waits() {
        let start = base();
        let mut budget = WaitBudget::new(start, Duration::from_millis(50));
        for _ in 0..7 {
            assert_eq!(budget.next_wait(), Some(Duration::from_millis(7)));
        }
        assert_eq!(budget.next_wait(), None);
        // The waits really ended early: the clock shows plenty left, the budget refills.
        let wait = budget.resync(start + Duration::from_micros(300));
        assert_eq!(wait, Some(Duration::from_millis(7)));
        assert_eq!(budget.next_wait(), Some(Duration::from_millis(7)));
        // A wait that may have overslept hands the next one to the clock.
        budget.expire();
        assert_eq!(budget.next_wait(), None);
    }

    #[test]
    fn never_more_than_eight_slices_between_readings() {
        for ms in 0..2_000u64 {
            let mut budget = WaitBudget::new(base(), Duration::from_millis(ms));
            let mut n = 0;
            // Bounded, so that a budget that never runs dry fails here instead of hanging.
            while n <= 8 && budget.next_wait().is_some() {
                n += 1;
            }
            assert!(n <= 8, "{ms} ms: {n} slices");
        }
    }

    #[test]
    fn a_clock_before_the_start_counts_as_no_time_gone() {
        let start = base() + Duration::from_secs(1);
        let mut budget = WaitBudget::new(start, Duration::from_millis(10));
        assert_eq!(budget.resync(base()), Some(Duration::from_millis(2)));
    }

    #[test]
    fn eight_slices_then_the_clock() {
        let start = base();
        let mut budget = WaitBudget::new(start, Duration::from_millis(80));
        // Eight waits of 10 ms fit in 80 ms without looking at the clock...
        for _ in 0..8 {
            assert_eq!(budget.next_wait(), Some(Duration::from_millis(10)));
        }
        // ...then the clock decides: 75 ms gone leaves one wait of 5 ms.
        assert_eq!(budget.next_wait(), None);
        assert_eq!(
            budget.resync(start + Duration::from_millis(75)),
            Some(Duration::from_millis(5))
        );
        assert_eq!(budget.resync(start + Duration::from_millis(80)), None);
        // A restarted budget is a new one from its own start, whatever was spent.
        let later = start + Duration::from_secs(1);
        let mut again = budget;
        again.restart(later);
        let mut fresh = WaitBudget::new(later, Duration::from_millis(80));
        for _ in 0..9 {
            assert_eq!(again.next_wait(), fresh.next_wait());
        }
        assert_eq!(
            again.resync(later + Duration::from_millis(75)),
            Some(Duration::from_millis(5))
        );
    }

    /// After a clock reading, the waits handed out without the clock, each counted as a
    /// whole number of milliseconds rounded up, cover what the reading left and no more:
    /// 20.5 ms left is two 10 ms waits, 12.5 ms is one, 7.5 ms is just that.
    #[test]
    fn a_reading_leaves_exactly_the_whole_slices_that_fit() {
        let start = base();
        let us = Duration::from_micros;
        let ten = Duration::from_millis(10);
        let mut budget = WaitBudget::new(start, Duration::from_millis(80));
        budget.expire();
        assert_eq!(budget.resync(start + us(59_500)), Some(ten));
        assert_eq!(budget.next_wait(), Some(ten));
        assert_eq!(budget.next_wait(), None);
        assert_eq!(budget.resync(start + us(67_500)), Some(ten));
        assert_eq!(budget.next_wait(), None);
        assert_eq!(budget.resync(start + us(72_500)), Some(us(7_500)));
        assert_eq!(budget.next_wait(), None);
    }
}
