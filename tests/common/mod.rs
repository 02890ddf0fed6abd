//! Shared integration-test harness: throwaway `redis-server` processes,
//! a raw RESP2 admin client and a fault-injecting TCP proxy.
//!
//! Every test binary uses a different subset of this module.
#![allow(dead_code, unused_imports)]

pub mod admin;
pub mod checker;
pub mod impostor;
pub mod proxy;
#[cfg(feature = "tls")]
pub mod tls;

pub use admin::{Admin, Auth, Endpoint, Reply, in_debug_sleep};
pub use proxy::{Mode, Proxy};

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom};
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long a freshly spawned server gets to answer `PING`.
pub const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// Fresh ports tried by `Cluster::start*` when the picked port got taken.
const START_PORT_ATTEMPTS: usize = 8;
/// Attempts (100 ms apart) to re-bind the same port on `Node::restart`.
const RESTART_ATTEMPTS: usize = 50;

/// Poll `f` every 5 ms until it returns true (→ `true`) or `timeout`
/// elapses (→ `false`). `f` is always called at least once.
pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(5));
    }
}

/// Wakes the thread that runs [`block_on`].
struct Unpark(std::thread::Thread);

impl std::task::Wake for Unpark {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.unpark();
    }
}

/// Runs `fut` to the end on this thread, with no runtime: a waker that unparks it (the
/// shared client's futures need nothing more).
pub fn block_on<F: std::future::Future>(fut: F) -> F::Output {
    let waker = std::task::Waker::from(std::sync::Arc::new(Unpark(thread::current())));
    let mut cx = std::task::Context::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    loop {
        if let std::task::Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
        thread::park();
    }
}

fn find_executable(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    dirs.push("/usr/bin".into());
    dirs.push("/usr/local/bin".into());
    dirs.push("/bin".into());
    dirs.into_iter().map(|d| d.join(name)).find(|p| {
        fs::metadata(p)
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    })
}

/// The environment variable that names the server binary the tests start instead of
/// Debian's `redis-server` (a path, e.g. `.servers/valkey-9.1/valkey-server`): the
/// compatibility matrix (`scripts/compat.sh`, `docs/COMPATIBILITY.md`).
pub const SERVER_VAR: &str = "QUORUMLOCK_TEST_SERVER";

/// Path of the server binary: `$QUORUMLOCK_TEST_SERVER` when set, else `redis-server`
/// (PATH, then /usr/bin, /usr/local/bin).
pub fn redis_server_path() -> PathBuf {
    static PATH: OnceLock<Option<PathBuf>> = OnceLock::new();
    PATH.get_or_init(|| match std::env::var_os(SERVER_VAR) {
        Some(p) if !p.is_empty() => {
            let p = PathBuf::from(p);
            assert!(
                p.is_file(),
                "{SERVER_VAR}={}: no such file (scripts/ensure-servers.sh installs the \
                 matrix's servers)",
                p.display()
            );
            Some(p)
        }
        _ => find_executable("redis-server"),
    })
    .clone()
    .unwrap_or_else(|| {
        panic!(
            "redis-server not found: run `apt-get install -y redis-server` \
             or scripts/test.sh"
        )
    })
}

/// The server binary's `--version` line, e.g. `Redis server v=7.0.15 sha=...` or
/// `Valkey server v=9.1.2 ...` (read once).
pub fn server_version_line() -> &'static str {
    static LINE: OnceLock<String> = OnceLock::new();
    LINE.get_or_init(|| {
        let out = Command::new(redis_server_path())
            .arg("--version")
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("{} --version: {e}", redis_server_path().display()));
        let text = String::from_utf8_lossy(&out.stdout);
        text.lines().next().unwrap_or("").trim().to_string()
    })
}

/// The server's `(major, minor)` version, from [`server_version_line`].
pub fn server_version() -> (u32, u32) {
    let line = server_version_line();
    let v = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("v="))
        .unwrap_or_else(|| panic!("no version in `{line}`"));
    let mut parts = v.split('.').map(|p| p.parse::<u32>().ok());
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(major), Some(minor)) => (major, minor),
        _ => panic!("no version in `{line}`"),
    }
}

/// The server is Valkey (its `--version` line says so), not Redis.
pub fn server_is_valkey() -> bool {
    server_version_line().starts_with("Valkey")
}

