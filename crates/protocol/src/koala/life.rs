//! When a Koala task's inputs have ended and when it may exit: one rule for the runtime's task
//! loop (`crates/runtime/src/task/koala.rs`) and the simulator.
//!
//! A task's inputs have ended once no data channel is open, nothing is held or in transition,
//! and no epoch it takes buckets in is still to begin (the hand-over may still bring records and
//! timers; a task a reconfiguration created learns its channels at its first `Start`). It then
//! reports `InputsEnded` once, with the last epoch it knew of, and keeps serving state; it exits
//! once the coordinator released it too.

use koala_types::Epoch;

use super::task::KoalaTask;

/// The exit rule of one Koala task.
#[derive(Clone, Debug, Default)]
pub struct TaskLife {
    epoch: Epoch,
    /// An epoch this task was prepared for and takes buckets in, until its `Start`.
    receiving: Option<Epoch>,
    /// Created by a reconfiguration and not started yet (it knows no channel).
    unstarted: bool,
    inputs_ended: bool,
    released: bool,
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

    /// The task's core started `epoch`.
    pub fn started(&mut self, epoch: Epoch) {
        self.epoch = epoch;
        self.unstarted = false;
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

    /// After every event: the epoch to report `InputsEnded` with, once, when the task's inputs
    /// have just ended (the caller then fires every timer and ends its outputs).
    pub fn check_inputs_ended(&mut self, core: &KoalaTask) -> Option<Epoch> {
        if self.inputs_ended
            || self.receiving.is_some()
            || self.unstarted
            || core.has_inputs()
            || core.is_busy()
            || core.in_transition()
        {
            return None;
        }
        self.inputs_ended = true;
        Some(self.epoch)
    }

    /// Whether the task may exit: released, and its inputs ended (the runtime also waits until
    /// nothing it sends is still waiting for room).
    pub fn may_exit(&self) -> bool {
        self.released && self.inputs_ended
    }
}
