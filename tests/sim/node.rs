//! One simulated Redis 7 master, as a lock client sees it: raw request bytes in, raw reply
//! bytes out, on the node's own clock.
//!
//! # What is modelled
//!
//! - The request protocol: RESP2 multibulk (`*N` then `$len` bulks), as the client sends
//!   it, and a simplified inline form (one line split on ASCII whitespace, no quoting).
//!   Every length is bounded; a request that breaks the protocol is answered
//!   `-ERR Protocol error: …` and the connection is closed, as Redis does. Stricter than
//!   Redis in one way: the `\r\n` after a bulk and after a `*`/`$` header is checked (Redis
//!   skips two bytes blindly), so an encoder that miscounts a length is caught at once.
//! - Commands: `PING [msg]`, `AUTH [user] pass`, `SELECT db`, `SET key value [NX|XX]
//!   [EX s|PX ms|KEEPTTL]`, `GET`, `DEL key…`, `PEXPIRE key ms [NX|XX|GT|LT]`, `PTTL`,
//!   `EVAL`/`EVALSHA` of exactly the client's seven scripts (`core::script`'s `RELEASE`,
//!   `EXTEND`, `ACQUIRE`, `FENCE`, `RELEASE_ALL`, `EXTEND_ALL`, `RELEASE_FENCED`),
//!   `SCRIPT FLUSH|LOAD|EXISTS`, `INFO` (the server section's `run_id` and
//!   `uptime_in_seconds` only), `QUIT`. The order of checks is Redis 7's: unknown
//!   command, then arity, then `NOAUTH`, then the command's own argument errors. Replies
//!   and error texts were compared byte for byte with `redis-server` 7.0.15 (the unit
//!   tests pin them).
//! - Time: the node reads only the `now` it is given (nanoseconds on its own clock, which
//!   may jump or run backwards: Redis expires by wall-clock time). Like Redis, it works in
//!   whole milliseconds: `PX ms` sets the expiry to `now_ms + ms` with
//!   `now_ms = now / 1 ms`, and a key is gone once `now_ms > expiry`. So a key set at node
//!   time `t` with `PX ms` is still there at `t + ms` and gone from
//!   `(floor(t / 1 ms) + ms + 1) ms` on: it can outlive its ttl by up to 1 ms, which is
//!   what the Redlock drift allowance's `+ 2 ms` is for.
//! - Uptime: Redis's `uptime_in_seconds` is `time(NULL)` now minus `time(NULL)` at the
//!   start, a difference of two whole-second wall-clock readings, so it can exceed the
//!   real uptime by up to (not including) 1 s: started at 12.9 s and asked at 13.1 s, it
//!   reads 1. The node models the wall clock as its own clock plus a fixed phase below
//!   1 s drawn from its seed ([`SimNode::wall_phase`]): a restart at node time `t` starts
//!   in second `floor((t + phase) / 1 s)`, and the uptime at `now` is
//!   `floor((now + phase) / 1 s)` minus that. A node never restarted started a day (in
//!   whole wall-clock seconds) before its time 0. Deviation: a clock set back past the
//!   start reads 0, where Redis would print a negative number.
//! - Expiry is lazy (every access checks), plus [`SimNode::expire_all`]; Redis's active
//!   expiry samples keys at random, which no command can observe.
//! - The script cache: `EVAL` and `SCRIPT LOAD` of any of the seven cache it by its SHA1
//!   (the constants of `core::script`, the script matched by its exact text); `EVALSHA` of
//!   a script not cached answers `-NOSCRIPT`. `SCRIPT FLUSH` and [`SimNode::restart`]
//!   empty it. Any other script is refused with an error that says it is not modelled.
//! - Scripts: each is its Lua transcribed step by step, so that any arguments give what
//!   Redis 7 gives: the same `redis.call`s in the same order, the same early returns, and
//!   an error stops the script where Lua would, keeping the writes made before it (Redis
//!   does not roll a script back). The whole script runs at one node time, as Redis
//!   freezes the clock for a script. A nil `KEYS[i]`/`ARGV[i]` given to `redis.call`
//!   raises `ERR Lua redis lib command arguments must be strings or integers`; an error of
//!   the Lua itself (a nil `for` limit, comparing a number with nil) raises
//!   `ERR user_script:1: <Lua's message>`; a command's own error raises its error text;
//!   each is answered as `-<that> script: <sha>, on @user_script:1.`. Lua numbers are
//!   doubles: `tonumber` of a string reads what Lua 5.1 over glibc's `strtod` reads (the
//!   text up to a NUL, C white space around it, decimal with optional fraction and
//!   exponent, hexadecimal `0x…` with optional fraction and `p` exponent, `inf`,
//!   `infinity`, `nan`, `nan(…)`, each optionally signed), anything else being nil; `for`
//!   loops step in doubles and `KEYS[i]` is nil for an `i` that is not a whole number in
//!   range (so `RELEASE_FENCED`'s `n = #KEYS/2` is a double: for an odd `#KEYS` its loop
//!   runs over the whole `i` up to `n`, `KEYS[n+i]` has a half and is nil, so the first
//!   lock key that holds the token raises in `get` before any write, and with none
//!   holding it `d==n` is false: 0); a number returned is replied as C's `(long long)`
//!   of it, truncating toward zero. Deviations: a hexadecimal number of more than 53
//!   significant bits, or whose value is subnormal, may round differently from glibc; a
//!   returned number out of the `i64` range (or NaN) answers `i64::MIN`, which is what
//!   x86-64 gives (C leaves it undefined, so another CPU may differ). Pinned against
//!   `redis-server` 7.0.15.
//! - Release notices: the scripts' `redis.pcall("publish",…)` is recorded, not delivered
//!   (no pub/sub command is modelled, so nothing can subscribe): [`SimNode::published`]
//!   counts them and [`SimNode::take_published`] hands out the channels of the latest
//!   (at most [`MAX_PUBLISHED`] kept). Publishing cannot fail in these scripts: the key it
//!   names was just deleted, so it is a string.
//! - Faults: [`SimNode::restart`] (no persistence: every key, the script cache and every
//!   connection lost; connection ids are never reused, so a stale id reads as closed).
//!   Freezes, latency and partial writes are the simulation's business: it just does not
//!   feed, delays, or splits.
//! - Bounds: a connection holding more than [`MAX_QUERY`] bytes of input with no complete
//!   command is closed without a reply; a `*` count above [`MAX_MULTIBULK`] or a bulk
//!   longer than [`MAX_QUERY`] is a protocol error; header and inline lines wait at most
//!   [`MAX_INLINE`] bytes for their end. That is Redis 7 configured with
//!   `client-query-buffer-limit 1mb` and `proto-max-bulk-len 1mb` (both the smallest
//!   allowed). As in Redis 7, while a password is required and the connection has not
//!   authenticated, a request of more than 10 arguments or a bulk over 16384 bytes is a
//!   protocol error.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

use quorumlock::__private::core::script::{
    ACQUIRE, ACQUIRE_SHA, EXTEND, EXTEND_ALL, EXTEND_ALL_SHA, EXTEND_SHA, FENCE, FENCE_SHA,
    RELEASE, RELEASE_ALL, RELEASE_ALL_SHA, RELEASE_FENCED, RELEASE_FENCED_SHA, RELEASE_SHA,
    RELEASED_PREFIX,
};

/// A time on one node's own clock, in nanoseconds.
pub type SimTime = u64;

/// Nanoseconds per millisecond.
pub const NS_PER_MS: SimTime = 1_000_000;

/// Nanoseconds per second.
pub const NS_PER_SEC: SimTime = 1_000 * NS_PER_MS;

/// Bytes of input a connection may hold without a complete command (and the longest bulk).
pub const MAX_QUERY: usize = 1 << 20;

/// The largest `*` count accepted (Redis 7's); [`MAX_QUERY`] bounds it in practice.
pub const MAX_MULTIBULK: i64 = i32::MAX as i64;

/// How long a `*`/`$` header line or an inline request may grow before it must end.
pub const MAX_INLINE: usize = 64 * 1024;

/// Release notices whose channels [`SimNode::take_published`] keeps; older ones are only
/// counted ([`SimNode::published`]), so a long simulation stays bounded.
pub const MAX_PUBLISHED: usize = 1024;

/// Number of databases (`SELECT 0` to `SELECT 15`).
pub const DATABASES: usize = 16;

const UNAUTH_MAX_MULTIBULK: i64 = 10;
const UNAUTH_MAX_BULK: i64 = 16384;

/// One client connection to a node. Never reused, even across restarts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConnId(u64);

/// Why a connection is (now) closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Closed {
    /// Fed after it was closed, after a restart, or never accepted: nothing was read.
    NotOpen,
    /// The request broke the protocol; the reply ends with the `-ERR Protocol error`.
    Protocol,
    /// More than [`MAX_QUERY`] bytes of input without a complete command. No reply for
    /// the incomplete command.
    QueryLimit,
    /// `QUIT` was answered `+OK`.
    Quit,
}

/// What one [`SimNode::feed`] produced.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Fed {
    /// Every reply, in order, for every complete command in the input so far.
    pub reply: Vec<u8>,
    /// Set if the connection is closed now (after `reply` is delivered).
    pub closed: Option<Closed>,
}

/// One live key, as seen by an invariant check.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct KeyView {
    /// Database index.
    pub db: usize,
    /// The key.
    pub key: Vec<u8>,
    /// Its value (for a lock: the holder's token).
    pub value: Vec<u8>,
    /// What `PTTL` would answer, in ms; `None` for a key without expiry.
    pub pttl_ms: Option<u64>,
}

#[derive(Clone, Debug)]
struct Entry {
    value: Vec<u8>,
    /// Absolute expiry on the node clock, in ms (Redis's `when`); `None`: never.
    expires_ms: Option<i64>,
}

impl Entry {
    fn expired(&self, now_ms: i64) -> bool {
        self.expires_ms.is_some_and(|when| now_ms > when)
    }
}

/// What a connection carries between commands.
#[derive(Clone, Debug)]
struct Session {
    db: usize,
    authed: bool,
}

/// One connection: its unread input and how far the command at its head is parsed.
#[derive(Clone, Debug)]
struct Conn {
    /// Input not yet consumed; `buf[start..]` is the command being parsed.
    buf: Vec<u8>,
    start: usize,
    /// Parse position.
    at: usize,
    /// Where the search for the current line's end resumes (all before it was searched).
    scan: usize,
    /// Bulks still to read, once the `*` header is read.
    want: Option<usize>,
    /// The arguments parsed so far, as ranges of `buf`.
    args: Vec<Range<usize>>,
    session: Session,
}

enum Parsed {
    /// `args` holds one complete command.
    Command,
    /// More input is needed.
    Wait,
    /// A protocol error, with Redis's text.
    Error(String),
}

impl Conn {
    fn new(authed: bool) -> Conn {
        Conn {
            buf: Vec::new(),
            start: 0,
            at: 0,
            scan: 0,
            want: None,
            args: Vec::new(),
            session: Session { db: 0, authed },
        }
    }

    /// Position of the next `delim` at or after `self.at`, resuming an earlier search.
    fn find(&mut self, delim: u8) -> Option<usize> {
        let from = self.scan.max(self.at);
        match self.buf[from..].iter().position(|&b| b == delim) {
            Some(i) => Some(from + i),
            None => {
                self.scan = self.buf.len();
                None
            }
        }
    }

    fn advance(&mut self, to: usize) {
        self.at = to;
        self.scan = to;
    }

    /// Parses as far as the input allows; stops at the first complete command.
    fn parse(&mut self, unauth: bool) -> Parsed {
        loop {
            match self.want {
                None => {
                    let Some(&first) = self.buf.get(self.at) else {
                        return Parsed::Wait;
                    };
                    if first != b'*' {
                        match self.parse_inline() {
                            Some(Parsed::Wait) => return Parsed::Wait,
                            Some(p) => return p,
                            // An empty line: nothing to run.
                            None => continue,
                        }
                    }
                    let Some(cr) = self.find(b'\r') else {
                        if self.buf.len() - self.at > MAX_INLINE {
                            return error("too big mbulk count string");
                        }
                        return Parsed::Wait;
                    };
                    let Some(&lf) = self.buf.get(cr + 1) else {
                        return Parsed::Wait;
                    };
                    if lf != b'\n' {
                        return error("expected '\\n' after '\\r'");
                    }
                    let count = string2ll(&self.buf[self.at + 1..cr]);
                    self.advance(cr + 2);
                    match count {
                        Some(n) if n > MAX_MULTIBULK => return error("invalid multibulk length"),
                        None => return error("invalid multibulk length"),
                        Some(n) if unauth && n > UNAUTH_MAX_MULTIBULK => {
                            return error("unauthenticated multibulk length");
                        }
                        // `*0` and `*-1` are empty requests: skipped without a reply.
                        Some(n) if n <= 0 => self.start = self.at,
                        Some(n) => self.want = Some(n as usize),
                    }
                }
                Some(0) => return Parsed::Command,
                Some(left) => {
                    let Some(cr) = self.find(b'\r') else {
                        if self.buf.len() - self.at > MAX_INLINE {
                            return error("too big bulk count string");
                        }
                        return Parsed::Wait;
                    };
                    let Some(&lf) = self.buf.get(cr + 1) else {
                        return Parsed::Wait;
                    };
                    if self.buf[self.at] != b'$' {
                        return error(&format!(
                            "expected '$', got '{}'",
                            char::from(self.buf[self.at])
                        ));
                    }
                    if lf != b'\n' {
                        return error("expected '\\n' after '\\r'");
                    }
                    let len = match string2ll(&self.buf[self.at + 1..cr]) {
                        Some(n) if (0..=MAX_QUERY as i64).contains(&n) => n,
                        _ => return error("invalid bulk length"),
                    };
                    if unauth && len > UNAUTH_MAX_BULK {
                        return error("unauthenticated bulk length");
                    }
                    let body = cr + 2;
                    let end = body + len as usize;
                    if self.buf.len() < end + 2 {
                        // The header is read again once the body is in: it is short.
                        self.scan = self.at;
                        return Parsed::Wait;
                    }
                    if &self.buf[end..end + 2] != b"\r\n" {
                        return error("expected '\\r\\n' after a bulk");
                    }
                    self.args.push(body..end);
                    self.advance(end + 2);
                    self.want = Some(left - 1);
                }
            }
        }
    }

    /// One inline request: `None` for an empty line (consumed).
    fn parse_inline(&mut self) -> Option<Parsed> {
        let Some(lf) = self.find(b'\n') else {
            if self.buf.len() - self.at > MAX_INLINE {
                return Some(error("too big inline request"));
            }
            return Some(Parsed::Wait);
        };
        let mut i = self.at;
        while i < lf {
            if self.buf[i].is_ascii_whitespace() {
                i += 1;
                continue;
            }
            let from = i;
            while i < lf && !self.buf[i].is_ascii_whitespace() {
                i += 1;
            }
            self.args.push(from..i);
        }
        self.advance(lf + 1);
        if self.args.is_empty() {
            self.start = self.at;
            return None;
        }
        self.want = Some(0);
        Some(Parsed::Command)
    }

    /// Forgets the command just run; the next one starts here.
    fn next_command(&mut self) {
        self.start = self.at;
        self.want = None;
        self.args.clear();
    }

    /// Drops consumed input, keeping the command being parsed.
    fn compact(&mut self) {
        let s = self.start;
        if s == 0 {
            return;
        }
        self.buf.drain(..s);
        self.start = 0;
        self.at -= s;
        self.scan -= s;
        for r in &mut self.args {
            *r = r.start - s..r.end - s;
        }
    }
}

fn error(msg: &str) -> Parsed {
    Parsed::Error(format!("ERR Protocol error: {msg}"))
}

/// Redis's `string2ll`: an optional `-`, then digits without leading zeros (or just `0`),
/// within `i64`.
pub fn string2ll(s: &[u8]) -> Option<i64> {
    if s.is_empty() || s.len() > 20 {
        return None;
    }
    if s == b"0" {
        return Some(0);
    }
    let (negative, digits) = match s.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, s),
    };
    if !matches!(digits.first(), Some(b'1'..=b'9')) {
        return None;
    }
    let mut v: u64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
    }
    if negative {
        if v > i64::MAX as u64 + 1 {
            return None;
        }
        Some(0i64.wrapping_sub(v as i64))
    } else {
        i64::try_from(v).ok()
    }
}

/// The scripts the node can run: the client's seven, known by their exact text or digest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Script {
    Release,
    Extend,
    Acquire,
    Fence,
    ReleaseAll,
    ExtendAll,
    ReleaseFenced,
}

impl Script {
    const ALL: [Script; 7] = [
        Script::Release,
        Script::Extend,
        Script::Acquire,
        Script::Fence,
        Script::ReleaseAll,
        Script::ExtendAll,
        Script::ReleaseFenced,
    ];

    fn text(self) -> &'static [u8] {
        match self {
            Script::Release => RELEASE,
            Script::Extend => EXTEND,
            Script::Acquire => ACQUIRE,
            Script::Fence => FENCE,
            Script::ReleaseAll => RELEASE_ALL,
            Script::ExtendAll => EXTEND_ALL,
            Script::ReleaseFenced => RELEASE_FENCED,
        }
    }

    fn sha(self) -> &'static [u8; 40] {
        match self {
            Script::Release => RELEASE_SHA,
            Script::Extend => EXTEND_SHA,
            Script::Acquire => ACQUIRE_SHA,
            Script::Fence => FENCE_SHA,
            Script::ReleaseAll => RELEASE_ALL_SHA,
            Script::ExtendAll => EXTEND_ALL_SHA,
            Script::ReleaseFenced => RELEASE_FENCED_SHA,
        }
    }

    fn by_text(text: &[u8]) -> Option<Script> {
        Script::ALL.into_iter().find(|s| s.text() == text)
    }

    fn by_sha(sha: &[u8]) -> Option<Script> {
        // Redis lowercases the digest before looking it up.
        Script::ALL
            .into_iter()
            .find(|s| sha.eq_ignore_ascii_case(s.sha()))
    }
}

/// What a script returned, before Redis turns it into a reply.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Lua {
    /// `return false`: a nil reply.
    False,
    /// `return redis.status_reply("OK")`.
    Ok,
    /// A number (every Lua number is a double).
    Number(f64),
}

/// A Lua error a script raised, as Redis words it before naming the script.
type Raised = Vec<u8>;

/// What `redis.call` raises when given nil (a `KEYS[i]` or `ARGV[i]` past the end).
const LUA_ARGS: &[u8] = b"ERR Lua redis lib command arguments must be strings or integers";

/// A runtime error of the script's own code (not of a command it calls), with the place
/// Lua names: every script is one line.
fn lua_error(msg: &str) -> Raised {
    format!("ERR user_script:1: {msg}").into_bytes()
}

/// A value handed to `redis.call`: nil (`None`) raises before the command runs.
fn lua_arg(v: Option<&[u8]>) -> Result<&[u8], Raised> {
    v.ok_or_else(|| LUA_ARGS.to_vec())
}

/// Lua's `==` between what `GET` gave (a string, or `false` for none) and an `ARGV[i]`
/// (a string, or nil): `false == nil` is false, so a missing key never matches.
fn lua_same(got: Option<&[u8]>, want: Option<&[u8]>) -> bool {
    got.is_some() && got == want
}

/// `KEYS[i]` for a Lua number `i`: nil unless `i` is a whole number within the table.
fn lua_index<'a>(table: &[&'a [u8]], i: f64) -> Option<&'a [u8]> {
    // NaN and the infinities have no zero fraction: nil.
    if i.fract() != 0.0 || i < 1.0 || i > table.len() as f64 {
        return None;
    }
    Some(table[i as usize - 1])
}

