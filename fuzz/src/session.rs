//! The property the `session` fuzz target checks: one node's protocol state machine
//! (`quorumlock::__private::core::session::Session`) driven by a script of connection
//! events, lock commands, server bytes and reads, beside a model of what it must do.
//!
//! Like `checks.rs`, this file compiles in two crates: the fuzz crate (`fuzz/src/lib.rs`)
//! and the main crate's `tests/fuzz_corpus.rs` (by `#[path]`), so it uses only `std` and
//! `quorumlock`. Every failed property is a panic, which libFuzzer reports as a crash.
//!
//! # Input
//!
//! `[config, op, params.., op, params.., ...]`, at most [`SESSION_MAX_OPS`] operations; a
//! missing parameter byte reads as 0. `config` picks the login (bits 0-1: none, password,
//! user and password, password; bit 2: database 5 instead of 0), the limits (bits 3-4:
//! default, [`SESSION_TIGHT`], [`SESSION_MID`], default again) and the maximum backoff
//! (bits 5-6: 0, 10 ms, 35 ms, 1 s); bit 7 allows the costly operations that fill the
//! owed queue or the outbox to its bound (at most [`SESSION_MAX_BIG`] of them). Each
//! operation is `op % 19` (see [`check_session`]).
//!
//! # The model
//!
//! Beside the session the check keeps what it must owe: every handshake status and every
//! lock command (round, slot, kind, when queued) enqueued on the *current* connection,
//! oldest first, cleared when the connection fails; the server's bytes not yet read
//! (`wire`, dropped with the connection); the read buffer's extent (`head`, `tail`, its
//! size); the unsent bytes; the backoff and retry time; the latest live write. Replies are
//! decided by an oracle written here from the protocol (a fresh `decode` of the unparsed
//! bytes, and what each reply means to the oldest owed entry), not by the session's code.

// Not every item is used by both includers.
#![allow(dead_code)]

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use quorumlock::__private::core::session::{
    Answer, Expect, Expected, Handshake, Identity, Login, Session, State, UNCOUNTED,
};
use quorumlock::__private::resp::encode;
use quorumlock::__private::resp::{Limits, ProtocolError, Reply, decode};
use quorumlock::{NodeError, Outcome, Phase};

/// Most operations run per input.
pub const SESSION_MAX_OPS: usize = 4096;

/// The session's documented bounds (`src/core/session.rs`): unsent bytes, owed replies,
/// and the first read buffer.
pub const MAX_OUTBOX: usize = 1 << 20;
pub const MAX_PENDING: usize = 1 << 16;
pub const INBOX: usize = 16 * 1024;

/// Small limits: the read buffer may not grow past its first size.
pub const SESSION_TIGHT: Limits = Limits {
    max_bulk_len: 16,
    max_array_len: 4,
    max_depth: 3,
    max_line_len: 32,
};

/// Limits under which the read buffer grows twice (16 KiB, 32 KiB, then 40,064 bytes) and
/// then refuses to grow, within a few fills.
pub const SESSION_MID: Limits = Limits {
    max_bulk_len: 40_000,
    max_array_len: 64,
    max_depth: 4,
    max_line_len: 1024,
};

/// Most operations per input that fill the owed queue or the outbox to its bound.
pub const SESSION_MAX_BIG: u32 = 2;

/// Lag cutoff and connect timeout the per-step checks use.
const NODE_TIMEOUT: Duration = Duration::from_millis(50);
const CONNECT_TIMEOUT: Duration = Duration::from_millis(100);

/// Server replies the script can send by index (`op 3`).
const TOKENS: [&[u8]; 20] = [
    b"+OK\r\n",
    b"$-1\r\n",
    b":0\r\n",
    b":1\r\n",
    b"-NOSCRIPT No matching script. Please use EVAL.\r\n",
    b"-ERR unknown command\r\n",
    b"-OOM command not allowed when used memory > 'maxmemory'.\r\n",
    b"+PONG\r\n",
    b"-WRONGPASS invalid username-password pair\r\n",
    b":2\r\n",
    b"$2\r\nOK\r\n",
    b"*2\r\n:1\r\n:0\r\n",
    b"*-1\r\n",
    b"$70\r\nrun_id:0123456789abcdef0123456789abcdef01234567\r\nuptime_in_seconds:9\r\n\r\n",
    b"HTTP/1.1 400 Bad Request\r\n",
    b"+OK\n",
    b"+O",
    b":-1\r\n",
    b"-LOADING Redis is loading the dataset in memory\r\n",
    b"\r\n",
];

/// Zeros for the outbox-filling operation (`op 17`).
static ZEROS: [u8; MAX_OUTBOX + 1] = [0; MAX_OUTBOX + 1];

/// The largest read buffer the session may hold under `limits`: one bulk string or line
/// at the limit plus framing, and never less than the first buffer.
pub fn inbox_cap(limits: &Limits) -> usize {
    limits
        .max_bulk_len
        .max(limits.max_line_len)
        .saturating_add(64)
        .max(INBOX)
}

/// The bound `Session::buffered` must stay under: the read buffer at its cap, the outbox
/// (at most `MAX_OUTBOX` bytes, its capacity at most twice that), and the owed-reply queue
/// (at most `MAX_PENDING` live entries plus as many dead ones before compaction, its
/// capacity at most twice that).
pub fn buffered_bound(limits: &Limits) -> usize {
    inbox_cap(limits) + 2 * MAX_OUTBOX + 4 * MAX_PENDING * std::mem::size_of::<Expect>()
}

