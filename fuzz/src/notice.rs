//! The property the `notice` fuzz target checks: one subscriber connection's state machine
//! (`quorumlock::__private::core::notice::Subscriber`) driven by a script of connection
//! events, wanted keys, server bytes and reads never panics, stays within its bounds, and
//! agrees with a model of its wanted keys.
//!
//! Like `checks.rs`, this file compiles in two crates: the fuzz crate (`fuzz/src/lib.rs`)
//! and the main crate's `tests/fuzz_corpus.rs` (by `#[path]`), so it uses only `std` and
//! `quorumlock`. Every failed property is a panic, which libFuzzer reports as a crash.
//!
//! # Input
//!
//! `[config, op, params.., op, params.., ...]`, at most [`NOTICE_MAX_OPS`] operations; a
//! missing parameter byte reads as 0. `config` picks the login (bits 0-1: none, password,
//! user and password, password) and the limits (bits 2-3: default, [`NOTICE_TIGHT`],
//! default, default); bit 4 allows the keys of the longest length (64 KiB each, at most
//! [`NOTICE_MAX_BIG`] operations with them). Each operation is `op % 10` (see
//! [`check_notice`]).
//!
//! # The model
//!
//! The waiters per key (what `want` and `unwant` must leave), whether a connection is
//! open, and the outbox's size right after the last `opened` (the resubscription, which
//! the outbox bound does not count).

// Not every item is used by both includers.
#![allow(dead_code)]

use std::collections::HashMap;

use quorumlock::__private::core::notice::{MAX_CHANNEL, Subscriber};
use quorumlock::__private::core::script::RELEASED_PREFIX;
use quorumlock::__private::core::session::Login;
use quorumlock::__private::resp::Limits;
use quorumlock::{MAX_RESOURCE, NodeError};

/// Most operations run per input.
pub const NOTICE_MAX_OPS: usize = 4096;

/// Operations per input that use a key of the longest length: enough subscribe and
/// unsubscribe edges (64 KiB each) to pass the outbox bound when the node reads nothing.
pub const NOTICE_MAX_BIG: u32 = 24;

/// The subscriber's documented bound on what count changes may queue (`MAX_OUTBOX` in
/// `src/core/notice.rs`).
pub const MAX_OUTBOX: usize = 1 << 20;

/// Small limits: payloads of at most 4 bytes, lines of at most 32.
pub const NOTICE_TIGHT: Limits = Limits {
    max_bulk_len: 4,
    max_array_len: 2,
    max_depth: 1,
    max_line_len: 32,
};

/// Keys by index: short ones, one with RESP framing inside, two of the longest length
/// allowed (`i % 8 == 4`, told apart by `i / 8 % 2`; only with config bit 4), and two that
/// cannot be resources (ignored by `want`).
fn key(i: u8, big: bool, long: &[u8], over: &[u8]) -> Vec<u8> {
    match i % 8 {
        0 => b"a".to_vec(),
        1 => b"b".to_vec(),
        2 => b"k\r\n$3\r\n".to_vec(),
        3 => b"lock:orders:42".to_vec(),
        // Two of them: toggling one is enough to pass the outbox bound (every 0 <-> 1
        // edge queues 64 KiB), and a few keep each resubscription cheap.
        4 if big => {
            let mut k = long.to_vec();
            k[0] = i / 8 % 2;
            k
        }
        5 if big => over.to_vec(),
        6 => Vec::new(),
        _ => b"c".to_vec(),
    }
}

fn channel(key: &[u8]) -> Vec<u8> {
    [RELEASED_PREFIX, key].concat()
}

fn bulk(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(format!("${}\r\n", b.len()).as_bytes());
    out.extend_from_slice(b);
    out.extend_from_slice(b"\r\n");
}

fn push(kind: &[u8], ch: &[u8], last: &[u8]) -> Vec<u8> {
    let mut out = b"*3\r\n".to_vec();
    bulk(&mut out, kind);
    bulk(&mut out, ch);
    out.extend_from_slice(last);
    out
}

