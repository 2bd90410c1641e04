//! What an upstream task switches its edges to when the operator they feed is reconfigured, as
//! the command itself carries it: the operator's live tasks and routing table after the switch.
//! Koala and stop-and-restart switch once, to the plan's deployment ([`RoutingSwitch::to_plan`]);
//! DRRS once per subscale, to the subscale's table ([`RoutingSwitch::subscale`]). One rule turns
//! it into the routing-core event of each edge ([`RoutingSwitch::event`]): the runtime's output
//! edges and the simulator's upstreams both call it.

use std::sync::Arc;

use koala_types::{Epoch, OperatorId, TaskId};

use crate::common::edge::Edge;
use crate::common::upstream::RouterEvent;
use crate::control::ReconfigPlan;

/// A switch of the edges into one operator.
#[derive(Clone, Debug, PartialEq)]
pub struct RoutingSwitch {
    /// The epoch the markers carry (a DRRS subscale's own epoch).
    pub epoch: Epoch,
    /// The reconfigured operator.
    pub operator: OperatorId,
    /// Its task indices with a channel after the switch: the table's, and those live before and
    /// after the reconfiguration that own no bucket in it (a DRRS subscale's).
    pub live: Vec<u32>,
    /// Its routing table after the switch (bucket → task index); empty for an operator without
    /// one (a stateless operator).
    pub routing: Vec<u32>,
    /// The reconfiguration's plan: where the new tasks run, and the rest of the job.
    pub plan: Arc<ReconfigPlan>,
}

/// An edge into the switched operator, as the upstream task sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SwitchedEdge {
    /// The edge.
    pub edge: Edge,
    /// Whether records go by key (else they are spread over the outputs).
    pub keyed: bool,
}

/// Why an edge cannot take a switch: the deployment it came with is inconsistent.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SwitchError {
    /// A keyed edge into an operator without a routing table.
    #[error("a keyed operator without a routing table")]
    NoTable,
    /// The table names a task without a channel.
    #[error("routing names task {0}, which is not live")]
    NotLive(TaskId),
}

impl RoutingSwitch {
    /// The switch to the plan's deployment (Koala, stop-and-restart, a stateless operator).
    pub fn to_plan(plan: Arc<ReconfigPlan>) -> Self {
        let op = plan.operator;
        Self {
            epoch: plan.epoch,
            operator: op,
            live: plan.deployment.live(op).to_vec(),
            routing: plan.deployment.routing.get(&op).cloned().unwrap_or_default(),
            plan,
        }
    }

    /// The switch to a DRRS subscale's table `routing` at the subscale's `epoch`, keeping the
    /// channels to `keep` (live tasks that own no bucket in it).
    pub fn subscale(plan: Arc<ReconfigPlan>, epoch: Epoch, routing: Vec<u32>, keep: &[u32]) -> Self {
        let mut live: Vec<u32> = routing.iter().chain(keep).copied().collect();
        live.sort_unstable();
        live.dedup();
        Self { epoch, operator: plan.operator, live, routing, plan }
    }

