//! The shared client against real `redis-server` nodes: many threads and tasks through
//! one loop and one connection per node; leases that outlive their ttl and are lost at
//! their deadline; cancelled futures and dropped leases leaving no key behind; the loop
//! ending with its last handle.

mod common;

use common::{Cluster, block_on, wait_until};
use quorumlock::{Error, Lease, Lock, Redlock, SharedRedlock};
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

fn shared(cluster: &Cluster) -> SharedRedlock {
    Redlock::builder()
        .nodes(cluster.urls())
        .node_timeout(Duration::from_millis(200))
        .retry_count(200)
        .retry_delay(Duration::from_millis(10))
        .retry_jitter(Duration::from_millis(5))
        .max_backoff(Duration::from_millis(50))
        .build_shared()
        .expect("valid configuration")
}

/// Connections on `node` besides the admin connection asking.
fn clients(cluster: &Cluster, node: usize) -> i64 {
    cluster.node(node).admin().connected_clients() - 1
}

fn holders(cluster: &Cluster, key: &str) -> usize {
    (0..cluster.len())
        .filter(|&n| cluster.node(n).admin().exists(key))
        .count()
}

#[test]
fn threads_share_one_connection_per_node() {
    let cluster = Cluster::start(5);
    let shared = shared(&cluster);
    let done = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..16)
        .map(|t| {
            let shared = shared.clone();
            let done = Arc::clone(&done);
            std::thread::spawn(move || {
                for i in 0..40 {
                    let key = format!("shared:t{t}:{i}");
                    let lock = shared
                        .blocking_lock(&key, Duration::from_secs(10))
                        .expect("distinct keys are free");
                    assert_eq!(lock.resource(), key.as_bytes());
                    assert!(lock.is_valid());
                    let n = shared.blocking_unlock(&lock).expect("unlock");
                    assert!(n >= 3, "unlock confirmed on {n} nodes");
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("no thread panicked");
    }
    assert_eq!(done.load(Ordering::Relaxed), 16 * 40);
    for n in 0..5 {
        assert_eq!(
            clients(&cluster, n),
            1,
            "node {n}: one connection for all threads"
        );
    }
}

#[test]
fn contending_threads_never_overlap() {
    let cluster = Cluster::start(5);
    let shared = shared(&cluster);
    let inside = Arc::new(AtomicUsize::new(0));
    let won = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let shared = shared.clone();
            let inside = Arc::clone(&inside);
            let won = Arc::clone(&won);
            std::thread::spawn(move || {
                for _ in 0..25 {
                    let lock = shared
                        .blocking_lock("shared:contended", Duration::from_secs(10))
                        .expect("lock");
                    assert_eq!(
                        inside.fetch_add(1, Ordering::SeqCst),
                        0,
                        "two holders at once"
                    );
                    std::thread::yield_now();
                    inside.fetch_sub(1, Ordering::SeqCst);
                    won.fetch_add(1, Ordering::Relaxed);
                    shared.blocking_unlock(&lock).expect("unlock");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("no thread panicked");
    }
    assert_eq!(won.load(Ordering::Relaxed), 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_lock_extend_and_unlock() {
    let cluster = Cluster::start(5);
    let shared = shared(&cluster);
    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let shared = shared.clone();
            tokio::spawn(async move {
                let key = format!("shared:task:{i}");
                let mut lock = shared.lock(&key, Duration::from_secs(10)).await?;
                let before = lock.deadline();
                shared.extend(&mut lock, Duration::from_secs(20)).await?;
                assert!(lock.deadline() > before, "the extend moved the deadline");
                shared.unlock(&lock).await
            })
        })
        .collect();
    for t in tasks {
        let n = t.await.expect("task").expect("lock, extend, unlock");
        assert!(n >= 3);
    }
    // One attempt on a held resource: taken.
    let held = shared
        .try_lock("shared:held", Duration::from_secs(10))
        .await
        .unwrap();
    match shared
        .try_lock("shared:held", Duration::from_secs(10))
        .await
    {
        Err(Error::Taken(f)) => assert_eq!(f.resource, b"shared:held"),
        other => panic!("expected Taken, got {other:?}"),
    }
    shared.unlock(&held).await.unwrap();
    for n in 0..5 {
        assert_eq!(clients(&cluster, n), 1);
    }
}

#[test]
fn lock_within_fails_no_earlier_than_its_wait() {
    let cluster = Cluster::start(5);
    let shared = shared(&cluster);
    let held = shared
        .blocking_lock("shared:within", Duration::from_secs(30))
        .unwrap();
    let wait = Duration::from_millis(300);
    let start = Instant::now();
    let r = shared.blocking_lock_within("shared:within", Duration::from_secs(5), wait);
    assert!(matches!(r, Err(Error::Taken(_))), "{r:?}");
    assert!(
        start.elapsed() >= wait,
        "failed after {:?}",
        start.elapsed()
    );
    // Released meanwhile: the waiter gets it.
    let other = shared.clone();
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        other.blocking_unlock(&held).unwrap();
    });
    let lock = shared
        .blocking_lock_within(
            "shared:within",
            Duration::from_secs(5),
            Duration::from_secs(60),
        )
        .expect("acquired once released");
    releaser.join().unwrap();
    shared.blocking_unlock(&lock).unwrap();
}

#[test]
fn a_lease_outlives_its_ttl_and_is_released() {
    let cluster = Cluster::start(5);
    let shared = shared(&cluster);
    // Long enough that a loaded machine cannot starve the loop past a term: the test
    // asserts the lease is never lost with every node up.
    let ttl = Duration::from_millis(1000);
    let lease = shared.blocking_lease("shared:lease", ttl).expect("lease");
    assert_eq!(lease.resource(), b"shared:lease");
    // Five ttls: extended all along.
    let until = Instant::now() + 5 * ttl;
    while Instant::now() < until {
        assert!(!lease.is_lost(), "lost with every node up");
        assert!(holders(&cluster, "shared:lease") >= 3);
        std::thread::sleep(ttl / 4);
    }
    assert!(!lease.wait_lost(Duration::from_millis(10)));
    // Someone else cannot take it meanwhile.
    assert!(matches!(
        shared.blocking_try_lock("shared:lease", ttl),
        Err(Error::Taken(_))
    ));
    let n = lease.blocking_release().expect("release");
    assert!(n >= 3);
    assert!(wait_until(Duration::from_secs(10), || holders(
        &cluster,
        "shared:lease"
    ) == 0));
}

#[test]
fn a_lease_is_lost_by_its_deadline_when_a_majority_freezes() {
    let cluster = Cluster::start(5);
    let shared = shared(&cluster);
    let ttl = Duration::from_millis(600);
    let lease = shared.blocking_lease("shared:frozen", ttl).expect("lease");
    for n in 0..3 {
        cluster.node(n).freeze();
    }
    // The lost signal comes from the client's own clock: whatever the nodes do, the
    // lease is lost by then (one term at most, from now).
    let lost = lease.wait_lost(ttl * 20);
    for n in 0..3 {
        cluster.node(n).thaw();
    }
    assert!(lost, "lost by its deadline");
    assert!(lease.is_lost());
    assert_eq!(lease.remaining(), Duration::ZERO);
    // At its deadline, for want of answers (`Expired` only if no renewal was decided
    // before the deadline, on a very slow machine): never a takeover.
    let why = lease.lost_reason().expect("lost");
    assert!(
        matches!(
            why,
            quorumlock::LostReason::TooFewNodes { .. } | quorumlock::LostReason::Expired { .. }
        ),
        "{why:?}"
    );
    // Once lost, lost for good: it is never re-extended.
    std::thread::sleep(ttl);
    assert!(lease.is_lost());
    drop(lease);
}

#[test]
fn a_dropped_lease_leaves_no_key_behind() {
    let cluster = Cluster::start(5);
    let shared = shared(&cluster);
    let lease = shared
        .blocking_lease("shared:dropped", Duration::from_secs(60))
        .unwrap();
    assert!(holders(&cluster, "shared:dropped") >= 3);
    drop(lease);
    assert!(
        wait_until(Duration::from_secs(10), || holders(
            &cluster,
            "shared:dropped"
        ) == 0),
        "the dropped lease was released well before its 60 s ttl"
    );
}

/// Polls `fut` once with a waker that does nothing.
fn poll_once<F: Future>(fut: F) -> Option<F::Output> {
    let mut fut = pin!(fut);
    let mut cx = Context::from_waker(Waker::noop());
    match fut.as_mut().poll(&mut cx) {
        Poll::Ready(v) => Some(v),
        Poll::Pending => None,
    }
}

#[test]
fn cancelled_acquisitions_leave_no_key_behind() {
    let cluster = Cluster::start(5);
    let shared = shared(&cluster);
    for i in 0..50 {
        let key = format!("shared:cancel:{i}");
        // Queued on the first poll, then dropped, at a different point of the round each
        // time.
        // (On a busy machine the loop may answer before the first poll returns: such a
        // lock is the caller's, released here; such a lease is released by its drop.)
        if let Some(Ok(lock)) = poll_once(shared.lock(&key, Duration::from_secs(60))) {
            shared.blocking_unlock(&lock).unwrap();
        }
        if i % 2 == 0 {
            std::thread::sleep(Duration::from_micros(50 * i));
        }
        drop(poll_once(shared.lease(&key, Duration::from_secs(60))));
    }
    for i in 0..50 {
        let key = format!("shared:cancel:{i}");
        assert!(
            wait_until(Duration::from_secs(10), || holders(&cluster, &key) == 0),
            "{key} left behind"
        );
    }
}

#[test]
fn the_loop_ends_with_its_last_handle_and_closes_its_connections() {
    let cluster = Cluster::start(3);
    let shared = shared(&cluster);
    let lease: Lease = shared
        .blocking_lease("shared:last", Duration::from_millis(1000))
        .unwrap();
    let clone = shared.clone();
    drop(shared);
    drop(clone);
    // The lease alone keeps the loop (and its lease) alive.
    std::thread::sleep(Duration::from_millis(2500));
    assert!(!lease.is_lost());
    assert!(holders(&cluster, "shared:last") >= 2);
    for n in 0..3 {
        assert_eq!(clients(&cluster, n), 1);
    }
    drop(lease);
    assert!(wait_until(Duration::from_secs(10), || {
        holders(&cluster, "shared:last") == 0 && (0..3).all(|n| clients(&cluster, n) == 0)
    }));
}

#[test]
fn the_futures_and_the_lease_are_send() {
    fn send<T: Send>(_: &T) {}
    fn sync<T: Send + Sync>() {}
    sync::<SharedRedlock>();
    sync::<Lease>();
    sync::<quorumlock::Lost<'static>>();
    let shared = Redlock::builder()
        .nodes(["redis://127.0.0.1:1"])
        .build_shared()
        .unwrap();
    send(&shared.lock("a", Duration::from_secs(1)));
    send(&shared.try_lock(String::from("a"), Duration::from_secs(1)));
    send(&shared.lock_within(b"a".to_vec(), Duration::from_secs(1), Duration::ZERO));
    send(&shared.lease("a", Duration::from_secs(1)));
    send(&shared.lock_all(&["a", "b"], Duration::from_secs(1)));
}

#[test]
fn many_leases_are_kept_alive_together() {
    let cluster = Cluster::start(5);
    let shared = shared(&cluster);
    let ttl = Duration::from_millis(1000);
    let leases: Vec<Lease> = (0..64)
        .map(|i| {
            shared
                .blocking_lease(format!("shared:many:{i}"), ttl)
                .unwrap()
        })
        .collect();
    let until = Instant::now() + 4 * ttl;
    while Instant::now() < until {
        std::thread::sleep(ttl / 4);
        for l in &leases {
            assert!(!l.is_lost(), "lease {:?} lost", l.resource());
        }
    }
    for l in leases {
        assert!(l.blocking_release().unwrap() >= 3);
    }
    for i in 0..64 {
        assert_eq!(holders(&cluster, &format!("shared:many:{i}")), 0);
    }
}

#[test]
fn a_lease_whose_key_is_taken_over_is_lost_and_never_taken_back() {
    let cluster = Cluster::start(5);
    let shared = shared(&cluster);
    let ttl = Duration::from_millis(600);
    let lease = shared.blocking_lease("shared:stolen", ttl).unwrap();
    // An operator (or a bug elsewhere) gives the key to someone else on every node.
    for n in 0..5 {
        cluster
            .node(n)
            .admin()
            .set_px("shared:stolen", "intruder", 60_000);
    }
    assert!(
        lease.wait_lost(ttl * 20),
        "the next extend finds the key is not ours"
    );
    let why = lease.lost_reason().expect("lost");
    assert!(
        matches!(why, quorumlock::LostReason::TakenOver { .. }),
        "a majority's refusal is a takeover: {why:?}"
    );
    assert!(why.last_error().is_some(), "with the renewal's answers");
    // Never re-taken: the intruder's value stays on every node.
    std::thread::sleep(ttl);
    for n in 0..5 {
        assert_eq!(
            cluster.node(n).admin().get("shared:stolen").as_deref(),
            Some(&b"intruder"[..])
        );
    }
    // Releasing a lost lease deletes nothing of someone else's.
    assert_eq!(lease.blocking_release().unwrap(), 0);
    assert_eq!(holders(&cluster, "shared:stolen"), 5);
}

#[test]
fn a_lease_is_released_and_lost_at_its_maximum_hold() {
    let cluster = Cluster::start(5);
    let shared = Redlock::builder()
        .nodes(cluster.urls())
        .max_hold(Duration::from_millis(800))
        .build_shared()
        .unwrap();
    let lease = shared
        .blocking_lease("shared:hold", Duration::from_millis(300))
        .unwrap();
    assert!(lease.wait_lost(Duration::from_secs(30)), "lost at max_hold");
    assert!(
        matches!(lease.lost_reason(), Some(quorumlock::LostReason::MaxHold)),
        "{:?}",
        lease.lost_reason()
    );
    assert!(wait_until(Duration::from_secs(10), || holders(
        &cluster,
        "shared:hold"
    ) == 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lost_future_completes_with_a_frozen_majority() {
    let cluster = Cluster::start(5);
    let shared = shared(&cluster);
    let ttl = Duration::from_millis(600);
    let lease = shared.lease("shared:lost-future", ttl).await.unwrap();
    for n in 0..3 {
        cluster.node(n).freeze();
    }
    // Read after the validity left, the estimate errs late: never a false failure.
    let deadline = Instant::now() + lease.remaining();
    let fired = tokio::time::timeout(ttl * 20, lease.lost()).await;
    let late = Instant::now().saturating_duration_since(deadline);
    for n in 0..3 {
        cluster.node(n).thaw();
    }
    assert!(fired.is_ok(), "the lost future completed");
    assert!(lease.is_lost());
    // Woken by the deadline itself (the timer thread): seen at the deadline, give or
    // take the scheduling of two threads on a loaded machine.
    assert!(
        late <= LOST_SLACK,
        "lost() observed {late:?} after the local deadline"
    );
}

/// How late past its deadline a lease's loss may be seen: the scheduling of the timer
/// thread and of the waiting thread or task on a loaded machine. The guarantee is "at
/// the deadline"; nothing waits for the loop or a node then.
const LOST_SLACK: Duration = Duration::from_millis(500);

/// An observer that holds the loop thread for a long time in every event, once armed.
struct Sleepy {
    armed: std::sync::atomic::AtomicBool,
    sleep: Duration,
    events: AtomicUsize,
}

impl quorumlock::Observer for Sleepy {
    fn round(&self, _: &quorumlock::RoundEvent<'_>) {
        if self.armed.load(Ordering::Relaxed) {
            self.events.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(self.sleep);
        }
    }

    fn node(&self, _: &quorumlock::NodeEvent<'_>) {
        if self.armed.load(Ordering::Relaxed) {
            self.events.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(self.sleep);
        }
    }
}

/// The loss of a lease is signalled at its deadline even while the loop thread is held
/// (an observer sleeping in every event, rounds waiting on a frozen majority): the
/// `lost()` future, `wait_lost`, a `LostSignal` and `is_lost` all see it then; a
/// margin's signal fires before it.
#[test]
fn the_lost_signal_rings_at_the_deadline_while_an_observer_holds_the_loop() {
    let cluster = Cluster::start(5);
    let observer = Arc::new(Sleepy {
        armed: false.into(),
        // Longer than the lease's whole life: a signal rung by the loop would come
        // seconds late.
        sleep: Duration::from_secs(3),
        events: AtomicUsize::new(0),
    });
    let shared = Redlock::builder()
        .nodes(cluster.urls())
        .node_timeout(Duration::from_millis(100))
        .observer(Arc::clone(&observer))
        .build_shared()
        .unwrap();
    let ttl = Duration::from_millis(1500);
    let lease = shared.blocking_lease("shared:sleepy", ttl).unwrap();
    observer.armed.store(true, Ordering::Relaxed);
    for n in 0..3 {
        cluster.node(n).freeze();
    }
    let signal = lease.lost_signal();
    let early = signal.before(Duration::from_millis(1000));
    let deadline = std::sync::Mutex::new(None::<Instant>);
    let (by_future, by_wait, by_signal, early_at, lost_when_early) = std::thread::scope(|s| {
        let future = s.spawn(|| {
            block_on(lease.lost());
            Instant::now()
        });
        let wait = s.spawn(|| {
            assert!(lease.wait_lost(Duration::from_secs(60)));
            Instant::now()
        });
        let owned = signal.clone();
        let signalled = s.spawn(move || {
            block_on(async move { owned.await });
            Instant::now()
        });
        let margin = s.spawn(|| {
            assert!(early.wait(Duration::from_secs(60)));
            (Instant::now(), lease.is_lost())
        });
        // The deadline, read while validity is left (each read errs late).
        while !lease.is_lost() {
            let left = lease.remaining();
            if !left.is_zero() {
                *deadline.lock().unwrap() = Some(Instant::now() + left);
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        let (early_at, lost_then) = margin.join().unwrap();
        (
            future.join().unwrap(),
            wait.join().unwrap(),
            signalled.join().unwrap(),
            early_at,
            lost_then,
        )
    });
    observer.armed.store(false, Ordering::Relaxed);
    for n in 0..3 {
        cluster.node(n).thaw();
    }
    assert!(
        observer.events.load(Ordering::Relaxed) > 0,
        "the observer held the loop"
    );
    let deadline = deadline
        .lock()
        .unwrap()
        .expect("validity was left at first");
    for (what, at) in [
        ("lost()", by_future),
        ("wait_lost", by_wait),
        ("LostSignal", by_signal),
    ] {
        assert!(
            at <= deadline + LOST_SLACK,
            "{what} came {:?} after the deadline",
            at - deadline
        );
    }
    assert!(lease.is_lost());
    assert!(signal.is_lost());
    assert!(lease.lost_reason().is_some());
    // The margin's signal came before the loss: 1 s ahead, with 1.5 s of ttl.
    assert!(
        !lost_when_early,
        "the margin's signal fired only at the loss"
    );
    assert!(early_at <= deadline);
    drop(lease);
}

#[test]
fn a_frozen_minority_does_not_stop_anyone_and_a_frozen_majority_is_unavailable() {
    let cluster = Cluster::start(5);
    let shared = Redlock::builder()
        .nodes(cluster.urls())
        .node_timeout(Duration::from_millis(100))
        .retry_count(0)
        .build_shared()
        .unwrap();
    cluster.node(0).freeze();
    cluster.node(1).freeze();
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let shared = shared.clone();
            std::thread::spawn(move || {
                for i in 0..20 {
                    let lock = shared
                        .blocking_try_lock(
                            format!("shared:minority:{t}:{i}"),
                            Duration::from_secs(10),
                        )
                        .expect("three of five answer");
                    shared.blocking_unlock(&lock).expect("unlock at a majority");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    cluster.node(2).freeze();
    match shared.blocking_try_lock("shared:majority", Duration::from_secs(10)) {
        Err(Error::Unavailable(f)) => {
            assert_eq!(f.nodes.len(), 5, "a report per node");
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    for n in 0..3 {
        cluster.node(n).thaw();
    }
    // Everyone back: the nodes the client gave up on are reconnected.
    assert!(wait_until(Duration::from_secs(20), || {
        match shared.blocking_try_lock("shared:back", Duration::from_secs(10)) {
            Ok(lock) => {
                let n = shared.blocking_unlock(&lock).unwrap();
                n >= 3
            }
            Err(_) => false,
        }
    }));
}

#[test]
fn connections_killed_by_the_server_are_replaced() {
    let cluster = Cluster::start(5);
    let shared = shared(&cluster);
    for round in 0..5 {
        for n in 0..5 {
            cluster.node(n).admin().client_kill_normal();
        }
        let lock = shared
            .blocking_lock(format!("shared:killed:{round}"), Duration::from_secs(10))
            .expect("retried on new connections");
        shared.blocking_unlock(&lock).unwrap();
    }
    // Every node's connection is replaced: a lock reaches all five. (Each call returns
    // at a majority, so a node whose new connection was still connecting, or backing
    // off after a failed one on a loaded machine, may be replaced only by a later call:
    // the client reconnects on demand, not while idle.)
    assert!(
        wait_until(Duration::from_secs(30), || {
            let lock = shared
                .blocking_lock("shared:killed:everywhere", Duration::from_secs(10))
                .expect("a lock on healthy nodes");
            let everywhere = holders(&cluster, "shared:killed:everywhere") == 5;
            shared.blocking_unlock(&lock).unwrap();
            everywhere
        }),
        "some node's connection was never replaced"
    );
    // And none leaked: one lock connection per node, and at most one subscriber
    // connection (had a retry listened for release notices).
    let within = wait_until(Duration::from_secs(10), || {
        (0..5).all(|n| (1..=2).contains(&clients(&cluster, n)))
    });
    let counts: Vec<i64> = (0..5).map(|n| clients(&cluster, n)).collect();
    assert!(within, "connections per node: {counts:?}");
}

/// Subscribers to `key`'s release notices on `node`.
fn listeners(cluster: &Cluster, node: usize, key: &str) -> i64 {
    cluster.node(node).admin().notice_listeners(key)
}

#[test]
fn a_waiter_is_woken_by_the_release_not_by_its_poll() {
    let cluster = Cluster::start(5);
    // A poll an hour apart: a waiter that gets the lock within the test was woken by
    // the holder's release notice.
    let shared = Redlock::builder()
        .nodes(cluster.urls())
        .retry_delay(Duration::from_secs(3600))
        .retry_jitter(Duration::ZERO)
        .build_shared()
        .unwrap();
    let holder = Redlock::builder().nodes(cluster.urls()).build().unwrap();
    let mut holder = holder;
    let held = holder
        .lock("shared:handoff", Duration::from_secs(60))
        .unwrap();
    let waiter = {
        let shared = shared.clone();
        std::thread::spawn(move || {
            shared.blocking_lock_within(
                "shared:handoff",
                Duration::from_secs(10),
                Duration::from_secs(120),
            )
        })
    };
    // Released once the waiter listens on every node (a notice before that is missed,
    // and costs a poll: an hour here).
    assert!(wait_until(Duration::from_secs(30), || {
        (0..5).all(|n| listeners(&cluster, n, "shared:handoff") == 1)
    }));
    holder.unlock(&held).unwrap(); // the direct client's release publishes too
    let lock = waiter.join().unwrap().expect("woken by the release");
    assert!(lock.is_valid());
    shared.blocking_unlock(&lock).unwrap();
    // No waiter left: the key's channel is unsubscribed.
    assert!(wait_until(Duration::from_secs(10), || {
        (0..5).all(|n| listeners(&cluster, n, "shared:handoff") == 0)
    }));
    // One lock connection and one subscriber connection per node (kept open, with no
    // subscription, for the next waiter), beside the direct holder's.
    drop(holder);
    for n in 0..5 {
        assert!(wait_until(Duration::from_secs(10), || clients(&cluster, n) == 2));
    }
}

#[test]
fn a_cancelled_extend_leaves_the_lock_no_longer_than_the_extend_could() {
    let cluster = Cluster::start(5);
    let shared = shared(&cluster);
    let mut lock = shared
        .blocking_lock("shared:extend-cancel", Duration::from_secs(10))
        .unwrap();
    let short = Duration::from_millis(300);
    // Queued, then dropped: the nodes may apply the shorter ttl, so the lock must not
    // claim more than it would give.
    drop(poll_once(shared.extend(&mut lock, short)));
    assert!(lock.remaining() <= short, "{:?} left", lock.remaining());
    shared.blocking_unlock(&lock).unwrap();
}

#[test]
fn a_cancelled_waiter_stops_waiting() {
    let cluster = Cluster::start(5);
    let shared = shared(&cluster);
    let mut holder = Redlock::builder().nodes(cluster.urls()).build().unwrap();
    let held = holder.lock("shared:gone", Duration::from_secs(60)).unwrap();
    {
        let mut waiter = pin!(shared.lock_within(
            "shared:gone",
            Duration::from_secs(10),
            Duration::from_secs(60)
        ));
        let mut cx = Context::from_waker(Waker::noop());
        assert!(waiter.as_mut().poll(&mut cx).is_pending());
        assert!(wait_until(Duration::from_secs(30), || {
            (0..5).all(|n| listeners(&cluster, n, "shared:gone") == 1)
        }));
    }
    // Dropped: it makes no more attempts and stops listening.
    assert!(wait_until(Duration::from_secs(30), || {
        (0..5).all(|n| listeners(&cluster, n, "shared:gone") == 0)
    }));
    holder.unlock(&held).unwrap();
    // Nobody takes the key behind our back: it stays free.
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(holders(&cluster, "shared:gone"), 0);
}

#[test]
fn an_unlock_with_a_frozen_majority_is_answered_within_its_round() {
    let cluster = Cluster::start(5);
    let shared = Redlock::builder()
        .nodes(cluster.urls())
        .node_timeout(Duration::from_millis(100))
        .retry_count(100)
        .build_shared()
        .unwrap();
    let lock = shared
        .blocking_lock("shared:unlock-frozen", Duration::from_secs(10))
        .unwrap();
    for n in 0..3 {
        cluster.node(n).freeze();
    }
    let start = Instant::now();
    let r = shared.blocking_unlock(&lock);
    let took = start.elapsed();
    for n in 0..3 {
        cluster.node(n).thaw();
    }
    assert!(matches!(r, Err(Error::Unavailable(_))), "{r:?}");
    // Its retries (100, 100 ms apart) go on in the background: the caller is not held
    // for them (a bound 50 times what the round may take).
    assert!(took < Duration::from_secs(5), "answered after {took:?}");
    // ... and they delete the key once the nodes are back.
    assert!(wait_until(Duration::from_secs(30), || {
        holders(&cluster, "shared:unlock-frozen") == 0
    }));
}

#[test]
fn a_waker_that_panics_does_not_take_the_loop_down() {
    struct Bomb;
    impl std::task::Wake for Bomb {
        fn wake(self: Arc<Self>) {
            panic!("a caller's waker panicked");
        }
    }
    let cluster = Cluster::start(3);
    let shared = shared(&cluster);
    let waker = Waker::from(Arc::new(Bomb));
    let mut cx = Context::from_waker(&waker);
    let mut fut = pin!(shared.try_lock("shared:bomb", Duration::from_secs(10)));
    if fut.as_mut().poll(&mut cx).is_pending() {
        // Answered on the loop thread, which wakes (and survives) the bomb.
        assert!(wait_until(Duration::from_secs(10), || {
            matches!(
                fut.as_mut().poll(&mut Context::from_waker(Waker::noop())),
                Poll::Ready(_)
            )
        }));
    }
    let lock = shared
        .blocking_lock("shared:after-bomb", Duration::from_secs(10))
        .expect("the loop still runs");
    shared.blocking_unlock(&lock).unwrap();
}

#[test]
fn calls_made_while_a_thread_unwinds_do_not_end_the_loop() {
    // A guard that releases its lock when dropped: also when its thread unwinds from a
    // panic elsewhere. The unwinding is not the client's: its loop carries on.
    struct UnlockOnDrop<'a> {
        shared: &'a SharedRedlock,
        lock: Option<Lock>,
        by_future: bool,
    }
    impl Drop for UnlockOnDrop<'_> {
        fn drop(&mut self) {
            let Some(lock) = self.lock.take() else { return };
            if self.by_future {
                let mut unlock = Box::pin(self.shared.unlock(&lock));
                let mut cx = Context::from_waker(Waker::noop());
                assert!(wait_until(Duration::from_secs(10), || {
                    matches!(unlock.as_mut().poll(&mut cx), Poll::Ready(Ok(_)))
                }));
            } else {
                self.shared.blocking_unlock(&lock).unwrap();
            }
        }
    }
    let cluster = Cluster::start(3);
    let shared = shared(&cluster);
    for by_future in [false, true] {
        let key = format!("shared:unwind:{by_future}");
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let lock = shared.blocking_lock(&key, Duration::from_secs(60)).unwrap();
            let _guard = UnlockOnDrop {
                shared: &shared,
                lock: Some(lock),
                by_future,
            };
            panic!("the job failed (this panic is the test's)");
        }));
        assert!(unwound.is_err());
        assert!(wait_until(Duration::from_secs(10), || holders(
            &cluster, &key
        ) == 0));
        let lock = shared
            .blocking_lock("shared:unwind:after", Duration::from_secs(10))
            .expect("the loop still runs");
        shared.blocking_unlock(&lock).unwrap();
    }
}