/// The values `i` takes in Lua 5.1's `for i=init,limit do`: step 1 in doubles, computed
/// as its FORPREP/FORLOOP do (`init - 1`, then `+ 1` while not past `limit`; none if
/// either is NaN). Unbounded for a huge limit: the scripts' loops end by indexing `KEYS`
/// past its end, which raises, as in Redis.
fn lua_for(init: f64, limit: f64) -> impl Iterator<Item = f64> {
    std::iter::successors(Some(init - 1.0), |i| Some(i + 1.0))
        .skip(1)
        .take_while(move |&i| i <= limit)
}

/// C's `isspace` in the C locale (`\v` included, unlike `u8::is_ascii_whitespace`).
fn c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// Lua 5.1's `tonumber(s)` of a string in Redis 7: `luaO_str2d` over glibc's `strtod`,
/// which reads the C string (up to a NUL), skips white space before it and allows only
/// white space after it. `None`: nil.
fn lua_tonumber(s: &[u8]) -> Option<f64> {
    let s = c_str(s, usize::MAX);
    let from = s.iter().position(|&b| !c_space(b))?;
    let to = s.iter().rposition(|&b| !c_space(b))? + 1;
    let s = &s[from..to];
    let (negative, body) = match s.split_first() {
        Some((b'-', rest)) => (true, rest),
        Some((b'+', rest)) => (false, rest),
        _ => (false, s),
    };
    let v = match body {
        [b'0', x, hex @ ..] if x.eq_ignore_ascii_case(&b'x') => hex_number(hex)?,
        _ => {
            let text = std::str::from_utf8(body).ok()?;
            let nan_chars = text
                .get(..4)
                .filter(|head| head.eq_ignore_ascii_case("nan("))
                .and_then(|_| text[4..].strip_suffix(')'));
            match nan_chars {
                Some(chars)
                    if chars
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'_') =>
                {
                    f64::NAN
                }
                // Rust's grammar is `strtod`'s decimal one plus `inf`, `infinity`, `nan`
                // (any case); its sign is already taken, a second one is not `strtod`'s.
                _ if !body.starts_with(b"+") && !body.starts_with(b"-") => text.parse().ok()?,
                _ => return None,
            }
        }
    };
    Some(if negative { -v } else { v })
}

/// The part of a `strtod` hexadecimal number after `0x`: hex digits with an optional `.`
/// (at least one digit), then optionally `p` and a signed decimal power of two. Exact
/// for up to 53 significant bits in the normal range (see the module docs).
fn hex_number(s: &[u8]) -> Option<f64> {
    let (mantissa, power) = match s.iter().position(|b| b.eq_ignore_ascii_case(&b'p')) {
        Some(p) => (&s[..p], Some(&s[p + 1..])),
        None => (s, None),
    };
    let (int, frac) = match mantissa.iter().position(|&b| b == b'.') {
        Some(dot) => (&mantissa[..dot], &mantissa[dot + 1..]),
        None => (mantissa, &b""[..]),
    };
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    let mut v = 0.0f64;
    for &d in int.iter().chain(frac) {
        v = v * 16.0 + f64::from(char::from(d).to_digit(16)?);
    }
    let mut exp = -4 * frac.len() as i64;
    if let Some(p) = power {
        let (negative, digits) = match p.split_first() {
            Some((b'-', rest)) => (true, rest),
            Some((b'+', rest)) => (false, rest),
            _ => (false, p),
        };
        if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        // Far past any double's range either way: saturate.
        let n = digits
            .iter()
            .fold(0i64, |n, d| (n * 10 + i64::from(d - b'0')).min(1 << 20));
        exp += if negative { -n } else { n };
    }
    // In two halves, so that a large mantissa with a small power does not underflow early.
    let exp = exp.clamp(-(1 << 21), 1 << 21) as i32;
    Some(v * 2f64.powi(exp / 2) * 2f64.powi(exp - exp / 2))
}

/// A number a script returns, as Redis replies it: C's `(long long)` cast, which truncates
/// toward zero; out of range or NaN, x86-64 gives `i64::MIN` (C leaves it undefined).
fn lua_integer(x: f64) -> i64 {
    const LIMIT: f64 = 9_223_372_036_854_775_808.0; // 2^63
    if x.is_nan() || !(-LIMIT..LIMIT).contains(&x) {
        i64::MIN
    } else {
        x as i64
    }
}

/// The commands the node knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cmd {
    Ping,
    Auth,
    Select,
    Set,
    Get,
    Del,
    Pexpire,
    Pttl,
    Eval,
    EvalSha,
    Script,
    Info,
    Quit,
}

impl Cmd {
    /// The command, its name as Redis prints it, and its arity (negative: at least).
    fn lookup(name: &[u8]) -> Option<(Cmd, &'static str, i64)> {
        const TABLE: [(Cmd, &str, i64); 13] = [
            (Cmd::Ping, "ping", -1),
            (Cmd::Auth, "auth", -2),
            (Cmd::Select, "select", 2),
            (Cmd::Set, "set", -3),
            (Cmd::Get, "get", 2),
            (Cmd::Del, "del", -2),
            (Cmd::Pexpire, "pexpire", -3),
            (Cmd::Pttl, "pttl", 2),
            (Cmd::Eval, "eval", -3),
            (Cmd::EvalSha, "evalsha", -3),
            (Cmd::Script, "script", -2),
            (Cmd::Info, "info", -1),
            (Cmd::Quit, "quit", -1),
        ];
        TABLE
            .iter()
            .find(|(_, n, _)| name.eq_ignore_ascii_case(n.as_bytes()))
            .copied()
    }
}

fn arity_ok(arity: i64, argc: usize) -> bool {
    let argc = argc as i64;
    if arity >= 0 {
        argc == arity
    } else {
        argc >= -arity
    }
}

/// Reply writers.
fn simple(out: &mut Vec<u8>, s: &[u8]) {
    out.push(b'+');
    out.extend_from_slice(s);
    out.extend_from_slice(b"\r\n");
}

fn int(out: &mut Vec<u8>, n: i64) {
    out.extend_from_slice(format!(":{n}\r\n").as_bytes());
}

fn bulk(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(format!("${}\r\n", b.len()).as_bytes());
    out.extend_from_slice(b);
    out.extend_from_slice(b"\r\n");
}

fn nil(out: &mut Vec<u8>) {
    out.extend_from_slice(b"$-1\r\n");
}

/// An error reply; as Redis does, any CR or LF in it becomes a space.
fn err(out: &mut Vec<u8>, msg: &[u8]) {
    out.push(b'-');
    out.extend(
        msg.iter()
            .map(|&b| if b == b'\r' || b == b'\n' { b' ' } else { b }),
    );
    out.extend_from_slice(b"\r\n");
}

const NOT_INTEGER: &[u8] = b"ERR value is not an integer or out of range";
const SYNTAX: &[u8] = b"ERR syntax error";

/// `%.*s` of C: at most `max` bytes, stopping at a NUL.
fn c_str(b: &[u8], max: usize) -> &[u8] {
    let b = &b[..b.len().min(max)];
    match b.iter().position(|&c| c == 0) {
        Some(nul) => &b[..nul],
        None => b,
    }
}

/// A simulated Redis 7 master.
/// `Clone`: the model checker (`tests/model.rs`) forks a world at each choice.
#[derive(Clone, Debug)]
pub struct SimNode {
    seed: u64,
    rng: fastrand::Rng,
    run_id: [u8; 40],
    /// When this run started on the node's clock; `None`: a day before its time 0.
    started: Option<SimTime>,
    /// Where the node's clock stands within the wall clock's whole second: wall-clock
    /// time is node time plus this (below [`NS_PER_SEC`]), for `uptime_in_seconds`.
    phase: SimTime,
    next_conn: u64,
    conns: BTreeMap<u64, Conn>,
    dbs: Vec<BTreeMap<Vec<u8>, Entry>>,
    /// The script cache.
    scripts: BTreeSet<Script>,
    /// `requirepass`: the default user's password; `None`: the default user is `nopass`.
    password: Option<Vec<u8>>,
    /// Other ACL users, by name and password.
    users: Vec<(Vec<u8>, Vec<u8>)>,
    restarts: u64,
    commands: u64,
    /// Release notices published by the scripts, ever.
    published: u64,
    /// The channels of the latest of them, oldest first (at most [`MAX_PUBLISHED`]).
    notices: std::collections::VecDeque<Vec<u8>>,
}

impl SimNode {
    /// An empty node without a password. `seed` makes its run id (a new one at every
    /// restart); nothing a command answers depends on it.
    pub fn new(seed: u64) -> SimNode {
        let mut rng = fastrand::Rng::with_seed(seed);
        let run_id = run_id(&mut rng);
        SimNode {
            seed,
            rng,
            run_id,
            started: None,
            phase: wall_phase(seed),
            next_conn: 1,
            conns: BTreeMap::new(),
            dbs: vec![BTreeMap::new(); DATABASES],
            scripts: BTreeSet::new(),
            password: None,
            users: Vec::new(),
            restarts: 0,
            commands: 0,
            published: 0,
            notices: std::collections::VecDeque::new(),
        }
    }

    /// The seed given to [`SimNode::new`].
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Sets `requirepass` (the default user's password), or removes it. Connections
    /// accepted from now on start unauthenticated while one is set; open ones keep their
    /// state, as in Redis.
    pub fn set_password(&mut self, password: Option<&[u8]>) {
        self.password = password.map(<[u8]>::to_vec);
    }

    /// Adds an ACL user that `AUTH user pass` accepts.
    pub fn add_user(&mut self, user: &[u8], password: &[u8]) {
        self.users.push((user.to_vec(), password.to_vec()));
    }

    /// A new client connection.
    pub fn accept(&mut self) -> ConnId {
        let id = self.next_conn;
        self.next_conn += 1;
        self.conns.insert(id, Conn::new(self.password.is_none()));
        ConnId(id)
    }

    /// Closes `conn` (the client hung up, or the simulation cut it). Input not yet parsed
    /// is dropped. Closing a closed connection does nothing.
    pub fn close(&mut self, conn: ConnId) {
        self.conns.remove(&conn.0);
    }

    /// Whether `conn` is open.
    pub fn is_open(&self, conn: ConnId) -> bool {
        self.conns.contains_key(&conn.0)
    }

    /// Number of open connections.
    pub fn connections(&self) -> usize {
        self.conns.len()
    }

    /// Bytes of input `conn` holds for a command not complete yet (0 if closed).
    pub fn buffered(&self, conn: ConnId) -> usize {
        self.conns.get(&conn.0).map_or(0, |c| c.buf.len() - c.start)
    }

    /// Feeds `bytes` read from `conn` at node time `now`: runs every command completed
    /// by them, in order, and returns the replies. Input that does not complete a
    /// command is kept for the next feed.
    pub fn feed(&mut self, conn: ConnId, bytes: &[u8], now: SimTime) -> Fed {
        let mut fed = Fed::default();
        let Some(mut c) = self.conns.remove(&conn.0) else {
            fed.closed = Some(Closed::NotOpen);
            return fed;
        };
        c.buf.extend_from_slice(bytes);
        loop {
            let unauth = self.password.is_some() && !c.session.authed;
            match c.parse(unauth) {
                Parsed::Wait => break,
                Parsed::Error(msg) => {
                    err(&mut fed.reply, msg.as_bytes());
                    fed.closed = Some(Closed::Protocol);
                    return fed;
                }
                Parsed::Command => {
                    let Conn {
                        buf, args, session, ..
                    } = &mut c;
                    let argv: Vec<&[u8]> = args.iter().map(|r| &buf[r.clone()]).collect();
                    let quit = self.execute(session, &argv, now, &mut fed.reply);
                    c.next_command();
                    if quit {
                        fed.closed = Some(Closed::Quit);
                        return fed;
                    }
                }
            }
        }
        c.compact();
        if c.buf.len() > MAX_QUERY {
            fed.closed = Some(Closed::QueryLimit);
            return fed;
        }
        self.conns.insert(conn.0, c);
        fed
    }

    /// A restart without persistence at `now` (its uptime counts from the wall-clock
    /// second `now` falls in: see [`SimNode::wall_phase`]): every key, the script cache
    /// and every connection are lost. The password and users are configuration: they
    /// stay.
    pub fn restart(&mut self, now: SimTime) {
        self.started = Some(now);
        self.conns.clear();
        for db in &mut self.dbs {
            db.clear();
        }
        self.scripts.clear();
        self.restarts += 1;
        self.run_id = run_id(&mut self.rng);
    }

    /// Where the node's clock stands within the wall clock's whole second, fixed by the
    /// seed and below [`NS_PER_SEC`]: node time `t` is wall-clock second
    /// `floor((t + phase) / 1 s)`, and `uptime_in_seconds` is the difference of two such
    /// seconds, as Redis's is of two `time(NULL)` readings.
    pub fn wall_phase(&self) -> SimTime {
        self.phase
    }

    /// `uptime_in_seconds` at node time `now`: whole wall-clock seconds now, minus those
    /// at the start (a day before time 0 for a node never restarted). It can exceed the
    /// real uptime by up to, not including, 1 s, and falls short of it by less than 1 s.
    /// A clock set back past the start reads 0 (Redis would print a negative number).
    pub fn uptime_secs(&self, now: SimTime) -> u64 {
        let second = |t: SimTime| (u128::from(t) + u128::from(self.phase)) / u128::from(NS_PER_SEC);
        let start = match self.started {
            Some(at) => second(at) as i128,
            None => -86_400,
        };
        (second(now) as i128 - start).max(0) as u64
    }

    /// Feeds into `h` everything of the node's state that a later command can observe:
    /// its run, every key with its value and absolute expiry, the script cache, and each
    /// connection's unparsed input and session, under the label `label` gives its id
    /// (so two worlds that opened the same connections in another order hash alike).
    /// Counters that no command reads (commands run, notices published) are left out.
    pub fn fingerprint<H: std::hash::Hasher>(&self, h: &mut H, label: impl Fn(ConnId) -> u64) {
        use std::hash::Hash;
        self.run_id.hash(h);
        self.started.hash(h);
        for (db, keys) in self.dbs.iter().enumerate() {
            for (key, e) in keys {
                (db, key, &e.value, e.expires_ms).hash(h);
            }
        }
        for s in &self.scripts {
            (*s as u8).hash(h);
        }
        let mut conns: Vec<(u64, &Conn)> = self
            .conns
            .iter()
            .map(|(&id, c)| (label(ConnId(id)), c))
            .collect();
        conns.sort_by_key(|&(l, _)| l);
        for (l, c) in conns {
            (l, &c.buf[c.start..], c.session.db, c.session.authed).hash(h);
        }
    }

    /// Number of restarts so far.
    pub fn restarts(&self) -> u64 {
        self.restarts
    }

    /// This run's id (changes at every restart), as `INFO` would print it.
    pub fn run_id(&self) -> &[u8; 40] {
        &self.run_id
    }

    /// Number of commands run so far (across restarts; protocol errors are not commands).
    pub fn commands(&self) -> u64 {
        self.commands
    }

    /// Release notices the scripts have published so far (across restarts).
    pub fn published(&self) -> u64 {
        self.published
    }

    /// The channels of the release notices published since the last call, oldest first
    /// (only the latest [`MAX_PUBLISHED`]).
    pub fn take_published(&mut self) -> Vec<Vec<u8>> {
        self.notices.drain(..).collect()
    }

    /// Whether the script with SHA1 `sha` is in the cache.
    pub fn script_cached(&self, sha: &[u8]) -> bool {
        Script::by_sha(sha).is_some_and(|s| self.scripts.contains(&s))
    }

    /// Deletes every key expired at node time `now`; returns how many.
    pub fn expire_all(&mut self, now: SimTime) -> usize {
        let now_ms = ms(now);
        let mut gone = 0;
        for db in &mut self.dbs {
            let before = db.len();
            db.retain(|_, e| !e.expired(now_ms));
            gone += before - db.len();
        }
        gone
    }

    /// Every key alive at node time `now`, by database and key.
    pub fn keys(&self, now: SimTime) -> Vec<KeyView> {
        let now_ms = ms(now);
        let mut out = Vec::new();
        for (db, keys) in self.dbs.iter().enumerate() {
            for (key, e) in keys {
                if e.expired(now_ms) {
                    continue;
                }
                out.push(KeyView {
                    db,
                    key: key.clone(),
                    value: e.value.clone(),
                    pttl_ms: e.expires_ms.map(|when| (when - now_ms).max(0) as u64),
                });
            }
        }
        out
    }

    /// The value of `key` in database `db` at node time `now`, if it is alive.
    pub fn value(&self, db: usize, key: &[u8], now: SimTime) -> Option<&[u8]> {
        let e = self.dbs.get(db)?.get(key)?;
        (!e.expired(ms(now))).then_some(e.value.as_slice())
    }

    /// The key, after deleting it if it has expired (Redis's `expireIfNeeded`).
    fn lookup(&mut self, db: usize, key: &[u8], now_ms: i64) -> Option<&mut Entry> {
        let keys = &mut self.dbs[db];
        if keys.get(key).is_some_and(|e| e.expired(now_ms)) {
            keys.remove(key);
        }
        keys.get_mut(key)
    }

    /// Runs one command; true if the connection must close (`QUIT`).
    fn execute(
        &mut self,
        s: &mut Session,
        argv: &[&[u8]],
        now: SimTime,
        out: &mut Vec<u8>,
    ) -> bool {
        self.commands += 1;
        let now_ms = ms(now);
        let Some((cmd, name, arity)) = Cmd::lookup(argv[0]) else {
            unknown_command(out, argv);
            return false;
        };
        if !arity_ok(arity, argv.len()) {
            err(
                out,
                format!("ERR wrong number of arguments for '{name}' command").as_bytes(),
            );
            return false;
        }
        if !s.authed && self.password.is_some() && !matches!(cmd, Cmd::Auth | Cmd::Quit) {
            err(out, b"NOAUTH Authentication required.");
            return false;
        }
        match cmd {
            Cmd::Ping => match argv.len() {
                1 => simple(out, b"PONG"),
                2 => bulk(out, argv[1]),
                _ => err(out, b"ERR wrong number of arguments for 'ping' command"),
            },
            Cmd::Quit => {
                simple(out, b"OK");
                return true;
            }
            // Any section list answers the server section: all the client asks for.
            Cmd::Info => {
                let uptime = self.uptime_secs(now);
                let text = format!(
                    "# Server\r\nredis_version:7.0.15\r\nrun_id:{}\r\nuptime_in_seconds:{uptime}\r\n",
                    String::from_utf8_lossy(&self.run_id)
                );
                bulk(out, text.as_bytes());
            }
            Cmd::Auth => self.auth(s, argv, out),
            Cmd::Select => match string2ll(argv[1]) {
                Some(n) if (0..DATABASES as i64).contains(&n) => {
                    s.db = n as usize;
                    simple(out, b"OK");
                }
                Some(n) if i32::try_from(n).is_ok() => err(out, b"ERR DB index is out of range"),
                Some(_) => err(
                    out,
                    b"ERR value is out of range, value must between -2147483648 and 2147483647",
                ),
                None => err(out, NOT_INTEGER),
            },
            Cmd::Set => match self.set(s.db, argv, now_ms) {
                Ok(true) => simple(out, b"OK"),
                Ok(false) => nil(out),
                Err(e) => err(out, e),
            },
            Cmd::Get => match self.lookup(s.db, argv[1], now_ms) {
                Some(e) => bulk(out, &e.value),
                None => nil(out),
            },
            Cmd::Del => {
                let mut n = 0;
                for key in &argv[1..] {
                    if self.lookup(s.db, key, now_ms).is_some() {
                        self.dbs[s.db].remove(*key);
                        n += 1;
                    }
                }
                int(out, n);
            }
            Cmd::Pexpire => match self.pexpire(s.db, argv[1], argv[2], &argv[3..], now_ms) {
                Ok(done) => int(out, i64::from(done)),
                Err(e) => err(out, &e),
            },
            Cmd::Pttl => match self.lookup(s.db, argv[1], now_ms) {
                None => int(out, -2),
                Some(Entry {
                    expires_ms: None, ..
                }) => int(out, -1),
                Some(Entry {
                    expires_ms: Some(when),
                    ..
                }) => int(out, (*when - now_ms).max(0)),
            },
            Cmd::Eval | Cmd::EvalSha => self.eval(s.db, cmd == Cmd::EvalSha, argv, now_ms, out),
            Cmd::Script => self.script(argv, out),
        }
        false
    }

    fn auth(&mut self, s: &mut Session, argv: &[&[u8]], out: &mut Vec<u8>) {
        let (user, pass): (&[u8], &[u8]) = match argv.len() {
            2 => (b"default", argv[1]),
            3 => (argv[1], argv[2]),
            _ => return err(out, SYNTAX),
        };
        if argv.len() == 2 && self.password.is_none() {
            return err(
                out,
                b"ERR AUTH <password> called without any password configured for the \
                  default user. Are you sure your configuration is correct?",
            );
        }
        let ok = if user == b"default" {
            self.password.as_deref().is_none_or(|p| p == pass)
        } else {
            self.users.iter().any(|(u, p)| u == user && p == pass)
        };
        if ok {
            s.authed = true;
            simple(out, b"OK");
        } else {
            err(
                out,
                b"WRONGPASS invalid username-password pair or user is disabled.",
            );
        }
    }

    /// `SET key value [NX|XX] [EX s|PX ms|KEEPTTL]`: `Ok(false)` when NX or XX refused
    /// (a nil reply), `Err` the error text.
    fn set(&mut self, db: usize, argv: &[&[u8]], now_ms: i64) -> Result<bool, &'static [u8]> {
        let (key, value) = (argv[1], argv[2]);
        let (mut nx, mut xx, mut keepttl) = (false, false, false);
        // The expiry argument and its unit in ms.
        let mut expire: Option<(&[u8], i64)> = None;
        let mut i = 3;
        while i < argv.len() {
            let opt = argv[i];
            let next = argv.get(i + 1);
            if opt.eq_ignore_ascii_case(b"NX") && !xx {
                nx = true;
            } else if opt.eq_ignore_ascii_case(b"XX") && !nx {
                xx = true;
            } else if opt.eq_ignore_ascii_case(b"KEEPTTL") && expire.is_none() {
                keepttl = true;
            } else if (opt.eq_ignore_ascii_case(b"PX") || opt.eq_ignore_ascii_case(b"EX"))
                && !keepttl
                && expire.is_none()
                && next.is_some()
            {
                let unit = if opt.eq_ignore_ascii_case(b"EX") {
                    1000
                } else {
                    1
                };
                expire = next.map(|n| (*n, unit));
                i += 1;
            } else {
                return Err(SYNTAX);
            }
            i += 1;
        }
        let when = match expire {
            None => None,
            Some((raw, unit)) => {
                let Some(n) = string2ll(raw) else {
                    return Err(NOT_INTEGER);
                };
                match n
                    .checked_mul(unit)
                    .filter(|&ms| n > 0 && ms > 0)
                    .and_then(|ms| ms.checked_add(now_ms))
                {
                    Some(when) => Some(when),
                    None => return Err(b"ERR invalid expire time in 'set' command"),
                }
            }
        };
        let old = self.lookup(db, key, now_ms).map(|e| e.expires_ms);
        if (nx && old.is_some()) || (xx && old.is_none()) {
            return Ok(false);
        }
        let expires_ms = if keepttl { old.flatten() } else { when };
        self.dbs[db].insert(
            key.to_vec(),
            Entry {
                value: value.to_vec(),
                expires_ms,
            },
        );
        Ok(true)
    }

