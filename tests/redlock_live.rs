//! The public API against real redis-server processes: the happy paths, contention,
//! binary names, authentication, unix sockets, batches and every configuration error.
//! (Faults live in faults.rs, hostile servers in hostile.rs.)

mod common;

use common::{Cluster, NodeOptions, wait_until};
use quorumlock::{Error, Lock, Outcome, Redlock};
use std::time::Duration;

/// Healthy nodes only: a generous `node_timeout`, so that on a loaded machine a healthy
/// node is never taken for one that timed out.
fn client(cluster: &Cluster) -> Redlock {
    Redlock::builder()
        .nodes(cluster.urls())
        .node_timeout(Duration::from_secs(2))
        .retry_count(0)
        .build()
        .expect("valid settings")
}

fn client_timing_out_after(cluster: &Cluster, node_timeout: Duration) -> Redlock {
    Redlock::builder()
        .nodes(cluster.urls())
        .node_timeout(node_timeout)
        .build()
        .expect("valid settings")
}

/// The value stored under `key` on every node.
fn values(cluster: &Cluster, key: &[u8]) -> Vec<Option<Vec<u8>>> {
    (0..cluster.len())
        .map(|i| cluster.node(i).admin().get(key))
        .collect()
}

/// Waits (bounded) until every node stores `want` under `key`: calls return at a quorum,
/// so the last nodes may apply the command a moment later.
fn wait_values(cluster: &Cluster, key: &[u8], want: Option<&[u8]>) {
    assert!(
        wait_until(Duration::from_secs(10), || values(cluster, key)
            .iter()
            .all(|v| v.as_deref() == want)),
        "not every node has {want:?} under {key:?}: {:?}",
        values(cluster, key)
    );
}

/// Unlocks a lock every node took, and checks it everywhere: `unlock` returns once a
/// majority has answered (issue #9), so its count is what was confirmed by then (at least
/// the quorum, as every node held the key; the other deletes are still in flight), and
/// which nodes deleted the key is seen on the nodes: all of them, within a deadline.
fn unlock_everywhere(cluster: &Cluster, rl: &mut Redlock, lock: &Lock) {
    wait_values(cluster, lock.resource(), Some(lock.token()));
    let released = rl.unlock(lock).expect("unlock");
    assert!(
        released >= rl.quorum() && released <= cluster.len(),
        "released on {released} of {}",
        cluster.len()
    );
    wait_values(cluster, lock.resource(), None);
}

/// `calls` of `cmdstat_<command>` in `INFO commandstats` on every node.
fn calls(cluster: &Cluster, command: &str) -> Vec<u64> {
    (0..cluster.len())
        .map(|i| {
            cluster
                .node(i)
                .admin()
                .info_field("commandstats", &format!("cmdstat_{command}"))
                .and_then(|v| {
                    v.split(',')
                        .find_map(|kv| kv.strip_prefix("calls="))
                        .and_then(|n| n.parse().ok())
                })
                .unwrap_or(0)
        })
        .collect()
}

#[test]
fn acquire_extend_release_on_five_nodes() {
    let cluster = Cluster::start(5);
    let mut rl = client(&cluster);
    let ttl = Duration::from_secs(10);
    let mut lock = rl.lock("orders:42", ttl).expect("free lock");
    assert_eq!(lock.resource(), b"orders:42");
    assert!(lock.is_valid());
    assert!(
        lock.remaining() <= ttl - Duration::from_millis(102),
        "drift is subtracted"
    );
    assert!(lock.remaining() > ttl - Duration::from_millis(500));
    // The token reaches every node, with the ttl. The call returns at a quorum, so the
    // last nodes may take a moment longer (a connection still opening, say).
    assert!(
        common::wait_until(Duration::from_secs(5), || {
            values(&cluster, b"orders:42")
                .iter()
                .all(|v| v.as_deref() == Some(lock.token()))
        }),
        "{:?}",
        values(&cluster, b"orders:42")
    );
    let pttl = cluster.node(0).admin().pttl("orders:42");
    assert!(pttl > 9_000 && pttl <= 10_000, "pttl {pttl}");

    rl.extend(&mut lock, Duration::from_secs(30))
        .expect("extend a held lock");
    assert!(lock.remaining() > Duration::from_secs(29));
    assert!(
        common::wait_until(Duration::from_secs(5), || cluster
            .node(3)
            .admin()
            .pttl("orders:42")
            > 29_000),
        "extend reached the nodes"
    );

    unlock_everywhere(&cluster, &mut rl, &lock);
}

