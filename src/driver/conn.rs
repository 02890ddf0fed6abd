//! The sockets: one non-blocking connection per node, opened, read, written and closed
//! for the protocol engine ([`Transport`]). Nothing here decides anything about a
//! connection's life: `core::engine` and `core::session` do.
//!
//! # Invariants
//!
//! - `streams[node]` is registered with the driver's `Poll` under `Token(base + node)`, for
//!   both readiness kinds, for as long as it is `Some`; a closed one is deregistered
//!   before it is dropped, so no event of an old socket is read as one of a new one.
//! - With the `tls` feature, a `rediss://` node's stream is `Stream::Tls` (see
//!   `crate::tls` for its own invariants): `established` is true only once its TLS
//!   handshake is done, `read` and `write` carry plaintext, and `flush` writes the records
//!   a full socket left behind. Its code sits in cold functions: a plain connection pays
//!   one more match arm, never taken.
//! - A node named by a host name (`Address::Host`) is resolved each time its connection
//!   is opened, never at build time and never on the caller's or the loop's thread: a
//!   helper thread runs the blocking `getaddrinfo` (at most one in flight per node: a
//!   reopen while it runs waits for the same answer) and hands the addresses back over a
//!   channel, then closes one end of a socket pair whose other end is registered under
//!   the node's token: the hang-up is an event of the node, like a connect's. Until then the
//!   node is connecting, within the same `connect_timeout` as a TCP connect (a resolver
//!   that does not answer in time is [`NodeError::Resolve`]). Every address is tried in
//!   the resolver's order, the next on a connect failure; one whose connect timed out
//!   goes last at the next attempt. An IP literal (`Address::Tcp`) goes through none of
//!   this: its path is as it was, one match arm.

use crate::config::{Address, Endpoint, Settings};
use crate::core::engine::{Received, Transport};
use crate::error::NodeError;
use mio::net::{TcpStream, UnixStream};
use mio::{Interest, Registry, Token};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::{Mutex, mpsc};
use std::time::Instant;

enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
    /// A host name being resolved (see the module's invariants): boxed and cold, as TLS.
    Resolving(Box<Resolving>),
    /// A `rediss://` node: boxed, so the plain variants stay small, and every use of it
    /// goes through a cold function, out of the plain path's way.
    #[cfg(feature = "tls")]
    Tls(Box<crate::tls::TlsConn>),
}

impl Stream {
    fn as_source(&mut self) -> &mut dyn mio::event::Source {
        match self {
            Stream::Tcp(s) => s,
            Stream::Unix(s) => s,
            Stream::Resolving(r) => &mut r.wake,
            #[cfg(feature = "tls")]
            Stream::Tls(s) => &mut s.tcp,
        }
    }
}

/// The addresses a name resolves to, or why it resolves to none.
type Answer = io::Result<Vec<SocketAddr>>;

/// A host name being resolved on a helper thread.
struct Resolving {
    /// Registered under the node's token; its peer is closed once the answer is in
    /// `answer` (a hang-up is a readable event; nothing is written, so a client gone
    /// meanwhile costs no `SIGPIPE`).
    wake: UnixStream,
    answer: mpsc::Receiver<Answer>,
}

impl Resolving {
    /// Starts resolving `host`: the blocking lookup runs on a thread of its own.
    #[cold]
    fn start(host: String, port: u16) -> io::Result<Resolving> {
        let (wake, ring) = UnixStream::pair()?;
        let (tx, answer) = mpsc::channel();
        std::thread::Builder::new()
            .name("quorumlock-resolve".into())
            .spawn(move || {
                let _ = tx.send(resolve(&host, port));
                // The answer is in: the hang-up rings.
                drop(ring);
            })?;
        Ok(Resolving { wake, answer })
    }
}

/// A name mapped by [`map_host`]: its addresses, and how long resolving it takes.
type Mapped = (String, Vec<SocketAddr>, std::time::Duration);

/// The names mapped by [`map_host`], looked up before the system's resolver.
static MAPPED: Mutex<Vec<Mapped>> = Mutex::new(Vec::new());

