//! A lease around a long job: the shared client keeps the lock alive in the background
//! while the job runs for several times its ttl, and the job stops if the lease is lost.
//!
//! ```sh
//! QUORUMLOCK_NODES=redis://127.0.0.1:7001,redis://127.0.0.1:7002,redis://127.0.0.1:7003 \
//!     cargo run --example lease
//! ```
//!
//! It exits 0 when the job finished under its lease, non-zero otherwise. The command-line
//! tool does the same for any program: `quorumlock run RESOURCE -- COMMAND`.

use quorumlock::Redlock;
use std::thread;
use std::time::{Duration, Instant};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let nodes = std::env::var("QUORUMLOCK_NODES")
        .map_err(|_| "set QUORUMLOCK_NODES to comma-separated redis:// URLs")?;

    // The shared client: one event-loop thread of its own, shared by every clone, thread
    // and task of the process. Leases need it: that thread extends them.
    let client = Redlock::builder().nodes(nodes.split(',')).build_shared()?;

    // A short ttl, so that the job below outlives it three times: the lease is extended
    // every ttl/3, each time for a new ttl. (Should this process die, the lock goes after
    // at most one ttl: that is what a short one buys.)
    let ttl = Duration::from_secs(1);
    let steps = 12;
    let step_time = Duration::from_millis(250);

    // `blocking_lease` acquires (with the usual retries) and then keeps the lock alive;
    // `blocking_lease_within(resource, ttl, wait)` would wait up to `wait` for a holder to
    // release it. From async code: `client.lease(...).await`.
    let lease = client.blocking_lease("examples:nightly-report", ttl)?;
    let started = Instant::now();
    println!(
        "leased {:?} with a ttl of {ttl:?} for a job of {steps} steps of {step_time:?}",
        String::from_utf8_lossy(lease.resource())
    );

    for step in 1..=steps {
        // A lease is lost for good when a majority says the key is gone or someone
        // else's, or when its validity runs out before an extend got through (nodes
        // unreachable). Check before each step that must not overlap another holder's;
        // `lost_reason` says which it was. (`lease.lost_signal()` hands the same check to
        // another thread; `.before(margin)` fires that long ahead of the deadline.)
        if let Some(why) = lease.lost_reason() {
            return Err(format!("lease lost before step {step} ({why}): stopping the job").into());
        }
        thread::sleep(step_time); // one step of the work
        println!(
            "step {step:2}/{steps} done at {:>4} ms, lease valid for {:>4} ms more",
            started.elapsed().as_millis(),
            lease.remaining().as_millis()
        );
    }

    // Done: release it now rather than let it expire. (Dropping a lease releases it too,
    // in the background; `blocking_with_lease` wraps acquire, job and release in one call.)
    let held = started.elapsed();
    let released_on = lease.blocking_release()?;
    println!(
        "job done in {} ms ({:.1} x the ttl) under one lease; released (confirmed on \
         {released_on} nodes so far)",
        held.as_millis(),
        held.as_secs_f64() / ttl.as_secs_f64()
    );
    Ok(())
}
