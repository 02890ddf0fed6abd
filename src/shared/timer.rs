//! One process-wide thread that wakes lost-signal waiters at their deadlines, without
//! the shared client's loop.
//!
//! The loop also marks a lease lost at its deadline, but only when it gets to it: an
//! observer callback or a slow round can hold the loop thread past the deadline. Every
//! future that awaits a lease's loss ([`Lease::lost`](crate::Lease::lost), a
//! [`LostSignal`](crate::LostSignal)) puts its lease here, at the moment it must fire;
//! this thread wakes it then, whatever the loop is doing.
//!
//! # Invariants
//!
//! - An entry is due at a [`Stamp`] (the suspend-counting clock). The thread waits on a
//!   condition variable for at most [`MAX_SLEEP`] at a time, so that after a suspend
//!   (during which the wait's monotonic clock stood still) it is late by at most that.
//! - An entry holds its lease weakly: a lease gone is dropped from here when due. A lease
//!   has one live entry at a time (it records its moment): a new waiter or an earlier
//!   deadline adds one only when due sooner, and the one replaced is ignored when it
//!   pops. When the live entry fires early (the deadline moved later, by a renewal), the
//!   lease says when to come back ([`LeaseShared::tick`]) and is put back. So entries
//!   never outnumber the leases waited on plus the times one's moment moved earlier, and
//!   each goes at its moment.
//! - Wakers run on this thread, outside its lock, each behind `catch_unwind` (a task's
//!   waker is caller code): one that panics does not stop the others.
//! - The thread is started on the first wait and lives as long as the process, parked
//!   when nothing is due.

use super::lease::LeaseShared;
use crate::clock::{self, Stamp};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::time::Duration;

/// The longest the thread sleeps before it reads the clock again.
const MAX_SLEEP: Duration = Duration::from_secs(1);

struct Entry {
    at: Stamp,
    seq: u64,
    lease: Weak<LeaseShared>,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Entry {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

#[derive(Default)]
struct Timers {
    due: BinaryHeap<Reverse<Entry>>,
    seq: u64,
    started: bool,
}

struct Timer {
    timers: Mutex<Timers>,
    changed: Condvar,
}

fn timer() -> &'static Timer {
    static TIMER: OnceLock<Timer> = OnceLock::new();
    TIMER.get_or_init(|| Timer {
        timers: Mutex::new(Timers::default()),
        changed: Condvar::new(),
    })
}

/// Wakes `lease`'s waiters at `at` (see [`LeaseShared::tick`]).
pub(crate) fn schedule(at: Stamp, lease: &Arc<LeaseShared>) {
    let t = timer();
    let mut timers = t.timers.lock().unwrap_or_else(|e| e.into_inner());
    let seq = timers.seq;
    timers.seq += 1;
    let earliest = timers.due.peek().is_none_or(|Reverse(e)| at < e.at);
    timers.due.push(Reverse(Entry {
        at,
        seq,
        lease: Arc::downgrade(lease),
    }));
    if !timers.started {
        let spawned = std::thread::Builder::new()
            .name("quorumlock-timer".into())
            .spawn(run);
        // Without the thread (the OS refused one), waiters still see the loss: the loop
        // marks the lease lost at its deadline, and a blocking wait times its own sleep.
        timers.started = spawned.is_ok();
    }
    drop(timers);
    if earliest {
        t.changed.notify_one();
    }
}

fn run() {
    let t = timer();
    let mut ready: Vec<(Stamp, Arc<LeaseShared>)> = Vec::new();
    loop {
        {
            let mut timers = t.timers.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                let now = clock::now();
                while let Some(Reverse(e)) = timers.due.peek() {
                    if e.at > now {
                        break;
                    }
                    let Some(Reverse(e)) = timers.due.pop() else {
                        break;
                    };
                    if let Some(lease) = e.lease.upgrade() {
                        ready.push((e.at, lease));
                    }
                }
                if !ready.is_empty() {
                    break;
                }
                timers = match timers.due.peek() {
                    None => t.changed.wait(timers).unwrap_or_else(|e| e.into_inner()),
                    Some(Reverse(e)) => {
                        let sleep = e.at.saturating_duration_since(now).min(MAX_SLEEP);
                        t.changed
                            .wait_timeout(timers, sleep)
                            .unwrap_or_else(|e| e.into_inner())
                            .0
                    }
                };
            }
        }
        for (at, lease) in ready.drain(..) {
            if let Some(next) = lease.tick(at) {
                schedule(next, &lease);
            }
        }
    }
}
