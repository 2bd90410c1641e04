//! Several topics read as one stream by each source task (Nexmark's people and auctions, which
//! `koala produce` writes to two topics, feed Q3 and Q8 as one stream of events): one
//! [`KafkaSource`] per topic, each reading its share of that topic's partitions
//! ([`crate::assigned_partitions`]), polled in turn. A checkpoint records every topic's offsets
//! in one [`SourcePosition::Offsets`]; a restore hands each topic its own.

use std::sync::Arc;

use koala_dataflow::{DataflowError, Restored, SourceLogic, SourcePoll, TaskInstance, graph::SourceFactory};
use koala_types::{PartitionOffset, Record, SourcePosition};
use serde::{Serialize, de::DeserializeOwned};

use crate::{KafkaSource, KafkaSourceSpec};

/// A factory of source tasks reading every topic of `specs` (values of one type `T`, e.g. each
/// topic's values mapped into an enum with [`KafkaSourceSpec::map_values`]).
pub fn topics_factory<T: Serialize + DeserializeOwned + 'static>(
    specs: Vec<KafkaSourceSpec<T>>,
) -> SourceFactory {
    Arc::new(move |task| {
        Box::new(KafkaTopics::new(specs.iter().map(|s| s.build(task)).collect(), task))
            as Box<dyn SourceLogic>
    })
}

/// One source task over several topics; see the module docs.
pub struct KafkaTopics {
    sources: Vec<KafkaSource>,
    finished: Vec<bool>,
    /// The topic polled first next time (turns rotate, so no topic starves another).
    next: usize,
    task: TaskInstance,
}

impl KafkaTopics {
    /// A task over `sources` (one per topic).
    pub fn new(sources: Vec<KafkaSource>, task: TaskInstance) -> Self {
        let finished = vec![false; sources.len()];
        Self { sources, finished, next: 0, task }
    }
}

impl SourceLogic for KafkaTopics {
    fn poll(&mut self, max: usize, out: &mut Vec<Record>) -> Result<SourcePoll, DataflowError> {
        let n = self.sources.len();
        let open = self.finished.iter().filter(|f| !**f).count();
        if open == 0 {
            return Ok(SourcePoll::Finished);
        }
        let share = max.div_ceil(open).max(1);
        let start = out.len();
        for turn in 0..n {
            let i = (self.next + turn) % n;
            let budget = share.min(max.saturating_sub(out.len() - start));
            if self.finished[i] || budget == 0 {
                continue;
            }
            if self.sources[i].poll(budget, out)? == SourcePoll::Finished {
                self.finished[i] = true;
            }
        }
        self.next = (self.next + 1) % n.max(1);
        Ok(if self.finished.iter().all(|f| *f) { SourcePoll::Finished } else { SourcePoll::More })
    }

    fn paced_by_runtime(&self) -> bool {
        false
    }

    fn drain_lag_samples(&mut self, out: &mut Vec<u64>) {
        for s in &mut self.sources {
            s.drain_lag_samples(out);
        }
    }

    fn pending_due_ms(&self) -> Option<u64> {
        self.sources.iter().filter_map(SourceLogic::pending_due_ms).min()
    }

    fn offset_lag(&self) -> Option<u64> {
        Some(self.sources.iter().map(KafkaSource::offset_lag).sum())
    }

    fn checkpoint_position(&mut self, emitted: u64) -> SourcePosition {
        let mut offsets = Vec::new();
        for s in &mut self.sources {
            if let SourcePosition::Offsets(mut o) = s.checkpoint_position(emitted) {
                offsets.append(&mut o);
            }
        }
        SourcePosition::Offsets(offsets)
    }

    fn restore(&mut self, position: &SourcePosition) -> Result<Restored, DataflowError> {
        let SourcePosition::Offsets(offsets) = position else {
            // Finished, or a position of another kind of source: the first topic's source says.
            let mut restored = Restored { skipped: 0, finished: true };
            for s in &mut self.sources {
                restored.finished &= s.restore(position)?.finished;
            }
            self.finished.fill(restored.finished);
            return Ok(restored);
        };
        let topics: Vec<String> = self.sources.iter().map(|s| s.topic().to_string()).collect();
        if let Some(o) = offsets.iter().find(|o| !topics.contains(&o.topic)) {
            return Err(DataflowError::Other(format!(
                "the checkpoint recorded topic {} for source task {}, which reads {}: [params.kafka] \
                 names other topics than when the checkpoint was taken; set them back",
                o.topic,
                self.task.index,
                topics.join(", ")
            )));
        }
        for (s, topic) in self.sources.iter_mut().zip(&topics) {
            let mine: Vec<PartitionOffset> = offsets.iter().filter(|o| &o.topic == topic).cloned().collect();
            s.restore(&SourcePosition::Offsets(mine))?;
        }
        Ok(Restored::default())
    }
}

#[cfg(test)]
mod tests {
    use koala_dataflow::{SourceLogic, TaskInstance};
    use koala_types::{PartitionOffset, SourcePosition};

    use super::KafkaTopics;
    use crate::{KafkaSourceSpec, ValueFormat};

    fn at(topic: &str, partition: i32, offset: i64) -> PartitionOffset {
        PartitionOffset { topic: topic.into(), partition, offset }
    }

    /// Each topic's source gets its own offsets back, and the checkpoint holds them all (no
    /// broker: the sources connect on their first poll).
    #[test]
    fn a_restore_hands_each_topic_its_offsets_and_refuses_an_unknown_topic() {
        let task = TaskInstance { index: 0, parallelism: 1 };
        let build = || {
            let spec =
                |topic| KafkaSourceSpec::<u64>::new(vec!["127.0.0.1:1".into()], topic, ValueFormat::Json);
            KafkaTopics::new(vec![spec("people").build(task), spec("auctions").build(task)], task)
        };
        let mut source = build();
        let recorded = vec![at("people", 0, 5), at("auctions", 0, 7), at("auctions", 1, 9)];
        source.restore(&SourcePosition::Offsets(recorded.clone())).expect("restore");
        assert_eq!(source.sources[0].positions(), vec![(0, 5)]);
        assert_eq!(source.sources[1].positions(), vec![(0, 7), (1, 9)]);
        assert_eq!(source.checkpoint_position(0), SourcePosition::Offsets(recorded));

        let err = build().restore(&SourcePosition::Offsets(vec![at("bids", 0, 1)])).expect_err("refused");
        assert!(
            err.to_string().contains("topic bids") && err.to_string().contains("people, auctions"),
            "{err}"
        );
        let mut finished = build();
        assert!(finished.restore(&SourcePosition::Finished).expect("finished").finished);
    }
}
