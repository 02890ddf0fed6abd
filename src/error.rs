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
    /// expired (or been lost) on a majority of nodes; for an `unlock`, no node that
    /// answered still held the lock (it had expired, or been taken over): nothing was
    /// released, which `unlock` reports this way rather than as `Ok(0)`.
    Expired(Failure),
    /// An argument of the call is out of range (a ttl of zero, or not longer than the
    /// drift allowance, or over [`MAX_TTL`](crate::MAX_TTL); an empty resource name or
    /// one over [`MAX_RESOURCE`](crate::MAX_RESOURCE); a lock already
    /// [released](crate::Lock::is_released), passed to `unlock` or `extend` again).
    /// Nothing was sent to any node.
    InvalidArgument(ArgumentError),
    /// An invalid setting or node URL, found before any connection was attempted.
    Config(ConfigError),
    /// The operating system refused something the client needs: the random source for
    /// lock tokens, or an event queue. [`std::error::Error::source`] gives the I/O error.
    Os(OsError),
    /// A lease was lost before the work done under it finished
    /// ([`SharedRedlock::with_lease`](crate::SharedRedlock::with_lease),
    /// [`SharedRedlock::blocking_with_lease`](crate::SharedRedlock::blocking_with_lease)):
    /// from the lease's deadline on, another client may hold the resource, so the work's
    /// result must not be trusted as done under the lock.
    Lost {
        /// The resource of the lease.
        resource: Vec<u8>,
        /// Why it was lost.
        why: LostReason,
    },
}

/// Why a lease was lost: [`Error::Lost`], [`Lease::lost_reason`](crate::Lease::lost_reason),
/// [`LostSignal::reason`](crate::LostSignal::reason).
///
/// # Example
///
/// ```no_run
/// # fn f(lease: &quorumlock::Lease) {
/// use quorumlock::LostReason;
/// match lease.lost_reason() {
///     None => println!("still held"),
///     Some(LostReason::TooFewNodes { last }) => println!("nodes unreachable: {last}"),
///     Some(why) => println!("lost: {why}"),
/// }
/// # }
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum LostReason {
    /// A renewal found that a majority of nodes no longer holds the lease's token (its
    /// key expired there, was deleted, or is someone else's): `last` is that renewal's
    /// error, with each node's answer.
    TakenOver {
        /// The renewal that found it.
        last: Box<Error>,
    },
    /// The local validity deadline passed before a renewal succeeded, with enough nodes
    /// answering: renewals agreed too late, or none was decided in time. `last` is the
    /// last failed renewal's error, if one failed.
    Expired {
        /// The last failed renewal, if any.
        last: Option<Box<Error>>,
    },
    /// The local validity deadline passed while renewals failed because too few nodes
    /// answered (down, frozen, unreachable, slow): `last` is the last renewal's error,
    /// with each node's failure.
    TooFewNodes {
        /// The last failed renewal.
        last: Box<Error>,
    },
    /// The lease reached [`Builder::max_hold`](crate::Builder::max_hold) and was released.
    MaxHold,
    /// The lease was released or dropped by its holder (seen only by a
    /// [`LostSignal`](crate::LostSignal) that outlived it).
    Released,
}

impl LostReason {
    /// The error of the renewal behind the loss, if one is.
    pub fn last_error(&self) -> Option<&Error> {
        match self {
            LostReason::TakenOver { last } | LostReason::TooFewNodes { last } => Some(last),
            LostReason::Expired { last } => last.as_deref(),
            LostReason::MaxHold | LostReason::Released => None,
        }
    }
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LostReason::TakenOver { last } => write!(
                f,
                "taken over: a majority of nodes no longer holds its token ({last})"
            ),
            LostReason::Expired { last: None } => {
                f.write_str("expired: its validity deadline passed before a renewal succeeded")
            }
            LostReason::Expired { last: Some(last) } => write!(
                f,
                "expired: its validity deadline passed before a renewal succeeded (last renewal: {last})"
            ),
            LostReason::TooFewNodes { last } => write!(
                f,
                "too few nodes: its validity deadline passed while renewals failed (last renewal: {last})"
            ),
            LostReason::MaxHold => f.write_str("it reached the maximum hold (Builder::max_hold)"),
            LostReason::Released => f.write_str("it was released by its holder"),
        }
    }
}

/// A resource name in a message: as UTF-8 (bytes that are not, replaced), at most
/// `MAX_SHOWN` bytes of it, quoted.
struct Lossy<'a>(&'a [u8]);

