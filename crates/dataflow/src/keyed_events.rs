//! The built-in keyed-event generator: a deterministic stream of `(key, seq, value)` events with
//! configurable key skew (hot keys), temporal locality (a sliding set of active keys) and bounded
//! event-time disorder. Used by the workloads and by the oracle tests (docs/testing.md §1), which
//! recompute the expected output from [`KeyedEvents::all_records`].
//!
//! Determinism: with source parallelism `n`, the event with global sequence number `s` is a pure
//! function of `(config, n, s)`. Task `i` generates `s = i, i + n, i + 2n, ...` and only keys
//! `k` with `k % n == i`, so all events of a key come from one task, in `s` order.

use koala_types::Timestamp;
use serde::{Deserialize, Serialize};

use crate::builder::Dataflow;
use crate::generator::{Generator, splitmix64};
use crate::graph::TaskInstance;
use crate::logic::DataflowError;
use crate::source::{RateSchedule, SourceOptions};
use crate::stream::Stream;

/// One generated event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct KeyedEvent {
    /// The key, in `0..key_space`.
    pub key: u64,
    /// Global sequence number (unique per generator).
    pub seq: u64,
    /// A value in `min_value..=max_value`.
    pub value: i64,
}

/// How [`KeyedEvents`] generates. Every field has a default; unknown fields are rejected.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KeyedEventsConfig {
    /// Number of distinct keys: keys are `0..key_space`. Should be at least the source
    /// parallelism (task `i >= key_space` would otherwise only generate key `i`).
    pub key_space: u64,
    /// Fraction (0..=1) of events that go to the hot keys.
    pub hot_key_ratio: f64,
    /// Number of hot keys: keys `0..hot_keys` (with source parallelism `n`, each task's hot keys
    /// are these keys moved into its residue class `k % n == i`).
    pub hot_keys: u64,
    /// Temporal locality: non-hot events only use a window of this many consecutive keys, which
    /// moves forward by one key every `active_shift_records` events (wrapping around the key
    /// space). 0 = the whole key space is active all the time.
    pub active_keys: u64,
    /// Events (global sequence numbers) per one-key move of the active window.
    pub active_shift_records: u64,
    /// Total number of events over all tasks; absent (the default) = unbounded.
    pub records: Option<u64>,
    /// Seed of all random choices.
    pub seed: u64,
    /// Event time advances by this much per global sequence number. Absent (the default): a
    /// record's event time is the time it is due under the source's rate schedule
    /// (`[params.source] rate`): sequence number `s` at the schedule's `s`-th record of the whole
    /// source, so windows of 1 s at 50 000 records/s hold 50 000 records; 1 ms per sequence
    /// number where the schedule is unlimited (rate 0 or none).
    pub time_step_ms: Option<u64>,
    /// Event times get a random jitter in `0..max_disorder_ms` (keep the source's
    /// `max_disorder_ms` at least this large, or records arrive behind the watermark).
    pub max_disorder_ms: u64,
    /// Event time of sequence number 0 (before jitter).
    pub start_time_ms: u64,
    /// Smallest value.
    pub min_value: i64,
    /// Largest value (inclusive).
    pub max_value: i64,
    /// The source's rate schedule, which places event times when `time_step_ms` is absent: set
    /// from the source's options by [`KeyedEvents::source`] (or [`Self::with_rate`]), never read
    /// from `[params.generator]`.
    #[serde(skip)]
    pub rate: RateSchedule,
}

impl Default for KeyedEventsConfig {
    fn default() -> Self {
        Self {
            key_space: 1000,
            hot_key_ratio: 0.0,
            hot_keys: 0,
            active_keys: 0,
            active_shift_records: 10,
            records: None,
            seed: 0,
            time_step_ms: None,
            max_disorder_ms: 0,
            start_time_ms: 0,
            min_value: 0,
            max_value: 100,
            rate: RateSchedule::unlimited(),
        }
    }
}

impl KeyedEventsConfig {
    /// This config with event times placed by `rate` (unless `time_step_ms` is set).
    pub fn with_rate(self, rate: RateSchedule) -> Self {
        Self { rate, ..self }
    }

