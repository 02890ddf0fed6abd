//! The clock the library compares validity deadlines against on the caller's side: one
//! that keeps counting while the machine is suspended.
//!
//! On Linux, [`Instant`] is `CLOCK_MONOTONIC`, which stops while the machine sleeps
//! (suspend to RAM or disk), while the nodes' keys keep expiring on their own machines.
//! A lock checked with `Instant` after a resume would look valid for as long as the
//! machine slept, though its keys may be gone and the resource someone else's. This
//! module reads `CLOCK_BOOTTIME`, which counts the time asleep. Elsewhere it falls back
//! to `Instant` (on macOS, `Instant` already counts sleep: `mach_continuous_time`).
//!
//! # What it covers, and what it does not
//!
//! - Covered: every check of "is it still valid?" made for a caller —
//!   [`Lock::remaining`](crate::Lock::remaining), [`Lock::is_valid`](crate::Lock::is_valid),
//!   [`Lease::remaining`](crate::Lease::remaining), [`Lease::is_lost`](crate::Lease::is_lost),
//!   the lost signals and the timer that wakes them. Each deadline is converted once, when
//!   it is set (an `Instant` from the protocol core), to a [`Stamp`] of this clock, with
//!   the gap between the two clocks read when its round started ([`round_starts`], from
//!   `Driver::begin`): a suspend from that moment on counts against it, one in the middle
//!   of the round included.
//! - Not covered: the protocol core and the loop keep `Instant`s (the core reads no
//!   clock; the loop's timers are `epoll` timeouts). After a resume, the loop may notice
//!   a lapsed lease late, but every caller-side check above already says it is lost.
//! - Not covered: a virtual machine paused by its host (live migration, a stopped VM):
//!   the guest's clocks, `CLOCK_BOOTTIME` included, do not advance while it is paused,
//!   so no clock read inside it can tell. Keep such pauses shorter than the drift
//!   allowance, or run lock holders where the host does not pause them.
//!
//! # Invariants
//!
//! - [`now`] never goes backwards, and counts at least the time `Instant` counts.
//! - This is the only module of the library with `unsafe` code: one `clock_gettime`
//!   call into a local, checked for failure (then `Instant` is used instead).

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A moment on the suspend-counting clock: the time since an arbitrary origin (the
/// boot, on Linux), comparable only with other stamps of this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Stamp(Duration);

impl Stamp {
    /// The time from `earlier` to this stamp, zero if `earlier` is later.
    pub fn saturating_duration_since(self, earlier: Stamp) -> Duration {
        self.0.saturating_sub(earlier.0)
    }

    /// This stamp plus `d`, saturating.
    pub fn saturating_add(self, d: Duration) -> Stamp {
        Stamp(self.0.saturating_add(d))
    }

    /// This stamp minus `d`, at the origin at the earliest.
    pub fn saturating_sub(self, d: Duration) -> Stamp {
        Stamp(self.0.saturating_sub(d))
    }
}

/// The base of the fallback: stamps count from the first use in this process.
fn base() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

#[cfg(any(target_os = "linux", target_os = "android"))]
#[allow(unsafe_code)]
fn boottime() -> Option<Duration> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec that outlives the call; the call
    // writes only into it.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    if rc != 0 || ts.tv_sec < 0 || !(0..1_000_000_000).contains(&ts.tv_nsec) {
        return None;
    }
    Some(Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn boottime() -> Option<Duration> {
    None
}

/// Now, on the suspend-counting clock.
pub(crate) fn now() -> Stamp {
    // `CLOCK_BOOTTIME` exists since Linux 2.6.39; should it ever fail, `Instant` (which
    // then does not count a suspend) is better than nothing. Whichever is used first is
    // used for good, so that stamps stay comparable.
    static BOOTTIME: OnceLock<bool> = OnceLock::new();
    if *BOOTTIME.get_or_init(|| boottime().is_some()) {
        if let Some(d) = boottime() {
            return Stamp(d);
        }
    }
    Stamp(Instant::now().saturating_duration_since(base()))
}

/// How far this clock is ahead of `Instant` (counted from [`base`]) now: the time the
/// machine spent suspended, plus a constant. It only grows, so a gap read earlier
/// converts a deadline no later than one read after. This clock is read first, so the
/// gap errs small (converting early) by the time between the two reads.
fn gap_now() -> Duration {
    let stamp = now();
    let since = Instant::now().saturating_duration_since(base());
    stamp.0.saturating_sub(since)
}

/// The gap when this process first used the clock: the smallest there is (the most
/// cautious conversion), for a deadline whose round left no record here.
fn first_gap() -> Duration {
    static FIRST: OnceLock<Duration> = OnceLock::new();
    *FIRST.get_or_init(gap_now)
}

/// Round starts remembered per thread: enough for the rounds one call chains (an
/// acquire, its fence write-back, a retry) between the start and the lock it makes.
const STARTS: usize = 8;

/// A round's start, and the gap then.
type RoundStart = Option<(Instant, Duration)>;

thread_local! {
    /// The last [`STARTS`] rounds begun on this thread, and where the next one goes.
    static ROUND_STARTS: std::cell::RefCell<([RoundStart; STARTS], usize)> =
        const { std::cell::RefCell::new(([None; STARTS], 0)) };
}

/// Records that a round starts at `start` (an `Instant` just read): the gap now, for
/// [`stamp_from`] to convert the deadlines counted from it. A suspend between a round's
/// start and its verdict then counts against the deadline, as it does against the keys.
pub(crate) fn round_starts(start: Instant) {
    let _ = first_gap();
    let gap = gap_now();
    ROUND_STARTS.with_borrow_mut(|(starts, next)| {
        starts[*next % STARTS] = Some((start, gap));
        *next = next.wrapping_add(1);
    });
}

/// The stamp of `at`, a deadline counted from a round that started at `started`: `at`
/// moved by the gap recorded when the latest round on this thread that started no later
/// than `started` did (exactly that round's, when it ran here; [`first_gap`], the most
/// cautious, when none is remembered). Never later than the deadline the keys have.
pub(crate) fn stamp_from(at: Instant, started: Instant) -> Stamp {
    let recorded = ROUND_STARTS.with_borrow(|(starts, _)| gap_at(starts, started));
    shifted(at, recorded.unwrap_or_else(first_gap))
}

/// The gap recorded by the latest of `starts` no later than `started`.
fn gap_at(starts: &[RoundStart], started: Instant) -> Option<Duration> {
    starts
        .iter()
        .flatten()
        .filter(|(s, _)| *s <= started)
        .max_by_key(|(s, _)| *s)
        .map(|&(_, gap)| gap)
}

/// The stamp of `at`, an `Instant` near now with no round behind it: moved by the gap
/// now (a suspend before this call is not counted against it). For tests.
#[cfg(test)]
pub(crate) fn stamp_of(at: Instant) -> Stamp {
    shifted(at, gap_now())
}

/// `at` on this clock, given the gap to use.
fn shifted(at: Instant, gap: Duration) -> Stamp {
    match at.checked_duration_since(base()) {
        Some(since) => Stamp(since.saturating_add(gap)),
        None => Stamp(gap.saturating_sub(base().saturating_duration_since(at))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deadline is moved by the gap of the round it was counted from, not by a later
    /// one's (which a suspend during the round would have grown), nor by none.
    #[test]
    fn a_deadline_takes_the_gap_of_its_own_rounds_start() {
        let t0 = Instant::now();
        let (t1, t2) = (
            t0 + Duration::from_millis(10),
            t0 + Duration::from_millis(20),
        );
        let secs = Duration::from_secs;
        // Round t1's gap 5 s; a suspend of 60 s, then round t2's gap 65 s.
        let starts = [Some((t1, secs(5))), Some((t2, secs(65))), None];
        assert_eq!(gap_at(&starts, t1), Some(secs(5)));
        assert_eq!(
            gap_at(&starts, t1 + Duration::from_millis(5)),
            Some(secs(5))
        );
        assert_eq!(gap_at(&starts, t2), Some(secs(65)));
        assert_eq!(
            gap_at(&starts, t0),
            None,
            "no round that early: the first gap"
        );
        // The conversion itself: a deadline 30 s after t1, with t1's gap.
        let deadline = t1 + secs(30);
        assert_eq!(
            shifted(deadline, secs(5)).saturating_duration_since(shifted(t1, secs(5))),
            secs(30)
        );
        assert!(shifted(deadline, secs(5)) < shifted(deadline, secs(65)));
    }

    #[test]
    fn a_round_started_here_converts_no_later_than_the_gap_now() {
        let start = Instant::now();
        round_starts(start);
        let deadline = start + Duration::from_secs(30);
        let from_round = stamp_from(deadline, start);
        // Each gap errs small by the time between its two clock reads: a millisecond of
        // slack for a loaded machine.
        let slack = Duration::from_millis(1);
        assert!(from_round <= stamp_of(deadline).saturating_add(slack));
        // No earlier than the first gap allows: the first gap is the smallest.
        assert!(shifted(deadline, first_gap()) <= from_round.saturating_add(slack));
    }

    #[test]
    fn the_clock_never_goes_backwards_and_counts_what_instant_counts() {
        let (s0, i0) = (now(), Instant::now());
        std::thread::sleep(Duration::from_millis(20));
        let (i1, s1) = (Instant::now(), now());
        assert!(s1 >= s0);
        assert!(s1.saturating_duration_since(s0) >= i1.saturating_duration_since(i0));
    }

    #[test]
    fn an_instant_ahead_or_behind_keeps_its_distance_from_now() {
        let ahead = Instant::now() + Duration::from_secs(10);
        let left = stamp_of(ahead).saturating_duration_since(now());
        assert!(left <= Duration::from_secs(10) && left > Duration::from_secs(9));
        let behind = Instant::now() - Duration::from_millis(1);
        assert_eq!(
            stamp_of(behind).saturating_duration_since(now()),
            Duration::ZERO
        );
    }
}
