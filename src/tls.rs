//! TLS for `rediss://` nodes (feature `tls`): the client configuration built from the
//! [`Builder`](crate::Builder)'s TLS settings, and one connection's TLS state driven
//! sans-I/O over the driver's non-blocking socket.
//!
//! # Invariants
//!
//! - rustls never does I/O by itself: [`TlsConn`] moves bytes between it and the socket
//!   with `read_tls` / `process_new_packets` / `write_tls`, and returns as soon as the
//!   socket would block, so one slow or silent node never holds up the event loop.
//! - Edge-triggered readiness: a read that reports less than the caller's buffer has
//!   handed over every byte of plaintext rustls held and drained the socket: read it
//!   until it would block, or until a read came back short (the socket had nothing
//!   more then, as the engine assumes of a plain socket's short read; a later byte
//!   raises a new edge). A handshake step reads and writes until the socket blocks. No
//!   readiness edge is needed for bytes already taken in.
//! - Written plaintext is accepted only while no earlier TLS record waits for the
//!   socket, and at most [`BUFFER_LIMIT`] of it at once: what the socket cannot take
//!   stays in the engine's outbox (bounded there, and known to `writes_pending`), and
//!   the records rustls still holds are flushed on the next readable or writable event
//!   ([`TlsConn::flush`]).
//! - Nothing from the network can panic: every rustls error becomes a
//!   [`NodeError::Tls`] that says what failed.

use crate::error::{ConfigError, NodeError};
use mio::net::TcpStream;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, ClientConnection, DigitallySignedStruct, RootCertStore};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The most TLS records (and plaintext before the handshake) a connection holds unsent.
pub(crate) const BUFFER_LIMIT: usize = 64 * 1024;

/// The most TLS bytes one [`TlsConn::read`] takes from the socket without any plaintext
/// coming of them. A server sends a few session tickets after its handshake, a key
/// update now and then; one that keeps the socket full of records that carry no data
/// (rustls bounds key updates, alerts and empty records, not tickets) would otherwise
/// hold the client's loop inside one read for as long as it likes.
pub(crate) const SILENT_LIMIT: usize = 32 * 1024;

/// Where the platform's CA bundle is looked for when `SSL_CERT_FILE` is not set, in
/// order: Debian/Ubuntu (and Alpine with `ca-certificates`), RHEL/Fedora/CentOS,
/// openSUSE, Alpine/macOS/BSD.
pub(crate) const PLATFORM_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

/// The TLS settings of a [`Builder`](crate::Builder), as given (files are read when the
/// settings are checked).
#[derive(Clone, Debug, Default)]
pub(crate) struct TlsOptions {
    pub ca_file: Option<PathBuf>,
    pub client_cert: Option<(PathBuf, PathBuf)>,
    pub skip_verification: bool,
}

/// The client configuration of the `rediss://` nodes, as [`Settings`](crate::Settings)
/// holds it: shared by every connection, and summed up by `Debug` (a derived one would
/// print every trust root, the whole platform bundle, byte by byte).
///
/// Unwind-safe, as the settings are without the feature (the feature must not take an
/// auto trait away): the configuration is never changed once built, and its one
/// interior mutability, rustls' session cache, sits behind a mutex whose worst state after
/// a panic is a resumption missed.
#[derive(Clone)]
pub(crate) struct TlsConfig {
    config: Arc<ClientConfig>,
    roots: Option<usize>,
    client_cert: bool,
}

impl std::panic::UnwindSafe for TlsConfig {}
impl std::panic::RefUnwindSafe for TlsConfig {}

impl TlsConfig {
    /// The rustls configuration.
    pub fn get(&self) -> &Arc<ClientConfig> {
        &self.config
    }
}

impl std::fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("TlsConfig");
        match self.roots {
            Some(roots) => d.field("trust_roots", &roots),
            None => d.field("verification", &"SKIPPED (dangerous_skip_tls_verification)"),
        };
        d.field("client_cert", &self.client_cert).finish()
    }
}

