//! Fencing tokens against real `redis-server` nodes: every lock taken with fencing on
//! carries a fence strictly larger than every earlier lock's on the same resource,
//! whoever took it, across a node restarted empty; a storage that keeps the largest fence
//! it saw refuses a late holder's write.

mod common;

use common::{Cluster, wait_until};
use quorumlock::{Error, Redlock};
use std::time::Duration;

const TTL: Duration = Duration::from_secs(30);

fn client(cluster: &Cluster, fencing: bool) -> Redlock {
    Redlock::builder()
        .nodes(cluster.urls())
        .node_timeout(Duration::from_millis(500))
        .retry_count(5)
        .retry_delay(Duration::from_millis(50))
        .retry_jitter(Duration::from_millis(20))
        .max_backoff(Duration::from_millis(50))
        .fencing(fencing)
        .build()
        .expect("valid configuration")
}

/// The counter a node keeps for `resource`.
fn counter(cluster: &Cluster, node: usize, resource: &str) -> Option<u64> {
    let value = cluster
        .node(node)
        .admin()
        .get(quorumlock::__private::core::slot::fence_key(
            resource.as_bytes(),
        ))?;
    String::from_utf8(value).ok()?.parse().ok()
}

#[test]
fn fences_rise_strictly_over_sequential_holders() {
    let cluster = Cluster::start(5);
    let mut rl = client(&cluster, true);
    let mut last = 0;
    for i in 0..20 {
        let lock = rl.lock("fence:seq", TTL).expect("lock");
        let fence = lock.fence().expect("fencing is on");
        assert!(fence > last, "lock {i}: fence {fence} after {last}");
        last = fence;
        rl.unlock(&lock).expect("unlock");
    }
    // The write-back reaches every node, not only a majority.
    assert!(wait_until(Duration::from_secs(10), || {
        (0..5).all(|n| counter(&cluster, n, "fence:seq") == Some(last))
    }));
    // Without fencing, no fence and no counter.
    let mut plain = client(&cluster, false);
    let lock = plain.lock("fence:plain", TTL).expect("lock");
    assert_eq!(lock.fence(), None);
    assert_eq!(counter(&cluster, 0, "fence:plain"), None);
    plain.unlock(&lock).expect("unlock");
}

#[test]
fn fences_rise_across_clients_and_resources_are_counted_apart() {
    let cluster = Cluster::start(5);
    let mut a = client(&cluster, true);
    let mut b = client(&cluster, true);
    let mut last = 0;
    for i in 0..10 {
        let rl = if i % 2 == 0 { &mut a } else { &mut b };
        let lock = rl.lock("fence:shared", TTL).expect("lock");
        let fence = lock.fence().expect("fenced");
        assert!(fence > last, "holder {i}: fence {fence} after {last}");
        last = fence;
        rl.unlock(&lock).expect("unlock");
    }
    // Another resource starts its own count.
    let other = a.lock("fence:other", TTL).expect("lock");
    assert_eq!(other.fence(), Some(1));
    a.unlock(&other).expect("unlock");
}

#[test]
fn fences_rise_across_a_minority_node_restarted_empty_with_the_guard_on() {
    const GUARD: Duration = Duration::from_secs(3);
    let cluster = Cluster::start(5);
    let mut rl = Redlock::builder()
        .nodes(cluster.urls())
        .node_timeout(Duration::from_millis(500))
        .retry_count(20)
        .retry_delay(Duration::from_millis(50))
        .max_backoff(Duration::from_millis(50))
        .fencing(true)
        .restart_guard(GUARD)
        .build()
        .expect("valid configuration");
    // The nodes must be older than the guard, and known that long: the first use of a
    // fresh deployment writes every node's marker, and waits out the guard once.
    assert!(
        wait_until(GUARD * 4, || match rl.lock("fence:warm", TTL) {
            Ok(lock) => rl.unlock(&lock).is_ok(),
            Err(_) => false,
        }),
        "the nodes never got older than the guard"
    );
    let mut last = 0;
    for round in 0..4 {
        for _ in 0..3 {
            let lock = rl.lock("fence:restart", TTL).expect("lock");
            let fence = lock.fence().expect("fenced");
            assert!(fence > last, "fence {fence} after {last}");
            last = fence;
            rl.unlock(&lock).expect("unlock");
        }
        // A minority node loses its keys and its counters, and comes back at once
        // (nodes 0 and 1 in turn: two nodes younger than the guard are a minority; three
        // would rightly hold every lock back).
        let victim = round % 2;
        cluster.node(victim).restart();
        assert_eq!(counter(&cluster, victim, "fence:restart"), None);
    }
    let lock = rl.lock("fence:restart", TTL).expect("lock");
    assert!(lock.fence().expect("fenced") > last);
    rl.unlock(&lock).expect("unlock");
}