struct Input<'a> {
    data: &'a [u8],
    pos: usize,
}

impl Input<'_> {
    fn byte(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }

    fn take(&mut self, n: usize) -> &[u8] {
        let start = self.pos.min(self.data.len());
        let end = (start + n).min(self.data.len());
        self.pos = start + n;
        &self.data[start..end]
    }

    fn done(&self) -> bool {
        self.pos >= self.data.len()
    }
}

/// What the session must be, step by step.
struct Model {
    limits: Limits,
    max_backoff: Duration,
    now: Instant,
    state: State,
    generation: u64,
    /// The replies owed on the current connection, oldest first.
    owed: VecDeque<Expect>,
    /// How many of `owed` are a SET or an extend.
    live_writes: usize,
    /// The read buffer: its size and the unparsed bytes' extent.
    inbox_len: usize,
    head: usize,
    tail: usize,
    /// Bytes the server sent on this connection and the session has not read:
    /// `wire[wire_off..]`.
    wire: Vec<u8>,
    wire_off: usize,
    /// Unsent bytes: `outbox[out_off..]`.
    outbox: Vec<u8>,
    out_off: usize,
    backoff: Duration,
    retry_at: Instant,
    connect_started: Instant,
    owed_until: Option<Instant>,
    extend_script_known: bool,
    suspect: bool,
    /// Who the server on this connection is (from its `INFO`).
    identity: Option<Identity>,
    /// The last round number used.
    round: u64,
    /// The handshake bytes a new connection writes first.
    handshake: Vec<u8>,
    handshake_statuses: Vec<Handshake>,
}

impl Model {
    fn unsent(&self) -> &[u8] {
        &self.outbox[self.out_off..]
    }

    fn unsent_len(&self) -> usize {
        self.outbox.len() - self.out_off
    }

    fn push(&mut self, e: Expect) {
        if matches!(
            e.kind,
            Expected::Command(Phase::Acquire | Phase::Extend)
                | Expected::Script(Phase::Acquire | Phase::Extend)
                | Expected::FencedAcquire
        ) {
            self.live_writes += 1;
        }
        self.owed.push_back(e);
    }

    fn pop(&mut self) -> Expect {
        let e = self.owed.pop_front().expect("model: nothing owed to pop");
        if matches!(
            e.kind,
            Expected::Command(Phase::Acquire | Phase::Extend)
                | Expected::Script(Phase::Acquire | Phase::Extend)
                | Expected::FencedAcquire
        ) {
            self.live_writes -= 1;
        }
        e
    }

    /// A reply of `used` bytes was consumed with its owed entry.
    fn consume(&mut self, used: usize) -> Expect {
        self.head += used;
        assert!(
            self.head <= self.tail,
            "model: consumed past the unparsed bytes"
        );
        if self.head == self.tail {
            self.head = 0;
            self.tail = 0;
        }
        self.backoff = Duration::ZERO;
        self.suspect = false;
        self.pop()
    }

    fn fail(&mut self) {
        self.state = State::Down;
        self.owed.clear();
        self.live_writes = 0;
        self.head = 0;
        self.tail = 0;
        self.wire.clear();
        self.wire_off = 0;
        self.outbox.clear();
        self.out_off = 0;
        self.owed_until = None;
        self.retry_at = self.now + self.backoff;
        self.backoff = if self.backoff.is_zero() {
            Duration::from_millis(10).min(self.max_backoff)
        } else {
            (self.backoff * 2).min(self.max_backoff)
        };
    }
}

/// What a reply means to the entry it answers, decided from the protocol alone.
#[derive(Debug)]
struct Meaning {
    answer: Option<Answer>,
    /// Bytes the reply takes (when it is consumed).
    used: usize,
    /// A handshake command answered as it must be: consumed, no answer.
    handshake: bool,
    /// For an answered `INFO`: who the server says it is (`None` when it refused).
    identity: Option<Identity>,
}

