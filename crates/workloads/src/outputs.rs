//! The values the registered queries emit (one JSON object per line in their sinks).

use serde::{Deserialize, Serialize};

/// `keyed-aggregate`: running count and sum of a key, after each of its events.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct KeyedTotal {
    /// The key.
    pub key: u64,
    /// Events of the key so far.
    pub count: u64,
    /// Sum of their values.
    pub sum: i64,
}

/// `last-n`: the newest values of a key (oldest first), after each of its events.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct LastN {
    /// The key.
    pub key: u64,
    /// Up to `last_n` values, oldest first.
    pub values: Vec<i64>,
}

/// `tumbling-window` / `sliding-window`: count and sum of a key's events in one window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct WindowTotal {
    /// The key.
    pub key: u64,
    /// Window start (inclusive).
    pub start: u64,
    /// Window end (exclusive).
    pub end: u64,
    /// Events of the key in the window.
    pub count: u64,
    /// Sum of their values.
    pub sum: i64,
}

/// `window-join`: one left and one right event of a key in the same window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct JoinPair {
    /// The key.
    pub key: u64,
    /// Window start.
    pub start: u64,
    /// Sequence number of the left event.
    pub left_seq: u64,
    /// Sequence number of the right event.
    pub right_seq: u64,
}

/// `keyed-join`: one left and one right event of a key (unwindowed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct KeyedJoinPair {
    /// The key.
    pub key: u64,
    /// Sequence number of the left event.
    pub left_seq: u64,
    /// Sequence number of the right event.
    pub right_seq: u64,
}

/// `two-stage-aggregate`: records so far of one group of keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct GroupCount {
    /// The group (key mod 16).
    pub key: u64,
    /// Records of the group so far.
    pub count: u64,
}
