//! The command-line tool, action by action: every exit code, strict parsing, `--help`,
//! `try`, `status`, `bench`, waiting with `--wait`. (The process-group and signal
//! scenarios of `run` are in tests/cli_run.rs.)

mod cli_common;
mod common;

use cli_common::{Running, bare, quorumlock, show, text};
use std::time::Duration;

/// A `run` that holds `resource` until the test creates the file it returns.
fn hold(nodes: &str, cluster: &common::Cluster, resource: &str) -> (Running, std::path::PathBuf) {
    let done = cluster.dir().join(format!("{resource}-done"));
    let script = format!("while [ ! -e '{}' ]; do sleep 0.02; done", done.display());
    let holder = Running::spawn(quorumlock(
        nodes,
        &[
            "--ttl",
            "6s",
            "--kill-after",
            "500ms",
            "run",
            resource,
            "--",
            "sh",
            "-c",
            &script,
        ],
    ));
    let mut admin = cluster.node(0).admin();
    assert!(
        common::wait_until(Duration::from_secs(20), || admin.exists(resource)),
        "the holder never took {resource}"
    );
    (holder, done)
}

/// Ends a [`hold`]: its command exits, and so does the run, with 0.
fn let_go(mut holder: Running, done: &std::path::Path) {
    std::fs::write(done, b"").unwrap();
    assert_eq!(holder.finish(Duration::from_secs(30)).0, Some(0));
}

