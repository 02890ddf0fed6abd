//! `run`: the command under a lease, stopped before the lease can expire under it.
//!
//! # The stop rule
//!
//! The lease's loop extends it every ttl/3 and reports it lost; this module only
//! watches. Let `S = kill_after + node_timeout`. The command's process group gets
//! SIGTERM as soon as the lease is lost or `lease.remaining() <= S + S/4` (the stop
//! line), and SIGKILL `kill_after` later: with `node_timeout + S/4` of validity left.
//! The SIGKILL's time is also capped by the deadline itself: it goes no later than
//! `node_timeout + S/4` before it, so a watcher that woke late (its step is at most
//! `S/8`, 50 ms; a loaded machine may add more), or a deadline moved earlier by a failed
//! extend, shortens the TERM→KILL window instead of pushing the SIGKILL past the
//! deadline; with no validity left to wait in, SIGKILL goes at once. A healthy lease
//! never reaches the stop line: at each extend about `2/3·ttl − drift` remains, which
//! [`check_rule`] requires to be at least `1.5·S` (or `ttl ≥ 3·S`).
//!
//! All of that needs this process to run. Should it be stopped (SIGSTOP to it or to its
//! process group) or its loop stall, the watchdog process kills the group by itself at
//! the backstop, half the spare before the deadline (after this process's own SIGKILL
//! would have landed): the watcher moves the backstop with the deadline on every pass,
//! in memory the two share (`Watchdog::kill_by`), and the run exits 70 if the watchdog
//! killed the command. A pause of the whole machine, or of both processes (a cgroup
//! freeze), is beyond it.
//!
//! A command that ended on its own while this process could not watch keeps its own
//! status only if it ended inside the lock's validity: the watchdog notes the moment it
//! saw the command exit (`Watchdog::exited_at`, never earlier than the exit), and the
//! status stands when that is before the backstop of the deadline last seen and every
//! renewal was won (so that only the deadline can have ended the lease). Otherwise a
//! lease found lost at the reap counts as lost while the command ran (exit 70).

use crate::args::{Args, Wait, show};
use crate::report::Renewals;
use crate::sys::{self, Signals, Watchdog};
use crate::{EX_LOST, EX_OSERR, failure_code};
use quorumlock::{Error, Lease, LostReason, SharedRedlock};
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// How long after the SIGKILL quorumlock waits for the command to be reaped before it
/// gives up on its status (a process stuck in the kernel).
const REAP_GRACE: Duration = Duration::from_secs(5);

/// The line `lease.remaining()` must stay above while the command runs.
pub fn stop_line(kill_after: Duration, timeout: Duration) -> Duration {
    let s = kill_after.saturating_add(timeout);
    s.saturating_add(s / 4)
}

/// Refuses settings under which a healthy lease would cross the stop line, or the ttl
/// could not cover `kill_after`. Accepts every `ttl >= 3 × (kill_after + timeout)`.
pub fn check_rule(
    ttl: Duration,
    kill_after: Duration,
    timeout: Duration,
    drift_factor: f64,
) -> Result<(), String> {
    let s = kill_after.saturating_add(timeout);
    if ttl >= s.saturating_mul(3) {
        return Ok(());
    }
    let drift = ttl.mul_f64(drift_factor) + Duration::from_millis(2);
    let healthy_low = (ttl * 2 / 3).saturating_sub(drift);
    if ttl > kill_after && healthy_low >= s.saturating_mul(3) / 2 {
        return Ok(());
    }
    // Every way out, with values that work with the other settings as given (by the
    // 3 x rule, which always suffices).
    let third = ttl / 3;
    let mut alone = Vec::new();
    if third > timeout {
        alone.push(format!(
            "--kill-after {} or less with this node timeout",
            show(third - timeout)
        ));
    }
    if third > kill_after {
        alone.push(format!(
            "--node-timeout {} or less with this kill-after",
            show(third - kill_after)
        ));
    }
    let alone = if alone.is_empty() {
        String::new()
    } else {
        format!(": {}", alone.join("; "))
    };
    Err(format!(
        "--ttl {} is too short for --kill-after {} and --node-timeout {}: the command would \
         be stopped with the lock healthy, or killed after the lock expired. Use a longer \
         --ttl ({} or more: 3 x (kill-after + node-timeout)), or a shorter --kill-after \
         and/or a shorter --node-timeout (together at most {}, a third of the ttl{alone}); \
         see the stop rule in --help",
        show(ttl),
        show(kill_after),
        show(timeout),
        show(s.saturating_mul(3)),
        show(third),
    ))
}

