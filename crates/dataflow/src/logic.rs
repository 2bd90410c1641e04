//! The erased, byte-level contract between operators and the runtime. The typed API in this crate
//! compiles user closures down to these traits; the runtime only ever sees bytes, keys and times.
//!
//! Per batch the runtime (docs/architecture.md §5): collects the distinct keys of the batch,
//! fetches their state for every state id the operator declared, calls
//! [`OperatorLogic::on_records`] with the records **in input order**, then writes back only the
//! state the operator changed.

use koala_types::{CodecError, Record, SourcePosition, Timestamp};

/// Identifies one of an operator's per-key states (e.g. 0 = value, 1 = list).
pub type StateId = u8;

/// An error an operator returns to the runtime.
#[derive(Debug, thiserror::Error)]
pub enum DataflowError {
    /// A record or a state value could not be decoded or encoded.
    #[error(transparent)]
    Codec(#[from] CodecError),
    /// The operator touched a key the runtime did not prefetch for this batch (a runtime bug).
    #[error("state of key {key:?} (state id {state}) was not fetched for this batch")]
    StateNotFetched {
        /// The state id.
        state: StateId,
        /// The encoded key.
        key: Vec<u8>,
    },
    /// Writing to a sink failed.
    #[error("sink i/o: {0}")]
    Io(#[from] std::io::Error),
    /// Anything else, with a message naming what is wrong.
    #[error("{0}")]
    Other(String),
}

/// Byte-level access to the per-key state fetched for the current batch or timer.
pub trait KeyedStateAccess {
    /// The current value of `state` for `key`, or `None` if it has none.
    fn get(&self, state: StateId, key: &[u8]) -> Result<Option<&[u8]>, DataflowError>;
    /// Sets the value of `state` for `key`.
    fn put(&mut self, state: StateId, key: &[u8], value: Vec<u8>) -> Result<(), DataflowError>;
    /// Removes `state` for `key`.
    fn delete(&mut self, state: StateId, key: &[u8]) -> Result<(), DataflowError>;
    /// Sets the value of `state` for `key` to the bytes `encode` appends to an empty buffer. A
    /// store that holds the value it replaces may hand over that value's buffer, cleared, so a
    /// write reuses the read's allocation (the runtime's batch state does).
    fn put_encoded(
        &mut self,
        state: StateId,
        key: &[u8],
        encode: &mut dyn FnMut(&mut Vec<u8>) -> Result<(), CodecError>,
    ) -> Result<(), DataflowError> {
        let mut value = Vec::new();
        encode(&mut value)?;
        self.put(state, key, value)
    }
}

/// What an operator may do while processing.
pub struct OperatorContext<'a> {
    /// Per-key state of the keys in this batch (stateful operators only).
    pub state: &'a mut dyn KeyedStateAccess,
    /// Records to emit downstream, in order. Keep the input key on keyed outputs; the runtime
    /// recomputes it where the downstream edge is key-partitioned.
    pub output: &'a mut Vec<Record>,
    /// Event-time timers to register: (key, time). The runtime calls
    /// [`OperatorLogic::on_timer`] once the task's watermark reaches `time`; duplicates collapse.
    pub timers: &'a mut Vec<(Vec<u8>, Timestamp)>,
    /// The task's current watermark, if any input has sent one.
    pub watermark: Option<Timestamp>,
}

/// A non-source, non-sink operator task.
pub trait OperatorLogic: Send {
    /// The state ids the runtime must fetch for each key of a batch (empty for stateless).
    fn state_ids(&self) -> &[StateId];
    /// Processes records of input `input` in order. An output record carries the `due_ms` of the
    /// input record that produced it (end-to-end latency, docs/architecture.md §9).
    fn on_records(
        &mut self,
        input: usize,
        records: &[Record],
        ctx: &mut OperatorContext<'_>,
    ) -> Result<(), DataflowError>;
    /// A timer registered for `key` at `time` fired (the watermark reached `time`). The key's
    /// state is fetched before the call. The runner overwrites the `due_ms` of what it emits with
    /// [`TimerDue::due_ms`]: the latest due time among records the task processed before.
    fn on_timer(
        &mut self,
        key: &[u8],
        time: Timestamp,
        ctx: &mut OperatorContext<'_>,
    ) -> Result<(), DataflowError> {
        let _ = (key, time, ctx);
        Ok(())
    }
}

/// Whether a source has more to give.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourcePoll {
    /// More records may follow.
    More,
    /// Exhausted: nothing will follow.
    Finished,
}

/// A source task. The runtime paces it (rate schedule) and derives watermarks from the event
/// times it returns.
pub trait SourceLogic: Send {
    /// Appends up to `max` records to `out`.
    fn poll(&mut self, max: usize, out: &mut Vec<Record>) -> Result<SourcePoll, DataflowError>;

    /// Whether the runtime paces this source by its rate schedule (generators) or the source paces
    /// itself, returning what is available (external systems such as Kafka). Self-paced sources
    /// may return no records from `poll` while not finished; the runtime then waits briefly.
    fn paced_by_runtime(&self) -> bool {
        true
    }

    /// Self-paced sources: moves into `out` the lag in milliseconds (now − the time the record
    /// entered the external system) of every record returned since the last call. Paced sources
    /// leave it empty: the runtime measures their lag against the schedule.
    fn drain_lag_samples(&mut self, out: &mut Vec<u64>) {
        let _ = out;
    }

    /// Self-paced sources: the due time (unix ms, as they stamp `Record::due_ms`) of the oldest
    /// record they hold and have not returned yet, if any (Kafka: the earliest timestamp among
    /// the fetched, unread records). The runtime samples it as lag while the source is paused.
    fn pending_due_ms(&self) -> Option<u64> {
        None
    }

