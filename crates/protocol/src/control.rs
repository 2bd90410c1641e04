//! Typed control messages between the coordinator and workers. Acks are enum variants, never
//! strings (the Go artifact's string ACKs are a known weak point, docs/protocols.md §9).

use std::collections::BTreeMap;

use koala_types::{BucketId, Epoch, OperatorId, TaskId, WorkerId};

use crate::moves::Moves;
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
    /// Emulated capacity (`[runtime] task_records_per_sec`, `link_mb_per_sec`); unlimited by
    /// default.
    #[serde(default)]
    pub capacity: EmulatedCapacity,
    /// Koala: records a task may hold (queued, parked, waiting for state) before it stops taking
    /// data input (`[runtime] max_queued_records`; `KoalaTask::takes_data`).
    #[serde(default = "default_max_queued_records")]
    pub max_queued_records: usize,
    /// Aligned checkpoints (off when `dir` is `None`) and the checkpoint a restarted job restores.
    #[serde(default)]
    pub checkpoint: CheckpointOptions,
}

impl RuntimeOptions {
    /// Bytes a stateful task's input queues and held records may take, charged to its share: its
    /// data queue and peer lane (`channel_capacity` messages each, a batch of up to `batch_records`
    /// records per message) and what a Koala task or a DRRS receiver may hold besides
    /// (`max_queued_records`; DRRS's wait buffer, `[drrs] wait_records`, default 2 048, is below it),
    /// at [`crate::memory::QUEUED_RECORD_BYTES`] per record. The fetch lane is bounded by credit (one request and one
    /// answer per peer) and not counted.
    pub fn queue_bytes_per_task(&self) -> u64 {
        let messages = 2 * self.channel_capacity.max(1) as u64;
        let records = messages * self.batch_records as u64 + self.max_queued_records as u64;
        records * crate::memory::QUEUED_RECORD_BYTES
    }
}

/// Checkpoints as every task sees them (docs/architecture.md §10).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointOptions {
    /// Where checkpoints go: `<dir>/<id>/<task>`; `None` = checkpoints off.
    pub dir: Option<String>,
    /// The checkpoint the tasks start from (a recovery), if any.
    pub restore: Option<RestorePoint>,
}

/// A completed checkpoint a restarted job starts from.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestorePoint {
    /// Its number.
    pub id: koala_types::CheckpointId,
    /// Each source's position in it (what it resumes from: records to skip, partition offsets
    /// to seek to, or finished).
    pub positions: BTreeMap<TaskId, koala_types::SourcePosition>,
    /// Each source's largest event time emitted before the barrier: its watermarks resume there.
    #[serde(default)]
    pub event_times: BTreeMap<TaskId, koala_types::Timestamp>,
    /// Each source's and sink's records emitted or written since the job's start before the
    /// barrier: a restored one counts on from there (`koala_types::metric::RECORDS_TOTAL`).
    #[serde(default)]
    pub records: BTreeMap<TaskId, u64>,
}

fn default_max_queued_records() -> usize {
    crate::koala::task::limits::DEFAULT_MAX_QUEUED_RECORDS
}

/// Capacity emulation for experiments on small machines (docs/architecture.md §4): without it,
/// a scale-out on 2 cores adds no capacity and a transfer over loopback costs nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EmulatedCapacity {
    /// Records per second each task of a stateful operator may process (`None` = as fast as
    /// the CPU allows).
    pub task_records_per_sec: Option<f64>,
    /// Megabytes (10^6 bytes) per second a worker receives peer traffic from other workers at:
    /// Koala fetches, pulls and hand-overs, stop-and-restart state (`None` = unlimited).
    pub link_mb_per_sec: Option<f64>,
}

/// Which store holds the keyed state of a worker's tasks (`[state] backend` in the job config;
/// docs/architecture.md §5).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StateBackendKind {
    /// One fjall LSM database per worker (one keyspace per task), behind a per-task write-back
    /// cache of `cache_bytes`.
    #[default]
    Fjall,
    /// An ordered in-memory map per task: state is bounded by RAM and lost with the process.
    Memory,
    /// Keeps nothing (reads miss, writes are dropped): the stateless ceiling of the same pipeline
    /// for `koala bench`; results are wrong by design.
    None,
    /// State servers shared by every task of an operator (`koala state-server`; keys partitioned
    /// over them by bucket): the Remote baseline's store, used with `protocol = "remote"`.
    Remote,
}

impl StateBackendKind {
    /// The name used in configs and the CLI.
    pub fn name(self) -> &'static str {
        match self {
            Self::Fjall => "fjall",
            Self::Memory => "memory",
            Self::None => "none",
            Self::Remote => "remote",
        }
    }
}

