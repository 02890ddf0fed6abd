//! The observer hook (`Builder::observer`) against real servers: every round of every
//! kind reports each node exactly once per event, in normal operation and under faults
//! (a frozen node, a killed and restarted one, a key held by another client, lagging
//! nodes), in the direct and the shared client; node changes (down, connected, lagging,
//! caught up) are reported; a panicking observer and one that calls back into the shared
//! client break nothing.
//!
//! Conditions are awaited with deadlines; what is asserted is what the client guarantees
//! (which outcome each node may have), never how fast it went.

mod common;

use common::{Cluster, wait_until};
use quorumlock::{
    Decision, Error, NodeChange, NodeError, NodeEvent, Observer, Outcome, Phase, Redlock,
    RoundEvent, SharedRedlock,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

const TTL: Duration = Duration::from_secs(10);
/// Rounds where every node is healthy: no healthy node misses one on a loaded machine.
const HEALTHY: Duration = Duration::from_secs(2);
/// How long a condition is awaited.
const PATIENCE: Duration = Duration::from_secs(10);

/// A round event, copied out.
#[derive(Clone, Debug)]
struct Round {
    phase: Phase,
    round: u64,
    item: usize,
    items: usize,
    resources: Vec<Vec<u8>>,
    decision: Decision,
    quorum: usize,
    yes: usize,
    validity: Option<Duration>,
    deadline: Option<Instant>,
    elapsed: Option<Duration>,
    /// (index, outcome, latency, written), as iterated.
    nodes: Vec<(usize, Outcome, Option<Duration>, bool)>,
}

impl Round {
    fn outcome(&self, node: usize) -> &Outcome {
        &self.nodes[node].1
    }
}

/// A node event, copied out.
#[derive(Clone, Debug, PartialEq)]
enum Change {
    Connected(bool),
    Down(NodeError),
    Lagging,
    CaughtUp,
}

#[derive(Default)]
struct Recorder {
    rounds: Mutex<Vec<Round>>,
    nodes: Mutex<Vec<(usize, Change)>>,
}

impl Observer for Recorder {
    fn round(&self, e: &RoundEvent<'_>) {
        let nodes: Vec<_> = e
            .nodes()
            .map(|n| (n.index(), n.outcome().clone(), n.latency(), n.written()))
            .collect();
        // The accessor by index agrees with the iterator.
        for (i, n) in nodes.iter().enumerate() {
            assert_eq!(e.node(i).map(|m| m.outcome().clone()).as_ref(), Some(&n.1));
        }
        assert!(e.node(nodes.len()).is_none());
        assert_eq!(e.nodes().len(), nodes.len());
        self.rounds.lock().unwrap().push(Round {
            phase: e.phase(),
            round: e.round(),
            item: e.item(),
            items: e.items(),
            resources: e.resources().map(<[u8]>::to_vec).collect(),
            decision: e.decision(),
            quorum: e.quorum(),
            yes: e.yes(),
            validity: e.validity(),
            deadline: e.deadline(),
            elapsed: e.elapsed(),
            nodes,
        });
    }

    fn node(&self, e: &NodeEvent<'_>) {
        let change = match e.change() {
            NodeChange::Connected { first } => Change::Connected(first),
            NodeChange::Down(why) => Change::Down(why.clone()),
            NodeChange::Lagging => Change::Lagging,
            NodeChange::CaughtUp => Change::CaughtUp,
            other => panic!("unknown change {other:?}"),
        };
        self.nodes.lock().unwrap().push((e.index(), change));
    }
}

impl Recorder {
    fn take(&self) -> Vec<Round> {
        std::mem::take(&mut *self.rounds.lock().unwrap())
    }
    fn changes(&self) -> Vec<(usize, Change)> {
        self.nodes.lock().unwrap().clone()
    }
}

/// The one invariant of every event: each of the `n` nodes exactly once, in order, with
/// an outcome that fits the phase, and a latency only for a node that answered or failed
/// during the round; the counts agree with the decision.
fn check_event(r: &Round, n: usize) {
    let indices: Vec<usize> = r.nodes.iter().map(|x| x.0).collect();
    assert_eq!(indices, (0..n).collect::<Vec<_>>(), "{r:?}");
    assert_eq!(r.quorum, n / 2 + 1);
    for (_, outcome, latency, written) in &r.nodes {
        let fits = match outcome {
            Outcome::Locked => matches!(r.phase, Phase::Acquire | Phase::Extend),
            Outcome::Held => r.phase == Phase::Acquire,
            Outcome::Released => r.phase == Phase::Release,
            Outcome::Fenced => r.phase == Phase::Fence,
            Outcome::NotHeld => r.phase != Phase::Acquire,
            Outcome::NotNeeded | Outcome::NoReply | Outcome::Failed(_) => true,
            _ => false,
        };
        assert!(fits, "{outcome:?} in {r:?}");
        if matches!(outcome, Outcome::NoReply | Outcome::NotNeeded) {
            assert!(latency.is_none(), "{r:?}");
        }
        if matches!(
            outcome,
            Outcome::Locked
                | Outcome::Held
                | Outcome::Released
                | Outcome::Fenced
                | Outcome::NotHeld
        ) {
            assert!(
                latency.is_some() && *written,
                "an answer without latency: {r:?}"
            );
        }
        if let Some(l) = latency {
            assert!(*l <= r.elapsed.expect("timed") + HEALTHY, "{r:?}");
        }
    }
    let yes = r
        .nodes
        .iter()
        .filter(|x| matches!(x.1, Outcome::Locked | Outcome::Released | Outcome::Fenced))
        .count();
    assert_eq!(yes, r.yes, "{r:?}");
    match r.decision {
        Decision::Won => assert!(yes >= r.quorum || r.phase == Phase::Fence, "{r:?}"),
        Decision::Released => {
            let answered = r
                .nodes
                .iter()
                .filter(|x| matches!(x.1, Outcome::Released | Outcome::NotHeld))
                .count();
            assert!(answered >= r.quorum, "{r:?}");
        }
        _ => {}
    }
    assert_eq!(r.validity.is_some(), r.deadline.is_some());
    if r.validity.is_some() {
        assert_eq!(r.decision, Decision::Won);
    }
    assert!(r.item < r.items);
}

fn direct(cluster: &Cluster, node_timeout: Duration, obs: &Arc<Recorder>) -> Redlock {
    Redlock::builder()
        .nodes(cluster.urls())
        .node_timeout(node_timeout)
        .retry_count(0)
        .max_backoff(Duration::from_millis(50))
        .observer(Arc::clone(obs))
        .build()
        .expect("valid configuration")
}

/// A builder for `cluster` with `obs` set, healthy timeouts.
fn observed(cluster: &Cluster, obs: Arc<impl Observer>) -> quorumlock::Builder {
    Redlock::builder()
        .nodes(cluster.urls())
        .node_timeout(HEALTHY)
        .observer(obs)
}

#[test]
fn every_kind_of_round_reports_each_node_once() {
    let cluster = Cluster::start(5);
    let obs = Arc::new(Recorder::default());
    let mut rl = direct(&cluster, HEALTHY, &obs);

    // Acquire, extend, release of one resource.
    let mut lock = rl.try_lock("obs:one", TTL).expect("lock");
    let e = obs.take();
    assert_eq!(e.len(), 1, "{e:?}");
    assert_eq!((e[0].phase, e[0].decision), (Phase::Acquire, Decision::Won));
    assert_eq!(e[0].resources, vec![b"obs:one".to_vec()]);
    assert_eq!((e[0].item, e[0].items), (0, 1));
    // The validity the event reports is the lock's.
    assert_eq!(e[0].deadline, Some(lock.deadline()));
    let validity = e[0].validity.expect("won in time");
    assert!(
        validity >= lock.remaining() && validity <= TTL,
        "{validity:?}"
    );
    rl.extend(&mut lock, TTL).expect("extend");
    let e2 = obs.take();
    assert_eq!(
        (e2[0].phase, e2[0].decision),
        (Phase::Extend, Decision::Won)
    );
    assert_eq!(e2[0].deadline, Some(lock.deadline()));
    assert!(e2[0].round > e[0].round);
    rl.unlock(&lock).expect("unlock");
    let e3 = obs.take();
    assert_eq!(
        (e3[0].phase, e3[0].decision),
        (Phase::Release, Decision::Released)
    );
    assert_eq!(e3[0].validity, None);
    for r in e.iter().chain(&e2).chain(&e3) {
        check_event(r, 5);
    }

    // A batch: one round, one event per resource, each with every node once.
    let locks: Vec<_> = rl
        .try_lock_many(&["obs:a", "obs:b", "obs:c"], TTL)
        .into_iter()
        .map(|r| r.expect("free"))
        .collect();
    let e = obs.take();
    assert_eq!(e.len(), 3, "{e:?}");
    for (k, r) in e.iter().enumerate() {
        check_event(r, 5);
        assert_eq!((r.item, r.items, r.round), (k, 3, e[0].round));
        assert_eq!(r.resources, vec![locks[k].resource().to_vec()]);
        assert_eq!(r.deadline, Some(locks[k].deadline()));
    }
    rl.unlock_many(&locks);
    let e = obs.take();
    assert_eq!(e.len(), 3);
    e.iter().for_each(|r| check_event(r, 5));
    assert!(e.iter().all(|r| r.phase == Phase::Release));

    // lock_all: one decision over every resource.
    let mut all = rl.lock_all(&["obs:x", "obs:y"], TTL).expect("lock_all");
    rl.extend(&mut all, TTL).expect("extend all");
    rl.unlock(&all).expect("unlock all");
    let e = obs.take();
    assert_eq!(e.len(), 3, "{e:?}");
    for r in &e {
        check_event(r, 5);
        assert_eq!(r.resources, vec![b"obs:x".to_vec(), b"obs:y".to_vec()]);
        assert_eq!(r.items, 1);
    }
    assert_eq!(
        e.iter().map(|r| r.phase).collect::<Vec<_>>(),
        [Phase::Acquire, Phase::Extend, Phase::Release]
    );
    assert_eq!(e[1].deadline, Some(all.deadline()));

    // A caller-chosen token (inline 32 bytes, and a longer one behind an Arc): the same
    // rounds, reported alike.
    for token in [
        vec![7u8; 32],
        b"a token of the caller's, longer than 32 bytes".to_vec(),
    ] {
        let lock = rl
            .try_lock_with_token("obs:given", TTL, &token)
            .expect("given token");
        assert_eq!(lock.token(), &token[..]);
        rl.unlock(&lock).expect("unlock");
        let e = obs.take();
        assert_eq!(e.len(), 2, "{e:?}");
        e.iter().for_each(|r| check_event(r, 5));
        assert_eq!(
            (e[0].phase, e[0].decision, e[0].deadline),
            (Phase::Acquire, Decision::Won, Some(lock.deadline()))
        );
        assert_eq!(e[0].resources, vec![b"obs:given".to_vec()]);
        assert_eq!(e[1].phase, Phase::Release);
    }
    let lock = rl
        .lock_with_token("obs:given", TTL, b"retried")
        .expect("given token, lock");
    rl.unlock(&lock).expect("unlock");
    let e = obs.take();
    assert_eq!(e.len(), 2, "{e:?}");
    e.iter().for_each(|r| check_event(r, 5));
}

#[test]
fn fenced_locks_report_their_write_back() {
    let cluster = Cluster::start(3);
    let obs = Arc::new(Recorder::default());
    let mut rl = observed(&cluster, Arc::clone(&obs))
        .fencing(true)
        .build()
        .unwrap();
    let lock = rl
        .try_lock("obs:fenced", Duration::from_secs(30))
        .expect("lock");
    rl.unlock(&lock).expect("unlock");
    let all = rl
        .lock_all(&["obs:f1", "obs:f2"], Duration::from_secs(30))
        .expect("lock_all");
    rl.unlock(&all).expect("unlock");
    let many = rl.try_lock_many(&["obs:f3", "obs:f4"], Duration::from_secs(30));
    let e = obs.take();
    let phases: Vec<Phase> = e.iter().map(|r| r.phase).collect();
    assert_eq!(
        phases,
        [
            Phase::Acquire,
            Phase::Fence,
            Phase::Release,
            Phase::Acquire,
            Phase::Fence,
            Phase::Release,
            Phase::Acquire,
            Phase::Acquire,
            Phase::Fence,
            Phase::Fence,
        ],
        "{e:?}"
    );
    for r in &e {
        check_event(r, 3);
    }
    for r in e.iter().filter(|r| r.phase == Phase::Fence) {
        assert_eq!(r.decision, Decision::Won, "{r:?}");
        assert!(r.yes >= 2);
    }
    assert!(many.iter().all(Result::is_ok));
}

#[test]
fn a_key_held_by_another_client_is_refused_on_that_node() {
    let cluster = Cluster::start(5);
    let obs = Arc::new(Recorder::default());
    let mut rl = direct(&cluster, HEALTHY, &obs);
    for i in [1, 3] {
        cluster
            .node(i)
            .admin()
            .set_px("obs:held", "someone-else", 60_000);
    }
    let lock = rl.try_lock("obs:held", TTL).expect("3 of 5 are free");
    let e = obs.take();
    check_event(&e[0], 5);
    // The decision may come before either refusal is read: then it is not needed.
    for i in [1, 3] {
        assert!(
            matches!(e[0].outcome(i), Outcome::Held | Outcome::NotNeeded),
            "{e:?}"
        );
    }
    for i in [0, 2, 4] {
        assert_eq!(e[0].outcome(i), &Outcome::Locked, "{e:?}");
    }
    rl.unlock(&lock).unwrap();
    obs.take();
    // Held on a majority: taken, with every refusal that decided it reported.
    cluster
        .node(0)
        .admin()
        .set_px("obs:held", "someone-else", 60_000);
    let err = rl.try_lock("obs:held", TTL).expect_err("taken");
    assert!(matches!(err, Error::Taken(_)), "{err}");
    let e = obs.take();
    check_event(&e[0], 5);
    assert_eq!(e[0].decision, Decision::Taken);
    assert!(e[0].nodes.iter().filter(|x| x.1 == Outcome::Held).count() >= 3);
    // The event says what the error says, node by node.
    let failure = err.failure().unwrap();
    for (i, n) in failure.nodes.iter().enumerate() {
        assert_eq!(&n.outcome, e[0].outcome(i));
    }
    // `lock` retries: one event per attempt.
    let mut retrying = Redlock::builder()
        .nodes(cluster.urls())
        .node_timeout(HEALTHY)
        .retry_count(2)
        .retry_delay(Duration::from_millis(5))
        .retry_jitter(Duration::ZERO)
        .observer(Arc::clone(&obs))
        .build()
        .unwrap();
    let err = retrying.lock("obs:held", TTL).expect_err("taken");
    assert_eq!(err.failure().unwrap().attempts, 3);
    let e = obs.take();
    assert_eq!(e.len(), 3, "{e:?}");
    for r in &e {
        check_event(r, 5);
        assert_eq!((r.phase, r.decision), (Phase::Acquire, Decision::Taken));
    }
}

#[test]
fn frozen_nodes_give_no_reply_then_lag_then_catch_up() {
    let cluster = Cluster::start(5);
    let obs = Arc::new(Recorder::default());
    // Short enough for the test, long enough that healthy nodes answer in time.
    let node_timeout = Duration::from_millis(300);
    let mut rl = direct(&cluster, node_timeout, &obs);
    rl.try_lock("obs:warm", TTL)
        .and_then(|l| rl.unlock(&l))
        .expect("warm up");
    obs.take();
    let frozen = [2, 3, 4];
    for &i in &frozen {
        cluster.node(i).freeze();
    }
    struct Thaw<'a>(&'a Cluster);
    impl Drop for Thaw<'_> {
        fn drop(&mut self) {
            for i in 0..self.0.len() {
                self.0.node(i).thaw();
            }
        }
    }
    let thaw = Thaw(&cluster);

    let err = rl.try_lock("obs:frozen", TTL).expect_err("no majority");
    assert!(matches!(err, Error::Unavailable(_)), "{err}");
    let e = obs.take();
    assert_eq!(e.len(), 1);
    check_event(&e[0], 5);
    assert_eq!(e[0].decision, Decision::Unavailable);
    for &i in &frozen {
        assert_eq!(e[0].outcome(i), &Outcome::NoReply, "{e:?}");
        assert_eq!(e[0].nodes[i].2, None);
    }
    // The healthy ones answered; a loaded machine may still fail one of them.
    for i in [0, 1] {
        assert!(
            matches!(e[0].outcome(i), Outcome::Locked | Outcome::NoReply),
            "{e:?}"
        );
    }

    // Now they owe replies older than node_timeout: lagging, not asked.
    thread::sleep(node_timeout);
    let _ = rl.try_lock("obs:frozen2", TTL);
    let e = obs.take();
    check_event(&e[0], 5);
    for &i in &frozen {
        assert!(
            matches!(e[0].outcome(i), Outcome::Failed(NodeError::Lagging)),
            "{e:?}"
        );
        assert!(!e[0].nodes[i].3, "a lagging node is not written");
    }
    let lagging: Vec<usize> = obs
        .changes()
        .iter()
        .filter(|c| c.1 == Change::Lagging)
        .map(|c| c.0)
        .collect();
    assert_eq!(lagging, frozen, "each lagging node reported once");

    drop(thaw);
    // Back: every node answers again, each lagging node reported caught up (or, had its
    // connection been reset meanwhile, down and connected again).
    let back = wait_until(PATIENCE, || {
        let ok = rl.try_lock("obs:thawed", TTL);
        let e = obs.take();
        e.iter().for_each(|r| check_event(r, 5));
        if let Ok(lock) = ok {
            let _ = rl.unlock(&lock);
        }
        obs.take().iter().for_each(|r| check_event(r, 5));
        let changes = obs.changes();
        frozen.iter().all(|&i| {
            changes
                .iter()
                .any(|c| c.0 == i && matches!(c.1, Change::CaughtUp | Change::Connected(false)))
        })
    });
    assert!(back, "{:?}", obs.changes());
}

