//! Impostors: loopback servers that are not Redis (silent hosts, an HTTP or SSH server)
//! or that answer a lock command in a hostile way, for the error-message and CPU tests.
//!
//! Each impostor runs one thread per accepted connection and is stopped (listener
//! closed, threads joined) when dropped.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::{self, JoinHandle};
use std::time::Duration;

/// What an impostor does with each connection.
#[derive(Clone, Copy, Debug)]
pub enum Act {
    /// Accepts and never answers.
    Silent,
    /// Answers whatever arrives with an HTTP error, then closes.
    Http,
    /// Speaks first, as an SSH server does, then says nothing more.
    SshBanner,
    /// Answers `INFO` and `PING` as Redis does, then answers the first lock command with an array of
    /// `elements` integers, `chunk` bytes per write with a short pause between writes, so
    /// that the client reads it in thousands of pieces.
    TrickleArray { elements: usize, chunk: usize },
}

pub struct Impostor {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    accepted: Arc<AtomicUsize>,
    acceptor: Option<JoinHandle<()>>,
}

impl Impostor {
    pub fn start(act: Act) -> Impostor {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind impostor");
        listener
            .set_nonblocking(true)
            .expect("nonblocking listener");
        let addr = listener.local_addr().expect("impostor address");
        let stop = Arc::new(AtomicBool::new(false));
        let accepted = Arc::new(AtomicUsize::new(0));
        let acceptor = {
            let (stop, accepted) = (stop.clone(), accepted.clone());
            thread::spawn(move || {
                let mut workers = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            accepted.fetch_add(1, Ordering::Relaxed);
                            let stop = stop.clone();
                            workers.push(thread::spawn(move || serve(stream, act, &stop)));
                        }
                        Err(_) => thread::sleep(Duration::from_millis(2)),
                    }
                }
                for w in workers {
                    let _ = w.join();
                }
            })
        };
        Impostor {
            addr,
            stop,
            accepted,
            acceptor: Some(acceptor),
        }
    }

    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::Relaxed)
    }
}

impl Drop for Impostor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
    }
}

/// Reads until `needle` has arrived (or the stop flag, or the peer closing).
fn read_until(
    stream: &mut TcpStream,
    seen: &mut Vec<u8>,
    needle: &[u8],
    stop: &AtomicBool,
) -> bool {
    let mut buf = [0u8; 4096];
    loop {
        if seen.windows(needle.len()).any(|w| w == needle) {
            return true;
        }
        if stop.load(Ordering::Relaxed) {
            return false;
        }
        match stream.read(&mut buf) {
            Ok(0) => return false,
            Ok(n) => seen.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => return false,
        }
    }
}

fn serve(mut stream: TcpStream, act: Act, stop: &AtomicBool) {
    let _ = stream.set_read_timeout(Some(Duration::from_millis(20)));
    let _ = stream.set_nodelay(true);
    let mut seen = Vec::new();
    match act {
        Act::Silent => {
            while !stop.load(Ordering::Relaxed) {
                let mut buf = [0u8; 1024];
                if let Ok(0) = stream.read(&mut buf) {
                    return;
                }
            }
        }
        Act::Http => {
            if read_until(&mut stream, &mut seen, b"\r\n", stop) {
                let _ = stream.write_all(
                    b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                );
            }
        }
        Act::SshBanner => {
            let _ = stream.write_all(b"SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n");
            while !stop.load(Ordering::Relaxed) {
                let mut buf = [0u8; 1024];
                if let Ok(0) = stream.read(&mut buf) {
                    return;
                }
            }
        }
        Act::TrickleArray { elements, chunk } => {
            if !read_until(&mut stream, &mut seen, b"PING\r\n", stop) {
                return;
            }
            // The handshake's INFO server comes right before PING.
            let port = stream.local_addr().map_or(0, |a| u64::from(a.port()));
            let mut handshake = super::fake_info(port);
            handshake.extend_from_slice(b"+PONG\r\n");
            let _ = stream.write_all(&handshake);
            // The lock command may have come in the same read, pipelined behind PING.
            let after_ping = seen
                .windows(6)
                .position(|w| w == b"PING\r\n")
                .map_or(0, |i| i + 6);
            seen.drain(..after_ping);
            if !read_until(&mut stream, &mut seen, b"SET\r\n", stop) {
                return;
            }
            let mut reply = format!("*{elements}\r\n").into_bytes();
            for _ in 0..elements {
                reply.extend_from_slice(b":1\r\n");
            }
            for piece in reply.chunks(chunk) {
                if stop.load(Ordering::Relaxed) || stream.write_all(piece).is_err() {
                    return;
                }
                // Long enough for the client to read each piece on its own.
                thread::sleep(Duration::from_micros(200));
            }
            // Then stay open until the client hangs up or the test ends.
            while !stop.load(Ordering::Relaxed) {
                let mut buf = [0u8; 1024];
                match stream.read(&mut buf) {
                    Ok(0) => return,
                    Err(e)
                        if e.kind() != std::io::ErrorKind::WouldBlock
                            && e.kind() != std::io::ErrorKind::TimedOut =>
                    {
                        return;
                    }
                    _ => {}
                }
            }
        }
    }
}
