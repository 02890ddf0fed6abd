//! Typed errors: what went wrong, in which phase, on which node.
//!
//! Lock-level failures ([`Error::Taken`], [`Error::Unavailable`], [`Error::Expired`]) carry
//! a [`Failure`] with one [`NodeReport`] per node, so a caller (or its logs) can tell a
//! contended lock from a sick cluster. Building these reports allocates; that only
//! happens on the failure path.

use crate::resp::ProtocolError;
use std::fmt;
use std::io;
use std::sync::Arc;
use std::time::Duration;

/// Everything that can go wrong with a lock operation.
///
/// # Example
///
/// ```no_run
/// use quorumlock::{Error, Redlock};
/// use std::time::Duration;
///
/// let mut rl = Redlock::builder().nodes(["redis://127.0.0.1:6379"]).build()?;
/// match rl.try_lock("jobs:nightly", Duration::from_secs(30)) {
///     Ok(lock) => println!("held for {:?}", lock.remaining()),
///     Err(Error::Taken(f)) => println!("someone else runs it: {f}"),
///     Err(e) => eprintln!("lock service trouble: {e}"),
/// }
/// # Ok::<(), Error>(())
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Error {
    /// Other clients hold the resource on so many nodes that no quorum is possible.
    Taken(Failure),
    /// Not enough nodes answered (down, frozen, slow, erroring) for a quorum.
    Unavailable(Failure),
    /// A quorum agreed too late to leave any validity, or the lock to extend had already
    /// expired (or been lost) on a majority of nodes.
    Expired(Failure),
    /// An invalid setting or node URL, found before any connection was attempted.
    Config(ConfigError),
}

impl Error {
    /// The per-operation detail, for every variant but `Config`.
    pub fn failure(&self) -> Option<&Failure> {
        match self {
            Error::Taken(f) | Error::Unavailable(f) | Error::Expired(f) => Some(f),
            Error::Config(_) => None,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Taken(x) => write!(
                f,
                "{} {:?} is held by another client: {x}",
                x.op,
                Escaped(&x.resource)
            ),
            Error::Unavailable(x) => write!(
                f,
                "{} {:?} failed: too few Redis nodes answered for a quorum of {}: {x}",
                x.op,
                Escaped(&x.resource),
                x.quorum
            ),
            Error::Expired(x) => write!(f, "{} {:?} expired: {x}", x.op, Escaped(&x.resource)),
            Error::Config(c) => write!(f, "invalid configuration: {c}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<ConfigError> for Error {
    fn from(e: ConfigError) -> Error {
        Error::Config(e)
    }
}

/// Which operation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// `lock` / `try_lock` (SET NX PX).
    Acquire,
    /// `extend` (compare-and-pexpire).
    Extend,
    /// `unlock` (compare-and-delete).
    Release,
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Phase::Acquire => "lock",
            Phase::Extend => "extend of lock",
            Phase::Release => "unlock of lock",
        })
    }
}

/// Detail of a failed lock operation.
#[derive(Debug, Clone)]
pub struct Failure {
    /// The operation.
    pub op: Phase,
    /// The resource (the Redis key).
    pub resource: Vec<u8>,
    /// Attempts made (1 + retries used).
    pub attempts: u32,
    /// Nodes needed for a majority.
    pub quorum: usize,
    /// Time the last attempt took.
    pub elapsed: Duration,
    /// What each node said in the last attempt, in configuration order.
    pub nodes: Vec<NodeReport>,
}

impl Failure {
    /// How many nodes reported `outcome`-like results, by a predicate.
    pub fn count(&self, pred: impl Fn(&Outcome) -> bool) -> usize {
        self.nodes.iter().filter(|n| pred(&n.outcome)).count()
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ok =
            self.count(|o| matches!(o, Outcome::Locked | Outcome::Released | Outcome::NotHeld));
        let held = self.count(|o| matches!(o, Outcome::Held));
        write!(
            f,
            "{ok} ok, {held} held elsewhere, {} failed of {} nodes (quorum {}) after {} attempt{} (last took {:?})",
            self.nodes.len() - ok - held,
            self.nodes.len(),
            self.quorum,
            self.attempts,
            if self.attempts == 1 { "" } else { "s" },
            self.elapsed,
        )?;
        for n in &self.nodes {
            write!(f, "; {}: {}", n.node, n.outcome)?;
        }
        Ok(())
    }
}

