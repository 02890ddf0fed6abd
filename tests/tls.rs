//! `rediss://` nodes (feature `tls`) against real `redis-server` processes listening
//! with `--tls-port` only (`--port 0`; the harness reaches them over a Unix socket),
//! with certificates each test makes for itself: a CA, a server certificate for
//! 127.0.0.1, a client certificate, and an unrelated CA.
#![cfg(feature = "tls")]

mod common;

use common::{Cluster, NodeOptions, free_port, wait_until};
use quorumlock::{Builder, Error, Outcome, Redlock};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// A CA, a server and a client certificate signed by it, and another CA, as PEM files
/// in a directory of their own (removed on drop).
struct Certs {
    dir: PathBuf,
}

impl Certs {
    fn new() -> Certs {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("quorumlock-test-certs-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let write = |name: &str, pem: String| std::fs::write(dir.join(name), pem).unwrap();

        let ca = |name: &str| {
            let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
            p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            p.distinguished_name.push(DnType::CommonName, name);
            p.key_usages = vec![
                KeyUsagePurpose::KeyCertSign,
                KeyUsagePurpose::CrlSign,
                KeyUsagePurpose::DigitalSignature,
            ];
            let key = KeyPair::generate().unwrap();
            let cert = p.self_signed(&key).unwrap();
            (cert, Issuer::new(p, key))
        };
        let (ca_cert, issuer) = ca("quorumlock test CA");
        write("ca.crt", ca_cert.pem());
        let (other_ca, _) = ca("some other CA");
        write("other-ca.crt", other_ca.pem());

        let leaf = |names: Vec<String>, usage: ExtendedKeyUsagePurpose, file: &str| {
            let mut p = CertificateParams::new(names).unwrap();
            p.distinguished_name.push(DnType::CommonName, file);
            p.extended_key_usages = vec![usage];
            p.use_authority_key_identifier_extension = true;
            let key = KeyPair::generate().unwrap();
            let cert = p.signed_by(&key, &issuer).unwrap();
            write(&format!("{file}.crt"), cert.pem());
            write(&format!("{file}.key"), key.serialize_pem());
        };
        leaf(
            vec!["127.0.0.1".into(), "localhost".into()],
            ExtendedKeyUsagePurpose::ServerAuth,
            "server",
        );
        leaf(
            vec!["quorumlock-client".into()],
            ExtendedKeyUsagePurpose::ClientAuth,
            "client",
        );
        Certs { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

impl Drop for Certs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One `redis-server` with TLS only on a free port: the cluster (one node, killed on
/// drop) and its `rediss://` URL.
struct TlsNode {
    cluster: Cluster,
    port: u16,
}

impl TlsNode {
    fn start(certs: &Certs, auth_clients: bool) -> TlsNode {
        let p = |name: &str| certs.path(name).display().to_string();
        let mut last = None;
        // The port is picked before the server binds it: another process may take it
        // first (the server then fails to start), so a few tries.
        for _ in 0..4 {
            let port = free_port();
            let opts = NodeOptions {
                unix_socket: true,
                extra_args: vec![
                    "--tls-port".into(),
                    port.to_string(),
                    "--tls-cert-file".into(),
                    p("server.crt"),
                    "--tls-key-file".into(),
                    p("server.key"),
                    "--tls-ca-cert-file".into(),
                    p("ca.crt"),
                    "--tls-auth-clients".into(),
                    if auth_clients { "yes" } else { "no" }.into(),
                ],
                ..Default::default()
            };
            match std::panic::catch_unwind(|| Cluster::start_with(1, &opts)) {
                Ok(cluster) => return TlsNode { cluster, port },
                Err(e) => last = Some(e),
            }
        }
        std::panic::resume_unwind(last.unwrap())
    }

    fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.port)
    }

    fn holds(&self, key: &str) -> bool {
        self.cluster.node(0).admin().exists(key)
    }

    fn pttl(&self, key: &str) -> i64 {
        self.cluster.node(0).admin().pttl(key)
    }
}

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
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("no lock within {within:?}: {e}"),
        }
    }
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
    let mut lock = lock_soon(&mut rl, "tls:basic", Duration::from_secs(20));
    assert!(lock.is_valid());
    assert!(nodes.iter().all(|n| n.holds("tls:basic")));
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
fn mutual_tls_with_and_without_a_client_certificate() {
    let (certs, nodes) = setup(3, true);
    let mut rl = trusting(&certs, &urls(&nodes))
        .tls_client_cert(certs.path("client.crt"), certs.path("client.key"))
        .build()
        .unwrap();
    let lock = lock_soon(&mut rl, "tls:mutual", Duration::from_secs(20));
    assert!(nodes.iter().all(|n| n.holds("tls:mutual")));
    rl.unlock(&lock).unwrap();

    // Without one, every node says it wanted a client certificate.
    let mut anonymous = trusting(&certs, &urls(&nodes)).build().unwrap();
    let (errors, _) = errors_saying(
        &mut anonymous,
        "client certificate",
        Duration::from_secs(20),
    );
    assert!(errors.iter().all(|e| e.contains("TLS")), "{errors:?}");
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
    let mut lock = lock_soon(&mut rl, "tls:mixed", Duration::from_secs(20));
    assert!(tls.iter().all(|n| n.holds("tls:mixed")));
    assert!(plain.node(0).admin().exists("tls:mixed"));
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
    let _ = lock_soon(&mut rl, "tls:warm", Duration::from_secs(20));
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
    let mut lock = shared
        .blocking_lock("tls:shared", Duration::from_secs(30))
        .unwrap();
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
    let channel = format!("quorumlock:released:{key}");
    node.cluster
        .node(0)
        .admin()
        .cmd(&["PUBSUB", "NUMSUB", channel.as_str()])
        .as_array()
        .and_then(|a| a.get(1))
        .and_then(|r| r.as_int())
        .unwrap_or(0)
}
