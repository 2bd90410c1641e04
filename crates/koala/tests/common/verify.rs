//! Checks that a run did what its config asked, from its metrics database
//! (`<output_dir>/metrics.db`, schema in `crates/coordinator/src/metrics_store.rs`): the protocol
//! and `extra_keys` the run recorded, every scheduled reconfiguration completed with the kind and
//! bucket count the schedule implies, the tasks it created processed records, and state moved.
//! Without these checks an oracle test passes when the config silently ran something else (e.g.
//! the default protocol) or when a reconfiguration never took effect.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use koala_coordinator::metrics_store::{MetricsStore, Reconfiguration, RunInfo};
use koala_types::metric;
use rusqlite::{Connection, OpenFlags};

use super::model::{Applied, apply_schedule};

/// A key as `key_by` encodes it: the bytes its bucket is computed from, whatever its type (a
/// `u64`, or a pair such as Twitch's (streamer, viewer)).
pub type KeyBytes = Vec<u8>;

/// `keys` encoded as `key_by` encodes them, for [`Expect::keys`].
pub fn key_bytes<K: serde::Serialize>(keys: impl IntoIterator<Item = K>) -> BTreeSet<KeyBytes> {
    keys.into_iter().map(|k| koala_types::encode(&k).expect("encode key")).collect()
}

/// What a run's metrics database holds about it.
#[derive(Clone, Debug)]
pub struct RunRecord {
    /// Run name.
    pub run: String,
    /// Start, unix ms (just before the sources start).
    pub started_ms: u64,
    /// Protocol name.
    pub protocol: String,
    /// The run's config, as TOML.
    pub config: String,
    /// Reconfigurations by epoch.
    pub reconfigurations: Vec<Reconfiguration>,
    /// (task, metric) → sum over the run's samples.
    pub sums: BTreeMap<(String, String), f64>,
    /// (task, metric) → largest sample of the run.
    pub maxes: BTreeMap<(String, String), f64>,
    /// What [`check_run`] checked beyond protocol, config and counts (for the test's output).
    pub checked: Vec<String>,
}

impl RunRecord {
    /// Reads the only run of `db`.
    pub fn read(db: &Path) -> Result<Self, String> {
        let store = MetricsStore::open(db).map_err(|e| format!("metrics db {}: {e}", db.display()))?;
        let mut runs = store.runs().map_err(|e| format!("metrics db {}: {e}", db.display()))?;
        if runs.len() != 1 {
            return Err(format!("metrics db {}: {} runs recorded, expected 1", db.display(), runs.len()));
        }
        let RunInfo { run, started_ms, protocol, config, .. } = runs.remove(0);
        let mut reconfigurations =
            store.reconfigurations(&run).map_err(|e| format!("metrics db {}: {e}", db.display()))?;
        reconfigurations.sort_by_key(|r| r.epoch);
        // Per-task totals: one query, not one per (task, metric) pair.
        let fail = |what: &str, e: rusqlite::Error| format!("metrics db {}: {what}: {e}", db.display());
        let conn =
            Connection::open_with_flags(db, OpenFlags::SQLITE_OPEN_READ_ONLY).map_err(|e| fail("open", e))?;
        let per_task = |aggregate: &str| -> Result<BTreeMap<(String, String), f64>, String> {
            let sql = format!(
                "SELECT task, metric, {aggregate}(value) FROM metrics WHERE run = ?1 GROUP BY task, metric"
            );
            let mut stmt = conn.prepare(&sql).map_err(|e| fail("read metrics", e))?;
            let rows = stmt
                .query_map([&run], |r| {
                    Ok(((r.get(0)?, r.get(1)?), r.get::<_, Option<f64>>(2)?.unwrap_or(0.0)))
                })
                .map_err(|e| fail("read metrics", e))?;
            rows.collect::<Result<BTreeMap<_, _>, _>>().map_err(|e| fail("read metrics", e))
        };
        let (sums, maxes) = (per_task("SUM")?, per_task("MAX")?);
        Ok(Self { run, started_ms, protocol, config, reconfigurations, sums, maxes, checked: Vec::new() })
    }

    /// Sum of `metric` over the run for `task` (e.g. `aggregate.3`); 0 if never sampled.
    pub fn task_sum(&self, task: &str, metric: &str) -> f64 {
        self.sums.get(&(task.to_string(), metric.to_string())).copied().unwrap_or(0.0)
    }

    /// Sum of `metric` over the run and every task.
    pub fn total(&self, metric: &str) -> f64 {
        self.sums.iter().filter(|((_, m), _)| m == metric).map(|(_, v)| *v).sum()
    }

