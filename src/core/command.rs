//! The three commands of the lock, encoded straight into a reused buffer.
//!
//! # Invariants
//!
//! - A [`Command`] carries everything that is the same for every key: its head is a
//!   constant chosen by the operation, and its tail (what follows the token: `NX PX` and
//!   the ttl, in decimal) is encoded once when the command is made. Encoding one key is
//!   then a few constant-size copies the compiler turns into stores, the key's length in
//!   decimal, and the key itself. This is the hot path of every round.
//! - Every command's length is computed first (the command's fixed part, plus the key and
//!   its length's digits), then its bytes are written into that room. The tail is copied
//!   whole, at its fixed size ([`TAIL_ROOM`]): the buffer keeps that much slack past the
//!   command's end, and what lands past it is not part of the output (the next command
//!   overwrites it, or it is cut off).
//! - [`Frame`] writes into a buffer that is never shrunk or zeroed between rounds, so in
//!   steady state encoding neither allocates nor clears memory. The tests check every
//!   command against the generic encoder byte for byte.

use super::script;
use super::slot::FenceName;
use super::token::Token;
use crate::error::Phase;
use crate::resp::encode::{array, bulk, bulk_int, line};

/// A command a frame carries: the operation, with what it needs beyond the key and token.
///
/// # Example
///
/// ```
/// use quorumlock::__private::core::command::{Command, Frame};
/// use quorumlock::__private::core::token::Token;
///
/// let mut frame = Frame::default();
/// frame.push(Command::acquire(10_000), b"orders:42", &Token::from_bits(1));
/// assert!(frame.command(0).ends_with(b"PX\r\n$5\r\n10000\r\n"));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Command {
    // INVARIANT: phase is Acquire, Extend or Release (the constructors are the only way
    // to make one); the fence write-back is a script over keys ([`eval_over`]).
    /// Which operation: `SET key token NX PX ttl_ms` (acquire), the compare-and-pexpire
    /// script (extend) or the compare-and-delete script (release).
    phase: Phase,
    /// Time to live, in milliseconds (acquire, extend; 0 for a release).
    ttl_ms: u64,
    /// A script by SHA (`EVALSHA`) when true, with the script itself (`EVAL`) when false;
    /// ignored for acquire.
    by_sha: bool,
    // INVARIANT: tail == Tail::new(phase, ttl_ms), and fixed == the length of everything
    // but the key and its length's digits; both follow from the fields above.
    /// What follows the token, encoded once for every key the command is sent for.
    tail: Tail,
    /// Bytes of the command that do not depend on the key.
    fixed: usize,
}

/// The bytes of a command after its token: the token's CRLF, then for `SET` its `NX PX`
/// and the ttl as a bulk string, for an extend the ttl as a bulk string, for a release
/// nothing more. Stored at a fixed size, so that writing it is a constant-size copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Tail {
    // INVARIANT: len <= TAIL_ROOM; only bytes[..len] is meaningful.
    bytes: [u8; TAIL_ROOM],
    len: usize,
}

/// Room for the longest tail: `\r\n$2\r\nNX\r\n$2\r\nPX\r\n$` (19 bytes), the ttl's digit
/// count (2), CRLF, the ttl (at most 20 digits), CRLF: 45 bytes. Also the slack a buffer
/// keeps past a command's end while the tail is written.
pub const TAIL_ROOM: usize = 48;

impl Tail {
    fn new(phase: Phase, ttl_ms: u64) -> Tail {
        let mut bytes = [0; TAIL_ROOM];
        let mut w = Writer {
            dst: &mut bytes,
            at: 0,
        };
        match phase {
            Phase::Acquire => w.put(TOKEN_END_NX_PX),
            Phase::Extend => w.put(b"\r\n$"),
            _ => w.put(b"\r\n"),
        }
        if matches!(phase, Phase::Acquire | Phase::Extend) {
            let n = digits(ttl_ms);
            // The ttl's digit count, itself one digit or two (a u64 has at most 20).
            if n < 10 {
                w.put(&[b'0' + n as u8]);
            } else {
                w.put(&[b'0' + (n / 10) as u8, b'0' + (n % 10) as u8]);
            }
            w.put(b"\r\n");
            w.decimal(ttl_ms, n);
            w.put(b"\r\n");
        }
        let len = w.at;
        Tail { bytes, len }
    }
}

