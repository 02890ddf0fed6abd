//! Settings, their builder, and node URLs; everything is validated before any socket opens.

use crate::Redlock;
use crate::error::{ConfigError, Error};
use crate::resp::Limits;

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

/// Where a node lives and how to log in to it: a parsed node URL.
///
/// Accepted forms:
///
/// - `redis://[[user]:password@]host[:port][/db]` (port 6379 and db 0 by default; user
///   and password may be percent-encoded; IPv6 hosts in brackets)
/// - `unix:///path/to/redis.sock[?db=N][&user=U][&password=P]`, or with the login
///   in front: `unix://[user]:password@/path/to/redis.sock`
/// - with the `tls` feature, `rediss://[[user]:password@]host[:port][/db]`: as
///   `redis://`, over TLS, the host sent as SNI and checked against the server's
///   certificate (see [`Builder::tls_ca_file`](crate::Builder)). Without the feature such
///   a URL is a [`ConfigError`] that says the build lacks it.
///
/// # Example
///
/// ```
/// use quorumlock::Endpoint;
///
/// let e = Endpoint::parse("redis://app:s3cret@127.0.0.1:7001/2").unwrap();
/// assert_eq!(e.db(), 2);
/// assert_eq!(e.to_string(), "redis://app:***@127.0.0.1:7001/2");
/// assert!(Endpoint::parse("redis://127.0.0.1:99999").is_err());
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub(crate) addr: Address,
    pub(crate) user: Option<String>,
    pub(crate) password: Option<String>,
    pub(crate) db: u32,
    shown: String,
    /// For a `rediss://` node: the host's name, sent as SNI and verified in the
    /// server's certificate.
    #[cfg(feature = "tls")]
    pub(crate) tls: Option<rustls::pki_types::ServerName<'static>>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Address {
    /// An IP literal: connected to as is, nothing to resolve.
    Tcp(SocketAddr),
    /// A host name (as written, without brackets) and port: resolved each time a
    /// connection is opened (`driver::conn`), never at parse time, so a node whose
    /// address changes is reached at its new one at the next reconnect.
    Host(String, u16),
    Unix(PathBuf),
}

impl Endpoint {
    /// Parses and checks a node URL. Nothing is resolved here: a host name is kept as
    /// written and resolved each time a connection to the node is opened (so a node
    /// whose address changes is reached at its new address at the next reconnect, and a
    /// name that does not resolve yet is a node down, not an invalid URL). An IP
    /// literal is never resolved.
    pub fn parse(url: &str) -> Result<Endpoint, ConfigError> {
        Endpoint::parse_as("node", url)
    }

    pub(crate) fn parse_as(setting: &str, url: &str) -> Result<Endpoint, ConfigError> {
        let bad = |problem: &str| ConfigError::new(setting, mask(url), problem);
        if let Some(rest) = url.strip_prefix("redis://") {
            let (addr, user, password, db, _) = parse_tcp(rest, &bad)?;
            Ok(Endpoint::new(addr, user, password, db))
        } else if let Some(rest) = url.strip_prefix("rediss://") {
            Endpoint::parse_tls(rest, &bad)
        } else if let Some(rest) = url.strip_prefix("unix://") {
            let (login, rest) = match login_end("unix", rest) {
                Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
                None => (None, rest),
            };
            let (mut user, mut password) = login
                .map(|l| parse_login(l, &bad))
                .transpose()?
                .unwrap_or((None, None));
            let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
            if !path.starts_with('/') {
                return Err(bad(
                    "a unix socket path must be absolute (unix:///path/to/redis.sock)",
                ));
            }
            let mut db = 0;
            for pair in query.split('&').filter(|p| !p.is_empty()) {
                let (k, v) = pair
                    .split_once('=')
                    .ok_or_else(|| bad("query parameters must be key=value"))?;
                match k {
                    "db" => db = parse_db(v, &bad)?,
                    "user" => {
                        user = Some(
                            percent_decode(v).ok_or_else(|| bad("bad percent-encoding in user"))?,
                        )
                    }
                    "password" | "pass" => {
                        password = Some(
                            percent_decode(v)
                                .ok_or_else(|| bad("bad percent-encoding in password"))?,
                        )
                    }
                    _ => {
                        return Err(bad(&format!(
                            "unknown query parameter {k:?} (expected db, user, password)"
                        )));
                    }
                }
            }
            if user.is_some() && password.is_none() {
                return Err(bad("a user needs a password"));
            }
            Ok(Endpoint::new(
                Address::Unix(PathBuf::from(path)),
                user,
                password,
                db,
            ))
        } else {
            Err(bad("scheme must be redis://, rediss:// or unix://"))
        }
    }

    /// A `rediss://` URL (after the scheme): as `redis://`, with TLS to the host named.
    #[cfg(feature = "tls")]
    fn parse_tls(rest: &str, bad: &dyn Fn(&str) -> ConfigError) -> Result<Endpoint, ConfigError> {
        let (addr, user, password, db, host) = parse_tcp(rest, bad)?;
        let name = crate::tls::server_name(host).map_err(|e| bad(&e))?;
        let mut e = Endpoint::new(addr, user, password, db);
        e.shown.insert(5, 's');
        e.tls = Some(name);
        Ok(e)
    }

    #[cfg(not(feature = "tls"))]
    fn parse_tls(_: &str, bad: &dyn Fn(&str) -> ConfigError) -> Result<Endpoint, ConfigError> {
        Err(bad(
            "rediss:// (TLS) is not available: quorumlock was built without the `tls` \
             feature (enable it: features = [\"tls\"])",
        ))
    }

    /// Whether the node is reached over TLS (a `rediss://` URL).
    ///
    /// # Example
    ///
    /// ```
    /// use quorumlock::Endpoint;
    ///
    /// assert!(!Endpoint::parse("redis://127.0.0.1:7001").unwrap().is_tls());
    /// # #[cfg(feature = "tls")]
    /// assert!(Endpoint::parse("rediss://127.0.0.1:7001").unwrap().is_tls());
    /// ```
    pub fn is_tls(&self) -> bool {
        #[cfg(feature = "tls")]
        return self.tls.is_some();
        #[cfg(not(feature = "tls"))]
        false
    }

