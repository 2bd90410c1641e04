//! Per-second progress of a running job, folded from task samples, and the events `koala run`
//! prints as progress lines.

use std::collections::{BTreeMap, HashSet};

use koala_dataflow::{JobGraph, OperatorKind};
use koala_protocol::TaskSample;
use koala_types::{OperatorId, metric};

/// What `koala run` prints while a job runs.
#[derive(Clone, Debug, PartialEq)]
pub enum ProgressEvent {
    /// One second of the job.
    Second(Progress),
    /// A reconfiguration started.
    ReconfigurationStarted {
        /// Its epoch.
        epoch: u64,
        /// The second it started in, since the run's start second: the clock of
        /// [`Progress::second`] and of `koala report`'s `t`.
        second: u64,
        /// What it does, e.g. `scale_out aggregate 2→4 (12 buckets move)`.
        description: String,
    },
    /// A reconfiguration completed.
    ReconfigurationCompleted {
        /// Its epoch.
        epoch: u64,
        /// The second it completed in, since the run's start second (as `second` above).
        second: u64,
        /// Bytes of state moved.
        bytes_moved: u64,
        /// How long upstream tasks were paused, ms.
        pause_ms: u64,
        /// From start to completion, ms.
        duration_ms: u64,
        /// Whether state keeps moving after completion (Koala: on first access).
        lazy: bool,
    },
    /// A reconfiguration request was rejected or skipped.
    ReconfigurationRejected {
        /// Why.
        error: String,
    },
    /// The reconfiguration policy (`[autoscale]`) decided and submitted a request.
    AutoscaleDecision {
        /// The last second of the window it judged, since the run's start second.
        second: u64,
        /// What, why, and the coordinator's answer.
        description: String,
    },
    /// A worker's memory budget and its split (at deployment, and when a reconfiguration adds
    /// or removes stateful tasks on it).
    Memory {
        /// The worker.
        worker: koala_types::WorkerId,
        /// What it reported.
        report: koala_protocol::memory::MemoryReport,
    },
}

/// MiB with one decimal, for memory lines.
fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
}

/// A worker's memory report as `koala run` prints it: the budget and where it comes from, then
/// each stateful task's share and what it pays for (docs/architecture.md §5, "Memory budget").
pub fn memory_lines(worker: koala_types::WorkerId, report: &koala_protocol::memory::MemoryReport) -> String {
    use koala_protocol::memory::{BudgetSource, MANAGED_FRACTION_TENTHS};
    let source = match report.source {
        BudgetSource::Configured => "[runtime] worker_memory_mb".to_string(),
        BudgetSource::Derived { machine_bytes, workers_on_machine } => format!(
            "0.{MANAGED_FRACTION_TENTHS} of {} physical memory / {workers_on_machine} worker(s) on the machine; \
             set [runtime] worker_memory_mb to override",
            mib(machine_bytes)
        ),
    };
    let mut out = format!(
        "[memory] {worker}: budget {} ({source}); store {} off the top; {} stateful task(s)",
        mib(report.budget),
        mib(report.worker_store),
        report.tasks.len()
    );
    for t in &report.tasks {
        let cache = match (t.cache, report.fixed_cache) {
            (Some(c), _) => format!("cache {} (the rest; KLT charged to it)", mib(c)),
            (None, Some(0)) => "no cache ([state] cache_mb = 0)".to_string(),
            (None, Some(c)) => format!("cache {} fixed by [state] cache_mb", mib(c)),
            (None, None) => "no cache (the backend has none)".to_string(),
        };
        out.push_str(&format!(
            "\n[memory]   {}: share {} = queues {} + store {} + {cache}",
            t.task,
            mib(t.share),
            mib(t.queues),
            mib(t.store)
        ));
    }
    out
}