    /// The tasks that reported `metric`, with their largest sample.
    pub fn task_maxes(&self, metric: &str) -> Vec<(&str, f64)> {
        self.maxes.iter().filter(|((_, m), _)| m == metric).map(|((t, _), v)| (t.as_str(), *v)).collect()
    }

    /// Completed reconfigurations.
    pub fn completed(&self) -> usize {
        self.reconfigurations.iter().filter(|r| r.completed_ms.is_some()).count()
    }
}

/// What a run must show.
pub struct Expect<'a> {
    /// The full config text the run used.
    pub config_text: &'a str,
    /// `koala`, `stop-and-restart` or `remote`.
    pub protocol: &'a str,
    /// Koala's `extra_keys` the config set (8 when it sets none).
    pub extra_keys: usize,
    /// Wall-clock milliseconds the rate-limited input takes (records / rate).
    pub input_ms: u64,
    /// The keys a stateful operator holds state for, by operator name, encoded ([`key_bytes`]);
    /// an operator given none is checked for completion only.
    pub keys: &'a dyn Fn(&str) -> BTreeSet<KeyBytes>,
    /// Keys with state a moved bucket set must contain before state must have moved (fewer keys
    /// can all be without state at that instant, e.g. windows that just fired).
    pub min_state_keys: &'a dyn Fn(&str) -> usize,
    /// Operators whose state, once a key has it, stays forever (running aggregates, lists,
    /// unwindowed joins): under Koala, moved keys are accessed again, so some state must move.
    pub permanent_state: &'a dyn Fn(&str) -> bool,
}

/// A created task must have at least this many keys and live this long before it must have
/// processed records.
const MIN_KEYS_FOR_RECORDS: usize = 20;
const MIN_LIFE_MS: u64 = 300;
/// A stop-and-restart pause at least this long holds input back at an upstream while the input
/// runs: five times the longest `linger_ms` the tests draw, after which every channel has
/// flushed. A pause of a few milliseconds may see no message arrive and so hold nothing back.
const MIN_PAUSE_HOLDING_INPUT_MS: u64 = 50;

/// The `extra_keys = N` the top-level config lines set, or the default 8.
pub fn extra_keys_of(top: &str) -> usize {
    top.lines()
        .filter_map(|l| l.trim().strip_prefix("extra_keys"))
        .filter_map(|rest| rest.trim().strip_prefix('=')?.trim().parse().ok())
        .next_back()
        .unwrap_or(8)
}

/// The `drain_keys_per_sec = R` the top-level config lines set, or the default 0 (off).
pub fn drain_of(top: &str) -> u64 {
    top.lines()
        .filter_map(|l| l.trim().strip_prefix("drain_keys_per_sec"))
        .filter_map(|rest| rest.trim().strip_prefix('=')?.trim().parse().ok())
        .next_back()
        .unwrap_or(0)
}

