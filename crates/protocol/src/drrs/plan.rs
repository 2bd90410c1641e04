//! How DRRS splits a reconfiguration's moves into subscales (artifact notes §5.6,
//! `getDRRSSubscales`; docs/protocols.md §11).

use std::collections::BTreeSet;

use koala_types::TaskId;

use crate::moves::{Moves, moves_between};

/// One subscale: the moves it makes and the assignment after it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// The buckets moved in this subscale, per (sender, receiver).
    pub moves: Moves,
    /// Bucket → owner once the subscale completed.
    pub assignment: Vec<TaskId>,
}

/// Splits the change from assignment `old` to `new` into at most `count` subscales (0 = one per
/// sender→receiver pair). Pairs are ordered moves to new tasks first, moves from removed tasks
/// last, the rest in between (each group by sender, then receiver), and cut into `count`
/// contiguous groups of near-equal size; the last step's assignment is `new`.
///
/// ```
/// use koala_protocol::drrs::plan::subscales;
/// use koala_types::{OperatorId, TaskId};
/// let t = |i| TaskId::new(OperatorId(1), i);
/// // Scale-in 3 → 2 with a rebalance: t2 is removed, t1 hands a bucket to t0.
/// let steps = subscales(&[t(0), t(1), t(2), t(2)], &[t(0), t(0), t(1), t(0)], 0).unwrap();
/// let pairs: Vec<_> = steps.iter().flat_map(|s| s.moves.keys().copied()).collect();
/// assert_eq!(pairs, vec![(t(1), t(0)), (t(2), t(0)), (t(2), t(1))]);
/// assert_eq!(steps.last().unwrap().assignment, vec![t(0), t(0), t(1), t(0)]);
/// ```
pub fn subscales(old: &[TaskId], new: &[TaskId], count: usize) -> Result<Vec<Step>, String> {
    let moves = moves_between(old, new).map_err(|e| e.to_string())?;
    let before: BTreeSet<TaskId> = old.iter().copied().collect();
    let after: BTreeSet<TaskId> = new.iter().copied().collect();
    let class = |from: &TaskId, to: &TaskId| {
        if !before.contains(to) {
            0
        } else if !after.contains(from) {
            2
        } else {
            1
        }
    };
    let mut pairs: Vec<((TaskId, TaskId), Vec<u16>)> = moves.into_iter().collect();
    pairs.sort_by_key(|((from, to), _)| (class(from, to), *from, *to));
    let groups = if count == 0 || count >= pairs.len() { pairs.len() } else { count };
    if groups > super::MAX_SUBSCALES {
        return Err(format!("{groups} subscales; at most {} are possible", super::MAX_SUBSCALES));
    }
    let mut steps = Vec::with_capacity(groups);
    let mut assignment = old.to_vec();
    let mut rest = pairs.into_iter();
    let total = rest.len();
    for g in 0..groups {
        // Group g takes pairs [g*total/groups, (g+1)*total/groups).
        let size = (g + 1) * total / groups - g * total / groups;
        let mut moves = Moves::new();
        for (pair, buckets) in rest.by_ref().take(size) {
            for &b in &buckets {
                assignment[usize::from(b)] = pair.1;
            }
            moves.insert(pair, buckets);
        }
        steps.push(Step { moves, assignment: assignment.clone() });
    }
    Ok(steps)
}

#[cfg(test)]
mod tests {
    use super::*;
    use koala_types::OperatorId;

    fn t(i: u32) -> TaskId {
        TaskId::new(OperatorId(1), i)
    }

    #[test]
    fn new_destinations_first_removed_sources_last_and_grouping() {
        let old = vec![t(0), t(0), t(1), t(1), t(2), t(2)];
        // t3 is new, t2 is removed, t0 → t1 is a plain move.
        let new = vec![t(3), t(1), t(1), t(3), t(0), t(1)];
        let steps = subscales(&old, &new, 0).expect("steps");
        let pairs: Vec<Vec<(TaskId, TaskId)>> =
            steps.iter().map(|s| s.moves.keys().copied().collect()).collect();
        assert_eq!(
            pairs,
            vec![
                vec![(t(0), t(3))],
                vec![(t(1), t(3))],
                vec![(t(0), t(1))],
                vec![(t(2), t(0))],
                vec![(t(2), t(1))]
            ]
        );
        assert_eq!(steps[0].assignment, vec![t(3), t(0), t(1), t(1), t(2), t(2)]);
        assert_eq!(steps.last().map(|s| s.assignment.clone()), Some(new.clone()));
        let two = subscales(&old, &new, 2).expect("steps");
        assert_eq!(two.len(), 2);
        assert_eq!(two[0].moves.len() + two[1].moves.len(), 5);
        assert_eq!(two[1].assignment, new);
        assert!(subscales(&old, &new[..5], 0).is_err());
        assert!(subscales(&old, &old, 0).expect("no moves").is_empty());
    }
}
