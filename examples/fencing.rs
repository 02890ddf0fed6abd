//! Fencing: a holder that stalls past its lock's validity (a long GC pause, a stopped
//! process) must not be able to write any more. No lock can stop a paused process from
//! waking up and writing; the storage can refuse it. With fencing on, every lock carries a
//! fence, a number larger than any earlier holder's; a storage that remembers the largest
//! fence it accepted and refuses a smaller one turns the stale write into an error.
//!
//! ```sh
//! QUORUMLOCK_NODES=redis://127.0.0.1:7001,redis://127.0.0.1:7002,redis://127.0.0.1:7003 \
//!     cargo run --example fencing
//! ```
//!
//! It exits 0 when the stale write was refused and the current holder's accepted,
//! non-zero otherwise.

use quorumlock::Redlock;
use std::thread;
use std::time::Duration;

/// A storage that checks the fence of every write. Here an in-process value; in real
/// life a database row with a `fence` column (`UPDATE ... WHERE fence <= $1`), or any
/// service that can compare and keep the largest fence atomically with the write.
struct FencedStore {
    /// The largest fence a write was accepted with.
    highest: u64,
    value: String,
}

impl FencedStore {
    fn write(&mut self, fence: u64, value: &str) -> Result<(), String> {
        // Equal is fine: the same holder writing twice.
        if fence < self.highest {
            return Err(format!(
                "refused: fence {fence} is older than {} (a later holder has written)",
                self.highest
            ));
        }
        self.highest = fence;
        self.value = value.to_string();
        Ok(())
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let nodes = std::env::var("QUORUMLOCK_NODES")
        .map_err(|_| "set QUORUMLOCK_NODES to comma-separated redis:// URLs")?;
    // `fencing(true)`: each acquire also reads a counter kept on the nodes beside the key
    // and returns the largest plus one, written back to a majority before `lock` returns.
    // The ttl must be at least 4 x node_timeout. (The node timeout is 500 ms here, not
    // the default 50 ms, so that a busy machine running both this and its nodes cannot
    // make a round miss a healthy node.)
    let client = || {
        Redlock::builder()
            .nodes(nodes.split(','))
            .node_timeout(Duration::from_millis(500))
            .fencing(true)
            .build()
    };
    let (mut a, mut b) = (client()?, client()?);
    let resource = "examples:fenced-report";
    let ttl = Duration::from_secs(2);
    let mut store = FencedStore {
        highest: 0,
        value: String::new(),
    };

    // A takes the lock and writes with its fence.
    let lock_a = a.lock(resource, ttl)?;
    let fence_a = lock_a
        .fence()
        .ok_or("fencing is on: every lock has a fence")?;
    store.write(fence_a, "written by A")?;
    println!("A holds the lock with fence {fence_a} and wrote");

    // A stalls past its validity (simulated here by a sleep) ...
    thread::sleep(lock_a.remaining() + Duration::from_millis(100));
    println!("A stalled; its lock is valid: {}", lock_a.is_valid());

    // ... meanwhile the key expired on the nodes and B takes the lock, with a larger
    // fence, and writes.
    let lock_b = b.lock(resource, ttl)?;
    let fence_b = lock_b
        .fence()
        .ok_or("fencing is on: every lock has a fence")?;
    if fence_b <= fence_a {
        return Err(format!("fences must rise: A had {fence_a}, B got {fence_b}").into());
    }
    store.write(fence_b, "written by B")?;
    println!("B holds the lock with fence {fence_b} and wrote");

    // A wakes up and, without looking at its lock again, writes. The store refuses it.
    match store.write(fence_a, "late write by A") {
        Err(why) => println!("A's late write: {why}"),
        Ok(()) => return Err("the store accepted a stale holder's write".into()),
    }
    if store.value != "written by B" {
        return Err(format!("the store holds {:?}", store.value).into());
    }

    // A's unlock deletes nothing: the key is B's now (the compare-and-delete checks the
    // token), and the unlock says so (`Error::Expired`, not a count). B releases its own.
    match a.unlock(&lock_a) {
        Err(quorumlock::Error::Expired(_)) => println!("A's unlock: held nowhere any more"),
        other => return Err(format!("A's stale unlock: {other:?}").into()),
    }
    println!("B's unlock released it on {} nodes", b.unlock(&lock_b)?);
    Ok(())
}
