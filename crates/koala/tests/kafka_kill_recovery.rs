//! Kafka sources in checkpoints (docs/architecture.md §10), on a real Kafka-protocol broker
//! (tansu, started by each test on a free port): a job reading Kafka checkpoints every 300 ms
//! under stop-and-restart, and one of its two worker processes is `kill -9`ed once a checkpoint
//! completed (read from the coordinator's log, never after a sleep). The job must recover from
//! that checkpoint or a later one with each source seeking its partitions to the offsets the
//! checkpoint recorded, and its JSON-lines output must be exactly the expected rows: no row
//! lost, none twice.
//!
//! - The bid aggregate over a two-partition bid topic the test writes, each auction's bids to one
//!   partition (the Kafka sink's key partitioning), so every auction's bids reach the aggregate
//!   in one partition's order and the rows (auction, count, running price sum) are determined by
//!   the topic alone: the expected rows are an independent fold of the topic read back.
//! - Nexmark Q3 over the person and auction topics `koala produce` writes (each source task reads
//!   both, one stream of events), against Q3 over the embedded generator.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use common::job::{start_job, worker_logs};
use common::oracle::{compare_rows, rows_per_key, rows_per_key_by};
use koala_connectors::broker::{BrokerOptions, create_topic, start};
use koala_connectors::queries::BidTotal;
use koala_connectors::{KafkaSinkSpec, KafkaSourceSpec, ProduceOptions, ValueFormat, produce};
use koala_dataflow::logic::SinkLogic;
use koala_dataflow::{SourceLogic, SourcePoll, TaskInstance};
use koala_types::Record;
use koala_workloads::nexmark::{Bid, Event, NexmarkConfig, NexmarkGenerator};

/// Nexmark events generated; about 92 % are bids.
const EVENTS: u64 = 16_000;

#[test]
fn a_kafka_job_killed_after_a_checkpoint_resumes_at_the_recorded_offsets_with_exact_output() {
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = start(BrokerOptions::new(dir.path().join("broker"))).expect("start tansu");
    let brokers = vec![broker.bootstrap().to_string()];
    let topic = "kk-bid";
    let written = write_bids(&brokers, topic);
    let expected = expected_rows(&brokers, topic, written);

    // Each aggregate task may process 2 000 records/s (emulated capacity) and short queues hold
    // the sources back (backpressure): the job runs for seconds, and checkpoints complete while
    // the sources are still reading (a finished source takes no barrier).
    let text = format!(
        "query = \"bid-aggregate\"\nworkers = 2\nprotocol = \"stop-and-restart\"\n\
         checkpoint_interval_ms = 300\ncheckpoints_retained = 2\noutput_dir = \"{}\"\n\
         [runtime]\ntask_records_per_sec = 2000.0\nbatch_records = 100\nchannel_capacity = 4\n\
         [parallelism]\nbids = 2\naggregate = 2\nsink = 1\n\
         [params]\ninput = \"kafka\"\noutput = \"jsonl\"\n\
         [params.kafka]\nbrokers = [\"{}\"]\ntopic_prefix = \"kk\"\nuntil_end = true\n",
        dir.path().join("out").display(),
        brokers[0]
    );
    let context = run_killed(dir.path(), &text, 2, &[topic]);
    let got = rows_per_key_by(&dir.path().join("out"), "auction");
    compare_rows(&expected, &got).unwrap_or_else(|e| panic!("{e}\n{context}"));
    drop(broker);
}

