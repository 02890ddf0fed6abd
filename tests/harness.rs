//! Self-tests of the shared integration-test harness in `tests/common/`.

mod common;

use common::{Admin, Cluster, Endpoint, Mode, NodeOptions, Proxy, Reply, pid_alive, wait_until};
use std::io::{self, ErrorKind};
use std::net::TcpStream;
use std::time::{Duration, Instant};

fn is_timeout(e: &io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

#[test]
fn three_nodes_set_get() {
    let c = Cluster::start(3);
    assert_eq!(c.len(), 3);
    let urls = c.urls();
    assert_eq!(urls.len(), 3);
    let mut ports = Vec::new();
    for (i, url) in urls.iter().enumerate() {
        let n = c.node(i);
        let port = n.port().expect("tcp node has a port");
        assert_eq!(*url, format!("redis://127.0.0.1:{port}"));
        assert_eq!(c.url(i), *url);
        assert!(n.is_running());
        ports.push(port);
        let mut a = n.admin();
        a.set(b"k", format!("v{i}"));
        assert_eq!(a.get(b"k"), Some(format!("v{i}").into_bytes()));
        assert_eq!(a.get("missing"), None);
        assert!(a.exists("k"));
        assert_eq!(a.pttl("k"), -1);
        a.set_px("t", "x", 10_000);
        let pttl = a.pttl("t");
        assert!(pttl > 9_000 && pttl <= 10_000, "pttl {pttl}");
        assert_eq!(a.pttl("missing"), -2);
        assert_eq!(a.keys_count(), 2);
        a.script_flush();
        a.flushall();
        assert_eq!(a.keys_count(), 0);
        assert!(!a.exists("k"));
        // The generic command form, with bytes and strs.
        assert_eq!(
            a.cmd(&[b"ECHO".as_slice(), b"hi"]),
            Reply::Bulk(Some(b"hi".to_vec()))
        );
        assert_eq!(a.cmd(&["PING"]), Reply::Simple("PONG".into()));
        assert!(a.cmd(&["NOSUCHCOMMAND"]).is_error());
        // Nested arrays parse.
        let r = a.cmd(&["CONFIG", "GET", "enable-debug-command"]);
        assert!(r.as_array().is_some(), "{r:?}");
    }
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(ports.len(), 3, "distinct ports");
}

#[test]
fn freeze_blocks_and_thaw_resumes() {
    let c = Cluster::start(1);
    let n = c.node(0);
    n.freeze();
    assert!(n.is_frozen());
    assert!(n.is_running(), "a frozen node is still running");
    // The kernel still completes the TCP handshake, but nothing answers.
    let mut a = n.admin();
    a.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let t = Instant::now();
    let err = a.try_ping().expect_err("frozen node must not answer");
    assert!(is_timeout(&err), "{err:?}");
    assert!(t.elapsed() >= Duration::from_millis(190));
    // A broken connection refuses further use.
    assert!(a.try_ping().is_err());
    n.thaw();
    assert!(!n.is_frozen());
    assert!(n.admin().ping());
}

#[test]
fn kill_and_restart_same_port_empty_data() {
    let c = Cluster::start(1);
    let n = c.node(0);
    let port = n.port().unwrap();
    let url = n.url();
    let pid1 = n.pid();
    n.admin().set("k", "v");
    n.kill();
    assert!(!n.is_running());
    assert!(!pid_alive(pid1));
    let err = TcpStream::connect(n.addr().unwrap()).expect_err("killed node refuses");
    assert_eq!(err.kind(), ErrorKind::ConnectionRefused);
    assert!(n.try_admin().is_err());
    n.kill(); // idempotent

    n.restart();
    assert!(n.is_running());
    assert_ne!(n.pid(), pid1);
    assert_eq!(n.port(), Some(port));
    assert_eq!(n.url(), url);
    let mut a = n.admin();
    assert_eq!(a.get("k"), None, "data does not survive a restart");
    a.set("k", "v2");

    // restart() of a running (even frozen) node kills it first.
    let pid2 = n.pid();
    n.freeze();
    n.restart();
    assert!(!pid_alive(pid2));
    assert!(!n.is_frozen());
    assert_eq!(n.admin().get("k"), None);
}

#[test]
fn unix_socket_node() {
    let c = Cluster::start_with(2, &NodeOptions::unix());
    for i in 0..2 {
        let n = c.node(i);
        assert_eq!(n.port(), None);
        let path = n.socket_path().expect("socket path").to_path_buf();
        assert!(path.exists());
        assert_eq!(n.url(), format!("unix://{}", path.display()));
        let mut a = n.admin();
        a.set("k", "unix");
        assert_eq!(a.get("k"), Some(b"unix".to_vec()));
    }
    // Restart keeps the socket path.
    let n = c.node(0);
    let path = n.socket_path().unwrap().to_path_buf();
    n.restart();
    assert_eq!(n.socket_path(), Some(path.as_path()));
    assert_eq!(n.admin().get("k"), None);
}

#[test]
fn password_node() {
    let c = Cluster::start_with(1, &NodeOptions::with_password("s3cret"));
    let n = c.node(0);
    assert_eq!(
        n.url(),
        format!("redis://:s3cret@127.0.0.1:{}", n.port().unwrap())
    );
    let mut raw = Admin::connect(n.endpoint(), None).unwrap();
    let r = raw.cmd(&["GET", "k"]);
    assert!(r.error().is_some_and(|e| e.starts_with("NOAUTH")), "{r:?}");
    assert!(raw.auth(None, "wrong").unwrap().is_error());
    assert!(raw.auth(None, "s3cret").unwrap().is_ok());
    assert_eq!(raw.get("k"), None);
    // The harness admin authenticates by itself, also after a restart.
    n.admin().set("k", "v");
    n.restart();
    assert_eq!(n.admin().get("k"), None);
}

#[test]
fn acl_user_node() {
    let c = Cluster::start_with(1, &NodeOptions::with_acl_user("alice", "wonderland"));
    let n = c.node(0);
    assert_eq!(
        n.url(),
        format!("redis://alice:wonderland@127.0.0.1:{}", n.port().unwrap())
    );
    let mut raw = Admin::connect(n.endpoint(), None).unwrap();
    assert!(raw.auth(Some("alice"), "nope").unwrap().is_error());
    assert!(raw.auth(Some("alice"), "wonderland").unwrap().is_ok());
    assert_eq!(
        raw.cmd(&["ACL", "WHOAMI"]).as_string().as_deref(),
        Some("alice")
    );
    raw.set("k", "v");
    assert_eq!(raw.cmd(&["EVAL", "return 1", "0"]), Reply::Int(1));
    // The default user is kept (no password here).
    let mut d = Admin::connect(n.endpoint(), None).unwrap();
    assert_eq!(
        d.cmd(&["ACL", "WHOAMI"]).as_string().as_deref(),
        Some("default")
    );
    assert_eq!(d.get("k"), Some(b"v".to_vec()));
}

#[test]
fn unix_urls_with_credentials() {
    let opts = NodeOptions {
        unix_socket: true,
        password: Some("pw".into()),
        acl_user: Some(("bob".into(), "b0b".into())),
        ..Default::default()
    };
    let c = Cluster::start_with(1, &opts);
    let n = c.node(0);
    let p = n.socket_path().unwrap().display().to_string();
    assert_eq!(n.url(), format!("unix://{p}?user=bob&password=b0b"));
    // Both the default user (password) and the ACL user work.
    let mut a = Admin::connect(n.endpoint(), None).unwrap();
    assert!(
        a.cmd(&["PING"])
            .error()
            .is_some_and(|e| e.starts_with("NOAUTH"))
    );
    assert!(a.auth(None, "pw").unwrap().is_ok());
    assert!(a.auth(Some("bob"), "b0b").unwrap().is_ok());
    assert!(n.admin().ping());

    let c2 = Cluster::start_with(
        1,
        &NodeOptions {
            unix_socket: true,
            ..NodeOptions::with_password("pw")
        },
    );
    let n2 = c2.node(0);
    assert_eq!(
        n2.url(),
        format!("unix://{}?password=pw", n2.socket_path().unwrap().display())
    );
    assert!(n2.admin().ping());
}

#[test]
fn extra_args_are_passed() {
    let opts = NodeOptions {
        extra_args: vec!["--maxmemory".into(), "12mb".into()],
        ..Default::default()
    };
    let c = Cluster::start_with(1, &opts);
    let r = c.node(0).admin().cmd(&["CONFIG", "GET", "maxmemory"]);
    let items = r.as_array().unwrap();
    assert_eq!(items[1].as_string().as_deref(), Some("12582912"));
}

#[test]
fn debug_sleep_and_client_kill() {
    let c = Cluster::start(1);
    let n = c.node(0);
    let mut a = n.admin();
    let mut victims: Vec<Admin> = (0..2).map(|_| n.admin()).collect();
    for v in &mut victims {
        assert!(v.ping());
    }
    assert!(a.client_kill_normal() >= 2);
    for v in &mut victims {
        assert!(v.try_ping().is_err(), "killed client sees EOF");
    }
    assert!(a.ping(), "SKIPME yes spares the caller");

    let t = Instant::now();
    let h = a.debug_sleep(2.0);
    // It returns once the server is seen sleeping, before the sleep's reply.
    assert!(
        n.in_debug_sleep(),
        "debug_sleep returned before the sleep ran"
    );
    // A command sent now is queued behind the sleep: its reply comes after it.
    assert!(a.ping());
    assert!(
        t.elapsed() >= Duration::from_millis(1990),
        "PING answered {:?} after a 2 s DEBUG SLEEP began",
        t.elapsed()
    );
    assert!(!n.in_debug_sleep());
    assert!(h.join().unwrap().unwrap().is_ok());
}

#[test]
fn proxy_modes() {
    let c = Cluster::start(1);
    let target = c.node(0).addr().unwrap();
    let p = Proxy::start(target);
    assert_eq!(p.url(), format!("redis://{}", p.addr()));
    assert_eq!(p.target(), target);

    // Pass
    let mut a = Admin::connect_tcp(p.addr()).unwrap();
    assert!(a.ping());
    a.set("via-proxy", "1");
    assert_eq!(c.node(0).admin().get("via-proxy"), Some(b"1".to_vec()));
    assert!(wait_until(Duration::from_secs(1), || p.connections() == 1));

    // Delay: the same connection is affected at once (each direction is held 300 ms).
    p.set_mode(Mode::Delay(Duration::from_millis(300)));
    let t = Instant::now();
    assert!(a.ping());
    let took = t.elapsed();
    assert!(took >= Duration::from_millis(300), "{took:?}");

    // Blackhole: no answer, on old and new connections.
    p.set_mode(Mode::Blackhole);
    a.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let err = a.try_ping().expect_err("blackholed");
    assert!(is_timeout(&err), "{err:?}");
    let mut b = Admin::connect_tcp(p.addr()).unwrap();
    b.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let err = b.try_ping().expect_err("blackholed");
    assert!(is_timeout(&err), "{err:?}");

    // Reset: an open connection is closed at once, new ones right after accept.
    p.set_mode(Mode::Pass);
    let mut d = Admin::connect_tcp(p.addr()).unwrap();
    assert!(d.ping());
    p.set_mode(Mode::Reset);
    // Closed, not merely silent: the error is not the read timeout.
    let err = d.try_ping().expect_err("reset");
    assert!(!is_timeout(&err), "{err:?}");
    let before = p.connections();
    match Admin::connect_tcp(p.addr()) {
        Ok(mut e) => {
            let err = e.try_ping().expect_err("reset after accept");
            assert!(!is_timeout(&err), "{err:?}");
        }
        Err(e) => assert!(!is_timeout(&e), "{e:?}"),
    }
    assert!(wait_until(Duration::from_secs(1), || p.connections() > before));

    // And back to normal.
    p.set_mode(Mode::Pass);
    let mut f = Admin::connect_tcp(p.addr()).unwrap();
    assert!(f.ping());
    assert_eq!(f.get("via-proxy"), Some(b"1".to_vec()));
}

#[test]
fn proxy_to_dead_target_and_prompt_drop() {
    let c = Cluster::start(1);
    let n = c.node(0);
    let p = Proxy::start(n.addr().unwrap());
    let mut conns: Vec<Admin> = (0..3)
        .map(|_| Admin::connect_tcp(p.addr()).unwrap())
        .collect();
    for a in &mut conns {
        assert!(a.ping());
    }
    // A chunk parked in the proxy for a minute: dropping the proxy must not wait for it.
    p.set_mode(Mode::Delay(Duration::from_secs(60)));
    conns[0].send(&["PING"]).unwrap();
    n.kill();
    // Upstream gone: the client sees the connection end.
    let mut g = Admin::connect_tcp(p.addr()).unwrap();
    assert!(g.try_ping().is_err());
    let t = Instant::now();
    drop(p);
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "drop took {:?}: it waited for the parked chunk",
        t.elapsed()
    );
    for a in &mut conns[1..] {
        assert!(a.try_ping().is_err());
    }
}

