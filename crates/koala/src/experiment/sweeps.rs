//! The §5.4 microbenchmarks and Appendix D.5 on the keyed aggregate, whose generator sets the
//! key space, the active window and the hot-key ratio directly (the paper uses Q6*, whose
//! Nexmark source it configures likewise):
//! - `state-growth` (Figure 13): total state grows 8× at a fixed working set; Koala's recovery
//!   and state moved should stay flat; each run's seconds short of CPU before the scale-out are
//!   counted, since a task the machine starves enters the scale-out with a backlog its state
//!   size did not make;
//! - `hot-keys` (Figure 15): the active key space, then the hot-key ratio, swept;
//! - `uniform` (Figure 22): every key equally likely, Koala's worst case, at a fixed sustainable
//!   rate, against stop-and-restart and DRRS (on Azure, whose state keeps its padding).

use anyhow::Context as _;
use koala_coordinator::config::PolicyName;
use koala_coordinator::metrics_store::MetricsStore;

use super::engine::{Done, Plan, RunSpec};
use super::scale_out::{Surge, against_stop_and_restart, aggregate};
use super::{Info, Mode, Runner};

const BYTES: usize = 2048;

fn surge(mode: Mode) -> Surge {
    mode.pick(
        Surge { phases_s: [2, 2, 4], tasks: (1, 2), task_records_per_sec: 4_000.0 },
        Surge { phases_s: [10, 8, 22], tasks: (2, 4), task_records_per_sec: 10_000.0 },
        Surge { phases_s: [120, 60, 420], tasks: (4, 8), task_records_per_sec: 7_500.0 },
    )
}

fn growth_plan(mode: Mode, protocols: &[String]) -> anyhow::Result<Plan> {
    super::only("state-growth", protocols, &["koala"])?;
    let s = surge(mode);
    let base: u64 = mode.pick(1_000, 16_000, 125_000);
    let active = mode.pick(500, 5_000, 10_000);
    // One link for every run: the smallest state's, so the emulation does not change with it.
    let link = s.link_mb_per_sec(base as f64 * BYTES as f64);
    let runs = [1u64, 2, 4, 8]
        .iter()
        .map(|f| {
            let keys = base * f;
            let mut scenario = aggregate(s, keys, BYTES, active, 0.3);
            scenario.link_mb_per_sec = Some(link);
            RunSpec {
                label: format!("{} state", crate::human::human_bytes(keys * BYTES as u64)),
                group: "keyed-aggregate".into(),
                protocol: "koala".into(),
                scenario,
            }
        })
        .collect();
    Ok(Plan {
        settings: vec![
            format!(
                "keyed-aggregate: {base}, {}, {} and {} warm keys × {BYTES} B (1×, 2×, 4×, 8×); the same working set in every run: 1 000 hot keys at 30 % of the records, a window of {active} keys moving one key every 500 records",
                base * 2,
                base * 4,
                base * 8
            ),
            s.line("aggregate", base as f64 * BYTES as f64),
            format!("one link cap for every run ({link} MB/s, from the smallest state)"),
        ],
        runs,
        default_policy: PolicyName::Interleaved,
        policy_required: false,
        measured_step: 0,
        per_task_of: None,
        conclude: flat,
    })
}

/// Seconds before the measured scale-out (from second 1, the first whole one) in which a task
/// of the experiment's operator could not reach its emulated capacity: its measured capacity
/// (`capacity_records_per_sec`, records per second of batch wall time) below
/// `task_records_per_sec`, or no sample at all (under half the budget processed: with the
/// offered rate at ≥ 70 % of the capacity before the scale-out, a task that processes less
/// than half is stalled, not idle). Returns the seconds and the lowest capacity sampled.
/// Such a task builds a backlog the scale-out then has to clear, so the run's recovery measures
/// what the machine left it, whatever its state size (2026-12-03: the same 31 MiB and 250 MiB
/// runs, alternated at load 12–13, recovered in > 20 / > 20 s and 20 / 7 s).
fn short_of_cpu(d: &Done) -> anyhow::Result<Shortfall> {
    let Some(budget) = d.config.runtime.task_records_per_sec else { return Ok((0, None)) };
    let Some(start) = d.measured(0).map(|r| r.start_t_s) else { return Ok((0, None)) };
    let operator = d.spec.scenario.target;
    let tasks = d.spec.scenario.parallelism.iter().find(|(o, _)| *o == operator).map_or(0, |(_, n)| *n);
    let db = d.config.metrics_path();
    let store = MetricsStore::open(&db).with_context(|| format!("opening {}", db.display()))?;
    let samples = store.task_samples(&d.report.run.run, koala_types::metric::CAPACITY_RECORDS_PER_SEC)?;
    let start_s = (d.report.run.started_ms / 1000) as i64;
    Ok(shortfall_before(&samples, start_s, operator, tasks, start, budget))
}