/// Resolves `host` (blocking): a name mapped by [`map_host`] to its addresses, any
/// other through the system's resolver (`getaddrinfo`).
pub(crate) fn resolve(host: &str, port: u16) -> Answer {
    let mapped = MAPPED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, addrs, delay)) = mapped.iter().find(|(h, ..)| h.eq_ignore_ascii_case(host)) {
        let (addrs, delay) = (addrs.clone(), *delay);
        drop(mapped);
        std::thread::sleep(delay);
        return Ok(addrs);
    }
    drop(mapped);
    Ok((host, port).to_socket_addrs()?.collect())
}

/// **Test seam, not API**: from now on, `host` resolves to `addrs` (ports included,
/// the URL's port ignored) for every client of this process, instead of through the
/// system's resolver; an empty list makes it resolve to no address. It changes what a
/// name maps to and nothing else: the connect path (the helper thread, the wake, the
/// timeout, trying every address) is the one a real name takes. It exists so that tests
/// can move a name to another server between two connections without root (no hosts
/// file, no DNS server); use names under the reserved `.test` domain.
#[doc(hidden)]
pub fn map_host(host: &str, addrs: &[SocketAddr]) {
    map_host_slowly(host, addrs, std::time::Duration::ZERO);
}

/// **Test seam, not API**: [`map_host`], each resolution of `host` taking `delay` (a
/// slow or unreachable DNS server), on the resolver thread as a real lookup would.
#[doc(hidden)]
pub fn map_host_slowly(host: &str, addrs: &[SocketAddr], delay: std::time::Duration) {
    let mut mapped = MAPPED.lock().unwrap_or_else(|p| p.into_inner());
    mapped.retain(|(h, ..)| !h.eq_ignore_ascii_case(host));
    mapped.push((host.to_string(), addrs.to_vec(), delay));
}

/// **Test seam, not API**: undoes [`map_host`] for `host`.
#[doc(hidden)]
pub fn unmap_host(host: &str) {
    let mut mapped = MAPPED.lock().unwrap_or_else(|p| p.into_inner());
    mapped.retain(|(h, ..)| !h.eq_ignore_ascii_case(host));
}

/// What a node named by a host name needs between its connects (unused for the others).
#[derive(Default)]
struct Named {
    /// A resolution still running when its connection was closed: the next open waits
    /// for it rather than start another (no pile of threads behind a slow resolver).
    pending: Option<Box<Resolving>>,
    /// The addresses not tried yet for the connection being opened, the next last.
    rest: Vec<SocketAddr>,
    /// The address being connected to.
    current: Option<SocketAddr>,
    /// The address whose connect timed out last: tried last next time.
    timed_out: Option<SocketAddr>,
}

