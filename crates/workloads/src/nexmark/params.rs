//! The parameters of the Nexmark queries (`[params]` of a config) and where their events come
//! from: the embedded generator, or for the bid queries the Kafka source the caller builds.

use koala_dataflow::SourceOptions;
use koala_dataflow::graph::SourceFactory;
use serde::{Deserialize, Serialize};

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
    /// Where the events come from: the embedded generator, or Kafka (the bid queries only).
    pub input: NexmarkInput,
    /// The Kafka source when `input = "kafka"`.
    pub kafka: NexmarkKafka,
    /// The source the bid queries read when `input = "kafka"`, built by the caller from
    /// [`Self::kafka`] (not a parameter: never read from or written to a config).
    #[serde(skip)]
    pub bids_from: ExternalSource,
}

/// Where the Nexmark queries read their events.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NexmarkInput {
    /// The embedded generator (`[params.nexmark]`).
    #[default]
    Generator,
    /// The `<topic_prefix>-bid` topic `koala produce` writes: the bid queries Q1, Q2, Q5, Q7.
    Kafka,
}

/// The Kafka source of the bid queries (`[params.kafka]`), read by koala-connectors, which checks
/// `format` and `start`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NexmarkKafka {
    /// Bootstrap brokers, `host:port`.
    pub brokers: Vec<String>,
    /// Bids are read from `<topic_prefix>-bid`.
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

/// A source built outside this crate (the Kafka source of the bid queries).
#[derive(Clone, Default)]
pub struct ExternalSource(pub Option<SourceFactory>);

impl std::fmt::Debug for ExternalSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "ExternalSource(given)" } else { "ExternalSource(none)" })
    }
}

impl PartialEq for ExternalSource {
    fn eq(&self, other: &Self) -> bool {
        match (&self.0, &other.0) {
            (Some(a), Some(b)) => std::sync::Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        }
    }
}

/// The queries whose only input is bids: the ones that read Kafka with `input = "kafka"`.
pub const BID_QUERIES: &[&str] = &["nexmark-q1", "nexmark-q2", "nexmark-q5", "nexmark-q7"];

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
            bids_from: ExternalSource::default(),
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
