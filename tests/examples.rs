//! The examples (examples/*.rs, the demo aside), each run against three real nodes: every
//! one must exit 0, and checks what it shows itself (a refused rival, a job longer than
//! its ttl under one lease, tasks that never overlap, a stale write refused by fence).
//!
//! `cargo test` builds the examples before it runs the tests; run alone, this test needs
//! `cargo build --examples` first (it says so).

mod common;

use std::path::PathBuf;
use std::process::Command;

/// target/<profile>/examples/<name>, beside this test's own deps/ directory.
fn example_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps/<test>");
    let path = profile_dir.join("examples").join(name);
    assert!(
        path.exists(),
        "{} does not exist: build the examples first (`cargo build --examples`; a plain \
         `cargo test` builds them)",
        path.display()
    );
    path
}

fn run_example(name: &str) {
    let cluster = common::Cluster::start(3);
    let out = Command::new(example_binary(name))
        .env("QUORUMLOCK_NODES", cluster.urls().join(","))
        .output()
        .expect("start the example");
    let show = format!(
        "examples/{name}.rs: {}\n--- stdout\n{}--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{show}");
    println!("{show}");
}

#[test]
fn direct_lock() {
    run_example("direct_lock");
}

#[test]
fn lease() {
    run_example("lease");
}

#[test]
fn shared_tokio() {
    run_example("shared_tokio");
}

#[test]
fn fencing() {
    run_example("fencing");
}

#[test]
fn an_example_without_nodes_fails() {
    let out = Command::new(example_binary("direct_lock"))
        .env_remove("QUORUMLOCK_NODES")
        .output()
        .expect("start the example");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("QUORUMLOCK_NODES"));
}
