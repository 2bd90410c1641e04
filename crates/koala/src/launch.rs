//! Starting jobs locally: a coordinator in this process and worker processes beside it.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

use anyhow::Context;
use koala_coordinator::config::{ConfigError, ConfigSource};
use koala_coordinator::{JobConfig, JobRun, JobSummary, ProgressEvent, run_job};

use crate::human::human_bytes;
use crate::interrupt::{self, RunningJob};
use crate::progress_lines::summary_lines;
use crate::protocol_names::{drrs_schedule_of, parse_protocol};

/// `--ignore-interrupt` of the processes `koala run` starts: Ctrl-C (SIGINT, sent to the whole
/// terminal's process group) does not end them; the coordinator stops the job and then them.
pub fn ignore_interrupt() -> anyhow::Result<()> {
    let ignored = Arc::new(std::sync::atomic::AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGINT, ignored).context("ignoring Ctrl-C")?;
    Ok(())
}

/// Reads a config file and checks it whole — syntax, types, the query's parameters and the
/// config against the query's graph — before anything starts; every error names the file, the
/// line and column of the field at fault, the field and the fix.
pub fn load_config(path: &Path) -> anyhow::Result<JobConfig> {
    load_checked(path, true)
}

/// [`load_config`] for `koala warmup`, which writes the config's `warm_state` rather than
/// reading it: every check but the one that the snapshot is there.
pub fn load_config_to_warm(path: &Path) -> anyhow::Result<JobConfig> {
    load_checked(path, false)
}

fn load_checked(path: &Path, warm_state_written: bool) -> anyhow::Result<JobConfig> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading config {}", path.display()))?;
    let origin = path.display().to_string();
    let config = JobConfig::parse(&text, &origin)?;
    let source = ConfigSource::new(&origin, &text);
    let at = |field: &str, message: String| {
        source.place_error(ConfigError::Invalid { field: field.to_string(), message })
    };
    let query = crate::queries::find(&config.query).map_err(|e| at("query", e))?;
    // `[params]` checked where it stands in the file, so an error names its real line.
    query.check_params(&source, &text)?;
    let graph = query.build(&config.params_text()).map_err(|e| at("params", e))?;
    let mut checked = config.clone();
    if !warm_state_written {
        checked.warm_state = None;
    }
    checked.validate(&graph).map_err(|e| source.place_error(e))?;
    Ok(config)
}

/// `koala demo`. `shared`: the settings every run of a `koala compare` gets (partition policy,
/// cache size); a lone demo keeps the demo config's, except that DRRS runs with the uniform policy.
pub fn demo(
    duration_s: Option<u64>,
    quick: bool,
    output_dir: &Path,
    protocol: &str,
    shared: Option<crate::settings::SharedSettings>,
    http_port: Option<u16>,
) -> anyhow::Result<crate::compare::Outcome> {
    let mut config = crate::demo::config(duration_s, quick)?;
    config.coordinator.http_port = http_port;
    config.output_dir = output_dir.to_path_buf();
    config.protocol = parse_protocol(protocol)?;
    config.drrs.schedule = drrs_schedule_of(protocol);
    match config.protocol {
        // The Remote baseline keeps state on state servers (one, started with the workers), with
        // a client cache sized from the budget, as the other protocols' write-back cache.
        koala_protocol::Protocol::Remote => {
            config.state.backend = koala_protocol::StateBackendKind::Remote;
            config.state.cache_mb = None;
        }
        // DRRS runs with the uniform policy, as the paper's does (docs/protocols.md §11).
        koala_protocol::Protocol::Drrs => {
            config.partition_policy = koala_coordinator::config::PolicyName::Uniform
        }
        _ => {}
    }
    if let Some(shared) = shared {
        shared.apply(&mut config);
    }
    let run = crate::run_dir::run_id();
    let run_dir = crate::run_dir::create(output_dir, &run, &config)?;
    println!(
        "koala demo: {} with {} workers ({}; {}; {}); run {run} in {}",
        config.query,
        config.workers,
        crate::demo::describe(&config),
        config.protocol_label(),
        config.runtime.capacity_line(),
        run_dir.display()
    );
    let summary = run_locally(config, None, run)?;
    let (outcome, report) = crate::compare::outcome(&summary, &run_dir)?;
    crate::compare::print_outcome(&outcome, &report);
    let mut text = summary_lines(&summary).join("\n");
    text.push_str(&format!("\n\n{report}"));
    crate::run_dir::write_summary(&run_dir, &text);
    Ok(outcome)
}

