//! Kafka in and out on a real Kafka-protocol broker (tansu, started by the test on a free port):
//! `koala produce`'s Nexmark bids → a job (2 worker processes) reads them through the keyed
//! aggregation → a sink topic → an independent consumer checks count and contents against the
//! generator's bids; the source lag is in the metrics DB. A second job reads a one-partition
//! topic with two source tasks (one has no partition and finishes at once) and is rescaled twice
//! while it runs, under each protocol; its output must be exactly the same. A Nexmark bid query
//! (Q7) reading the produced bids from Kafka writes what it writes over the embedded generator.

mod common;

use std::collections::BTreeMap;

use koala_connectors::broker::{BrokerOptions, start};
use koala_connectors::queries::BidTotal;
use koala_connectors::{KafkaSourceSpec, ProduceOptions, ValueFormat, produce};
use koala_coordinator::metrics_store::{Aggregate, MetricsStore, TaskScope};
use koala_dataflow::{SourceLogic, SourcePoll, TaskInstance};
use koala_types::metric;
use koala_workloads::nexmark::{Event, NexmarkConfig, NexmarkGenerator};

const EVENTS: u64 = 6_000;

#[test]
fn produced_bids_are_aggregated_into_a_sink_topic() {
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = start(BrokerOptions::new(dir.path().join("broker"))).expect("start tansu");
    let brokers = vec![broker.bootstrap().to_string()];

    // Two producers write two partitions; event times come from the generator (deterministic).
    let (nexmark, bids) = produce_events(&brokers, 2, "e2e");

    let config = format!(
        "query = \"bid-aggregate\"\nworkers = 2\noutput_dir = \"{}\"\n\
         [parallelism]\nbids = 2\naggregate = 2\nsink = 2\n\
         [params]\ninput = \"kafka\"\noutput = \"kafka\"\n\
         [params.kafka]\nbrokers = [\"{}\"]\ntopic_prefix = \"e2e\"\noutput_topic = \"e2e-totals\"\nuntil_end = true\n",
        dir.path().join("out").display(),
        brokers[0]
    );
    let run = common::run_koala(dir.path(), &config, common::RUN_TIMEOUT);
    assert!(run.success(), "{}\n{}", run.failure(), run.log());
    let out = dir.path().join("out");
    // Two sink tasks create the sink topic: the second finds it exists, which is fine and quiet;
    // the log goes to a pipe, so it has no colour codes.
    assert!(!run.stderr.contains("TopicAlreadyExists"), "{}", run.stderr);
    assert!(!run.stderr.contains('\u{1b}'), "colour codes in a log that is not a terminal: {:?}", run.stderr);
    assert!(
        run.stdout.contains("kafka: reading e2e-bid from the earliest offset of every partition"),
        "the job does not say where it starts reading:\n{}",
        run.stdout
    );

    check_totals(&brokers, &nexmark, "e2e-totals", bids);
    // The sink topic exists now: creating it again (as every later run's sink tasks do) asks
    // nothing of rskafka's controller, which would log the refusal as an error even though
    // `create_topic` takes it as success. rskafka's own log is captured here, not silenced.
    let log = RskafkaLog::capture();
    koala_connectors::broker::create_topic(&brokers, "e2e-totals", 2).expect("an existing topic is fine");
    assert_eq!(log.text(), "", "creating an existing topic asked the controller");

    let store = MetricsStore::open(&out.join("metrics.db")).expect("metrics db");
    let run = store.latest_run().expect("runs").expect("a run").run;
    let lag =
        store.per_second(&run, metric::SOURCE_LAG_MEAN_MS, Aggregate::Mean, TaskScope::All).expect("lag");
    assert!(!lag.is_empty(), "no Kafka lag samples in the metrics DB");
    let offsets = store
        .per_second(&run, metric::SOURCE_OFFSET_LAG, Aggregate::Sum, TaskScope::All)
        .expect("offset lag");
    assert!(!offsets.is_empty(), "no offset-lag samples (Fetch high watermark) in the metrics DB");
    // The Kafka sink (a custom sink) is measured too, against the input records' timestamps.
    let latency =
        store.per_second(&run, metric::LATENCY_P99_MS, Aggregate::Max, TaskScope::All).expect("latency");
    assert!(!latency.is_empty(), "no end-to-end latency samples from the Kafka sink");
    drop(broker);
}