/// Why the command was stopped.
enum Stop {
    /// The lease is lost, or fell to the stop line: exit `EX_LOST`.
    Lease,
    /// The command exited; what it left in its group is being stopped.
    Leftovers,
}

struct Stopping {
    why: Stop,
    kill_at: Instant,
    /// Set when the SIGKILL went: the moment to stop waiting for the command.
    give_up: Option<Instant>,
}

pub fn run(
    args: &Args,
    builder: quorumlock::Builder,
    renewals: &Renewals,
    resource: &str,
    command: &[String],
) -> u8 {
    // Before any thread exists: the fork must copy a single-threaded process.
    let mut watchdog = match Watchdog::start() {
        Ok(w) => w,
        Err(e) => return os_error(&e),
    };
    sys::become_subreaper();
    let signals = match Signals::install() {
        Ok(s) => s,
        Err(e) => return os_error(&e),
    };
    let code = match builder.build_shared() {
        Ok(shared) => with_client(
            args,
            &shared,
            &signals,
            &mut watchdog,
            renewals,
            resource,
            command,
        ),
        Err(e) => {
            eprintln!("quorumlock: {e}");
            failure_code(&e, args.conflict_code)
        }
    };
    watchdog.disarm();
    code
}

/// What the command finds in its environment about its lock: `QUORUMLOCK_RESOURCE`,
/// `QUORUMLOCK_TOKEN_PREFIX` (the token's first 8 characters, as logs and `Debug`
/// show it: the whole token is a credential and never leaves this process) and
/// `QUORUMLOCK_FENCE` when fenced. `None` removes a variable: a `QUORUMLOCK_FENCE` the
/// command would inherit from an outer `quorumlock run` is not this lock's.
fn child_env(resource: &str, lease: &Lease) -> Vec<(&'static str, Option<String>)> {
    let token = lease.token();
    let prefix = String::from_utf8_lossy(&token[..token.len().min(8)]).into_owned();
    vec![
        ("QUORUMLOCK_RESOURCE", Some(resource.to_string())),
        ("QUORUMLOCK_TOKEN_PREFIX", Some(prefix)),
        ("QUORUMLOCK_FENCE", lease.fence().map(|f| f.to_string())),
    ]
}

fn os_error(e: &std::io::Error) -> u8 {
    eprintln!("quorumlock: {e}");
    EX_OSERR
}

fn with_client(
    args: &Args,
    shared: &SharedRedlock,
    signals: &Signals,
    watchdog: &mut Watchdog,
    renewals: &Renewals,
    resource: &str,
    command: &[String],
) -> u8 {
    let lease = match acquire(args, shared, signals, resource) {
        Ok(lease) => lease,
        Err(code) => return code,
    };
    // The backstop is set before anything of the command runs.
    let rule = Rule::new(args.kill_after, args.node_timeout);
    watchdog.kill_by(Some(rule.backstop(Instant::now() + lease.remaining())));
    let pid = match sys::spawn(command, &child_env(resource, &lease), watchdog) {
        Ok(pid) => pid,
        Err(e) => {
            eprintln!("quorumlock: cannot run {:?}: {e}", command[0]);
            let _ = lease.blocking_release();
            return match e.kind() {
                std::io::ErrorKind::NotFound => 127,
                _ => 126,
            };
        }
    };
    let code = supervise(&rule, &lease, signals, watchdog, renewals, pid);
    // The group is gone: nothing is left for the watchdog to watch (and its pgid may be
    // reused by another group from now on).
    watchdog.kill_by(None);
    watchdog.disarm();
    if let Err(e) = lease.blocking_release() {
        eprintln!("quorumlock: releasing {resource:?}: {e}");
    }
    code
}

