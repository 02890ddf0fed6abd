//! The compatibility suite: one short scenario per feature, run against every server of
//! the matrix (`docs/COMPATIBILITY.md`). `scripts/compat.sh` runs this binary once per
//! server, naming the binary in `QUORUMLOCK_TEST_SERVER` (see `tests/common/mod.rs`), and
//! prints a table of server × test; a plain `cargo test` does not run it (Cargo.toml,
//! `test = false`): against Debian's `redis-server` the other test files cover all of it.
//!
//! Each test starts its own nodes, does one thing, and asserts the guarantee. Nothing waits
//! by sleeping: conditions are polled with a deadline (`wait_until`), and no assertion is
//! about how long something took.
//!
//! A server built without TLS makes the `tls` test skip, with the server's own words, and
//! only then: it writes `tls<TAB>reason` to the file named by `QUORUMLOCK_COMPAT_SKIPS`
//! (when set), which the table shows as `skip`.

mod common;

use common::{Cluster, wait_until};
use quorumlock::{Error, Lock, NodeError, Outcome, Redlock, SharedRedlock};
use std::time::{Duration, Instant};

/// Bound on every poll for a condition.
const WAIT: Duration = Duration::from_secs(20);
/// A ttl no scenario outlives by accident on a loaded machine.
const TTL: Duration = Duration::from_secs(30);

fn builder(urls: &[String]) -> quorumlock::Builder {
    Redlock::builder()
        .nodes(urls)
        .node_timeout(Duration::from_millis(500))
        .retry_count(0)
        .max_backoff(Duration::from_millis(50))
}

fn client(cluster: &Cluster) -> Redlock {
    builder(&cluster.urls())
        .build()
        .expect("valid configuration")
}

/// What node `n` holds at `key`.
fn value(cluster: &Cluster, n: usize, key: &str) -> Option<Vec<u8>> {
    cluster.node(n).admin().get(key)
}

/// Waits until every node holds `key` with `token` (`Some`) or nothing at `key` (`None`):
/// a call returns at a majority, the last node may follow a moment later.
fn wait_all(cluster: &Cluster, key: &str, token: Option<&[u8]>) -> bool {
    wait_until(WAIT, || {
        (0..cluster.len()).all(|n| value(cluster, n, key).as_deref() == token)
    })
}

/// Locks `key` until a call succeeds and every node holds it (the first calls may find a
/// connection still in its handshake, or a node just restarted).
fn lock_everywhere(rl: &mut Redlock, cluster: &Cluster, key: &str) -> Lock {
    let mut last = String::new();
    let mut got = None;
    let ok = wait_until(WAIT, || match rl.try_lock(key, TTL) {
        Ok(lock) => {
            let t = lock.token().to_vec();
            if (0..cluster.len()).all(|n| value(cluster, n, key).as_deref() == Some(&t[..])) {
                got = Some(lock);
                true
            } else {
                last = "held on a majority only".into();
                rl.unlock(&lock).expect("unlock");
                false
            }
        }
        Err(e) => {
            last = e.to_string();
            false
        }
    });
    assert!(ok, "{key} never held on every node; last: {last}");
    got.expect("locked")
}

fn outcome(e: &Error, node: usize) -> Option<&Outcome> {
    e.failure()
        .and_then(|f| f.nodes.get(node))
        .map(|r| &r.outcome)
}

#[test]
fn acquire_extend_release() {
    let cluster = Cluster::start(3);
    let mut rl = client(&cluster);
    let mut rival = client(&cluster);
    let mut lock = lock_everywhere(&mut rl, &cluster, "compat:basic");
    assert!(lock.is_valid());
    match rival.try_lock("compat:basic", TTL) {
        Err(Error::Taken(_)) => {}
        other => panic!("a held resource must be Taken: {other:?}"),
    }
    // Extend to far more than the ttl: every node's expiry moves.
    rl.extend(&mut lock, Duration::from_secs(600))
        .expect("extend");
    assert!(
        wait_until(WAIT, || (0..3).all(|n| cluster
            .node(n)
            .admin()
            .pttl("compat:basic")
            > TTL.as_millis() as i64)),
        "the extend did not reach every node"
    );
    assert!(rl.unlock(&lock).expect("unlock") >= 2);
    assert!(
        wait_all(&cluster, "compat:basic", None),
        "a key survived unlock"
    );
    // A stale unlock deletes nothing of the next holder's.
    let next = rival.try_lock("compat:basic", TTL).expect("free again");
    assert!(wait_all(&cluster, "compat:basic", Some(next.token())));
    let _ = rl.unlock(&lock);
    assert!(wait_all(&cluster, "compat:basic", Some(next.token())));
    rival.unlock(&next).expect("unlock");
}

