//! TLS for every koala connection (docs/architecture.md §3, docs/deploy.md §Security): the
//! control port, the workers' data ports and peer lanes, the state servers and the HTTP API.
//! Off unless a job names a certificate, its key and the CA that signed them (`[tls]`,
//! `--tls-cert/--tls-key/--tls-ca`). The job token stays the authentication; TLS keeps it (and
//! everything after it) secret and lets the dialling side check that the listener holds a
//! certificate of the job's CA for the host it dialled (a DNS name or an IP address SAN).
//!
//! rustls with the `ring` provider, TLS 1.3 only; blocking std I/O, like the rest of koala.
//! [`Conn`] is one connection, plain TCP or TLS, and [`Conn::split`] gives a reader and a writer
//! that two threads can use at once for either (`split`).
//!
//! ```
//! # #[cfg(feature = "certs")] {
//! use koala_types::tls::{Conn, Tls, TlsFiles, certs};
//! use std::io::{Read, Write};
//! use std::net::{TcpListener, TcpStream};
//!
//! let dir = tempfile::tempdir().unwrap();
//! let made = certs::write(&["127.0.0.1".to_string()], dir.path()).unwrap();
//! let tls = Tls::load(&made.files_of("127.0.0.1"), "[tls]").unwrap();
//! let listener = TcpListener::bind("127.0.0.1:0").unwrap();
//! let addr = listener.local_addr().unwrap().to_string();
//! let client = tls.clone();
//! let peer = std::thread::spawn(move || {
//!     let mut conn = client.connect(TcpStream::connect(&addr).unwrap(), &addr).unwrap();
//!     conn.write_all(b"hello").unwrap();
//!     conn.flush().unwrap();
//! });
//! let (tcp, _) = listener.accept().unwrap();
//! let mut conn = tls.accept(tcp, std::time::Duration::from_secs(5)).unwrap();
//! let mut got = [0u8; 5];
//! conn.read_exact(&mut got).unwrap();
//! assert_eq!(&got, b"hello");
//! peer.join().unwrap();
//! # }
//! ```

#[cfg(feature = "certs")]
pub mod certs;
mod conn;
mod split;

use std::io;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, ServerConfig, ServerConnection};

pub use conn::{Conn, Transport};
pub use split::{ConnReader, ConnWriter};

/// The files of a TLS setup: this host's certificate chain and key (PEM), and the CA
/// certificate(s) peers' certificates must chain to.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsFiles {
    /// This host's certificate (PEM; a chain, leaf first). Needed by a process that listens.
    #[serde(default)]
    pub cert: Option<PathBuf>,
    /// The private key of `cert` (PEM: PKCS#8, PKCS#1 or SEC1).
    #[serde(default)]
    pub key: Option<PathBuf>,
    /// The CA certificate(s) (PEM) every listener's certificate must chain to.
    #[serde(default)]
    pub ca: Option<PathBuf>,
}

impl TlsFiles {
    /// Whether any file is named (TLS is on).
    pub fn is_on(&self) -> bool {
        self.cert.is_some() || self.key.is_some() || self.ca.is_some()
    }
}

/// Why a TLS setup could not be loaded. Every message names the field (or flag) at fault and the
/// fix.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A field that is needed is not given.
    #[error("{field}: not given; {fix}")]
    Missing {
        /// The field or flag.
        field: String,
        /// What to do.
        fix: String,
    },
    /// A file could not be read or holds nothing usable.
    #[error("{field} = {path}: {message}")]
    File {
        /// The field or flag.
        field: String,
        /// The file.
        path: PathBuf,
        /// What is wrong and the fix.
        message: String,
    },
    /// The certificate and key do not make a usable identity (e.g. the key is not the
    /// certificate's).
    #[error("{field}: {message}")]
    Identity {
        /// The fields.
        field: String,
        /// What is wrong and the fix.
        message: String,
    },
}

/// A loaded TLS setup: what a process needs to accept TLS (if it has a certificate) and to dial
/// TLS listeners. Cheap to clone.
#[derive(Clone)]
pub struct Tls {
    server: Option<Arc<ServerConfig>>,
    client: Arc<ClientConfig>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").field("listens", &self.server.is_some()).finish()
    }
}

/// TLS records are 16 KiB of plaintext at most; buffers are sized in whole records.
pub const RECORD_BYTES: usize = 16 * 1024;

