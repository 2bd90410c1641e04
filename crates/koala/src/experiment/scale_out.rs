//! The §5.2 setting (Figures 6–7) on the keyed aggregate — `scale-out` — and the same run under
//! the two DRRS schedules (Figure 16) — `drrs-schedules` — plus [`Surge`], the phase schedule
//! every scale-out experiment shares: warm state restored into every run; phase 1 at 70 % of the
//! emulated capacity, phase 2 at twice that (a backlog forms), then a scale-out that doubles the
//! target's tasks while the surge goes on (phase 3).
//!
//! The link cap is chosen so that moving the state takes as long, relative to the run, as in the
//! paper: stop-and-restart paused ~45 s of a 10-minute run (7.5 %) for its 4 → 8 scale-out
//! (Figure 22). As there, every new task runs on a machine of its own — one worker per task after
//! the scale-out, so each new task's state crosses its worker's link — and every task gets an
//! equal share of the buckets, so the added capacity is real: the cap = one new task's share of
//! the state / (7.5 % of the run). Every run gets the same policy and cache size
//! (`crate::settings`): interleaved without DRRS (doubling moves exactly the new tasks' shares),
//! uniform (contiguous ranges, which DRRS requires; old tasks also exchange buckets) with it, or
//! `--partition-policy`.

use koala_coordinator::config::PolicyName;

use super::engine::{Done, Plan, RunSpec};
use super::scenario::{Scenario, Step};
use super::{Info, Mode, Runner};

/// Fraction of the run the paper's stop-and-restart paused for its scale-out (45 s of 600 s).
pub const PAUSE_FRACTION: f64 = 45.0 / 600.0;

/// The §5.2 phases and tasks.
#[derive(Clone, Copy, Debug)]
pub struct Surge {
    /// Seconds of phase 1 (70 %), phase 2 (the 2× surge), phase 3 (after the scale-out).
    pub phases_s: [u64; 3],
    /// The target's tasks before and after.
    pub tasks: (u32, u32),
    /// Emulated records/s of one stateful task.
    pub task_records_per_sec: f64,
}

impl Surge {
    /// Seconds the sources run.
    pub fn duration_s(&self) -> u64 {
        self.phases_s.iter().sum()
    }

    /// When the scale-out starts.
    pub fn at_s(&self) -> f64 {
        (self.phases_s[0] + self.phases_s[1]) as f64
    }

    /// Phase 1's rate, then twice it from phase 2 on.
    pub fn rates(&self) -> Vec<(f64, f64)> {
        let base = 0.7 * f64::from(self.tasks.0) * self.task_records_per_sec;
        vec![(0.0, base), (self.phases_s[0] as f64, 2.0 * base)]
    }

    /// The link cap (MB/s) that makes a new task's share of `state_bytes` take
    /// [`PAUSE_FRACTION`] of the run to cross its worker's link.
    pub fn link_mb_per_sec(&self, state_bytes: f64) -> f64 {
        let pause_s = PAUSE_FRACTION * self.duration_s() as f64;
        let per_link = state_bytes / f64::from(self.tasks.1);
        ((per_link / 1e6 / pause_s * 10.0).round() / 10.0).max(0.1)
    }

    /// One line for the settings.
    pub fn line(&self, operator: &str, state_bytes: f64) -> String {
        format!(
            "phases {:?} s (70 % of capacity, then 2×, then a scale-out of {operator} {} → {} at {} s), \
             one worker per task after it, task_records_per_sec = {}, link_mb_per_sec = {} per worker \
             (a new task's share of {} crosses it in {:.1} s = {:.1} % of the run, as the paper's stop-and-restart pause)",
            self.phases_s,
            self.tasks.0,
            self.tasks.1,
            self.at_s(),
            self.task_records_per_sec,
            self.link_mb_per_sec(state_bytes),
            crate::human::human_bytes(state_bytes as u64),
            PAUSE_FRACTION * self.duration_s() as f64,
            PAUSE_FRACTION * 100.0
        )
    }
}