#[test]
fn batches() {
    let cluster = Cluster::start(3);
    let mut rl = client(&cluster);
    let mut rival = client(&cluster);
    let held = lock_everywhere(&mut rival, &cluster, "compat:batch:b");
    let results = rl.try_lock_many(&["compat:batch:a", "compat:batch:b", "compat:batch:c"], TTL);
    assert_eq!(results.len(), 3);
    assert!(
        matches!(results[1], Err(Error::Taken(_))),
        "{:?}",
        results[1]
    );
    let won: Vec<Lock> = results
        .into_iter()
        .enumerate()
        .filter(|(i, _)| *i != 1)
        .map(|(i, r)| r.unwrap_or_else(|e| panic!("resource {i}: {e}")))
        .collect();
    for lock in &won {
        let key = String::from_utf8(lock.resource().to_vec()).unwrap();
        assert!(wait_all(&cluster, &key, Some(lock.token())), "{key}");
    }
    for r in rl.unlock_many(&won) {
        assert!(r.expect("unlock_many") >= 2);
    }
    for key in ["compat:batch:a", "compat:batch:c"] {
        assert!(wait_all(&cluster, key, None), "{key} survived unlock_many");
    }
    assert!(wait_all(&cluster, "compat:batch:b", Some(held.token())));
    rival.unlock(&held).expect("unlock");
}

#[test]
fn lock_all() {
    let cluster = Cluster::start(3);
    let mut rl = client(&cluster);
    let mut rival = client(&cluster);
    let keys = ["compat:all:a", "compat:all:b", "compat:all:c"];
    let held = lock_everywhere(&mut rival, &cluster, "compat:all:b");
    let err = rl.lock_all(&keys, TTL).expect_err("b is held");
    assert!(matches!(err, Error::Taken(_)), "{err:?}");
    // All or none on each node: nothing of a or c was left behind.
    for n in 0..3 {
        for key in ["compat:all:a", "compat:all:c"] {
            assert_eq!(value(&cluster, n, key), None, "node {n} kept {key}");
        }
    }
    rival.unlock(&held).expect("unlock");
    assert!(wait_all(&cluster, "compat:all:b", None));
    let mut lock = rl.lock_all(&keys, TTL).expect("a free set");
    for key in keys {
        assert!(wait_all(&cluster, key, Some(lock.token())), "{key}");
    }
    rl.extend(&mut lock, Duration::from_secs(600))
        .expect("extend");
    assert!(
        wait_until(WAIT, || (0..3).all(|n| keys.iter().all(|k| cluster
            .node(n)
            .admin()
            .pttl(k)
            > TTL.as_millis() as i64))),
        "the extend did not renew every key everywhere"
    );
    assert!(rl.unlock(&lock).expect("unlock") >= 2);
    for key in keys {
        assert!(wait_all(&cluster, key, None), "{key} survived unlock");
    }
}

#[test]
fn fencing() {
    let cluster = Cluster::start(3);
    let fenced = |c: &Cluster| {
        builder(&c.urls())
            .fencing(true)
            .build()
            .expect("valid configuration")
    };
    let mut a = fenced(&cluster);
    let mut b = fenced(&cluster);
    let mut last = 0;
    for i in 0..6 {
        let rl = if i % 2 == 0 { &mut a } else { &mut b };
        let lock = rl
            .try_lock("compat:fence", TTL)
            .unwrap_or_else(|e| panic!("holder {i}: {e}"));
        let fence = lock.fence().expect("fencing is on");
        assert!(fence > last, "holder {i}: fence {fence} after {last}");
        last = fence;
        rl.unlock(&lock).expect("unlock");
    }
    // A set's one fence is above every member's.
    let set = a
        .lock_all(&["compat:fence", "compat:fence:other"], TTL)
        .expect("lock_all");
    assert!(set.fence().expect("fenced") > last);
    a.unlock(&set).expect("unlock");
    // The counter is written back to every node.
    let name = quorumlock::__private::core::slot::fence_key(b"compat:fence");
    let counter = |n: usize| {
        cluster
            .node(n)
            .admin()
            .get(&name)
            .and_then(|v| String::from_utf8(v).ok())
            .and_then(|v| v.parse::<u64>().ok())
    };
    assert!(
        wait_until(WAIT, || (0..3).all(|n| counter(n) == set.fence())),
        "counters: {:?}",
        (0..3).map(counter).collect::<Vec<_>>()
    );
}

