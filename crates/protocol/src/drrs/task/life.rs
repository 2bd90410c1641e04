//! When a DRRS task may exit (docs/protocols.md §11): one rule for the runtime's task loop
//! (`crates/runtime/src/task/drrs.rs`) and the simulator's DRRS tasks, which checks it after
//! every event under random schedules.
//!
//! A task takes part in a reconfiguration from its `Prepare` (if the plan keeps it live or
//! cancels it) until its part is over: the reconfiguration's last subscale finished here, or it
//! was cancelled and pushed every bucket it owned. It is *idle* once it takes part in none, is no
//! new task still waiting for its first subscale ([`UnstartedInputs`]), runs no subscale, holds
//! no record and its loop holds nothing to take or send ([`LoopHolds`]).
//!
//! An idle task whose every input ended ends its outputs and reports `InputsEnded`, once; it
//! exits when the coordinator released it too, as a stop-and-restart task does
//! (`crate::koala::TaskLife`). The engine releases the operator's live tasks once all of them
//! reported, never while a reconfiguration runs, and then refuses to reconfigure the operator:
//! no `Prepare` reaches a task that may have exited. A task that exited as soon as its inputs
//! ended raced with the coordinator: a `Prepare` sent before it heard that the upstreams
//! finished was never answered, the reconfiguration never completed, and the tasks it created
//! never exited, so the job never ended (the simulator's seed 486 of `scale_out`, seed 688 of
//! `rebalance` with two subscales). A cancelled task, whose inputs stay open, exits once
//! released with no bucket left (it ends its outputs then).

use koala_types::{InputChannel, TaskId};

use super::DrrsTask;
use crate::common::unstarted::UnstartedInputs;
use crate::control::ReconfigPlan;
use crate::drrs::Subscale;

/// The exit rule of one DRRS task and the state it keeps for it.
#[derive(Clone, Debug, Default)]
pub struct DrrsLife {
    /// The last reconfiguration the task was prepared for (its `InputsEnded` names it).
    epoch: koala_types::Epoch,
    /// The task reported `InputsEnded` (and ended its outputs).
    inputs_ended: bool,
    /// A reconfiguration this task takes part in and has not finished: it must not end before.
    taking_part: Option<koala_types::Epoch>,
    /// Whether that reconfiguration cancels this task.
    cancelled: bool,
    /// Whether the last subscale started here was its reconfiguration's last.
    last_subscale: bool,
    /// The coordinator released the task (everything it held was pushed).
    released: bool,
    /// A new task's channels until its first subscale.
    unstarted: UnstartedInputs,
}

/// What the task's loop holds outside the core, which the exit rule waits for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoopHolds {
    /// Data taken off the queues that the core did not take yet.
    pub input: bool,
    /// Messages or pushed buckets not handed to their lane yet.
    pub sends: bool,
}

impl DrrsLife {
    /// A task deployed with `channels`: with the job, or (`created_by_reconfiguration`) by a
    /// reconfiguration, whose core learns them at its first subscale.
    pub fn new(created_by_reconfiguration: bool, channels: impl IntoIterator<Item = InputChannel>) -> Self {
        Self { unstarted: UnstartedInputs::new(created_by_reconfiguration, channels), ..Self::default() }
    }

    /// `me` was prepared for `plan`: it takes part if the plan keeps it live or cancels it.
    pub fn prepared(&mut self, plan: &ReconfigPlan, me: TaskId) {
        self.epoch = plan.epoch;
        let live = plan.deployment.tasks.get(&me.operator).is_some_and(|t| t.contains(&me.index));
        self.cancelled = plan.cancelled.contains(&me.index);
        if live || self.cancelled {
            self.taking_part = Some(plan.epoch);
            self.last_subscale = false;
        }
    }

    /// A subscale starts here (the caller feeds `TaskEvent::Start` next): a new task's core
    /// learns its channels, those it was deployed with less those whose upstream ended since
    /// (the core drops the channels of upstreams the subscale does not list as running).
    pub fn begin(&mut self, core: &mut DrrsTask, subscale: &Subscale) {
        self.last_subscale = subscale.index + 1 == subscale.count;
        for channel in self.unstarted.start().open() {
            core.add_input(channel);
        }
    }

    /// `upstream` ended: the core's channels from it to end (none while the task has not
    /// started: they count as ended at its first subscale).
    pub fn upstream_ended(&mut self, core: &DrrsTask, upstream: TaskId) -> Vec<InputChannel> {
        if self.unstarted.upstream_ended(upstream) { Vec::new() } else { core.inputs_from(upstream) }
    }

