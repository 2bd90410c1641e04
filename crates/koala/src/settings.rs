//! The settings every run of a comparison shares (`koala compare`, `koala experiment`): one
//! partition policy and one memory rule for every protocol — the same worker memory budget,
//! split the same way, each task's state cache (fjall's write-back cache, Remote's client cache)
//! sized from its share — so a difference in the table is the protocols' and not their
//! settings' (docs/architecture.md §9, "one ruler"). They are applied to each run's config,
//! which the metrics database stores with the run, and printed above the table.

use koala_coordinator::JobConfig;
use koala_coordinator::config::PolicyName;
use koala_protocol::memory::{MANAGED_FRACTION_TENTHS, default_worker_budget, parse_meminfo};
use koala_protocol::{Protocol, StateBackendKind};

/// What every run of one comparison is given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SharedSettings {
    /// The partition policy of every run.
    pub policy: PolicyName,
    /// `[runtime] worker_memory_mb` of every run: the default budget of one of the runs' workers
    /// on this machine (docs/architecture.md §5, "Memory budget"), written into each config so
    /// that every run has the same one even if the machine's memory reading changed.
    pub worker_memory_mb: u64,
    /// What it was derived from: this machine's memory (MiB) and the runs' workers.
    pub derived_from: (u64, u32),
}

impl SharedSettings {
    /// The settings for a comparison of `protocols`: `requested` policy if given, else uniform
    /// when DRRS is among them (DRRS runs only with it, as the paper's does), else `default`.
    /// A requested policy DRRS cannot run with is refused, naming the flag and the fix.
    /// Every run has `workers` workers on this machine.
    pub fn choose(
        protocols: &[Protocol],
        requested: Option<PolicyName>,
        default: PolicyName,
        workers: u32,
    ) -> anyhow::Result<Self> {
        let with_drrs = protocols.contains(&Protocol::Drrs);
        let policy = match requested {
            Some(p) if with_drrs && p != PolicyName::Uniform => anyhow::bail!(
                "--partition-policy {}: DRRS runs only with the uniform policy and every run of a comparison \
                 uses one policy; use --partition-policy uniform or drop drrs from --protocols",
                policy_name(p)
            ),
            Some(p) => p,
            None if with_drrs => PolicyName::Uniform,
            None => default,
        };
        let machine = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|t| parse_meminfo(&t))
            .ok_or_else(|| anyhow::anyhow!("cannot read MemTotal from /proc/meminfo: a comparison needs the machine's memory to give every run the same budget"))?;
        Ok(Self {
            policy,
            worker_memory_mb: default_worker_budget(machine, workers) >> 20,
            derived_from: (machine >> 20, workers),
        })
    }

    /// Gives `config` these settings (its protocol already set): the policy, the budget, and a
    /// cache from the budget for every backend that has one.
    pub fn apply(&self, config: &mut JobConfig) {
        config.partition_policy = self.policy;
        config.runtime.worker_memory_mb = Some(self.worker_memory_mb);
        if matches!(config.state.backend, StateBackendKind::Fjall | StateBackendKind::Remote) {
            config.state.cache_mb = None;
        }
    }

    /// One line for the top of a comparison's output.
    pub fn line(&self) -> String {
        let (machine_mb, workers) = self.derived_from;
        format!(
            "every run: partition policy {}, worker memory budget {} MiB (0.{MANAGED_FRACTION_TENTHS} of {machine_mb} MiB / {workers} workers), \
             split evenly among each worker's stateful tasks; each task's state cache (fjall's write-back cache, \
             Remote's client cache) is its share less its queues and store (`koala run` prints the split)",
            policy_name(self.policy),
            self.worker_memory_mb,
        )
    }
}