/// Server replies by index, about key `k`.
fn reply(i: u8, k: &[u8], n: u8) -> Vec<u8> {
    match i % 18 {
        0 => b"+OK\r\n".to_vec(),
        1 => b"-WRONGPASS invalid username-password pair\r\n".to_vec(),
        2 => push(b"subscribe", &channel(k), format!(":{n}\r\n").as_bytes()),
        3 => push(b"unsubscribe", &channel(k), format!(":{n}\r\n").as_bytes()),
        4 => push(b"message", &channel(k), b"$0\r\n\r\n"),
        5 => push(b"message", &channel(k), b"$5\r\nhello\r\n"),
        6 => b"+PONG\r\n".to_vec(),
        7 => b"*2\r\n$4\r\npong\r\n$0\r\n\r\n".to_vec(),
        8 => push(b"message", b"news", b"$0\r\n\r\n"),
        9 => b"*3\r\n$7\r\nmess".to_vec(),
        10 => b"$-1\r\n".to_vec(),
        11 => b":1\r\n".to_vec(),
        12 => b"*4\r\n".to_vec(),
        13 => b"HTTP/1.1 400 Bad Request\r\n".to_vec(),
        14 => push(b"message", &channel(k), b"$99999999999\r\n"),
        15 => push(b"subscribe", &channel(k), b":-1\r\n"),
        16 => b"-NOPERM no permissions\r\n".to_vec(),
        _ => format!("*3\r\n${}\r\n", MAX_CHANNEL + usize::from(n % 2)).into_bytes(),
    }
}