/// Send a signal (by name, e.g. "STOP") to a process this harness started.
fn signal(pid: u32, sig: &str) -> io::Result<()> {
    static KILL: OnceLock<PathBuf> = OnceLock::new();
    let kill = KILL.get_or_init(|| find_executable("kill").unwrap_or_else(|| "/bin/kill".into()));
    let status = Command::new(kill)
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()?;
    if status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "kill -{sig} {pid} failed: {status}"
        )))
    }
}

/// Whether a process with this pid exists (`kill -0 pid`). Test helper.
pub fn pid_alive(pid: u32) -> bool {
    signal(pid, "0").is_ok()
}

/// Linux process state letter from /proc/<pid>/stat ('T' = stopped).
fn proc_state(pid: u32) -> Option<char> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    after.trim_start().chars().next()
}

/// What a fake Redis node answers to the client's `INFO server`: a bulk string with a
/// fixed `run_id` derived from `seed` (distinct fakes, distinct servers) and an uptime
/// of a day, so that no restart guard holds it back.
#[allow(dead_code)]
pub fn fake_info(seed: u64) -> Vec<u8> {
    let text = format!(
        "# Server\r\nredis_version:7.0.0\r\nrun_id:{seed:040x}\r\nuptime_in_seconds:86400\r\n"
    );
    format!("${}\r\n{text}\r\n", text.len()).into_bytes()
}

/// A free loopback TCP port (racy by nature; callers retry on conflict).
pub fn free_port() -> u16 {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind 127.0.0.1:0");
    l.local_addr().expect("local_addr").port()
}

/// Percent-encode everything outside RFC 3986 "unreserved".
fn pct(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicking test must never turn cleanup into a double panic.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn unique_temp_dir() -> PathBuf {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let dir = std::env::temp_dir().join(format!(
        "quorumlock-test-{}-{}-{}",
        std::process::id(),
        n,
        nanos
    ));
    fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    dir
}

fn tail(path: &Path, from: u64, max_lines: usize) -> String {
    let mut s = String::new();
    if let Ok(mut f) = File::open(path) {
        let _ = f.seek(SeekFrom::Start(from));
        let mut buf = Vec::new();
        let _ = f.read_to_end(&mut buf);
        s = String::from_utf8_lossy(&buf).into_owned();
    }
    let lines: Vec<&str> = s.lines().collect();
    let start = lines.len().saturating_sub(max_lines);
    lines[start..].join("\n")
}

fn file_len(path: &Path) -> u64 {
    fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

/// How the nodes of a cluster are configured.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeOptions {
    /// Listen on `<dir>/redis.sock` only (`--port 0`).
    pub unix_socket: bool,
    /// `--requirepass` (password of the `default` user).
    pub password: Option<String>,
    /// `(user, password)`: an extra ACL user with `~* &* +@all`; the
    /// `default` user stays enabled as well.
    pub acl_user: Option<(String, String)>,
    /// Appended verbatim to the redis-server command line.
    pub extra_args: Vec<String>,
}

impl NodeOptions {
    pub fn unix() -> Self {
        NodeOptions {
            unix_socket: true,
            ..Default::default()
        }
    }

    pub fn with_password(password: &str) -> Self {
        NodeOptions {
            password: Some(password.to_string()),
            ..Default::default()
        }
    }

    pub fn with_acl_user(user: &str, password: &str) -> Self {
        NodeOptions {
            acl_user: Some((user.to_string(), password.to_string())),
            ..Default::default()
        }
    }

    /// The credentials an admin connection uses: the ACL user if any,
    /// else the `default` user's password if any.
    pub fn auth(&self) -> Option<Auth> {
        if let Some((u, p)) = &self.acl_user {
            Some(Auth {
                user: Some(u.clone()),
                password: p.clone(),
            })
        } else {
            self.password.as_ref().map(|p| Auth {
                user: None,
                password: p.clone(),
            })
        }
    }
}

enum LaunchError {
    /// The listening port was taken; try again (another port or later).
    PortInUse(String),
}

/// Kills a freshly spawned child unless disarmed (panic-safe launch).
struct ChildGuard(Option<Child>);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

struct NodeState {
    child: Option<Child>,
    pid: u32,
    frozen: bool,
}

/// One `redis-server` process owned by the harness. All methods take
/// `&self`, so nodes can be driven from several threads.
pub struct Node {
    index: usize,
    dir: PathBuf,
    endpoint: Endpoint,
    opts: NodeOptions,
    state: Mutex<NodeState>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("index", &self.index)
            .field("endpoint", &self.endpoint)
            .field("pid", &self.pid())
            .finish()
    }
}

