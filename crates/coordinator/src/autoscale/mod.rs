//! The reconfiguration policy (`[autoscale]`, docs/architecture.md §7, "The reconfiguration policy"): decides *when* to
//! reconfigure the job's stateful operator and *how*, from the per-second metrics the
//! coordinator already gathers (one aggregator, [`crate::progress::SecondAggregator`], folds them
//! for the progress lines and for the policy). A sans-IO core ([`Autoscaler`]): seconds in, at
//! most one [`Decision`] out; the coordinator submits a decision's request through the path of
//! `koala rescale` and `POST /api/rescale` (`JobState::submit`), records it, and tells the core
//! when a reconfiguration runs ([`Autoscaler::busy`]).
//!
//! - **Busy time** of a task is summed over the whole window: the worker's `busy_ms` (processing,
//!   plus the capacity emulation's holds), and under the emulation at least `records / budget`.
//!   A task held at a second's boundary reports two seconds in one sample and none in the next;
//!   a per-second busy clamped at 100 % would halve such a saturated task.
//! - **Scale-out** (DS2, Kalavri et al., OSDI '18): when end-to-end latency p99 or source lag
//!   p99 stays above its target for a whole window. Each task's true processing rate is records
//!   in ÷ busy time; the input rate the job must sustain is the sources' output corrected by how
//!   fast their lag grows (a paced source that emits `r` records/s while its lag grows by `g` s
//!   per s is offered `r / (1 − g)`). The parallelism is demand ÷ (per-task rate ×
//!   `target_utilisation`), at most `max_parallelism`. Overloaded with enough tasks by that
//!   estimate while both the source lag and the end-to-end p99 fall: the policy waits (the
//!   backlog drains).
//! - **Skew**: overloaded with enough tasks by DS2 and the backlog not draining: the cause is
//!   skew, not capacity. The policy rebalances the most loaded task's hottest buckets ([`skew`])
//!   when that lowers the most loaded task's estimated load by at least 10 %; only when the load
//!   is already even does it add one task.
//! - **Hot task**: overloaded, one task's input ≥ `hot_factor` × the mean of the others', it
//!   saturated (≥ 80 % busy over the window) and they not (≤ 60 %): one rebalance instead of a
//!   scale-out.
//! - Both rebalances move the hot task's *hottest* buckets, by the per-bucket load the stateful
//!   tasks count (`metric::bucket_records`), to the coldest tasks until the estimated loads even
//!   out (greedy bin-packing; [`skew::plan`]).
//! - **Scale-in**: when mean utilisation stays below `scale_in_utilisation` for
//!   `scale_in_windows` windows, to the DS2 parallelism (at least `min_parallelism`).
//!
//! At most one decision per window: after one the window starts afresh, and seconds of a
//! running or queued reconfiguration, and `cooldown_s` after it, are never judged.

pub(crate) mod driver;
pub mod skew;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;

use koala_protocol::ReconfigRequest;

pub use crate::config::AutoscaleSection;

/// The largest lag growth (s per s) the demand estimate trusts: near 1 the source emits almost
/// nothing and `r / (1 − g)` is noise.
const MAX_LAG_SLOPE: f64 = 0.9;

/// One task of the driven operator in one second.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TaskSecond {
    /// Its index.
    pub index: u32,
    /// Records it took from its inputs.
    pub records_in: f64,
    /// Milliseconds it was busy ([`busy_ms`]); may exceed 1000 when its sample covers more than
    /// a second.
    pub busy_ms: f64,
    /// Records it processed per bucket (`metric::bucket_records`), buckets with records only.
    pub buckets: Vec<(u16, f64)>,
}

/// Busy milliseconds of a task's sample: its processing time (`processing_ms`: the worker's
/// `busy_ms`, or batches × mean batch latency from a worker that does not send it), or, under
/// the capacity emulation, at least the share of its budget its records used. Not clamped: a
/// sample may cover more than a second.
pub fn busy_ms(records_in: f64, processing_ms: f64, budget: Option<f64>) -> f64 {
    let emulated = budget.map_or(0.0, |b| records_in * 1000.0 / b);
    processing_ms.max(emulated).max(0.0)
}

/// One second of the job as the policy sees it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Second {
    /// Unix second.
    pub t: u64,
    /// Records the sources emitted.
    pub input_per_s: f64,
    /// Mean source lag, ms (mean over source tasks).
    pub lag_mean_ms: Option<f64>,
    /// Worst source task's p99 lag, ms.
    pub lag_p99_ms: Option<f64>,
    /// Worst sink's p99 end-to-end latency, ms.
    pub latency_p99_ms: Option<f64>,
    /// The driven operator's tasks that reported.
    pub tasks: Vec<TaskSecond>,
}

