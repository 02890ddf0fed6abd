//! Bounded memory over many cycles: buffers and reply queues reach a steady size during
//! warm-up; after it they grow at most to the high-water mark the design allows (a node
//! may fall `MAX_ROUNDS_BEHIND` rounds behind, since calls return at a majority), never with
//! the number of cycles, healthy or with nodes frozen.
//!
//! CI runs 20,000 cycles per scenario; `MEMORY_CYCLES=1000000 cargo test --release --test
//! memory -- --nocapture` runs the long version.

mod common;

use common::Cluster;
use quorumlock::Redlock;
use std::time::Duration;

fn cycles() -> usize {
    std::env::var("MEMORY_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000)
}

fn run(rl: &mut Redlock, n: usize) {
    for i in 0..n {
        let resource = if i % 2 == 0 { &b"mem:a"[..] } else { b"mem:b" };
        let lock = rl
            .try_lock(resource, Duration::from_secs(10))
            .expect("a quorum is up");
        rl.unlock(&lock).expect("a quorum answers");
    }
}

#[test]
fn buffers_stay_bounded_over_many_cycles() {
    let cluster = Cluster::start(5);
    let mut rl = Redlock::builder()
        .nodes(cluster.urls())
        // Generous: on a loaded machine a healthy node must never miss a round, or
        // the cycle would fail for a reason this test is not about.
        .node_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    run(&mut rl, 1_000);
    let steady = rl.buffered_bytes();
    let n = cycles();
    run(&mut rl, n);
    println!(
        "healthy: {steady} bytes after warm-up, {} after {n} more cycles",
        rl.buffered_bytes()
    );
    // Calls return at a majority, so a node slower than the client may fall behind,
    // round after round, until it owes replies from `MAX_ROUNDS_BEHIND` (64) rounds back
    // (one reply each here); its queue of 128 entries, made at the start, holds that.
    // Past it the node is left alone until it catches up: the buffers stay as they were,
    // or at worst double once, never growing with the number of cycles.
    let bound = steady + 5 * 256 * 32;
    assert!(
        rl.buffered_bytes() <= bound,
        "grew past the bound: {} > {bound}",
        rl.buffered_bytes()
    );

    // Two nodes frozen: nothing new is queued for them, so nothing grows.
    cluster.node(3).freeze();
    cluster.node(4).freeze();
    run(&mut rl, 1_000);
    let frozen = rl.buffered_bytes();
    run(&mut rl, n);
    println!(
        "2 frozen: {frozen} bytes after warm-up, {} after {n} more cycles",
        rl.buffered_bytes()
    );
    assert!(
        rl.buffered_bytes() <= frozen,
        "grew while two nodes were frozen"
    );
    cluster.node(3).thaw();
    cluster.node(4).thaw();
}
