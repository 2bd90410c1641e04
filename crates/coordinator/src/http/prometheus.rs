//! `GET /metrics`: the job's metrics in the Prometheus text exposition format (version 0.0.4),
//! with standard names and base units (seconds, bytes, `_total` for counters) and the labels
//! `operator`, `task` (`operator.index`, as the metrics store and the report name it) and
//! `worker` (the worker the task runs on now; empty once the task left the deployment).
//!
//! Counters are the run's totals of the per-second samples tasks report; gauges are the value of
//! the task's last reported second (the same samples `koala report` aggregates, see
//! `koala_types::metric` for what each one measures).

use std::collections::BTreeMap;
use std::fmt::Write;

use koala_types::metric;

use super::live::{JobInfo, Snapshot};

/// How one task metric is exposed.
struct Exposed {
    /// The task metric (`koala_types::metric`).
    metric: &'static str,
    /// The Prometheus name.
    name: &'static str,
    /// `counter` (the run's total) or `gauge` (the last second's value).
    kind: &'static str,
    /// Multiplier to the base unit (ms → s: 0.001).
    scale: f64,
    /// An extra label, e.g. `quantile="0.99"`.
    label: &'static str,
    /// The HELP text.
    help: &'static str,
}

const fn counter(
    metric: &'static str,
    name: &'static str,
    scale: f64,
    label: &'static str,
    help: &'static str,
) -> Exposed {
    Exposed { metric, name, kind: "counter", scale, label, help }
}

const fn gauge(
    metric: &'static str,
    name: &'static str,
    scale: f64,
    label: &'static str,
    help: &'static str,
) -> Exposed {
    Exposed { metric, name, kind: "gauge", scale, label, help }
}

/// Every task metric `/metrics` exposes, grouped by name (a name's samples must be together).
const EXPOSED: &[Exposed] = &[
    counter(
        metric::RECORDS_IN,
        "koala_records_in_total",
        1.0,
        "",
        "Records the task took from its inputs (sources: records generated or read).",
    ),
    counter(
        metric::RECORDS_OUT,
        "koala_records_out_total",
        1.0,
        "",
        "Records the task emitted downstream (sinks: records written).",
    ),
    counter(metric::BATCHES, "koala_batches_total", 1.0, "", "Batches the task processed."),
    counter(
        metric::LATE_DROPPED,
        "koala_late_dropped_records_total",
        1.0,
        "",
        "Records dropped as later than the watermark allows.",
    ),
    counter(
        metric::STATE_BYTES_ON_DEMAND,
        "koala_state_moved_bytes_total",
        1.0,
        "kind=\"on_demand\"",
        "State bytes this task sent to another, by when: on demand (a record waited), in the background, or eagerly with the hand-over.",
    ),
    counter(metric::STATE_BYTES_BACKGROUND, "koala_state_moved_bytes_total", 1.0, "kind=\"background\"", ""),
    counter(metric::STATE_BYTES_EAGER, "koala_state_moved_bytes_total", 1.0, "kind=\"eager\"", ""),
    counter(
        metric::INPUT_PAUSED_MS,
        "koala_input_paused_seconds_total",
        0.001,
        "",
        "Time the task had input waiting and took none because its reconfiguration protocol held it back.",
    ),
    counter(
        metric::BACKPRESSURE_MS,
        "koala_backpressure_seconds_total",
        0.001,
        "",
        "Time the task spent blocked on a full downstream queue or socket.",
    ),
    counter(
        metric::BUSY_MS,
        "koala_busy_seconds_total",
        0.001,
        "",
        "Time the task was busy: processing batches and timers, or held by its emulated processing budget.",
    ),
    counter(
        metric::THROTTLED_MS,
        "koala_throttled_seconds_total",
        0.001,
        "",
        "Time input was held back by the task's emulated processing budget.",
    ),
    gauge(
        metric::LATENCY_P50_MS,
        "koala_e2e_latency_seconds",
        0.001,
        "quantile=\"0.5\"",
        "Sinks: end-to-end latency (arrival at the sink - due at the source) of the records written in the task's last reported second.",
    ),
    gauge(metric::LATENCY_P99_MS, "koala_e2e_latency_seconds", 0.001, "quantile=\"0.99\"", ""),
    gauge(metric::LATENCY_MAX_MS, "koala_e2e_latency_seconds", 0.001, "quantile=\"1\"", ""),
    gauge(
        metric::SOURCE_LAG_P99_MS,
        "koala_source_lag_seconds",
        0.001,
        "quantile=\"0.99\"",
        "Sources: lag (now - when the record was due) in the task's last reported second.",
    ),
    gauge(
        metric::SOURCE_LAG_MEAN_MS,
        "koala_source_lag_mean_seconds",
        0.001,
        "",
        "Sources: mean lag in the task's last reported second.",
    ),
    gauge(
        metric::BATCH_LATENCY_P99_US,
        "koala_batch_latency_seconds",
        0.000_001,
        "quantile=\"0.99\"",
        "Per-batch latency (first record taken to last output) in the task's last reported second.",
    ),
    gauge(metric::BATCH_LATENCY_MAX_US, "koala_batch_latency_seconds", 0.000_001, "quantile=\"1\"", ""),
    gauge(
        metric::BATCH_LATENCY_MEAN_US,
        "koala_batch_latency_mean_seconds",
        0.000_001,
        "",
        "Mean per-batch latency in the task's last reported second.",
    ),
    gauge(
        metric::QUEUED_RECORDS,
        "koala_queued_records",
        1.0,
        "",
        "Records the task took and has not handed to its operator yet, at the end of its last reported second.",
    ),
    gauge(
        metric::QUEUED_RECORDS_MAX,
        "koala_queued_records_max",
        1.0,
        "",
        "The most records the task held queued at once in its last reported second.",
    ),
    gauge(
        metric::SOURCE_OFFSET_LAG,
        "koala_source_offset_lag_records",
        1.0,
        "",
        "External sources: records not yet read.",
    ),
];