/// Runs the script in `data` (see the module docs); panics on a broken property.
pub fn check_notice(data: &[u8]) {
    let mut bytes = data.iter().copied();
    let config = bytes.next().unwrap_or(0);
    let login = match config & 3 {
        0 => Login::default(),
        2 => Login {
            user: Some("u".into()),
            password: Some("pw".into()),
            db: 5,
            marker: None,
        },
        _ => Login {
            password: Some("pw".into()),
            ..Login::default()
        },
    };
    let has_auth = login.password.is_some();
    let limits = match (config >> 2) & 3 {
        1 => NOTICE_TIGHT,
        _ => Limits::default(),
    };
    let big = config & 16 != 0;
    // Only built when used: 128 KiB to fill costs most inputs more than their script.
    let (long, over) = if big {
        (vec![b'L'; MAX_RESOURCE], vec![b'O'; MAX_RESOURCE + 1])
    } else {
        (Vec::new(), Vec::new())
    };
    let mut big_ops = 0;

    let mut s = Subscriber::new(&login, limits);
    let mut model: HashMap<Vec<u8>, usize> = HashMap::new();
    let mut open = false;
    let mut resubscribed = 0;

    let mut next = move || bytes.next();
    for _ in 0..NOTICE_MAX_OPS {
        let Some(op) = next() else { break };
        let mut param = || next().unwrap_or(0);
        let mut failed: Option<NodeError> = None;
        match op % 10 {
            // A connection opened: AUTH first, then every wanted key's SUBSCRIBE.
            0 => {
                s.opened();
                open = true;
                let out = s.outbox();
                assert_eq!(
                    out.starts_with(b"*2\r\n$4\r\nAUTH\r\n")
                        || out.starts_with(b"*3\r\n$4\r\nAUTH\r\n"),
                    has_auth
                );
                assert_eq!(s.owes(), has_auth || !model.is_empty());
                // (Searched for the short keys only: a naive search for 64 KiB keys in a
                // 1 MiB outbox would take the fuzzer's time.)
                for k in model.keys().filter(|k| k.len() < 64) {
                    let ch = channel(k);
                    assert!(
                        out.windows(ch.len()).any(|w| w == ch),
                        "{k:?} not resubscribed"
                    );
                }
                resubscribed = out.len();
            }
            // The connection is gone.
            1 => {
                s.closed();
                open = false;
                resubscribed = 0;
                assert!(s.outbox().is_empty() && !s.owes());
            }
            // A waiter more or less for a key.
            op @ (2 | 3) => {
                let i = param();
                let k = key(i, big && big_ops < NOTICE_MAX_BIG, &long, &over);
                if k.len() >= MAX_RESOURCE {
                    big_ops += 1;
                }
                let before = s.outbox().len();
                let result = if op == 2 { s.want(&k) } else { s.unwant(&k) };
                let valid = !k.is_empty() && k.len() <= MAX_RESOURCE;
                let count = model.get(&k).copied().unwrap_or(0);
                let edge = if op == 2 {
                    if valid {
                        *model.entry(k.clone()).or_default() += 1;
                    }
                    valid && count == 0
                } else {
                    if count == 1 {
                        model.remove(&k);
                    } else if count > 1 {
                        model.insert(k.clone(), count - 1);
                    }
                    count == 1
                };
                match result {
                    Ok(()) => {
                        // Bytes are queued exactly on a 0 <-> 1 edge while open.
                        assert_eq!(s.outbox().len() > before, edge && open, "{op} {k:?}");
                    }
                    Err(NodeError::Backlog) => {
                        assert!(edge && open && before > MAX_OUTBOX);
                        failed = Some(NodeError::Backlog);
                    }
                    Err(e) => panic!("want/unwant failed with {e:?}"),
                }
            }
            4 => s.ping(),
            // The socket takes some of the outbox.
            5 => {
                let n = usize::from(param()) * 64;
                s.consumed(n);
                resubscribed = resubscribed.saturating_sub(n);
            }
            // The server sends a reply from the alphabet.
            6 => {
                let (i, k, n) = (param(), param(), param());
                let k = key(k, big && big_ops < NOTICE_MAX_BIG, &long, &over);
                if k.len() >= MAX_RESOURCE {
                    big_ops += 1;
                }
                if let Err(e) = s.feed(&reply(i, &k, n)) {
                    failed = Some(e);
                }
            }
            // The server sends raw bytes (up to 255 of them).
            7 => {
                let len = usize::from(param());
                let raw: Vec<u8> = (0..len).map(|_| param()).collect();
                if let Err(e) = s.feed(&raw) {
                    failed = Some(e);
                }
            }
            // A long run of one byte (a line or bulk that never ends), up to 63 KiB.
            8 => {
                let (b, n) = (param(), usize::from(param() % 64));
                if let Err(e) = s.feed(&vec![b; n * 1024]) {
                    failed = Some(e);
                }
            }
            // The driver drains the notices.
            _ => loop {
                match s.next_notice() {
                    Ok(Some(n)) => {
                        assert!(open, "a notice while closed");
                        assert!(!n.key.is_empty() && n.key.len() <= MAX_RESOURCE);
                        assert!(
                            model.contains_key(n.key),
                            "a notice for {:?}, not wanted",
                            n.key
                        );
                    }
                    Ok(None) => break,
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
            },
        }
        if let Some(e) = failed {
            assert!(
                matches!(
                    e,
                    NodeError::Protocol(_)
                        | NodeError::UnexpectedReply(_)
                        | NodeError::Handshake(_)
                        | NodeError::Server(_)
                        | NodeError::NotRedis(_)
                        | NodeError::Backlog
                ),
                "untyped failure {e:?}"
            );
            // The driver drops the connection on any error.
            s.closed();
            open = false;
            resubscribed = 0;
        }
        // The invariants after every step.
        assert_eq!(s.is_open(), open);
        assert_eq!(s.wanted(), model.len());
        // Every step for the short keys; the long ones (hashing 64 KiB each) at the end.
        for (k, &n) in model.iter().filter(|(k, _)| k.len() < 64) {
            assert_eq!(s.waiters(k), n, "{k:?}");
        }
        assert!(
            s.buffer_size() <= s.cap(),
            "{} > {}",
            s.buffer_size(),
            s.cap()
        );
        assert!(s.cap() <= 4 * MAX_CHANNEL, "cap {}", s.cap());
        assert!(
            s.outbox().len() <= resubscribed + MAX_OUTBOX + MAX_CHANNEL + 64,
            "outbox {}",
            s.outbox().len()
        );
        if !open {
            assert!(s.outbox().is_empty() && !s.owes());
        }
    }
    for (k, &n) in &model {
        assert_eq!(s.waiters(k), n, "{k:?}");
    }
}
