//! A direct lock: one `Redlock` client, used by one thread, takes a lock, works while it is
//! valid, extends it, and releases it; a second client is refused meanwhile.
//!
//! Run it against your nodes (three or more independent Redis masters):
//!
//! ```sh
//! QUORUMLOCK_NODES=redis://127.0.0.1:7001,redis://127.0.0.1:7002,redis://127.0.0.1:7003 \
//!     cargo run --example direct_lock
//! ```
//!
//! It exits 0 when every step went as described, non-zero otherwise.

use quorumlock::{Error, Redlock};
use std::thread;
use std::time::Duration;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The variable the `quorumlock` command reads too: comma-separated node URLs
    // (`redis://[user:password@]host:port[/db]`, `unix:///path`, or `rediss://` with the
    // `tls` feature).
    let nodes = std::env::var("QUORUMLOCK_NODES")
        .map_err(|_| "set QUORUMLOCK_NODES to comma-separated redis:// URLs")?;

    // One client: a connection per node and one event loop, driven by the calling thread
    // (the methods take `&mut self`). `build` checks the settings; it does not need the
    // nodes to be up. The node timeout (how long a round waits for a node) is 50 ms by
    // default, for nodes on a nearby network; 500 ms here, so that a busy machine running
    // both this and its nodes cannot turn "held" into "no answer".
    let builder = || {
        Redlock::builder()
            .nodes(nodes.split(','))
            .node_timeout(Duration::from_millis(500))
    };
    let mut client = builder().build()?;
    let resource = "examples:direct-lock";
    let ttl = Duration::from_secs(5);

    // `lock` tries up to `retry_count` more times (3 by default) while someone else holds
    // it. The lock is ours for `ttl` minus the time the round took minus the clock drift
    // allowance: `remaining()` says how much of it is left.
    let mut lock = client.lock(resource, ttl)?;
    println!(
        "locked {resource:?}: valid for {} ms (a majority is {} of {} nodes)",
        lock.remaining().as_millis(),
        client.quorum(),
        client.settings().nodes.len()
    );

    // Meanwhile another client (here in the same process; usually another machine) is
    // refused. `try_lock` makes one attempt; `Error::Taken` means the key is held.
    let mut rival = builder().build()?;
    match rival.try_lock(resource, ttl) {
        Err(e @ Error::Taken(_)) => println!("a second client is refused: {e}"),
        Err(e) => return Err(format!("the second client failed otherwise: {e}").into()),
        Ok(stolen) => {
            rival.unlock(&stolen)?;
            return Err("the second client got a lock that was held".into());
        }
    }

    // Work in steps, and look at the lock before each one: past its validity another
    // client may hold the resource, so the work must stop (examples/fencing.rs shows a
    // storage that refuses such late writes on its own).
    for step in 1..=3 {
        if !lock.is_valid() {
            return Err("the lock ran out before the work was done".into());
        }
        thread::sleep(Duration::from_millis(100)); // the work
        println!("step {step} done, {} ms left", lock.remaining().as_millis());
    }

    // Need longer? `extend` renews it for a new ttl from now, on a majority, or fails and
    // leaves the deadline as it was (never later).
    client.extend(&mut lock, ttl)?;
    println!("extended: {} ms left", lock.remaining().as_millis());

    // Release: a compare-and-delete on every node, returning once a majority answered,
    // with the number of deletes confirmed by then. A `Lock` is plain data: dropping it
    // does not release it (the key would then expire after its ttl).
    let released_on = client.unlock(&lock)?;
    println!("released (confirmed on {released_on} nodes so far)");

    // Now the rival gets it.
    let theirs = rival.lock(resource, ttl)?;
    println!("the second client has it now");
    rival.unlock(&theirs)?;
    Ok(())
}