    /// The operator's tasks with a channel after the switch.
    pub fn live_tasks(&self) -> impl Iterator<Item = TaskId> + '_ {
        self.live.iter().map(|&i| TaskId::new(self.operator, i))
    }

    /// The routing-core event that switches `edge` of upstream task `task`: with markers, or,
    /// resuming after stop-and-restart's drain (`resume`), without. A one-to-one edge
    /// ([`crate::plan::is_one_to_one`], with the operator's live tasks after the switch) goes to
    /// the task of the same index; an unkeyed edge to every live task; a keyed edge by the table,
    /// keeping its live tasks that own no bucket as outputs.
    pub fn event(&self, edge: SwitchedEdge, task: TaskId, resume: bool) -> Result<RouterEvent, SwitchError> {
        let epoch = self.epoch;
        let outputs: Vec<TaskId> = self.live_tasks().collect();
        let one_to_one =
            edge.edge.forward_stateless && self.plan.deployment.live(edge.edge.from) == self.live;
        let (assignment, keep) = if one_to_one {
            (vec![TaskId::new(self.operator, task.index)], Vec::new())
        } else if !edge.keyed {
            (outputs, Vec::new())
        } else {
            if self.routing.is_empty() {
                return Err(SwitchError::NoTable);
            }
            let table: Vec<TaskId> = self.routing.iter().map(|&i| TaskId::new(self.operator, i)).collect();
            if let Some(t) = table.iter().find(|t| !outputs.contains(t)) {
                return Err(SwitchError::NotLive(*t));
            }
            let keep = outputs.into_iter().filter(|t| !table.contains(t)).collect();
            (table, keep)
        };
        Ok(if resume {
            RouterEvent::Reroute { epoch, assignment }
        } else {
            RouterEvent::Switch { epoch, assignment, keep }
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::control::{Deployment, Protocol};

    const UP: OperatorId = OperatorId(0);
    const OP: OperatorId = OperatorId(1);

    /// A plan that leaves `OP` on `tasks` with `routing`, fed by two upstream tasks.
    fn plan(tasks: Vec<u32>, routing: Option<Vec<u32>>) -> Arc<ReconfigPlan> {
        let routing = routing.map(|r| BTreeMap::from([(OP, r)])).unwrap_or_default();
        let tasks = BTreeMap::from([(UP, vec![0, 1]), (OP, tasks)]);
        let deployment = Deployment::for_tests(tasks, routing, 4, Protocol::Koala);
        Arc::new(ReconfigPlan {
            epoch: 3,
            operator: OP,
            deployment,
            moves: Default::default(),
            upstreams: vec![TaskId::new(UP, 0), TaskId::new(UP, 1)],
            created: Vec::new(),
            cancelled: Vec::new(),
            retired: Vec::new(),
        })
    }

    fn t(i: u32) -> TaskId {
        TaskId::new(OP, i)
    }

    fn edge(forward_stateless: bool, keyed: bool) -> SwitchedEdge {
        SwitchedEdge { edge: Edge::new(UP, OP, forward_stateless), keyed }
    }

    #[test]
    fn a_plan_switch_routes_by_the_plans_table() {
        let s = RoutingSwitch::to_plan(plan(vec![0, 1, 2], Some(vec![0, 1, 2, 2])));
        assert_eq!((s.epoch, s.live.clone()), (3, vec![0, 1, 2]));
        let up = TaskId::new(UP, 1);
        let expected = vec![t(0), t(1), t(2), t(2)];
        assert_eq!(
            s.event(edge(false, true), up, false),
            Ok(RouterEvent::Switch { epoch: 3, assignment: expected.clone(), keep: vec![] })
        );
        assert_eq!(
            s.event(edge(false, true), up, true),
            Ok(RouterEvent::Reroute { epoch: 3, assignment: expected })
        );
        // Unkeyed: every live task.
        assert_eq!(
            s.event(edge(false, false), up, false),
            Ok(RouterEvent::Switch { epoch: 3, assignment: vec![t(0), t(1), t(2)], keep: vec![] })
        );
    }

    #[test]
    fn a_subscale_keeps_live_tasks_without_buckets() {
        let s = RoutingSwitch::subscale(plan(vec![0, 1], Some(vec![0, 0, 1, 1])), 7, vec![0, 0, 2, 2], &[1]);
        assert_eq!(s.live, vec![0, 1, 2]);
        assert_eq!(
            s.event(edge(false, true), TaskId::new(UP, 0), false),
            Ok(RouterEvent::Switch { epoch: 7, assignment: vec![t(0), t(0), t(2), t(2)], keep: vec![t(1)] })
        );
    }

    #[test]
    fn a_forward_edge_with_equal_tasks_goes_to_the_same_index() {
        let s = RoutingSwitch::to_plan(plan(vec![0, 1], None));
        assert_eq!(
            s.event(edge(true, false), TaskId::new(UP, 1), false),
            Ok(RouterEvent::Switch { epoch: 3, assignment: vec![t(1)], keep: vec![] })
        );
        // Unequal tasks: not one-to-one.
        let s = RoutingSwitch::to_plan(plan(vec![0, 1, 2], None));
        assert!(matches!(
            s.event(edge(true, false), TaskId::new(UP, 1), false),
            Ok(RouterEvent::Switch { assignment, .. }) if assignment.len() == 3
        ));
    }

    #[test]
    fn an_inconsistent_deployment_is_refused() {
        let s = RoutingSwitch::to_plan(plan(vec![0, 1], None));
        assert_eq!(s.event(edge(false, true), TaskId::new(UP, 0), false), Err(SwitchError::NoTable));
        let s = RoutingSwitch::to_plan(plan(vec![0, 1], Some(vec![0, 1, 5, 5])));
        assert_eq!(s.event(edge(false, true), TaskId::new(UP, 0), false), Err(SwitchError::NotLive(t(5))));
    }
}
