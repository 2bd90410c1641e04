//! Per-second progress of a running job, folded from task samples, and the events `koala run`
//! prints as progress lines.

use std::collections::{BTreeMap, HashSet};

use koala_dataflow::{JobGraph, OperatorKind};
use koala_protocol::TaskSample;
use koala_types::{OperatorId, metric};

use crate::autoscale::{TaskSecond, busy_ms};

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
    /// A reconfiguration completed. The state it moved is read off the per-second progress (its
    /// [`Progress::state_bytes`] from its start second to this one), the report's ruler for every
    /// protocol: the protocol's own figure ([`ReconfigurationCompletion::bytes_moved`]) counts
    /// only what stop-and-restart's hand-over acknowledged.
    ///
    /// [`ReconfigurationCompletion::bytes_moved`]: crate::metrics_store::ReconfigurationCompletion
    ReconfigurationCompleted {
        /// Its epoch.
        epoch: u64,
        /// The second it completed in, since the run's start second (as `second` above).
        second: u64,
        /// How long upstream tasks were paused, ms.
        pause_ms: u64,
        /// From start to completion, ms.
        duration_ms: u64,
        /// Whether state keeps moving after completion (Koala: on first access).
        lazy: bool,
    },
    /// The job lost a worker and restarted from a checkpoint.
    Recovered {
        /// The second it restarted in, since the run's start second.
        second: u64,
        /// What was lost (`worker1 disappeared`).
        lost: String,
        /// The checkpoint restored (0: none had completed; the job restarted from its beginning).
        checkpoint: u64,
        /// From the loss's detection to the restarted job, ms.
        ms: u64,
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

/// Where a worker's budget comes from, in words.
fn budget_source(report: &koala_protocol::memory::MemoryReport) -> String {
    use koala_protocol::memory::{BudgetSource, MANAGED_FRACTION_TENTHS};
    match report.source {
        BudgetSource::Configured => "[runtime] worker_memory_mb".to_string(),
        BudgetSource::Derived { machine_bytes, workers_on_machine } => format!(
            "0.{MANAGED_FRACTION_TENTHS} of {} physical memory / {workers_on_machine} worker(s) on the machine; \
             set [runtime] worker_memory_mb to override",
            mib(machine_bytes)
        ),
    }
}

/// A worker's memory report in full, for the debug log: the budget and where it comes from,
/// then each stateful task's share and what it pays for (docs/architecture.md §5, "Memory
/// budget").
pub fn memory_lines(worker: koala_types::WorkerId, report: &koala_protocol::memory::MemoryReport) -> String {
    let source = budget_source(report);
    let mut out = format!(
        "[memory] {worker}: budget {} ({source}); store {} off the top; {} stateful task(s)",
        mib(report.budget),
        mib(report.worker_store),
        report.tasks.len()
    );
    for t in &report.tasks {
        let cache = match (t.cache, report.fixed_cache) {
            (Some(c), _) => format!(
                "cache {} (the rest; Koala's key-lookup table, which says where each moved key's state is, counts against it)",
                mib(c)
            ),
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

/// What `koala run` prints about memory while a job runs: one line with the budget when the first
/// worker reports it, and later only what asks for action — a worker whose budget differs from
/// the one printed, or a worker whose stateful tasks' shares no longer cover their queues and
/// store (over budget). The full split goes to the debug log ([`memory_lines`]).
#[derive(Debug, Default)]
pub struct MemoryNotes {
    budget: Option<u64>,
    over_budget: HashSet<koala_types::WorkerId>,
}

impl MemoryNotes {
    /// The line to print for `worker`'s report, if any.
    pub fn note(
        &mut self,
        worker: koala_types::WorkerId,
        report: &koala_protocol::memory::MemoryReport,
    ) -> Option<String> {
        use koala_protocol::memory::MIN_CACHE_BYTES;
        let short = report.tasks.iter().find(|t| {
            let cache = if t.cache.is_some() { MIN_CACHE_BYTES } else { 0 };
            t.share < t.queues + t.store + cache
        });
        if let Some(t) = short {
            let newly = self.over_budget.insert(worker);
            self.budget.get_or_insert(report.budget);
            return newly.then(|| {
                format!(
                    "memory: {worker} is over its budget of {}: {} stateful task(s) get {} each, less than their queues                      ({}) and store ({}) need; raise [runtime] worker_memory_mb or run fewer stateful tasks per worker",
                    mib(report.budget),
                    report.tasks.len(),
                    mib(t.share),
                    mib(t.queues),
                    mib(t.store)
                )
            });
        }
        self.over_budget.remove(&worker);
        match self.budget {
            Some(b) if b == report.budget => None,
            Some(_) => Some(format!(
                "memory: {worker} has a budget of {} ({})",
                mib(report.budget),
                budget_source(report)
            )),
            None => {
                self.budget = Some(report.budget);
                let cache = match report.fixed_cache {
                    Some(0) => "no state cache ([state] cache_mb = 0)".to_string(),
                    Some(c) => format!("a state cache of {} each ([state] cache_mb)", mib(c)),
                    None if report.tasks.iter().any(|t| t.cache.is_some()) => {
                        "the rest of each share is its state cache".to_string()
                    }
                    None => "the backend keeps no cache".to_string(),
                };
                Some(format!(
                    "memory: {} per worker ({}), shared by its stateful tasks; {cache} (KOALA_LOG=debug prints the split)",
                    mib(report.budget),
                    budget_source(report)
                ))
            }
        }
    }
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
    /// State bytes moved between tasks in that second, on demand, in the background and eagerly
    /// (Σ of the three `state_bytes_*` metrics over every task: the report's state moved).
    pub state_bytes: f64,
}

/// Totals over the whole run.
#[derive(Default)]
pub struct Totals {
    /// Records produced by sources, replayed ones each time.
    pub records_in: u64,
    /// Records written by sinks, rewritten ones each time.
    pub records_out: u64,
    /// Records dropped as too late.
    pub late_dropped: u64,
    /// Per source task, its latest `records_total` sample: (second, records since the job's start).
    sources_once: BTreeMap<koala_types::TaskId, (u64, u64)>,
    /// The same per sink task.
    sinks_once: BTreeMap<koala_types::TaskId, (u64, u64)>,
    /// Records the sources took again after recoveries, as far as their samples reached the
    /// coordinator before the loss (a lost worker's last second never does): a lower bound.
    pub replayed_at_least: u64,
    /// Records the sinks wrote again after recoveries, likewise a lower bound.
    pub rewritten_at_least: u64,
    /// Records each source operator skipped as malformed, by operator name.
    pub malformed: BTreeMap<String, u64>,
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
                metric::RECORDS_TOTAL => {
                    let once = if op.is_source() { &mut self.sources_once } else { &mut self.sinks_once };
                    let latest = once.entry(s.task).or_insert((s.time_s, s.value as u64));
                    if s.time_s >= latest.0 {
                        *latest = (s.time_s, s.value as u64);
                    }
                }
                metric::RECORDS_MALFORMED if s.value > 0.0 => {
                    *self.malformed.entry(op.name.clone()).or_default() += s.value as u64;
                }
                _ => {}
            }
        }
    }

    /// A recovery rewound every source and sink to `restored` (their `records_total` in the
    /// checkpoint restored; absent = 0, the job's start): what each had reported past it is taken
    /// or written again.
    pub fn rewound(&mut self, restored: &BTreeMap<koala_types::TaskId, u64>) {
        for (once, again) in [
            (&mut self.sources_once, &mut self.replayed_at_least),
            (&mut self.sinks_once, &mut self.rewritten_at_least),
        ] {
            for (task, (_, latest)) in once.iter_mut() {
                let back = restored.get(task).copied().unwrap_or(0);
                *again += latest.saturating_sub(back);
                *latest = back.min(*latest);
            }
        }
    }

    /// A task's latest `records_total` (a source's records emitted since the job's start).
    pub fn latest_total(&self, task: koala_types::TaskId) -> Option<u64> {
        self.sources_once.get(&task).or_else(|| self.sinks_once.get(&task)).map(|(_, n)| *n)
    }

    /// Records the sources took once each (Σ of their latest `records_total`): what a recovery
    /// replayed counts once. `None` if no source reported it.
    pub fn records_in_once(&self) -> Option<u64> {
        (!self.sources_once.is_empty()).then(|| self.sources_once.values().map(|(_, n)| n).sum())
    }

    /// Records the sinks wrote once each, likewise.
    pub fn records_out_once(&self) -> Option<u64> {
        (!self.sinks_once.is_empty()).then(|| self.sinks_once.values().map(|(_, n)| n).sum())
    }
}

/// One task of the driven operator in one second, as folded so far.
#[derive(Default)]
struct TaskFold {
    records_in: f64,
    batches: f64,
    batch_mean_us: f64,
    busy_ms: Option<f64>,
    buckets: BTreeMap<u16, f64>,
}

/// One second as folded so far.
struct Fold {
    progress: Progress,
    lag_n: u32,
    lag_sum: f64,
    tasks: BTreeMap<u32, TaskFold>,
}

/// One complete second of the job: its progress line and, when a policy drives an operator
/// (`[autoscale]`), that operator's tasks.
#[derive(Clone, Debug, PartialEq)]
pub struct JobSecond {
    /// Unix second.
    pub t: u64,
    /// The progress line's figures.
    pub progress: Progress,
    /// The driven operator's tasks that reported the second (none without a driven operator).
    pub tasks: Vec<TaskSecond>,
}

/// Folds per-task samples into per-second rows: the one aggregator behind `koala run`'s progress
/// lines and the reconfiguration policy's seconds (`crate::autoscale`).
pub struct SecondAggregator {
    sources: HashSet<OperatorId>,
    sinks: HashSet<OperatorId>,
    start_s: u64,
    /// The operator the policy drives and `[runtime] task_records_per_sec`.
    driven: Option<(OperatorId, Option<f64>)>,
    seconds: BTreeMap<u64, Fold>,
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
        Self { sources, sinks, start_s, driven: None, seconds: BTreeMap::new() }
    }

    /// Also folds the tasks of `operator` (the one the policy drives); `budget` is `[runtime]
    /// task_records_per_sec`, whose emulated capacity counts as busy time.
    pub fn driving(mut self, operator: OperatorId, budget: Option<f64>) -> Self {
        self.driven = Some((operator, budget));
        self
    }

    /// Adds one batch of samples.
    pub fn add(&mut self, samples: &[TaskSample]) {
        for s in samples.iter().filter(|s| s.value.is_finite()) {
            let start_s = self.start_s;
            let fold = self.seconds.entry(s.time_s).or_insert_with(|| Fold {
                progress: Progress { second: s.time_s.saturating_sub(start_s), ..Progress::default() },
                lag_n: 0,
                lag_sum: 0.0,
                tasks: BTreeMap::new(),
            });
            let p = &mut fold.progress;
            let op = s.task.operator;
            let source = self.sources.contains(&op);
            let max = |v: &mut Option<f64>| *v = Some(v.map_or(s.value, |m| m.max(s.value)));
            match s.metric.as_str() {
                metric::RECORDS_OUT if source => p.input_per_s += s.value,
                metric::RECORDS_IN if self.sinks.contains(&op) => p.output_per_s += s.value,
                metric::SOURCE_LAG_MEAN_MS if source => {
                    fold.lag_n += 1;
                    fold.lag_sum += s.value;
                    p.lag_mean_ms = Some(fold.lag_sum / f64::from(fold.lag_n));
                }
                metric::SOURCE_LAG_P99_MS if source => max(&mut p.lag_p99_ms),
                metric::LATENCY_P99_MS if self.sinks.contains(&op) => max(&mut p.latency_p99_ms),
                metric::BATCH_LATENCY_P99_US if !source => max(&mut p.batch_p99_us),
                metric::BACKPRESSURE_MS => p.backpressure_ms += s.value,
                metric::STATE_BYTES_ON_DEMAND
                | metric::STATE_BYTES_BACKGROUND
                | metric::STATE_BYTES_EAGER => p.state_bytes += s.value,
                _ => {}
            }
            if self.driven.is_some_and(|d| d.0 == op) {
                let t = fold.tasks.entry(s.task.index).or_default();
                match s.metric.as_str() {
                    metric::RECORDS_IN => t.records_in += s.value,
                    metric::BATCHES => t.batches += s.value,
                    metric::BATCH_LATENCY_MEAN_US => t.batch_mean_us = s.value,
                    metric::BUSY_MS => t.busy_ms = Some(t.busy_ms.unwrap_or(0.0) + s.value),
                    name => {
                        if let Some(b) = metric::bucket_of_metric(name) {
                            *t.buckets.entry(b).or_default() += s.value;
                        }
                    }
                }
            }
        }
    }

    /// Seconds old enough that every task has reported them (two seconds behind `now_s`; all of
    /// them for `u64::MAX`), oldest first.
    pub fn complete(&mut self, now_s: u64) -> Vec<JobSecond> {
        let mut out = Vec::new();
        while let Some((&t, _)) = self.seconds.first_key_value() {
            if now_s != u64::MAX && t + 2 > now_s {
                break;
            }
            let Some((_, fold)) = self.seconds.pop_first() else { break };
            let budget = self.driven.and_then(|d| d.1);
            let tasks = fold
                .tasks
                .into_iter()
                .map(|(index, x)| TaskSecond {
                    index,
                    records_in: x.records_in,
                    busy_ms: busy_ms(
                        x.records_in,
                        x.busy_ms.unwrap_or(x.batches * x.batch_mean_us / 1000.0),
                        budget,
                    ),
                    buckets: x.buckets.into_iter().collect(),
                })
                .collect();
            out.push(JobSecond { t, progress: fold.progress, tasks });
        }
        out
    }
}

