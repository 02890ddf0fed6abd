//! The Redlock protocol as plain data and arithmetic: no sockets, no clock of its own.
//!
//! # Overview
//!
//! - [`quorum`]: how many nodes make a majority, clock drift, lock validity.
//! - [`round`]: one round of one command on every node: replies in, an early decision
//!   out, per resource ("slot") when several resources share the round.
//! - [`command`]: the SET, release and extend commands as RESP bytes.
//! - [`script`]: the compare-and-delete and compare-and-pexpire Lua scripts.
//! - [`token`]: unique lock values.
//! - [`engine`]: the protocol of the whole client over every node's session, reaching
//!   sockets and the clock only through a `Transport` (the mio driver, or a simulation).
//! - [`notice`]: one subscriber connection's protocol state: the release notices that
//!   wake waiters, per wanted key.
//! - [`session`]: one node's protocol state without its socket: connection lifecycle,
//!   handshake, buffers, the FIFO of owed replies (`fifo`), backoff, lag.
//!
//! # Invariants
//!
//! Time comes in as `Instant` arguments; nothing here reads the system clock, touches a
//! socket or sleeps, so every edge of the algorithm is an ordinary unit test (each test
//! module takes one base instant and builds every other from it). The mio driver in
//! `crate::driver` and the simulation in `tests/sim.rs` run the engine through its
//! `Transport`.

pub mod budget;
pub mod command;
pub mod engine;
#[cfg(feature = "model-faults")]
pub mod faults;
pub(crate) mod fifo;
pub mod notice;
pub mod quorum;
pub mod round;
pub mod script;
pub mod session;
pub mod slot;
pub mod token;

/// Whether the deliberate fault `faults::Fault::$f` is switched on: with the non-default
/// feature `model-faults` a per-thread switch (see `faults`), otherwise the constant
/// `false`, so the faulty branch does not exist in normal builds.
#[cfg(feature = "model-faults")]
macro_rules! fault {
    ($f:ident) => {
        $crate::core::faults::on($crate::core::faults::Fault::$f)
    };
}
#[cfg(not(feature = "model-faults"))]
macro_rules! fault {
    ($f:ident) => {
        false
    };
}
pub(crate) use fault;