impl Command {
    /// The command for `phase`; everything but the key and the token encoded now.
    #[inline]
    fn make(phase: Phase, ttl_ms: u64, by_sha: bool) -> Command {
        let tail = Tail::new(phase, ttl_ms);
        let mut cmd = Command {
            phase,
            ttl_ms,
            by_sha,
            tail,
            fixed: 0,
        };
        // The head, the CRLF after the key's length, the key's CRLF with the token's
        // header, the token and the tail.
        cmd.fixed = cmd.head().len() + 2 + KEY_END_TOKEN_HEAD.len() + 32 + tail.len;
        cmd
    }

    /// `SET key token NX PX ttl_ms`.
    #[inline]
    pub fn acquire(ttl_ms: u64) -> Command {
        Command::make(Phase::Acquire, ttl_ms, false)
    }

    /// Compare-and-pexpire to `ttl_ms`, by SHA or with the script.
    #[inline]
    pub fn extend(ttl_ms: u64, by_sha: bool) -> Command {
        Command::make(Phase::Extend, ttl_ms, by_sha)
    }

    /// Compare-and-delete, by SHA or with the script.
    #[inline]
    pub fn release(by_sha: bool) -> Command {
        Command::make(Phase::Release, 0, by_sha)
    }

    /// `phase`'s command (`ttl_ms` is dropped for a release); `None` for the fence
    /// write-back, which is a script over several keys ([`eval_over`]).
    #[inline]
    pub fn new(phase: Phase, ttl_ms: u64, by_sha: bool) -> Option<Command> {
        match phase {
            Phase::Acquire => Some(Command::acquire(ttl_ms)),
            Phase::Extend => Some(Command::extend(ttl_ms, by_sha)),
            Phase::Release => Some(Command::release(by_sha)),
            _ => None,
        }
    }

    /// Its operation.
    #[inline]
    pub const fn phase(&self) -> Phase {
        self.phase
    }

    /// Everything up to the key's length: a constant per operation.
    #[inline]
    fn head(&self) -> &'static [u8] {
        match (self.phase, self.by_sha) {
            (Phase::Acquire, _) => SET_HEAD_KEY,
            (Phase::Extend, true) => &EXTEND_SHA_HEAD_KEY,
            (Phase::Extend, false) => &EXTEND_EVAL_HEAD_KEY,
            (_, true) => &RELEASE_SHA_HEAD_KEY,
            (_, false) => &RELEASE_EVAL_HEAD_KEY,
        }
    }

    /// The encoded length for a key of `key_len` bytes, whose length has `key_digits`
    /// decimal digits, and `token`.
    #[inline]
    fn len(&self, key_len: usize, key_digits: usize, token: TokenBytes<'_>) -> usize {
        let base = self.fixed + key_digits + key_len;
        match token {
            TokenBytes::Inline(_) => base,
            // `fixed` counts a 32-byte token and its 2-digit length.
            TokenBytes::Given(t) => base + t.len() + digits(t.len() as u64) - 34,
        }
    }

    /// Writes the command for `key` (whose length has `key_digits` digits) and `token`
    /// at the start of `dst`, which holds at least its length plus [`TAIL_ROOM`].
    #[inline(always)]
    fn write(&self, dst: &mut [u8], key: &[u8], key_digits: usize, token: TokenBytes<'_>) {
        let mut w = Writer { dst, at: 0 };
        // One constant-size copy per operation (the `match` keeps each one's size known).
        match (self.phase, self.by_sha) {
            (Phase::Acquire, _) => w.put(SET_HEAD_KEY),
            (Phase::Extend, true) => w.put(&EXTEND_SHA_HEAD_KEY),
            (Phase::Extend, false) => w.put(&EXTEND_EVAL_HEAD_KEY),
            (_, true) => w.put(&RELEASE_SHA_HEAD_KEY),
            (_, false) => w.put(&RELEASE_EVAL_HEAD_KEY),
        }
        w.decimal(key.len() as u64, key_digits);
        w.put(b"\r\n");
        w.put(key);
        match token {
            TokenBytes::Inline(inline) => {
                w.put(KEY_END_TOKEN_HEAD);
                w.put(inline);
            }
            TokenBytes::Given(given) => w.given_token(given),
        }
        // The whole room, at its fixed size: past `tail.len` it is slack (see the
        // module's invariants).
        w.put(&self.tail.bytes);
    }
}

