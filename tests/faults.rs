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
/// SHA1 of the release script, as `SCRIPT EXISTS` takes it.
fn release_sha() -> &'static str {
    std::str::from_utf8(quorumlock::__private::core::script::RELEASE_SHA).expect("hex digits")
}

fn client(urls: &[String], node_timeout: Duration) -> Redlock {
    Redlock::builder()
        .nodes(urls)
        .node_timeout(node_timeout)
        .retry_count(0)
        .max_backoff(Duration::from_millis(100))
        .build()
        .expect("valid configuration")
}

/// How long a node-side check waits for commands already sent to land (a loaded machine
/// may take a while to schedule a node; a command that was never sent never lands).
const SETTLE: Duration = Duration::from_secs(5);
/// The same wait in a loop that retries until the nodes rejoin: short, since a node that
/// was not sent the SET never gets it, and the loop tries again anyway.
const REJOIN_STEP: Duration = Duration::from_secs(1);

/// Every node of `cluster`.
fn all_nodes(cluster: &Cluster) -> Vec<usize> {
    (0..cluster.len()).collect()
}

/// `unlock` returns once a majority has answered (issue #9): `Ok(k)` says a quorum
/// answered, and `k` is what was confirmed by then, so `quorum <= k <= n` when every node
/// held our key. Which nodes deleted it is seen on the nodes: every node in `nodes` stops
/// holding the key within `SETTLE` (the deletes still in flight were sent; nothing else
/// needs to happen for them to land).
fn unlock_everywhere(rl: &mut Redlock, cluster: &Cluster, nodes: &[usize], lock: &Lock) {
    let resource = std::str::from_utf8(lock.resource()).expect("utf-8 resource");
    let released = rl.unlock(lock).expect("unlock");
    assert!(
        released >= rl.quorum() && released <= cluster.len(),
        "unlock of a lock every node held returned {released}"
    );
    let mut left = Vec::new();
    assert!(
        common::wait_until(SETTLE, || {
            left = holders(cluster, nodes, resource);
            left.iter().all(Option::is_none)
        }),
        "keys left after unlock returned Ok({released}), per node {nodes:?}: {left:?}"
    );
}

/// One lock + unlock that every node took part in, seen on the nodes: after `try_lock`
/// every node holds our token (within `settle`), and after `unlock` (a quorum answered)
/// none holds the key (within `settle`). `Err` says what was missing.
fn full_cycle(
    rl: &mut Redlock,
    cluster: &Cluster,
    resource: &str,
    settle: Duration,
) -> Result<(), String> {
    let all = all_nodes(cluster);
    let lock = rl
        .try_lock(resource, TTL)
        .map_err(|e| format!("lock: {e}"))?;
    let token = Some(lock.token().to_vec());
    let mut seen = Vec::new();
    let set_everywhere = common::wait_until(settle, || {
        seen = holders(cluster, &all, resource);
        seen.iter().all(|h| *h == token)
    });
    let unlocked = rl.unlock(&lock);
    let mut left = Vec::new();
    let deleted_everywhere = common::wait_until(settle, || {
        left = holders(cluster, &all, resource);
        left.iter().all(|h| *h != token)
    });
    let matched: Vec<bool> = seen.iter().map(|h| *h == token).collect();
    match unlocked {
        Err(e) => Err(format!("unlock: {e}; SET seen per node: {matched:?}")),
        Ok(_) if !set_everywhere => Err(format!("SET seen per node: {matched:?}")),
        Ok(k) if k < rl.quorum() => Err(format!("unlock returned {k} below the quorum")),
        Ok(k) if !deleted_everywhere => Err(format!(
            "unlock returned {k}, our key still on nodes: {:?}",
            left.iter().map(|h| *h == token).collect::<Vec<_>>()
        )),
        Ok(_) => Ok(()),
    }
}

