//! The command-line tool: runs a command under the lock, passes its exit status through,
//! refuses a held lock with EX_TEMPFAIL, and rejects bad settings with EX_USAGE.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

/// The CLI with a node timeout of 1 s (not its 50 ms default): on a loaded machine a
/// healthy node must not miss a round.
fn quorumlock(nodes: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_quorumlock"));
    cmd.arg("--nodes")
        .arg(nodes)
        .args(["--timeout", "1000"])
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

    // While one `run` holds the lock, `try` is refused with 75. The held command runs
    // until the test lets it go (a file appears), not for a fixed time.
    let done = cluster.dir().join("cli-b-done");
    let script = format!("while [ ! -e '{}' ]; do sleep 0.02; done", done.display());
    let mut holder = quorumlock(
        &nodes,
        &["--ttl", "2000", "run", "cli:b", "--", "sh", "-c", &script],
    )
    .spawn()
    .unwrap();
    let mut admin = cluster.node(0).admin();
    assert!(common::wait_until(Duration::from_secs(10), || admin.exists("cli:b")));
    // The holder extends the ttl (every ttl/3): seen on the node as a PTTL that goes up.
    let mut last = admin.pttl("cli:b");
    assert!(
        common::wait_until(Duration::from_secs(10), || {
            let now = admin.pttl("cli:b");
            let extended = now > last;
            last = now;
            extended
        }),
        "the holder never extended its lock (PTTL {last})"
    );
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
    std::fs::write(&done, b"").unwrap();
    assert_eq!(holder.wait().unwrap().code(), Some(0));
    // Released at the end (the unlock may reach node 0 after the quorum answered).
    assert!(common::wait_until(Duration::from_secs(10), || !admin.exists("cli:b")));
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
