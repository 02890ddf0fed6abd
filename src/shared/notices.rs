//! The loop's side connections for release notices: one subscriber connection per node,
//! opened while some waiter wants a key, each running a [`Subscriber`] (the pure state
//! machine of `core::notice`) over a socket of its own.
//!
//! A notice is a hint that lets a waiter try at once instead of at its next poll: a
//! missed one (a connection down, a node frozen) costs that waiter its poll interval,
//! never safety. So a connection that fails is closed and reopened with backoff, and
//! nothing here waits for anything.
//!
//! # Invariants
//!
//! - At most one subscriber connection per node, registered on the loop's `Poll` as
//!   `Token(nodes + node)`.
//! - A connection is opened only while the node's subscriber wants at least one key; it
//!   is kept open afterwards (a later waiter then finds it subscribed at once).
//! - A node that failed is not reconnected before its backoff has passed (doubling, up
//!   to `max_backoff`, and forgiven only once the node has answered all it was asked), so
//!   a dead or refusing node costs one connect attempt per backoff.

use crate::config::Settings;
use crate::core::engine::{Received, Transport};
use crate::core::notice::Subscriber;
use crate::core::session::Login;
use crate::driver::conn::Net;
use std::io;
use std::time::{Duration, Instant};

/// The state of one node's subscriber connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Link {
    /// No connection; the next one not before `retry_at`.
    Down {
        retry_at: Instant,
    },
    /// Connecting since then.
    Connecting {
        since: Instant,
    },
    Open,
}

/// Every node's subscriber connection.
pub(crate) struct Notices {
    net: Net,
    subs: Vec<Subscriber>,
    links: Vec<Link>,
    backoff: Vec<Duration>,
    connect_timeout: Duration,
    max_backoff: Duration,
}

impl Notices {
    pub fn new(registry: &mio::Registry, settings: &Settings, now: Instant) -> io::Result<Notices> {
        let nodes = settings.nodes.len();
        let net = Net::with_token_base(registry.try_clone()?, settings, nodes);
        let subs = settings
            .nodes
            .iter()
            .map(|e| {
                // A subscriber's votes never count: it needs no marker.
                let login = Login {
                    user: e.user.clone(),
                    password: e.password.clone(),
                    db: e.db,
                    marker: None,
                };
                Subscriber::new(&login, settings.limits)
            })
            .collect();
        Ok(Notices {
            net,
            subs,
            links: vec![Link::Down { retry_at: now }; nodes],
            backoff: vec![Duration::ZERO; nodes],
            connect_timeout: settings.connect_timeout,
            max_backoff: settings.max_backoff,
        })
    }

    /// One more waiter for `key` on every node (subscribed on the first).
    pub fn want(&mut self, key: &[u8], now: Instant) {
        for node in 0..self.subs.len() {
            if self.subs[node].want(key).is_err() {
                self.fail(node, now);
            }
        }
        self.flush_all(now);
    }

    /// One waiter fewer for `key` (unsubscribed with the last).
    pub fn unwant(&mut self, key: &[u8], now: Instant) {
        for node in 0..self.subs.len() {
            if self.subs[node].unwant(key).is_err() {
                self.fail(node, now);
            }
        }
        self.flush_all(now);
    }

    /// Opens the connections wanted and due, gives up on those that take too long.
    pub fn maintain(&mut self, now: Instant) {
        for node in 0..self.subs.len() {
            match self.links[node] {
                Link::Down { retry_at } if now >= retry_at && self.subs[node].wanted() > 0 => {
                    match self.net.open(node) {
                        Ok(()) => self.links[node] = Link::Connecting { since: now },
                        Err(_) => self.fail(node, now),
                    }
                }
                Link::Connecting { since } if now >= since + self.connect_timeout => {
                    self.fail(node, now);
                }
                _ => {}
            }
        }
    }

    /// Whether every open connection has written all it was given (an `UNSUBSCRIBE`
    /// may still wait for the socket, in the outbox or as a TLS record).
    pub fn quiet(&self) -> bool {
        (0..self.subs.len())
            .all(|node| self.links[node] != Link::Open || self.subs[node].outbox().is_empty())
            && !self.net.holds_unsent()
    }

