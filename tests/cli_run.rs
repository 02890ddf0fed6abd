//! `quorumlock run` against real nodes: the lock outlives the ttl while the command
//! runs; a frozen majority stops the whole process group (grandchildren and a
//! TERM-ignoring child included) before the lock's validity deadline; signals sent to
//! quorumlock reach the command; `kill -9` of quorumlock takes the command with it.

mod cli_common;
mod common;

use cli_common::{
    Pids, Running, children, common_wait, gone_or_zombie, quorumlock, run_sh, signal,
};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::{Duration, Instant};

/// Runs `sh -c` (after `prelude`) that starts a background `sleep` (the grandchild)
/// and loops; returns quorumlock, the pid guard, the child's and the grandchild's pids.
fn family(cluster: &common::Cluster, resource: &str, prelude: &str) -> (Running, Pids, u32, u32) {
    family_with(cluster, resource, prelude, |_| {})
}

/// [`family`], with `setup` applied to quorumlock's command before it starts.
fn family_with(
    cluster: &common::Cluster,
    resource: &str,
    prelude: &str,
    setup: impl FnOnce(&mut Command),
) -> (Running, Pids, u32, u32) {
    let (child_file, grandchild_file) = (
        cluster.dir().join(format!("{resource}-child")),
        cluster.dir().join(format!("{resource}-gc")),
    );
    let script = format!(
        "{prelude}sleep 1000 & echo $! > '{}'; echo $$ > '{}'; while :; do sleep 0.05; done",
        grandchild_file.display(),
        child_file.display()
    );
    let mut cmd = run_sh(&cluster.urls().join(","), resource, &script);
    setup(&mut cmd);
    let run = Running::spawn(cmd);
    let mut pids = Pids::default();
    let child = pids.read(&child_file);
    let grandchild = pids.read(&grandchild_file);
    (run, pids, child, grandchild)
}

/// Waits for an extend of `key` (its PTTL on node 0 goes up) and returns, read right
/// after it, a bound on the lock's validity deadline: no later than `now + pttl − drift`
/// (the extend was sent before node 0 applied it). Whatever stops the next extend must
/// follow at once.
fn after_an_extend(cluster: &common::Cluster, key: &str, ttl: Duration) -> Instant {
    let mut admin = cluster.node(0).admin();
    let mut last = admin.pttl(key);
    assert!(common::wait_until(Duration::from_secs(30), || {
        let now = admin.pttl(key);
        let up = now > last;
        last = now;
        up
    }));
    let read_at = Instant::now();
    let pttl = admin.pttl(key);
    assert!(pttl > 0);
    let drift = ttl / 100 + Duration::from_millis(2);
    read_at + Duration::from_millis(pttl as u64) - drift
}

/// Whether `s` starts with an RFC 3339 UTC time with milliseconds
/// (`2026-01-31T12:00:00.123Z`) of this century.
fn is_rfc3339(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() >= 24
        && s.starts_with("20")
        && b[..24].iter().enumerate().all(|(i, &c)| match i {
            4 | 7 => c == b'-',
            10 => c == b'T',
            13 | 16 => c == b':',
            19 => c == b'.',
            23 => c == b'Z',
            _ => c.is_ascii_digit(),
        })
}

/// Waits (up to 30 s) until the command and its background child are gone (or zombies);
/// whether they went.
fn family_gone(child: u32, grandchild: u32) -> bool {
    common::wait_until(Duration::from_secs(30), || {
        gone_or_zombie(child) && gone_or_zombie(grandchild)
    })
}

#[test]
fn a_job_longer_than_the_ttl_keeps_its_lock() {
    let cluster = common::Cluster::start(3);
    let nodes = cluster.urls().join(",");
    let done = cluster.dir().join("long-done");
    let script = format!("while [ ! -e '{}' ]; do sleep 0.02; done", done.display());
    // ttl 3 s = 3 × (kill-after 200 ms + node timeout 800 ms): the shortest the rule accepts.
    let mut holder = Running::spawn(quorumlock(
        &nodes,
        &[
            "--node-timeout",
            "800ms",
            "--ttl",
            "3s",
            "--kill-after",
            "200ms",
            "run",
            "cli:long",
            "--",
            "sh",
            "-c",
            &script,
        ],
    ));
    let mut admin = cluster.node(0).admin();
    assert!(common::wait_until(Duration::from_secs(20), || admin.exists("cli:long")));
    // The lease is extended every ttl/3: the PTTL goes up, three times, so the job has
    // run past its ttl with the key there all along.
    let started = Instant::now();
    let mut rises = 0;
    let mut last = admin.pttl("cli:long");
    assert!(
        common::wait_until(Duration::from_secs(60), || {
            let now = admin.pttl("cli:long");
            assert!(now > 0, "the key went away while the job ran (PTTL {now})");
            if now > last {
                rises += 1;
            }
            last = now;
            rises >= 3 && started.elapsed() > Duration::from_secs(3)
        }),
        "the lock was not extended ({rises} rises)"
    );
    let out = quorumlock(&nodes, &["try", "cli:long"]).output().unwrap();
    assert_eq!(out.status.code(), Some(75), "{}", cli_common::show(&out));

    std::fs::write(&done, b"").unwrap();
    let (code, err) = holder.finish(Duration::from_secs(30));
    assert_eq!(code, Some(0), "{err}");
    assert!(common::wait_until(Duration::from_secs(10), || !admin.exists("cli:long")));
}