    /// `PEXPIRE key ms [NX|XX|GT|LT]`: false (`:0`) for a missing key or an unmet
    /// condition, true (`:1`) otherwise (deleting the key if the new expiry is not in the
    /// future). `Err`: the error text.
    fn pexpire(
        &mut self,
        db: usize,
        key: &[u8],
        raw: &[u8],
        options: &[&[u8]],
        now_ms: i64,
    ) -> Result<bool, Vec<u8>> {
        let (mut nx, mut xx, mut gt, mut lt) = (false, false, false, false);
        for opt in options {
            let flag = match opt.to_ascii_uppercase().as_slice() {
                b"NX" => &mut nx,
                b"XX" => &mut xx,
                b"GT" => &mut gt,
                b"LT" => &mut lt,
                _ => return Err([&b"ERR Unsupported option "[..], c_str(opt, usize::MAX)].concat()),
            };
            *flag = true;
        }
        if nx && (xx || gt || lt) {
            return Err(
                b"ERR NX and XX, GT or LT options at the same time are not compatible".to_vec(),
            );
        }
        if gt && lt {
            return Err(b"ERR GT and LT options at the same time are not compatible".to_vec());
        }
        let n = string2ll(raw).ok_or_else(|| NOT_INTEGER.to_vec())?;
        let when = n
            .checked_add(now_ms)
            .ok_or_else(|| b"ERR invalid expire time in 'pexpire' command".to_vec())?;
        let refused = |current: Option<i64>| match current {
            // No expiry counts as an infinite one.
            None => xx || gt,
            Some(cur) => nx || (gt && when <= cur) || (lt && when >= cur),
        };
        match self.lookup(db, key, now_ms) {
            None => Ok(false),
            Some(e) if refused(e.expires_ms) => Ok(false),
            Some(_) if when <= now_ms => {
                self.dbs[db].remove(key);
                Ok(true)
            }
            Some(e) => {
                e.expires_ms = Some(when);
                Ok(true)
            }
        }
    }

    fn eval(&mut self, db: usize, by_sha: bool, argv: &[&[u8]], now_ms: i64, out: &mut Vec<u8>) {
        let Some(numkeys) = string2ll(argv[2]) else {
            return err(out, NOT_INTEGER);
        };
        if numkeys > argv.len() as i64 - 3 {
            return err(
                out,
                b"ERR Number of keys can't be greater than number of args",
            );
        }
        if numkeys < 0 {
            return err(out, b"ERR Number of keys can't be negative");
        }
        let script = if by_sha {
            match Script::by_sha(argv[1]).filter(|s| self.scripts.contains(s)) {
                Some(s) => s,
                None => return err(out, b"NOSCRIPT No matching script. Please use EVAL."),
            }
        } else {
            match Script::by_text(argv[1]) {
                Some(s) => {
                    self.scripts.insert(s);
                    s
                }
                None => {
                    return err(out, b"ERR sim: only the client's scripts are modelled");
                }
            }
        };
        let (keys, args) = argv[3..].split_at(numkeys as usize);
        match self.run_script(db, script, keys, args, now_ms) {
            Ok(Lua::False) => nil(out),
            Ok(Lua::Ok) => simple(out, b"OK"),
            Ok(Lua::Number(x)) => int(out, lua_integer(x)),
            Err(raised) => {
                let place = b" script: "
                    .iter()
                    .chain(script.sha())
                    .chain(b", on @user_script:1.");
                err(
                    out,
                    &raised
                        .into_iter()
                        .chain(place.copied())
                        .collect::<Vec<u8>>(),
                );
            }
        }
    }

    /// Runs `script` with `KEYS` and `ARGV` as Redis 7 runs its Lua (quoted above each).
    fn run_script(
        &mut self,
        db: usize,
        script: Script,
        keys: &[&[u8]],
        args: &[&[u8]],
        now_ms: i64,
    ) -> Result<Lua, Raised> {
        let argv = |i: usize| args.get(i - 1).copied();
        match script {
            // if redis.call("get",KEYS[1]) == ARGV[1] then local d=redis.call("del",KEYS[1])
            // redis.pcall("publish","quorumlock:released:"..KEYS[1],"") return d
            // else return 0 end
            Script::Release => {
                let key = keys.first().copied();
                if !lua_same(self.call_get(db, key, now_ms)?.as_deref(), argv(1)) {
                    return Ok(Lua::Number(0.0));
                }
                let d = self.call_del(db, key, now_ms)?;
                self.call_publish(key)?;
                Ok(Lua::Number(d as f64))
            }
            // if redis.call("get",KEYS[1]) == ARGV[1] then return
            // redis.call("pexpire",KEYS[1],ARGV[2]) else return 0 end
            Script::Extend => {
                let key = keys.first().copied();
                if !lua_same(self.call_get(db, key, now_ms)?.as_deref(), argv(1)) {
                    return Ok(Lua::Number(0.0));
                }
                let done = self.call_pexpire(db, key, argv(2), now_ms)?;
                Ok(Lua::Number(f64::from(u8::from(done))))
            }
            Script::Acquire => self.acquire(db, keys, args, now_ms),
            Script::Fence => self.fence(db, keys, args, now_ms),
            // local n=0 for i=1,#KEYS do if redis.call("get",KEYS[i])==ARGV[1] then
            // redis.call("del",KEYS[i]) redis.pcall("publish","quorumlock:released:"..KEYS[i],"")
            // n=n+1 end end if n==#KEYS then return 1 end return 0
            Script::ReleaseAll => {
                let mut n = 0;
                for &key in keys {
                    if lua_same(self.call_get(db, Some(key), now_ms)?.as_deref(), argv(1)) {
                        self.call_del(db, Some(key), now_ms)?;
                        self.call_publish(Some(key))?;
                        n += 1;
                    }
                }
                Ok(Lua::Number(if n == keys.len() { 1.0 } else { 0.0 }))
            }
            // for i=1,#KEYS do if redis.call("get",KEYS[i])~=ARGV[1] then return 0 end end
            // for i=1,#KEYS do redis.call("pexpire",KEYS[i],ARGV[2]) end return 1
            Script::ExtendAll => {
                for &key in keys {
                    if !lua_same(self.call_get(db, Some(key), now_ms)?.as_deref(), argv(1)) {
                        return Ok(Lua::Number(0.0));
                    }
                }
                for &key in keys {
                    self.call_pexpire(db, Some(key), argv(2), now_ms)?;
                }
                Ok(Lua::Number(1.0))
            }
            Script::ReleaseFenced => self.release_fenced(db, keys, args, now_ms),
        }
    }

    /// `ACQUIRE`, with `n` lock keys then fence counters:
    ///
    /// ```lua
    /// local n=tonumber(ARGV[3])
    /// for i=1,n do if redis.call("exists",KEYS[i])==1 then return false end end
    /// for i=1,n do redis.call("set",KEYS[i],ARGV[1],"px",ARGV[2]) end
    /// if #KEYS==n then return redis.status_reply("OK") end
    /// local m=0
    /// for i=n+1,#KEYS do local c=tonumber(redis.call("get",KEYS[i]))
    ///   if c and c>m then m=c end end
    /// return m
    /// ```
    fn acquire(
        &mut self,
        db: usize,
        keys: &[&[u8]],
        args: &[&[u8]],
        now_ms: i64,
    ) -> Result<Lua, Raised> {
        // Its first use is as a `for` limit: nil fails there.
        let Some(n) = args.get(2).and_then(|a| lua_tonumber(a)) else {
            return Err(lua_error("'for' limit must be a number"));
        };
        for i in lua_for(1.0, n) {
            if self.call_exists(db, lua_index(keys, i), now_ms)? {
                return Ok(Lua::False);
            }
        }
        let (token, ttl) = (args.first().copied(), args.get(1).copied());
        for i in lua_for(1.0, n) {
            let set = [lua_index(keys, i), token, Some(&b"px"[..]), ttl];
            self.call_set(db, &set, now_ms)?;
        }
        if keys.len() as f64 == n {
            return Ok(Lua::Ok);
        }
        let mut m = 0.0;
        for i in lua_for(n + 1.0, keys.len() as f64) {
            let value = self.call_get(db, lua_index(keys, i), now_ms)?;
            // `c>m` is false for NaN: a counter reading `nan` is skipped too.
            if let Some(c) = value.and_then(|v| lua_tonumber(&v)).filter(|&c| c > m) {
                m = c;
            }
        }
        Ok(Lua::Number(m))
    }

    /// `FENCE`, with `n = #KEYS/2` lock keys then their fence counters:
    ///
    /// ```lua
    /// local n=#KEYS/2 local f=tonumber(ARGV[2])
    /// for i=1,n do local c=tonumber(redis.call("get",KEYS[n+i]))
    ///   if not c or c<f then redis.call("set",KEYS[n+i],ARGV[2]) end end
    /// for i=1,n do if redis.call("get",KEYS[i])~=ARGV[1] then return 0 end end
    /// return 1
    /// ```
    ///
    /// `n` is a double, as in `RELEASE_FENCED`: for an odd `#KEYS`, `KEYS[n+1]` has a half
    /// and is nil, so the first `get` raises before any write.
    fn fence(
        &mut self,
        db: usize,
        keys: &[&[u8]],
        args: &[&[u8]],
        now_ms: i64,
    ) -> Result<Lua, Raised> {
        let n = keys.len() as f64 / 2.0;
        let (token, raw) = (args.first().copied(), args.get(1).copied());
        for i in lua_for(1.0, n) {
            self.raise_counter(db, lua_index(keys, n + i), raw, now_ms)?;
        }
        for i in lua_for(1.0, n) {
            if !lua_same(
                self.call_get(db, lua_index(keys, i), now_ms)?.as_deref(),
                token,
            ) {
                return Ok(Lua::Number(0.0));
            }
        }
        Ok(Lua::Number(1.0))
    }

    /// `local c=tonumber(redis.call("get",counter)) if not c or c<f then
    /// redis.call("set",counter,raw) end`, with `f=tonumber(raw)`: the raise both
    /// `FENCE` and `RELEASE_FENCED` make.
    fn raise_counter(
        &mut self,
        db: usize,
        counter: Option<&[u8]>,
        raw: Option<&[u8]>,
        now_ms: i64,
    ) -> Result<(), Raised> {
        let c = self
            .call_get(db, counter, now_ms)?
            .and_then(|v| lua_tonumber(&v));
        let lower = match (c, raw.and_then(lua_tonumber)) {
            // `not c` short-circuits: a missing or non-numeric counter is written
            // without comparing, whatever the fence is.
            (None, _) => true,
            (Some(c), Some(f)) => c < f,
            (Some(_), None) => return Err(lua_error("attempt to compare number with nil")),
        };
        if lower {
            // The text as given, not the number: `0x10` is stored as `0x10`.
            self.call_set(db, &[counter, raw], now_ms)?;
        }
        Ok(())
    }

    /// `RELEASE_FENCED`, with `n = #KEYS/2` lock keys then their fence counters:
    ///
    /// ```lua
    /// local n=#KEYS/2 local f=tonumber(ARGV[2]) local d=0
    /// for i=1,n do if redis.call("get",KEYS[i])==ARGV[1] then
    ///   local c=tonumber(redis.call("get",KEYS[n+i]))
    ///   if not c or c<f then redis.call("set",KEYS[n+i],ARGV[2]) end
    ///   redis.call("del",KEYS[i])
    ///   redis.pcall("publish","quorumlock:released:"..KEYS[i],"") d=d+1 end end
    /// if d==n then return 1 end return 0
    /// ```
    ///
    /// `n` is a double: for an odd `#KEYS` it has a half, the loop runs over the whole
    /// `i` up to it, and `KEYS[n+i]` (never whole) is nil, so the first key that is ours
    /// raises in `get`; with none ours, `d==n` is false: 0.
    fn release_fenced(
        &mut self,
        db: usize,
        keys: &[&[u8]],
        args: &[&[u8]],
        now_ms: i64,
    ) -> Result<Lua, Raised> {
        let n = keys.len() as f64 / 2.0;
        let (token, raw) = (args.first().copied(), args.get(1).copied());
        let mut d = 0.0;
        for i in lua_for(1.0, n) {
            let key = lua_index(keys, i);
            if !lua_same(self.call_get(db, key, now_ms)?.as_deref(), token) {
                continue;
            }
            self.raise_counter(db, lua_index(keys, n + i), raw, now_ms)?;
            self.call_del(db, key, now_ms)?;
            self.call_publish(key)?;
            d += 1.0;
        }
        Ok(Lua::Number(if d == n { 1.0 } else { 0.0 }))
    }

    /// `redis.call("get",key)`: the value, or `None` for Lua's `false` (no such key).
    fn call_get(
        &mut self,
        db: usize,
        key: Option<&[u8]>,
        now_ms: i64,
    ) -> Result<Option<Vec<u8>>, Raised> {
        let key = lua_arg(key)?;
        Ok(self.lookup(db, key, now_ms).map(|e| e.value.clone()))
    }

    /// `redis.call("exists",key)==1`.
    fn call_exists(&mut self, db: usize, key: Option<&[u8]>, now_ms: i64) -> Result<bool, Raised> {
        let key = lua_arg(key)?;
        Ok(self.lookup(db, key, now_ms).is_some())
    }

    /// `redis.call("del",key)`: how many it deleted.
    fn call_del(&mut self, db: usize, key: Option<&[u8]>, now_ms: i64) -> Result<i64, Raised> {
        let key = lua_arg(key)?;
        if self.lookup(db, key, now_ms).is_none() {
            return Ok(0);
        }
        self.dbs[db].remove(key);
        Ok(1)
    }

    /// `redis.pcall("publish","quorumlock:released:"..key,"")`: recorded (nothing
    /// subscribes in the model). The scripts call it only after deleting `key`, so it is
    /// a string; a nil would fail the concatenation before the call, as in Lua.
    fn call_publish(&mut self, key: Option<&[u8]>) -> Result<(), Raised> {
        let Some(key) = key else {
            return Err(lua_error("attempt to concatenate field '?' (a nil value)"));
        };
        self.published += 1;
        if self.notices.len() == MAX_PUBLISHED {
            self.notices.pop_front();
        }
        self.notices.push_back([RELEASED_PREFIX, key].concat());
        Ok(())
    }

    /// `redis.call("set",…)` with these arguments after `set`: every one is checked for nil
    /// before the command runs, as Redis converts them all first.
    fn call_set(&mut self, db: usize, args: &[Option<&[u8]>], now_ms: i64) -> Result<(), Raised> {
        let mut argv: Vec<&[u8]> = vec![b"set"];
        for &a in args {
            argv.push(lua_arg(a)?);
        }
        // The scripts never pass NX or XX, so it cannot be refused.
        self.set(db, &argv, now_ms)
            .map(drop)
            .map_err(<[u8]>::to_vec)
    }

    /// `redis.call("pexpire",key,ms)`: whether it applied.
    fn call_pexpire(
        &mut self,
        db: usize,
        key: Option<&[u8]>,
        ms: Option<&[u8]>,
        now_ms: i64,
    ) -> Result<bool, Raised> {
        let (key, ms) = (lua_arg(key)?, lua_arg(ms)?);
        self.pexpire(db, key, ms, &[], now_ms)
    }

    fn script(&mut self, argv: &[&[u8]], out: &mut Vec<u8>) {
        let sub = argv[1];
        if sub.eq_ignore_ascii_case(b"FLUSH") {
            match argv.get(2) {
                _ if argv.len() > 3 => err(
                    out,
                    b"ERR wrong number of arguments for 'script|flush' command",
                ),
                Some(mode)
                    if !mode.eq_ignore_ascii_case(b"SYNC")
                        && !mode.eq_ignore_ascii_case(b"ASYNC") =>
                {
                    err(out, b"ERR SCRIPT FLUSH only support SYNC|ASYNC option")
                }
                _ => {
                    self.scripts.clear();
                    simple(out, b"OK");
                }
            }
        } else if sub.eq_ignore_ascii_case(b"LOAD") {
            if argv.len() != 3 {
                return err(
                    out,
                    b"ERR wrong number of arguments for 'script|load' command",
                );
            }
            match Script::by_text(argv[2]) {
                Some(s) => {
                    self.scripts.insert(s);
                    bulk(out, s.sha());
                }
                None => err(out, b"ERR sim: only the client's scripts are modelled"),
            }
        } else if sub.eq_ignore_ascii_case(b"EXISTS") {
            if argv.len() < 3 {
                return err(
                    out,
                    b"ERR wrong number of arguments for 'script|exists' command",
                );
            }
            out.extend_from_slice(format!("*{}\r\n", argv.len() - 2).as_bytes());
            for sha in &argv[2..] {
                int(out, i64::from(self.script_cached(sha)));
            }
        } else {
            let mut msg = b"ERR unknown subcommand '".to_vec();
            msg.extend_from_slice(c_str(sub, 128));
            msg.extend_from_slice(b"'. Try SCRIPT HELP.");
            err(out, &msg);
        }
    }
}

