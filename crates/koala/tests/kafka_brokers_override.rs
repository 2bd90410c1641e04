//! `examples/kafka-bids.toml` against the broker `koala broker start` started on a port of its
//! choosing: the start prints the exact `koala run … --brokers ADDR` to use, `--brokers`
//! replaces the example's `127.0.0.1:9092`, and the bids topic's malformed records (values that
//! are not bids) are counted and named in the run's summary and report.

mod common;

use std::path::Path;

use koala_connectors::{KafkaSinkSpec, ProduceOptions, ValueFormat, produce};
use koala_dataflow::TaskInstance;
use koala_dataflow::logic::SinkLogic;
use koala_types::Record;
use koala_workloads::nexmark::NexmarkConfig;

/// Stops the broker started in a directory when dropped.
struct Broker<'a>(&'a Path);

impl Drop for Broker<'_> {
    fn drop(&mut self) {
        let _ = common::koala().args(["broker", "stop", "--data-dir"]).arg(self.0).output();
    }
}

#[test]
fn the_example_runs_against_the_started_broker_with_brokers_and_counts_malformed_records() {
    let dir = tempfile::tempdir().expect("tempdir");
    let broker_dir = dir.path().join("broker");
    let started = common::koala()
        .args(["broker", "start", "--memory", "--data-dir"])
        .arg(&broker_dir)
        .output()
        .expect("koala broker start");
    let _broker = Broker(&broker_dir);
    let said = String::from_utf8_lossy(&started.stdout).into_owned();
    assert!(started.status.success(), "{said}{}", String::from_utf8_lossy(&started.stderr));
    let addr = said
        .lines()
        .find_map(|l| l.trim().strip_prefix("koala run examples/kafka-bids.toml --brokers "))
        .unwrap_or_else(|| panic!("broker start does not print the `koala run --brokers` to use:\n{said}"))
        .trim()
        .to_string();
    assert!(said.contains(&format!("koala produce --brokers {addr}")), "{said}");

    let mut options = ProduceOptions::new(
        vec![addr.clone()],
        NexmarkConfig { events: Some(2_000), producers: 2, ..Default::default() },
    );
    options.topic_prefix = "t".into();
    options.progress = false;
    produce(&options).expect("produce");
    // Three values that are not bids (a JSON string each) in the bids topic.
    let mut bad = KafkaSinkSpec::<String>::new(vec![addr.clone()], "t-bid", ValueFormat::Json)
        .build(TaskInstance { index: 0, parallelism: 1 })
        .expect("a writer of the bids topic");
    let record = |text: &str| Record {
        key: Vec::new(),
        value: koala_types::encode(&text.to_string()).expect("encode"),
        time: 0,
        due_ms: 0,
    };
    bad.write(&[record("not a bid"), record("nor this"), record("{}")]).expect("write");
    bad.flush().expect("flush");

    // The example as shipped (brokers = 127.0.0.1:9092), in a directory of its own.
    let example =
        std::fs::read_to_string(common::repo_root().join("examples/kafka-bids.toml")).expect("example");
    assert!(example.contains("--brokers"), "the example's comments do not show --brokers:\n{example}");
    let text = example
        .replace(
            "output_dir = \"koala-out/kafka-bids\"",
            &format!("output_dir = {:?}", dir.path().join("out").display().to_string()),
        )
        .replace("topic_prefix = \"nexmark\"", "topic_prefix = \"t\"")
        .replace("output_topic = \"bid-totals\"", "output_topic = \"t-totals\"");
    assert!(text.contains("127.0.0.1:9092") && text.contains("topic_prefix = \"t\""), "{text}");
    let path = dir.path().join("job.toml");
    std::fs::write(&path, &text).expect("write config");
    let run = common::koala().arg("run").arg(&path).args(["--brokers", &addr]).output().expect("koala run");
    let log = format!("{}\n{}", String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&run.stderr));
    assert!(run.status.success(), "{log}");
    assert!(
        log.contains("3 malformed records skipped by source bids"),
        "the summary does not count them:\n{log}"
    );
    assert!(log.contains("done: run"), "{log}");
}