/// The crypto provider: ring (see `docs/TLS.md`, "Why ring").
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl TlsOptions {
    /// The client configuration for these settings: reads the CA and client
    /// certificate files. A problem is a [`ConfigError`] naming the setting.
    pub fn client_config(&self) -> Result<TlsConfig, ConfigError> {
        // The client certificate first: its problems are named whatever the roots.
        let client = match &self.client_cert {
            None => None,
            Some((cert, key)) => {
                let shown = format!("{}, {}", cert.display(), key.display());
                let bad = move |problem: String| {
                    ConfigError::new("tls_client_cert", shown.clone(), problem)
                };
                let chain = read_certs(cert).map_err(&bad)?;
                let key = PrivateKeyDer::from_pem_file(key).map_err(|e| {
                    bad(format!("cannot read a private key from the key file: {e}"))
                })?;
                Some((chain, key, bad))
            }
        };
        let provider = provider();
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| ConfigError::new("tls", "", e.to_string()))?;
        let mut root_count = None;
        let builder = if self.skip_verification {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(NoVerification(provider)))
        } else {
            let roots = self.roots()?;
            root_count = Some(roots.len());
            builder.with_root_certificates(roots)
        };
        let client_cert = client.is_some();
        let mut config = match client {
            None => builder.with_no_client_auth(),
            Some((chain, key, bad)) => builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| bad(format!("the key does not fit the certificate: {e}")))?,
        };
        // Redis speaks no ALPN; keep the defaults otherwise.
        config.enable_sni = true;
        Ok(TlsConfig {
            config: Arc::new(config),
            roots: root_count,
            client_cert,
        })
    }

    /// The trust roots: every certificate of `ca_file` when it is set, and only those
    /// (a private CA: with the platform's bundle beside it, any public CA could vouch for
    /// a node's name); else the platform's bundle (`SSL_CERT_FILE`, else the first of
    /// [`PLATFORM_BUNDLES`] that exists).
    fn roots(&self) -> Result<RootCertStore, ConfigError> {
        let mut roots = RootCertStore::empty();
        if let Some(ca) = &self.ca_file {
            let bad = |problem: String| {
                ConfigError::new("tls_ca_file", ca.display().to_string(), problem)
            };
            for cert in read_certs(ca).map_err(bad)? {
                roots
                    .add(cert)
                    .map_err(|e| bad(format!("not a usable CA certificate: {e}")))?;
            }
            return Ok(roots);
        }
        let platform = std::env::var_os("SSL_CERT_FILE")
            .map(PathBuf::from)
            .or_else(|| {
                PLATFORM_BUNDLES
                    .iter()
                    .map(PathBuf::from)
                    .find(|p| p.is_file())
            });
        if let Some(path) = &platform {
            // A bundle may hold the odd certificate webpki cannot use: skip those.
            if let Ok(certs) = CertificateDer::pem_file_iter(path) {
                roots.add_parsable_certificates(certs.filter_map(Result::ok));
            }
        }
        if roots.is_empty() {
            return Err(ConfigError::new(
                "tls_ca_file",
                "(not set)",
                match &platform {
                    Some(path) => format!(
                        "no trust roots: the CA bundle {} gave no usable certificate, and \
                         tls_ca_file is not set",
                        path.display()
                    ),
                    None => format!(
                        "no trust roots: set tls_ca_file, or SSL_CERT_FILE, or install the \
                         platform's CA bundle (looked for {})",
                        PLATFORM_BUNDLES.join(", ")
                    ),
                },
            ));
        }
        Ok(roots)
    }
}

/// Every certificate of a PEM file; at least one.
fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("cannot read it: {e}"))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("not a PEM certificate file: {e}"))?;
    if certs.is_empty() {
        return Err("no PEM certificate in it".into());
    }
    Ok(certs)
}

/// The SNI and verified name of a `rediss://` host.
pub(crate) fn server_name(host: &str) -> Result<ServerName<'static>, String> {
    ServerName::try_from(host.to_string())
        .map_err(|e| format!("{host:?} is not a valid TLS server name: {e}"))
}

