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
//!   it is set (an `Instant` from the protocol core), to a [`Stamp`] of this clock; a
//!   suspend after that moment counts against it.
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

/// The stamp of `at`, an `Instant` near now (a deadline just set): now plus the time
/// from now to `at` (minus it, for an `at` already past). The two clocks are read next
/// to each other, this one first, so the stamp errs by at most the time between the
/// reads, and early: a deadline converted is never later than the one given.
pub(crate) fn stamp_of(at: Instant) -> Stamp {
    let stamp = now();
    let instant = Instant::now();
    match at.checked_duration_since(instant) {
        Some(ahead) => stamp.saturating_add(ahead),
        None => stamp.saturating_sub(instant.saturating_duration_since(at)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
