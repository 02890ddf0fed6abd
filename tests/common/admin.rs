//! A tiny blocking RESP2 client used by the tests to inspect and poke Redis
//! nodes directly, independently of the library under test.

use std::fmt;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// Default read/write timeout of an [`Admin`] connection.
pub const ADMIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Where a Redis server (or a proxy in front of one) listens.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Endpoint {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Tcp(a) => write!(f, "tcp:{a}"),
            Endpoint::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

impl From<SocketAddr> for Endpoint {
    fn from(a: SocketAddr) -> Self {
        Endpoint::Tcp(a)
    }
}

/// Credentials sent with `AUTH` right after connecting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Auth {
    /// `None` means the `default` user (`AUTH password`).
    pub user: Option<String>,
    pub password: String,
}

/// One RESP2 reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Reply>>),
}

impl Reply {
    /// `+OK`
    pub fn is_ok(&self) -> bool {
        matches!(self, Reply::Simple(s) if s == "OK")
    }

    pub fn is_error(&self) -> bool {
        matches!(self, Reply::Error(_))
    }

    /// The error text of an error reply (e.g. `NOAUTH Authentication required.`).
    pub fn error(&self) -> Option<&str> {
        match self {
            Reply::Error(e) => Some(e),
            _ => None,
        }
    }

    pub fn as_int(&self) -> Option<i64> {
        match self {
            Reply::Int(i) => Some(*i),
            _ => None,
        }
    }

    /// Bulk or simple string contents.
    pub fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            Reply::Bulk(Some(b)) => Some(b),
            Reply::Simple(s) => Some(s.as_bytes()),
            _ => None,
        }
    }

    /// Bulk or simple string contents, lossily decoded as UTF-8.
    pub fn as_string(&self) -> Option<String> {
        self.as_bytes()
            .map(|b| String::from_utf8_lossy(b).into_owned())
    }

    pub fn as_array(&self) -> Option<&[Reply]> {
        match self {
            Reply::Array(Some(v)) => Some(v),
            _ => None,
        }
    }
}

enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_read_timeout(t),
            Stream::Unix(s) => s.set_read_timeout(t),
        }
    }

    fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_write_timeout(t),
            Stream::Unix(s) => s.set_write_timeout(t),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.flush(),
            Stream::Unix(s) => s.flush(),
        }
    }
}

/// Encode a command as a RESP2 array of bulk strings.
pub fn encode_command<A: AsRef<[u8]>>(args: &[A]) -> Vec<u8> {
    let mut out =
        Vec::with_capacity(16 + args.iter().map(|a| a.as_ref().len() + 16).sum::<usize>());
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        let a = a.as_ref();
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

fn invalid(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

fn read_line<R: BufRead>(r: &mut R) -> io::Result<Vec<u8>> {
    let mut line = Vec::new();
    let n = r.read_until(b'\n', &mut line)?;
    if n == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed by peer",
        ));
    }
    if !line.ends_with(b"\r\n") {
        return Err(if line.ends_with(b"\n") {
            invalid("RESP line not terminated by CRLF")
        } else {
            io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed mid-line")
        });
    }
    line.truncate(line.len() - 2);
    Ok(line)
}

fn parse_int(b: &[u8]) -> io::Result<i64> {
    std::str::from_utf8(b)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| invalid(format!("bad RESP integer {:?}", String::from_utf8_lossy(b))))
}

/// Read one RESP2 reply.
pub fn read_reply<R: BufRead>(r: &mut R) -> io::Result<Reply> {
    let line = read_line(r)?;
    let Some((&kind, rest)) = line.split_first() else {
        return Err(invalid("empty RESP line"));
    };
    match kind {
        b'+' => Ok(Reply::Simple(String::from_utf8_lossy(rest).into_owned())),
        b'-' => Ok(Reply::Error(String::from_utf8_lossy(rest).into_owned())),
        b':' => Ok(Reply::Int(parse_int(rest)?)),
        b'$' => {
            let n = parse_int(rest)?;
            if n < 0 {
                return Ok(Reply::Bulk(None));
            }
            let mut data = vec![0u8; n as usize + 2];
            r.read_exact(&mut data)?;
            if !data.ends_with(b"\r\n") {
                return Err(invalid("bulk string not terminated by CRLF"));
            }
            data.truncate(n as usize);
            Ok(Reply::Bulk(Some(data)))
        }
        b'*' => {
            let n = parse_int(rest)?;
            if n < 0 {
                return Ok(Reply::Array(None));
            }
            let mut items = Vec::with_capacity(n.min(1024) as usize);
            for _ in 0..n {
                items.push(read_reply(r)?);
            }
            Ok(Reply::Array(Some(items)))
        }
        other => Err(invalid(format!(
            "unexpected RESP type byte {:?}",
            other as char
        ))),
    }
}

