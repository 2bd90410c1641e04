//! How long a reconfiguration took to recover from, one definition for every protocol and every
//! command that prints it (`koala report`, `run`, `demo`, `compare`, `experiment`, the HTTP API;
//! docs/architecture.md §9), and the bound beside it that no protocol can beat.
//!
//! - [`recovery_s`]: seconds from a reconfiguration's start until a per-second latency series is
//!   back within [`RECOVERY_FACTOR`] × its level before the overload began and stays there
//!   [`RECOVERY_HOLD_S`] seconds. The **recovery** is read on the worst sink's end-to-end
//!   latency **p99**; the same rule on its median and on mean source lag gives the two figures
//!   printed beside it, each named (the median hides the slow tail a user waits for; source lag
//!   misses records already inside the job).
//! - [`DrainLimit`]: the backlog at the start ÷ (the capacity after − the offered rate): the
//!   seconds the backlog takes to drain at full capacity, which no protocol can beat.

use std::collections::BTreeMap;
use std::fmt;

use super::derived::{BASELINE_S, DISRUPTION_WINDOW_S, fmt_records};

/// Seconds a series must stay within its threshold to count as recovered.
pub const RECOVERY_HOLD_S: i64 = 5;
/// A second is healthy at or under this many times the series' level before the overload ...
pub const RECOVERY_FACTOR: f64 = 2.0;
/// ... or this many ms above that level, whichever is higher: a level of a few milliseconds
/// doubles within the noise of a shared machine without any backlog behind it.
pub const RECOVERY_MIN_EXCESS_MS: f64 = 20.0;

/// How the recovery printed first is read, in words: `e2e p99 (worst sink) back within 2× its
/// level before the surge for 5 s`.
pub fn recovery_rule() -> String {
    format!(
        "e2e p99 (worst sink) back within {RECOVERY_FACTOR}× its level before the surge for {RECOVERY_HOLD_S} s"
    )
}

/// Recovery time of a reconfiguration starting at second `start_t_s`, in seconds, from a
/// per-second latency series `series` (ms; `None` = no sample that second).
///
/// pre = the series' mean over the [`BASELINE_S`] seconds before `overload_t_s` (the second the
/// offered rate last went up at or before the start; the start itself if none or unknown);
/// threshold = max([`RECOVERY_FACTOR`] × pre, pre + [`RECOVERY_MIN_EXCESS_MS`]). A second is
/// *healthy* if it has a sample at or under the threshold. If every second of
/// `[start, start + DISRUPTION_WINDOW_S)` that the series covers is healthy, recovery is 0.
/// Otherwise, after the first unhealthy second, recovery ends at the first second that begins
/// [`RECOVERY_HOLD_S`] healthy seconds in a row; the result is that second − start. Only seconds
/// up to `input_last_t_s` (the input's last second; the series' last if `None`) are judged: once
/// the input ended there is no latency to measure. `None` if there is no sample before the
/// overload, or the series never recovers while input lasts.
///
/// ```
/// use koala_coordinator::report::recovery_s;
/// // p99 40 ms before a surge at 10 s, up to 2 s at the reconfiguration (15 s), back under
/// // 80 ms (2 × 40) from 24 s on: recovered 9 s after the start.
/// let p99: Vec<(i64, Option<f64>)> = (0..40)
///     .map(|t| (t, Some(match t { 0..=9 => 40.0, 10..=23 => 2000.0, _ => 70.0 })))
///     .collect();
/// assert_eq!(recovery_s(&p99, 15, Some(10), None), Some(9));
/// ```
pub fn recovery_s(
    series: &[(i64, Option<f64>)],
    start_t_s: i64,
    overload_t_s: Option<i64>,
    input_last_t_s: Option<i64>,
) -> Option<u64> {
    let by_second: BTreeMap<i64, f64> = series.iter().filter_map(|&(t, v)| Some((t, v?))).collect();
    let base_end = overload_t_s.map_or(start_t_s, |o| o.min(start_t_s));
    let before: Vec<f64> = by_second.range(base_end - BASELINE_S..base_end).map(|(_, v)| *v).collect();
    if before.is_empty() {
        return None;
    }
    let pre = before.iter().sum::<f64>() / before.len() as f64;
    let threshold = (RECOVERY_FACTOR * pre).max(pre + RECOVERY_MIN_EXCESS_MS);
    let healthy = |t: i64| by_second.get(&t).is_some_and(|v| *v <= threshold);
    let series_last = series.iter().map(|(t, _)| *t).max()?;
    let last_t = input_last_t_s.map_or(series_last, |i| i.min(series_last));
    let window_end = (start_t_s + DISRUPTION_WINDOW_S).min(last_t + 1);
    let Some(excursion) = (start_t_s..window_end).find(|t| !healthy(*t)) else {
        return Some(0);
    };
    (excursion + 1..=last_t - (RECOVERY_HOLD_S - 1))
        .find(|s| (*s..*s + RECOVERY_HOLD_S).all(healthy))
        .and_then(|s| u64::try_from(s - start_t_s).ok())
}

