//! One node's socket: connect, read, write. What the bytes mean, and every decision
//! about the connection's life, is the node's [`Session`] in `core::session`; this file
//! only moves bytes between it and the kernel.
//!
//! # Invariants
//!
//! - `stream` is `Some` exactly while the session is not `Down`, and registered with the
//!   driver's `Poll` under `token` for both readiness kinds.
//! - A failed connection is deregistered and dropped before the session forgets it, so
//!   no event of an old socket can be read as one of a new one (the `generation` tells
//!   them apart where a caller must).

use crate::config::{Address, Endpoint};
use crate::core::session::{Expect, Login, Session, State};
use crate::error::NodeError;
use crate::resp::Limits;
use mio::net::{TcpStream, UnixStream};
use mio::{Interest, Registry, Token};
use std::io::{self, Read, Write};
use std::time::{Duration, Instant};

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

pub(crate) struct NodeConn {
    pub endpoint: Endpoint,
    token: Token,
    stream: Option<Stream>,
    /// The node's protocol state.
    pub session: Session,
}

impl NodeConn {
    pub fn new(endpoint: Endpoint, index: usize, now: Instant) -> NodeConn {
        let login = Login {
            user: endpoint.user.clone(),
            password: endpoint.password.clone(),
            db: endpoint.db,
        };
        NodeConn {
            endpoint,
            token: Token(index),
            stream: None,
            session: Session::new(login, now),
        }
    }

    /// Starts a reconnect when the backoff has passed; gives up on a connect that takes
    /// too long. Never blocks.
    #[inline]
    pub fn maintain(
        &mut self,
        registry: &Registry,
        now: Instant,
        connect_timeout: Duration,
        max_backoff: Duration,
    ) {
        if self.session.wants_connect(now) {
            self.connect(registry, now, max_backoff);
        } else if self.session.connect_expired(now, connect_timeout) {
            self.fail(registry, NodeError::ConnectTimeout, now, max_backoff);
            // The next connection is sent nothing until its handshake is answered:
            // a silent host must not cost `node_timeout` at every reconnect.
            self.session.suspect = true;
        }
    }

    /// Reconnects at once, ignoring the backoff (for a connection found stale).
    pub fn reconnect_now(&mut self, registry: &Registry, now: Instant, max_backoff: Duration) {
        if self.session.state == State::Down {
            self.connect(registry, now, max_backoff);
        }
    }

    fn connect(&mut self, registry: &Registry, now: Instant, max_backoff: Duration) {
        let stream = match &self.endpoint.addr {
            Address::Tcp(addr) => TcpStream::connect(*addr).and_then(|s| {
                // Lock commands are tiny and latency-bound: never let Nagle hold them.
                s.set_nodelay(true)?;
                Ok(Stream::Tcp(s))
            }),
            Address::Unix(path) => UnixStream::connect(path).map(Stream::Unix),
        };
        let mut stream = match stream {
            Ok(s) => s,
            Err(e) => return self.fail(registry, e.into(), now, max_backoff),
        };
        // Both interests for the connection's whole life: edge-triggered writable events
        // only fire after a full buffer drains, so this costs nothing, and it saves an
        // epoll_ctl per short write.
        if let Err(e) = registry.register(
            stream.as_source(),
            self.token,
            Interest::READABLE | Interest::WRITABLE,
        ) {
            return self.fail(registry, e.into(), now, max_backoff);
        }
        self.stream = Some(stream);
        self.session.opened(now);
    }

    /// After an event on a connecting socket: `Ok(true)` once connected.
    pub fn finish_connect(&mut self, now: Instant) -> Result<bool, NodeError> {
        match &self.stream {
            Some(Stream::Tcp(s)) => {
                if let Some(e) = s.take_error()? {
                    return Err(e.into());
                }
                match s.peer_addr() {
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotConnected => return Ok(false),
                    Err(e) => return Err(e.into()),
                }
            }
            Some(Stream::Unix(s)) => {
                if let Some(e) = s.take_error()? {
                    return Err(e.into());
                }
            }
            None => return Err(NodeError::Closed),
        }
        // Nothing has been written yet, so any byte already here is one no command asked
        // for: the session refuses it.
        if self.session.has_unsent() {
            self.read(&Limits::default(), true)?;
        }
        self.session.established(now)?;
        self.flush()?;
        Ok(true)
    }