/// ring's provider: aws-lc-rs, rustls's default, needs cmake to build. ring offers no
/// post-quantum key exchange, which is why rustls marks this constructor deprecated.
#[allow(deprecated)]
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl Tls {
    /// Loads `files`; `prefix` names where they came from in errors (`[tls]` for a config's
    /// section: fields `[tls] cert`…, `--tls` for flags: `--tls-cert`…). `ca` is required;
    /// `cert` and `key` come together (a process that only dials, `koala rescale`, needs neither).
    pub fn load(files: &TlsFiles, prefix: &str) -> Result<Self, TlsError> {
        let field = |name: &str| {
            if prefix.starts_with("--") { format!("{prefix}-{name}") } else { format!("{prefix} {name}") }
        };
        let ca_path = files.ca.as_ref().ok_or_else(|| TlsError::Missing {
            field: field("ca"),
            fix: "give the CA certificate every host's certificate is signed by (`koala certs` writes it as ca.pem)"
                .into(),
        })?;
        let mut roots = RootCertStore::empty();
        for cert in read_certs(ca_path, &field("ca"))? {
            roots.add(cert).map_err(|e| TlsError::File {
                field: field("ca"),
                path: ca_path.clone(),
                message: format!("not a usable CA certificate ({e}); give the CA's certificate (ca.pem)"),
            })?;
        }
        let client = ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| TlsError::Identity { field: prefix.into(), message: e.to_string() })?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let server = match (&files.cert, &files.key) {
            (None, None) => None,
            (Some(_), None) => {
                return Err(TlsError::Missing {
                    field: field("key"),
                    fix: format!("give the private key of {} too", field("cert")),
                });
            }
            (None, Some(_)) => {
                return Err(TlsError::Missing {
                    field: field("cert"),
                    fix: format!("give the certificate of {} too", field("key")),
                });
            }
            (Some(cert), Some(key)) => Some(Arc::new(server_config(cert, key, &field)?)),
        };
        Ok(Self { server, client: Arc::new(client) })
    }

    /// Whether this setup can accept connections (it has a certificate and key).
    pub fn can_listen(&self) -> bool {
        self.server.is_some()
    }

    /// The rustls server config, for a listener that drives its connections itself.
    pub fn server_config(&self) -> Option<Arc<ServerConfig>> {
        self.server.clone()
    }

    /// Runs the server side of the TLS handshake on an accepted connection, within `limit` (a
    /// peer that trickles or stays silent is dropped then). A peer that greets in plaintext (a
    /// koala build or a process without TLS) is told, in plaintext, that this listener needs TLS.
    pub fn accept(&self, tcp: TcpStream, limit: Duration) -> io::Result<Conn> {
        let config = self.server.clone().ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, "this process has no TLS certificate to listen with")
        })?;
        let deadline = Instant::now() + limit;
        tcp.set_read_timeout(Some(limit))?;
        if let Some(refusal) = plaintext_greeting(&tcp) {
            let _ = tcp.set_write_timeout(Some(Duration::from_secs(1)));
            let _ = crate::handshake::write_refusal(&mut &tcp, &refusal);
            return Err(io::Error::new(io::ErrorKind::PermissionDenied, refusal.to_string()));
        }
        let conn = ServerConnection::new(config).map_err(io::Error::other)?;
        let mut conn = Conn::Server(Box::new(rustls::StreamOwned::new(conn, tcp)));
        conn.handshake(deadline)?;
        conn.tcp().set_read_timeout(None)?;
        Ok(conn)
    }

    /// Runs the client side of the TLS handshake on a connection to `addr` (`host:port`, the
    /// address dialled): the listener's certificate must chain to the CA and name `host`.
    pub fn connect(&self, tcp: TcpStream, addr: &str) -> io::Result<Conn> {
        let host = host_of(addr);
        let name = ServerName::try_from(host.to_string()).map_err(|e| {
            io::Error::new(io::ErrorKind::InvalidInput, format!("{host} is not a host name for TLS: {e}"))
        })?;
        let conn = ClientConnection::new(self.client.clone(), name).map_err(io::Error::other)?;
        let previous = tcp.read_timeout()?;
        tcp.set_read_timeout(Some(Duration::from_secs(30)))?;
        let mut conn = Conn::Client(Box::new(rustls::StreamOwned::new(conn, tcp)));
        conn.handshake(Instant::now() + Duration::from_secs(30)).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "TLS handshake with {addr} failed: {e} (does the listener run with TLS, with a \
                     certificate of this CA naming {host}?)"
                ),
            )
        })?;
        conn.tcp().set_read_timeout(previous)?;
        Ok(conn)
    }
}