/// The latest recovery a run can show for a reconfiguration starting at `start_t_s`: a recovery
/// is judged up to the input's last second and needs [`RECOVERY_HOLD_S`] healthy seconds, so one
/// not found took longer than this (`None` without input).
pub fn recovery_watched_s(start_t_s: i64, input_last_t_s: Option<i64>) -> Option<i64> {
    input_last_t_s.map(|last| last - start_t_s - (RECOVERY_HOLD_S - 1))
}

/// A recovery time for a table: `17 s`, or, when the run's input ended first, `> 44 s` (the
/// seconds it was watched after the reconfiguration began: not recovered *within the run*, which
/// says nothing of after it); `never` only when nothing was watched.
pub fn fmt_recovery(recovery_s: Option<u64>, watched_s: Option<i64>) -> String {
    match (recovery_s, watched_s) {
        (Some(s), _) => format!("{s} s"),
        (None, Some(w)) if w >= 0 => format!("> {w} s"),
        (None, _) => "never".into(),
    }
}

/// The shortest recovery any protocol could reach: the backlog at the reconfiguration's start
/// drained at the spare capacity after it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DrainLimit {
    /// Records the sources were offered before the start second and had not taken by then.
    pub backlog: f64,
    /// Records/s the reconfigured operator can process after it: its tasks after ×
    /// `[runtime] task_records_per_sec`.
    pub capacity: f64,
    /// Records/s offered in the start second.
    pub offered: f64,
}

impl DrainLimit {
    /// The drain limit of a reconfiguration starting at `start_t_s`: the backlog is Σ (offered −
    /// taken) over the seconds before it whose offered rate is known (`offered`, per second since
    /// the run's start; `throughput` = records the sources took), clamped at 0; `capacity` as
    /// [`DrainLimit::capacity`]. `None` where the start second has no known offered rate.
    ///
    /// ```
    /// use koala_coordinator::report::DrainLimit;
    /// // 5 600/s offered from 10 s, the job takes 4 000/s: 16 000 records behind at 20 s; after
    /// // the scale-out it can do 8 000/s, 2 400/s spare: 16 000 / 2 400 = 6.7 s.
    /// let offered = |t: i64| Some(if t < 10 { 2800.0 } else { 5600.0 });
    /// let taken: Vec<(i64, f64)> = (0..40).map(|t| (t, if t < 10 { 2800.0 } else { 4000.0 })).collect();
    /// let limit = DrainLimit::at(&taken, &offered, 20, 8000.0).unwrap();
    /// assert_eq!((limit.backlog, limit.spare()), (16_000.0, 2_400.0));
    /// assert_eq!(limit.to_string(), "drain limit 7 s (backlog 16 000 records ÷ 2 400 records/s spare)");
    /// ```
    pub fn at(
        throughput: &[(i64, f64)],
        offered: &dyn Fn(i64) -> Option<f64>,
        start_t_s: i64,
        capacity: f64,
    ) -> Option<Self> {
        let offered_now = offered(start_t_s)?;
        let backlog: f64 = throughput
            .iter()
            .filter(|(t, _)| *t < start_t_s)
            .filter_map(|&(t, taken)| offered(t).map(|o| o - taken))
            .sum();
        Some(Self { backlog: backlog.max(0.0), capacity, offered: offered_now })
    }

