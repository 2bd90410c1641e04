//! The tansu Kafka broker's lifecycle (docs/architecture.md §11): install it once, start it on
//! 127.0.0.1 in a data directory, wait until it answers a metadata request, stop it — also from
//! another process, through the state file `broker.json` that [`start`] writes into the data
//! directory.
//!
//! Known traps this module works around:
//! - tansu resolves a `sqlite://` path relative to its working directory (even `sqlite:///abs`
//!   becomes `cwd/abs`), so the broker runs with the data directory as its working directory and
//!   the URL `sqlite://tansu.db`;
//! - the `memory://` engine answers ListOffsets(latest) wrongly: our source never asks for it (it
//!   reads the high watermark from Fetch responses);
//! - tansu listens on `0.0.0.0:9092` and advertises `localhost:9092` by default: we always pass an
//!   explicit `127.0.0.1` listener and the same advertised listener.
//!
//! ```no_run
//! use koala_connectors::broker::{self, BrokerOptions};
//! let broker = broker::start(BrokerOptions::new("/tmp/koala-broker"))?;
//! println!("bootstrap: {}", broker.bootstrap());
//! broker.stop()?;
//! # Ok::<(), koala_connectors::ConnectorError>(())
//! ```

use std::{
    fs,
    net::TcpListener,
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::{CALL_LIMIT, ConnectorError, block_on_within, connect, io_runtime, now_ms};

/// The tansu version the project is tested with.
pub const TANSU_VERSION: &str = "0.6.0";
/// The state file [`start`] writes into the data directory.
pub const STATE_FILE: &str = "broker.json";
/// The broker's combined stdout/stderr, in the data directory.
pub const LOG_FILE: &str = "broker.log";

/// How to start a broker.
#[derive(Clone, Debug)]
pub struct BrokerOptions {
    /// Directory holding the SQLite database, the log and the state file (created if missing).
    pub data_dir: PathBuf,
    /// Use the in-memory engine (fast, not persistent; for throughput runs) instead of SQLite.
    pub memory: bool,
    /// Port on 127.0.0.1; `None` picks a free one.
    pub port: Option<u16>,
    /// The tansu binary; `None` finds or installs it with [`ensure_installed`].
    pub tansu: Option<PathBuf>,
    /// How long to wait for the broker to answer a metadata request.
    pub startup_timeout: Duration,
}

impl BrokerOptions {
    /// SQLite engine, a free port, the default startup timeout (60 s).
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Self {
            data_dir: data_dir.into(),
            memory: false,
            port: None,
            tansu: None,
            startup_timeout: Duration::from_secs(60),
        }
    }
}

/// What the state file records about a started broker.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerState {
    /// Process id of the tansu process.
    pub pid: u32,
    /// Port on 127.0.0.1.
    pub port: u16,
    /// `127.0.0.1:<port>`, to give Kafka clients.
    pub bootstrap: String,
    /// The storage engine URL.
    pub engine: String,
    /// The broker's log file.
    pub log: PathBuf,
    /// Wall-clock start time (ms since the epoch).
    pub started_at_ms: u64,
}

/// Whether a broker runs in a data directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BrokerStatus {
    /// No state file.
    NotRunning,
    /// The recorded process is alive.
    Running(BrokerState),
    /// A state file remains but its process is gone (crashed or killed).
    Stale(BrokerState),
}

/// A broker started by this process. Dropping the handle stops the broker; call
/// [`BrokerHandle::detach`] to leave it running (`koala broker start`).
#[derive(Debug)]
pub struct BrokerHandle {
    state: BrokerState,
    data_dir: PathBuf,
    child: Option<Child>,
}

impl BrokerHandle {
    /// `127.0.0.1:<port>`.
    pub fn bootstrap(&self) -> &str {
        &self.state.bootstrap
    }

    /// The recorded state.
    pub fn state(&self) -> &BrokerState {
        &self.state
    }

    /// Leaves the broker running after this handle (and this process) is gone; [`stop`] ends it.
    pub fn detach(mut self) -> BrokerState {
        self.child = None;
        self.state.clone()
    }

    /// Stops the broker (SIGTERM, then SIGKILL after 10 s) and removes the state file.
    pub fn stop(mut self) -> Result<(), ConnectorError> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<(), ConnectorError> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        signal(child.id(), "TERM")?;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match child.try_wait() {
                Ok(Some(_)) => break,
                Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(20)),
                Ok(None) => {
                    warn!(pid = child.id(), "tansu ignored SIGTERM for 10 s; killing it");
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
                Err(e) => return Err(ConnectorError::io("waiting for tansu to exit", e)),
            }
        }
        remove_state(&self.data_dir)
    }
}

