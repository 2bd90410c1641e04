//! The JSON of the HTTP API: the job and its deployment, per-second metrics (the report's table
//! for the job, the same figures per operator and per task), the reconfiguration history with the
//! report's derived figures, and reconfiguration requests parsed as the CLI parses them.

use std::collections::BTreeMap;

use koala_protocol::{ClientReply, ReconfigRequest};
use serde_json::{Value, json};

use super::live::{Live, Snapshot};
use crate::metrics_store::{Grouping, MetricsStore, RunInfo};
use crate::report::{self, ReportSummary, SecondRow};
use crate::request_record;

/// An answer other than 200: its status and the message of its `{"error": …}` body.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status.
    pub status: u16,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl ApiError {
    /// 400 Bad Request.
    pub fn bad(message: impl Into<String>) -> Self {
        Self { status: 400, message: message.into() }
    }

    /// 500: the metrics store could not be read.
    fn store(e: impl std::fmt::Display) -> Self {
        Self { status: 500, message: format!("reading the metrics store: {e}") }
    }
}

/// Most seconds `GET /api/metrics?seconds=N` returns.
pub const MAX_SECONDS: u64 = 3600;

/// `GET /api/job`: the run, the graph and the current deployment.
pub fn job(live: &Live, now: &Snapshot) -> Value {
    let info = &live.info;
    let operators: Vec<Value> = info
        .operators
        .iter()
        .map(|o| {
            let inputs: Vec<Value> =
                o.inputs.iter().map(|(from, p)| json!({ "from": from, "partitioning": p })).collect();
            json!({ "name": o.name, "kind": o.kind, "inputs": inputs })
        })
        .collect();
    let deployment = now.deployment.as_ref().map(|d| {
        let tasks: Vec<Value> = d
            .placement
            .iter()
            .filter(|(t, _)| d.tasks.get(&t.operator).is_some_and(|live| live.contains(&t.index)))
            .map(|(t, w)| {
                let buckets = d.routing.get(&t.operator).map(|r| r.iter().filter(|i| **i == t.index).count());
                json!({
                    "task": info.task_name(*t),
                    "operator": info.operator_name(t.operator),
                    "index": t.index,
                    "worker": w.0,
                    "buckets": buckets,
                    "finished": d.finished.contains(t),
                })
            })
            .collect();
        let parallelism: BTreeMap<&str, usize> = info
            .operators
            .iter()
            .map(|o| (o.name.as_str(), d.tasks.get(&o.id).map_or(0, Vec::len)))
            .collect();
        let buckets: BTreeMap<&str, &Vec<u32>> =
            d.routing.iter().map(|(op, r)| (info.operator_name(*op), r)).collect();
        let workers: Vec<Value> =
            d.workers.iter().map(|(w, addr)| json!({ "id": w.0, "data_addr": addr })).collect();
        json!({
            "epoch": d.epoch,
            "num_buckets": d.num_buckets,
            "parallelism": parallelism,
            "tasks": tasks,
            "workers": workers,
            "buckets": buckets,
        })
    });
    json!({
        "run": info.run,
        "query": info.query,
        "protocol": info.protocol,
        "phase": now.phase.name(),
        "started_ms": now.started_ms,
        "control_addr": info.control_addr,
        "metrics_db": info.metrics_db.display().to_string(),
        "operators": operators,
        "deployment": deployment,
        "running": now.running.as_ref().map(|r| json!({ "epoch": r.epoch, "operator": r.operator })),
        "queued": now.queued,
        "completed": now.completed,
        "checkpoints": checkpoints(live),
    })
}

