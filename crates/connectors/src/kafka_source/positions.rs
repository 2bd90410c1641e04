//! A Kafka source's positions outside the job: what a checkpoint records and a restored source
//! seeks to ([`SourcePosition::Offsets`], docs/architecture.md §10), and the consumer-group
//! commits of `start = "committed"`.

use std::time::{Duration, Instant};

use koala_dataflow::{DataflowError, Restored};
use koala_types::{PartitionOffset, SourcePosition};
use tracing::warn;

use super::{COMMIT_INTERVAL, KafkaSource, StartAt, assigned_partitions};
use crate::block_on_within;

impl KafkaSource {
    /// Every opened partition's next offset to emit, for a checkpoint. A source not connected
    /// yet connects first unless it starts at the earliest offsets: under `latest` or
    /// `committed` a partition without a position would start where that says *when restored*,
    /// not where this run started. If the broker is unreachable, a restore resolves those
    /// partitions again (and says so now).
    pub(super) fn checkpoint_offsets(&mut self) -> Vec<PartitionOffset> {
        if self.readers.is_none()
            && self.settings.start != StartAt::Earliest
            && !matches!(self.ensure_connected(), Ok(true))
        {
            warn!(
                topic = %self.settings.topic,
                "checkpoint before the source could open its partitions: a restore starts them at {:?} again",
                self.settings.start
            );
        }
        let topic = &self.settings.topic;
        self.positions()
            .into_iter()
            .map(|(partition, offset)| PartitionOffset { topic: topic.clone(), partition, offset })
            .collect()
    }

    /// Seeks where a checkpoint recorded this source (before it connects): each recorded
    /// partition starts at its offset; one opened since starts where `start` says. Refuses a
    /// position of another kind, another topic, or a partition this task does not read (the
    /// source's parallelism changed), naming the fix.
    pub(super) fn restore_offsets(&mut self, position: &SourcePosition) -> Result<Restored, DataflowError> {
        let topic = &self.settings.topic;
        let offsets = match position {
            SourcePosition::Finished => return Ok(Restored { skipped: 0, finished: true }),
            SourcePosition::Offsets(offsets) => offsets,
            SourcePosition::Records(_) => {
                return Err(DataflowError::Other(format!(
                    "the checkpoint recorded {position} for this Kafka source of {topic}, which resumes \
                     at partition offsets: the checkpoint was taken by a job whose source was a \
                     generator; resume it with the config it was taken with"
                )));
            }
        };
        if self.readers.is_some() {
            return Err(DataflowError::Other(format!(
                "the Kafka source of {topic} was restored after it started reading"
            )));
        }
        let (index, parallelism) = (self.task.index, self.task.parallelism);
        for PartitionOffset { topic: recorded, partition, .. } in offsets {
            if recorded != topic {
                return Err(DataflowError::Other(format!(
                    "the checkpoint recorded topic {recorded} for this source, which reads {topic}: \
                     [params.kafka] names other topics than when the checkpoint was taken; set them back"
                )));
            }
            if assigned_partitions(&[*partition], index, parallelism).is_empty() {
                return Err(DataflowError::Other(format!(
                    "the checkpoint recorded partition {partition} of {topic} for source task {index}, \
                     which reads the partitions p with p % {parallelism} = {index}: the source's \
                     parallelism is not the one the checkpoint ran with; set it back in [parallelism]"
                )));
            }
        }
        self.resume_from = offsets.iter().map(|o| (o.partition, o.offset)).collect();
        Ok(Restored::default())
    }

    /// `StartAt::Committed`: commits the positions if they changed, at most once per
    /// [`COMMIT_INTERVAL`] unless `now`. A failed commit is logged and tried again later: it
    /// never fails the task.
    pub(super) fn commit_positions(&mut self, now: bool) {
        if self.group.is_none() || self.committed_at.is_some_and(|at| !now && at.elapsed() < COMMIT_INTERVAL)
        {
            return;
        }
        let positions = self.positions();
        if positions == self.committed {
            return;
        }
        self.committed_at = Some(Instant::now());
        let (Some(rt), Some(group)) = (self.rt.as_ref(), self.group.as_mut()) else {
            return;
        };
        let topic = &self.settings.topic;
        match block_on_within(
            rt,
            Duration::from_secs(5),
            "committing offsets",
            group.commit(topic, &positions),
        ) {
            Ok(()) => self.committed = positions,
            Err(e) => {
                warn!(topic = %topic, group = %self.settings.group, "kafka offset commit failed, retrying: {e}")
            }
        }
    }
}

impl Drop for KafkaSource {
    fn drop(&mut self) {
        self.commit_positions(true);
    }
}

#[cfg(test)]
mod tests {
    use koala_dataflow::{SourceLogic, TaskInstance};
    use koala_types::{PartitionOffset, SourcePosition};

    use crate::{KafkaSourceSpec, ValueFormat};

    fn at(topic: &str, partition: i32, offset: i64) -> PartitionOffset {
        PartitionOffset { topic: topic.into(), partition, offset }
    }

    /// Restoring needs no broker (the source connects on its first poll), so neither do these.
    #[test]
    fn a_restored_source_records_the_offsets_it_was_restored_at_and_refuses_foreign_ones() {
        let spec = KafkaSourceSpec::<u64>::new(vec!["127.0.0.1:1".into()], "bids", ValueFormat::Json);
        let task = TaskInstance { index: 1, parallelism: 2 };
        let mut source = spec.build(task);
        let mine = SourcePosition::Offsets(vec![at("bids", 1, 40), at("bids", 3, 7)]);
        assert!(!source.restore(&mine).expect("its own partitions").finished);
        assert_eq!(source.positions(), vec![(1, 40), (3, 7)]);
        assert_eq!(source.checkpoint_position(0), mine, "unconnected, it records where it was put");

        let err =
            |position: SourcePosition| spec.build(task).restore(&position).expect_err("refused").to_string();
        let other_task = err(SourcePosition::Offsets(vec![at("bids", 2, 1)]));
        assert!(
            other_task.contains("partition 2 of bids") && other_task.contains("[parallelism]"),
            "{other_task}"
        );
        let other_topic = err(SourcePosition::Offsets(vec![at("asks", 1, 1)]));
        assert!(
            other_topic.contains("topic asks") && other_topic.contains("[params.kafka]"),
            "{other_topic}"
        );
        let counted = err(SourcePosition::Records(12));
        assert!(counted.contains("12 records") && counted.contains("generator"), "{counted}");
        assert!(spec.build(task).restore(&SourcePosition::Finished).expect("finished").finished);
    }
}