impl Second {
    /// Mean busy fraction over its tasks, each at most 1 (0 without any).
    pub fn utilisation(&self) -> f64 {
        if self.tasks.is_empty() {
            return 0.0;
        }
        self.tasks.iter().map(|t| (t.busy_ms / 1000.0).min(1.0)).sum::<f64>() / self.tasks.len() as f64
    }
}

/// What the policy decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecisionKind {
    /// More tasks.
    ScaleOut,
    /// Fewer tasks.
    ScaleIn,
    /// The same tasks, a hot task's buckets spread.
    Rebalance,
}

impl DecisionKind {
    /// `scale_out`, `scale_in` or `rebalance`.
    pub fn name(self) -> &'static str {
        match self {
            DecisionKind::ScaleOut => "scale_out",
            DecisionKind::ScaleIn => "scale_in",
            DecisionKind::Rebalance => "rebalance",
        }
    }
}

/// The figures of the window a decision was taken on.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WindowStats {
    /// First and last unix second of the window.
    pub from_t: u64,
    /// See `from_t`.
    pub to_t: u64,
    /// Tasks of the operator.
    pub parallelism: u32,
    /// Mean records/s the sources emitted.
    pub input_rate: f64,
    /// Source lag growth, s per s (mean lag's slope over the window).
    pub lag_slope: f64,
    /// End-to-end p99 growth, s per s (its slope over the window).
    pub latency_slope: f64,
    /// The input rate the job must sustain (DS2's target rate).
    pub demand_rate: f64,
    /// Lowest p99 end-to-end latency and source lag of the window, ms.
    pub latency_p99_min_ms: Option<f64>,
    /// See `latency_p99_min_ms`.
    pub lag_p99_min_ms: Option<f64>,
    /// Mean busy fraction of the tasks over the window.
    pub utilisation: f64,
    /// True processing rate of one task, records/s (Σ records ÷ Σ busy seconds).
    pub task_rate: Option<f64>,
    /// Mean records/s into each task over the window, by index.
    pub task_input: Vec<(u32, f64)>,
    /// Each task's busy fraction over the window (Σ busy ÷ the window's length, at most 1).
    pub task_busy: Vec<(u32, f64)>,
    /// Mean records/s of each bucket over the window (buckets with records), whichever task
    /// processed them.
    pub bucket_rate: Vec<(u16, f64)>,
}

impl std::fmt::Display for WindowStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.0} ms"));
        write!(
            f,
            "{} tasks, input {:.0}/s, lag {:+.2} s/s, e2e p99 {:+.2} s/s, demand {:.0}/s, e2e p99 ≥ {}, lag p99 ≥ {}, busy {:.0} %, task rate {}, per task [{}]",
            self.parallelism,
            self.input_rate,
            self.lag_slope,
            self.latency_slope,
            self.demand_rate,
            ms(self.latency_p99_min_ms),
            ms(self.lag_p99_min_ms),
            100.0 * self.utilisation,
            self.task_rate.map_or("-".to_string(), |r| format!("{r:.0}/s")),
            self.task_input.iter().map(|(i, r)| format!("{i}: {r:.0}/s")).collect::<Vec<_>>().join(", ")
        )
    }
}

/// One decision: the request to submit and why.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// The unix second of the window's last second.
    pub t: u64,
    /// What kind.
    pub kind: DecisionKind,
    /// The request, as `koala rescale` / `koala rebalance` would send it.
    pub request: ReconfigRequest,
    /// Why, in one line.
    pub reason: String,
    /// The window's figures.
    pub window: WindowStats,
}

/// The policy's state: the current window of judged seconds.
#[derive(Debug)]
pub struct Autoscaler {
    config: AutoscaleSection,
    operator: String,
    /// `[runtime] task_records_per_sec`, if set: the emulated capacity counts as busy time.
    budget: Option<f64>,
    window: VecDeque<Second>,
    /// Seconds up to this one are not judged (a reconfiguration ran, or a decision was taken).
    quiet_until: u64,
    /// Consecutive judged seconds with utilisation below `scale_in_utilisation`.
    idle_seconds: u64,
}

