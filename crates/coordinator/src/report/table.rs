//! The per-second table of a run: one row per second, each column one figure over the tasks of
//! a role (module docs of [`crate::report`]), and the same figures per operator and per task for
//! the live dashboard ([`group_series`]). How the tasks' values of one second combine is defined
//! once, per metric, by [`combine`].

use std::collections::BTreeMap;
use std::fmt;

use koala_types::metric;

use super::{ReportError, secs_of_ms};
use crate::metrics_store::{Aggregate, Grouping, MetricsStore, RunInfo, TaskScope};

/// How the per-second values of several tasks combine into one figure: counts of records and
/// bytes add up, means are means over the tasks (each weighted equally), and percentiles, maxima,
/// milliseconds held back (backpressure, input paused) and queue sizes take the worst task.
pub fn combine(metric_name: &str) -> Aggregate {
    match metric_name {
        metric::RECORDS_IN
        | metric::RECORDS_OUT
        | metric::BATCHES
        | metric::LATE_DROPPED
        | metric::STATE_BYTES_ON_DEMAND
        | metric::STATE_BYTES_BACKGROUND
        | metric::STATE_BYTES_EAGER
        | metric::STATE_KEYS_SENT
        | metric::STATE_READS
        | metric::STATE_WRITES
        | metric::CACHE_HITS
        | metric::CACHE_MISSES
        | metric::SOURCE_OFFSET_LAG => Aggregate::Sum,
        metric::SOURCE_LAG_MEAN_MS | metric::BATCH_LATENCY_MEAN_US | metric::KLT_LOOKUP_MEAN_US => {
            Aggregate::Mean
        }
        _ => Aggregate::Max,
    }
}

/// One second of the report table (see the module docs for each column's definition).
/// `Default`: second 0 with nothing measured (tests fill in what they need).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SecondRow {
    /// Seconds since the run's start second.
    pub t_s: i64,
    /// Records consumed by source tasks this second.
    pub throughput: f64,
    /// Records the sinks took this second (Σ `records_in` over the tasks that reported
    /// `latency_p50_ms` in the run: the sinks).
    pub output: f64,
    /// Records offered to the sources this second by the config's rate schedule
    /// ([`OfferedRate::in_second`]); `None` where unknown.
    pub offered: Option<f64>,
    /// Mean source lag, ms.
    pub lag_mean_ms: Option<f64>,
    /// Worst source task's p99 lag, ms.
    pub lag_p99_ms: Option<f64>,
    /// Mean per-batch latency of processing tasks, µs.
    pub batch_latency_mean_us: Option<f64>,
    /// Worst processing task's p99 per-batch latency, µs.
    pub batch_latency_p99_us: Option<f64>,
    /// Longest batch of any processing task, µs.
    pub batch_latency_max_us: Option<f64>,
    /// State bytes moved this second: on demand, in the background and eagerly together.
    pub state_bytes_moved: f64,
    /// Worst task's milliseconds blocked on backpressure.
    pub backpressure_ms: Option<f64>,
    /// Worst sink's median end-to-end latency, ms.
    pub latency_p50_ms: Option<f64>,
    /// Worst sink's p99 end-to-end latency, ms.
    pub latency_p99_ms: Option<f64>,
    /// Largest end-to-end latency of any sink, ms.
    pub latency_max_ms: Option<f64>,
}

/// The per-second table of a run, one row for every second from its first to its last sample.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PerSecondTable {
    /// Rows by ascending `t_s`, without gaps.
    pub rows: Vec<SecondRow>,
}

pub(super) fn read_table(store: &MetricsStore, info: &RunInfo) -> Result<PerSecondTable, ReportError> {
    let sources = TaskScope::Reporting(metric::SOURCE_LAG_MEAN_MS);
    let processing = TaskScope::NotReporting(metric::SOURCE_LAG_MEAN_MS);
    let columns = [
        (metric::RECORDS_IN, sources),
        (metric::SOURCE_LAG_MEAN_MS, sources),
        (metric::SOURCE_LAG_P99_MS, sources),
        (metric::BATCH_LATENCY_MEAN_US, processing),
        (metric::BATCH_LATENCY_P99_US, processing),
        (metric::STATE_BYTES_ON_DEMAND, TaskScope::All),
        (metric::BACKPRESSURE_MS, TaskScope::All),
        (metric::BATCH_LATENCY_MAX_US, processing),
        (metric::STATE_BYTES_BACKGROUND, TaskScope::All),
        (metric::STATE_BYTES_EAGER, TaskScope::All),
        (metric::LATENCY_P50_MS, TaskScope::All),
        (metric::LATENCY_P99_MS, TaskScope::All),
        (metric::LATENCY_MAX_MS, TaskScope::All),
        (metric::RECORDS_IN, TaskScope::Reporting(metric::LATENCY_P50_MS)),
    ];
    let run_start_s = secs_of_ms(info.started_ms);
    let mut series: Vec<BTreeMap<i64, f64>> = Vec::with_capacity(columns.len());
    for (name, scope) in columns {
        let values = store.per_second(&info.run, name, combine(name), scope)?;
        series.push(
            values
                .into_iter()
                .map(|(t, v)| (i64::try_from(t).unwrap_or(i64::MAX) - run_start_s, v))
                .collect(),
        );
    }
    let first = series.iter().filter_map(|s| s.keys().next()).min().copied();
    let last = series.iter().filter_map(|s| s.keys().next_back()).max().copied();
    let (Some(first), Some(last)) = (first, last) else {
        return Ok(PerSecondTable::default());
    };
    let at = |column: usize, t: i64| series[column].get(&t).copied();
    let rows = (first..=last)
        .map(|t| SecondRow {
            t_s: t,
            throughput: at(0, t).unwrap_or(0.0),
            output: at(13, t).unwrap_or(0.0),
            offered: None,
            lag_mean_ms: at(1, t),
            lag_p99_ms: at(2, t),
            batch_latency_mean_us: at(3, t),
            batch_latency_p99_us: at(4, t),
            state_bytes_moved: at(5, t).unwrap_or(0.0) + at(8, t).unwrap_or(0.0) + at(9, t).unwrap_or(0.0),
            backpressure_ms: at(6, t),
            batch_latency_max_us: at(7, t),
            latency_p50_ms: at(10, t),
            latency_p99_ms: at(11, t),
            latency_max_ms: at(12, t),
        })
        .collect();
    Ok(PerSecondTable { rows })
}

