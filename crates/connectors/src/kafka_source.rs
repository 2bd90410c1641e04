//! A self-paced Kafka source task (docs/architecture.md §9, §10, §11): reads its share of a topic's
//! partitions, decodes each record into the user type and re-encodes it with the project codec.
//!
//! - **Assignment.** Task `i` of `n` reads the partitions `p` with `p % n == i`
//!   ([`assigned_partitions`]); the coordinator's source assignment *is* this function, so no
//!   consumer group is involved.
//! - **Positions.** Each partition's next offset to emit is tracked ([`KafkaSource::positions`]).
//!   A checkpoint records them (`SourceLogic::checkpoint_position`: the offsets of the records
//!   emitted before the barrier) and a restored source seeks each partition there
//!   (`SourceLogic::restore`, as [`KafkaSourceSpec::resume`] does), so it reads no record twice
//!   and misses none; `positions.rs`.
//! - **Where it starts** ([`StartAt`], `koala run` says which when the job starts): without a
//!   position a partition starts at its earliest retained offset (a re-run reads the whole topic
//!   again), at its end as the task connects (only records produced from then on), or at the
//!   offset its consumer group committed (earliest if it never committed). Under `committed`
//!   the source commits the positions of its partitions as it goes, once a second, when it
//!   finishes and when it is dropped ([`crate::group_offsets`]); with no checkpoints, a
//!   committed position is what the source handed to the job, so records read but not yet
//!   processed when a job dies are not read again.
//! - **Lag.** A record is *available* to the job from its timestamp, or from when the task
//!   started reading if it was written before (data produced ahead of a run is not lag). Every
//!   emitted record yields a lag sample `now − available` (ms, not sampled), and its
//!   `Record::due_ms` is that instant; the earliest of the fetched records not yet returned is the
//!   source's pending due time (sampled once a second while it is paused);
//!   [`KafkaSource::offset_lag`] is the high watermark of the last Fetch minus the next offset
//!   (never ListOffsets, which tansu's memory engine answers wrongly).
//! - **Bad records** are counted ([`KafkaSource::undecodable`]), logged and skipped; they never
//!   fail the task.

use std::{
    collections::{BTreeMap, VecDeque},
    marker::PhantomData,
    sync::Arc,
    time::{Duration, Instant},
};

use koala_dataflow::{DataflowError, Restored, SourceLogic, SourcePoll, TaskInstance, graph::SourceFactory};
use koala_types::{Record, SourcePosition, Timestamp};
use rskafka::{
    client::partition::{PartitionClient, UnknownTopicHandling},
    record::RecordAndOffset,
};
use serde::{Serialize, de::DeserializeOwned};
use tokio::{runtime::Runtime, task::JoinSet};
use tracing::{error, info, warn};

mod positions;

use crate::group_offsets::GroupOffsets;
pub use crate::kafka_fetch::StartAt;
use crate::kafka_fetch::{Fetched, end_offset, fetch_from};
use crate::{ConnectorError, ValueFormat, block_on_within, connect, io_runtime, now_ms, within};

/// How often a source started at `committed` commits its positions.
const COMMIT_INTERVAL: Duration = Duration::from_secs(1);

/// The partitions source task `index` of `parallelism` reads: those with
/// `partition % parallelism == index`, in ascending order.
///
/// ```
/// use koala_connectors::assigned_partitions;
/// assert_eq!(assigned_partitions(&[0, 1, 2, 3, 4], 1, 2), vec![1, 3]);
/// assert_eq!(assigned_partitions(&[0, 1], 2, 3), Vec::<i32>::new());
/// ```
pub fn assigned_partitions(partitions: &[i32], index: u32, parallelism: u32) -> Vec<i32> {
    let n = i64::from(parallelism.max(1));
    let mut mine: Vec<i32> =
        partitions.iter().copied().filter(|&p| i64::from(p).rem_euclid(n) == i64::from(index)).collect();
    mine.sort_unstable();
    mine
}

/// Decodes a Kafka value into the project encoding and an optional event time.
type Decoder = Arc<dyn Fn(&[u8]) -> Result<(Vec<u8>, Option<Timestamp>), String> + Send + Sync>;