impl Drop for BrokerHandle {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            warn!("stopping the broker: {e}");
        }
    }
}

/// The `cargo install` command that installs the tested tansu version.
pub fn install_command() -> Command {
    let mut cmd = Command::new("cargo");
    cmd.args(["install", &format!("tansu@{TANSU_VERSION}"), "--locked", "--no-default-features"])
        .args(["--features", "libsql,dynostore"]);
    cmd
}

/// The tansu binary if installed: `$KOALA_TANSU`, then `$CARGO_HOME/bin` (default
/// `~/.cargo/bin`), then `PATH`.
pub fn find_tansu() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("KOALA_TANSU") {
        return Some(PathBuf::from(path));
    }
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")));
    let in_path =
        std::env::var_os("PATH").map(|p| std::env::split_paths(&p).collect::<Vec<_>>()).unwrap_or_default();
    cargo_home
        .map(|h| h.join("bin"))
        .into_iter()
        .chain(in_path)
        .map(|d| d.join("tansu"))
        .find(|p| p.is_file())
}

/// Returns the tansu binary, installing it with [`install_command`] first when missing (about
/// 11 minutes on 2 cores, once; cargo's output goes to this process's stderr).
pub fn ensure_installed() -> Result<PathBuf, ConnectorError> {
    if let Some(path) = find_tansu() {
        return Ok(path);
    }
    info!("tansu not found; installing tansu {TANSU_VERSION} with cargo (takes minutes, once)");
    let status = install_command()
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .status()
        .map_err(|e| ConnectorError::Install(format!("running cargo: {e}")))?;
    if !status.success() {
        return Err(ConnectorError::Install(format!("cargo install exited with {status}")));
    }
    find_tansu().ok_or_else(|| {
        ConnectorError::Install("cargo install succeeded but no tansu binary was found".into())
    })
}

/// Starts tansu on 127.0.0.1 in `options.data_dir` and waits until it answers a metadata request.
/// Fails if a broker already runs in that directory.
pub fn start(options: BrokerOptions) -> Result<BrokerHandle, ConnectorError> {
    fs::create_dir_all(&options.data_dir)
        .map_err(|e| ConnectorError::io(format!("creating {}", options.data_dir.display()), e))?;
    let data_dir = options
        .data_dir
        .canonicalize()
        .map_err(|e| ConnectorError::io(format!("resolving {}", options.data_dir.display()), e))?;
    match status(&data_dir)? {
        BrokerStatus::Running(s) => {
            return Err(ConnectorError::Config(format!(
                "a broker already runs in {} (pid {}, {}); stop it first",
                data_dir.display(),
                s.pid,
                s.bootstrap
            )));
        }
        BrokerStatus::Stale(_) => remove_state(&data_dir)?,
        BrokerStatus::NotRunning => {}
    }
    let tansu = match &options.tansu {
        Some(path) => path.clone(),
        None => ensure_installed()?,
    };
    // A port picked by binding 0 can be taken by someone else before tansu binds it: retry then.
    let attempts = if options.port.is_some() { 1 } else { 3 };
    let mut last_error = None;
    for _ in 0..attempts {
        let port = match options.port {
            Some(port) => port,
            None => free_port()?,
        };
        match spawn_and_wait(&tansu, &options, &data_dir, port) {
            Ok(handle) => return Ok(handle),
            Err(e) => {
                warn!("starting tansu on port {port}: {e}");
                last_error = Some(e);
            }
        }
    }
    Err(last_error.unwrap_or_else(|| ConnectorError::Config("no start attempt was made".into())))
}

