//! Where a source is in its input: what a checkpoint records per source task and what a
//! restored source resumes from (docs/architecture.md §10). Each kind of source says what it
//! needs to resume exactly — a deterministic generator the number of records it emitted, a
//! Kafka source the next offset of each partition it reads.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A source task's position at a checkpoint barrier.
///
/// ```
/// use koala_types::{PartitionOffset, SourcePosition};
/// assert_eq!(SourcePosition::Records(12).to_string(), "12 records");
/// let at = |partition, offset| PartitionOffset { topic: "bids".into(), partition, offset };
/// assert_eq!(SourcePosition::Offsets(vec![at(0, 40), at(2, 7)]).to_string(), "offsets bids/0:40 bids/2:7");
/// assert_eq!(SourcePosition::Finished.to_string(), "finished");
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SourcePosition {
    /// Records emitted before the barrier: a restored generator regenerates and skips them
    /// (generators are deterministic per task).
    Records(u64),
    /// The offset of the next record to emit of every partition the task had opened: a restored
    /// Kafka source seeks each partition there.
    Offsets(Vec<PartitionOffset>),
    /// The source had finished: a restored one emits nothing.
    Finished,
}

impl fmt::Display for SourcePosition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Records(n) => write!(f, "{n} records"),
            Self::Offsets(offsets) if offsets.is_empty() => f.write_str("offsets (no partition opened)"),
            Self::Offsets(offsets) => {
                f.write_str("offsets")?;
                for PartitionOffset { topic, partition, offset } in offsets {
                    write!(f, " {topic}/{partition}:{offset}")?;
                }
                Ok(())
            }
            Self::Finished => f.write_str("finished"),
        }
    }
}

/// Where a source is in one partition of a Kafka topic.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PartitionOffset {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The offset of the next record to emit.
    pub offset: i64,
}