/// Extracts the event time (ms) from a decoded value.
type EventTimeFn<T> = Arc<dyn Fn(&T) -> Option<Timestamp> + Send + Sync>;

/// Decodes a Kafka value in the topic's format into the value the job receives, with the event
/// time an earlier type of it gave ([`KafkaSourceSpec::map_values`]), if any.
type ParseFn<T> = Arc<dyn Fn(ValueFormat, &[u8]) -> Result<(T, Option<Timestamp>), String> + Send + Sync>;

/// A typed Kafka source declaration: topic, brokers, value format and event-time extractor.
///
/// ```
/// use koala_connectors::{KafkaSourceSpec, ValueFormat};
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct Click { user: u64, at_ms: u64 }
/// let spec = KafkaSourceSpec::<Click>::new(vec!["127.0.0.1:9092".into()], "clicks", ValueFormat::Json)
///     .event_time(|c| Some(c.at_ms));
/// let _factory = spec.factory(); // give this to the dataflow builder
/// ```
pub struct KafkaSourceSpec<T> {
    settings: Settings,
    parse: ParseFn<T>,
    event_time: Option<EventTimeFn<T>>,
    _type: PhantomData<fn() -> T>,
}

impl<T> Clone for KafkaSourceSpec<T> {
    fn clone(&self) -> Self {
        Self {
            settings: self.settings.clone(),
            parse: self.parse.clone(),
            event_time: self.event_time.clone(),
            _type: PhantomData,
        }
    }
}

#[derive(Clone)]
struct Settings {
    brokers: Vec<String>,
    topic: String,
    format: ValueFormat,
    max_fetch_bytes: i32,
    max_wait_ms: i32,
    until_end: bool,
    start: StartAt,
    /// The consumer group whose offsets `StartAt::Committed` reads and commits.
    group: String,
}

