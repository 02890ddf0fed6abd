//! Real servers, real faults: frozen (SIGSTOP), killed (SIGKILL) and restarted nodes,
//! connections killed by the server, a fault-injecting proxy, slow servers, a lost
//! script cache, and the lock lifecycle around expiry.
//!
//! Timing assertions are generous upper bounds that prove "no hang", or "did not wait
//! out `node_timeout`" with a `node_timeout` far above any round on a loaded machine;
//! never performance claims. Where a test names a path (a reply arriving after the
//! decision), it checks that the path was taken (the node was still asleep when the call
//! returned), and fails otherwise.

mod common;

use common::{Cluster, Mode, Proxy};
use quorumlock::{Error, Failure, Lock, NodeError, Outcome, Phase, Redlock};
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

const TTL: Duration = Duration::from_secs(10);
/// Added to "no hang" bounds: generous, the machine may be loaded.
const MARGIN: Duration = Duration::from_secs(5);
/// For rounds where every node is healthy: long enough that a loaded machine never makes
/// a healthy node miss a round (the round ends when every node has answered).
const HEALTHY: Duration = Duration::from_secs(2);
/// SHA1 of the release script (`quorumlock::__private::core::script::RELEASE_SHA`).
const RELEASE_SHA: &str = "b70c2384248f88e6b75b9f89241a180f856ad852";

fn client(urls: &[String], node_timeout: Duration) -> Redlock {
    Redlock::builder()
        .nodes(urls)
        .node_timeout(node_timeout)
        .retry_count(0)
        .max_backoff(Duration::from_millis(100))
        .build()
        .expect("valid configuration")
}

/// One lock + unlock; the number of nodes the unlock released on, or why it failed.
fn cycle(rl: &mut Redlock, resource: &str) -> Result<usize, Error> {
    let lock = rl.try_lock(resource, TTL)?;
    rl.unlock(&lock)
}

/// Loops `cycle` until an unlock releases on every node.
fn wait_all_rejoin(rl: &mut Redlock, resource: &str, n: usize, within: Duration) {
    let mut last = None;
    let ok = common::wait_until(within, || {
        let r = cycle(rl, resource);
        let done = matches!(r, Ok(k) if k == n);
        last = Some(r);
        done
    });
    assert!(ok, "nodes never all rejoined; last cycle: {last:?}");
}

/// Every node of `cluster` (by index) holds `resource` with `token`, or none does.
fn holders(cluster: &Cluster, nodes: &[usize], resource: &str) -> Vec<Option<Vec<u8>>> {
    nodes
        .iter()
        .map(|&i| cluster.node(i).admin().get(resource))
        .collect()
}

fn outcome(f: &Failure, node: usize) -> &Outcome {
    &f.nodes[node].outcome
}

/// Raises the flag when dropped, also while unwinding from a failed assertion.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

// ---------------------------------------------------------------------------------------
// Frozen nodes
// ---------------------------------------------------------------------------------------

#[test]
fn two_of_five_frozen_cost_nothing_and_rejoin_after_thaw() {
    let cluster = Cluster::start(5);
    // Waiting for a frozen node costs node_timeout: a lock that took less did not wait.
    let node_timeout = Duration::from_secs(2);
    let mut rl = client(&cluster.urls(), node_timeout);
    assert_eq!(cycle(&mut rl, "frozen").expect("warm-up"), 5);

    cluster.node(1).freeze();
    cluster.node(3).freeze();
    for i in 0..20 {
        let t = Instant::now();
        let lock = rl
            .lock("frozen", TTL)
            .unwrap_or_else(|e| panic!("cycle {i}: lock with 3 of 5: {e}"));
        let took = t.elapsed();
        assert!(
            took < node_timeout,
            "cycle {i}: lock took {took:?}; the healthy quorum should decide without \
             waiting out node_timeout ({node_timeout:?}) for the frozen nodes"
        );
        assert!(lock.is_valid());
        let t = Instant::now();
        let released = rl
            .unlock(&lock)
            .unwrap_or_else(|e| panic!("cycle {i}: unlock with 3 of 5: {e}"));
        assert_eq!(released, 3, "cycle {i}");
        assert!(t.elapsed() < node_timeout + MARGIN, "cycle {i}");
    }

    cluster.node(1).thaw();
    cluster.node(3).thaw();
    // Their late replies (one SET, many releases) are read and discarded; once caught
    // up they take part again.
    wait_all_rejoin(&mut rl, "frozen", 5, Duration::from_secs(10));
    for i in 0..20 {
        let lock = rl
            .lock("frozen", TTL)
            .unwrap_or_else(|e| panic!("cycle {i} after thaw: {e}"));
        assert_eq!(
            rl.unlock(&lock).expect("unlock after thaw"),
            5,
            "cycle {i} after thaw"
        );
    }
    assert_eq!(
        holders(&cluster, &[0, 1, 2, 3, 4], "frozen"),
        vec![None; 5],
        "keys left behind"
    );
}