/// Checks the run in `out_dir` against `expect`; `Err` says what it did not do.
pub fn check_run(out_dir: &Path, expect: &Expect<'_>) -> Result<RunRecord, String> {
    let mut rec = RunRecord::read(&out_dir.join("metrics.db"))?;
    let mut checked = Vec::new();
    // DRRS under the original DRRS's schedule records itself as `drrs-overlapping`: a run that
    // reports the other schedule fails.
    let asked: toml::Table = toml::from_str(expect.config_text).unwrap_or_default();
    let schedule = asked.get("drrs").and_then(|d| d.get("schedule")).and_then(toml::Value::as_str);
    let label = if expect.protocol == "drrs" && schedule == Some("overlapping") {
        "drrs-overlapping"
    } else {
        expect.protocol
    };
    if rec.protocol != label {
        return Err(format!("the run used protocol {:?}, the case asked for {label:?}", rec.protocol));
    }
    let recorded: toml::Table =
        toml::from_str(&rec.config).map_err(|e| format!("runs.config is not TOML: {e}\n{}", rec.config))?;
    let rec_protocol = recorded.get("protocol").and_then(toml::Value::as_str);
    if rec_protocol != Some(expect.protocol) {
        return Err(format!("runs.config has protocol {rec_protocol:?}, expected {:?}", expect.protocol));
    }
    // The remote protocol runs on the remote backend, whose servers `koala run` started (it
    // records their addresses in the run's config).
    let state = recorded.get("state").and_then(toml::Value::as_table);
    let backend = state.and_then(|s| s.get("backend")).and_then(toml::Value::as_str).unwrap_or("fjall");
    let servers =
        state.and_then(|s| s.get("server_addresses")).and_then(toml::Value::as_array).map_or(0, Vec::len);
    if (expect.protocol == "remote") != (backend == "remote") {
        return Err(format!(
            "runs.config has state.backend {backend:?} under protocol {:?}",
            expect.protocol
        ));
    }
    if backend == "remote" {
        if servers == 0 {
            return Err("runs.config has the remote backend but no state server addresses".into());
        }
        checked.push(format!("remote backend on {servers} state server(s)"));
    }
    let rec_extra = recorded.get("extra_keys").and_then(toml::Value::as_integer);
    if rec_extra != Some(expect.extra_keys as i64) {
        return Err(format!("runs.config has extra_keys {rec_extra:?}, the case set {}", expect.extra_keys));
    }
    let drain = drain_of(expect.config_text);
    let rec_drain = recorded.get("drain_keys_per_sec").and_then(toml::Value::as_integer).unwrap_or(0);
    if rec_drain != drain as i64 {
        return Err(format!("runs.config has drain_keys_per_sec {rec_drain}, the case set {drain}"));
    }
    let (model, applied) = apply_schedule(expect.config_text)
        .map_err(|e| format!("the schedule has a request the coordinator rejects: {e}"))?;
    let n = applied.len();
    if rec.reconfigurations.len() != n || rec.completed() != n {
        return Err(format!(
            "{} reconfigurations started and {} completed, the schedule has {n}: {:?}",
            rec.reconfigurations.len(),
            rec.completed(),
            rec.reconfigurations
        ));
    }
    for (i, (row, a)) in rec.reconfigurations.iter().zip(&applied).enumerate() {
        if row.protocol != label {
            return Err(format!("reconfiguration {} ran under {:?}", row.epoch, row.protocol));
        }
        if row.epoch != i as u64 + 1 || row.operator != a.operator || row.kind != a.kind {
            return Err(format!(
                "reconfiguration {i} is epoch {} {} {}, the schedule implies epoch {} {} {}",
                row.epoch,
                row.kind,
                row.operator,
                i + 1,
                a.kind,
                a.operator
            ));
        }
        if row.buckets_moved != a.moved.len() as u64 {
            return Err(format!(
                "epoch {} ({} {}) moved {} buckets, the schedule implies {}",
                row.epoch,
                a.kind,
                a.operator,
                row.buckets_moved,
                a.moved.len()
            ));
        }
    }
    let input_end = rec.started_ms + expect.input_ms;
    let nb = model.num_buckets;
    let keys_in = |op: &str, buckets: &BTreeSet<u16>| {
        (expect.keys)(op).iter().filter(|k| buckets.contains(&koala_types::bucket_of(k, nb))).count()
    };
    // Every created task that owned enough keys for long enough while the input ran processed
    // records.
    for (j, a) in applied.iter().enumerate() {
        let on = rec.reconfigurations[j].completed_ms.unwrap_or(u64::MAX);
        for c in &a.created {
            let cancel = applied
                .iter()
                .enumerate()
                .skip(j + 1)
                .find(|(_, b)| b.operator == a.operator && b.cancelled.contains(c));
            let off = cancel.map_or(input_end, |(k, _)| rec.reconfigurations[k].started_ms.min(input_end));
            let last = cancel.map_or(applied.len(), |(k, _)| k);
            let stateful = model.is_stateful(&a.operator);
            let min_keys = applied[j..last]
                .iter()
                .filter(|b| b.operator == a.operator)
                .map(|b| {
                    let owned: BTreeSet<u16> = b
                        .routing
                        .iter()
                        .enumerate()
                        .filter(|(_, t)| *t == c)
                        .map(|(i, _)| i as u16)
                        .collect();
                    keys_in(&a.operator, &owned)
                })
                .min()
                .unwrap_or(0);
            if off < on.saturating_add(MIN_LIFE_MS) || (stateful && min_keys < MIN_KEYS_FOR_RECORDS) {
                continue;
            }
            let task = format!("{}.{c}", a.operator);
            checked.push(format!("{task} processed records"));
            if rec.task_sum(&task, metric::RECORDS_IN) <= 0.0 {
                return Err(format!(
                    "task {task}, created by epoch {} ({}), processed no records although it lived {} ms with {} keys",
                    j + 1,
                    a.kind,
                    off - on,
                    min_keys
                ));
            }
        }
    }
    // State moved: per reconfiguration under stop-and-restart (bytes_moved), over the run under
    // Koala (state_bytes_on_demand and _background samples; state moves lazily, after completion).
    let mut koala_must_move = None;
    let mut drrs_must_move = None;
    for (j, a) in applied.iter().enumerate() {
        if !model.is_stateful(&a.operator) {
            continue;
        }
        let row = &rec.reconfigurations[j];
        let moved: BTreeSet<u16> = a.moved.iter().copied().collect();
        let keys = keys_in(&a.operator, &moved);
        if keys < (expect.min_state_keys)(&a.operator) || row.started_ms + MIN_LIFE_MS > input_end {
            continue;
        }
        if expect.protocol == "stop-and-restart" {
            checked.push(format!("epoch {} moved state", row.epoch));
        }
        if expect.protocol == "stop-and-restart" && row.bytes_moved == 0 {
            return Err(format!(
                "epoch {} ({} {}) moved {} buckets holding {keys} keys but 0 state bytes",
                row.epoch,
                a.kind,
                a.operator,
                a.moved.len()
            ));
        }
        if expect.protocol == "koala" && (expect.permanent_state)(&a.operator) {
            koala_must_move.get_or_insert(row.epoch);
        }
        if expect.protocol == "drrs" {
            drrs_must_move.get_or_insert(row.epoch);
        }
    }
    // DRRS pushes whole buckets in the background: a reconfiguration that moved buckets holding
    // keys made their senders report the state they pushed.
    if let Some(epoch) = drrs_must_move {
        if rec.total(metric::STATE_BYTES_BACKGROUND) <= 0.0 {
            return Err(format!(
                "epoch {epoch} moved buckets holding keys under DRRS, but no task reported {}",
                metric::STATE_BYTES_BACKGROUND
            ));
        }
        checked.push("state pushed".into());
    }
    if koala_must_move.is_some() {
        checked.push("state moved lazily".into());
    }
    // Remote: ownership moves, state does not go from task to task (the protocol's defining
    // property); what an old owner buffered is written back to the servers (eager, and in the
    // reconfiguration's row), nothing more.
    if expect.protocol == "remote" {
        let moved = rec.total(metric::STATE_BYTES_ON_DEMAND) + rec.total(metric::STATE_BYTES_BACKGROUND);
        if moved != 0.0 {
            return Err(format!("tasks under remote reported {moved} state bytes sent to other tasks"));
        }
        let written_back: u64 = rec.reconfigurations.iter().map(|r| r.bytes_moved).sum();
        if written_back as f64 != rec.total(metric::STATE_BYTES_EAGER) {
            return Err(format!(
                "remote: the reconfigurations recorded {written_back} bytes written back, the tasks' {} add up to {}",
                metric::STATE_BYTES_EAGER,
                rec.total(metric::STATE_BYTES_EAGER)
            ));
        }
        checked.push("no state moved between tasks".into());
    }
    // On demand (a batch needed the key) or in the background (progressive migration, which
    // may drain a cancelled task before any record of its keys arrives).
    if let Some(epoch) = koala_must_move
        && rec.total(metric::STATE_BYTES_ON_DEMAND) + rec.total(metric::STATE_BYTES_BACKGROUND) <= 0.0
    {
        return Err(format!(
            "epoch {epoch} moved buckets with keys whose state never expires, but no task reported {} or {}",
            metric::STATE_BYTES_ON_DEMAND,
            metric::STATE_BYTES_BACKGROUND
        ));
    }
    // Koala's background state is keys pulled: the drain rate's metric counts them (DRRS's
    // background state is whole buckets pushed, not counted in keys).
    if expect.protocol == "koala"
        && rec.total(metric::STATE_BYTES_BACKGROUND) > 0.0
        && rec.total(metric::STATE_KEYS_SENT) <= 0.0
    {
        return Err(format!(
            "tasks reported {} bytes of {} but no {}",
            rec.total(metric::STATE_BYTES_BACKGROUND),
            metric::STATE_BYTES_BACKGROUND,
            metric::STATE_KEYS_SENT
        ));
    }
    // The background drain moves state of live old owners without any record asking for it.
    if let Some(epoch) = koala_must_move
        && drain > 0
    {
        if rec.total(metric::STATE_BYTES_BACKGROUND) <= 0.0 {
            return Err(format!(
                "epoch {epoch} moved buckets of permanent state with drain_keys_per_sec = {drain}, but no task reported {}",
                metric::STATE_BYTES_BACKGROUND
            ));
        }
        checked.push("state drained in the background".into());
    }
    // Stop-and-restart pauses the upstreams of a keyed operator it reconfigures; input waits at
    // them if the pause is long enough for some to arrive.
    let must_pause = expect.protocol == "stop-and-restart"
        && rec.reconfigurations.iter().zip(&applied).any(|(r, a)| {
            model.is_stateful(&a.operator)
                && r.started_ms + MIN_LIFE_MS <= input_end
                && r.pause_ms.is_some_and(|ms| ms >= MIN_PAUSE_HOLDING_INPUT_MS)
        });
    check_queues_and_pauses(&rec, expect, must_pause, model.has_stateful(), &mut checked)?;
    rec.checked = checked;
    Ok(rec)
}