#[test]
fn a_frozen_majority_stops_the_whole_group_before_the_validity_deadline() {
    let cluster = common::Cluster::start(5);
    // The child ignores SIGTERM (and so does its background sleep, which inherits it):
    // only the SIGKILL that follows --kill-after later stops them.
    let (mut run, _pids, child, grandchild) = family(&cluster, "cli:frozen", "trap '' TERM; ");
    let ttl = Duration::from_secs(6);

    // Right after an extend, freeze 3 of 5: no extend succeeds after it.
    let deadline = after_an_extend(&cluster, "cli:frozen", ttl);
    for i in 0..3 {
        cluster.node(i).freeze();
    }

    assert!(
        family_gone(child, grandchild),
        "the process group was not stopped"
    );
    let stopped = Instant::now();
    // Polling here runs every 5 ms; the rule leaves node_timeout + S/4 = 1.5 s to spare.
    assert!(
        stopped < deadline,
        "stopped {:?} after the validity deadline",
        stopped - deadline
    );
    let (code, err) = run.finish(Duration::from_secs(30));
    assert_eq!(code, Some(70), "{err}");
    assert!(err.contains("stopping the command"), "{err}");
    // Why, and since when: the frozen nodes' renewals failing, the others renewing,
    // each line of the report stamped in RFC 3339 UTC.
    let first = err
        .lines()
        .find(|l| l.contains("stopping the command"))
        .unwrap();
    assert!(is_rfc3339(&first["quorumlock: ".len()..]), "{err}");
    assert!(
        err.contains("last renewal a majority confirmed: started"),
        "{err}"
    );
    for i in 0..5 {
        let line = err
            .lines()
            .find(|l| l.starts_with(&format!("quorumlock:   node {i} {}:", cluster.url(i))))
            .unwrap_or_else(|| panic!("no line for node {i}: {err}"));
        if i < 3 {
            let since = line.split_once("renewals failing since ").map(|(_, s)| s);
            assert!(since.is_some_and(is_rfc3339), "{line}");
        } else {
            assert!(line.contains(": renewing"), "{line}");
        }
    }
    for i in 0..3 {
        cluster.node(i).thaw();
    }
}

#[test]
fn sigterm_to_quorumlock_reaches_the_command_and_the_lock_is_released() {
    let cluster = common::Cluster::start(3);
    let nodes = cluster.urls().join(",");
    let (ready, marker) = (cluster.dir().join("ready"), cluster.dir().join("got-term"));
    let script = format!(
        "trap 'echo term > \"{}\"; exit 7' TERM; echo $$ > '{}'; while :; do sleep 0.05; done",
        marker.display(),
        ready.display()
    );
    let mut run = Running::spawn(run_sh(&nodes, "cli:term", &script));
    let mut pids = Pids::default();
    pids.read(&ready);
    signal(run.pid(), libc::SIGTERM);
    let (code, err) = run.finish(Duration::from_secs(30));
    assert_eq!(code, Some(7), "{err}");
    assert!(marker.exists(), "the command never got the SIGTERM");
    let mut admins = cluster.admins();
    assert!(common::wait_until(Duration::from_secs(10), || {
        admins.iter_mut().all(|a| !a.exists("cli:term"))
    }));

    // SIGINT to quorumlock, a command that does not catch it: 128 + 2.
    let ready = cluster.dir().join("ready-int");
    let script = format!("echo $$ > '{}'; exec sleep 1000", ready.display());
    let mut run = Running::spawn(run_sh(&nodes, "cli:term", &script));
    pids.read(&ready);
    signal(run.pid(), libc::SIGINT);
    let (code, err) = run.finish(Duration::from_secs(30));
    assert_eq!(code, Some(130), "{err}");

    // SIGHUP (the terminal went away): 128 + 1.
    let ready = cluster.dir().join("ready-hup");
    let script = format!("echo $$ > '{}'; exec sleep 1000", ready.display());
    let mut run = Running::spawn(run_sh(&nodes, "cli:term", &script));
    pids.read(&ready);
    signal(run.pid(), libc::SIGHUP);
    let (code, err) = run.finish(Duration::from_secs(30));
    assert_eq!(code, Some(129), "{err}");
}

