//! The job config (`koala run <config.toml>`): which query, how many tasks of each operator,
//! buckets, batching, where output and metrics go. Every error names the field and the fix.

mod autoscale;
mod coordinator;
mod located;
mod state;

use std::collections::BTreeMap;
use std::path::PathBuf;

use koala_dataflow::{JobGraph, OperatorKind, Partitioning};
use serde::{Deserialize, Serialize};

pub use autoscale::AutoscaleSection;
pub use coordinator::CoordinatorSection;
pub(crate) use located::invalid;
pub use located::{ConfigError, ConfigSource, plain_words};
pub use state::{MAX_WORKER_MEMORY_MB, MIN_WORKER_MEMORY_MB, StateSection};

/// A job, as written in a TOML config.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobConfig {
    /// Registered query name (`koala run --help` lists them).
    pub query: String,
    /// The query's parameters (generator, windows, sink …); checked by the query itself.
    #[serde(default)]
    pub params: toml::Table,
    /// Worker processes `koala run` starts (and the coordinator waits for).
    #[serde(default = "defaults::workers")]
    pub workers: u32,
    /// Tasks per operator, by operator name; operators not listed get `default_parallelism`.
    #[serde(default)]
    pub parallelism: BTreeMap<String, u32>,
    /// Tasks of operators not listed under `parallelism`.
    #[serde(default = "defaults::one")]
    pub default_parallelism: u32,
    /// Key-space partitions of every stateful operator (fixed for the life of the job).
    #[serde(default = "defaults::num_buckets")]
    pub num_buckets: u16,
    /// How buckets are assigned to tasks.
    #[serde(default)]
    pub partition_policy: PolicyName,
    /// Stop unbounded sources after this many seconds (bounded sources end by themselves).
    #[serde(default)]
    pub duration_s: Option<u64>,
    /// Where sink files, worker state and the metrics database go.
    #[serde(default = "defaults::output_dir")]
    pub output_dir: PathBuf,
    /// The metrics database; defaults to `<output_dir>/metrics.db`.
    #[serde(default)]
    pub metrics_db: Option<PathBuf>,
    /// Batching and queue sizes.
    #[serde(default)]
    pub runtime: RuntimeSection,
    /// Where keyed state lives: `[state] backend` and `cache_mb`.
    #[serde(default)]
    pub state: StateSection,
    /// The reconfiguration protocol: `koala` (lazy, the default), `stop-and-restart`, `remote`
    /// (stop-and-restart over state servers; needs `[state] backend = "remote"`) or `drrs` (live
    /// migration; needs `partition_policy = "uniform"`).
    #[serde(default)]
    pub protocol: koala_protocol::Protocol,
    /// `[drrs]`: `schedule` (`ported`, the default: the Koala authors' port, every subscale a
    /// slice of every sender→receiver pair, run one after another; `overlapping`, the original
    /// DRRS: single-pair subscales, about two per pair, several running at once, at most two per task),
    /// `subscales` (ported only: 0, the default, = as many as there are pairs) and `wait_records` (direct
    /// records a receiver lets wait for state before it stops taking direct input, until half of
    /// them wait; default 2048). Only read under `protocol = "drrs"`.
    #[serde(default)]
    pub drrs: koala_protocol::drrs::DrrsOptions,
    /// Koala's progressive migration: extra keys each fetch from a cancelled task carries, and
    /// the batch size of the background pull when idle (0 = fetch on demand only).
    #[serde(default = "defaults::extra_keys")]
    pub extra_keys: usize,
    /// Koala: drain old locations that progressive migration does not pull from — live old owners
    /// after a scale-out or rebalance — in the background, at most this many keys per second per
    /// location, while no batch waits for state, so their buckets converge to one place and their
    /// filters are freed. 0 (the default) = off: their keys move only when a record needs them.
    #[serde(default)]
    pub drain_keys_per_sec: u64,
    /// Reconfigurations to run while the job runs, in order.
    #[serde(default)]
    pub reconfigurations: Vec<ScheduledReconfiguration>,
    /// Warm state written by `koala warmup`: a directory with a snapshot per stateful operator
    /// (`<dir>/<operator name>`); `koala run` has every worker load its tasks' buckets from it
    /// before the job starts.
    #[serde(default)]
    pub warm_state: Option<PathBuf>,
    /// The coordinator's own settings (`[coordinator]`: the HTTP port).
    #[serde(default)]
    pub coordinator: CoordinatorSection,
    /// TLS for every listener and connection of the job (`[tls]`: `cert`, `key`, `ca`, PEM
    /// paths; off when absent; docs/deploy.md §Security): `koala run` and `koala coordinator`
    /// load it, `koala run` hands the same files to the workers and state servers it starts.
    #[serde(default)]
    pub tls: Option<koala_types::tls::TlsFiles>,
    /// Aligned checkpoints every this many milliseconds (off when unset; docs/architecture.md
    /// §10): with them a lost worker restarts the job from the last completed checkpoint instead
    /// of failing it, and JSON-lines sinks write exactly once. Checkpoints go to
    /// `<output_dir>/checkpoints/<id>/`.
    #[serde(default)]
    pub checkpoint_interval_ms: Option<u64>,
    /// Completed checkpoints kept on disk (older ones are deleted).
    #[serde(default = "defaults::checkpoints_retained")]
    pub checkpoints_retained: usize,
    /// `[autoscale]`: the reconfiguration policy (off by default; `crate::autoscale`).
    #[serde(default)]
    pub autoscale: AutoscaleSection,
}