/// Loops [`full_cycle`] (on a fresh resource each try, so a key a failed try left behind
/// never blocks the next) until every node of `cluster` takes both the SET and the
/// delete; `Err` has the last try's failure when `within` runs out.
fn try_rejoin(
    rl: &mut Redlock,
    cluster: &Cluster,
    resource: &str,
    within: Duration,
) -> Result<(), String> {
    let deadline = Instant::now() + within;
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        let last = match full_cycle(
            rl,
            cluster,
            &format!("{resource}:rejoin:{attempt}"),
            REJOIN_STEP,
        ) {
            Ok(()) => return Ok(()),
            Err(e) => e,
        };
        if Instant::now() >= deadline {
            return Err(format!("after {attempt} tries; last: {last}"));
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// [`try_rejoin`], asserted: every node of `cluster` is up and in step with the client.
fn wait_all_rejoin(rl: &mut Redlock, cluster: &Cluster, resource: &str, within: Duration) {
    if let Err(e) = try_rejoin(rl, cluster, resource, within) {
        panic!("nodes never all rejoined: {e}");
    }
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
    wait_all_rejoin(&mut rl, &cluster, "frozen", Duration::from_secs(10)); // warm-up

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
        // Exactly 3, though unlock returns at a majority: only the 3 healthy nodes can
        // answer, and the decision needs 3 answers, so all three are counted.
        assert_eq!(released, 3, "cycle {i}");
        assert!(t.elapsed() < node_timeout + MARGIN, "cycle {i}");
        // They answered, so the key is gone there (the frozen nodes cannot be asked).
        assert_eq!(
            holders(&cluster, &[0, 2, 4], "frozen"),
            vec![None; 3],
            "cycle {i}"
        );
    }

    cluster.node(1).thaw();
    cluster.node(3).thaw();
    // Their late replies (one SET, many releases) are read and discarded; once caught
    // up they take part again.
    wait_all_rejoin(&mut rl, &cluster, "frozen", Duration::from_secs(10));
    // Every node takes every SET and delete again (seen on the nodes: unlock's count
    // stops at a majority).
    for i in 0..20 {
        full_cycle(&mut rl, &cluster, "frozen", SETTLE)
            .unwrap_or_else(|e| panic!("cycle {i} after thaw: {e}"));
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
    wait_all_rejoin(&mut rl, &cluster, "warm", Duration::from_secs(10)); // warm-up

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
    wait_all_rejoin(&mut rl, &cluster, "three-frozen", Duration::from_secs(10));
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
    wait_all_rejoin(&mut rl, &cluster, "killed", Duration::from_secs(10)); // warm-up
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
        // Every lock succeeds throughout; every lock and unlock reaches the 4 nodes that
        // are never touched (seen on the nodes: unlock returns at a majority, so its count
        // is at least the quorum and says no more).
        let untouched = [0, 1, 3, 4];
        while !done.load(Ordering::SeqCst) || cycles < 10 {
            let lock = rl
                .try_lock("killed", TTL)
                .unwrap_or_else(|e| panic!("cycle {cycles}: lock with 4+ of 5: {e}"));
            let token = Some(lock.token().to_vec());
            assert!(
                common::wait_until(SETTLE, || holders(&cluster, &untouched, "killed")
                    .iter()
                    .all(|h| *h == token)),
                "cycle {cycles}: an untouched node never got the SET"
            );
            let released = rl
                .unlock(&lock)
                .unwrap_or_else(|e| panic!("cycle {cycles}: unlock with 4+ of 5: {e}"));
            assert!(
                (3..=5).contains(&released),
                "cycle {cycles}: released on {released}"
            );
            assert!(
                common::wait_until(SETTLE, || holders(&cluster, &untouched, "killed")
                    .iter()
                    .all(Option::is_none)),
                "cycle {cycles}: an untouched node kept the key after unlock"
            );
            cycles += 1;
            thread::sleep(Duration::from_millis(5));
        }
    });
    assert_ne!(victim.pid(), old_pid);
    assert!(cycles >= 10);
    // The client reconnects by itself.
    wait_all_rejoin(&mut rl, &cluster, "killed", Duration::from_secs(10));
}