/// What the next reply in `buf` (the unparsed bytes) means, owed `front`: what
/// `next_answer` must say of it.
fn oracle(front: Option<&Expect>, buf: &[u8], limits: &Limits, now: Instant) -> Meaning {
    let none = Meaning {
        answer: None,
        used: 0,
        handshake: false,
        identity: None,
    };
    if buf.is_empty() {
        return none;
    }
    let broken = |error: NodeError, to: Option<Expect>| Meaning {
        answer: Some(Answer {
            to,
            outcome: Outcome::Failed(error),
            counter: None,
        }),
        used: 0,
        handshake: false,
        identity: None,
    };
    let Some(&expect) = front else {
        return broken(NodeError::UnexpectedReply("a reply nobody asked for"), None);
    };
    // The `INFO` text is read whatever the limits on lock replies, up to the first read
    // buffer (less a margin).
    let info_limits = Limits {
        max_bulk_len: limits.max_bulk_len.max(INBOX - 64),
        ..*limits
    };
    let limits = if expect.kind == Expected::Handshake(Handshake::Info) {
        &info_limits
    } else {
        limits
    };
    let (reply, used) = match decode(buf, limits) {
        Ok(None) => return none,
        Ok(Some(parsed)) => parsed,
        Err(ProtocolError::UnknownType(_)) if matches!(expect.kind, Expected::Handshake(_)) => {
            // The message names the bytes; `same` compares the variant only.
            return broken(NodeError::NotRedis(String::new()), None);
        }
        Err(e) => return broken(NodeError::Protocol(e), None),
    };
    let lossy = |m: &[u8]| String::from_utf8_lossy(m).into_owned();
    let outcome = match expect.kind {
        Expected::Handshake(Handshake::Info) => {
            return match reply {
                Reply::Bulk(Some(text)) => Meaning {
                    answer: None,
                    used,
                    handshake: true,
                    identity: Identity::parse(text, now),
                },
                Reply::Error(_) => Meaning {
                    answer: None,
                    used,
                    handshake: true,
                    identity: None,
                },
                _ => broken(NodeError::UnexpectedReply(""), None),
            };
        }
        Expected::Handshake(want) => {
            let text: &[u8] = match want {
                Handshake::Ok => b"OK",
                Handshake::Pong => b"PONG",
                Handshake::Info => unreachable!("INFO answers text"),
                // The model's logins carry no marker (restart guard off): never sent.
                Handshake::MarkerSet | Handshake::MarkerGet => {
                    unreachable!("no marker in the model's logins")
                }
            };
            return match reply {
                Reply::Simple(got) if got == text => Meaning {
                    answer: None,
                    used,
                    handshake: true,
                    identity: None,
                },
                Reply::Error(m) => broken(NodeError::Handshake(lossy(m)), None),
                _ => broken(NodeError::UnexpectedReply(""), None),
            };
        }
        Expected::FencedAcquire => {
            let (outcome, counter) = match reply {
                Reply::Integer(n) if (0..=(1 << 53) - 1).contains(&n) => {
                    (Outcome::Locked, Some(n as u64))
                }
                Reply::Bulk(None) => (Outcome::Held, None),
                Reply::Error(m) => (Outcome::Failed(server_error(m)), None),
                _ => return broken(NodeError::UnexpectedReply(""), Some(expect)),
            };
            return Meaning {
                answer: Some(Answer {
                    to: Some(expect),
                    outcome,
                    counter,
                }),
                used,
                handshake: false,
                identity: None,
            };
        }
        Expected::Command(phase) | Expected::Script(phase) => match (phase, reply) {
            (Phase::Acquire, Reply::Error(m)) => Outcome::Failed(server_error(m)),
            (_, Reply::Error(m)) if m.starts_with(b"NOSCRIPT") => {
                Outcome::Failed(NodeError::NoScript)
            }
            (_, Reply::Error(m)) => Outcome::Failed(server_error(m)),
            (Phase::Acquire, Reply::Simple(b"OK")) => Outcome::Locked,
            (Phase::Acquire, Reply::Bulk(None)) => Outcome::Held,
            (Phase::Extend, Reply::Integer(1)) => Outcome::Locked,
            (Phase::Release, Reply::Integer(1)) => Outcome::Released,
            (Phase::Fence, Reply::Integer(1)) => Outcome::Fenced,
            (Phase::Extend | Phase::Release | Phase::Fence, Reply::Integer(0)) => Outcome::NotHeld,
            _ => return broken(NodeError::UnexpectedReply(""), Some(expect)),
        },
    };
    Meaning {
        answer: Some(Answer {
            to: Some(expect),
            outcome,
            counter: None,
        }),
        used,
        handshake: false,
        identity: None,
    }
}

/// Whether an answer breaks the stream (the connection must be dropped).
fn breaks(answer: &Answer) -> bool {
    matches!(&answer.outcome, Outcome::Failed(e) if e.breaks_stream())
}

/// Equal answers; the wording of `NotRedis` and `UnexpectedReply` is not compared.
fn same(got: &Option<Answer>, want: &Option<Answer>) -> bool {
    match (got, want) {
        (Some(g), Some(w)) if g.to == w.to => match (&g.outcome, &w.outcome) {
            (Outcome::Failed(NodeError::NotRedis(_)), Outcome::Failed(NodeError::NotRedis(_)))
            | (
                Outcome::Failed(NodeError::UnexpectedReply(_)),
                Outcome::Failed(NodeError::UnexpectedReply(_)),
            ) => true,
            (a, b) => a == b,
        },
        _ => got == want,
    }
}

/// The reply at the front of `buf` is one of the two common forms of an answer to
/// `phase`, which `take_vote` must take.
fn common_form(phase: Phase, buf: &[u8]) -> bool {
    if phase == Phase::Acquire {
        buf.starts_with(b"+OK\r\n") || buf.starts_with(b"$-1\r\n")
    } else {
        buf.starts_with(b":1\r\n") || buf.starts_with(b":0\r\n")
    }
}

struct Harness {
    s: Session,
    m: Model,
    step: usize,
    /// Operations left that fill the owed queue or the outbox to its bound: each costs
    /// 65,536 entries or 1 MiB, so a few per input keep the target fast.
    big_left: u32,
}

