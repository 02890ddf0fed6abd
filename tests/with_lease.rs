//! `with_lease` and `blocking_with_lease` on real nodes: work that borrows its lease and
//! finishes returns its value and frees the key; work outlived by its lease (a frozen
//! majority) is dropped and reported `Error::Lost`; work that finishes after the loss is
//! reported lost too; a release that fails is the call's error. Run on a hand-written
//! executor as well as tokio: the race needs no runtime.

mod common;

use common::{Cluster, block_on, wait_until};
use quorumlock::{Error, Lease, LostReason, Redlock, SharedRedlock};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How late past a lease's deadline its loss may be seen: time for the timer thread and
/// the waiting thread to be scheduled on a loaded machine. Generous: the guarantee is
/// "at the deadline", and nothing in these tests waits for the loop or a node then.
const SLACK: Duration = Duration::from_millis(500);

fn shared(cluster: &Cluster) -> SharedRedlock {
    Redlock::builder()
        .nodes(cluster.urls())
        .node_timeout(Duration::from_millis(100))
        .retry_count(20)
        .retry_delay(Duration::from_millis(10))
        .build_shared()
        .expect("valid configuration")
}

fn holders(cluster: &Cluster, key: &str) -> usize {
    (0..cluster.len())
        .filter(|&n| cluster.node(n).admin().exists(key))
        .count()
}

/// Sets its flag, and the moment, when dropped: shows that the work future was dropped.
struct Dropped(Arc<Mutex<Option<Instant>>>);

impl Drop for Dropped {
    fn drop(&mut self) {
        *self.0.lock().unwrap() = Some(Instant::now());
    }
}

/// The latest estimate of `lease`'s deadline: now plus the validity left, read while
/// some is left. It can only err late (the clock is read after the validity), so a
/// bound checked against it never fails for a loss that came on time.
fn note_deadline(lease: &Lease, deadline: &Mutex<Option<Instant>>) {
    let left = lease.remaining();
    if !left.is_zero() {
        *deadline.lock().unwrap() = Some(Instant::now() + left);
    }
}

