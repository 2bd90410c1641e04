//! What the coordinator's event loop publishes for its HTTP API while the job runs: the job graph
//! and run (fixed), the deployment and the running reconfiguration (after every change), and, per
//! task, each metric's total over the run and its value in the last second a task reported
//! (`/metrics`). Per-second series and the reconfiguration history are read from the metrics
//! store by the report's code instead (`/api/metrics`, `/api/reconfigurations`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;

use koala_dataflow::JobGraph;
use koala_protocol::{Deployment, TaskSample};
use koala_types::{OperatorId, TaskId};

/// Where the job is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Waiting for workers and their deployment acknowledgements.
    Starting,
    /// Started; metrics are being recorded.
    Running,
    /// Every task finished or the job failed; the API still answers until the coordinator stops.
    Ended,
}

impl Phase {
    /// `starting`, `running` or `ended`.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Starting => "starting",
            Phase::Running => "running",
            Phase::Ended => "ended",
        }
    }
}

/// One operator of the job graph, as the API shows it.
#[derive(Clone, Debug)]
pub struct OperatorInfo {
    /// Its id.
    pub id: OperatorId,
    /// Its name (what rescale, rebalance and migrate take).
    pub name: String,
    /// `source`, `stateful`, `stateless` or `sink`.
    pub kind: &'static str,
    /// Its inputs: (upstream operator's name, partitioning).
    pub inputs: Vec<(String, String)>,
}

/// The fixed facts of a run.
#[derive(Clone, Debug)]
pub struct JobInfo {
    /// The run id.
    pub run: String,
    /// The query.
    pub query: String,
    /// The protocol label (`koala`, `stop-and-restart`, …).
    pub protocol: String,
    /// The coordinator's control address (`koala rescale --coordinator`).
    pub control_addr: String,
    /// The metrics database.
    pub metrics_db: PathBuf,
    /// The graph's operators, in topological order.
    pub operators: Vec<OperatorInfo>,
    /// `checkpoint_interval_ms` of the config (`None`: checkpoints are off).
    pub checkpoint_interval_ms: Option<u64>,
    /// `checkpoints_retained` of the config.
    pub checkpoints_retained: usize,
}

impl JobInfo {
    /// The facts of `graph` run as `run`.
    pub fn new(
        run: &str,
        query: &str,
        protocol: String,
        control_addr: String,
        metrics_db: PathBuf,
        graph: &JobGraph,
    ) -> Self {
        let name = |id: OperatorId| graph.operator(id).map_or("?".to_string(), |o| o.name.clone());
        let operators = graph
            .operators
            .iter()
            .map(|o| OperatorInfo {
                id: o.id,
                name: o.name.clone(),
                kind: match &o.kind {
                    koala_dataflow::OperatorKind::Source { .. } => "source",
                    koala_dataflow::OperatorKind::Sink { .. } => "sink",
                    _ if o.is_stateful() => "stateful",
                    _ => "stateless",
                },
                inputs: o.inputs.iter().map(|i| (name(i.from), partitioning_name(&i.partitioning))).collect(),
            })
            .collect();
        Self {
            run: run.to_string(),
            query: query.to_string(),
            protocol,
            control_addr,
            metrics_db,
            operators,
            checkpoint_interval_ms: None,
            checkpoints_retained: 0,
        }
    }

    /// The name of operator `id`.
    pub fn operator_name(&self, id: OperatorId) -> &str {
        self.operators.iter().find(|o| o.id == id).map_or("?", |o| o.name.as_str())
    }

    /// `operator.index`, as the metrics store names tasks.
    pub fn task_name(&self, task: TaskId) -> String {
        format!("{}.{}", self.operator_name(task.operator), task.index)
    }
}

/// The running reconfiguration, if any.
#[derive(Clone, Debug, PartialEq)]
pub struct Running {
    /// Its epoch.
    pub epoch: u64,
    /// The operator it reconfigures.
    pub operator: String,
}

/// One task's metrics: per metric, the total over the run and the last reported second's value.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TaskMetrics {
    /// The last unix second a sample of this task came for.
    pub last_s: u64,
    /// Σ over the run, per metric (counters: records, bytes, milliseconds).
    pub total: BTreeMap<String, f64>,
    /// The value of the last second, per metric (gauges: latencies, queue sizes).
    pub last: BTreeMap<String, f64>,
}

/// What changes while the job runs.
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// Where the job is.
    pub phase: Phase,
    /// The run's start, unix ms (once running).
    pub started_ms: Option<u64>,
    /// The current deployment (once deployed).
    pub deployment: Option<Deployment>,
    /// The running reconfiguration.
    pub running: Option<Running>,
    /// Requests waiting behind it.
    pub queued: usize,
    /// Reconfigurations completed.
    pub completed: u64,
    /// Per task (`operator.index`).
    pub tasks: BTreeMap<String, TaskMetrics>,
}

/// The job as the HTTP API sees it: fixed facts and a snapshot the event loop keeps current.
#[derive(Debug)]
pub struct Live {
    /// Fixed facts.
    pub info: JobInfo,
    now: Mutex<Snapshot>,
}

impl Live {
    /// A job about to start.
    pub fn new(info: JobInfo) -> Self {
        let now = Snapshot {
            phase: Phase::Starting,
            started_ms: None,
            deployment: None,
            running: None,
            queued: 0,
            completed: 0,
            tasks: BTreeMap::new(),
        };
        Self { info, now: Mutex::new(now) }
    }

    /// A copy of the current snapshot.
    pub fn snapshot(&self) -> Snapshot {
        self.now.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Changes the snapshot.
    pub fn update(&self, change: impl FnOnce(&mut Snapshot)) {
        change(&mut self.now.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
    }

    /// Folds a batch of task samples into the per-task totals and last values. Non-finite values
    /// are skipped, as the metrics store's aggregates skip them.
    pub fn add_samples(&self, samples: &[TaskSample]) {
        let named: Vec<(String, &TaskSample)> =
            samples.iter().map(|s| (self.info.task_name(s.task), s)).collect();
        self.update(|now| {
            for (task, s) in named {
                if !s.value.is_finite() {
                    continue;
                }
                let m = now.tasks.entry(task).or_default();
                *m.total.entry(s.metric.clone()).or_insert(0.0) += s.value;
                if s.time_s >= m.last_s {
                    if s.time_s > m.last_s {
                        m.last.clear();
                    }
                    m.last_s = s.time_s;
                    m.last.insert(s.metric.clone(), s.value);
                }
            }
        });
    }
}

/// How an input reaches an operator's tasks, as the API names it.
fn partitioning_name(p: &koala_dataflow::Partitioning) -> String {
    match p {
        koala_dataflow::Partitioning::Forward => "forward",
        koala_dataflow::Partitioning::Rebalance => "round-robin",
        koala_dataflow::Partitioning::Key(_) => "by key",
    }
    .to_string()
}