impl Harness {
    fn new(config: u8) -> Harness {
        let now = Instant::now();
        let db = if config & 4 != 0 { 5 } else { 0 };
        let login = match config & 3 {
            0 => Login {
                db,
                ..Login::default()
            },
            2 => Login {
                user: Some("app".into()),
                password: Some("secret".into()),
                db,
                marker: None,
            },
            _ => Login {
                user: None,
                password: Some("pw".into()),
                db,
                marker: None,
            },
        };
        let limits = match (config >> 3) & 3 {
            1 => SESSION_TIGHT,
            2 => SESSION_MID,
            _ => Limits::default(),
        };
        let max_backoff =
            [0, 10, 35, 1000].map(Duration::from_millis)[usize::from((config >> 5) & 3)];
        // What `opened` must write and owe, in order: AUTH, SELECT, PING.
        let mut handshake = Vec::new();
        let mut handshake_statuses = Vec::new();
        if let Some(pw) = &login.password {
            match &login.user {
                Some(u) => encode::command(&mut handshake, &[b"AUTH", u.as_bytes(), pw.as_bytes()]),
                None => encode::command(&mut handshake, &[b"AUTH", pw.as_bytes()]),
            }
            handshake_statuses.push(Handshake::Ok);
        }
        if db != 0 {
            encode::command(&mut handshake, &[b"SELECT", db.to_string().as_bytes()]);
            handshake_statuses.push(Handshake::Ok);
        }
        encode::command(&mut handshake, &[b"INFO", b"server"]);
        handshake_statuses.push(Handshake::Info);
        encode::command(&mut handshake, &[b"PING"]);
        handshake_statuses.push(Handshake::Pong);
        let s = Session::new(login, now);
        let m = Model {
            limits,
            max_backoff,
            now,
            state: State::Down,
            generation: 0,
            owed: VecDeque::new(),
            live_writes: 0,
            inbox_len: INBOX,
            head: 0,
            tail: 0,
            wire: Vec::new(),
            wire_off: 0,
            outbox: Vec::new(),
            out_off: 0,
            backoff: Duration::ZERO,
            retry_at: now,
            connect_started: now,
            owed_until: None,
            extend_script_known: false,
            suspect: false,
            identity: None,
            round: 0,
            handshake,
            handshake_statuses,
        };
        Harness {
            s,
            m,
            step: 0,
            // Only in "bounds" inputs (config bit 7), so that the others stay fast.
            big_left: if config & 0x80 != 0 {
                SESSION_MAX_BIG
            } else {
                0
            },
        }
    }

    /// Everything observable about the session agrees with the model, and it is bounded.
    fn check_state(&mut self) {
        let (s, m, step) = (&mut self.s, &self.m, self.step);
        assert_eq!(s.state, m.state, "step {step}: state");
        assert_eq!(s.generation, m.generation, "step {step}: generation");
        assert_eq!(
            s.owed(),
            m.owed.len(),
            "step {step}: owed() differs from the model"
        );
        assert!(
            s.owed() <= MAX_PENDING,
            "step {step}: {} replies owed",
            s.owed()
        );
        let front = m.owed.front();
        assert_eq!(
            s.handshaking(),
            matches!(
                front,
                Some(Expect {
                    kind: Expected::Handshake(_),
                    ..
                })
            ),
            "step {step}: handshaking()"
        );
        assert_eq!(
            s.unparsed().len(),
            m.tail - m.head,
            "step {step}: unparsed bytes"
        );
        assert_eq!(s.has_input(), m.tail > m.head, "step {step}: has_input()");
        assert_eq!(
            s.has_unsent(),
            m.unsent_len() > 0,
            "step {step}: has_unsent()"
        );
        assert!(
            m.unsent_len() <= MAX_OUTBOX,
            "step {step}: outbox over its bound"
        );
        if m.state == State::Ready {
            assert_eq!(
                s.unsent().len(),
                m.unsent_len(),
                "step {step}: unsent() length"
            );
        } else {
            assert!(
                s.unsent().is_empty(),
                "step {step}: unsent() before established"
            );
        }
        assert_eq!(
            s.free_tail().len(),
            m.inbox_len - m.tail,
            "step {step}: free_tail() length"
        );
        assert!(
            m.inbox_len <= inbox_cap(&m.limits),
            "step {step}: read buffer {} past its cap {}",
            m.inbox_len,
            inbox_cap(&m.limits)
        );
        let buffered = s.buffered();
        assert!(
            buffered >= m.inbox_len && buffered <= buffered_bound(&m.limits),
            "step {step}: buffered() = {buffered}, bound {}",
            buffered_bound(&m.limits)
        );
        let now = m.now;
        assert_eq!(
            s.wants_connect(now),
            m.state == State::Down && now >= m.retry_at,
            "step {step}: wants_connect()"
        );
        let cutoff = now.checked_sub(NODE_TIMEOUT);
        assert_eq!(
            s.is_lagging(cutoff),
            matches!((front, cutoff), (Some(e), Some(c)) if e.sent_at < c),
            "step {step}: is_lagging()"
        );
        assert!(!s.is_lagging(None), "step {step}: lagging without a cutoff");
        let live = m.owed_until.is_some_and(|u| now < u) && m.live_writes > 0;
        assert_eq!(
            s.holds_live_write(now),
            live,
            "step {step}: holds_live_write()"
        );
        let connecting = m.state == State::Connecting
            || matches!(
                front,
                Some(Expect {
                    kind: Expected::Handshake(_),
                    ..
                })
            );
        // A live lock write keeps a handshaking connection (the write may be applied
        // once it goes out), but not one still in TCP connect (or its TLS handshake):
        // nothing of its outbox has left the process.
        let expired = connecting
            && m.state != State::Down
            && now.saturating_duration_since(m.connect_started) > CONNECT_TIMEOUT
            && (m.state == State::Connecting || !live);
        assert_eq!(
            s.connect_expired(now, CONNECT_TIMEOUT),
            expired,
            "step {step}: connect_expired()"
        );
        assert_eq!(
            s.extend_script_known, m.extend_script_known,
            "step {step}: extend_script_known"
        );
        assert_eq!(s.identity, m.identity, "step {step}: identity");
        // How far behind the node is, in rounds, seen from the current round and the next.
        for round in [m.round, m.round + 1] {
            let behind = match front {
                Some(e) if e.sent_in() != 0 => round.saturating_sub(e.sent_in()),
                _ => 0,
            };
            assert_eq!(
                s.rounds_behind(round),
                behind,
                "step {step}: rounds_behind({round})"
            );
        }
        assert_eq!(s.suspect, m.suspect, "step {step}: suspect");
    }

