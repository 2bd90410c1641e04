//! The parameters of the Nexmark queries (`[params]` of a config) and where their events come
//! from: the embedded generator, or the Kafka topics `koala produce` writes, through the source
//! the caller builds ([`ExternalSource`]).

use koala_dataflow::SourceOptions;
use koala_dataflow::graph::SourceFactory;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

use super::NexmarkConfig;
use crate::params::SinkKind;

/// Parameters of the Nexmark queries (`[params]` of a config). Unknown fields are rejected.
///
/// ```
/// use koala_workloads::nexmark::NexmarkParams;
/// let p: NexmarkParams = serde_json::from_str(r#"{"nexmark": {"events": 1000, "hot_ratio": 0.5}}"#)?;
/// assert_eq!(p.nexmark.events, Some(1000));
/// assert!(serde_json::from_str::<NexmarkParams>(r#"{"new_user_period": 5}"#).is_err());
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NexmarkParams {
    /// The generator: events, key skew (`hot_ratio`, `hot_range`), active people and auctions,
    /// value padding (`extra_payload_bytes`), warm-up keys, event time, auction duration. Its
    /// `producers` and `producer_index` are set per source task.
    pub nexmark: NexmarkConfig,
    /// Rate schedule, watermark cadence and bounded disorder of the source.
    pub source: SourceOptions,
    /// Q1: factor applied to every bid price (the paper's 0.85, as a currency conversion).
    pub q1_price_factor: f64,
    /// Q2: the auctions whose bids pass the filter.
    pub q2_auctions: Vec<u64>,
    /// Bytes of padding in Q3's person state and in Q4's, Q4*'s, Q6's and Q6*'s per-key state
    /// (the paper's `DummyFieldSize`, 2 KB in its runs; 0, the default, for standard Nexmark).
    pub state_padding_bytes: usize,
    /// Q5: sliding window size; Q7: tumbling window size.
    pub window_ms: u64,
    /// Q5: sliding window slide.
    pub slide_ms: u64,
    /// Q6 and Q6*: closing prices averaged per seller.
    pub last_prices: usize,
    /// Q8: how long after registering a person counts as new.
    pub new_user_period_ms: u64,
    /// Where the sink writes.
    pub sink: SinkKind,
    /// Where the events come from: the embedded generator, or Kafka.
    pub input: NexmarkInput,
    /// The Kafka source when `input = "kafka"`.
    pub kafka: NexmarkKafka,
    /// The Kafka sources the queries read when `input = "kafka"`, built by the caller from
    /// [`Self::kafka`] (not a parameter: never read from or written to a config).
    #[serde(skip)]
    pub kafka_source: ExternalSource,
}

/// Where the Nexmark queries read their events.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NexmarkInput {
    /// The embedded generator (`[params.nexmark]`).
    #[default]
    Generator,
    /// The `<topic_prefix>-person`, `-auction` and `-bid` topics `koala produce` writes, each
    /// query reading the ones it needs ([`KafkaStream`]).
    Kafka,
}

/// What a Nexmark query's source reads from Kafka, and the type of its records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KafkaStream {
    /// `<prefix>-bid`, as [`super::Bid`]s (Q1, Q2, Q5, Q7).
    Bids,
    /// `<prefix>-person` and `<prefix>-auction`, as [`super::Event`]s (Q3, Q8).
    PeopleAndAuctions,
    /// `<prefix>-auction` and `<prefix>-bid`, as [`super::Event`]s (Q4, Q6).
    AuctionsAndBids,
    /// `<prefix>-auction`, each auction as its [`super::ClosedAuction`] (Q4*, Q6*).
    ClosedAuctions,
}

