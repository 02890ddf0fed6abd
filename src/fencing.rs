//! Fencing tokens across the quorum: a number per lock that only ever rises, per resource.
//!
//! # How
//!
//! A fence counter is kept per resource on every node (`quorumlock:fence:{<resource>}`,
//! no expiry). A fenced acquire reads the counters with its `SET`s, atomically on each
//! node (`script::ACQUIRE`); the lock's fence is the largest counter among the nodes
//! whose yes counted, plus one. Before the lock is returned, that fence is written back to
//! every node whose connection is up (queued behind what a lagging one owes) by
//! `script::FENCE`, which raises the node's counter where lower and answers yes only if
//! the node still holds the lock's key with the lock's token (all of its keys, for
//! `lock_all`): a node that does not hold it keeps the raised counter (one more copy to
//! outlive a restart) but does not count. The call waits for a majority of distinct
//! nodes to confirm it while the lock is valid. The cost over an unfenced lock is that
//! one write-back round; no more.
//!
//! # Why fences never repeat
//!
//! The property: let A and B be two holders of one resource whose validity windows are
//! ordered, A's local deadline before B's acquire returns. Then B's fence is larger than
//! A's, unless a node restarted empty or lost its counter in between (below).
//!
//! Let `W` be the set of nodes that confirmed A's write-back (a majority; counted before
//! A's lock was returned, so before A's deadline), and `R` the set whose yes votes B's
//! acquire counted (a majority). Two majorities share a node `x`. On `x`, scripts run
//! one at a time, so these events have one order there:
//!
//! - `sA`: A's `SET` of its key (the one `FENCE` then found there),
//! - `wA`: A's write-back, which found A's key with A's token, so after `sA` and before
//!   that key left `x`, and left the counter at least A's fence (raise and check are one
//!   script),
//! - `rB`: B's acquire, which found the key free, set B's key and read the counter.
//!
//! `rB` cannot fall between `sA` and `wA`: A's key was there all along. So either
//!
//! 1. `rB` follows `wA`: B read a counter at least A's fence (counters only rise), and
//!    B's fence, one more than the largest counter it counted, is larger; or
//! 2. `rB` precedes `sA`: B's key, set at `rB`, left `x` before A's `SET NX` there. Keys
//!    leave a node by expiry or by a compare-and-delete of their token, and tokens are
//!    unique per acquire (the crate's own are 128 random bits per attempt; caller-chosen
//!    ones must be unique per call, [`Redlock::lock_with_token`], whose retries rely on
//!    a failed attempt's cleanup reaching each node ahead of the next attempt). So B's
//!    key is deleted only by B's release, after B's acquire returned. And it expires no
//!    earlier than B's deadline: that is B's start plus `ttl − drift`, and `rB` is after
//!    B's start (the Redlock drift argument mutual exclusion rests on). Either way `sA`
//!    comes after B's acquire returned (B returns only while valid). But `sA` precedes
//!    A's deadline (A's write-back counted before A returned, while valid), and A's
//!    deadline precedes B's return: a contradiction. Case 2 cannot happen.
//!
//! Nothing here bounds how long a round lasts, so none of these can break it:
//!
//! - **Late replies and stalls.** A reply read late (a paused process, the driver's last
//!   look after a stall, a loaded machine) still reports one script run at one point of
//!   `x`'s order. The ordering above is of script runs on `x`, not of when anyone read
//!   their replies. (The earlier write-back raised counters unconditionally and relied on
//!   rounds lasting at most `node_timeout`; a read counted late could precede a write-back
//!   on one node and follow the expiry of the earlier key on another: a repeated fence.)
//! - **Resends.** Each counted reply is one run of the script on one node; a resent
//!   command is another run, judged by what it found when it ran.
//! - **Lagging nodes.** A write-back queued behind a lagging node's backlog runs when it
//!   runs: if A's key is gone by then it answers no and does not count for `W` (its
//!   raise there is harmless: a counter only rises, so later fences only grow).
//! - **"Not needed" votes.** B's fence is taken over every yes it counted (at least `R`);
//!   a yes counted after the decision only adds counters to the maximum, and a write-back
//!   confirmation after the decision only adds nodes that hold the counter.
//! - **Aliases and the restart guard.** `R` and `W` count distinct servers (an alias's
//!   second endpoint never counts), and a young node's yes does not count for `R`.
//!
//! # Invariants
//!
//! - A fence is returned only with a lock that is still valid once a majority has
//!   confirmed it with the lock's key in place.
//! - A lock whose write-back was not confirmed in time is released and never returned:
//!   its caller sees [`Phase::Fence`] in the error.
//! - A fenced lock's release raises each node's counter to its fence in the same script
//!   that deletes its key (`script::RELEASE_FENCED`), so no node frees the key without
//!   the fence, even one the write-back missed.
//! - Counters are Lua numbers (doubles) on the nodes, exact up to 2^53: a node that
//!   answers a counter of 2^53 or more is treated as out of step, so every fence, one
//!   more, stays exact where the scripts compare it.
//! - Counters are permanent state: a node that restarts empty, fails over to a replica
//!   that lacks the last write, or evicts or flushes the counter loses it (the exception
//!   to the property). The restart guard keeps such a node's yes from counting for a
//!   while, which protects exclusivity (keys expire anyway) but not counters; strict
//!   order across restarts needs persistence on the nodes (AOF with `appendfsync always`),
//!   or a write-back that reached more nodes than restarted.