    fn fail(&mut self, error: NodeError) {
        self.s.fail(error, self.m.now, self.m.max_backoff);
        self.m.fail();
    }

    /// A new connection, once the backoff has passed (time moves on to it if needed).
    fn open(&mut self) {
        if self.m.state != State::Down {
            return;
        }
        if self.m.now < self.m.retry_at {
            assert!(
                !self.s.wants_connect(self.m.now),
                "step {}: wants_connect() during the backoff",
                self.step
            );
            self.m.now = self.m.retry_at;
        }
        assert!(
            self.s.wants_connect(self.m.now),
            "step {}: no wants_connect() after the backoff",
            self.step
        );
        self.s.opened(self.m.now);
        let m = &mut self.m;
        m.generation += 1;
        m.extend_script_known = false;
        m.identity = None;
        m.state = State::Connecting;
        m.connect_started = m.now;
        m.wire.clear();
        m.wire_off = 0;
        m.outbox.extend_from_slice(&m.handshake);
        for i in 0..m.handshake_statuses.len() {
            let status = m.handshake_statuses[i];
            let e = Expect {
                round: UNCOUNTED,
                slot: 0,
                kind: Expected::Handshake(status),
                sent_at: m.now,
            };
            m.push(e);
        }
    }

    fn establish(&mut self) {
        if self.m.state != State::Connecting {
            return;
        }
        let now = self.m.now;
        match self.s.established(now) {
            Ok(()) => {
                assert_eq!(
                    self.m.head, self.m.tail,
                    "step {}: established with bytes unasked for",
                    self.step
                );
                self.m.state = State::Ready;
                for e in self.m.owed.iter_mut() {
                    e.sent_at = now;
                }
                // The handshake goes first, then whatever was queued while connecting.
                assert_eq!(
                    self.s.unsent(),
                    self.m.unsent(),
                    "step {}: bytes to write once established",
                    self.step
                );
                assert!(
                    self.s.unsent().starts_with(&self.m.handshake),
                    "step {}: the handshake is not first",
                    self.step
                );
            }
            Err(e) => {
                assert!(
                    self.m.tail > self.m.head,
                    "step {}: established refused: {e:?}",
                    self.step
                );
                assert!(
                    matches!(e, NodeError::NotRedis(_)),
                    "step {}: established: {e:?}",
                    self.step
                );
                self.fail(e);
            }
        }
    }

    /// Queues `bytes` for `expect` (`count` slots) as the driver's `send` does: written at
    /// once (the first `direct` bytes of them, say) when the line is idle, queued
    /// otherwise; a backlog fails the connection.
    fn send(&mut self, expect: Expect, count: usize, bytes: &[u8], direct: usize) {
        if self.m.state == State::Down {
            return;
        }
        let step = self.step;
        let (owed, buffered) = (self.s.owed(), self.s.buffered());
        match self.s.enqueue(expect, count) {
            Err(e) => {
                assert_eq!(e, NodeError::Backlog, "step {step}: enqueue");
                assert!(
                    self.m.owed.len() + count > MAX_PENDING,
                    "step {step}: enqueue refused {count} more after {owed}"
                );
                assert_eq!(
                    (self.s.owed(), self.s.buffered()),
                    (owed, buffered),
                    "step {step}: a refused enqueue changed the session"
                );
                self.fail(e);
            }
            Ok(idle) => {
                assert!(
                    self.m.owed.len() + count <= MAX_PENDING,
                    "step {step}: enqueue took {count} more after {owed}"
                );
                assert_eq!(
                    idle,
                    self.m.state == State::Ready && self.m.unsent_len() == 0,
                    "step {step}: enqueue's idle answer"
                );
                if matches!(
                    expect.kind,
                    Expected::Command(Phase::Acquire | Phase::Extend)
                        | Expected::Script(Phase::Acquire | Phase::Extend)
                        | Expected::FencedAcquire
                ) {
                    self.m.live_writes += count;
                }
                let slots = expect.slot..expect.slot + count as u32;
                self.m
                    .owed
                    .extend(slots.map(|slot| Expect { slot, ..expect }));
                let written = if idle { direct.min(bytes.len()) } else { 0 };
                if written < bytes.len() {
                    self.queue(&bytes[written..]);
                }
            }
        }
    }

    fn queue(&mut self, rest: &[u8]) {
        let step = self.step;
        let buffered = self.s.buffered();
        match self.s.queue(rest) {
            Ok(()) => {
                assert!(
                    self.m.unsent_len() + rest.len() <= MAX_OUTBOX,
                    "step {step}: queue took {} bytes past the bound",
                    rest.len()
                );
                self.m.outbox.extend_from_slice(rest);
            }
            Err(e) => {
                assert_eq!(e, NodeError::Backlog, "step {step}: queue");
                assert!(
                    self.m.unsent_len() + rest.len() > MAX_OUTBOX,
                    "step {step}: queue refused {} bytes",
                    rest.len()
                );
                assert_eq!(
                    self.s.buffered(),
                    buffered,
                    "step {step}: a refused queue grew the session"
                );
                self.fail(e);
            }
        }
    }