/// Acquires the lease as `-n` / `-w` / the default ask, giving up (128 + n) if a
/// forwarded signal arrives meanwhile: the dropped acquisition is released in the
/// background by the client.
///
/// The first attempt decides whether there is anything to wait for: only a lock held
/// by another client is waited for (with the library's waiting path, woken by the
/// holder's release notice); a first attempt that finds too few nodes answering fails
/// at once (69), since a wrong `--nodes` is not something waiting cures. Once waiting,
/// nodes that stop answering are retried until the wait ends.
fn acquire(
    args: &Args,
    shared: &SharedRedlock,
    signals: &Signals,
    resource: &str,
) -> Result<Lease, u8> {
    let waker = signals.waker();
    let mut cx = Context::from_waker(&waker);
    let start = Instant::now();
    let first = block_on(shared.lease(resource, args.ttl), signals, &mut cx);
    let result = match (first, args.wait) {
        (Ok(Err(Error::Taken(_))), Wait::Within(wait)) => {
            // The bound counts from the start: the first attempt's time is part of it.
            let left = wait.saturating_sub(start.elapsed());
            block_on(
                shared.lease_within(resource, args.ttl, left),
                signals,
                &mut cx,
            )
        }
        (Ok(Err(Error::Taken(_))), Wait::Forever) => block_on(
            shared.lease_within(resource, args.ttl, Duration::MAX),
            signals,
            &mut cx,
        ),
        (first, _) => first,
    };
    match result {
        Err(sig) => {
            eprintln!("quorumlock: got signal {sig} while acquiring {resource:?}; nothing was run");
            Err(128 + sig as u8)
        }
        Ok(Err(e)) => {
            match (&e, args.wait) {
                (Error::Taken(_), Wait::Within(wait)) => eprintln!(
                    "quorumlock: {e}; gave up after {} (-w {})",
                    show(start.elapsed()),
                    show(wait)
                ),
                _ => eprintln!("quorumlock: {e}"),
            }
            Err(failure_code(&e, args.conflict_code))
        }
        Ok(Ok(lease)) => Ok(lease),
    }
}

/// Polls `fut` on this thread until it is ready, or until a forwarded signal arrives
/// (`Err(signal)`; the future is dropped, which cancels it).
fn block_on<T>(
    fut: impl Future<Output = T>,
    signals: &Signals,
    cx: &mut Context<'_>,
) -> Result<T, i32> {
    let mut fut = pin!(fut);
    loop {
        if let Poll::Ready(out) = fut.as_mut().poll(cx) {
            return Ok(out);
        }
        if let Some(&sig) = signals.take().first() {
            return Err(sig);
        }
        // Woken by the future's waker or a signal; the timeout is only a backstop.
        signals.wait(Duration::from_secs(1));
    }
}

/// The stop rule's numbers for one run (see the module docs).
#[derive(Clone, Copy)]
struct Rule {
    kill_after: Duration,
    /// SIGTERM when the remaining validity falls to this.
    line: Duration,
    /// The validity the SIGKILL must leave: `line − kill_after` (`timeout + S/4`).
    spare: Duration,
    /// The longest the watcher sleeps between two looks at the lease.
    step: Duration,
}

impl Rule {
    fn new(kill_after: Duration, timeout: Duration) -> Rule {
        let s = kill_after.saturating_add(timeout);
        let line = stop_line(kill_after, timeout);
        Rule {
            kill_after,
            line,
            spare: line.saturating_sub(kill_after),
            step: (s / 8).clamp(Duration::from_millis(1), Duration::from_millis(50)),
        }
    }

