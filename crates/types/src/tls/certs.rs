//! Making a job's certificates (`koala certs`, `koala bench --tls`, tests): a self-signed CA and
//! one certificate per host, signed by it, naming the host (an IP address SAN for an address, a
//! DNS name otherwise). ECDSA P-256 keys, with rcgen's default validity (no expiry to manage
//! within a job's life: a job's CA is retired by making a new one and replacing the files).

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use super::TlsFiles;

/// Why certificates could not be made.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// A host that is neither an IP address nor a DNS name.
    #[error("host {host:?}: {message}")]
    Host {
        /// The host.
        host: String,
        /// Why.
        message: String,
    },
    /// Generating or signing failed.
    #[error("making certificates: {0}")]
    Generate(#[from] rcgen::Error),
    /// Writing a file failed.
    #[error("writing {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// What [`write`] made: the CA and each host's certificate and key.
#[derive(Clone, Debug)]
pub struct Made {
    /// The CA certificate (`ca.pem`), what every process names as `ca`.
    pub ca: PathBuf,
    /// The CA's key (`ca.key`): keep it offline; it signs more hosts.
    pub ca_key: PathBuf,
    /// Per host: (host, certificate `HOST.pem`, key `HOST.key`).
    pub hosts: Vec<(String, PathBuf, PathBuf)>,
}

impl Made {
    /// The TLS files of `host` (its certificate and key, and the CA); only the CA if `host` was
    /// not among the hosts.
    pub fn files_of(&self, host: &str) -> TlsFiles {
        let mine = self.hosts.iter().find(|(h, _, _)| h == host);
        TlsFiles {
            cert: mine.map(|(_, cert, _)| cert.clone()),
            key: mine.map(|(_, _, key)| key.clone()),
            ca: Some(self.ca.clone()),
        }
    }
}

/// Makes a CA and a certificate per host in `out` (created if needed): `ca.pem`, `ca.key`,
/// `HOST.pem`, `HOST.key` (keys readable by the owner only).
pub fn write(hosts: &[String], out: &Path) -> Result<Made, CertError> {
    std::fs::create_dir_all(out).map_err(|source| CertError::Write { path: out.to_path_buf(), source })?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, "koala job CA");
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_key = KeyPair::generate()?;
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let ca = out.join("ca.pem");
    let ca_key_path = out.join("ca.key");
    write_file(&ca, ca_cert.pem().as_bytes(), false)?;
    write_file(&ca_key_path, ca_key.serialize_pem().as_bytes(), true)?;
    let issuer = Issuer::new(ca_params, ca_key);
    let mut made = Vec::new();
    for host in hosts {
        let host = host.trim();
        if host.is_empty() || host.contains(['/', '\\', ' ']) {
            return Err(CertError::Host {
                host: host.into(),
                message: "not an IP address or a DNS name (e.g. 10.0.0.1, worker-1.example, localhost)"
                    .into(),
            });
        }
        let mut params = CertificateParams::new(vec![host.to_string()])
            .map_err(|e| CertError::Host { host: host.into(), message: e.to_string() })?;
        params.distinguished_name.push(DnType::CommonName, host);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages =
            vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &issuer)?;
        let file = host.replace(':', "_");
        let (cert_path, key_path) = (out.join(format!("{file}.pem")), out.join(format!("{file}.key")));
        write_file(&cert_path, cert.pem().as_bytes(), false)?;
        write_file(&key_path, key.serialize_pem().as_bytes(), true)?;
        made.push((host.to_string(), cert_path, key_path));
    }
    Ok(Made { ca, ca_key: ca_key_path, hosts: made })
}

fn write_file(path: &Path, bytes: &[u8], secret: bool) -> Result<(), CertError> {
    let err = |source| CertError::Write { path: path.to_path_buf(), source };
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    if secret {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    #[cfg(not(unix))]
    let _ = secret;
    use std::io::Write;
    options.open(path).and_then(|mut f| f.write_all(bytes)).map_err(err)
}
