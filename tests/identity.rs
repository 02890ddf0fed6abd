//! Who a node is, against real `redis-server` nodes with the restart guard on: a failover
//! behind one address (a TCP proxy cut over from the old server to another that lacks
//! the lock's key and has been up longer than the guard) never grants a second holder; a
//! server without `run_id` (a proxy renames it in `INFO`, as Dragonfly and Kvrocks have
//! none) locks, is guarded by its marker, and two endpoints of it are one vote.

mod common;

use common::{Cluster, Mode, Proxy, wait_until};
use quorumlock::{Error, Lock, NodeError, Outcome, Redlock};
use std::time::Duration;

/// The ttl of the locks held across a fault, and the guard: the ttl plus a second.
const TTL: Duration = Duration::from_secs(5);
const GUARD: Duration = Duration::from_secs(6);

fn client(urls: &[String]) -> Redlock {
    Redlock::builder()
        .nodes(urls)
        .node_timeout(Duration::from_millis(300))
        .max_backoff(Duration::from_millis(50))
        .restart_guard(GUARD)
        .build()
        .expect("valid configuration")
}

/// Locks and unlocks `resource` until it works: the first use of a fresh deployment
/// waits out the guard once (every marker was missing), so this takes about a guard.
fn warm_up(rl: &mut Redlock, resource: &str) {
    let mut last = None;
    let ok = wait_until(GUARD * 4, || match rl.lock(resource, TTL) {
        Ok(lock) => rl.unlock(&lock).is_ok(),
        Err(e) => {
            last = Some(e);
            false
        }
    });
    assert!(ok, "never locked {resource}: {last:?}");
}

/// The outcome node `i` reported in `error`.
fn outcome(error: &Error, i: usize) -> Outcome {
    error.failure().expect("a failure with its nodes").nodes[i]
        .outcome
        .clone()
}

/// `rl.try_lock(resource)` again until node `node` answers in it (a node just reached
/// anew may still be reconnecting in the first attempts): the first lock won, or the
/// first error in which `node`'s answer counts as young.
fn attempt_until_answered(rl: &mut Redlock, resource: &str, node: usize) -> Result<Lock, Error> {
    let mut last = None;
    let answered = wait_until(Duration::from_secs(20), || {
        match rl.try_lock(resource, TTL) {
            Ok(lock) => {
                last = Some(Ok(lock));
                true
            }
            Err(e) => {
                let young = matches!(
                    outcome(&e, node),
                    Outcome::Failed(NodeError::YoungerThanGuard { .. })
                );
                last = Some(Err(e));
                young
            }
        }
    });
    match last {
        Some(result) if answered => result,
        other => panic!("node {node} never answered as young: {other:?}"),
    }
}

#[test]
fn a_failover_behind_one_address_never_grants_a_second_holder() {
    // Servers 0, 1, 2 are the deployment; server 3 is the replica promoted behind node
    // 0's address, long up and without the lock's key. Node 2 is reached through a
    // proxy too, to keep the holder's SET from it.
    let cluster = Cluster::start(4);
    let addr = |i: usize| cluster.node(i).addr().expect("tcp");
    let (front, side) = (Proxy::start(addr(0)), Proxy::start(addr(2)));
    let urls = vec![front.url(), cluster.url(1), side.url()];
    let mut holder = client(&urls);
    let mut rival = client(&urls);
    // Both clients know server 0 behind the front address.
    warm_up(&mut holder, "warm:holder");
    warm_up(&mut rival, "warm:rival");
    assert!(
        wait_until(GUARD * 4, || cluster.node(3).admin().uptime_secs()
            > GUARD.as_secs()),
        "server 3 never got older than the guard"
    );
    // The holder takes the lock on nodes 0 and 1 only: node 2 never sees its SET.
    side.set_mode(Mode::Blackhole);
    let lock = holder.lock("res", TTL).expect("nodes 0 and 1 of 3");
    side.set_mode(Mode::Pass);
    // Failover: node 0's address now reaches server 3, which never had the key.
    front.cut_over(addr(3));
    // The rival would win on the new server and node 2: the new server's yes must not
    // count (another run_id than the one this client saw there, and no marker).
    let attempt = attempt_until_answered(&mut rival, "res", 0);
    assert!(lock.is_valid(), "the holder's lock expired during the test");
    let error = match attempt {
        Ok(_) => panic!("two holders: the rival won while the holder's lock is valid"),
        Err(e) => e,
    };
    assert_eq!(outcome(&error, 1), Outcome::Held);
    holder.unlock(&lock).expect("unlock");
}

#[test]
fn a_server_without_run_id_locks_and_is_guarded_by_its_marker() {
    let cluster = Cluster::start(3);
    let proxies: Vec<Proxy> = (0..3)
        .map(|i| Proxy::start(cluster.node(i).addr().expect("tcp")))
        .collect();
    for p in &proxies {
        p.hide_run_id();
    }
    let urls: Vec<String> = proxies.iter().map(Proxy::url).collect();
    let mut rl = client(&urls);
    // It locks (known by its marker alone), once the markers it wrote are a guard old.
    warm_up(&mut rl, "warm");
    // Node 0 restarts empty behind its proxy: its marker is gone, so it is new again,
    // whatever uptime it reports; with node 2 frozen, its yes would decide.
    cluster.node(0).restart();
    cluster.node(2).freeze();
    let attempt = attempt_until_answered(&mut rl, "res", 0);
    cluster.node(2).thaw();
    let error = match attempt {
        Ok(_) => panic!("a restarted node's yes counted: the guard is blind without run_id"),
        Err(e) => e,
    };
    assert_eq!(outcome(&error, 1), Outcome::Locked);
}

#[test]
fn two_endpoints_of_a_server_without_run_id_are_one_vote() {
    let cluster = Cluster::start(2);
    let server0 = cluster.node(0).addr().expect("tcp");
    let proxies = [
        Proxy::start(server0),
        Proxy::start(server0),
        Proxy::start(cluster.node(1).addr().expect("tcp")),
    ];
    for p in &proxies {
        p.hide_run_id();
    }
    let urls: Vec<String> = proxies.iter().map(Proxy::url).collect();
    let mut rl = client(&urls);
    warm_up(&mut rl, "warm");
    // With server 1 frozen, only server 0 answers, through two endpoints: one vote.
    cluster.node(1).freeze();
    let attempt = rl.try_lock("res", TTL);
    cluster.node(1).thaw();
    let error = match attempt {
        Ok(_) => panic!("one server counted twice through two endpoints"),
        Err(e) => e,
    };
    assert!(
        matches!(
            outcome(&error, 1),
            Outcome::Failed(NodeError::Duplicate { of: 0, .. })
        ),
        "node 1 (the second endpoint of server 0): {:?}",
        outcome(&error, 1)
    );
}