    /// Event time of sequence number `seq` before jitter, ms: `start_time_ms` plus `seq ×
    /// time_step_ms` if that is set, else plus the time record `seq` of the whole source is due
    /// under the rate schedule (1 ms per record where the schedule is unlimited).
    ///
    /// ```
    /// use koala_dataflow::{KeyedEventsConfig, RateSchedule};
    /// let at_50k = KeyedEventsConfig::default().with_rate(RateSchedule::constant(50_000.0));
    /// assert_eq!((at_50k.base_time_ms(49_999), at_50k.base_time_ms(50_000)), (999, 1000));
    /// let stepped = KeyedEventsConfig { time_step_ms: Some(1), ..at_50k };
    /// assert_eq!(stepped.base_time_ms(50_000), 50_000);
    /// ```
    pub fn base_time_ms(&self, seq: u64) -> u64 {
        let offset = match self.time_step_ms {
            Some(step) => seq.saturating_mul(step),
            None => self.rate.due_ms(seq, 1).map_or(seq, |ms| ms.floor() as u64),
        };
        self.start_time_ms.saturating_add(offset)
    }

    /// Checks the fields are consistent, naming the first that is not.
    pub fn validate(&self) -> Result<(), DataflowError> {
        let problem = if self.key_space == 0 {
            Some("key_space must be positive".to_string())
        } else if !(0.0..=1.0).contains(&self.hot_key_ratio) {
            Some(format!("hot_key_ratio must be within 0..=1, got {}", self.hot_key_ratio))
        } else if self.hot_key_ratio > 0.0 && self.hot_keys == 0 {
            Some("hot_key_ratio > 0 needs hot_keys > 0".to_string())
        } else if self.hot_keys > self.key_space {
            Some(format!("hot_keys ({}) exceeds key_space ({})", self.hot_keys, self.key_space))
        } else if self.active_keys > self.key_space {
            Some(format!("active_keys ({}) exceeds key_space ({})", self.active_keys, self.key_space))
        } else if self.active_keys > 0 && self.active_shift_records == 0 {
            Some("active_shift_records must be positive when active_keys > 0".to_string())
        } else if self.min_value > self.max_value {
            Some(format!("min_value ({}) exceeds max_value ({})", self.min_value, self.max_value))
        } else {
            None
        };
        match problem {
            Some(p) => Err(DataflowError::Other(format!("keyed events generator: {p}"))),
            None => Ok(()),
        }
    }
}

/// Independent random lanes of one event.
#[derive(Clone, Copy)]
enum Lane {
    Key = 1,
    Hot = 2,
    Value = 3,
    Jitter = 4,
}

/// A random number that is a pure function of (seed, lane, seq).
fn random(seed: u64, lane: Lane, seq: u64) -> u64 {
    let stream = splitmix64(seed ^ splitmix64(lane as u64));
    splitmix64(stream.wrapping_add(seq.wrapping_mul(0x9E37_79B9_7F4A_7C15)))
}

/// A uniform fraction in `[0, 1)`.
fn unit(x: u64) -> f64 {
    (x >> 11) as f64 / (1u64 << 53) as f64
}

/// The key of residue class `task` (mod `n`) nearest below `logical`, within the key space.
fn project(logical: u64, task: u64, n: u64, key_space: u64) -> u64 {
    let base = logical - logical % n;
    let key = base + task;
    if key < key_space {
        key
    } else if base >= n {
        key - n
    } else {
        task // the key space has no key of this residue class
    }
}

/// The keyed-event generator of one source task.
///
/// ```
/// use koala_dataflow::{KeyedEvents, KeyedEventsConfig, Generator, TaskInstance};
///
/// let config = KeyedEventsConfig { key_space: 10, records: Some(6), ..Default::default() };
/// // Task 1 of 2 generates the odd sequence numbers, with odd keys only.
/// let mut task1 = KeyedEvents::new(config.clone(), TaskInstance { index: 1, parallelism: 2 });
/// let mut seqs = Vec::new();
/// while let Some((event, _time)) = task1.next() {
///     assert_eq!(event.key % 2, 1);
///     seqs.push(event.seq);
/// }
/// assert_eq!(seqs, vec![1, 3, 5]);
/// // The same events, recomputed independently.
/// let all = KeyedEvents::all_records(&config, 2);
/// assert_eq!(all.len(), 6);
/// assert_eq!(all[3], KeyedEvents::event_at(&config, 2, 3));
/// ```
#[derive(Clone, Debug)]
pub struct KeyedEvents {
    config: KeyedEventsConfig,
    parallelism: u64,
    next_seq: u64,
}