/// rskafka's errors in this test process, as they would be logged with the controller not
/// silenced (`KOALA_LOG` naming rskafka).
#[derive(Clone, Default)]
struct RskafkaLog(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl RskafkaLog {
    fn capture() -> Self {
        let log = Self::default();
        let writer = log.clone();
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("off,rskafka=error"))
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .init();
        log
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("log")).into_owned()
    }
}

impl std::io::Write for RskafkaLog {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log").extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Produces `EVENTS` Nexmark events with `producers` producers (= partitions per topic) under
/// `prefix`, event times from the generator; returns the generator config and the bids written.
fn produce_events(brokers: &[String], producers: u32, prefix: &str) -> (NexmarkConfig, u64) {
    let nexmark = NexmarkConfig { events: Some(EVENTS), producers, ..Default::default() };
    let mut options = ProduceOptions::new(brokers.to_vec(), nexmark.clone());
    options.topic_prefix = prefix.into();
    options.progress = false;
    options.wall_clock_event_time = false;
    let produced = produce(&options).expect("produce");
    assert_eq!(produced.records, EVENTS);
    (nexmark, produced.per_kind[2])
}

/// The independent check: the generator's bids folded per auction equal what the sink topic holds
/// (read back from both of its partitions): every bid counted once, every auction's sum.
fn check_totals(brokers: &[String], nexmark: &NexmarkConfig, topic: &str, produced_bids: u64) {
    let mut expected: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    for producer in 0..nexmark.producers {
        let g = NexmarkGenerator::new(NexmarkConfig { producer_index: producer, ..nexmark.clone() })
            .expect("config");
        for event in g.events() {
            if let Event::Bid(b) = event {
                let e = expected.entry(b.auction).or_default();
                e.0 += 1;
                e.1 += b.price;
            }
        }
    }
    let bids: u64 = expected.values().map(|(c, _)| c).sum();
    assert_eq!(bids, produced_bids);

    // Read the sink topic back (both partitions) until its end.
    let mut totals: Vec<BidTotal> = Vec::new();
    for partition_task in 0..2 {
        let spec =
            KafkaSourceSpec::<BidTotal>::new(brokers.to_vec(), topic, ValueFormat::Json).until_end(true);
        let mut source = spec.build(TaskInstance { index: partition_task, parallelism: 2 });
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let mut records = Vec::new();
            let poll = source.poll(10_000, &mut records).expect("poll sink topic");
            totals.extend(
                records.iter().map(|r| koala_types::decode::<BidTotal>(&r.value).expect("decode total")),
            );
            if poll == SourcePoll::Finished {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "reading the sink topic timed out");
        }
    }
    assert_eq!(totals.len() as u64, bids, "one total per bid");
    let mut per_auction: BTreeMap<u64, Vec<BidTotal>> = BTreeMap::new();
    for t in totals {
        per_auction.entry(t.auction).or_default().push(t);
    }
    assert_eq!(per_auction.len(), expected.len());
    for (auction, (count, sum)) in &expected {
        let mut rows = per_auction.remove(auction).unwrap_or_default();
        rows.sort_by_key(|r| r.count);
        let counts: Vec<u64> = rows.iter().map(|r| r.count).collect();
        assert_eq!(counts, (1..=*count).collect::<Vec<_>>(), "auction {auction}: every bid counted once");
        let last = rows.last().expect("rows");
        assert_eq!(last.sum_price, *sum, "auction {auction}: sum of prices");
    }
}

