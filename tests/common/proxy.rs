//! A thread-based, fault-injecting TCP proxy on 127.0.0.1.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// Polling granularity of the acceptor (stop flag).
const TICK: Duration = Duration::from_millis(5);
/// Longest a forwarding thread blocks in one read before re-checking the
/// mode / stop flag (mode changes that need to be immediate close sockets).
const PUMP_TICK: Duration = Duration::from_millis(20);
const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// Behaviour of the proxy; changes apply immediately to existing and new
/// connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Forward everything.
    Pass,
    /// Hold every chunk, in either direction, this long before forwarding.
    Delay(Duration),
    /// Accept and read everything, forward nothing, answer nothing (data
    /// read in this mode is discarded).
    Blackhole,
    /// Close every current connection at once; close each new connection
    /// right after accept.
    Reset,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

struct Conn {
    client: TcpStream,
    upstream: Mutex<Option<TcpStream>>,
    closed: AtomicBool,
    done: AtomicUsize,
}

impl Conn {
    fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let _ = self.client.shutdown(Shutdown::Both);
        if let Some(u) = lock(&self.upstream).as_ref() {
            let _ = u.shutdown(Shutdown::Both);
        }
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Called when one pump direction ends; the second one closes all.
    fn direction_done(&self) {
        if self.done.fetch_add(1, Ordering::SeqCst) >= 1 {
            self.close();
        }
    }
}

struct Shared {
    /// Where new connections go ([`Proxy::cut_over`] moves it).
    target: Mutex<SocketAddr>,
    /// Replies pass with every `run_id:` renamed (`run_xx:`, same length): a server
    /// without one, as Dragonfly and Kvrocks are.
    hide_run_id: AtomicBool,
    mode: Mutex<Mode>,
    stop: AtomicBool,
    accepted: AtomicUsize,
    conns: Mutex<Vec<Arc<Conn>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Shared {
    fn mode(&self) -> Mode {
        *lock(&self.mode)
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    fn spawn(self: &Arc<Self>, name: &str, f: impl FnOnce() + Send + 'static) {
        let h = thread::Builder::new()
            .name(name.into())
            .spawn(f)
            .expect("spawn proxy thread");
        let mut threads = lock(&self.threads);
        threads.retain(|t| !t.is_finished());
        threads.push(h);
    }
}

/// A TCP proxy `127.0.0.1:<random>` → `target`.
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("addr", &self.addr)
            .field("target", &*lock(&self.shared.target))
            .field("mode", &self.shared.mode())
            .finish()
    }
}

