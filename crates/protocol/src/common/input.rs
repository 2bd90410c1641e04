//! Where a target task's input comes from, as every protocol's task core names it in its events
//! and errors.

use koala_types::{InputChannel, TaskId};
use serde::{Deserialize, Serialize};

/// An input of a target task: a data channel from an upstream task or a peer channel from a sender.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum InputSource {
    /// A data channel: one input of the operator, from one upstream task (a self-join has two
    /// from each upstream task).
    Upstream(InputChannel),
    /// The peer channel from a sender of the running epoch.
    Peer(TaskId),
}