#[test]
fn a_lock_taken_away_on_a_majority_stops_the_group_sigterm_first_and_exits_70() {
    let cluster = common::Cluster::start(3);
    let marker = cluster.dir().join("lost-got-term");
    // The child leaves on SIGTERM (inside the TERM->KILL window): the grandchild goes
    // with the same SIGTERM; the exit code still says the lock was lost.
    let prelude = format!("trap 'echo term > \"{}\"; exit 0' TERM; ", marker.display());
    let (mut run, _pids, child, grandchild) = family(&cluster, "cli:lost", &prelude);
    let mut admins = cluster.admins();
    for admin in &mut admins[..2] {
        assert_eq!(admin.del("cli:lost"), 1);
    }
    // The next extend (ttl/3 = 2 s) finds the key gone on a majority.
    assert!(
        family_gone(child, grandchild),
        "the process group was not stopped"
    );
    let (code, err) = run.finish(Duration::from_secs(30));
    assert_eq!(code, Some(70), "{err}");
    assert!(err.contains("the lock was lost (taken over"), "{err}");
    assert!(
        err.contains("a majority no longer holds this lock's token"),
        "{err}"
    );
    assert_eq!(err.matches("does not hold this token").count(), 2, "{err}");
    assert!(
        marker.exists(),
        "the command was not sent SIGTERM first: {err}"
    );
    assert!(common::wait_until(Duration::from_secs(10), || {
        admins.iter_mut().all(|a| !a.exists("cli:lost"))
    }));
}

#[test]
fn the_watchdog_outlives_a_sigquit_to_quorumlocks_whole_group_and_kills_the_command_group() {
    let cluster = common::Cluster::start(3);
    let (mut run, _pids, child, grandchild) = family_with(&cluster, "cli:quit", "", |cmd| {
        // Its own group, as a shell job is; SIGQUIT at its default action (a shell's
        // background job, the test run included, may inherit it ignored), and no core
        // file when it kills.
        cmd.process_group(0);
        // SAFETY: setrlimit and signal with valid arguments, between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                let none = libc::rlimit {
                    rlim_cur: 0,
                    rlim_max: 0,
                };
                libc::setrlimit(libc::RLIMIT_CORE, &none);
                libc::signal(libc::SIGQUIT, libc::SIG_DFL);
                Ok(())
            });
        }
    });
    // ^\ on a terminal: SIGQUIT to quorumlock and its watchdog. quorumlock dies of it
    // (it does not catch it); the child goes by its parent-death signal, the
    // grandchild only by the watchdog.
    // SAFETY: kill with plain integers, to the group of a process this test started.
    assert_eq!(unsafe { libc::kill(-(run.pid() as i32), libc::SIGQUIT) }, 0);
    let (code, _) = run.finish(Duration::from_secs(10));
    assert_eq!(code, None, "killed by SIGQUIT");
    assert!(
        family_gone(child, grandchild),
        "the command or its child outlived quorumlock"
    );
}

#[test]
fn the_watchdog_is_let_go_and_reaped_when_run_ends_normally() {
    let cluster = common::Cluster::start(3);
    let (mut run, mut pids, child, _) = family(&cluster, "cli:reaped", "");
    // quorumlock's children: the command and the watchdog.
    let mut watchdog = None;
    assert!(common_wait(Duration::from_secs(10), || {
        watchdog = children(run.pid()).into_iter().find(|&p| p != child);
        watchdog.is_some()
    }));
    let watchdog = watchdog.unwrap();
    pids.0.push(watchdog);
    assert!(!gone_or_zombie(watchdog));
    signal(run.pid(), libc::SIGTERM);
    let (code, err) = run.finish(Duration::from_secs(30));
    assert_eq!(code, Some(128 + libc::SIGTERM), "{err}");
    assert!(gone_or_zombie(watchdog), "the watchdog outlived quorumlock");
}

#[test]
fn kill_9_of_quorumlock_takes_the_command_and_its_children_with_it() {
    let cluster = common::Cluster::start(3);
    let (mut run, _pids, child, grandchild) = family(&cluster, "cli:kill9", "");
    assert!(!gone_or_zombie(child) && !gone_or_zombie(grandchild));
    signal(run.pid(), libc::SIGKILL);
    let (code, _) = run.finish(Duration::from_secs(10));
    assert_eq!(code, None, "killed by a signal");
    assert!(
        family_gone(child, grandchild),
        "the command or its child outlived quorumlock"
    );
}