/// How a worker stores keyed state: sent with [`CoordinatorMessage::Deploy`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateOptions {
    /// The store.
    pub backend: StateBackendKind,
    /// Bytes of the write-back cache of each task in front of fjall or the state servers
    /// (0 = no cache), when `[state] cache_mb` gives it; unused with `cache_from_budget`.
    pub cache_bytes: u64,
    /// Size each task's cache from its share of the worker's memory budget
    /// ([`crate::memory`]; no `[state] cache_mb` given, and the backend has a cache).
    #[serde(default)]
    pub cache_from_budget: bool,
    /// `[runtime] worker_memory_mb` in bytes; `None` = derived from the worker's machine
    /// ([`crate::memory::default_worker_budget`]).
    #[serde(default)]
    pub worker_memory_bytes: Option<u64>,
    /// The state servers' addresses (`Remote` only; bucket `b` lives on `servers[b % len]`).
    #[serde(default)]
    pub servers: Vec<String>,
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
    /// Live task indices per operator (indices of removed tasks are not reused).
    pub tasks: BTreeMap<OperatorId, Vec<u32>>,
    /// The reconfiguration that produced this deployment (0 = the initial one).
    pub epoch: Epoch,
    /// For each stateful operator, its assignment: bucket → task index.
    pub routing: BTreeMap<OperatorId, Vec<u32>>,
    /// Buckets per stateful operator.
    pub num_buckets: u16,
    /// Batching and queue sizes.
    pub options: RuntimeOptions,
    /// The reconfiguration protocol stateful tasks run.
    pub protocol: Protocol,
    /// Koala's progressive migration: extra keys piggybacked per fetch from a cancelled task
    /// (0 = fetch on demand only).
    pub extra_keys: usize,
    /// Koala's background drain of old locations that progressive migration does not pull from
    /// (live old owners after a scale-out or rebalance): keys per second per location, 0 = off.
    #[serde(default)]
    pub drain_keys_per_sec: u64,
    /// Tasks that finished (their input ended and they sent end of stream downstream): no later
    /// reconfiguration waits for them, and no new task expects input from them.
    #[serde(default)]
    pub finished: std::collections::BTreeSet<TaskId>,
}

/// A reconfiguration protocol.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Protocol {
    /// Lazy ownership transfer, one-hop fetch on first access, progressive migration (paper §3).
    #[default]
    Koala,
    /// Pause upstreams, drain, move whole buckets, switch, resume.
    StopAndRestart,
    /// The Remote baseline: stop-and-restart over state servers. Ownership moves, state does not:
    /// an old owner flushes what it buffered for its moved buckets to the servers before their
    /// new owners may read (docs/protocols.md §7.1). Requires `[state] backend = "remote"`.
    Remote,
    /// DRRS live migration (docs/protocols.md §11): subscales, in-flight records rerouted over
    /// peer channels, whole buckets pushed in the background, out-of-order processing.
    Drrs,
}

impl Protocol {
    /// The name used in configs, metrics and the CLI.
    pub fn name(self) -> &'static str {
        match self {
            Self::Koala => "koala",
            Self::StopAndRestart => "stop-and-restart",
            Self::Remote => "remote",
            Self::Drrs => "drrs",
        }
    }

    /// Whether the reconfigured operator keeps processing while it runs (Koala, DRRS: their own
    /// coordinator cores take over after Prepare) rather than pausing its upstreams
    /// (stop-and-restart and remote: the phase driver's Drain and Resume).
    pub fn keeps_processing(self) -> bool {
        matches!(self, Self::Koala | Self::Drrs)
    }
}

