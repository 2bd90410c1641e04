//! When a task's inputs have ended and when it may exit: one rule for the runtime's task loops
//! (`crates/runtime/src/task/koala.rs`, `crates/runtime/src/task/operator.rs`) and the simulator.
//! It depends on no protocol: a Koala task passes its core as a [`CoreActivity`]; a task run by
//! a stop-and-restart `TargetCore` passes its open channels and whether its core is busy. (DRRS
//! tasks exit by their own rule, `crate::drrs::DrrsLife`.)
//!
//! **A task whose reconfigurations a stop-and-restart `TargetCore` runs** (stop-and-restart and
//! Remote tasks, and every task of a stateless operator under any protocol): its inputs have
//! ended once none of its data channels is open and its core runs no part of a reconfiguration.
//! It then ends its outputs, reports `InputsEnded` and waits for the coordinator's `Release`
//! (and for any part of a reconfiguration that started meanwhile) before it exits. Exiting at
//! once raced with the coordinator: a reconfiguration it started before it heard of the end
//! sent a `Prepare` the task never answered, and every other task of the operator waited for a
//! `Drain` that never came. Both checks run after **every** event the task handles, whichever
//! made them true (the last end of stream, a `Drain` after it that lets the task send its state,
//! the last `StateEnd` it awaited, the `Release`).
//!
//! **A Koala task of a keyed operator:**
//! A task's inputs have ended once no data channel is open, nothing is held, awaited or in transition,
//! and no epoch it takes buckets in is still to begin (the hand-over may still bring records and
//! timers; a task a reconfiguration created learns its channels at its first `Start`). It then
//! ends its outputs, reports `InputsEnded` with the last epoch it *started*, and keeps serving
//! state; it exits once the coordinator released it too. A task that reported and then starts
//! another epoch (its report crossed the epoch's `Prepare`) takes part in it — buckets, filters
//! and pulls to other tasks may come with it — so its report is stale: it reports again once that
//! part is over (its outputs stay ended), and the coordinator, which sent the `Start`, counts
//! only a report naming an epoch the task started at or after the last one it was sent
//! (`crate::engine::Engine`; the simulator's seed 288 of `scale_in_n4` exited a task that
//! another still pulled from without this). Nor does it report while a filter it asked for has
//! not arrived: the location could be released, and exit, before the request reached it.

use koala_types::Epoch;

/// What [`TaskLife::check_inputs_ended`] reads of a Koala task's core.
pub trait CoreActivity {
    /// Whether a data channel is still open.
    fn has_inputs(&self) -> bool;
    /// Whether it holds records or requests it has not finished.
    fn is_busy(&self) -> bool;
    /// Whether a membership filter it asked for has not arrived.
    fn awaits_filters(&self) -> bool;
    /// Whether it runs part of a reconfiguration.
    fn in_transition(&self) -> bool;
}

/// The exit rule of one Koala task.
#[derive(Clone, Debug, Default)]
pub struct TaskLife {
    epoch: Epoch,
    /// The last epoch the task started (its `InputsEnded` report names it).
    started_epoch: Epoch,
    /// An epoch this task was prepared for and takes buckets in, until its `Start`.
    receiving: Option<Epoch>,
    /// Created by a reconfiguration and not started yet (it knows no channel).
    unstarted: bool,
    inputs_ended: bool,
    /// The task ended its outputs (at its first `InputsEnded`).
    outputs_ended: bool,
    released: bool,
}

/// What [`TaskLife::check_inputs_ended`] tells the task to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InputsEnded {
    /// The epoch to report `InputsEnded` with: the last one the task started.
    pub epoch: Epoch,
    /// Whether to fire every timer and end the outputs first (the first report; a report again
    /// after a later epoch ended nothing new).
    pub end_outputs: bool,
}

impl TaskLife {
    /// A task deployed with the job, or (`created_by_reconfiguration`) by a reconfiguration.
    pub fn new(created_by_reconfiguration: bool) -> Self {
        Self { unstarted: created_by_reconfiguration, ..Self::default() }
    }

    /// The task was prepared for `epoch`; `receives`: it takes buckets in it.
    pub fn prepared(&mut self, epoch: Epoch, receives: bool) {
        self.epoch = epoch;
        if receives {
            self.receiving = Some(epoch);
        }
    }

    /// The task's core started `epoch`: an `InputsEnded` it reported is stale (see the module
    /// docs); it reports again once its part is over.
    pub fn started(&mut self, epoch: Epoch) {
        self.epoch = epoch;
        self.started_epoch = epoch;
        self.unstarted = false;
        self.inputs_ended = false;
        if self.receiving.is_some_and(|e| e <= epoch) {
            self.receiving = None;
        }
    }

    /// The last epoch the task was prepared for or started.
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// Whether the task was created by a reconfiguration and has not started yet.
    pub fn unstarted(&self) -> bool {
        self.unstarted
    }

    /// The coordinator released the task: nobody will fetch from it.
    pub fn release(&mut self) {
        self.released = true;
    }

    /// Whether the coordinator released the task.
    pub fn released(&self) -> bool {
        self.released
    }

    /// Whether the task's inputs ended (it reported `InputsEnded`).
    pub fn inputs_ended(&self) -> bool {
        self.inputs_ended
    }

    /// Whether the task ended its outputs (it reported `InputsEnded` at least once).
    pub fn outputs_ended(&self) -> bool {
        self.outputs_ended
    }

    /// After every event: whether to report `InputsEnded` now (the task's inputs have just ended,
    /// or ended again after an epoch it started since its report), and with which epoch.
    pub fn check_inputs_ended(&mut self, core: &impl CoreActivity) -> Option<InputsEnded> {
        if self.inputs_ended
            || self.receiving.is_some()
            || self.unstarted
            || core.has_inputs()
            || core.is_busy()
            || core.awaits_filters()
            || core.in_transition()
        {
            return None;
        }
        self.inputs_ended = true;
        let end_outputs = !std::mem::replace(&mut self.outputs_ended, true);
        Some(InputsEnded { epoch: self.started_epoch, end_outputs })
    }

    /// Whether the task may exit: released, and its inputs ended (the runtime also waits until
    /// nothing it sends is still waiting for room).
    pub fn may_exit(&self) -> bool {
        self.released && self.inputs_ended
    }

    /// A task run by a stop-and-restart `TargetCore` (see the module docs), after every event:
    /// the epoch to report `InputsEnded` with, once, when none of its `open_inputs` data channels
    /// is open and its core is not busy (the caller then ends its outputs).
    pub fn check_target_inputs_ended(&mut self, open_inputs: usize, core_busy: bool) -> Option<Epoch> {
        if self.inputs_ended || open_inputs > 0 || core_busy {
            return None;
        }
        self.inputs_ended = true;
        Some(self.epoch)
    }

    /// Whether a task run by a stop-and-restart `TargetCore` may exit: its inputs ended, the
    /// coordinator released it, and no part of a reconfiguration runs.
    pub fn target_may_exit(&self, core_busy: bool) -> bool {
        self.may_exit() && !core_busy
    }
}
