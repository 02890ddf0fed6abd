//! The shared client's blocking calls do not touch the heap in steady state, on either
//! side: the caller's thread and the loop thread. A counting global allocator sees every
//! thread (so this file holds one test: no other test may run beside it).

mod common;

use quorumlock::Redlock;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn blocking_calls_do_not_allocate_on_either_thread() {
    let cluster = common::Cluster::start(5);
    let shared = Redlock::builder()
        .nodes(cluster.urls())
        .node_timeout(Duration::from_millis(500))
        .build_shared()
        .unwrap();
    let resource = [b'r'; quorumlock::INLINE_RESOURCE];
    let ttl = Duration::from_secs(10);
    let cycle = || {
        let mut lock = shared.blocking_try_lock(resource, ttl).expect("free lock");
        shared.blocking_extend(&mut lock, ttl).expect("extend");
        let released = shared.blocking_unlock(&lock);
        assert!(matches!(released, Ok(n) if n <= 5), "{released:?}");
    };
    // Warm up: connections, buffers, script caches and the loop's scratch.
    for _ in 0..300 {
        cycle();
    }
    let before = ALLOCATIONS.load(Ordering::SeqCst);
    let cycles = 2_000;
    for _ in 0..cycles {
        cycle();
    }
    let counted = ALLOCATIONS.load(Ordering::SeqCst) - before;
    println!("{counted} allocations in {cycles} blocking try_lock + extend + unlock cycles");
    assert_eq!(
        counted, 0,
        "the steady-state blocking cycle must not allocate"
    );
    // The counter sees the loop thread: a resource past the inline size is copied to
    // the heap there (the lock it builds).
    let long = [b'x'; quorumlock::INLINE_RESOURCE + 1];
    let before = ALLOCATIONS.load(Ordering::SeqCst);
    let lock = shared.blocking_try_lock(long, ttl).expect("free lock");
    assert!(ALLOCATIONS.load(Ordering::SeqCst) > before);
    shared.blocking_unlock(&lock).unwrap();
}