#[test]
fn a_second_client_is_refused_while_held_and_gets_it_after_unlock_and_after_expiry() {
    let cluster = Cluster::start(5);
    let mut a = client(&cluster);
    let mut b = client(&cluster);
    let lock = a.lock("jobs:report", Duration::from_secs(5)).unwrap();
    // A's call returned at a quorum: let its SET reach the last nodes too, so B meets A's
    // key everywhere.
    wait_values(&cluster, b"jobs:report", Some(lock.token()));
    let evals = calls(&cluster, "eval");

    match b.try_lock("jobs:report", Duration::from_secs(5)) {
        Err(Error::Taken(f)) => {
            assert!(f.count(|o| *o == Outcome::Held) >= 3, "{f}");
            assert_eq!(f.quorum, 3);
            assert_eq!(f.nodes.len(), 5);
        }
        other => panic!("expected Taken, got {other:?}"),
    }
    // The refused attempt sends its compare-and-delete (EVAL) to every node it wrote to,
    // fire-and-forget: wait until each node has run it, then A's keys must be untouched.
    assert!(
        wait_until(Duration::from_secs(10), || calls(&cluster, "eval")
            .iter()
            .zip(&evals)
            .all(|(now, before)| now > before)),
        "B's cleanup never reached the nodes: EVAL calls {evals:?} -> {:?}",
        calls(&cluster, "eval")
    );
    assert!(
        values(&cluster, b"jobs:report")
            .iter()
            .all(|v| v.as_deref() == Some(lock.token())),
        "the refused attempt disturbed the holder's keys: {:?}",
        values(&cluster, b"jobs:report")
    );

    a.unlock(&lock).unwrap();
    let second = b
        .try_lock("jobs:report", Duration::from_millis(300))
        .expect("free after unlock");

    // Let it expire without unlocking: a crashed holder frees the resource by ttl.
    std::thread::sleep(Duration::from_millis(350));
    assert!(!second.is_valid());
    let third = a
        .try_lock("jobs:report", Duration::from_secs(5))
        .expect("free after expiry");
    assert_ne!(third.token(), second.token());
}

#[test]
fn lock_retries_until_the_holder_lets_go() {
    let cluster = Cluster::start(3);
    let mut holder = client(&cluster);
    let mut waiter = Redlock::builder()
        .nodes(cluster.urls())
        .retry_count(50)
        .retry_delay(Duration::from_millis(20))
        .retry_jitter(Duration::from_millis(10))
        .build()
        .unwrap();
    let lock = holder.lock("queue", Duration::from_millis(400)).unwrap();
    let got = waiter
        .lock("queue", Duration::from_secs(5))
        .expect("acquired after expiry");
    // The waiter got it only once the holder's validity was over (it retried meanwhile).
    assert!(!lock.is_valid(), "waited for the holder");
    assert!(got.is_valid());
}

#[test]
fn a_failed_attempt_releases_what_it_set() {
    let cluster = Cluster::start(5);
    let mut a = client(&cluster);
    let mut b = client(&cluster);
    // Someone else holds the key on 3 nodes only (set by hand): B wins 2, loses overall.
    for i in 0..3 {
        cluster
            .node(i)
            .admin()
            .set_px("split", "someone-else", 10_000);
    }
    let err = b.try_lock("split", Duration::from_secs(10)).unwrap_err();
    assert!(matches!(err, Error::Taken(_)), "{err}");
    // B's partial keys on nodes 3 and 4 are released (fire-and-forget, so give it a moment).
    assert!(common::wait_until(Duration::from_secs(2), || {
        (3..5).all(|i| cluster.node(i).admin().get("split").is_none())
    }));
    assert_eq!(
        cluster.node(0).admin().get("split").as_deref(),
        Some(&b"someone-else"[..])
    );
    drop(a.try_lock("other", Duration::from_secs(1)).unwrap());
}

