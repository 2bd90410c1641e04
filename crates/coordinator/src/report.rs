//! `koala report`: turns one run of the [metrics store](crate::metrics_store) into a per-second
//! table, PNG plots with reconfigurations marked, an HTML page, and the summary numbers of paper
//! §5.1.3 (docs/architecture.md §9).
//!
//! Definitions (the store does not know operator kinds, so roles are read off the metrics):
//! - **source tasks** are the tasks that reported `source_lag_mean_ms` at least once in the run;
//!   every other task is a *processing* task.
//! - **throughput** (per second) = Σ `records_in` over source tasks — the paper's "output rate
//!   at the source operator". A second in the run's span with no such sample counts as 0 (a
//!   paused source that does not report has consumed nothing).
//! - **lag** = mean over source tasks of `source_lag_mean_ms` (tasks weighted equally); lag p99 =
//!   max over source tasks of `source_lag_p99_ms`.
//! - **per-batch latency** = mean over processing tasks of `batch_latency_mean_us`; p99 = max over
//!   processing tasks of `batch_latency_p99_us`.
//! - **state moved** = Σ `state_bytes_moved` over all tasks; **backpressure** = max over tasks of
//!   `backpressure_ms` (the worst task's blocked milliseconds in that second).
//! - Times are seconds since the run's start second (`runs.started_ms / 1000`); a
//!   reconfiguration belongs to the second its `started_ms` falls in.
//!
//! See [`throughput_dip`] and [`backlog_recovery_s`] for the two derived numbers.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use koala_types::metric;
use thiserror::Error;

use crate::metrics_store::{Aggregate, MetricsStore, MetricsStoreError, Reconfiguration, RunInfo, TaskScope};

mod render;

/// Seconds before a reconfiguration's start that form its baseline (dip and recovery).
pub const BASELINE_S: i64 = 10;
/// Seconds from a reconfiguration's start searched for the throughput dip and the lag excursion.
pub const DISRUPTION_WINDOW_S: i64 = 60;
/// Seconds lag must stay under its threshold to count as recovered.
pub const RECOVERY_HOLD_S: i64 = 3;

const MIB: f64 = 1024.0 * 1024.0;

/// Why a report could not be produced.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ReportError {
    /// Reading the metrics store failed.
    #[error(transparent)]
    Store(#[from] MetricsStoreError),
    /// The database file does not exist (a report never creates one).
    #[error("metrics store {} does not exist", path.display())]
    MissingDatabase {
        /// The database file.
        path: PathBuf,
    },
    /// No run was named and the store holds none.
    #[error("metrics store {} holds no runs", path.display())]
    NoRuns {
        /// The database file.
        path: PathBuf,
    },
    /// The named run is not in the store.
    #[error("metrics store {} has no run {run:?}", path.display())]
    UnknownRun {
        /// The database file.
        path: PathBuf,
        /// The run asked for.
        run: String,
    },
    /// Creating the output directory or writing a file failed.
    #[error("report: writing {} failed", path.display())]
    Write {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Drawing or encoding a plot failed.
    #[error("report: drawing {} failed: {message}", path.display())]
    Plot {
        /// The PNG file.
        path: PathBuf,
        /// What plotters reported.
        message: String,
    },
}

/// One second of the report table (see the module docs for each column's definition).
#[derive(Debug, Clone, PartialEq)]
pub struct SecondRow {
    /// Seconds since the run's start second.
    pub t_s: i64,
    /// Records consumed by source tasks this second.
    pub throughput: f64,
    /// Mean source lag, ms.
    pub lag_mean_ms: Option<f64>,
    /// Worst source task's p99 lag, ms.
    pub lag_p99_ms: Option<f64>,
    /// Mean per-batch latency of processing tasks, µs.
    pub batch_latency_mean_us: Option<f64>,
    /// Worst processing task's p99 per-batch latency, µs.
    pub batch_latency_p99_us: Option<f64>,
    /// State bytes sent between tasks this second.
    pub state_bytes_moved: f64,
    /// Worst task's milliseconds blocked on backpressure.
    pub backpressure_ms: Option<f64>,
}

/// The per-second table of a run, one row for every second from its first to its last sample.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PerSecondTable {
    /// Rows by ascending `t_s`, without gaps.
    pub rows: Vec<SecondRow>,
}