impl Proxy {
    /// Start a proxy in [`Mode::Pass`].
    pub fn start(target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("proxy bind");
        listener.set_nonblocking(true).expect("proxy nonblocking");
        let addr = listener.local_addr().expect("proxy local_addr");
        let shared = Arc::new(Shared {
            target: Mutex::new(target),
            hide_run_id: AtomicBool::new(false),
            mode: Mutex::new(Mode::Pass),
            stop: AtomicBool::new(false),
            accepted: AtomicUsize::new(0),
            conns: Mutex::new(Vec::new()),
            threads: Mutex::new(Vec::new()),
        });
        let sh = shared.clone();
        let acceptor = thread::Builder::new()
            .name("proxy-accept".into())
            .spawn(move || accept_loop(listener, sh))
            .expect("spawn proxy acceptor");
        Proxy {
            addr,
            shared,
            acceptor: Some(acceptor),
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn target(&self) -> SocketAddr {
        *lock(&self.shared.target)
    }

    /// A failover behind this address: new connections go to `target`, and every
    /// current one is closed (the old server is gone for its clients).
    pub fn cut_over(&self, target: SocketAddr) {
        *lock(&self.shared.target) = target;
        for c in lock(&self.shared.conns).iter() {
            c.close();
        }
    }

    /// From now on, replies reach clients with `run_id:` renamed, so `INFO server` has
    /// none (a Dragonfly-like server).
    pub fn hide_run_id(&self) {
        self.shared.hide_run_id.store(true, Ordering::SeqCst);
    }

    /// `redis://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    pub fn mode(&self) -> Mode {
        self.shared.mode()
    }

    pub fn set_mode(&self, mode: Mode) {
        *lock(&self.shared.mode) = mode;
        if mode == Mode::Reset {
            for c in lock(&self.shared.conns).iter() {
                c.close();
            }
        }
    }

    /// Connections accepted so far (including ones closed by `Reset`).
    pub fn connections(&self) -> usize {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// Connections currently open through the proxy.
    pub fn open_connections(&self) -> usize {
        lock(&self.shared.conns)
            .iter()
            .filter(|c| !c.is_closed())
            .count()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
        // No new connections from here on: close everything and join all
        // workers (closing unblocks any read/write they are stuck in).
        loop {
            for c in lock(&self.shared.conns).iter() {
                c.close();
            }
            let threads: Vec<JoinHandle<()>> = std::mem::take(&mut *lock(&self.shared.threads));
            if threads.is_empty() {
                break;
            }
            for t in threads {
                let _ = t.join();
            }
        }
        lock(&self.shared.conns).clear();
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    while !shared.stopped() {
        match listener.accept() {
            Ok((client, _)) => {
                shared.accepted.fetch_add(1, Ordering::SeqCst);
                if shared.mode() == Mode::Reset {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let _ = client.set_nonblocking(false);
                let _ = client.set_nodelay(true);
                let conn = Arc::new(Conn {
                    client,
                    upstream: Mutex::new(None),
                    closed: AtomicBool::new(false),
                    done: AtomicUsize::new(0),
                });
                {
                    let mut conns = lock(&shared.conns);
                    conns.retain(|c| !c.is_closed());
                    conns.push(conn.clone());
                }
                let sh = shared.clone();
                shared.spawn("proxy-conn", move || handle_conn(conn, sh));
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => thread::sleep(TICK),
            Err(_) => thread::sleep(TICK),
        }
    }
}

fn handle_conn(conn: Arc<Conn>, shared: Arc<Shared>) {
    let target = *lock(&shared.target);
    let upstream = match TcpStream::connect_timeout(&target, UPSTREAM_CONNECT_TIMEOUT) {
        Ok(u) => u,
        Err(_) => {
            // Target unreachable: a blackhole still swallows the client's
            // bytes; otherwise just close.
            if let Ok(mut c) = conn.client.try_clone() {
                let mut buf = [0u8; 4096];
                let _ = c.set_read_timeout(Some(TICK));
                while !shared.stopped() && !conn.is_closed() && shared.mode() == Mode::Blackhole {
                    match c.read(&mut buf) {
                        Ok(0) => break,
                        Ok(_) => {}
                        Err(e) if is_timeout(&e) => {}
                        Err(_) => break,
                    }
                }
            }
            conn.close();
            return;
        }
    };
    let _ = upstream.set_nodelay(true);
    let clones = (|| -> io::Result<_> {
        Ok((
            conn.client.try_clone()?,
            conn.client.try_clone()?,
            upstream.try_clone()?,
            upstream.try_clone()?,
        ))
    })();
    *lock(&conn.upstream) = Some(upstream);
    let Ok((client_r, client_w, up_r, up_w)) = clones else {
        conn.close();
        return;
    };
    if shared.stopped() || conn.is_closed() {
        conn.close();
        return;
    }
    let (c2, s2) = (conn.clone(), shared.clone());
    shared.spawn("proxy-down", move || pump(up_r, client_w, &c2, &s2, true));
    pump(client_r, up_w, &conn, &shared, false);
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}

/// `run_id:` renamed in `data` (after `carry`, what an earlier chunk held back); returns
/// what may go on now, and keeps in `carry` a tail that may be the start of one.
fn rename_run_id(carry: &mut Vec<u8>, data: &[u8]) -> Vec<u8> {
    const FROM: &[u8] = b"run_id:";
    let mut out = std::mem::take(carry);
    out.extend_from_slice(data);
    let mut i = 0;
    while let Some(at) = out[i..].windows(FROM.len()).position(|w| w == FROM) {
        out[i + at..i + at + FROM.len()].copy_from_slice(b"run_xx:");
        i += at + FROM.len();
    }
    // A tail that could begin `run_id:` waits for the next chunk (replies end in
    // `\r\n`, which never does, so nothing waits for ever).
    let keep = (1..FROM.len())
        .rev()
        .find(|&k| out.len() >= k && out.ends_with(&FROM[..k]))
        .unwrap_or(0);
    *carry = out.split_off(out.len() - keep);
    out
}

/// Copy `src` → `dst` applying the current mode, until EOF/error/stop; `down`: the
/// server's replies to the client.
fn pump(mut src: TcpStream, mut dst: TcpStream, conn: &Conn, shared: &Shared, down: bool) {
    let _ = dst.set_write_timeout(Some(Duration::from_secs(2)));
    let mut buf = vec![0u8; 16 * 1024];
    let mut carry = Vec::new();
    let mut queue: VecDeque<(Instant, Vec<u8>)> = VecDeque::new();
    let mut eof = false;
    loop {
        if shared.stopped() || conn.is_closed() {
            break;
        }
        let mode = shared.mode();
        let now = Instant::now();
        let delay = match mode {
            Mode::Reset => {
                conn.close();
                break;
            }
            Mode::Blackhole => {
                queue.clear();
                None
            }
            Mode::Pass => Some(Duration::ZERO),
            Mode::Delay(d) => Some(d),
        };
        if let Some(d) = delay {
            let mut failed = false;
            while let Some((t, _)) = queue.front() {
                if *t + d > now {
                    break;
                }
                let (_, data) = queue.pop_front().expect("front");
                if dst.write_all(&data).is_err() {
                    failed = true;
                    break;
                }
            }
            if failed {
                conn.close();
                break;
            }
        }
        // Time until the next queued chunk is due (bounded by TICK).
        let wait = match (delay, queue.front()) {
            (Some(d), Some((t, _))) => (*t + d)
                .saturating_duration_since(now)
                .clamp(Duration::from_millis(1), PUMP_TICK),
            _ => PUMP_TICK,
        };
        if eof {
            if queue.is_empty() {
                if mode == Mode::Blackhole {
                    conn.close();
                } else {
                    let _ = dst.shutdown(Shutdown::Write);
                }
                break;
            }
            thread::sleep(wait);
            continue;
        }
        let _ = src.set_read_timeout(Some(wait));
        match src.read(&mut buf) {
            Ok(0) => eof = true,
            Ok(n) => {
                if shared.mode() != Mode::Blackhole {
                    let data = if down && shared.hide_run_id.load(Ordering::SeqCst) {
                        rename_run_id(&mut carry, &buf[..n])
                    } else {
                        buf[..n].to_vec()
                    };
                    queue.push_back((Instant::now(), data));
                }
            }
            Err(e) if is_timeout(&e) => {}
            Err(_) => {
                conn.close();
                break;
            }
        }
    }
    conn.direction_done();
}