/// Redis 7's answer to an unknown command: its name and its first arguments, quoted.
fn unknown_command(out: &mut Vec<u8>, argv: &[&[u8]]) {
    let mut args = Vec::new();
    for a in &argv[1..] {
        if args.len() >= 128 {
            break;
        }
        args.push(b'\'');
        args.extend_from_slice(c_str(a, 128 - args.len() + 1));
        args.extend_from_slice(b"' ");
    }
    let mut msg = b"ERR unknown command '".to_vec();
    msg.extend_from_slice(c_str(argv[0], 128));
    msg.extend_from_slice(b"', with args beginning with: ");
    msg.extend_from_slice(&args);
    err(out, &msg);
}

/// Node time in whole milliseconds, as Redis reads it.
fn ms(now: SimTime) -> i64 {
    (now / NS_PER_MS) as i64
}

/// A node's wall-clock phase (see [`SimNode::wall_phase`]): SplitMix64 of its seed, so it
/// draws nothing from the node's generator (run ids stay what they were).
fn wall_phase(seed: u64) -> SimTime {
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) % NS_PER_SEC
}

fn run_id(rng: &mut fastrand::Rng) -> [u8; 40] {
    std::array::from_fn(|_| b"0123456789abcdef"[rng.usize(..16)])
}

#[cfg(test)]
mod tests {
    use super::*;
    use quorumlock::__private::core::command::{acquire, extend, release};
    use quorumlock::__private::core::token::Token;

    const MS: SimTime = NS_PER_MS;
    const NOSCRIPT: &[u8] = b"-NOSCRIPT No matching script. Please use EVAL.\r\n";

