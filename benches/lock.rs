//! Lock operations against 5 local `redis-server` nodes (started by the shared test
//! harness, one fresh cluster per benchmark, killed when it ends).
//!
//! Run: `cargo bench --bench lock` (quick: `-- --warm-up-time 1 --measurement-time 3`).
//! Every iteration checks its result, so a failing lock cannot look fast.

#[path = "../tests/common/mod.rs"]
mod common;

use common::Cluster;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use quorumlock::{Error, Lock, Redlock};
use std::hint::black_box;
use std::time::{Duration, Instant};

const NODES: usize = 5;
const TTL: Duration = Duration::from_secs(30);

fn client(cluster: &Cluster) -> Redlock {
    client_with(cluster, Redlock::builder())
}

fn client_with(cluster: &Cluster, builder: quorumlock::Builder) -> Redlock {
    let mut rl = builder
        .nodes(cluster.urls())
        .build()
        .expect("client for the local cluster");
    // Connections open in the background: wait until a full cycle works, then warm up.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match rl.try_lock("bench:warmup", TTL) {
            Ok(lock) => {
                rl.unlock(&lock).expect("warm-up unlock");
                break;
            }
            Err(e) if Instant::now() < deadline => {
                eprintln!("warm-up: {e}");
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("cluster never became usable: {e}"),
        }
    }
    for _ in 0..100 {
        let lock = rl.try_lock("bench:warmup", TTL).expect("warm-up lock");
        rl.unlock(&lock).expect("warm-up unlock");
    }
    rl
}

/// `try_lock` + `unlock` of one resource, one client, 5 nodes.
fn acquire_release(c: &mut Criterion) {
    let cluster = Cluster::start(NODES);
    let mut rl = client(&cluster);
    let quorum = rl.quorum();
    let mut g = c.benchmark_group("lock/5_nodes");
    g.throughput(Throughput::Elements(1));
    g.bench_function("try_lock+unlock", |b| {
        b.iter(|| {
            let lock = rl
                .try_lock(black_box("bench:cycle"), TTL)
                .expect("uncontended try_lock");
            let released = rl.unlock(&lock).expect("unlock");
            // unlock waits for every responsive node; all 5 held our key.
            assert!(released >= quorum, "released on {released} nodes");
            black_box(released);
        })
    });
    g.finish();
}

/// `try_lock` of a resource another client holds: `Err(Error::Taken(_))`.
fn contended(c: &mut Criterion) {
    let cluster = Cluster::start(NODES);
    let mut holder = client(&cluster);
    let mut rl = client(&cluster);
    let held = holder
        .try_lock("bench:held", Duration::from_secs(3600))
        .expect("holder takes the lock");
    let mut g = c.benchmark_group("lock/5_nodes");
    g.throughput(Throughput::Elements(1));
    g.bench_function("try_lock_taken", |b| {
        b.iter(|| match rl.try_lock(black_box("bench:held"), TTL) {
            Err(Error::Taken(f)) => {
                black_box(f);
            }
            other => panic!("expected Err(Taken), got {other:?}"),
        })
    });
    g.finish();
    holder.unlock(&held).expect("holder unlock");
}

/// `extend` of a held lock.
fn extend(c: &mut Criterion) {
    let cluster = Cluster::start(NODES);
    let mut rl = client(&cluster);
    let mut lock = rl.try_lock("bench:extend", TTL).expect("lock to extend");
    let mut g = c.benchmark_group("lock/5_nodes");
    g.throughput(Throughput::Elements(1));
    g.bench_function("extend", |b| {
        b.iter(|| {
            rl.extend(black_box(&mut lock), TTL).expect("extend");
            assert!(lock.is_valid());
        })
    });
    g.finish();
    rl.unlock(&lock).expect("unlock after extend");
}

/// `try_lock_many` + `unlock_many` of K resources in one round each.
fn many(c: &mut Criterion) {
    let cluster = Cluster::start(NODES);
    // One round carries all K commands, but node_timeout (default 50 ms) bounds the whole
    // round: on a shared 2-core machine a 256-item unlock_many occasionally took longer
    // and failed with Unavailable. Give batches room so the benchmark measures throughput.
    let mut rl = client_with(
        &cluster,
        Redlock::builder().node_timeout(Duration::from_millis(500)),
    );
    let quorum = rl.quorum();
    let mut g = c.benchmark_group("lock/5_nodes/many");
    for k in [16usize, 256] {
        let resources: Vec<String> = (0..k).map(|i| format!("bench:many:{k}:{i}")).collect();
        g.throughput(Throughput::Elements(k as u64));
        g.bench_with_input(
            BenchmarkId::new("try_lock_many+unlock_many", k),
            &resources,
            |b, resources| {
                b.iter(|| {
                    let locks: Vec<Lock> = rl
                        .try_lock_many(black_box(resources), TTL)
                        .into_iter()
                        .map(|r| r.expect("uncontended try_lock_many"))
                        .collect();
                    assert_eq!(locks.len(), k);
                    for r in rl.unlock_many(&locks) {
                        let n = r.expect("unlock_many");
                        assert!(n >= quorum, "released on {n} nodes");
                    }
                })
            },
        );
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = acquire_release, contended, extend, many
}
criterion_main!(benches);
