//! `koala experiment <name>`: the analogues of the paper's evaluation (§5 and Appendix D), one
//! command each, on one machine. Every experiment is a description — its settings, its runs
//! (query, tasks, rate schedule, reconfigurations, protocol) — run by one engine
//! ([`engine::execute`]): warm state restored into every run, each run's per-second line while it
//! runs, then a CSV of every run's seconds, a CSV of the table, overlay PNGs and one page
//! (`index.html` in the output directory) stating the emulation, the partition policy and each
//! run's protocol knobs. `koala experiment --list` names them with their figures and durations;
//! an unknown name is refused with the list.
//!
//! The capacity emulation (docs/architecture.md §4): each stateful task processes at most
//! `task_records_per_sec`, each worker receives peer traffic at `link_mb_per_sec`, chosen per
//! experiment so that, relative to the run, moving state takes as long as on the paper's
//! testbed. Every run of one experiment gets the same partition policy and memory rule
//! (`crate::settings`).

mod autoscale;
mod engine;
mod klt;
mod migration;
mod page;
mod queries;
mod rebalance;
mod recovery;
mod repeated;
mod scale_out;
mod scenario;
mod small;
mod sweeps;

use std::path::PathBuf;

use koala_coordinator::config::PolicyName;

/// How long an experiment runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// A few seconds per run, for the test suite: checks the machinery, not the paper's claims.
    Smoke,
    /// ≤ 5 minutes on a 2-core machine.
    Quick,
    /// The paper's run lengths where they fit on one machine.
    Full,
}

impl Mode {
    /// As the page names it.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Smoke => "smoke",
            Mode::Quick => "quick",
            Mode::Full => "full",
        }
    }

    /// The flag that selects it.
    pub fn flag(self) -> &'static str {
        match self {
            Mode::Smoke => " --smoke",
            Mode::Quick => " --quick",
            Mode::Full => "",
        }
    }

    /// Seconds of the plots' moving average (the paper's 10 s; shorter for shorter runs).
    pub fn smoothing_s(self) -> i64 {
        match self {
            Mode::Smoke => 1,
            Mode::Quick => 5,
            Mode::Full => 10,
        }
    }

    /// `smoke`, `quick` or `full` value of a setting.
    pub fn pick<T>(self, smoke: T, quick: T, full: T) -> T {
        match self {
            Mode::Smoke => smoke,
            Mode::Quick => quick,
            Mode::Full => full,
        }
    }
}

/// The command line of one experiment.
#[derive(Clone, Debug)]
pub struct Options {
    /// Where the warm state, every run and the page go.
    pub out: PathBuf,
    /// `--protocols` (`None`: the experiment's own).
    pub protocols: Option<Vec<String>>,
    /// `--partition-policy`.
    pub policy: Option<PolicyName>,
}

/// How an experiment is run: a plan for the engine, or its own measurement (`klt`).
#[derive(Clone, Copy)]
pub enum Runner {
    /// Runs jobs: the plan of a mode under the protocols.
    Jobs(fn(Mode, &[String]) -> anyhow::Result<engine::Plan>),
    /// Measures without jobs.
    Own(fn(&Info, Mode, &Options) -> anyhow::Result<()>),
}

/// One experiment.
pub struct Info {
    /// `koala experiment <name>`.
    pub name: &'static str,
    /// The paper's figures it is the analogue of.
    pub figure: &'static str,
    /// What it shows.
    pub shows: &'static str,
    /// What `--quick` runs and how long it takes.
    pub quick: &'static str,
    /// What the full variant runs and how long it takes.
    pub full: &'static str,
    /// The protocols it runs unless `--protocols` says otherwise.
    pub protocols: &'static [&'static str],
    /// How it runs.
    pub runner: Runner,
}

const ALL4: &[&str] = &["koala", "stop-and-restart", "remote", "drrs"];

/// Every experiment, most valuable first.
pub const EXPERIMENTS: &[Info] = &[
    scale_out::SCALE_OUT,
    queries::SCALE_OUT_QUERIES,
    repeated::REPEATED,
    rebalance::REBALANCE,
    migration::MIGRATION,
    sweeps::STATE_GROWTH,
    klt::KLT,
    scale_out::DRRS_SCHEDULES,
    sweeps::UNIFORM,
    queries::TWO_OPERATORS,
    small::SMALL_STATE,
    sweeps::HOT_KEYS,
    small::LARGE_SCALE,
    autoscale::AUTOSCALE,
    recovery::RECOVERY,
];