    fn new(addr: Address, user: Option<String>, password: Option<String>, db: u32) -> Endpoint {
        let login = match (&user, &password) {
            (Some(u), Some(_)) => format!("{u}:***@"),
            (None, Some(_)) => ":***@".to_string(),
            _ => String::new(),
        };
        let shown = match &addr {
            Address::Tcp(a) if db == 0 => format!("redis://{login}{a}"),
            Address::Tcp(a) => format!("redis://{login}{a}/{db}"),
            Address::Host(h, port) if db == 0 => format!("redis://{login}{h}:{port}"),
            Address::Host(h, port) => format!("redis://{login}{h}:{port}/{db}"),
            Address::Unix(p) if db == 0 => format!("unix://{login}{}", p.display()),
            Address::Unix(p) => format!("unix://{login}{}?db={db}", p.display()),
        };
        Endpoint {
            addr,
            user,
            password,
            db,
            shown,
            #[cfg(feature = "tls")]
            tls: None,
        }
    }

    /// What identifies the server: its socket address (a host name as written, in
    /// lower case: names are not resolved here, so two names for one server are told
    /// apart only once connected, by its `run_id`: see [`NodeError::Duplicate`]), or
    /// its socket path, resolved (links, `..`) when the file exists, else with `.` and
    /// repeated `/` dropped.
    ///
    /// [`NodeError::Duplicate`]: crate::NodeError::Duplicate
    fn server(&self) -> String {
        match &self.addr {
            Address::Tcp(a) => a.to_string(),
            Address::Host(h, port) => format!("{}:{port}", h.to_ascii_lowercase()),
            Address::Unix(p) => std::fs::canonicalize(p)
                .unwrap_or_else(|_| p.components().collect())
                .display()
                .to_string(),
        }
    }

    /// The database number selected after connecting.
    pub fn db(&self) -> u32 {
        self.db
    }
}

impl std::fmt::Debug for Endpoint {
    /// The URL with any password replaced by `***`, as [`Display`](std::fmt::Display):
    /// a password never reaches a log through `{:?}`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Endpoint").field(&self.shown).finish()
    }
}

impl std::fmt::Display for Endpoint {
    /// The URL with any password replaced by `***`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown)
    }
}

/// The parts of a `redis://` URL after the scheme: the address (an IP literal, or a name
/// left unresolved), the login, the db, and the host as written.
type TcpParts<'a> = (Address, Option<String>, Option<String>, u32, &'a str);

fn parse_tcp<'a>(
    rest: &'a str,
    bad: &dyn Fn(&str) -> ConfigError,
) -> Result<TcpParts<'a>, ConfigError> {
    let (login, hostpart) = split_login(rest);
    let (user, password) = login
        .map(|l| parse_login(l, bad))
        .transpose()?
        .unwrap_or((None, None));
    let (hostport, db) = match hostpart.split_once('/') {
        Some((hp, "")) => (hp, 0),
        Some((hp, db)) => (hp, parse_db(db, bad)?),
        None => (hostpart, 0),
    };
    if hostport.contains('?') {
        return Err(bad("query parameters are not supported in redis:// URLs"));
    }
    let (host, port) = split_host_port(hostport, bad)?;
    if host.is_empty() {
        return Err(bad("missing host"));
    }
    // An IP literal skips resolution for good; a name is resolved at each connect.
    let addr = match host.parse::<IpAddr>() {
        Ok(ip) => Address::Tcp(SocketAddr::new(ip, port)),
        Err(_) => {
            if host.contains(|c: char| c.is_whitespace() || c.is_control() || c == '[' || c == ']')
            {
                return Err(bad(&format!(
                    "host {host:?} is not a host name or IP address"
                )));
            }
            Address::Host(host.to_string(), port)
        }
    };
    Ok((addr, user, password, db, host))
}

fn split_login(rest: &str) -> (Option<&str>, &str) {
    match login_end("redis", rest) {
        Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
        None => (None, rest),
    }
}

/// Where the login ends (its '@') in the part of a URL after `scheme://`. A host, port,
/// db or socket path holds no '@' before it, so the login runs to the last '@' (for
/// `unix://`, the last one followed by the path's '/'): a password may hold any of
/// `@ / ? # :`.
fn login_end(scheme: &str, rest: &str) -> Option<usize> {
    if scheme == "unix" {
        if rest.starts_with('/') {
            None
        } else {
            rest.rfind("@/")
        }
    } else {
        rest.rfind('@')
    }
}

type Login = (Option<String>, Option<String>);

fn parse_login(login: &str, bad: &dyn Fn(&str) -> ConfigError) -> Result<Login, ConfigError> {
    let (user, password) = match login.split_once(':') {
        Some((u, p)) => (u, Some(p)),
        None => (login, None),
    };
    let decode = |s: &str, what: &str| {
        percent_decode(s).ok_or_else(|| bad(&format!("bad percent-encoding in {what}")))
    };
    let user = if user.is_empty() {
        None
    } else {
        Some(decode(user, "user")?)
    };
    let password = password.map(|p| decode(p, "password")).transpose()?;
    match (&user, &password) {
        (Some(_), None) => Err(bad("a user needs a password (redis://user:password@host)")),
        (_, Some(p)) if p.is_empty() => Err(bad("empty password")),
        _ => Ok((user, password)),
    }
}

fn split_host_port<'a>(
    hostport: &'a str,
    bad: &dyn Fn(&str) -> ConfigError,
) -> Result<(&'a str, u16), ConfigError> {
    let (host, port) = if let Some(rest) = hostport.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .ok_or_else(|| bad("unclosed '[' in IPv6 host"))?;
        match after {
            "" => (host, None),
            p => (
                host,
                Some(
                    p.strip_prefix(':')
                        .ok_or_else(|| bad("expected ':' after IPv6 host"))?,
                ),
            ),
        }
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (hostport, None),
        }
    };
    let port = match port {
        None => 6379,
        Some(p) => match p.parse::<u32>() {
            Ok(n @ 1..=65535) => n as u16,
            Ok(_) => return Err(bad(&format!("port {p} is out of range 1-65535"))),
            Err(_) => return Err(bad(&format!("port {p:?} is not a number"))),
        },
    };
    Ok((host, port))
}

