//! `lock_all` against real `redis-server` nodes: every resource or none, released and
//! extended as one, with nothing left behind by a failed attempt.

mod common;

use common::{Cluster, wait_until};
use quorumlock::{Error, Redlock};
use std::time::Duration;

const TTL: Duration = Duration::from_secs(30);

fn client(cluster: &Cluster) -> Redlock {
    Redlock::builder()
        .nodes(cluster.urls())
        .node_timeout(Duration::from_millis(500))
        .retry_count(0)
        .build()
        .expect("valid configuration")
}

fn holder(cluster: &Cluster, node: usize, key: &str) -> Option<Vec<u8>> {
    cluster.node(node).admin().get(key)
}

#[test]
fn every_resource_is_taken_under_one_token_and_released_as_one() {
    let cluster = Cluster::start(5);
    let mut rl = client(&cluster);
    let lock = rl
        .lock_all(&["all:a", "all:b", "all:c"], TTL)
        .expect("a free set");
    let names: Vec<&[u8]> = lock.resources().collect();
    assert_eq!(names, [&b"all:a"[..], b"all:b", b"all:c"]);
    assert_eq!(lock.resource(), b"all:a");
    // Every node the SETs reached holds every key: check a majority at least.
    let full = (0..5)
        .filter(|&n| {
            ["all:a", "all:b", "all:c"]
                .iter()
                .all(|k| holder(&cluster, n, k).as_deref() == Some(lock.token()))
        })
        .count();
    assert!(full >= 3, "only {full} nodes hold the whole set");
    assert!(rl.unlock(&lock).expect("unlock") >= 3);
    assert!(wait_until(Duration::from_secs(10), || {
        (0..5).all(|n| {
            ["all:a", "all:b", "all:c"]
                .iter()
                .all(|k| holder(&cluster, n, k).is_none())
        })
    }));
}

#[test]
fn a_partly_held_set_fails_and_leaves_nothing_behind() {
    let cluster = Cluster::start(5);
    let mut rl = client(&cluster);
    let mut other = client(&cluster);
    let held = other.lock("part:b", TTL).expect("lock b");
    // `lock` returns at a majority: wait until every node holds b, so that no node can
    // run the set's script before it.
    assert!(wait_until(Duration::from_secs(10), || {
        (0..5).all(|n| holder(&cluster, n, "part:b").as_deref() == Some(held.token()))
    }));
    let err = rl
        .lock_all(&["part:a", "part:b", "part:c"], TTL)
        .expect_err("b is held");
    assert!(matches!(err, Error::Taken(_)), "{err:?}");
    // No node was left holding a or c: the script sets all or none.
    for n in 0..5 {
        assert_eq!(holder(&cluster, n, "part:a"), None, "node {n}");
        assert_eq!(holder(&cluster, n, "part:c"), None, "node {n}");
        assert_eq!(holder(&cluster, n, "part:b").as_deref(), Some(held.token()));
    }
    other.unlock(&held).expect("unlock");
    let lock = rl
        .lock_all(&["part:a", "part:b", "part:c"], TTL)
        .expect("free now");
    rl.unlock(&lock).expect("unlock");
}