/// `SET key token NX PX ttl_ms`, appended to `out`.
///
/// # Example
///
/// ```
/// use quorumlock::__private::core::command::acquire;
/// use quorumlock::__private::core::token::Token;
///
/// let mut out = Vec::new();
/// acquire(&mut out, b"k", &Token::from_bits(1), 500);
/// assert!(out.starts_with(b"*6\r\n$3\r\nSET\r\n$1\r\nk\r\n$32\r\n0000"));
/// assert!(out.ends_with(b"$2\r\nNX\r\n$2\r\nPX\r\n$3\r\n500\r\n"));
/// ```
pub fn acquire(out: &mut Vec<u8>, key: &[u8], token: &Token, ttl_ms: u64) {
    encode(out, Command::acquire(ttl_ms), key, token);
}

/// Compare-and-delete: `EVALSHA sha 1 key token`, or `EVAL script 1 key token` when
/// `by_sha` is false (after `NOSCRIPT`, or when no reply will be read); appended to `out`.
///
/// # Example
///
/// ```
/// use quorumlock::__private::core::command::release;
/// use quorumlock::__private::core::script::RELEASE_SHA;
/// use quorumlock::__private::core::token::Token;
///
/// let mut out = Vec::new();
/// release(&mut out, b"k", &Token::from_bits(1), true);
/// assert!(out.starts_with(b"*5\r\n$7\r\nEVALSHA\r\n$40\r\n"));
/// assert!(out.windows(40).any(|w| w == RELEASE_SHA));
/// ```
pub fn release(out: &mut Vec<u8>, key: &[u8], token: &Token, by_sha: bool) {
    encode(out, Command::release(by_sha), key, token);
}

/// Compare-and-pexpire: `EVALSHA sha 1 key token ttl_ms` (or `EVAL` as for release),
/// appended to `out`.
///
/// # Example
///
/// ```
/// use quorumlock::__private::core::command::extend;
/// use quorumlock::__private::core::token::Token;
///
/// let mut out = Vec::new();
/// extend(&mut out, b"k", &Token::from_bits(1), 30_000, false);
/// assert!(out.starts_with(b"*6\r\n$4\r\nEVAL\r\n"));
/// assert!(out.ends_with(b"$5\r\n30000\r\n"));
/// ```
pub fn extend(out: &mut Vec<u8>, key: &[u8], token: &Token, ttl_ms: u64, by_sha: bool) {
    encode(out, Command::extend(ttl_ms, by_sha), key, token);
}

/// `cmd` for `key` and `token`, appended to `out`: what [`acquire`], [`release`] and
/// [`extend`] do, for a command chosen at run time.
///
/// # Example
///
/// ```
/// use quorumlock::__private::core::command::{encode, release, Command};
/// use quorumlock::__private::core::token::Token;
///
/// let token = Token::from_bits(3);
/// let (mut a, mut b) = (Vec::new(), Vec::new());
/// encode(&mut a, Command::release(false), b"k", &token);
/// release(&mut b, b"k", &token, false);
/// assert_eq!(a, b);
/// ```
pub fn encode(out: &mut Vec<u8>, cmd: Command, key: &[u8], token: &Token) {
    let token = TokenBytes::of(token);
    let start = out.len();
    let key_digits = digits(key.len() as u64);
    let len = cmd.len(key.len(), key_digits, token);
    out.resize(start + len + TAIL_ROOM, 0);
    cmd.write(&mut out[start..], key, key_digits, token);
    out.truncate(start + len);
}

/// Commands encoded back to back into one buffer that keeps its size from round to round.
///
/// # Example
///
/// ```
/// use quorumlock::__private::core::command::{Command, Frame};
/// use quorumlock::__private::core::token::Token;
///
/// let mut frame = Frame::default();
/// frame.push(Command::release(true), b"a", &Token::from_bits(1));
/// frame.push(Command::release(true), b"b", &Token::from_bits(2));
/// assert_eq!(frame.count(), 2);
/// assert!(frame.bytes().starts_with(b"*5\r\n$7\r\nEVALSHA\r\n"));
/// assert_eq!(frame.command(0).len() + frame.command(1).len(), frame.bytes().len());
/// frame.clear();
/// assert!(frame.bytes().is_empty());
/// ```
#[derive(Clone, Debug, Default)]
pub struct Frame {
    // INVARIANT: len <= buf.len(); only buf[..len] is meaningful.
    buf: Vec<u8>,
    len: usize,
    // Where each command starts; a command ends where the next starts, the last at `len`.
    starts: Vec<usize>,
}

