//! `rediss://` nodes (feature `tls`) against real `redis-server` processes listening
//! with `--tls-port` only (`--port 0`; the harness reaches them over a Unix socket),
//! with certificates each test makes for itself: a CA, a server certificate for
//! 127.0.0.1, a client certificate, and an unrelated CA.
#![cfg(feature = "tls")]

mod common;

use common::tls::{Certs, TlsNode};
use common::{Cluster, wait_until};
use quorumlock::{Builder, Error, Outcome, Redlock};
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn tls_nodes(certs: &Certs, n: usize, auth_clients: bool) -> Vec<TlsNode> {
    (0..n)
        .map(|_| TlsNode::start(certs, auth_clients))
        .collect()
}

fn urls(nodes: &[TlsNode]) -> Vec<String> {
    nodes.iter().map(TlsNode::url).collect()
}

/// `n` TLS nodes with certificates of their own.
fn setup(n: usize, auth_clients: bool) -> (Certs, Vec<TlsNode>) {
    let certs = Certs::new();
    let nodes = tls_nodes(&certs, n, auth_clients);
    (certs, nodes)
}

/// A client of `urls` that trusts the test CA.
fn trusting(certs: &Certs, urls: &[String]) -> Builder {
    builder(urls).tls_ca_file(certs.path("ca.crt"))
}

fn builder(urls: &[String]) -> Builder {
    Redlock::builder()
        .nodes(urls)
        // Loaded machines: room for the handshakes, no retries to wait through.
        .node_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_secs(5))
        .retry_count(0)
}

/// Locks `key` until a call succeeds (the first may find the handshakes still going),
/// within `within`.
fn lock_soon(rl: &mut Redlock, key: &str, within: Duration) -> quorumlock::Lock {
    let deadline = Instant::now() + within;
    loop {
        match rl.lock(key, Duration::from_secs(30)) {
            Ok(lock) => return lock,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("no lock within {within:?}: {e}"),
        }
    }
}

/// Locks `key` so that every node holds it (`everywhere` says whether they all do): a
/// lock granted by a majority while one node's handshake was still going is released and
/// taken again, within 30 s.
fn lock_everywhere(rl: &mut Redlock, key: &str, everywhere: impl Fn() -> bool) -> quorumlock::Lock {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let lock = lock_soon(rl, key, Duration::from_secs(30));
        if everywhere() {
            return lock;
        }
        rl.unlock(&lock).unwrap();
        assert!(Instant::now() < deadline, "never held on every node");
    }
}

/// [`lock_everywhere`] on TLS nodes, in db 0.
fn lock_on(nodes: &[TlsNode], rl: &mut Redlock, key: &str) -> quorumlock::Lock {
    lock_everywhere(rl, key, || nodes.iter().all(|n| n.holds(key)))
}