/// `koala run <config>`, or `koala run --resume DIR` (a stopped job from its latest completed
/// checkpoint); `http_port` (`--http-port`) overrides `[coordinator] http_port`, `brokers`
/// (`--brokers`, `KOALA_BROKERS`) the Kafka bootstrap servers of `[params.kafka]`. The run's
/// report, plots and summary go to its own directory (`crate::run_dir`).
pub fn run_config(
    path: Option<&Path>,
    resume: Option<&Path>,
    http_port: Option<u16>,
    brokers: Option<&str>,
    tls: &crate::tls_setup::TlsArgs,
) -> anyhow::Result<JobSummary> {
    let (mut config, resume) = match (path, resume) {
        (Some(path), None) => (load_config(path)?, None),
        (None, Some(dir)) => {
            let (config, meta) = resume_point(dir)?;
            (config, Some(meta))
        }
        (Some(_), Some(_)) => anyhow::bail!(
            "koala run: give a config or --resume DIR, not both (a resumed job runs the config its checkpoint recorded)"
        ),
        (None, None) => {
            anyhow::bail!("koala run: give a job config, or --resume DIR to resume a stopped job")
        }
    };
    if http_port.is_some() {
        config.coordinator.http_port = http_port;
    }
    if let Some(brokers) = brokers {
        crate::kafka::override_brokers(&mut config, brokers)?;
    }
    if tls.files().is_on() {
        config.tls = Some(tls.files());
    }
    // A config the job cannot run with leaves no run directory behind.
    koala_coordinator::resolve(&config, &crate::queries::resolver())?;
    let out = config.output_dir.clone();
    let run = crate::run_dir::run_id();
    let run_dir = crate::run_dir::create(&out, &run, &config)?;
    println!("run {run}: its report, plots and summary go to {}", run_dir.display());
    let summary = run_locally(config, resume, run)?;
    let mut text = summary_lines(&summary).join("\n");
    // The plots and the summary of the run (demo and bench compute their own).
    match koala_coordinator::report::report(&summary.metrics_db, Some(&summary.run), &run_dir) {
        Ok(report) => {
            println!("{report}");
            text.push_str(&format!("\n\n{report}"));
        }
        Err(e) => crate::terminal::note(&format!("warning: could not write the report: {e}")),
    }
    crate::run_dir::write_summary(&run_dir, &text);
    Ok(summary)
}

/// `koala coordinator`: only the coordinator; workers are started by someone else.
pub fn coordinator(
    config: &Path,
    listen: &str,
    address_file: Option<&Path>,
    http_port: Option<u16>,
    tls_flags: &crate::tls_setup::TlsArgs,
) -> anyhow::Result<()> {
    let mut config = load_config(config)?;
    let tls = crate::tls_setup::of_job(&config, tls_flags)?.map(|(tls, _)| tls);
    if http_port.is_some() {
        config.coordinator.http_port = http_port;
    }
    koala_coordinator::resolve(&config, &crate::queries::resolver())?;
    anyhow::ensure!(
        config.state.servers_to_start() == 0,
        "state.server_addresses: `koala coordinator` starts no state servers; start them with `koala state-server` and list their addresses there (or use `koala run`, which starts [state] servers)"
    );
    let token = crate::token::find(config.coordinator.token_file.as_deref(), "coordinator.token_file")?;
    let listener = TcpListener::bind(listen).with_context(|| format!("binding {listen}"))?;
    let addr = listener.local_addr()?.to_string();
    if let Some(f) = address_file {
        std::fs::write(f, &addr).with_context(|| format!("writing {}", f.display()))?;
    }
    let (http, dashboard) = bind_http(&config, listener.local_addr()?.ip(), tls.is_some())?;
    // One line: scripts read the first line and may close the pipe after it.
    println!("coordinator listening on {addr}; waiting for {} workers; {dashboard}", config.workers);
    let run = crate::run_dir::run_id();
    interrupt::set_job(Some(running_job(&config, &run)));
    let summary = run_job(
        listener,
        JobRun {
            config,
            resolver: crate::queries::resolver(),
            run,
            progress: None,
            stop: Some(interrupt::stop_flag()?),
            http: Some(http),
            resume: None,
            token,
            tls,
        },
    )?;
    interrupt::set_job(None);
    crate::terminal::print_if_read(&summary_lines(&summary));
    Ok(())
}