/// Nexmark Q3 (people joined with the auctions they sell) reads the person and auction topics
/// `koala produce` wrote (two partitions each; each source task reads its partition of both),
/// with checkpoints and a worker killed after checkpoint 1, and writes exactly what Q3 writes
/// over the embedded generator (the join's output does not depend on how the two topics
/// interleave).
#[test]
fn nexmark_q3_over_the_person_and_auction_topics_recovers_from_a_kill_with_the_generators_rows() {
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = start(BrokerOptions::new(dir.path().join("broker"))).expect("start tansu");
    let brokers = vec![broker.bootstrap().to_string()];
    let events = 30_000;
    let nexmark = NexmarkConfig { events: Some(events), producers: 2, ..Default::default() };
    let mut produce_options = ProduceOptions::new(brokers.clone(), nexmark);
    produce_options.topic_prefix = "q3".into();
    produce_options.progress = false;
    produce_options.wall_clock_event_time = false;
    let produced = produce(&produce_options).expect("produce");
    assert_eq!(produced.records, events);

    // Each join task may process 250 records/s and short queues hold the sources back: the
    // ~2 400 people and auctions take seconds.
    let config = |out: &Path, input: &str, top: &str| {
        format!(
            "query = \"nexmark-q3\"\nworkers = 2\n{top}output_dir = \"{}\"\n\
             [runtime]\ntask_records_per_sec = 250.0\nbatch_records = 20\nchannel_capacity = 4\n\
             [parallelism]\nevents = 2\nfilter = 2\njoin = 2\nsink = 1\n\
             [params]\nsink = \"jsonl\"\n{input}\n\
             [params.nexmark]\nevents = {events}\n",
            out.display()
        )
    };
    let kafka = format!(
        "input = \"kafka\"\n[params.kafka]\nbrokers = [\"{}\"]\ntopic_prefix = \"q3\"\nuntil_end = true",
        brokers[0]
    );
    // Under Koala, the default protocol (the bid test above runs stop-and-restart).
    let checkpoints = "protocol = \"koala\"\ncheckpoint_interval_ms = 300\ncheckpoints_retained = 2\n";
    let text = config(&dir.path().join("out"), &kafka, checkpoints);
    let context = run_killed(dir.path(), &text, 1, &["q3-person", "q3-auction"]);

    let generator_dir = dir.path().join("generator");
    std::fs::create_dir_all(&generator_dir).expect("dir");
    let (generator_out, _) =
        common::run_job_logged(&generator_dir, &config(&generator_dir.join("out"), "", ""));
    let expected = rows_per_key(&generator_out);
    let got = rows_per_key(&dir.path().join("out"));
    assert!(expected.len() >= 50, "{} sellers: the test proves little", expected.len());
    compare_rows(&expected, &got)
        .unwrap_or_else(|e| panic!("Q3 over Kafka differs from Q3 over the generator: {e}\n{context}"));
    drop(broker);
}

/// Runs the job `text` in `dir` as processes, `kill -9`s the second worker once checkpoint
/// `after` completed, and checks that the job recovered from a checkpoint ≥ `after` and that
/// every restored Kafka source seeked each partition it was reading (of `topics`) to the offset
/// that checkpoint recorded. Returns the logs, for failure messages.
fn run_killed(dir: &Path, text: &str, after: u64, topics: &[&str]) -> String {
    let (mut coordinator, mut workers) = start_job(dir, text).expect("start the job");
    let reached = coordinator.wait_for(&format!("checkpoint {after} completed"));
    if reached {
        let _ = workers[1].kill();
        let _ = workers[1].wait();
    }
    let (ok, log) = coordinator.wait_exit(Duration::from_secs(120));
    for w in &mut workers {
        let _ = w.kill();
        let _ = w.wait();
    }
    let worker_log = worker_logs(dir);
    let context = format!("config:\n{text}\ncoordinator log:\n{log}\nworker logs:\n{worker_log}");
    assert!(reached, "the job never completed checkpoint {after}: {context}");
    assert!(ok, "the job failed: {context}");

    // It recovered from a checkpoint taken while the sources were reading…
    let restored = log
        .lines()
        .find_map(|l| {
            l.split("recovered: the job restarted from checkpoint ")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse::<u64>()
                .ok()
        })
        .unwrap_or_else(|| panic!("no recovery after the kill: {context}"));
    assert!(
        restored >= after,
        "recovered from checkpoint {restored}, before the one the kill followed: {context}"
    );
    // …the coordinator restored each source at the partition offsets it recorded (a source
    // that had read all its partitions by then is restored as finished), and each restored Kafka
    // source seeked its partitions there.
    let recorded = recorded_offsets(&log, restored);
    for topic in topics {
        assert!(
            recorded.keys().any(|(t, _)| t == topic),
            "checkpoint {restored} records no partition of {topic} being read: {context}"
        );
    }
    assert!(
        recorded.values().any(|&o| o > 0),
        "checkpoint {restored} recorded no record read: the kill came too early to test a seek: {context}"
    );
    for ((topic, partition), offset) in &recorded {
        let seek =
            format!("kafka: {topic} partition {partition} seeks to offset {offset}, its recorded position");
        assert!(worker_log.contains(&seek), "no '{seek}' in the worker logs: {context}");
    }
    context
}