impl fmt::Display for Lossy<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const MAX_SHOWN: usize = 200;
        let cut = self.0.len() > MAX_SHOWN;
        let text = String::from_utf8_lossy(&self.0[..self.0.len().min(MAX_SHOWN)]);
        write!(f, "{text:?}")?;
        if cut {
            write!(f, " (first {MAX_SHOWN} of {} bytes)", self.0.len())?;
        }
        Ok(())
    }
}

impl Error {
    /// The per-operation detail of `Taken`, `Unavailable` and `Expired`.
    pub fn failure(&self) -> Option<&Failure> {
        match self {
            Error::Taken(f) | Error::Unavailable(f) | Error::Expired(f) => Some(f),
            Error::InvalidArgument(_) | Error::Config(_) | Error::Os(_) | Error::Lost { .. } => {
                None
            }
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
            Error::Expired(x) => {
                write!(f, "{} {:?} failed: ", x.op, Escaped(&x.resource))?;
                f.write_str(x.expiry_reason())?;
                if x.nodes.is_empty() {
                    Ok(())
                } else {
                    write!(f, ": {x}")
                }
            }
            Error::InvalidArgument(a) => write!(f, "invalid argument: {a}"),
            Error::Config(c) => write!(f, "invalid configuration: {c}"),
            Error::Os(e) => write!(f, "{e}"),
            Error::Lost { resource, why } => {
                write!(f, "lease of {} lost: {why}", Lossy(resource))
            }
        }
    }
}

impl std::error::Error for Error {
    /// The I/O error under [`Error::Os`]; for a lock-level failure, the first node's
    /// failure (a socket error, a protocol error, ...), if any node failed.
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Os(e) => Some(e),
            Error::Config(e) => Some(e),
            Error::InvalidArgument(e) => Some(e),
            Error::Lost { why, .. } => why
                .last_error()
                .map(|e| e as &(dyn std::error::Error + 'static)),
            Error::Taken(x) | Error::Unavailable(x) | Error::Expired(x) => {
                x.nodes.iter().find_map(|n| match &n.outcome {
                    Outcome::Failed(e) => Some(e as &(dyn std::error::Error + 'static)),
                    _ => None,
                })
            }
        }
    }
}

impl From<ConfigError> for Error {
    fn from(e: ConfigError) -> Error {
        Error::Config(e)
    }
}

/// One of the lock's operations: the one name for it from the command on the wire
/// (which [`Outcome`] a node's reply means depends on it) up to the error that says which
/// operation failed.
///
/// # Example
///
/// ```
/// use quorumlock::{Outcome, Phase};
///
/// assert_eq!(Phase::Release.to_string(), "unlock of lock");
/// assert_eq!(Outcome::vote(Phase::Extend, true), Outcome::Locked);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Phase {
    /// `lock` / `try_lock` (SET NX PX).
    Acquire,
    /// `extend` (compare-and-pexpire).
    Extend,
    /// `unlock` (compare-and-delete).
    Release,
    /// The write-back of a fence after a fenced acquire (raise each node's counter to
    /// the lock's fence).
    Fence,
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Phase::Acquire => "lock",
            Phase::Extend => "extend of lock",
            Phase::Release => "unlock of lock",
            Phase::Fence => "fence write-back of lock",
        })
    }
}

/// Detail of a failed lock operation.
///
/// # Example
///
/// ```no_run
/// use quorumlock::{Error, Outcome, Redlock};
/// use std::time::Duration;
///
/// let mut rl = Redlock::builder().nodes(["redis://127.0.0.1:7001"]).build()?;
/// if let Err(Error::Unavailable(f)) = rl.try_lock("jobs:nightly", Duration::from_secs(30)) {
///     for n in &f.nodes {
///         if let Outcome::Failed(why) = &n.outcome {
///             eprintln!("{}: {why}", n.node);
///         }
///     }
/// }
/// # Ok::<(), Error>(())
/// ```
#[derive(Clone)]
#[non_exhaustive]
pub struct Failure {
    /// The operation.
    pub op: Phase,
    /// The resource (the Redis key).
    pub resource: Vec<u8>,
    /// Attempts made (1 + retries used); 0 when the lock had expired before anything
    /// was sent.
    pub attempts: u32,
    /// Nodes needed for a majority.
    pub quorum: usize,
    /// Time the last attempt took.
    pub elapsed: Duration,
    /// What each node said in the last attempt, in configuration order; empty when
    /// nothing was sent.
    pub nodes: Vec<NodeReport>,
}