#[test]
fn three_of_five_frozen_is_unavailable_without_hanging() {
    let cluster = Cluster::start(5);
    let node_timeout = Duration::from_millis(100);
    let retry_delay = Duration::from_millis(50);
    let jitter = Duration::from_millis(10);
    let mut rl = Redlock::builder()
        .nodes(cluster.urls())
        .node_timeout(node_timeout)
        .retry_count(2)
        .retry_delay(retry_delay)
        .retry_jitter(jitter)
        .max_backoff(Duration::from_millis(100))
        .build()
        .expect("config");
    assert_eq!(cycle(&mut rl, "warm").expect("warm-up"), 5);

    let frozen = [0, 2, 4];
    for &i in &frozen {
        cluster.node(i).freeze();
    }
    let t = Instant::now();
    let err = rl
        .lock("three-frozen", TTL)
        .expect_err("no quorum with 3 of 5 frozen");
    let took = t.elapsed();
    assert!(
        took < node_timeout * 3 + (retry_delay + jitter) * 2 + MARGIN,
        "took {took:?}"
    );
    let Error::Unavailable(f) = &err else {
        panic!("wrong error kind: {err:?}");
    };
    assert_eq!(f.attempts, 3, "{err}");
    assert_eq!(f.op, Phase::Acquire);
    assert_eq!(f.quorum, 3);
    for &i in &frozen {
        assert!(
            matches!(
                outcome(f, i),
                Outcome::NoReply | Outcome::Failed(NodeError::Lagging)
            ),
            "frozen node {i}: {err}"
        );
    }
    for i in [1, 3] {
        assert!(
            matches!(
                outcome(f, i),
                Outcome::Locked | Outcome::NoReply | Outcome::NotNeeded
            ),
            "healthy node {i}: {err}"
        );
    }
    // Every failed attempt released what it set on the healthy nodes.
    assert!(
        common::wait_until(Duration::from_secs(2), || holders(
            &cluster,
            &[1, 3],
            "three-frozen"
        ) == vec![None; 2]),
        "a failed attempt left its key on a healthy node"
    );

    for &i in &frozen {
        cluster.node(i).thaw();
    }
    // The thawed nodes apply the stale SETs and the releases queued behind them.
    wait_all_rejoin(&mut rl, "three-frozen", 5, Duration::from_secs(10));
    assert!(
        common::wait_until(Duration::from_secs(2), || holders(
            &cluster,
            &[0, 1, 2, 3, 4],
            "three-frozen"
        ) == vec![None; 5]),
        "stale keys after thaw"
    );
}

// ---------------------------------------------------------------------------------------
// Killed and restarted nodes
// ---------------------------------------------------------------------------------------

#[test]
fn node_killed_mid_run_and_restarted_on_the_same_port() {
    let cluster = Cluster::start(5);
    let mut rl = client(&cluster.urls(), HEALTHY);
    assert_eq!(cycle(&mut rl, "killed").expect("warm-up"), 5);
    let victim = cluster.node(2);
    let old_pid = victim.pid();
    let done = AtomicBool::new(false);
    let mut cycles = 0;
    thread::scope(|s| {
        s.spawn(|| {
            thread::sleep(Duration::from_millis(200));
            victim.kill();
            thread::sleep(Duration::from_millis(400));
            victim.restart();
            done.store(true, Ordering::SeqCst);
        });
        // Every lock succeeds throughout; every unlock releases on at least the 4 nodes
        // that were not touched while the lock was held.
        while !done.load(Ordering::SeqCst) || cycles < 10 {
            let lock = rl
                .try_lock("killed", TTL)
                .unwrap_or_else(|e| panic!("cycle {cycles}: lock with 4+ of 5: {e}"));
            let released = rl
                .unlock(&lock)
                .unwrap_or_else(|e| panic!("cycle {cycles}: unlock with 4+ of 5: {e}"));
            assert!(released >= 4, "cycle {cycles}: released on {released}");
            cycles += 1;
            thread::sleep(Duration::from_millis(5));
        }
    });
    assert_ne!(victim.pid(), old_pid);
    assert!(cycles >= 10);
    // The client reconnects by itself.
    wait_all_rejoin(&mut rl, "killed", 5, Duration::from_secs(10));
}