    /// When the watchdog kills the group by itself if this process has not acted: half
    /// the spare before `deadline`, after the SIGKILL this process sends on time (the
    /// spare before it), so it never cuts the SIGTERM's grace short; and before the
    /// deadline by half the spare less the watchdog's own lateness (it sleeps at most
    /// 20 ms at a time, which the kernel may end some 20 µs late; a loaded machine adds
    /// its scheduling delay).
    fn backstop(&self, deadline: Instant) -> Instant {
        deadline.checked_sub(self.spare / 2).unwrap_or(deadline)
    }

    /// When the SIGKILL of a stop begun `now` is due: `kill_after` later, or earlier if
    /// that is needed to leave `spare` before `deadline` (the watcher woke late, the
    /// machine is loaded, or the deadline moved earlier); `now` itself at the latest.
    fn kill_at(&self, now: Instant, deadline: Instant) -> Instant {
        let by_deadline = deadline.checked_sub(self.spare).unwrap_or(now).max(now);
        now.checked_add(self.kill_after)
            .map_or(by_deadline, |t| t.min(by_deadline))
    }
}

/// Runs until the command (pid = pgid) has exited and its group is empty, stopping it
/// by the stop rule and forwarding signals; returns the exit code.
fn supervise(
    rule: &Rule,
    lease: &Lease,
    signals: &Signals,
    watchdog: &Watchdog,
    renewals: &Renewals,
    pid: u32,
) -> u8 {
    let waker = signals.waker();
    let mut cx = Context::from_waker(&waker);
    let mut lost = pin!(lease.lost());
    let mut status: Option<u8> = None;
    let mut lost_while_running = false;
    // The command was killed by the watchdog at the backstop (not just ended meanwhile).
    let mut killed_by_watchdog = false;
    let mut stopping: Option<Stopping> = None;
    // The lease's local validity deadline as last seen while it was not lost (a lost
    // lease reports no remaining validity): what the SIGKILL must precede.
    let mut deadline = Instant::now() + lease.remaining();
    loop {
        for (p, code) in sys::reap() {
            if p == pid {
                status = Some(code);
                // The command ran to its end: was the lease still good all along? Killed
                // by the watchdog at the backstop, it was ended by the rule: this loop
                // did not act in time (it was stopped, or stalled).
                let by_watchdog = watchdog.fired() && i32::from(code) == 128 + sys::SIGKILL;
                // Lost by now, but maybe only since the command ended: when every renewal
                // was won (the lease can only have run out at its deadline) and the
                // watchdog saw the command exit before the backstop of that deadline (as
                // last seen; the backstop's margin covers a deadline moved earlier that
                // this loop has not seen yet), the command ended inside the lock's
                // validity though this loop learns it late (it was stopped, or stalled).
                let ended_in_time = renewals.all_won()
                    && watchdog
                        .exited_at()
                        .is_some_and(|exit| exit < rule.backstop(deadline));
                if stopping.is_none() && (by_watchdog || (lease.is_lost() && !ended_in_time)) {
                    lost_while_running = true;
                    killed_by_watchdog = by_watchdog;
                }
            }
        }
        for sig in signals.take() {
            sys::signal_group(pid, sig);
        }
        let now = Instant::now();
        let is_lost = lost.as_mut().poll(&mut cx).is_ready() || lease.is_lost();
        let remaining = if is_lost {
            deadline.saturating_duration_since(now)
        } else {
            let r = lease.remaining();
            deadline = now + r;
            r
        };
        // Each extend moves the deadline (a failed one may move it earlier): the
        // watchdog follows, so that it kills the group by itself should this loop stop
        // running (SIGSTOP, a stall). A store to shared memory, every pass.
        watchdog.kill_by(Some(rule.backstop(deadline)));
        // Anything of the group still running while the lease is lost or at the stop
        // line is stopped by the rule, also what the command left behind when it exited.
        let group_running = status.is_none()
            || matches!(
                stopping,
                Some(Stopping {
                    why: Stop::Leftovers,
                    ..
                })
            );
        let lease_stopping = matches!(
            stopping,
            Some(Stopping {
                why: Stop::Lease,
                ..
            })
        );
        if group_running && !lease_stopping && (is_lost || remaining <= rule.line) {
            let why = if is_lost {
                // Why, as the library saw it, in a word: the per-node detail of the
                // renewals follows in the report's own lines.
                let reason = match lease.lost_reason() {
                    Some(LostReason::TakenOver { .. }) => " (taken over)",
                    Some(LostReason::TooFewNodes { .. }) => {
                        " (too few nodes answered its renewals in time)"
                    }
                    Some(LostReason::Expired { .. }) => {
                        " (expired: no renewal succeeded before its deadline)"
                    }
                    Some(LostReason::MaxHold) => " (the maximum hold was reached)",
                    _ => "",
                };
                format!("the lock was lost{reason}; stopping the command")
            } else {
                format!(
                    "the lock's validity fell to {} (stop line {}); stopping the command",
                    show(remaining),
                    show(rule.line)
                )
            };
            let why = format!(
                "{why} (SIGTERM to its process group, SIGKILL {} later at the latest)",
                show(rule.kill_at(now, deadline).saturating_duration_since(now))
            );
            for line in renewals.stop_lines(&why, deadline) {
                eprintln!("{line}");
            }
            stopping = Some(match stopping.take() {
                // Its SIGTERM went already: only the SIGKILL may have to come sooner.
                Some(st) => Stopping {
                    why: Stop::Lease,
                    ..st
                },
                None => begin_stop(pid, Stop::Lease, rule, now, deadline),
            });
        }
        if status.is_some() && stopping.is_none() {
            if !sys::group_alive(pid) {
                break;
            }
            eprintln!(
                "quorumlock: the command exited but left processes in its group; stopping them"
            );
            stopping = Some(begin_stop(pid, Stop::Leftovers, rule, now, deadline));
        }
        if let Some(st) = &mut stopping {
            if st.give_up.is_none() {
                // The deadline may have moved earlier since the SIGTERM.
                st.kill_at = st.kill_at.min(rule.kill_at(now, deadline));
                if now >= st.kill_at {
                    sys::signal_group(pid, sys::SIGKILL);
                    st.give_up = Some(now + REAP_GRACE);
                }
            }
            if status.is_some() && !sys::group_alive(pid) {
                break;
            }
            if st.give_up.is_some_and(|g| now >= g) {
                eprintln!("quorumlock: the command did not go after SIGKILL; leaving it");
                break;
            }
        }
        // Sleep until the next thing to do: a signal, the lease's loss (its future's
        // waker), the stop line, the SIGKILL; at most one step.
        let mut next = rule.step;
        if stopping.is_none() {
            next = next.min(remaining.saturating_sub(rule.line));
        }
        if let Some(st) = &stopping {
            if st.give_up.is_none() {
                next = next.min(st.kill_at.saturating_duration_since(now));
            }
        }
        signals.wait(next);
    }
    match stopping {
        Some(Stopping {
            why: Stop::Lease, ..
        }) => EX_LOST,
        _ if lost_while_running => {
            if killed_by_watchdog {
                let why = "quorumlock could not act in time (stopped, or stalled): its \
                           watchdog killed the command before the lock's validity ran out";
                for line in renewals.stop_lines(why, deadline) {
                    eprintln!("{line}");
                }
            } else {
                let why = "the lock was lost before the command finished (it ended while \
                           quorumlock could not watch)";
                for line in renewals.stop_lines(why, deadline) {
                    eprintln!("{line}");
                }
            }
            EX_LOST
        }
        _ => status.unwrap_or(EX_LOST),
    }
}