impl Failure {
    /// How many nodes reported `outcome`-like results, by a predicate.
    pub fn count(&self, pred: impl Fn(&Outcome) -> bool) -> usize {
        self.nodes.iter().filter(|n| pred(&n.outcome)).count()
    }

    /// Why an [`Error::Expired`] expired, in words.
    fn expiry_reason(&self) -> &'static str {
        let still_ours = self.count(|o| matches!(o, Outcome::Locked));
        let all_said_gone = self.count(|o| matches!(o, Outcome::NotHeld)) == self.nodes.len();
        match self.op {
            _ if self.nodes.is_empty() => {
                "the lock expired before the extend (its validity had already run out; nothing was sent)"
            }
            Phase::Extend if still_ours >= self.quorum => {
                "the lock expired during the extend (a quorum agreed only after its validity had run out)"
            }
            Phase::Extend if all_said_gone => {
                "the lock expired before the extend: no node holds this token any more"
            }
            // Nodes that did not answer may still hold it, but too few did for a quorum.
            Phase::Extend if still_ours == 0 => {
                "the lock expired before the extend: no node that answered holds this token any more"
            }
            Phase::Extend => {
                "the lock expired before the extend: too few nodes still hold this token"
            }
            Phase::Release if all_said_gone => {
                "nothing to release: no node held this token any more (the lock had expired or been taken over)"
            }
            Phase::Release => {
                "nothing to release: no node that answered held this token any more (the lock had expired or been taken over)"
            }
            _ => {
                "the lock expired while it was being acquired (a quorum agreed only after the validity had run out)"
            }
        }
    }
}

impl fmt::Debug for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Failure")
            .field("op", &self.op)
            .field("resource", &Escaped(&self.resource))
            .field("attempts", &self.attempts)
            .field("quorum", &self.quorum)
            .field("elapsed", &self.elapsed)
            .field("nodes", &self.nodes)
            .finish()
    }
}