/// Writes the generator's bids to `topic` (two partitions) through the Kafka sink, keyed by
/// auction so each auction's bids share a partition; returns how many.
fn write_bids(brokers: &[String], topic: &str) -> u64 {
    create_topic(brokers, topic, 2).expect("create the bid topic");
    let mut sink = KafkaSinkSpec::<Bid>::new(brokers.to_vec(), topic, ValueFormat::Json)
        .build(TaskInstance { index: 0, parallelism: 1 })
        .expect("bid producer");
    let generator = NexmarkGenerator::new(NexmarkConfig { events: Some(EVENTS), ..Default::default() })
        .expect("generator");
    let records: Vec<Record> = generator
        .events()
        .filter_map(|e| if let Event::Bid(b) = e { Some(b) } else { None })
        .map(|b| Record {
            key: koala_types::encode(&b.auction).expect("key"),
            value: koala_types::encode(&b).expect("value"),
            time: b.date_time,
            due_ms: 0,
        })
        .collect();
    for chunk in records.chunks(1000) {
        sink.write(chunk).expect("produce bids");
    }
    sink.flush().expect("flush bids");
    assert_eq!(sink.written(), records.len() as u64);
    records.len() as u64
}

/// The independent computation: each partition of `topic` read back in offset order, its bids
/// folded per auction into the rows the aggregate writes (count and running price sum per bid).
fn expected_rows(brokers: &[String], topic: &str, written: u64) -> BTreeMap<String, Vec<String>> {
    let mut totals: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    let mut rows: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut read = 0;
    for partition in 0..2 {
        let spec = KafkaSourceSpec::<Bid>::new(brokers.to_vec(), topic, ValueFormat::Json).until_end(true);
        let mut source = spec.build(TaskInstance { index: partition, parallelism: 2 });
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let mut records = Vec::new();
            let poll = source.poll(10_000, &mut records).expect("read the bid topic");
            for r in &records {
                let bid: Bid = koala_types::decode(&r.value).expect("decode bid");
                let (count, sum) = totals.entry(bid.auction).or_default();
                *count += 1;
                *sum = sum.wrapping_add(bid.price);
                let row = BidTotal { auction: bid.auction, count: *count, sum_price: *sum };
                let json = serde_json::to_value(row).expect("json");
                rows.entry(bid.auction.to_string()).or_default().push(json.to_string());
                read += 1;
            }
            if poll == SourcePoll::Finished {
                break;
            }
            assert!(Instant::now() < deadline, "reading the bid topic back timed out");
        }
    }
    assert_eq!(read, written, "the bid topic holds what was written");
    assert!(rows.len() >= 100, "{} auctions: the test proves little", rows.len());
    for r in rows.values_mut() {
        r.sort();
    }
    rows
}

/// The offsets the coordinator logged restoring the sources from checkpoint `id`
/// (`source <task> resumes at offsets <topic>/<partition>:<offset> … (checkpoint id)`), per
/// topic and partition.
fn recorded_offsets(log: &str, id: u64) -> BTreeMap<(String, i32), i64> {
    let suffix = format!("(checkpoint {id})");
    let mut offsets = BTreeMap::new();
    for line in log.lines().filter(|l| l.contains(&suffix)) {
        let Some(rest) = line.split(" resumes at offsets ").nth(1) else { continue };
        for pair in rest.split_whitespace().take_while(|w| !w.starts_with('(')) {
            if let Some((topic, at)) = pair.split_once('/')
                && let Some((p, o)) = at.split_once(':')
                && let (Ok(p), Ok(o)) = (p.parse(), o.parse())
            {
                offsets.insert((topic.to_string(), p), o);
            }
        }
    }
    offsets
}