impl Autoscaler {
    /// A policy driving `operator` under `config`; `budget` is `[runtime] task_records_per_sec`.
    pub fn new(config: AutoscaleSection, operator: &str, budget: Option<f64>) -> Self {
        Self {
            config,
            operator: operator.to_string(),
            budget,
            window: VecDeque::new(),
            quiet_until: 0,
            idle_seconds: 0,
        }
    }

    /// The config it runs with.
    pub fn config(&self) -> &AutoscaleSection {
        &self.config
    }

    /// The emulated budget per task, if any.
    pub fn budget(&self) -> Option<f64> {
        self.budget
    }

    /// A reconfiguration runs or waits at unix second `now_s`: that second and `cooldown_s`
    /// after it are not judged, and the window starts afresh.
    pub fn busy(&mut self, now_s: u64) {
        self.quiet_until = self.quiet_until.max(now_s + self.config.cooldown_s);
        self.window.clear();
        self.idle_seconds = 0;
    }

    /// Judges one complete second; `routing` is the operator's bucket → task index table now and
    /// `live` its live tasks (not the cancelled ones a Koala job keeps while they serve state).
    pub fn on_second(&mut self, mut second: Second, routing: &[u32], live: &[u32]) -> Option<Decision> {
        second.tasks.retain(|t| live.contains(&t.index));
        if second.t <= self.quiet_until || second.tasks.is_empty() {
            return None;
        }
        let c = &self.config;
        if self.window.back().is_some_and(|b| second.t != b.t + 1) {
            // A gap (a second without the operator's samples): windows are consecutive seconds.
            self.window.clear();
        }
        let idle = second.utilisation() < c.scale_in_utilisation && !self.overloaded(&second);
        self.idle_seconds = if idle { self.idle_seconds + 1 } else { 0 };
        self.window.push_back(second);
        while self.window.len() as u64 > c.window_s {
            self.window.pop_front();
        }
        if (self.window.len() as u64) < c.window_s {
            return None;
        }
        let decision = self.decide(routing, live.len() as u32)?;
        let t = decision.t;
        self.busy(t);
        Some(decision)
    }

    fn overloaded(&self, s: &Second) -> bool {
        s.latency_p99_ms.is_some_and(|v| v > self.config.target_latency_ms)
            || s.lag_p99_ms.is_some_and(|v| v > self.config.lag_target_ms())
    }

    fn stats(&self, parallelism: u32) -> WindowStats {
        let w = &self.window;
        let n = w.len() as f64;
        let (from_t, to_t) = (w.front().map_or(0, |s| s.t), w.back().map_or(0, |s| s.t));
        let input_rate = w.iter().map(|s| s.input_per_s).sum::<f64>() / n;
        let lags: Vec<(f64, f64)> =
            w.iter().filter_map(|s| Some(((s.t - from_t) as f64, s.lag_mean_ms? / 1000.0))).collect();
        let lag_slope = slope(&lags).clamp(-MAX_LAG_SLOPE, MAX_LAG_SLOPE);
        let demand_rate = input_rate / (1.0 - lag_slope);
        let latencies: Vec<(f64, f64)> =
            w.iter().filter_map(|s| Some(((s.t - from_t) as f64, s.latency_p99_ms? / 1000.0))).collect();
        let latency_slope = slope(&latencies);
        let min_of = |f: fn(&Second) -> Option<f64>| w.iter().filter_map(f).reduce(f64::min);
        let mut per_task: std::collections::BTreeMap<u32, (f64, f64)> = Default::default();
        let mut buckets: std::collections::BTreeMap<u16, f64> = Default::default();
        for s in w {
            for t in &s.tasks {
                let e = per_task.entry(t.index).or_default();
                e.0 += t.records_in;
                e.1 += t.busy_ms / 1000.0;
                for (b, r) in &t.buckets {
                    *buckets.entry(*b).or_default() += r;
                }
            }
        }
        let (records, busy): (f64, f64) = per_task.values().fold((0.0, 0.0), |a, v| (a.0 + v.0, a.1 + v.1));
        // Sums over the window ÷ its length: a task whose samples jitter between seconds (two
        // seconds in one sample, none in the next) keeps its true mean.
        let task_busy: Vec<(u32, f64)> = per_task.iter().map(|(i, v)| (*i, (v.1 / n).min(1.0))).collect();
        WindowStats {
            from_t,
            to_t,
            parallelism,
            input_rate,
            lag_slope,
            latency_slope,
            demand_rate,
            latency_p99_min_ms: min_of(|s| s.latency_p99_ms),
            lag_p99_min_ms: min_of(|s| s.lag_p99_ms),
            utilisation: task_busy.iter().map(|t| t.1).sum::<f64>() / task_busy.len().max(1) as f64,
            task_rate: (busy > 0.0 && records > 0.0).then(|| records / busy),
            task_input: per_task.iter().map(|(i, v)| (*i, v.0 / n)).collect(),
            task_busy,
            bucket_rate: buckets.into_iter().map(|(b, r)| (b, r / n)).collect(),
        }
    }

