//! `koala produce`: writes the Nexmark person / auction / bid topics (docs/architecture.md §12) at a
//! scheduled rate, from one or several producers that each own one partition per topic and a
//! disjoint part of the event sequence, printing a progress line with records/s every second.
//!
//! Topic `<prefix>-<kind>` gets `producers` partitions; producer `i` writes partition `i`. Keys are
//! the person id, the auction id, and the bid's auction id; values are the `Person`, `Auction` or
//! `Bid` struct in the chosen [`ValueFormat`]; the Kafka timestamp is the wall-clock write time.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use koala_workloads::nexmark::{Event, EventKind, NexmarkConfig, NexmarkGenerator};
use rskafka::{
    chrono::{DateTime, Utc},
    client::partition::{Compression, PartitionClient, UnknownTopicHandling},
    record::Record as KafkaRecord,
};
use tracing::{info, warn};

use crate::{
    CALL_LIMIT, ConnectorError, REQUEST_DEADLINE, ValueFormat, block_on_within, broker::create_topic_with,
    connect, io_runtime, now_ms,
};

/// What `koala produce` does; each field maps to one CLI flag (named in its doc).
#[derive(Clone, Debug)]
pub struct ProduceOptions {
    /// `--brokers a:9092,b:9092`: bootstrap brokers.
    pub brokers: Vec<String>,
    /// `--topic-prefix` (default `nexmark`): topics `<prefix>-person`, `-auction`, `-bid`.
    pub topic_prefix: String,
    /// The generator: `--config nexmark.toml` and/or flags `--events`, `--rate at_ms:rps,…`,
    /// `--hot-ratio`, `--hot-range`, `--active-people`, `--active-auctions`, `--extra-bytes`,
    /// `--producers` (= partitions per topic), `--warmup`, `--first-event`.
    pub nexmark: NexmarkConfig,
    /// `--producer i`: run only producer `i` (one process per producer); `None` runs all
    /// `nexmark.producers` producers as threads of this process.
    pub only_producer: Option<u32>,
    /// `--duration-secs`: stop after this long (also stops at `nexmark.events` if bounded).
    pub duration: Option<Duration>,
    /// `--format json|binary` (default json).
    pub format: ValueFormat,
    /// `--no-create-topics` clears it: create the three topics (with `producers` partitions) first.
    pub create_topics: bool,
    /// `--generated-time` clears it: stamp events with wall-clock time instead of the
    /// generator's synthetic event time.
    pub wall_clock_event_time: bool,
    /// `--quiet` clears it: print a progress line every second to stderr.
    pub progress: bool,
    /// Records per produce request and topic (default 500).
    pub batch_records: usize,
    /// Set to stop early (the CLI's Ctrl-C handler).
    pub stop: Arc<AtomicBool>,
}