#[test]
fn three_of_five_killed_is_unavailable_promptly_then_recovers() {
    let cluster = Cluster::start(5);
    let mut rl = client(&cluster.urls(), Duration::from_millis(200));
    assert_eq!(cycle(&mut rl, "warm").expect("warm-up"), 5);
    let killed = [1, 2, 4];
    for &i in &killed {
        cluster.node(i).kill();
    }
    for attempt in 0..3 {
        let t = Instant::now();
        let err = rl
            .lock("three-killed", TTL)
            .expect_err("no quorum with 3 of 5 dead");
        let took = t.elapsed();
        assert!(
            took < Duration::from_millis(200) + MARGIN,
            "attempt {attempt} took {took:?}"
        );
        let Error::Unavailable(f) = &err else {
            panic!("wrong error kind: {err:?}");
        };
        for &i in &killed {
            assert!(
                matches!(
                    outcome(f, i),
                    Outcome::Failed(NodeError::Closed | NodeError::Io(..) | NodeError::Down(_))
                ),
                "attempt {attempt}, dead node {i}: {err}"
            );
        }
    }
    for &i in &killed {
        cluster.node(i).restart();
    }
    wait_all_rejoin(&mut rl, "three-killed", 5, Duration::from_secs(10));
}

// ---------------------------------------------------------------------------------------
// Connections killed by the server
// ---------------------------------------------------------------------------------------

#[test]
fn client_kill_between_calls_is_survived_within_one_attempt() {
    let cluster = Cluster::start(5);
    let mut rl = client(&cluster.urls(), HEALTHY);
    let mut admins = cluster.admins();
    for round in 0..5 {
        // All five connections in use and idle (every reply read: unlock waits for all).
        wait_all_rejoin(&mut rl, "ck", 5, Duration::from_secs(5));
        for a in &mut admins {
            assert!(a.client_kill_normal() >= 1, "round {round}");
        }
        // Single attempt: the idle connections found closed are reopened and the SET
        // resent within the round, on every node.
        let lock = rl
            .try_lock("ck", TTL)
            .unwrap_or_else(|e| panic!("round {round}: try_lock after CLIENT KILL: {e}"));
        let token = lock.token().to_vec();
        assert!(
            common::wait_until(Duration::from_secs(2), || holders(
                &cluster,
                &[0, 1, 2, 3, 4],
                "ck"
            )
            .iter()
            .all(|h| h.as_deref() == Some(&token[..]))),
            "round {round}: not every node got the resent SET"
        );
        for a in &mut admins {
            assert!(a.client_kill_normal() >= 1, "round {round}");
        }
        // A quorum answered, so the lock is free (see the test below for the nodes whose
        // late SET reply was still unread when the connection was killed).
        let released = rl.unlock(&lock).expect("unlock after CLIENT KILL");
        assert!(
            released >= 3,
            "round {round}: unlock after CLIENT KILL: {released}"
        );
        for a in &mut admins {
            a.del("ck");
        }
    }
}

#[test]
fn client_kill_after_a_quorum_decided_round_still_releases_everywhere() {
    // Nodes 1 and 3 answer the SET late (DEBUG SLEEP), after the other three decided
    // the lock: their replies sit unread in the client's sockets while it is idle. Then
    // the server kills every connection. From the server's point of view all five
    // connections were idle; the unlock must reopen them and delete the key on all five,
    // not leave it on the two slow ones until the ttl.
    let cluster = Cluster::start(5);
    // Far above the test's pauses: the slow nodes are never taken for lagging.
    let mut rl = client(&cluster.urls(), Duration::from_secs(10));
    assert_eq!(cycle(&mut rl, "warm").expect("warm-up"), 5);
    let sleepers = [cluster.node(1).admin(), cluster.node(3).admin()];
    let handles: Vec<_> = sleepers.iter().map(|a| a.debug_sleep(2.0)).collect();
    let lock = rl.try_lock("ck-late", TTL).expect("3 fast nodes of 5");
    // The late path: the lock was decided while nodes 1 and 3 still slept, so their
    // replies came after it.
    for i in [1, 3] {
        assert!(
            cluster.node(i).in_debug_sleep(),
            "node {i} woke before the lock was decided: its reply was not late"
        );
    }
    for h in handles {
        h.join().expect("sleep thread").expect("DEBUG SLEEP");
    }
    let token = Some(lock.token().to_vec());
    assert!(common::wait_until(Duration::from_secs(2), || holders(
        &cluster,
        &[0, 1, 2, 3, 4],
        "ck-late"
    ) == vec![
        token
            .clone();
        5
    ]));
    for n in cluster.nodes() {
        assert!(n.admin().client_kill_normal() >= 1);
    }
    let released = rl.unlock(&lock).expect("unlock after CLIENT KILL");
    let left = holders(&cluster, &[0, 1, 2, 3, 4], "ck-late");
    assert_eq!(
        released,
        5,
        "unlock after CLIENT KILL released on {released} of 5; keys left until the ttl: \
         {:?}",
        left.iter().map(Option::is_some).collect::<Vec<_>>()
    );
}