impl fmt::Display for Failure {
    /// Counts first (only the kinds that occurred), then every node's outcome.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        type Kind = (&'static str, fn(&Outcome) -> bool);
        let kinds: [Kind; 5] = [
            ("ok", |o| matches!(o, Outcome::Locked | Outcome::Released)),
            ("held by another client", |o| matches!(o, Outcome::Held)),
            ("without this token", |o| matches!(o, Outcome::NotHeld)),
            ("failed", |o| {
                matches!(o, Outcome::NoReply | Outcome::Failed(_))
            }),
            ("not needed", |o| matches!(o, Outcome::NotNeeded)),
        ];
        let mut first = true;
        for (name, pred) in kinds {
            let n = self.count(pred);
            if n > 0 || (first && name == "ok") {
                write!(f, "{}{n} {name}", if first { "" } else { ", " })?;
                first = false;
            }
        }
        write!(
            f,
            " of {} nodes (quorum {}) after {} attempt{} (last took {:?})",
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
#[non_exhaustive]
pub struct NodeReport {
    /// The node as configured (its URL with any password hidden).
    pub node: String,
    /// Its answer.
    pub outcome: Outcome,
}

/// One node's answer for one resource.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// Acquire or extend succeeded on this node.
    Locked,
    /// Another client's token holds the key (SET NX refused).
    Held,
    /// Release deleted our key.
    Released,
    /// The fence write-back raised the node's counter (or found it as high already).
    Fenced,
    /// Release or extend found no key with this lock's token (expired, deleted, taken
    /// over, or never set there).
    NotHeld,
    /// Not waited for: the operation was already decided by the other nodes' answers
    /// (a quorum agreed, or enough refused). Not a failure.
    NotNeeded,
    /// No answer within `node_timeout`.
    NoReply,
    /// The node could not take part; why.
    Failed(NodeError),
}

impl Outcome {
    /// A yes or no vote on a `phase` command, by name: yes is `Locked` (acquire, extend),
    /// `Released` or `Fenced`; no is `Held` (acquire: another token holds the key) or `NotHeld`
    /// (extend, release: the key is gone or holds another token).
    ///
    /// # Example
    ///
    /// ```
    /// use quorumlock::{Outcome, Phase};
    ///
    /// assert_eq!(Outcome::vote(Phase::Acquire, false), Outcome::Held);
    /// assert_eq!(Outcome::vote(Phase::Release, true), Outcome::Released);
    /// ```
    #[inline]
    pub fn vote(phase: Phase, yes: bool) -> Outcome {
        match (phase, yes) {
            (Phase::Release, true) => Outcome::Released,
            (Phase::Fence, true) => Outcome::Fenced,
            (_, true) => Outcome::Locked,
            (Phase::Acquire, false) => Outcome::Held,
            (_, false) => Outcome::NotHeld,
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Locked => f.write_str("locked"),
            Outcome::Held => f.write_str("held by another client"),
            Outcome::Released => f.write_str("released"),
            Outcome::Fenced => f.write_str("fence written"),
            Outcome::NotHeld => f.write_str("does not hold this token"),
            Outcome::NotNeeded => f.write_str("not needed (decided before it answered)"),
            Outcome::NoReply => f.write_str("no reply within node_timeout"),
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
    /// Connecting (TCP connect and the AUTH/SELECT/PING handshake) took longer than the
    /// connect timeout: the host is silent or unreachable.
    ConnectTimeout,
    /// Still connecting: the connection or its handshake has not completed yet (within
    /// the connect timeout).
    Connecting,
    /// The peer is not a Redis server: it sent bytes that are not RESP (shown escaped,
    /// at most 16 bytes), e.g. an HTTP or SSH server on that port.
    NotRedis(String),
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
    /// This endpoint reaches the same server as node `of`, listed earlier (a DNS alias, a
    /// port forward, a proxy): the same `run_id`, or, where one of them has none, the
    /// same marker (restart guard on). Its votes do not count, so one server never votes
    /// twice. `endpoint` names node `of` (its URL without password).
    Duplicate {
        /// The index of the node it duplicates, in configuration order.
        of: usize,
        /// That node's URL without password (empty where unknown).
        endpoint: String,
    },
    /// With a restart guard: the server at this endpoint is new to this client since less
    /// than the guard: up for less (it may have restarted empty and lost keys that are
    /// still live elsewhere), or found new (its marker missing or changed, its `run_id`
    /// other than the one this client saw there: a failover, a lost dataset), so its yes
    /// does not count yet.
    YoungerThanGuard {
        /// How long it had been up, or known, at least, when the round started.
        up_for: Duration,
    },
    /// With a restart guard: nothing identifies the node (`INFO server` gave no uptime
    /// and its marker could not be read: an ACL that forbids `INFO` and the marker's
    /// key?), so its age is unknown and its yes does not count.
    Unidentified,
    /// The server had lost the lock's script (a restart or `SCRIPT FLUSH`) and the
    /// command could not be sent again with the script itself.
    NoScript,
    /// The server runs no Lua scripts: it answered a script (a release, an extend, a
    /// fenced or multi-resource acquire) with this error, which says scripting is off
    /// (Garnet without `--lua`), `EVAL` is unknown (renamed away) or forbidden to the
    /// user (an ACL). Such a node can take a plain lock but never release or extend
    /// it: enable scripting. (Garnet also needs `--lua-transaction-mode`, or a
    /// compare-and-delete is not atomic there: see `docs/COMPATIBILITY.md`.)
    ScriptingOff(String),
    /// Too much unsent data queued for a node that does not read.
    Backlog,
    /// A `rediss://` node's TLS session failed (feature `tls`): the text says what failed
    /// and when, e.g. the server's certificate was refused (wrong CA, wrong host name),
    /// the server refused ours or wanted one, or the node answered in something that is
    /// not TLS (a plain Redis port on a `rediss://` URL).
    Tls(String),
    /// A `rediss://` node accepted the TCP connection but answered nothing to the TLS
    /// handshake within the connect timeout (feature `tls`): most likely it does not
    /// speak TLS on that port (a plain Redis port waits silently for more of what it
    /// takes for a command).
    TlsNoAnswer,
    /// The node's host name could not be resolved when its connection was opened: host
    /// names are resolved at each connect (never at build time), on a helper thread, so
    /// a name that does not resolve yet is a node down that is retried, and one whose
    /// address changed is reached at its new address at the next reconnect.
    Resolve {
        /// The host name, as written in the node's URL.
        host: String,
        /// What the resolver said (no such name, no address, no answer within the
        /// connect timeout).
        error: String,
    },
}

impl fmt::Display for NodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NodeError::Io(kind, msg) => write!(f, "I/O error ({kind:?}): {msg}"),
            NodeError::Closed => f.write_str("connection closed by server"),
            NodeError::ConnectTimeout => f.write_str("connect timed out"),
            NodeError::Connecting => {
                f.write_str("still connecting (no answer to the handshake yet)")
            }
            NodeError::NotRedis(sent) => write!(f, "not a Redis server (it sent '{sent}')"),
            NodeError::Down(why) => write!(f, "down, reconnecting ({why})"),
            NodeError::Lagging => f.write_str("lagging: earlier replies still outstanding"),
            NodeError::Protocol(e) => write!(f, "protocol error: {e}"),
            NodeError::UnexpectedReply(what) => write!(f, "unexpected reply: {what}"),
            NodeError::Server(msg) => write!(f, "server error: {msg}"),
            NodeError::Handshake(msg) => write!(f, "AUTH/SELECT refused: {msg}"),
            NodeError::Duplicate { of, endpoint } if endpoint.is_empty() => {
                write!(
                    f,
                    "same server (run_id or marker) as node {of}: its votes do not count"
                )
            }
            NodeError::Duplicate { of, endpoint } => write!(
                f,
                "same server (run_id or marker) as node {of} ({endpoint}): its votes do not count"
            ),
            NodeError::YoungerThanGuard { up_for } => write!(
                f,
                "up (or known: new marker or run_id) for only {up_for:?}, less than \
                 restart_guard: its yes does not count yet"
            ),
            NodeError::Unidentified => f.write_str(
                "neither INFO server (uptime) nor its marker identify it (an ACL without \
                 INFO, or on quorumlock:marker?): restart_guard counts no yes from it",
            ),
            NodeError::NoScript => f.write_str("the server lost the lock script (NOSCRIPT)"),
            NodeError::ScriptingOff(msg) => write!(
                f,
                "the server runs no Lua scripts ({msg}): enable scripting (Garnet: --lua \
                 --lua-transaction-mode; an ACL user needs +eval +evalsha)"
            ),
            NodeError::Backlog => f.write_str("write backlog over the limit"),
            NodeError::Tls(msg) => f.write_str(msg),
            NodeError::TlsNoAnswer => f.write_str(
                "connect timed out: the TLS handshake got no answer: does the node speak \
                 TLS on this port (rediss:// to a plain Redis port)?",
            ),
            NodeError::Resolve { host, error } => {
                write!(f, "cannot resolve host {host:?}: {error}")
            }
        }
    }
}

