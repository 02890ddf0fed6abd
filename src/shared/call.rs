//! One caller's request to the loop thread, and the cell its answer comes back in.
//!
//! A [`Call`] is shared by the caller (a blocking thread or a future) and the loop: the
//! caller fills in the request and queues it; the loop takes it, runs it, and puts the
//! answer in the same cell, then wakes whoever waits (a condition variable for a thread,
//! a `Waker` for a task).
//!
//! # Invariants
//!
//! - The loop writes the answer exactly once per submission, and never touches the cell
//!   again after that until it is submitted anew: a blocking thread reuses its call for
//!   every request, so that a call costs no allocation.
//! - A call whose caller is gone (a dropped future) is `abandoned`: whoever finds a lock
//!   in it then (the loop when it answers, or the future's drop when the answer came
//!   first) releases it in the background. Both look under the cell's mutex, so exactly
//!   one of them does.

use crate::error::Error;
use crate::lock::Lock;
use crate::shared::lease::LeaseShared;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::Waker;
use std::time::{Duration, Instant};

/// Wakes a task. A waker is the caller's code, run on the loop thread: one that
/// panics must not take the loop (and every other caller) down with it.
pub(crate) fn wake(w: Waker) {
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| w.wake()));
}

/// What a call asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    /// Acquire `key`: `attempts` at most, no attempt starting at or after `until`.
    Lock {
        attempts: u32,
        until: Option<Instant>,
    },
    /// Acquire `key` as `Lock` does, then keep it alive as a lease.
    Lease {
        attempts: u32,
        until: Option<Instant>,
    },
    /// Acquire every key of `keys` or none (`lock_all`), with retries.
    LockAll,
    /// Extend `lock` to `ttl`.
    Extend,
    /// Release `lock`.
    Unlock,
    /// Release the lease `lease`.
    Release,
    /// Report every node's health (`Done::Health`), from the loop's sessions.
    Health,
}

/// What the loop answers.
#[derive(Debug)]
pub(crate) enum Done {
    /// A lock, acquired.
    Locked(Lock),
    /// The lock of an extend, updated whether it succeeded or not (it replaces the
    /// caller's copy), and the extend's error if it failed.
    Extended(Lock, Option<Error>),
    /// A lease, acquired.
    Leased(Arc<LeaseShared>),
    /// How many nodes confirmed a release.
    Released(usize),
    /// Every node's health, in configuration order.
    Health(Vec<crate::shared::health::NodeHealth>),
}

/// A request and, once the loop has run it, its answer.
#[derive(Debug)]
pub(crate) struct Request {
    pub op: Op,
    /// The resource of `Lock` and `Lease`; kept with its capacity between uses.
    pub key: Vec<u8>,
    /// The caller's own token for `Lock` (`lock_with_token`); `None`: a new one per
    /// attempt.
    pub token: Option<crate::core::token::Token>,
    /// The resources of `LockAll`.
    pub keys: Vec<Box<[u8]>>,
    pub ttl: Duration,
    /// The lock of `Extend` and `Unlock`.
    pub lock: Option<Lock>,
    /// The lease of `Release`.
    pub lease: Option<Arc<LeaseShared>>,
    pub answer: Option<Result<Done, Error>>,
    /// Set while the request is queued or running: cleared with the answer.
    pub busy: bool,
    /// The caller is gone: a lock in the answer is to be released.
    pub abandoned: bool,
    pub waker: Option<Waker>,
    /// A thread sleeps on the condvar for the answer (a blocking call): only then is
    /// it notified, which costs a system call.
    pub sleeper: bool,
}

/// A request cell shared by a caller and the loop.
#[derive(Debug)]
pub(crate) struct Call {
    request: Mutex<Request>,
    answered: Condvar,
}

impl Call {
    pub fn new() -> Arc<Call> {
        Arc::new(Call {
            request: Mutex::new(Request {
                op: Op::Unlock,
                key: Vec::new(),
                token: None,
                keys: Vec::new(),
                ttl: Duration::ZERO,
                lock: None,
                lease: None,
                answer: None,
                busy: false,
                abandoned: false,
                waker: None,
                sleeper: false,
            }),
            answered: Condvar::new(),
        })
    }

    /// The request, locked. A poisoned mutex (a panic while it was held, which no code
    /// here does) is taken as is: the request is plain data.
    pub fn lock(&self) -> MutexGuard<'_, Request> {
        self.request.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Answers the request and wakes its caller. Returns the answer back when the caller
    /// is gone (the loop then releases any lock in it).
    pub fn answer(&self, answer: Result<Done, Error>) -> Option<Result<Done, Error>> {
        let mut r = self.lock();
        r.busy = false;
        if r.abandoned {
            return Some(answer);
        }
        r.answer = Some(answer);
        let waker = r.waker.take();
        let sleeper = std::mem::take(&mut r.sleeper);
        drop(r);
        if sleeper {
            self.answered.notify_one();
        }
        if let Some(w) = waker {
            wake(w);
        }
        None
    }

    /// Blocks the calling thread until the request is answered.
    pub fn wait(&self) -> Result<Done, Error> {
        let mut r = self.lock();
        loop {
            if let Some(answer) = r.answer.take() {
                return answer;
            }
            r.sleeper = true;
            r = self.answered.wait(r).unwrap_or_else(|e| e.into_inner());
        }
    }
}
