//! A hostile node costs bounded CPU: a server that answers a lock command with a
//! 65,536-element array trickled in thousands of small pieces must cost the client work
//! in proportion to the bytes, not to their square (re-parsing the reply from its first
//! byte at every piece would be ~10^9 byte steps here).
//!
//! The bound is on the CPU time of the calling thread (`getrusage(RUSAGE_THREAD)`), which
//! other load on the machine does not inflate, against the time the trickle takes: the
//! server pauses between pieces, so linear work keeps the client mostly idle (about 5 %
//! of the call here), while re-parsing from the start keeps it busy for most of the call
//! (it was measured at 100 % of a core with the resumable parser disabled).

mod common;

use common::impostor::{Act, Impostor};
use quorumlock::{Error, NodeError, Outcome, Redlock};
use std::time::{Duration, Instant};

fn thread_cpu() -> Duration {
    // SAFETY: getrusage writes one rusage struct, which we own and zeroed.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) };
    assert_eq!(rc, 0, "getrusage");
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

#[test]
fn a_trickled_65536_element_array_costs_linear_cpu() {
    const ELEMENTS: usize = 65_536;
    let fake = Impostor::start(Act::TrickleArray {
        elements: ELEMENTS,
        chunk: 32,
    });
    // One node, so the call waits for it; a node_timeout far longer than the trickle,
    // so the whole array is read and parsed within the call.
    let mut rl = Redlock::builder()
        .nodes([fake.url()])
        .node_timeout(Duration::from_secs(60))
        .connect_timeout(Duration::from_secs(10))
        .retry_count(0)
        .build()
        .expect("valid configuration");
    let wall = Instant::now();
    let cpu = thread_cpu();
    let err = rl
        .try_lock("trickle", Duration::from_secs(10))
        .expect_err("an array is no answer to SET");
    let cpu = thread_cpu() - cpu;
    let wall = wall.elapsed();
    println!("trickled {ELEMENTS} elements: {cpu:?} CPU in {wall:?}");
    // The whole reply was read and judged: a reply that does not fit the command.
    let Error::Unavailable(f) = &err else {
        panic!("wrong error kind: {err:?}");
    };
    assert!(
        matches!(
            f.nodes[0].outcome,
            Outcome::Failed(NodeError::UnexpectedReply(_))
        ),
        "{err}"
    );
    // ~262 KB in ~8,000 pieces with pauses between them: linear parsing leaves the client
    // idle most of the time; re-parsing from the start at every piece (~10^9 byte steps)
    // keeps it busy throughout. A busy machine only lowers the ratio for linear work.
    assert!(
        cpu * 4 < wall,
        "parsing the trickled array took {cpu:?} of CPU in {wall:?}"
    );
}
