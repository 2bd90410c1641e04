//! Partition policies (docs/architecture.md §6): bucket → owning task index, and the `moves`
//! between two assignments that every reconfiguration protocol consumes.

use xxhash_rust::xxh3::xxh3_64;

use crate::config::PolicyName;

/// Assigns `num_buckets` buckets to the task indices in `tasks`.
///
/// `Consistent` is rendezvous hashing: each bucket goes to the task with the highest
/// hash(bucket, task), so adding a task moves only the buckets the new task wins (all from old
/// tasks to the new one), and removing one moves only its own buckets; shares are uneven (at
/// 128 buckets over 8 tasks the largest is ~1.4× the mean). `Uniform` gives even contiguous
/// ranges, so any change of parallelism shifts most ranges (4 → 8 moves 7/8 of the buckets,
/// many between old tasks). `Interleaved` deals buckets out in turn: even shares, and doubling
/// moves exactly half the buckets, all to the new tasks.
pub fn assign(policy: PolicyName, num_buckets: u16, tasks: &[u32]) -> Vec<u32> {
    let mut tasks = tasks.to_vec();
    tasks.sort_unstable();
    if tasks.is_empty() {
        return Vec::new();
    }
    match policy {
        PolicyName::Uniform => {
            let n = tasks.len() as u64;
            (0..u64::from(num_buckets)).map(|b| tasks[(b * n / u64::from(num_buckets)) as usize]).collect()
        }
        PolicyName::Interleaved => (0..usize::from(num_buckets)).map(|b| tasks[b % tasks.len()]).collect(),
        PolicyName::Consistent => (0..num_buckets)
            .map(|b| {
                let score = |t: u32| {
                    let mut bytes = [0u8; 6];
                    bytes[..2].copy_from_slice(&b.to_be_bytes());
                    bytes[2..].copy_from_slice(&t.to_be_bytes());
                    xxh3_64(&bytes)
                };
                tasks.iter().copied().max_by_key(|t| (score(*t), *t)).unwrap_or(0)
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn every_task_owns_something_at_128_buckets() {
        for p in 1..=16u32 {
            let tasks: Vec<u32> = (0..p).collect();
            let a = assign(PolicyName::Consistent, 128, &tasks);
            for t in &tasks {
                assert!(a.contains(t), "task {t} of {p} owns no bucket");
            }
        }
    }

    proptest! {
        #[test]
        fn interleaved_is_even_and_multiplying_tasks_moves_only_to_the_new_ones(p in 1u32..16, k in 1u32..4) {
            let old = assign(PolicyName::Interleaved, 128, &(0..p).collect::<Vec<_>>());
            let new = assign(PolicyName::Interleaved, 128, &(0..p * k).collect::<Vec<_>>());
            for a in [&old, &new] {
                let n = a.iter().copied().max().unwrap_or(0) + 1;
                let shares: Vec<usize> = (0..n).map(|t| a.iter().filter(|o| **o == t).count()).collect();
                let (lo, hi) = (shares.iter().min().expect("a task"), shares.iter().max().expect("a task"));
                prop_assert!(hi - lo <= 1, "uneven shares {:?}", shares);
            }
            let moved = old.iter().zip(&new).filter(|(o, n)| o != n).count();
            for (b, (o, n)) in old.iter().zip(&new).enumerate() {
                prop_assert!(o == n || *n >= p, "bucket {} moved {} -> {} (an old task)", b, o, n);
            }
            // Exactly the new tasks' shares move: the fewest any even policy can move.
            let new_share: usize = new.iter().filter(|t| **t >= p).count();
            prop_assert_eq!(moved, new_share);
        }

        #[test]
        fn consistent_scale_out_moves_only_to_the_new_task(p in 1u32..12) {
            let old = assign(PolicyName::Consistent, 128, &(0..p).collect::<Vec<_>>());
            let new = assign(PolicyName::Consistent, 128, &(0..=p).collect::<Vec<_>>());
            for (b, (o, n)) in old.iter().zip(&new).enumerate() {
                prop_assert!(o == n || *n == p, "bucket {} moved {} -> {}", b, o, n);
            }
        }

        #[test]
        fn uniform_is_contiguous_and_even(p in 1u32..64) {
            let a = assign(PolicyName::Uniform, 128, &(0..p).collect::<Vec<_>>());
            prop_assert!(a.windows(2).all(|w| w[0] <= w[1]));
            let counts: Vec<usize> = (0..p).map(|t| a.iter().filter(|x| **x == t).count()).collect();
            let (min, max) = (counts.iter().min().copied().unwrap_or(0), counts.iter().max().copied().unwrap_or(0));
            prop_assert!(max - min <= 1);
        }
    }
}
