//! A look at one resource on every node, for operators: who holds it, for how long, and
//! which server answered. Off the lock path: short-lived blocking connections, opened
//! and closed per call.
//!
//! # Invariants
//!
//! - Nothing is written but `AUTH`/`SELECT` (as the node URL says), `GET`, `PTTL` and
//!   `INFO server`: inspecting never changes a node.
//! - Every node costs at most `connect_timeout + node_timeout` (one deadline for all its
//!   replies, however the server trickles them), and its replies are read under the
//!   client's [`Limits`](crate::Limits) (`INFO` text may take 16 KiB whatever they say):
//!   a hostile or broken server costs a bounded buffer and a typed error, never a panic.
//! - Replies are parsed by the crate's own RESP2 decoder.
//! - A Unix socket is connected without a timeout (std offers none): local, it only
//!   blocks while the server's listen backlog is full. Its replies are bounded as above.

use crate::config::{Address, Endpoint, Settings};
use crate::core::session::Identity;
use crate::driver::conn::resolve;
use crate::error::NodeError;
use crate::resp::encode::command;
use crate::resp::{Limits, Reply, decode};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

/// The most `INFO server` text read, whatever the limits (it is about 1.5 KiB).
const INFO_MAX: usize = 16 * 1024;

/// What one node holds for a resource, and who the node is: one line of
/// `quorumlock status`. Made by [`inspect`] (see its example), which says which node
/// by the entry's place in its result.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NodeView {
    /// The key's value (for a lock of this crate: its token, 32 lowercase hex digits, or
    /// the caller's own); `None` when the key does not exist.
    pub value: Option<Vec<u8>>,
    /// The key's remaining time to live; `None` when it does not exist or has no expiry.
    pub pttl: Option<Duration>,
    /// The server's `run_id` (40 hex characters), when `INFO server` answered one.
    pub run_id: Option<String>,
    /// The server's `uptime_in_seconds`, when `INFO server` answered it.
    pub uptime: Option<Duration>,
}

impl std::fmt::Debug for NodeView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeView")
            // The holder's token is a credential: a prefix only, as a lock shows it.
            .field(
                "value",
                &self.value.as_deref().map(crate::core::token::Prefix),
            )
            .field("pttl", &self.pttl)
            .field("run_id", &self.run_id)
            .field("uptime", &self.uptime)
            .finish()
    }
}

/// Reads `resource` on every node of `settings`, one after the other, over a fresh
/// blocking connection each (closed before the next): `GET`, `PTTL` and `INFO server`.
/// One entry per node, in configuration order: entry `i` is `settings.nodes[i]`, whose
/// `Display` names it without its password. A node that could not be read gives the
/// crate's own [`NodeError`], as in a lock call's [`NodeReport`](crate::NodeReport). Each
/// node costs at most `connect_timeout + node_timeout` (but see the invariants for Unix
/// sockets); nothing on any node is changed.
///
/// For operators and tools (`quorumlock status`), not for deciding who holds a lock:
/// the nodes are read at different moments, and only an acquire is a decision.
///
/// # Example
///
/// ```no_run
/// let settings = quorumlock::Redlock::builder()
///     .nodes(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
///     .settings()?;
/// let views = quorumlock::inspect(&settings, b"orders:42");
/// for (node, view) in settings.nodes.iter().zip(&views) {
///     match view {
///         Ok(v) if v.value.is_some() => println!("{node}: held, pttl {:?}", v.pttl),
///         Ok(_) => println!("{node}: free"),
///         Err(e) => println!("{node}: {e}"),
///     }
/// }
/// # Ok::<(), quorumlock::ConfigError>(())
/// ```
pub fn inspect(settings: &Settings, resource: &[u8]) -> Vec<Result<NodeView, NodeError>> {
    settings
        .nodes
        .iter()
        .map(|node| view(node, settings, resource))
        .collect()
}

/// A connection of either kind.
enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
    /// A `rediss://` node: rustls over the blocking socket (the handshake runs with the
    /// first write), every socket call under what is left of the deadline.
    #[cfg(feature = "tls")]
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, Deadlined>>),
}

/// A socket whose every read and write waits at most until `deadline`: rustls reads the
/// socket as often as it takes to complete a record or the handshake, so a per-call
/// timeout alone would let a server that trickles bytes hold it for ever.
#[cfg(feature = "tls")]
struct Deadlined {
    sock: TcpStream,
    deadline: Instant,
}

#[cfg(feature = "tls")]
impl Deadlined {
    fn arm(&self) -> io::Result<()> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        self.sock.set_read_timeout(Some(left))?;
        self.sock.set_write_timeout(Some(left))
    }
}

