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
    /// Start a broker in the background (SQLite engine unless --memory) and print its address
    /// and the exact `koala produce` / `koala run --brokers` commands that use it.
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

/// The environment variable `koala run` reads the Kafka bootstrap servers from when
/// `--brokers` is not given.
pub const BROKERS_ENV: &str = "KOALA_BROKERS";

/// `koala run --brokers` (or `KOALA_BROKERS`): replaces `[params.kafka] brokers` of `config` by
/// the comma-separated `host:port` list `brokers`. An error for a query without Kafka
/// parameters, or an address that is not `host:port`.
pub fn override_brokers(config: &mut koala_coordinator::JobConfig, brokers: &str) -> anyhow::Result<()> {
    let query = crate::queries::find(&config.query).map_err(anyhow::Error::msg)?;
    anyhow::ensure!(
        query.has_kafka_params(),
        "--brokers / {BROKERS_ENV}: query {:?} reads and writes no Kafka (it has no [params.kafka]); \
         drop the flag or unset {BROKERS_ENV}",
        config.query
    );
    let list: Vec<String> =
        brokers.split(',').map(|b| b.trim().to_string()).filter(|b| !b.is_empty()).collect();
    anyhow::ensure!(
        !list.is_empty(),
        "--brokers / {BROKERS_ENV}: no address given; use host:port[,host:port…]"
    );
    for b in &list {
        let port_ok =
            b.rsplit_once(':').is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
        anyhow::ensure!(port_ok, "--brokers / {BROKERS_ENV}: {b:?} is not host:port (e.g. 127.0.0.1:9092)");
    }
    let kafka = config.params.entry("kafka").or_insert_with(|| toml::Value::Table(toml::Table::new()));
    let Some(kafka) = kafka.as_table_mut() else {
        anyhow::bail!("[params] kafka is not a table; write it as [params.kafka]");
    };
    kafka.insert("brokers".into(), toml::Value::Array(list.into_iter().map(toml::Value::String).collect()));
    Ok(())
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
            println!("{}", use_broker_lines(&state.bootstrap, &data_dir));
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

/// What `koala broker start` prints after the address: the exact commands that use this broker.
fn use_broker_lines(bootstrap: &str, data_dir: &std::path::Path) -> String {
    format!(
        "use it with:\n  koala produce --brokers {bootstrap} --events 1000000\n  \
         koala run examples/kafka-bids.toml --brokers {bootstrap}\n  \
         (or `export {BROKERS_ENV}={bootstrap}` for every koala run)\n\
         stop it with: koala broker stop --data-dir {}",
        data_dir.display()
    )
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