    /// Records/s left for the backlog once the offered rate is served.
    pub fn spare(&self) -> f64 {
        self.capacity - self.offered
    }

    /// Seconds the backlog takes to drain at full capacity; `None` if the capacity does not
    /// exceed the offered rate (it never drains).
    pub fn seconds(&self) -> Option<f64> {
        (self.spare() > 0.0).then(|| self.backlog / self.spare())
    }
}

impl fmt::Display for DrainLimit {
    /// `drain limit 40 s (backlog 720 000 records ÷ 18 000 records/s spare)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.seconds() {
            Some(s) => write!(
                f,
                "drain limit {s:.0} s (backlog {} records ÷ {} records/s spare)",
                fmt_records(self.backlog),
                fmt_records(self.spare())
            ),
            None => write!(
                f,
                "no drain limit: capacity {} ≤ offered {} records/s, the backlog of {} records never drains",
                fmt_records(self.capacity),
                fmt_records(self.offered),
                fmt_records(self.backlog)
            ),
        }
    }
}

/// A drain limit for a table cell: `40 s`, `never` (capacity ≤ offered), `n/a` (unknown).
pub fn fmt_drain_limit(limit: Option<&DrainLimit>) -> String {
    match limit.map(DrainLimit::seconds) {
        Some(Some(s)) => format!("{s:.0} s"),
        Some(None) => "never".into(),
        None => "n/a".into(),
    }
}

