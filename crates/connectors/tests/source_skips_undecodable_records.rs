//! An undecodable record is counted and skipped; the task keeps going.
#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use common::{Reading, decode_all, json, poll_until, produce_raw, start_broker};
use koala_connectors::{KafkaSourceSpec, ValueFormat, broker};
use koala_dataflow::{SourcePoll, TaskInstance};

#[test]
fn undecodable_records_are_counted_and_skipped() {
    let broker = start_broker();
    let brokers = broker.brokers();
    broker::create_topic(&brokers, "mixed", 1).unwrap();
    let good = |i: u64| Reading { sensor: 1, seq: i, at_ms: i };
    produce_raw(
        &brokers,
        "mixed",
        0,
        vec![
            (None, json(&good(0))),
            (None, b"{not json".to_vec()),
            (None, json(&good(1))),
            (None, br#"{"sensor": "wrong type", "seq": 1, "at_ms": 2}"#.to_vec()),
            (None, json(&good(2))),
        ],
    );
    let spec = KafkaSourceSpec::<Reading>::new(brokers, "mixed", ValueFormat::Json).until_end(true);
    let mut source = spec.build(TaskInstance { index: 0, parallelism: 1 });
    let (records, poll) = poll_until(&mut source, usize::MAX, 100);
    assert_eq!(poll, SourcePoll::Finished);
    assert_eq!(decode_all::<Reading>(&records), vec![good(0), good(1), good(2)]);
    assert_eq!(source.undecodable(), 2);
    assert_eq!(source.positions(), vec![(0, 5)], "skipped records are consumed, not retried");
}