fn server_config(cert: &Path, key: &Path, field: &dyn Fn(&str) -> String) -> Result<ServerConfig, TlsError> {
    let certs = read_certs(cert, &field("cert"))?;
    let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| TlsError::File {
        field: field("key"),
        path: key.to_path_buf(),
        message: format!(
            "no private key read ({}); give the PEM key that belongs to {}",
            pem_error(&e),
            field("cert")
        ),
    })?;
    let config = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| TlsError::Identity { field: field("cert"), message: e.to_string() })?
        .with_no_client_auth();
    let mut config = config.with_single_cert(certs, key_der).map_err(|e| TlsError::Identity {
        field: format!("{} and {}", field("cert"), field("key")),
        message: format!(
            "{} ({}) and {} ({}) do not go together: {e}; give the key made with that certificate",
            field("cert"),
            cert.display(),
            field("key"),
            key.display()
        ),
    })?;
    // No session tickets: every connection is long-lived, and a ticket would be one more
    // message to answer on the reading side of a split connection.
    config.send_tls13_tickets = 0;
    Ok(config)
}

fn read_certs(path: &Path, field: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bad = |message: String| TlsError::File { field: field.into(), path: path.to_path_buf(), message };
    let iter = CertificateDer::pem_file_iter(path)
        .map_err(|e| bad(format!("cannot read it ({})", pem_error(&e))))?;
    let certs =
        iter.collect::<Result<Vec<_>, _>>().map_err(|e| bad(format!("not PEM ({})", pem_error(&e))))?;
    if certs.is_empty() {
        return Err(bad(
            "holds no PEM certificate (`-----BEGIN CERTIFICATE-----`); `koala certs` makes them".into(),
        ));
    }
    Ok(certs)
}

fn pem_error(e: &rustls::pki_types::pem::Error) -> String {
    match e {
        rustls::pki_types::pem::Error::Io(io) if io.kind() == io::ErrorKind::NotFound => {
            "no such file; check the path".into()
        }
        other => other.to_string(),
    }
}

/// The connection a listener accepted: TLS (handshake within `limit`) when the listener has
/// `tls`, else plain TCP as it was.
pub fn accepted(tls: Option<&Tls>, tcp: TcpStream, limit: Duration) -> io::Result<Conn> {
    match tls {
        Some(tls) => tls.accept(tcp, limit),
        None => Ok(Conn::Plain(tcp)),
    }
}

/// The connection to `addr` a client opened: TLS when it has `tls`, else plain TCP as it was.
pub fn dialled(tls: Option<&Tls>, tcp: TcpStream, addr: &str) -> io::Result<Conn> {
    match tls {
        Some(tls) => tls.connect(tcp, addr),
        None => Ok(Conn::Plain(tcp)),
    }
}

/// The host of `host:port` (`[v6]:port` too).
pub fn host_of(addr: &str) -> &str {
    if let Some(rest) = addr.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    addr.rsplit_once(':').map_or(addr, |(host, _)| host)
}

/// If the peer's first bytes are a koala greeting (`len u32`, `KOAL`), the refusal telling it
/// this listener needs TLS. Waits at most the stream's read timeout for the first bytes.
fn plaintext_greeting(tcp: &TcpStream) -> Option<crate::handshake::Refusal> {
    let mut first = [0u8; 8];
    let deadline = Instant::now() + tcp.read_timeout().ok().flatten().unwrap_or(Duration::from_secs(5));
    loop {
        let n = tcp.peek(&mut first).ok()?;
        // A TLS ClientHello starts with 0x16; anything else that is not a greeting goes on to
        // rustls, which refuses it.
        if n == 0 || first[0] == 0x16 {
            return None;
        }
        if n >= 8 {
            return (&first[4..8] == b"KOAL").then_some(crate::handshake::Refusal::NeedsTls);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[cfg(all(test, feature = "certs"))]
mod tests;