/// What one node did in one operation.
#[derive(Debug, Clone)]
pub struct NodeReport {
    /// The node as configured (its URL with any password hidden).
    pub node: String,
    /// Its answer.
    pub outcome: Outcome,
}

/// One node's answer for one resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Acquire or extend succeeded on this node.
    Locked,
    /// Another client's token holds the key (SET NX refused), or for extend, the key is
    /// gone or no longer ours.
    Held,
    /// Release deleted our key.
    Released,
    /// Release found no key of ours (expired, or never set there).
    NotHeld,
    /// No answer before the operation was decided (a quorum had already answered) or
    /// `node_timeout` passed.
    NoReply,
    /// The node could not take part; why.
    Failed(NodeError),
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Locked => f.write_str("locked"),
            Outcome::Held => f.write_str("held by another client"),
            Outcome::Released => f.write_str("released"),
            Outcome::NotHeld => f.write_str("not held"),
            Outcome::NoReply => f.write_str("no reply before the decision or the timeout"),
            Outcome::Failed(e) => write!(f, "{e}"),
        }
    }
}

/// Why a node could not take part in an operation.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum NodeError {
    /// A socket error (connection refused, reset, ...).
    Io(io::ErrorKind, String),
    /// The server closed the connection.
    Closed,
    /// Connecting took longer than the connect timeout.
    ConnectTimeout,
    /// The node is disconnected and waiting out its reconnect backoff.
    Down(Arc<NodeError>),
    /// The node still owes replies older than `node_timeout` (frozen or very slow), so it
    /// was not asked; it rejoins as soon as it catches up.
    Lagging,
    /// The server sent bytes that are not RESP2 or break a limit.
    Protocol(ProtocolError),
    /// A reply that does not fit the command, or one nobody asked for.
    UnexpectedReply(&'static str),
    /// The server answered with an error reply (e.g. `OOM`, `LOADING`, `READONLY`).
    Server(String),
    /// AUTH or SELECT after connecting was refused.
    Handshake(String),
    /// Too much unsent data queued for a node that does not read.
    Backlog,
}

impl fmt::Display for NodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NodeError::Io(kind, msg) => write!(f, "I/O error ({kind:?}): {msg}"),
            NodeError::Closed => f.write_str("connection closed by server"),
            NodeError::ConnectTimeout => f.write_str("connect timed out"),
            NodeError::Down(why) => write!(f, "down, reconnecting ({why})"),
            NodeError::Lagging => f.write_str("lagging: earlier replies still outstanding"),
            NodeError::Protocol(e) => write!(f, "protocol error: {e}"),
            NodeError::UnexpectedReply(what) => write!(f, "unexpected reply: {what}"),
            NodeError::Server(msg) => write!(f, "server error: {msg}"),
            NodeError::Handshake(msg) => write!(f, "AUTH/SELECT refused: {msg}"),
            NodeError::Backlog => f.write_str("write backlog over the limit"),
        }
    }
}

impl From<io::Error> for NodeError {
    fn from(e: io::Error) -> NodeError {
        NodeError::Io(e.kind(), e.to_string())
    }
}

/// An invalid setting, naming the setting and the bad value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The setting, e.g. `"nodes[2]"` or `"drift_factor"`.
    pub setting: String,
    /// The value given, as text (passwords masked).
    pub value: String,
    /// What is wrong with it.
    pub problem: String,
}

impl ConfigError {
    pub(crate) fn new(
        setting: impl Into<String>,
        value: impl Into<String>,
        problem: impl Into<String>,
    ) -> ConfigError {
        ConfigError {
            setting: setting.into(),
            value: value.into(),
            problem: problem.into(),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} = {:?}: {}", self.setting, self.value, self.problem)
    }
}

impl std::error::Error for ConfigError {}

/// Shows bytes as text, escaping anything that is not printable ASCII.
pub(crate) struct Escaped<'a>(pub &'a [u8]);

impl fmt::Debug for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{}\"", self.0.escape_ascii())
    }
}