    fn enqueue(&mut self, inp: &mut Input<'_>) {
        let (k, c, d) = (inp.byte(), inp.byte(), inp.byte());
        let kind = [
            Expected::Command(Phase::Acquire),
            Expected::Command(Phase::Extend),
            Expected::Command(Phase::Release),
            Expected::FencedAcquire,
            Expected::Script(Phase::Acquire),
            Expected::Script(Phase::Release),
            Expected::Script(Phase::Fence),
        ][usize::from(k % 7)];
        // Bit 2: the same round again (a resend); bit 3: counted by no round
        // (fire-and-forget cleanup, tagged with the round in progress).
        if k & 4 == 0 || self.m.round == 0 {
            self.m.round += 1;
        }
        let round = self.m.round;
        let counted = k & 8 == 0;
        let room = MAX_PENDING.saturating_sub(self.m.owed.len());
        let count = match c {
            254 if self.big_left > 0 && room > 8 => {
                self.big_left -= 1;
                room
            }
            255 => room + 1,
            _ => usize::from(c % 8) + 1,
        };
        let slot = u32::from(k >> 4);
        let mut bytes = Vec::new();
        encode::command(
            &mut bytes,
            &[
                b"LOCK",
                round.to_string().as_bytes(),
                slot.to_string().as_bytes(),
                count.to_string().as_bytes(),
            ],
        );
        let expect = Expect {
            round: if counted { round } else { round | UNCOUNTED },
            slot,
            kind,
            sent_at: self.m.now,
        };
        self.send(expect, count, &bytes, usize::from(d));
    }

    /// Moves up to `max` bytes of the wire into `room` and reports them.
    fn deliver(&mut self, fast: bool, max: usize) -> Result<usize, NodeError> {
        let step = self.step;
        let room = if fast {
            self.s.free_tail()
        } else {
            let m = &mut self.m;
            let full = m.tail == m.inbox_len;
            let compacts = full && m.head > 0;
            match self.s.read_room(&m.limits) {
                Err(e) => {
                    assert!(
                        full && m.head == 0,
                        "step {step}: read_room refused with room to make"
                    );
                    assert!(
                        m.inbox_len >= inbox_cap(&m.limits),
                        "step {step}: read_room refused to grow {} < {}",
                        m.inbox_len,
                        inbox_cap(&m.limits)
                    );
                    assert_eq!(
                        e,
                        NodeError::Protocol(ProtocolError::BulkTooLong),
                        "step {step}: read_room"
                    );
                    return Err(e);
                }
                Ok(room) => {
                    if compacts {
                        m.tail -= m.head;
                        m.head = 0;
                    }
                    let len = m.tail + room.len();
                    assert!(!room.is_empty(), "step {step}: read_room gave no room");
                    if compacts || !full {
                        assert_eq!(
                            len, m.inbox_len,
                            "step {step}: read_room resized the buffer needlessly"
                        );
                    } else {
                        assert!(
                            len > m.inbox_len && len <= inbox_cap(&m.limits),
                            "step {step}: read_room grew {} to {len}",
                            m.inbox_len
                        );
                    }
                    m.inbox_len = len;
                    room
                }
            }
        };
        let m = &mut self.m;
        let n = max.min(room.len()).min(m.wire.len() - m.wire_off);
        room[..n].copy_from_slice(&m.wire[m.wire_off..m.wire_off + n]);
        m.wire_off += n;
        if m.wire_off == m.wire.len() {
            m.wire.clear();
            m.wire_off = 0;
        }
        self.s.received(n);
        self.m.tail += n;
        Ok(n)
    }

    fn read(&mut self, fast: bool, max: usize) {
        if self.m.state == State::Down {
            return;
        }
        if let Err(e) = self.deliver(fast, max) {
            self.fail(e);
        }
    }

    /// Reads as the driver's `read` does: until the wire is empty, making room as needed.
    fn read_all(&mut self) {
        if self.m.state == State::Down {
            return;
        }
        while self.m.wire_off < self.m.wire.len() {
            match self.deliver(false, usize::MAX) {
                Ok(_) => {}
                Err(e) => return self.fail(e),
            }
        }
    }

    /// The hot path: every vote must be the oldest owed command's, and what `next_answer`
    /// would have said. True when a vote was taken.
    fn take_vote(&mut self) -> bool {
        let step = self.step;
        let front = self.m.owed.front().copied();
        let meaning = oracle(
            front.as_ref(),
            self.s.unparsed(),
            &self.m.limits,
            self.m.now,
        );
        let must = matches!(front, Some(Expect { kind: Expected::Command(kind), .. }) if common_form(kind, self.s.unparsed()));
        let before = (self.s.owed(), self.s.unparsed().len());
        match self.s.take_vote() {
            None => {
                assert!(
                    !must,
                    "step {step}: take_vote() left a common vote to the slow path"
                );
                assert_eq!(
                    (self.s.owed(), self.s.unparsed().len()),
                    before,
                    "step {step}: take_vote() consumed without a vote"
                );
                false
            }
            Some((round, slot, yes)) => {
                let phase = match front {
                    Some(Expect {
                        kind: Expected::Command(phase),
                        ..
                    }) => phase,
                    _ => panic!("step {step}: take_vote() = {round}/{slot} owed {front:?}"),
                };
                let got = Some(Answer {
                    // A reply no round counts keeps its tag (`UNCOUNTED`): no round id.
                    to: front.filter(|e| (e.round, e.slot) == (round, slot)),
                    outcome: Outcome::vote(phase, yes),
                    counter: None,
                });
                assert!(
                    same(&got, &meaning.answer),
                    "step {step}: take_vote() = {got:?}, owed {front:?}, the reply means {:?}",
                    meaning.answer
                );
                // The engine marks the node answered once per batch of votes; here,
                // a batch of one.
                self.s.answered();
                let e = self.m.consume(meaning.used);
                if e.kind == Expected::Command(Phase::Extend) {
                    self.m.extend_script_known = true;
                }
                true
            }
        }
    }