impl Frame {
    /// Forgets the commands; keeps the memory.
    #[inline]
    pub fn clear(&mut self) {
        self.len = 0;
        self.starts.clear();
    }

    /// Appends one command.
    #[inline]
    pub fn push(&mut self, cmd: Command, key: &[u8], token: &Token) {
        match token.as_array() {
            // Matched here, once, so that the length and the bytes of the common case are
            // computed without looking at the token's kind again.
            Some(inline) => self.push_with(cmd, key, TokenBytes::Inline(inline)),
            None => self.push_given(cmd, key, token.as_bytes()),
        }
    }

    /// [`Frame::push`] for a caller's token of a length other than 32.
    #[cold]
    #[inline(never)]
    fn push_given(&mut self, cmd: Command, key: &[u8], token: &[u8]) {
        self.push_with(cmd, key, TokenBytes::Given(token));
    }

    #[inline(always)]
    fn push_with(&mut self, cmd: Command, key: &[u8], token: TokenBytes<'_>) {
        let key_digits = digits(key.len() as u64);
        let end = self.len + cmd.len(key.len(), key_digits, token);
        // The command, and the slack its tail is written with.
        if end + TAIL_ROOM > self.buf.len() {
            // Grows only past the largest frame yet: steady state never gets here.
            self.buf
                .resize((end + TAIL_ROOM).max(2 * self.buf.len()), 0);
        }
        cmd.write(&mut self.buf[self.len..], key, key_digits, token);
        self.starts.push(self.len);
        self.len = end;
    }

    /// Appends one command that `encode` appends to the buffer it is given (the rare
    /// commands that are not one of [`Command`]'s: multi-key locks and fencing).
    pub fn push_encoded(&mut self, encode: impl FnOnce(&mut Vec<u8>)) {
        self.buf.truncate(self.len);
        self.starts.push(self.len);
        encode(&mut self.buf);
        self.len = self.buf.len();
    }

    /// All commands, back to back.
    #[inline]
    pub fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    /// Number of commands.
    #[inline]
    pub fn count(&self) -> usize {
        self.starts.len()
    }

    /// Command `i`; empty if there is none.
    pub fn command(&self, i: usize) -> &[u8] {
        let Some(&from) = self.starts.get(i) else {
            return &[];
        };
        let to = self.starts.get(i + 1).copied().unwrap_or(self.len);
        &self.buf[from..to]
    }

    /// Bytes of memory held.
    pub fn capacity(&self) -> usize {
        self.buf.capacity() + self.starts.capacity() * std::mem::size_of::<usize>()
    }
}

/// Where a resource's fence counter lives: this prefix, then a name that hashes to the
/// resource's cluster slot (`{resource}` for most; [`slot::FenceName`]). The counter is
/// permanent state on each node (no expiry): it only ever rises.
///
/// [`slot::FenceName`]: super::slot::FenceName
pub const FENCE_PREFIX: &[u8] = b"quorumlock:fence:";

/// Which keys a script over several resources names, in this order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyList {
    /// The lock keys (the resources themselves).
    Locks,
    /// The lock keys, then their fence counters.
    Both,
}

/// One argument of a script, after its keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arg<'a> {
    /// Bytes as they are (a token).
    Bytes(&'a [u8]),
    /// A number, in decimal (a ttl, a count, a fence).
    Int(u64),
}