    /// Queues `count` commands, for slots `expect.slot..expect.slot + count`, and writes
    /// them at once if the connection is idle.
    #[inline(always)]
    pub fn send(&mut self, bytes: &[u8], expect: Expect, count: usize) -> Result<(), NodeError> {
        if self.session.enqueue(expect, count)? {
            let n = write_to(&mut self.stream, bytes)?;
            if n == bytes.len() {
                return Ok(());
            }
            return self.session.queue(&bytes[n..]);
        }
        self.session.queue(bytes)
    }

    /// Writes as much of the outbox as the kernel takes.
    #[inline]
    pub fn flush(&mut self) -> Result<(), NodeError> {
        while !self.session.unsent().is_empty() {
            let n = write_to(&mut self.stream, self.session.unsent())?;
            if n == 0 {
                break;
            }
            self.session.wrote(n);
        }
        Ok(())
    }

    /// Reads what the socket has. `Ok(true)` means the peer closed after what was read.
    ///
    /// A read that returns less than the free space means the socket was drained at that
    /// moment, and any later byte raises a new edge: that saves the extra `read` that
    /// would only return `WouldBlock`. A close that came with the data raises no new edge,
    /// so when the event says the peer closed (`drain`), read on to the end.
    #[inline]
    pub fn read(&mut self, limits: &Limits, drain: bool) -> Result<bool, NodeError> {
        loop {
            let buf = self.session.read_room(limits)?;
            let free = buf.len();
            let r = match &mut self.stream {
                Some(Stream::Tcp(s)) => s.read(buf),
                Some(Stream::Unix(s)) => s.read(buf),
                None => return Err(NodeError::Closed),
            };
            match r {
                Ok(0) => return Ok(true),
                Ok(n) => {
                    self.session.received(n);
                    if n < free && !drain {
                        return Ok(false);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// The hot-path read: one `recv` into the free end of the inbox. Anything unusual
    /// (no room left, a full buffer that may hold more, an interrupted call) is
    /// [`ReadFast::Slow`]: the caller goes on with [`NodeConn::read`], which picks up
    /// where this left off.
    #[inline]
    pub fn read_fast(&mut self) -> ReadFast {
        let buf = self.session.free_tail();
        let free = buf.len();
        if free == 0 {
            return ReadFast::Slow;
        }
        let r = match &mut self.stream {
            Some(Stream::Tcp(s)) => s.read(buf),
            Some(Stream::Unix(s)) => s.read(buf),
            None => return ReadFast::Slow,
        };
        match r {
            Ok(0) => ReadFast::Closed,
            Ok(n) => {
                self.session.received(n);
                // A short read drained the socket (see `read`); a full one may have left
                // more behind.
                if n < free {
                    ReadFast::Drained
                } else {
                    ReadFast::Slow
                }
            }
            Err(e) => match e.kind() {
                io::ErrorKind::WouldBlock => ReadFast::Drained,
                io::ErrorKind::Interrupted => ReadFast::Slow,
                _ => ReadFast::Failed(e),
            },
        }
    }

    /// Drops the connection and everything queued on it; reconnects after the backoff.
    pub fn fail(
        &mut self,
        registry: &Registry,
        error: NodeError,
        now: Instant,
        max_backoff: Duration,
    ) {
        if let Some(mut s) = self.stream.take() {
            let _ = registry.deregister(s.as_source());
        }
        self.session.fail(error, now, max_backoff);
    }

    /// Bytes held by the read buffer, the write buffer and the reply queue.
    pub fn buffered(&self) -> usize {
        self.session.buffered()
    }
}

/// What [`NodeConn::read_fast`] did.
pub(crate) enum ReadFast {
    /// Read what there was; the socket is drained.
    Drained,
    /// The peer closed the connection (after what was read before).
    Closed,
    /// The socket failed.
    Failed(io::Error),
    /// Not finished: continue with [`NodeConn::read`].
    Slow,
}

/// One write; `Ok(0)` when the kernel buffer is full.
#[inline]
fn write_to(stream: &mut Option<Stream>, bytes: &[u8]) -> Result<usize, NodeError> {
    loop {
        let r = match stream {
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
