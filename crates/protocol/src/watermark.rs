//! Event-time alignment over a task's input channels (docs/architecture.md §4; paper Appendix A,
//! Alg. 1):
//! a task's event time is the minimum watermark over its live input channels, it never goes back,
//! and it does not advance while an expected channel has not sent a watermark yet.

use std::collections::BTreeMap;

use koala_types::Timestamp;

/// Tracks per-channel watermarks and the task's resulting watermark.
#[derive(Clone, Debug)]
pub struct WatermarkAligner<C: Ord + Clone> {
    channels: BTreeMap<C, Option<Timestamp>>,
    current: Option<Timestamp>,
}

impl<C: Ord + Clone> Default for WatermarkAligner<C> {
    fn default() -> Self {
        Self { channels: BTreeMap::new(), current: None }
    }
}

impl<C: Ord + Clone> WatermarkAligner<C> {
    /// An aligner expecting exactly these channels.
    pub fn new(channels: impl IntoIterator<Item = C>) -> Self {
        Self { channels: channels.into_iter().map(|c| (c, None)).collect(), current: None }
    }

    /// The task's watermark, once every live channel has sent one.
    pub fn current(&self) -> Option<Timestamp> {
        self.current
    }

    /// Expects one more channel; until it sends a watermark the task's event time holds.
    pub fn add_channel(&mut self, channel: C) {
        self.channels.entry(channel).or_insert(None);
    }

    /// Expects a channel that starts at a known watermark (e.g. one inherited from a sender).
    pub fn add_channel_at(&mut self, channel: C, watermark: Timestamp) {
        self.channels.insert(channel, Some(watermark));
    }

    /// The channels still open.
    pub fn channels(&self) -> impl Iterator<Item = C> + '_ {
        self.channels.keys().cloned()
    }

    /// Each open channel's last watermark (what a checkpoint records).
    pub fn watermarks(&self) -> impl Iterator<Item = (C, Option<Timestamp>)> + '_ {
        self.channels.iter().map(|(c, w)| (c.clone(), *w))
    }

    /// Number of channels still open.
    pub fn live_channels(&self) -> usize {
        self.channels.len()
    }

    /// Records a watermark from `channel`; returns the task's new watermark if it advanced.
    /// A regressing per-channel watermark is ignored (channels are FIFO and monotone).
    pub fn update(&mut self, channel: &C, watermark: Timestamp) -> Option<Timestamp> {
        if let Some(slot) = self.channels.get_mut(channel)
            && slot.is_none_or(|w| watermark > w)
        {
            *slot = Some(watermark);
        }
        self.recompute()
    }

    /// Closes `channel` (end of stream or peer channel closed); returns the new watermark if it
    /// advanced. With no channel left the watermark is `Timestamp::MAX`.
    pub fn close(&mut self, channel: &C) -> Option<Timestamp> {
        self.channels.remove(channel);
        self.recompute()
    }

    fn recompute(&mut self) -> Option<Timestamp> {
        let min = if self.channels.is_empty() {
            Some(Timestamp::MAX)
        } else {
            self.channels.values().try_fold(Timestamp::MAX, |acc, w| w.map(|w| acc.min(w)))
        };
        match (min, self.current) {
            (Some(m), Some(c)) if m > c => {
                self.current = Some(m);
                self.current
            }
            (Some(m), None) => {
                self.current = Some(m);
                self.current
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn holds_until_every_channel_reported() {
        let mut a = WatermarkAligner::new([1, 2]);
        assert_eq!(a.update(&1, 10), None);
        assert_eq!(a.update(&2, 7), Some(7));
        assert_eq!(a.update(&2, 12), Some(10));
        a.add_channel(3);
        assert_eq!(a.update(&1, 20), None, "new channel holds event time");
        assert_eq!(a.update(&3, 5), None, "never goes back");
        assert_eq!(a.current(), Some(10));
        assert_eq!(a.close(&3), Some(12));
        assert_eq!(a.close(&1), None);
        assert_eq!(a.close(&2), Some(Timestamp::MAX));
    }

    proptest! {
        #[test]
        fn monotone_and_never_above_a_live_channel(ops in proptest::collection::vec((0u8..3, 0u64..100, any::<bool>()), 0..60)) {
            let mut a = WatermarkAligner::new([0u8, 1, 2]);
            let mut last = None;
            for (ch, w, close) in ops {
                if close { a.close(&ch); } else { a.update(&ch, w); }
                let cur = a.current();
                prop_assert!(cur >= last);
                last = cur;
                if let Some(c) = cur {
                    for w in a.channels.values().flatten() {
                        prop_assert!(c <= *w || a.channels.is_empty());
                    }
                }
            }
        }
    }
}
