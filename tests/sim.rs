//! Deterministic simulation of the lock protocol (issue 9, section 2): the client's pure
//! core driven against simulated Redis nodes, every fault seeded.
//!
//! Built so far:
//!
//! - [`node`]: one simulated Redis 7 master, raw bytes in and out, on its own clock.
//! - [`check`]: the cross-client invariant, no two validity windows on one resource
//!   overlapping in global time.
//!
//! Each has its own unit tests; the scenarios that drive the core come next.

#[path = "sim/check.rs"]
mod check;
#[path = "sim/node.rs"]
mod node;
