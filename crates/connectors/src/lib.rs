//! Kafka in and out for koala-rs (docs/architecture.md §11): the tansu broker's lifecycle
//! ([`broker`]), a self-paced Kafka source ([`kafka_source`]) and a keyed Kafka sink
//! ([`kafka_sink`]) behind the runtime's byte-level `SourceLogic`/`SinkLogic`, and the Nexmark
//! producer behind `koala produce` ([`produce`]).
//!
//! The Kafka client is `rskafka` (pure Rust, no consumer groups): partitions are assigned by the
//! coordinator with [`kafka_source::assigned_partitions`] and positions live with the sources, as
//! Flink does; a source started at `committed` also commits them to a consumer group, with the
//! group-offset requests of [`group_offsets`]. rskafka is async; each source, sink and producer drives its own small
//! current-thread tokio runtime, so they must be called from plain threads (the runtime's task
//! threads), never from inside another tokio runtime.

pub mod broker;
pub mod group_offsets;
mod kafka_fetch;
pub mod kafka_sink;
pub mod kafka_source;
pub mod kafka_topics;
pub mod produce;
pub mod queries;

use std::{fmt, str::FromStr, time::Duration};

use rskafka::{
    BackoffConfig,
    client::{Client, ClientBuilder},
};
use serde::{Deserialize, Serialize};

pub use broker::{BrokerHandle, BrokerOptions, BrokerStatus};
pub use kafka_sink::{KafkaSink, KafkaSinkSpec};
pub use kafka_source::{KafkaSource, KafkaSourceSpec, StartAt, assigned_partitions};
pub use kafka_topics::{KafkaTopics, topics_factory};
pub use produce::{ProduceOptions, ProduceSummary, produce};

/// An error of a connector or of the broker lifecycle.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectorError {
    /// A Kafka request failed.
    #[error("kafka: {context}: {source}")]
    Kafka {
        /// What we were doing.
        context: String,
        /// The client's error.
        #[source]
        source: Box<rskafka::client::error::Error>,
    },
    /// A file or process operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What we were doing.
        context: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The broker did not start or did not answer in time.
    #[error("broker: {reason}\n--- last lines of {log} ---\n{tail}")]
    Broker {
        /// What went wrong.
        reason: String,
        /// The broker's log file.
        log: String,
        /// The last lines of that log.
        tail: String,
    },
    /// A Kafka operation got no answer in time (rskafka has no request timeout of its own).
    #[error("kafka: no answer within {after:?} while {what}")]
    Timeout {
        /// What we were doing.
        what: String,
        /// How long we waited.
        after: Duration,
    },
    /// `cargo install tansu` failed.
    #[error("installing tansu: {0}")]
    Install(String),
    /// An option or a configuration value is invalid; the message names it.
    #[error("{0}")]
    Config(String),
    /// A value could not be encoded or decoded.
    #[error(transparent)]
    Codec(#[from] koala_types::CodecError),
    /// The Nexmark generator configuration is invalid.
    #[error(transparent)]
    Nexmark(#[from] koala_workloads::nexmark::NexmarkConfigError),
}

impl ConnectorError {
    pub(crate) fn kafka(context: impl Into<String>, source: rskafka::client::error::Error) -> Self {
        Self::Kafka { context: context.into(), source: Box::new(source) }
    }

    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io { context: context.into(), source }
    }
}

/// How values (and keys) are laid out in Kafka records.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ValueFormat {
    /// One JSON document (serde_json of the user type).
    #[default]
    Json,
    /// The project's binary codec (`koala_types::encode`, postcard).
    Binary,
}

impl ValueFormat {
    /// Encodes a value in this format.
    pub fn encode<T: Serialize>(self, value: &T) -> Result<Vec<u8>, String> {
        match self {
            ValueFormat::Json => serde_json::to_vec(value).map_err(|e| e.to_string()),
            ValueFormat::Binary => koala_types::encode(value).map_err(|e| e.to_string()),
        }
    }

    /// Decodes a value written in this format.
    pub fn decode<T: serde::de::DeserializeOwned>(self, bytes: &[u8]) -> Result<T, String> {
        match self {
            ValueFormat::Json => serde_json::from_slice(bytes).map_err(|e| e.to_string()),
            ValueFormat::Binary => koala_types::decode(bytes).map_err(|e| e.to_string()),
        }
    }
}

impl fmt::Display for ValueFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ValueFormat::Json => "json",
            ValueFormat::Binary => "binary",
        })
    }
}

impl FromStr for ValueFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "json" => Ok(ValueFormat::Json),
            "binary" => Ok(ValueFormat::Binary),
            other => Err(format!("unknown value format {other:?} (expected json or binary)")),
        }
    }
}

/// How long one Kafka operation may retry before it gives up and returns an error (rskafka retries
/// forever by default, which would hang a task thread on a dead broker).
pub(crate) const REQUEST_DEADLINE: Duration = Duration::from_secs(10);

/// How long one connector call (including rskafka's retries) may block its thread.
pub(crate) const CALL_LIMIT: Duration = Duration::from_secs(20);

/// A current-thread tokio runtime for one connector object.
pub(crate) fn io_runtime() -> Result<tokio::runtime::Runtime, ConnectorError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| ConnectorError::io("starting a tokio runtime for kafka i/o", e))
}

/// Runs `fut` on `rt`, giving up after `limit`: rskafka has no request timeout, so a peer that
/// accepts connections but never answers would otherwise hang the calling task thread.
pub(crate) fn block_on_within<T>(
    rt: &tokio::runtime::Runtime,
    limit: Duration,
    what: &str,
    fut: impl Future<Output = Result<T, ConnectorError>>,
) -> Result<T, ConnectorError> {
    rt.block_on(within(limit, what, fut))
}

/// `fut`, failing with [`ConnectorError::Timeout`] after `limit`.
pub(crate) async fn within<T>(
    limit: Duration,
    what: &str,
    fut: impl Future<Output = Result<T, ConnectorError>>,
) -> Result<T, ConnectorError> {
    tokio::time::timeout(limit, fut)
        .await
        .unwrap_or_else(|_| Err(ConnectorError::Timeout { what: what.to_string(), after: limit }))
}

/// Connects to a Kafka cluster; every request retries for at most `deadline`.
pub(crate) async fn connect(brokers: &[String], deadline: Duration) -> Result<Client, ConnectorError> {
    let backoff = BackoffConfig {
        init_backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(500),
        base: 2.0,
        deadline: Some(deadline),
    };
    ClientBuilder::new(brokers.to_vec())
        .client_id("koala")
        .backoff_config(backoff)
        .build()
        .await
        .map_err(|e| ConnectorError::kafka(format!("connecting to {}", brokers.join(",")), e))
}

/// Wall-clock milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn value_formats_round_trip_and_parse() {
        let value = (7u64, "seven".to_string());
        for format in [ValueFormat::Json, ValueFormat::Binary] {
            let bytes = format.encode(&value).expect("encodes");
            assert_eq!(format.decode::<(u64, String)>(&bytes), Ok(value.clone()));
            assert_eq!(format.to_string().parse::<ValueFormat>(), Ok(format));
        }
        assert!(ValueFormat::Json.decode::<(u64, String)>(b"{oops").is_err());
        assert!("xml".parse::<ValueFormat>().is_err_and(|e| e.contains("xml")));
    }
}