/// Accepts any server certificate (still checking the handshake's signatures):
/// [`Builder::dangerous_skip_tls_verification`](crate::Builder::dangerous_skip_tls_verification).
#[derive(Debug)]
struct NoVerification(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// What failed, for a person: a rustls error met while `handshaking` or after.
pub(crate) fn describe(e: &rustls::Error, handshaking: bool) -> NodeError {
    use rustls::{AlertDescription as A, Error as E};
    let why = match e {
        E::InvalidCertificate(_) => format!(
            "the server's certificate was refused ({e}): is tls_ca_file the CA that \
             signed it, and is the URL's host in it?"
        ),
        E::AlertReceived(A::CertificateRequired) => format!(
            "the server refused the session ({e}): it requires a client certificate \
             (Builder::tls_client_cert)"
        ),
        E::AlertReceived(
            a @ (A::BadCertificate | A::UnknownCA | A::CertificateUnknown | A::AccessDenied),
        ) => format!(
            "the server refused our client certificate (alert {a:?}): is it signed by a \
             CA the server trusts?"
        ),
        E::AlertReceived(_) => format!("the server ended the session ({e})"),
        E::InvalidMessage(_) | E::InappropriateMessage { .. } if handshaking => format!(
            "the node's answer is not TLS ({e}): does it speak TLS on this port (a plain \
             Redis port on a rediss:// URL)?"
        ),
        _ => e.to_string(),
    };
    let when = if handshaking {
        "TLS handshake failed"
    } else {
        "TLS error"
    };
    NodeError::Tls(format!("{when}: {why}"))
}

/// An `io::Error` from a blocking rustls stream: the rustls error inside, if any,
/// described as [`describe`] does.
pub(crate) fn from_io(e: io::Error, handshaking: bool) -> NodeError {
    match e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    {
        Some(tls) => describe(tls, handshaking),
        None => NodeError::from(e),
    }
}

/// The socket as rustls reads it, noting whether the last read came back short.
struct Tracked<'a> {
    tcp: &'a mut TcpStream,
    short: bool,
}

impl Read for Tracked<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.tcp.read(buf)?;
        self.short = n < buf.len();
        Ok(n)
    }
}

/// One TLS connection over a non-blocking socket.
pub(crate) struct TlsConn {
    pub tcp: TcpStream,
    /// Set once the TCP connection was seen established: from then on its errors are
    /// the handshake's (or the session's), found by reading and writing.
    pub tcp_up: bool,
    conn: ClientConnection,
}

impl TlsConn {
    pub fn new(
        tcp: TcpStream,
        config: Arc<ClientConfig>,
        name: ServerName<'static>,
    ) -> io::Result<TlsConn> {
        let mut conn = ClientConnection::new(config, name).map_err(io::Error::other)?;
        conn.set_buffer_limit(Some(BUFFER_LIMIT));
        Ok(TlsConn {
            tcp,
            tcp_up: false,
            conn,
        })
    }

    /// Whether TLS records wait for the socket.
    pub fn holds_unsent(&self) -> bool {
        self.conn.wants_write()
    }