/// `EVAL script numkeys <keys> <args>`, appended to `out`: the commands of multi-resource
/// locks and of fencing, which carry the script itself (they are opt-in and rare enough
/// that `EVALSHA`'s saving is not worth a `NOSCRIPT` round trip, and no reply of theirs is
/// ever left unread with a script missing).
///
/// # Example
///
/// ```
/// use quorumlock::__private::core::command::{eval_over, Arg, KeyList};
///
/// let mut out = Vec::new();
/// eval_over(&mut out, b"return 1", [&b"a"[..], b"b"].into_iter(), KeyList::Both, &[Arg::Int(7)]);
/// assert_eq!(
///     out,
///     &b"*8\r\n$4\r\nEVAL\r\n$8\r\nreturn 1\r\n$1\r\n4\r\n$1\r\na\r\n$1\r\nb\r\n\
///        $20\r\nquorumlock:fence:{a}\r\n$20\r\nquorumlock:fence:{b}\r\n$1\r\n7\r\n"[..]
/// );
/// ```
pub fn eval_over<'k>(
    out: &mut Vec<u8>,
    script: &[u8],
    keys: impl Iterator<Item = &'k [u8]> + Clone,
    which: KeyList,
    args: &[Arg<'_>],
) {
    let n = keys.clone().count();
    let key_count = if which == KeyList::Both { 2 * n } else { n };
    array(out, 3 + key_count + args.len());
    bulk(out, b"EVAL");
    bulk(out, script);
    bulk_int(out, key_count as i64);
    for key in keys.clone() {
        bulk(out, key);
    }
    if which == KeyList::Both {
        for key in keys {
            // In the resource's hash slot: a cluster-mode node runs one script over one
            // slot only.
            let name = FenceName::of(key);
            line(out, b'$', name.len(key) as u64, false);
            name.write(key, out);
            out.extend_from_slice(b"\r\n");
        }
    }
    for arg in args {
        match *arg {
            Arg::Bytes(b) => bulk(out, b),
            Arg::Int(v) => bulk_int(out, v.min(i64::MAX as u64) as i64),
        }
    }
}

