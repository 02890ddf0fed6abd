//! Keys that fit a cluster slot, against real cluster-mode `redis-server` nodes (each a
//! one-shard Redis Cluster holding every slot): a fenced lock's script names its key and
//! its fence counter, which hash to one slot; `lock_all` over one hash tag works, fenced
//! too; `lock_all` over resources of different slots is refused with a clear error
//! instead of every node answering `CROSSSLOT`.

mod common;

use common::{Cluster, NodeOptions, Reply, wait_until};
use quorumlock::{Error, Redlock};
use std::time::Duration;

const TTL: Duration = Duration::from_secs(10);

/// `n` nodes, each a one-shard cluster that serves all 16384 slots.
fn cluster_mode_nodes(n: usize) -> Cluster {
    let options = NodeOptions {
        extra_args: [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
        ]
        .map(String::from)
        .to_vec(),
        ..NodeOptions::default()
    };
    let cluster = Cluster::start_with(n, &options);
    for i in 0..n {
        let mut admin = cluster.node(i).admin();
        let slots: Vec<String> = (0..16384).map(|s| s.to_string()).collect();
        let mut args = vec!["CLUSTER".to_string(), "ADDSLOTS".to_string()];
        args.extend(slots);
        let reply = admin.cmd(&args);
        assert!(reply.is_ok(), "node {i}: {reply:?}");
        assert!(
            wait_until(Duration::from_secs(20), || {
                admin.info_field("cluster", "cluster_enabled").as_deref() == Some("1")
                    && matches!(admin.cmd(&["CLUSTER", "INFO"]),
                        Reply::Bulk(Some(text)) if String::from_utf8_lossy(&text).contains("cluster_state:ok"))
            }),
            "node {i} never served its slots"
        );
    }
    cluster
}

fn client(cluster: &Cluster) -> Redlock {
    Redlock::builder()
        .nodes(cluster.urls())
        .node_timeout(Duration::from_millis(500))
        .retry_count(3)
        .retry_delay(Duration::from_millis(50))
        .fencing(true)
        .build()
        .expect("valid configuration")
}

#[test]
fn fenced_locks_and_lock_all_over_one_hash_tag_work_on_cluster_mode_nodes() {
    let cluster = cluster_mode_nodes(3);
    let mut rl = client(&cluster);
    // Names of every kind: no tag, a tag, braces without a tag.
    for resource in ["orders", "{shop}:cart", "a}b", "x{}y"] {
        let lock = rl.lock(resource, TTL).expect("a fenced lock");
        let fence = lock.fence().expect("fenced");
        rl.unlock(&lock).expect("unlock");
        let again = rl.lock(resource, TTL).expect("a fenced lock");
        assert!(again.fence() > Some(fence), "{resource}: fences rise");
        rl.unlock(&again).expect("unlock");
    }
    let mut set = rl
        .lock_all(&["{acct}:a", "{acct}:b", "{acct}:c"], TTL)
        .expect("lock_all over one hash tag");
    assert!(set.fence().is_some());
    rl.extend(&mut set, TTL).expect("extend the set");
    rl.unlock(&set).expect("unlock the set");
}

#[test]
fn lock_all_over_different_slots_is_refused_on_cluster_mode_nodes() {
    let cluster = cluster_mode_nodes(3);
    let mut rl = client(&cluster);
    // The nodes are known once connected (their INFO says cluster mode).
    let warm = rl.lock("warm", TTL).expect("lock");
    rl.unlock(&warm).expect("unlock");
    match rl.lock_all(&["account:a", "account:b"], TTL) {
        Err(Error::InvalidArgument(e)) => {
            let text = e.to_string();
            assert!(text.contains("hash slot"), "{text}");
            assert!(text.contains("{tag}"), "{text}");
        }
        other => panic!("not refused: {other:?}"),
    }
    // Nothing was sent: no key was set anywhere.
    for i in 0..3 {
        assert_eq!(cluster.node(i).admin().get("account:a"), None);
    }
}
