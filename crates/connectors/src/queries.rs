//! Queries whose input or output is Kafka. `bid-aggregate` is the keyed running aggregate of the
//! demo over Nexmark bids: per auction, the number of bids and the sum of their prices. Its input
//! is either the `<prefix>-bid` topic `koala produce` writes or the same Nexmark generator
//! embedded, so the two can be compared on one query; its output a Kafka topic, JSON lines or
//! nothing.

use std::sync::Arc;

use koala_dataflow::{
    Dataflow, DataflowError, Generator, JobGraph, SourceOptions, Stream, TaskInstance, ValueState,
};
use koala_types::Timestamp;
use koala_workloads::nexmark::{
    Auction, Bid, Event, EventKind, KafkaSourceBuilder, KafkaStream, NexmarkConfig, NexmarkGenerator,
    NexmarkKafka, Person, closed_auction_of,
};
use serde::{Deserialize, Serialize};

use crate::ValueFormat;
use crate::kafka_sink::KafkaSinkSpec;
use crate::kafka_source::{KafkaSourceSpec, StartAt};

/// The queries this crate registers: name and what it computes, operators named.
pub const QUERIES: &[(&str, &str)] = &[(
    "bid-aggregate",
    "\"bids\" (Nexmark bids from the generator or a Kafka topic) → key_by auction → \"aggregate\" (bids and price sum per auction) → sink (JSON lines, Kafka or discard)",
)];

/// Where bids come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Input {
    /// The embedded Nexmark generator (no broker needed).
    #[default]
    Generator,
    /// The `<topic_prefix>-bid` topic.
    Kafka,
}

/// Where per-auction totals go.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Output {
    /// `<output_dir>/sink-<task>.jsonl`.
    #[default]
    Jsonl,
    /// The `output_topic` topic, keyed by auction.
    Kafka,
    /// Counted and dropped.
    Discard,
}

/// Kafka settings of a query.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KafkaParams {
    /// Bootstrap brokers, `host:port`.
    pub brokers: Vec<String>,
    /// Bids are read from `<topic_prefix>-bid` (what `koala produce` writes).
    pub topic_prefix: String,
    /// Totals are written to this topic.
    pub output_topic: String,
    /// Value format of both topics.
    pub format: ValueFormat,
    /// End the source when it has read up to the end of the topic as it was when it started
    /// (bounded runs and tests); otherwise it waits for new records forever.
    pub until_end: bool,
    /// Where the source starts reading each partition: `earliest` (a re-run reads the topic
    /// again), `latest` (records produced from the job's start on) or `committed` (where the
    /// consumer group `group` left off, committing as it reads).
    pub start: StartAt,
    /// The consumer group of `start = "committed"`.
    pub group: String,
}

impl Default for KafkaParams {
    fn default() -> Self {
        Self {
            brokers: vec!["127.0.0.1:9092".into()],
            topic_prefix: "nexmark".into(),
            output_topic: "bid-totals".into(),
            format: ValueFormat::Json,
            until_end: false,
            start: StartAt::Earliest,
            group: "koala".into(),
        }
    }
}

/// Parameters of `bid-aggregate`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BidAggregateParams {
    /// Where bids come from.
    pub input: Input,
    /// Where totals go.
    pub output: Output,
    /// Kafka settings (input or output `kafka`).
    pub kafka: KafkaParams,
    /// The generator (input `generator`).
    pub nexmark: NexmarkConfig,
    /// Pacing and watermarks of the generator input (a Kafka source paces itself).
    pub source: SourceOptions,
}

/// Bids of one auction so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct BidTotal {
    /// The auction.
    pub auction: u64,
    /// Bids so far.
    pub count: u64,
    /// Sum of their prices.
    pub sum_price: u64,
}

/// Builds a query of this crate from its TOML parameters; `None` if the name is not ours.
pub fn build_query(name: &str, params_toml: &str) -> Option<Result<JobGraph, String>> {
    (name == "bid-aggregate").then(|| {
        let params: BidAggregateParams = toml::from_str(params_toml).map_err(|e| format!("params: {e}"))?;
        bid_aggregate(&params).map_err(|e| e.to_string())
    })
}

/// The generator's bids for one source task (producer `index` of `parallelism`).
struct BidGenerator {
    generator: Option<NexmarkGenerator>,
    seq: u64,
}

impl Generator<Bid> for BidGenerator {
    fn next(&mut self) -> Option<(Bid, Timestamp)> {
        loop {
            let event = self.generator.as_ref()?.event(self.seq)?;
            self.seq += 1;
            if let Event::Bid(bid) = event {
                let t = bid.date_time;
                return Some((bid, t));
            }
        }
    }
}

