//! Locks that say what happened, on both clients against real nodes: an unlock that found
//! the lock held nowhere is an error, not `Ok(0)`; a lock once released cannot be
//! released or extended again by mistake (refused, nothing sent); `Lock` is not `Clone`.

mod common;

use common::{Cluster, wait_until};
use quorumlock::{Error, Lock, Outcome, Phase, Redlock, SharedRedlock};
use std::time::Duration;

const TTL: Duration = Duration::from_secs(30);

fn builder(cluster: &Cluster) -> quorumlock::Builder {
    Redlock::builder()
        .nodes(cluster.urls())
        .node_timeout(Duration::from_secs(2))
        .max_backoff(Duration::from_millis(50))
        .retry_count(0)
}

fn holders(cluster: &Cluster, key: &str) -> usize {
    (0..cluster.len())
        .filter(|&n| cluster.node(n).admin().exists(key))
        .count()
}

/// Commands the nodes ran so far (`INFO stats`), summed over `cluster`, minus what the
/// asking admin connections cost: unchanged when a call sent nothing.
fn commands(cluster: &Cluster) -> Vec<i64> {
    (0..cluster.len())
        .map(|n| {
            let mut a = cluster.node(n).admin();
            let info = a.cmd(&["INFO", "commandstats"]).as_string().unwrap();
            // Lock traffic only: scripts and SETs (the admin sends INFO and EXISTS).
            info.lines()
                .filter(|l| {
                    l.starts_with("cmdstat_evalsha:")
                        || l.starts_with("cmdstat_eval:")
                        || l.starts_with("cmdstat_set:")
                })
                .map(|l| {
                    let calls = l.split("calls=").nth(1).unwrap();
                    calls.split(',').next().unwrap().parse::<i64>().unwrap()
                })
                .sum()
        })
        .collect()
}

/// `Lock` is not `Clone`: `<Lock as NotClone<_>>` is ambiguous (does not compile) if it is.
#[test]
fn lock_is_not_clone() {
    trait NotClone<A> {
        fn check() {}
    }
    impl<T: ?Sized> NotClone<()> for T {}
    #[allow(dead_code)]
    struct IsClone;
    impl<T: Clone> NotClone<IsClone> for T {}
    <Lock as NotClone<_>>::check();
}

#[test]
fn direct_unlock_releases_once_and_says_when_nothing_was_held() {
    let cluster = Cluster::start(3);
    let mut rl = builder(&cluster).build().unwrap();
    let mut lock = None;
    assert!(wait_until(Duration::from_secs(10), || {
        lock = rl.try_lock("unlock:direct", TTL).ok();
        lock.is_some()
    }));
    let mut lock = lock.unwrap();
    assert!(!lock.is_released());
    let n = rl.unlock(&lock).expect("a release");
    assert!(n >= 1, "Ok always counts at least one delete: {n}");
    assert!(lock.is_released() && !lock.is_valid());
    assert_eq!(lock.remaining(), Duration::ZERO);
    assert!(wait_until(Duration::from_secs(10), || holders(
        &cluster,
        "unlock:direct"
    ) == 0));

    // Used again by mistake: refused, and nothing reaches the nodes.
    let before = commands(&cluster);
    assert!(
        before.iter().sum::<i64>() > 0,
        "commandstats counts lock traffic"
    );
    let e = rl.unlock(&lock).expect_err("second unlock");
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    let e = rl.extend(&mut lock, TTL).expect_err("extend after unlock");
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    let many = rl.unlock_many(std::slice::from_ref(&lock));
    assert!(
        matches!(many[..], [Err(Error::InvalidArgument(_))]),
        "{many:?}"
    );
    assert_eq!(commands(&cluster), before, "a released lock sent something");

    // A lock whose key expired everywhere: told apart from a release.
    let short = rl
        .try_lock("unlock:expired", Duration::from_millis(100))
        .expect("lock");
    assert!(wait_until(Duration::from_secs(10), || holders(
        &cluster,
        "unlock:expired"
    ) == 0));
    let e = rl.unlock(&short).expect_err("held nowhere");
    let Error::Expired(f) = &e else {
        panic!("wrong error kind: {e:?}")
    };
    assert_eq!(f.op, Phase::Release);
    assert!(f.count(|o| *o == Outcome::NotHeld) >= 2, "{e}");
    assert!(e.to_string().contains("nothing to release"), "{e}");
    assert!(short.is_released(), "nothing left to release: released");

    // A batch: each lock for itself.
    let a = rl.try_lock("unlock:batch:a", TTL).expect("a");
    let b = rl
        .try_lock("unlock:batch:b", Duration::from_millis(100))
        .expect("b");
    assert!(wait_until(Duration::from_secs(10), || holders(
        &cluster,
        "unlock:batch:b"
    ) == 0));
    let results = rl.unlock_many(&[a, b]);
    assert!(matches!(results[0], Ok(n) if n >= 1), "{results:?}");
    assert!(matches!(results[1], Err(Error::Expired(_))), "{results:?}");
}

fn shared_client(cluster: &Cluster) -> SharedRedlock {
    builder(cluster).build_shared().unwrap()
}

