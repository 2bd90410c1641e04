//! A topic of 3 partitions read by 2 source tasks (partition p → task p % 2): together they return
//! every record exactly once, with the extracted event time and one lag sample per record.
#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::collections::BTreeSet;

use common::{Reading, decode_all, json, now_ms, poll_until, produce_raw, produce_raw_at, start_broker};
use koala_connectors::{KafkaSourceSpec, ValueFormat, assigned_partitions, broker};
use koala_dataflow::{SourceLogic, SourcePoll, TaskInstance};

#[test]
fn two_tasks_read_every_record_of_three_partitions_once() {
    let broker = start_broker();
    let brokers = broker.brokers();
    broker::create_topic(&brokers, "readings", 3).unwrap();
    let mut expected = BTreeSet::new();
    for p in 0..3 {
        let batch: Vec<Reading> =
            (0..200).map(|i| Reading { sensor: p as u32, seq: i, at_ms: 1_000 + i }).collect();
        expected.extend(batch.iter().cloned());
        produce_raw(&brokers, "readings", p, batch.iter().map(|r| (None, json(r))).collect());
    }

    let spec = KafkaSourceSpec::<Reading>::new(brokers, "readings", ValueFormat::Json)
        .event_time(|r| Some(r.at_ms))
        .until_end(true);
    let mut seen = Vec::new();
    for index in 0..2 {
        let mut source = spec.build(TaskInstance { index, parallelism: 2 });
        assert!(!source.paced_by_runtime());
        let (records, poll) = poll_until(&mut source, usize::MAX, 64);
        assert_eq!(poll, SourcePoll::Finished, "bounded source finishes at the high watermark");
        let readings: Vec<Reading> = decode_all(&records);
        let mine = assigned_partitions(&[0, 1, 2], index, 2);
        for (record, reading) in records.iter().zip(&readings) {
            assert!(
                mine.contains(&(reading.sensor as i32)),
                "task {index} read partition {}",
                reading.sensor
            );
            assert_eq!(record.time, reading.at_ms, "event time comes from the extractor");
        }
        let mut lags = Vec::new();
        source.drain_lag_samples(&mut lags);
        assert_eq!(lags.len(), records.len(), "one lag sample per record, not sampled");
        assert_eq!(source.offset_lag(), 0);
        let positions = source.positions();
        assert_eq!(positions, mine.iter().map(|&p| (p, 200)).collect::<Vec<_>>());
        seen.extend(readings);
    }
    assert_eq!(seen.len(), 600, "no record twice");
    assert_eq!(seen.into_iter().collect::<BTreeSet<_>>(), expected, "no record missed");
}

#[test]
fn a_missing_topic_is_a_clear_error() {
    let broker = start_broker();
    let spec = KafkaSourceSpec::<Reading>::new(broker.brokers(), "no-such-topic", ValueFormat::Json);
    let mut source = spec.build(TaskInstance { index: 0, parallelism: 1 });
    let err = source.poll(10, &mut Vec::new()).unwrap_err();
    assert!(err.to_string().contains("no-such-topic"), "{err}");
}

/// Records written an hour before the job started reading are available from the moment it
/// started, not from their timestamp: their lag is the time the job took, not the hour.
#[test]
fn lag_counts_from_when_a_record_became_available() {
    let broker = start_broker();
    let brokers = broker.brokers();
    broker::create_topic(&brokers, "old", 1).unwrap();
    const HOUR_MS: u64 = 3_600_000;
    let written_ms = now_ms() - HOUR_MS;
    let batch: Vec<Reading> = (0..100).map(|i| Reading { sensor: 0, seq: i, at_ms: i }).collect();
    produce_raw_at(&brokers, "old", 0, batch.iter().map(|r| (None, json(r))).collect(), written_ms);
    let before_reading = now_ms();
    let spec = KafkaSourceSpec::<Reading>::new(brokers, "old", ValueFormat::Json).until_end(true);
    let mut source = spec.build(TaskInstance { index: 0, parallelism: 1 });
    let (records, poll) = poll_until(&mut source, usize::MAX, 64);
    let after_reading = now_ms();
    assert_eq!((records.len(), poll), (100, SourcePoll::Finished));
    for r in &records {
        assert!(
            (before_reading..=after_reading).contains(&r.due_ms),
            "due {} is not when the task started reading ({before_reading}..={after_reading}); written at {written_ms}",
            r.due_ms
        );
    }
    let mut lags = Vec::new();
    source.drain_lag_samples(&mut lags);
    assert_eq!(lags.len(), 100);
    let longest = lags.iter().max().copied().unwrap_or(0);
    assert!(longest <= after_reading - before_reading, "lag {longest} ms counts the hour before the run");
}
