//! Per-channel event time of a Koala task (paper §3.2 and Appendix A, Algorithm 1 lines 7–10): the
//! minimum watermark over the live input channels, upstream and peer alike.
//!
//! Unlike [`crate::WatermarkAligner`], whose `current` never goes back, this reports the *true*
//! minimum: a peer channel that joins below the task's event time must pull the minimum down, or
//! the task would advance past records still coming over it. Monotone emission (lines 11–13) is
//! the task's job; the protocol guarantees a channel never joins below what the task has emitted.

use std::collections::BTreeMap;

use koala_types::Timestamp;

use super::error::ProtocolError;
use super::input::InputSource;

/// Watermark per live input channel; `None` until the channel sent one.
#[derive(Clone, Debug, Default)]
pub(crate) struct ChannelWatermarks {
    channels: BTreeMap<InputSource, Option<Timestamp>>,
    closed_any: bool,
}

impl ChannelWatermarks {
    /// Expects `channel`; it holds the minimum until it sends a watermark.
    pub(crate) fn add(&mut self, channel: InputSource) {
        self.channels.entry(channel).or_insert(None);
    }

    /// Records a watermark; a channel's watermarks may not go back.
    pub(crate) fn set(&mut self, channel: InputSource, time: Timestamp) -> Result<(), ProtocolError> {
        if let Some(slot) = self.channels.get_mut(&channel) {
            if let Some(last) = *slot
                && time < last
            {
                return Err(ProtocolError::WatermarkRegressed { last, got: time });
            }
            *slot = Some(time);
        }
        Ok(())
    }

    /// Each live upstream (data) channel's last watermark: what a task's checkpoint records.
    pub(crate) fn upstream_marks(&self) -> Vec<(koala_types::InputChannel, Option<Timestamp>)> {
        let upstream = |(c, w): (&InputSource, &Option<Timestamp>)| match c {
            InputSource::Upstream(c) => Some((*c, *w)),
            _ => None,
        };
        self.channels.iter().filter_map(upstream).collect()
    }

    /// A restored task's upstream channels' watermarks as its checkpoint recorded them; a
    /// channel it does not expect is ignored.
    pub(crate) fn restore_upstream(
        &mut self,
        marks: impl IntoIterator<Item = (koala_types::InputChannel, Timestamp)>,
    ) {
        for (channel, time) in marks {
            if let Some(slot) = self.channels.get_mut(&InputSource::Upstream(channel)) {
                *slot = Some(time);
            }
        }
    }

    /// The channel closed (end of stream, peer channel closed).
    pub(crate) fn close(&mut self, channel: InputSource) {
        if self.channels.remove(&channel).is_some() {
            self.closed_any = true;
        }
    }

    /// Minimum over live channels; `None` while one has not reported. Once every channel has closed
    /// the event time is `Timestamp::MAX`; a task that never had a channel has none.
    pub(crate) fn min(&self) -> Option<Timestamp> {
        self.min_over(|_| true)
    }

    /// Minimum over the upstream channels only: what bounds the records a sender still forwards.
    pub(crate) fn min_upstream(&self) -> Option<Timestamp> {
        self.min_over(|c| matches!(c, InputSource::Upstream(_)))
    }

    fn min_over(&self, include: impl Fn(&InputSource) -> bool) -> Option<Timestamp> {
        let mut live = self.channels.iter().filter(|(c, _)| include(c)).peekable();
        if live.peek().is_none() {
            return self.closed_any.then_some(Timestamp::MAX);
        }
        live.try_fold(Timestamp::MAX, |acc, (_, w)| w.map(|w| acc.min(w)))
    }
}

/// Multiset of event times of records a task holds but has not processed (inbox, parked, waiting
/// for state): the task's event time must stay below all of them. Its size is the task's
/// `queued_records` (docs/architecture.md §9).
#[derive(Clone, Debug, Default)]
pub(crate) struct HeldTimes(BTreeMap<Timestamp, usize>, usize);

impl HeldTimes {
    pub(crate) fn add(&mut self, time: Timestamp) {
        *self.0.entry(time).or_insert(0) += 1;
        self.1 += 1;
    }

    pub(crate) fn remove(&mut self, time: Timestamp) {
        if let Some(n) = self.0.get_mut(&time) {
            *n -= 1;
            self.1 -= 1;
            if *n == 0 {
                self.0.remove(&time);
            }
        }
    }

    pub(crate) fn min(&self) -> Option<Timestamp> {
        self.0.keys().next().copied()
    }

    /// The least held time at or past `from`.
    pub(crate) fn min_from(&self, from: Timestamp) -> Option<Timestamp> {
        self.0.range(from..).next().map(|(t, _)| *t)
    }

    /// How many records are held.
    pub(crate) fn len(&self) -> usize {
        self.1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use koala_types::{InputChannel, OperatorId, TaskId};

    #[test]
    fn joining_channel_pulls_the_minimum_down() {
        let u = InputSource::Upstream(InputChannel { input: 0, from: TaskId::new(OperatorId(0), 0) });
        let p = InputSource::Peer(TaskId::new(OperatorId(1), 0));
        let mut w = ChannelWatermarks::default();
        assert_eq!(w.min(), None);
        w.add(u);
        w.set(u, 10).expect("monotone");
        assert_eq!(w.min(), Some(10));
        w.add(p);
        assert_eq!(w.min(), None);
        w.set(p, 8).expect("monotone");
        assert_eq!(w.min(), Some(8));
        assert!(w.set(p, 7).is_err());
        w.close(p);
        assert_eq!(w.min(), Some(10));
        w.close(u);
        assert_eq!(w.min(), Some(Timestamp::MAX));
    }
}
