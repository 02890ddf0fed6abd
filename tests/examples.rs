//! The examples (examples/*.rs, the demo aside), each run against three real nodes: every
//! one must exit 0, and checks what it shows itself (a refused rival, a job longer than
//! its ttl under one lease, tasks that never overlap, a stale write refused by fence).
//!
//! `cargo test` builds the examples before it runs the tests; run alone, this test needs
//! `cargo build --examples` first (it says so).

mod common;

use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// Each example takes a few seconds; this bounds one that hangs (a bug, or a node that
/// never answers), with room for a loaded 2-core machine: it is then killed and the test
/// fails with what it printed.
const EXAMPLE_DEADLINE: Duration = Duration::from_secs(120);

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

/// Runs the command to its end: its status, stdout and stderr; or kills it at
/// `EXAMPLE_DEADLINE`: no status, and what it printed until then.
fn output_within(mut cmd: Command) -> (Option<ExitStatus>, Vec<u8>, Vec<u8>) {
    let mut child: Child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the example");
    let drain = |mut r: Box<dyn Read + Send>| {
        thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = r.read_to_end(&mut buf);
            buf
        })
    };
    let out = drain(Box::new(child.stdout.take().expect("piped stdout")));
    let err = drain(Box::new(child.stderr.take().expect("piped stderr")));
    let deadline = Instant::now() + EXAMPLE_DEADLINE;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the example") {
            break Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        thread::sleep(Duration::from_millis(20));
    };
    (status, out.join().unwrap(), err.join().unwrap())
}

fn run_example(name: &str) {
    let cluster = common::Cluster::start(3);
    let mut cmd = Command::new(example_binary(name));
    cmd.env("QUORUMLOCK_NODES", cluster.urls().join(","));
    let (status, stdout, stderr) = output_within(cmd);
    let shown = match status {
        Some(status) => status.to_string(),
        None => format!("killed after {EXAMPLE_DEADLINE:?} (still running)"),
    };
    let show = format!(
        "examples/{name}.rs: {shown}\n--- stdout\n{}--- stderr\n{}",
        String::from_utf8_lossy(&stdout),
        String::from_utf8_lossy(&stderr)
    );
    assert!(status.is_some_and(|s| s.success()), "{show}");
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
    let mut cmd = Command::new(example_binary("direct_lock"));
    cmd.env_remove("QUORUMLOCK_NODES");
    let (status, _, stderr) = output_within(cmd);
    assert!(status.is_some_and(|s| !s.success()));
    assert!(String::from_utf8_lossy(&stderr).contains("QUORUMLOCK_NODES"));
}