/// The lowest throughput after a reconfiguration started, against the throughput before it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ThroughputDip {
    /// Mean throughput over the [`BASELINE_S`] seconds before the start, records/s.
    pub baseline: f64,
    /// Minimum throughput in `[start, start + DISRUPTION_WINDOW_S)`, records/s.
    pub min: f64,
    /// The second of that minimum (since run start).
    pub at_t_s: i64,
}

impl ThroughputDip {
    /// `min / baseline`: 1.0 means no dip, 0.0 means processing stopped.
    pub fn ratio(&self) -> f64 {
        self.min / self.baseline
    }
}

/// One reconfiguration with the numbers derived around it.
#[derive(Debug, Clone, PartialEq)]
pub struct ReconfigurationSummary {
    /// The reconfiguration as recorded.
    pub reconfiguration: Reconfiguration,
    /// Its start second, since run start.
    pub start_t_s: i64,
    /// Its completion second, since run start, if it completed.
    pub end_t_s: Option<i64>,
    /// See [`throughput_dip`].
    pub dip: Option<ThroughputDip>,
    /// See [`backlog_recovery_s`].
    pub backlog_recovery_s: Option<u64>,
}

/// Everything `koala report` computed for one run.
#[derive(Debug, Clone, PartialEq)]
pub struct ReportSummary {
    /// The run reported on.
    pub run: RunInfo,
    /// Σ throughput over the table: records consumed by the sources.
    pub records_total: f64,
    /// `records_total / rows`, records/s (0 without rows).
    pub mean_throughput: f64,
    /// Highest per-second mean source lag, ms.
    pub peak_lag_mean_ms: Option<f64>,
    /// Highest per-second p99 source lag, ms.
    pub peak_lag_p99_ms: Option<f64>,
    /// Σ `state_bytes_moved` over all tasks and seconds.
    pub state_bytes_moved: f64,
    /// Σ `pause_ms` over the reconfigurations that recorded one.
    pub pause_ms_total: u64,
    /// The dip with the lowest [`ThroughputDip::ratio`] over all reconfigurations.
    pub worst_dip: Option<ThroughputDip>,
    /// The longest backlog recovery; `None` without reconfigurations or if any never recovered.
    pub backlog_recovery_s: Option<u64>,
    /// Each reconfiguration, by start time.
    pub reconfigurations: Vec<ReconfigurationSummary>,
    /// The per-second table.
    pub table: PerSecondTable,
    /// Whether the plots carry text (a DejaVu Sans font file was found in a usual place).
    pub plots_have_text: bool,
    /// The files written: PNGs and `report.html`.
    pub files: Vec<PathBuf>,
}

/// Reports on `run` (the latest run if `None`) of the store at `db`, writing `throughput.png`,
/// `lag.png`, `batch_latency.png`, `state_moved.png` and `report.html` into `out_dir`.
pub fn report(db: &Path, run: Option<&str>, out_dir: &Path) -> Result<ReportSummary, ReportError> {
    if !db.exists() {
        return Err(ReportError::MissingDatabase { path: db.to_path_buf() });
    }
    let store = MetricsStore::open(db)?;
    let info = match run {
        Some(name) => store
            .run(name)?
            .ok_or_else(|| ReportError::UnknownRun { path: db.to_path_buf(), run: name.to_string() })?,
        None => store.latest_run()?.ok_or_else(|| ReportError::NoRuns { path: db.to_path_buf() })?,
    };
    let table = read_table(&store, &info)?;
    let run_start_s = secs_of_ms(info.started_ms);
    let throughput: Vec<(i64, f64)> = table.rows.iter().map(|r| (r.t_s, r.throughput)).collect();
    let lag: Vec<(i64, Option<f64>)> = table.rows.iter().map(|r| (r.t_s, r.lag_mean_ms)).collect();
    let reconfigurations: Vec<ReconfigurationSummary> = store
        .reconfigurations(&info.run)?
        .into_iter()
        .map(|r| {
            let start_t_s = secs_of_ms(r.started_ms) - run_start_s;
            ReconfigurationSummary {
                start_t_s,
                end_t_s: r.completed_ms.map(|c| secs_of_ms(c) - run_start_s),
                dip: throughput_dip(&throughput, start_t_s),
                backlog_recovery_s: backlog_recovery_s(&lag, start_t_s),
                reconfiguration: r,
            }
        })
        .collect();

    let records_total: f64 = throughput.iter().map(|(_, v)| v).sum();
    let max_of = |f: fn(&SecondRow) -> Option<f64>| table.rows.iter().filter_map(f).reduce(f64::max);
    let recoveries: Option<Vec<u64>> = reconfigurations.iter().map(|r| r.backlog_recovery_s).collect();
    let mut summary = ReportSummary {
        records_total,
        mean_throughput: if table.rows.is_empty() { 0.0 } else { records_total / table.rows.len() as f64 },
        peak_lag_mean_ms: max_of(|r| r.lag_mean_ms),
        peak_lag_p99_ms: max_of(|r| r.lag_p99_ms),
        state_bytes_moved: table.rows.iter().map(|r| r.state_bytes_moved).sum(),
        pause_ms_total: reconfigurations.iter().filter_map(|r| r.reconfiguration.pause_ms).sum(),
        worst_dip: reconfigurations
            .iter()
            .filter_map(|r| r.dip)
            .min_by(|a, b| a.ratio().total_cmp(&b.ratio())),
        backlog_recovery_s: recoveries.and_then(|r| r.into_iter().max()),
        reconfigurations,
        table,
        plots_have_text: render::plot_font_ready(),
        files: Vec::new(),
        run: info,
    };
    std::fs::create_dir_all(out_dir)
        .map_err(|source| ReportError::Write { path: out_dir.to_path_buf(), source })?;
    summary.files = render::write_plots(&summary, out_dir)?;
    let html = out_dir.join("report.html");
    std::fs::write(&html, render::render_html(&summary))
        .map_err(|source| ReportError::Write { path: html.clone(), source })?;
    summary.files.push(html);
    Ok(summary)
}