/// The experiment `name`, or an error listing them.
pub fn find(name: &str) -> anyhow::Result<&'static Info> {
    EXPERIMENTS.iter().find(|e| e.name == name).ok_or_else(|| {
        anyhow::anyhow!(
            "unknown experiment {name:?}; the experiments are {} (`koala experiment --list` describes them)",
            EXPERIMENTS.iter().map(|e| e.name).collect::<Vec<_>>().join(", ")
        )
    })
}

/// `koala experiment --list`.
pub fn list() -> String {
    let mut text = String::new();
    for e in EXPERIMENTS {
        text.push_str(&format!("{:<19} {}\n", e.name, e.figure));
        text.push_str(&format!("{:<19} {}\n", "", e.shows));
        text.push_str(&format!("{:<19} protocols: {}\n", "", e.protocols.join(", ")));
        text.push_str(&format!("{:<19} --quick: {}\n", "", e.quick));
        text.push_str(&format!("{:<19} full: {}\n", "", e.full));
    }
    text
}

/// Runs experiment `name`.
pub fn run(name: &str, mode: Mode, opts: &Options) -> anyhow::Result<()> {
    let info = find(name)?;
    let protocols: Vec<String> = match &opts.protocols {
        Some(p) => p.clone(),
        None => info.protocols.iter().map(|p| p.to_string()).collect(),
    };
    for p in &protocols {
        crate::protocol_names::parse_protocol_flag(p, "--protocols")?;
    }
    match info.runner {
        Runner::Own(f) => f(info, mode, opts),
        Runner::Jobs(plan) => engine::execute(info, mode, plan(mode, &protocols)?, opts),
    }
}

/// Refuses protocols other than `allowed` for an experiment about one of them.
pub fn only(name: &str, protocols: &[String], allowed: &[&str]) -> anyhow::Result<()> {
    if let Some(p) = protocols.iter().find(|p| !allowed.contains(&p.as_str())) {
        anyhow::bail!(
            "--protocols {p}: experiment {name} is about {} only (its runs vary {}'s own knobs); drop --protocols",
            allowed.join(", "),
            allowed.join(", ")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Seconds a quick run takes besides its sources' (measured 2026-12-03 at load ~13: 2–4 s
    /// with 64 MB of warm state, ~8 s with 256 MB).
    const RUN_OVERHEAD_S: u64 = 5;

    /// Every job experiment's runs, in every mode, under its own protocols: each config parses,
    /// the protocol it records is the one asked for, and a quick variant fits in 5 minutes: its
    /// sources' seconds plus [`RUN_OVERHEAD_S`] per run (start, warm-state restore, drain).
    #[test]
    fn every_plan_parses_and_quick_ones_fit_in_five_minutes() {
        for info in EXPERIMENTS {
            let Runner::Jobs(plan) = info.runner else { continue };
            let protocols: Vec<String> = info.protocols.iter().map(|p| p.to_string()).collect();
            for mode in [Mode::Smoke, Mode::Quick, Mode::Full] {
                let plan = plan(mode, &protocols).unwrap_or_else(|e| panic!("{} {mode:?}: {e:#}", info.name));
                for run in &plan.runs {
                    let text = run.scenario.config(&run.protocol, std::path::Path::new("/tmp/x"), None);
                    let config = koala_coordinator::JobConfig::parse(&text, info.name)
                        .unwrap_or_else(|e| panic!("{} {}: {e}\n{text}", info.name, run.label));
                    assert_eq!(config.protocol_label(), run.protocol, "{}", info.name);
                    assert_eq!(config.reconfigurations.len(), run.scenario.steps.len());
                }
                let seconds: u64 = plan.runs.iter().map(|r| r.scenario.duration_s + RUN_OVERHEAD_S).sum();
                if mode == Mode::Quick {
                    assert!(seconds <= 300, "{} --quick takes about {seconds} s", info.name);
                }
            }
        }
    }

    #[test]
    fn an_unknown_experiment_is_refused_with_the_list() {
        let opts = Options { out: std::env::temp_dir().join("koala-never"), protocols: None, policy: None };
        let err = run("scale-up", Mode::Quick, &opts).expect_err("unknown").to_string();
        assert!(err.contains("unknown experiment \"scale-up\"") && err.contains("large-scale"), "{err}");
        let err =
            run("migration", Mode::Quick, &Options { protocols: Some(vec!["drrs".into()]), ..opts.clone() })
                .expect_err("koala only")
                .to_string();
        assert!(err.contains("--protocols drrs"), "{err}");
        assert!(!opts.out.exists());
    }
}