/// Coordinator → worker.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum CoordinatorMessage {
    /// Registration accepted; this is the worker's id.
    Welcome {
        /// The id the coordinator assigned.
        worker: WorkerId,
    },
    /// Create the input queues of the worker's tasks for this job and open its state stores as
    /// the options say (first `Deploy` only); answer `Deployed`.
    Deploy(Box<Deployment>, StateOptions),
    /// Start the tasks (every worker has answered `Deployed`, so every queue exists).
    Start,
    /// End unbounded sources now, as if exhausted (the job then drains and finishes).
    StopSources,
    /// Reconfiguration, phase 1: create and start the new tasks, tell the target operator's
    /// tasks what moves and its consumers which channels to expect. Tasks answer `Prepared`.
    Prepare(Box<ReconfigPlan>),
    /// Phase 2 (stop-and-restart): the target's upstream tasks send a marker and pause; target
    /// tasks that saw all markers send moved state to its new owners. Answers: `Paused`,
    /// `Drained`, `StateReceived`.
    Drain {
        /// The reconfiguration.
        epoch: Epoch,
    },
    /// Phase 3: upstream tasks switch to the new routing and resume. Answer: `Resumed`.
    Resume {
        /// The reconfiguration.
        epoch: Epoch,
    },
    /// Koala, after every `Prepared` (so every task's queues exist): the tasks the Koala
    /// coordinator core starts (every owner before or after) begin the hand-over. Answers:
    /// `PeerReady`.
    Begin {
        /// The reconfiguration as the core planned it (moves, retired locations, knobs).
        reconfiguration: Box<crate::koala::messages::Reconfiguration>,
        /// The tasks to start.
        tasks: Vec<TaskId>,
    },
    /// Koala, after every `PeerReady`: upstream tasks switch routing, injecting a marker into
    /// every channel to the operator. Answer: `Switched`.
    Switch {
        /// The reconfiguration.
        epoch: Epoch,
    },
    /// Koala: a task that kept serving state (a cancelled task, or any task of an operator whose
    /// input ended) may exit.
    Release {
        /// The task.
        task: TaskId,
    },
    /// An upstream task of the running reconfiguration finished before it switched routing:
    /// the new tasks `tasks` will never hear from it and treat it as ended.
    UpstreamEnded {
        /// The finished upstream task.
        upstream: TaskId,
        /// The reconfiguration's new tasks.
        tasks: Vec<TaskId>,
    },
    /// DRRS: a subscale begins, or the upstreams switch to a subscale's routing table
    /// ([`crate::drrs::DrrsControl`]).
    Drrs(Box<crate::drrs::messages::DrrsControl>),
    /// The live sources inject the barrier of checkpoint `id` (docs/architecture.md §10).
    /// Every live task answers `CheckpointAck` once its snapshot is written.
    Checkpoint {
        /// The checkpoint.
        id: koala_types::CheckpointId,
    },
    /// Checkpoint `id` is complete: sinks commit the output it covers.
    CheckpointCommitted {
        /// The checkpoint.
        id: koala_types::CheckpointId,
    },
    /// Recovery: drop every task and register again as a fresh worker (the process restarts
    /// itself), to be deployed from the last completed checkpoint.
    Restart,
    /// Exit.
    Shutdown,
}

/// One reconfiguration of one operator, as every worker receives it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReconfigPlan {
    /// The reconfiguration number.
    pub epoch: Epoch,
    /// The operator being reconfigured.
    pub operator: OperatorId,
    /// The deployment after the reconfiguration.
    pub deployment: Deployment,
    /// The partition policy's `moves`: every protocol consumes this same value.
    pub moves: Moves,
    /// The live tasks feeding the operator: they switch routing (and, under stop-and-restart,
    /// pause and resume).
    pub upstreams: Vec<TaskId>,
    /// Task indices of the operator that are created.
    pub created: Vec<u32>,
    /// Task indices of the operator that are cancelled once their state has moved.
    pub cancelled: Vec<u32>,
    /// Koala: every cancelled task (of this or earlier epochs) not yet released. They keep
    /// serving state, so they take `Prepare` too and learn where the new tasks run.
    pub retired: Vec<u32>,
}

impl Deployment {
    /// Live task indices of `op` (none for an operator it does not know).
    pub fn live(&self, op: OperatorId) -> &[u32] {
        self.tasks.get(&op).map(Vec::as_slice).unwrap_or(&[])
    }
}

impl Deployment {
    /// A deployment with nothing placed, for the cores' unit tests.
    #[cfg(test)]
    pub(crate) fn for_tests(
        tasks: BTreeMap<OperatorId, Vec<u32>>,
        routing: BTreeMap<OperatorId, Vec<u32>>,
        num_buckets: u16,
        protocol: Protocol,
    ) -> Self {
        let options = RuntimeOptions {
            batch_records: 1,
            linger_ms: 0,
            channel_capacity: 1,
            sink_dir: ".".into(),
            capacity: Default::default(),
            max_queued_records: crate::koala::task::limits::DEFAULT_MAX_QUEUED_RECORDS,
            checkpoint: Default::default(),
        };
        Self {
            run: "r".into(),
            query: "q".into(),
            query_params: String::new(),
            workers: BTreeMap::new(),
            placement: BTreeMap::new(),
            tasks,
            epoch: 0,
            routing,
            num_buckets,
            options,
            protocol,
            extra_keys: 0,
            drain_keys_per_sec: 0,
            finished: Default::default(),
        }
    }
}

impl ReconfigPlan {
    /// Moves leaving `task`: (new owner, buckets).
    pub fn outgoing(&self, task: TaskId) -> impl Iterator<Item = (TaskId, &Vec<BucketId>)> {
        self.moves.iter().filter(move |((from, _), _)| *from == task).map(|((_, to), b)| (*to, b))
    }