impl Node {
    fn start(index: usize, dir: PathBuf, opts: &NodeOptions) -> Node {
        fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        let mut last = String::new();
        for _ in 0..START_PORT_ATTEMPTS {
            let endpoint = if opts.unix_socket {
                Endpoint::Unix(dir.join("redis.sock"))
            } else {
                Endpoint::Tcp(SocketAddr::from((Ipv4Addr::LOCALHOST, free_port())))
            };
            match launch(&dir, &endpoint, opts) {
                Ok(child) => {
                    return Node {
                        index,
                        dir,
                        endpoint,
                        opts: opts.clone(),
                        state: Mutex::new(NodeState {
                            pid: child.id(),
                            child: Some(child),
                            frozen: false,
                        }),
                    };
                }
                Err(LaunchError::PortInUse(log)) => last = log,
            }
        }
        panic!(
            "redis-server node {index}: could not find a free port after \
             {START_PORT_ATTEMPTS} attempts; last log:\n{last}"
        );
    }

    pub fn index(&self) -> usize {
        self.index
    }

    /// Pid of the current (or last) redis-server process.
    pub fn pid(&self) -> u32 {
        lock(&self.state).pid
    }

    /// TCP port (`None` for a unix-socket node). Stable across restarts.
    pub fn port(&self) -> Option<u16> {
        match &self.endpoint {
            Endpoint::Tcp(a) => Some(a.port()),
            Endpoint::Unix(_) => None,
        }
    }

    /// TCP address (`None` for a unix-socket node), e.g. a proxy target.
    pub fn addr(&self) -> Option<SocketAddr> {
        match &self.endpoint {
            Endpoint::Tcp(a) => Some(*a),
            Endpoint::Unix(_) => None,
        }
    }

    /// Unix socket path (`None` for a TCP node).
    pub fn socket_path(&self) -> Option<&Path> {
        match &self.endpoint {
            Endpoint::Tcp(_) => None,
            Endpoint::Unix(p) => Some(p),
        }
    }

    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    pub fn options(&self) -> &NodeOptions {
        &self.opts
    }

    /// Credentials used by [`Node::admin`] (see [`NodeOptions::auth`]).
    pub fn auth(&self) -> Option<Auth> {
        self.opts.auth()
    }