#[test]
fn client_kill_during_rounds_gives_only_typed_errors() {
    let cluster = Cluster::start(5);
    let mut rl = client(&cluster.urls(), Duration::from_millis(200));
    assert_eq!(cycle(&mut rl, "warm").expect("warm-up"), 5);
    let stop = AtomicBool::new(false);
    let (mut ok, mut failed) = (0, 0);
    thread::scope(|s| {
        let killer = s.spawn(|| {
            let mut admins = cluster.admins();
            let mut kills = 0;
            while !stop.load(Ordering::SeqCst) {
                for a in &mut admins {
                    a.client_kill_normal();
                }
                kills += 1;
                thread::sleep(Duration::from_millis(7 + kills % 11));
            }
            kills
        });
        // Stops the killer even if an assertion below panics (else the scope would hang).
        let _stop_killer = StopOnDrop(&stop);
        let until = Instant::now() + Duration::from_secs(1);
        let mut i = 0u32;
        while Instant::now() < until {
            i += 1;
            // A fresh resource each time: a release that failed must not block the next.
            let resource = format!("ck-storm:{i}");
            match rl.try_lock(&resource, Duration::from_secs(2)) {
                Ok(lock) => {
                    ok += 1;
                    match rl.unlock(&lock) {
                        Ok(n) => assert!(n <= 5),
                        Err(Error::Unavailable(f)) => assert_eq!(f.op, Phase::Release),
                        Err(e) => panic!("unlock: unexpected error kind: {e:?}"),
                    }
                }
                Err(Error::Unavailable(f) | Error::Taken(f)) => {
                    failed += 1;
                    assert_eq!(f.nodes.len(), 5);
                    assert_eq!(f.op, Phase::Acquire);
                }
                Err(e) => panic!("try_lock: unexpected error kind: {e:?}"),
            }
        }
        stop.store(true, Ordering::SeqCst);
        let kills = killer.join().expect("killer thread");
        assert!(kills > 10, "only {kills} kill rounds");
    });
    assert!(
        ok > 0,
        "no lock at all during the storm ({failed} failures)"
    );
    // The storm is over: a working lock again, on every node.
    wait_all_rejoin(&mut rl, "ck-storm:after", 5, Duration::from_secs(5));
}

// ---------------------------------------------------------------------------------------
// A fault-injecting proxy in front of some nodes
// ---------------------------------------------------------------------------------------

