//! Host names are resolved when a connection is opened, never in `build()`: a node whose
//! name moves to another server is reached there at the next reconnect, every address a
//! name resolves to is tried, and a name that does not resolve is a node down that names
//! the host, while the other nodes still grant the lock.
//!
//! Moving a name needs no root: the crate's test seam
//! (`quorumlock::__private::resolver::map_host`) changes which addresses a name under
//! `.test` resolves to, and nothing else; the connect path it feeds is the real one (the
//! resolver thread, its wake, the connect timeout). `localhost` and `nonexistent.invalid`
//! go through the system's resolver.

mod common;

use common::{Cluster, wait_until};
use quorumlock::__private::resolver::{map_host, unmap_host};
use quorumlock::{Error, Outcome, Redlock, SharedRedlock};
use std::net::SocketAddr;
use std::time::Duration;

const PATIENCE: Duration = Duration::from_secs(20);

/// A name under `.test` no other test (or process) uses.
fn name(what: &str) -> String {
    format!("{what}-{}.quorumlock.test", std::process::id())
}

fn addr(cluster: &Cluster, i: usize) -> SocketAddr {
    cluster.node(i).addr().expect("a TCP node")
}

fn builder(urls: Vec<String>) -> quorumlock::Builder {
    Redlock::builder()
        .nodes(urls)
        .node_timeout(Duration::from_secs(2))
        .connect_timeout(Duration::from_secs(5))
        .max_backoff(Duration::from_millis(50))
        .retry_count(0)
}

/// An address nothing listens on: a port taken and let go.
fn dead_addr() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let a = l.local_addr().unwrap();
    drop(l);
    a
}

/// Takes locks on fresh resources (`{prefix}:{n}`, counting `n` up) until one's key is
/// seen on `node` with its token; false if none within `PATIENCE`.
fn reached(rl: &mut Redlock, prefix: &str, n: &mut usize, node: &common::Node) -> bool {
    wait_until(PATIENCE, || {
        *n += 1;
        let resource = format!("{prefix}:{n}");
        let Ok(lock) = rl.lock(&resource, Duration::from_secs(30)) else {
            return false;
        };
        let token = lock.token().to_vec();
        wait_until(Duration::from_secs(2), || {
            node.admin().get(&resource).as_deref() == Some(&token[..])
        })
    })
}

#[test]
fn a_name_moved_to_another_server_is_reached_there_at_the_next_connection() {
    let cluster = Cluster::start(3);
    let spare = Cluster::start(1);
    let host = name("moving");
    map_host(&host, &[addr(&cluster, 0)]);
    let urls = vec![
        format!("redis://{host}:6379"),
        cluster.url(1),
        cluster.url(2),
    ];
    let mut rl = builder(urls).build().expect("build");

    // Node 0 is reached through the name: a lock's key lands there.
    let mut n = 0;
    assert!(
        reached(&mut rl, "moving", &mut n, cluster.node(0)),
        "no lock reached node 0 through its name"
    );

    // The name moves to the spare server; the open connection is cut (a pod rescheduled).
    map_host(&host, &[addr(&spare, 0)]);
    let before = n;
    assert!(cluster.node(0).admin().client_kill_normal() >= 1);
    assert!(
        reached(&mut rl, "moving", &mut n, spare.node(0)),
        "no lock reached the name's new address after the reconnect"
    );
    // And nothing taken after the move went to the old address.
    let mut old = cluster.node(0).admin();
    for i in before + 1..=n {
        assert!(
            !old.exists(format!("moving:{i}")),
            "lock {i} reached the old address"
        );
    }
    unmap_host(&host);
}

#[test]
fn every_address_a_name_resolves_to_is_tried_in_order() {
    let cluster = Cluster::start(1);
    let host = name("several");
    // The first address refuses the connection: the second is tried within the same
    // connect.
    map_host(&host, &[dead_addr(), addr(&cluster, 0)]);
    let mut rl = builder(vec![format!("redis://{host}:1")])
        .build()
        .expect("build");
    let mut lock = None;
    assert!(
        wait_until(PATIENCE, || {
            lock = rl.lock("several", Duration::from_secs(30)).ok();
            lock.is_some()
        }),
        "the name's second address was never connected to"
    );
    let lock = lock.unwrap();
    assert_eq!(
        cluster.node(0).admin().get("several").as_deref(),
        Some(lock.token())
    );
    unmap_host(&host);
}

#[test]
fn localhost_goes_through_the_system_resolver() {
    let cluster = Cluster::start(3);
    let port = cluster.node(0).port().unwrap();
    let urls = vec![
        format!("redis://localhost:{port}"),
        cluster.url(1),
        cluster.url(2),
    ];
    let mut rl = builder(urls).build().expect("build");
    let mut n = 0;
    assert!(
        reached(&mut rl, "local", &mut n, cluster.node(0)),
        "no lock reached the node named localhost"
    );
}

/// The report of node 0 in the failure of a lock that another client holds.
fn node0_report(e: &Error) -> Option<String> {
    let f = e.failure()?;
    match &f.nodes[0].outcome {
        Outcome::Failed(why) => Some(why.to_string()),
        _ => None,
    }
}

