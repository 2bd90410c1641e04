//! The stop-and-restart core of a task feeding the reconfigured operator (docs/protocols.md §7):
//! it drains (a marker, then a pause) and resumes with the new routing table when the coordinator
//! says so.

use koala_types::Epoch;

use super::StopRestartError;
use crate::control::TaskAck;

/// Input of an [`UpstreamCore`]: the coordinator's phases, as the worker relays them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpstreamEvent {
    /// Send a marker to the reconfigured operator and pause.
    Drain {
        /// The reconfiguration.
        epoch: Epoch,
    },
    /// Switch to the plan's routing and resume.
    Resume {
        /// The reconfiguration.
        epoch: Epoch,
    },
}

/// Output of an [`UpstreamCore`], to execute in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UpstreamAction {
    /// Flush outputs and send `Marker(epoch)` on every output channel to the reconfigured
    /// operator (the runtime broadcasts on all outputs), then stop emitting.
    MarkAndPause {
        /// The reconfiguration.
        epoch: Epoch,
    },
    /// Switch the edges to the reconfigured operator to the plan's routing and resume emitting.
    SwitchAndResume {
        /// The reconfiguration.
        epoch: Epoch,
    },
    /// Acknowledge to the coordinator (`Paused`, `Resumed`).
    Ack {
        /// The reconfiguration.
        epoch: Epoch,
        /// The ack.
        ack: TaskAck,
    },
    /// The event was refused; the core is unchanged and the task must fail.
    Error(StopRestartError),
}

/// An upstream task of the reconfigured operator.
#[derive(Clone, Debug, Default)]
pub struct UpstreamCore {
    paused: Option<Epoch>,
}

impl UpstreamCore {
    /// The core of a task that is not paused.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds one event; returns what to do, in order.
    pub fn on(&mut self, event: UpstreamEvent) -> Vec<UpstreamAction> {
        match (event, self.paused) {
            (UpstreamEvent::Drain { epoch: got }, Some(paused)) => {
                vec![UpstreamAction::Error(StopRestartError::DrainWhilePaused { paused, got })]
            }
            (UpstreamEvent::Drain { epoch }, None) => {
                self.paused = Some(epoch);
                vec![
                    UpstreamAction::MarkAndPause { epoch },
                    UpstreamAction::Ack { epoch, ack: TaskAck::Paused },
                ]
            }
            (UpstreamEvent::Resume { epoch }, None) => {
                vec![UpstreamAction::Error(StopRestartError::ResumeWithoutDrain { epoch })]
            }
            (UpstreamEvent::Resume { epoch: got }, Some(paused)) if got != paused => {
                vec![UpstreamAction::Error(StopRestartError::ResumeOfOtherEpoch { paused, got })]
            }
            (UpstreamEvent::Resume { epoch }, Some(_)) => {
                self.paused = None;
                vec![
                    UpstreamAction::SwitchAndResume { epoch },
                    UpstreamAction::Ack { epoch, ack: TaskAck::Resumed },
                ]
            }
        }
    }

    /// The epoch this task is paused for, if it is.
    pub fn paused(&self) -> Option<Epoch> {
        self.paused
    }
}
