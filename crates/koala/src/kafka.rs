//! `koala broker` and `koala produce`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use koala_connectors::ValueFormat;
use koala_connectors::broker::{self, BrokerOptions, BrokerStatus};
use koala_connectors::produce::{ProduceOptions, produce as run_produce};
use koala_workloads::nexmark::NexmarkConfig;

/// What to do with the broker.
#[derive(Subcommand)]
pub enum BrokerAction {
    /// Start a broker in the background (SQLite engine unless --memory) and print its address.
    Start {
        /// Directory for the broker's database, log and state file.
        #[arg(long, default_value = "koala-out/broker")]
        data_dir: PathBuf,
        /// In-memory engine: faster, not persistent (throughput runs).
        #[arg(long)]
        memory: bool,
        /// Port on 127.0.0.1 (default: a free one).
        #[arg(long)]
        port: Option<u16>,
    },
    /// Stop the broker started in this directory.
    Stop {
        /// The directory given to `start`.
        #[arg(long, default_value = "koala-out/broker")]
        data_dir: PathBuf,
    },
    /// Tell whether a broker runs in this directory, and where.
    Status {
        /// The directory given to `start`.
        #[arg(long, default_value = "koala-out/broker")]
        data_dir: PathBuf,
    },
}

/// `koala produce` options.
#[derive(Args)]
pub struct ProduceArgs {
    /// Bootstrap broker, `host:port` (printed by `koala broker start`).
    #[arg(long)]
    brokers: String,
    /// Topics are `<prefix>-person`, `<prefix>-auction`, `<prefix>-bid`.
    #[arg(long, default_value = "nexmark")]
    topic_prefix: String,
    /// A TOML file with the generator settings (`events`, `rate`, `hot_ratio`, `active_auctions`,
    /// `extra_payload_bytes`, `producers`, `warmup`, …); flags below override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Events to write in total (default: until --duration-secs or Ctrl-C).
    #[arg(long)]
    events: Option<u64>,
    /// Events per second over all producers (0 = as fast as possible).
    #[arg(long)]
    rate: Option<f64>,
    /// Stop after this many seconds.
    #[arg(long)]
    duration_secs: Option<u64>,
    /// Write only the partitions of producer I of `producers` (run several in parallel).
    #[arg(long)]
    producer: Option<u32>,
    /// Value format.
    #[arg(long, default_value = "json")]
    format: ValueFormat,
    /// Event time from the generator's schedule instead of the wall clock at production.
    #[arg(long)]
    generated_time: bool,
    /// Do not create the topics first.
    #[arg(long)]
    no_create_topics: bool,
    /// No progress line.
    #[arg(long)]
    quiet: bool,
}

/// `koala broker ...`.
pub fn broker(action: BrokerAction) -> anyhow::Result<()> {
    match action {
        BrokerAction::Start { data_dir, memory, port } => {
            let mut options = BrokerOptions::new(&data_dir);
            options.memory = memory;
            options.port = port;
            println!("starting tansu in {} and waiting for it to answer …", data_dir.display());
            let state = broker::start(options).context("starting the broker")?.detach();
            println!(
                "broker running at {} (pid {}, {}); log: {}",
                state.bootstrap,
                state.pid,
                state.engine,
                state.log.display()
            );
            Ok(())
        }
        BrokerAction::Stop { data_dir } => {
            if broker::stop(&data_dir).context("stopping the broker")? {
                println!("broker stopped");
            } else {
                println!("no broker was running in {}", data_dir.display());
            }
            Ok(())
        }
        BrokerAction::Status { data_dir } => {
            // Exits non-zero unless a broker runs, so scripts can test for one.
            match broker::status(&data_dir).context("reading the broker state")? {
                BrokerStatus::NotRunning => anyhow::bail!("no broker running in {}", data_dir.display()),
                BrokerStatus::Running(s) => {
                    println!("running at {} (pid {}, {})", s.bootstrap, s.pid, s.engine);
                    Ok(())
                }
                BrokerStatus::Stale(s) => anyhow::bail!(
                    "no broker running: pid {} recorded at {} is gone; `koala broker stop` clears it",
                    s.pid,
                    s.bootstrap
                ),
            }
        }
    }
}

/// `koala produce`.
pub fn produce(args: ProduceArgs) -> anyhow::Result<()> {
    let mut nexmark: NexmarkConfig = match &args.config {
        Some(path) => {
            let text =
                std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
            toml::from_str(&text).with_context(|| format!("{}", path.display()))?
        }
        None => NexmarkConfig::default(),
    };
    if args.events.is_some() {
        nexmark.events = args.events;
    }
    if let Some(rate) = args.rate {
        nexmark.rate = koala_dataflow::RateSchedule::constant(rate);
    }
    let mut options = ProduceOptions::new(vec![args.brokers], nexmark);
    options.topic_prefix = args.topic_prefix;
    options.only_producer = args.producer;
    options.duration = args.duration_secs.map(Duration::from_secs);
    options.format = args.format;
    options.create_topics = !args.no_create_topics;
    options.wall_clock_event_time = !args.generated_time;
    options.progress = !args.quiet;
    let summary = run_produce(&options).context("producing")?;
    println!(
        "produced {} records ({} persons, {} auctions, {} bids) in {:.1} s",
        summary.records,
        summary.per_kind[0],
        summary.per_kind[1],
        summary.per_kind[2],
        summary.elapsed.as_secs_f64()
    );
    if let Some((reached, asked)) = summary.short_of_rate {
        println!(
            "WARNING: produce reached {reached:.0} records/s of the {asked:.0} asked for: the broker or this machine could not keep up, so the run took longer than its schedule"
        );
    }
    Ok(())
}