#[test]
fn drop_leaves_no_process() {
    let (pids, dir) = {
        let c = Cluster::start(3);
        c.node(1).freeze();
        c.node(2).kill();
        c.node(2).restart();
        (c.pids(), c.dir().to_path_buf())
    };
    assert_eq!(pids.len(), 3);
    for pid in pids {
        assert!(!pid_alive(pid), "redis-server {pid} survived Cluster drop");
    }
    assert!(!dir.exists(), "temp dir {} not removed", dir.display());
}

#[test]
fn drop_on_panic_kills_processes() {
    let pids = std::sync::Mutex::new(Vec::new());
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let c = Cluster::start(2);
        pids.lock().unwrap().extend(c.pids());
        c.node(0).freeze();
        panic!("test failure while nodes run");
    }));
    assert!(r.is_err());
    let pids = pids.into_inner().unwrap();
    assert_eq!(pids.len(), 2);
    for pid in pids {
        assert!(
            !pid_alive(pid),
            "redis-server {pid} survived a panicking test"
        );
    }
}

#[test]
fn nodes_are_usable_from_threads() {
    let c = Cluster::start(3);
    std::thread::scope(|s| {
        for n in c.nodes() {
            s.spawn(move || {
                let mut a = n.admin();
                for i in 0..50 {
                    a.set(format!("k{i}"), "v");
                }
                assert_eq!(a.keys_count(), 50);
            });
        }
    });
    assert!(matches!(c.node(0).endpoint(), Endpoint::Tcp(_)));
}

#[test]
fn wait_until_polls() {
    let t = Instant::now();
    let mut calls = 0;
    assert!(wait_until(Duration::from_secs(1), || {
        calls += 1;
        calls == 3
    }));
    assert_eq!(calls, 3);
    assert!(!wait_until(Duration::from_millis(30), || false));
    assert!(t.elapsed() >= Duration::from_millis(30));
}

#[test]
fn restart_retries_while_port_is_taken() {
    let c = Cluster::start(1);
    let n = c.node(0);
    let addr = n.addr().unwrap();
    n.kill();
    // Someone else holds the port for a while: restart must retry.
    let squatter = std::net::TcpListener::bind(addr).expect("grab the freed port");
    // Taken before the squatter can let go, so the bound below holds however the threads
    // are scheduled.
    let t = Instant::now();
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(400));
        drop(squatter);
    });
    n.restart();
    assert!(
        t.elapsed() >= Duration::from_millis(400),
        "{:?}",
        t.elapsed()
    );
    releaser.join().unwrap();
    assert_eq!(n.port(), Some(addr.port()));
    assert!(n.admin().ping());
    assert!(n.log_tail(200).contains("Address already in use"));
}