/// One second of a running job, for progress lines.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Progress {
    /// Seconds since the job started.
    pub second: u64,
    /// Records the sources produced in that second.
    pub input_per_s: f64,
    /// Records the sinks wrote in that second.
    pub output_per_s: f64,
    /// Mean source lag (ms), mean over source tasks.
    pub lag_mean_ms: Option<f64>,
    /// Worst task's p99 source lag (ms).
    pub lag_p99_ms: Option<f64>,
    /// Worst sink's p99 end-to-end latency (ms).
    pub latency_p99_ms: Option<f64>,
    /// Worst task's p99 per-batch latency (µs) over non-source tasks.
    pub batch_p99_us: Option<f64>,
    /// Milliseconds tasks spent blocked on full channels, summed.
    pub backpressure_ms: f64,
}

/// Totals over the whole run.
#[derive(Default)]
pub struct Totals {
    /// Records produced by sources.
    pub records_in: u64,
    /// Records written by sinks.
    pub records_out: u64,
    /// Records dropped as too late.
    pub late_dropped: u64,
}

impl Totals {
    /// Adds one batch of samples.
    pub fn add(&mut self, graph: &JobGraph, samples: &[TaskSample]) {
        for s in samples {
            let Some(op) = graph.operator(s.task.operator) else {
                continue;
            };
            match s.metric.as_str() {
                metric::RECORDS_OUT if op.is_source() => self.records_in += s.value as u64,
                metric::RECORDS_IN if matches!(op.kind, OperatorKind::Sink { .. }) => {
                    self.records_out += s.value as u64;
                }
                metric::LATE_DROPPED => self.late_dropped += s.value as u64,
                _ => {}
            }
        }
    }
}

/// Folds per-task samples into per-second progress.
pub struct SecondAggregator {
    sources: HashSet<OperatorId>,
    sinks: HashSet<OperatorId>,
    start_s: u64,
    seconds: BTreeMap<u64, (Progress, u32, f64)>,
}

impl SecondAggregator {
    /// An aggregator for a run that started at unix second `start_s`.
    pub fn new(graph: &JobGraph, start_s: u64) -> Self {
        let sources = graph.operators.iter().filter(|o| o.is_source()).map(|o| o.id).collect();
        let sinks = graph
            .operators
            .iter()
            .filter(|o| matches!(o.kind, OperatorKind::Sink { .. }))
            .map(|o| o.id)
            .collect();
        Self { sources, sinks, start_s, seconds: BTreeMap::new() }
    }

    /// Adds one batch of samples.
    pub fn add(&mut self, samples: &[TaskSample]) {
        for s in samples {
            let entry = self.seconds.entry(s.time_s).or_insert_with(|| {
                (Progress { second: s.time_s.saturating_sub(self.start_s), ..Progress::default() }, 0, 0.0)
            });
            let (p, lag_n, lag_sum) = entry;
            let source = self.sources.contains(&s.task.operator);
            match s.metric.as_str() {
                metric::RECORDS_OUT if source => p.input_per_s += s.value,
                metric::RECORDS_IN if self.sinks.contains(&s.task.operator) => p.output_per_s += s.value,
                metric::SOURCE_LAG_MEAN_MS => {
                    *lag_n += 1;
                    *lag_sum += s.value;
                    p.lag_mean_ms = Some(*lag_sum / f64::from(*lag_n));
                }
                metric::SOURCE_LAG_P99_MS => {
                    p.lag_p99_ms = Some(p.lag_p99_ms.map_or(s.value, |v| v.max(s.value)))
                }
                metric::LATENCY_P99_MS => {
                    p.latency_p99_ms = Some(p.latency_p99_ms.map_or(s.value, |v| v.max(s.value)));
                }
                metric::BATCH_LATENCY_P99_US if !source => {
                    p.batch_p99_us = Some(p.batch_p99_us.map_or(s.value, |v| v.max(s.value)));
                }
                metric::BACKPRESSURE_MS => p.backpressure_ms += s.value,
                _ => {}
            }
        }
    }

    /// Seconds old enough that every task has reported them.
    pub fn complete(&mut self, now_s: u64) -> Vec<Progress> {
        let mut out = Vec::new();
        while let Some((&t, _)) = self.seconds.first_key_value() {
            if now_s != u64::MAX && t + 2 > now_s {
                break;
            }
            if let Some((_, (p, _, _))) = self.seconds.pop_first() {
                out.push(p);
            }
        }
        out
    }
}