/// A lock held on nodes 0 and 1 of 3; node 0 restarts empty. Without the guard, a second
/// client wins on nodes 0 and 2 while the first still holds (the danger); with it, node 0's
/// yes does not count until it has been up for the guard.
#[test]
fn restart_guard() {
    const GUARD: Duration = Duration::from_secs(3);
    const KEY: &str = "compat:guard";
    let cluster = Cluster::start(3);
    let mut guarded = builder(&cluster.urls())
        .restart_guard(GUARD)
        .build()
        .expect("valid configuration");
    let mut plain = client(&cluster);
    // Nodes 1 and 2 must be older than the guard (uptime is in whole seconds).
    assert!(
        wait_until(GUARD * 5, || (1..3).all(|n| cluster
            .node(n)
            .admin()
            .uptime_secs()
            > GUARD.as_secs())),
        "the nodes never got older than the guard"
    );
    // The guarded client reads every node's identity (INFO server: run_id, uptime).
    let warm = lock_everywhere(&mut guarded, &cluster, "compat:guard:warm");
    guarded.unlock(&warm).expect("unlock");
    // Restarted right after the moment it started, node 0 stays younger than the guard
    // for `GUARD` at least: a grant seen later than that says nothing, and the scenario
    // is run again (three times at most).
    let mut shown = false;
    for _ in 0..3 {
        // The first holder's key, on node 1 (its copy on node 0 is lost in the restart).
        cluster.node(1).admin().set_px(KEY, "first-holder", 60_000);
        let restarted = Instant::now();
        cluster.node(0).restart();
        let mut verdict = None;
        wait_until(WAIT, || match guarded.try_lock(KEY, TTL) {
            Ok(lock) => {
                verdict = Some(Err(restarted.elapsed()));
                guarded.unlock(&lock).expect("unlock");
                true
            }
            Err(e) => match outcome(&e, 0) {
                Some(Outcome::Failed(NodeError::YoungerThanGuard { .. })) => {
                    assert!(matches!(e, Error::Unavailable(_)), "{e}");
                    verdict = Some(Ok(()));
                    true
                }
                // Still reconnecting to the restarted node.
                _ => false,
            },
        });
        match verdict {
            Some(Ok(())) => {
                shown = true;
                break;
            }
            // Its uptime is read in whole seconds, and may run a second ahead (the guard's
            // documented extra second).
            Some(Err(after)) => assert!(
                after + Duration::from_secs(1) >= GUARD,
                "node 0's yes counted {after:?} after its restart, within the guard"
            ),
            None => panic!("node 0 was never reported held back nor counted"),
        }
    }
    assert!(
        shown,
        "the machine was too slow to show the guard three times"
    );
    // The danger it prevents: a client without the guard wins on nodes 0 and 2 while the
    // first holder's key stands on node 1.
    assert_eq!(
        value(&cluster, 1, KEY).as_deref(),
        Some(&b"first-holder"[..])
    );
    let mut second = None;
    // The plain client may first meet node 0 on its old connection, and reconnect.
    let won = wait_until(WAIT, || match plain.try_lock(KEY, TTL) {
        Ok(lock) => {
            second = Some(lock);
            true
        }
        Err(_) => false,
    });
    assert!(
        won,
        "without the guard, nodes 0 and 2 grant a second holder"
    );
    let second = second.expect("locked");
    plain.unlock(&second).expect("unlock");
    // The unlock returns at a majority: wait for its deletes on nodes 0 and 2.
    assert!(wait_until(WAIT, || [0, 2]
        .iter()
        .all(|&n| value(&cluster, n, KEY).is_none())));
    // Once the first holder is gone, the guarded client locks on nodes 1 and 2.
    cluster.node(1).admin().del(KEY);
    let lock = guarded.try_lock(KEY, TTL).expect("two old nodes of 3");
    guarded.unlock(&lock).expect("unlock");
}

/// Subscribers to `key`'s release notices on `node`.
fn listeners(cluster: &Cluster, node: usize, key: &str) -> i64 {
    cluster.node(node).admin().notice_listeners(key)
}

