//! How DRRS splits a reconfiguration's moves into subscales (docs/protocols.md §11): as the Koala
//! authors' port does ([`subscales`]; their `drrs` branch, `getDRRSSubscales`; artifact notes
//! §5.6), every subscale holds a slice of *every* sender→receiver pair, so all links work at once;
//! as the original DRRS does ([`single_pairs`]), single-pair subscales, about two per pair.

use std::collections::BTreeSet;

use koala_types::{BucketId, TaskId};

use crate::moves::{Moves, moves_between};

/// One subscale: the moves it makes and the assignment after it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// The buckets moved in this subscale, per (sender, receiver).
    pub moves: Moves,
    /// Bucket → owner once the subscale completed.
    pub assignment: Vec<TaskId>,
}

/// Splits the change from assignment `old` to `new` into `count` subscales (0 = as many as there
/// are sender→receiver pairs, the artifact's `NumSubscales: -1`). Each pair's buckets (in bucket
/// order) are cut into `count` contiguous slices as even as possible, the larger ones first, and
/// subscale `i` moves slice `i` of every pair. A pair to a new task moves at least one bucket in
/// the first subscale (the task takes part from then on) and a pair from a removed task at least
/// one in the last (the task owns buckets until the end). Subscales left without a move are
/// dropped; the last step's assignment is `new`.
///
/// ```
/// use koala_protocol::drrs::plan::subscales;
/// use koala_types::{OperatorId, TaskId};
/// let t = |i| TaskId::new(OperatorId(1), i);
/// // Scale-out 1 → 3: two pairs, so two subscales, each with half of both pairs.
/// let old = vec![t(0); 6];
/// let new = vec![t(0), t(0), t(1), t(1), t(2), t(2)];
/// let steps = subscales(&old, &new, 0).unwrap();
/// assert_eq!(steps.len(), 2);
/// assert_eq!(steps[0].moves.get(&(t(0), t(1))), Some(&vec![2]));
/// assert_eq!(steps[0].moves.get(&(t(0), t(2))), Some(&vec![4]));
/// assert_eq!(steps[1].moves.get(&(t(0), t(2))), Some(&vec![5]));
/// assert_eq!(steps[1].assignment, new);
/// ```
pub fn subscales(old: &[TaskId], new: &[TaskId], count: usize) -> Result<Vec<Step>, String> {
    let moves = moves_between(old, new).map_err(|e| e.to_string())?;
    let n = if count == 0 { moves.len() } else { count };
    if n > super::MAX_SUBSCALES {
        return Err(format!("{n} subscales; at most {} are possible", super::MAX_SUBSCALES));
    }
    if moves.is_empty() {
        return Ok(Vec::new());
    }
    let before: BTreeSet<TaskId> = old.iter().copied().collect();
    let after: BTreeSet<TaskId> = new.iter().copied().collect();
    // Per pair, its slice of each subscale.
    let mut slices: Vec<(Pair, Vec<Vec<BucketId>>)> = Vec::with_capacity(moves.len());
    for ((from, to), buckets) in moves {
        let mut split = even_slices(&buckets, n);
        if !before.contains(&to)
            && split[0].is_empty()
            && let Some(j) = (1..n).find(|&j| !split[j].is_empty())
        {
            let b = split[j].remove(0);
            split[0].push(b);
        }
        if !after.contains(&from)
            && split[n - 1].is_empty()
            && let Some(j) = (0..n - 1).rev().find(|&j| !split[j].is_empty())
            && let Some(b) = split[j].pop()
        {
            split[n - 1].push(b);
        }
        slices.push(((from, to), split));
    }
    let mut steps = Vec::with_capacity(n);
    let mut assignment = old.to_vec();
    for i in 0..n {
        let mut moves = Moves::new();
        for (pair, split) in &mut slices {
            let buckets = std::mem::take(&mut split[i]);
            if buckets.is_empty() {
                continue;
            }
            for &b in &buckets {
                assignment[usize::from(b)] = pair.1;
            }
            moves.insert(*pair, buckets);
        }
        if !moves.is_empty() {
            steps.push(Step { moves, assignment: assignment.clone() });
        }
    }
    Ok(steps)
}

/// The fewest buckets (key groups) in an overlapping subscale: the original DRRS's evaluation
/// controller cuts a pair into subscales of at least 7 key groups.
pub const MIN_PAIR_SUBSCALE: usize = 7;

/// The overlapping schedule's subscales (the original DRRS, its evaluation controller's
/// `MinHoldScheduler`): each sender→receiver pair's buckets, in bucket order, cut into contiguous
/// subscales of [`pair_subscale_size`] buckets (about two per pair), pair after pair. They have
/// no assignment of their own: which run at once, and so the order of their routing switches,
/// is decided as they run (`DrrsCoordinator` picks the next one).
///
/// ```
/// use koala_protocol::drrs::plan::single_pairs;
/// use koala_types::{OperatorId, TaskId};
/// let t = |i| TaskId::new(OperatorId(1), i);
/// let old = vec![t(0); 6];
/// let new = vec![t(0), t(0), t(1), t(1), t(2), t(2)];
/// let subs = single_pairs(&old, &new).unwrap();
/// assert_eq!(subs.len(), 2);
/// assert_eq!(subs[0].get(&(t(0), t(1))), Some(&vec![2, 3]));
/// assert_eq!(subs[1].get(&(t(0), t(2))), Some(&vec![4, 5]));
/// // 2 → 4 over 128 buckets: three pairs of 32, each cut into two subscales of 16.
/// let old: Vec<TaskId> = (0..128).map(|b| t(b / 64)).collect();
/// let new: Vec<TaskId> = (0..128).map(|b| t(b / 32)).collect();
/// let subs = single_pairs(&old, &new).unwrap();
/// assert_eq!(subs.len(), 6);
/// assert!(subs.iter().all(|s| s.len() == 1 && s.values().all(|b| b.len() == 16)));
/// ```
pub fn single_pairs(old: &[TaskId], new: &[TaskId]) -> Result<Vec<Moves>, String> {
    let moves = moves_between(old, new).map_err(|e| e.to_string())?;
    let size = pair_subscale_size(&moves);
    let subs: Vec<Moves> = moves
        .into_iter()
        .flat_map(|(pair, buckets)| {
            buckets.chunks(size).map(|c| Moves::from([(pair, c.to_vec())])).collect::<Vec<_>>()
        })
        .collect();
    if subs.len() > super::MAX_SUBSCALES {
        return Err(format!("{} subscales; at most {} are possible", subs.len(), super::MAX_SUBSCALES));
    }
    Ok(subs)
}