/// SIGTERM to the group, or SIGKILL at once when `kill_after` is zero or no validity
/// is left to wait in.
fn begin_stop(pid: u32, why: Stop, rule: &Rule, now: Instant, deadline: Instant) -> Stopping {
    let kill_at = rule.kill_at(now, deadline);
    let at_once = kill_at <= now;
    sys::signal_group(pid, if at_once { sys::SIGKILL } else { sys::SIGTERM });
    Stopping {
        why,
        kill_at,
        give_up: at_once.then(|| now + REAP_GRACE),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_rule_accepts_three_times_kill_after_plus_timeout_and_refuses_ttl_up_to_kill_after() {
        for kill_after in [0, 1, 10, 500, 2_000, 60_000] {
            for timeout in [1, 50, 200, 1_000, 30_000] {
                let (k, t) = (kill_after * MS, timeout * MS);
                let s = k + t;
                for ttl in [3 * s, 3 * s + MS, 4 * s, 10 * s] {
                    assert!(check_rule(ttl, k, t, 0.01).is_ok(), "{ttl:?} {k:?} {t:?}");
                }
                for ttl in [MS, k / 2, k, k + MS] {
                    if ttl <= k && !ttl.is_zero() {
                        assert!(check_rule(ttl, k, t, 0.01).is_err(), "{ttl:?} {k:?} {t:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn a_ttl_too_short_names_every_way_out_with_values_that_work() {
        let (ttl, k, t) = (6000 * MS, 2000 * MS, 1000 * MS);
        let e = check_rule(ttl, k, t, 0.01).unwrap_err();
        for needle in [
            "a longer --ttl (9s or more",
            "a shorter --kill-after and/or a shorter --node-timeout (together at most 2s",
            "--kill-after 1s or less with this node timeout",
        ] {
            assert!(e.contains(needle), "{needle:?} in {e}");
        }
        // ttl/3 = kill-after: no node timeout alone would do; not offered.
        assert!(!e.contains("--node-timeout 0"), "{e}");
        assert!(check_rule(9000 * MS, k, t, 0.01).is_ok());
        assert!(check_rule(ttl, 1000 * MS, t, 0.01).is_ok());
        let e = check_rule(ttl, 1500 * MS, 1500 * MS, 0.01).unwrap_err();
        assert!(e.contains("--kill-after 500ms or less"), "{e}");
        assert!(e.contains("--node-timeout 500ms or less"), "{e}");
        assert!(check_rule(ttl, 1500 * MS, 500 * MS, 0.01).is_ok());
        assert!(check_rule(ttl, 500 * MS, 1500 * MS, 0.01).is_ok());
    }

    #[test]
    fn the_sigkill_lands_kill_after_later_or_sooner_but_never_past_the_spare() {
        let rule = Rule::new(Duration::from_secs(1), Duration::from_secs(1));
        assert_eq!(rule.line, 2500 * MS);
        assert_eq!(rule.spare, 1500 * MS);
        assert_eq!(rule.step, 50 * MS);
        let now = Instant::now();
        // Woken on time: kill_after later, the spare left.
        assert_eq!(rule.kill_at(now, now + rule.line), now + rule.kill_after);
        // Woken 300 ms late: the window shrinks, the SIGKILL still leaves the spare.
        let deadline = now + rule.line - 300 * MS;
        assert_eq!(rule.kill_at(now, deadline), deadline - rule.spare);
        // Less than the spare left (or the deadline passed): at once.
        assert_eq!(rule.kill_at(now, now + MS), now);
        assert_eq!(rule.kill_at(now + MS, now), now + MS);
        // kill_after 0: at once whatever is left.
        let at_once = Rule::new(Duration::ZERO, 200 * MS);
        assert_eq!(at_once.kill_at(now, now + Duration::from_secs(60)), now);
    }
}
