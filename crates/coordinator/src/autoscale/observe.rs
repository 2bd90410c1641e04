//! Folds the task samples the coordinator receives into the policy's [`Second`]s: the sources'
//! output and lag, the sinks' end-to-end latency, and per task of the driven operator its input
//! and busy time.

use std::collections::{BTreeMap, HashSet};

use koala_dataflow::{JobGraph, OperatorKind};
use koala_protocol::TaskSample;
use koala_types::{OperatorId, metric};

use super::{Second, TaskSecond};

#[derive(Default)]
struct TaskPartial {
    records_in: f64,
    batches: f64,
    batch_mean_us: f64,
}

#[derive(Default)]
struct Partial {
    input: f64,
    lag_sum: f64,
    lag_n: u32,
    lag_p99: Option<f64>,
    latency_p99: Option<f64>,
    tasks: BTreeMap<u32, TaskPartial>,
}

/// Per-second folds of task samples, handed out once every task has reported the second.
pub struct Observer {
    sources: HashSet<OperatorId>,
    sinks: HashSet<OperatorId>,
    operator: OperatorId,
    budget: Option<f64>,
    seconds: BTreeMap<u64, Partial>,
}

/// Busy milliseconds of a task's second: its batches' processing time, or, under the capacity
/// emulation, at least the share of its budget its records used (the throttle's waits count).
pub fn busy_ms(records_in: f64, batches: f64, batch_mean_us: f64, budget: Option<f64>) -> f64 {
    let processing = batches * batch_mean_us / 1000.0;
    let emulated = budget.map_or(0.0, |b| records_in * 1000.0 / b);
    processing.max(emulated).clamp(0.0, 1000.0)
}

impl Observer {
    /// An observer of `operator` in `graph`; `budget` is `[runtime] task_records_per_sec`.
    pub fn new(graph: &JobGraph, operator: OperatorId, budget: Option<f64>) -> Self {
        let sources = graph.operators.iter().filter(|o| o.is_source()).map(|o| o.id).collect();
        let sinks = graph
            .operators
            .iter()
            .filter(|o| matches!(o.kind, OperatorKind::Sink { .. }))
            .map(|o| o.id)
            .collect();
        Self { sources, sinks, operator, budget, seconds: BTreeMap::new() }
    }

    /// Adds one batch of samples.
    pub fn add(&mut self, samples: &[TaskSample]) {
        for s in samples.iter().filter(|s| s.value.is_finite()) {
            let p = self.seconds.entry(s.time_s).or_default();
            let op = s.task.operator;
            let max = |v: &mut Option<f64>| *v = Some(v.map_or(s.value, |m| m.max(s.value)));
            match s.metric.as_str() {
                metric::RECORDS_OUT if self.sources.contains(&op) => p.input += s.value,
                metric::SOURCE_LAG_MEAN_MS if self.sources.contains(&op) => {
                    p.lag_sum += s.value;
                    p.lag_n += 1;
                }
                metric::SOURCE_LAG_P99_MS if self.sources.contains(&op) => max(&mut p.lag_p99),
                metric::LATENCY_P99_MS if self.sinks.contains(&op) => max(&mut p.latency_p99),
                metric::RECORDS_IN if op == self.operator => {
                    p.tasks.entry(s.task.index).or_default().records_in += s.value
                }
                metric::BATCHES if op == self.operator => {
                    p.tasks.entry(s.task.index).or_default().batches += s.value
                }
                metric::BATCH_LATENCY_MEAN_US if op == self.operator => {
                    p.tasks.entry(s.task.index).or_default().batch_mean_us = s.value
                }
                _ => {}
            }
        }
    }

    /// Seconds old enough that every task has reported them (as `koala run`'s progress lines:
    /// two seconds behind `now_s`), oldest first.
    pub fn complete(&mut self, now_s: u64) -> Vec<Second> {
        let mut out = Vec::new();
        while let Some((&t, _)) = self.seconds.first_key_value() {
            if t + 2 > now_s {
                break;
            }
            let Some((_, p)) = self.seconds.pop_first() else { break };
            let tasks = p
                .tasks
                .iter()
                .map(|(i, x)| TaskSecond {
                    index: *i,
                    records_in: x.records_in,
                    busy_ms: busy_ms(x.records_in, x.batches, x.batch_mean_us, self.budget),
                })
                .collect();
            out.push(Second {
                t,
                input_per_s: p.input,
                lag_mean_ms: (p.lag_n > 0).then(|| p.lag_sum / f64::from(p.lag_n)),
                lag_p99_ms: p.lag_p99,
                latency_p99_ms: p.latency_p99,
                tasks,
            });
        }
        out
    }
}