/// Binds the HTTP API of a job's coordinator on `host` (the control port's) at `[coordinator]
/// http_port (0 or unset: any free port); returns it and the line that tells its URL.
fn bind_http(config: &JobConfig, host: std::net::IpAddr, tls: bool) -> anyhow::Result<(TcpListener, String)> {
    let port = config.coordinator.http_port.unwrap_or(0);
    let http = TcpListener::bind((host, port)).with_context(|| {
        format!("binding the HTTP API to {host}:{port} ([coordinator] http_port, --http-port)")
    })?;
    let mut line = format!(
        "dashboard at {}://{}/ (JSON API: /api/job, /api/metrics, /api/reconfigurations; Prometheus: /metrics)",
        if tls { "https" } else { "http" },
        http.local_addr()?
    );
    if !koala_types::handshake::is_loopback(host) {
        line.push_str(
            "; not on loopback, so every route needs the job token: header `Authorization: Bearer <token>`, \
             or open the page as /?token=<token>",
        );
    }
    Ok((http, line))
}

/// What a second Ctrl-C says about the job `config` runs as `run`.
fn running_job(config: &JobConfig, run: &str) -> RunningJob {
    RunningJob {
        run: run.to_string(),
        metrics_db: config.metrics_path(),
        output_dir: config.output_dir.clone(),
        checkpoints: config.checkpoint_interval_ms.is_some(),
    }
}

/// Kills worker processes left behind when the job ends (normally they exit on `Shutdown`).
/// Tracked by [`interrupt`], which kills them at a forced exit.
struct WorkerProcesses(Vec<Arc<Mutex<Child>>>);

impl Drop for WorkerProcesses {
    fn drop(&mut self) {
        for child in &self.0 {
            let Ok(mut child) = child.lock() else { continue };
            if matches!(child.try_wait(), Ok(None)) {
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
                while std::time::Instant::now() < deadline && matches!(child.try_wait(), Ok(None)) {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                let _ = child.kill();
            }
            let _ = child.wait();
        }
    }
}

/// The latest completed checkpoint of the job whose output directory is `dir`, and its config;
/// refused if the job's latest run finished (`crate::run_dir::refuse_finished`).
fn resume_point(dir: &Path) -> anyhow::Result<(JobConfig, koala_coordinator::resume::CheckpointMetadata)> {
    let meta = koala_coordinator::resume::latest(&dir.join("checkpoints"))?;
    let config = JobConfig::parse(&meta.config, "the checkpoint's recorded config")?;
    crate::run_dir::refuse_finished(dir, &config.metrics_path())?;
    let same = |a: &Path, b: &Path| match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    };
    anyhow::ensure!(
        same(&config.output_dir, dir),
        "--resume {}: its checkpoints belong to a job whose output_dir is {} (tasks and sinks find \
         their files there); resume with that directory",
        dir.display(),
        config.output_dir.display()
    );
    println!(
        "resuming {} from checkpoint {} (taken {:.1} s into the job)",
        dir.display(),
        meta.point.id,
        meta.elapsed_ms as f64 / 1000.0
    );
    Ok((config, meta))
}

/// Runs a job with a coordinator in this process and `config.workers` worker processes (and
/// the state servers of a remote backend without external addresses, `[state] servers`).
pub fn run_job_locally(config: JobConfig) -> anyhow::Result<JobSummary> {
    run_locally(config, None, crate::run_dir::run_id())
}