/// A token's bytes as the encoder writes them: 32 bytes at a constant size, or a caller's
/// token of another length.
#[derive(Clone, Copy)]
enum TokenBytes<'a> {
    Inline(&'a [u8; 32]),
    Given(&'a [u8]),
}

impl<'a> TokenBytes<'a> {
    #[inline]
    fn of(token: &'a Token) -> TokenBytes<'a> {
        match token.as_array() {
            Some(inline) => TokenBytes::Inline(inline),
            None => TokenBytes::Given(token.as_bytes()),
        }
    }
}

/// `SET`'s head and the `$` of the key's length.
const SET_HEAD_KEY: &[u8; 14] = b"*6\r\n$3\r\nSET\r\n$";
/// After the token of a `SET`: its CRLF, `NX`, `PX` and the `$` of the ttl's length.
const TOKEN_END_NX_PX: &[u8; 19] = b"\r\n$2\r\nNX\r\n$2\r\nPX\r\n$";
/// `*5 EVALSHA <release sha> 1` and the `$` of the key's length.
const RELEASE_SHA_HEAD_KEY: [u8; 72] = sha_head(b'5', script::RELEASE_SHA);
/// `*6 EVALSHA <extend sha> 1` and the `$` of the key's length.
const EXTEND_SHA_HEAD_KEY: [u8; 72] = sha_head(b'6', script::EXTEND_SHA);

/// `*<args>\r\n$7\r\nEVALSHA\r\n$40\r\n<sha>\r\n$1\r\n1\r\n$`, built at compile time.
const fn sha_head(args: u8, sha: &[u8; 40]) -> [u8; 72] {
    let mut out = [0u8; 72];
    let mut at = copy_into(&mut out, 0, &[b'*', args, b'\r', b'\n']);
    at = copy_into(&mut out, at, EVALSHA_HEAD);
    at = copy_into(&mut out, at, sha);
    at = copy_into(&mut out, at, ONE_KEY);
    copy_into(&mut out, at, b"$");
    out
}

/// `*5 EVAL <release script> 1` and the `$` of the key's length, built at compile time:
/// every unlock sends the script itself, so its head is one copy, like the digests'.
const RELEASE_EVAL_HEAD_KEY: [u8; eval_head_len(script::RELEASE)] =
    eval_head(b'5', script::RELEASE);
/// `*6 EVAL <extend script> 1` and the `$` of the key's length.
const EXTEND_EVAL_HEAD_KEY: [u8; eval_head_len(script::EXTEND)] = eval_head(b'6', script::EXTEND);

/// The length of `*<args>\r\n$4\r\nEVAL\r\n$<n>\r\n<body>\r\n$1\r\n1\r\n$`.
const fn eval_head_len(body: &[u8]) -> usize {
    4 + EVAL_HEAD.len() + 1 + const_digits(body.len()) + 2 + body.len() + ONE_KEY.len() + 1
}

/// `*<args>\r\n$4\r\nEVAL\r\n$<n>\r\n<body>\r\n$1\r\n1\r\n$`, built at compile time.
const fn eval_head<const N: usize>(args: u8, body: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    let mut at = copy_into(&mut out, 0, &[b'*', args, b'\r', b'\n']);
    at = copy_into(&mut out, at, EVAL_HEAD);
    at = copy_into(&mut out, at, b"$");
    // The script's length, in decimal.
    let digits = const_digits(body.len());
    let mut i = 0;
    let mut v = body.len();
    while i < digits {
        out[at + digits - 1 - i] = b'0' + (v % 10) as u8;
        v /= 10;
        i += 1;
    }
    at += digits;
    at = copy_into(&mut out, at, b"\r\n");
    at = copy_into(&mut out, at, body);
    at = copy_into(&mut out, at, ONE_KEY);
    at = copy_into(&mut out, at, b"$");
    assert!(at == N, "eval_head: N is not eval_head_len(body)");
    out
}

const fn const_digits(mut v: usize) -> usize {
    let mut n = 1;
    while v >= 10 {
        v /= 10;
        n += 1;
    }
    n
}

const fn copy_into<const N: usize>(out: &mut [u8; N], at: usize, bytes: &[u8]) -> usize {
    let mut i = 0;
    while i < bytes.len() {
        out[at + i] = bytes[i];
        i += 1;
    }
    at + bytes.len()
}
const EVALSHA_HEAD: &[u8; 18] = b"$7\r\nEVALSHA\r\n$40\r\n";
const EVAL_HEAD: &[u8; 10] = b"$4\r\nEVAL\r\n";
const ONE_KEY: &[u8; 9] = b"\r\n$1\r\n1\r\n";
/// What follows the key: its CRLF, then the token's header.
const KEY_END_TOKEN_HEAD: &[u8; 7] = b"\r\n$32\r\n";

/// Number of decimal digits of `v` (1 for 0), without a division or a loop: the bit
/// length gives the digit count to within one (`log10(2) ≈ 1233 / 4096`), and one compare
/// with a power of ten settles it. (The standard library's `ilog10` takes a few times as
/// many instructions; a chain of range compares becomes conditional moves that evaluate
/// every step.) The tests check it against `ilog10` at every power of two and of ten.
#[inline]
fn digits(v: u64) -> usize {
    const POW10: [u64; 20] = {
        let mut p = [1u64; 20];
        let mut i = 1;
        while i < 20 {
            p[i] = p[i - 1] * 10;
            i += 1;
        }
        p
    };
    // 0 has the digits of 1. Bits in `v`, and an estimate of its digit count less one
    // (0..=19), exact or one too many.
    let v = v | 1;
    let bits = 64 - v.leading_zeros() as usize;
    let guess = (bits * 1233) >> 12;
    guess + 1 - usize::from(v < POW10[guess])
}

/// Bytes written front to back into a slice sized for them.
struct Writer<'a> {
    dst: &'a mut [u8],
    at: usize,
}

impl Writer<'_> {
    #[inline(always)]
    fn put(&mut self, bytes: &[u8]) {
        let end = self.at + bytes.len();
        self.dst[self.at..end].copy_from_slice(bytes);
        self.at = end;
    }

    /// The key's CRLF, then a token of any length as a bulk string (a caller's own
    /// token: the crate's are 32 bytes, written by the constant-size path).
    #[cold]
    fn given_token(&mut self, token: &[u8]) {
        self.put(b"\r\n$");
        let n = token.len() as u64;
        self.decimal(n, digits(n));
        self.put(b"\r\n");
        self.put(token);
    }

    /// Writes `v`, which has `n` digits (from [`digits`]: exactly, or the output is
    /// wrong), straight into place, two digits per division.
    #[inline(always)]
    fn decimal(&mut self, mut v: u64, n: usize) {
        const PAIRS: &[u8; 200] = b"0001020304050607080910111213141516171819\
                                    2021222324252627282930313233343536373839\
                                    4041424344454647484950515253545556575859\
                                    6061626364656667686970717273747576777879\
                                    8081828384858687888990919293949596979899";
        let end = self.at + n;
        let out = &mut self.dst[self.at..end];
        let mut i = out.len();
        while i >= 2 {
            let pair = (v % 100) as usize * 2;
            v /= 100;
            out[i - 2..i].copy_from_slice(&PAIRS[pair..pair + 2]);
            i -= 2;
        }
        if i == 1 {
            // `n` is `v`'s digit count, so one digit is left: no division.
            debug_assert!(v < 10);
            out[0] = b'0' + v as u8;
        }
        self.at = end;
    }
}