#[test]
fn work_that_borrows_its_lease_returns_its_value_and_frees_the_key() {
    let cluster = Cluster::start(5);
    let shared = shared(&cluster);
    let key = "with_lease:ok";
    // On a hand-written executor: no runtime needed.
    let got = block_on(
        shared.with_lease(key, Duration::from_secs(10), async |lease: &Lease| {
            assert_eq!(lease.resource(), key.as_bytes());
            assert!(!lease.is_lost());
            // A borrow of the lease held across an await.
            let signal = lease.lost_signal();
            std::future::ready(()).await;
            assert!(!signal.is_lost());
            lease.remaining()
        }),
    )
    .expect("held throughout");
    assert!(got > Duration::ZERO);
    assert!(wait_until(Duration::from_secs(5), || holders(
        &cluster, key
    ) == 0));

    let n = shared
        .blocking_with_lease(key, Duration::from_secs(10), |lease| {
            assert!(!lease.is_lost());
            7
        })
        .expect("held throughout");
    assert_eq!(n, 7);
    assert!(wait_until(Duration::from_secs(5), || holders(
        &cluster, key
    ) == 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_outlived_by_its_lease_is_dropped_and_reported_lost() {
    let cluster = Cluster::start(5);
    let shared = shared(&cluster);
    let dropped = Arc::new(Mutex::new(None));
    let deadline = Arc::new(Mutex::new(None));
    let (d, dl) = (Arc::clone(&dropped), Arc::clone(&deadline));
    let cluster_ref = &cluster;
    let run = shared.with_lease(
        "with_lease:lost",
        Duration::from_millis(900),
        async move |lease: &Lease| {
            let _guard = Dropped(d);
            for n in 0..3 {
                cluster_ref.node(n).freeze();
            }
            // Work that would never end on its own.
            loop {
                note_deadline(lease, &dl);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        },
    );
    let result: Result<(), Error> = tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("with_lease returned");
    let returned = Instant::now();
    for n in 0..3 {
        cluster.node(n).thaw();
    }
    match &result {
        Err(Error::Lost { resource, why }) => {
            assert_eq!(resource, b"with_lease:lost");
            // Frozen nodes: renewals failed for want of answers (or, should the loop
            // not have tried one before the deadline, plain expiry).
            assert!(
                matches!(
                    why,
                    LostReason::TooFewNodes { .. } | LostReason::Expired { .. }
                ),
                "{why:?}"
            );
            let shown = result.as_ref().unwrap_err().to_string();
            assert!(shown.contains("with_lease:lost"), "{shown}");
        }
        other => panic!("expected Error::Lost, got {other:?}"),
    }
    let dropped_at = dropped
        .lock()
        .unwrap()
        .expect("the work future was dropped");
    assert!(dropped_at <= returned, "dropped before the call returned");
    let deadline = deadline
        .lock()
        .unwrap()
        .expect("the work saw validity left");
    assert!(
        dropped_at <= deadline + SLACK,
        "the work was dropped {:?} after the lease's deadline",
        dropped_at - deadline
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_that_finishes_after_the_loss_is_reported_lost() {
    let cluster = Cluster::start(5);
    let shared = shared(&cluster);
    let cluster_ref = &cluster;
    let result = shared
        .with_lease(
            "with_lease:late",
            Duration::from_millis(600),
            async |lease: &Lease| {
                for n in 0..3 {
                    cluster_ref.node(n).freeze();
                }
                // Blocks its thread without an await: the race cannot cut it short.
                assert!(lease.wait_lost(Duration::from_secs(30)));
                "done too late"
            },
        )
        .await;
    for n in 0..3 {
        cluster.node(n).thaw();
    }
    assert!(
        matches!(result, Err(Error::Lost { .. })),
        "expected Error::Lost, got {result:?}"
    );
}

#[test]
fn blocking_work_that_outlives_its_lease_is_reported_lost() {
    let cluster = Cluster::start(5);
    let shared = shared(&cluster);
    let result =
        shared.blocking_with_lease("with_lease:blocking", Duration::from_millis(600), |lease| {
            for n in 0..3 {
                cluster.node(n).freeze();
            }
            assert!(lease.wait_lost(Duration::from_secs(30)));
            42
        });
    for n in 0..3 {
        cluster.node(n).thaw();
    }
    match result {
        Err(Error::Lost { resource, .. }) => assert_eq!(resource, b"with_lease:blocking"),
        other => panic!("expected Error::Lost, got {other:?}"),
    }
}

/// The work ends in time, but the release then finds a majority frozen: the release's
/// error is the call's, not a silent `Ok`.
#[test]
fn a_failed_release_is_the_calls_error() {
    let cluster = Cluster::start(5);
    let shared = shared(&cluster);
    let frozen = AtomicBool::new(false);
    let result = shared.blocking_with_lease("with_lease:release", Duration::from_secs(30), |_| {
        for n in 0..3 {
            cluster.node(n).freeze();
        }
        frozen.store(true, Ordering::Relaxed);
    });
    for n in 0..3 {
        cluster.node(n).thaw();
    }
    assert!(frozen.load(Ordering::Relaxed));
    assert!(
        matches!(result, Err(Error::Unavailable(_))),
        "expected the release's Unavailable, got {result:?}"
    );
    let cluster_ref = &cluster;
    let result = block_on(shared.with_lease(
        "with_lease:release-async",
        Duration::from_secs(30),
        async |_: &Lease| {
            for n in 0..3 {
                cluster_ref.node(n).freeze();
            }
        },
    ));
    for n in 0..3 {
        cluster.node(n).thaw();
    }
    assert!(
        matches!(result, Err(Error::Unavailable(_))),
        "expected the release's Unavailable, got {result:?}"
    );
}

/// The future of `with_lease` is `Send` when its work is: it can be spawned on a
/// multi-threaded runtime, its work borrowing the lease across awaits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_lease_can_be_spawned() {
    let cluster = Cluster::start(3);
    let client = shared(&cluster);
    let task = tokio::spawn(async move {
        client
            .with_lease(
                "with_lease:spawned",
                Duration::from_secs(10),
                async |lease: &Lease| {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    lease.fence()
                },
            )
            .await
    });
    let fence = task.await.expect("the task ran").expect("held throughout");
    assert_eq!(fence, None, "fencing is off");
    // A lost signal moves into a task of its own.
    let client = shared(&cluster);
    let lease = client
        .lease("with_lease:signal", Duration::from_secs(10))
        .await
        .unwrap();
    let signal = lease.lost_signal();
    let watcher = tokio::spawn(async move {
        signal.clone().await;
        signal.reason()
    });
    lease.release().await.unwrap();
    let why = watcher.await.unwrap();
    assert!(
        matches!(why, Some(LostReason::Released)),
        "a released lease's signal says so: {why:?}"
    );
}

/// Every node loses the lease's key while the work runs (a flush, a failover to an empty
/// replica), between two renewals, so nothing told the lease: the release finds it held
/// nowhere, and the call says the lease was lost instead of returning the work's value.
#[test]
fn work_whose_keys_vanished_unseen_is_reported_lost_by_the_release() {
    let cluster = Cluster::start(3);
    let shared = shared(&cluster);
    let key = "with_lease:flushed";
    // A 30 s lease renews every 10 s: the work ends long before the first renewal.
    let flush = || {
        for n in 0..cluster.len() {
            cluster.node(n).admin().del(key);
        }
    };
    let got = block_on(
        shared.with_lease(key, Duration::from_secs(30), async |lease: &Lease| {
            flush();
            assert!(!lease.is_lost(), "nothing told the lease yet");
            7
        }),
    );
    match got {
        Err(Error::Lost {
            why: LostReason::TakenOver { .. },
            ..
        }) => {}
        other => panic!("the release should have found the lease lost: {other:?}"),
    }
    let got = shared.blocking_with_lease(key, Duration::from_secs(30), |lease| {
        flush();
        assert!(!lease.is_lost());
        7
    });
    assert!(
        matches!(
            got,
            Err(Error::Lost {
                why: LostReason::TakenOver { .. },
                ..
            })
        ),
        "{got:?}"
    );
}