/// The tasks of `operator` that ran after the unix second `after_s`: distinct task names
/// `operator.<index>` among `samples` (`(task, unix second, value)`) at a later second.
pub fn tasks_after(samples: &[(String, u64, f64)], operator: &str, after_s: u64) -> usize {
    let mut tasks: Vec<&str> = samples
        .iter()
        .filter(|(task, t, _)| {
            *t > after_s
                && task
                    .strip_prefix(operator)
                    .and_then(|rest| rest.strip_prefix('.'))
                    .is_some_and(|index| index.parse::<u32>().is_ok())
        })
        .map(|(task, _, _)| task.as_str())
        .collect();
    tasks.sort_unstable();
    tasks.dedup();
    tasks.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(values: &[Option<f64>]) -> Vec<(i64, Option<f64>)> {
        (0..).zip(values.iter().copied()).collect()
    }

    #[test]
    fn recovery_is_zero_when_latency_never_rises() {
        assert_eq!(recovery_s(&series(&[Some(10.0); 30]), 10, None, None), Some(0));
    }

    #[test]
    fn recovery_needs_five_seconds_within_twice_the_level_before() {
        // pre = 100 → threshold = max(200, 120) = 200.
        let mut v = vec![Some(100.0); 10];
        v.extend([Some(900.0), Some(500.0), Some(150.0), Some(150.0), Some(250.0)]);
        v.extend([Some(190.0); 4]);
        assert_eq!(recovery_s(&series(&v), 10, None, None), None, "only 4 healthy seconds in a row");
        v.push(Some(200.0));
        assert_eq!(recovery_s(&series(&v), 10, None, None), Some(5));
    }

    #[test]
    fn a_level_of_a_few_milliseconds_has_an_absolute_margin() {
        // pre = 3 ms: 2 × pre = 6 ms would call 10 ms of noise an excursion.
        let mut v = vec![Some(3.0); 10];
        v.extend([Some(10.0), Some(23.0), Some(12.0)]);
        v.extend([Some(5.0); 10]);
        assert_eq!(recovery_s(&series(&v), 10, None, None), Some(0));
        v[11] = Some(24.0);
        assert_eq!(recovery_s(&series(&v), 10, None, None), Some(2));
    }

    #[test]
    fn recovery_is_measured_against_the_level_before_the_overload() {
        // 10 ms until a surge at 10 s; latency grows until the reconfiguration at 15 s and is
        // back to 10 ms from 20 s.
        let mut v = vec![Some(10.0); 10];
        v.extend([100.0, 300.0, 600.0, 900.0, 1200.0, 1500.0, 1000.0, 600.0, 300.0, 100.0].map(Some));
        v.extend([Some(10.0); 10]);
        let s = series(&v);
        assert_eq!(recovery_s(&s, 15, Some(10), None), Some(5));
        // Measured against the 10 s just before the start, the backlog is the baseline: the
        // threshold (2 × the mean of 5–14 s = 630 ms) "recovers" at 17 s, with 600 ms.
        assert_eq!(recovery_s(&s, 15, None, None), Some(2));
    }

    #[test]
    fn missing_samples_are_not_recovered() {
        let mut v = vec![Some(20.0); 10];
        v.extend([None, None, Some(20.0), Some(20.0), None]);
        v.extend([Some(20.0); 5]);
        assert_eq!(recovery_s(&series(&v), 10, None, None), Some(5));
    }

    #[test]
    fn recovery_none_when_latency_never_recovers_or_no_baseline() {
        let mut growing = vec![Some(5.0); 10];
        growing.extend((1..40).map(|i| Some(f64::from(i) * 100.0)));
        assert_eq!(recovery_s(&series(&growing), 10, None, None), None);
        assert_eq!(recovery_s(&series(&[None, Some(5.0)]), 0, None, None), None);
    }

    #[test]
    fn a_recovery_after_the_input_ended_reads_as_longer_than_the_run_watched() {
        assert_eq!(fmt_recovery(Some(17), Some(44)), "17 s");
        assert_eq!(fmt_recovery(None, Some(44)), "> 44 s");
        assert_eq!(fmt_recovery(None, None), "never");
        assert_eq!(recovery_watched_s(20, Some(60)), Some(36));
    }

    #[test]
    fn the_drain_limit_is_the_backlog_over_the_spare_capacity() {
        // The paper's full scale-out: 4 tasks of 7 500/s, 21 000/s offered, then 42 000/s for
        // 60 s: 720 000 records behind at the scale-out to 8 tasks (60 000/s, 18 000/s spare).
        let offered = |t: i64| (t >= 1).then_some(if t < 60 { 21_000.0 } else { 42_000.0 });
        let taken: Vec<(i64, f64)> = (0..200)
            .map(|t| {
                (
                    t,
                    match t {
                        0 => 5_000.0,
                        1..=59 => 21_000.0,
                        _ => 30_000.0,
                    },
                )
            })
            .collect();
        let limit = DrainLimit::at(&taken, &offered, 120, 60_000.0).expect("limit");
        assert_eq!((limit.backlog, limit.spare()), (720_000.0, 18_000.0));
        assert_eq!(limit.seconds(), Some(40.0));
        assert_eq!(fmt_drain_limit(Some(&limit)), "40 s");
        let short = DrainLimit { capacity: 40_000.0, ..limit };
        assert_eq!(short.seconds(), None);
        assert!(short.to_string().starts_with("no drain limit: capacity 40 000 ≤ offered 42 000"));
        assert_eq!(fmt_drain_limit(Some(&short)), "never");
        assert_eq!(fmt_drain_limit(None), "n/a");
        // A job ahead of its schedule has no backlog, not a negative one.
        let ahead: Vec<(i64, f64)> = (0..10).map(|t| (t, 50_000.0)).collect();
        assert_eq!(DrainLimit::at(&ahead, &offered, 5, 60_000.0).map(|l| l.backlog), Some(0.0));
        assert_eq!(DrainLimit::at(&taken, &offered, 0, 60_000.0), None, "no offered rate at the start");
    }

    #[test]
    fn tasks_after_counts_the_operators_tasks_that_ran_later() {
        let samples: Vec<(String, u64, f64)> = [
            ("aggregate.0", 10),
            ("aggregate.1", 10),
            ("aggregate.1", 30),
            ("aggregate.2", 31),
            ("aggregate.3", 32),
            ("aggregate.3", 33),
            ("aggregate_sink.0", 40),
            ("source.0", 40),
        ]
        .into_iter()
        .map(|(task, t)| (task.to_string(), t, 1.0))
        .collect();
        assert_eq!(tasks_after(&samples, "aggregate", 20), 3);
        assert_eq!(tasks_after(&samples, "aggregate", 40), 0);
        assert_eq!(tasks_after(&samples, "source", 0), 1);
    }
}
