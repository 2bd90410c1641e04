//! The routing core of an upstream task (paper §3.1 step 4): it routes records by bucket with its
//! routing table (RT), broadcasts watermarks, and on `Switch` atomically installs the new
//! table and injects a marker — followed by its current watermark — into every output channel of
//! the old and the new configuration, so each target task learns that nothing routed by the old
//! table follows; a channel the new configuration drops then ends. The runtime's output edges
//! (`crates/runtime/src/output.rs`) and the simulator run this one core.

use std::collections::{BTreeMap, BTreeSet};

use koala_types::{ChannelMessage, Epoch, Record, TaskId, Timestamp, bucket_of};

use super::error::ProtocolError;

/// Input of an [`UpstreamRouter`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RouterEvent {
    /// Records the upstream task produced, in order.
    Records(Vec<Record>),
    /// The upstream task's event time advanced.
    Watermark(Timestamp),
    /// Switch to `assignment` (bucket → task; an unkeyed edge's outputs) with markers, keeping
    /// channels to the tasks `keep` as outputs besides the table's: live tasks that own no bucket
    /// in it (a DRRS subscale's intermediate table). They get markers and watermarks, and no end
    /// of stream. Koala sends it once every `PeerReady` arrived; DRRS once per subscale.
    Switch {
        /// The epoch the markers carry.
        epoch: Epoch,
        /// The new routing table.
        assignment: Vec<TaskId>,
        /// Tasks kept as outputs besides the table's.
        keep: Vec<TaskId>,
    },
    /// Stop-and-restart's drain: a marker into every output channel of the current table; the
    /// caller then pauses until [`RouterEvent::Reroute`].
    Mark {
        /// The epoch.
        epoch: Epoch,
    },
    /// Stop-and-restart's resume: install `assignment` without markers (every channel carried
    /// the epoch's marker at the drain); new output channels get the current watermark, dropped
    /// ones end.
    Reroute {
        /// The epoch.
        epoch: Epoch,
        /// The new routing table.
        assignment: Vec<TaskId>,
    },
    /// The upstream task ended.
    EndOfStream,
}

/// Output of an [`UpstreamRouter`]: one message on the channel to `to`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RouterAction {
    /// Send `message` on the data channel to `to` (opening it first if it is new).
    Send {
        /// The target task.
        to: TaskId,
        /// The message.
        message: ChannelMessage,
    },
    /// The event was rejected.
    Error(ProtocolError),
}

/// Routing table and marker injection of one upstream task towards one input of an operator.
///
/// A keyed router routes records by bucket through its table. An unkeyed one (a forward or
/// round-robin edge, [`UpstreamRouter::unkeyed`]) has no table: the caller spreads records over
/// its outputs, and the `assignment` of a switch names the new outputs.
#[derive(Clone, Debug)]
pub struct UpstreamRouter {
    /// Bucket → task; empty for an unkeyed router.
    table: Vec<TaskId>,
    outputs: BTreeSet<TaskId>,
    watermark: Option<Timestamp>,
    epoch: Epoch,
    ended: bool,
}

impl UpstreamRouter {
    /// A router with the initial routing table `assignment` (bucket → task).
    pub fn new(assignment: Vec<TaskId>) -> Result<Self, ProtocolError> {
        check_table(&assignment)?;
        let outputs = assignment.iter().copied().collect();
        Ok(Self { table: assignment, outputs, watermark: None, epoch: 0, ended: false })
    }

    /// A router with the table `assignment` and output channels also to the tasks `keep` (live
    /// tasks that own no bucket in it, as [`RouterEvent::Switch`] keeps them).
    pub fn keeping(assignment: Vec<TaskId>, keep: Vec<TaskId>) -> Result<Self, ProtocolError> {
        let mut router = Self::new(assignment)?;
        router.outputs.extend(keep);
        Ok(router)
    }

    /// An unkeyed router over the output channels to `outputs`.
    pub fn unkeyed(outputs: Vec<TaskId>) -> Result<Self, ProtocolError> {
        if outputs.is_empty() {
            return Err(ProtocolError::InvalidAssignment { reason: "an edge to no task".into() });
        }
        let outputs = outputs.into_iter().collect();
        Ok(Self { table: Vec::new(), outputs, watermark: None, epoch: 0, ended: false })
    }

    /// Whether records are routed by bucket (else the caller spreads them over the outputs).
    pub fn is_keyed(&self) -> bool {
        !self.table.is_empty()
    }

    /// The task the record with `key` goes to (a keyed router's decision), `None` if unkeyed.
    pub fn route(&self, key: &[u8]) -> Option<TaskId> {
        let n = u16::try_from(self.table.len()).ok().filter(|&n| n > 0)?;
        self.table.get(usize::from(bucket_of(key, n))).copied()
    }

    /// The tasks with an open output channel, in order.
    pub fn outputs(&self) -> &BTreeSet<TaskId> {
        &self.outputs
    }

    /// Whether the upstream ended (every output got its end of stream).
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// The last epoch whose routing switch this upstream applied (0 = the initial table).
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// The current routing table.
    pub fn table(&self) -> &[TaskId] {
        &self.table
    }