/// The throughput dip of a reconfiguration starting at second `start_t_s`: the minimum of
/// `throughput` over `[start, start + DISRUPTION_WINDOW_S)` against the mean over
/// `[start − BASELINE_S, start)`. `None` if either window holds no second or the baseline is 0.
///
/// ```
/// use koala_coordinator::report::throughput_dip;
/// let series: Vec<(i64, f64)> = (0..30).map(|t| (t, if t == 12 { 25.0 } else { 100.0 })).collect();
/// let dip = throughput_dip(&series, 10).unwrap();
/// assert_eq!((dip.baseline, dip.min, dip.at_t_s), (100.0, 25.0, 12));
/// ```
pub fn throughput_dip(throughput: &[(i64, f64)], start_t_s: i64) -> Option<ThroughputDip> {
    let before: Vec<f64> = values_in(throughput, start_t_s - BASELINE_S, start_t_s).collect();
    if before.is_empty() {
        return None;
    }
    let baseline = before.iter().sum::<f64>() / before.len() as f64;
    if baseline <= 0.0 {
        return None;
    }
    throughput
        .iter()
        .filter(|(t, _)| (start_t_s..start_t_s + DISRUPTION_WINDOW_S).contains(t))
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map(|&(at_t_s, min)| ThroughputDip { baseline, min, at_t_s })
}

/// Backlog recovery time (paper §5.1.3) of a reconfiguration starting at second `start_t_s`, in
/// seconds, from the per-second mean source `lag` (ms; `None` = no sample that second).
///
/// Threshold = max(1.5 × pre, pre + 50 ms), with pre = mean lag over `[start − BASELINE_S, start)`.
/// A second is *healthy* if it has a lag sample at or under the threshold. If every second of
/// `[start, start + DISRUPTION_WINDOW_S)` that the series covers is healthy, recovery is 0.
/// Otherwise, after the first unhealthy second, recovery ends at the first second that begins
/// [`RECOVERY_HOLD_S`] healthy seconds in a row; the result is that second − start.
/// `None` if there is no lag before the start, or lag never recovers within the series.
pub fn backlog_recovery_s(lag: &[(i64, Option<f64>)], start_t_s: i64) -> Option<u64> {
    let by_second: BTreeMap<i64, f64> = lag.iter().filter_map(|&(t, v)| Some((t, v?))).collect();
    let before: Vec<f64> = by_second.range(start_t_s - BASELINE_S..start_t_s).map(|(_, v)| *v).collect();
    if before.is_empty() {
        return None;
    }
    let pre = before.iter().sum::<f64>() / before.len() as f64;
    let threshold = (1.5 * pre).max(pre + 50.0);
    let healthy = |t: i64| by_second.get(&t).is_some_and(|v| *v <= threshold);
    let last_t = lag.iter().map(|(t, _)| *t).max()?;
    let window_end = (start_t_s + DISRUPTION_WINDOW_S).min(last_t + 1);
    let Some(excursion) = (start_t_s..window_end).find(|t| !healthy(*t)) else {
        return Some(0);
    };
    (excursion + 1..=last_t - (RECOVERY_HOLD_S - 1))
        .find(|s| (*s..*s + RECOVERY_HOLD_S).all(healthy))
        .and_then(|s| u64::try_from(s - start_t_s).ok())
}