impl KeyedEvents {
    /// The generator of `task`.
    pub fn new(config: KeyedEventsConfig, task: TaskInstance) -> Self {
        Self { config, parallelism: u64::from(task.parallelism.max(1)), next_seq: u64::from(task.index) }
    }

    /// Adds a source named `name` whose tasks generate these events.
    ///
    /// ```
    /// # use koala_dataflow::{Dataflow, KeyedEvents, KeyedEventsConfig, SourceOptions, local};
    /// let df = Dataflow::new();
    /// let config = KeyedEventsConfig { records: Some(5), ..Default::default() };
    /// KeyedEvents::source(&df, "events", SourceOptions::default(), config).sink_discard("sink");
    /// assert!(local::run(&df.build()?).is_ok());
    /// # Ok::<(), koala_dataflow::DataflowError>(())
    /// ```
    pub fn source(
        df: &Dataflow,
        name: &str,
        options: SourceOptions,
        config: KeyedEventsConfig,
    ) -> Stream<KeyedEvent> {
        let config = config.with_rate(options.rate.clone());
        df.source(name, options, move |task| KeyedEvents::new(config.clone(), task))
    }

    /// The event with global sequence number `seq` when the source has `parallelism` tasks.
    pub fn event_at(config: &KeyedEventsConfig, parallelism: u32, seq: u64) -> (KeyedEvent, Timestamp) {
        let n = u64::from(parallelism.max(1));
        let key_space = config.key_space.max(1);
        let seed = config.seed;
        let r_key = random(seed, Lane::Key, seq);
        let hot = config.hot_keys > 0 && unit(random(seed, Lane::Hot, seq)) < config.hot_key_ratio;
        let logical = if hot {
            r_key % config.hot_keys.min(key_space)
        } else if config.active_keys > 0 {
            let offset = seq / config.active_shift_records.max(1);
            (offset % key_space + r_key % config.active_keys.min(key_space)) % key_space
        } else {
            r_key % key_space
        };
        let key = project(logical, seq % n, n, key_space);
        let (lo, hi) = (i128::from(config.min_value), i128::from(config.max_value.max(config.min_value)));
        let span = (hi - lo + 1).unsigned_abs();
        let offset = (u128::from(random(seed, Lane::Value, seq)) % span) as i128;
        let value = i64::try_from(lo + offset).unwrap_or(config.min_value);
        let jitter = match config.max_disorder_ms {
            0 => 0,
            d => random(seed, Lane::Jitter, seq) % d,
        };
        let time = config.base_time_ms(seq).saturating_add(jitter);
        (KeyedEvent { key, seq, value }, time)
    }

    /// Every event of a bounded config in global sequence order (empty if `records` is `None`).
    pub fn all_records(config: &KeyedEventsConfig, parallelism: u32) -> Vec<(KeyedEvent, Timestamp)> {
        let count = config.records.unwrap_or(0);
        (0..count).map(|seq| Self::event_at(config, parallelism, seq)).collect()
    }
}

