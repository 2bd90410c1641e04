//! The bound on what a Koala task holds (`[runtime] max_queued_records`, docs/architecture.md
//! §4): when the task takes data input, and how much of a batch, so it never holds more than the
//! bound and nothing deadlocks.

use std::collections::VecDeque;

use koala_types::{InputChannel, Record};

use super::task::{KoalaTask, Route};

impl KoalaTask {
    /// Records parked until a sender's peer channel closes (per-key FIFO).
    fn parked_records(&self) -> usize {
        self.transition.as_ref().map_or(0, |t| t.parked.values().map(VecDeque::len).sum())
    }

    /// Whether the task takes any data-channel input now (bounded memory, docs/architecture.md
    /// §4): not once it holds `max_queued_records`. Then the backlog waits upstream
    /// (backpressure, source lag); commands, peer and fetch lanes keep flowing, and what the task
    /// holds drains without data input (see [`Self::data_room`]).
    pub fn takes_data(&self) -> bool {
        if self.fault_hold_back_after_marker.on() {
            return self.transition.as_ref().is_some_and(|t| !t.markers_pending.is_empty())
                || self.queued_records() < self.max_queued;
        }
        self.queued_records() < self.max_queued
    }

    /// How many of `records`, from the front, the task takes now from data channel `channel`;
    /// the rest stays at the head of the channel (the runtime and the simulator split the
    /// batch), and a channel whose head is refused entirely waits at its sender. With this rule
    /// [`Self::queued_records`] never exceeds `max_queued_records`, and nothing deadlocks:
    /// - queued records drain with fetch answers alone, which every task serves whatever it
    ///   waits for;
    /// - parked records (those of a bucket whose sender's peer channel is open, which only come
    ///   after this channel's marker) wait for the sender's `Close`, which waits for the sender's
    ///   markers and for everything it forwards on the peer lane; so they may fill at most
    ///   `max_queued_records − 1`, and a record that would park past that is refused: room for
    ///   one record always comes back, for the channels whose marker is still to come (they
    ///   carry no parked records, so a task reaches its markers) and for forwarded records
    ///   ([`Self::peer_room`]). Two tasks that hand buckets to each other, each full of the
    ///   other's parked records, would otherwise never reach their markers.
    pub fn data_room(&self, channel: InputChannel, records: &[Record]) -> usize {
        let queued = self.queued_records();
        let room = self.max_queued.saturating_sub(queued);
        if self.fault_hold_back_after_marker.on() {
            return self.reverted_data_room(channel, records.len());
        }
        let Some(t) = &self.transition else { return room.min(records.len()) };
        // Fast path: even if every one parked, parked records stay below the bound.
        if queued + records.len() < self.max_queued {
            return records.len();
        }
        let mut parked = self.parked_records();
        for (taken, r) in records.iter().enumerate() {
            if taken == room {
                return taken;
            }
            let bucket = koala_types::bucket_of(&r.key, self.num_buckets);
            if matches!(t.route_direct(channel, bucket, !self.fault_no_parking.on()), Some(Route::Park)) {
                if parked + 1 >= self.max_queued {
                    return taken;
                }
                parked += 1;
            }
        }
        records.len()
    }

    /// How many of `records` forwarded on the peer lane the task takes now (they queue; the
    /// rest stays at the head of the lane): the room left under `max_queued_records`.
    pub fn peer_room(&self, records: usize) -> usize {
        self.max_queued.saturating_sub(self.queued_records()).min(records)
    }

    /// Fault injection for the simulator's negative tests: the rule tried and reverted on
    /// 2026-12-02 (`0e8e770`). Parked records do not count while a marker is still to come, and
    /// every channel whose marker is in waits at its sender until the task's markers are all in,
    /// whatever its records are (the runtime held them back once the task held the bound minus
    /// what its queue might still deliver, 16 384 records by default: at small bounds, always).
    #[cfg(any(test, feature = "sim"))]
    #[doc(hidden)]
    pub fn inject_fault_hold_back_after_marker(&mut self) {
        self.fault_hold_back_after_marker.set();
    }

    fn reverted_data_room(&self, channel: InputChannel, records: usize) -> usize {
        let held = self.queued_records();
        match &self.transition {
            Some(t) if !t.markers_pending.is_empty() => {
                let parked = self.parked_records();
                let takes = held - parked.min(held) < self.max_queued;
                if t.markers_pending.contains(&channel) && takes { records } else { 0 }
            }
            _ if held < self.max_queued => records,
            _ => 0,
        }
    }
}