impl<T: Serialize + DeserializeOwned + 'static> KafkaSourceSpec<T> {
    /// Reads `topic` from `brokers`; values are `format`-encoded `T`s; event time is the Kafka
    /// record timestamp unless [`Self::event_time`] says otherwise.
    pub fn new(brokers: Vec<String>, topic: impl Into<String>, format: ValueFormat) -> Self {
        let settings = Settings {
            brokers,
            topic: topic.into(),
            format,
            max_fetch_bytes: 1 << 20,
            max_wait_ms: 50,
            until_end: false,
            start: StartAt::Earliest,
            group: String::new(),
        };
        let parse: ParseFn<T> = Arc::new(|format, bytes| Ok((format.decode(bytes)?, None)));
        Self { settings, parse, event_time: None, _type: PhantomData }
    }

    /// Hands the job `f(value)` instead of each decoded value (e.g. Nexmark people as
    /// `Event::Person`, so several topics make one stream of events). The event time stays what
    /// [`Self::event_time`] took from the decoded value unless the new spec sets its own.
    pub fn map_values<U: Serialize + DeserializeOwned + 'static>(
        self,
        f: impl Fn(T) -> U + Send + Sync + 'static,
    ) -> KafkaSourceSpec<U> {
        let (parse, event_time) = (self.parse, self.event_time);
        let parse: ParseFn<U> = Arc::new(move |format, bytes| {
            let (value, time) = parse(format, bytes)?;
            let time = event_time.as_ref().and_then(|t| t(&value)).or(time);
            Ok((f(value), time))
        });
        KafkaSourceSpec { settings: self.settings, parse, event_time: None, _type: PhantomData }
    }

    /// The topic read.
    pub fn topic(&self) -> &str {
        &self.settings.topic
    }

    /// Takes the event time (ms) from the value; `None` falls back to the record timestamp.
    pub fn event_time(mut self, f: impl Fn(&T) -> Option<Timestamp> + Send + Sync + 'static) -> Self {
        self.event_time = Some(Arc::new(f));
        self
    }

    /// Maximum bytes per Fetch and partition (default 1 MiB).
    pub fn max_fetch_bytes(mut self, bytes: i32) -> Self {
        self.settings.max_fetch_bytes = bytes.max(1);
        self
    }

    /// How long the broker may hold a Fetch when no data is available (default 50 ms).
    pub fn max_wait_ms(mut self, ms: i32) -> Self {
        self.settings.max_wait_ms = ms.max(0);
        self
    }

    /// Bounded mode: finish once every partition reaches the high watermark seen by its first
    /// Fetch (for tests and replays of a fixed topic).
    pub fn until_end(mut self, bounded: bool) -> Self {
        self.settings.until_end = bounded;
        self
    }

    /// Where each partition starts without a position (default: the earliest offset); `group`
    /// is the consumer group `StartAt::Committed` reads and commits (ignored otherwise).
    pub fn start_at(mut self, start: StartAt, group: impl Into<String>) -> Self {
        self.settings.start = start;
        self.settings.group = group.into();
        self
    }

    /// The source task `task`, starting each partition where [`Self::start_at`] says.
    pub fn build(&self, task: TaskInstance) -> KafkaSource {
        self.resume(task, &[])
    }

    /// The source task `task`, starting at `positions` (partition, next offset) as recorded by
    /// [`KafkaSource::positions`]. Positions of partitions not assigned to the task are ignored, so
    /// the union of all tasks' positions may be passed to every task.
    pub fn resume(&self, task: TaskInstance, positions: &[(i32, i64)]) -> KafkaSource {
        KafkaSource::new(self.settings.clone(), self.decoder(), task, positions)
    }

    /// A factory building [`Self::build`] per task, for the dataflow builder.
    pub fn factory(&self) -> SourceFactory {
        let spec = self.clone();
        Arc::new(move |task| Box::new(spec.build(task)) as Box<dyn SourceLogic>)
    }

    fn decoder(&self) -> Decoder {
        let format = self.settings.format;
        let (parse, event_time) = (self.parse.clone(), self.event_time.clone());
        Arc::new(move |bytes| {
            let (value, earlier): (T, _) = parse(format, bytes)?;
            let time = event_time.as_ref().and_then(|f| f(&value)).or(earlier);
            let encoded = koala_types::encode(&value).map_err(|e| e.to_string())?;
            Ok((encoded, time))
        })
    }
}

/// One partition being read.
struct PartitionReader {
    partition: i32,
    client: Arc<PartitionClient>,
    /// Offset of the next record to emit (what a checkpoint records).
    next: i64,
    /// Offset the next Fetch starts at (ahead of `next` by what is buffered).
    fetch_at: i64,
    high_watermark: Option<i64>,
    /// Bounded mode: the offset at which this partition is done.
    end: Option<i64>,
    buffer: VecDeque<RecordAndOffset>,
}

impl PartitionReader {
    fn done(&self) -> bool {
        self.end.is_some_and(|end| self.next >= end)
    }
}

/// A Kafka source task; see the module docs. Connects lazily on the first [`SourceLogic::poll`].
pub struct KafkaSource {
    settings: Settings,
    decoder: Decoder,
    task: TaskInstance,
    resume_from: BTreeMap<i32, i64>,
    rt: Option<Runtime>,
    readers: Option<Vec<PartitionReader>>,
    retry_at: Option<Instant>,
    lag_samples: Vec<u64>,
    undecodable: u64,
    /// When this task started reading (unix ms): records written before are available from then.
    reading_since_ms: Option<u64>,
    /// `StartAt::Committed`: the group's coordinator, and the positions last committed and when.
    group: Option<GroupOffsets>,
    committed: Vec<(i32, i64)>,
    committed_at: Option<Instant>,
}

impl KafkaSource {
    fn new(settings: Settings, decoder: Decoder, task: TaskInstance, positions: &[(i32, i64)]) -> Self {
        let resume_from = positions
            .iter()
            .copied()
            .filter(|&(p, _)| !assigned_partitions(&[p], task.index, task.parallelism).is_empty())
            .collect();
        Self {
            settings,
            decoder,
            task,
            resume_from,
            rt: None,
            readers: None,
            retry_at: None,
            lag_samples: Vec::new(),
            undecodable: 0,
            reading_since_ms: None,
            group: None,
            committed: Vec::new(),
            committed_at: None,
        }
    }

