//! The shared client under tokio: many tasks take turns on one lock through one
//! `SharedRedlock` (one event-loop thread and one connection per node for the whole
//! process), and a waiter is woken when the holder releases, not at its next poll.
//!
//! ```sh
//! QUORUMLOCK_NODES=redis://127.0.0.1:7001,redis://127.0.0.1:7002,redis://127.0.0.1:7003 \
//!     cargo run --example shared_tokio
//! ```
//!
//! It exits 0 when every task got the lock and no two held it at once, non-zero
//! otherwise. The client needs no runtime of its own: its futures only use the `Waker`,
//! so they run under tokio, async-std or a plain `block_on` alike.

use quorumlock::Redlock;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const TASKS: usize = 20;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let nodes = std::env::var("QUORUMLOCK_NODES")
        .map_err(|_| "set QUORUMLOCK_NODES to comma-separated redis:// URLs")?;

    // Cloning a `SharedRedlock` is cheap (a reference count): every clone shares the
    // loop thread and the connections. Requests from many tasks that arrive together go
    // out together, in one write per node.
    let client = Redlock::builder().nodes(nodes.split(',')).build_shared()?;

    // Only to show that the lock works: set while a task is inside.
    let inside = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let (client, inside) = (client.clone(), inside.clone());
        tasks.push(tokio::spawn(async move {
            // `lock_within` keeps trying for up to 30 s. The client listens for the
            // holder's release (a notice every release script publishes) and tries again
            // at once, so the lock passes from task to task in about a millisecond.
            let lock = client
                .lock_within(
                    "examples:shared",
                    Duration::from_secs(5),
                    Duration::from_secs(30),
                )
                .await?;
            if inside.swap(true, Ordering::SeqCst) {
                return Err(format!("task {task}: another task was inside").into());
            }
            // The work, while the lock is valid. (Long work would take a `lease` and
            // check `is_lost()`: see examples/lease.rs.)
            tokio::time::sleep(Duration::from_millis(5)).await;
            inside.store(false, Ordering::SeqCst);
            // Returns at a majority; the other deletes are still on their way.
            client.unlock(&lock).await?;
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        }));
    }
    for (task, handle) in tasks.into_iter().enumerate() {
        handle
            .await?
            .map_err(|e| format!("task {task} failed: {e}"))?;
    }
    println!(
        "{TASKS} tasks took turns on one lock in {} ms through one client, never two at once",
        started.elapsed().as_millis()
    );
    Ok(())
}