#[test]
fn a_killed_node_fails_and_its_reconnect_is_reported() {
    let cluster = Cluster::start(5);
    let obs = Arc::new(Recorder::default());
    let mut rl = direct(&cluster, HEALTHY, &obs);
    let lock = rl.try_lock("obs:kill", TTL).expect("lock");
    rl.unlock(&lock).unwrap();
    // Every node's first connection is reported, once.
    let reported = |node: usize, change: &dyn Fn(&Change) -> bool| {
        obs.changes().iter().any(|c| c.0 == node && change(&c.1))
    };
    let mut cycle_until = |done: &dyn Fn() -> bool| {
        wait_until(PATIENCE, || {
            let lock = rl.try_lock("obs:kill", TTL).expect("4 of 5 up");
            rl.unlock(&lock).unwrap();
            done()
        })
    };
    let first = || (0..5).all(|i| reported(i, &|c| *c == Change::Connected(true)));
    assert!(cycle_until(&first), "{:?}", obs.changes());
    cluster.node(4).kill();
    // The next rounds find it gone: failed (or not needed, if the quorum came first).
    let down = || reported(4, &|c| matches!(c, Change::Down(_)));
    assert!(cycle_until(&down), "{:?}", obs.changes());
    let e = obs.take();
    e.iter().for_each(|r| check_event(r, 5));
    let last = e.last().unwrap();
    assert!(
        matches!(last.outcome(4), Outcome::Failed(_) | Outcome::NotNeeded),
        "{last:?}"
    );
    assert!(
        e.iter().any(|r| matches!(r.outcome(4), Outcome::Failed(_))),
        "{e:?}"
    );

    cluster.node(4).restart();
    let back = || reported(4, &|c| *c == Change::Connected(false));
    assert!(cycle_until(&back), "{:?}", obs.changes());
    obs.take().iter().for_each(|r| check_event(r, 5));
    // Down always comes before the reconnect; one first connection per node.
    let changes = obs.changes();
    let firsts = changes.iter().filter(|c| c.1 == Change::Connected(true));
    assert_eq!(firsts.count(), 5, "{changes:?}");
    let down = changes
        .iter()
        .position(|c| c.0 == 4 && matches!(c.1, Change::Down(_)));
    let up = changes
        .iter()
        .position(|c| c.0 == 4 && c.1 == Change::Connected(false));
    assert!(down < up, "{changes:?}");
}