    /// The general path. Returns false when there was nothing to answer or the connection
    /// failed.
    fn next_answer(&mut self, resend: bool) -> bool {
        let step = self.step;
        // A handshake answered as it must be is consumed on the way to the next reply.
        let mut offset = 0;
        let (front, meaning) = loop {
            let front = self.m.owed.front().copied();
            let unparsed = &self.s.unparsed()[offset..];
            let meaning = oracle(front.as_ref(), unparsed, &self.m.limits, self.m.now);
            if !meaning.handshake {
                break (front, meaning);
            }
            if front.is_some_and(|e| e.kind == Expected::Handshake(Handshake::Info)) {
                self.m.identity = meaning.identity;
            }
            offset += meaning.used;
            self.m.consume(meaning.used);
        };
        let got = self.s.next_answer(&self.m.limits, self.m.now);
        assert!(
            same(&got, &meaning.answer),
            "step {step}: next_answer() = {got:?}, owed {front:?}, the reply means {:?}",
            meaning.answer
        );
        match got {
            None => false,
            Some(answer) if breaks(&answer) => {
                // Nothing consumed: asked again, the same; the hot path takes nothing.
                assert_eq!(
                    self.s.owed(),
                    self.m.owed.len(),
                    "step {step}: a broken stream consumed"
                );
                assert_eq!(
                    self.s.unparsed().len(),
                    self.m.tail - self.m.head,
                    "step {step}: a broken stream consumed"
                );
                assert_eq!(
                    self.s.take_vote(),
                    None,
                    "step {step}: take_vote() after a broken stream"
                );
                let again = self.s.next_answer(&self.m.limits, self.m.now);
                assert!(
                    same(&again, &Some(answer.clone())),
                    "step {step}: next_answer() after a broken stream: {again:?}"
                );
                let Outcome::Failed(error) = answer.outcome else {
                    unreachable!("breaks() holds only for failures")
                };
                // As the driver does: drop the connection, and with it everything owed.
                self.fail(error);
                false
            }
            Some(answer) => {
                let e = self.m.consume(meaning.used);
                if !matches!(answer.outcome, Outcome::Failed(_))
                    && e.kind == Expected::Command(Phase::Extend)
                {
                    self.m.extend_script_known = true;
                }
                if let (
                    Answer {
                        to: Some(expect),
                        outcome: Outcome::Failed(NodeError::NoScript),
                        ..
                    },
                    true,
                ) = (answer, resend)
                {
                    // The driver sends the script again as EVAL, owed by the same entry.
                    let mut bytes = Vec::new();
                    encode::command(
                        &mut bytes,
                        &[b"EVAL", b"script", expect.slot.to_string().as_bytes()],
                    );
                    self.send(expect, 1, &bytes, usize::MAX);
                }
                true
            }
        }
    }

    /// What the driver does with a node's input: the hot path while it can, then the
    /// general path, until nothing is left or the connection failed.
    fn drain(&mut self, resend: bool) {
        for _ in 0..=self.m.owed.len() + 1 {
            while self.take_vote() {}
            if !self.s.has_input() || !self.next_answer(resend) {
                return;
            }
        }
    }

    fn peek(&mut self, consume: bool) {
        let step = self.step;
        let buf = self.s.unparsed().to_vec();
        let want = if buf.is_empty() {
            Ok(None)
        } else {
            decode(&buf, &self.m.limits)
        };
        let got = self.s.peek(&self.m.limits);
        assert_eq!(got, want, "step {step}: peek() on {buf:?}");
        if let (Ok(Some((_, used))), true) = (got, consume && !self.m.owed.is_empty()) {
            self.s.consume(used);
            self.m.consume(used);
        }
    }

    fn write(&mut self, n: u8) {
        if self.m.state != State::Ready {
            return;
        }
        let len = self.m.unsent_len();
        let n = if n == 255 {
            len
        } else {
            usize::from(n).min(len)
        };
        assert_eq!(
            &self.s.unsent()[..n],
            &self.m.unsent()[..n],
            "step {}: unsent() bytes",
            self.step
        );
        self.s.wrote(n);
        self.m.out_off += n;
        if self.m.out_off == self.m.outbox.len() {
            self.m.outbox.clear();
            self.m.out_off = 0;
        }
    }
}

