//! `[autoscale]` of a job config: whether the coordinator's reconfiguration policy runs, on
//! which operator, and its targets. Every error names the field and the fix.

use koala_dataflow::JobGraph;
use koala_types::OperatorId;
use serde::{Deserialize, Serialize};

use crate::config::ConfigError;

/// `[autoscale]`: the reconfiguration policy (docs/architecture.md §7, "The reconfiguration policy"). Off by default.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AutoscaleSection {
    /// Whether the policy runs (default false).
    pub enabled: bool,
    /// The stateful operator it rescales and rebalances (default: the query's only stateful
    /// operator; required when it has several).
    pub operator: Option<String>,
    /// Seconds of one decision window (default 10): a condition must hold for a whole window
    /// before the policy acts, and it acts at most once per window.
    pub window_s: u64,
    /// End-to-end latency p99 (worst sink), ms, above which the job counts as overloaded
    /// (default 200).
    pub target_latency_ms: f64,
    /// Source lag p99, ms, above which the job counts as overloaded (default: the latency target).
    pub target_lag_ms: Option<f64>,
    /// The utilisation (busy time / wall time) each task should run at after a rescale: the
    /// parallelism is input rate ÷ (per-task processing rate × this), DS2-style (default 0.8).
    pub target_utilisation: f64,
    /// Fewest tasks a scale-in leaves (default 1).
    pub min_parallelism: u32,
    /// Most tasks a scale-out makes (default 8; at most `num_buckets`).
    pub max_parallelism: u32,
    /// Mean utilisation below which a window counts as idle (default 0.3).
    pub scale_in_utilisation: f64,
    /// Consecutive idle windows before a scale-in (default 3).
    pub scale_in_windows: u32,
    /// Seconds after a reconfiguration completed whose metrics the policy ignores (default 5):
    /// the transient of the change itself.
    pub cooldown_s: u64,
    /// A task whose input is this many times the mean of the others', while it is saturated and
    /// they are not, is hot: the policy rebalances its buckets instead of scaling out (default 2).
    pub hot_factor: f64,
}

impl Default for AutoscaleSection {
    fn default() -> Self {
        Self {
            enabled: false,
            operator: None,
            window_s: 10,
            target_latency_ms: 200.0,
            target_lag_ms: None,
            target_utilisation: 0.8,
            min_parallelism: 1,
            max_parallelism: 8,
            scale_in_utilisation: 0.3,
            scale_in_windows: 3,
            cooldown_s: 5,
            hot_factor: 2.0,
        }
    }
}

fn invalid(field: &str, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid { field: format!("autoscale.{field}"), message: message.into() }
}

impl AutoscaleSection {
    /// Checks the section against the job's graph; returns the operator it drives (`None` when
    /// off).
    pub fn validate(&self, graph: &JobGraph, num_buckets: u16) -> Result<Option<OperatorId>, ConfigError> {
        if !(2..=3600).contains(&self.window_s) {
            return Err(invalid(
                "window_s",
                format!(
                    "{} s is outside 2..=3600; a window of ~10 s (the default) fits most jobs",
                    self.window_s
                ),
            ));
        }
        for (field, v) in
            [("target_latency_ms", Some(self.target_latency_ms)), ("target_lag_ms", self.target_lag_ms)]
        {
            if let Some(v) = v
                && !(v.is_finite() && v > 0.0)
            {
                return Err(invalid(
                    field,
                    format!("{v} is not a positive number of ms; e.g. {field} = 200"),
                ));
            }
        }
        if !(self.target_utilisation > 0.0 && self.target_utilisation <= 1.0) {
            return Err(invalid(
                "target_utilisation",
                format!("{} is outside (0, 1]; e.g. 0.8 keeps 20 % headroom", self.target_utilisation),
            ));
        }
        if !(self.scale_in_utilisation >= 0.0 && self.scale_in_utilisation < self.target_utilisation) {
            return Err(invalid(
                "scale_in_utilisation",
                format!(
                    "{} must be at least 0 and below target_utilisation ({}), or a scale-in would be undone at once; e.g. 0.3",
                    self.scale_in_utilisation, self.target_utilisation
                ),
            ));
        }
        if self.scale_in_windows == 0 {
            return Err(invalid("scale_in_windows", "0 windows: give 1 or more (default 3)"));
        }
        if !(self.hot_factor.is_finite() && self.hot_factor > 1.0) {
            return Err(invalid(
                "hot_factor",
                format!(
                    "{} must be above 1 (a hot task takes more than the others); e.g. 2",
                    self.hot_factor
                ),
            ));
        }
        if self.min_parallelism == 0 || self.min_parallelism > self.max_parallelism {
            return Err(invalid(
                "min_parallelism",
                format!(
                    "{} must be at least 1 and at most max_parallelism ({})",
                    self.min_parallelism, self.max_parallelism
                ),
            ));
        }
        if self.max_parallelism > u32::from(num_buckets) {
            return Err(invalid(
                "max_parallelism",
                format!(
                    "{} tasks exceed num_buckets = {num_buckets}: a task would own no bucket; lower it or raise num_buckets",
                    self.max_parallelism
                ),
            ));
        }
        let stateful: Vec<&koala_dataflow::OperatorSpec> =
            graph.operators.iter().filter(|o| o.is_stateful()).collect();
        let names = || stateful.iter().map(|o| o.name.as_str()).collect::<Vec<_>>().join(", ");
        let op = match &self.operator {
            Some(name) => {
                let Some(op) = stateful.iter().find(|o| &o.name == name) else {
                    return Err(invalid(
                        "operator",
                        format!(
                            "{name:?} is not a stateful operator of this query; its stateful operators are {}",
                            names()
                        ),
                    ));
                };
                op.id
            }
            None if !self.enabled => return Ok(None),
            None => match stateful.as_slice() {
                [one] => one.id,
                [] => {
                    return Err(invalid(
                        "enabled",
                        "this query has no stateful operator to rescale; set enabled = false",
                    ));
                }
                _ => {
                    return Err(invalid(
                        "operator",
                        format!(
                            "this query has several stateful operators ({}); name the one to drive",
                            names()
                        ),
                    ));
                }
            },
        };
        Ok(self.enabled.then_some(op))
    }

    /// The source-lag target, ms.
    pub fn lag_target_ms(&self) -> f64 {
        self.target_lag_ms.unwrap_or(self.target_latency_ms)
    }
}