    /// `AddInputs` brought `channel`: kept until the first subscale, or given to the core.
    pub fn add_input(&mut self, core: &mut DrrsTask, channel: InputChannel) {
        if !self.unstarted.add(channel) {
            core.add_input(channel);
        }
    }

    /// The coordinator released the task.
    pub fn release(&mut self) {
        self.released = true;
    }

    /// Whether the coordinator released the task.
    pub fn released(&self) -> bool {
        self.released
    }

    /// Whether the task was created by a reconfiguration and has not started yet.
    pub fn unstarted(&self) -> bool {
        self.unstarted.is_waiting()
    }

    /// Whether the task takes part in a reconfiguration that is not over for it.
    pub fn taking_part(&self) -> bool {
        self.taking_part.is_some()
    }

    /// After every event: the reconfiguration this task takes part in is over for it once its
    /// last subscale finished, or it was cancelled and pushed everything.
    pub fn check_taking_part(&mut self, core: &DrrsTask) {
        if self.taking_part.is_some()
            && !core.in_transition()
            && (self.last_subscale || (self.cancelled && core.owned_buckets().is_empty()))
        {
            self.taking_part = None;
        }
    }

    /// Whether the task reported `InputsEnded` (its outputs ended then).
    pub fn inputs_ended(&self) -> bool {
        self.inputs_ended
    }

    /// After every event: the epoch to report `InputsEnded` with, once, when every input ended
    /// and the task is idle (see the module docs; the caller fires every timer and ends its
    /// outputs first).
    pub fn check_inputs_ended(&mut self, core: &DrrsTask, holds: LoopHolds) -> Option<koala_types::Epoch> {
        if self.inputs_ended || core.has_inputs() || !self.idle(core, holds) {
            return None;
        }
        self.inputs_ended = true;
        Some(self.epoch)
    }

    /// Whether the task may exit (see the module docs): idle and released, and either its
    /// inputs ended (it reported) or it owns no bucket (a cancelled task). The caller ends its
    /// outputs first unless [`Self::inputs_ended`] did.
    pub fn may_exit(&self, core: &DrrsTask, holds: LoopHolds) -> bool {
        self.released && self.idle(core, holds) && (self.inputs_ended || core.owned_buckets().is_empty())
    }