/// `session`: a script of operations on one `Session` (see the module documentation for
/// the input layout), with every step checked against the model:
///
/// - nothing panics;
/// - every `Vote`, `Refused`, `NoScript` and `Broken { failed: Some(..) }` names the
///   oldest owed entry of the current connection, and only a lock command's; a handshake
///   status is only ever `Handshake` or `Broken { failed: None }`; `next_answer` and
///   `take_vote` answer exactly as the oracle (a fresh `decode` and the protocol's table
///   of what each reply means), and consume exactly the reply's bytes; `take_vote` takes
///   every common vote (`+OK`/`$-1` to a SET, `:1`/`:0` to a script) and nothing else;
/// - after `Broken` nothing is consumed, asking again gives the same answer and
///   `take_vote` nothing; the connection is then failed, and nothing owed before is
///   answered again (the model's queue starts empty on the next connection);
/// - `owed()` is the model's count; `enqueue` and `queue` past `MAX_PENDING` entries or
///   `MAX_OUTBOX` bytes refuse with `Backlog` and change nothing; the read buffer is
///   compacted when it is full behind consumed bytes, grows only when unparsed bytes fill
///   it from its start, never past [`inbox_cap`], and `read_room` refuses (`BulkTooLong`)
///   only at the cap; `buffered()` stays under [`buffered_bound`];
/// - `wants_connect`, `is_lagging`, `holds_live_write`, `connect_expired`, `handshaking`,
///   `has_input`, `has_unsent`, `unsent`, `free_tail`, `rounds_behind`,
///   `extend_script_known` and `suspect`
///   agree with the model, and the handshake is written first on every connection.
///
/// Operations (`op % 19`, then their parameter bytes): 0 open (after the backoff);
/// 1 established; 2 enqueue `[kind/round/slot, count, direct]`; 3 a server reply from a
/// small alphabet `[token and repeats]`; 4 raw server bytes `[n, n bytes]`; 5 a run of one
/// byte `[byte, n × 256]`; 6 read through `read_room` `[max]`; 7 read into `free_tail`
/// `[max]`; 8 read everything; 9 `take_vote`; 10 `next_answer` `[resend NOSCRIPT]`;
/// 11 drain as the driver does `[resend]`; 12 `peek` `[consume]`; 13 write `[n]`; 14 fail;
/// 15 time passes `[ms]`; 16 `note_write` `[ms]`; 17 fill the outbox `[one over]`;
/// 18 mark suspect. Filling the owed queue (enqueue count byte 254) or the outbox is done
/// only when config bit 7 is set, at most [`SESSION_MAX_BIG`] times per input, for speed;
/// refusals are not limited.
pub fn check_session(data: &[u8]) {
    let Some((&config, ops)) = data.split_first() else {
        return;
    };
    let mut h = Harness::new(config);
    let mut inp = Input { data: ops, pos: 0 };
    h.check_state();
    while !inp.done() && h.step < SESSION_MAX_OPS {
        h.step += 1;
        match inp.byte() % 19 {
            0 => h.open(),
            1 => h.establish(),
            2 => h.enqueue(&mut inp),
            3 => {
                let p = inp.byte();
                let token = TOKENS[usize::from(p) % TOKENS.len()];
                for _ in 0..=usize::from(p) / TOKENS.len() {
                    h.m.wire.extend(token);
                }
            }
            4 => {
                let n = usize::from(inp.byte());
                let bytes = inp.take(n);
                h.m.wire.extend(bytes);
            }
            5 => {
                let (b, n) = (inp.byte(), inp.byte());
                h.m.wire
                    .extend(std::iter::repeat_n(b, usize::from(n) * 256));
            }
            6 => {
                let max = inp.byte();
                h.read(false, usize::from(max));
            }
            7 => {
                let max = inp.byte();
                h.read(true, usize::from(max));
            }
            8 => h.read_all(),
            9 => {
                h.take_vote();
            }
            10 => {
                let resend = inp.byte() & 1 == 0;
                h.next_answer(resend);
            }
            11 => {
                let resend = inp.byte() & 1 == 0;
                h.drain(resend);
            }
            12 => {
                let consume = inp.byte() & 1 == 1;
                h.peek(consume);
            }
            13 => {
                let n = inp.byte();
                h.write(n);
            }
            14 => h.fail(NodeError::Closed),
            15 => {
                let b = inp.byte();
                let ms = if b & 0x80 != 0 {
                    u64::from(b & 0x7f) * 64
                } else {
                    u64::from(b)
                };
                h.m.now += Duration::from_millis(ms);
            }
            16 => {
                let b = inp.byte();
                let until = (b != 0).then(|| h.m.now + Duration::from_millis(u64::from(b)));
                h.s.note_write(until);
                if let Some(u) = until.filter(|&u| h.m.owed_until.is_none_or(|o| o < u)) {
                    h.m.owed_until = Some(u);
                }
            }
            17 => {
                let over = usize::from(inp.byte() & 1);
                let n = MAX_OUTBOX - h.m.unsent_len() + over;
                // One byte over is refused without a copy; a fill is a big operation.
                let cheap = over == 1 || n <= 4096;
                if h.m.state != State::Down && (cheap || h.big_left > 0) {
                    h.big_left -= u32::from(!cheap);
                    h.queue(&ZEROS[..n]);
                }
            }
            _ => {
                h.s.suspect = true;
                h.m.suspect = true;
            }
        }
        h.check_state();
    }
}

/// A server's error, restated from the library's rule: a message that says the server
/// runs no scripts (scripting disabled; `EVAL` unknown or forbidden) is `ScriptingOff`
/// anything else `Server`, each with the message.
fn server_error(m: &[u8]) -> NodeError {
    let text = String::from_utf8_lossy(m).into_owned();
    let lower = m.to_ascii_lowercase();
    let has = |n: &[u8]| lower.windows(n.len()).any(|w| w == n);
    let eval = has(b"'eval") || has(b"`eval");
    if (has(b"scripting") && has(b"disabled"))
        || (lower.starts_with(b"err unknown command") && eval)
        || (lower.starts_with(b"noperm") && eval)
    {
        NodeError::ScriptingOff(text)
    } else {
        NodeError::Server(text)
    }
}
