//! The erased job graph a [`crate::Dataflow`] builds and the runtime executes. Every process of a
//! job (coordinator, workers) builds the same graph by running the same registered query, so the
//! closures inside exist everywhere and only ids cross the network.

use std::sync::Arc;

use koala_types::{CodecError, OperatorId};

use crate::logic::{OperatorLogic, SinkFormat, SourceLogic};
use crate::source::SourceOptions;

/// Computes the canonical key bytes of an encoded value (the `key_by` closure, erased).
pub type KeyFn = Arc<dyn Fn(&[u8]) -> Result<Vec<u8>, CodecError> + Send + Sync>;

/// Builds the source logic of one task.
pub type SourceFactory = Arc<dyn Fn(TaskInstance) -> Box<dyn SourceLogic> + Send + Sync>;

/// Builds the operator logic of one task.
pub type OperatorFactory = Arc<dyn Fn(TaskInstance) -> Box<dyn OperatorLogic> + Send + Sync>;

/// Which instance of an operator a factory is building.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskInstance {
    /// Index of the task among its operator's tasks.
    pub index: u32,
    /// Number of tasks of the operator when the task is created.
    pub parallelism: u32,
}

/// How records travel from an upstream operator's tasks to this operator's tasks.
#[derive(Clone)]
pub enum Partitioning {
    /// Task i feeds task i; the runtime falls back to [`Partitioning::Rebalance`] when the two
    /// operators' parallelism differs.
    Forward,
    /// Round-robin over all downstream tasks.
    Rebalance,
    /// By bucket of the key computed by the function, through the upstream task's routing table.
    Key(KeyFn),
}

impl std::fmt::Debug for Partitioning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Forward => write!(f, "Forward"),
            Self::Rebalance => write!(f, "Rebalance"),
            Self::Key(_) => write!(f, "Key"),
        }
    }
}

/// One input of an operator.
#[derive(Clone, Debug)]
pub struct InputSpec {
    /// The upstream operator.
    pub from: OperatorId,
    /// How its records are distributed over this operator's tasks.
    pub partitioning: Partitioning,
}

/// What an operator is, with the factory that instantiates its tasks.
#[derive(Clone)]
pub enum OperatorKind {
    /// Produces records; has no inputs.
    Source {
        /// Builds one source task.
        factory: SourceFactory,
        /// Rate schedule, watermark cadence and bounded disorder.
        options: SourceOptions,
    },
    /// Transforms records; keyed operators hold per-key state.
    Transform {
        /// Builds one task.
        factory: OperatorFactory,
        /// Whether the operator holds per-key state (then every input is key-partitioned).
        stateful: bool,
        /// Whether the operator uses event time (late records are dropped before it).
        event_time: bool,
        /// Records later than the watermark by more than this are dropped (event-time operators).
        allowed_lateness: u64,
    },
    /// Writes records out of the job.
    Sink {
        /// Where and how records are written.
        format: SinkFormat,
    },
}

/// One node of the job graph.
#[derive(Clone)]
pub struct OperatorSpec {
    /// Position in [`JobGraph::operators`].
    pub id: OperatorId,
    /// Unique, user-chosen name (used in configs, CLI and metrics).
    pub name: String,
    /// Inputs in order: input 0, input 1 (two-input operators such as joins).
    pub inputs: Vec<InputSpec>,
    /// What the operator does.
    pub kind: OperatorKind,
}

impl OperatorSpec {
    /// Whether the operator holds keyed state that reconfiguration must move.
    pub fn is_stateful(&self) -> bool {
        matches!(self.kind, OperatorKind::Transform { stateful: true, .. })
    }

    /// Whether the operator is a source.
    pub fn is_source(&self) -> bool {
        matches!(self.kind, OperatorKind::Source { .. })
    }
}

/// A whole job: operators in topological order (every input refers to an earlier operator).
#[derive(Clone, Default)]
pub struct JobGraph {
    /// All operators, indexed by `OperatorId.0`.
    pub operators: Vec<OperatorSpec>,
}

impl JobGraph {
    /// The operator with this id.
    pub fn operator(&self, id: OperatorId) -> Option<&OperatorSpec> {
        self.operators.get(id.0 as usize)
    }

    /// The operator with this name.
    pub fn by_name(&self, name: &str) -> Option<&OperatorSpec> {
        self.operators.iter().find(|o| o.name == name)
    }

    /// Downstream edges of `id`: (consumer, input index at the consumer).
    pub fn consumers(&self, id: OperatorId) -> Vec<(OperatorId, usize)> {
        let mut out = Vec::new();
        for op in &self.operators {
            for (i, input) in op.inputs.iter().enumerate() {
                if input.from == id {
                    out.push((op.id, i));
                }
            }
        }
        out
    }

    /// Whether input `input` of `consumer` is a forward edge between two stateless operators: the
    /// edges that connect task i to task i only when both operators run the same tasks
    /// (`koala_protocol::plan::is_one_to_one` adds that condition).
    pub fn is_forward_stateless(&self, consumer: OperatorId, input: usize) -> bool {
        let Some(c) = self.operator(consumer) else { return false };
        let Some(i) = c.inputs.get(input) else { return false };
        let Some(u) = self.operator(i.from) else { return false };
        matches!(i.partitioning, Partitioning::Forward) && !c.is_stateful() && !u.is_stateful()
    }
}

/// Builds the graph of a registered query from its name and its parameters (TOML text). Every
/// process of a job calls the same resolver, so all build the same graph.
pub type QueryResolver = Arc<dyn Fn(&str, &str) -> Result<JobGraph, String> + Send + Sync>;
