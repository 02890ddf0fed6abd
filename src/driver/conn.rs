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

use crate::config::{Address, Endpoint, Settings};
use crate::core::engine::{Received, Transport};
use crate::error::NodeError;
use mio::net::{TcpStream, UnixStream};
use mio::{Interest, Registry, Token};
use std::io::{self, Read, Write};
use std::time::Instant;

enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
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
            #[cfg(feature = "tls")]
            Stream::Tls(s) => &mut s.tcp,
        }
    }
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
        Net {
            registry,
            endpoints,
            streams,
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
}

impl Transport for Net {
    #[inline]
    fn now(&mut self) -> Instant {
        Instant::now()
    }

    fn open(&mut self, node: usize) -> Result<(), NodeError> {
        self.close(node);
        let endpoint = &self.endpoints[node];
        let stream = match &endpoint.addr {
            Address::Tcp(addr) => {
                let s = TcpStream::connect(*addr)?;
                // Lock commands are tiny and latency-bound: never let Nagle hold them.
                s.set_nodelay(true)?;
                #[cfg(feature = "tls")]
                if let Some(name) = endpoint.tls.clone() {
                    return self.open_tls(node, s, name);
                }
                Stream::Tcp(s)
            }
            Address::Unix(path) => UnixStream::connect(path).map(Stream::Unix)?,
        };
        self.register(node, stream)
    }

    fn close(&mut self, node: usize) {
        if let Some(mut s) = self.streams[node].take() {
            let _ = self.registry.deregister(s.as_source());
        }
    }

    fn established(&mut self, node: usize) -> Result<bool, NodeError> {
        match &mut self.streams[node] {
            Some(Stream::Tcp(s)) => tcp_established(s),
            Some(Stream::Unix(s)) => match s.take_error()? {
                Some(e) => Err(e.into()),
                None => Ok(true),
            },
            #[cfg(feature = "tls")]
            Some(Stream::Tls(s)) => tls_established(s),
            None => Err(NodeError::Closed),
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
