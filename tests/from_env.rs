//! `Builder::from_env` against the real environment and real nodes. One test in this
//! binary: it alone sets the process's environment.

mod common;

use common::{Cluster, wait_until};
use quorumlock::{Builder, Error};
use std::time::Duration;

#[test]
fn a_client_configured_from_the_environment_locks() {
    let cluster = Cluster::start(3);
    let nodes = cluster.urls().join(", ");
    // SAFETY: the only test of this binary, and no other thread reads the environment.
    unsafe {
        std::env::set_var("QUORUMLOCK_NODES", "");
        std::env::set_var("QUORUMLOCK_FENCING", "on");
    }
    let e = Builder::from_env().expect_err("no nodes");
    assert!(
        matches!(&e, Error::Config(c) if c.setting == "QUORUMLOCK_NODES"),
        "{e}"
    );
    unsafe {
        std::env::set_var("QUORUMLOCK_NODES", &nodes);
        std::env::set_var("QUORUMLOCK_NODE_TIMEOUT", "2");
    }
    let shared = Builder::from_env()
        .expect("from_env")
        .build_shared()
        .expect("build");
    assert_eq!(shared.settings().node_timeout, Duration::from_secs(2));
    let mut lock = None;
    assert!(wait_until(Duration::from_secs(10), || {
        lock = shared
            .blocking_try_lock("from-env", Duration::from_secs(30))
            .ok();
        lock.is_some()
    }));
    let lock = lock.unwrap();
    assert!(lock.fence().is_some(), "QUORUMLOCK_FENCING=on took effect");
    shared.blocking_unlock(&lock).expect("unlock");
}