    /// One command as the client encodes it: a multibulk of bulks.
    fn req(args: &[&[u8]]) -> Vec<u8> {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            bulk(&mut out, a);
        }
        out
    }

    /// Runs one command on an open connection; returns its reply.
    fn run(node: &mut SimNode, conn: ConnId, args: &[&[u8]], now: SimTime) -> Vec<u8> {
        let fed = node.feed(conn, &req(args), now);
        assert_eq!(
            fed.closed,
            None,
            "{:?}",
            String::from_utf8_lossy(&fed.reply)
        );
        fed.reply
    }

    fn text(b: &[u8]) -> String {
        String::from_utf8_lossy(b).into_owned()
    }

    /// Length of the one well-formed RESP2 reply at the head of `b`, if there is one.
    fn resp_value(b: &[u8]) -> Option<usize> {
        let cr = b.iter().position(|&c| c == b'\r')?;
        if b.get(cr + 1) != Some(&b'\n') || b[..cr].contains(&b'\n') {
            return None;
        }
        let line = &b[1..cr];
        let after = cr + 2;
        match b[0] {
            b'+' | b'-' => Some(after),
            b':' => string2ll(line).map(|_| after),
            b'$' => match string2ll(line)? {
                -1 => Some(after),
                n if n >= 0 => {
                    let end = after + n as usize;
                    (b.get(end..end + 2)? == b"\r\n").then_some(end + 2)
                }
                _ => None,
            },
            b'*' => {
                let n = string2ll(line)?;
                let mut at = after;
                for _ in 0..n.max(0) {
                    at += resp_value(&b[at..])?;
                }
                Some(at)
            }
            _ => None,
        }
    }

    /// Whether `b` is a sequence of complete, well-formed RESP2 replies.
    fn well_formed(mut b: &[u8]) -> bool {
        while !b.is_empty() {
            match resp_value(b) {
                Some(n) => b = &b[n..],
                None => return false,
            }
        }
        true
    }

    #[test]
    fn string2ll_is_redis_strict() {
        assert_eq!(string2ll(b"0"), Some(0));
        assert_eq!(string2ll(b"10000"), Some(10000));
        assert_eq!(string2ll(b"-1"), Some(-1));
        assert_eq!(string2ll(b"9223372036854775807"), Some(i64::MAX));
        assert_eq!(string2ll(b"-9223372036854775808"), Some(i64::MIN));
        for bad in [
            &b""[..],
            b"-",
            b"-0",
            b"01",
            b"+1",
            b" 1",
            b"1 ",
            b"1.5",
            b"9223372036854775808",
            b"-9223372036854775809",
            b"99999999999999999999",
            b"000000000000000000001",
        ] {
            assert_eq!(string2ll(bad), None, "{}", text(bad));
        }
    }

    #[test]
    fn ping_quit_and_unknown_commands() {
        let mut n = SimNode::new(1);
        let c = n.accept();
        assert_eq!(run(&mut n, c, &[b"PING"], 0), b"+PONG\r\n");
        assert_eq!(run(&mut n, c, &[b"ping", b"hi"], 0), b"$2\r\nhi\r\n");
        assert_eq!(
            run(&mut n, c, &[b"PING", b"a", b"b"], 0),
            b"-ERR wrong number of arguments for 'ping' command\r\n"
        );
        assert_eq!(
            run(&mut n, c, &[b"FOO", b"a", b"b"], 0),
            b"-ERR unknown command 'FOO', with args beginning with: 'a' 'b' \r\n"
        );
        assert_eq!(
            run(&mut n, c, &[b"HELLO"], 0),
            b"-ERR unknown command 'HELLO', with args beginning with: \r\n"
        );
        // CR and LF never reach the reply; names and arguments are cut at 128 bytes or NUL.
        let long = [b'x'; 300];
        let reply = run(&mut n, c, &[b"a\r\nb", &long, b"c\0d"], 0);
        assert!(well_formed(&reply), "{}", text(&reply));
        let want = format!(
            "-ERR unknown command 'a  b', with args beginning with: '{}' \r\n",
            "x".repeat(128)
        );
        assert_eq!(
            text(&reply),
            want,
            "the first 128 bytes of arguments, no more"
        );
        let reply = run(&mut n, c, &[b"x\0y", b"c\0d"], 0);
        assert_eq!(
            reply,
            b"-ERR unknown command 'x', with args beginning with: 'c' \r\n"
        );
        assert_eq!(n.commands(), 7);
        let fed = n.feed(c, &req(&[b"QUIT"]), 0);
        assert_eq!(fed.reply, b"+OK\r\n");
        assert_eq!(fed.closed, Some(Closed::Quit));
        assert!(!n.is_open(c));
        assert_eq!(n.feed(c, &req(&[b"PING"]), 0).closed, Some(Closed::NotOpen));
    }

    #[test]
    fn set_nx_twice_keeps_the_first_holder() {
        let mut n = SimNode::new(2);
        let c = n.accept();
        let t = 7 * MS;
        assert_eq!(
            run(&mut n, c, &[b"SET", b"k", b"a", b"NX", b"PX", b"1000"], t),
            b"+OK\r\n"
        );
        assert_eq!(
            run(&mut n, c, &[b"SET", b"k", b"b", b"NX", b"PX", b"1000"], t),
            b"$-1\r\n"
        );
        assert_eq!(
            run(&mut n, c, &[b"set", b"k", b"b", b"px", b"9", b"nx"], t),
            b"$-1\r\n"
        );
        assert_eq!(run(&mut n, c, &[b"GET", b"k"], t + MS), b"$1\r\na\r\n");
        assert_eq!(run(&mut n, c, &[b"PTTL", b"k"], t + MS), b":999\r\n");
        assert_eq!(
            n.keys(t + MS),
            vec![KeyView {
                db: 0,
                key: b"k".to_vec(),
                value: b"a".to_vec(),
                pttl_ms: Some(999)
            }]
        );
        // Another connection sees the same keyspace.
        let d = n.accept();
        assert_eq!(
            run(&mut n, d, &[b"SET", b"k", b"c", b"NX", b"PX", b"5"], t),
            b"$-1\r\n"
        );
        // Plain SET and XX overwrite, and drop the ttl unless KEEPTTL.
        assert_eq!(
            run(&mut n, d, &[b"SET", b"k", b"c", b"XX", b"KEEPTTL"], t),
            b"+OK\r\n"
        );
        assert_eq!(run(&mut n, d, &[b"PTTL", b"k"], t), b":1000\r\n");
        assert_eq!(run(&mut n, d, &[b"SET", b"k", b"d"], t), b"+OK\r\n");
        assert_eq!(run(&mut n, d, &[b"PTTL", b"k"], t), b":-1\r\n");
        assert_eq!(n.keys(t)[0].pttl_ms, None);
        assert_eq!(run(&mut n, d, &[b"SET", b"m", b"d", b"XX"], t), b"$-1\r\n");
        assert_eq!(run(&mut n, d, &[b"PTTL", b"m"], t), b":-2\r\n");
        assert_eq!(
            run(&mut n, d, &[b"SET", b"e", b"1", b"EX", b"2"], t),
            b"+OK\r\n"
        );
        assert_eq!(run(&mut n, d, &[b"PTTL", b"e"], t), b":2000\r\n");
        assert_eq!(run(&mut n, d, &[b"DEL", b"k", b"e", b"m"], t), b":2\r\n");
        assert_eq!(run(&mut n, d, &[b"DEL", b"k"], t), b":0\r\n");
        assert_eq!(n.keys(t), vec![]);
    }

    #[test]
    fn px_expires_exactly_at_the_boundary_in_whole_node_milliseconds() {
        let mut n = SimNode::new(3);
        let c = n.accept();
        // Set at 10.3 ms on the node clock: Redis reads 10 ms, so the expiry is 110 ms.
        let t = 10 * MS + 300_000;
        assert_eq!(
            run(&mut n, c, &[b"SET", b"k", b"v", b"NX", b"PX", b"100"], t),
            b"+OK\r\n"
        );
        assert_eq!(run(&mut n, c, &[b"PTTL", b"k"], t), b":100\r\n");
        // Still there for all of 110 ms (even past t + 100 ms), with PTTL 0 ...
        let last = 111 * MS - 1;
        assert_eq!(n.value(0, b"k", last), Some(&b"v"[..]));
        assert_eq!(n.keys(last)[0].pttl_ms, Some(0));
        assert_eq!(run(&mut n, c, &[b"PTTL", b"k"], 110 * MS), b":0\r\n");
        assert_eq!(run(&mut n, c, &[b"GET", b"k"], last), b"$1\r\nv\r\n");
        assert_eq!(
            run(&mut n, c, &[b"SET", b"k", b"w", b"NX", b"PX", b"100"], last),
            b"$-1\r\n"
        );
        // ... and gone from 111 ms: for reads, for NX and for the invariant view.
        let gone = 111 * MS;
        assert_eq!(n.keys(gone), vec![]);
        assert_eq!(n.value(0, b"k", gone), None);
        assert_eq!(run(&mut n, c, &[b"PTTL", b"k"], gone), b":-2\r\n");
        assert_eq!(run(&mut n, c, &[b"GET", b"k"], gone), b"$-1\r\n");
        assert_eq!(
            run(&mut n, c, &[b"SET", b"k", b"w", b"NX", b"PX", b"100"], gone),
            b"+OK\r\n"
        );
        assert_eq!(run(&mut n, c, &[b"GET", b"k"], gone), b"$1\r\nw\r\n");

        // Lazy expiry keeps the dead key in memory until something looks or expire_all.
        assert_eq!(
            run(&mut n, c, &[b"SET", b"a", b"1", b"PX", b"1"], 0),
            b"+OK\r\n"
        );
        assert_eq!(
            run(&mut n, c, &[b"SET", b"b", b"1", b"PX", b"500"], 0),
            b"+OK\r\n"
        );
        assert_eq!(n.expire_all(MS), 0);
        assert_eq!(n.expire_all(2 * MS), 1);
        assert_eq!(n.value(0, b"a", 0), None, "expire_all deleted it");
        assert_eq!(n.value(0, b"b", 0), Some(&b"1"[..]));
        // The node's clock is only what it is given: back in time, the key lives again.
        assert_eq!(run(&mut n, c, &[b"GET", b"k"], 0), b"$1\r\nw\r\n");
    }

    #[test]
    fn set_and_pexpire_argument_errors() {
        let mut n = SimNode::new(4);
        let c = n.accept();
        let cases: [(&[&[u8]], &[u8]); 12] = [
            (
                &[b"SET", b"k", b"v", b"PX", b"0"],
                b"-ERR invalid expire time in 'set' command\r\n",
            ),
            (
                &[b"SET", b"k", b"v", b"PX", b"-5"],
                b"-ERR invalid expire time in 'set' command\r\n",
            ),
            (
                &[b"SET", b"k", b"v", b"EX", b"9223372036854776"],
                b"-ERR invalid expire time in 'set' command\r\n",
            ),
            (
                &[b"SET", b"k", b"v", b"PX", b"9223372036854775807"],
                b"-ERR invalid expire time in 'set' command\r\n",
            ),
            (
                &[b"SET", b"k", b"v", b"PX", b"1.5"],
                b"-ERR value is not an integer or out of range\r\n",
            ),
            (
                &[b"SET", b"k", b"v", b"NX", b"XX"],
                b"-ERR syntax error\r\n",
            ),
            (&[b"SET", b"k", b"v", b"PX"], b"-ERR syntax error\r\n"),
            (
                &[b"SET", b"k", b"v", b"PX", b"5", b"EX", b"5"],
                b"-ERR syntax error\r\n",
            ),
            (&[b"SET", b"k", b"v", b"GET"], b"-ERR syntax error\r\n"),
            (
                &[b"SET", b"k"],
                b"-ERR wrong number of arguments for 'set' command\r\n",
            ),
            (
                &[b"PEXPIRE", b"k", b"x"],
                b"-ERR value is not an integer or out of range\r\n",
            ),
            (
                &[b"PEXPIRE", b"k", b"5", b"BAD"],
                b"-ERR Unsupported option BAD\r\n",
            ),
        ];
        for (args, want) in cases {
            assert_eq!(run(&mut n, c, args, 5 * MS), want, "{args:?}");
        }
        assert_eq!(n.keys(0), vec![], "no failed SET wrote anything");
        assert_eq!(
            run(&mut n, c, &[b"GET"], 0),
            b"-ERR wrong number of arguments for 'get' command\r\n"
        );
    }

    #[test]
    fn pexpire_and_pttl() {
        let mut n = SimNode::new(5);
        let c = n.accept();
        assert_eq!(run(&mut n, c, &[b"PEXPIRE", b"k", b"100"], 0), b":0\r\n");
        run(&mut n, c, &[b"SET", b"k", b"v"], 0);
        assert_eq!(
            run(&mut n, c, &[b"PEXPIRE", b"k", b"100"], 3 * MS),
            b":1\r\n"
        );
        assert_eq!(run(&mut n, c, &[b"PTTL", b"k"], 3 * MS), b":100\r\n");
        assert_eq!(run(&mut n, c, &[b"PTTL", b"k"], 50 * MS), b":53\r\n");
        // An expiry not in the future deletes the key, and still answers 1.
        assert_eq!(
            run(&mut n, c, &[b"PEXPIRE", b"k", b"0"], 50 * MS),
            b":1\r\n"
        );
        assert_eq!(run(&mut n, c, &[b"GET", b"k"], 50 * MS), b"$-1\r\n");
        run(&mut n, c, &[b"SET", b"k", b"v"], 0);
        assert_eq!(run(&mut n, c, &[b"PEXPIRE", b"k", b"-7"], 0), b":1\r\n");
        assert_eq!(n.keys(0), vec![]);
    }

    #[test]
    fn pexpire_options_as_redis_7() {
        let mut n = SimNode::new(17);
        let c = n.accept();
        run(&mut n, c, &[b"SET", b"k", b"v"], 0);
        let px = |ms: &'static [u8], opts: &[&'static [u8]]| {
            let mut v: Vec<&[u8]> = vec![b"PEXPIRE", b"k", ms];
            v.extend_from_slice(opts);
            v
        };
        // No expiry counts as infinite: XX and GT refuse, LT and NX accept.
        assert_eq!(run(&mut n, c, &px(b"100", &[b"XX"]), 0), b":0\r\n");
        assert_eq!(run(&mut n, c, &px(b"100", &[b"GT"]), 0), b":0\r\n");
        assert_eq!(run(&mut n, c, &px(b"100", &[b"lt"]), 0), b":1\r\n");
        assert_eq!(run(&mut n, c, &px(b"200", &[b"NX"]), 0), b":0\r\n");
        assert_eq!(
            run(&mut n, c, &px(b"100", &[b"LT"]), 0),
            b":0\r\n",
            "not less"
        );
        assert_eq!(
            run(&mut n, c, &px(b"100", &[b"GT"]), 0),
            b":0\r\n",
            "not greater"
        );
        assert_eq!(run(&mut n, c, &px(b"200", &[b"GT", b"XX"]), 0), b":1\r\n");
        assert_eq!(run(&mut n, c, &[b"PTTL", b"k"], 0), b":200\r\n");
        assert_eq!(
            run(&mut n, c, &px(b"1", &[b"NX", b"GT"]), 0),
            b"-ERR NX and XX, GT or LT options at the same time are not compatible\r\n"
        );
        assert_eq!(
            run(&mut n, c, &px(b"1", &[b"GT", b"LT"]), 0),
            b"-ERR GT and LT options at the same time are not compatible\r\n"
        );
        // Options are checked before the number.
        assert_eq!(
            run(&mut n, c, &px(b"x", &[b"NOPE"]), 0),
            b"-ERR Unsupported option NOPE\r\n"
        );
        assert_eq!(run(&mut n, c, &px(b"-1", &[b"LT"]), 0), b":1\r\n");
        assert_eq!(n.keys(0), vec![]);
    }

    /// `EVAL` of one of the two scripts.
    fn eval<'a>(script: &'a [u8], key: &'a [u8], args: &[&'a [u8]]) -> Vec<&'a [u8]> {
        let mut v: Vec<&[u8]> = vec![b"EVAL", script, b"1", key];
        v.extend_from_slice(args);
        v
    }

    fn evalsha<'a>(sha: &'a [u8], key: &'a [u8], args: &[&'a [u8]]) -> Vec<&'a [u8]> {
        let mut v: Vec<&[u8]> = vec![b"EVALSHA", sha, b"1", key];
        v.extend_from_slice(args);
        v
    }

    #[test]
    fn release_deletes_only_with_the_right_token() {
        let mut n = SimNode::new(6);
        let c = n.accept();
        run(&mut n, c, &[b"SET", b"k", b"tok", b"NX", b"PX", b"1000"], 0);
        assert_eq!(
            run(&mut n, c, &eval(RELEASE, b"k", &[b"other"]), 0),
            b":0\r\n"
        );
        assert_eq!(run(&mut n, c, &eval(RELEASE, b"k", &[b"to"]), 0), b":0\r\n");
        assert_eq!(run(&mut n, c, &eval(RELEASE, b"k", &[]), 0), b":0\r\n");
        assert_eq!(n.value(0, b"k", 0), Some(&b"tok"[..]));
        assert_eq!(
            run(&mut n, c, &eval(RELEASE, b"k", &[b"tok"]), 0),
            b":1\r\n"
        );
        assert_eq!(n.value(0, b"k", 0), None);
        assert_eq!(
            run(&mut n, c, &eval(RELEASE, b"k", &[b"tok"]), 0),
            b":0\r\n"
        );
        // An expired key is not there to release.
        run(&mut n, c, &[b"SET", b"k", b"tok", b"NX", b"PX", b"10"], 0);
        assert_eq!(
            run(&mut n, c, &eval(RELEASE, b"k", &[b"tok"]), 11 * MS),
            b":0\r\n"
        );
        // Extra keys and arguments are ignored, as the script ignores them.
        run(&mut n, c, &[b"SET", b"k", b"tok"], 0);
        let args: [&[u8]; 7] = [b"EVAL", RELEASE, b"2", b"k", b"x", b"tok", b"y"];
        assert_eq!(run(&mut n, c, &args, 0), b":1\r\n");
    }

    #[test]
    fn extend_sets_the_ttl_only_with_the_right_token() {
        let mut n = SimNode::new(7);
        let c = n.accept();
        run(&mut n, c, &[b"SET", b"k", b"tok", b"NX", b"PX", b"1000"], 0);
        assert_eq!(
            run(&mut n, c, &eval(EXTEND, b"k", &[b"other", b"5000"]), 0),
            b":0\r\n"
        );
        assert_eq!(run(&mut n, c, &[b"PTTL", b"k"], 0), b":1000\r\n");
        assert_eq!(
            run(&mut n, c, &eval(EXTEND, b"k", &[b"tok", b"5000"]), 400 * MS),
            b":1\r\n"
        );
        assert_eq!(run(&mut n, c, &[b"PTTL", b"k"], 400 * MS), b":5000\r\n");
        assert_eq!(n.value(0, b"k", 5400 * MS), Some(&b"tok"[..]));
        assert_eq!(n.value(0, b"k", 5401 * MS), None);
        // Shorter is allowed: it is a new ttl, not a minimum.
        assert_eq!(
            run(&mut n, c, &eval(EXTEND, b"k", &[b"tok", b"10"]), 400 * MS),
            b":1\r\n"
        );
        assert_eq!(run(&mut n, c, &[b"PTTL", b"k"], 400 * MS), b":10\r\n");
        assert_eq!(
            run(&mut n, c, &eval(EXTEND, b"k", &[b"tok", b"10"]), 411 * MS),
            b":0\r\n"
        );
        assert_eq!(
            run(&mut n, c, &eval(EXTEND, b"gone", &[b"tok", b"10"]), 0),
            b":0\r\n"
        );
        // A bad ttl fails inside the script, only once the token matched.
        run(&mut n, c, &[b"SET", b"k", b"tok"], 0);
        let bad = run(&mut n, c, &eval(EXTEND, b"k", &[b"tok", b"soon"]), 0);
        assert!(bad.starts_with(b"-ERR value is not an integer or out of range script: 36e94d1c"));
        assert!(well_formed(&bad));
        assert_eq!(
            run(&mut n, c, &eval(EXTEND, b"k", &[b"x", b"soon"]), 0),
            b":0\r\n"
        );
        let missing = run(&mut n, c, &eval(EXTEND, b"k", &[b"tok"]), 0);
        assert!(missing.starts_with(b"-ERR Lua redis lib command arguments must be strings"));
        assert_eq!(run(&mut n, c, &[b"PTTL", b"k"], 0), b":-1\r\n");
        // A ttl of 0 deletes, and counts as extended (PEXPIRE's answer).
        assert_eq!(
            run(&mut n, c, &eval(EXTEND, b"k", &[b"tok", b"0"]), 0),
            b":1\r\n"
        );
        assert_eq!(n.keys(0), vec![]);
    }

    #[test]
    fn eval_argument_errors() {
        let mut n = SimNode::new(8);
        let c = n.accept();
        let cases: [(&[&[u8]], &[u8]); 6] = [
            (
                &[b"EVAL", RELEASE, b"x", b"k"],
                b"-ERR value is not an integer or out of range\r\n",
            ),
            (
                &[b"EVAL", RELEASE, b"2", b"k"],
                b"-ERR Number of keys can't be greater than number of args\r\n",
            ),
            (
                &[b"EVAL", RELEASE, b"-1", b"k"],
                b"-ERR Number of keys can't be negative\r\n",
            ),
            (
                &[b"EVALSHA", RELEASE_SHA, b"3"],
                b"-ERR Number of keys can't be greater than number of args\r\n",
            ),
            (
                &[b"EVAL", b"return 1", b"0"],
                b"-ERR sim: only the client's scripts are modelled\r\n",
            ),
            (&[b"EVALSHA", b"abc", b"0"], NOSCRIPT),
        ];
        for (args, want) in cases {
            assert_eq!(text(&run(&mut n, c, args, 0)), text(want), "{args:?}");
        }
        // Argument errors come before the cache: nothing was cached by them.
        assert!(!n.script_cached(RELEASE_SHA));
        // No key: the script's own GET fails.
        let reply = run(&mut n, c, &[b"EVAL", RELEASE, b"0", b"tok"], 0);
        assert!(
            reply.starts_with(b"-ERR Lua redis lib command arguments"),
            "{}",
            text(&reply)
        );
        let tail = [
            &b"script: "[..],
            &RELEASE_SHA[..],
            &b", on @user_script:1.\r\n"[..],
        ]
        .concat();
        assert!(reply.ends_with(&tail), "{}", text(&reply));
    }

    #[test]
    fn evalsha_needs_the_script_cached_by_eval_and_flush_and_restart_forget_it() {
        let mut n = SimNode::new(9);
        let c = n.accept();
        run(&mut n, c, &[b"SET", b"k", b"tok"], 0);
        assert_eq!(
            run(&mut n, c, &evalsha(RELEASE_SHA, b"k", &[b"tok"]), 0),
            NOSCRIPT
        );
        assert_eq!(
            run(&mut n, c, &evalsha(EXTEND_SHA, b"k", &[b"tok", b"9"]), 0),
            NOSCRIPT
        );
        assert_eq!(
            n.value(0, b"k", 0),
            Some(&b"tok"[..]),
            "NOSCRIPT ran nothing"
        );
        // EVAL of the extend script caches that one only.
        assert_eq!(
            run(&mut n, c, &eval(EXTEND, b"k", &[b"tok", b"900"]), 0),
            b":1\r\n"
        );
        assert!(n.script_cached(EXTEND_SHA) && !n.script_cached(RELEASE_SHA));
        assert_eq!(
            run(&mut n, c, &evalsha(RELEASE_SHA, b"k", &[b"tok"]), 0),
            NOSCRIPT
        );
        assert_eq!(
            run(&mut n, c, &evalsha(EXTEND_SHA, b"k", &[b"tok", b"800"]), 0),
            b":1\r\n"
        );
        assert_eq!(run(&mut n, c, &[b"PTTL", b"k"], 0), b":800\r\n");
        // The cache is the node's, not the connection's; the digest is case-insensitive.
        let d = n.accept();
        let upper = EXTEND_SHA.to_ascii_uppercase();
        assert_eq!(
            run(&mut n, d, &evalsha(&upper, b"k", &[b"no", b"1"]), 0),
            b":0\r\n"
        );
        assert_eq!(run(&mut n, d, &eval(RELEASE, b"k", &[b"no"]), 0), b":0\r\n");
        assert_eq!(
            run(&mut n, c, &evalsha(RELEASE_SHA, b"k", &[b"tok"]), 0),
            b":1\r\n"
        );
        // SCRIPT FLUSH forgets both.
        assert_eq!(run(&mut n, c, &[b"SCRIPT", b"FLUSH"], 0), b"+OK\r\n");
        assert!(!n.script_cached(RELEASE_SHA) && !n.script_cached(EXTEND_SHA));
        assert_eq!(
            run(&mut n, c, &evalsha(RELEASE_SHA, b"k", &[b"tok"]), 0),
            NOSCRIPT
        );
        assert_eq!(
            run(&mut n, c, &evalsha(EXTEND_SHA, b"k", &[b"tok", b"1"]), 0),
            NOSCRIPT
        );
        assert_eq!(
            run(&mut n, c, &[b"script", b"flush", b"async"], 0),
            b"+OK\r\n"
        );
        assert_eq!(
            run(&mut n, c, &[b"SCRIPT", b"FLUSH", b"NOW"], 0),
            b"-ERR SCRIPT FLUSH only support SYNC|ASYNC option\r\n"
        );
        // SCRIPT LOAD and EXISTS.
        let loaded = run(&mut n, c, &[b"SCRIPT", b"LOAD", RELEASE], 0);
        assert_eq!(loaded, [&b"$40\r\n"[..], RELEASE_SHA, b"\r\n"].concat());
        assert_eq!(
            run(
                &mut n,
                c,
                &[b"SCRIPT", b"EXISTS", RELEASE_SHA, EXTEND_SHA, b"x"],
                0
            ),
            b"*3\r\n:1\r\n:0\r\n:0\r\n"
        );
        assert_eq!(
            run(&mut n, c, &[b"SCRIPT", b"KILL"], 0),
            b"-ERR unknown subcommand 'KILL'. Try SCRIPT HELP.\r\n"
        );
        // A restart forgets the cache, every key and every connection.
        run(&mut n, c, &eval(EXTEND, b"x", &[b"t", b"1"]), 0);
        run(&mut n, c, &[b"SET", b"k", b"tok"], 0);
        let id = *n.run_id();
        assert_eq!(
            *SimNode::new(9).run_id(),
            id,
            "the run id comes from the seed"
        );
        n.restart(0);
        assert_eq!(n.seed(), 9);
        assert_eq!(n.restarts(), 1);
        assert_ne!(*n.run_id(), id);
        assert_eq!(n.connections(), 0);
        assert_eq!(n.feed(c, &req(&[b"PING"]), 0).closed, Some(Closed::NotOpen));
        assert_eq!(n.keys(0), vec![]);
        assert!(!n.script_cached(RELEASE_SHA) && !n.script_cached(EXTEND_SHA));
        let e = n.accept();
        assert_ne!(e, c, "ids are never reused");
        assert_eq!(
            run(&mut n, e, &evalsha(RELEASE_SHA, b"k", &[b"tok"]), 0),
            NOSCRIPT
        );
        assert_eq!(
            run(&mut n, e, &evalsha(EXTEND_SHA, b"x", &[b"t", b"1"]), 0),
            NOSCRIPT
        );
    }

    #[test]
    fn the_clients_own_frames() {
        let mut n = SimNode::new(10);
        let c = n.accept();
        let (mine, theirs) = (Token::from_bits(1), Token::from_bits(2));
        let mut out = Vec::new();
        let mut send = |n: &mut SimNode, f: &dyn Fn(&mut Vec<u8>), now| {
            out.clear();
            f(&mut out);
            run_raw(n, c, &out, now)
        };
        assert_eq!(
            send(&mut n, &|o| acquire(o, b"res", &mine, 500), 0),
            b"+OK\r\n"
        );
        assert_eq!(
            send(&mut n, &|o| acquire(o, b"res", &theirs, 500), 0),
            b"$-1\r\n"
        );
        assert_eq!(n.value(0, b"res", 0), Some(mine.as_bytes()));
        assert_eq!(
            send(&mut n, &|o| release(o, b"res", &theirs, true), 0),
            NOSCRIPT
        );
        assert_eq!(
            send(&mut n, &|o| release(o, b"res", &theirs, false), 0),
            b":0\r\n"
        );
        assert_eq!(
            send(&mut n, &|o| extend(o, b"res", &mine, 2000, true), 0),
            NOSCRIPT
        );
        assert_eq!(
            send(&mut n, &|o| extend(o, b"res", &mine, 2000, false), 0),
            b":1\r\n"
        );
        assert_eq!(
            send(&mut n, &|o| extend(o, b"res", &mine, 3000, true), MS),
            b":1\r\n"
        );
        assert_eq!(n.keys(MS)[0].pttl_ms, Some(3000));
        assert_eq!(
            send(&mut n, &|o| release(o, b"res", &mine, true), 0),
            b":1\r\n"
        );
        assert_eq!(n.keys(0), vec![]);
    }

    fn run_raw(node: &mut SimNode, conn: ConnId, bytes: &[u8], now: SimTime) -> Vec<u8> {
        let fed = node.feed(conn, bytes, now);
        assert_eq!(fed.closed, None, "{}", text(&fed.reply));
        fed.reply
    }

    #[test]
    fn auth_and_noauth() {
        // No password: the default user is nopass.
        let mut n = SimNode::new(11);
        let c = n.accept();
        let reply = run(&mut n, c, &[b"AUTH", b"pw"], 0);
        assert!(reply.starts_with(b"-ERR AUTH <password> called without any password configured"));
        assert_eq!(
            run(&mut n, c, &[b"AUTH", b"default", b"anything"], 0),
            b"+OK\r\n"
        );
        assert_eq!(
            run(&mut n, c, &[b"AUTH", b"app", b"pw"], 0),
            b"-WRONGPASS invalid username-password pair or user is disabled.\r\n"
        );

        n.set_password(Some(b"pw"));
        n.add_user(b"app", b"secret");
        assert_eq!(
            run(&mut n, c, &[b"PING"], 0),
            b"+PONG\r\n",
            "open connections stay in"
        );
        let d = n.accept();
        assert_eq!(
            run(&mut n, d, &[b"PING"], 0),
            b"-NOAUTH Authentication required.\r\n"
        );
        assert_eq!(
            run(&mut n, d, &[b"GET", b"k"], 0),
            b"-NOAUTH Authentication required.\r\n"
        );
        // Unknown commands and wrong arity are reported before NOAUTH, as in Redis 7.
        assert!(run(&mut n, d, &[b"NOPE"], 0).starts_with(b"-ERR unknown command 'NOPE'"));
        assert_eq!(
            run(&mut n, d, &[b"GET"], 0),
            b"-ERR wrong number of arguments for 'get' command\r\n"
        );
        let wrong = b"-WRONGPASS invalid username-password pair or user is disabled.\r\n";
        assert_eq!(run(&mut n, d, &[b"AUTH", b"nope"], 0), wrong);
        assert_eq!(run(&mut n, d, &[b"AUTH", b"app", b"pw"], 0), wrong);
        assert_eq!(
            run(&mut n, d, &[b"AUTH", b"a", b"b", b"c"], 0),
            b"-ERR syntax error\r\n"
        );
        assert_eq!(run(&mut n, d, &[b"AUTH", b"pw"], 0), b"+OK\r\n");
        assert_eq!(run(&mut n, d, &[b"PING"], 0), b"+PONG\r\n");
        assert_eq!(run(&mut n, d, &[b"AUTH", b"nope"], 0), wrong);
        assert_eq!(
            run(&mut n, d, &[b"PING"], 0),
            b"+PONG\r\n",
            "a failed AUTH keeps the login"
        );
        let e = n.accept();
        assert_eq!(run(&mut n, e, &[b"AUTH", b"app", b"secret"], 0), b"+OK\r\n");
        let f = n.accept();
        assert_eq!(run(&mut n, f, &[b"AUTH", b"default", b"pw"], 0), b"+OK\r\n");
        // The handshake the client pipelines: AUTH, SELECT, PING in one write.
        let g = n.accept();
        let hs = [
            req(&[b"AUTH", b"app", b"secret"]),
            req(&[b"SELECT", b"2"]),
            req(&[b"PING"]),
        ]
        .concat();
        assert_eq!(run_raw(&mut n, g, &hs, 0), b"+OK\r\n+OK\r\n+PONG\r\n");
        // Before AUTH, Redis 7 refuses long requests outright.
        let h = n.accept();
        let big = vec![b'x'; 16385];
        let fed = n.feed(h, &req(&[b"AUTH", &big]), 0);
        assert_eq!(
            fed.reply,
            b"-ERR Protocol error: unauthenticated bulk length\r\n"
        );
        assert_eq!(fed.closed, Some(Closed::Protocol));
        let h = n.accept();
        let fed = n.feed(h, &req(&[&b"PING"[..]; 11]), 0);
        assert_eq!(
            fed.reply,
            b"-ERR Protocol error: unauthenticated multibulk length\r\n"
        );
        assert_eq!(fed.closed, Some(Closed::Protocol));
        // After AUTH, in the same write, the limits are gone.
        let h = n.accept();
        let both = [req(&[b"AUTH", b"pw"]), req(&[&b"NOPE"[..]; 11])].concat();
        let reply = run_raw(&mut n, h, &both, 0);
        assert!(
            reply.starts_with(b"+OK\r\n-ERR unknown command 'NOPE'"),
            "{}",
            text(&reply)
        );
        // Configuration survives a restart; logins do not.
        n.restart(0);
        let i = n.accept();
        assert_eq!(
            run(&mut n, i, &[b"PING"], 0),
            b"-NOAUTH Authentication required.\r\n"
        );
        n.set_password(None);
        let j = n.accept();
        assert_eq!(run(&mut n, j, &[b"PING"], 0), b"+PONG\r\n");
    }

    #[test]
    fn select_separates_databases() {
        let mut n = SimNode::new(12);
        let (c, d) = (n.accept(), n.accept());
        assert_eq!(run(&mut n, c, &[b"SELECT", b"2"], 0), b"+OK\r\n");
        assert_eq!(
            run(&mut n, c, &[b"SET", b"k", b"two", b"NX", b"PX", b"100"], 0),
            b"+OK\r\n"
        );
        assert_eq!(run(&mut n, d, &[b"GET", b"k"], 0), b"$-1\r\n");
        assert_eq!(
            run(&mut n, d, &[b"SET", b"k", b"zero", b"NX", b"PX", b"100"], 0),
            b"+OK\r\n"
        );
        assert_eq!(
            run(&mut n, c, &eval(RELEASE, b"k", &[b"zero"]), 0),
            b":0\r\n"
        );
        assert_eq!(
            run(&mut n, d, &evalsha(RELEASE_SHA, b"k", &[b"zero"]), 0),
            b":1\r\n"
        );
        assert_eq!(n.value(2, b"k", 0), Some(&b"two"[..]));
        assert_eq!(n.keys(0).iter().map(|k| k.db).collect::<Vec<_>>(), vec![2]);
        assert_eq!(
            run(&mut n, c, &[b"SELECT", b"16"], 0),
            b"-ERR DB index is out of range\r\n"
        );
        assert_eq!(
            run(&mut n, c, &[b"SELECT", b"-1"], 0),
            b"-ERR DB index is out of range\r\n"
        );
        assert_eq!(
            run(&mut n, c, &[b"SELECT", b"4294967296"], 0),
            &b"-ERR value is out of range, value must between -2147483648 and 2147483647\r\n"[..]
        );
        assert_eq!(
            run(&mut n, c, &[b"SELECT", b"x"], 0),
            b"-ERR value is not an integer or out of range\r\n"
        );
        assert_eq!(
            run(&mut n, c, &[b"GET", b"k"], 0),
            b"$3\r\ntwo\r\n",
            "still in db 2"
        );
    }

    /// A pipeline touching every command, with the replies it must get in one piece.
    fn pipeline() -> Vec<u8> {
        let cmds: Vec<Vec<&[u8]>> = vec![
            vec![b"PING"],
            vec![b"SET", b"k", b"tok", b"NX", b"PX", b"1000"],
            vec![b"SET", b"k", b"other", b"NX", b"PX", b"1000"],
            vec![b"GET", b"k"],
            evalsha(RELEASE_SHA, b"k", &[b"tok"]),
            eval(EXTEND, b"k", &[b"tok", b"2000"]),
            evalsha(EXTEND_SHA, b"k", &[b"bad", b"2000"]),
            vec![b"PTTL", b"k"],
            eval(RELEASE, b"k", &[b"tok"]),
            vec![b"PEXPIRE", b"k", b"5"],
            vec![b"SELECT", b"1"],
            vec![b"SET", b"", b"", b"PX", b"1"],
            vec![b"NOPE", b"x"],
            vec![b"DEL", b"", b"k"],
            vec![b"SCRIPT", b"FLUSH"],
            evalsha(EXTEND_SHA, b"k", &[b"tok", b"2000"]),
        ];
        let mut bytes: Vec<u8> = cmds.iter().flat_map(|c| req(c)).collect();
        bytes.extend_from_slice(b"*0\r\n\r\nPING  inline\r\n*1\r\n$4\r\nPING\r\n");
        bytes
    }

    const PIPELINE_REPLY: &[u8] = b"+PONG\r\n+OK\r\n$-1\r\n$3\r\ntok\r\n\
        -NOSCRIPT No matching script. Please use EVAL.\r\n:1\r\n:0\r\n:2000\r\n:1\r\n:0\r\n\
        +OK\r\n+OK\r\n-ERR unknown command 'NOPE', with args beginning with: 'x' \r\n:1\r\n\
        +OK\r\n-NOSCRIPT No matching script. Please use EVAL.\r\n$6\r\ninline\r\n+PONG\r\n";

    #[test]
    fn pipelined_commands_split_at_every_byte_answer_as_whole() {
        let bytes = pipeline();
        let now = 3 * MS;
        let mut whole = SimNode::new(13);
        let c = whole.accept();
        assert_eq!(
            text(&run_raw(&mut whole, c, &bytes, now)),
            text(PIPELINE_REPLY)
        );
        let keys = whole.keys(now);
        for split in 0..=bytes.len() {
            let mut n = SimNode::new(13);
            let c = n.accept();
            let mut reply = run_raw(&mut n, c, &bytes[..split], now);
            reply.extend(run_raw(&mut n, c, &bytes[split..], now));
            assert_eq!(reply, PIPELINE_REPLY, "split at {split}");
            assert_eq!(n.keys(now), keys);
            assert_eq!(n.buffered(c), 0);
        }
        // One byte at a time: every reply comes out with the byte that completes its command.
        let mut n = SimNode::new(13);
        let c = n.accept();
        let mut reply = Vec::new();
        for (i, b) in bytes.iter().enumerate() {
            let got = run_raw(&mut n, c, std::slice::from_ref(b), now);
            if !got.is_empty() {
                assert!(bytes[..=i].ends_with(b"\r\n") || bytes[..=i].ends_with(b"\n"));
            }
            assert!(well_formed(&got));
            reply.extend(got);
        }
        assert_eq!(reply, PIPELINE_REPLY);
        // Random cuts into several pieces.
        let mut rng = fastrand::Rng::with_seed(13);
        for _ in 0..300 {
            let mut n = SimNode::new(13);
            let c = n.accept();
            let mut reply = Vec::new();
            let mut rest = &bytes[..];
            while !rest.is_empty() {
                let (piece, tail) = rest.split_at(rng.usize(0..=rest.len().min(40)));
                reply.extend(run_raw(&mut n, c, piece, now));
                rest = tail;
            }
            assert_eq!(reply, PIPELINE_REPLY);
        }
    }

    #[test]
    fn a_partial_command_waits_for_the_rest() {
        let mut n = SimNode::new(14);
        let c = n.accept();
        let set = req(&[b"SET", b"k", b"tok", b"NX", b"PX", b"100"]);
        for cut in 1..set.len() {
            let mut n = SimNode::new(14);
            let c = n.accept();
            assert_eq!(run_raw(&mut n, c, &set[..cut], 0), b"", "cut at {cut}");
            assert_eq!(n.buffered(c), cut);
            assert_eq!(n.keys(0), vec![], "nothing ran");
            assert_eq!(n.commands(), 0);
            // The rest arrives later: the command runs at the time of the byte completing it.
            assert_eq!(run_raw(&mut n, c, &set[cut..], 50 * MS), b"+OK\r\n");
            assert_eq!(n.keys(50 * MS)[0].pttl_ms, Some(100));
            assert_eq!(n.buffered(c), 0);
        }
        // A complete command followed by part of the next: the first is answered now.
        let mut two = req(&[b"PING"]);
        two.extend_from_slice(b"*2\r\n$3\r\nGET\r\n$1\r\nk\r");
        assert_eq!(run_raw(&mut n, c, &two, 0), b"+PONG\r\n");
        assert_eq!(n.buffered(c), 19);
        assert_eq!(run_raw(&mut n, c, b"", 0), b"");
        assert_eq!(run_raw(&mut n, c, b"\n", 0), b"$-1\r\n");
        // Closing drops the partial input.
        assert_eq!(run_raw(&mut n, c, b"*1\r\n", 0), b"");
        n.close(c);
        n.close(c);
        assert_eq!(n.buffered(c), 0);
        assert_eq!(n.connections(), 0);
    }

    #[test]
    fn protocol_errors_answer_then_close() {
        let cases: [(&[u8], &[u8]); 11] = [
            (
                b"*abc\r\n",
                b"-ERR Protocol error: invalid multibulk length\r\n",
            ),
            (
                b"*2147483648\r\n",
                b"-ERR Protocol error: invalid multibulk length\r\n",
            ),
            (
                b"*01\r\n",
                b"-ERR Protocol error: invalid multibulk length\r\n",
            ),
            (
                b"*1\r\nPING\r\n",
                b"-ERR Protocol error: expected '$', got 'P'\r\n",
            ),
            // The CR in the error text becomes a space, as in Redis.
            (
                b"*1\r\n\r\n",
                b"-ERR Protocol error: expected '$', got ' '\r\n",
            ),
            (
                b"*1\r\n$-1\r\n",
                b"-ERR Protocol error: invalid bulk length\r\n",
            ),
            (
                b"*1\r\n$1048577\r\n",
                b"-ERR Protocol error: invalid bulk length\r\n",
            ),
            (
                b"*1\r\n$x\r\n",
                b"-ERR Protocol error: invalid bulk length\r\n",
            ),
            (
                b"*1\r\n$4\r\nPINGxx",
                b"-ERR Protocol error: expected '\\r\\n' after a bulk\r\n",
            ),
            (
                b"*1\rx",
                b"-ERR Protocol error: expected '\\n' after '\\r'\r\n",
            ),
            (
                b"+PING\r\n",
                b"-ERR unknown command '+PING', with args beginning with: \r\n",
            ),
        ];
        for (input, want) in cases {
            let mut n = SimNode::new(15);
            let c = n.accept();
            // Commands before the bad one are answered first.
            let bytes = [&b"PING\r\n"[..], input].concat();
            let fed = n.feed(c, &bytes, 0);
            let reply = [&b"+PONG\r\n"[..], want].concat();
            assert_eq!(text(&fed.reply), text(&reply), "{}", text(input));
            if want.starts_with(b"-ERR Protocol") {
                assert_eq!(fed.closed, Some(Closed::Protocol));
                assert!(!n.is_open(c));
                assert_eq!(n.feed(c, b"PING\r\n", 0).closed, Some(Closed::NotOpen));
            } else {
                assert_eq!(fed.closed, None);
            }
        }
    }

    #[test]
    fn input_is_bounded() {
        // A bulk that would fit, but does not arrive in full: closed past 1 MiB held.
        let mut n = SimNode::new(16);
        let c = n.accept();
        let head = format!("*2\r\n$3\r\nGET\r\n${MAX_QUERY}\r\n");
        assert_eq!(run_raw(&mut n, c, head.as_bytes(), 0), b"");
        let fill = vec![b'a'; MAX_QUERY - head.len()];
        assert_eq!(run_raw(&mut n, c, &fill, 0), b"");
        assert_eq!(n.buffered(c), MAX_QUERY);
        let fed = n.feed(c, b"a", 0);
        assert_eq!(
            fed,
            Fed {
                reply: vec![],
                closed: Some(Closed::QueryLimit)
            }
        );
        assert!(!n.is_open(c));
        // A large command that completes is fine, in one feed or many.
        let big = vec![b'v'; 900 * 1024];
        let set = req(&[b"SET", b"big", &big]);
        let c = n.accept();
        for piece in set.chunks(100_000) {
            run_raw(&mut n, c, piece, 0);
        }
        assert_eq!(n.value(0, b"big", 0).map(<[u8]>::len), Some(big.len()));
        assert_eq!(n.buffered(c), 0);
        // Many complete commands in one feed are not limited.
        let many: Vec<u8> = std::iter::repeat_n(req(&[b"PING"]), 100_000)
            .flatten()
            .collect();
        assert!(many.len() > MAX_QUERY);
        assert_eq!(run_raw(&mut n, c, &many, 0).len(), 7 * 100_000);
        // Lines that never end.
        let c = n.accept();
        run_raw(&mut n, c, &vec![b'P'; MAX_INLINE], 0);
        let fed = n.feed(c, b"P", 0);
        assert_eq!(
            fed.reply,
            b"-ERR Protocol error: too big inline request\r\n"
        );
        let c = n.accept();
        let fed = n.feed(c, &[&b"*"[..], &vec![b'1'; MAX_INLINE + 1]].concat(), 0);
        assert_eq!(
            fed.reply,
            b"-ERR Protocol error: too big mbulk count string\r\n"
        );
        let c = n.accept();
        let fed = n.feed(
            c,
            &[&b"*1\r\n$"[..], &vec![b'1'; MAX_INLINE + 1]].concat(),
            0,
        );
        assert_eq!(
            fed.reply,
            b"-ERR Protocol error: too big bulk count string\r\n"
        );
        assert_eq!(fed.closed, Some(Closed::Protocol));
    }

    /// One chunk of hostile input: noise, valid commands, or valid commands mangled.
    fn chunk(rng: &mut fastrand::Rng) -> Vec<u8> {
        let cmds: [Vec<&[u8]>; 20] = [
            vec![b"PING"],
            vec![b"EVAL", ACQUIRE, b"2", b"k", b"f", b"t1", b"5", b"1"],
            vec![b"EVALSHA", ACQUIRE_SHA, b"1", b"k", b"t2", b"50", b"x"],
            vec![b"EVAL", FENCE, b"2", b"k", b"f", b"t1", b"9"],
            vec![b"EVAL", RELEASE_ALL, b"2", b"k", b"f", b"t1"],
            vec![b"EVAL", EXTEND_ALL, b"1", b"k", b"t2", b"-1"],
            vec![b"EVAL", RELEASE_FENCED, b"2", b"k", b"f", b"t1", b"7"],
            vec![b"EVAL", RELEASE_FENCED, b"3", b"k", b"f", b"g", b"t2", b"x"],
            vec![b"INFO", b"server"],
            vec![b"SET", b"k", b"t1", b"NX", b"PX", b"5"],
            vec![b"SET", b"k", b"t2", b"NX", b"PX", b"100"],
            vec![b"GET", b"k"],
            eval(RELEASE, b"k", &[b"t1"]),
            evalsha(RELEASE_SHA, b"k", &[b"t2"]),
            eval(EXTEND, b"k", &[b"t2", b"50"]),
            evalsha(EXTEND_SHA, b"k", &[b"t1", b"-1"]),
            vec![b"SCRIPT", b"FLUSH"],
            vec![b"AUTH", b"pw"],
            vec![b"SELECT", b"3"],
            vec![b"PTTL", b"k"],
        ];
        match rng.u8(0..6) {
            0 => (0..rng.usize(0..64)).map(|_| rng.u8(..)).collect(),
            1 => (0..rng.usize(0..32))
                .map(|_| *rng.choice(b"*$\r\n0123456789-PINGSET ").unwrap())
                .collect(),
            2 => {
                let mut b = req(rng.choice(&cmds).unwrap());
                let i = rng.usize(..b.len());
                b[i] = rng.u8(..);
                b
            }
            3 => {
                let b = req(rng.choice(&cmds).unwrap());
                b[..rng.usize(..=b.len())].to_vec()
            }
            _ => req(rng.choice(&cmds).unwrap()),
        }
    }

    #[test]
    fn no_input_panics_and_every_reply_is_well_formed() {
        for seed in 0..300u64 {
            let mut rng = fastrand::Rng::with_seed(seed);
            let mut n = SimNode::new(seed);
            if rng.bool() {
                n.set_password(Some(b"pw"));
            }
            let mut conns = vec![n.accept(), n.accept()];
            let mut now: SimTime = rng.u64(..1 << 40);
            for _ in 0..200 {
                now = match rng.u8(0..10) {
                    0 => rng.u64(..),
                    1 => now.saturating_sub(rng.u64(..10 * MS)),
                    _ => now.saturating_add(rng.u64(..3 * MS)),
                };
                match rng.u8(0..40) {
                    0 => n.restart(0),
                    1 => n.close(*rng.choice(&conns).unwrap()),
                    2 => conns.push(n.accept()),
                    3 => {
                        n.expire_all(now);
                    }
                    _ => {}
                }
                let c = *rng.choice(&conns).unwrap();
                let bytes = chunk(&mut rng);
                let fed = n.feed(c, &bytes, now);
                assert!(well_formed(&fed.reply), "seed {seed}: {}", text(&fed.reply));
                assert!(n.buffered(c) <= MAX_QUERY);
                if fed.closed == Some(Closed::NotOpen) {
                    assert!(fed.reply.is_empty());
                }
                if fed.closed.is_some() {
                    assert!(!n.is_open(c));
                }
                for k in n.keys(now) {
                    assert!(k.db < DATABASES);
                    assert_eq!(n.value(k.db, &k.key, now), Some(&k.value[..]));
                }
            }
        }
    }

    /// `verb` (`EVAL` with a script's text, `EVALSHA` with its digest) of `keys` and `args`.
    fn script_req(verb: &[u8], body: &[u8], keys: &[&[u8]], args: &[&[u8]]) -> Vec<u8> {
        let numkeys = keys.len().to_string();
        let mut v: Vec<&[u8]> = vec![verb, body, numkeys.as_bytes()];
        v.extend_from_slice(keys);
        v.extend_from_slice(args);
        req(&v)
    }

    /// Runs `EVAL` of `script` with several keys on `conn`; returns its reply.
    fn eval_all(
        node: &mut SimNode,
        conn: ConnId,
        script: &[u8],
        keys: &[&[u8]],
        args: &[&[u8]],
        now: SimTime,
    ) -> Vec<u8> {
        run_raw(node, conn, &script_req(b"EVAL", script, keys, args), now)
    }

    fn evalsha_all(
        node: &mut SimNode,
        conn: ConnId,
        sha: &[u8],
        keys: &[&[u8]],
        args: &[&[u8]],
        now: SimTime,
    ) -> Vec<u8> {
        run_raw(node, conn, &script_req(b"EVALSHA", sha, keys, args), now)
    }

    /// The error reply of a script that raised `msg`, as Redis 7 words it.
    fn raised(msg: &str, sha: &[u8]) -> String {
        format!("-{msg} script: {}, on @user_script:1.\r\n", text(sha))
    }

    /// Asserts the value of each key in database 0 at time 0, as text.
    fn assert_values(n: &SimNode, want: &[(&str, Option<&str>)]) {
        for &(key, value) in want {
            let got = n.value(0, key.as_bytes(), 0).map(text);
            assert_eq!(got.as_deref(), value, "{key}");
        }
    }

    const ARGS_NIL: &str = "ERR Lua redis lib command arguments must be strings or integers";

    fn pttl(node: &mut SimNode, conn: ConnId, key: &[u8], now: SimTime) -> Vec<u8> {
        run(node, conn, &[b"PTTL", key], now)
    }

    #[test]
    fn acquire_takes_every_key_or_none() {
        let mut n = SimNode::new(18);
        let c = n.accept();
        let t = 3 * MS;
        let ours: [&[u8]; 3] = [b"tok", b"5000", b"2"];
        assert_eq!(
            eval_all(&mut n, c, ACQUIRE, &[b"a", b"b"], &ours, t),
            b"+OK\r\n"
        );
        let held = |key: &[u8], pttl_ms| KeyView {
            db: 0,
            key: key.to_vec(),
            value: b"tok".to_vec(),
            pttl_ms: Some(pttl_ms),
        };
        assert_eq!(n.keys(t), vec![held(b"a", 5000), held(b"b", 5000)]);
        // One key taken, first or last: nil, and no other key is created.
        let theirs: [&[u8]; 3] = [b"other", b"5000", b"2"];
        for keys in [[&b"a"[..], b"c"], [b"c", b"b"]] {
            assert_eq!(
                eval_all(&mut n, c, ACQUIRE, &keys, &theirs, t + MS),
                b"$-1\r\n"
            );
            assert_eq!(n.value(0, b"c", t + MS), None, "{keys:?}");
        }
        assert_eq!(n.keys(t + MS), vec![held(b"a", 4999), held(b"b", 4999)]);
        // Expiry on the node clock: set at 3 ms with PX 5000, the keys live through 5003 ms
        // and are missing for ACQUIRE from 5004 ms on.
        let last = 5004 * MS - 1;
        assert_eq!(
            eval_all(&mut n, c, ACQUIRE, &[b"a", b"c"], &theirs, last),
            b"$-1\r\n"
        );
        let gone = 5004 * MS;
        assert_eq!(
            eval_all(&mut n, c, ACQUIRE, &[b"a", b"c"], &theirs, gone),
            b"+OK\r\n"
        );
        assert_eq!(n.value(0, b"a", gone), Some(&b"other"[..]));
        assert_eq!(pttl(&mut n, c, b"c", gone), b":5000\r\n");
        assert_eq!(n.value(0, b"b", gone), None);
    }

    #[test]
    fn acquire_errors_as_its_lua_raises_them() {
        let mut n = SimNode::new(19);
        let c = n.accept();
        let sha = ACQUIRE_SHA;
        let limit = raised("ERR user_script:1: 'for' limit must be a number", sha);
        // No count, or one tonumber rejects: the first `for` fails.
        for args in [
            &[&b"tok"[..], b"100"][..],
            &[b"tok", b"100", b"two"],
            &[b"tok"],
        ] {
            assert_eq!(text(&eval_all(&mut n, c, ACQUIRE, &[b"q"], args, 0)), limit);
        }
        // More lock keys than KEYS: `exists` of nil, unless a taken key answers first.
        let three: [&[u8]; 3] = [b"tok", b"100", b"3"];
        let reply = eval_all(&mut n, c, ACQUIRE, &[b"q", b"r"], &three, 0);
        assert_eq!(text(&reply), raised(ARGS_NIL, sha));
        run(&mut n, c, &[b"SET", b"r", b"x"], 0);
        assert_eq!(
            eval_all(&mut n, c, ACQUIRE, &[b"q", b"r"], &three, 0),
            b"$-1\r\n"
        );
        // A bad ttl fails in the first SET: nothing is written.
        let reply = eval_all(&mut n, c, ACQUIRE, &[b"q"], &[b"tok", b"soon", b"1"], 0);
        assert_eq!(
            text(&reply),
            raised("ERR value is not an integer or out of range", sha)
        );
        let reply = eval_all(&mut n, c, ACQUIRE, &[b"q"], &[b"tok", b"0", b"1"], 0);
        assert_eq!(
            text(&reply),
            raised("ERR invalid expire time in 'set' command", sha)
        );
        let reply = eval_all(&mut n, c, ACQUIRE, &[b"q"], &[b"tok"], 0);
        assert_eq!(text(&reply), limit, "the count is read before the ttl");
        assert_eq!(n.value(0, b"q", 0), None);
        // The count is a Lua number: 1.5 takes KEYS[1], then no counter is whole: 0.
        let half: [&[u8]; 3] = [b"tok", b"100", b"1.5"];
        assert_eq!(
            eval_all(&mut n, c, ACQUIRE, &[b"q", b"s"], &half, 0),
            b":0\r\n"
        );
        assert_eq!(n.value(0, b"q", 0), Some(&b"tok"[..]));
        assert_eq!(n.value(0, b"s", 0), None);
        // A count below 1 locks nothing; the counters then start at KEYS[n+1].
        run(&mut n, c, &[b"SET", b"f", b"4"], 0);
        let zero: [&[u8]; 3] = [b"tok", b"100", b"0"];
        assert_eq!(eval_all(&mut n, c, ACQUIRE, &[b"f"], &zero, 0), b":4\r\n");
        assert_eq!(eval_all(&mut n, c, ACQUIRE, &[], &zero, 0), b"+OK\r\n");
        let minus: [&[u8]; 3] = [b"tok", b"100", b"-1"];
        let reply = eval_all(&mut n, c, ACQUIRE, &[b"f"], &minus, 0);
        assert_eq!(text(&reply), raised(ARGS_NIL, sha), "KEYS[0] is nil");
        assert_eq!(n.value(0, b"f", 0), Some(&b"4"[..]));
    }

    #[test]
    fn fenced_acquire_answers_the_largest_counter() {
        let mut n = SimNode::new(20);
        let c = n.accept();
        let one: [&[u8]; 3] = [b"tok", b"5000", b"1"];
        let two: [&[u8]; 3] = [b"tok", b"5000", b"2"];
        // No counter yet: 0.
        assert_eq!(
            eval_all(&mut n, c, ACQUIRE, &[b"x", b"fx"], &one, 0),
            b":0\r\n"
        );
        assert_eq!(
            n.value(0, b"fx", 0),
            None,
            "reading a counter does not create it"
        );
        let fence =
            |n: &mut SimNode, f: &[u8]| eval_all(n, c, FENCE, &[b"x", b"fx"], &[b"tok", f], 0);
        assert_eq!(fence(&mut n, b"7"), b":1\r\n");
        assert_eq!(fence(&mut n, b"5"), b":1\r\n");
        assert_eq!(run(&mut n, c, &[b"GET", b"fx"], 0), b"$1\r\n7\r\n");
        let keys: [&[u8]; 4] = [b"y", b"z", b"fx", b"fz"];
        assert_eq!(eval_all(&mut n, c, ACQUIRE, &keys, &two, 0), b":7\r\n");
        assert_eq!(n.value(0, b"z", 0), Some(&b"tok"[..]));
        assert_eq!(
            pttl(&mut n, c, b"fx", 0),
            b":-1\r\n",
            "counters are only read"
        );
        // Taken: nil, counters or not.
        assert_eq!(
            eval_all(&mut n, c, ACQUIRE, &[b"y", b"fx"], &one, 0),
            b"$-1\r\n"
        );
        // The largest counter wins; what tonumber rejects is skipped; a fraction truncates.
        let read = |n: &mut SimNode, lock: &[u8], fz: &[u8]| {
            run(n, c, &[b"SET", b"fz", fz], 0);
            eval_all(n, c, ACQUIRE, &[lock, b"fx", b"fz"], &one, 0)
        };
        assert_eq!(read(&mut n, b"l1", b" 9 "), b":9\r\n");
        assert_eq!(read(&mut n, b"l2", b"abc"), b":7\r\n");
        assert_eq!(read(&mut n, b"l3", b"7.9"), b":7\r\n");
        assert_eq!(read(&mut n, b"l4", b"8.9"), b":8\r\n");
        assert_eq!(read(&mut n, b"l5", b"0x10"), b":16\r\n");
        assert_eq!(read(&mut n, b"l6", b"1e3"), b":1000\r\n");
        assert_eq!(read(&mut n, b"l7", b"-50"), b":7\r\n");
        assert_eq!(read(&mut n, b"l8", b"nan"), b":7\r\n");
        // Out of i64's range, Redis's cast gives i64::MIN (on x86-64).
        assert_eq!(read(&mut n, b"l9", b"inf"), b":-9223372036854775808\r\n");
        // An expired counter is missing.
        run(&mut n, c, &[b"SET", b"fz", b"99", b"PX", b"10"], 0);
        let reply = eval_all(&mut n, c, ACQUIRE, &[b"m", b"fz"], &one, 11 * MS);
        assert_eq!(reply, b":0\r\n");
    }

    #[test]
    fn fence_only_raises() {
        let mut n = SimNode::new(21);
        let c = n.accept();
        // Lock keys `k1`, `k2` hold the token; each counter below is paired with `k1`.
        run(&mut n, c, &[b"SET", b"k1", b"tok", b"PX", b"10000"], 0);
        run(&mut n, c, &[b"SET", b"k2", b"tok", b"PX", b"10000"], 0);
        let fence = |n: &mut SimNode, locks: &[&[u8]], counters: &[&[u8]], f: &[u8]| {
            let keys = [locks, counters].concat();
            eval_all(n, c, FENCE, &keys, &[b"tok", f], 0)
        };
        // A lower counter is raised and a missing one created, neither with an expiry.
        run(&mut n, c, &[b"SET", b"c1", b"3", b"PX", b"10000"], 0);
        assert_eq!(
            fence(&mut n, &[b"k1", b"k2"], &[b"c1", b"c2"], b"5"),
            b":1\r\n"
        );
        for key in [b"c1", b"c2"] {
            assert_eq!(n.value(0, key, 0), Some(&b"5"[..]));
            assert_eq!(pttl(&mut n, c, key, 0), b":-1\r\n");
        }
        // Never lowered, nor rewritten when equal.
        assert_eq!(fence(&mut n, &[b"k1"], &[b"c1"], b"4"), b":1\r\n");
        assert_eq!(n.value(0, b"c1", 0), Some(&b"5"[..]));
        // The text is stored as given, and compared as a number.
        assert_eq!(fence(&mut n, &[b"k1"], &[b"c1"], b"0x10"), b":1\r\n");
        assert_eq!(fence(&mut n, &[b"k1"], &[b"c1"], b"16"), b":1\r\n");
        assert_eq!(n.value(0, b"c1", 0), Some(&b"0x10"[..]));
        assert_eq!(fence(&mut n, &[b"k1"], &[b"c1"], b"16.5"), b":1\r\n");
        assert_eq!(n.value(0, b"c1", 0), Some(&b"16.5"[..]));
        // A counter that is not a number is overwritten.
        run(&mut n, c, &[b"SET", b"c3", b"junk"], 0);
        assert_eq!(fence(&mut n, &[b"k1"], &[b"c3"], b"2"), b":1\r\n");
        assert_eq!(n.value(0, b"c3", 0), Some(&b"2"[..]));
        assert_eq!(fence(&mut n, &[], &[], b"2"), b":1\r\n");
        // A fence that is not a number: Lua compares a number with nil and raises, after
        // the writes to missing counters before it (they need no comparison).
        let compare = raised(
            "ERR user_script:1: attempt to compare number with nil",
            FENCE_SHA,
        );
        let reply = fence(&mut n, &[b"k1", b"k2"], &[b"c4", b"c1"], b"abc");
        assert_eq!(text(&reply), compare);
        assert_eq!(n.value(0, b"c4", 0), Some(&b"abc"[..]));
        assert_eq!(n.value(0, b"c1", 0), Some(&b"16.5"[..]));
        // No ARGV[2]: the same on a numeric counter; SET of nil on a missing one.
        let reply = eval_all(&mut n, c, FENCE, &[b"k1", b"c1"], &[b"tok"], 0);
        assert_eq!(text(&reply), compare);
        let reply = eval_all(&mut n, c, FENCE, &[b"k1", b"c5"], &[b"tok"], 0);
        assert_eq!(text(&reply), raised(ARGS_NIL, FENCE_SHA));
        assert_eq!(n.value(0, b"c5", 0), None);
    }

    #[test]
    fn fence_confirms_only_where_every_lock_key_is_ours() {
        let mut n = SimNode::new(26);
        let c = n.accept();
        run(&mut n, c, &[b"SET", b"k1", b"tok", b"PX", b"10000"], 0);
        run(&mut n, c, &[b"SET", b"k2", b"other", b"PX", b"10000"], 0);
        /// KEYS, ARGV, and the counter `c1` after the call.
        type Case<'a> = (&'a [&'a [u8]], &'a [&'a [u8]], &'a [u8]);
        let cases: [Case<'_>; 4] = [
            // Another token holds the key.
            (&[b"k2", b"c1"], &[b"tok", b"3"], b"3"),
            // The key is gone (expired, released, never set).
            (&[b"k3", b"c1"], &[b"tok", b"4"], b"4"),
            // One of two keys is ours: not confirmed.
            (&[b"k1", b"k2", b"c1", b"c2"], &[b"tok", b"5"], b"5"),
            // Another token than the one asked for, on a missing key.
            (&[b"k3", b"c1"], &[b"tok2", b"6"], b"6"),
        ];
        for (keys, args, raised_to) in cases {
            assert_eq!(eval_all(&mut n, c, FENCE, keys, args, 0), b":0\r\n");
            // The counter is raised all the same: more copies outlive a restart.
            assert_eq!(n.value(0, b"c1", 0), Some(raised_to), "{keys:?}");
        }
        assert_eq!(n.value(0, b"c2", 0), Some(&b"5"[..]));
        let reply = eval_all(&mut n, c, FENCE, &[b"k1", b"c7"], &[], 0);
        assert_eq!(
            text(&reply),
            raised(ARGS_NIL, FENCE_SHA),
            "SET of a nil fence"
        );
        // The key expired on this node's clock (`PX 5` at 0 ms is gone from 6 ms on).
        run(&mut n, c, &[b"SET", b"k4", b"tok", b"PX", b"5"], 0);
        let keys: [&[u8]; 2] = [b"k4", b"c1"];
        assert_eq!(
            eval_all(&mut n, c, FENCE, &keys, &[b"tok", b"9"], 5 * MS),
            b":1\r\n"
        );
        assert_eq!(
            eval_all(&mut n, c, FENCE, &keys, &[b"tok", b"10"], 6 * MS),
            b":0\r\n"
        );
        assert_eq!(n.value(0, b"c1", 6 * MS), Some(&b"10"[..]));
        // An odd number of keys: the first counter, `KEYS[n+1]` (n = 1.5), is nil and
        // `get` raises before any write.
        let reply = eval_all(
            &mut n,
            c,
            FENCE,
            &[b"k1", b"c1", b"c2"],
            &[b"tok", b"99"],
            0,
        );
        assert_eq!(text(&reply), raised(ARGS_NIL, FENCE_SHA));
        assert_eq!(n.value(0, b"c1", 0), Some(&b"10"[..]));
    }

    #[test]
    fn release_fenced_raises_the_fence_then_deletes() {
        let mut n = SimNode::new(25);
        let c = n.accept();
        let release = |n: &mut SimNode, keys: &[&[u8]], args: &[&[u8]]| {
            eval_all(n, c, RELEASE_FENCED, keys, args, 0)
        };
        let get = |n: &mut SimNode, key: &[u8]| n.value(0, key, 0).map(<[u8]>::to_vec);
        // The cases checked on redis-server 7: ours, raised from 3 to 7 and deleted.
        run(&mut n, c, &[b"SET", b"k", b"tok"], 0);
        run(&mut n, c, &[b"SET", b"fk", b"3"], 0);
        assert_eq!(release(&mut n, &[b"k", b"fk"], &[b"tok", b"7"]), b":1\r\n");
        assert_eq!(get(&mut n, b"fk"), Some(b"7".to_vec()));
        assert_eq!(get(&mut n, b"k"), None);
        // Not ours: 0, the counter and the key untouched.
        run(&mut n, c, &[b"SET", b"k", b"other"], 0);
        assert_eq!(release(&mut n, &[b"k", b"fk"], &[b"tok", b"9"]), b":0\r\n");
        assert_eq!(get(&mut n, b"fk"), Some(b"7".to_vec()));
        assert_eq!(get(&mut n, b"k"), Some(b"other".to_vec()));
        // Two keys, both ours: both counters created at 5, both keys gone.
        run(&mut n, c, &[b"SET", b"a", b"tok", b"PX", b"1000"], 0);
        run(&mut n, c, &[b"SET", b"b", b"tok", b"PX", b"1000"], 0);
        let four: [&[u8]; 4] = [b"a", b"b", b"fa", b"fb"];
        assert_eq!(release(&mut n, &four, &[b"tok", b"5"]), b":1\r\n");
        assert_values(
            &n,
            &[
                ("a", None),
                ("b", None),
                ("fa", Some("5")),
                ("fb", Some("5")),
            ],
        );
        assert_eq!(
            pttl(&mut n, c, b"fa", 0),
            b":-1\r\n",
            "a counter never expires"
        );
        // Partial: ours is fenced and freed, the other's counter is not touched: 0.
        run(&mut n, c, &[b"SET", b"a", b"tok"], 0);
        run(&mut n, c, &[b"SET", b"b", b"oth"], 0);
        run(&mut n, c, &[b"SET", b"fb", b"1"], 0);
        assert_eq!(release(&mut n, &four, &[b"tok", b"8"]), b":0\r\n");
        assert_values(
            &n,
            &[
                ("a", None),
                ("b", Some("oth")),
                ("fa", Some("8")),
                ("fb", Some("1")),
            ],
        );
        // Never lowered, nor rewritten when equal; compared as numbers, stored as given.
        for (counter, fence, after) in [
            (&b"9"[..], &b"8"[..], &b"9"[..]),
            (b"8", b"8", b"8"),
            (b"16.5", b"0x11", b"0x11"),
            (b"0x10", b"16", b"0x10"),
            (b"junk", b"2", b"2"),
            (b"nan", b"3", b"nan"),
            (b"3", b"nan", b"3"),
        ] {
            run(&mut n, c, &[b"SET", b"a", b"tok"], 0);
            run(&mut n, c, &[b"SET", b"fa", counter], 0);
            assert_eq!(release(&mut n, &[b"a", b"fa"], &[b"tok", fence]), b":1\r\n");
            assert_eq!(
                get(&mut n, b"fa"),
                Some(after.to_vec()),
                "{}",
                text(counter)
            );
            assert_eq!(get(&mut n, b"a"), None);
        }
        // A fence that is not a number is written to a missing counter (no comparison).
        run(&mut n, c, &[b"SET", b"a", b"tok"], 0);
        run(&mut n, c, &[b"DEL", b"fa"], 0);
        assert_eq!(
            release(&mut n, &[b"a", b"fa"], &[b"tok", b"abc"]),
            b":1\r\n"
        );
        assert_eq!(get(&mut n, b"fa"), Some(b"abc".to_vec()));
        // A key that is its own counter: fenced (its value is no number), then deleted.
        run(&mut n, c, &[b"SET", b"a", b"tok"], 0);
        assert_eq!(release(&mut n, &[b"a", b"a"], &[b"tok", b"5"]), b":1\r\n");
        assert_eq!(get(&mut n, b"a"), None);
        // Expired on the node clock: not ours any more.
        run(&mut n, c, &[b"SET", b"e", b"tok", b"PX", b"10"], 0);
        let reply = eval_all(
            &mut n,
            c,
            RELEASE_FENCED,
            &[b"e", b"fe"],
            &[b"tok", b"4"],
            11 * MS,
        );
        assert_eq!(reply, b":0\r\n");
        assert_eq!(get(&mut n, b"fe"), None);
        // No token: nothing is ours. No keys: all of none were: 1.
        run(&mut n, c, &[b"SET", b"a", b"tok"], 0);
        assert_eq!(release(&mut n, &[b"a", b"fa"], &[]), b":0\r\n");
        assert_eq!(get(&mut n, b"a"), Some(b"tok".to_vec()));
        assert_eq!(release(&mut n, &[], &[b"tok", b"5"]), b":1\r\n");
        assert_eq!(release(&mut n, &[], &[]), b":1\r\n");
    }

    #[test]
    fn release_fenced_errors_and_odd_keys_as_in_redis() {
        // Each pinned against `redis-server` 7.0.15.
        let mut n = SimNode::new(26);
        let c = n.accept();
        let sha = RELEASE_FENCED_SHA;
        let release = |n: &mut SimNode, keys: &[&[u8]], args: &[&[u8]]| {
            eval_all(n, c, RELEASE_FENCED, keys, args, 0)
        };
        let get = |n: &mut SimNode, key: &[u8]| n.value(0, key, 0).map(<[u8]>::to_vec);
        let compare = raised("ERR user_script:1: attempt to compare number with nil", sha);
        // No fence: SET of nil on a missing counter, a comparison with nil on a numeric
        // one; either way the lock key stays.
        run(&mut n, c, &[b"SET", b"a", b"tok"], 0);
        assert_eq!(
            text(&release(&mut n, &[b"a", b"fa"], &[b"tok"])),
            raised(ARGS_NIL, sha)
        );
        run(&mut n, c, &[b"SET", b"fa", b"3"], 0);
        assert_eq!(text(&release(&mut n, &[b"a", b"fa"], &[b"tok"])), compare);
        // A fence that is not a number, against a numeric counter: the same.
        assert_eq!(
            text(&release(&mut n, &[b"a", b"fa"], &[b"tok", b"abc"])),
            compare
        );
        assert_eq!(get(&mut n, b"a"), Some(b"tok".to_vec()));
        assert_eq!(get(&mut n, b"fa"), Some(b"3".to_vec()));
        // The first key (counter missing: no comparison) is fenced and released before
        // the second (counter 9) raises: Redis keeps the writes made.
        run(&mut n, c, &[b"DEL", b"fa"], 0);
        run(&mut n, c, &[b"SET", b"b", b"tok"], 0);
        run(&mut n, c, &[b"SET", b"fb", b"9"], 0);
        let four: [&[u8]; 4] = [b"a", b"b", b"fa", b"fb"];
        let reply = release(&mut n, &four, &[b"tok", b"x"]);
        assert_eq!(text(&reply), compare);
        assert_values(
            &n,
            &[
                ("a", None),
                ("b", Some("tok")),
                ("fa", Some("x")),
                ("fb", Some("9")),
            ],
        );
        n.restart(0);
        let c = n.accept();
        let release = |n: &mut SimNode, keys: &[&[u8]], args: &[&[u8]]| {
            eval_all(n, c, RELEASE_FENCED, keys, args, 0)
        };
        // Odd #KEYS: n = 1.5, the loop runs i = 1 only, and KEYS[2.5] is nil.
        let three: [&[u8]; 3] = [b"a", b"b", b"c"];
        run(&mut n, c, &[b"SET", b"a", b"tok"], 0);
        assert_eq!(
            text(&release(&mut n, &three, &[b"tok", b"5"])),
            raised(ARGS_NIL, sha)
        );
        assert_eq!(
            get(&mut n, b"a"),
            Some(b"tok".to_vec()),
            "raised before any write"
        );
        // None ours: no counter is read, and d == 1.5 is false: 0.
        run(&mut n, c, &[b"SET", b"a", b"oth"], 0);
        assert_eq!(release(&mut n, &three, &[b"tok", b"5"]), b":0\r\n");
        // One key: n = 0.5, no iteration, and 0 == 0.5 is false: 0, the key kept.
        run(&mut n, c, &[b"SET", b"a", b"tok"], 0);
        assert_eq!(release(&mut n, &[b"a"], &[b"tok", b"5"]), b":0\r\n");
        assert_eq!(get(&mut n, b"a"), Some(b"tok".to_vec()));
        // Five keys: i = 1, 2; the first ours raises, whichever it is.
        let five: [&[u8]; 5] = [b"a", b"b", b"c", b"d", b"e"];
        run(&mut n, c, &[b"SET", b"a", b"x"], 0);
        run(&mut n, c, &[b"SET", b"b", b"tok"], 0);
        assert_eq!(
            text(&release(&mut n, &five, &[b"tok", b"5"])),
            raised(ARGS_NIL, sha)
        );
        assert_eq!(get(&mut n, b"b"), Some(b"tok".to_vec()));
        assert_eq!(n.keys(0).len(), 2, "nothing written");
    }

    /// `uptime_in_seconds` as `INFO` answers it on `conn` at `now`.
    fn info_uptime(n: &mut SimNode, conn: ConnId, now: SimTime) -> u64 {
        let reply = text(&run(n, conn, &[b"INFO", b"server"], now));
        let line = reply
            .split("\r\n")
            .find_map(|l| l.strip_prefix("uptime_in_seconds:"))
            .unwrap_or_else(|| panic!("{reply:?}"));
        line.parse().unwrap()
    }

    const SEC: SimTime = NS_PER_SEC;

    #[test]
    fn uptime_can_read_one_200_ms_after_a_restart_just_before_a_wall_second() {
        for seed in [0, 1, 7, 31, 1 << 40, u64::MAX] {
            let mut n = SimNode::new(seed);
            let phase = n.wall_phase();
            assert!(phase < SEC);
            assert_eq!(phase, SimNode::new(seed).wall_phase(), "fixed by the seed");
            // Restart 100 ms before the wall clock's second 5 begins (node time 4.1 s to
            // 5.1 s, by the phase); 200 ms on, it is in second 5: up 1 (real: 0.2 s).
            let at = 5 * SEC - phase - 100 * MS;
            n.restart(at);
            let c = n.accept();
            assert_eq!(info_uptime(&mut n, c, at), 0, "seed {seed}");
            assert_eq!(info_uptime(&mut n, c, at + 100 * MS - 1), 0, "seed {seed}");
            assert_eq!(info_uptime(&mut n, c, at + 100 * MS), 1, "seed {seed}");
            assert_eq!(info_uptime(&mut n, c, at + 200 * MS), 1, "seed {seed}");
            assert_eq!(info_uptime(&mut n, c, at + 1100 * MS - 1), 1, "seed {seed}");
            assert_eq!(info_uptime(&mut n, c, at + 1100 * MS), 2, "seed {seed}");
        }
    }

    #[test]
    fn uptime_reads_zero_right_after_a_restart_just_after_a_wall_second() {
        for seed in [0, 1, 7, 31, 1 << 40, u64::MAX] {
            let mut n = SimNode::new(seed);
            let phase = n.wall_phase();
            // Restart 1 ms into the wall clock's second 5: 0 for the 999 ms left of it.
            let at = 5 * SEC - phase + MS;
            n.restart(at);
            let c = n.accept();
            for after in [0, MS, 200 * MS, 998 * MS, 999 * MS - 1] {
                assert_eq!(info_uptime(&mut n, c, at + after), 0, "seed {seed}");
            }
            assert_eq!(info_uptime(&mut n, c, at + 999 * MS), 1, "seed {seed}");
            // A clock set back past the start reads 0, not a negative number.
            assert_eq!(info_uptime(&mut n, c, at - 2 * SEC), 0, "seed {seed}");
        }
    }

    #[test]
    fn uptime_is_within_a_second_of_the_real_one_and_a_day_before_time_0_by_default() {
        let mut rng = fastrand::Rng::with_seed(27);
        for seed in 0..200 {
            let mut n = SimNode::new(seed);
            let phase = n.wall_phase();
            let c = n.accept();
            // Never restarted: up from a whole wall-clock second a day before time 0.
            assert_eq!(n.uptime_secs(0), 86_400);
            assert_eq!(info_uptime(&mut n, c, SEC - phase - 1), 86_400);
            assert_eq!(info_uptime(&mut n, c, SEC - phase), 86_401);
            let at = rng.u64(..1 << 45);
            let up = rng.u64(..10 * SEC);
            n.restart(at);
            let c = n.accept();
            let secs = info_uptime(&mut n, c, at + up);
            // Never below the real uptime's whole seconds, and over it by less than 1 s.
            assert!(
                secs == up / SEC || secs == up / SEC + 1,
                "{seed}: {secs} for {up}"
            );
            assert!(secs * SEC < up + SEC, "{seed}: {secs} for {up}");
        }
    }

    #[test]
    fn release_all_deletes_ours_and_answers_whether_all_were() {
        let mut n = SimNode::new(22);
        let c = n.accept();
        run(&mut n, c, &[b"SET", b"a", b"tok"], 0);
        run(&mut n, c, &[b"SET", b"b", b"other"], 0);
        // Partial: 0, but ours is deleted all the same.
        let keys: [&[u8]; 3] = [b"a", b"b", b"m"];
        assert_eq!(
            eval_all(&mut n, c, RELEASE_ALL, &keys, &[b"tok"], 0),
            b":0\r\n"
        );
        assert_eq!(n.value(0, b"a", 0), None);
        assert_eq!(n.value(0, b"b", 0), Some(&b"other"[..]));
        assert_eq!(eval_all(&mut n, c, RELEASE_ALL, &[b"b"], &[], 0), b":0\r\n");
        assert_eq!(
            eval_all(&mut n, c, RELEASE_ALL, &[b"b"], &[b"other"], 0),
            b":1\r\n"
        );
        assert_eq!(n.keys(0), vec![]);
        // Every one ours: 1; a key named twice is gone the second time.
        run(&mut n, c, &[b"SET", b"a", b"tok", b"PX", b"100"], 0);
        run(&mut n, c, &[b"SET", b"b", b"tok", b"PX", b"100"], 0);
        assert_eq!(
            eval_all(&mut n, c, RELEASE_ALL, &[b"a", b"b"], &[b"tok"], 0),
            b":1\r\n"
        );
        run(&mut n, c, &[b"SET", b"d", b"tok"], 0);
        assert_eq!(
            eval_all(&mut n, c, RELEASE_ALL, &[b"d", b"d"], &[b"tok"], 0),
            b":0\r\n"
        );
        assert_eq!(n.keys(0), vec![]);
        // Expired on the node clock: not there to release.
        run(&mut n, c, &[b"SET", b"e", b"tok", b"PX", b"10"], 0);
        let reply = eval_all(&mut n, c, RELEASE_ALL, &[b"e"], &[b"tok"], 11 * MS);
        assert_eq!(reply, b":0\r\n");
        // No keys: all of none were deleted.
        assert_eq!(eval_all(&mut n, c, RELEASE_ALL, &[], &[], 0), b":1\r\n");
    }

    #[test]
    fn a_release_publishes_a_notice_for_each_key_it_deletes_and_only_then() {
        let mut n = SimNode::new(31);
        let c = n.accept();
        let ch = |k: &str| [RELEASED_PREFIX, k.as_bytes()].concat();
        run(&mut n, c, &[b"SET", b"k", b"tok"], 0);
        // Someone else's token, a missing key: nothing deleted, nothing published.
        assert_eq!(run(&mut n, c, &eval(RELEASE, b"k", &[b"x"]), 0), b":0\r\n");
        assert_eq!(
            run(&mut n, c, &eval(RELEASE, b"m", &[b"tok"]), 0),
            b":0\r\n"
        );
        assert_eq!((n.published(), n.take_published()), (0, vec![]));
        assert_eq!(
            run(&mut n, c, &eval(RELEASE, b"k", &[b"tok"]), 0),
            b":1\r\n"
        );
        assert_eq!(n.take_published(), vec![ch("k")]);
        // RELEASE_ALL: the deleted ones, in key order; a partial release still answers 0.
        for k in [&b"a"[..], b"c"] {
            run(&mut n, c, &[b"SET", k, b"tok"], 0);
        }
        run(&mut n, c, &[b"SET", b"b", b"oth"], 0);
        let keys: [&[u8]; 3] = [b"a", b"b", b"c"];
        let reply = eval_all(&mut n, c, RELEASE_ALL, &keys, &[b"tok"], 0);
        assert_eq!(reply, b":0\r\n");
        assert_eq!(n.take_published(), vec![ch("a"), ch("c")]);
        // RELEASE_FENCED: the lock keys deleted, never the counters.
        run(&mut n, c, &[b"SET", b"a", b"tok"], 0);
        let reply = eval_all(
            &mut n,
            c,
            RELEASE_FENCED,
            &[b"a", b"b", b"fa", b"fb"],
            &[b"tok", b"3"],
            0,
        );
        assert_eq!(reply, b":0\r\n");
        assert_eq!(n.take_published(), vec![ch("a")]);
        assert_eq!(n.published(), 4);
        // By EVALSHA too (cached by the EVALs above).
        run(&mut n, c, &[b"SET", b"k", b"tok"], 0);
        assert_eq!(
            run(&mut n, c, &evalsha(RELEASE_SHA, b"k", &[b"tok"]), 0),
            b":1\r\n"
        );
        assert_eq!(n.take_published(), vec![ch("k")]);
        // The log is bounded; the count is not.
        for _ in 0..MAX_PUBLISHED + 5 {
            run(&mut n, c, &[b"SET", b"k", b"tok"], 0);
            run(&mut n, c, &eval(RELEASE, b"k", &[b"tok"]), 0);
        }
        assert_eq!(n.take_published().len(), MAX_PUBLISHED);
        assert_eq!(n.published(), 5 + MAX_PUBLISHED as u64 + 5);
    }

    #[test]
    fn extend_all_extends_every_key_or_none() {
        let mut n = SimNode::new(23);
        let c = n.accept();
        for (key, value) in [(b"a", b"tok"), (b"b", b"tok"), (b"o", b"oth")] {
            run(&mut n, c, &[b"SET", key, value, b"PX", b"1000"], 0);
        }
        let t = 100 * MS;
        let extend = |n: &mut SimNode, keys: &[&[u8]], args: &[&[u8]]| {
            eval_all(n, c, EXTEND_ALL, keys, args, t)
        };
        let ttls = |n: &mut SimNode| n.keys(t).iter().map(|k| k.pttl_ms).collect::<Vec<_>>();
        let untouched = vec![Some(900); 3];
        // One not ours, or missing: 0, and no expiry changed.
        assert_eq!(extend(&mut n, &[b"a", b"o"], &[b"tok", b"5000"]), b":0\r\n");
        assert_eq!(extend(&mut n, &[b"a", b"m"], &[b"tok", b"5000"]), b":0\r\n");
        assert_eq!(extend(&mut n, &[b"a", b"b"], &[]), b":0\r\n");
        assert_eq!(ttls(&mut n), untouched);
        // A bad ttl raises in the first PEXPIRE: nothing changed either.
        let reply = extend(&mut n, &[b"a", b"b"], &[b"tok", b"soon"]);
        let sha = EXTEND_ALL_SHA;
        assert_eq!(
            text(&reply),
            raised("ERR value is not an integer or out of range", sha)
        );
        let reply = extend(&mut n, &[b"a", b"b"], &[b"tok"]);
        assert_eq!(text(&reply), raised(ARGS_NIL, sha));
        let reply = extend(&mut n, &[b"a", b"b"], &[b"tok", b"9223372036854775807"]);
        assert_eq!(
            text(&reply),
            raised("ERR invalid expire time in 'pexpire' command", sha)
        );
        assert_eq!(ttls(&mut n), untouched);
        // All ours: every expiry is the new one, on the node clock.
        assert_eq!(extend(&mut n, &[b"a", b"b"], &[b"tok", b"5000"]), b":1\r\n");
        assert_eq!(ttls(&mut n), vec![Some(5000), Some(5000), Some(900)]);
        assert_eq!(n.value(0, b"a", 5101 * MS - 1), Some(&b"tok"[..]));
        assert_eq!(n.value(0, b"b", 5101 * MS), None);
        // No keys: 1. A ttl of 0 deletes, and counts as extended (PEXPIRE's answer).
        assert_eq!(extend(&mut n, &[], &[]), b":1\r\n");
        assert_eq!(
            extend(&mut n, &[b"a", b"a", b"b"], &[b"tok", b"0"]),
            b":1\r\n"
        );
        assert_eq!(n.value(0, b"a", t), None);
        assert_eq!(n.value(0, b"b", t), None);
    }

    #[test]
    fn the_new_scripts_need_eval_before_evalsha_and_flush_and_restart_forget_them() {
        let mut n = SimNode::new(24);
        let c = n.accept();
        let now = 0;
        run(&mut n, c, &[b"SET", b"r", b"tok"], now);
        run(&mut n, c, &[b"SET", b"e", b"tok"], now);
        run(&mut n, c, &[b"SET", b"rf", b"tok"], now);
        /// A script, its digest, KEYS, ARGV, and what it answers once cached.
        type Case = (
            &'static [u8],
            &'static [u8; 40],
            &'static [&'static [u8]],
            &'static [&'static [u8]],
            &'static [u8],
        );
        let cases: [Case; 5] = [
            (
                ACQUIRE,
                ACQUIRE_SHA,
                &[b"k"],
                &[b"tok", b"100", b"1"],
                b"$-1\r\n",
            ),
            (FENCE, FENCE_SHA, &[b"e", b"fe"], &[b"tok", b"3"], b":1\r\n"),
            (RELEASE_ALL, RELEASE_ALL_SHA, &[b"r"], &[b"tok"], b":0\r\n"),
            (
                EXTEND_ALL,
                EXTEND_ALL_SHA,
                &[b"e"],
                &[b"tok", b"700"],
                b":1\r\n",
            ),
            (
                RELEASE_FENCED,
                RELEASE_FENCED_SHA,
                &[b"rf", b"frf"],
                &[b"tok", b"4"],
                b":0\r\n",
            ),
        ];
        let shas: Vec<&[u8]> = cases.iter().map(|case| &case.1[..]).collect();
        let exists = [&[&b"SCRIPT"[..], b"EXISTS"][..], &shas].concat();
        for (body, sha, keys, args, _) in cases {
            let before = n.keys(now);
            assert_eq!(evalsha_all(&mut n, c, sha, keys, args, now), NOSCRIPT);
            assert_eq!(n.keys(now), before, "NOSCRIPT ran nothing");
            assert!(!n.script_cached(sha));
            // EVAL runs it (the key `k` is free for ACQUIRE, then taken) and caches it.
            let first = eval_all(&mut n, c, body, keys, args, now);
            assert!(!first.starts_with(b"-"), "{}", text(&first));
            assert!(n.script_cached(sha));
        }
        assert_eq!(n.value(0, b"r", now), None, "RELEASE_ALL ran once");
        assert_eq!(n.value(0, b"rf", now), None, "RELEASE_FENCED ran once");
        assert_eq!(n.value(0, b"frf", now), Some(&b"4"[..]));
        for (_, sha, keys, args, want) in cases {
            assert_eq!(evalsha_all(&mut n, c, sha, keys, args, now), want);
            let upper = sha.to_ascii_uppercase();
            assert_eq!(evalsha_all(&mut n, c, &upper, keys, args, now), want);
        }
        assert_eq!(pttl(&mut n, c, b"e", now), b":700\r\n");
        assert_eq!(
            run(&mut n, c, &exists, now),
            b"*5\r\n:1\r\n:1\r\n:1\r\n:1\r\n:1\r\n"
        );
        // SCRIPT FLUSH forgets them all.
        assert_eq!(run(&mut n, c, &[b"SCRIPT", b"FLUSH"], now), b"+OK\r\n");
        assert_eq!(
            run(&mut n, c, &exists, now),
            b"*5\r\n:0\r\n:0\r\n:0\r\n:0\r\n:0\r\n"
        );
        for (_, sha, keys, args, _) in cases {
            assert_eq!(evalsha_all(&mut n, c, sha, keys, args, now), NOSCRIPT);
        }
        // SCRIPT LOAD caches without running; a restart forgets again.
        for (body, sha, ..) in cases {
            let loaded = run(&mut n, c, &[b"SCRIPT", b"LOAD", body], now);
            assert_eq!(loaded, [&b"$40\r\n"[..], sha, b"\r\n"].concat());
        }
        assert_eq!(pttl(&mut n, c, b"e", now), b":700\r\n");
        assert_eq!(
            run(&mut n, c, &exists, now),
            b"*5\r\n:1\r\n:1\r\n:1\r\n:1\r\n:1\r\n"
        );
        let (_, sha, keys, args, _) = cases[0];
        assert_eq!(evalsha_all(&mut n, c, sha, keys, args, now), b"$-1\r\n");
        n.restart(now);
        let d = n.accept();
        for (_, sha, keys, args, _) in cases {
            assert_eq!(evalsha_all(&mut n, d, sha, keys, args, now), NOSCRIPT);
        }
        assert_eq!(
            run(&mut n, d, &exists, now),
            b"*5\r\n:0\r\n:0\r\n:0\r\n:0\r\n:0\r\n"
        );
        assert_eq!(n.keys(now), vec![]);
    }

    #[test]
    fn lua_numbers_read_and_reply_as_in_redis() {
        // Each pinned against `redis-server` 7.0.15 (`tostring(tonumber(ARGV[1]))`).
        let cases: [(&[u8], Option<f64>); 36] = [
            (b"8", Some(8.0)),
            (b"-5", Some(-5.0)),
            (b"+3", Some(3.0)),
            (b"7.9", Some(7.9)),
            (b"-7.9", Some(-7.9)),
            (b"1.", Some(1.0)),
            (b".5e1", Some(5.0)),
            (b"1e3", Some(1000.0)),
            (b"1e400", Some(f64::INFINITY)),
            (b"1e-400", Some(0.0)),
            (b"99999999999999999999", Some(1e20)),
            (b" 9 ", Some(9.0)),
            (b"\t 42\r\n", Some(42.0)),
            (b"\x0b12\x0c", Some(12.0)),
            (b"12\0zz", Some(12.0)),
            (b"0x10", Some(16.0)),
            (b"0X1F", Some(31.0)),
            (b" -0x10 ", Some(-16.0)),
            (b"+0x10", Some(16.0)),
            (b"0x1p4", Some(16.0)),
            (b"0x1p+4", Some(16.0)),
            (b"0x1P-2", Some(0.25)),
            (b"0x1.8p1", Some(3.0)),
            (b"0x.8p1", Some(1.0)),
            (b"INFINITY", Some(f64::INFINITY)),
            (b"inf", Some(f64::INFINITY)),
            (b"", None),
            (b" ", None),
            (b".", None),
            (b"abc", None),
            (b"0x", None),
            (b"0x1p", None),
            (b"1e", None),
            (b"--5", None),
            (b"+-5", None),
            (b"1_0", None),
        ];
        for (s, want) in cases {
            assert_eq!(lua_tonumber(s), want, "{:?}", text(s));
        }
        for s in [&b"nan"[..], b"-nan", b"nan()", b"NaN(a_1)"] {
            assert!(lua_tonumber(s).is_some_and(f64::is_nan), "{}", text(s));
        }
        for s in [&b"nan(-)"[..], b"0xg", b"1e5x", "\u{ff11}".as_bytes()] {
            assert_eq!(lua_tonumber(s), None, "{}", text(s));
        }
        assert_eq!(lua_integer(7.9), 7);
        assert_eq!(lua_integer(-7.9), -7);
        assert_eq!(lua_integer(9.007_199_254_740_992e15), 9_007_199_254_740_992);
        for x in [f64::INFINITY, f64::NAN, 1.5e19, -1e19] {
            assert_eq!(lua_integer(x), i64::MIN, "{x}");
        }
        // Lua's `for` over doubles, and KEYS indexed by them.
        let v: Vec<f64> = lua_for(1.0, 2.5).collect();
        assert_eq!(v, [1.0, 2.0]);
        assert_eq!(lua_for(1.0, f64::NAN).count(), 0);
        assert_eq!(lua_for(2.5, 2.0).count(), 0);
        let keys: [&[u8]; 2] = [b"a", b"b"];
        assert_eq!(lua_index(&keys, 2.0), Some(&b"b"[..]));
        for i in [0.0, 1.5, 3.0, -1.0, f64::NAN, f64::INFINITY] {
            assert_eq!(lua_index(&keys, i), None, "{i}");
        }
    }

    #[test]
    fn a_clone_fingerprints_alike_and_a_key_changes_it() {
        use std::hash::Hasher;
        let print = |n: &SimNode| {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            n.fingerprint(&mut h, |id| id.0);
            h.finish()
        };
        let mut n = SimNode::new(3);
        let c = n.accept();
        let before = print(&n);
        let m = n.clone();
        assert_eq!(print(&m), before);
        run(&mut n, c, &[b"SET", b"k", b"v"], 0);
        assert_ne!(print(&n), before);
    }
}