    /// Nothing to do now or to come: no reconfiguration part, no first subscale awaited, no
    /// subscale running, no record held, nothing the loop holds.
    fn idle(&self, core: &DrrsTask, holds: LoopHolds) -> bool {
        self.taking_part.is_none()
            && !self.unstarted.is_waiting()
            && !holds.input
            && !holds.sends
            && !core.in_transition()
            && !core.is_busy()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use koala_types::OperatorId;

    use super::*;
    use crate::common::task_config::TaskConfig;
    use crate::control::{Deployment, Protocol};
    use crate::drrs::TaskEvent;

    const OP: OperatorId = OperatorId(1);

    fn up() -> TaskId {
        TaskId::new(OperatorId(0), 0)
    }

    fn channel() -> InputChannel {
        InputChannel { input: 0, from: up() }
    }

    fn task(i: u32, owned: &[u16], inputs: bool) -> DrrsTask {
        DrrsTask::new(TaskConfig {
            id: TaskId::new(OP, i),
            num_buckets: 2,
            owned: owned.iter().copied().collect(),
            inputs: if inputs { BTreeSet::from([channel()]) } else { BTreeSet::new() },
        })
    }

    fn plan(epoch: u64, live: &[u32], cancelled: &[u32]) -> ReconfigPlan {
        let tasks = BTreeMap::from([(OP, live.to_vec())]);
        let deployment = Deployment::for_tests(tasks, BTreeMap::new(), 2, Protocol::Drrs);
        ReconfigPlan {
            epoch,
            operator: OP,
            deployment,
            moves: BTreeMap::new(),
            upstreams: vec![up()],
            created: Vec::new(),
            cancelled: cancelled.to_vec(),
            retired: Vec::new(),
        }
    }

    fn subscale(epoch: u64, index: usize, count: usize) -> Subscale {
        Subscale {
            operator: OP,
            epoch,
            index,
            count,
            moves: BTreeMap::new(),
            upstreams: BTreeSet::from([up()]),
            wait_records: 8,
        }
    }

    #[test]
    fn a_task_whose_inputs_ended_reports_once_nothing_is_held_and_exits_once_released() {
        let mut core = task(0, &[0, 1], true);
        let mut life = DrrsLife::new(false, [channel()]);
        life.prepared(&plan(3, &[0], &[]), TaskId::new(OP, 0));
        life.begin(&mut core, &subscale(3, 0, 1));
        life.check_taking_part(&core);
        assert_eq!(life.check_inputs_ended(&core, LoopHolds::default()), None, "an input is open");
        core.on(TaskEvent::EndOfStream { channel: channel() });
        for held in [LoopHolds { input: true, sends: false }, LoopHolds { input: false, sends: true }] {
            assert_eq!(life.check_inputs_ended(&core, held), None);
        }
        assert_eq!(life.check_inputs_ended(&core, LoopHolds::default()), Some(3));
        assert_eq!(life.check_inputs_ended(&core, LoopHolds::default()), None, "reported once");
        assert!(!life.may_exit(&core, LoopHolds::default()), "a Prepare may still come");
        life.release();
        assert!(life.may_exit(&core, LoopHolds::default()));
        assert!(!life.may_exit(&core, LoopHolds { input: false, sends: true }));
    }

    #[test]
    fn a_task_prepared_before_its_inputs_ended_takes_part_before_it_reports() {
        let mut core = task(0, &[0, 1], true);
        let mut life = DrrsLife::new(false, [channel()]);
        core.on(TaskEvent::EndOfStream { channel: channel() });
        life.prepared(&plan(3, &[0, 1], &[]), TaskId::new(OP, 0));
        assert_eq!(life.check_inputs_ended(&core, LoopHolds::default()), None);
        life.begin(&mut core, &subscale(3, 0, 1));
        life.check_taking_part(&core);
        assert_eq!(life.check_inputs_ended(&core, LoopHolds::default()), Some(3));
    }

    #[test]
    fn a_released_task_with_open_inputs_exits_only_once_it_owns_nothing() {
        let core = task(0, &[0], true);
        let mut life = DrrsLife::new(false, [channel()]);
        assert!(!life.may_exit(&task(0, &[], true), LoopHolds::default()), "not released");
        life.release();
        assert!(!life.may_exit(&core, LoopHolds::default()), "it still owns bucket 0");
        let empty = task(0, &[], true);
        assert!(life.may_exit(&empty, LoopHolds::default()));
    }

    #[test]
    fn a_task_taking_part_stays_until_its_last_subscale_or_its_cancellation_is_over() {
        let core = task(0, &[], false);
        let mut life = DrrsLife::new(false, []);
        life.prepared(&plan(7, &[0], &[]), TaskId::new(OP, 0));
        assert!(life.taking_part());
        life.check_taking_part(&core);
        assert!(!life.may_exit(&core, LoopHolds::default()), "no subscale began yet");
        let mut core = core;
        life.begin(&mut core, &subscale(7, 0, 2));
        life.check_taking_part(&core);
        assert!(life.taking_part(), "one subscale of two");
        life.begin(&mut core, &subscale(7, 1, 2));
        life.check_taking_part(&core);
        assert!(!life.taking_part());
        life.release();
        assert!(life.may_exit(&core, LoopHolds::default()));

        let mut cancelled = DrrsLife::new(false, []);
        cancelled.prepared(&plan(8, &[1], &[0]), TaskId::new(OP, 0));
        cancelled.check_taking_part(&task(0, &[1], false));
        assert!(cancelled.taking_part(), "it still owns a bucket to push");
        cancelled.check_taking_part(&core);
        assert!(!cancelled.taking_part());
    }

    #[test]
    fn a_task_the_plan_retires_does_not_take_part() {
        let mut life = DrrsLife::new(false, []);
        life.prepared(&plan(7, &[1], &[]), TaskId::new(OP, 0));
        assert!(!life.taking_part());
    }

    #[test]
    fn a_new_task_waits_for_its_first_subscale_and_learns_its_open_channels() {
        let mut core = task(2, &[], false);
        let other = InputChannel { input: 0, from: TaskId::new(OperatorId(0), 1) };
        let mut life = DrrsLife::new(true, [channel(), other]);
        assert!(life.unstarted());
        assert!(!life.may_exit(&core, LoopHolds::default()));
        assert!(life.upstream_ended(&core, up()).is_empty(), "absorbed before the start");
        life.begin(&mut core, &subscale(7, 0, 1));
        assert!(!life.unstarted());
        assert_eq!(core.inputs_from(up()), Vec::new(), "its upstream ended before the start");
        assert_eq!(core.inputs_from(other.from), vec![other]);
        assert_eq!(life.upstream_ended(&core, other.from), vec![other]);
    }
}
