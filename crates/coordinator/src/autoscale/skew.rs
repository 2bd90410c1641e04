//! Skew: which task is hot, and which of its buckets to move where. Estimates each task's load
//! (records/s it is offered: what it took, plus its share of the demand the saturated tasks did
//! not take), spreads it over its buckets by their measured rates (`metric::bucket_records`; even
//! when a task's buckets have no counts), and packs the hot task's hottest buckets onto the
//! coldest tasks until the loads even out ([`plan`]).

use std::collections::BTreeMap;

use koala_protocol::ReconfigRequest;

use super::{Autoscaler, WindowStats};

/// A task's busy fraction over the window above which it counts as saturated (a hot task).
/// Measured: on a loaded 2-core machine a hot task under Koala's on-demand fetches reached 88 %
/// of its budget.
pub const SATURATED: f64 = 0.8;
/// The others' mean busy fraction at most, for one task to count as hot.
pub const OTHERS_IDLE: f64 = 0.6;
/// The least share by which a skew rebalance must lower the most loaded task's estimated load;
/// below it the load counts as even.
pub const MIN_GAIN: f64 = 0.1;

/// Moves of one rebalance: buckets and the task they go to.
pub type Moves = Vec<(Vec<u16>, u32)>;

/// The window's load estimate: per task its offered records/s, per bucket its records/s.
#[derive(Debug, Clone, PartialEq)]
pub struct Load {
    /// Task index → estimated offered records/s.
    pub tasks: BTreeMap<u32, f64>,
    /// Bucket → estimated offered records/s (every bucket in `routing` owned by a task of
    /// `tasks`).
    pub buckets: Vec<f64>,
    /// Whether the buckets' split came from per-bucket counts (else: even over each task's).
    pub measured: bool,
}

impl Load {
    /// The estimate of `stats` under `routing` (bucket → task). A saturated task (busy ≥
    /// [`SATURATED`]) took less than it was offered: the demand no task took is added to the
    /// saturated tasks in proportion to what they took.
    pub fn estimate(stats: &WindowStats, routing: &[u32]) -> Self {
        let busy = |i: u32| stats.task_busy.iter().find(|t| t.0 == i).map_or(0.0, |t| t.1);
        let taken: f64 = stats.task_input.iter().map(|t| t.1).sum();
        let saturated: f64 = stats.task_input.iter().filter(|t| busy(t.0) >= SATURATED).map(|t| t.1).sum();
        let hidden = (stats.demand_rate - taken).max(0.0);
        let tasks: BTreeMap<u32, f64> = stats
            .task_input
            .iter()
            .map(|&(i, r)| {
                let extra =
                    if saturated > 0.0 && busy(i) >= SATURATED { hidden * r / saturated } else { 0.0 };
                (i, r + extra)
            })
            .collect();
        let mut measured_rate = vec![0.0; routing.len()];
        for &(b, r) in &stats.bucket_rate {
            if let Some(m) = measured_rate.get_mut(usize::from(b)) {
                *m = r;
            }
        }
        let mut buckets = vec![0.0; routing.len()];
        let mut measured = true;
        for (&task, &load) in &tasks {
            let owned: Vec<usize> = (0..routing.len()).filter(|b| routing[*b] == task).collect();
            let sum: f64 = owned.iter().map(|b| measured_rate[*b]).sum();
            for &b in &owned {
                buckets[b] = if sum > 0.0 {
                    load * measured_rate[b] / sum
                } else {
                    measured &= load == 0.0;
                    load / owned.len() as f64
                };
            }
        }
        Self { tasks, buckets, measured }
    }

    /// The most loaded task and its load.
    pub fn hottest(&self) -> Option<(u32, f64)> {
        self.tasks.iter().map(|(i, l)| (*i, *l)).max_by(|a, b| a.1.total_cmp(&b.1).then(b.0.cmp(&a.0)))
    }
}

