//! How a coordinator message reaches the tasks it concerns: one rule for the runtime's workers
//! (`crates/runtime/src/worker.rs`), which relay it to their own tasks, and the simulator.

use std::collections::BTreeSet;

use koala_types::TaskId;

use crate::control::{CoordinatorMessage, ReconfigPlan};
use crate::drrs::DrrsControl;

/// What one task is told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Relayed {
    /// A task of the reconfigured operator (live, cancelled or retired): learn the plan.
    Prepare,
    /// An upstream: a marker on every output, then pause (stop-and-restart).
    Drain,
    /// A task of the reconfigured operator (live or cancelled): every task is prepared, moved
    /// state may go once every marker arrived.
    HandOver,
    /// An upstream: switch to the plan's routing, with markers.
    Switch,
    /// An upstream: switch to the plan's routing and resume (after `Drain`).
    Resume,
    /// Koala: start the hand-over of the reconfiguration.
    Begin,
    /// A new task: this upstream finished before it switched.
    UpstreamEnded(TaskId),
    /// Koala: nobody fetches from the task any more.
    Release,
    /// DRRS: a subscale starts.
    DrrsBegin,
    /// DRRS: an upstream switches to a subscale's table.
    DrrsSwitch,
}

/// The tasks `msg` concerns, each with what it is told, in order. `plan` is the plan of the
/// message's epoch, as its `Prepare` carried it (a `Drain`, `Switch` or `Resume` of an epoch
/// without one concerns nobody: the caller reports it).
pub fn relay(msg: &CoordinatorMessage, plan: Option<&ReconfigPlan>) -> Vec<(TaskId, Relayed)> {
    match (msg, plan) {
        (CoordinatorMessage::Prepare(p), _) => {
            let mut tasks = operator_tasks(p);
            tasks.extend(p.retired.iter().map(|&i| TaskId::new(p.operator, i)));
            tasks.into_iter().map(|t| (t, Relayed::Prepare)).collect()
        }
        (CoordinatorMessage::Drain { .. }, Some(p)) => {
            let hand_over: Vec<TaskId> = operator_tasks(p).into_iter().collect();
            to(&p.upstreams, Relayed::Drain).chain(to(&hand_over, Relayed::HandOver)).collect()
        }
        // Koala: a stateless operator's old tasks pass their markers and finish.
        (CoordinatorMessage::Switch { .. }, Some(p)) => {
            let hand_over: Vec<TaskId> = operator_tasks(p).into_iter().collect();
            to(&hand_over, Relayed::HandOver).chain(to(&p.upstreams, Relayed::Switch)).collect()
        }
        (CoordinatorMessage::Resume { .. }, Some(p)) => to(&p.upstreams, Relayed::Resume).collect(),
        (CoordinatorMessage::Begin { tasks, .. }, _) => to(tasks, Relayed::Begin).collect(),
        (CoordinatorMessage::UpstreamEnded { upstream, tasks }, _) => {
            to(tasks, Relayed::UpstreamEnded(*upstream)).collect()
        }
        (CoordinatorMessage::Release { task }, _) => vec![(*task, Relayed::Release)],
        (CoordinatorMessage::Drrs(control), _) => match &**control {
            DrrsControl::Begin { tasks, .. } => to(tasks, Relayed::DrrsBegin).collect(),
            DrrsControl::Switch { upstreams, .. } => to(upstreams, Relayed::DrrsSwitch).collect(),
        },
        _ => Vec::new(),
    }
}

/// Each of `tasks`, told `r`.
fn to(tasks: &[TaskId], r: Relayed) -> impl Iterator<Item = (TaskId, Relayed)> + '_ {
    tasks.iter().map(move |&t| (t, r))
}

/// The reconfigured operator's tasks that may move state: live after it, or cancelled by it.
fn operator_tasks(plan: &ReconfigPlan) -> BTreeSet<TaskId> {
    let op = plan.operator;
    let live = plan.deployment.tasks.get(&op).into_iter().flatten();
    live.chain(&plan.cancelled).map(|&i| TaskId::new(op, i)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::Deployment;
    use koala_types::OperatorId;

    /// A scale-in 0,1,2 → 0,1 with task 3 retired: who hears what.
    #[test]
    fn phases_reach_the_tasks_they_concern() {
        let (up, op) = (OperatorId(0), OperatorId(1));
        let deployment = Deployment {
            run: "relay".into(),
            query: String::new(),
            query_params: String::new(),
            workers: Default::default(),
            placement: Default::default(),
            tasks: [(op, vec![0, 1])].into(),
            epoch: 2,
            routing: Default::default(),
            num_buckets: 8,
            options: crate::control::RuntimeOptions {
                batch_records: 1,
                linger_ms: 0,
                channel_capacity: 1,
                sink_dir: String::new(),
                capacity: Default::default(),
                max_queued_records: 1,
                checkpoint: Default::default(),
            },
            protocol: crate::control::Protocol::StopAndRestart,
            extra_keys: 0,
            drain_keys_per_sec: 0,
            finished: Default::default(),
        };
        let plan = ReconfigPlan {
            epoch: 2,
            operator: op,
            deployment,
            moves: Default::default(),
            upstreams: vec![TaskId::new(up, 0)],
            created: vec![],
            cancelled: vec![2],
            retired: vec![3],
        };
        let t = |i| TaskId::new(op, i);
        let prepare = relay(&CoordinatorMessage::Prepare(Box::new(plan.clone())), None);
        assert_eq!(prepare.iter().map(|(t, _)| *t).collect::<Vec<_>>(), vec![t(0), t(1), t(2), t(3)]);
        assert_eq!(
            relay(&CoordinatorMessage::Drain { epoch: 2 }, Some(&plan)),
            vec![
                (TaskId::new(up, 0), Relayed::Drain),
                (t(0), Relayed::HandOver),
                (t(1), Relayed::HandOver),
                (t(2), Relayed::HandOver)
            ]
        );
        assert_eq!(
            relay(&CoordinatorMessage::Resume { epoch: 2 }, Some(&plan)),
            vec![(TaskId::new(up, 0), Relayed::Resume)]
        );
        assert!(relay(&CoordinatorMessage::Switch { epoch: 2 }, None).is_empty());
    }
}
