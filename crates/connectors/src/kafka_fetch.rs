//! Reading one partition for a [`KafkaSource`](crate::KafkaSource): a Fetch from an offset
//! (skipping to the earliest retained one when the offset is gone), the partition's end, and
//! [`StartAt`], where a partition without a position starts.

use std::time::Duration;

use rskafka::client::{
    error::{Error as KafkaError, ProtocolError},
    partition::{OffsetAt, PartitionClient},
};
use rskafka::record::RecordAndOffset;
use serde::{Deserialize, Serialize};

use crate::{ConnectorError, within};

/// Where a source task starts reading a partition it has no position for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StartAt {
    /// The earliest retained offset: a re-run reads the whole topic again.
    #[default]
    Earliest,
    /// The partition's end when the task connects: only records produced from then on.
    Latest,
    /// The offset the consumer group committed (earliest if it never did); the source commits
    /// its positions as it goes.
    Committed,
}

impl std::fmt::Display for StartAt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Earliest => "earliest",
            Self::Latest => "latest",
            Self::Committed => "committed",
        })
    }
}

pub(crate) enum Fetched {
    Records(Vec<RecordAndOffset>, i64),
    /// The requested offset is gone (retention); the earliest retained offset.
    Moved(i64),
}

pub(crate) async fn fetch_from(
    client: &PartitionClient,
    at: i64,
    bytes: i32,
    wait: i32,
) -> Result<Fetched, ConnectorError> {
    match client.fetch_records(at, 1..bytes, wait).await {
        Ok((records, hw)) => Ok(Fetched::Records(records, hw)),
        Err(KafkaError::ServerError { protocol_error: ProtocolError::OffsetOutOfRange, .. }) => {
            let earliest = client
                .get_offset(OffsetAt::Earliest)
                .await
                .map_err(|e| ConnectorError::kafka("listing the earliest offset", e))?;
            if earliest > at {
                Ok(Fetched::Moved(earliest))
            } else {
                // Ahead of the head (e.g. a position from a recreated topic): nothing to read yet.
                Ok(Fetched::Records(Vec::new(), at))
            }
        }
        Err(e) => Err(ConnectorError::kafka(
            format!("fetching {}/{} at {at}", client.topic(), client.partition()),
            e,
        )),
    }
}

/// The end of a partition (its high watermark: the offset the next record produced gets), from a
/// Fetch response, as the source reads it everywhere (tansu's memory engine answers
/// ListOffsets(latest) wrongly).
pub(crate) async fn end_offset(client: &PartitionClient) -> Result<i64, ConnectorError> {
    let limit = Duration::from_secs(10);
    match within(limit, "reading the end of a partition", fetch_from(client, 0, 2, 0)).await? {
        Fetched::Records(_, hw) => Ok(hw),
        Fetched::Moved(earliest) => {
            match within(limit, "reading the end of a partition", fetch_from(client, earliest, 2, 0)).await? {
                Fetched::Records(_, hw) => Ok(hw),
                Fetched::Moved(_) => Err(ConnectorError::Config(format!(
                    "kafka: {}/{}: the earliest offset moved while reading the end",
                    client.topic(),
                    client.partition()
                ))),
            }
        }
    }
}