    /// (partition, next offset to read) of every assigned partition, ascending; before the first
    /// connection, the positions the source was resumed from.
    pub fn positions(&self) -> Vec<(i32, i64)> {
        match &self.readers {
            Some(readers) => readers.iter().map(|r| (r.partition, r.next)).collect(),
            None => self.resume_from.iter().map(|(&p, &o)| (p, o)).collect(),
        }
    }

    /// Records behind the head of the assigned partitions: Σ (high watermark of the last Fetch −
    /// next offset). Zero until the first Fetch.
    pub fn offset_lag(&self) -> u64 {
        self.partition_offset_lags().iter().map(|&(_, lag)| lag).sum()
    }

    /// [`Self::offset_lag`] per assigned partition.
    pub fn partition_offset_lags(&self) -> Vec<(i32, u64)> {
        let readers = self.readers.as_deref().unwrap_or_default();
        readers
            .iter()
            .map(|r| {
                let lag = r.high_watermark.map_or(0, |hw| hw.saturating_sub(r.next).max(0));
                (r.partition, u64::try_from(lag).unwrap_or(0))
            })
            .collect()
    }

    /// When a record with Kafka timestamp `kafka_ms` became available to this task (unix ms): its
    /// timestamp, or when the task started reading if it was written before.
    fn available_ms(&self, kafka_ms: u64) -> u64 {
        kafka_ms.max(self.reading_since_ms.unwrap_or(0))
    }

    /// The topic read.
    pub fn topic(&self) -> &str {
        &self.settings.topic
    }

    /// Records that could not be decoded and were skipped.
    pub fn undecodable(&self) -> u64 {
        self.undecodable
    }

    /// Connects and resolves the assigned partitions; `Ok(false)` = broker unreachable, retry later.
    fn ensure_connected(&mut self) -> Result<bool, DataflowError> {
        if self.readers.is_some() {
            return Ok(true);
        }
        self.reading_since_ms.get_or_insert_with(now_ms);
        if self.retry_at.is_some_and(|at| Instant::now() < at) {
            return Ok(false);
        }
        if self.rt.is_none() {
            self.rt = Some(io_runtime().map_err(|e| DataflowError::Other(e.to_string()))?);
        }
        let Some(rt) = self.rt.as_ref() else {
            return Ok(false);
        };
        let settings = &self.settings;
        let task = self.task;
        let resume_from = &self.resume_from;
        let opened = block_on_within(rt, Duration::from_secs(5), "opening the source topic", async {
            let client = connect(&settings.brokers, Duration::from_secs(2)).await?;
            let topics =
                client.list_topics().await.map_err(|e| ConnectorError::kafka("listing topics", e))?;
            let Some(topic) = topics.into_iter().find(|t| t.name == settings.topic) else {
                return Ok(None);
            };
            let all: Vec<i32> = topic.partitions.into_iter().collect();
            let mut clients = Vec::new();
            for p in assigned_partitions(&all, task.index, task.parallelism) {
                let pc = client
                    .partition_client(settings.topic.clone(), p, UnknownTopicHandling::Retry)
                    .await
                    .map_err(|e| ConnectorError::kafka(format!("opening {}/{p}", settings.topic), e))?;
                clients.push((p, Arc::new(pc)));
            }
            // Where each partition without a position starts.
            let mut group = None;
            let mut starts = BTreeMap::new();
            let unplaced: Vec<i32> =
                clients.iter().map(|(p, _)| *p).filter(|p| !resume_from.contains_key(p)).collect();
            match settings.start {
                StartAt::Earliest => {}
                StartAt::Latest => {
                    for (p, pc) in clients.iter().filter(|(p, _)| unplaced.contains(p)) {
                        starts.insert(*p, end_offset(pc).await?);
                    }
                }
                StartAt::Committed => {
                    let mut g = GroupOffsets::connect(&settings.brokers, &settings.group).await?;
                    starts = g.fetch(&settings.topic, &unplaced).await?;
                    group = Some(g);
                }
            }
            Ok::<_, ConnectorError>(Some((clients, starts, group)))
        });
        match opened {
            Ok(Some((clients, starts, group))) => {
                self.group = group;
                let topic = &self.settings.topic;
                let readers = clients
                    .into_iter()
                    .map(|(partition, client)| {
                        let recorded = self.resume_from.get(&partition).copied();
                        if let Some(offset) = recorded {
                            info!(
                                task = self.task.index,
                                "kafka: {topic} partition {partition} seeks to offset {offset}, its recorded position"
                            );
                        }
                        let start = recorded.or_else(|| starts.get(&partition).copied()).unwrap_or(0);
                        PartitionReader {
                            partition,
                            client,
                            next: start,
                            fetch_at: start,
                            high_watermark: None,
                            end: None,
                            buffer: VecDeque::new(),
                        }
                    })
                    .collect();
                self.readers = Some(readers);
                self.retry_at = None;
                if self.group.is_some() {
                    // Where the group left off is committed already.
                    self.committed = self.positions();
                }
                Ok(true)
            }
            Ok(None) => Err(DataflowError::Other(format!(
                "kafka topic {} does not exist on {}",
                self.settings.topic,
                self.settings.brokers.join(",")
            ))),
            Err(e) => {
                warn!(topic = %self.settings.topic, "kafka source cannot connect, retrying in 1 s: {e}");
                self.retry_at = Some(Instant::now() + Duration::from_secs(1));
                Ok(false)
            }
        }
    }