impl ProduceOptions {
    /// Defaults: prefix `nexmark`, JSON, create topics, wall-clock event time, progress on.
    pub fn new(brokers: Vec<String>, nexmark: NexmarkConfig) -> Self {
        Self {
            brokers,
            topic_prefix: "nexmark".into(),
            nexmark,
            only_producer: None,
            duration: None,
            format: ValueFormat::Json,
            create_topics: true,
            wall_clock_event_time: true,
            progress: true,
            batch_records: 500,
            stop: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The topic of one kind of event.
    pub fn topic(&self, kind: EventKind) -> String {
        format!("{}-{}", self.topic_prefix, kind.name())
    }
}

/// What a [`produce`] run wrote.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProduceSummary {
    /// Records written, all topics.
    pub records: u64,
    /// Records written per kind: person, auction, bid.
    pub per_kind: [u64; 3],
    /// Wall-clock duration of the run.
    pub elapsed: Duration,
    /// If the run fell short of its rate schedule: (records/s reached, records/s the schedule
    /// asked for over the same records), when it reached less than [`RATE_SHORTFALL`] of it.
    pub short_of_rate: Option<(f64, f64)>,
}

/// Below this fraction of its scheduled rate a produce run warns that it cannot reach it.
pub const RATE_SHORTFALL: f64 = 0.9;

impl ProduceSummary {
    /// Mean records per second over the run.
    pub fn records_per_sec(&self) -> f64 {
        self.records as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Writes Nexmark events until `nexmark.events` are written, `duration` passes or `stop` is set.
pub fn produce(options: &ProduceOptions) -> Result<ProduceSummary, ConnectorError> {
    let producers = options.nexmark.producers;
    options.nexmark.validate()?;
    if options.brokers.is_empty() {
        return Err(ConnectorError::Config("--brokers must name at least one broker".into()));
    }
    if let Some(i) = options.only_producer.filter(|&i| i >= producers) {
        return Err(ConnectorError::Config(format!("--producer {i} must be below --producers {producers}")));
    }
    if options.create_topics {
        let rt = io_runtime()?;
        block_on_within(&rt, CALL_LIMIT * 3, "creating the nexmark topics", async {
            let client = connect(&options.brokers, REQUEST_DEADLINE).await?;
            for kind in EventKind::ALL {
                let partitions = i32::try_from(producers).unwrap_or(i32::MAX);
                create_topic_with(&client, &options.topic(kind), partitions).await?;
            }
            Ok::<_, ConnectorError>(())
        })?;
    }
    let indices: Vec<u32> = match options.only_producer {
        Some(i) => vec![i],
        None => (0..producers).collect(),
    };
    let counts: [AtomicU64; 3] = Default::default();
    let done = AtomicBool::new(false);
    let start = Instant::now();
    let result = thread::scope(|s| {
        let workers: Vec<_> = indices
            .iter()
            .map(|&i| {
                let (counts, done) = (&counts, &done);
                s.spawn(move || {
                    let r = run_producer(options, i, start, counts, done);
                    if r.is_err() {
                        done.store(true, Ordering::Relaxed); // one failure stops the others
                    }
                    r
                })
            })
            .collect();
        let mut last = (Instant::now(), 0u64);
        let mut warned = false;
        while !workers.iter().all(|w| w.is_finished()) {
            thread::sleep(Duration::from_millis(50));
            if last.0.elapsed() >= Duration::from_secs(1) {
                let total: u64 = counts.iter().map(|c| c.load(Ordering::Relaxed)).sum();
                let rate = (total - last.1) as f64 / last.0.elapsed().as_secs_f64();
                let target = target_rate(options, start.elapsed());
                if options.progress {
                    eprintln!(
                        "produce: {total} records, {rate:.0} records/s (target {})",
                        target.map_or("unlimited".into(), |t| format!("{t:.0}"))
                    );
                }
                // The first second includes connecting; judge from the second one on.
                if !warned && last.1 > 0 && target.is_some_and(|t| rate < RATE_SHORTFALL * t) {
                    warned = true;
                    warn!(
                        "produce cannot reach its rate: {rate:.0} records/s of the {:.0} asked for (the broker or this machine is too slow; the run takes longer)",
                        target.unwrap_or_default()
                    );
                }
                last = (Instant::now(), total);
            }
        }
        let mut first_error = None;
        for w in workers {
            let r =
                w.join().unwrap_or_else(|_| Err(ConnectorError::Config("a producer thread panicked".into())));
            if let Err(e) = r {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    });
    let per_kind = [0, 1, 2].map(|i| counts[i].load(Ordering::Relaxed));
    let records = per_kind.iter().sum();
    let elapsed = start.elapsed();
    // The schedule's rate over the records written (this process's share of it).
    let share = if options.only_producer.is_some() { producers } else { 1 };
    let scheduled = options
        .nexmark
        .rate
        .due_ms(records, share)
        .filter(|ms| *ms > 0.0)
        .map(|ms| records as f64 / (ms / 1000.0));
    let reached = records as f64 / elapsed.as_secs_f64().max(1e-9);
    let short_of_rate = scheduled.filter(|s| reached < RATE_SHORTFALL * s).map(|s| (reached, s));
    let summary = ProduceSummary { records, per_kind, elapsed, short_of_rate };
    result?;
    info!(records = summary.records, rate = summary.records_per_sec(), "produce finished");
    Ok(summary)
}

/// The scheduled rate of this process now (`None` where unlimited).
fn target_rate(options: &ProduceOptions, elapsed: Duration) -> Option<f64> {
    let elapsed_ms = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
    let step = options.nexmark.rate.0.iter().rev().find(|s| s.at_ms <= elapsed_ms)?;
    let rate = step.records_per_sec;
    if rate <= 0.0 {
        return None;
    }
    Some(if options.only_producer.is_some() {
        rate / f64::from(options.nexmark.producers.max(1))
    } else {
        rate
    })
}

fn kind_index(kind: EventKind) -> usize {
    match kind {
        EventKind::Person => 0,
        EventKind::Auction => 1,
        EventKind::Bid => 2,
    }
}

/// One producer: generates its part of the sequence on schedule and writes partition `index`.
fn run_producer(
    options: &ProduceOptions,
    index: u32,
    start: Instant,
    counts: &[AtomicU64; 3],
    done: &AtomicBool,
) -> Result<(), ConnectorError> {
    let producers = options.nexmark.producers;
    let generator = NexmarkGenerator::new(options.nexmark.for_producer(index, producers))?;
    let rt = io_runtime()?;
    let partition = i32::try_from(index).unwrap_or(i32::MAX);
    let clients: Vec<PartitionClient> =
        block_on_within(&rt, CALL_LIMIT, "opening the nexmark topics", async {
            let client = connect(&options.brokers, REQUEST_DEADLINE).await?;
            let mut clients = Vec::new();
            for kind in EventKind::ALL {
                let topic = options.topic(kind);
                let pc = client
                    .partition_client(topic.clone(), partition, UnknownTopicHandling::Retry)
                    .await
                    .map_err(|e| ConnectorError::kafka(format!("opening {topic}/{partition}"), e))?;
                clients.push(pc);
            }
            Ok::<_, ConnectorError>(clients)
        })?;
    let rate = &options.nexmark.rate;
    let mut seq = 0u64;
    let mut batches: [Vec<KafkaRecord>; 3] = Default::default();
    loop {
        if done.load(Ordering::Relaxed)
            || options.stop.load(Ordering::Relaxed)
            || options.duration.is_some_and(|d| start.elapsed() >= d)
        {
            return Ok(());
        }
        let elapsed_ms = start.elapsed().as_secs_f64() * 1000.0;
        let now = now_ms();
        let timestamp =
            DateTime::<Utc>::from_timestamp_millis(i64::try_from(now).unwrap_or(0)).unwrap_or_default();
        let mut exhausted = false;
        let mut taken = 0;
        let mut wait_ms = None;
        while taken < options.batch_records {
            if let Some(due) = rate.due_ms(seq, producers).filter(|&due| due > elapsed_ms) {
                wait_ms = Some(due - elapsed_ms);
                break;
            }
            let Some(mut event) = generator.event(seq) else {
                exhausted = true;
                break;
            };
            if options.wall_clock_event_time {
                event.set_date_time(now);
            }
            let (key, value) = encode_event(&event, options.format)?;
            batches[kind_index(event.kind())].push(KafkaRecord {
                key: Some(key),
                value: Some(value),
                headers: Default::default(),
                timestamp,
            });
            seq += 1;
            taken += 1;
        }
        for (i, client) in clients.iter().enumerate() {
            let records = std::mem::take(&mut batches[i]);
            let n = records.len() as u64;
            if n == 0 {
                continue;
            }
            let what = format!("producing to {}/{partition}", client.topic());
            let produced = async {
                client
                    .produce(records, Compression::NoCompression)
                    .await
                    .map_err(|e| ConnectorError::kafka(what.clone(), e))
            };
            block_on_within(&rt, CALL_LIMIT, &what, produced)?;
            counts[i].fetch_add(n, Ordering::Relaxed);
        }
        if exhausted {
            return Ok(());
        }
        if let Some(ms) = wait_ms.filter(|_| taken == 0) {
            // Ahead of the schedule: pacing sleep, capped so stop requests are seen promptly.
            thread::sleep(Duration::from_secs_f64(ms.min(100.0) / 1000.0));
        }
    }
}

/// The Kafka key and value of an event in `format`.
fn encode_event(event: &Event, format: ValueFormat) -> Result<(Vec<u8>, Vec<u8>), ConnectorError> {
    let encoded = match event {
        Event::Person(p) => format.encode(&p.id).and_then(|k| Ok((k, format.encode(p)?))),
        Event::Auction(a) => format.encode(&a.id).and_then(|k| Ok((k, format.encode(a)?))),
        Event::Bid(b) => format.encode(&b.auction).and_then(|k| Ok((k, format.encode(b)?))),
    };
    encoded.map_err(|e| ConnectorError::Config(format!("encoding a nexmark event: {e}")))
}