/// Each node's error in a failed call (`None`: it did not fail), in configuration order.
fn node_errors(e: &Error) -> Vec<Option<String>> {
    e.failure()
        .map(|f| {
            f.nodes
                .iter()
                .map(|n| match &n.outcome {
                    Outcome::Failed(e) => Some(e.to_string()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Calls `lock` until every node has failed with an error that mentions `what` (before
/// that, a node may still be connecting), within `within`; returns each node's first
/// such error and how long it took.
fn errors_saying(rl: &mut Redlock, what: &str, within: Duration) -> (Vec<String>, Duration) {
    let start = Instant::now();
    let n = rl.settings().nodes.len();
    let mut seen: Vec<Option<String>> = vec![None; n];
    let mut last = Vec::new();
    while start.elapsed() < within {
        let e = rl
            .lock("tls:refused", Duration::from_secs(10))
            .expect_err("no node may grant the lock");
        last = node_errors(&e);
        for (slot, error) in seen.iter_mut().zip(&last) {
            if let Some(error) = error.as_ref().filter(|m| m.contains(what)) {
                slot.get_or_insert_with(|| error.clone());
            }
        }
        if seen.iter().all(Option::is_some) {
            let errors: Vec<String> = seen.into_iter().flatten().collect();
            eprintln!("after {:?}: {errors:#?}", start.elapsed());
            return (errors, start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("after {within:?}, not every node's error mentions {what:?}: {last:?}");
}

#[test]
fn lock_extend_unlock_over_tls() {
    let (certs, nodes) = setup(3, false);
    let mut rl = trusting(&certs, &urls(&nodes)).build().unwrap();
    let mut lock = lock_on(&nodes, &mut rl, "tls:basic");
    assert!(lock.is_valid());
    // Taken: a second client over TLS is refused.
    let mut other = trusting(&certs, &urls(&nodes)).build().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match other.lock("tls:basic", Duration::from_secs(5)) {
            Err(Error::Taken(_)) => break,
            Err(e) if Instant::now() < deadline => drop(e),
            other => panic!("expected Taken, got {other:?}"),
        }
    }
    rl.extend(&mut lock, Duration::from_secs(120)).unwrap();
    assert!(nodes.iter().all(|n| n.pttl("tls:basic") > 60_000));
    assert!(rl.unlock(&lock).unwrap() >= 2, "a majority released it");
    assert!(wait_until(Duration::from_secs(10), || {
        nodes.iter().all(|n| !n.holds("tls:basic"))
    }));
    // The status view reads TLS nodes too.
    let lock = lock_soon(&mut rl, "tls:inspect", Duration::from_secs(10));
    let views = quorumlock::inspect(rl.settings(), b"tls:inspect");
    for v in &views {
        let v = v.as_ref().expect("inspect over TLS");
        assert_eq!(v.value.as_deref(), Some(lock.token()));
        assert!(v.run_id.is_some());
    }
    rl.unlock(&lock).unwrap();
}

#[test]
fn password_and_db_go_over_tls_after_the_handshake() {
    let certs = Certs::new();
    let opts = common::NodeOptions::with_acl_user("alice", "wonder/land");
    let nodes: Vec<TlsNode> = (0..3)
        .map(|_| TlsNode::start_with(&certs, false, &opts))
        .collect();
    let urls: Vec<String> = nodes
        .iter()
        .map(|n| format!("rediss://alice:wonder%2Fland@127.0.0.1:{}/3", n.port))
        .collect();
    let mut rl = trusting(&certs, &urls).build().unwrap();
    assert!(
        rl.settings()
            .nodes
            .iter()
            .all(|e| e.db() == 3 && e.is_tls())
    );
    let in_db3 = || {
        nodes.iter().all(|n| {
            let mut admin = n.cluster.node(0).admin();
            admin.cmd(&["SELECT", "3"]).is_ok() && admin.exists("tls:db3")
        })
    };
    let lock = lock_everywhere(&mut rl, "tls:db3", in_db3);
    for n in &nodes {
        let mut admin = n.cluster.node(0).admin();
        assert!(!admin.exists("tls:db3"), "db 0 holds nothing");
        assert!(admin.cmd(&["SELECT", "3"]).is_ok());
        assert!(admin.exists("tls:db3"), "the lock is in db 3");
    }
    rl.unlock(&lock).unwrap();
    // A wrong password is refused after the TLS handshake, as over TCP.
    let wrong: Vec<String> = urls
        .iter()
        .map(|u| u.replace("wonder%2Fland", "nope"))
        .collect();
    let mut rl = trusting(&certs, &wrong).build().unwrap();
    let (errors, _) = errors_saying(&mut rl, "AUTH", Duration::from_secs(20));
    assert!(errors.iter().all(|e| !e.contains("TLS")), "{errors:?}");
}

#[test]
fn mutual_tls_with_and_without_a_client_certificate() {
    let (certs, nodes) = setup(3, true);
    let mut rl = trusting(&certs, &urls(&nodes))
        .tls_client_cert(certs.path("client.crt"), certs.path("client.key"))
        .build()
        .unwrap();
    let lock = lock_on(&nodes, &mut rl, "tls:mutual");
    rl.unlock(&lock).unwrap();

    // Without one, every node says it wanted a client certificate.
    let mut anonymous = trusting(&certs, &urls(&nodes)).build().unwrap();
    let (errors, _) = errors_saying(
        &mut anonymous,
        "client certificate",
        Duration::from_secs(20),
    );
    assert!(errors.iter().all(|e| e.contains("TLS")), "{errors:?}");

    // One the servers' CA did not sign: every node refuses it, and says so.
    let mut stranger = trusting(&certs, &urls(&nodes))
        .tls_client_cert(
            certs.path("other-client.crt"),
            certs.path("other-client.key"),
        )
        .build()
        .unwrap();
    let (errors, _) = errors_saying(
        &mut stranger,
        "refused our client certificate",
        Duration::from_secs(20),
    );
    assert!(errors.iter().all(|e| e.contains("TLS")), "{errors:?}");
    assert!(nodes.iter().all(|n| !n.holds("tls:refused")));
}

#[test]
fn a_wrong_ca_is_a_clear_error_at_once() {
    let (certs, nodes) = setup(3, false);
    let mut rl = builder(&urls(&nodes))
        .tls_ca_file(certs.path("other-ca.crt"))
        // Long, so that a hang would show: the refusal must not wait for it.
        .connect_timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let (errors, took) = errors_saying(&mut rl, "certificate", Duration::from_secs(20));
    assert!(took < Duration::from_secs(20));
    assert!(
        errors
            .iter()
            .all(|e| e.contains("TLS handshake failed") && e.contains("tls_ca_file")),
        "{errors:?}"
    );
    assert!(nodes.iter().all(|n| !n.holds("tls:refused")));
}

#[test]
fn skipping_verification_accepts_an_unknown_ca() {
    let (_certs, nodes) = setup(1, false);
    let mut rl = builder(&urls(&nodes))
        .dangerous_skip_tls_verification()
        .build()
        .unwrap();
    let lock = lock_soon(&mut rl, "tls:unverified", Duration::from_secs(20));
    rl.unlock(&lock).unwrap();
}

#[test]
fn a_plain_port_on_a_rediss_url_is_a_clear_error() {
    let certs = Certs::new();
    let plain = Cluster::start(3);
    let urls: Vec<String> = plain
        .nodes()
        .iter()
        .map(|n| format!("rediss://127.0.0.1:{}", n.port().unwrap()))
        .collect();
    let mut rl = trusting(&certs, &urls)
        .connect_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    // Redis either waits silently for the rest of what it takes for an inline command
    // (the connect timeout then says the handshake got no answer), or, when the
    // ClientHello happens to hold a newline, answers an error in plain text: either
    // way the error says TLS and asks whether the node speaks it.
    let (errors, _) = errors_saying(&mut rl, "speak TLS", Duration::from_secs(20));
    assert!(errors.iter().all(|e| e.contains("TLS")), "{errors:?}");
    // The inspection view says the same, within its bound.
    let start = Instant::now();
    for v in quorumlock::inspect(rl.settings(), b"tls:refused") {
        let e = v.expect_err("not a TLS server").to_string();
        assert!(e.contains("TLS"), "{e}");
    }
    assert!(start.elapsed() < Duration::from_secs(10));
}

#[test]
fn a_plain_text_answer_to_the_handshake_is_a_clear_error() {
    // A server that speaks plain text (as Redis does, with an error, when the hello
    // happens to hold a newline): here an SSH banner.
    let certs = Certs::new();
    let http: Vec<common::impostor::Impostor> = (0..3)
        .map(|_| common::impostor::Impostor::start(common::impostor::Act::SshBanner))
        .collect();
    let urls: Vec<String> = http
        .iter()
        .map(|i| i.url().replacen("redis://", "rediss://", 1))
        .collect();
    let mut rl = trusting(&certs, &urls).build().unwrap();
    let (errors, took) = errors_saying(&mut rl, "not TLS", Duration::from_secs(20));
    assert!(
        took < Duration::from_secs(5),
        "at once, not at the connect timeout"
    );
    assert!(errors.iter().all(|e| e.contains("speak TLS")), "{errors:?}");
}

#[test]
fn tls_and_plain_nodes_mix() {
    let certs = Certs::new();
    let tls = tls_nodes(&certs, 2, false);
    let plain = Cluster::start(1);
    let mut all = urls(&tls);
    all.push(plain.url(0));
    let mut rl = trusting(&certs, &all).build().unwrap();
    let mut lock = lock_everywhere(&mut rl, "tls:mixed", || {
        tls.iter().all(|n| n.holds("tls:mixed")) && plain.node(0).admin().exists("tls:mixed")
    });
    rl.extend(&mut lock, Duration::from_secs(60)).unwrap();
    assert!(rl.unlock(&lock).unwrap() >= 2, "a majority released it");
    assert!(wait_until(Duration::from_secs(10), || {
        tls.iter().all(|n| !n.holds("tls:mixed")) && !plain.node(0).admin().exists("tls:mixed")
    }));
}

#[test]
fn a_command_bigger_than_the_socket_buffers_gets_through_whole() {
    // 256 KiB of key names in one script per node: more than a socket takes at once, so
    // TLS records wait for writable events (and the engine's outbox for them).
    let (certs, nodes) = setup(3, false);
    let mut rl = trusting(&certs, &urls(&nodes))
        .node_timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    // Every connection up first: the command must reach all three.
    let warm = lock_on(&nodes, &mut rl, "tls:warm");
    rl.unlock(&warm).unwrap();
    let names: Vec<String> = (0..8)
        .map(|i| format!("tls:big:{i}:{}", "x".repeat(32 * 1024 - 64)))
        .collect();
    for round in 0..3 {
        let lock = rl
            .lock_all(&names, Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        // Every node ran the whole command.
        assert!(wait_until(Duration::from_secs(10), || {
            nodes.iter().all(|n| names.iter().all(|k| n.holds(k)))
        }));
        assert!(rl.unlock(&lock).unwrap() >= 2, "a majority released it");
        assert!(wait_until(Duration::from_secs(10), || {
            nodes.iter().all(|n| names.iter().all(|k| !n.holds(k)))
        }));
    }
}

#[test]
fn the_shared_client_works_over_tls() {
    let (certs, nodes) = setup(3, false);
    let shared = trusting(&certs, &urls(&nodes))
        .retry_count(200)
        .retry_delay(Duration::from_millis(20))
        .retry_jitter(Duration::from_millis(5))
        .build_shared()
        .unwrap();
    // Held on every node (a first lock may be granted by a majority while a handshake
    // is still going), so that the extend shows on each.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut lock = loop {
        let lock = shared
            .blocking_lock("tls:shared", Duration::from_secs(30))
            .unwrap();
        if nodes.iter().all(|n| n.holds("tls:shared")) {
            break lock;
        }
        shared.blocking_unlock(&lock).unwrap();
        assert!(Instant::now() < deadline, "never held on every node");
    };
    shared
        .blocking_extend(&mut lock, Duration::from_secs(60))
        .unwrap();
    assert!(nodes.iter().all(|n| n.pttl("tls:shared") > 30_000));
    shared.blocking_unlock(&lock).unwrap();

    // A waiter woken by the release notice, heard on its TLS subscriber connections: it
    // polls only once an hour.
    let waiting = trusting(&certs, &urls(&nodes))
        .retry_delay(Duration::from_secs(3600))
        .retry_jitter(Duration::ZERO)
        .build_shared()
        .unwrap();
    let mut holder = trusting(&certs, &urls(&nodes)).build().unwrap();
    let held = lock_soon(&mut holder, "tls:handoff", Duration::from_secs(20));
    let waiter = std::thread::spawn(move || {
        waiting.blocking_lock_within(
            "tls:handoff",
            Duration::from_secs(10),
            Duration::from_secs(120),
        )
    });
    assert!(
        wait_until(Duration::from_secs(30), || {
            nodes.iter().all(|n| listeners(n, "tls:handoff") == 1)
        }),
        "the waiter subscribes on every node over TLS"
    );
    holder.unlock(&held).unwrap();
    let lock = waiter.join().unwrap().expect("woken by the release notice");
    assert!(lock.is_valid());
}

/// Subscribers to `key`'s release notices on `node`.
fn listeners(node: &TlsNode, key: &str) -> i64 {
    node.cluster.node(0).admin().notice_listeners(key)
}

#[test]
fn the_command_line_tool_takes_its_tls_settings_from_the_environment() {
    let (certs, nodes) = setup(3, true);
    let run = |env: &[(&str, PathBuf)], action: &str| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_quorumlock"));
        cmd.env("QUORUMLOCK_NODES", urls(&nodes).join(","))
            .env_remove("QUORUMLOCK_TLS_CA_FILE")
            .env_remove("QUORUMLOCK_TLS_CERT")
            .env_remove("QUORUMLOCK_TLS_KEY")
            .args(["--node-timeout", "2s", action, "tls:cli"]);
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.output().unwrap()
    };
    let all = [
        ("QUORUMLOCK_TLS_CA_FILE", certs.path("ca.crt")),
        ("QUORUMLOCK_TLS_CERT", certs.path("client.crt")),
        ("QUORUMLOCK_TLS_KEY", certs.path("client.key")),
    ];
    let out = run(&all, "try");
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(0), "{said}");
    let out = run(&all, "status");
    assert!(out.status.code().is_some_and(|c| c <= 1), "{out:?}");
    // A certificate without its key is a usage error.
    let out = run(&all[..2], "try");
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("QUORUMLOCK_TLS_KEY"));
    // Without the client certificate, every node refuses.
    let out = run(&all[..1], "try");
    assert_eq!(out.status.code(), Some(69), "{out:?}");
}

#[test]
fn a_frozen_tls_node_costs_nothing_and_a_restarted_one_rejoins() {
    let (certs, nodes) = setup(3, false);
    // A node_timeout far above what a quorum of replies takes, even on a loaded machine:
    // a round that waited for the frozen node would take all of it.
    let node_timeout = Duration::from_secs(10);
    let mut rl = trusting(&certs, &urls(&nodes))
        .node_timeout(node_timeout)
        .build()
        .unwrap();
    let lock = lock_on(&nodes, &mut rl, "tls:faults:warm");
    rl.unlock(&lock).unwrap();

    // Frozen (SIGSTOP): the other two are a majority; the round decides without it.
    nodes[2].cluster.node(0).freeze();
    let start = Instant::now();
    let lock = rl.lock("tls:faults", Duration::from_secs(30)).unwrap();
    assert!(
        start.elapsed() < node_timeout,
        "decided at the quorum, not at node_timeout: {:?}",
        start.elapsed()
    );
    assert!(nodes[..2].iter().all(|n| n.holds("tls:faults")));
    rl.unlock(&lock).unwrap();
    nodes[2].cluster.node(0).thaw();

    // Restarted (SIGKILL, a fresh process on the same port): a new TLS connection, and
    // the node holds the next lock.
    nodes[1].cluster.node(0).kill();
    nodes[1].cluster.node(0).restart();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let lock = lock_soon(&mut rl, "tls:faults:after", Duration::from_secs(20));
        let everywhere = nodes.iter().all(|n| n.holds("tls:faults:after"));
        rl.unlock(&lock).unwrap();
        if everywhere {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the restarted node never held a lock again"
        );
        assert!(wait_until(Duration::from_secs(10), || {
            nodes.iter().all(|n| !n.holds("tls:faults:after"))
        }));
    }
}

#[test]
fn inspect_is_bounded_against_a_node_that_trickles_its_handshake() {
    use std::io::Write;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    // Answers the ClientHello with the header of a 16 KiB handshake record, then its body
    // one byte every 10 ms: every read gets something, none completes a record.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let stop = Arc::new(AtomicBool::new(false));
    let server = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let (mut sock, _) = listener.accept().unwrap();
            let _ = sock.write_all(&[0x16, 0x03, 0x03, 0x40, 0x00]);
            while !stop.load(Ordering::Relaxed) && sock.write_all(&[0]).is_ok() {
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };
    let settings = Redlock::builder()
        .node(format!("rediss://127.0.0.1:{port}"))
        .dangerous_skip_tls_verification()
        .connect_timeout(Duration::from_millis(300))
        .node_timeout(Duration::from_millis(200))
        .settings()
        .unwrap();
    let start = Instant::now();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(quorumlock::inspect(&settings, b"tls:trickle")));
    // Its bound is connect_timeout + node_timeout (0.5 s); the trickle would last 160 s.
    let views = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("inspect returned within its bound");
    let took = start.elapsed();
    stop.store(true, Ordering::Relaxed);
    server.join().unwrap();
    let e = views[0]
        .as_ref()
        .expect_err("no view from a trickle")
        .to_string();
    assert!(e.contains("TLS"), "{e}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
}

#[test]
fn a_reset_in_the_tls_handshake_says_so() {
    // Nodes that take the connection, wait for the ClientHello and close without reading
    // it: the kernel resets the connection.
    let listeners: Vec<std::net::TcpListener> = (0..3)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let urls: Vec<String> = listeners
        .iter()
        .map(|l| format!("rediss://127.0.0.1:{}", l.local_addr().unwrap().port()))
        .collect();
    for l in &listeners {
        l.set_nonblocking(true).unwrap();
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let resetter = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let mut idle = true;
                for l in &listeners {
                    if let Ok((sock, _)) = l.accept() {
                        idle = false;
                        sock.set_nonblocking(false).unwrap();
                        sock.set_read_timeout(Some(Duration::from_secs(10)))
                            .unwrap();
                        let _ = sock.peek(&mut [0]);
                    }
                }
                if idle {
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
        })
    };
    let mut rl = builder(&urls)
        .dangerous_skip_tls_verification()
        .build()
        .unwrap();
    // Every reset says it came in the handshake, whether it is met reading or (the next
    // readiness event) as the socket's error.
    let mut resets = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while resets.len() < 30 && Instant::now() < deadline {
        let e = rl
            .lock("tls:refused", Duration::from_secs(10))
            .expect_err("no node may grant the lock");
        resets.extend(
            node_errors(&e)
                .into_iter()
                .flatten()
                .filter(|e| e.contains("ConnectionReset")),
        );
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    resetter.join().unwrap();
    assert!(resets.len() >= 30, "{resets:?}");
    assert!(
        resets.iter().all(|e| e.contains("in the TLS handshake")),
        "{resets:?}"
    );
}
