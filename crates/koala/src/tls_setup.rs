//! TLS as processes are told it (docs/deploy.md §Security): the flags `--tls-cert/--tls-key/
//! --tls-ca`, a job config's `[tls]`, the flags `koala run` hands to the processes it starts, and
//! `koala certs`, which makes a CA and a certificate per host.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::Context;
use koala_coordinator::JobConfig;
use koala_types::tls::{Tls, TlsFiles, certs};

/// `--tls-cert/--tls-key/--tls-ca`: TLS for every port the process listens on and every
/// connection it opens. Off (plain TCP, as without these flags) unless given.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct TlsArgs {
    /// TLS: this host's certificate (PEM), for the ports this process listens on; it must name
    /// the host peers dial (`koala certs --hosts` makes one per host). With --tls-key, --tls-ca.
    #[arg(long = "tls-cert", value_name = "PEM")]
    pub cert: Option<PathBuf>,
    /// TLS: the private key of --tls-cert (PEM).
    #[arg(long = "tls-key", value_name = "PEM")]
    pub key: Option<PathBuf>,
    /// TLS: the job's CA certificate (PEM; `koala certs` writes ca.pem): every listener this
    /// process dials must present a certificate it signed, for the host dialled. A client
    /// (`koala rescale` …) needs only this one.
    #[arg(long = "tls-ca", value_name = "PEM")]
    pub ca: Option<PathBuf>,
}

impl TlsArgs {
    /// The files named.
    pub fn files(&self) -> TlsFiles {
        TlsFiles { cert: self.cert.clone(), key: self.key.clone(), ca: self.ca.clone() }
    }

    /// The TLS setup the flags give (`None`: none given, TLS off).
    pub fn load(&self) -> anyhow::Result<Option<Tls>> {
        let files = self.files();
        if !files.is_on() {
            return Ok(None);
        }
        Ok(Some(Tls::load(&files, "--tls")?))
    }
}

/// A job's TLS: the flags if any is given (they replace `[tls]` whole), else the config's
/// `[tls]`; loaded (errors name the field or flag and the fix), with the files it came from.
pub fn of_job(config: &JobConfig, flags: &TlsArgs) -> anyhow::Result<Option<(Tls, TlsFiles)>> {
    let (files, prefix) = match (&config.tls, flags.files()) {
        (_, files) if files.is_on() => (files, "--tls"),
        (Some(files), _) if files.is_on() => (files.clone(), "[tls]"),
        _ => return Ok(None),
    };
    let tls = Tls::load(&files, prefix)?;
    anyhow::ensure!(
        tls.can_listen(),
        "{}: a coordinator listens, so it needs a certificate and its key besides the CA ({})",
        if prefix == "--tls" { "--tls-cert, --tls-key" } else { "[tls] cert, key" },
        "`koala certs --hosts HOST --out DIR` makes them"
    );
    Ok(Some((tls, absolute(&files)?)))
}

/// The flags that give `files` to a process `koala run` starts.
pub fn child_args(files: &TlsFiles) -> Vec<OsString> {
    let mut args = Vec::new();
    for (flag, path) in [("--tls-cert", &files.cert), ("--tls-key", &files.key), ("--tls-ca", &files.ca)] {
        if let Some(path) = path {
            args.push(flag.into());
            args.push(path.clone().into_os_string());
        }
    }
    args
}

fn absolute(files: &TlsFiles) -> anyhow::Result<TlsFiles> {
    let abs = |p: &Option<PathBuf>| -> anyhow::Result<Option<PathBuf>> {
        p.as_ref()
            .map(|p| std::path::absolute(p).with_context(|| format!("resolving {}", p.display())))
            .transpose()
    };
    Ok(TlsFiles { cert: abs(&files.cert)?, key: abs(&files.key)?, ca: abs(&files.ca)? })
}

/// `koala certs --hosts H1,H2 --out DIR`: makes the CA and a certificate per host and prints
/// how to use them. Refuses a directory that already holds a CA (its hosts' certificates would
/// stop matching).
pub fn certs_command(hosts: &[String], out: &Path) -> anyhow::Result<()> {
    anyhow::ensure!(
        !hosts.is_empty(),
        "--hosts: name at least one host, e.g. --hosts 10.0.0.1,10.0.0.2,localhost"
    );
    anyhow::ensure!(
        !out.join("ca.pem").exists(),
        "--out {}: it already holds a CA (ca.pem); certificates made now would not be signed by it. \
         Give another --out, or remove the directory to start over",
        out.display()
    );
    let made = certs::write(hosts, out).context("koala certs")?;
    let show = |p: &Path| p.display().to_string();
    println!("CA: {} (give it to every process), {} (keep it private)", show(&made.ca), show(&made.ca_key));
    for (host, cert, key) in &made.hosts {
        println!("{host}: {} and {}", show(cert), show(key));
    }
    let (first, cert, key) = &made.hosts[0];
    println!();
    println!("job config (koala run, or koala coordinator on {first}; each host uses its own cert and key):");
    println!("[tls]\ncert = {:?}\nkey = {:?}\nca = {:?}", show(cert), show(key), show(&made.ca));
    println!();
    println!("flags, per host (koala coordinator, worker, state-server):");
    for (host, cert, key) in &made.hosts {
        println!("  {host}: --tls-cert {} --tls-key {} --tls-ca {}", show(cert), show(key), show(&made.ca));
    }
    println!("clients (koala rescale | rebalance | migrate): --tls-ca {}", show(&made.ca));
    Ok(())
}

/// `koala bench --tls`: a throwaway CA and a certificate for 127.0.0.1 in `dir` (made anew).
pub fn throwaway(dir: &Path) -> anyhow::Result<TlsFiles> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("clearing {}", dir.display()))?;
    }
    let made = certs::write(&["127.0.0.1".to_string()], dir).context("making the bench's certificates")?;
    absolute(&made.files_of("127.0.0.1"))
}
