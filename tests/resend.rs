//! A lock command applied by the server whose reply never reaches the client: the
//! connection closes in between, the driver resends on a new connection, and the resend
//! meets our own key. The attempt must still clean up after itself.

mod common;

use common::Cluster;
use quorumlock::{Error, Redlock};
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

/// A one-trick proxy: once `cut` is armed, it forwards the next SET to the server,
/// swallows the server's reply and closes the client's connection. The command was
/// applied; the client never hears so.
fn cutting_proxy(target: SocketAddr) -> (SocketAddr, Arc<AtomicBool>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let cut = Arc::new(AtomicBool::new(false));
    let armed = cut.clone();
    thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { return };
            let Ok(upstream) = TcpStream::connect(target) else {
                return;
            };
            let swallowing = Arc::new(AtomicBool::new(false));
            let (mut from_client, mut to_server) =
                (client.try_clone().unwrap(), upstream.try_clone().unwrap());
            let (armed, swallow, closer) = (
                armed.clone(),
                swallowing.clone(),
                client.try_clone().unwrap(),
            );
            thread::spawn(move || {
                let mut buf = [0u8; 65536];
                while let Ok(n @ 1..) = from_client.read(&mut buf) {
                    let is_set = buf[..n].windows(7).any(|w| w == b"\r\nSET\r\n");
                    let cut_now = is_set && armed.swap(false, Ordering::SeqCst);
                    if cut_now {
                        // Before the SET goes up, so its reply cannot slip through.
                        swallow.store(true, Ordering::SeqCst);
                    }
                    if to_server.write_all(&buf[..n]).is_err() {
                        return;
                    }
                    if cut_now {
                        thread::sleep(Duration::from_millis(30));
                        let _ = closer.shutdown(Shutdown::Both);
                        return;
                    }
                }
            });
            let (mut from_server, mut to_client) = (upstream, client);
            thread::spawn(move || {
                let mut buf = [0u8; 65536];
                while let Ok(n @ 1..) = from_server.read(&mut buf) {
                    if swallowing.load(Ordering::SeqCst) {
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

#[test]
fn a_lost_attempt_releases_its_own_key_even_where_a_resend_said_held() {
    let cluster = Cluster::start(3);
    let (proxied, cut) = cutting_proxy(cluster.node(0).addr().unwrap());
    let urls = [format!("redis://{proxied}"), cluster.url(1), cluster.url(2)];
    let mut rl = Redlock::builder()
        .nodes(&urls)
        .node_timeout(Duration::from_millis(500))
        .retry_count(0)
        .build()
        .unwrap();
    let warm = rl.try_lock("warm", Duration::from_secs(10)).unwrap();
    assert!(matches!(rl.unlock(&warm), Ok(3)));

    // Someone else holds node 2; node 0 applies our SET but its reply is lost.
    cluster.node(2).admin().set_px("res", "OTHER", 60_000);
    cut.store(true, Ordering::SeqCst);
    let err = rl.try_lock("res", Duration::from_secs(30)).unwrap_err();
    assert!(
        matches!(err, Error::Taken(_) | Error::Unavailable(_)),
        "{err}"
    );
    // The release is fire-and-forget: give it a moment, then node 0 must be clean.
    assert!(
        common::wait_until(Duration::from_secs(2), || cluster
            .node(0)
            .admin()
            .get("res")
            .is_none()),
        "our own key was left on node 0 after the failed attempt: {err}"
    );
    assert_eq!(
        cluster.node(2).admin().get("res").as_deref(),
        Some(&b"OTHER"[..])
    );
}