#[test]
fn extend_renews_every_key_or_none() {
    let cluster = Cluster::start(5);
    let mut rl = client(&cluster);
    let mut lock = rl
        .lock_all(&["ext:a", "ext:b"], Duration::from_secs(5))
        .expect("lock");
    rl.extend(&mut lock, Duration::from_secs(60))
        .expect("extend");
    // `extend` returns at a majority; the others follow.
    assert!(wait_until(Duration::from_secs(10), || {
        (0..5).all(|n| {
            ["ext:a", "ext:b"]
                .iter()
                .all(|key| cluster.node(n).admin().pttl(key) > 30_000)
        })
    }));
    // One key gone on every node: the extend fails and touches no other key.
    for n in 0..5 {
        cluster.node(n).admin().del("ext:b");
    }
    let before: Vec<i64> = (0..5)
        .map(|n| cluster.node(n).admin().pttl("ext:a"))
        .collect();
    let err = rl
        .extend(&mut lock, Duration::from_secs(600))
        .expect_err("not every key is ours");
    assert!(matches!(err, Error::Expired(_)), "{err:?}");
    for (n, was) in before.iter().enumerate() {
        assert!(cluster.node(n).admin().pttl("ext:a") <= *was, "node {n}");
    }
    // Releasing what is left deletes it; the lock was whole nowhere any more, which
    // the unlock says (it is not a normal release).
    let e = rl.unlock(&lock).expect_err("no node held every key");
    assert!(matches!(e, Error::Expired(_)), "{e}");
    assert!(wait_until(Duration::from_secs(10), || {
        (0..5).all(|n| holder(&cluster, n, "ext:a").is_none())
    }));
}

#[test]
fn bad_sets_are_refused_before_anything_is_sent() {
    let cluster = Cluster::start(3);
    let mut rl = client(&cluster);
    let empty: [&str; 0] = [];
    for (set, why) in [
        (&empty[..], "1 to 1024"),
        (&["dup:a", "dup:b", "dup:a"][..], "each resource once"),
        (&["dup:a", ""][..], "empty"),
    ] {
        let err = rl.lock_all(set, TTL).expect_err("refused");
        assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
        assert!(err.to_string().contains(why), "{err}");
    }
    assert!(!cluster.node(0).admin().exists("dup:a"));
    // String, &str and byte slices all work.
    let owned = vec!["own:a".to_string(), "own:b".to_string()];
    let lock = rl.lock_all(&owned, TTL).expect("lock");
    rl.unlock(&lock).expect("unlock");
    let bytes: [&[u8]; 2] = [b"own:c", b"own:d"];
    let lock = rl.lock_all(&bytes, TTL).expect("lock");
    rl.unlock(&lock).expect("unlock");
}

#[test]
fn a_fenced_set_has_a_fence_above_each_member_resource() {
    let cluster = Cluster::start(5);
    let mut rl = Redlock::builder()
        .nodes(cluster.urls())
        .node_timeout(Duration::from_millis(500))
        .fencing(true)
        .build()
        .expect("valid configuration");
    let mut high = 0;
    for _ in 0..3 {
        let single = rl.lock("fset:b", TTL).expect("lock");
        high = single.fence().unwrap();
        rl.unlock(&single).expect("unlock");
    }
    let set = rl.lock_all(&["fset:a", "fset:b"], TTL).expect("lock");
    let fence = set.fence().expect("fenced");
    assert!(fence > high, "{fence} after {high}");
    rl.unlock(&set).expect("unlock");
    let a = rl.lock("fset:a", TTL).expect("lock");
    assert!(a.fence().unwrap() > fence);
    rl.unlock(&a).expect("unlock");
}

/// The set's script runs on a node where part of the set is free: on nodes 3 and 4 (b is
/// held only on 0, 1 and 2) it takes a, b and c; the attempt loses (3 nodes refuse) and
/// returns only once its deletes there are answered: nothing of it is left anywhere.
#[test]
fn a_set_won_on_a_minority_is_cleaned_up_before_the_call_returns() {
    let cluster = Cluster::start(5);
    let mut rl = client(&cluster);
    for n in 0..3 {
        cluster
            .node(n)
            .admin()
            .set_px("min:b", "someone-else", 60_000);
    }
    let err = rl
        .lock_all(&["min:a", "min:b", "min:c"], TTL)
        .expect_err("b is held on a majority");
    assert!(matches!(err, Error::Taken(_)), "{err:?}");
    for n in 0..5 {
        for key in ["min:a", "min:c"] {
            assert_eq!(holder(&cluster, n, key), None, "node {n} still holds {key}");
        }
    }
    for n in 3..5 {
        assert_eq!(
            holder(&cluster, n, "min:b"),
            None,
            "node {n} still holds min:b"
        );
    }
}