/// A blocking RESP2 connection. After any I/O error (including a read
/// timeout) the connection is marked broken and every further call fails:
/// open a new one.
pub struct Admin {
    conn: BufReader<Stream>,
    endpoint: Endpoint,
    auth: Option<Auth>,
    broken: Option<String>,
}

impl fmt::Debug for Admin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admin")
            .field("endpoint", &self.endpoint)
            .field("user", &self.auth.as_ref().map(|a| a.user.clone()))
            .field("broken", &self.broken)
            .finish()
    }
}

impl Admin {
    /// Connect (and `AUTH` if `auth` is given) with the default 5 s timeouts.
    pub fn connect(endpoint: &Endpoint, auth: Option<&Auth>) -> io::Result<Admin> {
        Self::connect_timeout(endpoint, auth, ADMIN_TIMEOUT)
    }

    /// Connect to a TCP address without authenticating (e.g. through a proxy).
    pub fn connect_tcp(addr: SocketAddr) -> io::Result<Admin> {
        Self::connect(&Endpoint::Tcp(addr), None)
    }

    /// Connect with `timeout` used for connecting, reading and writing.
    /// A failed `AUTH` yields an error of kind `PermissionDenied`.
    pub fn connect_timeout(
        endpoint: &Endpoint,
        auth: Option<&Auth>,
        timeout: Duration,
    ) -> io::Result<Admin> {
        let stream = match endpoint {
            Endpoint::Tcp(a) => {
                let s = TcpStream::connect_timeout(a, timeout)?;
                s.set_nodelay(true)?;
                Stream::Tcp(s)
            }
            Endpoint::Unix(p) => Stream::Unix(UnixStream::connect(p)?),
        };
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        let mut admin = Admin {
            conn: BufReader::new(stream),
            endpoint: endpoint.clone(),
            auth: auth.cloned(),
            broken: None,
        };
        if let Some(a) = auth {
            let reply = admin.auth(a.user.as_deref(), &a.password)?;
            if let Reply::Error(e) = reply {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!("AUTH failed on {endpoint}: {e}"),
                ));
            }
        }
        Ok(admin)
    }

    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// Change the read timeout (`None` = block forever).
    pub fn set_read_timeout(&mut self, t: Option<Duration>) -> io::Result<()> {
        self.conn.get_ref().set_read_timeout(t)
    }

    pub fn set_write_timeout(&mut self, t: Option<Duration>) -> io::Result<()> {
        self.conn.get_ref().set_write_timeout(t)
    }

    fn check(&self) -> io::Result<()> {
        match &self.broken {
            Some(why) => Err(io::Error::new(
                io::ErrorKind::NotConnected,
                format!("admin connection to {} is broken: {why}", self.endpoint),
            )),
            None => Ok(()),
        }
    }

    fn mark<T>(&mut self, r: io::Result<T>) -> io::Result<T> {
        if let Err(e) = &r {
            self.broken = Some(e.to_string());
        }
        r
    }

    /// Send a command without waiting for its reply (pipelining).
    pub fn send<A: AsRef<[u8]>>(&mut self, args: &[A]) -> io::Result<()> {
        self.check()?;
        let buf = encode_command(args);
        let r = self.conn.get_mut().write_all(&buf);
        self.mark(r)
    }

    /// Send raw bytes as-is.
    pub fn send_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.check()?;
        let r = self.conn.get_mut().write_all(bytes);
        self.mark(r)
    }

    /// Read one reply.
    pub fn recv(&mut self) -> io::Result<Reply> {
        self.check()?;
        let r = read_reply(&mut self.conn);
        self.mark(r)
    }

    /// Send a command and read its reply; I/O errors (timeouts, EOF, ...)
    /// are returned, Redis errors come back as `Ok(Reply::Error(..))`.
    pub fn try_cmd<A: AsRef<[u8]>>(&mut self, args: &[A]) -> io::Result<Reply> {
        self.send(args)?;
        self.recv()
    }

    /// Like [`Admin::try_cmd`] but panics on I/O errors.
    pub fn cmd<A: AsRef<[u8]>>(&mut self, args: &[A]) -> Reply {
        match self.try_cmd(args) {
            Ok(r) => r,
            Err(e) => {
                let shown: Vec<String> = args
                    .iter()
                    .map(|a| String::from_utf8_lossy(a.as_ref()).into_owned())
                    .collect();
                panic!("admin command {shown:?} on {} failed: {e}", self.endpoint)
            }
        }
    }

    /// `AUTH [user] password`; returns the server's reply.
    pub fn auth(&mut self, user: Option<&str>, password: &str) -> io::Result<Reply> {
        match user {
            Some(u) => self.try_cmd(&["AUTH", u, password]),
            None => self.try_cmd(&["AUTH", password]),
        }
    }

    /// `PING`, returning the raw reply or the I/O error.
    pub fn try_ping(&mut self) -> io::Result<Reply> {
        self.try_cmd(&["PING"])
    }

    /// `PING` answered with `+PONG`.
    pub fn ping(&mut self) -> bool {
        matches!(self.try_ping(), Ok(Reply::Simple(s)) if s == "PONG")
    }

    fn expect_ok(&mut self, what: &str, r: Reply) {
        assert!(
            r.is_ok(),
            "{what} on {}: unexpected reply {r:?}",
            self.endpoint
        );
    }

    fn expect_int(&mut self, what: &str, r: Reply) -> i64 {
        match r {
            Reply::Int(i) => i,
            other => panic!("{what} on {}: unexpected reply {other:?}", self.endpoint),
        }
    }

    pub fn get(&mut self, key: impl AsRef<[u8]>) -> Option<Vec<u8>> {
        match self.cmd(&[b"GET".as_slice(), key.as_ref()]) {
            Reply::Bulk(b) => b,
            other => panic!("GET on {}: unexpected reply {other:?}", self.endpoint),
        }
    }

    pub fn set(&mut self, key: impl AsRef<[u8]>, val: impl AsRef<[u8]>) {
        let r = self.cmd(&[b"SET".as_slice(), key.as_ref(), val.as_ref()]);
        self.expect_ok("SET", r);
    }

    /// `SET key val PX ms`
    pub fn set_px(&mut self, key: impl AsRef<[u8]>, val: impl AsRef<[u8]>, ms: u64) {
        let ms = ms.to_string();
        let r = self.cmd(&[
            b"SET".as_slice(),
            key.as_ref(),
            val.as_ref(),
            b"PX",
            ms.as_bytes(),
        ]);
        self.expect_ok("SET PX", r);
    }

    pub fn del(&mut self, key: impl AsRef<[u8]>) -> i64 {
        let r = self.cmd(&[b"DEL".as_slice(), key.as_ref()]);
        self.expect_int("DEL", r)
    }

    /// `PTTL key`: -2 if missing, -1 if no expiry.
    pub fn pttl(&mut self, key: impl AsRef<[u8]>) -> i64 {
        let r = self.cmd(&[b"PTTL".as_slice(), key.as_ref()]);
        self.expect_int("PTTL", r)
    }

    pub fn exists(&mut self, key: impl AsRef<[u8]>) -> bool {
        let r = self.cmd(&[b"EXISTS".as_slice(), key.as_ref()]);
        self.expect_int("EXISTS", r) > 0
    }

    pub fn flushall(&mut self) {
        let r = self.cmd(&["FLUSHALL"]);
        self.expect_ok("FLUSHALL", r);
    }

    pub fn script_flush(&mut self) {
        let r = self.cmd(&["SCRIPT", "FLUSH"]);
        self.expect_ok("SCRIPT FLUSH", r);
    }

    /// `SCRIPT EXISTS sha1`
    pub fn script_exists(&mut self, sha1: &str) -> bool {
        match self.cmd(&["SCRIPT", "EXISTS", sha1]) {
            Reply::Array(Some(v)) => v.first() == Some(&Reply::Int(1)),
            other => panic!(
                "SCRIPT EXISTS on {}: unexpected reply {other:?}",
                self.endpoint
            ),
        }
    }

    /// `CLIENT KILL TYPE normal SKIPME yes`: drops every normal client
    /// connection except this one; returns how many were killed.
    pub fn client_kill_normal(&mut self) -> i64 {
        let r = self.cmd(&["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"]);
        self.expect_int("CLIENT KILL", r)
    }

    /// Number of connected clients (`INFO clients` / `connected_clients`).
    pub fn connected_clients(&mut self) -> i64 {
        self.info_field("clients", "connected_clients")
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no connected_clients in INFO on {}", self.endpoint))
    }

    /// `DBSIZE`
    pub fn keys_count(&mut self) -> i64 {
        let r = self.cmd(&["DBSIZE"]);
        self.expect_int("DBSIZE", r)
    }

    /// Raw `INFO section` text.
    pub fn info(&mut self, section: &str) -> String {
        match self.cmd(&["INFO", section]) {
            Reply::Bulk(Some(b)) => String::from_utf8_lossy(&b).into_owned(),
            other => panic!("INFO on {}: unexpected reply {other:?}", self.endpoint),
        }
    }

    /// One `field:value` line of `INFO section`.
    pub fn info_field(&mut self, section: &str, field: &str) -> Option<String> {
        let text = self.info(section);
        text.lines().find_map(|l| {
            l.strip_prefix(field)
                .and_then(|rest| rest.strip_prefix(':'))
                .map(|v| v.trim().to_string())
        })
    }

    /// The server's `uptime_in_seconds` (0 if it cannot be read).
    /// Subscribers to `key`'s release notices (`PUBSUB NUMSUB quorumlock:released:<key>`).
    pub fn notice_listeners(&mut self, key: &str) -> i64 {
        let channel = format!("quorumlock:released:{key}");
        self.cmd(&["PUBSUB", "NUMSUB", channel.as_str()])
            .as_array()
            .and_then(|a| a.get(1))
            .and_then(|r| r.as_int())
            .unwrap_or(0)
    }

    pub fn uptime_secs(&mut self) -> u64 {
        self.info_field("server", "uptime_in_seconds")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }

    /// The server's pid (`INFO server` / `process_id`).
    pub fn server_pid(&mut self) -> u32 {
        self.info_field("server", "process_id")
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no process_id in INFO on {}", self.endpoint))
    }

    /// Make the server sleep for `secs` seconds (`DEBUG SLEEP`) using a
    /// separate connection. Returns once the server is observed sleeping (its
    /// main thread is in `nanosleep`, see [`in_debug_sleep`]), so the caller's
    /// next request is queued behind the sleep; the returned thread waits for
    /// the sleep's reply. Panics if the sleep is not seen within 10 s, or is
    /// already over when first seen (use a longer sleep).
    pub fn debug_sleep(&self, secs: f64) -> JoinHandle<io::Result<Reply>> {
        let timeout = ADMIN_TIMEOUT + Duration::from_secs_f64(secs.max(0.0));
        let mut conn = Admin::connect(&self.endpoint, self.auth.as_ref())
            .unwrap_or_else(|e| panic!("DEBUG SLEEP: connect to {} failed: {e}", self.endpoint));
        let pid = conn.server_pid();
        conn.set_read_timeout(Some(timeout))
            .expect("set_read_timeout");
        let secs_s = format!("{secs}");
        conn.send(&["DEBUG", "SLEEP", secs_s.as_str()])
            .unwrap_or_else(|e| panic!("DEBUG SLEEP: send to {} failed: {e}", self.endpoint));
        let handle = thread::Builder::new()
            .name("admin-debug-sleep".into())
            .spawn(move || conn.recv())
            .expect("spawn debug-sleep thread");
        // Wait until the server has picked the command up: its main thread sleeps.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if in_debug_sleep(pid) {
                return handle;
            }
            assert!(
                !handle.is_finished(),
                "DEBUG SLEEP {secs} on {} was over before it was seen running: use a \
                 longer sleep",
                self.endpoint
            );
            assert!(
                Instant::now() < deadline,
                "DEBUG SLEEP {secs} on {} (pid {pid}) not seen running after 10 s",
                self.endpoint
            );
            thread::sleep(Duration::from_millis(1));
        }
    }
}

/// Whether the redis-server `pid` is inside a `DEBUG SLEEP` right now: its main
/// thread is blocked in `nanosleep` (an idle server waits in `epoll_wait`).
/// Reads `/proc/<pid>/wchan` (the kernel function it waits in), falling back to
/// the syscall number in `/proc/<pid>/syscall` (x86_64: 35 nanosleep, 230
/// clock_nanosleep; aarch64: 101, 115). Panics if neither can be read.
pub fn in_debug_sleep(pid: u32) -> bool {
    let wchan = std::fs::read_to_string(format!("/proc/{pid}/wchan")).unwrap_or_default();
    if wchan.contains("nanosleep") {
        return true;
    }
    if !wchan.is_empty() && wchan != "0" {
        return false;
    }
    let syscall = std::fs::read_to_string(format!("/proc/{pid}/syscall"))
        .unwrap_or_else(|e| panic!("cannot tell whether pid {pid} sleeps: /proc: {e}"));
    let nr = syscall.split_whitespace().next().unwrap_or("");
    let sleeping: &[&str] = if cfg!(target_arch = "aarch64") {
        &["101", "115"]
    } else {
        &["35", "230"]
    };
    sleeping.contains(&nr)
}