fn parse_db(db: &str, bad: &dyn Fn(&str) -> ConfigError) -> Result<u32, ConfigError> {
    db.parse::<u32>()
        .map_err(|_| bad(&format!("database {db:?} is not a non-negative number")))
}

fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Hides the password in a URL for error messages and `Debug`: the login's password (or
/// the whole login when it has no ':'), and `password=`/`pass=` query values.
pub(crate) fn mask(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    // Wider than `login_end` on purpose: a malformed URL may still carry a password.
    let at = if rest.starts_with('/') {
        None
    } else {
        rest.rfind('@')
    };
    let (login, tail) = match at {
        Some(at) => (Some(&rest[..at]), &rest[at..]),
        None => (None, rest),
    };
    let login = match login.map(|l| l.split_once(':')) {
        Some(Some((user, _))) => format!("{user}:***"),
        Some(None) => "***".to_string(),
        None => String::new(),
    };
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let pairs: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((k, _)) if k == "password" || k == "pass" => format!("{k}=***"),
                    _ => pair.to_string(),
                })
                .collect();
            format!("{path}?{}", pairs.join("&"))
        }
        None => tail.to_string(),
    };
    let scheme = &url[..url.len() - rest.len()];
    format!("{scheme}{login}{tail}")
}

/// Upper bound of every duration setting: far beyond any sensible value, and far
/// below what `Instant` arithmetic can hold.
const MAX_SETTING_DURATION: Duration = Duration::from_secs(3600);

/// Validated settings of a [`Redlock`] client.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Settings {
    /// The nodes, in the order given.
    pub nodes: Vec<Endpoint>,
    /// Longest a round may wait for replies; also bounds how long any one node can delay
    /// a call.
    pub node_timeout: Duration,
    /// Longest a connection attempt may take before the node is marked down.
    pub connect_timeout: Duration,
    /// Extra attempts `lock` makes after the first fails.
    pub retry_count: u32,
    /// Mean delay between attempts.
    pub retry_delay: Duration,
    /// Each delay is drawn uniformly from `retry_delay ± retry_jitter`.
    pub retry_jitter: Duration,
    /// Clock drift allowance as a fraction of the ttl (plus 2 ms).
    pub drift_factor: f64,
    /// Longest wait before reconnecting to a failed node (the backoff doubles up to this).
    pub max_backoff: Duration,
    /// Bounds on what a server may send.
    pub limits: Limits,
    /// How long a node must have been up before its yes to an acquire counts; zero: off.
    pub restart_guard: Duration,
    /// Every lock carries a fence ([`Lock::fence`](crate::Lock::fence)).
    pub fencing: bool,
    /// The longest a [`Lease`](crate::Lease) is kept alive; `None`: no limit.
    pub max_hold: Option<Duration>,
    /// See [`Builder::observer`].
    pub(crate) observer: Option<crate::observer::Attached>,
    /// The TLS client configuration of the `rediss://` nodes (none without them).
    #[cfg(feature = "tls")]
    pub(crate) tls: Option<crate::tls::TlsConfig>,
}

/// Builds a [`Redlock`]: set the nodes, optionally tune, then [`Builder::build`].
///
/// | setting | default | allowed |
/// |---|---|---|
/// | `node_timeout` | 50 ms | over zero, at most 1 h |
/// | `connect_timeout` | 1 s | over zero, at most 1 h |
/// | `retry_count` | 3 (so 4 attempts) | any |
/// | `retry_delay` | 200 ms | at most 1 h |
/// | `retry_jitter` | 100 ms | at most 1 h |
/// | `drift_factor` | 0.01 | `[0, 1)` |
/// | `max_backoff` | 1 s | over zero, at most 1 h |
/// | `restart_guard` | off (zero) | at most [`MAX_TTL`](crate::MAX_TTL) (24 h) |
/// | `fencing` | off | |
/// | `max_hold` | none (a lease is kept alive until released or lost) | over zero |
///
/// A value out of range is an [`Error::Config`] from [`Builder::build`] (or
/// [`Builder::settings`]) naming the setting: the setters themselves never fail. A lock's
/// ttl is an argument of each call, from 1 ms to [`MAX_TTL`](crate::MAX_TTL).
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use quorumlock::Redlock;
///
/// let err = Redlock::builder()
///     .nodes(["redis://127.0.0.1:7001", "redis://127.0.0.1:7001"])
///     .build()
///     .unwrap_err();
/// assert!(err.to_string().contains("duplicate"));
///
/// let err = Redlock::builder()
///     .nodes(["redis://127.0.0.1:7001"])
///     .drift_factor(1.5)
///     .build()
///     .unwrap_err();
/// assert!(err.to_string().contains("drift_factor"));
/// ```
#[derive(Clone)]
pub struct Builder {
    nodes: Vec<String>,
    node_timeout: Duration,
    connect_timeout: Duration,
    retry_count: u32,
    retry_delay: Duration,
    retry_jitter: Duration,
    drift_factor: f64,
    max_backoff: Duration,
    limits: Limits,
    restart_guard: Duration,
    fencing: bool,
    max_hold: Option<Duration>,
    observer: Option<crate::observer::Attached>,
    #[cfg(feature = "tls")]
    tls: crate::tls::TlsOptions,
}

impl std::fmt::Debug for Builder {
    /// Node URLs are shown with their passwords replaced by `***`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let nodes: Vec<String> = self.nodes.iter().map(|u| mask(u)).collect();
        let mut f = f.debug_struct("Builder");
        f.field("nodes", &nodes)
            .field("node_timeout", &self.node_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("retry_count", &self.retry_count)
            .field("retry_delay", &self.retry_delay)
            .field("retry_jitter", &self.retry_jitter)
            .field("drift_factor", &self.drift_factor)
            .field("max_backoff", &self.max_backoff)
            .field("limits", &self.limits)
            .field("restart_guard", &self.restart_guard)
            .field("fencing", &self.fencing)
            .field("max_hold", &self.max_hold)
            .field("observer", &self.observer);
        #[cfg(feature = "tls")]
        f.field("tls", &self.tls);
        f.finish()
    }
}