/// Whether a TCP connection being opened is established.
fn tcp_established(s: &TcpStream) -> Result<bool, NodeError> {
    if let Some(e) = s.take_error()? {
        return Err(e.into());
    }
    match s.peer_addr() {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Every node's socket, and the registry they are polled through.
pub(crate) struct Net {
    registry: Registry,
    endpoints: Vec<Endpoint>,
    streams: Vec<Option<Stream>>,
    /// Per node, for those named by a host name.
    named: Vec<Named>,
    /// Node `i`'s socket is registered as `Token(base + i)`: 0 for the lock connections,
    /// the number of nodes for the shared client's subscriber connections.
    base: usize,
    /// The TLS configuration, when some node is `rediss://`.
    #[cfg(feature = "tls")]
    tls: Option<crate::tls::TlsConfig>,
}

impl Net {
    pub fn new(registry: Registry, settings: &Settings) -> Net {
        let endpoints = settings.nodes.clone();
        let streams = endpoints.iter().map(|_| None).collect();
        let named = endpoints.iter().map(|_| Named::default()).collect();
        Net {
            registry,
            endpoints,
            streams,
            named,
            base: 0,
            #[cfg(feature = "tls")]
            tls: settings.tls.clone(),
        }
    }

    /// A second set of sockets to the same nodes on the same `Poll`, registered from
    /// `Token(base)` up.
    pub fn with_token_base(registry: Registry, settings: &Settings, base: usize) -> Net {
        Net {
            base,
            ..Net::new(registry, settings)
        }
    }

    /// Whether some TLS connection holds records its socket has not taken yet (see
    /// `crate::tls`): a release does not return before they are out. Always false
    /// without the `tls` feature, and without `rediss://` nodes one test.
    #[inline]
    pub fn holds_unsent(&self) -> bool {
        #[cfg(feature = "tls")]
        if self.tls.is_some() {
            return self.tls_holds_unsent();
        }
        false
    }

    #[cfg(feature = "tls")]
    #[cold]
    fn tls_holds_unsent(&self) -> bool {
        self.streams
            .iter()
            .any(|s| matches!(s, Some(Stream::Tls(t)) if t.holds_unsent()))
    }

    /// Registers `node`'s new connection and keeps it.
    fn register(&mut self, node: usize, mut stream: Stream) -> Result<(), NodeError> {
        // Both interests for the connection's whole life: edge-triggered writable events
        // only fire after a full buffer drains, so this costs nothing, and it saves an
        // epoll_ctl per short write.
        self.registry.register(
            stream.as_source(),
            Token(self.base + node),
            Interest::READABLE | Interest::WRITABLE,
        )?;
        self.streams[node] = Some(stream);
        Ok(())
    }

    /// Opens a TLS connection over a new TCP one (its handshake waits for `established`).
    #[cfg(feature = "tls")]
    #[cold]
    fn open_tls(
        &mut self,
        node: usize,
        tcp: TcpStream,
        name: rustls::pki_types::ServerName<'static>,
    ) -> Result<(), NodeError> {
        let Some(config) = &self.tls else {
            // `Settings` carries a configuration whenever a node is `rediss://`.
            return Err(NodeError::Tls("no TLS configuration".into()));
        };
        let conn = crate::tls::TlsConn::new(tcp, config.get().clone(), name)?;
        self.register(node, Stream::Tls(Box::new(conn)))
    }

    pub fn endpoints(&self) -> &[Endpoint] {
        &self.endpoints
    }

    /// Starts a TCP connection to `addr` for `node` (over TLS for a `rediss://` node).
    fn connect_tcp(&mut self, node: usize, addr: SocketAddr) -> Result<(), NodeError> {
        let s = TcpStream::connect(addr)?;
        // Lock commands are tiny and latency-bound: never let Nagle hold them.
        s.set_nodelay(true)?;
        #[cfg(feature = "tls")]
        if let Some(name) = self.endpoints[node].tls.clone() {
            return self.open_tls(node, s, name);
        }
        self.register(node, Stream::Tcp(s))
    }

    /// The host name of `node` (empty for a node given by address).
    fn host(&self, node: usize) -> &str {
        match &self.endpoints[node].addr {
            Address::Host(host, _) => host,
            _ => "",
        }
    }

    /// [`Transport::open`] of a node named by a host name: resolving starts (or the
    /// resolution still running from the last attempt is waited for again).
    #[cold]
    fn open_named(&mut self, node: usize, host: &str, port: u16) -> Result<(), NodeError> {
        let named = &mut self.named[node];
        named.rest.clear();
        named.current = None;
        let resolving = match named.pending.take() {
            Some(r) => r,
            None => Box::new(Resolving::start(host.to_string(), port).map_err(|e| {
                NodeError::Resolve {
                    host: host.to_string(),
                    error: format!("cannot start the resolver thread: {e}"),
                }
            })?),
        };
        // Registered afresh: an answer already in rings at once.
        self.register(node, Stream::Resolving(resolving))
    }

    /// [`Transport::established`] while `node`'s name is being resolved: once the
    /// answer is in, connects to its first address.
    #[cold]
    fn resolved(&mut self, node: usize) -> Result<bool, NodeError> {
        let Some(Stream::Resolving(mut r)) = self.streams[node].take() else {
            return Err(NodeError::Closed);
        };
        let answer = match r.answer.try_recv() {
            Ok(answer) => answer,
            Err(mpsc::TryRecvError::Empty) => {
                self.streams[node] = Some(Stream::Resolving(r));
                return Ok(false);
            }
            Err(mpsc::TryRecvError::Disconnected) => Err(io::Error::other(
                "the resolver thread ended without an answer",
            )),
        };
        let _ = self.registry.deregister(&mut r.wake);
        let unresolved = |error: String| NodeError::Resolve {
            host: self.host(node).to_string(),
            error,
        };
        let mut addrs = answer.map_err(|e| unresolved(e.to_string()))?;
        if addrs.is_empty() {
            return Err(unresolved("it resolves to no address".into()));
        }
        let named = &mut self.named[node];
        // The address that timed out last time goes last (stable otherwise).
        if let Some(slow) = named.timed_out.take() {
            if let Some(i) = addrs.iter().position(|a| *a == slow) {
                let a = addrs.remove(i);
                addrs.push(a);
            }
        }
        addrs.reverse();
        named.rest = addrs;
        self.connect_next(node, None)
    }

    /// Connects `node` to the next address its name resolved to, after `failed` (the
    /// error of the address tried before, if any); the last address's error once none
    /// is left, naming the host and the address.
    #[cold]
    fn connect_next(&mut self, node: usize, failed: Option<NodeError>) -> Result<bool, NodeError> {
        self.close(node);
        let mut last = failed.map(|e| (self.named[node].current, e));
        while let Some(addr) = self.named[node].rest.pop() {
            self.named[node].current = Some(addr);
            match self.connect_tcp(node, addr) {
                Ok(()) => return Ok(false),
                Err(e) => {
                    self.close(node);
                    last = Some((Some(addr), e));
                }
            }
        }
        Err(match last {
            Some((Some(addr), NodeError::Io(kind, msg))) => {
                let host = self.host(node);
                NodeError::Io(kind, format!("{msg} (at {addr}, an address of {host:?})"))
            }
            Some((_, e)) => e,
            None => NodeError::Closed,
        })
    }

    /// [`Transport::connect_timeout_error`] of a node named by a host name: a resolver
    /// that did not answer says so; an address whose connect timed out goes last next
    /// time.
    #[cold]
    fn named_timeout_error(&mut self, node: usize) -> NodeError {
        let tcp_up = match &self.streams[node] {
            Some(Stream::Resolving(_)) => {
                return NodeError::Resolve {
                    host: self.host(node).to_string(),
                    error: "no answer from the resolver within connect_timeout".into(),
                };
            }
            #[cfg(feature = "tls")]
            Some(Stream::Tls(s))
                if s.handshaking() && tcp_established(&s.tcp).is_ok_and(|up| up) =>
            {
                return NodeError::TlsNoAnswer;
            }
            Some(Stream::Tcp(s)) => tcp_established(s).is_ok_and(|up| up),
            _ => false,
        };
        if !tcp_up {
            self.named[node].timed_out = self.named[node].current;
        }
        NodeError::ConnectTimeout
    }

    /// Whether `node`'s name resolved to addresses not tried yet.
    #[inline]
    fn untried(&self, node: usize) -> bool {
        !self.named[node].rest.is_empty()
    }
}

impl Transport for Net {
    #[inline]
    fn now(&mut self) -> Instant {
        Instant::now()
    }

    fn open(&mut self, node: usize) -> Result<(), NodeError> {
        self.close(node);
        let stream = match &self.endpoints[node].addr {
            Address::Tcp(addr) => return self.connect_tcp(node, *addr),
            Address::Host(host, port) => {
                let (host, port) = (host.clone(), *port);
                return self.open_named(node, &host, port);
            }
            Address::Unix(path) => UnixStream::connect(path).map(Stream::Unix)?,
        };
        self.register(node, stream)
    }

    fn close(&mut self, node: usize) {
        if let Some(mut s) = self.streams[node].take() {
            let _ = self.registry.deregister(s.as_source());
            if let Stream::Resolving(r) = s {
                // Still resolving: the next open waits for this answer.
                if matches!(r.answer.try_recv(), Err(mpsc::TryRecvError::Empty)) {
                    self.named[node].pending = Some(r);
                }
            }
        }
    }

    fn established(&mut self, node: usize) -> Result<bool, NodeError> {
        let up = match &mut self.streams[node] {
            Some(Stream::Tcp(s)) => tcp_established(s),
            Some(Stream::Unix(s)) => match s.take_error()? {
                Some(e) => Err(e.into()),
                None => Ok(true),
            },
            Some(Stream::Resolving(_)) => return self.resolved(node),
            #[cfg(feature = "tls")]
            Some(Stream::Tls(s)) => {
                let up = tls_established(s);
                if s.tcp_up {
                    // A TLS failure, not the address's: no other address is tried.
                    return up;
                }
                up
            }
            None => Err(NodeError::Closed),
        };
        match up {
            // A named node's connect failed: its name's next address, if any.
            Err(e) if self.untried(node) => self.connect_next(node, Some(e)),
            up => up,
        }
    }

    fn flush(&mut self, node: usize) -> Result<(), NodeError> {
        match &mut self.streams[node] {
            #[cfg(feature = "tls")]
            Some(Stream::Tls(s)) => s.flush(),
            _ => Ok(()),
        }
    }

    fn connect_timeout_error(&mut self, node: usize) -> NodeError {
        if matches!(self.endpoints[node].addr, Address::Host(..)) {
            return self.named_timeout_error(node);
        }
        match &self.streams[node] {
            #[cfg(feature = "tls")]
            Some(Stream::Tls(s))
                if s.handshaking() && tcp_established(&s.tcp).is_ok_and(|up| up) =>
            {
                NodeError::TlsNoAnswer
            }
            _ => NodeError::ConnectTimeout,
        }
    }

    #[inline(always)]
    fn write(&mut self, node: usize, bytes: &[u8]) -> Result<usize, NodeError> {
        loop {
            let r = match &mut self.streams[node] {
                Some(Stream::Tcp(s)) => s.write(bytes),
                Some(Stream::Unix(s)) => s.write(bytes),
                Some(Stream::Resolving(_)) => return Ok(0),
                #[cfg(feature = "tls")]
                Some(Stream::Tls(s)) => return tls_write(s, bytes),
                None => return Err(NodeError::Closed),
            };
            match r {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(0),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }

    #[inline(always)]
    fn read(&mut self, node: usize, buf: &mut [u8]) -> Result<Received, NodeError> {
        loop {
            let r = match &mut self.streams[node] {
                Some(Stream::Tcp(s)) => s.read(buf),
                Some(Stream::Unix(s)) => s.read(buf),
                Some(Stream::Resolving(_)) => return Ok(Received::Nothing),
                #[cfg(feature = "tls")]
                Some(Stream::Tls(s)) => return tls_read(s, buf),
                None => return Err(NodeError::Closed),
            };
            return match r {
                Ok(0) => Ok(Received::Closed),
                Ok(n) => Ok(Received::Bytes(n)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(Received::Nothing),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => Err(e.into()),
            };
        }
    }
}

/// [`Transport::established`] of a TLS connection: TCP first, then the TLS handshake
/// as far as the socket allows.
#[cfg(feature = "tls")]
#[cold]
fn tls_established(s: &mut crate::tls::TlsConn) -> Result<bool, NodeError> {
    // TCP until it is up (then a reset is the handshake's: `tcp_established` would
    // report it bare, as a connect error).
    if !s.tcp_up {
        if !tcp_established(&s.tcp)? {
            return Ok(false);
        }
        s.tcp_up = true;
    }
    s.handshake()
}

#[cfg(feature = "tls")]
#[cold]
#[inline(never)]
fn tls_write(s: &mut crate::tls::TlsConn, bytes: &[u8]) -> Result<usize, NodeError> {
    s.write(bytes)
}

#[cfg(feature = "tls")]
#[cold]
#[inline(never)]
fn tls_read(s: &mut crate::tls::TlsConn, buf: &mut [u8]) -> Result<Received, NodeError> {
    Ok(match s.read(buf)? {
        None => Received::Nothing,
        Some(0) => Received::Closed,
        Some(n) => Received::Bytes(n),
    })
}