/// Greedy bin-packing: moves `from`'s buckets, hottest first, each to the then coldest other
/// task when that lowers the larger of the two loads, until `from` is no longer the most loaded
/// task. Returns the moves (by target, ascending) and the loads after them.
pub fn plan(load: &Load, from: u32, routing: &[u32]) -> (Moves, BTreeMap<u32, f64>) {
    let mut loads = load.tasks.clone();
    let mut owned: Vec<(u16, f64)> = (0..routing.len())
        .filter(|b| routing[*b] == from)
        .filter_map(|b| Some((u16::try_from(b).ok()?, load.buckets[b])))
        .collect();
    owned.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut moves: BTreeMap<u32, Vec<u16>> = BTreeMap::new();
    for (b, rate) in owned {
        let others = loads.iter().filter(|(i, _)| **i != from).map(|(i, l)| (*i, *l));
        let Some(max_other) = others.clone().map(|o| o.1).reduce(f64::max) else { break };
        let own = loads.get(&from).copied().unwrap_or(0.0);
        if own <= max_other {
            break;
        }
        let Some((cold, cold_load)) = others.min_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0))) else {
            break;
        };
        if rate > 0.0 && cold_load + rate < own {
            loads.insert(from, own - rate);
            loads.insert(cold, cold_load + rate);
            moves.entry(cold).or_default().push(b);
        }
    }
    let moves = moves
        .into_iter()
        .map(|(to, mut buckets)| {
            buckets.sort_unstable();
            (buckets, to)
        })
        .collect();
    (moves, loads)
}

fn loads_text(loads: &BTreeMap<u32, f64>) -> String {
    loads.iter().map(|(i, l)| format!("{i}: {l:.0}/s")).collect::<Vec<_>>().join(", ")
}

/// What a plan does, in words.
fn describe(load: &Load, from: u32, moves: &Moves, after: &BTreeMap<u32, f64>) -> String {
    let moved: Vec<u16> = moves.iter().flat_map(|m| m.0.iter().copied()).collect();
    let rate: f64 = moved.iter().map(|b| load.buckets[usize::from(*b)]).sum();
    format!(
        "task {from}'s {} hottest bucket(s) ({rate:.0}/s by {}) move to the coldest tasks; estimated loads [{}] → [{}]",
        moved.len(),
        if load.measured { "their measured rates" } else { "an even split (no per-bucket counts)" },
        loads_text(&load.tasks),
        loads_text(after)
    )
}

/// A rebalance of a hot task's buckets, if one task is hot in the window: its input ≥
/// `hot_factor` × the others' mean, it saturated, they not.
pub fn hot_rebalance(
    policy: &Autoscaler,
    stats: &WindowStats,
    routing: &[u32],
) -> Option<(ReconfigRequest, String)> {
    if stats.task_input.len() < 2 {
        return None;
    }
    let busy = |i: u32| stats.task_busy.iter().find(|t| t.0 == i).map_or(0.0, |t| t.1);
    let (hot, hot_in) = stats.task_input.iter().copied().max_by(|a, b| a.1.total_cmp(&b.1))?;
    let others: Vec<(u32, f64)> = stats.task_input.iter().copied().filter(|(i, _)| *i != hot).collect();
    let others_in = others.iter().map(|o| o.1).sum::<f64>() / others.len() as f64;
    let others_busy = others.iter().map(|o| busy(o.0)).sum::<f64>() / others.len() as f64;
    let hot_busy = busy(hot);
    if hot_in < policy.config.hot_factor * others_in || hot_busy < SATURATED || others_busy > OTHERS_IDLE {
        return None;
    }
    let load = Load::estimate(stats, routing);
    let (moves, after) = plan(&load, hot, routing);
    if moves.is_empty() {
        return None;
    }
    let why = format!(
        "task {hot} is hot: {hot_in:.0}/s at {:.0} % busy against {others_in:.0}/s at {:.0} % for the others; {}",
        100.0 * hot_busy,
        100.0 * others_busy,
        describe(&load, hot, &moves, &after)
    );
    Some((ReconfigRequest::Rebalance { operator: policy.operator.clone(), moves }, why))
}

/// A rebalance of the most loaded task when DS2 finds enough tasks yet the backlog does not
/// drain: when packing its hottest buckets onto the coldest tasks lowers the most loaded task's
/// estimated load by at least [`MIN_GAIN`]. `None`: the load is even.
pub fn skew_rebalance(
    policy: &Autoscaler,
    stats: &WindowStats,
    routing: &[u32],
) -> Option<(ReconfigRequest, String)> {
    if stats.task_input.len() < 2 {
        return None;
    }
    let load = Load::estimate(stats, routing);
    let (hot, before) = load.hottest()?;
    let (moves, after) = plan(&load, hot, routing);
    let max_after = after.values().copied().reduce(f64::max)?;
    if moves.is_empty() || max_after > (1.0 - MIN_GAIN) * before {
        return None;
    }
    let why = format!("task {hot} is the most loaded; {}", describe(&load, hot, &moves, &after));
    Some((ReconfigRequest::Rebalance { operator: policy.operator.clone(), moves }, why))
}
