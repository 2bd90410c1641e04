//! The reconfiguration scenarios of the simulator (paper §2.2, §5.3): each turns a seed into an
//! initial assignment and a sequence of target assignments of one 16-bucket operator.

use std::collections::BTreeSet;
use std::fmt;

use koala_types::{OperatorId, TaskId};

use super::rng::SplitMix64;

/// The operator the simulator reconfigures.
pub const TARGET: OperatorId = OperatorId(1);

/// The operator feeding it.
pub const UPSTREAM: OperatorId = OperatorId(0);

/// The operator it feeds ([`SimConfig::consumers`](super::SimConfig::consumers) tasks).
pub const CONSUMER: OperatorId = OperatorId(2);

/// Which reconfiguration(s) a simulation runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    /// 2 → 4 tasks; new tasks take random buckets.
    ScaleOut,
    /// 4 → 2 tasks with progressive migration knob N.
    ScaleIn {
        /// Extra keys per fetch from a cancelled task.
        extra_keys: usize,
    },
    /// 3 tasks; random buckets move between existing tasks.
    Rebalance,
    /// 3 tasks; every bucket of task 1 moves to a new task 3.
    Migration,
    /// 2 → 4 → 6 → 3 → 2, queued back to back.
    Chain,
    /// 3–6 random steps from 2 tasks: rescale to 1–5 tasks (so scale-in followed by scale-out,
    /// with cold state left on retired tasks), rebalance, migrate a task to a new one.
    Mixed {
        /// Extra keys per fetch from a cancelled task.
        extra_keys: usize,
    },
}

impl Scenario {
    /// Every scenario, as the test suite runs them.
    pub const ALL: [Scenario; 8] = [
        Scenario::ScaleOut,
        Scenario::ScaleIn { extra_keys: 0 },
        Scenario::ScaleIn { extra_keys: 4 },
        Scenario::Rebalance,
        Scenario::Migration,
        Scenario::Chain,
        Scenario::Mixed { extra_keys: 0 },
        Scenario::Mixed { extra_keys: 8 },
    ];

