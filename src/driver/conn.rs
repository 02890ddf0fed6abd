//! The sockets: one non-blocking connection per node, opened, read, written and closed
//! for the protocol engine ([`Transport`]). Nothing here decides anything about a
//! connection's life: `core::engine` and `core::session` do.
//!
//! # Invariants
//!
//! - `streams[node]` is registered with the driver's `Poll` under `Token(base + node)`, for
//!   both readiness kinds, for as long as it is `Some`; a closed one is deregistered
//!   before it is dropped, so no event of an old socket is read as one of a new one.

use crate::config::{Address, Endpoint};
use crate::core::engine::{Received, Transport};
use crate::error::NodeError;
use mio::net::{TcpStream, UnixStream};
use mio::{Interest, Registry, Token};
use std::io::{self, Read, Write};
use std::time::Instant;

enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    fn as_source(&mut self) -> &mut dyn mio::event::Source {
        match self {
            Stream::Tcp(s) => s,
            Stream::Unix(s) => s,
        }
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
}

impl Net {
    pub fn new(registry: Registry, endpoints: Vec<Endpoint>) -> Net {
        let streams = endpoints.iter().map(|_| None).collect();
        Net {
            registry,
            endpoints,
            streams,
            base: 0,
        }
    }

    /// A second set of sockets to the same nodes on the same `Poll`, registered from
    /// `Token(base)` up.
    pub fn with_token_base(registry: Registry, endpoints: Vec<Endpoint>, base: usize) -> Net {
        Net {
            base,
            ..Net::new(registry, endpoints)
        }
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
        let mut stream = match &self.endpoints[node].addr {
            Address::Tcp(addr) => TcpStream::connect(*addr).and_then(|s| {
                // Lock commands are tiny and latency-bound: never let Nagle hold them.
                s.set_nodelay(true)?;
                Ok(Stream::Tcp(s))
            })?,
            Address::Unix(path) => UnixStream::connect(path).map(Stream::Unix)?,
        };
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

    fn close(&mut self, node: usize) {
        if let Some(mut s) = self.streams[node].take() {
            let _ = self.registry.deregister(s.as_source());
        }
    }

    fn established(&mut self, node: usize) -> Result<bool, NodeError> {
        match &self.streams[node] {
            Some(Stream::Tcp(s)) => {
                if let Some(e) = s.take_error()? {
                    return Err(e.into());
                }
                match s.peer_addr() {
                    Ok(_) => Ok(true),
                    Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(false),
                    Err(e) => Err(e.into()),
                }
            }
            Some(Stream::Unix(s)) => match s.take_error()? {
                Some(e) => Err(e.into()),
                None => Ok(true),
            },
            None => Err(NodeError::Closed),
        }
    }

    #[inline(always)]
    fn write(&mut self, node: usize, bytes: &[u8]) -> Result<usize, NodeError> {
        loop {
            let r = match &mut self.streams[node] {
                Some(Stream::Tcp(s)) => s.write(bytes),
                Some(Stream::Unix(s)) => s.write(bytes),
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