/// `/api/job`'s `checkpoints`: whether they are on, how often, how many are kept, how many
/// completed and skipped, the last one (id, epoch, when, how long, its alignment, size, bytes
/// written anew, directory), every one (`list`: id, duration, size, written, entries,
/// alignment), the number of recoveries and each one (`recovery_list`: what was lost, the
/// checkpoint, detection → restart → first record out). The counts come from the metrics
/// database; if it cannot be read, `error` says why and the counts are null.
fn checkpoints(live: &Live) -> Value {
    let info = &live.info;
    let mut out = json!({
        "enabled": info.checkpoint_interval_ms.is_some(),
        "interval_ms": info.checkpoint_interval_ms,
        "retained": info.checkpoints_retained,
        "completed": 0,
        "skipped": 0,
        "recoveries": 0,
        "last": null,
        "list": [],
        "recovery_list": [],
    });
    let read = open_run(live).and_then(|run| match run {
        Some((store, _)) => {
            let done = store.checkpoints(&info.run).map_err(ApiError::store)?;
            let recoveries = store.recoveries(&info.run).map_err(ApiError::store)?;
            let skipped = store.checkpoints_skipped(&info.run).map_err(ApiError::store)?;
            Ok(Some((done, recoveries, skipped)))
        }
        None => Ok(None),
    });
    match read {
        Ok(Some((done, recoveries, skipped))) => {
            out["completed"] = json!(done.len());
            out["skipped"] = json!(skipped);
            out["recoveries"] = json!(recoveries.len());
            out["list"] = done
                .iter()
                .map(|c| {
                    json!({
                        "id": c.id,
                        "duration_ms": c.completed_ms.saturating_sub(c.started_ms),
                        "bytes": c.bytes,
                        "written_bytes": c.written_bytes,
                        "entries": c.entries,
                        "alignment_ms": c.alignment_ms,
                    })
                })
                .collect();
            out["recovery_list"] = recoveries
                .iter()
                .map(|r| {
                    json!({
                        "lost": r.lost,
                        "checkpoint": r.checkpoint,
                        "detected_ms": r.detected_ms,
                        "restarted_ms": r.restarted_ms,
                        "first_output_ms": r.first_output_ms,
                        "restart_after_ms": r.restart_ms(),
                        "first_output_after_ms": r.first_output_after_ms(),
                    })
                })
                .collect();
            out["last"] = done.iter().max_by_key(|c| c.id).map_or(Value::Null, |c| {
                json!({
                    "id": c.id,
                    "epoch": c.epoch,
                    "started_ms": c.started_ms,
                    "completed_ms": c.completed_ms,
                    "duration_ms": c.completed_ms.saturating_sub(c.started_ms),
                    "alignment_ms": c.alignment_ms,
                    "bytes": c.bytes,
                    "written_bytes": c.written_bytes,
                    "entries": c.entries,
                    "path": c.path,
                })
            });
        }
        Ok(None) => {}
        Err(e) => {
            out["completed"] = Value::Null;
            out["skipped"] = Value::Null;
            out["recoveries"] = Value::Null;
            out["error"] = json!(e.message);
        }
    }
    out
}

/// The run's row, or `None` while the job starts (the coordinator records it once deployed).
fn open_run(live: &Live) -> Result<Option<(MetricsStore, RunInfo)>, ApiError> {
    if !live.info.metrics_db.exists() {
        return Ok(None);
    }
    let store = MetricsStore::open(&live.info.metrics_db).map_err(ApiError::store)?;
    match store.run(&live.info.run).map_err(ApiError::store)? {
        Some(info) => Ok(Some((store, info))),
        None => Ok(None),
    }
}

fn row_json(r: &SecondRow) -> Value {
    json!({
        "t_s": r.t_s,
        "throughput": r.throughput,
        "output": r.output,
        "offered": r.offered,
        "lag_mean_ms": r.lag_mean_ms,
        "lag_p99_ms": r.lag_p99_ms,
        "latency_p50_ms": r.latency_p50_ms,
        "latency_p99_ms": r.latency_p99_ms,
        "latency_max_ms": r.latency_max_ms,
        "batch_latency_mean_us": r.batch_latency_mean_us,
        "batch_latency_p99_us": r.batch_latency_p99_us,
        "batch_latency_max_us": r.batch_latency_max_us,
        "state_bytes_moved": r.state_bytes_moved,
        "backpressure_ms": r.backpressure_ms,
    })
}

/// Parses `seconds=N` of a query string (default 60, 1 to [`MAX_SECONDS`]).
pub fn seconds_param(query: &str) -> Result<u64, ApiError> {
    let mut seconds = 60;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("seconds", v)) => {
                seconds = v.parse().ok().filter(|s| (1..=MAX_SECONDS).contains(s)).ok_or_else(|| {
                    ApiError::bad(format!(
                        "seconds: {v:?} is not a number of seconds from 1 to {MAX_SECONDS}"
                    ))
                })?;
            }
            _ => {
                return Err(ApiError::bad(format!(
                    "query {pair:?}: /api/metrics takes only seconds=N (1 to {MAX_SECONDS})"
                )));
            }
        }
    }
    Ok(seconds)
}