/// source "bids" → key_by auction → "aggregate" (count, sum of prices) → sink "sink".
pub fn bid_aggregate(p: &BidAggregateParams) -> Result<JobGraph, DataflowError> {
    p.source.validate().map_err(|e| DataflowError::Other(format!("params: {e}")))?;
    let df = Dataflow::new();
    let bids: Stream<Bid> = match p.input {
        Input::Kafka => {
            let topic = format!("{}-bid", p.kafka.topic_prefix);
            let spec = KafkaSourceSpec::<Bid>::new(p.kafka.brokers.clone(), topic, p.kafka.format)
                .event_time(|b: &Bid| Some(b.date_time))
                .until_end(p.kafka.until_end)
                .start_at(p.kafka.start, p.kafka.group.clone());
            df.source_from("bids", p.source.clone(), spec.factory())
        }
        Input::Generator => {
            let config = p.nexmark.clone();
            NexmarkGenerator::new(config.clone())
                .map_err(|e| DataflowError::Other(format!("params.nexmark: {e}")))?;
            df.source("bids", p.source.clone(), move |task: TaskInstance| {
                let mut c = config.clone();
                c.producers = task.parallelism.max(1);
                c.producer_index = task.index;
                // Validated above for one producer; should the split still be refused, the task
                // says so and produces nothing rather than bringing its worker down.
                let generator = NexmarkGenerator::new(c)
                    .map_err(
                        |e| tracing::error!(task = task.index, error = %e, "bid generator refused its share"),
                    )
                    .ok();
                BidGenerator { generator, seq: 0 }
            })
        }
    };
    let totals = bids.key_by(|b: &Bid| b.auction).stateful_map(
        "aggregate",
        |auction: &u64, bid: Bid, total: &mut ValueState<(u64, u64)>| {
            let (count, sum_price) = total.update(|(count, sum)| {
                *count += 1;
                *sum = sum.wrapping_add(bid.price);
                (*count, *sum)
            });
            BidTotal { auction: *auction, count, sum_price }
        },
    );
    match p.output {
        Output::Jsonl => totals.sink_json_lines("sink"),
        Output::Discard => totals.sink_discard("sink"),
        Output::Kafka => {
            let (brokers, topic) = (p.kafka.brokers.clone(), p.kafka.output_topic.clone());
            let spec = KafkaSinkSpec::<BidTotal>::new(brokers.clone(), topic.clone(), p.kafka.format);
            let build = spec.factory();
            // The output topic is created (one partition per sink task) if it does not exist yet.
            totals.sink_with(
                "sink",
                std::sync::Arc::new(move |task: TaskInstance| {
                    let partitions = i32::try_from(task.parallelism).unwrap_or(i32::MAX);
                    crate::broker::create_topic(&brokers, &topic, partitions)
                        .map_err(|e| DataflowError::Other(format!("creating output topic {topic:?}: {e}")))?;
                    build(task)
                }),
            )
        }
    }
    df.build()
}

/// The Kafka sources of the Nexmark queries (`[params] input = "kafka"`, [`NexmarkKafka`]): per
/// [`KafkaStream`], the topics `koala produce` writes under `topic_prefix` — one topic read as it
/// is, or two read by each source task as one stream of events ([`crate::topics_factory`]) —
/// each record's event time its `date_time`.
pub fn nexmark_kafka_source(k: &NexmarkKafka) -> Result<KafkaSourceBuilder, String> {
    let format: ValueFormat = k.format.parse().map_err(|e| format!("params.kafka.format: {e}"))?;
    let start = parse_start(&k.start)?;
    let k = k.clone();
    Ok(Arc::new(move |stream: KafkaStream| {
        let spec = |kind: EventKind| {
            let topic = format!("{}-{}", k.topic_prefix, kind.name());
            (k.brokers.clone(), topic, format)
        };
        let of = |kind: EventKind| -> KafkaSourceSpec<Event> {
            let (brokers, topic, format) = spec(kind);
            let events = match kind {
                EventKind::Person => {
                    KafkaSourceSpec::<Person>::new(brokers, topic, format).map_values(Event::Person)
                }
                EventKind::Auction => {
                    KafkaSourceSpec::<Auction>::new(brokers, topic, format).map_values(Event::Auction)
                }
                EventKind::Bid => KafkaSourceSpec::<Bid>::new(brokers, topic, format).map_values(Event::Bid),
            };
            events
                .event_time(|e: &Event| Some(e.date_time()))
                .until_end(k.until_end)
                .start_at(start, k.group.clone())
        };
        match stream {
            KafkaStream::Bids => {
                let (brokers, topic, format) = spec(EventKind::Bid);
                KafkaSourceSpec::<Bid>::new(brokers, topic, format)
                    .event_time(|b: &Bid| Some(b.date_time))
                    .until_end(k.until_end)
                    .start_at(start, k.group.clone())
                    .factory()
            }
            KafkaStream::ClosedAuctions => {
                let (brokers, topic, format) = spec(EventKind::Auction);
                KafkaSourceSpec::<Auction>::new(brokers, topic, format)
                    .event_time(|a: &Auction| Some(a.date_time))
                    .map_values(|a: Auction| closed_auction_of(&a))
                    .until_end(k.until_end)
                    .start_at(start, k.group.clone())
                    .factory()
            }
            KafkaStream::PeopleAndAuctions | KafkaStream::AuctionsAndBids => {
                crate::topics_factory(stream.kinds().iter().map(|&kind| of(kind)).collect())
            }
        }
    }))
}

/// `params.kafka.start` as written in a config.
pub fn parse_start(start: &str) -> Result<StartAt, String> {
    match start {
        "earliest" => Ok(StartAt::Earliest),
        "latest" => Ok(StartAt::Latest),
        "committed" => Ok(StartAt::Committed),
        other => {
            Err(format!("params.kafka.start = {other:?}: give \"earliest\", \"latest\" or \"committed\""))
        }
    }
}