/// A waiter whose own poll is an hour away gets the lock: woken by the release notice the
/// holder's unlock published on the nodes.
#[test]
fn release_notice_wakes_waiter() {
    const KEY: &str = "compat:notice";
    let cluster = Cluster::start(3);
    let shared: SharedRedlock = Redlock::builder()
        .nodes(cluster.urls())
        .retry_delay(Duration::from_secs(3600))
        .retry_jitter(Duration::ZERO)
        .build_shared()
        .expect("valid configuration");
    let mut holder = client(&cluster);
    let held = lock_everywhere(&mut holder, &cluster, KEY);
    let waiter = {
        let shared = shared.clone();
        std::thread::spawn(move || shared.blocking_lock_within(KEY, TTL, Duration::from_secs(1800)))
    };
    // Released once the waiter listens on every node (a notice before that is missed).
    assert!(
        wait_until(WAIT, || (0..3).all(|n| listeners(&cluster, n, KEY) == 1)),
        "the waiter never subscribed on every node"
    );
    holder.unlock(&held).expect("unlock");
    let lock = waiter
        .join()
        .expect("waiter thread")
        .expect("woken by the release");
    assert!(lock.is_valid());
    shared.blocking_unlock(&lock).expect("unlock");
    assert!(
        wait_until(WAIT, || (0..3).all(|n| listeners(&cluster, n, KEY) == 0)),
        "the waiter's subscriptions were not dropped"
    );
}

/// The shared client's lease outlives its ttl (extended in the background) and, released,
/// leaves no key.
#[test]
fn lease() {
    const KEY: &str = "compat:lease";
    let cluster = Cluster::start(3);
    let shared = Redlock::builder()
        .nodes(cluster.urls())
        .node_timeout(Duration::from_millis(500))
        .build_shared()
        .expect("valid configuration");
    // Long enough that a loaded machine does not starve the loop past a term (it extends
    // every ttl/3).
    let ttl = Duration::from_secs(2);
    let lease = shared.blocking_lease(KEY, ttl).expect("lease");
    let token = lease.token().to_vec();
    // Two ttls later the key is still ours on a majority: it was extended.
    let start = Instant::now();
    assert!(wait_until(ttl * 10, || start.elapsed() > ttl * 2));
    assert!(!lease.is_lost(), "lost with every node up");
    let holding = (0..3)
        .filter(|&n| value(&cluster, n, KEY).as_deref() == Some(&token[..]))
        .count();
    assert!(holding >= 2, "held on {holding} nodes after two ttls");
    match shared.blocking_try_lock(KEY, ttl) {
        Err(Error::Taken(_)) => {}
        other => panic!("a leased resource must be Taken: {other:?}"),
    }
    assert!(lease.blocking_release().expect("release") >= 2);
    assert!(wait_all(&cluster, KEY, None), "a key survived the release");
}

/// Every node restarted (empty, with an empty script cache): the client reconnects by
/// itself, and lock, extend (its script sent again) and unlock work on every node.
#[test]
fn reconnect_after_restart() {
    const KEY: &str = "compat:restart";
    let cluster = Cluster::start(3);
    let mut rl = client(&cluster);
    let mut lock = lock_everywhere(&mut rl, &cluster, KEY);
    rl.extend(&mut lock, TTL).expect("extend");
    rl.unlock(&lock).expect("unlock");
    let before = cluster.pids();
    for n in 0..3 {
        cluster.node(n).restart();
    }
    assert!(before.iter().zip(cluster.pids()).all(|(a, b)| *a != b));
    let mut lock = lock_everywhere(&mut rl, &cluster, KEY);
    rl.extend(&mut lock, Duration::from_secs(600))
        .expect("extend after the restart");
    assert!(
        wait_until(WAIT, || {
            (0..3).all(|n| cluster.node(n).admin().pttl(KEY) > TTL.as_millis() as i64)
        }),
        "the extend did not reach every restarted node"
    );
    assert!(rl.unlock(&lock).expect("unlock") >= 2);
    assert!(wait_all(&cluster, KEY, None));
}