/// Buckets per overlapping subscale: half the mean a pair moves (rounded up), at least
/// [`MIN_PAIR_SUBSCALE`], as the original DRRS's `MinHoldScheduler` cuts them.
///
/// ```
/// use koala_protocol::drrs::plan::pair_subscale_size;
/// use koala_protocol::Moves;
/// use koala_types::{OperatorId, TaskId};
/// let t = |i| TaskId::new(OperatorId(1), i);
/// let moves = Moves::from([((t(0), t(1)), (0..40).collect()), ((t(0), t(2)), (40..60).collect())]);
/// assert_eq!(pair_subscale_size(&moves), 15); // half of the mean 30
/// assert_eq!(pair_subscale_size(&Moves::from([((t(0), t(1)), vec![3])])), 7);
/// ```
pub fn pair_subscale_size(moves: &Moves) -> usize {
    let total: usize = moves.values().map(Vec::len).sum();
    let mean = total.div_ceil(moves.len().max(1));
    mean.div_ceil(2).max(MIN_PAIR_SUBSCALE)
}

/// A sender and a receiver.
type Pair = (TaskId, TaskId);

/// `buckets` cut into `n` contiguous slices whose sizes differ by at most one, the larger first.
fn even_slices(buckets: &[BucketId], n: usize) -> Vec<Vec<BucketId>> {
    let (base, rem) = (buckets.len() / n, buckets.len() % n);
    let mut rest = buckets.iter().copied();
    (0..n).map(|i| rest.by_ref().take(base + usize::from(i < rem)).collect()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use koala_types::OperatorId;

    fn t(i: u32) -> TaskId {
        TaskId::new(OperatorId(1), i)
    }

    #[test]
    fn every_subscale_holds_a_slice_of_every_pair() {
        // 1 → 5 over 20 buckets: four pairs of four buckets, four subscales of one bucket each.
        let old = vec![t(0); 20];
        let new: Vec<TaskId> = (0..20).map(|b| t(b / 4)).collect();
        let steps = subscales(&old, &new, 0).expect("steps");
        assert_eq!(steps.len(), 4);
        for (i, step) in steps.iter().enumerate() {
            let pairs: Vec<(TaskId, TaskId)> = step.moves.keys().copied().collect();
            assert_eq!(pairs, vec![(t(0), t(1)), (t(0), t(2)), (t(0), t(3)), (t(0), t(4))], "subscale {i}");
            assert!(step.moves.values().all(|b| b.len() == 1), "subscale {i}: {:?}", step.moves);
        }
        assert_eq!(steps[0].moves[&(t(0), t(1))], vec![4]);
        assert_eq!(steps[3].moves[&(t(0), t(4))], vec![19]);
        assert_eq!(steps.last().map(|s| s.assignment.clone()), Some(new.clone()));
        // Two subscales: each pair's first half, then its second.
        let two = subscales(&old, &new, 2).expect("steps");
        assert_eq!(two.len(), 2);
        assert_eq!(two[0].moves[&(t(0), t(3))], vec![12, 13]);
        assert_eq!(two[1].moves[&(t(0), t(3))], vec![14, 15]);
        assert!(subscales(&old, &new[..5], 0).is_err());
        assert!(subscales(&old, &old, 0).expect("no moves").is_empty());
    }

    #[test]
    fn removed_senders_keep_a_bucket_until_the_last_subscale_and_empty_ones_are_dropped() {
        // 3 → 2: t2 is removed and hands one bucket to each of t0 and t1; t0 → t1 moves three.
        let old = vec![t(0), t(0), t(0), t(0), t(1), t(1), t(2), t(2)];
        let new = vec![t(0), t(1), t(1), t(1), t(1), t(1), t(0), t(1)];
        let steps = subscales(&old, &new, 0).expect("steps");
        // Three pairs, three subscales; t2's single-bucket pairs move in the last.
        assert_eq!(steps.len(), 3);
        let last = &steps[2].moves;
        assert_eq!(last.get(&(t(2), t(0))), Some(&vec![6]));
        assert_eq!(last.get(&(t(2), t(1))), Some(&vec![7]));
        assert_eq!(steps[0].moves.keys().copied().collect::<Vec<_>>(), vec![(t(0), t(1))]);
        // More subscales than any pair has buckets: those with no move are dropped.
        let many = subscales(&old, &new, 6).expect("steps");
        assert_eq!(many.len(), 4, "{many:?}");
        assert_eq!(many.last().map(|s| s.assignment.clone()), Some(new));
    }
}