/// Nodes 0 and 1 behind proxies; for each count in `faulty`, that many proxies switch to
/// `mode`: locks still succeed from the direct nodes without waiting out `node_timeout`,
/// and after switching back to `Pass` the proxied nodes rejoin by themselves.
///
/// `node_timeout` is 1 s, far above a healthy round on a loaded machine, so "took less
/// than node_timeout" means "did not wait for the faulty nodes"; a delay must exceed it.
fn proxy_scenario(mode: Mode, faulty: &[usize]) {
    let cluster = Cluster::start(5);
    let proxies = [
        Proxy::start(cluster.node(0).addr().expect("tcp")),
        Proxy::start(cluster.node(1).addr().expect("tcp")),
    ];
    let mut urls = cluster.urls();
    urls[0] = proxies[0].url();
    urls[1] = proxies[1].url();
    let node_timeout = PROXY_NODE_TIMEOUT;
    let mut rl = client(&urls, node_timeout);
    assert_eq!(cycle(&mut rl, "proxied").expect("warm-up"), 5);
    for &faulty in faulty {
        for p in &proxies[..faulty] {
            p.set_mode(mode);
        }
        for i in 0..3 {
            let t = Instant::now();
            let lock = rl
                .try_lock("proxied", TTL)
                .unwrap_or_else(|e| panic!("{faulty} × {mode:?}, cycle {i}: {e}"));
            let took = t.elapsed();
            assert!(
                took < node_timeout,
                "{faulty} × {mode:?}, cycle {i}: lock took {took:?}; the direct nodes \
                 should decide"
            );
            let released = rl
                .unlock(&lock)
                .unwrap_or_else(|e| panic!("{faulty} × {mode:?}, cycle {i}: unlock: {e}"));
            assert_eq!(released, 5 - faulty, "{faulty} × {mode:?}, cycle {i}");
        }
        for p in &proxies[..faulty] {
            p.set_mode(Mode::Pass);
        }
        let resource = format!("proxied:{faulty}:{mode:?}");
        let mut last = None;
        // A blackholed connection never catches up: the client resets it once it has lagged
        // for 20 × node_timeout, then the node rejoins.
        let rejoined = common::wait_until(node_timeout * 20 + Duration::from_secs(15), || {
            let r = cycle(&mut rl, &resource);
            let done = matches!(r, Ok(5));
            last = Some(r);
            done
        });
        assert!(
            rejoined,
            "{faulty} proxied node(s) never rejoined after {mode:?} -> Pass; \
             last cycle: {last:?}; connections accepted per proxy: {:?}",
            proxies.iter().map(Proxy::connections).collect::<Vec<_>>()
        );
    }
}

const PROXY_NODE_TIMEOUT: Duration = Duration::from_secs(1);

#[test]
fn proxy_delay_in_front_of_one_then_two_nodes() {
    // Longer than node_timeout: the delayed nodes can never answer within a round.
    proxy_scenario(Mode::Delay(PROXY_NODE_TIMEOUT * 2), &[1, 2]);
}

#[test]
fn proxy_reset_in_front_of_one_then_two_nodes() {
    proxy_scenario(Mode::Reset, &[1, 2]);
}

#[test]
fn proxy_blackhole_in_front_of_one_node() {
    // The commands swallowed while in Blackhole are never answered: after Pass, the
    // client has to give up on that connection and reconnect.
    proxy_scenario(Mode::Blackhole, &[1]);
}

#[test]
fn proxy_blackhole_in_front_of_two_nodes() {
    proxy_scenario(Mode::Blackhole, &[2]);
}

// ---------------------------------------------------------------------------------------
// Slow servers
// ---------------------------------------------------------------------------------------

#[test]
fn debug_sleep_on_two_nodes_does_not_block_the_quorum() {
    let cluster = Cluster::start(5);
    let node_timeout = Duration::from_millis(500);
    let mut rl = client(&cluster.urls(), node_timeout);
    assert_eq!(cycle(&mut rl, "warm").expect("warm-up"), 5);
    let sleepers = [cluster.node(1).admin(), cluster.node(3).admin()];
    // Far longer than the 5 cycles (at most one node_timeout each): the sleepers sleep
    // through all of them.
    let handles: Vec<_> = sleepers.iter().map(|a| a.debug_sleep(6.0)).collect();
    let asleep = |what: &str| {
        for i in [1, 3] {
            assert!(
                cluster.node(i).in_debug_sleep(),
                "{what}: node {i} woke up: the sleep no longer covers the test"
            );
        }
    };
    for i in 0..5 {
        let lock = rl
            .lock("sleepy", TTL)
            .unwrap_or_else(|e| panic!("cycle {i}: lock with 2 of 5 asleep: {e}"));
        // Returned while the two slept: the quorum did not wait for them.
        asleep(&format!("cycle {i}, lock"));
        let released = rl
            .unlock(&lock)
            .unwrap_or_else(|e| panic!("cycle {i}: unlock with 2 of 5 asleep: {e}"));
        asleep(&format!("cycle {i}, unlock"));
        assert_eq!(released, 3, "cycle {i}");
    }
    for h in handles {
        let reply = h.join().expect("debug sleep thread").expect("DEBUG SLEEP");
        assert!(reply.is_ok(), "{reply:?}");
    }
    wait_all_rejoin(&mut rl, "sleepy", 5, Duration::from_secs(10));
    assert_eq!(holders(&cluster, &[0, 1, 2, 3, 4], "sleepy"), vec![None; 5]);
}

// ---------------------------------------------------------------------------------------
// Lost script cache
// ---------------------------------------------------------------------------------------