/// The keyed aggregate's §5.2 setting of a mode: (surge, warm keys, value bytes).
fn aggregate_setup(mode: Mode) -> (Surge, u64, usize) {
    mode.pick(
        (Surge { phases_s: [2, 2, 5], tasks: (1, 2), task_records_per_sec: 4_000.0 }, 4_000, 512),
        // 256 MB, 55 s per protocol (the full variant's phases at 0.09×, phase 3 a little
        // longer so that stop-and-restart's recovery is seen): four protocols in ≤ 5 minutes.
        (Surge { phases_s: [15, 12, 28], tasks: (2, 4), task_records_per_sec: 10_000.0 }, 125_000, 2048),
        // 1 GB, 10 minutes per protocol (the paper's run length), 4 → 8 tasks (its scale-out).
        (Surge { phases_s: [120, 60, 420], tasks: (4, 8), task_records_per_sec: 7_500.0 }, 500_000, 2048),
    )
}

/// The keyed aggregate under `surge` with `warm_keys` of `value_bytes`: 1 000 hot keys take 30 %
/// of the records, the rest a window of `active_keys` moving one key every 500 records (0 = all
/// keys active).
pub fn aggregate(
    surge: Surge,
    warm_keys: u64,
    value_bytes: usize,
    active_keys: u64,
    hot_ratio: f64,
) -> Scenario {
    let state = warm_keys as f64 * value_bytes as f64;
    Scenario {
        query: "keyed-aggregate",
        params: "sink = \"discard\"".into(),
        param_tables: format!(
            "[params.generator]\nkey_space = {warm_keys}\nhot_keys = {}\nhot_key_ratio = {hot_ratio}\n\
             active_keys = {active_keys}\nactive_shift_records = 500\nseed = 7\n",
            1000.min(warm_keys)
        ),
        source: "max_disorder_ms = 50\nwatermark_interval_ms = 200\n".into(),
        parallelism: vec![("source", 2), ("aggregate", surge.tasks.0), ("sink", 1)],
        target: "aggregate",
        workers: surge.tasks.1,
        duration_s: surge.duration_s(),
        steps: vec![Step::Rescale { at_s: surge.at_s(), operator: "aggregate".into(), tasks: surge.tasks.1 }],
        rates: surge.rates(),
        task_records_per_sec: surge.task_records_per_sec,
        link_mb_per_sec: Some(surge.link_mb_per_sec(state)),
        extra_keys: None,
        warm_keys,
        value_bytes,
    }
}

fn plan(mode: Mode, protocols: &[String]) -> anyhow::Result<Plan> {
    let (surge, keys, bytes) = aggregate_setup(mode);
    let scenario = aggregate(surge, keys, bytes, 10_000.min(keys), 0.3);
    let state = keys as f64 * bytes as f64;
    Ok(Plan {
        settings: vec![
            format!(
                "keyed-aggregate: {keys} warm keys × {bytes} B = {}; 1 000 hot keys take 30 % of the records, the rest a window of {} keys moving one key every 500 records",
                crate::human::human_bytes(state as u64),
                10_000.min(keys)
            ),
            surge.line("aggregate", state),
            format!("offered: {}", scenario.rates_line()),
        ],
        runs: RunSpec::per_protocol(protocols, "keyed-aggregate", &scenario),
        default_policy: PolicyName::Interleaved,
        policy_required: false,
        measured_step: 0,
        per_task_of: None,
        conclude: against_stop_and_restart,
    })
}

