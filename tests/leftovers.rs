//! Nothing left behind: a SET or an extend queued to a frozen node applies when the node
//! thaws, so `unlock` must queue its compare-and-delete behind it on the same connection
//! (Redis runs one connection's commands in order), even though it does not wait for a
//! node that lags. Without that, a thawed node would keep a stale key for a whole ttl.

mod common;

use common::{Cluster, wait_until};
use quorumlock::{NodeError, Outcome, Redlock};
use std::time::Duration;

/// Long enough that a key surviving by its ttl cannot be mistaken for a deleted one.
const TTL: Duration = Duration::from_secs(60);
/// Long enough that the lag reset (20 × node_timeout = 5 s) cannot come between the
/// freeze and the unlock on a loaded machine.
const NODE_TIMEOUT: Duration = Duration::from_millis(250);
const FROZEN: [usize; 2] = [3, 4];

fn client(cluster: &Cluster) -> Redlock {
    Redlock::builder()
        .nodes(cluster.urls())
        .node_timeout(NODE_TIMEOUT)
        .retry_count(0)
        .build()
        .expect("valid configuration")
}

/// Calls of `command` a node has run (from `INFO commandstats`).
fn calls(cluster: &Cluster, node: usize, command: &str) -> u64 {
    let stats = cluster.node(node).admin().info("commandstats");
    let prefix = format!("cmdstat_{command}:calls=");
    stats
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Waits until `rl` reports the frozen nodes as lagging (it no longer waits for them):
/// the scenario is about an unlock that skips them. The client's own second attempt on a
/// key it holds fails, and its report names each node's state.
fn wait_seen_lagging(rl: &mut Redlock) {
    let probe = rl
        .lock("leftovers:probe", TTL)
        .expect("the 3 healthy nodes grant the probe");
    let mut last = None;
    let seen = wait_until(Duration::from_secs(10), || {
        let err = rl
            .try_lock("leftovers:probe", TTL)
            .expect_err("the probe is held");
        let lagging = err.failure().is_some_and(|f| {
            FROZEN
                .iter()
                .all(|&i| f.nodes[i].outcome == Outcome::Failed(NodeError::Lagging))
        });
        last = Some(err);
        lagging
    });
    assert!(seen, "the frozen nodes were never seen lagging: {last:?}");
    rl.unlock(&probe).expect("probe unlock");
}

fn assert_gone_everywhere(cluster: &Cluster, key: &str) {
    let gone = wait_until(Duration::from_secs(10), || {
        (0..cluster.len()).all(|i| !cluster.node(i).admin().exists(key))
    });
    let left: Vec<i64> = (0..cluster.len())
        .map(|i| cluster.node(i).admin().pttl(key))
        .collect();
    assert!(
        gone,
        "a node kept {key:?} after unlock (PTTL per node: {left:?})"
    );
}

#[test]
fn unlock_removes_a_set_that_a_frozen_node_applies_when_it_thaws() {
    let cluster = Cluster::start(5);
    let mut rl = client(&cluster);
    // Every connection up before the freeze, so the SET really is queued to them.
    let warm = rl.lock("leftovers:warm", TTL).expect("warm-up lock");
    rl.unlock(&warm).expect("warm-up unlock");
    let sets_before: Vec<u64> = FROZEN.iter().map(|&i| calls(&cluster, i, "set")).collect();

    for &i in &FROZEN {
        cluster.node(i).freeze();
    }
    let lock = rl
        .lock("leftovers:set", TTL)
        .expect("3 healthy nodes grant it");
    wait_seen_lagging(&mut rl);
    let released = rl.unlock(&lock).expect("a majority answers the unlock");
    assert_eq!(released, 3, "the healthy nodes deleted the key");
    for &i in &FROZEN {
        cluster.node(i).thaw();
    }

    assert_gone_everywhere(&cluster, "leftovers:set");
    // The path under test ran: the frozen nodes did apply the stale SET on thawing,
    // and then our delete.
    for (k, &i) in FROZEN.iter().enumerate() {
        assert!(
            calls(&cluster, i, "set") > sets_before[k],
            "node {i} never ran the queued SET: the scenario did not happen"
        );
        assert!(
            calls(&cluster, i, "eval") >= 1,
            "node {i} never got the delete"
        );
    }
}

#[test]
fn unlock_removes_what_an_extend_queued_to_frozen_nodes_reapplies() {
    let cluster = Cluster::start(5);
    let mut rl = client(&cluster);
    let mut lock = rl.lock("leftovers:extend", TTL).expect("lock");
    // All five hold the key before anything is frozen.
    assert!(wait_until(Duration::from_secs(10), || {
        (0..5).all(|i| cluster.node(i).admin().exists("leftovers:extend"))
    }));
    let extends_before: Vec<u64> = FROZEN
        .iter()
        .map(|&i| calls(&cluster, i, "evalsha") + calls(&cluster, i, "eval"))
        .collect();

    for &i in &FROZEN {
        cluster.node(i).freeze();
    }
    // The extend goes to all five (nobody lags yet) and wins on the three healthy ones;
    // on the frozen two it waits in their sockets, a full new ttl to apply on thawing.
    rl.extend(&mut lock, TTL * 2)
        .expect("extend on the healthy majority");
    wait_seen_lagging(&mut rl);
    rl.unlock(&lock).expect("unlock");
    for &i in &FROZEN {
        cluster.node(i).thaw();
    }

    assert_gone_everywhere(&cluster, "leftovers:extend");
    for (k, &i) in FROZEN.iter().enumerate() {
        let scripts = calls(&cluster, i, "evalsha") + calls(&cluster, i, "eval");
        assert!(
            scripts >= extends_before[k] + 2,
            "node {i} did not run both the queued extend and the delete ({scripts} scripts)"
        );
    }
}

#[test]
fn a_lagging_connection_that_owes_a_set_is_not_dropped_before_the_unlock() {
    let cluster = Cluster::start(5);
    // Defaults: a node lagging for 1 s would have its connection reset.
    let mut rl = Redlock::builder()
        .nodes(cluster.urls())
        .retry_count(0)
        .build()
        .expect("valid configuration");
    let warm = rl.lock("leftovers:warm", TTL).expect("warm-up lock");
    rl.unlock(&warm).expect("warm-up unlock");
    for &i in &FROZEN {
        cluster.node(i).freeze();
    }
    let lock = rl
        .lock("leftovers:reset", TTL)
        .expect("3 healthy nodes grant it");
    // The scenario: well past the 1 s lag reset, with calls in between that would reset
    // the frozen nodes' connections. The client keeps a connection that owes a live SET
    // (so the delete follows it in order); were it reset, the delete would go on a new
    // connection and the outcome would rest on the order the thawed server reads its
    // sockets in, which this test cannot force either way: it checks the guarantee.
    let past_reset = std::time::Instant::now() + Duration::from_millis(1500);
    while std::time::Instant::now() < past_reset {
        let other = rl.lock("leftovers:other", TTL).expect("healthy majority");
        rl.unlock(&other).expect("unlock");
        std::thread::sleep(Duration::from_millis(100));
    }
    rl.unlock(&lock).expect("unlock");
    for &i in &FROZEN {
        cluster.node(i).thaw();
    }
    assert_gone_everywhere(&cluster, "leftovers:reset");
}

#[test]
fn unlock_reaches_a_frozen_node_that_already_held_the_key() {
    let cluster = Cluster::start(5);
    let mut rl = client(&cluster);
    let a = rl.lock("leftovers:a", TTL).expect("lock a");
    let b = rl.lock("leftovers:b", TTL).expect("lock b");
    // Both keys applied on all five before anything is frozen: nothing owed for them.
    assert!(wait_until(Duration::from_secs(10), || {
        (0..5).all(|i| {
            let mut admin = cluster.node(i).admin();
            admin.exists("leftovers:a") && admin.exists("leftovers:b")
        })
    }));
    for &i in &FROZEN {
        cluster.node(i).freeze();
    }
    rl.unlock(&b).expect("unlock b, queued to the frozen nodes");
    wait_seen_lagging(&mut rl);
    // The frozen nodes owe only releases now, yet hold a's key: the delete must go there.
    rl.unlock(&a).expect("unlock a");
    for &i in &FROZEN {
        cluster.node(i).thaw();
    }
    assert_gone_everywhere(&cluster, "leftovers:a");
    assert_gone_everywhere(&cluster, "leftovers:b");
}