/// The line naming the DRRS schedule of each DRRS run among `protocols` (command-line names),
/// if any: `drrs` runs the Koala authors' port, `drrs-overlapping` the original DRRS's schedule.
pub fn drrs_line(protocols: &[String]) -> Option<String> {
    let runs: Vec<String> = protocols
        .iter()
        .filter(|p| p.starts_with("drrs"))
        .map(|p| {
            let s = crate::protocol_names::drrs_schedule_of(p);
            format!("{p} = schedule \"{}\" ({})", s.name(), s.describe())
        })
        .collect();
    (!runs.is_empty()).then(|| format!("DRRS runs: {}", runs.join("; ")))
}

/// A policy as configs and flags spell it.
pub fn policy_name(p: PolicyName) -> &'static str {
    match p {
        PolicyName::Consistent => "consistent",
        PolicyName::Uniform => "uniform",
        PolicyName::Interleaved => "interleaved",
    }
}

/// `--partition-policy VALUE`.
pub fn parse_policy(name: &str) -> anyhow::Result<PolicyName> {
    Ok(match name {
        "consistent" => PolicyName::Consistent,
        "uniform" => PolicyName::Uniform,
        "interleaved" => PolicyName::Interleaved,
        other => anyhow::bail!("--partition-policy {other:?}: use consistent, uniform or interleaved"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drrs_among_the_protocols_gives_every_run_the_uniform_policy() {
        let all = [Protocol::Koala, Protocol::StopAndRestart, Protocol::Remote, Protocol::Drrs];
        let s = SharedSettings::choose(&all, None, PolicyName::Interleaved, 2).expect("settings");
        assert_eq!(s.policy, PolicyName::Uniform);
        let without = SharedSettings::choose(&all[..3], None, PolicyName::Interleaved, 2).expect("settings");
        assert_eq!(without.policy, PolicyName::Interleaved);
        let err = SharedSettings::choose(&all, Some(PolicyName::Consistent), PolicyName::Interleaved, 2)
            .expect_err("drrs with consistent");
        assert!(err.to_string().contains("--partition-policy consistent"), "{err}");
    }

    #[test]
    fn the_drrs_line_names_each_drrs_run_s_schedule() {
        let names = |ps: &[&str]| ps.iter().map(|p| p.to_string()).collect::<Vec<_>>();
        assert_eq!(drrs_line(&names(&["koala", "stop-and-restart"])), None);
        let line = drrs_line(&names(&["koala", "drrs", "drrs-overlapping"])).expect("a line");
        assert!(line.contains("drrs = schedule \"ported\" (the Koala authors' port"), "{line}");
        assert!(line.contains("drrs-overlapping = schedule \"overlapping\" (the original DRRS"), "{line}");
        let drrs =
            crate::protocol_names::parse_protocol_flag("drrs-overlapping", "--protocols").expect("known");
        assert_eq!(drrs, Protocol::Drrs);
        let err =
            crate::protocol_names::parse_protocol_flag("drrs-original", "--protocols").expect_err("unknown");
        assert!(err.to_string().contains("drrs-overlapping"), "{err}");
    }

    #[test]
    fn every_backend_with_a_cache_gets_the_same_budget_and_share_rule() {
        let s =
            SharedSettings { policy: PolicyName::Uniform, worker_memory_mb: 3000, derived_from: (15000, 2) };
        for backend in [StateBackendKind::Fjall, StateBackendKind::Remote] {
            // A config's own cache size does not survive: every run sizes it from the budget.
            let mut config =
                JobConfig::parse("query = \"keyed-aggregate\"\n[state]\ncache_mb = 64\n", "test")
                    .expect("config");
            config.state.backend = backend;
            s.apply(&mut config);
            assert_eq!(config.state.cache_mb, None);
            let options = config.state_options();
            assert!(options.cache_from_budget, "{backend:?}");
            assert_eq!(options.worker_memory_bytes, Some(3000 << 20));
            assert_eq!(config.partition_policy, PolicyName::Uniform);
        }
        assert!(
            s.line().contains("worker memory budget 3000 MiB (0.4 of 15000 MiB / 2 workers)"),
            "{}",
            s.line()
        );
    }
}