#[test]
fn script_flush_between_lock_and_unlock() {
    let cluster = Cluster::start(5);
    let mut rl = client(&cluster.urls(), HEALTHY);
    assert_eq!(cycle(&mut rl, "warm").expect("warm-up"), 5); // caches the script
    for round in 0..3 {
        let lock = rl.try_lock("flushed", TTL).expect("lock");
        for n in cluster.nodes() {
            n.admin().script_flush();
        }
        // EVALSHA → NOSCRIPT → EVAL, within the same call.
        assert_eq!(
            rl.unlock(&lock).expect("unlock after SCRIPT FLUSH"),
            5,
            "round {round}"
        );
    }
    assert_eq!(
        holders(&cluster, &[0, 1, 2, 3, 4], "flushed"),
        vec![None; 5]
    );
}

#[test]
fn script_flush_between_lock_and_extend() {
    let cluster = Cluster::start(5);
    let mut rl = client(&cluster.urls(), HEALTHY);
    assert_eq!(cycle(&mut rl, "warm").expect("warm-up"), 5);
    let mut lock = rl
        .try_lock("flushed-extend", Duration::from_secs(5))
        .expect("lock");
    for n in cluster.nodes() {
        n.admin().script_flush();
    }
    let before = lock.deadline();
    rl.extend(&mut lock, Duration::from_secs(60))
        .expect("extend after SCRIPT FLUSH");
    assert!(lock.deadline() > before + Duration::from_secs(30));
    assert_eq!(lock.ttl(), Duration::from_secs(60));
    // The quorum that decided certainly has the new ttl (see the test below for the
    // others).
    let extended = cluster
        .nodes()
        .iter()
        .filter(|n| n.admin().pttl("flushed-extend") > 50_000)
        .count();
    assert!(extended >= 3, "extended on {extended} nodes");
    assert_eq!(rl.unlock(&lock).expect("unlock"), 5);
}

#[test]
fn extend_reaches_nodes_whose_noscript_arrives_after_the_quorum() {
    // After SCRIPT FLUSH every node answers the extend's EVALSHA with NOSCRIPT. Nodes 1
    // and 3 answer late (DEBUG SLEEP), after the other three decided the extend. The
    // extend was still sent to them and they are up: the new ttl must reach them too
    // (by EVAL), or the lock silently lives on a bare quorum with the old ttl elsewhere.
    let cluster = Cluster::start(5);
    // Far above the test's pauses: the slow nodes are never taken for lagging.
    let mut rl = client(&cluster.urls(), Duration::from_secs(10));
    assert_eq!(cycle(&mut rl, "warm").expect("warm-up"), 5);
    let mut lock = rl
        .try_lock("late-noscript", Duration::from_secs(30))
        .expect("lock");
    for n in cluster.nodes() {
        n.admin().script_flush();
    }
    let sleepers = [cluster.node(1).admin(), cluster.node(3).admin()];
    let handles: Vec<_> = sleepers.iter().map(|a| a.debug_sleep(2.0)).collect();
    rl.extend(&mut lock, Duration::from_secs(60))
        .expect("extend decided by the 3 fast nodes");
    // The late path: the extend was decided while nodes 1 and 3 still slept, so their
    // NOSCRIPT came after it (and only the late EVAL can give them the 60 s ttl: the
    // 30 s keys stay under 50 s otherwise).
    for i in [1, 3] {
        assert!(
            cluster.node(i).in_debug_sleep(),
            "node {i} woke before the extend was decided: its NOSCRIPT was not late"
        );
    }
    for h in handles {
        h.join().expect("sleep thread").expect("DEBUG SLEEP");
    }
    // Give the client rounds in which to read the late NOSCRIPTs and act on them.
    for _ in 0..3 {
        assert_eq!(cycle(&mut rl, "other").expect("other resource"), 5);
    }
    let mut pttls = Vec::new();
    let everywhere = common::wait_until(Duration::from_secs(2), || {
        pttls = cluster
            .nodes()
            .iter()
            .map(|n| n.admin().pttl("late-noscript"))
            .collect();
        pttls.iter().all(|&p| p > 50_000)
    });
    assert!(
        everywhere,
        "extend returned Ok, but the new 60 s ttl never reached the nodes whose NOSCRIPT \
         came after the decision: PTTL per node {pttls:?}"
    );
    assert_eq!(rl.unlock(&lock).expect("unlock"), 5);
}

