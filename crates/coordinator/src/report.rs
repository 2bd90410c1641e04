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
//! - **end-to-end latency** (records written by sinks: arrival − due at the source) = max over
//!   tasks of `latency_p50_ms` (the worst sink's median), p99 = max of `latency_p99_ms` (the
//!   worst sink's p99, the series recovery is measured on), max = max of `latency_max_ms`.
//! - **per-batch latency** = mean over processing tasks of `batch_latency_mean_us`; p99 = max over
//!   processing tasks of `batch_latency_p99_us`; max = max over processing tasks of
//!   `batch_latency_max_us` (the longest batch of the second: one stall among hundreds of batches
//!   is above the p99).
//! - **state moved** = Σ over all tasks of `state_bytes_on_demand`, `state_bytes_background` and
//!   `state_bytes_eager`; **backpressure** = max over tasks of
//!   `backpressure_ms` (the worst task's blocked milliseconds in that second).
//! - **pause** (of the run) = Σ over seconds of the max over tasks of `input_paused_ms`: the time
//!   some task held input back for its protocol (stop-and-restart's Drain, DRRS's wait buffer,
//!   Koala's `max_queued_records`), the same ruler for every protocol; **queued records** = the
//!   largest `queued_records_max` sample of any task (the most records one task held at once).
//! - Times are seconds since the run's start second (`runs.started_ms / 1000`); a
//!   reconfiguration belongs to the second its `started_ms` falls in.
//!
//! The derived figures — throughput dip against the offered rate, recovery on the end-to-end p99
//! and its drain limit, state moved on demand vs in the background — are defined once, in
//! [`derived`] and [`recovery`], and every command that
//! prints them (`koala report`, `run`, `demo`, `compare`) takes them from a [`ReportSummary`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use koala_types::metric;
use thiserror::Error;

use crate::config::JobConfig;
use crate::metrics_store::{MetricsStore, MetricsStoreError, Reconfiguration, RunInfo, TaskScope};

mod checkpoints;
pub mod derived;
pub mod ending;
mod overlay;
pub mod recovery;
mod render;
pub mod table;
mod text;

pub use text::fmt_ms;

pub use checkpoints::{CheckpointSummary, checkpoint_table, recovery_line};
pub use overlay::{overlay_offered, write_overlay, write_throughput_overlay};
pub use render::Span;
pub use table::{GroupSeries, PerSecondTable, SecondRow, combine, group_series};

pub use derived::{
    BASELINE_S, DISRUPTION_WINDOW_S, DipReference, OfferedRate, StateMoved, ThroughputDip, fmt_records,
    input_last_t_s, moving_average, state_moved_by_epoch, throughput_dip,
};
pub use recovery::{
    DrainLimit, RECOVERY_FACTOR, RECOVERY_HOLD_S, fmt_drain_limit, fmt_recovery, recovery_rule, recovery_s,
    recovery_watched_s,
};