#[test]
fn the_shared_client_reports_each_item_of_its_rounds() {
    let cluster = Cluster::start(3);
    let obs = Arc::new(Recorder::default());
    let shared = observed(&cluster, Arc::clone(&obs)).build_shared().unwrap();
    let mut lock = shared.blocking_lock("obs:shared", TTL).expect("lock");
    // Reported before the caller is answered.
    let e = obs.take();
    assert_eq!(e.len(), 1, "{e:?}");
    assert_eq!(e[0].deadline, Some(lock.deadline()));
    check_event(&e[0], 3);
    shared.blocking_extend(&mut lock, TTL).expect("extend");
    shared.blocking_unlock(&lock).expect("unlock");
    let e = obs.take();
    assert_eq!(
        e.iter().map(|r| r.phase).collect::<Vec<_>>(),
        [Phase::Extend, Phase::Release]
    );
    e.iter().for_each(|r| check_event(r, 3));

    // A future, and many callers at once: their rounds batch several items, each
    // reported with every node once, every acquire and release exactly once.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let lock = shared.lock("obs:async", TTL).await.expect("lock");
        shared.unlock(&lock).await.expect("unlock");
    });
    let e = obs.take();
    assert_eq!(e.len(), 2, "{e:?}");
    e.iter().for_each(|r| check_event(r, 3));
    // A caller-chosen token, through the loop's batched rounds.
    let lock = shared
        .blocking_lock_with_token("obs:given", TTL, b"shared given token")
        .expect("given token");
    shared.blocking_unlock(&lock).expect("unlock");
    let e = obs.take();
    assert_eq!(
        e.iter().map(|r| (r.phase, r.decision)).collect::<Vec<_>>(),
        [
            (Phase::Acquire, Decision::Won),
            (Phase::Release, Decision::Released)
        ]
    );
    assert_eq!(e[0].deadline, Some(lock.deadline()));
    e.iter().for_each(|r| check_event(r, 3));

    let callers = 8;
    let rounds = 20;
    thread::scope(|s| {
        for c in 0..callers {
            let shared = shared.clone();
            s.spawn(move || {
                for k in 0..rounds {
                    let key = format!("obs:many:{c}:{k}");
                    let lock = shared.blocking_lock(&key, TTL).expect("lock");
                    shared.blocking_unlock(&lock).expect("unlock");
                }
            });
        }
    });
    let e = obs.take();
    e.iter().for_each(|r| check_event(r, 3));
    for phase in [Phase::Acquire, Phase::Release] {
        let mut keys: Vec<Vec<u8>> = e
            .iter()
            .filter(|r| r.phase == phase)
            .map(|r| r.resources[0].clone())
            .collect();
        keys.sort();
        let n = keys.len();
        keys.dedup();
        assert_eq!(
            (n, keys.len()),
            (callers * rounds, callers * rounds),
            "{phase}"
        );
    }
    // Items of one round share its id and count.
    for r in &e {
        let siblings = e
            .iter()
            .filter(|x| x.round == r.round && x.phase == r.phase);
        assert_eq!(siblings.count(), r.items, "{r:?}");
    }

    // A lease's extends, run by the loop, each reported.
    let lease = shared
        .blocking_lease("obs:lease", Duration::from_millis(900))
        .expect("lease");
    let extended = wait_until(PATIENCE, || {
        let rounds = obs.rounds.lock().unwrap();
        rounds.iter().filter(|r| r.phase == Phase::Extend).count() >= 2
    });
    assert!(extended);
    assert!(!lease.is_lost());
    lease.blocking_release().expect("release");
    let e = obs.take();
    e.iter().for_each(|r| check_event(r, 3));
    assert!(e.iter().any(|r| r.phase == Phase::Release), "{e:?}");
    for r in e.iter().filter(|r| r.phase == Phase::Extend) {
        assert_eq!(r.resources, vec![b"obs:lease".to_vec()]);
        assert_eq!(r.decision, Decision::Won, "{r:?}");
    }

    // lock_all in the shared client.
    let all = shared
        .blocking_lock_all(&["obs:s1", "obs:s2"], TTL)
        .expect("lock_all");
    shared.blocking_unlock(&all).expect("unlock");
    let e = obs.take();
    assert_eq!(e.len(), 2, "{e:?}");
    for r in &e {
        check_event(r, 3);
        assert_eq!(r.resources.len(), 2);
    }
}