#[test]
fn what_the_command_leaves_in_its_group_is_stopped_before_the_release() {
    let cluster = common::Cluster::start(3);
    let nodes = cluster.urls().join(",");
    let grandchild_file = cluster.dir().join("gc");
    let script = format!(
        "sleep 1000 & echo $! > '{}'; exit 4",
        grandchild_file.display()
    );
    let out = run_sh(&nodes, "cli:left", &script).output().unwrap();
    let mut pids = Pids::default();
    let grandchild = pids.read(&grandchild_file);
    assert_eq!(out.status.code(), Some(4), "{}", cli_common::show(&out));
    assert!(
        gone_or_zombie(grandchild),
        "the background sleep outlived the lock"
    );
}

/// quorumlock stopped right after an extend, by a SIGSTOP to it alone or to its job's
/// whole process group (`kill -STOP %1`): the command (it ignores SIGTERM; quorumlock,
/// stopped, sends nothing anyway) must be gone before the lock's validity deadline, by
/// the watchdog, which holds the moment the group must be gone by.
fn stopped_quorumlock_stops_the_command(resource: &str, whole_group: bool) {
    let cluster = common::Cluster::start(3);
    let (mut run, _pids, child, grandchild) =
        family_with(&cluster, resource, "trap '' TERM; ", |cmd| {
            cmd.process_group(0);
        });
    let ttl = Duration::from_secs(6);
    let target = if whole_group {
        -(run.pid() as i32)
    } else {
        run.pid() as i32
    };
    let stop = |sig| {
        // SAFETY: kill with plain integers, to a process (group) this test started.
        assert_eq!(unsafe { libc::kill(target, sig) }, 0);
    };
    let deadline = after_an_extend(&cluster, resource, ttl);
    stop(libc::SIGSTOP);
    let gone = family_gone(child, grandchild);
    let stopped = Instant::now();
    stop(libc::SIGCONT);
    assert!(
        gone,
        "the command outlived the lock while quorumlock was stopped"
    );
    // The watchdog kills half the spare (0.75 s here) before the deadline.
    assert!(
        stopped < deadline,
        "stopped {:?} after the validity deadline",
        stopped - deadline
    );
    // Resumed, quorumlock finds its command killed by the rule.
    let (code, err) = run.finish(Duration::from_secs(30));
    assert_eq!(code, Some(70), "{err}");
    assert!(err.contains("watchdog killed the command"), "{err}");
}

#[test]
fn a_stopped_quorumlock_cannot_let_the_command_outlive_the_lock() {
    stopped_quorumlock_stops_the_command("cli:paused", false);
}

#[test]
fn a_stopped_job_cannot_let_the_command_outlive_the_lock() {
    stopped_quorumlock_stops_the_command("cli:paused-job", true);
}

/// Whether this kernel lets a process open a pidfd (Linux 5.3 on, unless a sandbox
/// refuses it): how quorumlock's watchdog learns when the command exited.
fn pidfds() -> bool {
    // SAFETY: pidfd_open with plain integers, on this process; the fd is closed.
    unsafe {
        let fd = libc::syscall(libc::SYS_pidfd_open, libc::getpid(), 0);
        if fd >= 0 {
            libc::close(fd as libc::c_int);
        }
        fd >= 0
    }
}

#[test]
fn a_command_that_ends_while_quorumlock_is_stopped_keeps_its_own_status() {
    let cluster = common::Cluster::start(3);
    let (done, pid_file) = (
        cluster.dir().join("stopped-done"),
        cluster.dir().join("stopped-pid"),
    );
    let script = format!(
        "echo $$ > '{}'; while [ ! -e '{}' ]; do sleep 0.02; done",
        pid_file.display(),
        done.display()
    );
    let mut run = Running::spawn(run_sh(&cluster.urls().join(","), "cli:ends", &script));
    let mut pids = Pids::default();
    let child = pids.read(&pid_file);
    let ttl = Duration::from_secs(6);
    after_an_extend(&cluster, "cli:ends", ttl);
    signal(run.pid(), libc::SIGSTOP);
    // The command ends on its own while quorumlock is stopped ...
    std::fs::write(&done, b"").unwrap();
    assert!(
        common::wait_until(Duration::from_secs(30), || gone_or_zombie(child)),
        "the command did not end"
    );
    // ... and quorumlock is resumed only once the lock has expired on every node: past
    // the watchdog's backstop and the lease's deadline. Its watchdog saw the command
    // exit before them: the command's own status, not 70.
    let mut admins = cluster.admins();
    assert!(
        common::wait_until(Duration::from_secs(30), || {
            admins.iter_mut().all(|a| !a.exists("cli:ends"))
        }),
        "the lock never expired"
    );
    signal(run.pid(), libc::SIGCONT);
    let (code, err) = run.finish(Duration::from_secs(30));
    if pidfds() {
        assert_eq!(code, Some(0), "{err}");
    } else {
        // Without a pidfd nothing tells when the command ended: counted as lost.
        assert_eq!(code, Some(70), "{err}");
    }
}