/// `queued_records` and `input_paused_ms` mean the same for every protocol (docs/architecture.md
/// §9): every stateful task reports what it holds, stop-and-restart and remote never hold
/// anything, a pause never exceeds its second (a late tick makes an interval a little longer),
/// and stop-and-restart's upstreams report a pause when one of at least
/// `MIN_PAUSE_HOLDING_INPUT_MS` ran while the input did.
fn check_queues_and_pauses(
    rec: &RunRecord,
    expect: &Expect<'_>,
    must_pause: bool,
    stateful_job: bool,
    checked: &mut Vec<String>,
) -> Result<(), String> {
    let holds = matches!(expect.protocol, "koala" | "drrs");
    let mut most = 0.0;
    for name in [metric::QUEUED_RECORDS, metric::QUEUED_RECORDS_MAX] {
        let queued = rec.task_maxes(name);
        // Only stateful tasks report what they hold (a stateless job, e.g. Nexmark Q1, has none).
        if queued.is_empty() && stateful_job {
            return Err(format!("no task reported {name}"));
        }
        if let Some((task, n)) = queued.iter().find(|(_, n)| *n < 0.0 || (!holds && *n > 0.0)) {
            return Err(format!("{task} reported {n} {name} under {}", expect.protocol));
        }
        most = queued.iter().map(|(_, n)| *n).fold(most, f64::max);
    }
    // A Koala task never holds more than `[runtime] max_queued_records` (architecture.md §4).
    if expect.protocol == "koala" {
        let config: toml::Table = toml::from_str(expect.config_text).map_err(|e| format!("config: {e}"))?;
        let bound = config
            .get("runtime")
            .and_then(|r| r.get("max_queued_records"))
            .and_then(toml::Value::as_integer)
            .map_or(koala_protocol::koala::DEFAULT_MAX_QUEUED_RECORDS as f64, |n| n as f64);
        if most > bound {
            return Err(format!("a Koala task held {most} records, past max_queued_records = {bound}"));
        }
    }
    // A DRRS task never holds more than `[drrs] wait_records`, the records its senders forwarded
    // included (docs/protocols.md §11) — or, below one record per sender, one per sender's window
    // (`DrrsTask::hold_bound`; these jobs run at most 8 tasks of an operator).
    if expect.protocol == "drrs" {
        let config: toml::Table = toml::from_str(expect.config_text).map_err(|e| format!("config: {e}"))?;
        let wait_records = config
            .get("drrs")
            .and_then(|r| r.get("wait_records"))
            .and_then(toml::Value::as_integer)
            .map_or(koala_protocol::drrs::DrrsOptions::default().wait_records as f64, |n| n as f64);
        let bound = wait_records.max(8.0);
        if most > bound {
            return Err(format!("a DRRS task held {most} records, past wait_records = {wait_records}"));
        }
    }
    checked.push(format!("at most {most} records queued in a task"));
    let paused = rec.task_maxes(metric::INPUT_PAUSED_MS);
    if let Some((task, ms)) = paused.iter().find(|(_, ms)| !(0.0..=1_500.0).contains(ms)) {
        return Err(format!("{task} reported {ms} {} in one second", metric::INPUT_PAUSED_MS));
    }
    let total = rec.total(metric::INPUT_PAUSED_MS);
    if must_pause && total <= 0.0 {
        return Err(format!(
            "stop-and-restart reconfigured while the input ran, but no upstream reported {}",
            metric::INPUT_PAUSED_MS
        ));
    }
    let required = if must_pause { "a pause required" } else { "no pause long enough to require one" };
    checked.push(format!("input paused {total:.0} ms in all ({required})"));
    Ok(())
}

/// Names of the tasks a schedule creates, for messages.
pub fn created_tasks(applied: &[Applied]) -> Vec<String> {
    applied.iter().flat_map(|a| a.created.iter().map(move |c| format!("{}.{c}", a.operator))).collect()
}