/// An ACL user made with `ACL SETUSER`, allowed only the commands the client sends, its
/// own keys and the release channels: lock, extend, unlock and the notice work; a wrong
/// password is refused at the handshake.
#[test]
fn acl_user() {
    const KEY: &str = "compat:acl";
    let cluster = Cluster::start(3);
    for n in 0..3 {
        let r = cluster.node(n).admin().cmd(&[
            "ACL",
            "SETUSER",
            "locker",
            "reset",
            "on",
            ">s3cret pw",
            "~compat:*",
            "~quorumlock:*",
            "resetchannels",
            "&quorumlock:released:*",
            "+ping",
            "+info",
            "+set",
            "+get",
            "+del",
            "+exists",
            "+pexpire",
            "+publish",
            "+eval",
            "+evalsha",
        ]);
        assert!(r.is_ok(), "node {n}: ACL SETUSER: {r:?}");
    }
    let urls = |password: &str| -> Vec<String> {
        (0..3)
            .map(|n| {
                let port = cluster.node(n).port().expect("tcp node");
                format!("redis://locker:{password}@127.0.0.1:{port}")
            })
            .collect()
    };
    let mut rl = builder(&urls("s3cret%20pw"))
        .fencing(true)
        .build()
        .expect("valid configuration");
    let mut lock = lock_everywhere(&mut rl, &cluster, KEY);
    assert!(lock.fence().is_some());
    rl.extend(&mut lock, TTL).expect("extend");
    let mut sub = cluster.node(0).admin();
    sub.set_read_timeout(Some(WAIT)).unwrap();
    sub.send(&["SUBSCRIBE", "quorumlock:released:compat:acl"])
        .unwrap();
    sub.recv().expect("subscribe confirmation");
    assert!(rl.unlock(&lock).expect("unlock") >= 2);
    assert!(wait_all(&cluster, KEY, None));
    let notice = sub
        .recv()
        .expect("the release notice, published by the user");
    assert!(
        notice
            .as_array()
            .and_then(|a| a.first())
            .and_then(|k| k.as_bytes())
            == Some(&b"message"[..]),
        "{notice:?}"
    );
    // A wrong password: every node refuses the handshake.
    let mut wrong = builder(&urls("nope")).build().expect("valid configuration");
    let mut last = None;
    let refused = wait_until(WAIT, || {
        let e = wrong.try_lock(KEY, TTL).expect_err("wrong password");
        let all = (0..3).all(|n| {
            matches!(outcome(&e, n), Some(Outcome::Failed(NodeError::Handshake(m))) if m.starts_with("WRONGPASS"))
        });
        last = Some(e);
        all
    });
    assert!(refused, "not every node refused the handshake: {last:?}");
}

/// Where the server was built with TLS: three `rediss://` nodes (TLS port only), lock,
/// extend and unlock. Where it was not, the server says so on start-up and the test skips.
#[cfg(feature = "tls")]
#[test]
fn tls() {
    use common::tls::{Certs, TlsNode};
    let certs = Certs::new();
    let first = match std::panic::catch_unwind(|| TlsNode::start(&certs, false)) {
        Ok(node) => node,
        Err(panic) => {
            let text = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            // Redis 7+ and Valkey: "Failed finding TLS support."; Redis 6: the `tls-port`
            // directive is unknown to a build without TLS.
            let reason = if text.contains("Failed finding TLS support") {
                "built without TLS (the server says: Failed finding TLS support)"
            } else if text.contains("'tls-port") && text.contains("Bad directive") {
                "built without TLS (the server does not know tls-port)"
            } else {
                std::panic::resume_unwind(panic)
            };
            skip("tls", reason);
            return;
        }
    };
    let mut nodes = vec![first];
    nodes.extend((1..3).map(|_| TlsNode::start(&certs, false)));
    let urls: Vec<String> = nodes.iter().map(TlsNode::url).collect();
    let mut rl = builder(&urls)
        .connect_timeout(Duration::from_secs(5))
        .tls_ca_file(certs.path("ca.crt"))
        .build()
        .expect("valid configuration");
    let mut last = String::new();
    let mut got = None;
    let ok = wait_until(WAIT, || match rl.try_lock("compat:tls", TTL) {
        Ok(lock) if nodes.iter().all(|n| n.holds("compat:tls")) => {
            got = Some(lock);
            true
        }
        Ok(lock) => {
            rl.unlock(&lock).expect("unlock");
            false
        }
        Err(e) => {
            last = e.to_string();
            false
        }
    });
    assert!(ok, "never locked on every TLS node; last: {last}");
    let mut lock = got.expect("locked");
    rl.extend(&mut lock, Duration::from_secs(600))
        .expect("extend");
    assert!(wait_until(WAIT, || nodes
        .iter()
        .all(|n| n.pttl("compat:tls") > TTL.as_millis() as i64)));
    assert!(rl.unlock(&lock).expect("unlock") >= 2);
    assert!(wait_until(WAIT, || nodes
        .iter()
        .all(|n| !n.holds("compat:tls"))));
}

/// Records that `test` was skipped on this server, and why (see the module's doc).
#[cfg(feature = "tls")]
fn skip(test: &str, reason: &str) {
    let server = common::server_version_line();
    eprintln!("{test}: skipped on `{server}`: {reason}");
    if let Some(path) = std::env::var_os("QUORUMLOCK_COMPAT_SKIPS") {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.to_string_lossy()));
        writeln!(f, "{test}\t{reason}").expect("write the skip");
    }
}