#[test]
fn three_of_five_killed_is_unavailable_promptly_then_recovers() {
    let cluster = Cluster::start(5);
    let mut rl = client(&cluster.urls(), Duration::from_millis(200));
    wait_all_rejoin(&mut rl, &cluster, "warm", Duration::from_secs(10)); // warm-up
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
    wait_all_rejoin(&mut rl, &cluster, "three-killed", Duration::from_secs(10));
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
        // All five connections in use: every node took the last SET and delete (their
        // replies may still wait unread in the client's sockets).
        wait_all_rejoin(&mut rl, &cluster, "ck", Duration::from_secs(5));
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
    wait_all_rejoin(&mut rl, &cluster, "warm", Duration::from_secs(10)); // warm-up
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
    // unlock returns at a majority (its count is at least the quorum); the deletes must
    // still reach all five nodes, seen there, without waiting out the ttl.
    let released = rl.unlock(&lock).expect("unlock after CLIENT KILL");
    assert!((3..=5).contains(&released), "released on {released}");
    let mut left = Vec::new();
    assert!(
        common::wait_until(SETTLE, || {
            left = holders(&cluster, &[0, 1, 2, 3, 4], "ck-late");
            left.iter().all(Option::is_none)
        }),
        "unlock after CLIENT KILL returned Ok({released}); keys left until the ttl: {:?}",
        left.iter().map(Option::is_some).collect::<Vec<_>>()
    );
}

#[test]
fn client_kill_during_rounds_gives_only_typed_errors() {
    let cluster = Cluster::start(5);
    let mut rl = client(&cluster.urls(), Duration::from_millis(200));
    wait_all_rejoin(&mut rl, &cluster, "warm", Duration::from_secs(10)); // warm-up
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
    wait_all_rejoin(&mut rl, &cluster, "ck-storm:after", Duration::from_secs(5));
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
    wait_all_rejoin(&mut rl, &cluster, "proxied", Duration::from_secs(10)); // warm-up
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
            let healthy: Vec<usize> = (faulty..5).collect();
            let token = Some(lock.token().to_vec());
            assert!(
                common::wait_until(SETTLE, || holders(&cluster, &healthy, "proxied")
                    .iter()
                    .all(|h| *h == token)),
                "{faulty} × {mode:?}, cycle {i}: a healthy node never got the SET"
            );
            let released = rl
                .unlock(&lock)
                .unwrap_or_else(|e| panic!("{faulty} × {mode:?}, cycle {i}: unlock: {e}"));
            // unlock returns at a majority: at least the quorum, at most the nodes that
            // can answer. Which nodes deleted is seen on them: every node behind a
            // healthy path (direct, or a proxy still in Pass) held our key and lost it.
            assert!(
                (3..=5 - faulty).contains(&released),
                "{faulty} × {mode:?}, cycle {i}: released on {released}"
            );
            let mut left = Vec::new();
            assert!(
                common::wait_until(SETTLE, || {
                    left = holders(&cluster, &healthy, "proxied");
                    left.iter().all(Option::is_none)
                }),
                "{faulty} × {mode:?}, cycle {i}: keys left on healthy nodes {healthy:?}: \
                 {left:?}"
            );
        }
        for p in &proxies[..faulty] {
            p.set_mode(Mode::Pass);
        }
        let resource = format!("proxied:{faulty}:{mode:?}");
        // A blackholed connection never catches up: the client resets it once it has lagged
        // for 20 × node_timeout, then the node rejoins (takes every SET and delete again).
        let rejoined = try_rejoin(
            &mut rl,
            &cluster,
            &resource,
            node_timeout * 20 + Duration::from_secs(15),
        );
        assert!(
            rejoined.is_ok(),
            "{faulty} proxied node(s) never rejoined after {mode:?} -> Pass: {rejoined:?}; \
             connections accepted per proxy: {:?}",
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
    wait_all_rejoin(&mut rl, &cluster, "warm", Duration::from_secs(10)); // warm-up
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
        // Exactly 3, though unlock returns at a majority: only the 3 awake nodes can
        // answer and the decision needs 3 answers. They answered, so the key is gone
        // there (the sleepers cannot be asked).
        assert_eq!(released, 3, "cycle {i}");
        assert_eq!(
            holders(&cluster, &[0, 2, 4], "sleepy"),
            vec![None; 3],
            "cycle {i}"
        );
    }
    for h in handles {
        let reply = h.join().expect("debug sleep thread").expect("DEBUG SLEEP");
        assert!(reply.is_ok(), "{reply:?}");
    }
    wait_all_rejoin(&mut rl, &cluster, "sleepy", Duration::from_secs(10));
    assert_eq!(holders(&cluster, &[0, 1, 2, 3, 4], "sleepy"), vec![None; 5]);
}