#[test]
fn stale_lock_release_never_deletes_the_new_holders_key() {
    let cluster = Cluster::start(5);
    let mut a = client(&cluster);
    let mut b = client(&cluster);
    let old = a.lock("k", Duration::from_millis(150)).unwrap();
    // A's lock expires (the scenario); its SET may reach the last nodes after `lock`
    // returned, so wait for the key to be gone everywhere, not a fixed time.
    wait_values(&cluster, b"k", None);
    let new = b.lock("k", Duration::from_secs(10)).unwrap();
    wait_values(&cluster, b"k", Some(new.token()));
    let e = a.unlock(&old).expect_err("the stale lock owns nothing");
    assert!(matches!(e, Error::Expired(_)), "{e}");
    assert!(old.is_released());
    assert!(
        values(&cluster, b"k")
            .iter()
            .all(|v| v.as_deref() == Some(new.token()))
    );
}

#[test]
fn binary_resource_names_are_exact() {
    let cluster = Cluster::start(3);
    let mut rl = client(&cluster);
    let names: [&[u8]; 4] = [b"a\r\nb", b"\0\0\x01", b"\xff\xfe non-utf8", &[b'x'; 300]];
    for name in names {
        let lock = rl.try_lock(name, Duration::from_secs(5)).unwrap();
        assert_eq!(lock.resource(), name);
        assert!(
            common::wait_until(Duration::from_secs(5), || {
                cluster.node(1).admin().get(name).as_deref() == Some(lock.token())
            }),
            "the key on node 1 is the name, byte for byte"
        );
        assert!(
            rl.try_lock(name, Duration::from_secs(5)).is_err(),
            "held: {name:?}"
        );
        unlock_everywhere(&cluster, &mut rl, &lock);
    }
    // Names that differ in one byte are different locks.
    let a = rl.try_lock(b"same\0a", Duration::from_secs(5)).unwrap();
    let b = rl.try_lock(b"same\0b", Duration::from_secs(5)).unwrap();
    assert_ne!(a.token(), b.token());
}

#[test]
fn tokens_are_unique_per_request() {
    let cluster = Cluster::start(1);
    let mut a = client(&cluster);
    let mut b = client(&cluster);
    let mut seen = std::collections::HashSet::new();
    for i in 0..200 {
        let rl = if i % 2 == 0 { &mut a } else { &mut b };
        let lock = rl
            .try_lock(format!("t{i}"), Duration::from_secs(5))
            .unwrap();
        assert!(lock.token().len() >= 32, "128 bits as hex");
        assert!(seen.insert(lock.token().to_vec()));
    }
}

#[test]
fn password_nodes_work_and_a_wrong_password_is_a_typed_failure() {
    let cluster = Cluster::start_with(3, &NodeOptions::with_password("s3cret"));
    let mut rl = client(&cluster);
    let lock = rl.try_lock("auth", Duration::from_secs(5)).unwrap();
    unlock_everywhere(&cluster, &mut rl, &lock);

    let port = cluster.node(0).port().unwrap();
    let wrong: Vec<String> = cluster
        .urls()
        .iter()
        .map(|u| u.replace("s3cret", "wrong"))
        .collect();
    assert!(wrong[0].contains(&port.to_string()));
    let mut bad = Redlock::builder()
        .nodes(&wrong)
        .retry_count(0)
        .build()
        .unwrap();
    let err = bad.try_lock("auth", Duration::from_secs(5)).unwrap_err();
    let f = err.failure().unwrap();
    assert!(matches!(err, Error::Unavailable(_)), "{err}");
    // The round ends as soon as quorum is impossible, so the last node may not have
    // answered yet; every node that did answer refused the login.
    let refused = f.count(|o| matches!(o, Outcome::Failed(quorumlock::NodeError::Handshake(m)) if m.contains("WRONGPASS")));
    assert!(refused >= 2, "{err}");
    let unanswered = f.count(|o| matches!(o, Outcome::NoReply | Outcome::NotNeeded));
    assert_eq!(refused + unanswered, 3, "{err}");
    assert!(
        !err.to_string().contains("wrong@"),
        "passwords are masked: {err}"
    );
}

