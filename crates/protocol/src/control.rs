//! Typed control messages between the coordinator and workers. Acks are enum variants, never
//! strings (the Go artifact's string ACKs are a known weak point, DESIGN.md §11).

use std::collections::BTreeMap;

use koala_types::{OperatorId, TaskId, WorkerId};
use serde::{Deserialize, Serialize};

/// Runtime knobs every worker applies to every task of a job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RuntimeOptions {
    /// A batch is flushed once it holds this many records.
    pub batch_records: usize,
    /// ... or once its oldest record has waited this long.
    pub linger_ms: u64,
    /// Capacity of a task's input queue, in messages (batches, watermarks, markers).
    pub channel_capacity: usize,
    /// Directory JSON-lines sinks write into.
    pub sink_dir: String,
}

/// Everything a worker needs to instantiate its part of a job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Deployment {
    /// Run id (metrics, sink file names).
    pub run: String,
    /// Registered query name; every worker builds the same graph from it.
    pub query: String,
    /// The query's parameters as TOML text.
    pub query_params: String,
    /// Data-plane address of every worker.
    pub workers: BTreeMap<WorkerId, String>,
    /// Where every task of the job runs.
    pub placement: BTreeMap<TaskId, WorkerId>,
    /// Tasks per operator.
    pub parallelism: BTreeMap<OperatorId, u32>,
    /// For each stateful operator, its assignment: bucket → task index.
    pub routing: BTreeMap<OperatorId, Vec<u32>>,
    /// Buckets per stateful operator.
    pub num_buckets: u16,
    /// Batching and queue sizes.
    pub options: RuntimeOptions,
}

/// Coordinator → worker.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum CoordinatorMessage {
    /// Registration accepted; this is the worker's id.
    Welcome {
        /// The id the coordinator assigned.
        worker: WorkerId,
    },
    /// Create the input queues of the worker's tasks for this job; answer `Deployed`.
    Deploy(Box<Deployment>),
    /// Start the tasks (every worker has answered `Deployed`, so every queue exists).
    Start,
    /// End unbounded sources now, as if exhausted (the job then drains and finishes).
    StopSources,
    /// Exit.
    Shutdown,
}

/// One per-second metric sample of a task.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TaskSample {
    /// Unix time, seconds.
    pub time_s: u64,
    /// The task.
    pub task: TaskId,
    /// A name from `koala_types::metric`.
    pub metric: String,
    /// The value.
    pub value: f64,
}

/// Worker → coordinator.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum WorkerMessage {
    /// First message on the control connection.
    Register {
        /// Address the worker's data plane listens on.
        data_addr: String,
        /// OS process id, for logs.
        pid: u32,
    },
    /// All queues of the deployment exist.
    Deployed,
    /// Deployment failed (e.g. the query could not be built); the job cannot start.
    DeployFailed {
        /// What went wrong.
        error: String,
    },
    /// The task processed its end of stream and exited.
    TaskFinished {
        /// The task.
        task: TaskId,
    },
    /// The task stopped on an error.
    TaskFailed {
        /// The task.
        task: TaskId,
        /// What went wrong.
        error: String,
    },
    /// Per-second metric samples.
    Metrics(Vec<TaskSample>),
}
