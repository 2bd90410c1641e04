//! A source stopped mid-stream and resumed from its recorded positions reads no record twice and
//! misses none, including records produced while it was stopped.
#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use common::{Reading, decode_all, poll_until, produce_raw, start_broker};
use koala_connectors::{KafkaSourceSpec, ValueFormat, broker};
use koala_dataflow::TaskInstance;

fn binary(r: &Reading) -> Vec<u8> {
    koala_types::encode(r).unwrap()
}

#[test]
fn resumed_source_reads_no_record_twice_and_misses_none() {
    let broker = start_broker();
    let brokers = broker.brokers();
    broker::create_topic(&brokers, "resume", 2).unwrap();
    let reading = |p: i32, i: u64| Reading { sensor: p as u32, seq: i, at_ms: i };
    for p in 0..2 {
        produce_raw(&brokers, "resume", p, (0..150).map(|i| (None, binary(&reading(p, i)))).collect());
    }
    let spec = KafkaSourceSpec::<Reading>::new(brokers.clone(), "resume", ValueFormat::Binary);
    let task = TaskInstance { index: 0, parallelism: 1 };

    let mut first = spec.build(task);
    let (part1, _) = poll_until(&mut first, 170, 25);
    assert_eq!(part1.len(), 170);
    let positions = first.positions();
    assert_eq!(positions.iter().map(|&(_, o)| o).sum::<i64>(), 170, "positions count emitted records only");
    drop(first);

    for p in 0..2 {
        produce_raw(&brokers, "resume", p, (150..200).map(|i| (None, binary(&reading(p, i)))).collect());
    }
    let mut second = spec.resume(task, &positions);
    assert_eq!(second.positions(), positions);
    let (part2, _) = poll_until(&mut second, 230, 40);
    assert_eq!(part2.len(), 230);

    let mut all: Vec<Reading> = decode_all(&part1);
    all.extend(decode_all::<Reading>(&part2));
    all.sort();
    let mut expected: Vec<Reading> = (0..2).flat_map(|p| (0..200).map(move |i| reading(p, i))).collect();
    expected.sort();
    assert_eq!(all, expected);
    assert_eq!(second.positions(), vec![(0, 200), (1, 200)]);
}

#[test]
fn a_task_keeps_only_the_positions_of_its_own_partitions() {
    // No broker needed: positions are filtered before the first connection.
    let spec = KafkaSourceSpec::<Reading>::new(vec!["127.0.0.1:1".into()], "t", ValueFormat::Json);
    let all_tasks = [(0, 5), (1, 6), (2, 7), (3, 9)];
    let source = spec.resume(TaskInstance { index: 1, parallelism: 2 }, &all_tasks);
    assert_eq!(source.positions(), vec![(1, 6), (3, 9)]);
}