/// The stream Nexmark query `name` reads from Kafka with `input = "kafka"`, if it is one.
pub fn kafka_stream_of(name: &str) -> Option<KafkaStream> {
    Some(match name.strip_prefix("nexmark-")? {
        "q1" | "q2" | "q5" | "q7" => KafkaStream::Bids,
        "q3" | "q8" => KafkaStream::PeopleAndAuctions,
        "q4" | "q6" => KafkaStream::AuctionsAndBids,
        "q4star" | "q6star" => KafkaStream::ClosedAuctions,
        _ => return None,
    })
}

impl KafkaStream {
    /// The kinds of event, hence the topics, it reads.
    pub fn kinds(self) -> &'static [super::EventKind] {
        use super::EventKind::{Auction, Bid, Person};
        match self {
            Self::Bids => &[Bid],
            Self::PeopleAndAuctions => &[Person, Auction],
            Self::AuctionsAndBids => &[Auction, Bid],
            Self::ClosedAuctions => &[Auction],
        }
    }
}

/// The Kafka source of the queries (`[params.kafka]`), read by koala-connectors, which checks
/// `format` and `start`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NexmarkKafka {
    /// Bootstrap brokers, `host:port`.
    pub brokers: Vec<String>,
    /// Events are read from `<topic_prefix>-person`, `-auction` and `-bid`.
    pub topic_prefix: String,
    /// Value format: `json` or `binary` (as `koala produce --format`).
    pub format: String,
    /// End the source at the end of the topic as it was when it started (bounded runs).
    pub until_end: bool,
    /// Where each partition starts: `earliest`, `latest` or `committed` (the consumer group's
    /// offsets, committed as it reads).
    pub start: String,
    /// The consumer group of `start = "committed"`.
    pub group: String,
}

impl Default for NexmarkKafka {
    fn default() -> Self {
        Self {
            brokers: vec!["127.0.0.1:9092".into()],
            topic_prefix: "nexmark".into(),
            format: "json".into(),
            until_end: false,
            start: "earliest".into(),
            group: "koala".into(),
        }
    }
}

/// Builds a query's Kafka source for the stream it reads.
pub type KafkaSourceBuilder = Arc<dyn Fn(KafkaStream) -> SourceFactory + Send + Sync>;

/// The Kafka sources, built outside this crate (it knows no Kafka).
#[derive(Clone, Default)]
pub struct ExternalSource(pub Option<KafkaSourceBuilder>);

impl std::fmt::Debug for ExternalSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "ExternalSource(given)" } else { "ExternalSource(none)" })
    }
}

impl PartialEq for ExternalSource {
    fn eq(&self, other: &Self) -> bool {
        match (&self.0, &other.0) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        }
    }
}

impl Default for NexmarkParams {
    fn default() -> Self {
        Self {
            nexmark: NexmarkConfig::default(),
            source: SourceOptions::default(),
            q1_price_factor: 0.85,
            q2_auctions: vec![1007, 1020, 2001, 2019, 1087],
            state_padding_bytes: 0,
            window_ms: 1000,
            slide_ms: 100,
            last_prices: 10,
            new_user_period_ms: 10_000,
            sink: SinkKind::default(),
            input: NexmarkInput::Generator,
            kafka: NexmarkKafka::default(),
            kafka_source: ExternalSource::default(),
        }
    }
}

impl NexmarkParams {
    /// Checks the parameters, naming the first bad one and the fix.
    pub fn validate(&self) -> Result<(), String> {
        self.nexmark.validate().map_err(|e| format!("params.nexmark: {e}"))?;
        self.source.validate()?;
        if !(self.q1_price_factor.is_finite() && self.q1_price_factor >= 0.0) {
            return Err(format!("q1_price_factor = {}: give a finite factor ≥ 0", self.q1_price_factor));
        }
        for (name, value) in [
            ("window_ms", self.window_ms),
            ("slide_ms", self.slide_ms),
            ("new_user_period_ms", self.new_user_period_ms),
        ] {
            if value == 0 {
                return Err(format!("{name} must be positive"));
            }
        }
        if self.last_prices == 0 {
            return Err("last_prices must be positive".into());
        }
        Ok(())
    }
}