#[cfg(feature = "tls")]
impl Read for Deadlined {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.arm()?;
        self.sock.read(buf)
    }
}

#[cfg(feature = "tls")]
impl Write for Deadlined {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.arm()?;
        self.sock.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.sock.flush()
    }
}

impl Stream {
    /// Connects to `node`; a node named by a host name at `resolved`, the addresses its
    /// name resolved to, tried in order.
    fn open(node: &Endpoint, settings: &Settings, resolved: &[SocketAddr]) -> io::Result<Stream> {
        let addrs = match &node.addr {
            Address::Tcp(addr) => std::slice::from_ref(addr),
            Address::Host(..) => resolved,
            Address::Unix(path) => return Ok(Stream::Unix(UnixStream::connect(path)?)),
        };
        let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
        for addr in addrs {
            match TcpStream::connect_timeout(addr, settings.connect_timeout) {
                Ok(s) => return Stream::over_tcp(s, node, settings),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// A connected socket, over TLS for a `rediss://` node.
    #[cfg_attr(not(feature = "tls"), allow(unused_variables))]
    fn over_tcp(s: TcpStream, node: &Endpoint, settings: &Settings) -> io::Result<Stream> {
        s.set_nodelay(true)?;
        #[cfg(feature = "tls")]
        if let (Some(name), Some(config)) = (&node.tls, &settings.tls) {
            let conn = rustls::ClientConnection::new(config.get().clone(), name.clone())
                .map_err(io::Error::other)?;
            let sock = Deadlined {
                sock: s,
                deadline: Instant::now() + settings.connect_timeout,
            };
            return Ok(Stream::Tls(Box::new(rustls::StreamOwned::new(conn, sock))));
        }
        Ok(Stream::Tcp(s))
    }

    fn set_timeouts(&mut self, t: Duration) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => {
                s.set_read_timeout(Some(t))?;
                s.set_write_timeout(Some(t))
            }
            Stream::Unix(s) => {
                s.set_read_timeout(Some(t))?;
                s.set_write_timeout(Some(t))
            }
            #[cfg(feature = "tls")]
            Stream::Tls(s) => {
                s.sock.deadline = Instant::now() + t;
                Ok(())
            }
        }
    }

    fn write_all(&mut self, buf: &[u8]) -> Result<(), NodeError> {
        match self {
            Stream::Tcp(s) => Ok(s.write_all(buf)?),
            Stream::Unix(s) => Ok(s.write_all(buf)?),
            #[cfg(feature = "tls")]
            Stream::Tls(s) => {
                let handshaking = s.conn.is_handshaking();
                s.write_all(buf)
                    .and_then(|()| s.flush())
                    .map_err(|e| tls_error(e, handshaking))
            }
        }
    }

    fn read(&mut self, buf: &mut [u8]) -> Result<usize, NodeError> {
        match self {
            Stream::Tcp(s) => read_plain(s, buf),
            Stream::Unix(s) => read_plain(s, buf),
            #[cfg(feature = "tls")]
            Stream::Tls(s) => {
                let handshaking = s.conn.is_handshaking();
                match s.read(buf) {
                    // Redis ends connections without close_notify: an end all the same.
                    Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(0),
                    Err(e) if is_timeout(&e) => Err(no_reply()),
                    r => r.map_err(|e| tls_error(e, handshaking)),
                }
            }
        }
    }
}

/// A TLS stream's error: what rustls says failed, or a timeout during the handshake
/// (the node says nothing to TLS: does it speak it?).
#[cfg(feature = "tls")]
fn tls_error(e: io::Error, handshaking: bool) -> NodeError {
    if handshaking && is_timeout(&e) {
        return NodeError::TlsNoAnswer;
    }
    crate::tls::from_io(e, handshaking)
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

fn no_reply() -> NodeError {
    NodeError::Io(
        io::ErrorKind::TimedOut,
        "no complete reply within node_timeout".into(),
    )
}

fn read_plain(s: &mut impl Read, buf: &mut [u8]) -> Result<usize, NodeError> {
    match s.read(buf) {
        Err(e) if is_timeout(&e) => Err(no_reply()),
        r => Ok(r?),
    }
}

/// The replies of one connection, read in order under one deadline.
struct Replies {
    stream: Stream,
    buf: Vec<u8>,
    /// INVARIANT: `start <= buf.len()`; `buf[start..]` is not yet parsed.
    start: usize,
    deadline: Instant,
    limits: Limits,
}

impl Replies {
    /// Reads the next reply and hands it to `f` (it borrows the buffer).
    fn next<T>(
        &mut self,
        f: impl FnOnce(Reply<'_>) -> Result<T, NodeError>,
    ) -> Result<T, NodeError> {
        loop {
            match decode(&self.buf[self.start..], &self.limits).map_err(NodeError::Protocol)? {
                Some((reply, used)) => {
                    let out = f(reply);
                    self.start += used;
                    return out;
                }
                None => self.fill()?,
            }
        }
    }

    /// Reads more bytes before the deadline.
    fn fill(&mut self) -> Result<(), NodeError> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(no_reply());
        }
        self.stream.set_timeouts(left)?;
        let mut chunk = [0u8; 4096];
        let n = match self.stream.read(&mut chunk) {
            Ok(0) => return Err(NodeError::Closed),
            Ok(n) => n,
            Err(NodeError::Io(io::ErrorKind::Interrupted, _)) => return Ok(()),
            Err(e) => return Err(e),
        };
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(())
    }
}

fn view(node: &Endpoint, settings: &Settings, resource: &[u8]) -> Result<NodeView, NodeError> {
    let started = Instant::now();
    // A host name is resolved here, on the caller's thread (`inspect` blocks anyway).
    let resolved = match &node.addr {
        Address::Host(host, port) => {
            let unresolved = |error: String| NodeError::Resolve {
                host: host.clone(),
                error,
            };
            let addrs = resolve(host, *port).map_err(|e| unresolved(e.to_string()))?;
            if addrs.is_empty() {
                return Err(unresolved("it resolves to no address".into()));
            }
            addrs
        }
        _ => Vec::new(),
    };
    let mut stream = Stream::open(node, settings, &resolved).map_err(|e| {
        if matches!(
            e.kind(),
            io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
        ) {
            NodeError::ConnectTimeout
        } else {
            NodeError::from(e)
        }
    })?;
    let deadline = started + settings.connect_timeout + settings.node_timeout;
    stream.set_timeouts(
        deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1)),
    )?;

    let mut out = Vec::new();
    if let Some(password) = &node.password {
        match &node.user {
            Some(user) => command(&mut out, &[b"AUTH", user.as_bytes(), password.as_bytes()]),
            None => command(&mut out, &[b"AUTH", password.as_bytes()]),
        }
    }
    let db = node.db.to_string();
    if node.db != 0 {
        command(&mut out, &[b"SELECT", db.as_bytes()]);
    }
    command(&mut out, &[b"GET", resource]);
    command(&mut out, &[b"PTTL", resource]);
    command(&mut out, &[b"INFO", b"server"]);
    stream.write_all(&out)?;

    let mut replies = Replies {
        stream,
        buf: Vec::new(),
        start: 0,
        deadline,
        limits: Limits {
            max_bulk_len: settings.limits.max_bulk_len.max(INFO_MAX),
            ..settings.limits
        },
    };
    let handshake = |reply: Reply<'_>| match reply {
        Reply::Simple(b"OK") => Ok(()),
        Reply::Error(e) => Err(NodeError::Handshake(e.escape_ascii().to_string())),
        _ => Err(NodeError::UnexpectedReply(
            "AUTH/SELECT answered other than OK",
        )),
    };
    if node.password.is_some() {
        replies.next(handshake)?;
    }
    if node.db != 0 {
        replies.next(handshake)?;
    }
    let value = replies.next(|reply| match reply {
        Reply::Bulk(v) => Ok(v.map(<[u8]>::to_vec)),
        Reply::Error(e) => Err(server_error(e)),
        _ => Err(NodeError::UnexpectedReply(
            "GET answered other than a bulk string",
        )),
    })?;
    let pttl = replies.next(|reply| match reply {
        Reply::Integer(ms) => Ok(u64::try_from(ms).ok().map(Duration::from_millis)),
        Reply::Error(e) => Err(server_error(e)),
        _ => Err(NodeError::UnexpectedReply(
            "PTTL answered other than an integer",
        )),
    })?;
    // An ACL may forbid INFO: the key is still shown, the server unidentified.
    let identity = replies.next(|reply| match reply {
        Reply::Bulk(Some(text)) => Ok(Identity::parse(text, Instant::now())),
        Reply::Error(_) => Ok(None),
        _ => Err(NodeError::UnexpectedReply("INFO answered other than text")),
    })?;
    Ok(NodeView {
        value,
        pttl,
        // A run_id is hex by `Identity::parse`'s check.
        run_id: identity
            .and_then(|id| id.run_id)
            .map(|id| id.escape_ascii().to_string()),
        uptime: identity.and_then(|id| id.uptime),
    })
}