/// An observer that panics on every other round.
#[derive(Default)]
struct Panicky(AtomicU64);

impl Observer for Panicky {
    fn round(&self, _: &RoundEvent<'_>) {
        if self.0.fetch_add(1, Ordering::Relaxed) % 2 == 0 {
            panic!("observer bug (expected by the test)");
        }
    }
    fn node(&self, _: &NodeEvent<'_>) {
        panic!("observer bug in node (expected by the test)");
    }
}

#[test]
fn a_panicking_observer_breaks_nothing() {
    let cluster = Cluster::start(3);
    let obs = Arc::new(Panicky::default());
    let mut rl = observed(&cluster, Arc::clone(&obs)).build().unwrap();
    for _ in 0..10 {
        let mut lock = rl.try_lock("obs:panic", TTL).expect("lock");
        rl.extend(&mut lock, TTL).expect("extend");
        assert!(rl.unlock(&lock).expect("unlock") >= 2);
    }
    // Every round was still reported, after the panics.
    assert_eq!(obs.0.load(Ordering::Relaxed), 30);
    let shared = observed(&cluster, Arc::clone(&obs)).build_shared().unwrap();
    for _ in 0..10 {
        let lock = shared.blocking_lock("obs:panic", TTL).expect("lock");
        shared.blocking_unlock(&lock).expect("unlock");
    }
    assert_eq!(obs.0.load(Ordering::Relaxed), 50);
}