#[test]
fn restarted_node_with_empty_script_cache() {
    let cluster = Cluster::start(5);
    let all = [0, 1, 2, 3, 4];
    let mut rl = client(&cluster.urls(), HEALTHY);
    assert_eq!(cycle(&mut rl, "warm").expect("warm-up"), 5); // scripts cached everywhere

    // A node restarted without its data: the key is gone there, unlock counts 4.
    let lock = rl.try_lock("restarted", TTL).expect("lock");
    // Another full cycle reads every outstanding reply: all connections are idle.
    assert_eq!(cycle(&mut rl, "other").expect("other"), 5);
    cluster.node(1).restart();
    assert_eq!(rl.unlock(&lock).expect("unlock after restart"), 4);
    assert_eq!(holders(&cluster, &all, "restarted"), vec![None; 5]);

    // A node restarted with its data (as if restored from disk) but an empty script
    // cache: the stale connection is reopened within the call, EVALSHA draws NOSCRIPT,
    // and the script itself is sent with EVAL (which caches it).
    let lock = rl.try_lock("restarted", TTL).expect("lock");
    assert_eq!(cycle(&mut rl, "other").expect("other"), 5);
    cluster.node(0).restart();
    let mut admin = cluster.node(0).admin();
    assert!(!admin.script_exists(RELEASE_SHA));
    admin.set("restarted", lock.token());
    assert_eq!(rl.unlock(&lock).expect("unlock after restart"), 5);
    assert!(
        admin.script_exists(RELEASE_SHA),
        "EVAL was not used on node 0"
    );
    assert_eq!(holders(&cluster, &all, "restarted"), vec![None; 5]);
    assert_eq!(cycle(&mut rl, "restarted").expect("after restart"), 5);
}

// ---------------------------------------------------------------------------------------
// Lifecycle
// ---------------------------------------------------------------------------------------

#[test]
fn crashed_holder_frees_the_resource_after_ttl() {
    let cluster = Cluster::start(5);
    // Long enough that B's first try certainly meets A's keys, however loaded the machine.
    let ttl = Duration::from_secs(2);
    let mut a = client(&cluster.urls(), HEALTHY);
    let t0 = Instant::now();
    let lock = a.try_lock("crash", ttl).expect("A locks");
    drop(a); // the holder "crashes": no unlock
    let mut b = client(&cluster.urls(), HEALTHY);
    let err = b.try_lock("crash", ttl).expect_err("still held by A");
    let (Error::Taken(f) | Error::Unavailable(f)) = &err else {
        panic!("wrong error kind: {err:?}");
    };
    assert!(f.count(|o| *o == Outcome::Held) >= 1, "{err}");
    assert!(f.count(|o| *o == Outcome::Locked) <= 2, "{err}");
    let mut taken = None;
    assert!(
        common::wait_until(ttl + Duration::from_secs(10), || {
            taken = b.try_lock("crash", TTL).ok();
            taken.is_some()
        }),
        "the resource never became free after A's ttl"
    );
    let elapsed = t0.elapsed();
    assert!(
        elapsed >= ttl - Duration::from_millis(10),
        "B got the lock {elapsed:?} after A took it with ttl {ttl:?}"
    );
    let taken = taken.expect("lock");
    assert_ne!(taken.token(), lock.token());
    // B may have won before A's key expired on the slowest node: at least a quorum.
    assert!(b.unlock(&taken).expect("unlock") >= 3);
}

#[test]
fn unlock_twice_and_unlock_after_expiry() {
    let cluster = Cluster::start(5);
    let mut rl = client(&cluster.urls(), HEALTHY);
    let lock = rl.try_lock("twice", TTL).expect("lock");
    assert_eq!(rl.unlock(&lock).expect("first unlock"), 5);
    assert_eq!(rl.unlock(&lock).expect("second unlock"), 0);

    let lock = rl
        .try_lock("expired", Duration::from_millis(100))
        .expect("lock");
    assert!(
        common::wait_until(Duration::from_secs(2), || holders(
            &cluster,
            &[0, 1, 2, 3, 4],
            "expired"
        ) == vec![None; 5]),
        "key did not expire"
    );
    assert!(!lock.is_valid());
    assert_eq!(rl.unlock(&lock).expect("unlock of an expired lock"), 0);
}