    /// The DS2 parallelism for the window's demand.
    fn ds2(&self, stats: &WindowStats) -> Option<u32> {
        let rate = stats.task_rate?;
        let p = (stats.demand_rate / (rate * self.config.target_utilisation)).ceil();
        Some(p.clamp(1.0, f64::from(u32::MAX)) as u32)
    }

    fn decide(&self, routing: &[u32], parallelism: u32) -> Option<Decision> {
        let c = &self.config;
        let stats = self.stats(parallelism);
        let t = stats.to_t;
        let current = stats.parallelism;
        let operator = self.operator.clone();
        if self.window.iter().all(|s| self.overloaded(s)) {
            let over = format!(
                "e2e p99 or source lag p99 above {:.0}/{:.0} ms for {} s",
                c.target_latency_ms,
                c.lag_target_ms(),
                c.window_s
            );
            if let Some((request, why)) = skew::hot_rebalance(self, &stats, routing) {
                let reason = format!("{over}, and {why}");
                return Some(Decision { t, kind: DecisionKind::Rebalance, request, reason, window: stats });
            }
            let target = self.ds2(&stats);
            let how = match (target, stats.task_rate) {
                (Some(p), Some(rate)) => format!(
                    "DS2: demand {:.0}/s ÷ ({rate:.0}/s per task × {}) → {p} tasks",
                    stats.demand_rate, c.target_utilisation
                ),
                _ => "no processing rate measured: one task more".to_string(),
            };
            let parallelism = match target {
                Some(p) if p > current => p.min(c.max_parallelism),
                // Enough tasks by the estimate and the backlog drains: wait.
                Some(_) if stats.lag_slope < 0.0 && stats.latency_slope <= 0.0 => return None,
                // Enough tasks by the estimate, yet the backlog does not drain: skew, not
                // capacity. Spread the most loaded task's hottest buckets; only an even load
                // gets one task more (the estimate fell short).
                Some(_) => {
                    if let Some((request, why)) = skew::skew_rebalance(self, &stats, routing) {
                        let reason = format!(
                            "{over}; {how}, no more than run, yet the backlog does not drain: skew, not capacity; {why}"
                        );
                        return Some(Decision {
                            t,
                            kind: DecisionKind::Rebalance,
                            request,
                            reason,
                            window: stats,
                        });
                    }
                    current + 1
                }
                None => current + 1,
            };
            if current >= c.max_parallelism || parallelism <= current {
                return None;
            }
            let even = if target.is_some_and(|p| p <= current) {
                "; the backlog does not drain and the load is even: one task more"
            } else {
                ""
            };
            let reason = format!("{over}; {how}{even}; {current} → {parallelism}");
            let request = ReconfigRequest::Rescale { operator, parallelism };
            return Some(Decision { t, kind: DecisionKind::ScaleOut, request, reason, window: stats });
        }
        let idle_for = u64::from(c.scale_in_windows) * c.window_s;
        if self.idle_seconds >= idle_for && current > c.min_parallelism {
            let p = self.ds2(&stats)?.max(c.min_parallelism);
            if p >= current {
                return None;
            }
            let reason = format!(
                "busy below {:.0} % for {idle_for} s (now {:.0} %); DS2: demand {:.0}/s → {p} tasks; {current} → {p}",
                100.0 * c.scale_in_utilisation,
                100.0 * stats.utilisation,
                stats.demand_rate
            );
            let request = ReconfigRequest::Rescale { operator, parallelism: p };
            return Some(Decision { t, kind: DecisionKind::ScaleIn, request, reason, window: stats });
        }
        None
    }

    /// The operator it drives.
    pub fn operator(&self) -> &str {
        &self.operator
    }
}

/// Least-squares slope of `points` (0 with fewer than two).
fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    if points.len() < 2 {
        return 0.0;
    }
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    if sxx == 0.0 { 0.0 } else { sxy / sxx }
}