impl Default for Builder {
    fn default() -> Self {
        Builder {
            nodes: Vec::new(),
            node_timeout: Duration::from_millis(50),
            connect_timeout: Duration::from_secs(1),
            retry_count: 3,
            retry_delay: Duration::from_millis(200),
            retry_jitter: Duration::from_millis(100),
            drift_factor: 0.01,
            max_backoff: Duration::from_secs(1),
            limits: Limits::default(),
            restart_guard: Duration::ZERO,
            fencing: false,
            max_hold: None,
            observer: None,
            #[cfg(feature = "tls")]
            tls: Default::default(),
        }
    }
}

impl Builder {
    /// The Redis masters, as URLs (see [`Endpoint`]). Replaces any earlier list.
    pub fn nodes<I, S>(mut self, urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.nodes = urls.into_iter().map(|s| s.as_ref().to_string()).collect();
        self
    }

    /// Adds one node.
    pub fn node(mut self, url: impl AsRef<str>) -> Self {
        self.nodes.push(url.as_ref().to_string());
        self
    }

    /// Longest a round waits for replies (default 50 ms; over zero, at most one hour).
    /// Keep it small against the ttl.
    pub fn node_timeout(mut self, d: Duration) -> Self {
        self.node_timeout = d;
        self
    }

    /// Longest a connection attempt may take, host-name resolution included (default
    /// 1 s; over zero, at most one hour). Attempts never block a call.
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = d;
        self
    }

    /// Extra attempts `lock` makes after a failed one (default 3).
    pub fn retry_count(mut self, n: u32) -> Self {
        self.retry_count = n;
        self
    }

    /// Mean delay between attempts (default 200 ms; at most one hour).
    pub fn retry_delay(mut self, d: Duration) -> Self {
        self.retry_delay = d;
        self
    }

    /// Random spread around `retry_delay` (default 100 ms; at most one hour); delays
    /// below zero are clamped to zero.
    pub fn retry_jitter(mut self, d: Duration) -> Self {
        self.retry_jitter = d;
        self
    }

    /// Clock drift allowance as a fraction of the ttl, in `[0, 1)` (default 0.01).
    pub fn drift_factor(mut self, f: f64) -> Self {
        self.drift_factor = f;
        self
    }

    /// Cap on the reconnect backoff of a failed node (default 1 s; over zero, at most one
    /// hour).
    pub fn max_backoff(mut self, d: Duration) -> Self {
        self.max_backoff = d;
        self
    }

    /// The restart guard (default off): a node's yes to an acquire counts only once it has
    /// been up for `d`. **Set it to the longest ttl in use plus one second.**
    ///
    /// A Redis node that restarts without persistence comes back empty, and can then
    /// grant a second client a key that the first still holds on a bare majority: the
    /// Redlock spec's answer is to keep a crashed node down for the longest ttl. The
    /// guard enforces that from the client: every connection reads the node's
    /// `INFO server`, and the node's start is taken to be the moment the reply was read
    /// minus its `uptime_in_seconds`. Redis computes that uptime as the difference of two
    /// whole-second wall-clock readings, so it can exceed the real uptime by up to a
    /// second: hence the extra second.
    ///
    /// A server can also be new without a short uptime: a replica promoted behind the
    /// same address (Sentinel, a managed "primary endpoint") has been up long but lacks
    /// the last writes. So with the guard on each connection also writes a marker where
    /// the node has none (`SET quorumlock:marker <random> NX`, no expiry) and reads it
    /// back. The server at an endpoint counts as new from the moment this client finds
    /// its marker missing (a fresh node, or one that lost its data: the first use of a
    /// fresh deployment waits out the guard once), its marker other than the one it saw
    /// there before, or its `run_id` other than the one it saw there before (a
    /// failover). A server with no `run_id` (Dragonfly, Kvrocks) is known by its marker
    /// and uptime; two endpoints whose server has no `run_id` are one server when their
    /// markers are equal. What this cannot see: a client that never saw the old server
    /// trusts a promoted replica that carries the old marker (replicated) and a long
    /// uptime; keep the guard's clients long-lived, or run nodes without replicas.
    ///
    /// Until the server has been up and known for `d`, its yes reads as
    /// [`NodeError::YoungerThanGuard`] in reports, its no still counts, and it is still
    /// sent every command (so the key it may set is cleaned up as usual). A node that
    /// nothing identifies (an ACL without `INFO` and without the marker's key) never
    /// counts a yes: [`NodeError::Unidentified`]; an ACL user needs `INFO`, or `SET`
    /// and `GET` on `quorumlock:marker`. With the guard off no marker is written or
    /// read. At most [`MAX_TTL`](crate::MAX_TTL).
    ///
    /// # Example
    ///
    /// ```
    /// use std::time::Duration;
    /// use quorumlock::Redlock;
    ///
    /// let rl = Redlock::builder()
    ///     .nodes(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
    ///     .restart_guard(Duration::from_secs(30))
    ///     .build()?;
    /// # Ok::<(), quorumlock::Error>(())
    /// ```
    ///
    /// [`NodeError::YoungerThanGuard`]: crate::NodeError::YoungerThanGuard
    /// [`NodeError::Unidentified`]: crate::NodeError::Unidentified
    pub fn restart_guard(mut self, d: Duration) -> Self {
        self.restart_guard = d;
        self
    }

    /// Fencing tokens (default off): every lock carries a fence
    /// ([`Lock::fence`](crate::Lock::fence)), a number strictly larger than the fence of
    /// every lock on the same resource granted before it, at the cost of a second round
    /// trip per acquire.
    ///
    /// The acquire also reads each node's counter for the resource
    /// (`quorumlock:fence:{<resource>}`, a permanent key); the fence is the largest counter
    /// among the nodes whose yes won the lock, plus one, and it is written back (raised
    /// where lower) to every node whose connection is up (queued behind what a lagging
    /// one owes) before the lock is returned, once a majority has confirmed it; a fenced lock's unlock
    /// raises it again where it deletes the key. Any two majorities share a node, so the
    /// next lock reads it. This needs the counters to survive: a node that restarts empty
    /// loses them (the restart guard protects exclusivity, which expires anyway, but not
    /// counters, which are permanent), so strict order across restarts needs persistence
    /// (AOF) on the nodes, or the write-back to have reached more nodes than restart. It
    /// also needs a ttl of at least 4 × `node_timeout`, so that no acquire round can
    /// span another lock's write-back; shorter ttls are refused. What the fence does
    /// not do: stop a late write by itself. The storage that the lock protects must keep
    /// the largest fence it has accepted, atomically with each operation, and refuse an
    /// operation that carries a smaller one: a write, and a read that a write will
    /// depend on (read-modify-write), or a stale holder's write could land between a
    /// newer holder's read and write.
    ///
    /// # Example
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use quorumlock::Redlock;
    ///
    /// let mut rl = Redlock::builder()
    ///     .nodes(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
    ///     .fencing(true)
    ///     .build()?;
    /// let lock = rl.lock("report:2026-11", Duration::from_secs(10))?;
    /// let fence = lock.fence().expect("fencing is on");
    /// # let _ = fence;
    /// # Ok::<(), quorumlock::Error>(())
    /// ```
    pub fn fencing(mut self, on: bool) -> Self {
        self.fencing = on;
        self
    }

    /// The longest a [`Lease`](crate::Lease) of the shared client is kept alive (default:
    /// no limit). Past it the lease is no longer extended: it is released and reported
    /// lost, so that a worker that hangs while holding a lease cannot hold the resource
    /// forever. A job that may legitimately run long should set it to the longest run it
    /// can have; one that must never lose its lease to this rule leaves it unset and
    /// watches [`Lease::lost`](crate::Lease::lost) instead.
    ///
    /// # Example
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use quorumlock::Redlock;
    ///
    /// let shared = Redlock::builder()
    ///     .nodes(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
    ///     .max_hold(Duration::from_secs(3600))
    ///     .build_shared()?;
    /// # drop(shared);
    /// # Ok::<(), quorumlock::Error>(())
    /// ```
    pub fn max_hold(mut self, d: Duration) -> Self {
        self.max_hold = Some(d);
        self
    }

    /// Sets an [`Observer`](crate::Observer), which the client calls with every round's
    /// outcome, node by node, and with node changes (connected, down, lagging): the
    /// place to count, time or log what the client does. Unset (the default), the client
    /// does no work for one. Pass an `Arc` to keep a handle to it. See
    /// [`observer`](crate::observer) for what it is told, on which thread, and what it
    /// must not do.
    ///
    /// # Example
    ///
    /// ```no_run
    /// use quorumlock::{Observer, Redlock, RoundEvent};
    /// use std::sync::Arc;
    /// use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    ///
    /// #[derive(Default)]
    /// struct Rounds(AtomicU64);
    ///
    /// impl Observer for Rounds {
    ///     fn round(&self, _: &RoundEvent<'_>) {
    ///         self.0.fetch_add(1, Relaxed);
    ///     }
    /// }
    ///
    /// let rounds = Arc::new(Rounds::default());
    /// let mut rl = Redlock::builder()
    ///     .nodes(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
    ///     .observer(Arc::clone(&rounds))
    ///     .build()?;
    /// # Ok::<(), quorumlock::Error>(())
    /// ```
    pub fn observer(mut self, observer: impl crate::Observer) -> Self {
        self.observer = Some(crate::observer::Attached::new(observer));
        self
    }

    /// Bounds on server replies (defaults in [`Limits`]).
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// A PEM file of CA certificates that `rediss://` nodes' certificates must chain to:
    /// the only trust roots when set (as `redis-cli --cacert`: a private CA, and no
    /// public CA besides it can vouch for a node). Without it the platform's roots are
    /// trusted (the bundle named by `SSL_CERT_FILE`, else the first of
    /// `/etc/ssl/certs/ca-certificates.crt`, `/etc/pki/tls/certs/ca-bundle.crt`,
    /// `/etc/ssl/ca-bundle.pem`, `/etc/ssl/cert.pem` that exists); with neither,
    /// building fails with a [`ConfigError`] that says so. The file is read when the
    /// settings are checked ([`Builder::build`]): a missing or malformed one is a
    /// [`ConfigError`] naming `tls_ca_file`.
    ///
    /// Available with the `tls` feature only.
    ///
    /// # Example
    ///
    /// ```
    /// use quorumlock::Redlock;
    ///
    /// let err = Redlock::builder()
    ///     .nodes(["rediss://localhost:6380"])
    ///     .tls_ca_file("/no/such/ca.pem")
    ///     .build()
    ///     .unwrap_err();
    /// assert!(err.to_string().contains("tls_ca_file"));
    /// ```
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls_ca_file(mut self, path: impl AsRef<std::path::Path>) -> Self {
        self.tls.ca_file = Some(path.as_ref().to_path_buf());
        self
    }

    /// A client certificate (PEM, the leaf first, then any intermediates) and its
    /// private key (PEM: PKCS#8, PKCS#1 or SEC1) for servers that require one
    /// (`tls-auth-clients yes`): mutual TLS. Read when the settings are checked; a
    /// problem is a [`ConfigError`] naming `tls_client_cert`.
    ///
    /// Available with the `tls` feature only.
    ///
    /// # Example
    ///
    /// ```
    /// use quorumlock::Redlock;
    ///
    /// let err = Redlock::builder()
    ///     .nodes(["rediss://localhost:6380"])
    ///     .tls_client_cert("/no/such/client.crt", "/no/such/client.key")
    ///     .build()
    ///     .unwrap_err();
    /// assert!(err.to_string().contains("tls_client_cert"));
    /// ```
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls_client_cert(
        mut self,
        cert: impl AsRef<std::path::Path>,
        key: impl AsRef<std::path::Path>,
    ) -> Self {
        self.tls.client_cert = Some((cert.as_ref().to_path_buf(), key.as_ref().to_path_buf()));
        self
    }

    /// **Never in production.** Accepts any certificate from `rediss://` nodes: no
    /// chain to a trusted root, no host name check, expired or self-signed alike. The
    /// traffic is still encrypted, but anyone who can intercept the connection can pose
    /// as the node, read the passwords and tokens, and grant or steal locks. For test
    /// setups with throwaway certificates only; prefer [`Builder::tls_ca_file`] with the
    /// test CA.
    ///
    /// Available with the `tls` feature only.
    ///
    /// # Example
    ///
    /// ```no_run
    /// use quorumlock::Redlock;
    ///
    /// // A test rig whose nodes have self-signed certificates.
    /// let rl = Redlock::builder()
    ///     .nodes(["rediss://127.0.0.1:6380"])
    ///     .dangerous_skip_tls_verification()
    ///     .build()?;
    /// # Ok::<(), quorumlock::Error>(())
    /// ```
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn dangerous_skip_tls_verification(mut self) -> Self {
        self.tls.skip_verification = true;
        self
    }

    /// Checks every setting, then opens connections without waiting for them.
    ///
    /// Fails on invalid settings (an [`Error::Config`] naming the setting and value) or
    /// when the operating system refuses the random source for lock tokens or the event
    /// queue ([`Error::Os`]); never because a node is down or its host name does not
    /// resolve (yet): host names are resolved each time a connection is opened, and
    /// unreachable nodes are retried as calls go on.
    pub fn build(self) -> Result<Redlock, Error> {
        Redlock::from_settings(self.settings()?)
    }

    /// Checks every setting, then starts the shared client's loop thread, which opens
    /// connections without waiting for them: a [`SharedRedlock`](crate::SharedRedlock),
    /// one event loop and one connection per node for every clone of it.
    ///
    /// Fails on invalid settings ([`Error::Config`]) or when the operating system refuses
    /// the random source, the event queue or the thread ([`Error::Os`]), never because a
    /// node is down or its host name does not resolve (yet).
    pub fn build_shared(self) -> Result<crate::SharedRedlock, Error> {
        crate::SharedRedlock::from_settings(self.settings()?)
    }

    /// Validates without connecting.
    pub fn settings(self) -> Result<Settings, ConfigError> {
        if self.nodes.is_empty() {
            return Err(ConfigError::new(
                "nodes",
                "[]",
                "at least one node is needed",
            ));
        }
        let mut nodes: Vec<Endpoint> = Vec::with_capacity(self.nodes.len());
        for (i, url) in self.nodes.iter().enumerate() {
            let e = Endpoint::parse_as(&format!("nodes[{i}]"), url)?;
            // One server under several db numbers is still one server: it would give
            // one process a majority.
            if let Some(j) = nodes.iter().position(|n| n.server() == e.server()) {
                return Err(ConfigError::new(
                    format!("nodes[{i}]"),
                    mask(url),
                    format!(
                        "duplicate of nodes[{j}]: the same server ({}), whatever the db; each node must be a distinct Redis server",
                        e.server()
                    ),
                ));
            }
            nodes.push(e);
        }
        for (name, d) in [
            ("node_timeout", self.node_timeout),
            ("connect_timeout", self.connect_timeout),
            ("max_backoff", self.max_backoff),
        ] {
            if d.is_zero() {
                return Err(ConfigError::new(
                    name,
                    format!("{d:?}"),
                    "must be greater than zero",
                ));
            }
        }
        for (name, d) in [
            ("node_timeout", self.node_timeout),
            ("connect_timeout", self.connect_timeout),
            ("max_backoff", self.max_backoff),
            ("retry_delay", self.retry_delay),
            ("retry_jitter", self.retry_jitter),
        ] {
            if d > MAX_SETTING_DURATION {
                return Err(ConfigError::new(
                    name,
                    format!("{d:?}"),
                    "must be at most one hour",
                ));
            }
        }
        if self.restart_guard > crate::MAX_TTL {
            return Err(ConfigError::new(
                "restart_guard",
                format!("{:?}", self.restart_guard),
                "must be at most MAX_TTL (24 h)",
            ));
        }
        if let Some(d) = self.max_hold {
            if d.is_zero() {
                return Err(ConfigError::new(
                    "max_hold",
                    format!("{d:?}"),
                    "must be greater than zero (leave it unset for no limit)",
                ));
            }
        }
        if !(0.0..1.0).contains(&self.drift_factor) {
            return Err(ConfigError::new(
                "drift_factor",
                self.drift_factor.to_string(),
                "must be in [0, 1)",
            ));
        }
        let l = self.limits;
        if l.max_bulk_len < 64 || l.max_array_len < 1 || l.max_depth < 1 || l.max_line_len < 64 {
            return Err(ConfigError::new(
                "limits",
                format!("{l:?}"),
                "too small to read ordinary replies (max_bulk_len and max_line_len >= 64, \
                 others >= 1)",
            ));
        }
        #[cfg(feature = "tls")]
        let tls = if nodes.iter().any(Endpoint::is_tls) {
            Some(self.tls.client_config()?)
        } else {
            None
        };
        Ok(Settings {
            #[cfg(feature = "tls")]
            tls,
            nodes,
            node_timeout: self.node_timeout,
            connect_timeout: self.connect_timeout,
            retry_count: self.retry_count,
            retry_delay: self.retry_delay,
            retry_jitter: self.retry_jitter,
            drift_factor: self.drift_factor,
            max_backoff: self.max_backoff,
            limits: self.limits,
            restart_guard: self.restart_guard,
            fencing: self.fencing,
            max_hold: self.max_hold,
            observer: self.observer,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(url: &str) -> String {
        Endpoint::parse(url).unwrap_err().to_string()
    }

    #[test]
    fn redis_urls_parse() {
        let e = Endpoint::parse("redis://127.0.0.1").unwrap();
        assert_eq!(e.addr, Address::Tcp("127.0.0.1:6379".parse().unwrap()));
        let e = Endpoint::parse("redis://:p%40ss@127.0.0.1:7000/3").unwrap();
        assert_eq!(
            (e.user, e.password.as_deref(), e.db),
            (None, Some("p@ss"), 3)
        );
        let e = Endpoint::parse("redis://bob:a@b@127.0.0.1:7000/").unwrap();
        assert_eq!(
            (e.user.as_deref(), e.password.as_deref()),
            (Some("bob"), Some("a@b"))
        );
        let e = Endpoint::parse("redis://[::1]:7000").unwrap();
        assert_eq!(e.addr, Address::Tcp("[::1]:7000".parse().unwrap()));
        assert!(Endpoint::parse("redis://localhost:7000").is_ok());
    }

    #[test]
    fn unix_urls_parse() {
        let e = Endpoint::parse("unix:///tmp/r.sock?db=2&password=x%26y").unwrap();
        assert_eq!(e.addr, Address::Unix("/tmp/r.sock".into()));
        assert_eq!((e.db, e.password.as_deref()), (2, Some("x&y")));
        let e = Endpoint::parse("unix://u:pw@/tmp/r.sock").unwrap();
        assert_eq!(
            (e.user.as_deref(), e.password.as_deref()),
            (Some("u"), Some("pw"))
        );
        assert_eq!(e.to_string(), "unix://u:***@/tmp/r.sock");
    }

    #[test]
    #[cfg(not(feature = "tls"))]
    fn rediss_needs_the_tls_feature() {
        let e = err("rediss://127.0.0.1:6380");
        assert!(e.contains("built without the `tls` feature"), "{e}");
    }

    #[test]
    #[cfg(feature = "tls")]
    fn rediss_urls_parse() {
        let e = Endpoint::parse("rediss://app:s3cret@localhost:6380/2").unwrap();
        assert!(e.is_tls());
        assert_eq!(e.db(), 2);
        assert!(e.to_string().starts_with("rediss://app:***@"), "{e}");
        assert!(!e.to_string().contains("s3cret"));
        let e = Endpoint::parse("rediss://127.0.0.1").unwrap();
        assert_eq!(e.to_string(), "rediss://127.0.0.1:6379");
        assert!(Endpoint::parse("rediss://[::1]:7000").unwrap().is_tls());
        assert!(!Endpoint::parse("redis://127.0.0.1").unwrap().is_tls());
        assert!(err("rediss://127.0.0.1:0").contains("out of range"));
    }

    #[test]
    #[cfg(feature = "tls")]
    fn tls_files_are_checked_when_building() {
        let dir = std::env::temp_dir().join(format!("quorumlock-unit-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let junk = dir.join("junk.pem");
        std::fs::write(&junk, "not a certificate").unwrap();
        let with = |b: Builder| b.node("rediss://127.0.0.1:6380").settings().unwrap_err();
        let e = with(Builder::default().tls_ca_file(&junk));
        assert_eq!(e.setting, "tls_ca_file");
        assert!(e.problem.contains("no PEM certificate"), "{e}");
        let e = with(Builder::default().tls_ca_file(dir.join("missing.pem")));
        assert_eq!(e.setting, "tls_ca_file");
        let e = with(
            Builder::default()
                .tls_client_cert(&junk, &junk)
                .dangerous_skip_tls_verification(),
        );
        assert_eq!(e.setting, "tls_client_cert");
        // Plain nodes never read the TLS files.
        assert!(
            Builder::default()
                .node("redis://127.0.0.1:6380")
                .tls_ca_file(&junk)
                .settings()
                .is_ok()
        );
        let s = Builder::default()
            .node("rediss://127.0.0.1:6380")
            .dangerous_skip_tls_verification()
            .settings()
            .unwrap();
        assert!(s.tls.is_some());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    #[cfg(feature = "tls")]
    fn tls_settings_keep_the_auto_traits_and_a_short_debug() {
        // The feature takes no auto trait away from the settings (features are additive:
        // a crate that catches panics around them must still build when another one
        // turns `tls` on).
        fn unwind_safe<T: std::panic::UnwindSafe + std::panic::RefUnwindSafe + Send + Sync>(_: &T) {
        }
        let dir = std::env::temp_dir().join(format!("quorumlock-unit-dbg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ca = rcgen::generate_simple_self_signed(vec!["ca.test".into()]).unwrap();
        std::fs::write(dir.join("ca.pem"), ca.cert.pem()).unwrap();
        let s = Builder::default()
            .node("rediss://app:s3cret@127.0.0.1:6380")
            .tls_ca_file(dir.join("ca.pem"))
            .settings()
            .unwrap();
        unwind_safe(&s);
        // The configuration is summed up, not dumped (a derived Debug printed every trust
        // root byte by byte: the whole platform bundle).
        let shown = format!("{s:?}");
        assert!(shown.len() < 2000, "{} bytes: {shown}", shown.len());
        assert!(shown.contains("TlsConfig"), "{shown}");
        assert!(!shown.contains("s3cret"), "{shown}");
        let skipped = Builder::default()
            .node("rediss://127.0.0.1:6380")
            .dangerous_skip_tls_verification()
            .settings()
            .unwrap();
        assert!(format!("{skipped:?}").contains("SKIPPED"), "{skipped:?}");
        // A CA file is the only root: the platform's bundle (SSL_CERT_FILE, or
        // /etc/ssl/certs/... here) is not added to it.
        assert!(shown.contains("trust_roots: 1,"), "{shown}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn bad_urls_say_what_is_wrong() {
        assert!(err("http://x").contains("scheme"));
        #[cfg(not(feature = "tls"))]
        assert!(err("rediss://127.0.0.1").contains("TLS"));
        assert!(err("redis://127.0.0.1:0").contains("out of range"));
        assert!(err("redis://127.0.0.1:65536").contains("out of range"));
        assert!(err("redis://127.0.0.1:x").contains("not a number"));
        assert!(err("redis://127.0.0.1:1/x").contains("database"));
        assert!(err("redis://127.0.0.1:1/-1").contains("database"));
        assert!(err("redis://:7000").contains("missing host"));
        assert!(err("redis://user@127.0.0.1").contains("needs a password"));
        assert!(err("unix://relative.sock").contains("absolute"));
        assert!(err("unix:///tmp/s?db=x").contains("database"));
        assert!(err("unix:///tmp/s?color=red").contains("unknown query"));
        assert!(err("redis://[::1").contains("IPv6"));
        assert!(err("redis://bad host:1").contains("not a host name"));
        // A name is kept, not resolved: one that does not resolve (yet) is a node down
        // at connect time, not an invalid URL.
        let e = Endpoint::parse("redis://no-such-host.invalid:1").unwrap();
        assert_eq!(e.addr, Address::Host("no-such-host.invalid".into(), 1));
        assert_eq!(e.to_string(), "redis://no-such-host.invalid:1");
        let e = Endpoint::parse("redis://[::1]:7000").unwrap();
        assert!(
            matches!(e.addr, Address::Tcp(_)),
            "an IP literal is never resolved"
        );
    }

    #[test]
    fn passwords_never_show_in_errors() {
        assert!(!err("redis://u:hunter2@127.0.0.1:0").contains("hunter2"));
        assert!(!err("unix:///tmp/s?password=hunter2&bogus=1").contains("hunter2"));
        assert!(!err("redis://hunter2@127.0.0.1").contains("hunter2"));
        for url in [
            "redis://app:se/cr?et#x@127.0.0.1:0",
            "redis://app:s@e/cret@127.0.0.1:70000/1",
            "redis://:se/cret@no such host.invalid:1",
            "unix://u:se/cr@et@relative.sock",
            "unix:///tmp/s?db=x&pass=se/cret&password=se/cret",
            "app:se/cret@127.0.0.1:7001",
        ] {
            let shown = err(url);
            assert!(
                !shown.contains("se/cr") && !shown.contains("cret"),
                "{shown}"
            );
            let debug = format!("{:?}", Builder::default().node(url));
            assert!(!debug.contains("cret"), "{debug}");
        }
        // A password with '/' parses as a password, not as the start of a db.
        let e = Endpoint::parse("redis://app:se/cret@127.0.0.1:7001/2").unwrap();
        assert_eq!((e.password.as_deref(), e.db), (Some("se/cret"), 2));
        let e = Endpoint::parse("unix://app:se/cr@et@/tmp/r.sock").unwrap();
        assert_eq!(e.password.as_deref(), Some("se/cr@et"));
    }

    #[test]
    fn passwords_never_show_in_debug_output() {
        let builder = Builder::default()
            .nodes([
                "redis://app:hunter2@127.0.0.1:7001",
                "redis://:hunter3@127.0.0.1:7002/1",
                "unix:///tmp/q.sock?password=hunter4",
                "unix://u:hunter5@/tmp/r.sock",
            ])
            .node("redis://hunter6@127.0.0.1:7003");
        let shown = format!("{builder:?} {builder:#?}");
        let settings = builder
            .clone()
            .nodes(&builder.nodes[..4])
            .settings()
            .unwrap();
        let shown = format!("{shown} {settings:?} {settings:#?} {:?}", settings.nodes[0]);
        for secret in ["hunter2", "hunter3", "hunter4", "hunter5", "hunter6"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        assert!(shown.contains("app:***@127.0.0.1:7001"), "{shown}");
    }

    #[test]
    fn one_server_cannot_pose_as_several_nodes() {
        let dup = |a: &str, b: &str| {
            Builder::default()
                .nodes(["redis://127.0.0.1:7009", a, b])
                .settings()
                .map_err(|e| e.to_string())
        };
        // Another db of the same server, written another way, is the same server.
        for other in [
            "redis://127.0.0.1:7001/1",
            "redis://127.0.0.1:7001/4",
            "redis://u:pw@127.0.0.1:7001/3",
        ] {
            let e = dup("redis://127.0.0.1:7001", other).unwrap_err();
            assert!(
                e.contains("duplicate of nodes[1]") && e.contains("whatever the db"),
                "{e}"
            );
        }
        let e = dup("unix:///tmp/ql.sock", "unix:///tmp/./ql.sock?db=3").unwrap_err();
        assert!(e.contains("duplicate of nodes[1]"), "{e}");
        let e = dup("unix:///tmp/ql.sock", "unix:///tmp//ql.sock").unwrap_err();
        assert!(e.contains("duplicate of nodes[1]"), "{e}");
        assert!(dup("redis://127.0.0.1:7001", "redis://127.0.0.1:7002").is_ok());
        // A name is compared as written (case aside): it is not resolved at build time,
        // so an alias of another node is caught once connected, by its run_id.
        let e = dup("redis://Node-A:7001", "redis://node-a:7001/2").unwrap_err();
        assert!(e.contains("duplicate of nodes[1]"), "{e}");
        assert!(dup("redis://127.0.0.1:7001", "redis://localhost:7001").is_ok());
    }

    #[test]
    fn settings_are_checked_before_connecting() {
        let base =
            || Builder::default().nodes(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002"]);
        assert!(base().settings().is_ok());
        let e = Builder::default().settings().unwrap_err();
        assert_eq!(e.setting, "nodes");
        let e = base()
            .node("redis://127.0.0.1:7001")
            .settings()
            .unwrap_err();
        assert!(e.problem.contains("duplicate of nodes[0]"), "{e}");
        let refused = |b: Builder| b.settings().unwrap_err().setting;
        for (builder, setting) in [
            (base().node_timeout(Duration::ZERO), "node_timeout"),
            (base().connect_timeout(Duration::ZERO), "connect_timeout"),
            (base().drift_factor(1.0), "drift_factor"),
            (base().drift_factor(-0.1), "drift_factor"),
            (base().drift_factor(f64::NAN), "drift_factor"),
            (base().node_timeout(Duration::MAX), "node_timeout"),
            (base().retry_delay(Duration::MAX), "retry_delay"),
        ] {
            assert_eq!(refused(builder), setting);
        }
        // A jitter wider than the delay is clamped at zero, not refused.
        assert!(
            base()
                .retry_jitter(Duration::from_secs(1))
                .settings()
                .is_ok()
        );
        let e = base()
            .node("redis://127.0.0.1:99999")
            .settings()
            .unwrap_err();
        assert_eq!(e.setting, "nodes[2]");
    }
}