    /// Fetches into the empty buffers of unfinished partitions, all partitions concurrently.
    fn fetch(&mut self) -> Result<(), DataflowError> {
        let (Some(rt), Some(readers)) = (self.rt.as_ref(), self.readers.as_mut()) else {
            return Ok(());
        };
        let (bytes, wait) = (self.settings.max_fetch_bytes, self.settings.max_wait_ms);
        let results = rt.block_on(async {
            let mut set = JoinSet::new();
            for (i, r) in readers.iter().enumerate() {
                if r.buffer.is_empty() && !r.done() {
                    let (client, at) = (Arc::clone(&r.client), r.fetch_at);
                    let limit =
                        Duration::from_millis(u64::try_from(wait).unwrap_or(0)) + Duration::from_secs(10);
                    set.spawn(async move {
                        (i, within(limit, "fetching", fetch_from(&client, at, bytes, wait)).await)
                    });
                }
            }
            let mut results = Vec::new();
            while let Some(joined) = set.join_next().await {
                results.push(joined.map_err(|e| DataflowError::Other(format!("kafka fetch task: {e}")))?);
            }
            Ok::<_, DataflowError>(results)
        })?;
        for (i, result) in results {
            let Some(r) = readers.get_mut(i) else {
                continue;
            };
            match result {
                Ok(Fetched::Records(records, hw)) => {
                    r.high_watermark = Some(hw);
                    if self.settings.until_end && r.end.is_none() {
                        r.end = Some(hw);
                    }
                    if let Some(first) = records.first().filter(|f| f.offset > r.fetch_at) {
                        // Offsets may be missing (compaction, transaction markers); a whole batch
                        // missing after a seek is tansu 0.6's memory engine, which answers a Fetch
                        // from the first batch *starting* at or after the offset asked for.
                        warn!(
                            topic = %self.settings.topic, partition = r.partition,
                            "asked for offset {}, the broker answered from offset {}: {} offsets skipped \
                             (compacted or transaction markers, or a broker that serves a Fetch from a \
                             batch start only, as tansu's memory engine does: restore Kafka sources \
                             from its SQLite engine)",
                            r.fetch_at, first.offset, first.offset - r.fetch_at
                        );
                    }
                    if let Some(last) = records.last() {
                        r.fetch_at = last.offset + 1;
                    }
                    r.buffer.extend(records);
                }
                Ok(Fetched::Moved(earliest)) => {
                    warn!(
                        topic = %self.settings.topic, partition = r.partition,
                        "offset {} is no longer retained; skipping to the earliest offset {earliest}",
                        r.fetch_at
                    );
                    r.fetch_at = earliest;
                    r.next = earliest;
                }
                Err(e) => {
                    warn!(topic = %self.settings.topic, partition = r.partition, "kafka fetch failed: {e}")
                }
            }
        }
        Ok(())
    }