fn values_in(series: &[(i64, f64)], from: i64, to: i64) -> impl Iterator<Item = f64> + '_ {
    series.iter().filter(move |(t, _)| (from..to).contains(t)).map(|(_, v)| *v)
}

/// Whole unix seconds of a unix-milliseconds instant (the store caps values at `i64::MAX`).
fn secs_of_ms(ms: u64) -> i64 {
    i64::try_from(ms / 1000).unwrap_or(i64::MAX)
}

fn read_table(store: &MetricsStore, info: &RunInfo) -> Result<PerSecondTable, ReportError> {
    let sources = TaskScope::Reporting(metric::SOURCE_LAG_MEAN_MS);
    let processing = TaskScope::NotReporting(metric::SOURCE_LAG_MEAN_MS);
    let columns = [
        (metric::RECORDS_IN, Aggregate::Sum, sources),
        (metric::SOURCE_LAG_MEAN_MS, Aggregate::Mean, sources),
        (metric::SOURCE_LAG_P99_MS, Aggregate::Max, sources),
        (metric::BATCH_LATENCY_MEAN_US, Aggregate::Mean, processing),
        (metric::BATCH_LATENCY_P99_US, Aggregate::Max, processing),
        (metric::STATE_BYTES_MOVED, Aggregate::Sum, TaskScope::All),
        (metric::BACKPRESSURE_MS, Aggregate::Max, TaskScope::All),
    ];
    let run_start_s = secs_of_ms(info.started_ms);
    let mut series: Vec<BTreeMap<i64, f64>> = Vec::with_capacity(columns.len());
    for (name, agg, scope) in columns {
        let values = store.per_second(&info.run, name, agg, scope)?;
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
            lag_mean_ms: at(1, t),
            lag_p99_ms: at(2, t),
            batch_latency_mean_us: at(3, t),
            batch_latency_p99_us: at(4, t),
            state_bytes_moved: at(5, t).unwrap_or(0.0),
            backpressure_ms: at(6, t),
        })
        .collect();
    Ok(PerSecondTable { rows })
}