#[test]
fn acl_user_nodes_work() {
    let cluster = Cluster::start_with(3, &NodeOptions::with_acl_user("locker", "pw1"));
    assert!(cluster.url(0).contains("locker:"));
    let mut rl = client(&cluster);
    let mut lock = rl.try_lock("acl", Duration::from_secs(5)).unwrap();
    rl.extend(&mut lock, Duration::from_secs(5)).unwrap();
    unlock_everywhere(&cluster, &mut rl, &lock);
}

#[test]
fn unix_socket_nodes_work_with_and_without_password_and_db() {
    let plain = Cluster::start_with(3, &NodeOptions::unix());
    let mut rl = client(&plain);
    let lock = rl.try_lock("sock", Duration::from_secs(5)).unwrap();
    unlock_everywhere(&plain, &mut rl, &lock);

    let opts = NodeOptions {
        unix_socket: true,
        password: Some("pw".into()),
        ..NodeOptions::default()
    };
    let secured = Cluster::start_with(3, &opts);
    let urls: Vec<String> = secured.urls().iter().map(|u| format!("{u}&db=3")).collect();
    assert!(
        urls[0].starts_with("unix://") && urls[0].contains("password="),
        "{}",
        urls[0]
    );
    let mut rl = Redlock::builder().nodes(&urls).build().unwrap();
    let lock = rl.try_lock("sock", Duration::from_secs(5)).unwrap();
    // SELECT 3 happened: the key is in db 3, not db 0.
    let mut admin = secured.node(0).admin();
    assert_eq!(admin.get("sock"), None);
    assert!(admin.cmd(&["SELECT", "3"]).is_ok());
    assert_eq!(admin.get("sock").as_deref(), Some(lock.token()));
    // unlock returns at a majority (2 of 3 here): its count is at least that; the key
    // goes from db 3 of every node, seen there.
    let released = rl.unlock(&lock).unwrap();
    assert!((2..=3).contains(&released), "released on {released}");
    let mut admins: Vec<_> = secured.admins();
    for admin in &mut admins {
        assert!(admin.cmd(&["SELECT", "3"]).is_ok());
    }
    assert!(
        wait_until(Duration::from_secs(10), || admins
            .iter_mut()
            .all(|a| a.get("sock").is_none())),
        "a node kept the key in db 3 after unlock"
    );
}

#[test]
fn tcp_db_number_is_selected() {
    let cluster = Cluster::start(1);
    let mut rl = Redlock::builder()
        .nodes([format!("{}/5", cluster.url(0))])
        .build()
        .unwrap();
    let lock = rl.try_lock("db5", Duration::from_secs(5)).unwrap();
    let mut admin = cluster.node(0).admin();
    assert!(admin.cmd(&["SELECT", "5"]).is_ok());
    assert_eq!(admin.get("db5").as_deref(), Some(lock.token()));
}

#[test]
fn script_digests_match_what_redis_computes() {
    let cluster = Cluster::start(1);
    let mut admin = cluster.node(0).admin();
    use quorumlock::__private::core::script as s;
    for (body, sha) in [
        (s::RELEASE, s::RELEASE_SHA),
        (s::EXTEND, s::EXTEND_SHA),
        (s::ACQUIRE, s::ACQUIRE_SHA),
        (s::FENCE, s::FENCE_SHA),
        (s::RELEASE_ALL, s::RELEASE_ALL_SHA),
        (s::EXTEND_ALL, s::EXTEND_ALL_SHA),
        (s::RELEASE_FENCED, s::RELEASE_FENCED_SHA),
    ] {
        let reply = admin.cmd(&[&b"SCRIPT"[..], b"LOAD", body]);
        assert_eq!(reply.as_bytes(), Some(&sha[..]), "{reply:?}");
    }
}