fn server_error(e: &[u8]) -> NodeError {
    NodeError::Server(e.escape_ascii().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::thread;

    const RUN_ID: &str = "0123456789abcdef0123456789abcdef01234567";

    /// A one-connection server: reads the client's commands, writes `reply` in pieces of
    /// `piece` bytes (a trickle when small), then holds the connection until the client
    /// hangs up, or closes it at once when `close`.
    fn server(reply: Vec<u8>, piece: usize, close: bool) -> (Settings, thread::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let settings = crate::Redlock::builder()
            .nodes([format!("redis://{}", listener.local_addr().unwrap())])
            .node_timeout(Duration::from_millis(500))
            .settings()
            .unwrap();
        let t = thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf);
            for chunk in reply.chunks(piece) {
                if s.write_all(chunk).is_err() {
                    return;
                }
            }
            if !close {
                while matches!(s.read(&mut buf), Ok(1..)) {}
            }
        });
        (settings, t)
    }

    fn info() -> Vec<u8> {
        let text = format!("# Server\r\nrun_id:{RUN_ID}\r\nuptime_in_seconds:42\r\n");
        format!("${}\r\n{text}\r\n", text.len()).into_bytes()
    }

    fn one(reply: Vec<u8>, piece: usize, close: bool) -> Result<NodeView, NodeError> {
        let (settings, t) = server(reply, piece, close);
        let mut views = inspect(&settings, b"res");
        t.join().unwrap();
        assert_eq!(views.len(), 1);
        views.pop().unwrap()
    }

    #[test]
    fn a_held_key_read_in_pieces_of_one_byte() {
        let mut reply = b"$5\r\ntoken\r\n:5000\r\n".to_vec();
        reply.extend(info());
        let v = one(reply, 1, false).unwrap();
        assert_eq!(v.value.as_deref(), Some(&b"token"[..]));
        assert_eq!(v.pttl, Some(Duration::from_millis(5000)));
        assert_eq!(v.run_id.as_deref(), Some(RUN_ID));
        assert_eq!(v.uptime, Some(Duration::from_secs(42)));
    }

    #[test]
    fn a_missing_key_and_an_info_refused_by_an_acl() {
        let v = one(
            b"$-1\r\n:-2\r\n-NOPERM no INFO for you\r\n".to_vec(),
            64,
            false,
        )
        .unwrap();
        assert_eq!(
            (v.value, v.pttl, v.run_id, v.uptime),
            (None, None, None, None)
        );
    }

    #[test]
    fn hostile_or_broken_replies_are_typed_errors() {
        let huge = format!("${}\r\n", 1u64 << 40).into_bytes();
        type Case = (Vec<u8>, fn(&NodeError) -> bool);
        let cases: Vec<Case> = vec![
            (b"HTTP/1.1 400 Bad Request\r\n\r\n".to_vec(), |e| {
                matches!(e, NodeError::Protocol(_))
            }),
            (huge, |e| matches!(e, NodeError::Protocol(_))),
            (b":1\r\n:1\r\n".to_vec(), |e| {
                matches!(e, NodeError::UnexpectedReply(_))
            }),
            (b"$-1\r\n$1\r\nx\r\n".to_vec(), |e| {
                matches!(e, NodeError::UnexpectedReply(_))
            }),
            (
                b"-WRONGTYPE \xff\x00\r\n".to_vec(),
                |e| matches!(e, NodeError::Server(m) if m.contains("\\xff")),
            ),
            (b"$-1\r\n:-2\r\n:7\r\n".to_vec(), |e| {
                matches!(e, NodeError::UnexpectedReply(_))
            }),
        ];
        for (reply, expected) in cases {
            let shown = reply.escape_ascii().to_string();
            let e = one(reply, 64, false).unwrap_err();
            assert!(expected(&e), "{shown}: {e:?}");
        }
        // Cut short: the server closes in the middle of a reply.
        let e = one(b"$5\r\ntok".to_vec(), 64, true).unwrap_err();
        assert_eq!(e, NodeError::Closed);
    }

    #[test]
    fn a_silent_node_costs_no_more_than_its_timeouts() {
        // Never accepted, never answered: the kernel completes the connect (backlog).
        let silent = TcpListener::bind("127.0.0.1:0").unwrap();
        let settings = crate::Redlock::builder()
            .nodes([format!("redis://{}", silent.local_addr().unwrap())])
            .node_timeout(Duration::from_millis(200))
            .connect_timeout(Duration::from_millis(300))
            .settings()
            .unwrap();
        let started = Instant::now();
        let views = inspect(&settings, b"res");
        let took = started.elapsed();
        assert!(
            matches!(&views[0], Err(NodeError::Io(io::ErrorKind::TimedOut, _))),
            "{views:?}"
        );
        // The guarantee is a deadline: connect_timeout + node_timeout (500 ms), with
        // room for a loaded machine.
        assert!(took < Duration::from_secs(5), "{took:?}");
    }
}
