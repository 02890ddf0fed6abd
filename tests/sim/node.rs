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
//!   [EX s|PX ms|KEEPTTL]`, `GET`, `DEL key…`, `PEXPIRE key ms`, `PTTL`, `EVAL`/`EVALSHA`
//!   of exactly the client's two scripts, `SCRIPT FLUSH|LOAD|EXISTS`, `QUIT`. The order of
//!   checks is Redis 7's: unknown command, then arity, then `NOAUTH`, then the command's own
//!   argument errors. Error texts are Redis 7's.
//! - Time: the node reads only the `now` it is given (nanoseconds on its own clock, which
//!   may jump or run backwards: Redis expires by wall-clock time). Like Redis, it works in
//!   whole milliseconds: `PX ms` sets the expiry to `now_ms + ms` with
//!   `now_ms = now / 1 ms`, and a key is gone once `now_ms > expiry`. So a key set at node
//!   time `t` with `PX ms` is still there at `t + ms` and gone from
//!   `(floor(t / 1 ms) + ms + 1) ms` on: it can outlive its ttl by up to 1 ms, which is
//!   what the Redlock drift allowance's `+ 2 ms` is for.
//! - Expiry is lazy (every access checks), plus [`SimNode::expire_all`]; Redis's active
//!   expiry samples keys at random, which no command can observe.
//! - The script cache: `EVAL` and `SCRIPT LOAD` of either script cache it by its SHA1
//!   (the constants of `core::script`, the script matched by its exact text); `EVALSHA` of
//!   a script not cached answers `-NOSCRIPT`. `SCRIPT FLUSH` and [`SimNode::restart`]
//!   empty it. Any other script is refused with an error that says it is not modelled.
//! - Faults: [`SimNode::restart`] (no persistence: every key, the script cache and every
//!   connection lost; connection ids are never reused, so a stale id reads as closed).
//!   Freezes, latency and partial writes are the simulation's business: it just does not
//!   feed, delays, or splits.
//! - Bounds: a connection holding more than [`MAX_QUERY`] bytes of input with no complete
//!   command is closed; a `*` count above [`MAX_MULTIBULK`] or a bulk longer than
//!   [`MAX_QUERY`] is a protocol error; header and inline lines wait at most
//!   [`MAX_INLINE`] bytes for their end. As in Redis 7, while a password is required and
//!   the connection has not authenticated, a request of more than 10 arguments or a bulk
//!   over 16384 bytes is a protocol error.

use std::collections::BTreeMap;
use std::ops::Range;

use quorumlock::__private::core::script::{EXTEND, EXTEND_SHA, RELEASE, RELEASE_SHA};

/// A time on one node's own clock, in nanoseconds.
pub type SimTime = u64;

/// Nanoseconds per millisecond.
pub const NS_PER_MS: SimTime = 1_000_000;

/// Bytes of input a connection may hold without a complete command (and the longest bulk).
pub const MAX_QUERY: usize = 1 << 20;

/// The largest `*` count accepted.
pub const MAX_MULTIBULK: i64 = 1024 * 1024;

/// How long a `*`/`$` header line or an inline request may grow before it must end.
pub const MAX_INLINE: usize = 64 * 1024;

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
#[derive(Debug)]
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

/// The two scripts the node can run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Script {
    Release,
    Extend,
}

impl Script {
    fn by_text(text: &[u8]) -> Option<Script> {
        if text == RELEASE {
            Some(Script::Release)
        } else if text == EXTEND {
            Some(Script::Extend)
        } else {
            None
        }
    }

    fn by_sha(sha: &[u8]) -> Option<Script> {
        // Redis lowercases the digest before looking it up.
        if sha.eq_ignore_ascii_case(RELEASE_SHA) {
            Some(Script::Release)
        } else if sha.eq_ignore_ascii_case(EXTEND_SHA) {
            Some(Script::Extend)
        } else {
            None
        }
    }

    fn sha(self) -> &'static [u8; 40] {
        match self {
            Script::Release => RELEASE_SHA,
            Script::Extend => EXTEND_SHA,
        }
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
    Quit,
}