#[test]
fn batches_lock_each_resource_by_its_own_quorum() {
    let cluster = Cluster::start(5);
    let mut rl = client(&cluster);
    let mut other = client(&cluster);
    let taken = other.try_lock("batch:3", Duration::from_secs(10)).unwrap();
    let names: Vec<String> = (0..16).map(|i| format!("batch:{i}")).collect();
    let results = rl.try_lock_many(&names, Duration::from_secs(10));
    assert_eq!(results.len(), 16);
    for (i, r) in results.iter().enumerate() {
        match (i, r) {
            (3, Err(Error::Taken(_))) => {}
            (3, other) => panic!("batch:3 is held elsewhere: {other:?}"),
            (_, Ok(lock)) => assert_eq!(lock.resource(), names[i].as_bytes()),
            (_, Err(e)) => panic!("{i}: {e}"),
        }
    }
    let held: Vec<_> = results.into_iter().filter_map(Result::ok).collect();
    for lock in &held {
        wait_values(&cluster, lock.resource(), Some(lock.token()));
    }
    // Each release returns at its own majority: at least the quorum (every node held
    // every key); every node loses every key, seen on the nodes.
    let released = rl.unlock_many(&held);
    assert!(
        released
            .iter()
            .all(|r| matches!(r, Ok(n) if (3..=5).contains(n))),
        "{released:?}"
    );
    for lock in &held {
        wait_values(&cluster, lock.resource(), None);
    }
    // The other holder still has batch:3 on a majority. Not necessarily on every node:
    // its try_lock returned at a quorum, so on a node it had not reached yet the batch's
    // SET NX may have landed first (and been released again as part of a lost attempt).
    let holding = cluster
        .admins()
        .into_iter()
        .filter_map(|mut admin| admin.get("batch:3"))
        .filter(|value| value.as_slice() == taken.token())
        .count();
    assert!(
        holding >= 3,
        "batch:3 held by the other client on {holding} of 5 nodes"
    );
    assert!(
        rl.try_lock_many::<&str>(&[], Duration::from_secs(1))
            .is_empty()
    );
}

#[test]
fn every_config_error_names_the_setting_before_connecting() {
    let ok = "redis://127.0.0.1:1";
    let cases: Vec<(quorumlock::Builder, &str)> = vec![
        (Redlock::builder(), "nodes"),
        (Redlock::builder().nodes(["http://127.0.0.1:1"]), "nodes[0]"),
        (
            Redlock::builder().nodes([ok, "redis://127.0.0.1:70000"]),
            "nodes[1]",
        ),
        (
            Redlock::builder().nodes([ok, "redis://127.0.0.1:2/x"]),
            "nodes[1]",
        ),
        (
            Redlock::builder().nodes([ok, "redis://127.0.0.1:1"]),
            "nodes[1]",
        ),
        (Redlock::builder().nodes(["unix://no/abs"]), "nodes[0]"),
        (
            Redlock::builder().nodes([ok]).node_timeout(Duration::ZERO),
            "node_timeout",
        ),
        (
            Redlock::builder()
                .nodes([ok])
                .connect_timeout(Duration::ZERO),
            "connect_timeout",
        ),
        (
            Redlock::builder().nodes([ok]).drift_factor(1.0),
            "drift_factor",
        ),
        (
            Redlock::builder().nodes([ok]).drift_factor(-0.5),
            "drift_factor",
        ),
        (
            Redlock::builder().nodes([ok]).limits(quorumlock::Limits {
                max_bulk_len: 1,
                ..Default::default()
            }),
            "limits",
        ),
    ];
    for (builder, setting) in cases {
        match builder.build() {
            Err(Error::Config(c)) => {
                assert_eq!(c.setting, setting, "{c}");
                assert!(!c.problem.is_empty());
            }
            other => panic!("{setting}: expected a Config error, got {other:?}"),
        }
    }
    // Arguments of a call are not configuration: a ttl below the PX resolution, one the
    // drift allowance (2 ms + 1 %) would eat whole, one over MAX_TTL, and an empty or
    // oversized resource name are InvalidArgument at call time, for every operation.
    let mut rl = Redlock::builder().nodes([ok]).build().unwrap();
    let invalid = |r: Result<Lock, Error>, argument: &str| match r {
        Err(Error::InvalidArgument(a)) => {
            assert_eq!(a.argument, argument, "{a}");
            assert!(!a.problem.is_empty());
        }
        other => panic!("{argument}: expected InvalidArgument, got {other:?}"),
    };
    invalid(rl.try_lock("x", Duration::from_micros(10)), "ttl");
    invalid(rl.try_lock("x", Duration::ZERO), "ttl");
    invalid(rl.lock("x", Duration::from_millis(2)), "ttl");
    invalid(
        rl.lock("x", quorumlock::MAX_TTL + Duration::from_secs(1)),
        "ttl",
    );
    invalid(rl.lock("x", Duration::MAX), "ttl");
    invalid(rl.try_lock("", Duration::from_secs(1)), "resource");
    let long = vec![b'r'; quorumlock::MAX_RESOURCE + 1];
    invalid(rl.try_lock(&long, Duration::from_secs(1)), "resource");
    for r in rl.try_lock_many(&["a", ""], Duration::ZERO) {
        invalid(r, "ttl");
    }
}