/// Seconds at the end of a run whose lag p99 is reported as its tail lag (the demo's "has the
/// backlog drained" check).
pub const TAIL_S: usize = 5;

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
    #[error("metrics store {} has no run {run:?}; its runs (oldest first): {}", path.display(), known.join(", "))]
    UnknownRun {
        /// The database file.
        path: PathBuf,
        /// The run asked for.
        run: String,
        /// The runs it holds, oldest first (each with its query and protocol).
        known: Vec<String>,
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

/// One reconfiguration with the numbers derived around it.
#[derive(Debug, Clone, PartialEq)]
pub struct ReconfigurationSummary {
    /// The reconfiguration as recorded.
    pub reconfiguration: Reconfiguration,
    /// Its start second, since run start.
    pub start_t_s: i64,
    /// Its completion second, since run start, if it completed.
    pub end_t_s: Option<i64>,
    /// Its start in seconds since the run's start second, to the millisecond (plots: two
    /// reconfigurations in one second stay apart).
    pub start_s: f64,
    /// Its completion likewise, if it completed.
    pub end_s: Option<f64>,
    /// See [`throughput_dip`]: over its own seconds, from its start to the next one's start or
    /// the input's last second.
    pub dip: Option<ThroughputDip>,
    /// State moved from its start second until the next reconfiguration's
    /// ([`state_moved_by_epoch`]): the reconfigurations add up to [`ReportSummary::state_moved`].
    pub state_moved: StateMoved,
    /// Its recovery ([`recovery_s`]) on the worst sink's end-to-end p99
    /// ([`SecondRow::latency_p99_ms`]): the recovery every command prints first.
    pub recovery_s: Option<u64>,
    /// The same on the worst sink's median ([`SecondRow::latency_p50_ms`]), printed beside it.
    pub recovery_p50_s: Option<u64>,
    /// The same on source lag ([`SecondRow::lag_mean_ms`]), which misses records inside the job.
    pub lag_recovery_s: Option<u64>,
    /// The recovery no protocol can beat ([`DrainLimit`]); `None` without an emulated capacity
    /// (`[runtime] task_records_per_sec`), a rate schedule, or a completed reconfiguration.
    pub drain_limit: Option<DrainLimit>,
}

impl ReconfigurationSummary {
    /// The drain limit for a summary line, or why there is none.
    pub fn drain_limit_text(&self) -> String {
        match &self.drain_limit {
            Some(limit) => limit.to_string(),
            None => "drain limit n/a (needs [runtime] task_records_per_sec, a finite rate and a completed reconfiguration)".into(),
        }
    }
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
    /// Highest per-second p99 end-to-end latency (worst sink), ms: the peak latency printed first.
    pub peak_latency_p99_ms: Option<f64>,
    /// Highest per-second median end-to-end latency (worst sink), ms, printed beside it.
    pub peak_latency_p50_ms: Option<f64>,
    /// State moved between tasks: on demand, in the background and eagerly ([`StateMoved`]).
    pub state_moved: StateMoved,
    /// Worst per-second p99 source lag over the last [`TAIL_S`] seconds with lag samples, ms.
    pub tail_lag_p99_ms: Option<f64>,
    /// The run's capacity emulation, as `[runtime]` set it (`None` if its config is unreadable).
    pub capacity: Option<String>,
    /// Tasks that could not reach their processing budget: (task, seconds short, lowest measured
    /// capacity in records/s), from `capacity_records_per_sec` samples below the budget.
    pub capacity_shortfall: Vec<(String, u64, f64)>,
    /// Σ over seconds of the max over tasks of `input_paused_ms`, ms (see the module docs).
    pub pause_ms_total: u64,
    /// The largest `queued_records_max` sample of the run and its task (`None` if no task
    /// reported one).
    pub max_queued_records: Option<(String, f64)>,
    /// Per task with a state cache: (task, hits, misses) over the run, from the per-second
    /// `cache_hits` and `cache_misses` samples.
    pub cache_lookups: Vec<(String, f64, f64)>,
    /// The dip with the lowest [`ThroughputDip::ratio`] over all reconfigurations.
    pub worst_dip: Option<ThroughputDip>,
    /// The longest recovery (end-to-end p99, [`ReconfigurationSummary::recovery_s`]); `None`
    /// without reconfigurations or if any never recovered.
    pub recovery_s: Option<u64>,
    /// The longest recovery on the end-to-end median, likewise.
    pub recovery_p50_s: Option<u64>,
    /// The longest recovery of source lag, likewise.
    pub lag_recovery_s: Option<u64>,
    /// Each reconfiguration, by start time.
    pub reconfigurations: Vec<ReconfigurationSummary>,
    /// The per-second table.
    pub table: PerSecondTable,
    /// The last second the sources took input in ([`input_last_t_s`]); `None` without input.
    pub input_last_t_s: Option<i64>,
    /// Whether the plots carry text (a DejaVu Sans font file was found in a usual place).
    pub plots_have_text: bool,
    /// Checkpoints (duration, size, alignment) and recoveries after a lost worker.
    pub checkpoints: CheckpointSummary,
    /// The reconfiguration policy's decisions (`[autoscale]`), oldest first.
    pub autoscale: Vec<crate::metrics_store::DecisionRecord>,
    /// How the run ended (finished, interrupted, failed, …) and the records its sources skipped.
    pub ending: ending::RunEnding,
    /// The files written: PNGs and `report.html`.
    pub files: Vec<PathBuf>,
}

/// One line of a plot: its name and its points (second's middle, value).
pub type PlotLine = (&'static str, Vec<(f64, f64)>);

impl ReportSummary {
    /// The reconfigurations as the plots draw them: spans from start to completion, to the
    /// millisecond, labelled by epoch.
    pub fn spans(&self) -> Vec<Span> {
        render::spans(self)
    }

    /// What each plot draws: per file (`throughput.png`, …), its lines as (name, points at each
    /// second's middle), the data `report`, `compare` and `experiment` render.
    pub fn plot_lines(&self) -> Vec<(&'static str, Vec<PlotLine>)> {
        render::plots(&self.table.rows)
            .into_iter()
            .map(|(file, _, _, lines)| {
                (file, lines.into_iter().map(|(name, _, points)| (name, points)).collect())
            })
            .collect()
    }
}

/// Reports on `run` (the latest run if `None`) of the store at `db`, writing `throughput.png`,
/// `lag.png`, `latency.png`, `batch_latency.png`, `state_moved.png` and `report.html` into
/// `out_dir`.
pub fn report(db: &Path, run: Option<&str>, out_dir: &Path) -> Result<ReportSummary, ReportError> {
    if !db.exists() {
        return Err(ReportError::MissingDatabase { path: db.to_path_buf() });
    }
    let store = MetricsStore::open(db)?;
    let info = match run {
        Some(name) => match store.run(name)? {
            Some(info) => info,
            None => {
                let known = store
                    .runs()?
                    .iter()
                    .map(|r| format!("{} ({}, {})", r.run, r.query, r.protocol))
                    .collect();
                return Err(ReportError::UnknownRun { path: db.to_path_buf(), run: name.to_string(), known });
            }
        },
        None => store.latest_run()?.ok_or_else(|| ReportError::NoRuns { path: db.to_path_buf() })?,
    };
    let mut summary = summarize(&store, info)?;
    std::fs::create_dir_all(out_dir)
        .map_err(|source| ReportError::Write { path: out_dir.to_path_buf(), source })?;
    summary.files = render::write_plots(&summary, out_dir)?;
    let html = out_dir.join("report.html");
    std::fs::write(&html, render::render_html(&summary))
        .map_err(|source| ReportError::Write { path: html.clone(), source })?;
    summary.files.push(html);
    Ok(summary)
}

/// Everything the report computes for the run `info` of `store`, without writing a file (the
/// live API serves it while the run is still going; `files` is empty).
pub fn summarize(store: &MetricsStore, info: RunInfo) -> Result<ReportSummary, ReportError> {
    let mut table = table::read_table(store, &info)?;
    let run_start_s = secs_of_ms(info.started_ms);
    let throughput: Vec<(i64, f64)> = table.rows.iter().map(|r| (r.t_s, r.throughput)).collect();
    let lag: Vec<(i64, Option<f64>)> = table.rows.iter().map(|r| (r.t_s, r.lag_mean_ms)).collect();
    let latency_p99: Vec<(i64, Option<f64>)> = table.rows.iter().map(|r| (r.t_s, r.latency_p99_ms)).collect();
    let latency_p50: Vec<(i64, Option<f64>)> = table.rows.iter().map(|r| (r.t_s, r.latency_p50_ms)).collect();
    let config = JobConfig::parse(&info.config, "runs.config").ok();
    let offered = OfferedRate::from_config(&info.config, info.started_ms);
    let offered_at = offered.as_ref().map(|o| move |t: i64| o.in_second(run_start_s + t));
    let offered_fn = offered_at.as_ref().map(|f| f as &dyn Fn(i64) -> Option<f64>);
    if let Some(offered) = offered_fn {
        for row in &mut table.rows {
            row.offered = offered(row.t_s);
        }
    }
    let input_last = input_last_t_s(&throughput);
    let recorded = store.reconfigurations(&info.run)?;
    let starts: Vec<i64> = recorded.iter().map(|r| secs_of_ms(r.started_ms) - run_start_s).collect();
    let budget = config.as_ref().and_then(|c| c.runtime.task_records_per_sec);
    // Every task takes records; which ran after a reconfiguration gives its capacity after.
    let task_records = match budget {
        Some(_) => store.task_samples(&info.run, metric::RECORDS_IN)?,
        None => Vec::new(),
    };
    let moved = |m: &str| -> Result<Vec<(i64, f64)>, ReportError> {
        Ok(store
            .per_second(&info.run, m, combine(m), TaskScope::All)?
            .into_iter()
            .map(|(t, v)| (i64::try_from(t).unwrap_or(i64::MAX) - run_start_s, v))
            .collect())
    };
    let (on_demand, background, eager) = (
        moved(metric::STATE_BYTES_ON_DEMAND)?,
        moved(metric::STATE_BYTES_BACKGROUND)?,
        moved(metric::STATE_BYTES_EAGER)?,
    );
    let total = |series: &[(i64, f64)]| series.iter().map(|(_, v)| v).sum::<f64>();
    let state_moved = StateMoved::from_totals(total(&on_demand), total(&background), total(&eager));
    let mut moved_by_epoch = state_moved_by_epoch(&starts, &on_demand, &background, &eager).into_iter();
    let reconfigurations: Vec<ReconfigurationSummary> = recorded
        .into_iter()
        .enumerate()
        .map(|(i, r)| {
            let start_t_s = starts[i];
            // Its own seconds: until the next one starts (at least its start second) and before
            // the input's last, partial second.
            let next = starts.get(i + 1).map_or(i64::MAX, |n| (*n).max(start_t_s + 1));
            let window = start_t_s..next.min(input_last.unwrap_or(i64::MIN));
            let overload_t_s = offered.as_ref().and_then(|o| {
                o.last_increase_before(r.started_ms.saturating_sub(info.started_ms))
                    .map(|ms| secs_of_ms(info.started_ms + ms) - run_start_s)
            });
            let since_start = |ms: u64| (ms as f64 - run_start_s as f64 * 1000.0) / 1000.0;
            ReconfigurationSummary {
                start_t_s,
                end_t_s: r.completed_ms.map(|c| secs_of_ms(c) - run_start_s),
                start_s: since_start(r.started_ms),
                end_s: r.completed_ms.map(since_start),
                dip: throughput_dip(&throughput, window, offered_fn),
                state_moved: moved_by_epoch.next().unwrap_or_default(),
                recovery_s: recovery_s(&latency_p99, start_t_s, overload_t_s, input_last),
                recovery_p50_s: recovery_s(&latency_p50, start_t_s, overload_t_s, input_last),
                lag_recovery_s: recovery_s(&lag, start_t_s, overload_t_s, input_last),
                drain_limit: budget.zip(offered_fn).zip(r.completed_ms).and_then(
                    |((budget, offered), done)| {
                        let tasks = recovery::tasks_after(&task_records, &r.operator, done / 1000);
                        DrainLimit::at(&throughput, offered, start_t_s, budget * tasks as f64)
                    },
                ),
                reconfiguration: r,
            }
        })
        .collect();
    let capacity_shortfall = match budget {
        Some(budget) => shortfall(&store.task_samples(&info.run, metric::CAPACITY_RECORDS_PER_SEC)?, budget),
        None => Vec::new(),
    };
    let tail: Vec<f64> = table.rows.iter().filter_map(|r| r.lag_p99_ms).collect();
    let paused = store.per_second(
        &info.run,
        metric::INPUT_PAUSED_MS,
        combine(metric::INPUT_PAUSED_MS),
        TaskScope::All,
    )?;
    // The peak within each second; a run recorded before it existed has the end-of-second gauge.
    let mut queued = store.task_samples(&info.run, metric::QUEUED_RECORDS_MAX)?;
    if queued.is_empty() {
        queued = store.task_samples(&info.run, metric::QUEUED_RECORDS)?;
    }
    let max_queued_records =
        queued.into_iter().map(|(task, _, v)| (task, v)).reduce(|a, b| if b.1 > a.1 { b } else { a });

    let cache_lookups = cache_lookups(
        &store.task_samples(&info.run, metric::CACHE_HITS)?,
        &store.task_samples(&info.run, metric::CACHE_MISSES)?,
    );
    let records_total: f64 = throughput.iter().map(|(_, v)| v).sum();
    let max_of = |f: fn(&SecondRow) -> Option<f64>| table.rows.iter().filter_map(f).reduce(f64::max);
    let longest = |f: fn(&ReconfigurationSummary) -> Option<u64>| {
        reconfigurations.iter().map(f).collect::<Option<Vec<u64>>>().and_then(|r| r.into_iter().max())
    };
    Ok(ReportSummary {
        records_total,
        mean_throughput: if table.rows.is_empty() { 0.0 } else { records_total / table.rows.len() as f64 },
        peak_lag_mean_ms: max_of(|r| r.lag_mean_ms),
        peak_lag_p99_ms: max_of(|r| r.lag_p99_ms),
        peak_latency_p50_ms: max_of(|r| r.latency_p50_ms),
        peak_latency_p99_ms: max_of(|r| r.latency_p99_ms),
        state_moved,
        tail_lag_p99_ms: tail.iter().rev().take(TAIL_S).copied().reduce(f64::max),
        capacity: config.as_ref().map(|c| c.runtime.capacity_line()),
        capacity_shortfall,
        pause_ms_total: paused.iter().map(|(_, ms)| ms).sum::<f64>().round() as u64,
        max_queued_records,
        cache_lookups,
        worst_dip: reconfigurations
            .iter()
            .filter_map(|r| r.dip)
            .min_by(|a, b| a.ratio().total_cmp(&b.ratio())),
        recovery_s: longest(|r| r.recovery_s),
        recovery_p50_s: longest(|r| r.recovery_p50_s),
        lag_recovery_s: longest(|r| r.lag_recovery_s),
        reconfigurations,
        table,
        input_last_t_s: input_last,
        plots_have_text: render::plot_font_ready(),
        checkpoints: CheckpointSummary {
            checkpoints: store.checkpoints(&info.run)?,
            recoveries: store.recoveries(&info.run)?,
            skipped: store.checkpoints_skipped(&info.run)?,
        },
        autoscale: store.autoscale_decisions(&info.run)?,
        ending: ending::RunEnding::read(store, &info)?,
        files: Vec::new(),
        run: info,
    })
}

/// Sets each reconfiguration's stored `bytes_moved` of `run` to the state the report gives it:
/// Σ of the tasks' `state_bytes_on_demand`, `state_bytes_background` and `state_bytes_eager`
/// from its start second to the next one's ([`state_moved_by_epoch`]: the reconfigurations add
/// up to the run's state moved). For Koala and DRRS, whose tasks acknowledge no bytes (their
/// fetches and pushes report through the metrics), once the run's samples are all stored;
/// stop-and-restart's and Remote's acknowledged hand-over is exact per reconfiguration already.
pub fn settle_bytes_moved(store: &mut MetricsStore, run: &str) -> Result<(), MetricsStoreError> {
    let recorded = store.reconfigurations(run)?;
    let starts: Vec<i64> = recorded.iter().map(|r| secs_of_ms(r.started_ms)).collect();
    let series = |store: &MetricsStore, m: &str| -> Result<Vec<(i64, f64)>, MetricsStoreError> {
        Ok(store
            .per_second(run, m, combine(m), TaskScope::All)?
            .into_iter()
            .map(|(t, v)| (i64::try_from(t).unwrap_or(i64::MAX), v))
            .collect())
    };
    let (on_demand, background, eager) = (
        series(store, metric::STATE_BYTES_ON_DEMAND)?,
        series(store, metric::STATE_BYTES_BACKGROUND)?,
        series(store, metric::STATE_BYTES_EAGER)?,
    );
    for (r, moved) in recorded.iter().zip(state_moved_by_epoch(&starts, &on_demand, &background, &eager)) {
        store.set_bytes_moved(run, r.epoch, &r.operator, moved.total().round() as u64)?;
    }
    Ok(())
}

/// Per task, Σ of its hits and misses samples: (task, hits, misses), by task.
fn cache_lookups(hits: &[(String, u64, f64)], misses: &[(String, u64, f64)]) -> Vec<(String, f64, f64)> {
    let mut by_task: BTreeMap<&str, (f64, f64)> = BTreeMap::new();
    for (task, _, v) in hits {
        by_task.entry(task).or_default().0 += v;
    }
    for (task, _, v) in misses {
        by_task.entry(task).or_default().1 += v;
    }
    by_task.into_iter().map(|(task, (h, m))| (task.to_string(), h, m)).collect()
}

/// Per task, the seconds its measured capacity fell below `budget` and the lowest one.
fn shortfall(samples: &[(String, u64, f64)], budget: f64) -> Vec<(String, u64, f64)> {
    let mut by_task: BTreeMap<&str, (u64, f64)> = BTreeMap::new();
    for (task, _, capacity) in samples.iter().filter(|(_, _, c)| *c < budget) {
        let entry = by_task.entry(task).or_insert((0, f64::INFINITY));
        entry.0 += 1;
        entry.1 = entry.1.min(*capacity);
    }
    by_task.into_iter().map(|(task, (n, min))| (task.to_string(), n, min)).collect()
}

/// Whole unix seconds of a unix-milliseconds instant (the store caps values at `i64::MAX`).
pub(crate) fn secs_of_ms(ms: u64) -> i64 {
    i64::try_from(ms / 1000).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_renders_aligned_columns() {
        let row = |t_s, throughput| SecondRow {
            t_s,
            throughput,
            output: throughput,
            lag_mean_ms: Some(1.0),
            ..SecondRow::default()
        };
        let text = PerSecondTable { rows: vec![row(0, 5.0), row(1, 123_456.0)] }.to_string();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines.iter().all(|l| l.len() == lines[0].len()), "{text}");
    }
}