/// `GET /api/metrics?seconds=N`: the last N seconds of the report's per-second table (the whole
/// job), the same figures per operator and per task, and where reconfigurations ran.
pub fn metrics(live: &Live, now: &Snapshot, seconds: u64) -> Result<Value, ApiError> {
    let Some((store, info)) = open_run(live)? else {
        return Ok(json!({ "run": live.info.run, "phase": now.phase.name(), "seconds": seconds,
            "job": [], "operators": {}, "tasks": {}, "reconfigurations": [] }));
    };
    let summary = report::summarize(&store, info.clone()).map_err(ApiError::store)?;
    let last = summary.table.rows.last().map_or(0, |r| r.t_s);
    let since = last - i64::try_from(seconds).unwrap_or(i64::MAX) + 1;
    let job: Vec<Value> = summary.table.rows.iter().filter(|r| r.t_s >= since).map(row_json).collect();
    let grouped = |g| -> Result<Value, ApiError> {
        let series = report::group_series(&store, &info, g, since).map_err(ApiError::store)?;
        serde_json::to_value(series).map_err(|e| ApiError { status: 500, message: e.to_string() })
    };
    let marks: Vec<Value> = summary
        .reconfigurations
        .iter()
        .map(|r| {
            let c = &r.reconfiguration;
            json!({ "epoch": c.epoch, "kind": c.kind, "operator": c.operator, "start_s": r.start_s, "end_s": r.end_s })
        })
        .collect();
    Ok(json!({
        "run": live.info.run,
        "phase": now.phase.name(),
        "seconds": seconds,
        "last_t_s": last,
        "job": job,
        "operators": grouped(Grouping::Operator)?,
        "tasks": grouped(Grouping::Task)?,
        "reconfigurations": marks,
    }))
}

fn reconfiguration_json(summary: &ReportSummary, r: &report::ReconfigurationSummary) -> Value {
    let c = &r.reconfiguration;
    let watched = report::recovery_watched_s(r.start_t_s, summary.input_last_t_s);
    json!({
        "epoch": c.epoch,
        "operator": c.operator,
        "kind": c.kind,
        "protocol": c.protocol,
        "detail": request_record::describe_text(&c.detail),
        "request": request_record::from_text(&c.detail).map(|r| request_record::to_json(&r)),
        "start_s": r.start_s,
        "end_s": r.end_s,
        "completed": c.completed_ms.is_some(),
        "buckets_moved": c.buckets_moved,
        "pause_ms": c.pause_ms,
        "state_moved": {
            "on_demand_bytes": r.state_moved.on_demand,
            "background_bytes": r.state_moved.background,
            "eager_bytes": r.state_moved.eager,
            "total_bytes": r.state_moved.total(),
        },
        "dip": r.dip.map(|d| json!({ "min": d.min, "against": d.offered, "at_t_s": d.at_t_s, "text": d.to_string() })),
        "recovery_rule": report::recovery_rule(),
        "recovery_s": r.recovery_s,
        "recovery_p50_s": r.recovery_p50_s,
        "lag_recovery_s": r.lag_recovery_s,
        "recovery": report::fmt_recovery(r.recovery_s, watched),
        "recovery_p50": report::fmt_recovery(r.recovery_p50_s, watched),
        "lag_recovery": report::fmt_recovery(r.lag_recovery_s, watched),
        "drain_limit": r.drain_limit.map(|d| json!({
            "seconds": d.seconds(),
            "backlog_records": d.backlog,
            "capacity_records_per_sec": d.capacity,
            "offered_records_per_sec": d.offered,
            "text": d.to_string(),
        })),
    })
}

/// `GET /api/reconfigurations`: every reconfiguration so far with the report's figures (state
/// moved, pause, throughput dip, recovery on the p99 and the drain limit), and the run's totals beside them.
pub fn reconfigurations(live: &Live, now: &Snapshot) -> Result<Value, ApiError> {
    let running = now.running.as_ref().map(|r| json!({ "epoch": r.epoch, "operator": r.operator }));
    let Some((store, info)) = open_run(live)? else {
        return Ok(json!({ "run": live.info.run, "phase": now.phase.name(), "reconfigurations": [],
            "running": running, "queued": now.queued }));
    };
    let summary = report::summarize(&store, info).map_err(ApiError::store)?;
    let list: Vec<Value> =
        summary.reconfigurations.iter().map(|r| reconfiguration_json(&summary, r)).collect();
    Ok(json!({
        "run": live.info.run,
        "phase": now.phase.name(),
        "reconfigurations": list,
        "running": running,
        "queued": now.queued,
        "state_moved_bytes": summary.state_moved.total(),
        "input_paused_ms": summary.pause_ms_total,
        "max_queued_records": summary.max_queued_records.map(|(task, n)| json!({ "task": task, "records": n })),
    }))
}