/// [`run_job_locally`] as run `run`, or resumed from a checkpoint (its sink files and
/// checkpoints stay).
fn run_locally(
    mut config: JobConfig,
    resume: Option<koala_coordinator::resume::CheckpointMetadata>,
    run: String,
) -> anyhow::Result<JobSummary> {
    let resolver = crate::queries::resolver();
    koala_coordinator::resolve(&config, &resolver)?;
    let stop = interrupt::stop_flag()?;
    if config.duration_s.is_none()
        && crate::queries::find(&config.query).is_ok_and(|q| q.unbounded(&config.params))
    {
        println!(
            "this job's input has no end (no `records` or `until_end` in [params], no `duration_s`): \
             Ctrl-C or SIGTERM ends its sources, lets it drain and prints its summary (a second one stops it at once, without draining)"
        );
    }
    if let Some(note) = crate::queries::find(&config.query).ok().and_then(|q| q.input_note(&config.params)) {
        println!("{note}");
    }
    let out = config.output_dir.clone();
    std::fs::create_dir_all(&out).with_context(|| format!("creating output dir {}", out.display()))?;
    match resume {
        None => clear_previous_output(&out)?,
        // The stopped run's worker state is not the checkpoint's: tasks restore from it.
        Some(_) if out.join("state").exists() => std::fs::remove_dir_all(out.join("state"))
            .with_context(|| format!("clearing {}", out.join("state").display()))?,
        Some(_) => {}
    }
    let exe = std::env::current_exe().context("locating the koala binary")?;
    // Loopback, so not required, but presented by every worker and checked by every listener of
    // the job (the state servers too): one is generated unless given.
    let token = crate::token::for_local_run(config.coordinator.token_file.as_deref())?;
    let tls = crate::tls_setup::of_job(&config, &Default::default())?;
    let tls_args = tls.as_ref().map(|(_, files)| crate::tls_setup::child_args(files)).unwrap_or_default();
    // Stopped (after the workers) when the job ends: dropped last.
    let _servers = match config.state.servers_to_start() {
        0 => None,
        n => {
            let (servers, addrs) = crate::state_servers::start(&exe, &out, n, &token, &tls_args)?;
            println!("state servers at {}", addrs.join(", "));
            config.state.server_addresses = addrs;
            config.state.servers = None;
            Some(servers)
        }
    };
    let listener = TcpListener::bind("127.0.0.1:0").context("binding the coordinator")?;
    let addr = listener.local_addr()?.to_string();
    println!("coordinator at {addr} (koala rescale|rebalance|migrate --coordinator {addr} ...)");
    let (http, dashboard) = bind_http(&config, listener.local_addr()?.ip(), tls.is_some())?;
    println!("{dashboard}");
    let mut workers = WorkerProcesses(Vec::new());
    // Named after the id each worker gets when it registers (`koala worker --data-dir`'s `{id}`),
    // so `state/worker-1` is the worker messages call worker1.
    let data_dir = out.join("state").join(format!("worker-{}", koala_runtime::WORKER_ID_PLACEHOLDER));
    for i in 0..config.workers {
        let child = Command::new(&exe)
            .arg("worker")
            .arg("--coordinator")
            .arg(&addr)
            .arg("--data-dir")
            .arg(&data_dir)
            .args(
                config.warm_state.iter().flat_map(|w| [std::ffi::OsStr::new("--warm-state"), w.as_os_str()]),
            )
            .env("KOALA_LOG", std::env::var("KOALA_LOG").unwrap_or_else(|_| "warn".into()))
            .env(crate::token::ENV, token.expose())
            .args(&tls_args)
            // A Ctrl-C at the terminal reaches the whole process group: the workers ignore it and
            // end when the coordinator, which stops the job cleanly, tells them to.
            .arg("--ignore-interrupt")
            .stdin(Stdio::null())
            .spawn()
            .with_context(|| format!("starting worker process {} of {}", i + 1, config.workers))?;
        workers.0.push(interrupt::track(child));
    }
    let (tx, rx) = crossbeam_channel::unbounded();
    interrupt::set_job(Some(running_job(&config, &run)));
    let job = JobRun {
        config: config.clone(),
        resolver,
        run,
        progress: Some(tx),
        stop: Some(stop),
        http: Some(http),
        resume,
        token: Some(token),
        tls: tls.map(|(tls, _)| tls),
    };
    let handle = std::thread::spawn(move || run_job(listener, job));
    // Progress lines come out once every task reported their second (about 2 s late); a
    // reconfiguration's lines wait for them, so both are printed in the order of one clock, the
    // report's (seconds since the run's start second).
    let mut lines = crate::progress_lines::ProgressLines::default();
    let mut memory = koala_coordinator::progress::MemoryNotes::default();
    for event in rx.iter() {
        match event {
            ProgressEvent::Second(p) => lines.second(&p),
            ProgressEvent::ReconfigurationStarted { epoch, second, description } => {
                lines.started(epoch, second, format!("reconfiguration {epoch} started: {description}"));
            }
            ProgressEvent::ReconfigurationCompleted { epoch, second, pause_ms, duration_ms, lazy } => {
                lines.completed(epoch, second, move |moved| {
                    if lazy {
                        format!(
                            "reconfiguration {epoch} completed in {duration_ms} ms (ownership moved, upstreams paused \
                             {pause_ms} ms; {} of state moved so far); the rest follows on first access",
                            human_bytes(moved)
                        )
                    } else {
                        format!(
                            "reconfiguration {epoch} completed in {duration_ms} ms: {} of state moved, upstreams \
                             paused {pause_ms} ms",
                            human_bytes(moved)
                        )
                    }
                });
            }
            ProgressEvent::Recovered { second, lost, checkpoint, ms } => {
                lines.at(second, crate::progress_lines::recovery_line(&lost, checkpoint, ms));
            }
            ProgressEvent::ReconfigurationRejected { error } => {
                println!("[reconfiguration] rejected: {error}")
            }
            ProgressEvent::AutoscaleDecision { second, description } => {
                lines.at(second, format!("autoscale: {description}"));
            }
            ProgressEvent::Memory { worker, report } => {
                if let Some(line) = memory.note(worker, &report) {
                    println!("{line}");
                }
            }
        }
    }
    lines.flush(u64::MAX);
    let summary = handle.join().map_err(|_| anyhow::anyhow!("the coordinator thread panicked"));
    drop(workers);
    interrupt::set_job(None);
    let summary = summary??;
    crate::progress_lines::print_summary(&summary);
    Ok(summary)
}