    /// External sources: records between the source's position and the end of its input
    /// (Kafka: the Fetch high watermark minus the next offset, over its partitions).
    fn offset_lag(&self) -> Option<u64> {
        None
    }

    /// External sources: records skipped since the task started because they could not be
    /// decoded (Kafka: a value that is not the topic's format). The runtime reports the
    /// increase each second as `records_malformed`.
    fn malformed_records(&self) -> Option<u64> {
        None
    }

    /// What a checkpoint records for this source at a barrier, after it emitted `emitted`
    /// records since the task started (a restored source counts the ones it skipped): whatever
    /// it needs to resume exactly there. Deterministic sources (the default) record the count; a
    /// source reading an external system records where it is in it (Kafka: each partition's
    /// next offset).
    fn checkpoint_position(&mut self, emitted: u64) -> SourcePosition {
        SourcePosition::Records(emitted)
    }

    /// Puts a restored source where a checkpoint recorded it ([`Self::checkpoint_position`]),
    /// before its first `poll`. The default serves deterministic sources: it regenerates the
    /// records a [`SourcePosition::Records`] counts and drops them.
    fn restore(&mut self, position: &SourcePosition) -> Result<Restored, DataflowError> {
        match position {
            SourcePosition::Finished => Ok(Restored { skipped: 0, finished: true }),
            SourcePosition::Records(records) => skip_records(self, *records),
            SourcePosition::Offsets(_) => Err(DataflowError::Other(format!(
                "the checkpoint recorded {position} for this source, which resumes by counting \
                 records: the checkpoint was taken by a job whose source read Kafka; resume it with \
                 the config it was taken with (koala run --resume uses the recorded one)"
            ))),
        }
    }
}

/// Where [`SourceLogic::restore`] left a source.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Restored {
    /// Records regenerated and dropped (a paced source's schedule goes on after them).
    pub skipped: u64,
    /// The source had finished: it emits nothing more.
    pub finished: bool,
}

/// Records a deterministic source regenerates per `poll` while it skips to its position.
const SKIP_CHUNK: u64 = 4096;

/// Polls `source` for `records` records and drops them (fewer if it finishes first).
fn skip_records<S: SourceLogic + ?Sized>(source: &mut S, records: u64) -> Result<Restored, DataflowError> {
    let mut skipped = 0;
    let mut buf = Vec::new();
    while skipped < records {
        buf.clear();
        let want = usize::try_from((records - skipped).min(SKIP_CHUNK)).unwrap_or(1);
        let poll = source.poll(want, &mut buf)?;
        skipped += buf.len() as u64;
        if poll == SourcePoll::Finished {
            return Ok(Restored { skipped, finished: true });
        }
        if buf.is_empty() {
            // Only a source that waits for an external system returns nothing: it cannot be
            // rewound by regenerating, and must implement `restore` itself.
            return Err(DataflowError::Other(format!(
                "returned no record at {skipped} of the {records} it emitted before the checkpoint: \
                 a source that is not deterministic resumes through its own SourceLogic::restore"
            )));
        }
    }
    Ok(Restored { skipped, finished: false })
}

/// A sink implemented outside the runtime (e.g. a Kafka producer). Built per task.
pub trait SinkLogic: Send {
    /// Writes records in order.
    fn write(&mut self, records: &[Record]) -> Result<(), DataflowError>;
    /// Makes everything written so far visible downstream; called at end of stream and before
    /// the task releases.
    fn flush(&mut self) -> Result<(), DataflowError>;
}

/// Builds the custom sink of one task.
pub type SinkFactory = std::sync::Arc<
    dyn Fn(crate::graph::TaskInstance) -> Result<Box<dyn SinkLogic>, DataflowError> + Send + Sync,
>;

/// Where a sink writes. JSON-lines sinks write one file per task, `<dir>/<sink>-<task>.jsonl`,
/// under the job's output directory.
#[derive(Clone)]
pub enum SinkFormat {
    /// One JSON value per line into a file per task.
    JsonLines(ValueToJson),
    /// One JSON value per line on standard output.
    Stdout(ValueToJson),
    /// Counts and drops records.
    Discard,
    /// A sink implemented by a connector.
    Custom(SinkFactory),
}

/// Renders an encoded value as one line of JSON (the typed `T: Serialize`, erased).
pub type ValueToJson = std::sync::Arc<dyn Fn(&[u8]) -> Result<String, DataflowError> + Send + Sync>;

/// The due time a task's timer outputs get: the latest `due_ms` among records the task handed to
/// its operator so far. An approximation of the due time of the watermark that fired the timer
/// (watermarks carry no due time): a watermark follows the records its source emitted before it on
/// every channel, so this is never earlier than that due time, and it can be later when another
/// input ran ahead — end-to-end latency of timer outputs is then underestimated, never inflated
/// (docs/architecture.md §9). A task that has processed no record yet (e.g. one that received its
/// timers in a hand-over) stamps 0: unknown, not measured.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TimerDue {
    latest: u64,
}

impl TimerDue {
    /// Notes the records handed to the operator.
    pub fn saw(&mut self, records: &[Record]) {
        if let Some(max) = records.iter().map(|r| r.due_ms).max() {
            self.latest = self.latest.max(max);
        }
    }

    /// The due time of timer outputs now (0: unknown).
    pub fn due_ms(&self) -> u64 {
        self.latest
    }

    /// Stamps the records a timer round emitted.
    pub fn stamp(&self, outputs: &mut [Record]) {
        for r in outputs {
            r.due_ms = self.latest;
        }
    }
}
