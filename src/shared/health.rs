//! Per-node health, as a client's engine sees it: [`NodeHealth`], made by
//! [`SharedRedlock::health`](crate::SharedRedlock::health) (on the loop thread, on
//! request) and [`Redlock::health`](crate::Redlock::health).
//!
//! # Invariants
//!
//! - A report is read from the engine's sessions in one pass, with one clock reading:
//!   no I/O, no round, nothing sent to a node; it costs the loop a few microseconds.
//! - A node's URL is shown without its password.

use crate::error::NodeError;
use std::fmt;
use std::time::Duration;

/// Where one node's connection stands.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum NodeState {
    /// Connected, handshake answered: the node takes part in rounds.
    Connected,
    /// A connection is being opened (its host name resolved, TCP connect, TLS, or the
    /// AUTH/INFO/PING handshake): it votes once it is up.
    Connecting,
    /// Connected, but it owes replies older than `node_timeout` (frozen, partitioned,
    /// overloaded): it is not waited for, and rejoins once it catches up.
    Lagging,
    /// No connection: the last one failed for this reason, and a new one is opened
    /// after a backoff.
    Down(NodeError),
}

impl fmt::Display for NodeState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NodeState::Connected => f.write_str("connected"),
            NodeState::Connecting => f.write_str("connecting"),
            NodeState::Lagging => f.write_str("lagging"),
            NodeState::Down(why) => write!(f, "down: {why}"),
        }
    }
}

/// One node's health (see [`SharedRedlock::health`](crate::SharedRedlock::health)).
///
/// # Example
///
/// ```no_run
/// use quorumlock::{NodeState, Redlock};
///
/// let shared = Redlock::builder()
///     .nodes(["redis://10.0.0.1", "redis://10.0.0.2", "redis://10.0.0.3"])
///     .build_shared()?;
/// for node in shared.blocking_health()? {
///     if let NodeState::Down(why) = &node.state {
///         eprintln!("{} is down: {why}", node.node);
///     }
/// }
/// # Ok::<(), quorumlock::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NodeHealth {
    /// The node as configured (its URL with any password hidden).
    pub node: String,
    /// Where its connection stands.
    pub state: NodeState,
    /// The last round trip measured to it: its last connection's handshake (from the
    /// handshake written to its `PONG` read). Lock rounds read no clock per reply; for
    /// per-call latencies, set an [`Observer`](crate::Observer). `None` before any
    /// handshake was answered.
    pub latency: Option<Duration>,
}

impl fmt::Display for NodeHealth {
    /// `redis://10.0.0.1:6379: connected (1.2ms)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.node, self.state)?;
        if let Some(l) = self.latency {
            write!(f, " (last round trip {l:?})")?;
        }
        Ok(())
    }
}