/// Removes sink files and worker state of an earlier run in the same output directory.
fn clear_previous_output(out: &Path) -> anyhow::Result<()> {
    let state = out.join("state");
    if state.exists() {
        std::fs::remove_dir_all(&state).with_context(|| format!("clearing {}", state.display()))?;
    }
    for entry in std::fs::read_dir(out).with_context(|| format!("listing {}", out.display()))? {
        let path: PathBuf = entry?.path();
        if path.extension().is_some_and(|e| e == "jsonl") {
            std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
        }
    }
    Ok(())
}

/// `koala rescale|rebalance|migrate`: submits a request to a running coordinator.
pub fn submit(
    coordinator: &str,
    token_file: Option<&Path>,
    tls_ca: Option<&Path>,
    request: koala_protocol::ReconfigRequest,
) -> anyhow::Result<()> {
    let token = crate::token::find(token_file, "--token-file")?;
    let tls = crate::tls_setup::TlsArgs { ca: tls_ca.map(Path::to_path_buf), ..Default::default() }.load()?;
    let reply = koala_coordinator::control::submit(coordinator, request, token.as_ref(), tls.as_ref())
        .with_context(|| format!("talking to the coordinator at {coordinator}"))?;
    let line = koala_coordinator::control::reply_line(&reply).map_err(anyhow::Error::msg)?;
    println!("{line}");
    Ok(())
}

/// Parses `BUCKETS:TASK` (`3,4,10-12:1`) of `--move`, as `POST /api/rebalance` does.
pub fn parse_move(text: &str) -> anyhow::Result<(Vec<u16>, u32)> {
    koala_coordinator::control::parse_move(text, "--move").map_err(anyhow::Error::msg)
}