impl Cmd {
    /// The command, its name as Redis prints it, and its arity (negative: at least).
    fn lookup(name: &[u8]) -> Option<(Cmd, &'static str, i64)> {
        const TABLE: [(Cmd, &str, i64); 12] = [
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
#[derive(Debug)]
pub struct SimNode {
    seed: u64,
    rng: fastrand::Rng,
    run_id: [u8; 40],
    next_conn: u64,
    conns: BTreeMap<u64, Conn>,
    dbs: Vec<BTreeMap<Vec<u8>, Entry>>,
    release_cached: bool,
    extend_cached: bool,
    /// `requirepass`: the default user's password; `None`: the default user is `nopass`.
    password: Option<Vec<u8>>,
    /// Other ACL users, by name and password.
    users: Vec<(Vec<u8>, Vec<u8>)>,
    restarts: u64,
    commands: u64,
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
            next_conn: 1,
            conns: BTreeMap::new(),
            dbs: vec![BTreeMap::new(); DATABASES],
            release_cached: false,
            extend_cached: false,
            password: None,
            users: Vec::new(),
            restarts: 0,
            commands: 0,
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

    /// A restart without persistence: every key, the script cache and every connection
    /// are lost. The password and users are configuration: they stay.
    pub fn restart(&mut self) {
        self.conns.clear();
        for db in &mut self.dbs {
            db.clear();
        }
        self.release_cached = false;
        self.extend_cached = false;
        self.restarts += 1;
        self.run_id = run_id(&mut self.rng);
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

    /// Whether the script with SHA1 `sha` is in the cache.
    pub fn script_cached(&self, sha: &[u8]) -> bool {
        match Script::by_sha(sha) {
            Some(Script::Release) => self.release_cached,
            Some(Script::Extend) => self.extend_cached,
            None => false,
        }
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
            Cmd::Auth => self.auth(s, argv, out),
            Cmd::Select => match string2ll(argv[1]) {
                Some(n) if i32::try_from(n).is_ok() => {
                    if (0..DATABASES as i64).contains(&n) {
                        s.db = n as usize;
                        simple(out, b"OK");
                    } else {
                        err(out, b"ERR DB index is out of range");
                    }
                }
                _ => err(out, NOT_INTEGER),
            },
            Cmd::Set => self.set(s.db, argv, now_ms, out),
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
            Cmd::Pexpire => {
                if argv.len() > 3 {
                    let mut msg = b"ERR Unsupported option ".to_vec();
                    msg.extend_from_slice(c_str(argv[3], usize::MAX));
                    err(out, &msg);
                } else if let Err(e) = self.pexpire(s.db, argv[1], argv[2], now_ms, out) {
                    err(out, e.as_bytes());
                }
            }
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

    fn set(&mut self, db: usize, argv: &[&[u8]], now_ms: i64, out: &mut Vec<u8>) {
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
                return err(out, SYNTAX);
            }
            i += 1;
        }
        let when = match expire {
            None => None,
            Some((raw, unit)) => {
                let Some(n) = string2ll(raw) else {
                    return err(out, NOT_INTEGER);
                };
                match n
                    .checked_mul(unit)
                    .filter(|&ms| n > 0 && ms > 0)
                    .and_then(|ms| ms.checked_add(now_ms))
                {
                    Some(when) => Some(when),
                    None => return err(out, b"ERR invalid expire time in 'set' command"),
                }
            }
        };
        let old = self.lookup(db, key, now_ms).map(|e| e.expires_ms);
        if (nx && old.is_some()) || (xx && old.is_none()) {
            return nil(out);
        }
        let expires_ms = if keepttl { old.flatten() } else { when };
        self.dbs[db].insert(
            key.to_vec(),
            Entry {
                value: value.to_vec(),
                expires_ms,
            },
        );
        simple(out, b"OK");
    }

    /// `PEXPIRE key ms`: `:0` for a missing key, `:1` otherwise (deleting the key if the
    /// new expiry is not in the future). `Err`: the error text.
    fn pexpire(
        &mut self,
        db: usize,
        key: &[u8],
        raw: &[u8],
        now_ms: i64,
        out: &mut Vec<u8>,
    ) -> Result<(), String> {
        let n = string2ll(raw).ok_or_else(|| String::from_utf8_lossy(NOT_INTEGER).into_owned())?;
        let when = n
            .checked_add(now_ms)
            .ok_or_else(|| "ERR invalid expire time in 'pexpire' command".to_string())?;
        match self.lookup(db, key, now_ms) {
            None => int(out, 0),
            Some(_) if when <= now_ms => {
                self.dbs[db].remove(key);
                int(out, 1);
            }
            Some(e) => {
                e.expires_ms = Some(when);
                int(out, 1);
            }
        }
        Ok(())
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
            match Script::by_sha(argv[1]).filter(|s| self.script_cached(s.sha())) {
                Some(s) => s,
                None => return err(out, b"NOSCRIPT No matching script. Please use EVAL."),
            }
        } else {
            match Script::by_text(argv[1]) {
                Some(s) => {
                    self.cache(s);
                    s
                }
                None => {
                    return err(
                        out,
                        b"ERR sim: only the release and extend scripts are modelled",
                    );
                }
            }
        };
        let (keys, args) = argv[3..].split_at(numkeys as usize);
        // Any error a `redis.call` raises, as Redis 7 reports it from a script.
        let script_err = |out: &mut Vec<u8>, msg: &str| {
            let sha = String::from_utf8_lossy(script.sha());
            err(
                out,
                format!("{msg} script: {sha}, on @user_script:1.").as_bytes(),
            );
        };
        // `redis.call("get",KEYS[1]) == ARGV[1]`.
        let Some(&key) = keys.first() else {
            return script_err(
                out,
                "ERR Lua redis lib command arguments must be strings or integers",
            );
        };
        let matches = match (self.lookup(db, key, now_ms), args.first()) {
            (Some(e), Some(token)) => e.value == *token,
            _ => false,
        };
        if !matches {
            return int(out, 0);
        }
        match script {
            Script::Release => {
                self.dbs[db].remove(key);
                int(out, 1);
            }
            Script::Extend => {
                let Some(ttl) = args.get(1) else {
                    return script_err(
                        out,
                        "ERR Lua redis lib command arguments must be strings or integers",
                    );
                };
                let mut reply = Vec::new();
                match self.pexpire(db, key, ttl, now_ms, &mut reply) {
                    Ok(()) => out.extend_from_slice(&reply),
                    Err(e) => script_err(out, &e),
                }
            }
        }
    }

    fn cache(&mut self, script: Script) {
        match script {
            Script::Release => self.release_cached = true,
            Script::Extend => self.extend_cached = true,
        }
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
                    self.release_cached = false;
                    self.extend_cached = false;
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
                    self.cache(s);
                    bulk(out, s.sha());
                }
                None => err(
                    out,
                    b"ERR sim: only the release and extend scripts are modelled",
                ),
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

fn run_id(rng: &mut fastrand::Rng) -> [u8; 40] {
    std::array::from_fn(|_| b"0123456789abcdef"[rng.usize(..16)])
}