    fn emit(&mut self, r: RecordAndOffset, out: &mut Vec<Record>, partition: i32) {
        let kafka_ms = u64::try_from(r.record.timestamp.timestamp_millis()).unwrap_or(0);
        let decoded = match r.record.value.as_deref() {
            Some(bytes) => (self.decoder)(bytes),
            None => Err("record has no value".to_string()),
        };
        match decoded {
            Ok((value, time)) => {
                let available = self.available_ms(kafka_ms);
                out.push(Record {
                    key: Vec::new(),
                    value,
                    time: time.unwrap_or(kafka_ms),
                    due_ms: available,
                });
                self.lag_samples.push(now_ms().saturating_sub(available));
            }
            Err(e) => {
                self.undecodable += 1;
                // Log the first few and then every 1000th, so a poisoned topic cannot flood the log.
                if self.undecodable <= 10 || self.undecodable.is_multiple_of(1000) {
                    error!(
                        topic = %self.settings.topic, partition, offset = r.offset,
                        skipped = self.undecodable, "skipping undecodable kafka record: {e}"
                    );
                }
            }
        }
    }
}

impl SourceLogic for KafkaSource {
    fn offset_lag(&self) -> Option<u64> {
        Some(KafkaSource::offset_lag(self))
    }

    fn malformed_records(&self) -> Option<u64> {
        Some(self.undecodable)
    }

    fn poll(&mut self, max: usize, out: &mut Vec<Record>) -> Result<SourcePoll, DataflowError> {
        if !self.ensure_connected()? {
            return Ok(SourcePoll::More);
        }
        let buffered: usize = self.readers.iter().flatten().map(|r| r.buffer.len()).sum();
        if buffered < max {
            self.fetch()?;
        }
        let mut readers = self.readers.take().unwrap_or_default();
        if readers.is_empty() {
            // More tasks than partitions: this task has nothing to read, ever.
            self.readers = Some(readers);
            return Ok(SourcePoll::Finished);
        }
        // Drain the partitions fairly: a share each per round until `max` or all are empty.
        let share = max.div_ceil(readers.len()).max(1);
        let start = out.len();
        while out.len() - start < max && readers.iter().any(|r| !r.buffer.is_empty()) {
            // Every round consumes at least one record, so this ends even if none decode.
            for r in readers.iter_mut() {
                for _ in 0..share {
                    if out.len() - start >= max {
                        break;
                    }
                    let Some(record) = r.buffer.pop_front() else {
                        break;
                    };
                    r.next = record.offset + 1;
                    self.emit(record, out, r.partition);
                }
            }
        }
        let finished = self.settings.until_end && readers.iter().all(PartitionReader::done);
        self.readers = Some(readers);
        self.commit_positions(finished);
        Ok(if finished { SourcePoll::Finished } else { SourcePoll::More })
    }

    fn paced_by_runtime(&self) -> bool {
        false
    }

    fn drain_lag_samples(&mut self, out: &mut Vec<u64>) {
        out.append(&mut self.lag_samples);
    }

    fn pending_due_ms(&self) -> Option<u64> {
        // The front of each partition's buffer is its oldest unread record.
        let fronts = self.readers.iter().flatten().filter_map(|r| r.buffer.front());
        let kafka_ms = fronts.filter_map(|r| u64::try_from(r.record.timestamp.timestamp_millis()).ok()).min();
        kafka_ms.map(|ms| self.available_ms(ms))
    }

    fn checkpoint_position(&mut self, _emitted: u64) -> SourcePosition {
        SourcePosition::Offsets(self.checkpoint_offsets())
    }

    fn restore(&mut self, position: &SourcePosition) -> Result<Restored, DataflowError> {
        self.restore_offsets(position)
    }
}
