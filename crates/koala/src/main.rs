//! `koala`: run stateful dataflow jobs that can be reconfigured while they run.

/// `std::println!` for this crate, declared before its modules so that every one of them uses
/// it: it writes through [`terminal::write_stdout`], which ends the command quietly when the
/// standard output closed instead of panicking.
macro_rules! println {
    () => {
        $crate::terminal::write_stdout(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::terminal::write_stdout(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `std::print!` for this crate, as [`println!`].
macro_rules! print {
    ($($arg:tt)*) => {
        $crate::terminal::write_stdout(format_args!($($arg)*))
    };
}

mod bench;
mod compare;
mod demo;
mod experiment;
mod human;
mod interrupt;
mod kafka;
mod launch;
mod logging;
mod progress_lines;
mod protocol_names;
mod queries;
mod run_dir;
mod settings;
mod state_servers;
mod terminal;
mod tls_setup;
mod token;
mod warmup;

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};
use koala_coordinator::config::PolicyName;

/// mimalloc instead of glibc's allocator for every koala process: the record path allocates per
/// batch and per message, and glibc's `free`/`malloc_consolidate` took 13–18 % of an aggregate
/// task (`perf`). `koala bench --cache-mb 256`, binaries back to back: 9.2–9.6 instead of
/// 10.6–11.0 CPU-seconds for 10 M records. Built without transparent huge pages (feature
/// `no_thp`), whose first-touch zeroing made 12–15 ms batches (docs/architecture.md §11).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// koala-rs: a distributed stateful stream processor with non-disruptive reconfiguration.
#[derive(Parser)]
#[command(version, about, long_about = None, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the demo job locally: a coordinator and 2 worker processes, a keyed running aggregate
    /// over the built-in generator for about a minute (20 000 records/s per aggregate task,
    /// emulated), overloaded by a rate surge in the middle and scaled out from 2 to 4 tasks during
    /// it. Prints one progress line per second, then the run's report summary; writes the metrics
    /// DB and PNG plots.
    Demo {
        /// Seconds the sources run (default 60, or 30 with --quick; the surge is at 20–45 s, the
        /// scale-out at 25 s, and a shorter run ends inside the surge).
        #[arg(long)]
        duration_s: Option<u64>,
        /// The same run in half the time: every rate step and the scale-out at half its time,
        /// 30 s by default.
        #[arg(long)]
        quick: bool,
        /// Where metrics and worker state go; the run's plots and report go to its own
        /// directory under it, `runs/<run id>/` (`latest` points at it).
        #[arg(long, default_value = "koala-out")]
        output_dir: PathBuf,
        /// Reconfiguration protocol: koala, stop-and-restart, remote or drrs (with the uniform
        /// partition policy; drrs-overlapping runs it with the original DRRS's schedule).
        #[arg(long, default_value = "koala")]
        protocol: String,
        /// Port of the dashboard and HTTP API on 127.0.0.1 (default: any free port; the URL is
        /// printed at the start).
        #[arg(long)]
        http_port: Option<u16>,
    },
    /// Run the demo workload once per protocol (`--protocols`) and print a table: state
    /// moved on demand, in the background and eagerly, recovery time on the end-to-end p99 (and
    /// on the median and source lag beside it), the drain limit no protocol can beat, peak
    /// end-to-end latency p99, peak lag, lag p99 over the last 5 s,
    /// worst throughput dip against the offered rate, per-batch latency before and after, pause
    /// (input paused, every protocol), the most records a task held.
    Compare {
        /// Seconds the sources of each run run (default 60, or 30 with --quick).
        #[arg(long)]
        duration_s: Option<u64>,
        /// Each run in half the time, as `koala demo --quick`.
        #[arg(long)]
        quick: bool,
        /// Partition policy of every run (consistent, uniform or interleaved; default: uniform when
        /// drrs is among --protocols, which runs only with it, else the demo config's, consistent).
        /// Every run also gets the same state cache size.
        #[arg(long)]
        partition_policy: Option<String>,
        /// Where each run's metrics go (`<dir>/<protocol>`; plots in `<dir>/<protocol>/runs/<run id>/`).
        #[arg(long, default_value = "koala-out/compare")]
        output_dir: PathBuf,
        /// Protocols to run, in order: koala, stop-and-restart, remote (the Remote baseline:
        /// stop-and-restart over a state server), drrs (only with the uniform partition policy;
        /// the Koala authors' port, the paper's baseline), drrs-overlapping (DRRS with the
        /// original DRRS's schedule: single-pair subscales, about two per pair, several at once; the
        /// paper's Figure 16 compares the two).
        #[arg(long, value_delimiter = ',', default_value = "koala,stop-and-restart,remote,drrs")]
        protocols: Vec<String>,
    },
    /// Run a job from a TOML config with local worker processes (see examples/*.toml). With
    /// `[autoscale] enabled = true` the coordinator rescales (and rebalances a hot task of) one
    /// stateful operator by itself: fields `operator`, `window_s` (10), `target_latency_ms` (200),
    /// `target_lag_ms`, `target_utilisation` (0.8), `min_parallelism` (1), `max_parallelism` (8),
    /// `scale_in_utilisation` (0.3), `scale_in_windows` (3), `cooldown_s` (5), `hot_factor` (2);
    /// docs/architecture.md §7, "The reconfiguration policy". Watchdogs under `[runtime]`, each
    /// failing the job with a non-zero exit that names who it waited for: `heartbeat_timeout_s`
    /// (10; a silent worker), `reconfiguration_timeout_s` (120; a reconfiguration without
    /// progress), `end_timeout_s` (60; a job whose input ended but that gets no closer to its end:
    /// every unfinished task and what it still waits for).
    #[command(after_help = queries::help())]
    Run {
        /// The job config (omit it with --resume).
        config: Option<PathBuf>,
        /// Resume a stopped job (its coordinator killed, or every process) from its latest
        /// completed checkpoint: DIR is the job's output_dir (checkpoints under DIR/checkpoints);
        /// the job runs the config the checkpoint recorded, sources rewind, and JSON-lines sinks
        /// keep their committed parts.
        #[arg(long, value_name = "DIR")]
        resume: Option<PathBuf>,
        /// Port of the dashboard and HTTP API on 127.0.0.1 (overrides `[coordinator] http_port`;
        /// default: any free port; the URL is printed at the start).
        #[arg(long)]
        http_port: Option<u16>,
        /// Kafka bootstrap servers, `host:port[,host:port…]`, replacing `[params.kafka] brokers`
        /// of a job that reads or writes Kafka (`koala broker start` prints the address). The
        /// environment variable KOALA_BROKERS does the same when the flag is not given.
        #[arg(long, value_name = "HOST:PORT")]
        brokers: Option<String>,
        /// TLS for every process of the job (replaces the config's `[tls]`): the certificate
        /// must name 127.0.0.1, where `koala run` starts everything; the workers and state
        /// servers get the same files.
        #[command(flatten)]
        tls: tls_setup::TlsArgs,
    },
    /// Run only the coordinator of a job; workers join with `koala worker --coordinator ADDR`
    /// (docs/deploy.md: several hosts). Off loopback, every connection and every POST to the API
    /// must present the job token: `KOALA_TOKEN`, or `[coordinator] token_file`. With TLS
    /// (`[tls]` or --tls-cert/--tls-key/--tls-ca) the control port and the API accept only TLS.
    Coordinator {
        /// The job config.
        #[arg(long)]
        config: PathBuf,
        /// Control address to listen on (port 0 = any free port).
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: String,
        /// Write the address actually bound to this file (for scripts that start workers).
        #[arg(long)]
        address_file: Option<PathBuf>,
        /// Port of the dashboard and HTTP API, on the --listen host (overrides `[coordinator]
        /// http_port`; default: any free port; the URL is printed at the start).
        #[arg(long)]
        http_port: Option<u16>,
        /// TLS (replaces the config's `[tls]`).
        #[command(flatten)]
        tls: tls_setup::TlsArgs,
    },
    /// Run a state server for `[state] backend = "remote"` (the Remote baseline): an fjall
    /// database with one key space per operator, shared by all its tasks, over framed TCP. Runs
    /// until killed; prints `state server listening on ADDR` first. `koala run` starts the ones
    /// a job needs; give addresses of others with `[state] server_addresses`. Off loopback,
    /// every connection must present the job token (the workers present theirs): `KOALA_TOKEN`,
    /// or --token-file; without one such a server refuses to start.
    StateServer {
        /// Address to listen on (port 0 = any free port).
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: String,
        /// Where the server keeps its database.
        #[arg(long, default_value = "koala-out/state/server")]
        data_dir: PathBuf,
        /// A file holding the job token (the environment variable KOALA_TOKEN takes precedence):
        /// required from every client when --listen is not loopback; a wrong one is refused
        /// everywhere.
        #[arg(long)]
        token_file: Option<PathBuf>,
        /// TLS: with it the server accepts only TLS.
        #[command(flatten)]
        tls: tls_setup::TlsArgs,
        /// Ignore Ctrl-C (`koala run` passes it: the job drains before its servers stop).
        #[arg(long, hide = true)]
        ignore_interrupt: bool,
    },
    /// Run a worker process that hosts tasks placed on it by a coordinator.
    Worker {
        /// The coordinator's control address, `host:port` (`coordinator listening on ADDR`, not
        /// the dashboard's).
        #[arg(long)]
        coordinator: String,
        /// Where this worker keeps its state stores. `{id}` in it becomes the number of the id
        /// the coordinator assigns when the worker registers (ids follow registration order), so
        /// the directory of the worker messages call worker1 is `worker-1`, and workers sharing
        /// a host and a default never share a directory.
        #[arg(long, default_value = "koala-out/state/worker-{id}")]
        data_dir: PathBuf,
        /// Host the data plane listens on (the port is chosen by the OS).
        #[arg(long, default_value = "127.0.0.1")]
        listen_host: String,
        /// The host other workers reach this worker's data port at (default: --listen-host, or,
        /// when that is 0.0.0.0, this host's address on its route to the coordinator).
        #[arg(long)]
        advertise_host: Option<String>,
        /// A file holding the job token (the environment variable KOALA_TOKEN takes precedence):
        /// presented to the coordinator and other workers; required by this worker's data port
        /// when --listen-host is not loopback.
        #[arg(long)]
        token_file: Option<PathBuf>,
        /// Warm state (`koala warmup`) the worker's stateful tasks load their buckets from before
        /// the job starts (`koala run` passes the config's `warm_state`).
        #[arg(long)]
        warm_state: Option<PathBuf>,
        /// TLS: the data port accepts only TLS, and the coordinator, other workers and state
        /// servers must present certificates of the CA (all three flags, as the job's other hosts).
        #[command(flatten)]
        tls: tls_setup::TlsArgs,
        /// Ignore Ctrl-C (`koala run` passes it: its coordinator stops the job cleanly, then the
        /// workers).
        #[arg(long, hide = true)]
        ignore_interrupt: bool,
    },
    /// Write warm state for a job: N keys of each of its query's stateful operators with values
    /// padded to a size, straight into a snapshot per operator (no records processed), for
    /// `warm_state = "<out>"` in the config. Knows the keyed aggregate, Nexmark Q3, Q4, Q4*, Q6,
    /// Q6* and Twitch, Taxi, Azure, Borg (not windowed or timer operators).
    Warmup {
        /// The job config (its query, `[params]` and num_buckets).
        #[arg(long, required_unless_present = "query")]
        config: Option<PathBuf>,
        /// The query, with its default parameters and num_buckets (instead of --config).
        #[arg(long, conflicts_with = "config")]
        query: Option<String>,
        /// Warm keys (0..N: the query's first N keys).
        #[arg(long)]
        keys: u64,
        /// Bytes of padding per value (the paper's Q6* uses 2048); give the job the same
        /// `state_padding_bytes`, or each key it touches changes size.
        #[arg(long, default_value_t = 2048)]
        value_bytes: usize,
        /// Where the snapshots go (must not hold them).
        #[arg(long)]
        out: PathBuf,
    },
    /// Measure the keyed running aggregate at full speed (2 workers, discarding sink): steady
    /// records/s, the first vs the last 10 % of the run, and p99 per-batch latency.
    Bench(bench::BenchArgs),
    /// Make TLS certificates for a job: a self-signed CA (DIR/ca.pem, its key DIR/ca.key) and,
    /// per host, a certificate naming it (an IP address or a DNS name) signed by the CA
    /// (DIR/HOST.pem, DIR/HOST.key); prints the `[tls]` lines and the flags to use on each host.
    /// Every process gets ca.pem; each host its own certificate and key. Keep ca.key off the
    /// job's hosts. Refuses a DIR that already holds a CA.
    Certs {
        /// The hosts, comma-separated, as peers dial them: e.g. 10.0.0.1,10.0.0.2,localhost.
        #[arg(long, value_delimiter = ',', required = true)]
        hosts: Vec<String>,
        /// Where the files go (created).
        #[arg(long, default_value = "koala-certs")]
        out: PathBuf,
    },
    /// Change the number of tasks of an operator of a running job (scale-out or scale-in).
    Rescale {
        /// The coordinator's control address: `koala run` prints it as `coordinator at ADDR`
        /// (not the dashboard's address, which is the HTTP API).
        #[arg(long)]
        coordinator: String,
        /// A file holding the job token, if the coordinator is not on loopback (KOALA_TOKEN
        /// takes precedence).
        #[arg(long)]
        token_file: Option<PathBuf>,
        /// The job's CA certificate (PEM), if the job runs TLS: the control port's certificate
        /// must be signed by it for the host in --coordinator.
        #[arg(long, value_name = "PEM")]
        tls_ca: Option<PathBuf>,
        /// Operator name.
        #[arg(long)]
        operator: String,
        /// New number of tasks.
        #[arg(long)]
        parallelism: u32,
    },
    /// Move buckets of a stateful operator between its tasks in a running job.
    Rebalance {
        /// The coordinator's control address (`coordinator at ADDR`, not the dashboard's).
        #[arg(long)]
        coordinator: String,
        /// A file holding the job token, if the coordinator is not on loopback (KOALA_TOKEN
        /// takes precedence).
        #[arg(long)]
        token_file: Option<PathBuf>,
        /// The job's CA certificate (PEM), if the job runs TLS: the control port's certificate
        /// must be signed by it for the host in --coordinator.
        #[arg(long, value_name = "PEM")]
        tls_ca: Option<PathBuf>,
        /// Operator name.
        #[arg(long)]
        operator: String,
        /// `BUCKETS:TASK`, e.g. `3,4,10-12:1` (buckets 3, 4, 10, 11, 12 go to task 1); repeatable.
        #[arg(long = "move", required = true)]
        moves: Vec<String>,
    },
    /// Move one task of a running job to another worker.
    Migrate {
        /// The coordinator's control address (`coordinator at ADDR`, not the dashboard's).
        #[arg(long)]
        coordinator: String,
        /// A file holding the job token, if the coordinator is not on loopback (KOALA_TOKEN
        /// takes precedence).
        #[arg(long)]
        token_file: Option<PathBuf>,
        /// The job's CA certificate (PEM), if the job runs TLS: the control port's certificate
        /// must be signed by it for the host in --coordinator.
        #[arg(long, value_name = "PEM")]
        tls_ca: Option<PathBuf>,
        /// Operator name.
        #[arg(long)]
        operator: String,
        /// Task index.
        #[arg(long)]
        task: u32,
        /// Destination worker id.
        #[arg(long)]
        worker: u32,
    },
    /// Run the tansu Kafka-protocol broker on 127.0.0.1 (installed with cargo on first use).
    Broker {
        #[command(subcommand)]
        action: kafka::BrokerAction,
    },
    /// Write Nexmark person / auction / bid topics to a Kafka broker at a scheduled rate.
    Produce(kafka::ProduceArgs),
    /// Run an experiment of the paper's evaluation (§5, Appendix D), one command each: `koala
    /// experiment --list` names them with their figures, protocols and durations. Each writes,
    /// into --out, every run's metrics and report, a CSV of every run's seconds and one of the
    /// table, overlay PNGs and a page (index.html) with the settings: the capacity emulation,
    /// the partition policy and each run's protocol knobs. EXPERIMENTS.md has the measured results.
    Experiment {
        /// The experiment (`--list` names them).
        #[arg(required_unless_present = "list")]
        name: Option<String>,
        /// List the experiments: figure, what each shows, protocols, quick and full durations.
        #[arg(long)]
        list: bool,
        /// The short variant: at most about 5 minutes on a 2-core machine (each names what it cuts).
        #[arg(long, conflicts_with = "smoke")]
        quick: bool,
        /// A few seconds per run, for the test suite: checks the machinery, not the paper's claims.
        #[arg(long)]
        smoke: bool,
        /// Where the warm state, each run and the results go (default: koala-out/experiment-<name>).
        #[arg(long, alias = "output-dir")]
        out: Option<PathBuf>,
        /// Protocols to run, in order (koala, stop-and-restart, remote, drrs, drrs-overlapping;
        /// default: the experiment's own, `--list` shows them).
        #[arg(long, value_delimiter = ',')]
        protocols: Option<Vec<String>>,
        /// Partition policy of every run (consistent, uniform or interleaved; default: uniform
        /// when drrs is among the protocols, which runs only with it, else interleaved).
        #[arg(long)]
        partition_policy: Option<String>,
    },
    /// Print the per-second table and summary of a run from a metrics DB and write its PNG plots
    /// and report.html, or list the runs it holds (`--list`). The summary starts with how the run
    /// ended: finished, interrupted (stopped early: its numbers cover part of its input), failed,
    /// still running, or killed (no end recorded).
    Report {
        /// The metrics database (`<output_dir>/metrics.db`), or the job's output_dir.
        #[arg(default_value = "koala-out")]
        db: PathBuf,
        /// List the runs: id, start (UTC), status, how long each ran, query, protocol, report.
        #[arg(long, conflicts_with_all = ["run", "out"])]
        list: bool,
        /// Which run (default: the latest; `--list` names them).
        #[arg(long)]
        run: Option<String>,
        /// Where the plots and report.html go (default: the run's directory,
        /// `<output_dir>/runs/<run>/`).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// List the queries a config can name, one line each; with a NAME, that query's operators
    /// (the names [parallelism], rescale, rebalance and migrate take), its example config and the
    /// [params] it reads with their defaults.
    Queries {
        /// The query to describe.
        name: Option<String>,
        /// Describe every query (operators, example, parameters).
        #[arg(long, conflicts_with = "name")]
        all: bool,
    },
}

fn main() {
    let cli = Cli::parse();
    let default_level = match cli.command {
        Command::Worker { .. } | Command::Coordinator { .. } | Command::StateServer { .. } => "info",
        Command::Rescale { .. } | Command::Rebalance { .. } | Command::Migrate { .. } => "error",
        _ => "warn",
    };
    logging::init(default_level);
    let result = run(cli.command);
    // A second Ctrl-C is ending the process on the signal thread: whatever the job's end looks
    // like from here (its workers killed), that thread says what happened and exits 130.
    while interrupt::forcing() {
        std::thread::park();
    }
    // A closed standard output stopped the command (and its job, cleanly): exit as a process
    // killed by SIGPIPE would, without an error of our own (there is no one to read it).
    if terminal::stdout_closed() {
        std::process::exit(terminal::CLOSED_OUTPUT_EXIT);
    }
    if let Err(e) = result {
        terminal::note(&format!("error: {e:#}"));
        std::process::exit(1);
    }
}

fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Demo { duration_s, quick, output_dir, protocol, http_port } => {
            launch::demo(duration_s, quick, &output_dir, &protocol, None, http_port).map(|_| ())
        }
        Command::Compare { duration_s, quick, output_dir, protocols, partition_policy } => {
            let parsed = protocols
                .iter()
                .map(|p| protocol_names::parse_protocol_flag(p, "--protocols"))
                .collect::<anyhow::Result<Vec<_>>>()?;
            let requested = partition_policy.as_deref().map(settings::parse_policy).transpose()?;
            // The demo config's policy (consistent) unless DRRS is among the runs.
            let demo = demo::config(duration_s, quick)?;
            let workers = demo.workers;
            let shared =
                settings::SharedSettings::choose(&parsed, requested, PolicyName::Consistent, workers)?;
            println!("koala compare: {}; {}", demo::describe(&demo), shared.line());
            let drrs = settings::drrs_line(&protocols);
            if let Some(line) = &drrs {
                println!("{line}");
            }
            let mut outcomes = Vec::new();
            for protocol in &protocols {
                outcomes.push(launch::demo(
                    duration_s,
                    quick,
                    &output_dir.join(protocol),
                    protocol,
                    Some(shared),
                    None,
                )?);
            }
            println!();
            println!("{}", shared.line());
            if let Some(line) = &drrs {
                println!("{line}");
            }
            compare::print_table(&outcomes);
            Ok(())
        }
        Command::Run { config, resume, http_port, brokers, tls } => {
            let brokers =
                brokers.or_else(|| std::env::var(kafka::BROKERS_ENV).ok().filter(|b| !b.trim().is_empty()));
            launch::run_config(config.as_deref(), resume.as_deref(), http_port, brokers.as_deref(), &tls)
                .map(|_| ())
        }
        Command::Coordinator { config, listen, address_file, http_port, tls } => {
            launch::coordinator(&config, &listen, address_file.as_deref(), http_port, &tls)
        }
        Command::StateServer { listen, data_dir, token_file, tls, ignore_interrupt } => {
            if ignore_interrupt {
                launch::ignore_interrupt()?;
            }
            let token = token::find(token_file.as_deref(), "--token-file")?;
            state_servers::state_server(&listen, &data_dir, token, tls.load()?)
        }
        Command::Certs { hosts, out } => tls_setup::certs_command(&hosts, &out),
        Command::Worker {
            coordinator,
            data_dir,
            listen_host,
            advertise_host,
            token_file,
            warm_state,
            tls,
            ignore_interrupt,
        } => {
            if ignore_interrupt {
                launch::ignore_interrupt()?;
            }
            koala_runtime::run_worker(koala_runtime::WorkerOptions {
                coordinator,
                data_dir,
                listen_host,
                advertise_host,
                token: token::find(token_file.as_deref(), "--token-file")?,
                resolver: queries::resolver(),
                warm_state,
                tls: tls.load()?,
            })
            .context("worker stopped")
        }
        Command::Bench(args) => args.run().map(|_| ()),
        Command::Warmup { config, query, keys, value_bytes, out } => {
            let (query, params, num_buckets) = match (config, query) {
                (Some(path), _) => {
                    let config = launch::load_config_to_warm(&path)?;
                    let params = config.params_text();
                    (config.query, params, config.num_buckets)
                }
                (None, Some(query)) => (query, String::new(), koala_types::DEFAULT_NUM_BUCKETS),
                (None, None) => anyhow::bail!("give --config <job.toml> or --query <name>"),
            };
            let started = std::time::Instant::now();
            let written = warmup::warmup(&query, &params, num_buckets, keys, value_bytes, &out)?;
            let secs = started.elapsed().as_secs_f64();
            let total: u64 = written.iter().map(|w| w.bytes).sum();
            for w in &written {
                println!(
                    "warm state of {:?}: {} entries, {} in {}",
                    w.operator,
                    w.entries,
                    human::human_bytes(w.bytes),
                    out.join(w.operator).display()
                );
            }
            println!(
                "warm state: {keys} keys, {} in {secs:.1} s; add `warm_state = {:?}` to the config",
                human::human_bytes(total),
                out.display()
            );
            if let Some(note) = warmup::padding_note(&params, value_bytes) {
                println!("{note}");
            }
            Ok(())
        }
        Command::Rescale { coordinator, token_file, tls_ca, operator, parallelism } => launch::submit(
            &coordinator,
            token_file.as_deref(),
            tls_ca.as_deref(),
            koala_protocol::ReconfigRequest::Rescale { operator, parallelism },
        ),
        Command::Rebalance { coordinator, token_file, tls_ca, operator, moves } => {
            let moves = moves.iter().map(|m| launch::parse_move(m)).collect::<anyhow::Result<Vec<_>>>()?;
            let request = koala_protocol::ReconfigRequest::Rebalance { operator, moves };
            launch::submit(&coordinator, token_file.as_deref(), tls_ca.as_deref(), request)
        }
        Command::Migrate { coordinator, token_file, tls_ca, operator, task, worker } => launch::submit(
            &coordinator,
            token_file.as_deref(),
            tls_ca.as_deref(),
            koala_protocol::ReconfigRequest::Migrate { operator, task, worker },
        ),
        Command::Broker { action } => kafka::broker(action),
        Command::Produce(args) => kafka::produce(args),
        Command::Experiment { name, list, quick, smoke, out, protocols, partition_policy } => {
            let Some(name) = name.filter(|_| !list) else {
                print!("{}", experiment::list());
                return Ok(());
            };
            let mode = match (smoke, quick) {
                (true, _) => experiment::Mode::Smoke,
                (false, true) => experiment::Mode::Quick,
                (false, false) => experiment::Mode::Full,
            };
            let policy = partition_policy.as_deref().map(settings::parse_policy).transpose()?;
            let out = out.unwrap_or_else(|| PathBuf::from(format!("koala-out/experiment-{name}")));
            experiment::run(&name, mode, &experiment::Options { out, protocols, policy })
        }
        Command::Report { db, list, run, out } => run_dir::report(&db, list, run, out),
        Command::Queries { name, all } => {
            let text = match (name, all) {
                (None, false) => queries::list(),
                (name, _) => queries::describe(name.as_deref()).map_err(anyhow::Error::msg)?,
            };
            print!("{text}");
            Ok(())
        }
    }
}