impl From<JobSecond> for crate::autoscale::Second {
    fn from(s: JobSecond) -> Self {
        crate::autoscale::Second {
            t: s.t,
            input_per_s: s.progress.input_per_s,
            lag_mean_ms: s.progress.lag_mean_ms,
            lag_p99_ms: s.progress.lag_p99_ms,
            latency_p99_ms: s.progress.latency_p99_ms,
            tasks: s.tasks,
        }
    }
}

#[cfg(test)]
mod tests {
    use koala_dataflow::{Dataflow, KeyedEvent, KeyedEvents, KeyedEventsConfig, SourceOptions, ValueState};
    use koala_types::TaskId;

    use super::*;

    /// The run's totals name each source that skipped malformed records, summed over its tasks
    /// and seconds; a source that skipped none is not listed.
    #[test]
    fn totals_count_malformed_records_per_source() {
        let df = Dataflow::new();
        let config = KeyedEventsConfig { key_space: 3, records: Some(30), ..Default::default() };
        KeyedEvents::source(&df, "bids", SourceOptions::default(), config.clone()).sink_json_lines("a");
        KeyedEvents::source(&df, "people", SourceOptions::default(), config).sink_json_lines("b");
        let graph = df.build().expect("graph");
        let sample = |op: &str, index: u32, value: f64| TaskSample {
            time_s: 1_000,
            task: TaskId { operator: graph.by_name(op).map(|o| o.id).expect(op), index },
            metric: metric::RECORDS_MALFORMED.to_string(),
            value,
        };
        let mut totals = Totals::default();
        totals.add(&graph, &[sample("bids", 0, 2.0), sample("bids", 1, 1.0), sample("people", 0, 0.0)]);
        totals.add(&graph, &[sample("bids", 0, 4.0)]);
        assert_eq!(totals.malformed, BTreeMap::from([("bids".to_string(), 7)]));
    }