    /// Feeds one event; returns the messages to send, in order.
    pub fn on(&mut self, event: RouterEvent) -> Vec<RouterAction> {
        match self.handle(event) {
            Ok(out) => out,
            Err(e) => vec![RouterAction::Error(e)],
        }
    }

    fn handle(&mut self, event: RouterEvent) -> Result<Vec<RouterAction>, ProtocolError> {
        let mut out = Vec::new();
        match event {
            RouterEvent::Records(records) => {
                let mut per: BTreeMap<TaskId, Vec<Record>> = BTreeMap::new();
                for r in records {
                    let to = self.route(&r.key).ok_or_else(|| ProtocolError::InvalidAssignment {
                        reason: "records through an unkeyed router (its caller spreads them)".into(),
                    })?;
                    per.entry(to).or_default().push(r);
                }
                out.extend(
                    per.into_iter()
                        .map(|(to, rs)| RouterAction::Send { to, message: ChannelMessage::Batch(rs) }),
                );
            }
            RouterEvent::Watermark(time) => {
                if let Some(last) = self.watermark.filter(|&l| time < l) {
                    return Err(ProtocolError::WatermarkRegressed { last, got: time });
                }
                self.watermark = Some(time);
                out.extend(
                    self.outputs
                        .iter()
                        .map(|&to| RouterAction::Send { to, message: ChannelMessage::Watermark(time) }),
                );
            }
            // A finished upstream task is gone: it switches nothing. The coordinator learns that
            // it finished and tells the epoch's new tasks instead.
            RouterEvent::Switch { .. } | RouterEvent::Reroute { .. } if self.ended => {}
            RouterEvent::Mark { .. } if self.ended => {}
            RouterEvent::Switch { epoch, assignment, keep } => {
                self.switch(epoch, assignment, keep, &mut out)?;
            }
            RouterEvent::Mark { epoch } => {
                if epoch <= self.epoch {
                    return Err(ProtocolError::StaleEpoch { got: epoch, current: self.epoch });
                }
                out.extend(
                    self.outputs
                        .iter()
                        .map(|&to| RouterAction::Send { to, message: ChannelMessage::Marker(epoch) }),
                );
            }
            RouterEvent::Reroute { epoch, assignment } => {
                self.check_switch(epoch, &assignment)?;
                let new_outputs = assignment.iter().copied().collect();
                let old = std::mem::take(&mut self.outputs);
                end_dropped(&old, &new_outputs, &mut out);
                self.install_outputs(epoch, assignment, new_outputs, &mut out);
                // Old channels already have the current watermark.
                out.retain(|a| {
                    !matches!(a, RouterAction::Send { to, message: ChannelMessage::Watermark(_) } if old.contains(to))
                });
            }
            RouterEvent::EndOfStream => {
                if !self.ended {
                    self.ended = true;
                    out.extend(
                        self.outputs
                            .iter()
                            .map(|&to| RouterAction::Send { to, message: ChannelMessage::EndOfStream }),
                    );
                }
            }
        }
        Ok(out)
    }
}

impl UpstreamRouter {
    /// A switch with markers: one on every channel of the old and the new outputs, then the end
    /// of every dropped channel, then the current watermark on every new output.
    fn switch(
        &mut self,
        epoch: Epoch,
        assignment: Vec<TaskId>,
        keep: Vec<TaskId>,
        out: &mut Vec<RouterAction>,
    ) -> Result<(), ProtocolError> {
        self.check_switch(epoch, &assignment)?;
        let mut new_outputs: BTreeSet<TaskId> = assignment.iter().copied().collect();
        new_outputs.extend(keep);
        for &to in self.outputs.union(&new_outputs) {
            out.push(RouterAction::Send { to, message: ChannelMessage::Marker(epoch) });
        }
        end_dropped(&self.outputs, &new_outputs, out);
        self.install_outputs(epoch, assignment, new_outputs, out);
        Ok(())
    }

    fn check_switch(&self, epoch: Epoch, assignment: &[TaskId]) -> Result<(), ProtocolError> {
        if epoch <= self.epoch {
            return Err(ProtocolError::StaleEpoch { got: epoch, current: self.epoch });
        }
        if !self.is_keyed() {
            return if assignment.is_empty() {
                Err(ProtocolError::InvalidAssignment { reason: "an edge to no task".into() })
            } else {
                Ok(())
            };
        }
        if assignment.len() != self.table.len() {
            return Err(ProtocolError::InvalidAssignment {
                reason: format!("{} buckets instead of {}", assignment.len(), self.table.len()),
            });
        }
        Ok(())
    }

    /// Installs a new table with these output channels (the table's tasks and any kept ones); the
    /// current watermark is the first thing every new output channel carries after its marker
    /// (paper §3.2).
    fn install_outputs(
        &mut self,
        epoch: Epoch,
        assignment: Vec<TaskId>,
        new_outputs: BTreeSet<TaskId>,
        out: &mut Vec<RouterAction>,
    ) {
        if let Some(w) = self.watermark {
            out.extend(
                new_outputs
                    .iter()
                    .map(|&to| RouterAction::Send { to, message: ChannelMessage::Watermark(w) }),
            );
        }
        self.epoch = epoch;
        if self.is_keyed() {
            self.table = assignment;
        }
        self.outputs = new_outputs;
    }
}