use crate::core::command::FENCE_PREFIX;
use crate::core::engine::{Fencing, Item, Request};
use crate::core::quorum::next_fence;
use crate::core::round::Decision;
use crate::error::{ArgumentError, Error, Phase};
use crate::lock::Lock;
use crate::redlock::{Redlock, check_resource};
use std::time::{Duration, Instant};

/// With fencing on, a ttl must be at least this many `node_timeout`s. Not for the order
/// of fences (the proof above bounds no round): a fenced lock must outlive two rounds on
/// its nodes, the acquire and the write-back (each up to one `node_timeout`), and still
/// leave time to use it; a shorter ttl would mostly end in a write-back not confirmed in
/// time.
pub const FENCE_TTL_FACTOR: u32 = 4;

impl Redlock {
    /// What an acquire does with fence counters under these settings.
    #[inline]
    pub(crate) fn fencing(&self) -> Fencing {
        if self.settings.fencing {
            Fencing::Read
        } else {
            Fencing::Off
        }
    }

    /// A resource name as [`check_resource`] accepts it, and with fencing on, not one of
    /// the fence counters' own keys (`quorumlock:fence:...`): locking one would have its
    /// key overwritten, without expiry, by a write-back.
    #[inline]
    pub(crate) fn check_key(&self, resource: &[u8]) -> Result<(), Error> {
        check_resource(resource)?;
        if self.settings.fencing && resource.starts_with(FENCE_PREFIX) {
            return Err(Error::InvalidArgument(ArgumentError::new(
                "resource",
                format!("{:?}", crate::error::Escaped(resource)),
                "with fencing on, a name under quorumlock:fence: is a fence counter's key",
            )));
        }
        Ok(())
    }

    /// Refuses a ttl too short for a fenced lock to be of use ([`FENCE_TTL_FACTOR`]).
    pub(crate) fn check_fenced_ttl(&self, ttl: Duration) -> Result<(), Error> {
        let least = self.settings.node_timeout.saturating_mul(FENCE_TTL_FACTOR);
        if ttl >= least {
            return Ok(());
        }
        Err(Error::InvalidArgument(ArgumentError::new(
            "ttl",
            format!("{ttl:?}"),
            format!(
                "with fencing on, at least {FENCE_TTL_FACTOR} × node_timeout ({least:?}): \
                 a fenced lock must outlive its acquire and its fence write-back, one \
                 node_timeout each"
            ),
        )))
    }