    #[test]
    fn memory_is_one_line_at_the_start_and_then_only_what_asks_for_action() {
        use koala_protocol::memory::{BudgetSource, MemoryReport, TaskShare};
        use koala_types::{OperatorId, WorkerId};
        let share = |index, share| TaskShare {
            task: TaskId::new(OperatorId(1), index),
            share,
            queues: 8 << 20,
            store: 16 << 20,
            cache: Some(share.saturating_sub(24 << 20)),
        };
        let report = |budget, tasks| MemoryReport {
            budget,
            source: BudgetSource::Configured,
            worker_store: 256 << 20,
            tasks,
            fixed_cache: None,
        };
        let mut notes = MemoryNotes::default();
        let first = notes.note(WorkerId(0), &report(512 << 20, vec![share(0, 256 << 20)]));
        let first = first.expect("the budget is printed once");
        assert!(first.contains("512.0 MiB per worker ([runtime] worker_memory_mb)"), "{first}");
        assert!(!first.contains("KLT"), "{first}");
        // The same budget on the other worker, and a re-split at a scale-out: nothing to say.
        assert_eq!(notes.note(WorkerId(1), &report(512 << 20, vec![share(1, 256 << 20)])), None);
        let resplit = report(512 << 20, vec![share(0, 128 << 20), share(2, 128 << 20)]);
        assert_eq!(notes.note(WorkerId(0), &resplit), None);
        // Shares that do not cover queues and store: said once, with the fix.
        let over = report(512 << 20, (0..12).map(|i| share(i, 20 << 20)).collect());
        let line = notes.note(WorkerId(0), &over).expect("over budget is printed");
        assert!(line.contains("worker0 is over its budget") && line.contains("worker_memory_mb"), "{line}");
        assert_eq!(notes.note(WorkerId(0), &over), None);
        // The full split stays available for the debug log, in words.
        let full = memory_lines(WorkerId(0), &resplit);
        assert!(full.contains("key-lookup table") && !full.contains("KLT"), "{full}");
    }

