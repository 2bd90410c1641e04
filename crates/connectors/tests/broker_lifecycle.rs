//! The broker lifecycle across "processes": start, status from the state file, stop by data dir,
//! a second start in the same dir refused, and SQLite data surviving a restart.
#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use common::{consume_raw, poll_until, produce_raw};
use koala_connectors::{
    KafkaSourceSpec, ValueFormat,
    broker::{self, BrokerOptions, BrokerStatus},
};
use koala_dataflow::{SourcePoll, TaskInstance};

#[test]
fn start_status_stop_and_restart_keep_the_data() {
    let dir = tempfile::tempdir().unwrap();
    let handle = broker::start(BrokerOptions::new(dir.path())).unwrap();
    let brokers = vec![handle.bootstrap().to_string()];
    assert!(dir.path().join("tansu.db").exists(), "sqlite db lives in the data dir");

    let again = broker::start(BrokerOptions::new(dir.path())).unwrap_err();
    assert!(again.to_string().contains("already runs"), "{again}");

    broker::create_topic(&brokers, "kept", 1).unwrap();
    produce_raw(&brokers, "kept", 0, (0..10u8).map(|i| (None, vec![i])).collect());

    // `koala broker start` detaches; `koala broker stop` finds it through the state file.
    let state = handle.detach();
    match broker::status(dir.path()).unwrap() {
        BrokerStatus::Running(s) => assert_eq!(s, state),
        other => panic!("expected running, got {other:?}"),
    }
    assert!(broker::stop(dir.path()).unwrap());
    // `stop` returns once the broker has exited: no thread of it is left, nothing listens.
    let threads = std::fs::read_dir(format!("/proc/{}/task", state.pid)).map_or(0, |t| {
        t.filter_map(Result::ok)
            .filter(|t| {
                std::fs::read_to_string(t.path().join("stat")).is_ok_and(|s| {
                    s.rsplit_once(')').is_some_and(|(_, r)| !r.trim_start().starts_with(['Z', 'X']))
                })
            })
            .count()
    });
    assert_eq!(threads, 0, "broker threads still running after stop returned");
    assert!(std::net::TcpStream::connect(&state.bootstrap).is_err(), "the broker still listens after stop");
    assert_eq!(broker::status(dir.path()).unwrap(), BrokerStatus::NotRunning);
    assert!(!broker::stop(dir.path()).unwrap(), "stopping twice is a no-op");

    let restarted = broker::start(BrokerOptions::new(dir.path())).unwrap();
    let brokers = vec![restarted.bootstrap().to_string()];
    let values: Vec<Vec<u8>> =
        consume_raw(&brokers, "kept", 0, 10).into_iter().map(|r| r.record.value.unwrap()).collect();
    assert_eq!(values, (0..10u8).map(|i| vec![i]).collect::<Vec<_>>());
    restarted.stop().unwrap();
    assert_eq!(broker::status(dir.path()).unwrap(), BrokerStatus::NotRunning);
}

#[test]
fn memory_engine_starts_and_answers() {
    let dir = tempfile::tempdir().unwrap();
    let handle = broker::start(BrokerOptions { memory: true, ..BrokerOptions::new(dir.path()) }).unwrap();
    let brokers = vec![handle.bootstrap().to_string()];
    broker::create_topic(&brokers, "fast", 2).unwrap();
    produce_raw(&brokers, "fast", 1, vec![(None, br#""x""#.to_vec())]);
    assert_eq!(consume_raw(&brokers, "fast", 1, 1).len(), 1);
    // The source's bounded mode relies on the Fetch high watermark, which the memory engine gets
    // right (unlike its ListOffsets(latest)).
    let spec = KafkaSourceSpec::<String>::new(brokers, "fast", ValueFormat::Json).until_end(true);
    let mut source = spec.build(TaskInstance { index: 0, parallelism: 1 });
    let (records, poll) = poll_until(&mut source, usize::MAX, 10);
    assert_eq!((records.len(), poll), (1, SourcePoll::Finished));
    assert!(!dir.path().join("tansu.db").exists());
}

#[test]
fn a_broker_that_cannot_start_reports_its_log_tail() {
    let dir = tempfile::tempdir().unwrap();
    // Take the port so tansu cannot bind it.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let options = BrokerOptions {
        port: Some(port),
        startup_timeout: std::time::Duration::from_secs(20),
        ..BrokerOptions::new(dir.path())
    };
    let err = broker::start(options).unwrap_err().to_string();
    eprintln!("{err}");
    assert!(err.contains("broker.log"), "{err}");
    assert_eq!(broker::status(dir.path()).unwrap(), BrokerStatus::NotRunning);
}