fn spawn_and_wait(
    tansu: &Path,
    options: &BrokerOptions,
    data_dir: &Path,
    port: u16,
) -> Result<BrokerHandle, ConnectorError> {
    let log = data_dir.join(LOG_FILE);
    let log_file =
        fs::File::create(&log).map_err(|e| ConnectorError::io(format!("creating {}", log.display()), e))?;
    let log_err = log_file.try_clone().map_err(|e| ConnectorError::io("duplicating the log handle", e))?;
    let engine = if options.memory { "memory://tansu/" } else { "sqlite://tansu.db" };
    let url = format!("tcp://127.0.0.1:{port}");
    let child = Command::new(tansu)
        .arg("broker")
        .args(["--listener-url", &url, "--advertised-listener-url", &url])
        .args(["--storage-engine", engine, "--cluster-id", "koala"])
        .current_dir(data_dir)
        // Keep a panic (e.g. the port is taken) within the log tail we show.
        .env("RUST_BACKTRACE", "0")
        .stdin(Stdio::null())
        .stdout(log_file)
        .stderr(log_err)
        // Own process group: a Ctrl-C aimed at `koala broker start` must not reach the broker.
        .process_group(0)
        .spawn()
        .map_err(|e| ConnectorError::io(format!("spawning {}", tansu.display()), e))?;
    let state = BrokerState {
        pid: child.id(),
        port,
        bootstrap: format!("127.0.0.1:{port}"),
        engine: engine.to_string(),
        log: log.clone(),
        started_at_ms: now_ms(),
    };
    let mut handle = BrokerHandle { state, data_dir: data_dir.to_path_buf(), child: Some(child) };
    wait_until_answering(&mut handle, options.startup_timeout)?;
    let json = serde_json::to_vec_pretty(&handle.state)
        .map_err(|e| ConnectorError::Config(format!("encoding the broker state: {e}")))?;
    let path = data_dir.join(STATE_FILE);
    fs::write(&path, json).map_err(|e| ConnectorError::io(format!("writing {}", path.display()), e))?;
    info!(bootstrap = %handle.state.bootstrap, engine, "tansu broker is up");
    Ok(handle)
}

