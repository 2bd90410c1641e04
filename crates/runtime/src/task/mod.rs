//! Task loops: one thread per task, one loop per kind of operator.

mod operator;
mod sink;
mod source;

use std::collections::BTreeSet;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender};
use koala_dataflow::OperatorSpec;
use koala_protocol::{RuntimeOptions, WorkerMessage};
use koala_state::StateBackend;
use koala_types::TaskId;

pub use self::operator::run_operator;
pub use self::sink::run_sink;
pub use self::source::run_source;
use crate::RuntimeError;
use crate::channel::{InputChannel, TaskInput};
use crate::metrics::TaskMetrics;
use crate::output::Outputs;

/// Commands a worker sends to one of its tasks.
#[derive(Debug)]
pub enum TaskCommand {
    /// A source ends now, as if exhausted.
    StopSource,
}

/// Everything a task loop runs with.
pub struct TaskSetup {
    /// The task.
    pub task: TaskId,
    /// Its operator.
    pub spec: OperatorSpec,
    /// Tasks of its operator.
    pub parallelism: u32,
    /// Its input queue.
    pub inbox: Receiver<TaskInput>,
    /// Commands from the worker.
    pub commands: Receiver<TaskCommand>,
    /// Events to the worker.
    pub events: Sender<WorkerMessage>,
    /// Its outputs (channels already open).
    pub outputs: Outputs,
    /// The input channels it expects (for watermarks and end of stream).
    pub inputs: BTreeSet<InputChannel>,
    /// Batching and queue sizes.
    pub options: RuntimeOptions,
    /// Buckets of stateful operators.
    pub num_buckets: u16,
    /// Its state store (stateful operators).
    pub store: Option<Box<dyn StateBackend>>,
}

impl TaskSetup {
    /// Sends the second's samples if one ended.
    pub(crate) fn report(&self, metrics: &mut TaskMetrics, outputs: &mut Outputs, now: Instant) {
        metrics.backpressure += std::mem::take(&mut outputs.backpressure);
        if let Some(samples) = metrics.take_if_due(now) {
            let _ = self.events.send(WorkerMessage::Metrics(samples));
        }
    }
}

/// Runs a task to completion and reports how it ended.
pub fn run_task(setup: TaskSetup, body: fn(TaskSetup) -> Result<(), RuntimeError>) {
    let task = setup.task;
    let events = setup.events.clone();
    match body(setup) {
        Ok(()) => {
            let _ = events.send(WorkerMessage::TaskFinished { task });
        }
        Err(e) => {
            tracing::error!(%task, error = %e, "task failed");
            let _ = events.send(WorkerMessage::TaskFailed {
                task,
                error: e.to_string(),
            });
        }
    }
}