#[test]
fn stale_release_never_deletes_the_new_holders_key() {
    let cluster = Cluster::start(5);
    let mut a = client(&cluster.urls(), HEALTHY);
    let mut b = client(&cluster.urls(), HEALTHY);
    let all = [0, 1, 2, 3, 4];
    let mut a_lock = a
        .try_lock("stale", Duration::from_millis(200))
        .expect("A locks");
    assert!(
        common::wait_until(Duration::from_secs(2), || holders(&cluster, &all, "stale")
            == vec![None; 5]),
        "A's key did not expire"
    );
    let b_lock = b.try_lock("stale", TTL).expect("B locks after A expired");
    let b_token = Some(b_lock.token().to_vec());
    assert!(common::wait_until(Duration::from_secs(2), || holders(
        &cluster, &all, "stale"
    ) == vec![
        b_token
            .clone();
        5
    ]));

    // A's release and extend come too late and must not touch B's key.
    assert_eq!(a.unlock(&a_lock).expect("stale unlock"), 0);
    let err = a
        .extend(&mut a_lock, TTL)
        .expect_err("extend of an expired lock");
    let Error::Expired(f) = &err else {
        panic!("wrong error kind: {err:?}");
    };
    assert_eq!(f.op, Phase::Extend);
    assert_eq!(f.attempts, 0, "an expired lock is refused without a round");
    assert!(f.nodes.is_empty(), "{err}");
    assert_eq!(holders(&cluster, &all, "stale"), vec![b_token.clone(); 5]);
    for i in all {
        let pttl = cluster.node(i).admin().pttl("stale");
        assert!(
            pttl > 0 && pttl <= 10_000,
            "node {i}: B's ttl changed: {pttl}"
        );
    }
    assert_eq!(b.unlock(&b_lock).expect("B unlocks"), 5);
}

#[test]
fn extend_after_another_client_took_over_is_expired() {
    // A's lock is still valid on A's clock, but the keys were lost on the servers (here:
    // deleted by an admin) and B took the resource. A's extend must see B's keys, report
    // Expired, and leave B's keys and ttl alone.
    let cluster = Cluster::start(5);
    let all = [0, 1, 2, 3, 4];
    let mut a = client(&cluster.urls(), HEALTHY);
    let mut b = client(&cluster.urls(), HEALTHY);
    let mut a_lock = a.try_lock("takeover", TTL).expect("A locks");
    assert!(common::wait_until(Duration::from_secs(2), || holders(
        &cluster, &all, "takeover"
    )
    .iter()
    .all(Option::is_some)));
    for i in all {
        cluster.node(i).admin().del("takeover");
    }
    let b_lock = b.try_lock("takeover", TTL).expect("B locks");
    let b_token = Some(b_lock.token().to_vec());
    assert!(common::wait_until(Duration::from_secs(2), || holders(
        &cluster, &all, "takeover"
    ) == vec![
        b_token
            .clone();
        5
    ]));
    assert!(a_lock.is_valid());
    let err = a
        .extend(&mut a_lock, Duration::from_secs(60))
        .expect_err("B holds the resource");
    let Error::Expired(f) = &err else {
        panic!("wrong error kind: {err:?}");
    };
    assert_eq!(f.op, Phase::Extend);
    // An extend's "no" means "this token is not there": B's key, not ours.
    assert!(f.count(|o| *o == Outcome::NotHeld) >= 3, "{err}");
    assert_eq!(f.count(|o| *o == Outcome::Locked), 0, "{err}");
    assert_eq!(
        holders(&cluster, &all, "takeover"),
        vec![b_token.clone(); 5]
    );
    for i in all {
        let pttl = cluster.node(i).admin().pttl("takeover");
        assert!(
            pttl > 0 && pttl <= 10_000,
            "node {i}: B's ttl changed: {pttl}"
        );
    }
    assert_eq!(a.unlock(&a_lock).expect("A's stale unlock"), 0);
    assert_eq!(holders(&cluster, &all, "takeover"), vec![b_token; 5]);
    assert_eq!(b.unlock(&b_lock).expect("B unlocks"), 5);
}

#[test]
fn extend_of_an_expired_lock_is_refused_at_once() {
    let cluster = Cluster::start(3);
    let mut rl = client(&cluster.urls(), HEALTHY);
    let mut lock: Lock = rl
        .try_lock("short", Duration::from_millis(100))
        .expect("lock");
    thread::sleep(Duration::from_millis(150));
    assert!(!lock.is_valid());
    // "At once": no round, so no node is asked (checked below), not a time bound.
    let err = rl
        .extend(&mut lock, TTL)
        .expect_err("extend of an expired lock");
    let Error::Expired(f) = &err else {
        panic!("wrong error kind: {err:?}");
    };
    assert_eq!((f.op, f.attempts, f.nodes.len()), (Phase::Extend, 0, 0));
    assert!(!lock.is_valid(), "a refused extend never revives a lock");
}
