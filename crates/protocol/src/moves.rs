//! Which buckets change owner in a reconfiguration: the one value every protocol consumes
//! (docs/architecture.md §6). A partition policy produces the new assignment; the moves are the
//! difference between the old and the new one.

use std::collections::BTreeMap;

use koala_types::{BucketId, TaskId};

/// Buckets moved per (old owner, new owner) pair.
pub type Moves = BTreeMap<(TaskId, TaskId), Vec<BucketId>>;

/// Two assignments of different sizes cannot be compared.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AssignmentMismatch {
    /// Buckets of the old assignment.
    pub old: usize,
    /// Buckets of the new assignment.
    pub new: usize,
}

impl std::fmt::Display for AssignmentMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "assignments of {} and {} buckets cannot be compared", self.old, self.new)
    }
}

impl std::error::Error for AssignmentMismatch {}

/// The moves that turn assignment `old` into `new` (both bucket → owner).
///
/// ```
/// use koala_protocol::moves_between;
/// use koala_types::{OperatorId, TaskId};
///
/// let t = |i| TaskId::new(OperatorId(1), i);
/// let moves = moves_between(&[t(0), t(0), t(1)], &[t(0), t(2), t(1)]).unwrap();
/// assert_eq!(moves.get(&(t(0), t(2))), Some(&vec![1]));
/// ```
pub fn moves_between(old: &[TaskId], new: &[TaskId]) -> Result<Moves, AssignmentMismatch> {
    if old.len() != new.len() || old.len() > usize::from(u16::MAX) {
        return Err(AssignmentMismatch { old: old.len(), new: new.len() });
    }
    let mut moves = Moves::new();
    for (b, (&from, &to)) in old.iter().zip(new).enumerate() {
        if from != to {
            moves.entry((from, to)).or_default().push(b as BucketId);
        }
    }
    Ok(moves)
}
