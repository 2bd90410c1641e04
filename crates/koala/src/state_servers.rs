//! State server processes of the Remote baseline (`[state] backend = "remote"`): `koala
//! state-server`, and the ones `koala run` starts for a job.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

use anyhow::Context;
use koala_types::handshake::Token;

/// State server processes: they run until killed, which happens when the job is over (or at a
/// forced exit: `crate::interrupt` tracks them).
pub struct ServerProcesses(Vec<Arc<Mutex<Child>>>);

impl Drop for ServerProcesses {
    fn drop(&mut self) {
        for child in &self.0 {
            let Ok(mut child) = child.lock() else { continue };
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// `koala state-server`: serves remote state until killed, to clients presenting `token`
/// (required off loopback). Prints `state server listening on ADDR` first (`koala run` reads
/// the address from it).
pub fn state_server(
    listen: &str,
    data_dir: &Path,
    token: Option<Token>,
    tls: Option<koala_types::tls::Tls>,
) -> anyhow::Result<()> {
    let server = koala_state::StateServer::start(listen, data_dir, token, tls)
        .with_context(|| format!("starting a state server on {listen} in {}", data_dir.display()))?;
    println!("state server listening on {}", server.addr());
    // Serves on its own threads; this one only waits (the process ends when it is killed).
    loop {
        std::thread::park();
    }
}

/// Starts `n` state server processes (`koala state-server` on port 0) with their data under
/// `out/state/server-<i>`, each checking the job's `token` (passed in its environment, never on
/// its command line); returns them and their addresses, read from their first line.
pub fn start(
    exe: &Path,
    out: &Path,
    n: u32,
    token: &Token,
    tls_args: &[std::ffi::OsString],
) -> anyhow::Result<(ServerProcesses, Vec<String>)> {
    use std::io::BufRead;
    let mut servers = ServerProcesses(Vec::new());
    let mut addrs = Vec::new();
    for i in 0..n {
        let data_dir = out.join("state").join(format!("server-{i}"));
        let mut child = Command::new(exe)
            .arg("state-server")
            .arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--data-dir")
            .arg(&data_dir)
            .env("KOALA_LOG", std::env::var("KOALA_LOG").unwrap_or_else(|_| "warn".into()))
            .env(crate::token::ENV, token.expose())
            .args(tls_args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            // The job drains against it after a Ctrl-C; it is stopped once the job ended.
            .arg("--ignore-interrupt")
            .spawn()
            .with_context(|| format!("starting state server {i}"))?;
        let stdout = child.stdout.take().context("the state server's stdout")?;
        servers.0.push(crate::interrupt::track(child));
        let mut line = String::new();
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .with_context(|| format!("reading state server {i}'s address"))?;
        let addr = line
            .trim()
            .strip_prefix("state server listening on ")
            .with_context(|| format!("state server {i} did not start (it printed {line:?})"))?;
        addrs.push(addr.to_string());
    }
    Ok((servers, addrs))
}
