//! A keyed Kafka sink task: writes each record's value as JSON or in the project's binary codec,
//! with the record's key bytes as the Kafka key.
//!
//! - **Keys.** A keyed record's Kafka key is its canonical encoded key (the bytes the runtime hashes
//!   into buckets) and its partition is `bucket_of(key, partitions)`: the same key always lands in
//!   the same partition, whichever sink task writes it. Unkeyed records go round-robin.
//! - **Timestamps.** The Kafka timestamp is the wall-clock time of the write, so a downstream
//!   consumer's lag measures the time spent in the topic (docs/architecture.md §9).
//! - **Batching.** Records are buffered per partition and produced when a partition's batch is full
//!   and on [`SinkLogic::flush`]; a flush returns once the broker acknowledged everything.

use std::{marker::PhantomData, sync::Arc};

use koala_dataflow::{DataflowError, TaskInstance, logic::SinkFactory, logic::SinkLogic};
use koala_types::{Record, bucket_of};
use rskafka::{
    chrono::{DateTime, Utc},
    client::partition::{Compression, PartitionClient, UnknownTopicHandling},
};
use serde::{Serialize, de::DeserializeOwned};
use tokio::runtime::Runtime;

use crate::{
    CALL_LIMIT, ConnectorError, REQUEST_DEADLINE, ValueFormat, block_on_within, connect, io_runtime, now_ms,
};

/// Turns a project-encoded value into the Kafka value bytes.
type Encoder = Arc<dyn Fn(&[u8]) -> Result<Vec<u8>, DataflowError> + Send + Sync>;

/// A typed Kafka sink declaration.
///
/// ```
/// use koala_connectors::{KafkaSinkSpec, ValueFormat};
/// let spec = KafkaSinkSpec::<(u64, f64)>::new(vec!["127.0.0.1:9092".into()], "averages", ValueFormat::Json);
/// let _factory = spec.factory(); // koala_dataflow::logic::SinkFormat::Custom(_factory)
/// ```
pub struct KafkaSinkSpec<T> {
    brokers: Vec<String>,
    topic: String,
    format: ValueFormat,
    batch_records: usize,
    _type: PhantomData<fn() -> T>,
}

impl<T> Clone for KafkaSinkSpec<T> {
    fn clone(&self) -> Self {
        Self {
            brokers: self.brokers.clone(),
            topic: self.topic.clone(),
            format: self.format,
            batch_records: self.batch_records,
            _type: PhantomData,
        }
    }
}

impl<T: Serialize + DeserializeOwned + 'static> KafkaSinkSpec<T> {
    /// Writes `T` values to an existing `topic` in `format`.
    pub fn new(brokers: Vec<String>, topic: impl Into<String>, format: ValueFormat) -> Self {
        Self { brokers, topic: topic.into(), format, batch_records: 1_000, _type: PhantomData }
    }

    /// Records per produce request and partition (default 1000).
    pub fn batch_records(mut self, records: usize) -> Self {
        self.batch_records = records.max(1);
        self
    }

    /// Connects the sink of task `task`.
    pub fn build(&self, task: TaskInstance) -> Result<KafkaSink, ConnectorError> {
        let rt = io_runtime()?;
        let topic = self.topic.clone();
        let partitions = block_on_within(&rt, CALL_LIMIT, "opening the sink topic", async {
            let client = connect(&self.brokers, REQUEST_DEADLINE).await?;
            let topics =
                client.list_topics().await.map_err(|e| ConnectorError::kafka("listing topics", e))?;
            let Some(meta) = topics.into_iter().find(|t| t.name == topic) else {
                return Err(ConnectorError::Config(format!(
                    "kafka topic {topic} does not exist on {}",
                    self.brokers.join(",")
                )));
            };
            let mut clients = Vec::new();
            for p in meta.partitions {
                let pc = client
                    .partition_client(topic.clone(), p, UnknownTopicHandling::Retry)
                    .await
                    .map_err(|e| ConnectorError::kafka(format!("opening {topic}/{p}"), e))?;
                clients.push(Arc::new(pc));
            }
            Ok(clients)
        })?;
        if partitions.is_empty() {
            return Err(ConnectorError::Config(format!("kafka topic {topic} has no partitions")));
        }
        let pending = partitions.iter().map(|_| Vec::new()).collect();
        Ok(KafkaSink {
            rt,
            next_unkeyed: task.index as usize % partitions.len(),
            partitions,
            encode: self.encoder(),
            pending,
            batch_records: self.batch_records,
            written: 0,
        })
    }

    /// A factory building [`Self::build`] per task (`SinkFormat::Custom`).
    pub fn factory(&self) -> SinkFactory {
        let spec = self.clone();
        Arc::new(move |task| {
            spec.build(task)
                .map(|sink| Box::new(sink) as Box<dyn SinkLogic>)
                .map_err(|e| DataflowError::Other(e.to_string()))
        })
    }

    fn encoder(&self) -> Encoder {
        match self.format {
            ValueFormat::Binary => Arc::new(|bytes| Ok(bytes.to_vec())),
            ValueFormat::Json => Arc::new(|bytes| {
                let value: T = koala_types::decode(bytes)?;
                serde_json::to_vec(&value).map_err(|e| DataflowError::Other(format!("encoding json: {e}")))
            }),
        }
    }
}

/// A Kafka sink task; see the module docs.
pub struct KafkaSink {
    rt: Runtime,
    partitions: Vec<Arc<PartitionClient>>,
    encode: Encoder,
    /// Records waiting to be produced, per partition index.
    pending: Vec<Vec<rskafka::record::Record>>,
    batch_records: usize,
    next_unkeyed: usize,
    written: u64,
}

impl KafkaSink {
    /// Records acknowledged by the broker so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    fn produce(&mut self, only_full: bool) -> Result<(), DataflowError> {
        for (i, pending) in self.pending.iter_mut().enumerate() {
            if pending.is_empty() || (only_full && pending.len() < self.batch_records) {
                continue;
            }
            let records = std::mem::take(pending);
            let n = records.len() as u64;
            let client = &self.partitions[i];
            let what = format!("producing to {}/{}", client.topic(), client.partition());
            let produced = async {
                client
                    .produce(records, Compression::NoCompression)
                    .await
                    .map_err(|e| ConnectorError::kafka(what.clone(), e))
            };
            block_on_within(&self.rt, CALL_LIMIT, &what, produced)
                .map_err(|e| DataflowError::Other(e.to_string()))?;
            self.written += n;
        }
        Ok(())
    }
}

impl SinkLogic for KafkaSink {
    fn write(&mut self, records: &[Record]) -> Result<(), DataflowError> {
        let timestamp =
            DateTime::<Utc>::from_timestamp_millis(i64::try_from(now_ms()).unwrap_or(0)).unwrap_or_default();
        let n = self.partitions.len();
        for record in records {
            let value = (self.encode)(&record.value)?;
            let (key, index) = if record.key.is_empty() {
                self.next_unkeyed = (self.next_unkeyed + 1) % n;
                (None, self.next_unkeyed)
            } else {
                let index = usize::from(bucket_of(&record.key, u16::try_from(n).unwrap_or(u16::MAX)));
                (Some(record.key.clone()), index)
            };
            self.pending[index].push(rskafka::record::Record {
                key,
                value: Some(value),
                headers: Default::default(),
                timestamp,
            });
        }
        self.produce(true)
    }

    fn flush(&mut self) -> Result<(), DataflowError> {
        self.produce(false)
    }
}