/// Koala's recovery and state moved against stop-and-restart's in each group where both ran.
pub fn against_stop_and_restart(done: &[Done]) -> Vec<String> {
    let mut lines = Vec::new();
    for (group, runs) in super::engine::groups(done) {
        let ran = |p: &str| runs.iter().find(|d| d.report.run.protocol == p).copied();
        let Some(k) = ran("koala") else { continue };
        let rec = |d: &Done| d.measured(0).and_then(|c| c.recovery_s);
        for other in ["stop-and-restart", "remote", "drrs", "drrs-overlapping"] {
            let Some(o) = ran(other) else { continue };
            let mut parts = Vec::new();
            if let (Some(a), Some(b)) = (rec(k), rec(o)) {
                // Without a backlog at the start (no surge) the limit is 0 s: no ratio to give.
                let limit = match k.measured(0).and_then(|c| c.drain_limit).and_then(|l| l.seconds()) {
                    Some(l) if l >= 1.0 => {
                        format!(", drain limit {l:.0} s: {:.1}× and {:.1}× of it", a as f64 / l, b as f64 / l)
                    }
                    Some(l) => format!(", drain limit {l:.0} s"),
                    None => String::new(),
                };
                parts.push(format!(
                    "recovery (e2e p99) {a} s vs {b} s ({:.2}×{limit})",
                    a as f64 / (b as f64).max(1.0)
                ));
            }
            if o.report.state_moved.total() > 0.0 {
                parts.push(format!(
                    "state moved {:.3} of {other}'s ({} less)",
                    k.report.state_moved.total() / o.report.state_moved.total(),
                    if k.report.state_moved.total() > 0.0 {
                        format!("{:.1}×", o.report.state_moved.total() / k.report.state_moved.total())
                    } else {
                        "∞×".into()
                    }
                ));
            }
            if let (Some(a), Some(b)) = (k.latency.1, o.latency.1) {
                parts.push(format!(
                    "per-batch latency after {:.0} vs {:.0} µs ({:+.0} %)",
                    a,
                    b,
                    (a / b - 1.0) * 100.0
                ));
            }
            if !parts.is_empty() {
                lines.push(format!("{group}: koala vs {other}: {}", parts.join("; ")));
            }
        }
    }
    lines
}

/// `koala experiment scale-out`.
pub const SCALE_OUT: Info = Info {
    name: "scale-out",
    figure: "Figures 6-7 (keyed aggregate)",
    shows: "the §5.2 setting on the keyed aggregate: 70 % load, a 2× surge, then a scale-out under each protocol; recovery on the end-to-end p99 beside its drain limit, state moved, per-batch latency",
    quick: "256 MB warm, 2 → 4 tasks at 27 s, 55 s per run (phases 15 / 12 / 28 s): about 4.5 minutes for the four protocols",
    full: "1 GB warm, 4 → 8 tasks, 10 minutes per run: about 45 minutes",
    protocols: super::ALL4,
    runner: Runner::Jobs(plan),
};

fn drrs_plan(mode: Mode, protocols: &[String]) -> anyhow::Result<Plan> {
    super::only("drrs-schedules", protocols, &["drrs", "drrs-overlapping", "koala"])?;
    let mut p = plan(mode, protocols)?;
    p.settings.push(
        "drrs = the Koala authors' port (subscales one after another); drrs-overlapping = the original DRRS's schedule (single-pair subscales, about two per pair, several at once)".into(),
    );
    p.conclude = |done| {
        let ran = |p: &str| done.iter().find(|d| d.report.run.protocol == p);
        match (ran("drrs"), ran("drrs-overlapping")) {
            (Some(a), Some(b)) => {
                let reconf = |d: &Done| {
                    d.measured(0)
                        .and_then(|c| Some(c.end_s? - c.start_s))
                        .map_or("not completed".to_string(), |s| format!("{s:.1} s"))
                };
                vec![format!(
                    "reconfiguration took {} (ported) vs {} (overlapping); state moved {} vs {}",
                    reconf(a),
                    reconf(b),
                    crate::human::human_bytes(a.report.state_moved.total() as u64),
                    crate::human::human_bytes(b.report.state_moved.total() as u64)
                )]
            }
            _ => Vec::new(),
        }
    };
    Ok(p)
}

/// `koala experiment drrs-schedules`.
pub const DRRS_SCHEDULES: Info = Info {
    name: "drrs-schedules",
    figure: "Figure 16",
    shows: "DRRS as the Koala authors ported it vs the original DRRS's overlapping schedule, in the scale-out setting on the keyed aggregate",
    quick: "256 MB warm, 2 → 4 tasks at 27 s, 55 s per run: about 2.5 minutes",
    full: "1 GB warm, 4 → 8 tasks, 10 minutes per run: about 22 minutes",
    protocols: &["drrs", "drrs-overlapping"],
    runner: Runner::Jobs(drrs_plan),
};