    /// This node's working directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.join("redis.log")
    }

    /// Last lines of the server log (for assertion messages).
    pub fn log_tail(&self, lines: usize) -> String {
        tail(&self.log_path(), 0, lines)
    }

    /// URL in the library's format (credentials from the ACL user, else the
    /// password).
    pub fn url(&self) -> String {
        let auth = self.opts.auth();
        match &self.endpoint {
            Endpoint::Tcp(a) => match auth {
                None => format!("redis://{a}"),
                Some(Auth {
                    user: None,
                    password,
                }) => format!("redis://:{}@{a}", pct(&password)),
                Some(Auth {
                    user: Some(u),
                    password,
                }) => format!("redis://{}:{}@{a}", pct(&u), pct(&password)),
            },
            Endpoint::Unix(p) => {
                let base = format!("unix://{}", p.display());
                match auth {
                    None => base,
                    Some(Auth {
                        user: None,
                        password,
                    }) => {
                        format!("{base}?password={}", pct(&password))
                    }
                    Some(Auth {
                        user: Some(u),
                        password,
                    }) => format!("{base}?user={}&password={}", pct(&u), pct(&password)),
                }
            }
        }
    }

    /// Whether the process is alive (frozen counts as running).
    pub fn is_running(&self) -> bool {
        let mut st = lock(&self.state);
        match st.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    pub fn is_frozen(&self) -> bool {
        lock(&self.state).frozen
    }

    /// Whether the server is inside a `DEBUG SLEEP` right now (see
    /// [`admin::in_debug_sleep`]): it cannot have answered anything since the
    /// sleep began.
    pub fn in_debug_sleep(&self) -> bool {
        admin::in_debug_sleep(self.pid())
    }

    fn kill_locked(st: &mut NodeState) {
        if let Some(mut c) = st.child.take() {
            if st.frozen {
                let _ = signal(c.id(), "CONT");
            }
            let _ = c.kill(); // SIGKILL
            let _ = c.wait();
        }
        st.frozen = false;
    }

    /// SIGKILL the server and reap it. No-op if it is not running.
    pub fn kill(&self) {
        Self::kill_locked(&mut lock(&self.state));
    }

    /// SIGSTOP: the process stays alive, its sockets keep accepting
    /// connections at the kernel level, but nothing is answered.
    pub fn freeze(&self) {
        let mut st = lock(&self.state);
        let pid = st.pid;
        assert!(
            st.child.is_some(),
            "freeze: node {} is not running",
            self.index
        );
        signal(pid, "STOP").unwrap_or_else(|e| panic!("freeze node {}: {e}", self.index));
        st.frozen = true;
        drop(st);
        // Make sure the stop has taken effect before returning.
        wait_until(Duration::from_secs(1), || {
            proc_state(pid).is_none_or(|s| s == 'T' || s == 't')
        });
    }

    /// SIGCONT after [`Node::freeze`].
    pub fn thaw(&self) {
        let mut st = lock(&self.state);
        let pid = st.pid;
        if st.child.is_none() {
            st.frozen = false;
            return;
        }
        signal(pid, "CONT").unwrap_or_else(|e| panic!("thaw node {}: {e}", self.index));
        st.frozen = false;
        drop(st);
        wait_until(Duration::from_secs(1), || {
            proc_state(pid).is_none_or(|s| s != 'T' && s != 't')
        });
    }

    /// Kill the server if running, then start a fresh process (empty
    /// dataset) on the same port / socket path with the same options.
    pub fn restart(&self) {
        let mut st = lock(&self.state);
        Self::kill_locked(&mut st);
        let mut last = String::new();
        for _ in 0..RESTART_ATTEMPTS {
            match launch(&self.dir, &self.endpoint, &self.opts) {
                Ok(child) => {
                    st.pid = child.id();
                    st.child = Some(child);
                    st.frozen = false;
                    return;
                }
                Err(LaunchError::PortInUse(log)) => {
                    last = log;
                    thread::sleep(Duration::from_millis(100));
                }
            }
        }
        panic!(
            "restart node {} on {}: address still in use after {RESTART_ATTEMPTS} attempts; \
             last log:\n{last}",
            self.index, self.endpoint
        );
    }

    /// A new admin connection, authenticated if the node needs it.
    /// Panics if the node does not accept connections.
    pub fn admin(&self) -> Admin {
        self.try_admin().unwrap_or_else(|e| {
            panic!(
                "admin connection to node {} ({}): {e}",
                self.index, self.endpoint
            )
        })
    }

    /// A new admin connection, authenticated if the node needs it.
    pub fn try_admin(&self) -> io::Result<Admin> {
        Admin::connect(&self.endpoint, self.opts.auth().as_ref())
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Spawn redis-server and wait until it answers PING on `endpoint`.
fn launch(dir: &Path, endpoint: &Endpoint, opts: &NodeOptions) -> Result<Child, LaunchError> {
    let log = dir.join("redis.log");
    let err_log = dir.join("stderr.log");
    let log_start = file_len(&log);
    let err_start = file_len(&err_log);

    let mut cmd = Command::new(redis_server_path());
    match endpoint {
        Endpoint::Tcp(a) => {
            cmd.arg("--port").arg(a.port().to_string());
        }
        Endpoint::Unix(_) => {
            cmd.args(["--port", "0"]);
        }
    }
    cmd.args(["--bind", "127.0.0.1"])
        .args(["--save", ""])
        .args(["--appendonly", "no"])
        .args(["--daemonize", "no"])
        .arg("--dir")
        .arg(dir)
        .arg("--logfile")
        .arg(&log)
        .args(["--protected-mode", "no"]);
    // Redis 7 turned `DEBUG` off by default and added this switch; Redis 6 has `DEBUG` on
    // and refuses the unknown directive. (Valkey counts from 7.2 on.)
    if server_version().0 >= 7 {
        cmd.args(["--enable-debug-command", "yes"]);
    }
    if let Endpoint::Unix(p) = endpoint {
        cmd.arg("--unixsocket")
            .arg(p)
            .args(["--unixsocketperm", "700"]);
    }
    if let Some(pw) = &opts.password {
        cmd.arg("--requirepass").arg(pw);
    }
    if let Some((user, pw)) = &opts.acl_user {
        // `user` directive: each ACL rule is its own argv item.
        cmd.arg("--user")
            .arg(user)
            .arg("on")
            .arg(format!(">{pw}"))
            .args(["~*", "&*", "+@all"]);
    }
    cmd.args(&opts.extra_args);

    // stdout → null; stderr → a file so early config errors (reported
    // before the logfile is opened) are not lost.
    let stderr = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&err_log)
        .map(Stdio::from)
        .unwrap_or_else(|_| Stdio::null());
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr);

    let child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {}: {e}", redis_server_path().display()));
    let mut guard = ChildGuard(Some(child));
    let auth = opts.auth();
    let deadline = Instant::now() + READY_TIMEOUT;
    let describe = || {
        format!(
            "--- {} ---\n{}\n--- stderr ---\n{}",
            log.display(),
            tail(&log, log_start, 30),
            tail(&err_log, err_start, 30)
        )
    };
    loop {
        let child = guard.0.as_mut().expect("child");
        match child.try_wait() {
            Ok(Some(status)) => {
                guard.0 = None; // already reaped
                let text = describe();
                if text.contains("Address already in use") {
                    return Err(LaunchError::PortInUse(text));
                }
                panic!("redis-server on {endpoint} exited during startup ({status}):\n{text}");
            }
            Ok(None) => {}
            Err(e) => panic!("try_wait on redis-server: {e}"),
        }
        let pid = child.id();
        if let Ok(mut a) =
            Admin::connect_timeout(endpoint, auth.as_ref(), Duration::from_millis(500))
        {
            if a.ping() {
                // Make sure it is *our* process answering (the port may have
                // been grabbed by another test's server).
                let their_pid = a
                    .try_cmd(&["INFO", "server"])
                    .ok()
                    .and_then(|r| r.as_string())
                    .and_then(|t| {
                        t.lines().find_map(|l| {
                            l.strip_prefix("process_id:").map(|v| v.trim().to_string())
                        })
                    })
                    .and_then(|v| v.parse::<u32>().ok());
                if their_pid == Some(pid) {
                    return Ok(guard.0.take().expect("child"));
                }
            }
        }
        if Instant::now() >= deadline {
            drop(guard); // kills it
            panic!(
                "redis-server on {endpoint} not ready after {READY_TIMEOUT:?}:\n{}",
                describe()
            );
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// N independent redis-server processes in a private temp directory.
/// Dropping it (also while unwinding from a panic) kills every process it
/// started and removes the directory.
pub struct Cluster {
    dir: PathBuf,
    nodes: Vec<Node>,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("dir", &self.dir)
            .field("nodes", &self.nodes)
            .finish()
    }
}

impl Cluster {
    /// `n` plain TCP nodes on free loopback ports.
    pub fn start(n: usize) -> Cluster {
        Self::start_with(n, &NodeOptions::default())
    }

    pub fn start_with(n: usize, opts: &NodeOptions) -> Cluster {
        let mut cluster = Cluster {
            dir: unique_temp_dir(),
            nodes: Vec::with_capacity(n),
        };
        for i in 0..n {
            // If this panics, `cluster` is dropped and already started
            // nodes are killed.
            let node = Node::start(i, cluster.dir.join(i.to_string()), opts);
            cluster.nodes.push(node);
        }
        cluster
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    pub fn node(&self, i: usize) -> &Node {
        &self.nodes[i]
    }

    pub fn node_mut(&mut self, i: usize) -> &mut Node {
        &mut self.nodes[i]
    }

    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    pub fn url(&self, i: usize) -> String {
        self.nodes[i].url()
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(Node::url).collect()
    }

    pub fn pids(&self) -> Vec<u32> {
        self.nodes.iter().map(Node::pid).collect()
    }

    /// The cluster's private temp directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Admin connections to every node.
    pub fn admins(&self) -> Vec<Admin> {
        self.nodes.iter().map(Node::admin).collect()
    }

    /// `FLUSHALL` on every running, unfrozen node.
    pub fn flushall(&self) {
        for n in &self.nodes {
            if n.is_running() && !n.is_frozen() {
                n.admin().flushall();
            }
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for n in &self.nodes {
            n.kill();
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}
