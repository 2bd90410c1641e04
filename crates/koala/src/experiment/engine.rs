//! The one engine every job-running experiment uses: warm state written once per layout, each
//! run started with `koala run`'s launcher under the settings every run of the experiment shares
//! (`crate::settings`), its report read back, then one CSV of every run's seconds, one of the
//! table, overlay PNGs per group of runs and the experiment's page (`index.html`, [`super::page`]).
//! A run that fails does not throw the others away: the results of those that ran are written,
//! then the experiment fails naming the ones that did not.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use anyhow::Context;
use koala_coordinator::JobConfig;
use koala_coordinator::config::PolicyName;
use koala_coordinator::report::{ReportSummary, fmt_drain_limit, fmt_recovery, recovery_watched_s};

use super::scenario::Scenario;
use super::{Info, Mode, Options};
use crate::settings::SharedSettings;

/// One run of an experiment.
#[derive(Clone, Debug)]
pub struct RunSpec {
    /// Its name in the table, the plots' legends and its directory (unique in the experiment).
    pub label: String,
    /// Runs of one group share their overlay plots (e.g. one query's protocols).
    pub group: String,
    /// A `--protocols` name.
    pub protocol: String,
    /// The job.
    pub scenario: Scenario,
}

impl RunSpec {
    /// One run of `scenario` per protocol, labelled by the protocol, in one group.
    pub fn per_protocol(protocols: &[String], group: &str, scenario: &Scenario) -> Vec<RunSpec> {
        protocols
            .iter()
            .map(|p| RunSpec {
                label: p.clone(),
                group: group.into(),
                protocol: p.clone(),
                scenario: scenario.clone(),
            })
            .collect()
    }
}

/// What an experiment runs, from its description.
pub struct Plan {
    /// The experiment's own settings, one line each (the page and the output's head list them).
    pub settings: Vec<String>,
    /// The runs, in order.
    pub runs: Vec<RunSpec>,
    /// The partition policy unless `--partition-policy` or DRRS decides (`SharedSettings::choose`).
    pub default_policy: PolicyName,
    /// Whether the runs need `default_policy` (their bucket moves are computed for it).
    pub policy_required: bool,
    /// Which reconfiguration of each run the table's recovery, dip and latency columns are of.
    pub measured_step: usize,
    /// Per-task throughput plots of this operator's tasks, one per run (skew: Figure 11).
    pub per_task_of: Option<&'static str>,
    /// The experiment's conclusions from the finished runs, one line each.
    pub conclude: fn(&[Done]) -> Vec<String>,
}

/// A finished run.
pub struct Done {
    /// What was run.
    pub spec: RunSpec,
    /// Its report (`koala report` of its metrics DB).
    pub report: ReportSummary,
    /// Mean per-batch latency (µs) in the 5 s before the measured reconfiguration and in the first
    /// 10 s after it in which the sources took input (`compare::mean_batch_latency`).
    pub latency: (Option<f64>, Option<f64>),
    /// The config it ran with (the shared settings applied).
    pub config: JobConfig,
    /// Its output directory.
    pub dir: PathBuf,
}

impl Done {
    /// The measured reconfiguration's summary.
    pub fn measured(&self, step: usize) -> Option<&koala_coordinator::report::ReconfigurationSummary> {
        self.report.reconfigurations.get(step)
    }
}

/// The directory name of a label.
pub fn slug(label: &str) -> String {
    label
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '.' { c.to_ascii_lowercase() } else { '-' })
        .collect()
}