impl std::error::Error for NodeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            NodeError::Down(why) => Some(&**why),
            NodeError::Protocol(e) => Some(e),
            _ => None,
        }
    }
}

impl NodeError {
    /// True for the errors after which a connection's replies can no longer be matched
    /// to its commands (bytes that are not RESP, a reply that does not fit its command or
    /// that nobody asked for, a refused or garbled handshake): the connection is dropped.
    /// An error reply to a lock command (`OOM`, `NOSCRIPT`, ...) leaves it in step.
    ///
    /// # Example
    ///
    /// ```
    /// use quorumlock::NodeError;
    ///
    /// assert!(NodeError::UnexpectedReply("a reply nobody asked for").breaks_stream());
    /// assert!(!NodeError::Server("OOM command not allowed".into()).breaks_stream());
    /// ```
    pub fn breaks_stream(&self) -> bool {
        matches!(
            self,
            NodeError::Protocol(_)
                | NodeError::UnexpectedReply(_)
                | NodeError::NotRedis(_)
                | NodeError::Handshake(_)
        )
    }

    /// The error a server answered with: [`NodeError::ScriptingOff`] when it says the
    /// server runs no scripts (scripting disabled, `EVAL` unknown or forbidden), else
    /// [`NodeError::Server`].
    pub(crate) fn server(msg: &[u8]) -> NodeError {
        let text = String::from_utf8_lossy(msg).into_owned();
        let lower = text.to_ascii_lowercase();
        // Redis quotes the command as 'eval' (7) or `eval` (6.2's unknown command).
        let about_eval = lower.contains("'eval") || lower.contains("`eval");
        let off = (lower.contains("scripting") && lower.contains("disabled"))
            || (lower.starts_with("err unknown command") && about_eval)
            || (lower.starts_with("noperm") && about_eval);
        if off {
            NodeError::ScriptingOff(text)
        } else {
            NodeError::Server(text)
        }
    }