/// The end of stream on every channel of `old` that `new` drops: nothing follows on it.
fn end_dropped(old: &BTreeSet<TaskId>, new: &BTreeSet<TaskId>, out: &mut Vec<RouterAction>) {
    out.extend(
        old.difference(new).map(|&to| RouterAction::Send { to, message: ChannelMessage::EndOfStream }),
    );
}

fn check_table(table: &[TaskId]) -> Result<(), ProtocolError> {
    if table.is_empty() || table.len() > usize::from(u16::MAX) {
        return Err(ProtocolError::InvalidAssignment { reason: format!("{} buckets", table.len()) });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use koala_types::OperatorId;

    #[test]
    fn switch_injects_marker_then_watermark_and_reroutes() {
        let (a, b) = (TaskId::new(OperatorId(1), 0), TaskId::new(OperatorId(1), 1));
        let mut r = UpstreamRouter::new(vec![a, a]).expect("table");
        r.on(RouterEvent::Watermark(7));
        let out = r.on(RouterEvent::Switch { epoch: 1, assignment: vec![a, b], keep: vec![] });
        assert_eq!(
            out,
            vec![
                RouterAction::Send { to: a, message: ChannelMessage::Marker(1) },
                RouterAction::Send { to: b, message: ChannelMessage::Marker(1) },
                RouterAction::Send { to: a, message: ChannelMessage::Watermark(7) },
                RouterAction::Send { to: b, message: ChannelMessage::Watermark(7) },
            ]
        );
        assert!(matches!(
            r.on(RouterEvent::Switch { epoch: 1, assignment: vec![a, b], keep: vec![] })[..],
            [RouterAction::Error(_)]
        ));
        assert!(matches!(r.on(RouterEvent::Watermark(3))[..], [RouterAction::Error(_)]));
    }

    /// A channel a switch drops gets its marker, then its end; one a resume drops, its end.
    #[test]
    fn dropped_channels_end() {
        let (a, b) = (TaskId::new(OperatorId(1), 0), TaskId::new(OperatorId(1), 1));
        let mut r = UpstreamRouter::new(vec![a, b]).expect("table");
        let out = r.on(RouterEvent::Switch { epoch: 1, assignment: vec![b, b], keep: vec![] });
        assert_eq!(
            out,
            vec![
                RouterAction::Send { to: a, message: ChannelMessage::Marker(1) },
                RouterAction::Send { to: b, message: ChannelMessage::Marker(1) },
                RouterAction::Send { to: a, message: ChannelMessage::EndOfStream },
            ]
        );
        assert_eq!(r.route(b"k"), Some(b));
        r.on(RouterEvent::Watermark(5));
        let out = r.on(RouterEvent::Reroute { epoch: 2, assignment: vec![a, a] });
        assert_eq!(
            out,
            vec![
                RouterAction::Send { to: b, message: ChannelMessage::EndOfStream },
                RouterAction::Send { to: a, message: ChannelMessage::Watermark(5) },
            ]
        );
        assert_eq!(r.outputs().iter().copied().collect::<Vec<_>>(), vec![a]);
    }

    /// An unkeyed router's switch names its outputs; it routes no records itself.
    #[test]
    fn unkeyed_router_switches_outputs() {
        let (a, b) = (TaskId::new(OperatorId(1), 0), TaskId::new(OperatorId(1), 1));
        let mut r = UpstreamRouter::unkeyed(vec![a]).expect("outputs");
        assert!(!r.is_keyed());
        assert_eq!(r.route(b"k"), None);
        let out = r.on(RouterEvent::Switch { epoch: 3, assignment: vec![b], keep: vec![] });
        assert_eq!(
            out,
            vec![
                RouterAction::Send { to: a, message: ChannelMessage::Marker(3) },
                RouterAction::Send { to: b, message: ChannelMessage::Marker(3) },
                RouterAction::Send { to: a, message: ChannelMessage::EndOfStream },
            ]
        );
        assert!(matches!(r.on(RouterEvent::Records(vec![])).as_slice(), []));
        assert!(UpstreamRouter::unkeyed(vec![]).is_err());
    }

    /// DRRS keeps channels to tasks that own nothing in an intermediate table.
    #[test]
    fn switch_keeping_marks_and_feeds_kept_outputs() {
        let (a, b) = (TaskId::new(OperatorId(1), 0), TaskId::new(OperatorId(1), 1));
        let mut r = UpstreamRouter::new(vec![a, b]).expect("table");
        let out = r.on(RouterEvent::Switch { epoch: 1, assignment: vec![b, b], keep: vec![a] });
        assert_eq!(
            out,
            vec![
                RouterAction::Send { to: a, message: ChannelMessage::Marker(1) },
                RouterAction::Send { to: b, message: ChannelMessage::Marker(1) },
            ]
        );
        let out = r.on(RouterEvent::Watermark(4));
        assert_eq!(out.len(), 2, "the kept task still gets watermarks: {out:?}");
    }
}