/// Runs `plan` of experiment `info` into `opts.out`.
pub fn execute(info: &Info, mode: Mode, plan: Plan, opts: &Options) -> anyhow::Result<()> {
    anyhow::ensure!(!plan.runs.is_empty(), "experiment {}: no runs to do", info.name);
    let out = &opts.out;
    let protocols: Vec<String> = plan.runs.iter().fold(Vec::new(), |mut v, r| {
        if !v.contains(&r.protocol) {
            v.push(r.protocol.clone());
        }
        v
    });
    let parsed = protocols
        .iter()
        .map(|p| crate::protocol_names::parse_protocol_flag(p, "--protocols"))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let workers = plan.runs.iter().map(|r| r.scenario.workers).max().unwrap_or(1);
    if plan.policy_required {
        let policy = crate::settings::policy_name(plan.default_policy);
        if opts.policy.is_some_and(|p| p != plan.default_policy) {
            anyhow::bail!(
                "--partition-policy: experiment {} computes its bucket moves for the {policy} policy; drop --partition-policy",
                info.name
            );
        }
        if protocols.iter().any(|p| p.starts_with("drrs")) {
            anyhow::bail!(
                "--protocols: DRRS runs only with the uniform policy, and experiment {} computes its bucket moves for the {policy} policy; drop drrs",
                info.name
            );
        }
    }
    let shared = SharedSettings::choose(&parsed, opts.policy, plan.default_policy, workers)?;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let mut head =
        vec![format!("koala experiment {} ({}, {}): {}", info.name, mode.name(), info.figure, info.shows)];
    head.extend(plan.settings.iter().cloned());
    head.push(shared.line());
    head.push(format!(
        "every run's channels hold {} batches (`[runtime] channel_capacity`; about the authors' artifact's bytes in flight per channel)",
        super::scenario::CHANNEL_CAPACITY
    ));
    if let Some(line) = crate::settings::drrs_line(&protocols) {
        head.push(line);
    }
    for line in &head {
        println!("{line}");
    }
    let mut done: Vec<Done> = Vec::new();
    let mut failed = Vec::new();
    for (i, spec) in plan.runs.iter().enumerate() {
        if crate::interrupt::interrupted() {
            // Ctrl-C / SIGTERM drained the run it stopped; the others would end at once.
            failed.push(format!("{}: not run (interrupted)", spec.label));
            continue;
        }
        println!();
        println!(
            "=== run {}/{}: {} ({}; {} of {}: {}) ===",
            i + 1,
            plan.runs.len(),
            spec.label,
            spec.protocol,
            spec.scenario.target,
            spec.scenario.query,
            spec.scenario.steps.iter().map(|s| s.describe()).collect::<Vec<_>>().join("; ")
        );
        match run_one(spec, out, &shared, plan.measured_step) {
            Ok(d) => {
                println!("{}", d.report);
                done.push(d);
            }
            Err(e) => {
                eprintln!("the run {} failed: {e:#}", spec.label);
                failed.push(format!("{}: {e:#}", spec.label));
            }
        }
    }
    if !done.is_empty() {
        let table = table(&done, plan.measured_step);
        let conclusions = (plan.conclude)(&done);
        let plots = super::page::plots(&done, out, mode, plan.per_task_of)?;
        let csvs = super::page::csvs(&done, &table, out)?;
        println!();
        for line in &head[1..] {
            println!("{line}");
        }
        println!("{}", table.text());
        for line in &conclusions {
            println!("{line}");
        }
        let page = super::page::Page {
            info,
            mode,
            head: &head,
            table: &table,
            conclusions: &conclusions,
            plots: &plots,
            csvs: &csvs,
            runs: &done,
            failed: &failed,
        };
        let index = page.write(out)?;
        println!("page: {}; plots: {}", index.display(), plots.len());
    }
    if !failed.is_empty() {
        anyhow::bail!("{} of {} runs failed: {}", failed.len(), plan.runs.len(), failed.join("; "));
    }
    Ok(())
}

/// Writes the warm state of `scenario` under `out/warm` unless there already, returns its directory.
fn warm_state(
    scenario: &Scenario,
    params: &str,
    num_buckets: u16,
    out: &Path,
) -> anyhow::Result<Option<PathBuf>> {
    if scenario.warm_keys == 0 {
        return Ok(None);
    }
    let mut h = std::collections::hash_map::DefaultHasher::new();
    params.hash(&mut h);
    let dir = out.join("warm").join(format!(
        "{}-{}-keys-{}-B-{:08x}",
        scenario.query,
        scenario.warm_keys,
        scenario.value_bytes,
        h.finish() as u32
    ));
    let operators = koala_workloads::warm::WARM_QUERIES
        .iter()
        .find(|(q, _)| *q == scenario.query)
        .map(|(_, ops)| *ops)
        .with_context(|| format!("query {:?} has no warm layout", scenario.query))?;
    if operators.iter().all(|op| dir.join(op).join("manifest").exists()) {
        return Ok(Some(dir));
    }
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("clearing {}", dir.display()))?;
    }
    let started = std::time::Instant::now();
    let written = crate::warmup::warmup(
        scenario.query,
        params,
        num_buckets,
        scenario.warm_keys,
        scenario.value_bytes,
        &dir,
    )?;
    println!(
        "warm state of {}: {} keys, {} in {:.1} s ({})",
        scenario.query,
        scenario.warm_keys,
        crate::human::human_bytes(written.iter().map(|w| w.bytes).sum()),
        started.elapsed().as_secs_f64(),
        dir.display()
    );
    Ok(Some(dir))
}