    /// Writes the TLS records rustls holds until none is left or the socket blocks.
    pub fn flush(&mut self) -> Result<(), NodeError> {
        while self.conn.wants_write() {
            match self.conn.write_tls(&mut self.tcp) {
                Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero).into()),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Processes the records just read; on an error, tries to send rustls' alert.
    fn process(&mut self) -> Result<(), NodeError> {
        let handshaking = self.conn.is_handshaking();
        match self.conn.process_new_packets() {
            Ok(_) => Ok(()),
            Err(e) => {
                let _ = self.flush();
                Err(describe(&e, handshaking))
            }
        }
    }

    /// Drives the handshake as far as the socket allows: `Ok(true)` once it is done. A
    /// socket error says it came in the handshake (a reset there is most often a node
    /// that does not speak TLS, or refuses us), and stays an I/O error.
    pub fn handshake(&mut self) -> Result<bool, NodeError> {
        self.drive_handshake().map_err(|e| match e {
            NodeError::Io(kind, msg) => NodeError::Io(kind, format!("in the TLS handshake: {msg}")),
            e => e,
        })
    }

    fn drive_handshake(&mut self) -> Result<bool, NodeError> {
        loop {
            self.flush()?;
            if !self.conn.is_handshaking() {
                return Ok(true);
            }
            match self.conn.read_tls(&mut self.tcp) {
                Ok(0) => {
                    return Err(NodeError::Tls(
                        "TLS handshake failed: the node closed the connection without \
                         answering it: does it speak TLS on this port?"
                            .into(),
                    ));
                }
                Ok(_) => self.process()?,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Whether the TLS handshake is still going on.
    pub fn handshaking(&self) -> bool {
        self.conn.is_handshaking()
    }

    /// Takes as much of `bytes` as the socket takes, encrypted: nothing while earlier
    /// records wait for the socket, and at most [`BUFFER_LIMIT`] more than the socket
    /// took (the records left over go out with the next [`TlsConn::flush`]).
    pub fn write(&mut self, bytes: &[u8]) -> Result<usize, NodeError> {
        let mut taken = 0;
        loop {
            self.flush()?;
            if taken == bytes.len() || self.conn.wants_write() {
                return Ok(taken);
            }
            match self.conn.writer().write(&bytes[taken..])? {
                0 => return Ok(taken),
                n => taken += n,
            }
        }
    }

    /// Reads plaintext into `buf`: `Ok(Some(n))` with `n > 0`, `Ok(None)` when nothing
    /// is there now (the socket would block), `Ok(Some(0))` when the peer closed. A
    /// result shorter than `buf` means the socket was drained: read until it would
    /// block, or until a read from it came back short.
    pub fn read(&mut self, buf: &mut [u8]) -> Result<Option<usize>, NodeError> {
        // Records held back by a full socket go first: a readable event may be the only
        // one that comes.
        self.flush()?;
        let mut filled = 0;
        // Set once a read from the socket came back short: it had nothing more then (as
        // the engine assumes of a plain socket's short read), so no read that would only
        // say "would block" is made; a later byte raises a new readiness edge.
        let mut drained = false;
        // Bytes taken from the socket since plaintext last came (see [`SILENT_LIMIT`]).
        let mut silent = 0;
        loop {
            match self.conn.reader().read(&mut buf[filled..]) {
                Ok(0) if filled < buf.len() => {
                    // close_notify: a clean end.
                    return Ok(Some(filled));
                }
                Ok(n) => {
                    silent = 0;
                    filled += n;
                    if filled == buf.len() {
                        return Ok(Some(filled));
                    }
                    continue;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                // The socket ended without close_notify (Redis closing a connection):
                // the engine treats it as any closed connection.
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(Some(filled)),
                Err(e) => return Err(e.into()),
            }
            let nothing_more = Ok(if filled > 0 { Some(filled) } else { None });
            if drained {
                return nothing_more;
            }
            if silent > SILENT_LIMIT {
                return Err(NodeError::Tls(format!(
                    "TLS error: the node sent over {} KiB of TLS records that carry no data \
                     (a flood of session tickets?): closing the connection",
                    SILENT_LIMIT / 1024
                )));
            }
            let mut socket = Tracked {
                tcp: &mut self.tcp,
                short: false,
            };
            match self.conn.read_tls(&mut socket) {
                // Seen by the reader above on the next turn (an end too).
                Ok(n) => {
                    drained = socket.short;
                    silent += n;
                    self.process()?;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return nothing_more,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
            // A key update or alert answered by rustls.
            self.flush()?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mio::{Events, Interest, Poll, Token};
    use rustls::pki_types::PrivatePkcs8KeyDer;
    use std::net::TcpListener;
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    /// A TLS server's listener on loopback and configuration, with a self-signed
    /// certificate for `localhost` only (returned as PEM, to trust it).
    fn listening() -> (TcpListener, u16, rustls::ServerConfig, String) {
        let rcgen::CertifiedKey { cert, signing_key } =
            rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let key = PrivatePkcs8KeyDer::from(signing_key.serialize_der());
        let config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert.der().clone()], key.into())
            .unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        (listener, port, config, cert.pem())
    }

    /// The server side of one connection on `listener`, its handshake done (or failed).
    fn accept(
        listener: TcpListener,
        config: rustls::ServerConfig,
    ) -> Result<(rustls::ServerConnection, std::net::TcpStream), rustls::Error> {
        let (mut sock, _) = listener.accept().unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let mut conn = rustls::ServerConnection::new(Arc::new(config)).unwrap();
        while conn.is_handshaking() {
            if let Err(e) = conn.complete_io(&mut sock) {
                return Err(e
                    .get_ref()
                    .and_then(|e| e.downcast_ref::<rustls::Error>())
                    .cloned()
                    .unwrap_or(rustls::Error::General(e.to_string())));
            }
        }
        Ok((conn, sock))
    }

    /// A client connection to `port` as host `name`, registered with a new `Poll`.
    fn connect(port: u16, config: &TlsConfig, name: &str) -> (TlsConn, Poll, Events) {
        let tcp = TcpStream::connect(([127, 0, 0, 1], port).into()).unwrap();
        let mut conn = TlsConn::new(tcp, config.get().clone(), server_name(name).unwrap()).unwrap();
        let poll = Poll::new().unwrap();
        poll.registry()
            .register(
                &mut conn.tcp,
                Token(0),
                Interest::READABLE | Interest::WRITABLE,
            )
            .unwrap();
        (conn, poll, Events::with_capacity(8))
    }

    /// A client configuration that accepts any server certificate.
    fn unverified() -> TlsConfig {
        TlsOptions {
            skip_verification: true,
            ..Default::default()
        }
        .client_config()
        .unwrap()
    }

    /// Drives the client's handshake on readiness events (as the driver does) until it
    /// is done or fails.
    fn handshake_on_events(
        conn: &mut TlsConn,
        poll: &mut Poll,
        events: &mut Events,
    ) -> Result<(), NodeError> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            wait(poll, events, deadline);
            if !conn.tcp_up {
                // Checked once: a reset socket has no peer address either.
                if conn.tcp.peer_addr().is_err() {
                    continue;
                }
                conn.tcp_up = true;
            }
            if conn.handshake()? {
                return Ok(());
            }
        }
    }

    /// A TLS server on loopback that completes the handshake, then reads nothing until
    /// told to, then reads `len` bytes of plaintext and returns them.
    fn server(len: usize) -> (u16, mpsc::Sender<()>, std::thread::JoinHandle<Vec<u8>>) {
        let (listener, port, config, _) = listening();
        let (go, wait) = mpsc::channel();
        let handle = std::thread::spawn(move || {
            let (conn, sock) = accept(listener, config).unwrap();
            wait.recv().unwrap();
            let mut tls = rustls::StreamOwned::new(conn, sock);
            let mut got = vec![0; len];
            tls.read_exact(&mut got).unwrap();
            got
        });
        (port, go, handle)
    }

    /// Waits for a readiness event on `poll`: none before `deadline` fails the test
    /// (the socket was left without an edge to come).
    fn wait(poll: &mut Poll, events: &mut Events, deadline: Instant) {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "no readiness event came");
            poll.poll(events, Some(left)).unwrap();
            if !events.is_empty() {
                return;
            }
        }
    }

    #[test]
    fn records_a_full_socket_did_not_take_go_out_on_later_events() {
        // More than any loopback socket pair buffers while the server does not read.
        let data: Vec<u8> = (0..8 << 20).map(|i: usize| (i % 251) as u8).collect();
        let (port, go, server) = server(data.len());
        let (mut conn, mut poll, mut events) = connect(port, &unverified(), "localhost");
        let deadline = Instant::now() + Duration::from_secs(60);
        while !(conn.tcp.peer_addr().is_ok() && conn.handshake().unwrap()) {
            wait(&mut poll, &mut events, deadline);
        }

        // Fill the socket: the connection ends up holding records it could not send,
        // and then takes no more plaintext.
        let mut sent = 0;
        loop {
            let n = conn.write(&data[sent..]).unwrap();
            sent += n;
            if n == 0 {
                break;
            }
        }
        assert!(sent < data.len(), "the socket took everything");
        assert!(conn.holds_unsent());
        assert_eq!(conn.write(&data[sent..]).unwrap(), 0);

        // The server reads again: each readiness event flushes what is held, then more
        // is written, until everything is out. Only events wake this loop: a record
        // left behind without the socket full would never raise one.
        go.send(()).unwrap();
        while sent < data.len() || conn.holds_unsent() {
            wait(&mut poll, &mut events, deadline);
            conn.flush().unwrap();
            sent += conn.write(&data[sent..]).unwrap();
        }
        let got = server.join().unwrap();
        assert!(got == data, "the server got every byte once, in order");
    }

    /// The client's handshake, as host `name`, with a server whose certificate names
    /// `localhost` only (trusted through `tls_ca_file`); and the SNI the server was sent,
    /// or why its side failed.
    fn handshake_as(name: &str) -> (Result<(), NodeError>, Result<Option<String>, rustls::Error>) {
        let (listener, port, server_config, pem) = listening();
        let server = std::thread::spawn(move || {
            accept(listener, server_config).map(|(c, _)| c.server_name().map(str::to_string))
        });
        let dir =
            std::env::temp_dir().join(format!("quorumlock-unit-sni-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("ca.pem"), pem).unwrap();
        let config = TlsOptions {
            ca_file: Some(dir.join("ca.pem")),
            ..Default::default()
        }
        .client_config()
        .unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let (mut conn, mut poll, mut events) = connect(port, &config, name);
        let client = handshake_on_events(&mut conn, &mut poll, &mut events);
        drop(conn);
        (client, server.join().unwrap())
    }

    #[test]
    fn the_host_is_sent_as_sni_and_verified_in_the_certificate() {
        // A name in the certificate: sent as SNI, accepted.
        let (client, server) = handshake_as("localhost");
        client.unwrap();
        assert_eq!(server.unwrap().as_deref(), Some("localhost"));

        // The same server reached by an address its certificate does not name: refused by
        // the client, the error naming what the certificate is valid for (an IP address is
        // checked against IP SANs, and never sent as SNI).
        let (client, server) = handshake_as("127.0.0.1");
        let e = client
            .expect_err("a certificate for another name")
            .to_string();
        assert!(e.contains("TLS handshake failed"), "{e}");
        assert!(e.contains("127.0.0.1") && e.contains("localhost"), "{e}");
        assert!(server.is_err(), "the server saw the handshake fail");
    }

    /// Connects to `port` (any certificate), completes the handshake, then reads on
    /// readiness events until a read fails; plaintext fails the test.
    fn read_until_an_error(port: u16) -> NodeError {
        let (mut conn, mut poll, mut events) = connect(port, &unverified(), "localhost");
        handshake_on_events(&mut conn, &mut poll, &mut events).unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut buf = [0u8; 64];
        loop {
            match conn.read(&mut buf) {
                Ok(None) => wait(&mut poll, &mut events, deadline),
                Ok(Some(n)) => panic!("read {n} bytes of plaintext"),
                Err(e) => return e,
            }
        }
    }

    #[test]
    fn a_flood_of_records_without_data_is_an_error_not_a_captive_loop() {
        // A server that sends session tickets without end (rustls bounds key updates,
        // alerts and empty records, not tickets): the client's read must give up with an
        // error instead of reading them for as long as they come.
        let (listener, port, mut config, _) = listening();
        config.send_tls13_tickets = 50_000;
        let server = std::thread::spawn(move || {
            // The tickets go out as the handshake ends, in `accept` or after it; either
            // ends with an error once the client gives up and closes.
            if let Ok((mut conn, mut sock)) = accept(listener, config) {
                while conn.wants_write() && conn.write_tls(&mut sock).is_ok() {}
            }
        });
        let err = read_until_an_error(port);
        // Ours, or rustls' own bound on records it has not processed yet, whichever a
        // given interleaving of the server's writes and our reads meets first.
        assert!(
            matches!(&err, NodeError::Tls(m) if m.contains("carry no data"))
                || matches!(&err, NodeError::Io(io::ErrorKind::InvalidData, m) if m.contains("buffer full")),
            "{err:?}"
        );
        server.join().unwrap();
    }

    #[test]
    fn garbage_after_the_handshake_is_a_tls_error_not_a_panic() {
        let (listener, port, config, _) = listening();
        let server = std::thread::spawn(move || {
            let (conn, mut sock) = accept(listener, config).unwrap();
            // Not a TLS record: a plain-text error, as a confused proxy might send.
            sock.write_all(b"-ERR not tls\r\n").unwrap();
            let mut rest = Vec::new();
            let _ = sock.read_to_end(&mut rest);
            drop(conn);
        });
        let err = read_until_an_error(port);
        let NodeError::Tls(msg) = &err else {
            panic!("expected a TLS error, got {err}");
        };
        assert!(msg.starts_with("TLS error:"), "{msg}");
        server.join().unwrap();
    }

    #[test]
    fn a_reset_in_the_handshake_says_so() {
        // A server that reads nothing: closing with the ClientHello unread resets the
        // connection.
        let (listener, port, _, _) = listening();
        let server = std::thread::spawn(move || {
            let (sock, _) = listener.accept().unwrap();
            sock.peek(&mut [0]).unwrap();
        });
        let (mut conn, mut poll, mut events) = connect(port, &unverified(), "localhost");
        let e = handshake_on_events(&mut conn, &mut poll, &mut events)
            .expect_err("a handshake with nobody");
        server.join().unwrap();
        assert!(
            matches!(&e, NodeError::Io(io::ErrorKind::ConnectionReset, m) if m.contains("TLS handshake")),
            "{e:?}"
        );
    }
}
