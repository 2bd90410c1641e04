//! Shared by the connector tests: a real tansu broker in a temp dir on a free port, raw
//! produce/consume with rskafka, and polling a source until a deadline (never a sleep deciding
//! correctness).
#![allow(dead_code, clippy::unwrap_used, missing_docs)]

use std::time::{Duration, Instant};

use koala_connectors::{
    KafkaSource,
    broker::{self, BrokerHandle, BrokerOptions},
};
use koala_dataflow::{SourceLogic, SourcePoll};
use koala_types::Record;
use rskafka::{
    chrono::{DateTime, Utc},
    client::{
        ClientBuilder,
        partition::{Compression, UnknownTopicHandling},
    },
    record::{Record as KafkaRecord, RecordAndOffset},
};
use serde::{Deserialize, Serialize};

/// The value type most tests move through Kafka.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Reading {
    pub sensor: u32,
    pub seq: u64,
    pub at_ms: u64,
}

pub struct TestBroker {
    pub handle: BrokerHandle,
    pub dir: tempfile::TempDir,
}

impl TestBroker {
    pub fn brokers(&self) -> Vec<String> {
        vec![self.handle.bootstrap().to_string()]
    }
}

/// Starts tansu (SQLite engine) in a fresh temp dir on a free port; stopped when dropped.
pub fn start_broker() -> TestBroker {
    let dir = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let handle = broker::start(BrokerOptions::new(dir.path())).unwrap();
    eprintln!("broker {} up in {:?}", handle.bootstrap(), started.elapsed());
    TestBroker { handle, dir }
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

/// Produces `(key, value)` pairs to one partition; returns the offsets.
pub fn produce_raw(
    brokers: &[String],
    topic: &str,
    partition: i32,
    records: Vec<(Option<Vec<u8>>, Vec<u8>)>,
) -> Vec<i64> {
    produce_raw_at(brokers, topic, partition, records, now_ms())
}

/// [`produce_raw`] with the Kafka timestamp `timestamp_ms` on every record.
pub fn produce_raw_at(
    brokers: &[String],
    topic: &str,
    partition: i32,
    records: Vec<(Option<Vec<u8>>, Vec<u8>)>,
    timestamp_ms: u64,
) -> Vec<i64> {
    let timestamp = DateTime::<Utc>::from_timestamp_millis(timestamp_ms as i64).unwrap();
    let records = records
        .into_iter()
        .map(|(key, value)| KafkaRecord { key, value: Some(value), headers: Default::default(), timestamp })
        .collect();
    runtime().block_on(async {
        let client = ClientBuilder::new(brokers.to_vec()).build().await.unwrap();
        let pc = client.partition_client(topic, partition, UnknownTopicHandling::Retry).await.unwrap();
        pc.produce(records, Compression::NoCompression).await.unwrap()
    })
}

/// Reads a partition from offset 0 until `want` records arrived or the deadline passed.
pub fn consume_raw(brokers: &[String], topic: &str, partition: i32, want: usize) -> Vec<RecordAndOffset> {
    runtime().block_on(async {
        let client = ClientBuilder::new(brokers.to_vec()).build().await.unwrap();
        let pc = client.partition_client(topic, partition, UnknownTopicHandling::Retry).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut out: Vec<RecordAndOffset> = Vec::new();
        while out.len() < want && Instant::now() < deadline {
            let at = out.last().map_or(0, |r| r.offset + 1);
            let (records, _hw) = pc.fetch_records(at, 1..1_000_000, 100).await.unwrap();
            out.extend(records);
        }
        out
    })
}

pub fn json(r: &Reading) -> Vec<u8> {
    serde_json::to_vec(r).unwrap()
}

/// Polls until `want` records were returned, the source finished, or 30 s passed.
pub fn poll_until(source: &mut KafkaSource, want: usize, batch: usize) -> (Vec<Record>, SourcePoll) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut out = Vec::new();
    loop {
        let mut chunk = Vec::new();
        let poll = source.poll(batch.min(want.saturating_sub(out.len()).max(1)), &mut chunk).unwrap();
        out.extend(chunk);
        if out.len() >= want || poll == SourcePoll::Finished || Instant::now() >= deadline {
            return (out, poll);
        }
    }
}

pub fn decode_all<T: serde::de::DeserializeOwned>(records: &[Record]) -> Vec<T> {
    records.iter().map(|r| koala_types::decode(&r.value).unwrap()).collect()
}

pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
}