    /// Whether some waiter wants a key (the connections then need the loop).
    pub fn any_wanted(&self) -> bool {
        self.subs.iter().any(|s| s.wanted() > 0)
    }

    /// The next moment [`Notices::maintain`] has something to do.
    pub fn next_timer(&self) -> Option<Instant> {
        (0..self.subs.len())
            .filter_map(|node| match self.links[node] {
                Link::Down { retry_at } if self.subs[node].wanted() > 0 => Some(retry_at),
                Link::Connecting { since } => Some(since + self.connect_timeout),
                _ => None,
            })
            .min()
    }

    /// Handles readiness of the nodes in `ready` (bit `i`: node `i`), calling `heard`
    /// with each node and key of a release notice.
    pub fn on_ready(&mut self, ready: u64, now: Instant, mut heard: impl FnMut(usize, &[u8])) {
        for node in 0..self.subs.len().min(64) {
            if ready & (1 << node) != 0 {
                self.on_node(node, now, &mut heard);
            }
        }
    }

    fn on_node(&mut self, node: usize, now: Instant, heard: &mut impl FnMut(usize, &[u8])) {
        if let Link::Connecting { .. } = self.links[node] {
            match self.net.established(node) {
                Ok(true) => {
                    self.subs[node].opened();
                    self.links[node] = Link::Open;
                }
                Ok(false) => return,
                Err(_) => return self.fail(node, now),
            }
        }
        if self.links[node] != Link::Open {
            return;
        }
        if self.flush(node).is_err() {
            return self.fail(node, now);
        }
        loop {
            let sub = &mut self.subs[node];
            let room = match sub.read_room() {
                Ok(room) => room,
                Err(_) => return self.fail(node, now),
            };
            let closed = match self.net.read(node, room) {
                Ok(Received::Bytes(n)) => {
                    sub.received(n);
                    false
                }
                Ok(Received::Nothing) => true,
                Ok(Received::Closed) | Err(_) => {
                    // What came before the end is still read, then the link is dropped.
                    self.drain(node, heard);
                    return self.fail(node, now);
                }
            };
            if !self.drain(node, heard) {
                return self.fail(node, now);
            }
            // The backoff is forgiven only once the node has answered everything asked
            // (AUTH, the subscriptions): one that accepts connections and then refuses
            // them is not reconnected every few milliseconds.
            if !self.subs[node].owes() {
                self.backoff[node] = Duration::ZERO;
            }
            if closed {
                return;
            }
        }
    }

    /// Hands every notice read to `heard`; false when the node broke the protocol.
    fn drain(&mut self, node: usize, heard: &mut impl FnMut(usize, &[u8])) -> bool {
        loop {
            match self.subs[node].next_notice() {
                Ok(Some(notice)) => heard(node, notice.key),
                Ok(None) => return true,
                Err(_) => return false,
            }
        }
    }

    fn flush_all(&mut self, now: Instant) {
        for node in 0..self.subs.len() {
            if self.links[node] == Link::Open && self.flush(node).is_err() {
                self.fail(node, now);
            }
        }
    }

    /// Writes what the subscriber has queued, as far as the socket takes it (the rest
    /// goes on the next writable event).
    fn flush(&mut self, node: usize) -> Result<(), crate::error::NodeError> {
        loop {
            let out = self.subs[node].outbox();
            if out.is_empty() {
                // And what the transport holds (a TLS record a full socket did not take).
                return self.net.flush(node);
            }
            let n = self.net.write(node, out)?;
            if n == 0 {
                return Ok(());
            }
            self.subs[node].consumed(n);
        }
    }

    fn fail(&mut self, node: usize, now: Instant) {
        self.net.close(node);
        self.subs[node].closed();
        let backoff = (self.backoff[node] * 2)
            .max(Duration::from_millis(10))
            .min(self.max_backoff);
        self.backoff[node] = backoff;
        self.links[node] = Link::Down {
            retry_at: now + backoff,
        };
    }
}