#[test]
fn build_succeeds_with_nodes_down_and_they_join_when_they_come_up() {
    // A service must start while a minority (here: all) of its nodes are unreachable.
    let cluster = Cluster::start(3);
    cluster.node(0).kill();
    cluster.node(1).kill();
    let mut rl = Redlock::builder()
        .nodes(cluster.urls())
        .max_backoff(Duration::from_millis(50))
        .retry_count(0)
        .build()
        .expect("build never fails because a node is down");
    let err = rl.try_lock("late", Duration::from_secs(5)).unwrap_err();
    assert!(matches!(err, Error::Unavailable(_)), "{err}");
    cluster.node(0).restart();
    cluster.node(1).restart();
    // They joined when every node takes the SET and the delete, seen on the nodes (unlock
    // returns at a majority, so its count cannot say it).
    let token_everywhere = |lock: &Lock| {
        wait_until(Duration::from_secs(1), || {
            values(&cluster, b"late")
                .iter()
                .all(|v| v.as_deref() == Some(lock.token()))
        })
    };
    let gone_everywhere = || {
        wait_until(Duration::from_secs(2), || {
            values(&cluster, b"late").iter().all(Option::is_none)
        })
    };
    assert!(common::wait_until(Duration::from_secs(10), || {
        match rl.try_lock("late", Duration::from_secs(5)) {
            Ok(lock) => {
                let joined = token_everywhere(&lock);
                let released = rl.unlock(&lock);
                joined && matches!(released, Ok(n) if n >= 2) && gone_everywhere()
            }
            Err(_) => false,
        }
    }));
}

#[test]
fn public_types_are_send_and_debug() {
    fn send<T: Send>() {}
    fn debug<T: std::fmt::Debug>() {}
    send::<Redlock>();
    send::<quorumlock::Lock>();
    send::<Error>();
    debug::<Error>();
    debug::<quorumlock::Lock>();
}

/// The unlock of a lock whose keys live much longer than the test: it reached every node
/// (each key is gone within 10 s while the ttl is 60 s, so no expiry explains it), and no
/// node was taken for lagging (`Failure::nodes`, if a loaded machine made it fail).
fn unlock_reaches_every_node(cluster: &Cluster, rl: &mut Redlock, lock: &quorumlock::Lock) {
    match rl.unlock(lock) {
        Ok(n) => assert!(n >= 3, "a quorum answered, released on {n}"),
        Err(Error::Unavailable(f)) => assert_eq!(
            f.count(|o| *o == Outcome::Failed(quorumlock::NodeError::Lagging)),
            0,
            "a healthy node was taken for lagging: {f}"
        ),
        Err(e) => panic!("unlock: {e}"),
    }
    wait_values(cluster, lock.resource(), None);
}