/// One entry of the reconfiguration schedule. Give exactly one of: `parallelism` (rescale),
/// `moves` (rebalance), or `task` + `worker` (migrate).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduledReconfiguration {
    /// Seconds after the job starts.
    pub at_s: f64,
    /// Operator name.
    pub operator: String,
    /// Rescale to this many tasks.
    #[serde(default)]
    pub parallelism: Option<u32>,
    /// Rebalance: buckets and their new owner task index.
    #[serde(default)]
    pub moves: Option<Vec<BucketMoveSpec>>,
    /// Migrate this task index ...
    #[serde(default)]
    pub task: Option<u32>,
    /// ... to this worker.
    #[serde(default)]
    pub worker: Option<u32>,
}

/// Buckets that go to one task.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BucketMoveSpec {
    /// The buckets.
    pub buckets: Vec<u16>,
    /// The new owner's task index.
    pub to: u32,
}

impl ScheduledReconfiguration {
    /// The request this entry describes; `field` names the entry in errors.
    pub fn request(&self, field: &str) -> Result<koala_protocol::ReconfigRequest, ConfigError> {
        use koala_protocol::ReconfigRequest as R;
        let operator = self.operator.clone();
        match (self.parallelism, &self.moves, self.task, self.worker) {
            (Some(parallelism), None, None, None) => Ok(R::Rescale { operator, parallelism }),
            (None, Some(moves), None, None) => Ok(R::Rebalance {
                operator,
                moves: moves.iter().map(|m| (m.buckets.clone(), m.to)).collect(),
            }),
            (None, None, Some(task), Some(worker)) => Ok(R::Migrate { operator, task, worker }),
            _ => Err(invalid(
                field,
                "give exactly one of `parallelism` (rescale), `moves` (rebalance) or `task` and `worker` (migrate)",
            )),
        }
    }
}

/// Batching and queue sizes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RuntimeSection {
    /// Records per batch before it is sent.
    pub batch_records: usize,
    /// Milliseconds a partial batch may wait before it is sent.
    pub linger_ms: u64,
    /// Messages a task's data queue, and its peer lane, hold before senders wait (backpressure;
    /// docs/architecture.md §4).
    pub channel_capacity: usize,
    /// Seconds without a heartbeat (sent every second) after which a worker counts as lost and
    /// the job fails: a stopped or hung worker ends the job instead of stalling it.
    pub heartbeat_timeout_s: f64,
    /// Seconds a running reconfiguration may go without any task acknowledging a step before the
    /// job fails, naming the tasks it waits for. Generous, so a multi-GB stop-and-restart transfer
    /// (one step) is not cut off; raise it for larger state.
    pub reconfiguration_timeout_s: f64,
    /// Seconds a job whose sources have all finished may go without getting closer to its end —
    /// no task finishing, reporting its inputs ended or being released, no reconfiguration
    /// completing — before it fails, naming every unfinished task and what it still waits for
    /// (`crate::ending`). A job whose input ended drains in seconds; this catches one that
    /// never would.
    pub end_timeout_s: f64,
    /// Emulated processing capacity: records per second each task of a stateful operator may
    /// process, enforced per batch by a token bucket that sleeps (docs/architecture.md §4).
    /// Unset = as fast as the CPU allows. Keep the total (tasks × this) at or below half of what
    /// the machine really sustains (`koala bench`), or tasks cannot reach it.
    pub task_records_per_sec: Option<f64>,
    /// Emulated network: megabytes (10^6 bytes) per second each worker receives peer traffic from
    /// other workers at — Koala fetches, pulls and hand-overs, stop-and-restart state. Unset =
    /// unlimited (loopback speed).
    pub link_mb_per_sec: Option<f64>,
    /// Koala: records a task may hold — queued behind a batch waiting for state, parked until a
    /// sender's peer channel closes — before it stops taking data input, so a backlog waits
    /// upstream (backpressure, source lag) instead of in memory (docs/architecture.md §4). The
    /// default (4 batches of the core's largest size) never needs changing.
    pub max_queued_records: usize,
    /// MiB of memory each worker gives its stateful tasks: split evenly among the stateful tasks
    /// it hosts (re-split when a reconfiguration adds or removes some), each share paying the
    /// task's input queues and store first, the rest its state cache (docs/architecture.md §5,
    /// "Memory budget"). Unset = 40 % of the machine's physical memory over the job's workers on
    /// that machine (Flink's managed memory fraction). `[state] cache_mb` overrides the cache.
    pub worker_memory_mb: Option<u64>,
}