    /// Tasks sending state to `task`.
    pub fn senders_to(&self, task: TaskId) -> std::collections::BTreeSet<TaskId> {
        self.moves.keys().filter(|(_, to)| *to == task).map(|(from, _)| *from).collect()
    }
}

/// A task's typed acknowledgement of one reconfiguration phase.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TaskAck {
    /// The task applied `Prepare` (new tasks: they are running).
    Prepared,
    /// An upstream task sent its markers and paused.
    Paused,
    /// Stop-and-restart: a target task saw every marker and sent all state it moves.
    StateSent {
        /// Bytes of state sent.
        bytes: u64,
        /// Entries sent.
        entries: u64,
    },
    /// A receiving task has all state sent to it.
    StateReceived,
    /// An upstream task switched routing and resumed.
    Resumed,
    /// Koala: every hand-over this task expects has arrived.
    PeerReady,
    /// Koala: all markers arrived and all inbound peer channels closed.
    Done,
    /// Koala: this task's KLT no longer points at `location` (progressive migration).
    LocationDrained {
        /// The retired task that holds none of this task's keys any more.
        location: TaskId,
    },
    /// Koala: an upstream task switched its routing.
    Switched,
    /// Koala: every input of the task ended and it has nothing left to process; it keeps
    /// serving state until released.
    InputsEnded,
    /// A protocol surprise the task refused; the coordinator aborts the epoch and fails the job.
    ProtocolError {
        /// The error.
        error: crate::common::error::ProtocolError,
    },
}

/// A reconfiguration request, from a config schedule or `koala rescale|rebalance|migrate`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReconfigRequest {
    /// Change the operator's number of tasks (scale-out or scale-in).
    Rescale {
        /// Operator name.
        operator: String,
        /// New number of tasks.
        parallelism: u32,
    },
    /// Move buckets between existing tasks.
    Rebalance {
        /// Operator name.
        operator: String,
        /// (buckets, new owner task index).
        moves: Vec<(Vec<BucketId>, u32)>,
    },
    /// Move one task to another worker.
    Migrate {
        /// Operator name.
        operator: String,
        /// Task index.
        task: u32,
        /// Destination worker.
        worker: u32,
    },
}

impl ReconfigRequest {
    /// The operator the request targets.
    pub fn operator(&self) -> &str {
        match self {
            Self::Rescale { operator, .. }
            | Self::Rebalance { operator, .. }
            | Self::Migrate { operator, .. } => operator,
        }
    }
}

/// First frame on a connection to the coordinator's control port.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ControlHello {
    /// A worker registering.
    Worker {
        /// Address the worker's data plane listens on.
        data_addr: String,
        /// OS process id, for logs.
        pid: u32,
    },
    /// A client (`koala rescale` …) submitting a request; answered by one [`ClientReply`].
    Client(ReconfigRequest),
}

/// The coordinator's answer to a client request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClientReply {
    /// Accepted and queued as this epoch.
    Accepted {
        /// The reconfiguration's epoch.
        epoch: Epoch,
    },
    /// Valid, and queued behind `ahead` reconfigurations; it runs when they complete (its
    /// start and completion appear in the job's output and metrics).
    Queued {
        /// Reconfigurations running or queued before it.
        ahead: usize,
    },
    /// Rejected; the job keeps running.
    Rejected {
        /// What is wrong and how to fix it.
        error: String,
    },
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
    /// The worker's memory budget and its split among its stateful tasks: at deployment and
    /// whenever a reconfiguration adds or removes stateful tasks on the worker.
    Memory(crate::memory::MemoryReport),
    /// The worker is alive (sent every second; the coordinator fails the job when a worker falls
    /// silent for `[runtime] heartbeat_timeout_s`).
    Heartbeat,
    /// A task wrote its snapshot of a checkpoint.
    CheckpointAck {
        /// The task.
        task: TaskId,
        /// The checkpoint.
        id: koala_types::CheckpointId,
        /// Its part.
        ack: crate::checkpoint::TaskCheckpoint,
    },
    /// A task acknowledges a reconfiguration phase.
    TaskAck {
        /// The task.
        task: TaskId,
        /// The reconfiguration.
        epoch: Epoch,
        /// What it acknowledges.
        ack: TaskAck,
    },
    /// A sink task of a job restored from a checkpoint wrote its first records (once per
    /// restore): the end of a recovery as the job's output sees it (docs/architecture.md §10).
    FirstOutput {
        /// The sink task.
        task: TaskId,
        /// When it wrote them, unix ms (the worker's clock).
        unix_ms: u64,
    },
}