/// Seconds short of CPU and the lowest capacity sampled, records/s ([`short_of_cpu`]).
type Shortfall = (u64, Option<f64>);

/// [`short_of_cpu`] over capacity samples `(task, unix s, records/s)` of a run started at unix
/// second `start_s`: tasks `operator.0 .. operator.{tasks - 1}`, seconds `1 .. before`.
fn shortfall_before(
    samples: &[(String, u64, f64)],
    start_s: i64,
    operator: &str,
    tasks: u32,
    before: i64,
    budget: f64,
) -> Shortfall {
    let mut short = 0;
    let mut lowest: Option<f64> = None;
    for t in 1..before {
        let mut second_short = false;
        for task in (0..tasks).map(|i| format!("{operator}.{i}")) {
            let sample = samples.iter().find(|(n, at, _)| *n == task && *at as i64 - start_s == t);
            match sample {
                Some((_, _, c)) => {
                    lowest = Some(lowest.map_or(*c, |l| l.min(*c)));
                    second_short |= *c < budget;
                }
                None => second_short = true,
            }
        }
        short += u64::from(second_short);
    }
    (short, lowest)
}

/// Koala's recovery and state moved across the state sizes: the spread (max / min − 1); and
/// which runs were short of CPU before the scale-out ([`short_of_cpu`]), with the spread of
/// the others.
fn flat(done: &[Done]) -> Vec<String> {
    let rec: Vec<u64> = done.iter().filter_map(|d| d.measured(0).and_then(|c| c.recovery_s)).collect();
    let moved: Vec<f64> = done.iter().map(|d| d.report.state_moved.total()).collect();
    let spread = |v: &[f64]| {
        let (lo, hi) = v.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), x| (lo.min(*x), hi.max(*x)));
        if lo > 0.0 { Some((hi / lo - 1.0) * 100.0) } else { None }
    };
    let mut lines = vec![format!(
        "recovery per state size: {} (spread {}; the paper's claim: flat, ≤ 20 %)",
        done.iter()
            .map(|d| format!(
                "{} {}",
                d.spec.label,
                d.measured(0).and_then(|c| c.recovery_s).map_or("not seen".into(), |s| format!("{s} s"))
            ))
            .collect::<Vec<_>>()
            .join(", "),
        if rec.len() == done.len() {
            spread(&rec.iter().map(|r| *r as f64).collect::<Vec<_>>())
                .map_or("-".into(), |s| format!("{s:.0} %"))
        } else {
            "- (a recovery was not seen)".into()
        }
    )];
    let short: Vec<(&Done, anyhow::Result<Shortfall>)> = done.iter().map(|d| (d, short_of_cpu(d))).collect();
    lines.push(format!(
        "seconds before the scale-out with a task short of CPU (measured capacity below its emulated one, or no sample: under half of it processed): {}",
        short
            .iter()
            .map(|(d, s)| match s {
                Ok((0, _)) => format!("{} none", d.spec.label),
                Ok((n, low)) => format!(
                    "{} {n} s (lowest {})",
                    d.spec.label,
                    low.map_or("no sample".into(), |l| format!("{l:.0} records/s"))
                ),
                Err(e) => format!("{} unknown ({e:#})", d.spec.label),
            })
            .collect::<Vec<_>>()
            .join(", ")
    ));
    let fed: Vec<&Done> = short.iter().filter(|(_, s)| matches!(s, Ok((0, _)))).map(|(d, _)| *d).collect();
    if fed.len() < done.len() {
        let rec: Vec<f64> =
            fed.iter().filter_map(|d| d.measured(0).and_then(|c| c.recovery_s)).map(|r| r as f64).collect();
        lines.push(format!(
            "a run short of CPU before the scale-out enters it with a backlog the state size did not make: its recovery measures the machine; recovery spread over the {} run(s) that were not: {}",
            fed.len(),
            if fed.len() < 2 || rec.len() < fed.len() {
                "- (fewer than two, or a recovery not seen)".to_string()
            } else {
                spread(&rec).map_or("-".into(), |s| format!("{s:.0} %"))
            }
        ));
    }
    lines.push(format!(
        "state moved per state size: {} (spread {})",
        moved.iter().map(|m| crate::human::human_bytes(*m as u64)).collect::<Vec<_>>().join(", "),
        spread(&moved).map_or("-".into(), |s| format!("{s:.0} %"))
    ));
    lines
}

