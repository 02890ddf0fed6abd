//! Errors that say what happened: each scenario provokes one failure a user meets in the
//! first hour and checks that the error's variant, per-node detail and message are true
//! and specific.

mod common;

use common::impostor::{Act, Impostor};
use common::{Cluster, wait_until};
use quorumlock::{Error, Failure, NodeError, Outcome, Phase, Redlock};
use std::error::Error as _;
use std::time::Duration;

const TTL: Duration = Duration::from_secs(10);

fn client(urls: &[String]) -> Redlock {
    Redlock::builder()
        .nodes(urls)
        .node_timeout(Duration::from_millis(200))
        .connect_timeout(Duration::from_millis(500))
        .retry_count(0)
        .max_backoff(Duration::from_millis(100))
        .build()
        .expect("valid configuration")
}

fn failure(err: &Error) -> &Failure {
    err.failure()
        .unwrap_or_else(|| panic!("no per-node detail: {err:?}"))
}

/// Calls that write nothing: the lock commands each node has run so far.
fn lock_commands(cluster: &Cluster) -> Vec<String> {
    cluster
        .nodes()
        .iter()
        .map(|n| {
            let stats = n.admin().info("commandstats");
            stats
                .lines()
                .filter(|l| {
                    ["cmdstat_set:", "cmdstat_eval:", "cmdstat_evalsha:"]
                        .iter()
                        .any(|c| l.starts_with(c))
                })
                .map(|l| l.split(',').next().unwrap_or("").to_string())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

#[test]
fn taken_on_a_healthy_cluster_reports_no_failure() {
    let cluster = Cluster::start(5);
    let mut a = client(&cluster.urls());
    let mut b = client(&cluster.urls());
    let held = a.lock("errors:taken", TTL).expect("A locks");
    let err = b.try_lock("errors:taken", TTL).expect_err("A holds it");
    let Error::Taken(f) = &err else {
        panic!("wrong error kind: {err:?}");
    };
    let text = err.to_string();
    // Every node is healthy: none may read as failed, whatever the timing.
    assert_eq!(
        f.count(|o| matches!(o, Outcome::Failed(_) | Outcome::NoReply)),
        0,
        "{text}"
    );
    assert!(!text.contains("failed"), "{text}");
    assert!(f.count(|o| *o == Outcome::Held) >= 3, "{text}");
    // Nodes not waited for once a blocking majority said "held" are "not needed".
    let not_needed = f.count(|o| *o == Outcome::NotNeeded);
    assert_eq!(not_needed + f.count(|o| *o == Outcome::Held), 5, "{text}");
    assert_eq!(text.contains("not needed"), not_needed > 0, "{text}");
    assert!(text.contains("held by another client"), "{text}");
    a.unlock(&held).expect("unlock");
}

#[test]
fn extend_after_unlock_says_no_node_holds_the_token() {
    let cluster = Cluster::start(5);
    let mut rl = client(&cluster.urls());
    let mut lock = rl.lock("errors:extend-after-unlock", TTL).expect("lock");
    // The same hold as a second value (as handed over to another process), which the
    // unlock does not mark released: its extend goes to the nodes.
    let mut copy = quorumlock::Lock::from_parts(lock.to_parts()).expect("parts");
    rl.unlock(&lock).expect("unlock");
    // The unlocked value itself is refused without a round.
    let refused = rl.extend(&mut lock, TTL).expect_err("released");
    assert!(matches!(refused, Error::InvalidArgument(_)), "{refused}");
    let mut lock = std::mem::replace(&mut copy, lock);
    let deadline = lock.deadline();
    let err = rl.extend(&mut lock, TTL).expect_err("nothing to extend");
    let Error::Expired(f) = &err else {
        panic!("wrong error kind: {err:?}");
    };
    let text = err.to_string();
    assert!(text.contains("expired"), "{text}");
    // The round is decided once a majority says "not ours"; every node that answered
    // says so (all of them, when all answered before the decision).
    assert!(text.contains("holds this token any more"), "{text}");
    assert!(!text.contains("held by another client"), "{text}");
    assert_eq!(f.op, Phase::Extend);
    assert!(f.count(|o| *o == Outcome::NotHeld) >= 3, "{text}");
    assert!(
        lock.deadline() <= deadline,
        "a failed extend never lengthens"
    );
}

#[test]
fn extend_of_an_expired_lock_says_it_expired_and_sends_nothing() {
    let cluster = Cluster::start(3);
    let mut rl = client(&cluster.urls());
    let mut lock = rl
        .lock("errors:extend-expired", Duration::from_millis(50))
        .expect("lock");
    assert!(wait_until(Duration::from_secs(5), || !lock.is_valid()));
    let before = lock_commands(&cluster);
    let err = rl.extend(&mut lock, TTL).expect_err("expired");
    let Error::Expired(f) = &err else {
        panic!("wrong error kind: {err:?}");
    };
    let text = err.to_string();
    assert!(
        text.contains("the lock expired before the extend"),
        "{text}"
    );
    assert!(!text.contains("0 nodes"), "{text}");
    assert!(f.nodes.is_empty() && f.attempts == 0, "{f:?}");
    assert_eq!(
        lock_commands(&cluster),
        before,
        "an expired lock sends nothing"
    );
}

#[test]
fn a_silent_host_is_connecting_then_timed_out_never_lagging() {
    let cluster = Cluster::start(2);
    let silent = Impostor::start(Act::Silent);
    let mut urls = cluster.urls();
    urls.push(silent.url());
    // Another client holds the key, so every call fails and shows each node's report.
    let mut other = client(&cluster.urls());
    let held = other
        .lock("errors:silent", Duration::from_secs(120))
        .expect("other client locks");
    let mut rl = client(&urls);
    let mut seen = Vec::new();
    // A connection that carries a SET is kept until that SET's ttl has run out (it may
    // be a frozen Redis that will still apply it): short ttls, so the connect timeout
    // shows soon.
    let timed_out = wait_until(Duration::from_secs(30), || {
        let err = rl
            .try_lock("errors:silent", Duration::from_millis(500))
            .expect_err("held elsewhere");
        let report = failure(&err).nodes[2].outcome.clone();
        seen.push(report.to_string());
        match report {
            Outcome::Failed(NodeError::ConnectTimeout) => true,
            Outcome::Failed(NodeError::Down(why)) => *why == NodeError::ConnectTimeout,
            _ => false,
        }
    });
    other.unlock(&held).expect("unlock");
    assert!(timed_out, "never reported a connect timeout: {seen:?}");
    assert!(
        seen.last().is_some_and(|s| s.contains("connect timed out")),
        "{seen:?}"
    );
    assert!(
        silent.accepted() >= 1,
        "the client never reached the silent host"
    );
    assert!(
        seen.iter().all(|s| !s.contains("lagging")),
        "a node that never connected was called lagging: {seen:?}"
    );
}

#[test]
fn a_server_that_is_not_redis_is_named_for_what_it_sent() {
    let cluster = Cluster::start(1);
    let http = Impostor::start(Act::Http);
    let ssh = Impostor::start(Act::SshBanner);
    let urls = vec![cluster.url(0), http.url(), ssh.url()];
    let mut rl = client(&urls);
    let mut last = String::new();
    // The first call may find the impostors still connecting; the verdict follows.
    let named = wait_until(Duration::from_secs(10), || {
        let err = match rl.try_lock("errors:not-redis", TTL) {
            Ok(lock) => panic!("1 real node of 3 granted a lock: {lock:?}"),
            Err(e) => e,
        };
        last = err.to_string();
        let f = failure(&err);
        let said = |node: usize, prefix: &str| match &f.nodes[node].outcome {
            Outcome::Failed(NodeError::NotRedis(s)) => s.starts_with(prefix),
            Outcome::Failed(NodeError::Down(why)) => {
                matches!(&**why, NodeError::NotRedis(s) if s.starts_with(prefix))
            }
            _ => false,
        };
        said(1, "HTTP/1.1 400") && said(2, "SSH-2.0-")
    });
    assert!(named, "{last}");
    assert!(
        last.contains("not a Redis server (it sent 'HTTP/1.1 400"),
        "{last}"
    );
    assert!(!last.contains("unknown reply type byte"), "{last}");
}

#[test]
fn invalid_arguments_write_nothing_to_any_node() {
    let cluster = Cluster::start(3);
    let mut rl = client(&cluster.urls());
    // Warm: connections up, the scripts' first use done.
    let lock = rl.lock("errors:warm", TTL).expect("lock");
    let mut held = rl.lock("errors:args", TTL).expect("lock");
    rl.unlock(&lock).expect("unlock");
    assert!(wait_until(Duration::from_secs(5), || {
        cluster
            .nodes()
            .iter()
            .all(|n| !n.admin().exists("errors:warm"))
    }));
    let before = lock_commands(&cluster);
    let long = vec![b'x'; quorumlock::MAX_RESOURCE + 1];
    let errors = [
        rl.try_lock("errors:args2", Duration::ZERO).unwrap_err(),
        rl.try_lock("errors:args2", Duration::from_millis(2))
            .unwrap_err(),
        rl.lock("errors:args2", Duration::from_secs(25 * 3600))
            .unwrap_err(),
        rl.try_lock("", TTL).unwrap_err(),
        rl.try_lock(&long, TTL).unwrap_err(),
        rl.extend(&mut held, Duration::ZERO).unwrap_err(),
        rl.extend(&mut held, quorumlock::MAX_TTL * 2).unwrap_err(),
    ];
    for e in &errors {
        assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
        assert!(e.to_string().starts_with("invalid argument: "), "{e}");
        assert!(e.source().is_some(), "{e:?}");
    }
    assert!(
        held.is_valid(),
        "a refused extend leaves the lock as it was"
    );
    assert_eq!(
        lock_commands(&cluster),
        before,
        "an invalid call wrote to a node"
    );
    rl.unlock(&held).expect("unlock");
}

#[test]
fn the_io_error_behind_a_failure_is_its_source() {
    let cluster = Cluster::start(1);
    // Two ports nobody listens on: connection refused.
    let dead: Vec<String> = (0..2)
        .map(|_| format!("redis://127.0.0.1:{}", common::free_port()))
        .collect();
    let mut urls = vec![cluster.url(0)];
    urls.extend(dead);
    let mut rl = client(&urls);
    let mut last = None;
    let refused = wait_until(Duration::from_secs(10), || {
        let err = rl.try_lock("errors:source", TTL).expect_err("1 of 3");
        let chain: Vec<String> = std::iter::successors(err.source(), |e| (*e).source())
            .map(|e| e.to_string())
            .collect();
        let found = matches!(err, Error::Unavailable(_))
            && chain.iter().any(|s| s.to_lowercase().contains("refused"));
        last = Some((err, chain));
        found
    });
    assert!(refused, "no I/O error in the source chain: {last:?}");
}

#[test]
fn a_failure_shows_its_resource_as_text() {
    let cluster = Cluster::start(3);
    let mut a = client(&cluster.urls());
    let mut b = client(&cluster.urls());
    let name: &[u8] = b"errors:\n\x00bin\xff";
    let held = a.lock(name, TTL).expect("lock");
    let err = b.try_lock(name, TTL).expect_err("held");
    let debug = format!("{err:?}");
    assert!(
        debug.contains(r#"resource: "errors:\n\x00bin\xff""#),
        "{debug}"
    );
    assert!(
        !debug.contains("101, 114, 114"),
        "bytes shown as numbers: {debug}"
    );
    // Neither the error nor the locks print a whole token.
    let token = String::from_utf8(held.token().to_vec()).unwrap();
    assert!(!format!("{held:?} {err:?} {err}").contains(&token));
    a.unlock(&held).expect("unlock");
}

/// A server that runs no Lua scripts (here `EVAL` and `EVALSHA` renamed away; Garnet
/// without `--lua` says so in other words) takes a plain lock but cannot release it: the
/// unlock's error says plainly, per node, that the server runs no scripts.
#[test]
fn a_server_without_scripting_is_reported_as_such() {
    let options = common::NodeOptions {
        extra_args: [
            "--rename-command",
            "EVAL",
            "",
            "--rename-command",
            "EVALSHA",
            "",
        ]
        .map(String::from)
        .to_vec(),
        ..common::NodeOptions::default()
    };
    let cluster = Cluster::start_with(3, &options);
    let mut rl = client(&cluster.urls());
    let lock = rl
        .lock("noscript", TTL)
        .expect("a plain SET NX needs no script");
    let err = rl
        .unlock(&lock)
        .expect_err("no node can run the release script");
    let f = failure(&err);
    assert_eq!(f.op, Phase::Release);
    // Decided once too many had failed: a majority says it, the rest were not needed.
    let off = f.count(|o| matches!(o, Outcome::Failed(NodeError::ScriptingOff(_))));
    let not_needed = f.count(|o| matches!(o, Outcome::NotNeeded));
    assert!(
        off >= f.quorum && off + not_needed == f.nodes.len(),
        "{f:?}"
    );
    let text = err.to_string();
    assert!(text.contains("runs no Lua scripts"), "{text}");
}
