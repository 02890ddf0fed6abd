//! A lock command applied by the server whose reply never reaches the client: the
//! connection closes in between, the driver resends on a new connection, and the resend
//! meets our own key. The attempt must still clean up after itself.

mod common;

use common::Cluster;
use quorumlock::{Error, Outcome, Redlock};
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

/// What the cutting proxy did, for the test to check that the scenario happened.
#[derive(Default)]
struct Cut {
    /// Armed by the test; disarmed by the connection that cuts.
    armed: AtomicBool,
    /// The server's reply to the SET that was cut, swallowed instead of forwarded.
    swallowed: Mutex<Vec<u8>>,
    /// Client connections accepted.
    accepted: AtomicUsize,
}

/// A one-trick proxy: once armed, it forwards the next SET to the server, swallows the
/// server's reply and, once that whole reply is in (so the command was applied), closes
/// the client's connection. The client never hears that its SET was applied.
fn cutting_proxy(target: SocketAddr) -> (SocketAddr, Arc<Cut>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let cut = Arc::new(Cut::default());
    let shared = cut.clone();
    thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { return };
            shared.accepted.fetch_add(1, Ordering::SeqCst);
            let Ok(upstream) = TcpStream::connect(target) else {
                return;
            };
            let swallowing = Arc::new(AtomicBool::new(false));
            let (mut from_client, mut to_server) =
                (client.try_clone().unwrap(), upstream.try_clone().unwrap());
            let (cut, swallow) = (shared.clone(), swallowing.clone());
            thread::spawn(move || {
                let mut buf = [0u8; 65536];
                while let Ok(n @ 1..) = from_client.read(&mut buf) {
                    let is_set = buf[..n].windows(7).any(|w| w == b"\r\nSET\r\n");
                    let cut_now = is_set && cut.armed.swap(false, Ordering::SeqCst);
                    if cut_now {
                        // Before the SET goes up, so its reply cannot slip through.
                        swallow.store(true, Ordering::SeqCst);
                    }
                    if to_server.write_all(&buf[..n]).is_err() || cut_now {
                        // Nothing more goes up on this connection.
                        return;
                    }
                }
            });
            let (cut, mut from_server, mut to_client) = (shared.clone(), upstream, client);
            thread::spawn(move || {
                let mut buf = [0u8; 65536];
                while let Ok(n @ 1..) = from_server.read(&mut buf) {
                    if swallowing.load(Ordering::SeqCst) {
                        let mut swallowed = cut.swallowed.lock().unwrap();
                        swallowed.extend_from_slice(&buf[..n]);
                        if swallowed.ends_with(b"\r\n") {
                            // The SET was applied and answered: now cut the client off.
                            let _ = to_client.shutdown(Shutdown::Both);
                        }
                        continue;
                    }
                    if to_client.write_all(&buf[..n]).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, cut)
}

/// `calls` of `cmdstat_eval` in `INFO commandstats`: the failed attempt's cleanup is
/// an EVAL of the compare-and-delete script.
fn eval_calls(cluster: &Cluster, node: usize) -> u64 {
    cluster
        .node(node)
        .admin()
        .info_field("commandstats", "cmdstat_eval")
        .and_then(|v| {
            v.split(',')
                .find_map(|kv| kv.strip_prefix("calls="))
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}

#[test]
fn a_lost_attempt_releases_its_own_key_even_where_a_resend_said_held() {
    let cluster = Cluster::start(3);
    let (proxied, cut) = cutting_proxy(cluster.node(0).addr().unwrap());
    let urls = [format!("redis://{proxied}"), cluster.url(1), cluster.url(2)];
    // A generous node_timeout: the round waits for node 0's resend however loaded the
    // machine is (it ends as soon as node 0 answers).
    let mut rl = Redlock::builder()
        .nodes(&urls)
        .node_timeout(Duration::from_secs(10))
        .retry_count(0)
        .build()
        .unwrap();
    let warm = rl.try_lock("warm", Duration::from_secs(10)).unwrap();
    // Every node, node 0 through the proxy included, takes the warm-up's SET and delete:
    // seen on the nodes, since unlock returns at a majority (its count is at least 2 of 3
    // and says no more). Once node 0's key is gone its compare-and-delete has run, so the
    // EVAL count read below already includes it.
    let holds = |token: Option<&[u8]>| {
        common::wait_until(Duration::from_secs(10), || {
            (0..3).all(|i| cluster.node(i).admin().get("warm").as_deref() == token)
        })
    };
    assert!(
        holds(Some(warm.token())),
        "not every node got the warm-up SET"
    );
    assert!(matches!(rl.unlock(&warm), Ok(2 | 3)));
    assert!(holds(None), "not every node deleted the warm-up key");
    assert_eq!(cut.accepted.load(Ordering::SeqCst), 1);
    let evals_before = eval_calls(&cluster, 0);

    // Someone else holds node 2; node 0 applies our SET but its reply is lost.
    cluster.node(2).admin().set_px("res", "OTHER", 60_000);
    cut.armed.store(true, Ordering::SeqCst);
    let err = rl.try_lock("res", Duration::from_secs(30)).unwrap_err();

    // The scenario happened: node 0 applied our SET (its +OK was swallowed), the client
    // resent on a new connection, and the resend met our own key: "held".
    assert!(!cut.armed.load(Ordering::SeqCst), "no SET was cut: {err}");
    assert_eq!(
        String::from_utf8_lossy(&cut.swallowed.lock().unwrap()),
        "+OK\r\n",
        "node 0 did not apply the SET whose reply was cut"
    );
    assert_eq!(
        cut.accepted.load(Ordering::SeqCst),
        2,
        "the SET was not resent on a new connection: {err}"
    );
    let Error::Taken(f) = &err else {
        panic!("expected Taken (1 locked, 2 held), got {err}");
    };
    assert_eq!(
        f.nodes[0].outcome,
        Outcome::Held,
        "node 0's resend must meet our own key: {err}"
    );
    assert_eq!(f.nodes[2].outcome, Outcome::Held, "{err}");
    // Two "held" decide the round; node 1's yes may come after that.
    assert!(
        matches!(
            f.nodes[1].outcome,
            Outcome::Locked | Outcome::NoReply | Outcome::NotNeeded
        ),
        "{err}"
    );

    // The release is fire-and-forget: our compare-and-delete (an EVAL) must run on node 0
    // and remove our key there, well before its 30 s ttl.
    assert!(
        common::wait_until(Duration::from_secs(10), || cluster
            .node(0)
            .admin()
            .get("res")
            .is_none()),
        "our own key was left on node 0 after the failed attempt: {err}"
    );
    assert!(
        eval_calls(&cluster, 0) > evals_before,
        "the key on node 0 went, but not by our compare-and-delete"
    );
    assert_eq!(
        cluster.node(2).admin().get("res").as_deref(),
        Some(&b"OTHER"[..])
    );
}