    /// The fence of `lock`, just won in the round in `self.round` on `items` (one slot),
    /// written back to the nodes; the lock with its fence, or the error of a write-back
    /// that a majority did not confirm while the lock was valid (the lock is then
    /// released).
    pub(crate) fn fence_lock(
        &mut self,
        mut lock: Lock,
        items: &[Item<'_>],
        atomic: bool,
        start: Instant,
        attempt: u32,
    ) -> Result<Lock, Error> {
        let fence = next_fence(self.round.counter(0));
        let req = Request {
            atomic,
            fencing: Fencing::Write(fence.get()),
            ..Request::new(Phase::Fence, 0, items, 0)
        };
        self.driver.run(&mut self.round, &req);
        let decision = self.round.decision(0);
        if decision == Decision::Won && lock.is_valid() {
            lock.set_fence(fence);
            return Ok(lock);
        }
        let failure = self.failure(Phase::Fence, lock.resource(), 0, attempt, start);
        let error = if decision == Decision::Won {
            Error::Expired(failure)
        } else {
            Error::Unavailable(failure)
        };
        // Never handed out without its fence: free it for the next holder at once.
        let _ = self.unlock(&lock);
        Err(error)
    }

    /// The fences of a batch: every lock won in `results` (one per slot of `items`, in
    /// order, errors included) gets the same fence, larger than every counter read for
    /// any of them, written back in one round; a lock whose write-back a majority did not
    /// confirm while it was valid becomes an error, and is released.
    pub(crate) fn fence_batch(
        &mut self,
        items: &[Item<'_>],
        results: &mut [Result<Lock, Error>],
        start: Instant,
    ) {
        let won: Vec<usize> = results
            .iter()
            .enumerate()
            .filter(|(_, r)| r.is_ok())
            .map(|(slot, _)| slot)
            .collect();
        if won.is_empty() {
            return;
        }
        let highest = won
            .iter()
            .filter_map(|&slot| self.round.counter(slot))
            .max();
        let fence = next_fence(highest);
        let fenced: Vec<Item<'_>> = won.iter().map(|&slot| items[slot]).collect();
        let req = Request {
            fencing: Fencing::Write(fence.get()),
            ..Request::new(Phase::Fence, 0, &fenced, 0)
        };
        self.driver.run(&mut self.round, &req);
        let mut unfenced = Vec::new();
        for (k, &slot) in won.iter().enumerate() {
            let decision = self.round.decision(k);
            let Ok(lock) = &mut results[slot] else {
                continue;
            };
            if decision == Decision::Won && lock.is_valid() {
                lock.set_fence(fence);
                continue;
            }
            let failure = self.failure(Phase::Fence, items[slot].key, k, 1, start);
            let error = if decision == Decision::Won {
                Error::Expired(failure)
            } else {
                Error::Unavailable(failure)
            };
            if let Ok(lock) = std::mem::replace(&mut results[slot], Err(error)) {
                unfenced.push(lock);
            }
        }
        // Never handed out without their fence: free them for the next holders at once.
        if !unfenced.is_empty() {
            let _ = self.unlock_many(&unfenced);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::round::Round;
    use crate::core::script;
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::sync::{Arc, Mutex};

    /// Every command a node was sent, each as its arguments.
    type Seen = Arc<Mutex<Vec<Vec<Vec<u8>>>>>;

    /// A stand-in for one Redis node on the loopback: answers the connection's handshake
    /// (`INFO server`, `PING`) as Redis does, every other command with `reply`, and keeps
    /// every command it was sent. Its threads end with the connection and the process.
    fn node(reply: &'static [u8]) -> (String, Seen) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("redis://{}", listener.local_addr().unwrap());
        let seen = Seen::default();
        let log = Arc::clone(&seen);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let log = Arc::clone(&log);
                std::thread::spawn(move || serve(stream, reply, &log));
            }
        });
        (url, seen)
    }

    fn serve(stream: TcpStream, reply: &[u8], seen: &Seen) {
        let mut out = stream.try_clone().unwrap();
        let mut input = BufReader::new(stream);
        let mut line = String::new();
        let mut read_line = |input: &mut BufReader<TcpStream>| {
            line.clear();
            match input.read_line(&mut line) {
                Ok(1..) => line.trim_end()[1..].parse::<usize>().ok(),
                _ => None,
            }
        };
        while let Some(argc) = read_line(&mut input) {
            let mut args = Vec::with_capacity(argc);
            for _ in 0..argc {
                let Some(len) = read_line(&mut input) else {
                    return;
                };
                let mut arg = vec![0; len + 2];
                if input.read_exact(&mut arg).is_err() {
                    return;
                }
                arg.truncate(len);
                args.push(arg);
            }
            let answer = match args.first().map(|a| a.to_ascii_uppercase()).as_deref() {
                Some(b"INFO") => {
                    let text = format!(
                        "# Server\r\nrun_id:{}\r\nuptime_in_seconds:100000\r\n",
                        "a".repeat(40)
                    );
                    format!("${}\r\n{text}\r\n", text.len()).into_bytes()
                }
                Some(b"PING") => b"+PONG\r\n".to_vec(),
                _ => {
                    seen.lock().unwrap().push(args);
                    reply.to_vec()
                }
            };
            if out.write_all(&answer).is_err() {
                return;
            }
        }
    }

    fn client(url: &str) -> Redlock {
        Redlock::builder()
            .nodes([url])
            // Generous: no test here waits it out (every round is decided by a reply), and
            // a loaded machine must not turn a slow handshake into a failed round.
            .node_timeout(Duration::from_secs(2))
            .fencing(true)
            .build()
            .unwrap()
    }

    /// A lock on `resource` of `rl`'s, valid for `validity` from now (expired when `None`).
    fn lock(rl: &mut Redlock, resource: &[u8], validity: Option<Duration>) -> Lock {
        let now = Instant::now();
        let ttl = Duration::from_secs(10);
        let deadline = match validity {
            Some(v) => now + v,
            None => now.checked_sub(Duration::from_millis(1)).unwrap(),
        };
        Lock::new(resource, rl.next_token().unwrap(), ttl, now, deadline, 0)
    }

    /// The commands seen that carry `arg` among their arguments.
    fn with_arg(seen: &Seen, arg: &[u8]) -> usize {
        let seen = seen.lock().unwrap();
        seen.iter().filter(|c| c.iter().any(|a| a == arg)).count()
    }

    /// The commands seen that release a key (by any of the release scripts).
    fn releases(seen: &Seen) -> usize {
        let scripts: [&[u8]; 6] = [
            script::RELEASE,
            script::RELEASE_SHA,
            script::RELEASE_ALL,
            script::RELEASE_ALL_SHA,
            script::RELEASE_FENCED,
            script::RELEASE_FENCED_SHA,
        ];
        let seen = seen.lock().unwrap();
        seen.iter()
            .filter(|c| c.iter().any(|a| scripts.contains(&&a[..])))
            .count()
    }

    /// A fresh acquire round over one node and `slots` slots, whose counted yes votes
    /// read the fence counters `counters` (by slot).
    fn acquired(rl: &mut Redlock, counters: &[Option<u64>]) {
        rl.round = Round::default();
        rl.round.begin(Phase::Acquire, 1, counters.len());
        for (slot, c) in counters.iter().enumerate() {
            if let Some(c) = c {
                rl.round.raise_counter(slot, *c);
            }
        }
    }

    #[test]
    fn a_ttl_below_four_node_timeouts_is_refused_with_fencing_on() {
        let rl = client("redis://127.0.0.1:1");
        assert_eq!(rl.fencing(), Fencing::Read);
        assert!(rl.check_fenced_ttl(Duration::from_secs(8)).is_ok());
        assert!(rl.check_fenced_ttl(Duration::from_secs(60)).is_ok());
        let short = rl.check_fenced_ttl(Duration::from_millis(7999));
        assert!(matches!(short, Err(Error::InvalidArgument(_))), "{short:?}");
    }

    #[test]
    fn a_fence_counters_key_is_no_resource_with_fencing_on_only() {
        let on = client("redis://127.0.0.1:1");
        assert!(on.check_key(b"job").is_ok());
        let counter = on.check_key(b"quorumlock:fence:job");
        assert!(
            matches!(counter, Err(Error::InvalidArgument(_))),
            "{counter:?}"
        );
        assert!(on.check_key(b"").is_err());
        let off = Redlock::builder()
            .nodes(["redis://127.0.0.1:1"])
            .build()
            .unwrap();
        assert_eq!(off.fencing(), Fencing::Off);
        assert!(off.check_key(b"quorumlock:fence:job").is_ok());
    }

    /// A won lock gets one more than the largest counter read, written back to the
    /// nodes; it is returned only once a majority confirmed it.
    #[test]
    fn a_lock_is_returned_with_its_fence_once_a_majority_confirms_it() {
        let (url, seen) = node(b":1\r\n");
        let mut rl = client(&url);
        let held = lock(&mut rl, b"job", Some(Duration::from_secs(10)));
        let token = held.token_value();
        let items = [Item {
            key: b"job",
            token: &token,
        }];
        acquired(&mut rl, &[Some(41)]);
        let fenced = rl
            .fence_lock(held, &items, false, Instant::now(), 1)
            .expect("a majority confirmed the fence");
        assert_eq!(fenced.fence(), Some(42));
        assert_eq!(with_arg(&seen, b"42"), 1, "the fence is written back once");
        assert_eq!(releases(&seen), 0);
    }

    /// A lock over several resources has its fence written back in one command (one
    /// atomic script), as it was taken.
    #[test]
    fn an_atomic_lock_has_its_fence_written_back_in_one_command() {
        let (url, seen) = node(b":1\r\n");
        let mut rl = client(&url);
        let held = lock(&mut rl, b"a", Some(Duration::from_secs(10)));
        let token = held.token_value();
        let items = [
            Item {
                key: b"a",
                token: &token,
            },
            Item {
                key: b"b",
                token: &token,
            },
        ];
        acquired(&mut rl, &[Some(6)]);
        let fenced = rl
            .fence_lock(held, &items, true, Instant::now(), 1)
            .expect("a majority confirmed the fence");
        assert_eq!(fenced.fence(), Some(7));
        assert_eq!(with_arg(&seen, b"7"), 1, "one command for both keys");
    }

    /// A lock whose validity ran out before a majority confirmed its fence is never
    /// returned: the caller is told it expired, and its key is released.
    #[test]
    fn a_lock_that_expired_before_its_fence_was_confirmed_is_released() {
        let (url, seen) = node(b":1\r\n");
        let mut rl = client(&url);
        let expired = lock(&mut rl, b"job", None);
        let token = expired.token_value();
        let items = [Item {
            key: b"job",
            token: &token,
        }];
        acquired(&mut rl, &[Some(1)]);
        let err = rl
            .fence_lock(expired, &items, false, Instant::now(), 1)
            .expect_err("expired before the fence was confirmed");
        assert!(matches!(err, Error::Expired(_)), "{err:?}");
        assert_eq!(releases(&seen), 1);
    }

    /// A fence a majority refused is never handed out: the lock is unavailable, and
    /// released.
    #[test]
    fn a_lock_whose_fence_a_majority_refused_is_released() {
        let (url, seen) = node(b":0\r\n");
        let mut rl = client(&url);
        let held = lock(&mut rl, b"job", Some(Duration::from_secs(10)));
        let token = held.token_value();
        let items = [Item {
            key: b"job",
            token: &token,
        }];
        acquired(&mut rl, &[None]);
        let err = rl
            .fence_lock(held, &items, false, Instant::now(), 1)
            .expect_err("the fence was refused");
        assert!(matches!(err, Error::Unavailable(_)), "{err:?}");
        assert_eq!(releases(&seen), 1);
    }

    /// A batch: every lock won gets the same fence, above every counter read for any of
    /// them, in one write-back round; errors stay errors; a lock that expired meanwhile
    /// becomes an error and is released, the others are returned fenced.
    #[test]
    fn a_batch_shares_one_fence_above_every_counter_read() {
        let (url, seen) = node(b":1\r\n");
        let mut rl = client(&url);
        let a = lock(&mut rl, b"a", Some(Duration::from_secs(10)));
        let c = lock(&mut rl, b"c", None);
        let d = lock(&mut rl, b"d", Some(Duration::from_secs(10)));
        let (ta, tc, td) = (a.token_value(), c.token_value(), d.token_value());
        let tb = rl.next_token().unwrap();
        let items = [
            Item {
                key: b"a",
                token: &ta,
            },
            Item {
                key: b"b",
                token: &tb,
            },
            Item {
                key: b"c",
                token: &tc,
            },
            Item {
                key: b"d",
                token: &td,
            },
        ];
        let taken = Error::InvalidArgument(ArgumentError::new("resource", "b", "taken"));
        let mut results = vec![Ok(a), Err(taken), Ok(c), Ok(d)];
        acquired(&mut rl, &[Some(5), Some(100), None, Some(9)]);
        rl.fence_batch(&items, &mut results, Instant::now());
        let fences: Vec<_> = results
            .iter()
            .map(|r| r.as_ref().map(|l| l.fence()))
            .collect();
        assert!(matches!(fences[0], Ok(Some(10))), "{fences:?}");
        assert!(matches!(results[1], Err(Error::InvalidArgument(_))));
        assert!(matches!(results[2], Err(Error::Expired(_))), "{results:?}");
        assert!(matches!(fences[3], Ok(Some(10))), "{fences:?}");
        // One command per lock won, each with the one fence.
        assert_eq!(with_arg(&seen, b"10"), 3);
        assert_eq!(releases(&seen), 1, "the expired lock is released");
    }

    /// A batch whose every lock is fenced releases nothing; one that won nothing writes
    /// nothing back.
    #[test]
    fn a_batch_fenced_whole_releases_nothing() {
        let (url, seen) = node(b":1\r\n");
        let mut rl = client(&url);
        let a = lock(&mut rl, b"a", Some(Duration::from_secs(10)));
        let ta = a.token_value();
        let items = [Item {
            key: b"a",
            token: &ta,
        }];
        let mut results = vec![Ok(a)];
        acquired(&mut rl, &[Some(2)]);
        rl.fence_batch(&items, &mut results, Instant::now());
        assert!(
            matches!(&results[0], Ok(l) if l.fence() == Some(3)),
            "{results:?}"
        );
        assert_eq!(releases(&seen), 0);
        let seen_before = seen.lock().unwrap().len();
        let mut lost = vec![Err(Error::InvalidArgument(ArgumentError::new(
            "resource", "a", "taken",
        )))];
        rl.fence_batch(&items, &mut lost, Instant::now());
        assert_eq!(seen.lock().unwrap().len(), seen_before);
    }
}
