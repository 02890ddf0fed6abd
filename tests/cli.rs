//! The command-line tool: runs a command under the lock, passes its exit status through,
//! refuses a held lock with EX_TEMPFAIL, and rejects bad settings with EX_USAGE.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

fn quorumlock(nodes: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_quorumlock"));
    cmd.arg("--nodes")
        .arg(nodes)
        .args(args)
        .stdin(Stdio::null());
    cmd
}

#[test]
fn run_holds_the_lock_for_the_command_and_passes_its_status_through() {
    let cluster = common::Cluster::start(3);
    let nodes = cluster.urls().join(",");
    let status = quorumlock(&nodes, &["run", "cli:a", "--", "sh", "-c", "exit 3"])
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(3));

    // While one `run` holds the lock (a sleeping command), `try` is refused with 75.
    let mut holder = quorumlock(
        &nodes,
        &["--ttl", "600", "run", "cli:b", "--", "sleep", "1.5"],
    )
    .spawn()
    .unwrap();
    assert!(common::wait_until(Duration::from_secs(5), || cluster
        .node(0)
        .admin()
        .exists("cli:b")));
    // Longer than the ttl: the holder must have extended it meanwhile.
    std::thread::sleep(Duration::from_millis(800));
    let out = quorumlock(&nodes, &["--retries", "0", "try", "cli:b"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(75),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("held by another client"));
    assert_eq!(holder.wait().unwrap().code(), Some(0));
    // Released at the end.
    assert!(!cluster.node(0).admin().exists("cli:b"));
    let out = quorumlock(&nodes, &["try", "cli:b"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
}

#[test]
fn bad_settings_are_usage_errors() {
    let out = quorumlock("http://x", &["try", "r"]).output().unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("scheme"));
    let out = quorumlock("redis://127.0.0.1:1", &["--ttl", "soon", "try", "r"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let out = quorumlock("redis://127.0.0.1:1", &["run", "r", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
}