impl fmt::Display for PerSecondTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let header = [
            "t_s",
            "rec/s",
            "out/s",
            "offered/s",
            "lag_ms",
            "lag_p99_ms",
            "e2e_p50_ms",
            "e2e_p99_ms",
            "batch_us",
            "batch_p99_us",
            "batch_max_us",
            "moved_B/s",
            "bp_ms",
        ];
        let opt = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{v:.1}"));
        let cells: Vec<[String; 13]> = self
            .rows
            .iter()
            .map(|r| {
                [
                    r.t_s.to_string(),
                    format!("{:.0}", r.throughput),
                    format!("{:.0}", r.output),
                    r.offered.map_or_else(|| "-".to_string(), |v| format!("{v:.0}")),
                    opt(r.lag_mean_ms),
                    opt(r.lag_p99_ms),
                    opt(r.latency_p50_ms),
                    opt(r.latency_p99_ms),
                    opt(r.batch_latency_mean_us),
                    opt(r.batch_latency_p99_us),
                    opt(r.batch_latency_max_us),
                    format!("{:.0}", r.state_bytes_moved),
                    opt(r.backpressure_ms),
                ]
            })
            .collect();
        let mut widths = header.map(str::len);
        for row in &cells {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.len());
            }
        }
        let header = header.map(str::to_string);
        for row in std::iter::once(&header).chain(&cells) {
            let line: Vec<String> = row.iter().zip(widths).map(|(cell, w)| format!("{cell:>w$}")).collect();
            writeln!(f, "{}", line.join("  "))?;
        }
        Ok(())
    }
}

/// The per-operator and per-task figures of the live dashboard and `GET /api/metrics`: each
/// metric combined over a group's tasks by [`combine`], as the table combines it over a role's.
pub const GROUP_METRICS: &[&str] = &[
    metric::RECORDS_IN,
    metric::RECORDS_OUT,
    metric::LATENCY_P50_MS,
    metric::LATENCY_P99_MS,
    metric::SOURCE_LAG_MEAN_MS,
    metric::SOURCE_LAG_P99_MS,
    metric::BATCH_LATENCY_MEAN_US,
    metric::BATCH_LATENCY_P99_US,
    metric::QUEUED_RECORDS_MAX,
    metric::INPUT_PAUSED_MS,
    metric::BACKPRESSURE_MS,
];

/// The name of state moved per second in [`group_series`]: Σ of on-demand, background and eager
/// state bytes, as [`SecondRow::state_bytes_moved`].
pub const STATE_BYTES_MOVED: &str = "state_bytes_moved";

/// Per-second series per group, then per figure: `(t_s, value)` pairs, seconds since the run's
/// start second.
pub type GroupSeries = BTreeMap<String, BTreeMap<&'static str, Vec<(i64, f64)>>>;

/// Per operator or per task (`grouping`), every [`GROUP_METRICS`] figure and
/// [`STATE_BYTES_MOVED`] per second from `since_t_s` (seconds since the run's start second).
pub fn group_series(
    store: &MetricsStore,
    info: &RunInfo,
    grouping: Grouping,
    since_t_s: i64,
) -> Result<GroupSeries, ReportError> {
    let run_start_s = secs_of_ms(info.started_ms);
    let since = u64::try_from(run_start_s + since_t_s.max(0)).unwrap_or(0);
    let mut out: GroupSeries = BTreeMap::new();
    let t_of = |t: u64| i64::try_from(t).unwrap_or(i64::MAX) - run_start_s;
    for &name in GROUP_METRICS {
        for (group, t, v) in store.per_second_grouped(&info.run, name, combine(name), grouping, since)? {
            out.entry(group).or_default().entry(name).or_default().push((t_of(t), v));
        }
    }
    let mut moved: BTreeMap<String, BTreeMap<i64, f64>> = BTreeMap::new();
    for name in [metric::STATE_BYTES_ON_DEMAND, metric::STATE_BYTES_BACKGROUND, metric::STATE_BYTES_EAGER] {
        for (group, t, v) in store.per_second_grouped(&info.run, name, combine(name), grouping, since)? {
            *moved.entry(group).or_default().entry(t_of(t)).or_insert(0.0) += v;
        }
    }
    for (group, series) in moved {
        out.entry(group).or_default().insert(STATE_BYTES_MOVED, series.into_iter().collect());
    }
    Ok(out)
}
