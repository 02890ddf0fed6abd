//! What the command-line tests share: the binary with generous node timeouts, processes
//! stopped by pid on drop (also when an assertion fails), and pid files.
#![allow(dead_code)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

/// The binary, with `--nodes` and a node timeout of 1 s (not its 200 ms default): on a
/// loaded machine a healthy node must not miss a round. (A bare number is seconds.)
pub fn quorumlock(nodes: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_quorumlock"));
    cmd.env_remove("QUORUMLOCK_NODES")
        .arg("--nodes")
        .arg(nodes)
        .args(["--node-timeout", "1"])
        .args(args)
        .stdin(Stdio::null());
    cmd
}

/// The binary with only the given arguments (no nodes, no timeout).
pub fn bare(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_quorumlock"));
    cmd.env_remove("QUORUMLOCK_NODES")
        .args(args)
        .stdin(Stdio::null());
    cmd
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Code, stdout and stderr, for assertion messages.
pub fn show(out: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}--- stderr\n{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    )
}

/// A started `quorumlock`, killed (SIGKILL) and reaped on drop unless it was waited for.
pub struct Running(pub Option<Child>);

impl Running {
    pub fn spawn(mut cmd: Command) -> Running {
        Running(Some(
            cmd.stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn quorumlock"),
        ))
    }

    pub fn pid(&self) -> u32 {
        self.0.as_ref().expect("running").id()
    }

    /// Waits for it to exit (within `timeout`, else panics); its exit code and stderr.
    /// Its stderr is read by a thread and taken as far as it got a moment after the
    /// exit: a process that outlived quorumlock and still holds that pipe (the very bug
    /// some tests look for) must fail their assertions, not hang them.
    pub fn finish(&mut self, timeout: Duration) -> (Option<i32>, String) {
        let mut child = self.0.take().expect("running");
        let pid = child.id();
        let mut stderr = child.stderr.take().expect("stderr piped");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = stderr.read(&mut buf) {
                if tx.send(buf[..n].to_vec()).is_err() {
                    return;
                }
            }
        });
        if !common_wait(timeout, || gone_or_zombie(pid)) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("quorumlock (pid {pid}) did not exit within {timeout:?}");
        }
        let status = child.wait().expect("wait quorumlock");
        let mut err = Vec::new();
        let until = std::time::Instant::now() + Duration::from_secs(2);
        while let Ok(chunk) =
            rx.recv_timeout(until.saturating_duration_since(std::time::Instant::now()))
        {
            err.extend_from_slice(&chunk);
        }
        (status.code(), text(&err))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Pids read from files the commands under test write; each is sent SIGKILL on drop,
/// so a failing test leaves no `sleep` behind.
#[derive(Default)]
pub struct Pids(pub Vec<u32>);

impl Pids {
    /// Waits for `path` to hold a pid, and remembers it.
    pub fn read(&mut self, path: &Path) -> u32 {
        let mut pid = None;
        assert!(
            common_wait(Duration::from_secs(20), || {
                pid = std::fs::read_to_string(path)
                    .ok()
                    .and_then(|s| s.trim().parse().ok());
                pid.is_some()
            }),
            "no pid in {}",
            path.display()
        );
        let pid = pid.unwrap();
        self.0.push(pid);
        pid
    }
}

impl Drop for Pids {
    fn drop(&mut self) {
        for &pid in &self.0 {
            if !gone_or_zombie(pid) {
                // SAFETY: kill with plain integers, to a pid this test started.
                unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            }
        }
    }
}

/// Sends `sig` to `pid`.
pub fn signal(pid: u32, sig: i32) {
    // SAFETY: kill with plain integers.
    assert_eq!(
        unsafe { libc::kill(pid as libc::pid_t, sig) },
        0,
        "kill {pid}"
    );
}

/// True when `pid` no longer runs: gone, or a zombie (an orphan whose reaper, e.g. a
/// container's pid 1, does not reap).
pub fn gone_or_zombie(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].trim_start().chars().next())
            .is_some_and(|state| state == 'Z' || state == 'X'),
    }
}

/// The processes whose parent is `pid` (from /proc).
pub fn children(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&p| {
            std::fs::read_to_string(format!("/proc/{p}/stat"))
                .ok()
                .and_then(|stat| {
                    let fields = stat[stat.rfind(')')? + 1..].to_string();
                    fields.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(pid)
        })
        .collect()
}

/// Whether `pid` has a handler installed for `sig` (its SigCgt mask in /proc).
pub fn catches(pid: u32, sig: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            let mask = status.lines().find_map(|l| l.strip_prefix("SigCgt:"))?;
            u64::from_str_radix(mask.trim(), 16).ok()
        })
        .is_some_and(|mask| mask & (1 << (sig - 1)) != 0)
}

/// Waits for `f` to hold, checking every 5 ms, until `timeout`; whether it did.
pub fn common_wait(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A fresh path in `dir`.
pub fn file(dir: &Path, name: &str) -> PathBuf {
    dir.join(name)
}

/// `run RESOURCE -- COMMAND...` with `--ttl 6s --kill-after 1s` (3 × (1 s + the 1 s node
/// timeout): the shortest ttl the stop rule accepts for them).
pub fn run(nodes: &str, resource: &str, command: &[&str]) -> Command {
    let mut args = vec!["--ttl", "6s", "--kill-after", "1s", "run", resource, "--"];
    args.extend_from_slice(command);
    quorumlock(nodes, &args)
}

/// `sh -c SCRIPT` under `run`.
pub fn run_sh(nodes: &str, resource: &str, script: &str) -> Command {
    run(nodes, resource, &["sh", "-c", script])
}
