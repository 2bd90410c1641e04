//! The policy inside the coordinator's event loop: judges the seconds the coordinator's one
//! aggregator (`crate::progress::SecondAggregator`) completes, tells the policy when a
//! reconfiguration runs, and submits its decisions through the one request path
//! (`JobState::submit`, as `koala rescale` and `POST /api/rescale` do), logging and storing each
//! with the coordinator's answer.

use crossbeam_channel::bounded;
use koala_dataflow::JobGraph;
use koala_types::OperatorId;

use super::{Autoscaler, Decision};
use crate::clock::unix_ms;
use crate::config::JobConfig;
use crate::error::CoordinatorError;
use crate::job::JobState;
use crate::metrics_store::DecisionRecord;
use crate::progress::{JobSecond, ProgressEvent};
use crate::request_record::{describe, to_json};

/// The policy, for one job.
pub(crate) struct Driver {
    policy: Autoscaler,
    operator: OperatorId,
}

impl Driver {
    /// The driver of `config`'s `[autoscale]`, or `None` when it is off.
    pub(crate) fn new(config: &JobConfig, graph: &JobGraph) -> Result<Option<Self>, crate::ConfigError> {
        let Some(operator) = config.autoscale.validate(graph, config.num_buckets)? else { return Ok(None) };
        let name = graph.operator(operator).map_or_else(String::new, |o| o.name.clone());
        let budget = config.runtime.task_records_per_sec;
        tracing::info!(operator = %name, window_s = config.autoscale.window_s, "autoscale: the policy drives {name}");
        Ok(Some(Self { policy: Autoscaler::new(config.autoscale.clone(), &name, budget), operator }))
    }

    /// The operator it drives and its emulated budget, for the aggregator
    /// (`SecondAggregator::driving`).
    pub(crate) fn driven(&self) -> (OperatorId, Option<f64>) {
        (self.operator, self.policy.budget())
    }

    /// Called after every event with the seconds every task has reported (the aggregator's
    /// `complete`): marks a running or queued reconfiguration, judges the seconds, and submits a
    /// decision. `sources_stopped`: the job drains to its end, nothing is decided any more.
    pub(crate) fn tick(
        &mut self,
        state: &mut JobState<'_>,
        sources_stopped: bool,
        seconds: &[JobSecond],
    ) -> Result<(), CoordinatorError> {
        let now_s = unix_ms() / 1000;
        // A source task that finished: the input is ending, the job drains; nothing to decide.
        let sources_stopped = sources_stopped
            || state
                .graph
                .operators
                .iter()
                .filter(|o| o.is_source())
                .any(|o| state.ended_ms.keys().any(|t| t.operator == o.id));
        if state.engine.running().is_some() || !state.queue.is_empty() {
            self.policy.busy(now_s);
        }
        for second in seconds {
            let d = state.engine.deployment();
            let routing = d.routing.get(&self.operator).cloned().unwrap_or_default();
            let live: Vec<u32> = d.tasks.get(&self.operator).cloned().unwrap_or_default();
            if let Some(decision) = self.policy.on_second(second.clone().into(), &routing, &live)
                && !sources_stopped
            {
                self.submit(state, decision)?;
            }
        }
        Ok(())
    }

    fn submit(&mut self, state: &mut JobState<'_>, d: Decision) -> Result<(), CoordinatorError> {
        let (tx, rx) = bounded(1);
        state.submit(d.request.clone(), tx)?;
        // `submit` answers at once: checked and started, queued, or rejected.
        let outcome = match rx.try_recv() {
            Ok(reply) => crate::control::reply_line(&reply).unwrap_or_else(|rejected| rejected),
            Err(_) => "no answer from the coordinator".to_string(),
        };
        self.policy.busy(unix_ms() / 1000);
        let t_s = d.t.saturating_sub(state.start_s);
        let description =
            format!("{} at t={t_s} s: {}: {}; {}", d.kind.name(), describe(&d.request), d.reason, outcome);
        tracing::info!(kind = d.kind.name(), window = %d.window, "autoscale decision: {description}");
        state.store.autoscale_decision(
            state.run,
            &DecisionRecord {
                at_ms: unix_ms(),
                t_s,
                kind: d.kind.name().into(),
                request: to_json(&d.request).to_string(),
                reason: d.reason.clone(),
                window: d.window.to_string(),
                outcome: outcome.clone(),
            },
        )?;
        state.say(ProgressEvent::AutoscaleDecision { second: t_s, description });
        Ok(())
    }
}
