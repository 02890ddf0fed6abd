//! `health()` on real nodes: connected with a measured round trip, lagging while frozen,
//! down with why when killed or when its name does not resolve; read from the loop
//! without sending anything.

mod common;

use common::{Cluster, wait_until};
use quorumlock::{NodeError, NodeHealth, NodeState, Redlock};
use std::time::Duration;

const PATIENCE: Duration = Duration::from_secs(20);

fn states(h: &[NodeHealth]) -> Vec<String> {
    h.iter().map(|n| n.state.to_string()).collect()
}

#[test]
fn shared_health_tells_connected_lagging_and_down_apart() {
    let cluster = Cluster::start(3);
    let mut urls = cluster.urls();
    urls.push("redis://u:hunter2@nonexistent.invalid:6379".into());
    let shared = Redlock::builder()
        .nodes(&urls)
        .node_timeout(Duration::from_millis(200))
        .max_backoff(Duration::from_millis(50))
        .retry_count(0)
        .build_shared()
        .unwrap();
    let mut h = Vec::new();
    assert!(
        wait_until(PATIENCE, || {
            h = shared.blocking_health().unwrap();
            h[..3]
                .iter()
                .all(|n| n.state == NodeState::Connected && n.latency.is_some())
        }),
        "not every node connected: {:?}",
        states(&h)
    );
    // The name that does not resolve: down, naming the host; no password shown.
    assert!(
        wait_until(PATIENCE, || {
            h = shared.blocking_health().unwrap();
            matches!(&h[3].state, NodeState::Down(NodeError::Resolve { host, .. })
                if host == "nonexistent.invalid")
        }),
        "{:?}",
        states(&h)
    );
    assert!(!format!("{h:?}").contains("hunter2") && !h[3].to_string().contains("hunter2"));

    // Node 2 frozen: once it owes a reply older than node_timeout, it is lagging.
    cluster.node(2).freeze();
    assert!(
        wait_until(PATIENCE, || {
            let _ = shared.blocking_try_lock("health:lag", Duration::from_secs(5));
            h = shared.blocking_health().unwrap();
            h[2].state == NodeState::Lagging
        }),
        "{:?}",
        states(&h)
    );
    cluster.node(2).thaw();
    // Node 1 killed: down, with why.
    cluster.node(1).kill();
    assert!(
        wait_until(PATIENCE, || {
            let _ = shared.blocking_try_lock("health:down", Duration::from_secs(5));
            h = shared.blocking_health().unwrap();
            matches!(h[1].state, NodeState::Down(_))
        }),
        "{:?}",
        states(&h)
    );
    assert!(h[1].to_string().starts_with(&cluster.url(1)), "{}", h[1]);
    // The thawed node catches up.
    assert!(
        wait_until(PATIENCE, || {
            let _ = shared.blocking_try_lock("health:back", Duration::from_secs(5));
            h = shared.blocking_health().unwrap();
            h[2].state == NodeState::Connected
        }),
        "{:?}",
        states(&h)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_and_direct_health() {
    let cluster = Cluster::start(2);
    let shared = Redlock::builder()
        .nodes(cluster.urls())
        .build_shared()
        .unwrap();
    let mut connected = false;
    for _ in 0..400 {
        let h = shared.health().await.unwrap();
        assert_eq!(h.len(), 2);
        if h.iter().all(|n| n.state == NodeState::Connected) {
            connected = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(connected);

    let mut rl = Redlock::builder().nodes(cluster.urls()).build().unwrap();
    assert!(wait_until(PATIENCE, || {
        let _ = rl.try_lock("health:direct", Duration::from_secs(5));
        rl.health().iter().all(|n| n.state == NodeState::Connected)
    }));
}
