//! KafkaSink writes keyed records (JSON and binary values); an independent rskafka consumer reads
//! them back, each key in the partition `bucket_of(key, partitions)`.
#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::collections::BTreeMap;

use common::{Reading, consume_raw, start_broker};
use koala_connectors::{KafkaSinkSpec, ValueFormat, broker};
use koala_dataflow::TaskInstance;
use koala_types::{Record, bucket_of};

fn records() -> Vec<Record> {
    (0..300u64)
        .map(|i| {
            let r = Reading { sensor: (i % 7) as u32, seq: i, at_ms: i };
            Record {
                key: koala_types::encode(&r.sensor).unwrap(),
                value: koala_types::encode(&r).unwrap(),
                time: i,
                due_ms: 0,
            }
        })
        .collect()
}

fn write_and_read_back(format: ValueFormat, topic: &str) {
    let broker = start_broker();
    let brokers = broker.brokers();
    broker::create_topic(&brokers, topic, 3).unwrap();
    let spec = KafkaSinkSpec::<Reading>::new(brokers.clone(), topic, format).batch_records(64);
    let factory = spec.factory();
    let mut sink = factory(TaskInstance { index: 0, parallelism: 1 }).unwrap();
    let input = records();
    for chunk in input.chunks(50) {
        sink.write(chunk).unwrap();
    }
    sink.flush().unwrap();

    let mut by_partition = BTreeMap::new();
    let mut read = Vec::new();
    for p in 0..3 {
        let want = input.iter().filter(|r| i32::from(bucket_of(&r.key, 3)) == p).count();
        let got = consume_raw(&brokers, topic, p, want);
        assert_eq!(got.len(), want, "partition {p}");
        for r in got {
            let key = r.record.key.unwrap();
            assert_eq!(i32::from(bucket_of(&key, 3)), p, "a key always lands in its bucket's partition");
            let value = r.record.value.unwrap();
            let reading: Reading = match format {
                ValueFormat::Json => serde_json::from_slice(&value).unwrap(),
                ValueFormat::Binary => koala_types::decode(&value).unwrap(),
            };
            assert_eq!(koala_types::decode::<u32>(&key).unwrap(), reading.sensor);
            by_partition.entry(p).or_insert_with(Vec::new).push(reading.seq);
            read.push(reading);
        }
    }
    for seqs in by_partition.values() {
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "per-partition order is write order");
    }
    read.sort();
    let mut expected: Vec<Reading> = input.iter().map(|r| koala_types::decode(&r.value).unwrap()).collect();
    expected.sort();
    assert_eq!(read, expected);
}

#[test]
fn json_values_round_trip_through_kafka() {
    write_and_read_back(ValueFormat::Json, "sink-json");
}

#[test]
fn binary_values_round_trip_through_kafka() {
    write_and_read_back(ValueFormat::Binary, "sink-binary");
}

#[test]
fn a_missing_topic_fails_the_sink_factory_with_its_name() {
    let broker = start_broker();
    let spec = KafkaSinkSpec::<Reading>::new(broker.brokers(), "absent", ValueFormat::Json);
    let err = spec.factory()(TaskInstance { index: 0, parallelism: 1 }).err().unwrap();
    assert!(err.to_string().contains("absent"), "{err}");
}