impl RuntimeSection {
    /// The capacity emulation workers apply.
    pub fn capacity(&self) -> koala_protocol::EmulatedCapacity {
        koala_protocol::EmulatedCapacity {
            task_records_per_sec: self.task_records_per_sec,
            link_mb_per_sec: self.link_mb_per_sec,
        }
    }

    /// Both capacity settings as one line for reports and summaries.
    pub fn capacity_line(&self) -> String {
        let or_unlimited = |v: Option<f64>| v.map_or_else(|| "unlimited".to_string(), |v| format!("{v}"));
        format!(
            "task_records_per_sec = {}, link_mb_per_sec = {}",
            or_unlimited(self.task_records_per_sec),
            or_unlimited(self.link_mb_per_sec)
        )
    }
}

impl Default for RuntimeSection {
    fn default() -> Self {
        Self {
            batch_records: 256,
            linger_ms: 5,
            channel_capacity: 64,
            heartbeat_timeout_s: 10.0,
            reconfiguration_timeout_s: 120.0,
            end_timeout_s: 60.0,
            task_records_per_sec: None,
            link_mb_per_sec: None,
            max_queued_records: koala_protocol::koala::DEFAULT_MAX_QUEUED_RECORDS,
            worker_memory_mb: None,
        }
    }
}

/// Partition policy names as written in configs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyName {
    /// Rendezvous hashing: scale-out moves the fewest buckets, only from old to new tasks.
    #[default]
    Consistent,
    /// Contiguous, even bucket ranges (Flink key groups).
    Uniform,
    /// Bucket `b` → the `(b mod n)`-th task: even shares (±1 bucket), and scaling `n → k·n`
    /// tasks moves buckets only to the new tasks (`k·n → n`: only from the removed ones).
    Interleaved,
}

mod defaults {
    use std::path::PathBuf;

    pub fn workers() -> u32 {
        2
    }
    pub fn one() -> u32 {
        1
    }
    pub fn extra_keys() -> usize {
        8
    }
    pub fn num_buckets() -> u16 {
        koala_types::DEFAULT_NUM_BUCKETS
    }
    pub fn checkpoints_retained() -> usize {
        3
    }
    pub fn output_dir() -> PathBuf {
        PathBuf::from("koala-out")
    }
}