/// Produces `EVENTS` Nexmark events to one partition per topic, then runs the bid aggregate with
/// two source tasks for 4 s, rescaling the aggregate 2 → 3 at 1 s and 3 → 1 at 2 s.
fn rescaled_while_reading_one_partition(protocol: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = start(BrokerOptions::new(dir.path().join("broker"))).expect("start tansu");
    let brokers = vec![broker.bootstrap().to_string()];
    let (nexmark, bids) = produce_events(&brokers, 1, "one");
    let config = format!(
        "query = \"bid-aggregate\"\nworkers = 2\nprotocol = \"{protocol}\"\nduration_s = 4\noutput_dir = \"{}\"\n\
         [parallelism]\nbids = 2\naggregate = 2\nsink = 2\n\
         [params]\ninput = \"kafka\"\noutput = \"kafka\"\n\
         [params.kafka]\nbrokers = [\"{}\"]\ntopic_prefix = \"one\"\noutput_topic = \"one-totals\"\n\
         [[reconfigurations]]\nat_s = 1.0\noperator = \"aggregate\"\nparallelism = 3\n\
         [[reconfigurations]]\nat_s = 2.0\noperator = \"aggregate\"\nparallelism = 1\n",
        dir.path().join("out").display(),
        brokers[0]
    );
    let (out, log) = common::run_job_logged(dir.path(), &config);
    let completed =
        log.lines().filter(|l| l.contains("] reconfiguration ") && l.contains(" completed in ")).count();
    assert_eq!(completed, 2, "both rescales must complete; log:\n{log}");
    let store = MetricsStore::open(&out.join("metrics.db")).expect("metrics db");
    let info = store.latest_run().expect("runs").expect("a run");
    assert_eq!(info.protocol, protocol, "the run used another protocol");
    check_totals(&brokers, &nexmark, "one-totals", bids);
    drop(broker);
}

#[test]
fn koala_rescales_a_job_reading_a_one_partition_topic_with_two_source_tasks() {
    rescaled_while_reading_one_partition("koala");
}

#[test]
fn stop_and_restart_rescales_a_job_reading_a_one_partition_topic_with_two_source_tasks() {
    rescaled_while_reading_one_partition("stop-and-restart");
}

/// Nexmark over Kafka: Q7 (the highest bid per 100 ms window, per bidder first) reads the bids
/// `koala produce` wrote to two partitions and writes the same rows as over the embedded
/// generator with the same settings (the disorder bound covers the whole input, so no bid is late
/// however the two partitions interleave).
#[test]
fn nexmark_q7_over_kafka_writes_what_it_writes_over_the_generator() {
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = start(BrokerOptions::new(dir.path().join("broker"))).expect("start tansu");
    let brokers = vec![broker.bootstrap().to_string()];
    let (_, bids) = produce_events(&brokers, 2, "nq");
    let config = |out: &str, input: &str| {
        format!(
            "query = \"nexmark-q7\"\nworkers = 2\noutput_dir = \"{}\"\n\
             [parallelism]\nbids = 1\nmax_bid = 2\nhighest = 1\nsink = 1\n\
             [params]\nsink = \"jsonl\"\nwindow_ms = 100\n{input}\n\
             [params.nexmark]\nevents = {EVENTS}\n\
             [params.source]\nmax_disorder_ms = 60000\n",
            dir.path().join(out).join("out").display(),
        )
    };
    let kafka = format!(
        "input = \"kafka\"\n[params.kafka]\nbrokers = [\"{}\"]\ntopic_prefix = \"nq\"\nuntil_end = true\n",
        brokers[0]
    );
    std::fs::create_dir_all(dir.path().join("kafka")).expect("dir");
    std::fs::create_dir_all(dir.path().join("generator")).expect("dir");
    let (from_kafka, log) = common::run_job_logged(&dir.path().join("kafka"), &config("kafka", &kafka));
    assert!(log.contains("kafka: reading nq-bid from the earliest offset"), "{log}");
    let (from_generator, _) = common::run_job_logged(&dir.path().join("generator"), &config("generator", ""));
    let (got, expected) =
        (common::oracle::rows_per_key(&from_kafka), common::oracle::rows_per_key(&from_generator));
    assert!(expected.len() >= 50, "{} windows over {bids} bids: the test proves little", expected.len());
    if let Err(e) = common::oracle::compare_rows(&expected, &got) {
        panic!("Q7 over Kafka differs from Q7 over the generator: {e}");
    }
    drop(broker);
}
