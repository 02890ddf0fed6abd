//! Distributed locks over N independent Redis masters, by the Redlock algorithm.
//!
//! # Overview
//!
//! `quorumlock` takes a lock by writing `SET key token NX PX ttl` to every node at once
//! from one non-blocking event loop, and decides the moment a majority (`N/2 + 1`) has
//! answered: the slowest nodes never add latency, and a frozen or dead minority costs
//! nothing. A lock is valid for `ttl − elapsed − drift`; it is released and extended
//! with Lua compare-and-delete and compare-and-pexpire scripts, so a client can only
//! ever touch its own key. A failed attempt sends the compare-and-delete to every node
//! it reached (even those that said no), then
//! retries after a random delay.
//!
//! The crate depends only on `mio`, `bytes`, `memchr` and `fastrand`: RESP2 is written
//! by hand, there is no async runtime.
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use quorumlock::{Error, Lock, Redlock};
//!
//! let mut rl = Redlock::builder()
//!     .nodes(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
//!     .build()?;
//! let mut lock: Lock = rl.lock("orders:42", Duration::from_secs(10))?;
//! // Work for at most lock.remaining(); extend before it runs out.
//! rl.extend(&mut lock, Duration::from_secs(10))?;
//! let released_on = rl.unlock(&lock)?;
//! println!("released on {released_on} nodes");
//! # Ok::<(), Error>(())
//! ```
//!
//! # Layout
//!
//! - [`resp`]: the RESP2 codec; bytes in, values out, no I/O.
//! - [`core`]: Redlock as plain data: quorum arithmetic, rounds of votes, scripts,
//!   tokens. Time is passed in; nothing here reads a clock or a socket.
//! - `driver` (private): the mio event loop, the only place with I/O.
//! - [`Redlock`], [`Lock`], [`Error`]: the API.
//!
//! # Guarantees and their limits
//!
//! Mutual exclusion holds while the lock is valid ([`Lock::is_valid`]), assuming clocks
//! on the client and the nodes run at nearly the same rate (the drift allowance covers
//! `drift_factor × ttl + 2 ms`), and that a node that restarts without persistence stays
//! away for at least the longest ttl in use. See the README for the details.

#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod config;
pub mod core;
mod driver;
mod error;
mod lock;
mod redlock;
pub mod resp;

pub use config::{Builder, Endpoint, Settings};
pub use error::{ConfigError, Error, Failure, NodeError, NodeReport, Outcome, Phase};
pub use lock::{INLINE_RESOURCE, Lock};
pub use redlock::{MAX_RESOURCE, Redlock};

/// The README's examples, compiled as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