impl JobConfig {
    /// Parses a config from TOML text; `origin` names the file in errors, which give the line
    /// and column of the field at fault.
    pub fn parse(text: &str, origin: &str) -> Result<Self, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigSource::new(origin, text).parse_error(&e))
    }

    /// The query parameters as TOML text (what workers rebuild the graph from).
    pub fn params_text(&self) -> String {
        toml::to_string(&self.params).unwrap_or_default()
    }

    /// The protocol as runs and reconfigurations record it: its name, and `drrs-overlapping` for
    /// DRRS under the original DRRS's schedule, so two DRRS runs compared side by side are told
    /// apart (`koala compare --protocols drrs,drrs-overlapping`).
    pub fn protocol_label(&self) -> String {
        match (self.protocol, self.drrs.schedule) {
            (koala_protocol::Protocol::Drrs, koala_protocol::drrs::DrrsSchedule::Overlapping) => {
                "drrs-overlapping".into()
            }
            (p, _) => p.name().into(),
        }
    }

    /// Where checkpoints go, if they are on.
    pub fn checkpoint_dir(&self) -> Option<PathBuf> {
        self.checkpoint_interval_ms.map(|_| self.output_dir.join("checkpoints"))
    }

    /// The metrics database path.
    pub fn metrics_path(&self) -> PathBuf {
        self.metrics_db.clone().unwrap_or_else(|| self.output_dir.join("metrics.db"))
    }

    /// What workers are told about state: the `[state]` section and the worker memory budget.
    pub fn state_options(&self) -> koala_protocol::StateOptions {
        koala_protocol::StateOptions {
            worker_memory_bytes: self.runtime.worker_memory_mb.map(|mb| mb.saturating_mul(1 << 20)),
            ..self.state.options()
        }
    }

    /// Checks the config against the query's graph; returns tasks per operator (by position).
    pub fn validate(&self, graph: &JobGraph) -> Result<Vec<u32>, ConfigError> {
        if self.workers == 0 {
            return Err(invalid("workers", "0 workers cannot run a job; use 1 or more"));
        }
        if self.checkpoint_interval_ms == Some(0) {
            return Err(invalid(
                "checkpoint_interval_ms",
                "0 ms between checkpoints cannot run; give a positive interval (e.g. 1000) or remove the line to turn checkpoints off",
            ));
        }
        if self.checkpoint_interval_ms.is_some() && self.checkpoints_retained == 0 {
            return Err(invalid(
                "checkpoints_retained",
                "recovery needs the last completed checkpoint; keep at least 1 (the default is 3)",
            ));
        }
        if self.protocol == koala_protocol::Protocol::Drrs && self.partition_policy != PolicyName::Uniform {
            return Err(invalid(
                "partition_policy",
                "protocol = \"drrs\" runs with the uniform partition policy, as the paper's DRRS does \
                 (contiguous even bucket ranges); add partition_policy = \"uniform\"",
            ));
        }
        if self.drrs.schedule == koala_protocol::drrs::DrrsSchedule::Overlapping && self.drrs.subscales != 0 {
            return Err(invalid(
                "drrs.subscales",
                "schedule = \"overlapping\" (the original DRRS) runs one subscale per \
                 slice of a sender→receiver pair, about two per pair; remove subscales, or use schedule = \"ported\" to choose \
                 how many subscales each slice every pair",
            ));
        }
        if self.drrs.subscales > koala_protocol::drrs::MAX_SUBSCALES {
            return Err(invalid(
                "drrs.subscales",
                format!(
                    "at most {}; 0 (the default) runs as many as there are sender→receiver pairs",
                    koala_protocol::drrs::MAX_SUBSCALES
                ),
            ));
        }
        if self.num_buckets == 0 {
            return Err(invalid("num_buckets", "must be at least 1 (the default is 128)"));
        }
        if self.default_parallelism == 0 {
            return Err(invalid("default_parallelism", "0 tasks cannot run an operator; use 1 or more"));
        }
        for (field, v, default) in [
            ("runtime.batch_records", self.runtime.batch_records, RuntimeSection::default().batch_records),
            (
                "runtime.channel_capacity",
                self.runtime.channel_capacity,
                RuntimeSection::default().channel_capacity,
            ),
        ] {
            if v == 0 {
                return Err(invalid(field, format!("must be at least 1 (the default is {default})")));
            }
        }
        if self.runtime.max_queued_records == 0 {
            return Err(invalid(
                "runtime.max_queued_records",
                format!(
                    "must be at least 1 (the default, {}, never needs changing)",
                    koala_protocol::koala::DEFAULT_MAX_QUEUED_RECORDS
                ),
            ));
        }
        for (name, v, min) in [
            ("runtime.heartbeat_timeout_s", self.runtime.heartbeat_timeout_s, 1.0),
            ("runtime.reconfiguration_timeout_s", self.runtime.reconfiguration_timeout_s, 1.0),
            ("runtime.end_timeout_s", self.runtime.end_timeout_s, 1.0),
        ] {
            if !(v.is_finite() && v >= min) {
                return Err(invalid(
                    name,
                    format!("{v} is not a number of seconds ≥ {min}; the default is fine"),
                ));
            }
        }
        let discards = self.params.get("sink").and_then(toml::Value::as_str) == Some("discard");
        if self.state.backend == koala_protocol::StateBackendKind::None && !discards {
            return Err(invalid(
                "state.backend",
                "\"none\" keeps no state, so every stateful operator's output is wrong; it is the \
                 ceiling of `koala bench`, whose output is discarded ([params] sink = \"discard\"). \
                 Use \"fjall\" (the default) or \"memory\"",
            ));
        }
        self.state.validate(self.protocol)?;
        self.autoscale.validate(graph, self.num_buckets)?;
        if let Some(mb) = self.runtime.worker_memory_mb
            && !(MIN_WORKER_MEMORY_MB..=MAX_WORKER_MEMORY_MB).contains(&mb)
        {
            return Err(invalid(
                "runtime.worker_memory_mb",
                format!(
                    "{mb} MiB is outside {MIN_WORKER_MEMORY_MB}..={MAX_WORKER_MEMORY_MB}; give a worker's budget in MiB \
                     (e.g. worker_memory_mb = 4096), or remove the line for 40 % of the machine's memory over its workers"
                ),
            ));
        }
        if self.state.cache_mb.is_some_and(|mb| mb > 1 << 20) {
            return Err(invalid("state.cache_mb", "more than 1 TiB per task; give MiB, e.g. cache_mb = 64"));
        }
        for (name, v, example) in [
            ("runtime.task_records_per_sec", self.runtime.task_records_per_sec, "20000"),
            ("runtime.link_mb_per_sec", self.runtime.link_mb_per_sec, "100"),
        ] {
            if let Some(v) = v
                && !(v.is_finite() && v > 0.0)
            {
                return Err(invalid(
                    name,
                    format!(
                        "{v} is not a positive rate; give one (e.g. {name} = {example}) or remove the line for no limit"
                    ),
                ));
            }
        }
        if let Some(v) = self.runtime.task_records_per_sec
            && v < 1.0
        {
            return Err(invalid(
                "runtime.task_records_per_sec",
                format!("{v} is below one record per second; use 1 or more, or remove the line for no limit"),
            ));
        }
        if let Some(dir) = &self.warm_state {
            let stateful: Vec<&str> =
                graph.operators.iter().filter(|o| o.is_stateful()).map(|o| o.name.as_str()).collect();
            if !stateful.iter().any(|op| dir.join(op).join("manifest").exists()) {
                return Err(invalid(
                    "warm_state",
                    format!(
                        "{} holds no snapshot of a stateful operator of query {:?} (expected {}/<{}>/manifest); write one with `koala warmup`",
                        dir.display(),
                        self.query,
                        dir.display(),
                        stateful.join("|")
                    ),
                ));
            }
        }
        let names: Vec<&str> = graph.operators.iter().map(|o| o.name.as_str()).collect();
        for (name, p) in &self.parallelism {
            let field = format!("parallelism.{name}");
            if graph.by_name(name).is_none() {
                return Err(invalid(
                    field,
                    format!(
                        "query {:?} has no operator {name:?}; its operators are {}",
                        self.query,
                        names.join(", ")
                    ),
                ));
            }
            if *p == 0 {
                return Err(invalid(field, "0 tasks cannot run an operator; use 1 or more"));
            }
        }
        for (i, r) in self.reconfigurations.iter().enumerate() {
            let field = format!("reconfigurations[{i}]");
            r.request(&field)?;
            if !(r.at_s >= 0.0 && r.at_s.is_finite()) {
                return Err(invalid(format!("{field}.at_s"), "must be a number of seconds, 0 or more"));
            }
            if graph.by_name(&r.operator).is_none() {
                return Err(invalid(
                    format!("{field}.operator"),
                    format!("no operator {:?}; the operators are {}", r.operator, names.join(", ")),
                ));
            }
        }
        let mut out = Vec::with_capacity(graph.operators.len());
        for op in &graph.operators {
            let p = self.parallelism.get(&op.name).copied().unwrap_or(self.default_parallelism);
            if op.is_stateful() && p > u32::from(self.num_buckets) {
                return Err(invalid(
                    format!("parallelism.{}", op.name),
                    format!(
                        "{p} tasks exceed num_buckets = {}: a task would own no bucket; lower the parallelism or raise num_buckets",
                        self.num_buckets
                    ),
                ));
            }
            if let OperatorKind::Transform { stateful: true, .. } = op.kind
                && op.inputs.iter().any(|i| !matches!(i.partitioning, Partitioning::Key(_)))
            {
                return Err(invalid(
                    format!("query {}", self.query),
                    format!(
                        "stateful operator {:?} has an input that is not key-partitioned (a query bug)",
                        op.name
                    ),
                ));
            }
            out.push(p);
        }
        Ok(out)
    }
}
