//! The mutual-exclusion invariant across all simulated clients: no two validity windows
//! on one resource overlap in simulated real (global) time.
//!
//! A hold is the half-open window `[acquired_at, valid_until)` in global time: from when
//! its client learned it holds the lock to the deadline it was given (or its release, if
//! earlier). An extension is recorded by moving `valid_until` of the same hold, not as a
//! new hold: two holds of one client that overlap are reported like any other pair. An
//! empty window (`valid_until <= acquired_at`: the lock was already expired when won)
//! overlaps nothing.

use crate::node::SimTime;

/// One lock held by one client, in global time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hold<R> {
    /// Which simulated client held it.
    pub client: usize,
    /// The locked resource.
    pub resource: R,
    /// When the client learned it holds the lock.
    pub acquired_at: SimTime,
    /// Its deadline, or the moment it released the lock if that came first.
    pub valid_until: SimTime,
}

impl<R> Hold<R> {
    fn is_empty(&self) -> bool {
        self.valid_until <= self.acquired_at
    }
}

/// Two holds of one resource whose windows overlap: indices into the log given to
/// [`overlaps`], and the shared part `[from, to)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Overlap {
    /// The hold that started first (ties: the one listed first in the log).
    pub earlier: usize,
    /// The hold that started inside `earlier`'s window.
    pub later: usize,
    /// Start of the shared time.
    pub from: SimTime,
    /// End of the shared time (exclusive).
    pub to: SimTime,
}

/// Every hold that starts inside the window of another hold of its resource, paired with
/// the one of those that lasts longest. Empty if and only if no two windows on one
/// resource overlap. Sorted by resource, then by the later hold's start.
///
/// O(n log n): holds are sorted by resource and start, then swept once, keeping the
/// window that reaches furthest so far.
pub fn overlaps<R: Ord>(holds: &[Hold<R>]) -> Vec<Overlap> {
    let mut order: Vec<usize> = (0..holds.len()).filter(|&i| !holds[i].is_empty()).collect();
    order.sort_by(|&a, &b| {
        let (x, y) = (&holds[a], &holds[b]);
        (&x.resource, x.acquired_at, a).cmp(&(&y.resource, y.acquired_at, b))
    });
    let mut found = Vec::new();
    // The hold of the current resource whose window ends last.
    let mut widest: Option<usize> = None;
    for i in order {
        let h = &holds[i];
        match widest {
            Some(w) if holds[w].resource == h.resource => {
                let wh = &holds[w];
                if wh.valid_until > h.acquired_at {
                    found.push(Overlap {
                        earlier: w,
                        later: i,
                        from: h.acquired_at,
                        to: wh.valid_until.min(h.valid_until),
                    });
                }
                if h.valid_until > wh.valid_until {
                    widest = Some(i);
                }
            }
            _ => widest = Some(i),
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hold(
        client: usize,
        resource: &str,
        acquired_at: SimTime,
        valid_until: SimTime,
    ) -> Hold<&str> {
        Hold {
            client,
            resource,
            acquired_at,
            valid_until,
        }
    }

    #[test]
    fn disjoint_and_touching_windows_do_not_overlap() {
        let log = [
            hold(0, "a", 0, 10),
            hold(1, "a", 10, 20), // starts exactly when the first ends: half-open
            hold(2, "a", 25, 30),
            hold(3, "b", 5, 15),  // another resource
            hold(4, "a", 12, 12), // empty
            hold(5, "a", 18, 3),  // empty (won already expired)
        ];
        assert_eq!(overlaps(&log), vec![]);
        assert_eq!(overlaps::<&str>(&[]), vec![]);
    }

    #[test]
    fn an_overlap_is_reported_with_both_holds_and_the_shared_time() {
        let log = [
            hold(0, "a", 0, 10),
            hold(1, "b", 0, 100),
            hold(2, "a", 9, 30),
        ];
        assert_eq!(
            overlaps(&log),
            vec![Overlap {
                earlier: 0,
                later: 2,
                from: 9,
                to: 10
            }]
        );
    }

    #[test]
    fn a_long_window_is_remembered_past_shorter_ones() {
        // 0 covers everything; 1 and 2 are disjoint from each other but not from 0.
        let log = [
            hold(0, "a", 0, 100),
            hold(1, "a", 10, 20),
            hold(2, "a", 30, 40),
        ];
        let found = overlaps(&log);
        assert_eq!(found.len(), 2);
        assert!(found.iter().all(|o| o.earlier == 0));
        assert_eq!((found[1].later, found[1].from, found[1].to), (2, 30, 40));
    }

    #[test]
    fn same_start_and_same_client_count_too() {
        let log = [hold(7, "a", 5, 8), hold(7, "a", 5, 6)];
        let found = overlaps(&log);
        assert_eq!(found.len(), 1);
        assert_eq!((found[0].earlier, found[0].later), (0, 1));
        assert_eq!((found[0].from, found[0].to), (5, 6));
    }

    #[test]
    fn matches_a_quadratic_check_on_random_logs() {
        let mut rng = fastrand::Rng::with_seed(9);
        for _ in 0..2000 {
            let n = rng.usize(0..12);
            let log: Vec<Hold<u8>> = (0..n)
                .map(|c| {
                    let at = rng.u64(0..100);
                    Hold {
                        client: c,
                        resource: rng.u8(0..3),
                        acquired_at: at,
                        valid_until: at + rng.u64(0..30) - 5.min(at),
                    }
                })
                .collect();
            let found = overlaps(&log);
            // Every reported pair really overlaps.
            for o in &found {
                let (a, b) = (&log[o.earlier], &log[o.later]);
                assert_eq!(a.resource, b.resource);
                assert!(o.from < o.to);
                assert_eq!(o.from, a.acquired_at.max(b.acquired_at));
                assert_eq!(o.to, a.valid_until.min(b.valid_until));
            }
            // A hold overlaps an earlier-starting one iff it is reported as `later`.
            for (j, b) in log.iter().enumerate() {
                let expected = log.iter().enumerate().any(|(i, a)| {
                    i != j
                        && a.resource == b.resource
                        && !a.is_empty()
                        && !b.is_empty()
                        && (a.acquired_at, i) < (b.acquired_at, j)
                        && a.valid_until > b.acquired_at
                });
                assert_eq!(
                    found.iter().any(|o| o.later == j),
                    expected,
                    "hold {j} of {log:?}"
                );
            }
        }
    }
}