/// Rewrites one `EVALSHA` command as encoded by [`release`] or [`extend`] into the same
/// command with `EVAL` and the script itself, for a node that answered `NOSCRIPT`.
/// Returns `false` (and writes nothing) for bytes that are not such a command.
///
/// # Example
///
/// ```
/// use quorumlock::__private::core::command::{evalsha_to_eval, release};
/// use quorumlock::__private::core::token::Token;
///
/// let token = Token::from_bits(7);
/// let (mut by_sha, mut by_script, mut rewritten) = (Vec::new(), Vec::new(), Vec::new());
/// release(&mut by_sha, b"k", &token, true);
/// release(&mut by_script, b"k", &token, false);
/// assert!(evalsha_to_eval(&mut rewritten, &by_sha));
/// assert_eq!(rewritten, by_script);
/// assert!(!evalsha_to_eval(&mut rewritten, b"*1\r\n$4\r\nPING\r\n"));
/// ```
pub fn evalsha_to_eval(out: &mut Vec<u8>, cmd: &[u8]) -> bool {
    const HEAD: usize = 4; // "*5\r\n" or "*6\r\n"
    let sha_at = HEAD + EVALSHA_HEAD.len();
    let rest_at = sha_at + 40 + 2;
    if cmd.len() < rest_at || cmd.get(HEAD..sha_at) != Some(&EVALSHA_HEAD[..]) {
        return false;
    }
    let script = match &cmd[sha_at..sha_at + 40] {
        sha if sha == script::RELEASE_SHA => script::RELEASE,
        sha if sha == script::EXTEND_SHA => script::EXTEND,
        _ => return false,
    };
    out.extend_from_slice(&cmd[..HEAD]);
    out.extend_from_slice(EVAL_HEAD);
    out.push(b'$');
    let n = script.len() as u64;
    let at = out.len();
    out.resize(at + digits(n), 0);
    Writer {
        dst: &mut out[at..],
        at: 0,
    }
    .decimal(n, digits(n));
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(script);
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(&cmd[rest_at..]);
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::token::MAX_TOKEN;
    use crate::resp::encode::command;

    /// Random keys (every length from 0 to 300, then a few large ones) and ttls of every
    /// digit count, pushed back to back into one reused frame: each command must equal
    /// the generic encoder's bytes, and the frame must hold exactly their concatenation.
    #[test]
    fn frames_match_the_generic_encoder_for_any_key_and_ttl() {
        let mut rng = fastrand::Rng::with_seed(11);
        let mut frame = Frame::default();
        let mut lengths: Vec<usize> = (0..=300).collect();
        lengths.extend([999, 1000, 9_999, 10_000, 65_535, 65_536]);
        for (round, len) in lengths.into_iter().enumerate() {
            let key: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
            // Every third command carries a caller's token of any allowed length (32
            // included: it takes the constant-size path), any bytes.
            let token = if round % 3 == 0 {
                let len = 1 + (round / 3) % MAX_TOKEN;
                let given: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
                Token::given(&given).unwrap()
            } else {
                Token::from_bits(rng.u128(..))
            };
            let digits = 1 + round % 20;
            let ttl = if digits == 20 {
                rng.u64(10u64.pow(19)..)
            } else {
                rng.u64(10u64.pow(digits as u32 - 1)..10u64.pow(digits as u32))
            };
            let t = token.as_bytes();
            let ttl_text = ttl.to_string();
            let cmds = [
                Command::acquire(ttl),
                Command::extend(ttl, true),
                Command::extend(ttl, false),
                Command::release(true),
                Command::release(false),
            ];
            if round % 7 == 0 {
                frame.clear();
            }
            let mut expected_tail = Vec::new();
            let before = frame.bytes().to_vec();
            for cmd in cmds {
                let mut want = Vec::new();
                match cmd {
                    Command {
                        phase: Phase::Acquire,
                        ..
                    } => command(
                        &mut want,
                        &[b"SET", &key, t, b"NX", b"PX", ttl_text.as_bytes()],
                    ),
                    Command {
                        phase: Phase::Extend,
                        by_sha,
                        ..
                    } => {
                        let (name, script): (&[u8], &[u8]) = if by_sha {
                            (b"EVALSHA", &script::EXTEND_SHA[..])
                        } else {
                            (b"EVAL", script::EXTEND)
                        };
                        command(
                            &mut want,
                            &[name, script, b"1", &key, t, ttl_text.as_bytes()],
                        )
                    }
                    Command {
                        phase: Phase::Release,
                        by_sha,
                        ..
                    } => {
                        let (name, script): (&[u8], &[u8]) = if by_sha {
                            (b"EVALSHA", &script::RELEASE_SHA[..])
                        } else {
                            (b"EVAL", script::RELEASE)
                        };
                        command(&mut want, &[name, script, b"1", &key, t])
                    }
                    _ => unreachable!("no other command is made here"),
                }
                let index = frame.count();
                frame.push(cmd, &key, &token);
                assert_eq!(
                    frame.command(index),
                    &want[..],
                    "{cmd:?}, key of {len} bytes"
                );
                expected_tail.extend_from_slice(&want);
            }
            assert_eq!(&frame.bytes()[..before.len()], &before[..]);
            assert_eq!(&frame.bytes()[before.len()..], &expected_tail[..]);
        }
    }

    #[test]
    fn digits_counts_every_decimal_digit() {
        let mut values = vec![0, 1, 9, 10, 11, 99, 100, u64::MAX - 1, u64::MAX];
        for k in 0..64 {
            values.extend([(1u64 << k) - 1, 1 << k, (1 << k) + 1]);
        }
        let mut p = 1u64;
        while let Some(next) = p.checked_mul(10) {
            values.extend([p - 1, p, p + 1, next - 1]);
            p = next;
        }
        values.extend([p - 1, p, p + 1]);
        let mut rng = fastrand::Rng::with_seed(3);
        values.extend((0..100_000).map(|_| rng.u64(..) >> rng.u32(..64)));
        for v in values {
            assert_eq!(digits(v), v.to_string().len(), "{v}");
        }
    }

    #[test]
    fn commands_match_the_generic_encoder() {
        let token = Token::from_bits(0x0123_4567_89ab_cdef_0011_2233_4455_6677);
        let t = token.as_bytes();
        for key in [&b"k"[..], b"", b"a\r\nb", &[0xff; 100]] {
            for (by_sha, name, rel, ext) in [
                (
                    true,
                    &b"EVALSHA"[..],
                    &script::RELEASE_SHA[..],
                    &script::EXTEND_SHA[..],
                ),
                (false, b"EVAL", script::RELEASE, script::EXTEND),
            ] {
                let (mut got, mut want) = (Vec::new(), Vec::new());
                release(&mut got, key, &token, by_sha);
                command(&mut want, &[name, rel, b"1", key, t]);
                assert_eq!(got, want);
                let (mut got, mut want) = (Vec::new(), Vec::new());
                extend(&mut got, key, &token, 1234, by_sha);
                command(&mut want, &[name, ext, b"1", key, t, b"1234"]);
                assert_eq!(got, want);
            }
            for by_sha_cmd in [0, 1] {
                let (mut sha, mut eval, mut rewritten) = (Vec::new(), Vec::new(), Vec::new());
                if by_sha_cmd == 0 {
                    release(&mut sha, key, &token, true);
                    release(&mut eval, key, &token, false);
                } else {
                    extend(&mut sha, key, &token, 77, true);
                    extend(&mut eval, key, &token, 77, false);
                }
                assert!(evalsha_to_eval(&mut rewritten, &sha));
                assert_eq!(rewritten, eval);
                assert!(
                    !evalsha_to_eval(&mut rewritten, &eval),
                    "EVAL is not rewritten"
                );
            }
            let (mut got, mut want) = (Vec::new(), Vec::new());
            acquire(&mut got, key, &token, 30_000);
            command(&mut want, &[b"SET", key, t, b"NX", b"PX", b"30000"]);
            assert_eq!(got, want);
        }
    }
}
