//! A future that finds the shared client idle runs its round in its own poll (no thread
//! hand-off), and never blocks that poll for a whole round: with a frozen majority the
//! poll gives up and the loop thread finishes the round.
//!
//! Its own test binary: the tests watch the loop thread of their client through
//! `/proc/self/task`, so no other client may run in the process meanwhile (they take
//! turns on `ONE_AT_A_TIME`).

mod common;

use common::{Cluster, wait_until};
use quorumlock::{Error, Redlock, SharedRedlock};
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The shared clients' loop threads of this process (named `quorumlock`): their voluntary
/// context switches (a switch is a sleep: the loop parked, then woken), by thread id.
fn loop_threads() -> BTreeMap<u32, u64> {
    let mut out = BTreeMap::new();
    for task in std::fs::read_dir("/proc/self/task")
        .expect("procfs")
        .flatten()
    {
        let dir = task.path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if comm.trim_end() != "quorumlock" {
            continue;
        }
        let status = std::fs::read_to_string(dir.join("status")).unwrap_or_default();
        let switches = status
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|v| v.trim().parse().ok());
        let tid = task.file_name().to_string_lossy().parse().ok();
        if let (Some(tid), Some(switches)) = (tid, switches) {
            out.insert(tid, switches);
        }
    }
    out
}

/// Builds a client and finds its loop thread (the one that was not there before).
fn client(cluster: &Cluster, node_timeout: Duration) -> (SharedRedlock, u32) {
    let before = loop_threads();
    let shared = Redlock::builder()
        .nodes(cluster.urls())
        .node_timeout(node_timeout)
        .retry_count(0)
        .build_shared()
        .unwrap();
    let mut tid = None;
    assert!(wait_until(Duration::from_secs(10), || {
        tid = loop_threads().into_keys().find(|t| !before.contains_key(t));
        tid.is_some()
    }));
    (shared, tid.unwrap())
}

fn switches(tid: u32) -> u64 {
    loop_threads()[&tid]
}

fn noop() -> Context<'static> {
    Context::from_waker(Waker::noop())
}

/// Polls `fut` with a do-nothing waker until it is ready (every few milliseconds, for at
/// most `timeout`).
fn poll_until_ready<F: Future + Unpin>(fut: &mut F, timeout: Duration) -> Option<F::Output> {
    let mut out = None;
    wait_until(timeout, || {
        if let Poll::Ready(v) = Pin::new(&mut *fut).poll(&mut noop()) {
            out = Some(v);
        }
        out.is_some()
    });
    out
}

/// One `try_lock` + `unlock` through futures, each polled to the end.
fn cycle(shared: &SharedRedlock, key: &str) {
    let mut acquire = Box::pin(shared.try_lock(key, Duration::from_secs(10)));
    let lock = poll_until_ready(&mut acquire, Duration::from_secs(10))
        .expect("answered")
        .expect("every node is up");
    let mut unlock = Box::pin(shared.unlock(&lock));
    let released = poll_until_ready(&mut unlock, Duration::from_secs(10)).expect("answered");
    assert!(released.unwrap() >= 3);
}

#[test]
fn a_future_on_an_idle_client_runs_its_round_in_its_poll() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let cluster = Cluster::start(5);
    let (shared, tid) = client(&cluster, Duration::from_millis(500));
    for i in 0..10 {
        cycle(&shared, &format!("inline:warm:{i}"));
    }
    // Through the loop thread, every operation would wake it (it parks between them:
    // the test polls every few milliseconds): 80 operations, 80 wake-ups at least. In
    // their polls, the loop sleeps on. A round may outlast the poll's wait on a busy
    // machine (the loop then takes it over), so a batch passes with fewer than half, and
    // one batch in five suffices.
    let mut seen = Vec::new();
    for batch in 0..5 {
        let before = switches(tid);
        for i in 0..40 {
            cycle(&shared, &format!("inline:{batch}:{i}"));
        }
        let woken = switches(tid) - before;
        if woken < 40 {
            return;
        }
        seen.push(woken);
    }
    panic!("the loop thread was woken for most operations in every batch: {seen:?} of 80");
}

#[test]
fn a_future_never_blocks_its_poll_for_a_round_with_a_frozen_majority() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let cluster = Cluster::start(5);
    // A round that cannot be decided lasts `node_timeout`: 3 s here. A poll that waited
    // for it would return it decided; the poll must give up long before and leave the
    // round to the loop. Three clients, so that each future finds its client idle and
    // used to quick rounds (a slow round sends the next futures through the loop).
    let clients: Vec<(SharedRedlock, u32)> = (0..3)
        .map(|_| client(&cluster, Duration::from_secs(3)))
        .collect();
    // Warm up until a cycle ran in place (the loop thread slept through it), so that the
    // first future after the freeze begins its round in its poll. Best effort: on a busy
    // machine the checks below still hold through the loop.
    for (i, (shared, tid)) in clients.iter().enumerate() {
        for n in 0..50 {
            let before = switches(*tid);
            cycle(shared, &format!("frozen-poll:warm:{i}:{n}"));
            if switches(*tid) == before {
                break;
            }
        }
    }
    let (a, b, c) = (&clients[0].0, &clients[1].0, &clients[2].0);
    let held = a
        .blocking_lock("frozen-poll:held", Duration::from_secs(60))
        .unwrap();
    for n in 0..3 {
        cluster.node(n).freeze();
    }

    let mut acquire = Box::pin(b.try_lock("frozen-poll", Duration::from_secs(60)));
    assert!(
        acquire.as_mut().poll(&mut noop()).is_pending(),
        "the acquire's poll waited out the round"
    );
    let r = poll_until_ready(&mut acquire, Duration::from_secs(30)).expect("answered");
    assert!(matches!(r, Err(Error::Unavailable(_))), "{r:?}");

    let mut unlock = Box::pin(a.unlock(&held));
    assert!(
        unlock.as_mut().poll(&mut noop()).is_pending(),
        "the unlock's poll waited out the round"
    );
    let r = poll_until_ready(&mut unlock, Duration::from_secs(30)).expect("answered");
    assert!(matches!(r, Err(Error::Unavailable(_))), "{r:?}");

    // A future dropped while the loop finishes the round its poll began: what it may
    // have set is deleted once the nodes are back.
    let mut lease = Box::pin(c.lease("frozen-poll:dropped", Duration::from_secs(60)));
    assert!(lease.as_mut().poll(&mut noop()).is_pending());
    drop(lease);
    for n in 0..3 {
        cluster.node(n).thaw();
    }
    let holders = |key: &str| {
        (0..cluster.len())
            .filter(|&n| cluster.node(n).admin().exists(key))
            .count()
    };
    for key in ["frozen-poll", "frozen-poll:held", "frozen-poll:dropped"] {
        assert!(
            wait_until(Duration::from_secs(30), || holders(key) == 0),
            "{key} left behind"
        );
    }
    // Every loop carries on.
    for (shared, _) in &clients {
        let lock = shared
            .blocking_lock("frozen-poll:after", Duration::from_secs(10))
            .unwrap();
        shared.blocking_unlock(&lock).unwrap();
    }
}
