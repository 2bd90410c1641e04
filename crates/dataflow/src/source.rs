//! Sources: the rate schedule and watermark options the runtime applies to every source task.

use serde::{Deserialize, Serialize};

/// One step of a rate schedule: from `at_ms` after the job starts, emit `records_per_sec` records
/// per second in total over all tasks of the source.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateStep {
    /// Milliseconds after the start of the job at which this rate begins.
    pub at_ms: u64,
    /// Records per second over all source tasks; 0 means "as fast as possible".
    pub records_per_sec: f64,
}

/// A piecewise-constant rate over time. An empty schedule means "as fast as possible".
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RateSchedule(pub Vec<RateStep>);

impl RateSchedule {
    /// As fast as the job can take it.
    pub fn unlimited() -> Self {
        Self(Vec::new())
    }

    /// One constant rate from the start.
    pub fn constant(records_per_sec: f64) -> Self {
        Self(vec![RateStep { at_ms: 0, records_per_sec }])
    }

    /// The milliseconds after start at which the `n`-th record (0-based) of a task that owns
    /// `1/parallelism` of the rate is due, or `None` when the schedule is unlimited at that point.
    pub fn due_ms(&self, n: u64, parallelism: u32) -> Option<f64> {
        let share = f64::from(parallelism.max(1));
        let mut emitted = 0.0_f64; // records due before the current step started
        let target = n as f64;
        for (i, step) in self.0.iter().enumerate() {
            let rate = step.records_per_sec / share;
            if rate <= 0.0 {
                return None;
            }
            let end = self.0.get(i + 1).map(|s| s.at_ms as f64);
            let in_step = end.map(|e| (e - step.at_ms as f64) / 1000.0 * rate);
            match in_step {
                Some(count) if emitted + count <= target => emitted += count,
                _ => return Some(step.at_ms as f64 + (target - emitted) / rate * 1000.0),
            }
        }
        None
    }
}

/// How the runtime drives a source task.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SourceOptions {
    /// Emission rate over time.
    pub rate: RateSchedule,
    /// Bounded disorder: the watermark is the maximum event time seen minus this.
    pub max_disorder_ms: u64,
    /// How often (wall clock) a watermark is emitted.
    pub watermark_interval_ms: u64,
}

impl SourceOptions {
    /// Checks the schedule, naming the first step at fault (`source.rate[i]`) and the fix.
    pub fn validate(&self) -> Result<(), String> {
        let mut last_at = None;
        for (i, step) in self.rate.0.iter().enumerate() {
            if !(step.records_per_sec.is_finite() && step.records_per_sec >= 0.0) {
                return Err(format!(
                    "source.rate[{i}].records_per_sec = {}: give a rate ≥ 0 records per second over all source tasks (0 = as fast as possible)",
                    step.records_per_sec
                ));
            }
            if last_at.is_some_and(|last| step.at_ms <= last) {
                return Err(format!(
                    "source.rate[{i}].at_ms = {}: the steps must start at increasing times (the step before starts at {} ms)",
                    step.at_ms,
                    last_at.unwrap_or(0)
                ));
            }
            last_at = Some(step.at_ms);
        }
        Ok(())
    }
}

impl Default for SourceOptions {
    fn default() -> Self {
        Self { rate: RateSchedule::unlimited(), max_disorder_ms: 0, watermark_interval_ms: 100 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_negative_or_unordered_rate_is_refused_by_name() {
        let with =
            |steps: Vec<RateStep>| SourceOptions { rate: RateSchedule(steps), ..SourceOptions::default() };
        let negative = with(vec![RateStep { at_ms: 0, records_per_sec: -50_000.0 }]);
        let err = negative.validate().expect_err("negative rate");
        assert!(err.contains("source.rate[0].records_per_sec = -50000"), "{err}");
        let nan = with(vec![
            RateStep { at_ms: 0, records_per_sec: 10.0 },
            RateStep { at_ms: 5, records_per_sec: f64::NAN },
        ]);
        assert!(nan.validate().is_err_and(|e| e.contains("source.rate[1]")));
        let unordered = with(vec![
            RateStep { at_ms: 1000, records_per_sec: 10.0 },
            RateStep { at_ms: 1000, records_per_sec: 20.0 },
        ]);
        assert!(unordered.validate().is_err_and(|e| e.contains("source.rate[1].at_ms = 1000")));
        let fine = with(vec![
            RateStep { at_ms: 0, records_per_sec: 0.0 },
            RateStep { at_ms: 10, records_per_sec: 5.0 },
        ]);
        assert_eq!(fine.validate(), Ok(()));
    }

    #[test]
    fn due_times_follow_the_steps() {
        let s = RateSchedule(vec![
            RateStep { at_ms: 0, records_per_sec: 1000.0 },
            RateStep { at_ms: 1000, records_per_sec: 2000.0 },
        ]);
        // One task: record 500 due at 500 ms; record 1000 starts step 2; record 2000 at 1500 ms.
        assert_eq!(s.due_ms(500, 1), Some(500.0));
        assert_eq!(s.due_ms(1000, 1), Some(1000.0));
        assert_eq!(s.due_ms(2000, 1), Some(1500.0));
        // Two tasks share the rate: each gets half.
        assert_eq!(s.due_ms(500, 2), Some(1000.0));
        assert_eq!(RateSchedule::unlimited().due_ms(7, 1), None);
    }
}