    #[test]
    fn one_aggregator_gives_the_progress_line_and_the_driven_operators_tasks() {
        let df = Dataflow::new();
        let config = KeyedEventsConfig { key_space: 3, records: Some(30), ..Default::default() };
        KeyedEvents::source(&df, "events", SourceOptions::default(), config)
            .key_by(|e: &KeyedEvent| e.key)
            .stateful_map("count", |key: &u64, _e: KeyedEvent, n: &mut ValueState<u64>| {
                (*key, n.update(|n| *n += 1))
            })
            .sink_json_lines("counts");
        let graph = df.build().expect("graph");
        let id = |name: &str| graph.by_name(name).map(|o| o.id).expect(name);
        let sample = |op: &str, index: u32, metric: &str, value: f64| TaskSample {
            time_s: 1_000,
            task: TaskId { operator: id(op), index },
            metric: metric.to_string(),
            value,
        };
        let samples = [
            sample("events", 0, metric::RECORDS_OUT, 30_000.0),
            sample("events", 0, metric::SOURCE_LAG_MEAN_MS, 40.0),
            sample("events", 0, metric::SOURCE_LAG_P99_MS, 90.0),
            sample("counts", 0, metric::RECORDS_IN, 29_000.0),
            sample("counts", 0, metric::LATENCY_P99_MS, 120.0),
            sample("count", 1, metric::RECORDS_IN, 12_000.0),
            sample("count", 1, metric::BUSY_MS, 1_500.0),
            sample("count", 1, &metric::bucket_records(7), 9_000.0),
            sample("count", 1, &metric::bucket_records(9), 3_000.0),
            sample("count", 0, metric::RECORDS_IN, 4_000.0),
            sample("count", 0, metric::BATCHES, 10.0),
            sample("count", 0, metric::BATCH_LATENCY_MEAN_US, 2_000.0),
        ];
        // Without a driven operator: the progress line only.
        let mut plain = SecondAggregator::new(&graph, 990);
        plain.add(&samples);
        assert!(plain.complete(1_001).is_empty(), "a second is complete two seconds later");
        let [s] = plain.complete(1_002).try_into().expect("one second");
        assert_eq!(
            (s.t, s.progress.second, s.progress.input_per_s, s.progress.output_per_s),
            (1_000, 10, 30_000.0, 29_000.0)
        );
        assert_eq!(
            (s.progress.lag_mean_ms, s.progress.lag_p99_ms, s.progress.latency_p99_ms),
            (Some(40.0), Some(90.0), Some(120.0))
        );
        assert!(s.tasks.is_empty());
        // Driving `count` under a 10 000/s budget: the same line, and its tasks.
        let mut driving = SecondAggregator::new(&graph, 990).driving(id("count"), Some(10_000.0));
        driving.add(&samples);
        let [d] = driving.complete(u64::MAX).try_into().expect("one second");
        assert_eq!(d.progress, s.progress);
        // Task 1: the worker's busy time (1.5 s: its sample covered more than a second) and
        // its buckets. Task 0 sent no busy time: batches × mean latency (20 ms), or its budget
        // share (400 ms), whichever is more.
        assert_eq!(
            d.tasks[1],
            TaskSecond {
                index: 1,
                records_in: 12_000.0,
                busy_ms: 1_500.0,
                buckets: vec![(7, 9_000.0), (9, 3_000.0)]
            }
        );
        assert_eq!(d.tasks[0], TaskSecond { index: 0, records_in: 4_000.0, busy_ms: 400.0, buckets: vec![] });
        let policy: crate::autoscale::Second = d.into();
        assert_eq!((policy.t, policy.input_per_s, policy.latency_p99_ms), (1_000, 30_000.0, Some(120.0)));
    }
}