fn run_one(spec: &RunSpec, out: &Path, shared: &SharedSettings, step: usize) -> anyhow::Result<Done> {
    let dir = out.join(slug(&spec.label));
    // Parsed once without warm state for the query's [params] as the workers read them.
    let bare = JobConfig::parse(&spec.scenario.config(&spec.protocol, &dir, None), "koala experiment")?;
    let warm = warm_state(&spec.scenario, &bare.params_text(), bare.num_buckets, out)?;
    let text = spec.scenario.config(&spec.protocol, &dir, warm.as_deref());
    let mut config = JobConfig::parse(&text, "koala experiment")?;
    shared.apply(&mut config);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    // The config as run: the shared settings applied (the generated text with them noted, if
    // the applied config does not serialise).
    let applied = toml::to_string(&config)
        .unwrap_or_else(|e| format!("# with the shared settings: {} ({e})\n{text}", shared.line()));
    std::fs::write(dir.join("job.toml"), &applied)
        .with_context(|| format!("writing {}", dir.join("job.toml").display()))?;
    let summary = crate::launch::run_job_locally(config.clone())?;
    let (_, report) = crate::compare::outcome(&summary, &dir)?;
    let latency = report
        .reconfigurations
        .get(step)
        .map_or((None, None), |r| crate::compare::mean_batch_latency(&report, r.start_t_s));
    Ok(Done { spec: spec.clone(), report, latency, config, dir })
}

/// The experiment's table: one row per run.
pub struct Table {
    /// Column names.
    pub columns: Vec<&'static str>,
    /// Cells by row.
    pub rows: Vec<Vec<String>>,
}

impl Table {
    /// Fixed-width text.
    pub fn text(&self) -> String {
        let widths: Vec<usize> = (0..self.columns.len())
            .map(|c| {
                self.rows
                    .iter()
                    .map(|r| r[c].chars().count())
                    .chain([self.columns[c].chars().count()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let line = |cells: Vec<&str>| {
            cells
                .iter()
                .zip(&widths)
                .enumerate()
                .map(|(i, (c, w))| if i == 0 { format!("{c:<w$}") } else { format!("{c:>w$}") })
                .collect::<Vec<_>>()
                .join("  ")
        };
        let mut text = line(self.columns.clone());
        for r in &self.rows {
            text.push('\n');
            text.push_str(&line(r.iter().map(String::as_str).collect()));
        }
        text
    }
}

fn bytes(b: f64) -> String {
    crate::human::human_bytes(b.max(0.0) as u64)
}

fn table(done: &[Done], step: usize) -> Table {
    let columns = vec![
        "run",
        "protocol",
        "recovery (e2e p99)",
        "drain limit",
        "median rec.",
        "lag rec.",
        "peak e2e p99",
        "state moved",
        "on demand",
        "background",
        "eager",
        "moved per step",
        "pause",
        "peak lag",
        "mean rate",
        "lowest rate (vs offered)",
        "batch latency",
    ];
    let us = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.0} µs"));
    let rows = done
        .iter()
        .map(|d| {
            let r = &d.report;
            let m = d.measured(step);
            let watched = m.and_then(|c| recovery_watched_s(c.start_t_s, r.input_last_t_s));
            vec![
                d.spec.label.clone(),
                r.run.protocol.clone(),
                fmt_recovery(m.and_then(|c| c.recovery_s), watched),
                fmt_drain_limit(m.and_then(|c| c.drain_limit.as_ref())),
                fmt_recovery(m.and_then(|c| c.recovery_p50_s), watched),
                fmt_recovery(m.and_then(|c| c.lag_recovery_s), watched),
                r.peak_latency_p99_ms.map_or("-".into(), |l| format!("{l:.0} ms")),
                bytes(r.state_moved.total()),
                bytes(r.state_moved.on_demand),
                bytes(r.state_moved.background),
                bytes(r.state_moved.eager),
                r.reconfigurations
                    .iter()
                    .map(|c| bytes(c.state_moved.total()))
                    .collect::<Vec<_>>()
                    .join(" / "),
                format!("{} ms", r.pause_ms_total),
                r.peak_lag_mean_ms.map_or("-".into(), |l| format!("{l:.0} ms")),
                format!("{:.0}/s", r.mean_throughput),
                m.and_then(|c| c.dip).map_or("-".into(), |d| d.short()),
                format!("{} → {}", us(d.latency.0), us(d.latency.1)),
            ]
        })
        .collect();
    Table { columns, rows }
}

/// Runs by group, in the order the groups first appear.
pub fn groups(done: &[Done]) -> Vec<(String, Vec<&Done>)> {
    let mut order: Vec<String> = Vec::new();
    let mut by: BTreeMap<String, Vec<&Done>> = BTreeMap::new();
    for d in done {
        if !by.contains_key(&d.spec.group) {
            order.push(d.spec.group.clone());
        }
        by.entry(d.spec.group.clone()).or_default().push(d);
    }
    order
        .into_iter()
        .map(|g| {
            let v = by.remove(&g).unwrap_or_default();
            (g, v)
        })
        .collect()
}
