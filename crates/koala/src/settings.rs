//! The settings every run of a comparison shares (`koala compare`, `koala experiment`): one
//! partition policy and one state cache size for every protocol, so a difference in the table is
//! the protocols' and not their settings' (docs/architecture.md §9, "one ruler"). They are applied
//! to each run's config, which the metrics database stores with the run, and printed above the
//! table.

use koala_coordinator::JobConfig;
use koala_coordinator::config::{DEFAULT_CACHE_MB, PolicyName};
use koala_protocol::{Protocol, StateBackendKind};

/// What every run of one comparison is given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SharedSettings {
    /// The partition policy of every run.
    pub policy: PolicyName,
    /// MiB of state cache per task, whatever the backend: the write-back cache in front of fjall,
    /// the client cache in front of the Remote baseline's state servers.
    pub cache_mb: u64,
}

impl SharedSettings {
    /// The settings for a comparison of `protocols`: `requested` policy if given, else uniform
    /// when DRRS is among them (DRRS runs only with it, as the paper's does), else `default`.
    /// A requested policy DRRS cannot run with is refused, naming the flag and the fix.
    pub fn choose(
        protocols: &[Protocol],
        requested: Option<PolicyName>,
        default: PolicyName,
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
        Ok(Self { policy, cache_mb: DEFAULT_CACHE_MB })
    }

    /// Gives `config` these settings (its protocol already set).
    pub fn apply(&self, config: &mut JobConfig) {
        config.partition_policy = self.policy;
        if matches!(config.state.backend, StateBackendKind::Fjall | StateBackendKind::Remote) {
            config.state.cache_mb = Some(self.cache_mb);
        }
    }

    /// One line for the top of a comparison's output.
    pub fn line(&self) -> String {
        format!(
            "every run: partition policy {}, state cache {} MiB per task (fjall's write-back cache; Remote's client cache)",
            policy_name(self.policy),
            self.cache_mb
        )
    }
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
        let s = SharedSettings::choose(&all, None, PolicyName::Interleaved).expect("settings");
        assert_eq!(s.policy, PolicyName::Uniform);
        let without = SharedSettings::choose(&all[..3], None, PolicyName::Interleaved).expect("settings");
        assert_eq!(without.policy, PolicyName::Interleaved);
        let err = SharedSettings::choose(&all, Some(PolicyName::Consistent), PolicyName::Interleaved)
            .expect_err("drrs with consistent");
        assert!(err.to_string().contains("--partition-policy consistent"), "{err}");
    }

    #[test]
    fn every_backend_with_a_cache_gets_the_same_size() {
        let s = SharedSettings { policy: PolicyName::Uniform, cache_mb: 48 };
        for backend in [StateBackendKind::Fjall, StateBackendKind::Remote] {
            let mut config = JobConfig::parse("query = \"keyed-aggregate\"\n", "test").expect("config");
            config.state.backend = backend;
            s.apply(&mut config);
            assert_eq!(config.state.cache_mb, Some(48));
            assert_eq!(config.state.options().cache_bytes, 48 << 20);
            assert_eq!(config.partition_policy, PolicyName::Uniform);
        }
    }
}