#[test]
fn help_and_version_go_to_stdout_with_status_0() {
    let out = bare(&["--help"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    let help = text(&out.stdout);
    for needle in [
        "run RESOURCE -- COMMAND",
        "try RESOURCE",
        "status RESOURCE",
        "bench",
        "--kill-after DURATION",
        "(default 2s",
        "--ttl DURATION",
        "(default 30s)",
        "-w, --wait SECONDS",
        "-n, --nonblock",
        "-E, --conflict-exit-code N",
        "(default 75)",
        "--node-timeout DURATION",
        "(default 200ms)",
        "--fencing",
        "--restart-guard DURATION",
        "--nodes-file PATH",
        "QUORUMLOCK_FENCE",
        "QUORUMLOCK_TOKEN_PREFIX",
        "QUORUMLOCK_RESOURCE",
        "RFC 3339",
        "QUORUMLOCK_NODES",
        "EXIT STATUS",
        "75",
        "69",
        "70",
        "64",
        "127",
        "kill-after + node-timeout + (kill-after + node-timeout) / 4",
        "EXAMPLE",
    ] {
        assert!(help.contains(needle), "--help lacks {needle:?}:\n{help}");
    }
    assert!(out.stderr.is_empty());
    let out = bare(&["try", "x", "-h"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));

    let out = bare(&["--version"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        text(&out.stdout),
        format!("quorumlock {}\n", env!("CARGO_PKG_VERSION"))
    );
    assert_eq!(bare(&["-V"]).output().unwrap().stdout, out.stdout);
}

#[test]
fn every_kind_of_bad_argument_is_a_usage_error_before_anything_runs() {
    let dir = std::env::temp_dir().join(format!("quorumlock-cli-usage-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let marker = dir.join("ran");
    let touch = format!("touch '{}'", marker.display());
    let node = "redis://127.0.0.1:1";
    let cases: Vec<Vec<&str>> = vec![
        vec![],                                                 // no action
        vec!["frob", "x"],                                      // unknown action
        vec!["try"],                                            // missing resource
        vec!["try", "x", "y"],                                  // extra positional
        vec!["try", "x", "--bogus"],                            // unknown option
        vec!["try", "x", "--ttl"],                              // missing value
        vec!["try", "x", "--ttl", "soon"],                      // not a duration
        vec!["try", "x", "--ttl", "10q"],                       // bad unit
        vec!["try", "x", "--ttl", "0"],                         // zero ttl
        vec!["try", "x", "--ttl", "99999999999999999999h"],     // overflow
        vec!["try", "x", "--node-timeout", "0s"],               // zero node timeout
        vec!["try", "x", "--timeout", "1"],                     // the old flag
        vec!["try", "x", "--", "sh"],                           // a command for try
        vec!["try", "x", "--count", "3"],                       // bench's option
        vec!["run", "x", "sh", "-c", "true"],                   // no --
        vec!["run", "x", "--"],                                 // no command
        vec!["run", "x", "--ttl=2s", "--", "sh", "-c", &touch], // ttl <= kill-after
        vec![
            "run",
            "x",
            "--ttl",
            "4s",
            "--kill-after",
            "3s",
            "--",
            "sh",
            "-c",
            &touch,
        ],
    ];
    for args in &cases {
        let out = quorumlock(node, args).output().unwrap();
        assert_eq!(out.status.code(), Some(64), "{args:?}: {}", show(&out));
        assert!(out.stdout.is_empty(), "{args:?}: {}", show(&out));
        let err = text(&out.stderr);
        assert!(
            err.starts_with("quorumlock: ") && err.ends_with("try 'quorumlock --help'\n"),
            "{args:?}: {}",
            show(&out)
        );
        assert_eq!(err.lines().count(), 2, "{args:?}: {}", show(&out));
    }
    assert!(!marker.exists(), "a refused run ran its command");

    // Bad node URLs, named without their password; no nodes at all.
    let out = quorumlock("http://x", &["try", "r"]).output().unwrap();
    assert_eq!(out.status.code(), Some(64), "{}", show(&out));
    assert!(text(&out.stderr).contains("scheme"));
    let out = quorumlock("redis://app:hunter2@127.0.0.1:99999", &["status", "r"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64), "{}", show(&out));
    assert!(!text(&out.stderr).contains("hunter2"), "{}", show(&out));
    let out = bare(&["try", "r"]).output().unwrap();
    assert_eq!(out.status.code(), Some(64), "{}", show(&out));
    assert!(text(&out.stderr).contains("QUORUMLOCK_NODES"));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn run_passes_the_commands_status_through_as_a_shell_would() {
    let cluster = common::Cluster::start(3);
    let nodes = cluster.urls().join(",");
    let run = |args: &[&str]| {
        let mut all = vec![
            "--ttl",
            "6s",
            "--kill-after",
            "500ms",
            "run",
            "cli:status",
            "--",
        ];
        all.extend_from_slice(args);
        quorumlock(&nodes, &all).output().unwrap()
    };
    assert_eq!(run(&["true"]).status.code(), Some(0));
    assert_eq!(run(&["sh", "-c", "exit 3"]).status.code(), Some(3));
    // Killed by SIGUSR1 (10): 128 + 10.
    assert_eq!(run(&["sh", "-c", "kill -USR1 $$"]).status.code(), Some(138));
    // Options after the action and resource, the command's own options after --.
    let out = quorumlock(
        &nodes,
        &[
            "run",
            "cli:status",
            "--ttl=6s",
            "--kill-after",
            "1s",
            "--",
            "sh",
            "-c",
            "echo \"$0\" --ttl",
            "zero",
        ],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    assert_eq!(text(&out.stdout), "zero --ttl\n");

    let out = run(&["/nonexistent/quorumlock-test-command"]);
    assert_eq!(out.status.code(), Some(127), "{}", show(&out));
    let not_executable = cluster.dir().join("not-executable");
    std::fs::write(&not_executable, "#!/bin/sh\n").unwrap();
    let out = run(&[not_executable.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(126), "{}", show(&out));
    // Released every time: the lock is free.
    let out = quorumlock(&nodes, &["try", "cli:status"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
}

#[test]
fn try_and_status_while_a_run_holds_the_lock_and_after() {
    let cluster = common::Cluster::start(3);
    let nodes = cluster.urls().join(",");

    let out = quorumlock(&nodes, &["try", "cli:probe"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    assert!(text(&out.stdout).contains("acquired \"cli:probe\""));
    assert!(out.stderr.is_empty(), "{}", show(&out));
    let out = quorumlock(&nodes, &["status", "cli:probe"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", show(&out));

    let (mut holder, done) = hold(&nodes, &cluster, "cli:probe");
    let out = quorumlock(&nodes, &["try", "cli:probe"]).output().unwrap();
    assert_eq!(out.status.code(), Some(75), "{}", show(&out));
    assert!(out.stdout.is_empty(), "{}", show(&out));
    assert!(
        text(&out.stderr).contains("held by another client"),
        "{}",
        show(&out)
    );

    let token = cluster.node(0).admin().get("cli:probe").unwrap();
    let token = text(&token);
    let out = quorumlock(&nodes, &["status", "cli:probe"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{stdout}");
    for (i, line) in lines[..3].iter().enumerate() {
        assert!(
            line.starts_with(&format!("node {i} {}", cluster.url(i))),
            "{line}"
        );
        // The holder's token prefix (as its command sees it), never the whole token.
        assert!(line.contains(&format!("token={}…", &token[..8])), "{line}");
        assert!(!line.contains(&token), "{line}");
        assert!(line.contains("pttl=") && line.contains("run_id=") && line.contains("uptime="));
    }
    assert!(
        lines[3].contains("is held") && lines[3].contains("3 of 3"),
        "{stdout}"
    );

    std::fs::write(&done, b"").unwrap();
    assert_eq!(holder.finish(Duration::from_secs(30)).0, Some(0));
    let mut admins = cluster.admins();
    assert!(common::wait_until(Duration::from_secs(10), || {
        admins.iter_mut().all(|a| !a.exists("cli:probe"))
    }));
    let out = quorumlock(&nodes, &["status", "cli:probe"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", show(&out));
    assert!(text(&out.stdout).contains("free"));
}

#[test]
fn status_says_which_nodes_fail_and_whether_a_majority_holds() {
    let cluster = common::Cluster::start(3);
    let nodes = cluster.urls().join(",");
    let (mut holder, done) = hold(&nodes, &cluster, "cli:minority");
    cluster.node(2).kill();
    // Two of three still hold the token: a majority.
    let out = quorumlock(&nodes, &["status", "cli:minority"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    assert!(
        text(&out.stdout).lines().nth(2).unwrap().contains("error"),
        "{}",
        show(&out)
    );
    // Delete it on one more: no majority.
    cluster.node(1).admin().del("cli:minority");
    let out = quorumlock(&nodes, &["status", "cli:minority"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", show(&out));
    std::fs::write(&done, b"").unwrap();
    // The holder notices the loss (or not, depending on timing): either way it ends.
    let _ = holder.finish(Duration::from_secs(30));
}

#[test]
fn nodes_that_do_not_answer_are_unavailable_69() {
    let nodes: Vec<String> = (0..3)
        .map(|_| format!("redis://127.0.0.1:{}", common::free_port()))
        .collect();
    let nodes = nodes.join(",");
    for args in [
        &["try", "cli:down"][..],
        &["bench", "--count", "5"],
        &[
            "--ttl",
            "6s",
            "--kill-after",
            "1s",
            "run",
            "cli:down",
            "--",
            "sh",
            "-c",
            "exit 9",
        ],
    ] {
        let out = quorumlock(&nodes, args).output().unwrap();
        assert_eq!(out.status.code(), Some(69), "{args:?}: {}", show(&out));
        assert!(
            text(&out.stderr).contains("too few Redis nodes answered"),
            "{}",
            show(&out)
        );
    }
    let out = quorumlock(&nodes, &["status", "cli:down"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", show(&out));
    assert_eq!(
        text(&out.stdout).matches(": error: ").count(),
        3,
        "{}",
        show(&out)
    );
}

#[test]
fn wait_gives_up_with_75_or_gets_the_lock_when_the_holder_releases() {
    let cluster = common::Cluster::start(3);
    let nodes = cluster.urls().join(",");
    let (mut holder, done) = hold(&nodes, &cluster, "cli:wait");
    let marker = cluster.dir().join("waiter-ran");
    let touch = format!("touch '{}'", marker.display());
    let run = |wait: &str| {
        quorumlock(
            &nodes,
            &[
                "--ttl",
                "6s",
                "--kill-after",
                "500ms",
                "--wait",
                wait,
                "run",
                "cli:wait",
                "--",
                "sh",
                "-c",
                &touch,
            ],
        )
    };
    let out = run("300ms").output().unwrap();
    assert_eq!(out.status.code(), Some(75), "{}", show(&out));
    assert!(!marker.exists());
    // With -n: one attempt.
    let out = quorumlock(&nodes, &["-n", "run", "cli:wait", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(75), "{}", show(&out));

    // A signal while waiting: given up, with 128 + n, and nothing run.
    let mut waiter = Running::spawn(run("60s"));
    let pid = waiter.pid();
    assert!(common::wait_until(Duration::from_secs(10), || {
        cli_common::catches(pid, libc::SIGINT)
    }));
    cli_common::signal(pid, libc::SIGINT);
    let (code, err) = waiter.finish(Duration::from_secs(30));
    assert_eq!(code, Some(130), "{err}");
    assert!(err.contains("nothing was run"), "{err}");
    assert!(!marker.exists());

    let mut waiter = Running::spawn(run("60s"));
    std::thread::sleep(Duration::from_millis(200));
    assert!(!marker.exists(), "the waiter ran while the lock was held");
    std::fs::write(&done, b"").unwrap();
    assert_eq!(holder.finish(Duration::from_secs(30)).0, Some(0));
    let (code, err) = waiter.finish(Duration::from_secs(60));
    assert_eq!(code, Some(0), "{err}");
    assert!(marker.exists());
}

#[test]
fn bench_measures_and_leaves_no_key_behind() {
    let cluster = common::Cluster::start(3);
    let nodes = cluster.urls().join(",");
    let out = quorumlock(&nodes, &["bench", "--count", "50"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    let table = text(&out.stdout);
    for needle in [
        "locks/s",
        "p50",
        "p99",
        "acquire",
        "release",
        "50 (0 failed)",
    ] {
        assert!(table.contains(needle), "{needle:?} missing: {}", show(&out));
    }
    assert!(text(&out.stderr).contains("bench:"), "{}", show(&out));
    let mut admins = cluster.admins();
    assert!(common::wait_until(Duration::from_secs(10), || {
        admins.iter_mut().all(|a| a.keys_count() == 0)
    }));
    let out = quorumlock(&nodes, &["bench", "--duration", "300ms"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
}

#[test]
fn bench_stopped_by_a_signal_reports_what_it_measured_and_leaves_no_key_behind() {
    let cluster = common::Cluster::start(3);
    let nodes = cluster.urls().join(",");
    let mut admin = cluster.node(0).admin();
    let commands = |a: &mut common::Admin| {
        a.info_field("stats", "total_commands_processed")
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let before = commands(&mut admin);
    let mut run = Running::spawn(quorumlock(&nodes, &["bench", "--duration", "5m"]));
    // Interrupted while it locks and unlocks: its commands reach the nodes.
    assert!(common::wait_until(Duration::from_secs(20), || {
        commands(&mut admin) > before + 100
    }));
    cli_common::signal(run.pid(), libc::SIGINT);
    let (code, err) = run.finish(Duration::from_secs(20));
    assert_eq!(code, Some(130), "{err}");
    assert!(err.contains("stopped by signal 2"), "{err}");
    let mut admins = cluster.admins();
    assert!(
        common::wait_until(Duration::from_secs(10), || {
            admins.iter_mut().all(|a| a.keys_count() == 0)
        }),
        "bench left keys behind"
    );
}

#[test]
fn nodes_come_from_the_environment_unless_given() {
    let cluster = common::Cluster::start(3);
    let nodes = cluster.urls().join(",");
    let out = bare(&["try", "cli:env"])
        .env("QUORUMLOCK_NODES", &nodes)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    let out = bare(&["--nodes", &nodes, "try", "cli:env"])
        .env("QUORUMLOCK_NODES", "http://not-a-node")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
}

#[test]
fn status_logs_in_with_the_urls_password_and_never_prints_it() {
    let cluster = common::Cluster::start_with(3, &common::NodeOptions::with_password("s3cr3t-pw"));
    let nodes = cluster.urls().join(",");
    assert!(nodes.contains("s3cr3t-pw"));
    let out = quorumlock(&nodes, &["try", "cli:pw"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    let out = quorumlock(&nodes, &["status", "cli:pw"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", show(&out));
    let all = show(&out);
    assert!(!all.contains("s3cr3t-pw"), "{all}");
    assert_eq!(text(&out.stdout).matches(":***@").count(), 3, "{all}");
    assert_eq!(text(&out.stdout).matches("run_id=").count(), 3, "{all}");
    // A wrong password: each node says why, without the password either.
    let wrong = nodes.replace("s3cr3t-pw", "wrong-pw");
    let out = quorumlock(&wrong, &["status", "cli:pw"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", show(&out));
    assert!(!show(&out).contains("wrong-pw"), "{}", show(&out));
    assert_eq!(
        text(&out.stdout).matches("AUTH/SELECT refused").count(),
        3,
        "{}",
        show(&out)
    );
}

/// The environment a command under `run` wrote to `path` (`env > path`), as
/// name=value lines, once the file is complete (the command went on after writing it).
fn env_of(path: &std::path::Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines().map(String::from).collect()
}

fn var<'a>(env: &'a [String], name: &str) -> Option<&'a str> {
    env.iter()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix('='))
}

#[test]
fn nonblock_gives_up_at_once_with_the_conflict_code_and_e_sets_it() {
    let cluster = common::Cluster::start(3);
    let nodes = cluster.urls().join(",");
    let (holder, done) = hold(&nodes, &cluster, "cli:nonblock");
    let marker = cluster.dir().join("nonblock-ran");
    let touch = format!("touch '{}'", marker.display());
    for (extra, code) in [
        (&["-n"][..], 75),
        (&["--nonblock"], 75),
        (&["-n", "-E", "3"], 3),
        (&["-n", "--conflict-exit-code=0"], 0),
    ] {
        let mut args = extra.to_vec();
        args.extend(["run", "cli:nonblock", "--", "sh", "-c", &touch]);
        let out = quorumlock(&nodes, &args).output().unwrap();
        assert_eq!(out.status.code(), Some(code), "{args:?}: {}", show(&out));
        assert!(
            text(&out.stderr).contains("held by another client"),
            "{}",
            show(&out)
        );
    }
    // try takes -E too.
    let out = quorumlock(&nodes, &["try", "cli:nonblock", "-E", "9"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(9), "{}", show(&out));
    assert!(!marker.exists(), "a refused run ran its command");
    let_go(holder, &done);
}

#[test]
fn a_bounded_wait_gives_up_no_sooner_than_its_bound() {
    let cluster = common::Cluster::start(3);
    let nodes = cluster.urls().join(",");
    let (holder, done) = hold(&nodes, &cluster, "cli:bounded");
    for (extra, code) in [(&["-w", "0.5"][..], 75), (&["--wait=0.5", "-E", "4"], 4)] {
        let mut args = extra.to_vec();
        args.extend(["run", "cli:bounded", "--", "true"]);
        let started = std::time::Instant::now();
        let out = quorumlock(&nodes, &args).output().unwrap();
        let took = started.elapsed();
        assert_eq!(out.status.code(), Some(code), "{args:?}: {}", show(&out));
        assert!(took >= Duration::from_millis(500), "gave up after {took:?}");
        assert!(
            text(&out.stderr).contains("gave up after"),
            "{}",
            show(&out)
        );
    }
    let_go(holder, &done);
}

/// A `run` that writes its command's environment to `env_file` and holds the lock until
/// `done` exists.
fn env_run(
    nodes: &str,
    resource: &str,
    extra: &[&str],
    env_file: &std::path::Path,
    done: &std::path::Path,
) -> std::process::Command {
    let script = format!(
        "env > '{0}.part' && mv '{0}.part' '{0}'; while [ ! -e '{1}' ]; do sleep 0.02; done",
        env_file.display(),
        done.display()
    );
    let mut args = vec!["--ttl", "6", "--kill-after", "0.5"];
    args.extend_from_slice(extra);
    args.extend(["run", resource, "--", "sh", "-c", &script]);
    let mut cmd = quorumlock(nodes, &args);
    // An outer run's fence must not reach the command of an unfenced one.
    cmd.env("QUORUMLOCK_FENCE", "424242");
    cmd
}

fn waited_hand_off(fenced: bool) {
    let cluster = common::Cluster::start(3);
    let nodes = cluster.urls().join(",");
    let resource = if fenced {
        "cli:handoff-fenced"
    } else {
        "cli:handoff"
    };
    let extra: &[&str] = if fenced { &["--fencing"] } else { &[] };
    let dir = cluster.dir();
    let (env1, done1) = (dir.join("env1"), dir.join("done1"));
    let (env2, done2) = (dir.join("env2"), dir.join("done2"));
    let mut first = Running::spawn(env_run(&nodes, resource, extra, &env1, &done1));
    assert!(
        common::wait_until(Duration::from_secs(20), || env1.exists()),
        "the first run never ran its command"
    );
    let token = cluster.node(0).admin().get(resource).expect("held");
    let token = text(&token);
    // The second run, without -n or -w, waits: subscribed to the release notices on a
    // majority, its command not started.
    let mut second = Running::spawn(env_run(&nodes, resource, extra, &env2, &done2));
    let mut admins = cluster.admins();
    assert!(
        common::wait_until(Duration::from_secs(20), || {
            admins
                .iter_mut()
                .map(|a| a.notice_listeners(resource))
                .filter(|&n| n > 0)
                .count()
                >= 2
        }),
        "the second run is not waiting for the release"
    );
    assert!(
        !env2.exists(),
        "the second run ran while the first held the lock"
    );
    std::fs::write(&done1, b"").unwrap();
    let (code, err) = first.finish(Duration::from_secs(30));
    assert_eq!(code, Some(0), "{err}");
    assert!(
        common::wait_until(Duration::from_secs(30), || env2.exists()),
        "the second run never got the lock"
    );
    std::fs::write(&done2, b"").unwrap();
    let (code, err) = second.finish(Duration::from_secs(30));
    assert_eq!(code, Some(0), "{err}");

    let (e1, e2) = (env_of(&env1), env_of(&env2));
    for env in [&e1, &e2] {
        assert_eq!(var(env, "QUORUMLOCK_RESOURCE"), Some(resource), "{env:?}");
        let prefix = var(env, "QUORUMLOCK_TOKEN_PREFIX").expect("a token prefix");
        assert_eq!(prefix.len(), 8, "{prefix}");
        assert!(
            !env.iter().any(|l| l.contains(&token)),
            "the whole token reached the command"
        );
    }
    assert_eq!(var(&e1, "QUORUMLOCK_TOKEN_PREFIX"), Some(&token[..8]));
    assert_ne!(
        var(&e1, "QUORUMLOCK_TOKEN_PREFIX"),
        var(&e2, "QUORUMLOCK_TOKEN_PREFIX")
    );
    if fenced {
        let fence = |env: &[String]| -> u64 {
            var(env, "QUORUMLOCK_FENCE")
                .expect("a fence")
                .parse()
                .expect("a number")
        };
        assert!(fence(&e2) > fence(&e1), "{e1:?}\n{e2:?}");
        assert_ne!(fence(&e1), 424242);
    } else {
        assert_eq!(var(&e1, "QUORUMLOCK_FENCE"), None, "{e1:?}");
        assert_eq!(var(&e2, "QUORUMLOCK_FENCE"), None, "{e2:?}");
    }
}

#[test]
fn run_waits_by_default_and_gets_the_lock_when_the_holder_ends() {
    waited_hand_off(false);
}

#[test]
fn fenced_runs_hand_the_command_a_larger_fence_each_time() {
    waited_hand_off(true);
}

#[test]
fn a_signal_ends_the_default_wait_with_128_plus_n() {
    let cluster = common::Cluster::start(3);
    let nodes = cluster.urls().join(",");
    let (holder, done) = hold(&nodes, &cluster, "cli:sigwait");
    let marker = cluster.dir().join("sigwait-ran");
    let touch = format!("touch '{}'", marker.display());
    let mut waiter = Running::spawn(quorumlock(
        &nodes,
        &["run", "cli:sigwait", "--", "sh", "-c", &touch],
    ));
    let mut admin = cluster.node(0).admin();
    assert!(common::wait_until(Duration::from_secs(20), || {
        admin.notice_listeners("cli:sigwait") > 0
    }));
    cli_common::signal(waiter.pid(), libc::SIGTERM);
    let (code, err) = waiter.finish(Duration::from_secs(30));
    assert_eq!(code, Some(128 + libc::SIGTERM), "{err}");
    assert!(err.contains("nothing was run"), "{err}");
    assert!(!marker.exists());
    let_go(holder, &done);
}

#[test]
fn bare_numbers_are_seconds_on_the_command_line() {
    let cluster = common::Cluster::start(3);
    let nodes = cluster.urls().join(",");
    // 3 × (0.5 + 1) = 4.5 <= 5: accepted. Were 5 read as milliseconds, refused (64).
    let out = quorumlock(
        &nodes,
        &[
            "--ttl",
            "5",
            "--kill-after",
            "0.5",
            "-w",
            "2.5",
            "run",
            "cli:bare",
            "--",
            "true",
        ],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    // The ttl reached the nodes in seconds: a 2.5 s lock, not 2.5 ms.
    let out = quorumlock(&nodes, &["--ttl", "2.5", "try", "cli:bare"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    let said = text(&out.stdout);
    let validity: f64 = said
        .split_once("(validity ")
        .and_then(|(_, rest)| rest.split_once("s)"))
        .and_then(|(v, _)| v.parse().ok())
        .unwrap_or_else(|| panic!("no validity in seconds: {said}"));
    assert!(validity > 1.0 && validity <= 2.5, "{said}");
    // A bad value: a usage error quoting it; the old --timeout names its replacements.
    for (args, needle) in [
        (&["--ttl", "5x", "try", "r"][..], "\"5x\""),
        (&["-w", "soon", "run", "r", "--", "true"], "\"soon\""),
        (&["--kill-after", "-1", "run", "r", "--", "true"], "\"-1\""),
        (&["--timeout", "1000", "try", "r"], "--node-timeout"),
    ] {
        let out = bare(args).env("QUORUMLOCK_NODES", &nodes).output().unwrap();
        assert_eq!(out.status.code(), Some(64), "{args:?}: {}", show(&out));
        assert!(
            text(&out.stderr).contains(needle),
            "{args:?}: {}",
            show(&out)
        );
    }
    // A ttl too short names every way out.
    let out = quorumlock(&nodes, &["--ttl", "2", "run", "r", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64), "{}", show(&out));
    for way in [
        "a longer --ttl",
        "a shorter --kill-after",
        "a shorter --node-timeout",
    ] {
        assert!(text(&out.stderr).contains(way), "{way:?}: {}", show(&out));
    }
    // --restart-guard reaches the client: these nodes started seconds ago, younger than
    // an hour, so none of them votes yet.
    let out = quorumlock(&nodes, &["--restart-guard", "1h", "try", "cli:guard"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(69), "{}", show(&out));
    let out = bare(&["--timeout", "1", "try", "r"])
        .env("QUORUMLOCK_NODES", &nodes)
        .output()
        .unwrap();
    assert!(text(&out.stderr).contains("-w"), "{}", show(&out));
}

#[test]
fn node_urls_with_passwords_come_from_a_file_or_the_environment_never_argv() {
    let cluster = common::Cluster::start_with(3, &common::NodeOptions::with_password("f1le-pw"));
    let dir = cluster.dir();
    let file = dir.join("nodes");
    let mut listing = String::from("# the lock's masters\n\n");
    for url in cluster.urls() {
        listing.push_str(&format!("  {url}  \n# between\n"));
    }
    std::fs::write(&file, &listing).unwrap();
    let path = file.to_str().unwrap();
    let out = bare(&["--nodes-file", path, "try", "cli:file"])
        .env("QUORUMLOCK_NODES", "http://not-a-node")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    assert!(!show(&out).contains("f1le-pw"), "{}", show(&out));
    // run too, from the file or from the environment.
    let run = [
        "--ttl",
        "6",
        "--kill-after",
        "1",
        "run",
        "cli:file",
        "--",
        "true",
    ];
    let from_file = [&["--nodes-file", path][..], &run].concat();
    let mut from_env = bare(&run);
    from_env.env("QUORUMLOCK_NODES", cluster.urls().join(","));
    for mut cmd in [bare(&from_file), from_env] {
        let out = cmd.output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", show(&out));
        assert!(!show(&out).contains("f1le-pw"), "{}", show(&out));
    }

    // A bad line: named by its number, its password nowhere.
    let bad = dir.join("bad-nodes");
    let mut lines = cluster.urls();
    lines.insert(1, "redis://app:f1le-pw@127.0.0.1:99999".into());
    lines.insert(2, "http://:f1le-pw@example".into());
    std::fs::write(&bad, lines.join("\n")).unwrap();
    let out = bare(&["--nodes-file", bad.to_str().unwrap(), "status", "cli:file"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64), "{}", show(&out));
    assert!(text(&out.stderr).contains("line 2"), "{}", show(&out));
    assert!(!show(&out).contains("f1le-pw"), "{}", show(&out));
    // An unreadable file: a usage error naming it.
    let out = bare(&["--nodes-file", "/nonexistent/quorumlock-nodes", "try", "r"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64), "{}", show(&out));
    assert!(
        text(&out.stderr).contains("/nonexistent/quorumlock-nodes"),
        "{}",
        show(&out)
    );
}