/// Escapes a label value (backslash, double quote, newline).
fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// A sample value as the format writes it (`+Inf`, `-Inf`, `NaN` spelled out).
fn value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf".into() } else { "-Inf".into() }
    } else {
        format!("{v}")
    }
}

/// The whole exposition.
pub fn render(info: &JobInfo, now: &Snapshot) -> String {
    let mut out = String::new();
    // Task → (operator, worker) from the current deployment.
    let mut placed: BTreeMap<String, (String, String)> = BTreeMap::new();
    if let Some(d) = &now.deployment {
        for (task, worker) in &d.placement {
            let op = info.operator_name(task.operator).to_string();
            placed.insert(info.task_name(*task), (op, worker.0.to_string()));
        }
    }
    let labels = |task: &str| -> String {
        let (op, worker) = placed
            .get(task)
            .cloned()
            .unwrap_or_else(|| (task.rsplit_once('.').map_or(task, |(op, _)| op).to_string(), String::new()));
        format!("operator=\"{}\",task=\"{}\",worker=\"{}\"", escape(&op), escape(task), escape(&worker))
    };
    let mut described = std::collections::BTreeSet::new();
    for e in EXPOSED {
        if described.insert(e.name) {
            let help = EXPOSED.iter().find(|x| x.name == e.name).map_or("", |x| x.help);
            let _ = writeln!(out, "# HELP {} {}", e.name, help);
            let _ = writeln!(out, "# TYPE {} {}", e.name, e.kind);
        }
        for (task, m) in &now.tasks {
            let v = if e.kind == "counter" { m.total.get(e.metric) } else { m.last.get(e.metric) };
            let Some(v) = v else { continue };
            let extra = if e.label.is_empty() { String::new() } else { format!(",{}", e.label) };
            let _ = writeln!(out, "{}{{{}{extra}}} {}", e.name, labels(task), value(v * e.scale));
        }
    }
    // Stateful tasks' per-bucket load (`metric::bucket_records`), the autoscaler's input.
    let mut described_buckets = false;
    for (task, m) in &now.tasks {
        for (name, v) in &m.total {
            let Some(bucket) = metric::bucket_of_metric(name) else { continue };
            if !std::mem::replace(&mut described_buckets, true) {
                let _ = writeln!(
                    out,
                    "# HELP koala_bucket_records_total Records a stateful task processed per bucket."
                );
                let _ = writeln!(out, "# TYPE koala_bucket_records_total counter");
            }
            let _ = writeln!(
                out,
                "koala_bucket_records_total{{{},bucket=\"{bucket}\"}} {}",
                labels(task),
                value(*v)
            );
        }
    }
    let job = format!("run=\"{}\",protocol=\"{}\"", escape(&info.run), escape(&info.protocol));
    let _ =
        writeln!(out, "# HELP koala_job_running Whether the job runs (0 while it starts or once it ended).");
    let _ = writeln!(out, "# TYPE koala_job_running gauge");
    let _ =
        writeln!(out, "koala_job_running{{{job}}} {}", u8::from(now.phase == super::live::Phase::Running));
    let _ = writeln!(out, "# HELP koala_reconfigurations_total Reconfigurations completed.");
    let _ = writeln!(out, "# TYPE koala_reconfigurations_total counter");
    let _ = writeln!(out, "koala_reconfigurations_total{{{job}}} {}", now.completed);
    let _ = writeln!(out, "# HELP koala_reconfiguration_running Whether a reconfiguration is running.");
    let _ = writeln!(out, "# TYPE koala_reconfiguration_running gauge");
    let _ = writeln!(out, "koala_reconfiguration_running{{{job}}} {}", u8::from(now.running.is_some()));
    if let Some(d) = &now.deployment {
        let _ = writeln!(out, "# HELP koala_operator_tasks Live tasks of each operator.");
        let _ = writeln!(out, "# TYPE koala_operator_tasks gauge");
        for o in &info.operators {
            let n = d.tasks.get(&o.id).map_or(0, Vec::len);
            let _ = writeln!(out, "koala_operator_tasks{{operator=\"{}\"}} {n}", escape(&o.name));
        }
        let _ = writeln!(
            out,
            "# HELP koala_deployment_epoch The reconfiguration that produced the current deployment (0: the initial one)."
        );
        let _ = writeln!(out, "# TYPE koala_deployment_epoch gauge");
        let _ = writeln!(out, "koala_deployment_epoch{{{job}}} {}", d.epoch);
    }
    out
}