    /// [`NodeError::NotRedis`] with a preview of what the peer sent.
    pub(crate) fn not_redis(sent: &[u8]) -> NodeError {
        let shown = &sent[..sent.len().min(16)];
        let more = if sent.len() > 16 { "…" } else { "" };
        NodeError::NotRedis(format!("{}{more}", shown.escape_ascii()))
    }
}

impl From<io::Error> for NodeError {
    fn from(e: io::Error) -> NodeError {
        NodeError::Io(e.kind(), e.to_string())
    }
}

/// An invalid setting, naming the setting and the bad value.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
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

/// An out-of-range argument of a call, naming the argument and the bad value.
///
/// # Example
///
/// ```no_run
/// use quorumlock::{Error, Redlock};
/// use std::time::Duration;
///
/// let mut rl = Redlock::builder().nodes(["redis://127.0.0.1:7001"]).build()?;
/// match rl.try_lock("", Duration::from_secs(5)) {
///     Err(Error::InvalidArgument(a)) => assert_eq!(a.argument, "resource"),
///     other => panic!("{other:?}"),
/// }
/// # Ok::<(), Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ArgumentError {
    /// The argument: `"ttl"` or `"resource"`.
    pub argument: &'static str,
    /// The value given, as text (a resource by its length).
    pub value: String,
    /// What is wrong with it.
    pub problem: String,
}

impl ArgumentError {
    pub(crate) fn new(
        argument: &'static str,
        value: impl Into<String>,
        problem: impl Into<String>,
    ) -> ArgumentError {
        ArgumentError {
            argument,
            value: value.into(),
            problem: problem.into(),
        }
    }
}

impl fmt::Display for ArgumentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} = {}: {}", self.argument, self.value, self.problem)
    }
}

impl std::error::Error for ArgumentError {}

/// The operating system refused something the client needs.
///
/// # Example
///
/// ```
/// use quorumlock::Error;
///
/// fn explain(e: &Error) {
///     if let Error::Os(os) = e {
///         eprintln!("{} ({:?})", os.what(), os.io_error().kind());
///     }
/// }
/// ```
#[derive(Debug, Clone)]
pub struct OsError {
    what: &'static str,
    source: Arc<io::Error>,
}

impl OsError {
    pub(crate) fn new(what: &'static str, source: io::Error) -> OsError {
        OsError {
            what,
            source: Arc::new(source),
        }
    }

    /// What the client was doing, e.g. "reading lock tokens from /dev/urandom".
    pub fn what(&self) -> &'static str {
        self.what
    }

    /// The underlying I/O error.
    pub fn io_error(&self) -> &io::Error {
        &self.source
    }
}

impl fmt::Display for OsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.what, self.source)
    }
}

impl std::error::Error for OsError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.source)
    }
}

/// Shows bytes as text, escaping anything that is not printable ASCII.
pub(crate) struct Escaped<'a>(pub &'a [u8]);

impl fmt::Debug for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{}\"", self.0.escape_ascii())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(resource: &[u8]) -> Failure {
        Failure {
            op: Phase::Extend,
            resource: resource.to_vec(),
            attempts: 1,
            quorum: 3,
            elapsed: Duration::from_millis(100),
            nodes: Vec::new(),
        }
    }

    /// `Error::Lost` names its resource (as text, bytes that are not UTF-8 replaced, at
    /// most 200 bytes of it) and why, with the last renewal's error as its source.
    #[test]
    fn a_lost_lease_says_which_resource_and_why() {
        let last = Error::Unavailable(failure(b"jobs:\xffnightly"));
        let e = Error::Lost {
            resource: b"jobs:\xffnightly".to_vec(),
            why: LostReason::TooFewNodes {
                last: Box::new(last),
            },
        };
        let shown = e.to_string();
        assert!(
            shown.starts_with("lease of \"jobs:\u{fffd}nightly\" lost: too few nodes"),
            "{shown}"
        );
        assert!(std::error::Error::source(&e).is_some());
        assert!(e.failure().is_none());

        let long = vec![b'x'; 10_000];
        let e = Error::Lost {
            resource: long,
            why: LostReason::MaxHold,
        };
        let shown = e.to_string();
        assert!(shown.len() < 400, "{shown}");
        assert!(shown.contains("first 200 of 10000 bytes"), "{shown}");
        assert!(
            shown.ends_with("maximum hold (Builder::max_hold)"),
            "{shown}"
        );
        assert!(std::error::Error::source(&e).is_none());
    }
}