/// The write-back goes to every node whose connection is up, a frozen (lagging) one too:
/// queued behind what it owes, it raises the counter there when the node wakes.
#[test]
fn the_write_back_is_queued_to_frozen_nodes_too() {
    let cluster = Cluster::start(5);
    let mut rl = client(&cluster, true);
    let warm = rl.lock("fence:warm", TTL).expect("lock");
    rl.unlock(&warm).expect("unlock");
    cluster.node(3).freeze();
    cluster.node(4).freeze();
    // A command queued to the frozen nodes makes them lag once its reply is older than
    // node_timeout (500 ms): then they are sent nothing new but the write-back.
    let lag = rl.lock("fence:lag", TTL).expect("3 healthy nodes of 5");
    let queued_by = std::time::Instant::now();
    assert!(wait_until(Duration::from_secs(10), || {
        queued_by.elapsed() > Duration::from_secs(1)
    }));
    let lock = rl.lock("fence:frozen", TTL).expect("3 healthy nodes of 5");
    let fence = lock.fence().expect("fenced");
    for n in 0..3 {
        assert_eq!(
            counter(&cluster, n, "fence:frozen"),
            Some(fence),
            "node {n}"
        );
    }
    cluster.node(3).thaw();
    cluster.node(4).thaw();
    assert!(
        wait_until(Duration::from_secs(10), || {
            (3..5).all(|n| counter(&cluster, n, "fence:frozen") == Some(fence))
        }),
        "the thawed nodes never got the write-back"
    );
    rl.unlock(&lock).expect("unlock");
    rl.unlock(&lag).expect("unlock");
}

/// A holder that pauses past its validity and then writes is turned away by a storage
/// that keeps the largest fence it accepted.
#[test]
fn a_fenced_store_refuses_a_paused_holders_late_write() {
    let cluster = Cluster::start(5);
    let mut a = client(&cluster, true);
    let mut b = client(&cluster, true);
    let mut store = FencedStore::default();
    let short = Duration::from_secs(3);
    let lock_a = a.lock("fence:store", short).expect("lock");
    assert!(store.write(lock_a.fence().unwrap(), "a1"));
    // A "pauses" until its lock has expired; B takes over and writes.
    assert!(wait_until(short * 3, || !lock_a.is_valid()));
    let lock_b = b
        .lock("fence:store", short)
        .expect("B locks once A's keys expire");
    assert!(lock_b.fence() > lock_a.fence());
    assert!(store.write(lock_b.fence().unwrap(), "b1"));
    // A wakes up and writes with its old fence: refused.
    assert!(!store.write(lock_a.fence().unwrap(), "a2"));
    assert_eq!(store.value, "b1");
    b.unlock(&lock_b).expect("unlock");
}

#[test]
fn a_ttl_too_short_for_fencing_is_refused_before_anything_is_sent() {
    let cluster = Cluster::start(3);
    let mut rl = client(&cluster, true);
    let err = rl
        .lock("fence:short", Duration::from_millis(1500))
        .expect_err("ttl below 4 × node_timeout");
    let Error::InvalidArgument(e) = &err else {
        panic!("{err:?}");
    };
    assert!(err.to_string().contains("node_timeout"), "{e}");
    assert!(!cluster.node(0).admin().exists("fence:short"));
}

/// The storage the issue describes: keeps the largest fence it accepted.
#[derive(Default)]
struct FencedStore {
    highest: u64,
    value: String,
}

impl FencedStore {
    fn write(&mut self, fence: u64, value: &str) -> bool {
        if fence < self.highest {
            return false;
        }
        self.highest = fence;
        self.value = value.to_string();
        true
    }
}

/// A lease keeps its acquire's fence through its extends; the next holder's is larger.
#[test]
fn a_lease_keeps_its_fence_through_extends_and_the_next_holder_gets_a_larger_one() {
    let cluster = Cluster::start(3);
    let build = |fencing: bool| {
        Redlock::builder()
            .nodes(cluster.urls())
            .node_timeout(Duration::from_millis(200))
            .fencing(fencing)
            .build_shared()
            .expect("valid configuration")
    };
    let shared = build(true);
    // 3 s: extended every second. An extend shows as the key's ttl rising again.
    let lease = shared
        .blocking_lease("fence:lease", Duration::from_secs(3))
        .expect("lease");
    let fence = lease.fence().expect("fencing is on");
    let ttl_of = |n: usize| cluster.node(n).admin().pttl(b"fence:lease");
    assert!(wait_until(Duration::from_secs(15), || ttl_of(0) < 2_500));
    assert!(
        wait_until(Duration::from_secs(15), || ttl_of(0) > 2_600),
        "the lease was never extended"
    );
    assert!(!lease.is_lost());
    assert_eq!(lease.fence(), Some(fence), "an extend changed the fence");
    lease.blocking_release().expect("release");
    let next = shared
        .blocking_lease("fence:lease", Duration::from_secs(3))
        .expect("lease");
    assert!(next.fence().expect("fenced") > fence);
    next.blocking_release().expect("release");
    let plain = build(false)
        .blocking_lease("fence:lease:plain", Duration::from_secs(1))
        .expect("lease");
    assert_eq!(plain.fence(), None);
}
