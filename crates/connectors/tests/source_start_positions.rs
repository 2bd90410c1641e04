//! Where a source starts reading a partition it has no position for (`[params.kafka] start`):
//! the earliest offset, the end as it connects (`latest`), or its consumer group's committed
//! offset (`committed`, committing as it reads), on a real tansu broker.
#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use common::{Reading, decode_all, json, poll_until, produce_raw, runtime, start_broker};
use koala_connectors::group_offsets::GroupOffsets;
use koala_connectors::{KafkaSourceSpec, StartAt, ValueFormat, broker};
use koala_dataflow::{SourcePoll, TaskInstance};

const TASK: TaskInstance = TaskInstance { index: 0, parallelism: 1 };

fn produce(brokers: &[String], topic: &str, seqs: std::ops::Range<u64>) {
    for p in 0..2 {
        let batch =
            seqs.clone().map(|seq| (None, json(&Reading { sensor: p as u32, seq, at_ms: seq }))).collect();
        produce_raw(brokers, topic, p, batch);
    }
}

fn sorted(records: &[koala_types::Record]) -> Vec<(u32, u64)> {
    let mut v: Vec<(u32, u64)> = decode_all::<Reading>(records).iter().map(|r| (r.sensor, r.seq)).collect();
    v.sort_unstable();
    v
}

fn committed(brokers: &[String], group: &str, topic: &str) -> Vec<(i32, i64)> {
    runtime().block_on(async {
        let mut g = GroupOffsets::connect(brokers, group).await.unwrap();
        g.fetch(topic, &[0, 1]).await.unwrap().into_iter().collect()
    })
}

/// `latest` skips what was produced before the task connected and reads what comes after.
#[test]
fn latest_reads_only_records_produced_after_the_task_connected() {
    let broker = start_broker();
    let brokers = broker.brokers();
    broker::create_topic(&brokers, "late", 2).unwrap();
    produce(&brokers, "late", 0..10);
    let spec = KafkaSourceSpec::<Reading>::new(brokers.clone(), "late", ValueFormat::Json)
        .start_at(StartAt::Latest, "unused");
    let mut source = spec.build(TASK);
    let (before, _) = poll_until(&mut source, 0, 16);
    assert!(before.is_empty(), "read {} records produced before it connected", before.len());
    assert_eq!(source.positions(), vec![(0, 10), (1, 10)], "starts at each partition's end");
    produce(&brokers, "late", 10..15);
    let (after, _) = poll_until(&mut source, 10, 16);
    let expected: Vec<(u32, u64)> = (0..2).flat_map(|p| (10..15).map(move |s| (p, s))).collect();
    assert_eq!(sorted(&after), expected);

    // The default, `earliest`, reads the topic from its start.
    let spec = KafkaSourceSpec::<Reading>::new(brokers, "late", ValueFormat::Json).until_end(true);
    let (all, poll) = poll_until(&mut spec.build(TASK), usize::MAX, 64);
    assert_eq!((all.len(), poll), (30, SourcePoll::Finished));
}

/// `committed` continues where the group left off, commits as it reads (and when dropped), and
/// another group starts at the earliest offset.
#[test]
fn committed_continues_where_the_group_left_off() {
    let broker = start_broker();
    let brokers = broker.brokers();
    broker::create_topic(&brokers, "groups", 2).unwrap();
    produce(&brokers, "groups", 0..10);
    let spec = |group: &str| {
        KafkaSourceSpec::<Reading>::new(brokers.clone(), "groups", ValueFormat::Json)
            .start_at(StartAt::Committed, group)
            .until_end(true)
    };
    assert_eq!(committed(&brokers, "g1", "groups"), vec![], "a new group has committed nothing");

    // The first reader stops after 12 of the 20 records; dropping it commits its positions.
    let mut first = spec("g1").build(TASK);
    let (part1, _) = poll_until(&mut first, 12, 4);
    assert_eq!(part1.len(), 12);
    let positions = first.positions();
    drop(first);
    assert_eq!(committed(&brokers, "g1", "groups"), positions);

    // The next run of the group reads the other 8 and what came since, and commits at its end.
    produce(&brokers, "groups", 10..15);
    let mut second = spec("g1").build(TASK);
    let (part2, poll) = poll_until(&mut second, usize::MAX, 64);
    assert_eq!((part2.len(), poll), (18, SourcePoll::Finished), "the rest, once");
    let mut both = sorted(&part1);
    both.extend(sorted(&part2));
    both.sort_unstable();
    let expected: Vec<(u32, u64)> = (0..2).flat_map(|p| (0..15).map(move |s| (p, s))).collect();
    assert_eq!(both, expected, "no record read twice, none missed");
    assert_eq!(committed(&brokers, "g1", "groups"), vec![(0, 15), (1, 15)], "committed when it finished");

    // Another group has its own offsets: it starts at the earliest.
    let (other, _) = poll_until(&mut spec("g2").build(TASK), usize::MAX, 64);
    assert_eq!(other.len(), 30);
}