// ---------------------------------------------------------------------------------------
// Lost script cache
// ---------------------------------------------------------------------------------------

#[test]
fn script_flush_between_lock_and_unlock() {
    let cluster = Cluster::start(5);
    let mut rl = client(&cluster.urls(), HEALTHY);
    wait_all_rejoin(&mut rl, &cluster, "warm", Duration::from_secs(10)); // warm-up // caches the script
    let all = all_nodes(&cluster);
    for round in 0..3 {
        let lock = rl.try_lock("flushed", TTL).expect("lock");
        let token = Some(lock.token().to_vec());
        assert!(
            common::wait_until(SETTLE, || holders(&cluster, &all, "flushed")
                .iter()
                .all(|h| *h == token)),
            "round {round}: not every node got the SET"
        );
        for n in cluster.nodes() {
            n.admin().script_flush();
        }
        // EVALSHA → NOSCRIPT → EVAL: unlock returns at a majority, and every node's key
        // is deleted (seen on the nodes) with no further call from the client.
        unlock_everywhere(&mut rl, &cluster, &all, &lock);
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
    wait_all_rejoin(&mut rl, &cluster, "warm", Duration::from_secs(10)); // warm-up
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
    unlock_everywhere(&mut rl, &cluster, &all_nodes(&cluster), &lock);
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
    wait_all_rejoin(&mut rl, &cluster, "warm", Duration::from_secs(10)); // warm-up
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
    // Give the client rounds in which to read the late NOSCRIPTs and act on them: full
    // cycles on another resource (every node takes part, seen on the nodes), until the
    // new ttl is everywhere or the deadline passes.
    let mut pttls = Vec::new();
    let mut round = 0;
    let everywhere = common::wait_until(Duration::from_secs(10), || {
        round += 1;
        full_cycle(&mut rl, &cluster, &format!("other:{round}"), SETTLE)
            .unwrap_or_else(|e| panic!("other resource, round {round}: {e}"));
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
    unlock_everywhere(&mut rl, &cluster, &all_nodes(&cluster), &lock);
}

#[test]
fn restarted_node_with_empty_script_cache() {
    let cluster = Cluster::start(5);
    let all = [0, 1, 2, 3, 4];
    let mut rl = client(&cluster.urls(), HEALTHY);
    wait_all_rejoin(&mut rl, &cluster, "warm", Duration::from_secs(10)); // warm-up // scripts cached everywhere

    // A node restarted without its data: the key is gone there.
    let lock = rl.try_lock("restarted", TTL).expect("lock");
    // Another full cycle: every node took our SET (and the other resource's), seen on the
    // nodes, so nothing of this lock is still on its way when node 1 restarts.
    full_cycle(&mut rl, &cluster, "other", SETTLE).expect("other");
    let token = Some(lock.token().to_vec());
    assert_eq!(holders(&cluster, &all, "restarted"), vec![token.clone(); 5]);
    cluster.node(1).restart();
    // unlock returns at a majority: at most 4 had our key (node 1 lost it), and of the
    // majority that decided at most one (node 1) lacked it, so at least 2.
    let released = rl.unlock(&lock).expect("unlock after restart");
    assert!((2..=4).contains(&released), "released on {released}");
    assert!(
        common::wait_until(SETTLE, || holders(&cluster, &all, "restarted")
            == vec![None; 5]),
        "keys left after unlock: {:?}",
        holders(&cluster, &all, "restarted")
    );

    // A node restarted with its data (as if restored from disk) but an empty script
    // cache: the stale connection is reopened within the call, EVALSHA draws NOSCRIPT,
    // and the script itself is sent with EVAL (which caches it).
    let lock = rl.try_lock("restarted", TTL).expect("lock");
    full_cycle(&mut rl, &cluster, "other", SETTLE).expect("other");
    cluster.node(0).restart();
    let mut admin = cluster.node(0).admin();
    assert!(!admin.script_exists(release_sha()));
    admin.set("restarted", lock.token());
    // unlock returns at a majority (count at least the quorum; all five had our key);
    // node 0's delete is seen on node 0, with no further call from the client.
    unlock_everywhere(&mut rl, &cluster, &all, &lock);
    assert!(
        admin.script_exists(release_sha()),
        "EVAL was not used on node 0"
    );
    full_cycle(&mut rl, &cluster, "restarted", SETTLE).expect("after restart");
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
    // B may have won before A's key expired on some nodes, and unlock returns at a
    // majority of answers, which may include those nodes (they never had B's key): the
    // count says little. What matters is seen on the nodes: B's key is gone everywhere.
    let released = b.unlock(&taken).expect("unlock");
    assert!(released <= 5, "released on {released}");
    assert!(
        common::wait_until(SETTLE, || holders(&cluster, &[0, 1, 2, 3, 4], "crash")
            .iter()
            .all(|h| h.as_deref() != Some(taken.token()))),
        "B's key left after unlock"
    );
}

#[test]
fn unlock_twice_and_unlock_after_expiry() {
    let cluster = Cluster::start(5);
    let mut rl = client(&cluster.urls(), HEALTHY);
    let all = all_nodes(&cluster);
    let lock = rl.try_lock("twice", TTL).expect("lock");
    let token = Some(lock.token().to_vec());
    assert!(common::wait_until(SETTLE, || holders(
        &cluster, &all, "twice"
    )
    .iter()
    .all(|h| *h == token)));
    // At least the quorum (unlock returns at a majority), and the key goes everywhere.
    unlock_everywhere(&mut rl, &cluster, &all, &lock);
    // The lock is released: a second unlock (or an extend) is refused, nothing sent.
    assert!(lock.is_released() && !lock.is_valid());
    let e = rl.unlock(&lock).expect_err("second unlock");
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    assert!(e.to_string().contains("already released"), "{e}");
    let mut same = lock;
    let e = rl.extend(&mut same, TTL).expect_err("extend after unlock");
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    // The same hold as another value (handed over as parts): every node deleted the key
    // already, so it is told apart from a release: held nowhere, `Expired`.
    let mut parts = same.to_parts();
    parts.remaining = parts.ttl / 2;
    let copy = Lock::from_parts(parts).expect("parts");
    let e = rl.unlock(&copy).expect_err("unlock of a lock held nowhere");
    let Error::Expired(f) = &e else {
        panic!("wrong error kind: {e:?}");
    };
    assert_eq!(f.op, Phase::Release);
    assert!(
        f.nodes.iter().all(|n| n.outcome != Outcome::Released),
        "{e}"
    );
    assert!(e.to_string().contains("nothing to release"), "{e}");
    assert!(copy.is_released());

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
    let e = rl.unlock(&lock).expect_err("unlock of an expired lock");
    assert!(
        matches!(&e, Error::Expired(f) if f.op == Phase::Release),
        "{e}"
    );
    assert!(lock.is_released());
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

    // A's extend and release come too late and must not touch B's key.
    let err = a
        .extend(&mut a_lock, TTL)
        .expect_err("extend of an expired lock");
    let Error::Expired(f) = &err else {
        panic!("wrong error kind: {err:?}");
    };
    assert_eq!(f.op, Phase::Extend);
    assert_eq!(f.attempts, 0, "an expired lock is refused without a round");
    assert!(f.nodes.is_empty(), "{err}");
    // Every node holds B's token: A's unlock is told apart from a release.
    let err = a.unlock(&a_lock).expect_err("stale unlock");
    assert!(
        matches!(&err, Error::Expired(f) if f.op == Phase::Release),
        "{err}"
    );
    assert_eq!(holders(&cluster, &all, "stale"), vec![b_token.clone(); 5]);
    for i in all {
        let pttl = cluster.node(i).admin().pttl("stale");
        assert!(
            pttl > 0 && pttl <= 10_000,
            "node {i}: B's ttl changed: {pttl}"
        );
    }
    unlock_everywhere(&mut b, &cluster, &all, &b_lock);
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
    let e = a.unlock(&a_lock).expect_err("A's stale unlock");
    assert!(
        matches!(&e, Error::Expired(f) if f.op == Phase::Release),
        "{e}"
    );
    assert_eq!(holders(&cluster, &all, "takeover"), vec![b_token; 5]);
    unlock_everywhere(&mut b, &cluster, &all, &b_lock);
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