#[test]
fn blocking_shared_unlock_releases_once_and_says_when_nothing_was_held() {
    let cluster = Cluster::start(3);
    let shared = shared_client(&cluster);
    let mut lock = None;
    assert!(wait_until(Duration::from_secs(10), || {
        lock = shared.blocking_try_lock("unlock:shared", TTL).ok();
        lock.is_some()
    }));
    let mut lock = lock.unwrap();
    assert!(shared.blocking_unlock(&lock).expect("a release") >= 1);
    assert!(lock.is_released() && !lock.is_valid());
    let before = commands(&cluster);
    let e = shared.blocking_unlock(&lock).expect_err("second unlock");
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    let e = shared.blocking_extend(&mut lock, TTL).expect_err("extend");
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    assert_eq!(commands(&cluster), before, "a released lock sent something");

    let short = shared
        .blocking_try_lock("unlock:shared:expired", Duration::from_millis(100))
        .expect("lock");
    assert!(wait_until(Duration::from_secs(10), || holders(
        &cluster,
        "unlock:shared:expired"
    ) == 0));
    let e = shared.blocking_unlock(&short).expect_err("held nowhere");
    assert!(
        matches!(&e, Error::Expired(f) if f.op == Phase::Release),
        "{e}"
    );
    assert!(short.is_released());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_shared_unlock_releases_once_and_says_when_nothing_was_held() {
    let cluster = Cluster::start(3);
    let shared = shared_client(&cluster);
    let mut lock = shared.lock("unlock:async", TTL).await;
    for _ in 0..200 {
        if lock.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        lock = shared.lock("unlock:async", TTL).await;
    }
    let mut lock = lock.expect("lock");
    assert!(shared.unlock(&lock).await.expect("a release") >= 1);
    assert!(lock.is_released());
    let e = shared.unlock(&lock).await.expect_err("second unlock");
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    let e = shared.extend(&mut lock, TTL).await.expect_err("extend");
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");

    let short = shared
        .try_lock("unlock:async:expired", Duration::from_millis(100))
        .await
        .expect("lock");
    assert!(wait_until(Duration::from_secs(10), || holders(
        &cluster,
        "unlock:async:expired"
    ) == 0));
    let e = shared.unlock(&short).await.expect_err("held nowhere");
    assert!(
        matches!(&e, Error::Expired(f) if f.op == Phase::Release),
        "{e}"
    );
}

#[test]
fn a_failed_unlock_leaves_the_lock_unreleased_to_try_again() {
    let cluster = Cluster::start(3);
    let mut rl = builder(&cluster)
        .node_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let mut lock = None;
    assert!(wait_until(Duration::from_secs(10), || {
        lock = rl.try_lock("unlock:retry", TTL).ok();
        lock.is_some()
    }));
    let lock = lock.unwrap();
    // Two of three nodes frozen: too few answer.
    cluster.node(1).freeze();
    cluster.node(2).freeze();
    let e = rl.unlock(&lock).expect_err("no majority");
    cluster.node(1).thaw();
    cluster.node(2).thaw();
    assert!(matches!(e, Error::Unavailable(_)), "{e}");
    assert!(!lock.is_released(), "a failed unlock can be tried again");
    assert!(
        wait_until(Duration::from_secs(20), || rl.unlock(&lock).is_ok()
            || lock.is_released()),
        "the second unlock never went through"
    );
    assert!(lock.is_released());
}

#[test]
fn shared_batches_lock_and_unlock_as_the_direct_ones() {
    let cluster = Cluster::start(3);
    let shared = shared_client(&cluster);
    let mut other = builder(&cluster).build().unwrap();
    assert!(wait_until(Duration::from_secs(10), || other
        .try_lock("batch:held", TTL)
        .is_ok()));
    let names = ["batch:a", "batch:held", "batch:b", ""];
    let mut results = Vec::new();
    assert!(wait_until(Duration::from_secs(10), || {
        for lock in results.drain(..).flatten() {
            let _ = shared.blocking_unlock(&lock);
        }
        results = shared.blocking_try_lock_many(&names, TTL);
        results[0].is_ok() && results[2].is_ok()
    }));
    assert!(
        matches!(results[1], Err(Error::Taken(_))),
        "{:?}",
        results[1]
    );
    assert!(
        matches!(results[3], Err(Error::InvalidArgument(_))),
        "{:?}",
        results[3]
    );
    let a = results.remove(0).unwrap();
    let b = results.remove(1).unwrap();
    assert!(holders(&cluster, "batch:a") >= 2);
    let released = shared.blocking_unlock_many(&[a, b]);
    assert!(
        released.iter().all(|r| matches!(r, Ok(n) if *n >= 1)),
        "{released:?}"
    );
    assert!(wait_until(Duration::from_secs(10), || holders(
        &cluster, "batch:a"
    ) == 0
        && holders(&cluster, "batch:b") == 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_shared_batches() {
    let cluster = Cluster::start(3);
    let shared = shared_client(&cluster);
    let names: Vec<String> = (0..40).map(|i| format!("batch:async:{i}")).collect();
    let mut results = shared.try_lock_many(&names, TTL).await;
    for _ in 0..200 {
        if results.iter().all(Result::is_ok) {
            break;
        }
        for lock in results.drain(..).flatten() {
            let _ = shared.unlock(&lock).await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        results = shared.try_lock_many(&names, TTL).await;
    }
    let locks: Vec<Lock> = results.into_iter().map(|r| r.expect("free")).collect();
    assert_eq!(locks.len(), 40);
    assert!(holders(&cluster, "batch:async:39") >= 2);
    let released = shared.unlock_many(&locks).await;
    assert!(
        released.iter().all(|r| matches!(r, Ok(n) if *n >= 1)),
        "{released:?}"
    );
    assert!(locks.iter().all(Lock::is_released));
    // Again: refused one by one, nothing sent.
    let again = shared.unlock_many(&locks).await;
    assert!(
        again
            .iter()
            .all(|r| matches!(r, Err(Error::InvalidArgument(_))))
    );
}