/// The JSON object of a request body, with only the fields `allowed`.
fn object(body: &[u8], allowed: &[&str], example: &str) -> Result<serde_json::Map<String, Value>, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad(format!("body: not JSON ({e}); expected an object like {example}")))?;
    let Value::Object(map) = value else {
        return Err(ApiError::bad(format!("body: not a JSON object; expected one like {example}")));
    };
    if let Some(unknown) = map.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(ApiError::bad(format!(
            "{unknown}: not a field of this request; it takes {} (e.g. {example})",
            allowed.join(", ")
        )));
    }
    Ok(map)
}

fn field<'a>(
    map: &'a serde_json::Map<String, Value>,
    name: &str,
    example: &str,
) -> Result<&'a Value, ApiError> {
    map.get(name).ok_or_else(|| ApiError::bad(format!("{name}: missing; e.g. {example}")))
}

fn text_field(map: &serde_json::Map<String, Value>, name: &str, example: &str) -> Result<String, ApiError> {
    match field(map, name, example)? {
        Value::String(s) => Ok(s.clone()),
        other => Err(ApiError::bad(format!("{name}: {other} is not a string; e.g. {example}"))),
    }
}

fn number_field(map: &serde_json::Map<String, Value>, name: &str, example: &str) -> Result<u32, ApiError> {
    let value = field(map, name, example)?;
    value.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(|| {
        ApiError::bad(format!("{name}: {value} is not a whole number from 0 to {}; e.g. {example}", u32::MAX))
    })
}

/// The body of `POST /api/{kind}` as a request: the CLI's flags as JSON fields (`moves` in
/// `--move`'s syntax, parsed by the same function); an error names the field and gives an example.
pub fn parse_request(kind: &str, body: &[u8]) -> Result<ReconfigRequest, ApiError> {
    match kind {
        "rescale" => {
            let example = r#"{"operator": "aggregate", "parallelism": 4}"#;
            let map = object(body, &["operator", "parallelism"], example)?;
            Ok(ReconfigRequest::Rescale {
                operator: text_field(&map, "operator", example)?,
                parallelism: number_field(&map, "parallelism", example)?,
            })
        }
        "rebalance" => {
            let example = r#"{"operator": "aggregate", "moves": ["3,4,10-12:1"]}"#;
            let map = object(body, &["operator", "moves"], example)?;
            let operator = text_field(&map, "operator", example)?;
            let Value::Array(list) = field(&map, "moves", example)? else {
                return Err(ApiError::bad(format!(
                    "moves: not a list of BUCKETS:TASK strings; e.g. {example}"
                )));
            };
            if list.is_empty() {
                return Err(ApiError::bad(
                    "moves: give at least one `buckets:task` move, e.g. \"3,4,10-12:1\"",
                ));
            }
            let mut moves = Vec::new();
            let mut listed = 0;
            for (i, m) in list.iter().enumerate() {
                let name = format!("moves[{i}]");
                let text = m
                    .as_str()
                    .ok_or_else(|| ApiError::bad(format!("{name}: {m} is not a BUCKETS:TASK string")))?;
                let (buckets, task) = crate::control::parse_move(text, &name).map_err(ApiError::bad)?;
                // Each move's ranges are bounded by the parser; all of them together here.
                listed += buckets.len();
                if listed > crate::control::MAX_LISTED_BUCKETS {
                    return Err(ApiError::bad(crate::control::too_many_buckets("moves")));
                }
                moves.push((buckets, task));
            }
            Ok(ReconfigRequest::Rebalance { operator, moves })
        }
        "migrate" => {
            let example = r#"{"operator": "aggregate", "task": 0, "worker": 1}"#;
            let map = object(body, &["operator", "task", "worker"], example)?;
            Ok(ReconfigRequest::Migrate {
                operator: text_field(&map, "operator", example)?,
                task: number_field(&map, "task", example)?,
                worker: number_field(&map, "worker", example)?,
            })
        }
        other => Err(ApiError {
            status: 404,
            message: format!("no request {other:?}; POST to /api/rescale, /api/rebalance or /api/migrate"),
        }),
    }
}

/// The coordinator's reply as HTTP: 200 accepted, 202 queued, 422 rejected, each with the line
/// `koala rescale` prints for it ([`crate::control::reply_line`]).
pub fn reply(reply: &ClientReply) -> Result<(u16, Value), ApiError> {
    let line = crate::control::reply_line(reply).map_err(|message| ApiError { status: 422, message })?;
    Ok(match reply {
        ClientReply::Queued { ahead } => (202, json!({ "queued": true, "ahead": ahead, "message": line })),
        ClientReply::Accepted { epoch } => {
            (200, json!({ "accepted": true, "epoch": epoch, "message": line }))
        }
        ClientReply::Rejected { .. } => (422, json!({ "error": line })),
    })
}
