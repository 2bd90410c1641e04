//! The input channels of a task a reconfiguration created, until its first start: one rule for
//! the Koala and DRRS task loops of the runtime (`crates/runtime/src/task/koala.rs`,
//! `crates/runtime/src/task/drrs.rs`) and the simulator's DRRS tasks.
//!
//! A new task's core learns its channels at its first start (a Koala `Start`, a DRRS subscale):
//! before that it owns nothing and must emit no watermark, since its senders hand it records
//! without waiting for its event time. Until then the task keeps the channels it was deployed
//! with, those an `AddInputs` adds, and those whose upstream ended meanwhile (the end of stream
//! went to the task, not its core).
//!
//! ```
//! use koala_protocol::UnstartedInputs;
//! use koala_types::{InputChannel, OperatorId, TaskId};
//!
//! let (a, b) = (TaskId::new(OperatorId(0), 0), TaskId::new(OperatorId(0), 1));
//! let (from_a, from_b) = (InputChannel { input: 0, from: a }, InputChannel { input: 0, from: b });
//! let mut inputs = UnstartedInputs::new(true, [from_a]);
//! assert!(inputs.add(from_b));
//! assert!(inputs.upstream_ended(a));
//! let first = inputs.start();
//! assert_eq!(first.open().collect::<Vec<_>>(), vec![from_b]);
//! // Started: the core takes what comes next itself.
//! assert!(!inputs.upstream_ended(b));
//! ```

use std::collections::BTreeSet;

use koala_types::{InputChannel, TaskId};

/// A new task's input channels until its first start (see the module docs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UnstartedInputs {
    /// `None` once the task started (or when it was deployed with the job).
    waiting: Option<FirstStart>,
}

/// The channels a new task gives its core at its first start.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FirstStart {
    /// Every channel the task will have had, those that ended included.
    pub channels: BTreeSet<InputChannel>,
    /// Those whose upstream ended before the start.
    pub ended: BTreeSet<InputChannel>,
}

impl FirstStart {
    /// The channels still open: every channel less those that ended.
    pub fn open(&self) -> impl Iterator<Item = InputChannel> + '_ {
        self.channels.difference(&self.ended).copied()
    }
}

impl UnstartedInputs {
    /// A task deployed with `channels`; one deployed with the job (`created_by_reconfiguration`
    /// false) gave them to its core already and keeps nothing.
    pub fn new(created_by_reconfiguration: bool, channels: impl IntoIterator<Item = InputChannel>) -> Self {
        let waiting = created_by_reconfiguration
            .then(|| FirstStart { channels: channels.into_iter().collect(), ended: BTreeSet::new() });
        Self { waiting }
    }

    /// Whether the task was created by a reconfiguration and has not started yet.
    pub fn is_waiting(&self) -> bool {
        self.waiting.is_some()
    }

    /// `upstream` ended: whether this absorbed it (the task has not started; its channels from
    /// `upstream` count as ended). If not, the caller ends the core's channels from it.
    pub fn upstream_ended(&mut self, upstream: TaskId) -> bool {
        let Some(w) = self.waiting.as_mut() else { return false };
        w.ended.extend(w.channels.iter().filter(|c| c.from == upstream));
        true
    }

    /// `AddInputs` brought `channel`: whether this kept it (the task has not started). If not,
    /// the caller gives it to the core.
    pub fn add(&mut self, channel: InputChannel) -> bool {
        let Some(w) = self.waiting.as_mut() else { return false };
        w.channels.insert(channel);
        true
    }

    /// The task starts: the channels to give its core (nothing after the first start, or for a
    /// task deployed with the job).
    pub fn start(&mut self) -> FirstStart {
        self.waiting.take().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use koala_types::OperatorId;

    use super::*;

    fn up(i: u32) -> TaskId {
        TaskId::new(OperatorId(0), i)
    }

    fn ch(input: usize, from: u32) -> InputChannel {
        InputChannel { input, from: up(from) }
    }

    #[test]
    fn a_task_deployed_with_the_job_keeps_nothing() {
        let mut inputs = UnstartedInputs::new(false, [ch(0, 0)]);
        assert!(!inputs.is_waiting());
        assert!(!inputs.upstream_ended(up(0)));
        assert!(!inputs.add(ch(0, 1)));
        assert_eq!(inputs.start(), FirstStart::default());
    }

    #[test]
    fn an_ended_upstream_ends_all_its_channels_and_only_them() {
        // A self-join: two channels from upstream 0.
        let mut inputs = UnstartedInputs::new(true, [ch(0, 0), ch(1, 0), ch(0, 1)]);
        assert!(inputs.upstream_ended(up(0)));
        let first = inputs.start();
        assert_eq!(first.ended, BTreeSet::from([ch(0, 0), ch(1, 0)]));
        assert_eq!(first.channels.len(), 3);
        assert_eq!(first.open().collect::<Vec<_>>(), vec![ch(0, 1)]);
    }

    #[test]
    fn added_channels_join_and_an_earlier_end_does_not_cover_them() {
        let mut inputs = UnstartedInputs::new(true, [ch(0, 0)]);
        assert!(inputs.upstream_ended(up(1)));
        assert!(inputs.add(ch(0, 1)));
        let first = inputs.start();
        assert_eq!(first.open().collect::<Vec<_>>(), vec![ch(0, 0), ch(0, 1)]);
        assert!(first.ended.is_empty());
    }

    #[test]
    fn only_the_first_start_gives_channels() {
        let mut inputs = UnstartedInputs::new(true, [ch(0, 0)]);
        assert!(inputs.is_waiting());
        assert_eq!(inputs.start().channels.len(), 1);
        assert!(!inputs.is_waiting());
        assert_eq!(inputs.start(), FirstStart::default());
        assert!(!inputs.upstream_ended(up(0)));
        assert!(!inputs.add(ch(0, 2)));
    }
}