fn wait_until_answering(handle: &mut BrokerHandle, timeout: Duration) -> Result<(), ConnectorError> {
    let rt = io_runtime()?;
    let brokers = vec![handle.state.bootstrap.clone()];
    let deadline = Instant::now() + timeout;
    let log = handle.state.log.clone();
    let fail = |reason: String| ConnectorError::Broker {
        reason,
        log: log.display().to_string(),
        tail: log_tail(&log, 20),
    };
    loop {
        if let Some(child) = handle.child.as_mut()
            && let Ok(Some(exit)) = child.try_wait()
        {
            handle.child = None;
            return Err(fail(format!("tansu exited ({exit}) before answering")));
        }
        let answered = block_on_within(&rt, Duration::from_secs(1), "asking for metadata", async {
            let client = connect(&brokers, Duration::from_millis(300)).await?;
            client.list_topics().await.map_err(|e| ConnectorError::kafka("metadata", e))
        });
        match answered {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() >= deadline => {
                let _ = handle.shutdown();
                return Err(fail(format!(
                    "no answer to a metadata request on {} within {timeout:?}: {e}",
                    handle.state.bootstrap
                )));
            }
            Err(_) => thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// Whether a broker runs in `data_dir`, by its state file and the recorded process.
pub fn status(data_dir: &Path) -> Result<BrokerStatus, ConnectorError> {
    let path = data_dir.join(STATE_FILE);
    let bytes = match fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BrokerStatus::NotRunning),
        Err(e) => return Err(ConnectorError::io(format!("reading {}", path.display()), e)),
    };
    let state: BrokerState = serde_json::from_slice(&bytes)
        .map_err(|e| ConnectorError::Config(format!("{} is not a broker state file: {e}", path.display())))?;
    Ok(if is_tansu_alive(state.pid) { BrokerStatus::Running(state) } else { BrokerStatus::Stale(state) })
}

/// Stops the broker recorded in `data_dir` (SIGTERM, then SIGKILL after 10 s) and removes its
/// state file. Returns whether a running broker was stopped.
pub fn stop(data_dir: &Path) -> Result<bool, ConnectorError> {
    let state = match status(data_dir)? {
        BrokerStatus::NotRunning => return Ok(false),
        BrokerStatus::Stale(_) => {
            remove_state(data_dir)?;
            return Ok(false);
        }
        BrokerStatus::Running(state) => state,
    };
    signal(state.pid, "TERM")?;
    // Returns only once every thread of the broker has exited (its port and files are free).
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut killed = false;
    while is_tansu_alive(state.pid) {
        if !killed && Instant::now() >= deadline {
            warn!(pid = state.pid, "tansu ignored SIGTERM for 10 s; killing it");
            signal(state.pid, "KILL")?;
            killed = true;
        } else if killed && Instant::now() >= deadline + Duration::from_secs(10) {
            return Err(ConnectorError::Config(format!(
                "tansu (pid {}) did not exit after SIGKILL",
                state.pid
            )));
        }
        thread::sleep(Duration::from_millis(20));
    }
    remove_state(data_dir)?;
    Ok(true)
}

/// Creates `topic` with `partitions` partitions unless it exists, then waits until the broker's
/// metadata lists it. An existing topic with another partition count is an error.
pub fn create_topic(brokers: &[String], topic: &str, partitions: i32) -> Result<(), ConnectorError> {
    let rt = io_runtime()?;
    block_on_within(&rt, CALL_LIMIT, "creating a topic", async {
        let client = connect(brokers, crate::REQUEST_DEADLINE).await?;
        create_topic_with(&client, topic, partitions).await
    })
}

/// [`create_topic`] on an existing client.
pub async fn create_topic_with(
    client: &rskafka::client::Client,
    topic: &str,
    partitions: i32,
) -> Result<(), ConnectorError> {
    use rskafka::client::error::{Error, ProtocolError};
    // An existing topic is fine and asks nothing of the controller (which would log the
    // refusal as an error); two tasks creating it at once is fine too.
    let exists = client
        .list_topics()
        .await
        .map_err(|e| ConnectorError::kafka("listing topics", e))?
        .iter()
        .any(|t| t.name == topic);
    if !exists {
        let controller = client.controller_client().map_err(|e| ConnectorError::kafka("controller", e))?;
        match controller.create_topic(topic, partitions, 1, 5_000).await {
            Ok(()) => {}
            Err(Error::ServerError { protocol_error: ProtocolError::TopicAlreadyExists, .. }) => {}
            Err(e) => return Err(ConnectorError::kafka(format!("creating topic {topic}"), e)),
        }
    }
    let deadline = Instant::now() + crate::REQUEST_DEADLINE;
    loop {
        let topics = client.list_topics().await.map_err(|e| ConnectorError::kafka("listing topics", e))?;
        if let Some(t) = topics.iter().find(|t| t.name == topic) {
            if t.partitions.len() == usize::try_from(partitions).unwrap_or(0) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(ConnectorError::Config(format!(
                    "topic {topic} exists with {} partitions, not {partitions}",
                    t.partitions.len()
                )));
            }
        } else if Instant::now() >= deadline {
            return Err(ConnectorError::Config(format!("topic {topic} did not appear in the metadata")));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn free_port() -> Result<u16, ConnectorError> {
    let listener = TcpListener::bind("127.0.0.1:0")
        .map_err(|e| ConnectorError::io("binding 127.0.0.1:0 to pick a port", e))?;
    listener.local_addr().map(|a| a.port()).map_err(|e| ConnectorError::io("reading the picked port", e))
}

/// Whether `pid` is a tansu process with a thread still running; checking the name guards against
/// pid reuse. A process whose main thread has exited shows as a zombie while its other threads
/// still shut down (and hold the port and the data files), so every thread is checked: the
/// broker has exited only when none is left.
fn is_tansu_alive(pid: u32) -> bool {
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // Format: `pid (comm) state ...`; comm may contain spaces, so split at the last ')'.
    let Some((head, _)) = stat.rsplit_once(')') else {
        return false;
    };
    if !head.contains("tansu") {
        return false;
    }
    let running = |stat: &str| {
        stat.rsplit_once(')').is_some_and(|(_, tail)| !tail.trim_start().starts_with(['Z', 'X']))
    };
    match fs::read_dir(format!("/proc/{pid}/task")) {
        Ok(threads) => threads
            .filter_map(Result::ok)
            .any(|t| fs::read_to_string(t.path().join("stat")).is_ok_and(|s| running(&s))),
        Err(_) => running(&stat),
    }
}

/// Sends a signal with the shell's `kill` builtin (the workspace forbids `unsafe`, so no direct
/// `kill(2)`; the builtin needs no procps package).
fn signal(pid: u32, name: &str) -> Result<(), ConnectorError> {
    let status = Command::new("sh")
        .args(["-c", &format!("kill -{name} {pid}")])
        .stderr(Stdio::null())
        .status()
        .map_err(|e| ConnectorError::io("running kill", e))?;
    if !status.success() && is_tansu_alive(pid) {
        return Err(ConnectorError::Config(format!("could not send SIG{name} to pid {pid}")));
    }
    Ok(())
}

fn remove_state(data_dir: &Path) -> Result<(), ConnectorError> {
    let path = data_dir.join(STATE_FILE);
    match fs::remove_file(&path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(ConnectorError::io(format!("removing {}", path.display()), e)),
    }
}

/// The last `lines` lines of a log file (empty if unreadable).
pub fn log_tail(path: &Path, lines: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
