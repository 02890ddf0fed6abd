//! What `run` says when it stops the command: why, and since when, each line stamped
//! with the wall-clock time in RFC 3339 UTC.
//!
//! The library's `Lease` says only that it is lost, and how much validity is left. The
//! detail comes from an [`Observer`] installed on the client ([`Renewals`]): every
//! acquire and extend round of the lease reports each node's answer, and every node's
//! connection reports going down or coming back. It records, per node, since when its
//! renewals have failed in a row and why the last one did, and when the last renewal a
//! majority confirmed was.
//!
//! # Invariants
//!
//! - The observer runs on the client's loop thread: it only takes a short mutex and
//!   copies a few strings (no I/O, no call into the client).
//! - Nodes are shown by their endpoint's `Display`, which masks passwords; no token is
//!   ever recorded.

use crate::args::show;
use quorumlock::{Decision, NodeChange, NodeEvent, Observer, Outcome, Phase, RoundEvent};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// One node as the lease's rounds saw it.
#[derive(Default, Clone)]
struct NodeLog {
    /// The endpoint, password masked.
    shown: String,
    /// The first of the failed renewals in a row (none while it renews).
    failing_since: Option<Instant>,
    failures: u32,
    /// Why the last renewal failed there.
    last_failure: String,
    /// Down since, and why (the connection's own report).
    down: Option<(Instant, String)>,
}

#[derive(Default)]
struct State {
    /// The start of the last acquire or extend a majority confirmed: the validity of
    /// the current term counts from there.
    last_won: Option<Instant>,
    /// The last round that a majority did not confirm: its start and decision.
    last_failed: Option<(Instant, Decision)>,
    nodes: Vec<NodeLog>,
}

/// The observer that gathers the renewals' story (see the module docs).
#[derive(Default)]
pub struct Renewals {
    state: Mutex<State>,
}

impl Renewals {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn log_of<'a>(
        state: &'a mut State,
        index: usize,
        shown: &dyn std::fmt::Display,
    ) -> &'a mut NodeLog {
        if state.nodes.len() <= index {
            state.nodes.resize(index + 1, NodeLog::default());
        }
        let log = &mut state.nodes[index];
        if log.shown.is_empty() {
            log.shown = shown.to_string();
        }
        log
    }

    /// Whether every renewal so far was won: then the lease can only be lost by its
    /// deadline passing, not by a takeover or a failure.
    pub fn all_won(&self) -> bool {
        self.state().last_failed.is_none()
    }

    /// The lines that say why the command is stopped, `why` first; each starts with
    /// `quorumlock: ` and the first with the time.
    pub fn stop_lines(&self, why: &str, deadline: Instant) -> Vec<String> {
        let now = Instant::now();
        let mut lines = vec![format!("quorumlock: {}: {why}", stamp(now))];
        let state = self.state();
        match state.last_won {
            Some(at) => lines.push(format!(
                "quorumlock:   last renewal a majority confirmed: started {} ({} ago); \
                 validity deadline {}",
                stamp(at),
                show(now.saturating_duration_since(at)),
                stamp(deadline)
            )),
            None => lines.push(format!(
                "quorumlock:   validity deadline {}",
                stamp(deadline)
            )),
        }
        if let Some((at, decision)) = state.last_failed {
            let what = match decision {
                Decision::Taken => {
                    "a majority no longer holds this lock's token (taken over, \
                                    or expired there)"
                }
                Decision::Unavailable => "too few nodes answered",
                Decision::Expired => "confirmed too late: no validity left",
                _ => "not confirmed",
            };
            lines.push(format!(
                "quorumlock:   last renewal that failed: started {}: {what}",
                stamp(at)
            ));
        }
        for (i, node) in state.nodes.iter().enumerate() {
            let mut line = format!("quorumlock:   node {i} {}: ", node.shown);
            match (node.failing_since, &node.down) {
                (Some(since), _) => line.push_str(&format!(
                    "renewals failing since {} ({} in a row), last: {}",
                    stamp(since),
                    node.failures,
                    node.last_failure
                )),
                (None, _) => line.push_str("renewing"),
            }
            if let Some((since, why)) = &node.down {
                line.push_str(&format!("; down since {}: {why}", stamp(*since)));
            }
            lines.push(line);
        }
        lines
    }
}

impl Observer for Renewals {
    fn round(&self, e: &RoundEvent<'_>) {
        if !matches!(e.phase(), Phase::Acquire | Phase::Extend) {
            return;
        }
        let mut state = self.state();
        let at = e.started_at();
        if e.decision() == Decision::Won {
            state.last_won = Some(at);
        }
        // Only renewals count for the rest: an acquire's refusals (while waiting for the
        // lock) are no failure of the lease.
        if e.phase() != Phase::Extend {
            return;
        }
        if e.decision() != Decision::Won {
            state.last_failed = Some((at, e.decision()));
        }
        for n in e.nodes() {
            let log = Renewals::log_of(&mut state, n.index(), n.endpoint());
            match n.outcome() {
                Outcome::Locked => {
                    log.failing_since = None;
                    log.failures = 0;
                }
                Outcome::NotNeeded => {}
                failed => {
                    log.failing_since.get_or_insert(at);
                    log.failures += 1;
                    log.last_failure = failed.to_string();
                }
            }
        }
    }

    fn node(&self, e: &NodeEvent<'_>) {
        let mut state = self.state();
        let log = Renewals::log_of(&mut state, e.index(), e.endpoint());
        match e.change() {
            NodeChange::Down(why) => {
                let why = why.to_string();
                match &mut log.down {
                    Some((_, last)) => *last = why,
                    None => log.down = Some((Instant::now(), why)),
                }
            }
            NodeChange::Connected { .. } | NodeChange::CaughtUp => log.down = None,
            _ => {}
        }
    }
}

/// `at` on the wall clock, RFC 3339 in UTC with milliseconds
/// (`2026-01-31T12:00:00.123Z`).
pub fn stamp(at: Instant) -> String {
    let (wall, now) = (SystemTime::now(), Instant::now());
    let wall = if at <= now {
        wall.checked_sub(now - at)
    } else {
        wall.checked_add(at - now)
    };
    let since_epoch = wall
        .and_then(|w| w.duration_since(UNIX_EPOCH).ok())
        .unwrap_or(Duration::ZERO);
    rfc3339(since_epoch)
}

/// Time since the Unix epoch as RFC 3339 UTC with milliseconds.
fn rfc3339(since_epoch: Duration) -> String {
    let secs = since_epoch.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        since_epoch.subsec_millis()
    )
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_dates() {
        assert_eq!(rfc3339(Duration::ZERO), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            rfc3339(Duration::from_millis(951_782_400_123)),
            "2000-02-29T00:00:00.123Z"
        );
        assert_eq!(
            rfc3339(Duration::from_secs(1_735_689_599)),
            "2024-12-31T23:59:59.000Z"
        );
        assert_eq!(
            rfc3339(Duration::from_secs(4_102_444_800)),
            "2100-01-01T00:00:00.000Z"
        );
    }
}