/// `koala experiment state-growth`.
pub const STATE_GROWTH: Info = Info {
    name: "state-growth",
    figure: "Figure 13",
    shows: "Koala's scale-out as total state grows 8× at a fixed working set: recovery and state moved should stay flat",
    quick: "32 MB → 256 MB warm, 2 → 4 tasks, 40 s per run, 4 runs: about 3.5 minutes",
    full: "250 MB → 2 GB warm, 4 → 8 tasks, 10 minutes per run: about 42 minutes",
    protocols: &["koala"],
    runner: Runner::Jobs(growth_plan),
};

fn hot_plan(mode: Mode, protocols: &[String]) -> anyhow::Result<Plan> {
    super::only("hot-keys", protocols, &["koala"])?;
    let s = surge(mode);
    let keys: u64 = mode.pick(4_000, 128_000, 500_000);
    let actives: Vec<u64> =
        mode.pick(vec![400, 1_600], vec![5_000, 20_000, 80_000], vec![12_500, 25_000, 50_000, 100_000]);
    let ratios: Vec<f64> = mode.pick(vec![0.0], vec![0.0, 0.75], vec![0.0, 0.5, 0.75]);
    let fixed_active = actives[actives.len() / 2];
    let mut runs: Vec<RunSpec> = actives
        .iter()
        .map(|a| RunSpec {
            label: format!("active {a}, hot 25 %"),
            group: "active key space".into(),
            protocol: "koala".into(),
            scenario: aggregate(s, keys, BYTES, *a, 0.25),
        })
        .collect();
    runs.extend(ratios.iter().map(|r| RunSpec {
        label: format!("active {fixed_active}, hot {:.0} %", r * 100.0),
        group: "hot-key ratio".into(),
        protocol: "koala".into(),
        scenario: aggregate(s, keys, BYTES, fixed_active, *r),
    }));
    Ok(Plan {
        settings: vec![
            format!(
                "keyed-aggregate, {keys} warm keys × {BYTES} B; (a) active key space {actives:?} at a 25 % hot-key ratio; (b) hot-key ratio {ratios:?} at {fixed_active} active keys (its 25 % run is (a)'s); 1 000 hot keys"
            ),
            s.line("aggregate", keys as f64 * BYTES as f64),
        ],
        runs,
        default_policy: PolicyName::Interleaved,
        policy_required: false,
        measured_step: 0,
        per_task_of: None,
        conclude: |done| {
            done.iter()
                .map(|d| {
                    let start = d.measured(0).map_or(0, |c| c.start_t_s);
                    let last =
                        d.report.table.rows.iter().filter(|r| r.state_bytes_moved > 0.0).map(|r| r.t_s).max();
                    format!(
                        "{}: moved {}, state moved for {} after the scale-out started, recovery {}",
                        d.spec.label,
                        crate::human::human_bytes(d.report.state_moved.total() as u64),
                        last.map_or("0 s".into(), |t| format!("{} s", t - start)),
                        d.measured(0)
                            .and_then(|c| c.recovery_s)
                            .map_or("not seen".into(), |s| format!("{s} s"))
                    )
                })
                .collect()
        },
    })
}

/// `koala experiment hot-keys`.
pub const HOT_KEYS: Info = Info {
    name: "hot-keys",
    figure: "Figure 15",
    shows: "Koala's scale-out as the active key space grows and as the hot-key ratio grows: state moved and how long it kept moving",
    quick: "256 MB warm, 2 → 4 tasks, 40 s per run, 5 runs: about 4.5 minutes",
    full: "1 GB warm, 4 → 8 tasks, 10 minutes per run, 7 runs: about 75 minutes",
    protocols: &["koala"],
    runner: Runner::Jobs(hot_plan),
};

