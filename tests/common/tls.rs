//! TLS test fixtures (feature `tls`): certificates made at run time, and
//! `redis-server` nodes that listen with `--tls-port` only.

use super::{Cluster, NodeOptions, free_port};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use std::path::PathBuf;

/// A CA, a server and a client certificate signed by it, another CA and a client
/// certificate signed by that one, as PEM files
/// in a directory of their own (removed on drop).
pub struct Certs {
    dir: PathBuf,
}

impl Certs {
    pub fn new() -> Certs {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("quorumlock-test-certs-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let write = |name: &str, pem: String| std::fs::write(dir.join(name), pem).unwrap();

        let ca = |name: &str| {
            let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
            p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            p.distinguished_name.push(DnType::CommonName, name);
            p.key_usages = vec![
                KeyUsagePurpose::KeyCertSign,
                KeyUsagePurpose::CrlSign,
                KeyUsagePurpose::DigitalSignature,
            ];
            let key = KeyPair::generate().unwrap();
            let cert = p.self_signed(&key).unwrap();
            (cert, Issuer::new(p, key))
        };
        let (ca_cert, issuer) = ca("quorumlock test CA");
        write("ca.crt", ca_cert.pem());
        let (other_ca, other_issuer) = ca("some other CA");
        write("other-ca.crt", other_ca.pem());

        let signed = |names: Vec<String>,
                      usage: ExtendedKeyUsagePurpose,
                      file: &str,
                      issuer: &Issuer<'_, KeyPair>| {
            let mut p = CertificateParams::new(names).unwrap();
            p.distinguished_name.push(DnType::CommonName, file);
            p.extended_key_usages = vec![usage];
            p.use_authority_key_identifier_extension = true;
            let key = KeyPair::generate().unwrap();
            let cert = p.signed_by(&key, issuer).unwrap();
            write(&format!("{file}.crt"), cert.pem());
            write(&format!("{file}.key"), key.serialize_pem());
        };
        let leaf = |names: Vec<String>, usage: ExtendedKeyUsagePurpose, file: &str| {
            signed(names, usage, file, &issuer)
        };
        leaf(
            vec!["127.0.0.1".into(), "localhost".into()],
            ExtendedKeyUsagePurpose::ServerAuth,
            "server",
        );
        leaf(
            vec!["quorumlock-client".into()],
            ExtendedKeyUsagePurpose::ClientAuth,
            "client",
        );
        // A client certificate the servers do not trust.
        signed(
            vec!["quorumlock-client".into()],
            ExtendedKeyUsagePurpose::ClientAuth,
            "other-client",
            &other_issuer,
        );
        Certs { dir }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

impl Drop for Certs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One `redis-server` with TLS only on a free port: the cluster (one node, killed on
/// drop) and its `rediss://` URL.
pub struct TlsNode {
    pub cluster: Cluster,
    pub port: u16,
}

impl TlsNode {
    pub fn start(certs: &Certs, auth_clients: bool) -> TlsNode {
        TlsNode::start_with(certs, auth_clients, &NodeOptions::default())
    }

    /// [`TlsNode::start`] with more options (a password, an ACL user); the node listens
    /// on a Unix socket for the harness whatever `base` says.
    pub fn start_with(certs: &Certs, auth_clients: bool, base: &NodeOptions) -> TlsNode {
        let p = |name: &str| certs.path(name).display().to_string();
        let mut last = None;
        // The port is picked before the server binds it: another process may take it
        // first (the server then fails to start), so a few tries.
        for _ in 0..4 {
            let port = free_port();
            let opts = NodeOptions {
                unix_socket: true,
                extra_args: vec![
                    "--tls-port".into(),
                    port.to_string(),
                    "--tls-cert-file".into(),
                    p("server.crt"),
                    "--tls-key-file".into(),
                    p("server.key"),
                    "--tls-ca-cert-file".into(),
                    p("ca.crt"),
                    "--tls-auth-clients".into(),
                    if auth_clients { "yes" } else { "no" }.into(),
                ],
                ..base.clone()
            };
            match std::panic::catch_unwind(|| Cluster::start_with(1, &opts)) {
                Ok(cluster) => return TlsNode { cluster, port },
                Err(e) => last = Some(e),
            }
        }
        std::panic::resume_unwind(last.unwrap())
    }

    pub fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.port)
    }

    pub fn holds(&self, key: &str) -> bool {
        self.cluster.node(0).admin().exists(key)
    }

    pub fn pttl(&self, key: &str) -> i64 {
        self.cluster.node(0).admin().pttl(key)
    }
}
