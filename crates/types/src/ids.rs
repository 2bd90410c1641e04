use std::fmt;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

/// Event time in milliseconds since an arbitrary epoch chosen by the source.
pub type Timestamp = u64;

/// Reconfiguration number; every control message and marker of a reconfiguration carries it.
pub type Epoch = u64;

/// A checkpoint's number (1, 2, …; never reused within a job).
pub type CheckpointId = u64;

/// A node of the dataflow DAG, numbered in the order the builder created it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct OperatorId(pub u32);

/// One parallel instance of an operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TaskId {
    /// The operator this task runs.
    pub operator: OperatorId,
    /// Index among the operator's tasks (0-based; indices of removed tasks are not reused).
    pub index: u32,
}

/// A worker process, numbered by the coordinator in registration order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct WorkerId(pub u32);

impl TaskId {
    /// The task `index` of `operator`.
    pub fn new(operator: OperatorId, index: u32) -> Self {
        Self { operator, index }
    }
}

/// One logical input channel of a task: which input of its operator, from which upstream task.
/// A self-join has two channels from each upstream task, one per input.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct InputChannel {
    /// Input index at the receiving operator (0, or 1 for the right side of a join).
    pub input: usize,
    /// The sending task.
    pub from: TaskId,
}

/// The operators' names of the job this process runs, for display.
static OPERATOR_NAMES: OnceLock<Vec<String>> = OnceLock::new();

/// Names this process's operators for display, so logs and errors say `window.0`, as configs,
/// metrics and reports do, instead of `op1.0`. Called once per process by the coordinator and by
/// each worker when they build the job's graph (indexed by `OperatorId.0`); a later call is
/// ignored (a process runs one job; the operators of one query are named alike in every run).
pub fn name_operators(names: Vec<String>) {
    let _ = OPERATOR_NAMES.set(names);
}

impl fmt::Display for OperatorId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match OPERATOR_NAMES.get().and_then(|names| names.get(self.0 as usize)) {
            Some(name) => f.write_str(name),
            None => write!(f, "op{}", self.0),
        }
    }
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.operator, self.index)
    }
}

impl fmt::Display for InputChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "input {} from {}", self.input, self.from)
    }
}

impl fmt::Display for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "worker{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_display_with_their_operators_names_once_named() {
        // The only test in this binary that names operators (the names are per process).
        name_operators(vec!["source".into(), "window".into()]);
        assert_eq!(TaskId::new(OperatorId(1), 0).to_string(), "window.0");
        assert_eq!(OperatorId(7).to_string(), "op7", "an operator without a name keeps its number");
        name_operators(vec!["other".into()]);
        assert_eq!(OperatorId(0).to_string(), "source", "the first naming stands");
    }
}

/// The time domain of a timer. Timers of both domains share one `(time, key)` queue per task —
/// and so travel with their buckets under every protocol — processing-time ones marked by
/// [`PROCESSING_TIME`] in their time: past every event time, they never fire by a watermark (only
/// the end of input, [`Timestamp::MAX`], fires every timer left).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum TimeDomain {
    /// Fired when the task's watermark reaches the time.
    EventTime,
    /// Fired when the task's clock (milliseconds since the Unix epoch) reaches the time.
    ProcessingTime,
}

/// The mark of a processing-time timer's time in a timer queue (its top bit).
pub const PROCESSING_TIME: Timestamp = 1 << 63;

impl TimeDomain {
    /// The queue time of a timer of this domain at `time` (`time` below [`PROCESSING_TIME`]).
    pub fn queue_time(self, time: Timestamp) -> Timestamp {
        match self {
            Self::EventTime => time,
            Self::ProcessingTime => PROCESSING_TIME | time,
        }
    }

    /// The domain and time of a queue time.
    pub fn of(queue_time: Timestamp) -> (Self, Timestamp) {
        if queue_time & PROCESSING_TIME != 0 && queue_time != Timestamp::MAX {
            (Self::ProcessingTime, queue_time & !PROCESSING_TIME)
        } else {
            (Self::EventTime, queue_time)
        }
    }
}