fn uniform_plan(mode: Mode, protocols: &[String]) -> anyhow::Result<Plan> {
    let s = mode.pick(
        Surge { phases_s: [3, 0, 6], tasks: (1, 2), task_records_per_sec: 4_000.0 },
        Surge { phases_s: [20, 0, 45], tasks: (2, 4), task_records_per_sec: 10_000.0 },
        Surge { phases_s: [180, 0, 420], tasks: (4, 8), task_records_per_sec: 7_500.0 },
    );
    let keys: u64 = mode.pick(4_000, 64_000, 500_000);
    // A large-state query, as the paper's (Q6*, Appendix D.5), not the keyed aggregate. It
    // moved here when the aggregate still shed its warm padding on a key's first record (under
    // uniform access every key shrank before the scale-out); the aggregate keeps it now, but the
    // figure is not about the aggregate.
    let azure = super::queries::QUERIES.iter().find(|q| q.name == "Azure").expect("Azure is listed");
    let mut scenario = super::queries::scenario(azure, s, keys, BYTES);
    scenario.param_tables =
        format!("[params.generator]\nkeys = {keys}\nactive_keys = {keys}\nhot_ratio = 0.0\n");
    // No surge: a fixed rate the old tasks sustain (70 % of their capacity).
    scenario.rates.truncate(1);
    let runs = RunSpec::per_protocol(protocols, "uniform", &scenario);
    Ok(Plan {
        settings: vec![
            format!(
                "Azure (cpu_stats: the last 80 readings per VM and {BYTES} B of padding), {keys} warm keys × {BYTES} B = {}, every key equally likely (active_keys = keys: the whole key space; hot-key ratio 0)",
                crate::human::human_bytes(keys * BYTES as u64)
            ),
            format!(
                "a fixed rate of {}, scale-out {} → {} at {} s, run {} s; task_records_per_sec = {}, link_mb_per_sec = {}",
                scenario.rates_line(),
                s.tasks.0,
                s.tasks.1,
                s.at_s(),
                s.duration_s(),
                s.task_records_per_sec,
                s.link_mb_per_sec(keys as f64 * BYTES as f64)
            ),
        ],
        runs,
        default_policy: PolicyName::Interleaved,
        policy_required: false,
        measured_step: 0,
        per_task_of: None,
        conclude: against_stop_and_restart,
    })
}

/// `koala experiment uniform`.
pub const UNIFORM: Info = Info {
    name: "uniform",
    figure: "Figure 22",
    shows: "uniform access over the whole key space of Azure, Koala's worst case, at a fixed sustainable rate: Koala vs stop-and-restart vs DRRS",
    quick: "128 MB warm, 2 → 4 tasks at 20 s, 65 s per run, 3 runs: about 3.5 minutes",
    full: "1 GB warm, 4 → 8 tasks at 3 min, 10 minutes per run: about 32 minutes",
    protocols: &["koala", "stop-and-restart", "drrs"],
    runner: Runner::Jobs(uniform_plan),
};

#[cfg(test)]
mod tests {
    use super::shortfall_before;

    /// Seconds 1 .. before of the initial tasks only: a sample below the budget or a missing
    /// one makes the second short; second 0 (partial), the scale-out's second and a task added
    /// by it are not judged.
    #[test]
    fn a_second_is_short_when_an_initial_task_is_below_its_budget_or_silent() {
        let start = 1_000;
        let s = |task: &str, t: u64, c: f64| (task.to_string(), start + t, c);
        let mut samples = vec![s("aggregate.0", 0, 10.0), s("aggregate.1", 0, 10.0)];
        for t in 1..5 {
            samples.push(s("aggregate.0", t, if t == 2 { 900.0 } else { 5_000.0 }));
            if t != 3 {
                samples.push(s("aggregate.1", t, 4_000.0));
            }
            samples.push(s("aggregate.2", t, 1.0));
        }
        samples.push(s("aggregate.0", 5, 1.0));
        let short = shortfall_before(&samples, start as i64, "aggregate", 2, 5, 1_000.0);
        assert_eq!(short, (2, Some(900.0)), "seconds 2 (below) and 3 (aggregate.1 silent)");
        assert_eq!(shortfall_before(&samples, start as i64, "aggregate", 2, 5, 800.0), (1, Some(900.0)));
        assert_eq!(shortfall_before(&samples, start as i64, "aggregate", 2, 2, 800.0), (0, Some(4_000.0)));
        assert_eq!(shortfall_before(&samples, start as i64, "other", 1, 3, 800.0), (2, None));
    }
}
