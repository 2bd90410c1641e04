//! `koala produce` writes the person / auction / bid topics from several producers, each to its
//! own partition, in the 1:3:46 proportions, and a Kafka source reads the typed events back.
#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::{collections::BTreeSet, time::Duration};

use common::{decode_all, poll_until, start_broker};
use koala_connectors::{KafkaSourceSpec, ProduceOptions, ValueFormat, produce};
use koala_dataflow::{RateSchedule, TaskInstance};
use koala_workloads::nexmark::{Auction, Bid, EventKind, NexmarkConfig, Person};

#[test]
fn two_producers_write_disjoint_partitions_in_nexmark_proportions() {
    let broker = start_broker();
    let nexmark = NexmarkConfig { events: Some(1_000), producers: 2, ..Default::default() };
    let options = ProduceOptions { progress: false, ..ProduceOptions::new(broker.brokers(), nexmark) };
    let summary = produce(&options).unwrap();
    assert_eq!(summary.records, 1_000);
    assert_eq!(summary.per_kind, [20, 60, 920]);

    let mut people: Vec<Person> = Vec::new();
    for task in 0..2 {
        let spec = KafkaSourceSpec::<Person>::new(
            broker.brokers(),
            options.topic(EventKind::Person),
            ValueFormat::Json,
        )
        .until_end(true);
        let mut source = spec.build(TaskInstance { index: task, parallelism: 2 });
        people.extend(decode_all::<Person>(&poll_until(&mut source, usize::MAX, 500).0));
    }
    assert_eq!(people.len(), 20);
    let ids: BTreeSet<u64> = people.iter().map(|p| p.id).collect();
    assert_eq!(ids, (1_000..1_020).collect(), "each person id exactly once over both partitions");

    let spec =
        KafkaSourceSpec::<Bid>::new(broker.brokers(), options.topic(EventKind::Bid), ValueFormat::Json)
            .event_time(|b| Some(b.date_time))
            .until_end(true);
    let mut bids = 0;
    for task in 0..2 {
        let mut source = spec.build(TaskInstance { index: task, parallelism: 2 });
        bids += poll_until(&mut source, usize::MAX, 500).0.len();
    }
    assert_eq!(bids, 920);
}

#[test]
fn binary_format_and_rate_pacing() {
    let broker = start_broker();
    let nexmark = NexmarkConfig {
        events: Some(500),
        rate: RateSchedule::constant(2_000.0),
        extra_payload_bytes: 100,
        ..Default::default()
    };
    let options = ProduceOptions {
        progress: false,
        format: ValueFormat::Binary,
        topic_prefix: "paced".into(),
        ..ProduceOptions::new(broker.brokers(), nexmark)
    };
    let summary = produce(&options).unwrap();
    assert_eq!(summary.records, 500);
    // 500 records at 2000/s are due over 250 ms: the run cannot be faster than the schedule.
    assert!(summary.elapsed >= Duration::from_millis(240), "{:?}", summary.elapsed);

    let spec = KafkaSourceSpec::<Auction>::new(
        broker.brokers(),
        options.topic(EventKind::Auction),
        ValueFormat::Binary,
    )
    .until_end(true);
    let mut source = spec.build(TaskInstance { index: 0, parallelism: 1 });
    let auctions: Vec<Auction> = decode_all(&poll_until(&mut source, usize::MAX, 100).0);
    assert_eq!(auctions.len(), 30);
    assert!(auctions.iter().all(|a| a.extra.len() == 100 && a.expires > a.date_time));

    // A rate no broker reaches: the run says it fell short, and of which rate.
    let fast = ProduceOptions {
        progress: false,
        topic_prefix: "fast".into(),
        ..ProduceOptions::new(
            broker.brokers(),
            NexmarkConfig { events: Some(2_000), rate: RateSchedule::constant(1e9), ..Default::default() },
        )
    };
    let summary = produce(&fast).unwrap();
    let (reached, asked) = summary.short_of_rate.expect("1e9 records/s is out of reach");
    assert!((asked - 1e9).abs() < 1.0 && reached < 0.9 * asked, "{reached} of {asked}");
}