#[test]
fn a_holder_that_was_busy_longer_than_node_timeout_still_releases_everywhere() {
    // Acquire decides at quorum; the slower replies arrive while the caller works and
    // does not poll (here: three node_timeouts). Those nodes are healthy, not lagging:
    // unlock must reach all five.
    let cluster = Cluster::start(5);
    let node_timeout = Duration::from_millis(200);
    let mut rl = client_timing_out_after(&cluster, node_timeout);
    for i in 0..5 {
        let lock = rl
            .try_lock(format!("busy{i}"), Duration::from_secs(60))
            .unwrap();
        // Every node applied the SET, so every reply is on its way: the slow ones sit
        // unread in the sockets while the caller is busy. (A node that has not answered
        // after node_timeout really lags; that case is not this test's.)
        wait_values(&cluster, format!("busy{i}").as_bytes(), Some(lock.token()));
        std::thread::sleep(node_timeout * 3);
        unlock_reaches_every_node(&cluster, &mut rl, &lock);
    }
}

#[test]
fn a_client_left_unused_after_build_is_not_taken_for_lagging() {
    // Connections open in build() and their handshake is queued then; a client first
    // used long after (three node_timeouts) must not mistake that old handshake for a
    // node that lags: the lock and the unlock reach all five nodes.
    let cluster = Cluster::start(5);
    let node_timeout = Duration::from_millis(200);
    let mut rl = client_timing_out_after(&cluster, node_timeout);
    std::thread::sleep(node_timeout * 3);
    let lock = rl.try_lock("late-start", Duration::from_secs(60)).unwrap();
    // A node taken for lagging is sent nothing: every node must get the SET.
    wait_values(&cluster, b"late-start", Some(lock.token()));
    unlock_reaches_every_node(&cluster, &mut rl, &lock);
}

#[test]
fn large_batches_are_split_into_rounds_and_oversized_names_refused() {
    let cluster = Cluster::start(3);
    // node_timeout bounds a whole batch round: give 1,024 commands per node room.
    let mut rl = client_timing_out_after(&cluster, Duration::from_secs(2));
    let mut names: Vec<Vec<u8>> = (0..2500).map(|i| format!("big:{i}").into_bytes()).collect();
    names.insert(7, vec![b'x'; quorumlock::MAX_RESOURCE + 1]);
    let results = rl.try_lock_many(&names, Duration::from_secs(10));
    assert_eq!(results.len(), names.len());
    assert!(
        matches!(&results[7], Err(Error::InvalidArgument(a)) if a.argument == "resource"),
        "{:?}",
        results[7]
    );
    let held: Vec<_> = results.into_iter().filter_map(Result::ok).collect();
    assert_eq!(held.len(), 2500);
    // Each batch decides at a quorum of 2: the third node may still be working through
    // its pipeline when the call returns, but it gets every key.
    let mut admins = cluster.admins();
    for admin in &mut admins {
        assert!(
            wait_until(Duration::from_secs(10), || admin.keys_count() == 2500),
            "a node never got every key of the batch"
        );
    }
    // Each release returns at its own majority (2 of 3, every node held every key);
    // every node loses every key, seen on the nodes.
    let released = rl.unlock_many(&held);
    assert!(
        released
            .iter()
            .all(|r| matches!(r, Ok(n) if (2..=3).contains(n)))
    );
    for admin in &mut admins {
        assert!(
            wait_until(Duration::from_secs(10), || admin.keys_count() == 0),
            "a node kept keys of the batch after unlock_many"
        );
    }
    let err = rl.try_lock(
        vec![b'y'; quorumlock::MAX_RESOURCE + 1],
        Duration::from_secs(1),
    );
    assert!(matches!(err, Err(Error::InvalidArgument(_))));
}