impl Generator<KeyedEvent> for KeyedEvents {
    fn next(&mut self) -> Option<(KeyedEvent, Timestamp)> {
        let seq = self.next_seq;
        if self.config.records.is_some_and(|total| seq >= total) {
            return None;
        }
        self.next_seq = seq.checked_add(self.parallelism)?;
        let parallelism = u32::try_from(self.parallelism).unwrap_or(u32::MAX);
        Some(Self::event_at(&self.config, parallelism, seq))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> KeyedEventsConfig {
        KeyedEventsConfig {
            key_space: 50,
            records: Some(2000),
            max_disorder_ms: 7,
            time_step_ms: Some(3),
            seed: 42,
            min_value: -5,
            max_value: 5,
            ..Default::default()
        }
    }

    #[test]
    fn tasks_partition_sequence_numbers_and_keys() {
        let c = config();
        for n in 1..=4u32 {
            let mut seqs = Vec::new();
            for i in 0..n {
                let mut g = KeyedEvents::new(c.clone(), TaskInstance { index: i, parallelism: n });
                while let Some((e, t)) = g.next() {
                    assert_eq!(e.key % u64::from(n), u64::from(i));
                    assert!(e.key < c.key_space);
                    assert!((-5..=5).contains(&e.value));
                    assert_eq!((e, t), KeyedEvents::event_at(&c, n, e.seq));
                    seqs.push(e.seq);
                }
            }
            seqs.sort_unstable();
            assert_eq!(seqs, (0..2000).collect::<Vec<_>>());
        }
    }

    #[test]
    fn disorder_is_bounded() {
        let c = config();
        let all = KeyedEvents::all_records(&c, 1);
        let mut max_seen = 0;
        for (_, t) in all {
            assert!(t + c.max_disorder_ms > max_seen, "watermark would pass a record");
            max_seen = max_seen.max(t);
        }
    }

    #[test]
    fn hot_keys_get_their_share() {
        let c = KeyedEventsConfig {
            hot_key_ratio: 0.5,
            hot_keys: 1,
            key_space: 1000,
            records: Some(10_000),
            ..Default::default()
        };
        let hot = KeyedEvents::all_records(&c, 1).iter().filter(|(e, _)| e.key == 0).count();
        assert!((4500..5500).contains(&hot), "{hot}");
    }

    #[test]
    fn active_window_moves_forward() {
        let c = KeyedEventsConfig {
            active_keys: 10,
            active_shift_records: 100,
            key_space: 1000,
            records: Some(1000),
            ..Default::default()
        };
        for (e, _) in KeyedEvents::all_records(&c, 1) {
            let offset = e.seq / 100;
            assert!((offset..offset + 10).contains(&e.key), "{e:?}");
        }
    }

    #[test]
    fn invalid_configs_name_the_field() {
        let c = KeyedEventsConfig { hot_key_ratio: 2.0, ..Default::default() };
        let err = c.validate().err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("hot_key_ratio"), "{err}");
        assert!(KeyedEventsConfig::default().validate().is_ok());
        let parsed: Result<KeyedEventsConfig, _> = serde_json::from_str(r#"{"keyspace": 3}"#);
        assert!(parsed.is_err());
    }

    #[test]
    fn event_time_defaults_to_the_due_time_under_the_rate_schedule() {
        // 50 000 records/s for 2 s, then 10 000/s: one-second windows hold 50 000, 50 000, then
        // 10 000 records, whatever the source parallelism.
        let rate = RateSchedule(vec![
            crate::RateStep { at_ms: 0, records_per_sec: 50_000.0 },
            crate::RateStep { at_ms: 2000, records_per_sec: 10_000.0 },
        ]);
        let config = KeyedEventsConfig { records: Some(120_000), ..Default::default() }.with_rate(rate);
        for n in [1, 3] {
            let mut per_second = std::collections::BTreeMap::<u64, u64>::new();
            for (_, time) in KeyedEvents::all_records(&config, n) {
                *per_second.entry(time / 1000).or_default() += 1;
            }
            assert_eq!(
                per_second.into_iter().collect::<Vec<_>>(),
                vec![(0, 50_000), (1, 50_000), (2, 10_000), (3, 10_000)]
            );
        }
        // `time_step_ms` overrides the schedule; without a schedule a record is 1 ms.
        let stepped = KeyedEventsConfig { time_step_ms: Some(2), ..config.clone() };
        assert_eq!(KeyedEvents::event_at(&stepped, 1, 50_000).1, 100_000);
        let unlimited = KeyedEventsConfig { rate: RateSchedule::unlimited(), ..config };
        assert_eq!(KeyedEvents::event_at(&unlimited, 1, 50_000).1, 50_000);
        // The schedule is never read from the generator's own table.
        assert!(serde_json::from_str::<KeyedEventsConfig>(r#"{"rate": []}"#).is_err());
    }
}
