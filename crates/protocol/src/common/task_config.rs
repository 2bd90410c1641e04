//! How a task core of any protocol starts: its id, the key space, the buckets it holds and its
//! open channels.

use std::collections::BTreeSet;

use koala_types::{BucketId, InputChannel, TaskId};

/// How a target task starts (a Koala or DRRS task core).
#[derive(Clone, Debug)]
pub struct TaskConfig {
    /// The task.
    pub id: TaskId,
    /// Buckets of the operator's key space.
    pub num_buckets: u16,
    /// Buckets the task owns with their state local (initial deployment); empty for a new task.
    pub owned: BTreeSet<BucketId>,
    /// Data channels open to this task (upstream task and input index); empty for a new task.
    pub inputs: BTreeSet<InputChannel>,
}