#[test]
fn a_name_that_does_not_resolve_is_a_node_down_and_build_succeeds() {
    let cluster = Cluster::start(2);
    let mut urls = vec!["redis://nonexistent.invalid:6379".to_string()];
    urls.extend(cluster.urls());
    // `build` resolves nothing: it succeeds whatever the name.
    let mut holder = builder(urls.clone()).build().expect("build");
    let shared = builder(urls.clone()).build_shared().expect("build_shared");
    let mut other = builder(urls).build().expect("build");

    // The two nodes that resolve grant the lock (a quorum of 2 of 3).
    let mut lock = None;
    assert!(wait_until(PATIENCE, || {
        lock = holder.lock("unresolved", Duration::from_secs(30)).ok();
        lock.is_some()
    }));
    let lock = lock.unwrap();
    assert!(lock.is_valid());

    // Another client is refused, and its report says node 0's name does not resolve.
    let mut seen = String::new();
    assert!(
        wait_until(PATIENCE, || {
            let e = other
                .try_lock("unresolved", Duration::from_secs(5))
                .expect_err("held");
            // Held on one node, failed on another: taken or unavailable, as decided.
            assert!(matches!(e, Error::Taken(_) | Error::Unavailable(_)), "{e}");
            seen = node0_report(&e).unwrap_or_default();
            seen.contains("resolve") && seen.contains("nonexistent.invalid")
        }),
        "node 0's report does not name the host that does not resolve: {seen:?}"
    );

    // The shared client's loop is not held by the resolver either.
    let e = shared
        .blocking_try_lock("unresolved", Duration::from_secs(5))
        .expect_err("held");
    assert!(matches!(e, Error::Taken(_) | Error::Unavailable(_)), "{e}");
    let granted = shared
        .blocking_lock("unresolved:free", Duration::from_secs(5))
        .expect("two nodes of three grant it");
    shared.blocking_unlock(&granted).expect("unlock");
    holder.unlock(&lock).expect("unlock");
}

#[test]
fn a_name_that_starts_resolving_later_is_connected_to_then() {
    let cluster = Cluster::start(1);
    let host = name("later");
    // No address yet (a name not yet in DNS): the node is down, naming the host.
    map_host(&host, &[]);
    let shared: SharedRedlock = builder(vec![format!("redis://{host}:1")])
        .build_shared()
        .expect("build_shared: a name that does not resolve yet is no configuration error");
    let e = shared
        .blocking_try_lock("later", Duration::from_secs(5))
        .expect_err("no node");
    assert!(matches!(e, Error::Unavailable(_)), "{e}");
    map_host(&host, &[addr(&cluster, 0)]);
    assert!(
        wait_until(PATIENCE, || shared
            .blocking_try_lock("later", Duration::from_secs(30))
            .is_ok()),
        "the node was not reached once its name resolved"
    );
    assert!(cluster.node(0).admin().exists("later"));
    unmap_host(&host);
}

#[test]
fn a_slow_resolver_holds_no_round_and_not_the_shared_loop() {
    use quorumlock::__private::resolver::map_host_slowly;
    use quorumlock::{NodeError, NodeState};
    let cluster = Cluster::start(3);
    let host = name("slow");
    // Node 0's name takes a minute to resolve: longer than the whole test.
    map_host_slowly(&host, &[addr(&cluster, 0)], Duration::from_secs(60));
    let urls = vec![
        format!("redis://{host}:6379"),
        cluster.url(1),
        cluster.url(2),
    ];
    // The connect timeout covers the resolution: with a minute, node 0 stays connecting.
    let mut rl = builder(urls.clone())
        .connect_timeout(Duration::from_secs(120))
        .build()
        .expect("build");
    let shared = builder(urls.clone())
        .connect_timeout(Duration::from_secs(120))
        .build_shared()
        .expect("build_shared");
    // Both clients grant locks from the other two nodes while node 0 is still resolving:
    // no call waited for the resolver.
    assert!(wait_until(PATIENCE, || rl
        .try_lock("slow:direct", Duration::from_secs(30))
        .is_ok()));
    assert_eq!(rl.health()[0].state, NodeState::Connecting);
    assert!(wait_until(PATIENCE, || shared
        .blocking_try_lock("slow:shared", Duration::from_secs(30))
        .is_ok()));
    assert_eq!(
        shared.blocking_health().unwrap()[0].state,
        NodeState::Connecting
    );

    // With a short connect timeout, a resolver that does not answer in time is a node
    // down that says so.
    let mut rl = builder(urls)
        .connect_timeout(Duration::from_millis(200))
        .build()
        .expect("build");
    let mut seen = Vec::new();
    assert!(
        wait_until(PATIENCE, || {
            let _ = rl.try_lock("slow:timeout", Duration::from_secs(30));
            seen = rl.health();
            matches!(&seen[0].state, NodeState::Down(NodeError::Resolve { host: h, error })
                if *h == host && error.contains("no answer"))
        }),
        "{seen:?}"
    );
}