    /// Parses the name printed by `Display` (for replay commands).
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.to_string() == name)
    }

    /// Initial assignment, target assignments in order, and N.
    pub(crate) fn plan(self, buckets: u16, rng: &mut SplitMix64) -> (Vec<TaskId>, Vec<Vec<TaskId>>, usize) {
        let n = usize::from(buckets);
        let even = |k: u32| (0..n).map(|b| t((b * k as usize / n) as u32)).collect::<Vec<_>>();
        match self {
            Scenario::ScaleOut => {
                let a0 = even(2);
                let a1 = spread(&a0, &[t(2), t(3)], 2, rng);
                (a0, vec![a1], 0)
            }
            Scenario::ScaleIn { extra_keys } => {
                let a0 = even(4);
                let a1 = shrink(&a0, 2, rng);
                (a0, vec![a1], extra_keys)
            }
            Scenario::Rebalance => {
                let a0 = even(3);
                let mut a1 = a0.clone();
                while a1 == a0 {
                    for x in a1.iter_mut() {
                        if rng.chance(1, 3) {
                            *x = t(rng.below(3) as u32);
                        }
                    }
                    for i in 0..3 {
                        if !a1.contains(&t(i)) {
                            a1[rng.below(n)] = t(i);
                        }
                    }
                }
                (a0, vec![a1], 0)
            }
            Scenario::Migration => {
                let a0 = even(3);
                let a1 = a0.iter().map(|&x| if x == t(1) { t(3) } else { x }).collect();
                (a0, vec![a1], 1 + rng.below(4))
            }
            Scenario::Chain => {
                let a0 = even(2);
                let a1 = spread(&a0, &[t(2), t(3)], 2, rng);
                let a2 = spread(&a1, &[t(4), t(5)], 3, rng);
                let a3 = shrink(&a2, 3, rng);
                let a4 = shrink(&a3, 2, rng);
                (a0, vec![a1, a2, a3, a4], 2 * rng.below(2))
            }
            Scenario::Mixed { extra_keys } => {
                let a0 = even(2);
                let mut next = 2u32;
                let mut fresh = |k: usize| -> Vec<TaskId> {
                    let v = (0..k).map(|i| t(next + i as u32)).collect();
                    next += k as u32;
                    v
                };
                let mut steps: Vec<Vec<TaskId>> = Vec::new();
                let mut cur = a0.clone();
                for _ in 0..3 + rng.below(4) {
                    let live: BTreeSet<TaskId> = cur.iter().copied().collect();
                    let a = match rng.below(4) {
                        0 | 1 => {
                            let target = 1 + rng.below(5);
                            if target > live.len() {
                                spread(&cur, &fresh(target - live.len()), 2, rng)
                            } else if target < live.len() {
                                shrink(&cur, target, rng)
                            } else {
                                continue;
                            }
                        }
                        2 if live.len() > 1 => {
                            let live: Vec<TaskId> = live.into_iter().collect();
                            let mut a = cur.clone();
                            let to = live[rng.below(live.len())];
                            for x in a.iter_mut().filter(|x| **x != to) {
                                if rng.chance(1, 3) {
                                    *x = to;
                                }
                            }
                            // Every live task keeps at least one bucket.
                            for &l in &live {
                                if !a.contains(&l)
                                    && let Some(b) = cur.iter().position(|x| *x == l)
                                {
                                    a[b] = l;
                                }
                            }
                            a
                        }
                        _ => {
                            let live: Vec<TaskId> = live.into_iter().collect();
                            let from = live[rng.below(live.len())];
                            let to = fresh(1)[0];
                            cur.iter().map(|&x| if x == from { to } else { x }).collect()
                        }
                    };
                    if a != cur {
                        steps.push(a.clone());
                        cur = a;
                    }
                }
                if steps.is_empty() {
                    steps.push(spread(&cur, &fresh(1), 2, rng));
                }
                (a0, steps, extra_keys)
            }
        }
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scenario::ScaleOut => write!(f, "scale_out"),
            Scenario::ScaleIn { extra_keys } => write!(f, "scale_in_n{extra_keys}"),
            Scenario::Rebalance => write!(f, "rebalance"),
            Scenario::Migration => write!(f, "migration"),
            Scenario::Chain => write!(f, "chain"),
            Scenario::Mixed { extra_keys } => write!(f, "mixed_n{extra_keys}"),
        }
    }
}

fn t(i: u32) -> TaskId {
    TaskId::new(TARGET, i)
}

/// Scale-out: each bucket moves to one of `new` with probability 1/`one_in`; every new task gets one.
fn spread(a: &[TaskId], new: &[TaskId], one_in: u64, rng: &mut SplitMix64) -> Vec<TaskId> {
    let mut out = a.to_vec();
    for x in out.iter_mut() {
        if rng.chance(1, one_in) {
            *x = new[rng.below(new.len())];
        }
    }
    for &n in new {
        if !out.contains(&n) {
            let b = rng.below(out.len());
            out[b] = n;
        }
    }
    for &old in a {
        // A scale-out keeps every old task alive.
        if !out.contains(&old)
            && let Some(b) = a.iter().position(|&x| x == old)
        {
            out[b] = old;
        }
    }
    out
}

/// Scale-in: keep `keep` random live tasks; buckets of the others go to random survivors.
fn shrink(a: &[TaskId], keep: usize, rng: &mut SplitMix64) -> Vec<TaskId> {
    let mut live: Vec<TaskId> = a.iter().copied().collect::<BTreeSet<_>>().into_iter().collect();
    while live.len() > keep {
        live.remove(rng.below(live.len()));
    }
    a.iter().map(|x| if live.contains(x) { *x } else { live[rng.below(live.len())] }).collect()
}
