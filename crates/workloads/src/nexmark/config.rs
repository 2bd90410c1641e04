//! Knobs of the Nexmark generator (docs/architecture.md §12), loadable from TOML/JSON with
//! `deny_unknown_fields` so a misspelt knob is an error, not a silent default.

use koala_dataflow::RateSchedule;
use serde::{Deserialize, Serialize};

/// A Nexmark generator configuration was rejected; the message names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid nexmark config: {0}")]
pub struct NexmarkConfigError(pub String);

/// How the generator shapes its events.
///
/// Several producers split one event sequence: producer `i` of `k` generates the global event
/// numbers `first_event + j·k + i` for `j = 0, 1, …`, so their id subsequences are disjoint and
/// together they generate exactly what one producer would.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NexmarkConfig {
    /// Events to generate over all producers (counted from `first_event`); `None` = unbounded.
    pub events: Option<u64>,
    /// Global number of the first event: continues the id sequence after a warm-up run.
    pub first_event: u64,
    /// Records per second over all producers, in steps. Used by `koala produce`; an embedded
    /// generator is paced by its source's `SourceOptions` instead.
    pub rate: RateSchedule,
    /// Probability that a seller, bidder or bid's auction is the hot key of its block.
    pub hot_ratio: f64,
    /// Width (in ids) of a hot-key block: the hot key is the first id of the block that holds the
    /// newest id, so the hot key drifts as ids grow.
    pub hot_range: u64,
    /// Active key window: a non-hot seller or bidder is uniform over the newest this-many people.
    pub active_people: u64,
    /// A non-hot bid is on one of the newest this-many auctions.
    pub active_auctions: u64,
    /// Number of auction categories.
    pub num_categories: u64,
    /// Extra payload characters added to every event (`extra` field).
    pub extra_payload_bytes: usize,
    /// Number of producers sharing the event sequence (= partitions per topic when producing).
    pub producers: u32,
    /// Which producer this generator is, `0 ≤ producer_index < producers`.
    pub producer_index: u32,
    /// Warm-up mode: every seller, bidder and bid's auction is a new sequential key (the event
    /// number), to build large state before a measured run.
    pub warmup: bool,
    /// Event time of event number 0, in milliseconds.
    pub base_time_ms: u64,
    /// Event time between consecutive event numbers, in microseconds.
    pub inter_event_delay_us: u64,
    /// Mean auction duration (event time, ms): `expires` is uniform in `[d/2, 3d/2)` after opening.
    pub auction_duration_ms: u64,
    /// Seed of the per-event pseudo-random choices.
    pub seed: u64,
}

impl Default for NexmarkConfig {
    fn default() -> Self {
        Self {
            events: None,
            first_event: 0,
            rate: RateSchedule::unlimited(),
            hot_ratio: 0.0,
            hot_range: 100,
            active_people: 100,
            active_auctions: 30_000,
            num_categories: 10,
            extra_payload_bytes: 0,
            producers: 1,
            producer_index: 0,
            warmup: false,
            base_time_ms: 0,
            inter_event_delay_us: 1_000,
            auction_duration_ms: 10_000,
            seed: 0x006b_6f61_6c61, // "koala"
        }
    }
}

impl NexmarkConfig {
    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<(), NexmarkConfigError> {
        let bad = |msg: String| Err(NexmarkConfigError(msg));
        if !(0.0..=1.0).contains(&self.hot_ratio) {
            return bad(format!("hot_ratio must be within [0, 1], got {}", self.hot_ratio));
        }
        for (name, value) in [
            ("hot_range", self.hot_range),
            ("active_people", self.active_people),
            ("active_auctions", self.active_auctions),
            ("num_categories", self.num_categories),
            ("auction_duration_ms", self.auction_duration_ms),
        ] {
            if value == 0 {
                return bad(format!("{name} must be at least 1"));
            }
        }
        if self.producers == 0 {
            return bad("producers must be at least 1".into());
        }
        if self.producer_index >= self.producers {
            return bad(format!(
                "producer_index {} must be below producers ({})",
                self.producer_index, self.producers
            ));
        }
        for (i, step) in self.rate.0.iter().enumerate() {
            if !(step.records_per_sec >= 0.0 && step.records_per_sec.is_finite()) {
                return bad(format!("rate step {i}: records_per_sec must be a finite number ≥ 0"));
            }
            if i > 0 && step.at_ms <= self.rate.0[i - 1].at_ms {
                return bad(format!("rate step {i}: at_ms must increase"));
            }
        }
        Ok(())
    }

    /// The same configuration for producer `index` of `producers`.
    pub fn for_producer(&self, index: u32, producers: u32) -> Self {
        Self { producer_index: index, producers, ..self.clone() }
    }
}
