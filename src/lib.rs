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
//! by hand, there is no async runtime. The optional `tls` feature adds `rediss://` nodes
//! over rustls (with its ring provider): see [`Endpoint`] and
//! `Builder::tls_ca_file`.
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
//! - [`Redlock`], [`Builder`], [`Settings`], [`Endpoint`], [`Lock`] (and [`LockParts`], a
//!   lock as plain data for another process): the API.
//! - [`SharedRedlock`], [`Lease`]: one event loop thread for every thread and async task
//!   of a process (`async fn`s and blocking twins), leases it keeps alive, waiters woken
//!   when the holder releases.
//! - [`Error`] and its parts ([`Failure`], [`NodeReport`], [`Outcome`], [`NodeError`],
//!   [`ConfigError`], [`ArgumentError`], [`OsError`]): what went wrong, where.
//! - [`Limits`], [`MAX_RESOURCE`], [`MAX_TTL`], [`MAX_TOKEN`], [`INLINE_RESOURCE`]: the bounds.
//! - [`observer`] ([`Observer`], [`RoundEvent`], [`NodeEvent`]): every round's outcome,
//!   node by node, and node changes, for metrics and logs
//!   ([`Builder::observer`]).
//! - [`inspect`] ([`NodeView`]): what every node holds for a resource, for operators
//!   (`quorumlock status`); off the lock path.
//!
//! Everything else is private: `resp` (the RESP2 codec), `core` (Redlock as plain data:
//! quorum arithmetic, rounds of votes, scripts, tokens; time is passed in) and `driver`
//! (the mio event loop, the only place with I/O), and `shared` runs that same loop on a
//! thread of its own for the shared client. Benches and fuzz targets reach them
//! through a hidden module that is not part of the API and may change in any release.
//!
//! # Guarantees and their limits
//!
//! Mutual exclusion holds while the lock is valid ([`Lock::is_valid`]), assuming clocks
//! on the client and the nodes run at nearly the same rate (the drift allowance covers
//! `drift_factor × ttl + 2 ms`), and that a node that restarts without persistence stays
//! away for at least the longest ttl in use. Validity is measured on a clock that counts
//! time the machine spent suspended (`CLOCK_BOOTTIME` on Linux); a virtual machine paused
//! by its host is not seen by any clock inside it. See `docs/GUARANTEES.md` for the details.

#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]
// One module reads a clock through libc (`clock`, `CLOCK_BOOTTIME`): it alone allows
// `unsafe`; everything else is refused it.
#![deny(unsafe_code)]

mod clock;
mod config;
mod core;
mod driver;
mod error;
mod fencing;
mod from_env;
mod inspect;
mod lock;
mod lock_all;
pub mod observer;
mod redlock;
mod resp;
mod shared;
#[cfg(feature = "tls")]
mod tls;

pub use crate::core::token::MAX_TOKEN;
pub use config::{Builder, Endpoint, Settings};
pub use error::{
    ArgumentError, ConfigError, Error, Failure, LostReason, NodeError, NodeReport, OsError,
    Outcome, Phase,
};
pub use inspect::{NodeView, inspect};
pub use lock::{INLINE_RESOURCE, Lock, LockParts};
pub use observer::{
    Decision, NodeChange, NodeEvent, NodeOutcome, Nodes, Observer, Resources, RoundEvent,
};
pub use redlock::{MAX_RESOURCE, MAX_TTL, Redlock};
pub use resp::{Limits, ProtocolError};
pub use shared::{Lease, Lost, LostSignal, LostSignalFuture, NodeHealth, NodeState, SharedRedlock};

/// Internals for this crate's benches, fuzz targets and tests. Not part of the API: no
/// stability promise, may change in any release.
#[doc(hidden)]
pub mod __private {
    /// The protocol as plain data.
    pub mod core {
        /// Deliberate faults for the model checker (feature `model-faults`).
        #[cfg(feature = "model-faults")]
        pub use crate::core::faults;
        pub use crate::core::{
            budget, command, engine, notice, quorum, round, script, session, slot, token,
        };
    }
    /// The lease renewal arithmetic of the shared client.
    pub mod lease {
        pub use crate::shared::lease::{Renewal, renew_at, renewal};
    }
    /// The RESP2 codec.
    pub mod resp {
        pub use crate::resp::*;
    }
    /// The rules `Builder::from_env` and the tool share: node lists and durations.
    pub mod env {
        pub use crate::from_env::{parse_duration, split_node_list};
    }
    /// The test seam of host-name resolution: see `map_host`.
    pub mod resolver {
        pub use crate::driver::conn::{map_host, map_host_slowly, unmap_host};
    }
}

/// The README's examples, compiled as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