/// An observer that calls back into the shared client it observes.
#[derive(Default)]
struct Reentrant {
    client: Mutex<Option<SharedRedlock>>,
    refused: AtomicU64,
}

impl Observer for Reentrant {
    fn round(&self, _: &RoundEvent<'_>) {
        let client = self.client.lock().unwrap().clone();
        if let Some(client) = client {
            // Counted as refused if the call panics (the panic ends this method).
            self.refused.fetch_add(1, Ordering::Relaxed);
            let _ = client.blocking_try_lock("obs:inner", TTL);
            self.refused.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

#[test]
fn a_shared_client_called_from_its_observer_refuses_instead_of_deadlocking() {
    let cluster = Cluster::start(3);
    let obs = Arc::new(Reentrant::default());
    let shared = observed(&cluster, Arc::clone(&obs)).build_shared().unwrap();
    *obs.client.lock().unwrap() = Some(shared.clone());
    let (tx, rx) = std::sync::mpsc::channel();
    let outer = shared.clone();
    thread::spawn(move || {
        let r = outer
            .blocking_lock("obs:outer", TTL)
            .map(|l| outer.blocking_unlock(&l));
        let _ = tx.send(r.is_ok());
    });
    let done = rx.recv_timeout(PATIENCE).expect("no deadlock");
    assert!(done);
    assert!(obs.refused.load(Ordering::Relaxed) >= 2);
    // Break the cycle (observer → client → observer) so the loop can end.
    obs.client.lock().unwrap().take();
}

#[test]
fn a_builder_and_its_settings_stay_unwind_safe_with_an_observer() {
    // As they are without one: an observer is `Send + Sync`, and only ever called behind
    // `catch_unwind`.
    fn unwind_safe<T: std::panic::UnwindSafe + std::panic::RefUnwindSafe + Send + Sync>(_: &T) {}
    let builder = Redlock::builder()
        .nodes(["redis://127.0.0.1:1"])
        .observer(Recorder::default());
    unwind_safe(&builder);
    unwind_safe(&builder.clone());
    let settings: Option<&quorumlock::Settings> = None;
    unwind_safe(&settings);
}