impl fmt::Display for PerSecondTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let header =
            ["t_s", "rec/s", "lag_ms", "lag_p99_ms", "batch_us", "batch_p99_us", "moved_B/s", "bp_ms"];
        let opt = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{v:.1}"));
        let cells: Vec<[String; 8]> = self
            .rows
            .iter()
            .map(|r| {
                [
                    r.t_s.to_string(),
                    format!("{:.0}", r.throughput),
                    opt(r.lag_mean_ms),
                    opt(r.lag_p99_ms),
                    opt(r.batch_latency_mean_us),
                    opt(r.batch_latency_p99_us),
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

fn fmt_opt(v: Option<f64>, unit: &str) -> String {
    v.map_or_else(|| "n/a".to_string(), |v| format!("{v:.1} {unit}"))
}

fn fmt_dip(dip: Option<ThroughputDip>) -> String {
    dip.map_or_else(
        || "n/a".to_string(),
        |d| {
            format!(
                "{:.1}% of {:.0} rec/s (min {:.0} at t={} s)",
                d.ratio() * 100.0,
                d.baseline,
                d.min,
                d.at_t_s
            )
        },
    )
}

fn fmt_recovery(r: Option<u64>) -> String {
    r.map_or_else(|| "not recovered / n/a".to_string(), |s| format!("{s} s"))
}

impl fmt::Display for ReportSummary {
    /// The summary only; print [`ReportSummary::table`] for the per-second rows.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let run = &self.run;
        writeln!(
            f,
            "run {} (query {}, protocol {}): {} s of metrics",
            run.run,
            run.query,
            run.protocol,
            self.table.rows.len()
        )?;
        writeln!(
            f,
            "records in at sources: {:.0}, mean throughput {:.1} rec/s",
            self.records_total, self.mean_throughput
        )?;
        writeln!(
            f,
            "peak lag: mean {}, p99 {}",
            fmt_opt(self.peak_lag_mean_ms, "ms"),
            fmt_opt(self.peak_lag_p99_ms, "ms")
        )?;
        writeln!(
            f,
            "state moved: {:.2} MiB; pause total: {} ms",
            self.state_bytes_moved / MIB,
            self.pause_ms_total
        )?;
        writeln!(f, "worst throughput dip: {}", fmt_dip(self.worst_dip))?;
        writeln!(f, "backlog recovery (longest): {}", fmt_recovery(self.backlog_recovery_s))?;
        if !self.plots_have_text {
            writeln!(f, "plots drawn without text: no font in {:?}", render::FONT_CANDIDATES)?;
        }
        for r in &self.reconfigurations {
            let c = &r.reconfiguration;
            writeln!(
                f,
                "  epoch {} {} of {} ({}): t={}..{} s, {} buckets, {:.2} MiB, pause {}; dip {}; recovery {}",
                c.epoch,
                c.kind,
                c.operator,
                c.protocol,
                r.start_t_s,
                r.end_t_s.map_or_else(|| "?".to_string(), |t| t.to_string()),
                c.buckets_moved,
                c.bytes_moved as f64 / MIB,
                c.pause_ms.map_or_else(|| "-".to_string(), |p| format!("{p} ms")),
                fmt_dip(r.dip),
                fmt_recovery(r.backlog_recovery_s)
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lag(values: &[Option<f64>]) -> Vec<(i64, Option<f64>)> {
        (0..).zip(values.iter().copied()).collect()
    }

    #[test]
    fn no_dip_without_baseline_or_window() {
        let flat: Vec<(i64, f64)> = (0..20).map(|t| (t, 100.0)).collect();
        assert_eq!(throughput_dip(&flat, 0), None, "nothing before the start");
        assert_eq!(throughput_dip(&flat, 25), None, "nothing after the start");
        let zero: Vec<(i64, f64)> = (0..20).map(|t| (t, 0.0)).collect();
        assert_eq!(throughput_dip(&zero, 10), None, "zero baseline");
        let dip = throughput_dip(&flat, 10);
        assert_eq!(dip.map(|d| d.ratio()), Some(1.0));
    }

    #[test]
    fn dip_only_counts_the_window() {
        // A dip 60 s after the start is outside the window.
        let series: Vec<(i64, f64)> = (0..100).map(|t| (t, if t == 70 { 1.0 } else { 50.0 })).collect();
        assert_eq!(throughput_dip(&series, 10).map(|d| d.min), Some(50.0));
        assert_eq!(throughput_dip(&series, 11).map(|d| d.at_t_s), Some(70));
    }

    #[test]
    fn recovery_is_zero_when_lag_never_rises() {
        let series = lag(&[Some(10.0); 30]);
        assert_eq!(backlog_recovery_s(&series, 10), Some(0));
    }

    #[test]
    fn recovery_needs_three_healthy_seconds() {
        // pre = 20 → threshold = max(30, 70) = 70.
        let mut v = vec![Some(20.0); 10];
        v.extend([Some(900.0), Some(500.0), Some(60.0), Some(60.0), Some(80.0)]);
        v.extend([Some(60.0), Some(70.0), Some(10.0), Some(10.0)]);
        assert_eq!(backlog_recovery_s(&lag(&v), 10), Some(5));
    }

    #[test]
    fn missing_lag_is_not_recovered() {
        let mut v = vec![Some(20.0); 10];
        v.extend([None, None, Some(20.0), Some(20.0), None, Some(20.0), Some(20.0), Some(20.0)]);
        assert_eq!(backlog_recovery_s(&lag(&v), 10), Some(5));
    }

    #[test]
    fn recovery_none_when_lag_never_recovers_or_no_baseline() {
        let mut v = vec![Some(20.0); 10];
        v.extend([Some(900.0), Some(20.0), Some(20.0)]);
        assert_eq!(backlog_recovery_s(&lag(&v), 10), None, "only 2 healthy seconds");
        let mut growing = vec![Some(5.0); 10];
        growing.extend((1..40).map(|i| Some(f64::from(i) * 100.0)));
        assert_eq!(backlog_recovery_s(&lag(&growing), 10), None);
        assert_eq!(backlog_recovery_s(&lag(&[None, Some(5.0)]), 0), None);
    }

    #[test]
    fn table_renders_aligned_columns() {
        let row = |t_s, throughput| SecondRow {
            t_s,
            throughput,
            lag_mean_ms: Some(1.0),
            lag_p99_ms: None,
            batch_latency_mean_us: None,
            batch_latency_p99_us: None,
            state_bytes_moved: 0.0,
            backpressure_ms: None,
        };
        let text = PerSecondTable { rows: vec![row(0, 5.0), row(1, 123_456.0)] }.to_string();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines.iter().all(|l| l.len() == lines[0].len()), "{text}");
    }
}
