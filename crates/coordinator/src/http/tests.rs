//! The HTTP server against a stand-in event loop: routes, status codes, the request path shared
//! with the framed control protocol, bounds on bodies, and the Prometheus text.

#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;

use crossbeam_channel::unbounded;
use koala_dataflow::JobGraph;
use koala_protocol::{ClientReply, ReconfigRequest, TaskSample};
use koala_types::{OperatorId, TaskId};
use serde_json::Value;

use super::live::{JobInfo, Live, OperatorInfo};
use super::{HttpServer, MAX_BODY};
use crate::control::Event;

fn live(db: std::path::PathBuf) -> Live {
    let mut info = JobInfo::new(
        "run-1",
        "keyed-aggregate",
        "koala".into(),
        "127.0.0.1:9".into(),
        db,
        &JobGraph::default(),
    );
    info.operators = ["source", "aggregate", "sink"]
        .iter()
        .enumerate()
        .map(|(i, name)| OperatorInfo {
            id: OperatorId(i as u32),
            name: (*name).to_string(),
            kind: ["source", "stateful", "sink"][i],
            inputs: Vec::new(),
        })
        .collect();
    Live::new(info)
}

/// One HTTP/1.1 exchange: (status, body).
fn call(addr: std::net::SocketAddr, method: &str, path: &str, body: &[u8]) -> (u16, String) {
    call_with(addr, method, path, body, "")
}

/// [`call`] with extra header lines (each ending in `\r\n`).
fn call_with(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    body: &[u8],
    headers: &str,
) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    let _ = s.write_all(body);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map_or(String::new(), |(_, b)| b.to_string());
    (status, body)
}

fn error_of(body: &str) -> String {
    let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"));
    v["error"].as_str().unwrap_or_else(|| panic!("no error in {body}")).to_string()
}

#[test]
fn requests_take_the_event_loops_path_and_errors_are_json_with_4xx() {
    let dir = tempfile::tempdir().unwrap();
    let live = Arc::new(live(dir.path().join("metrics.db")));
    let (events_tx, events) = unbounded();
    let server =
        HttpServer::start(TcpListener::bind("127.0.0.1:0").unwrap(), live, events_tx, None, None).unwrap();
    // A stand-in event loop: what reaches it, and its answers.
    let seen = std::thread::spawn(move || {
        let mut seen = Vec::new();
        for event in events.iter().take(3) {
            if let Event::Client(request, reply) = event {
                let answer = match &request {
                    ReconfigRequest::Rescale { parallelism: 3, .. } => ClientReply::Accepted { epoch: 1 },
                    ReconfigRequest::Migrate { .. } => ClientReply::Queued { ahead: 1 },
                    _ => ClientReply::Rejected { error: "operator: no operator \"nope\"".into() },
                };
                let _ = reply.send(answer);
                seen.push(request);
            }
        }
        seen
    });
    let addr = server.addr();
    let (status, body) =
        call(addr, "POST", "/api/rescale", br#"{"operator": "aggregate", "parallelism": 3}"#);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("accepted as reconfiguration 1"), "{body}");
    let (status, body) =
        call(addr, "POST", "/api/rebalance", br#"{"operator": "nope", "moves": ["0-3:1", "7:0"]}"#);
    assert_eq!((status, error_of(&body)), (422, "rejected: operator: no operator \"nope\"".to_string()));
    let (status, body) =
        call(addr, "POST", "/api/migrate", br#"{"operator": "aggregate", "task": 0, "worker": 1}"#);
    assert_eq!(status, 202, "{body}");
    assert_eq!(
        seen.join().unwrap(),
        vec![
            ReconfigRequest::Rescale { operator: "aggregate".into(), parallelism: 3 },
            ReconfigRequest::Rebalance {
                operator: "nope".into(),
                moves: vec![(vec![0, 1, 2, 3], 1), (vec![7], 0)]
            },
            ReconfigRequest::Migrate { operator: "aggregate".into(), task: 0, worker: 1 },
        ]
    );
    // Rejected before the event loop: malformed bodies name the field, as the CLI's flags do.
    let cases: &[(&str, &str, &[u8], u16, &str)] = &[
        ("POST", "/api/rescale", br#"{"operator": "aggregate"}"#, 400, "parallelism: missing"),
        (
            "POST",
            "/api/rescale",
            br#"{"operator": "aggregate", "parallelism": -1}"#,
            400,
            "parallelism: -1 is not a whole number",
        ),
        ("POST", "/api/rescale", br#"{"operator": 7, "parallelism": 2}"#, 400, "operator: 7 is not a string"),
        (
            "POST",
            "/api/rescale",
            br#"{"operator": "a", "parallelism": 2, "extra": 1}"#,
            400,
            "extra: not a field of this request",
        ),
        ("POST", "/api/rebalance", br#"{"operator": "a", "moves": "0:1"}"#, 400, "moves: not a list"),
        (
            "POST",
            "/api/rebalance",
            br#"{"operator": "a", "moves": ["x:1"]}"#,
            400,
            "moves[0] \"x:1\": \"x\" is not a bucket",
        ),
        ("POST", "/api/rebalance", br#"{"operator": "a", "moves": []}"#, 400, "moves: give at least one"),
        ("POST", "/api/migrate", b"not json", 400, "body: not JSON"),
        ("POST", "/api/migrate", b"[1]", 400, "body: not a JSON object"),
        ("GET", "/api/rescale", b"", 405, "takes POST"),
        ("POST", "/api/job", b"", 405, "takes GET"),
        ("GET", "/api/nothing", b"", 404, "no route /api/nothing"),
        ("GET", "/api/metrics?seconds=0", b"", 400, "seconds: \"0\""),
        ("GET", "/api/metrics?minutes=2", b"", 400, "only seconds=N"),
    ];
    for (method, path, body, want_status, needle) in cases {
        let (status, answer) = call(addr, method, path, body);
        assert_eq!(status, *want_status, "{method} {path}: {answer}");
        let error = error_of(&answer);
        assert!(error.contains(needle), "{method} {path}: {error:?} lacks {needle:?}");
    }
    let big = vec![b' '; MAX_BODY + 1];
    let (status, answer) = call(addr, "POST", "/api/rescale", &big);
    assert_eq!((status, error_of(&answer)), (413, format!("body: larger than {MAX_BODY} bytes")));
    // Before the run is recorded: the job answers as starting, with empty series.
    let (status, body) = call(addr, "GET", "/api/metrics?seconds=5", b"");
    assert_eq!(status, 200);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!((v["phase"].as_str(), v["seconds"].as_u64()), (Some("starting"), Some(5)));
    let (status, page) = call(addr, "GET", "/", b"");
    assert!(
        status == 200 && page.contains("<title>koala-rs job</title>") && page.contains("/api/metrics"),
        "{status}"
    );
}

#[test]
fn prometheus_text_has_base_units_labels_and_counter_totals() {
    let dir = tempfile::tempdir().unwrap();
    let live = live(dir.path().join("m.db"));
    let sink = TaskId::new(OperatorId(2), 0);
    let source = TaskId::new(OperatorId(0), 1);
    let sample =
        |time_s, task, metric: &str, value| TaskSample { time_s, task, metric: metric.into(), value };
    live.add_samples(&[
        sample(100, source, koala_types::metric::RECORDS_IN, 1000.0),
        sample(100, sink, koala_types::metric::LATENCY_P99_MS, 900.0),
        sample(101, source, koala_types::metric::RECORDS_IN, 500.0),
        sample(101, sink, koala_types::metric::LATENCY_P99_MS, 250.0),
        sample(101, sink, koala_types::metric::INPUT_PAUSED_MS, f64::NAN),
        sample(100, sink, &koala_types::metric::bucket_records(7), 40.0),
        sample(101, sink, &koala_types::metric::bucket_records(7), 2.0),
    ]);
    let text = super::prometheus::render(&live.info, &live.snapshot());
    // Counters add up over the run; gauges are the last second's, in seconds.
    assert!(
        text.contains("koala_records_in_total{operator=\"source\",task=\"source.1\",worker=\"\"} 1500\n"),
        "{text}"
    );
    assert!(
        text.contains("koala_e2e_latency_seconds{operator=\"sink\",task=\"sink.0\",worker=\"\",quantile=\"0.99\"} 0.25\n"),
        "{text}"
    );
    assert!(!text.contains("koala_input_paused_seconds_total{"), "a NaN sample is skipped: {text}");
    assert!(text.contains("# TYPE koala_records_in_total counter\n"), "{text}");
    assert_eq!(text.matches("# TYPE koala_e2e_latency_seconds ").count(), 1, "one TYPE per name");
    // Per-bucket load: a counter per task and bucket.
    assert!(
        text.contains(
            "koala_bucket_records_total{operator=\"sink\",task=\"sink.0\",worker=\"\",bucket=\"7\"} 42\n"
        ),
        "{text}"
    );
}

/// A server on 0.0.0.0 (not loopback, so the token is required whatever address reaches it;
/// the test reaches it over 127.0.0.1): every route, reads included, refuses a request without
/// the token (401) or with another one (403) and serves one with it; the dashboard page also
/// takes it as `?token=`. Only the authenticated POST reaches the event loop.
#[test]
fn every_route_off_loopback_needs_the_job_token() {
    let dir = tempfile::tempdir().unwrap();
    let live = Arc::new(live(dir.path().join("metrics.db")));
    let (events_tx, events) = unbounded();
    let token = koala_types::handshake::Token::parse("0123456789abcdef-http", "test").unwrap();
    // 0.0.0.0 is not loopback: without a token the server does not start.
    let refused = HttpServer::start(
        TcpListener::bind("0.0.0.0:0").unwrap(),
        live.clone(),
        events_tx.clone(),
        None,
        None,
    );
    assert!(refused.is_err_and(|e| e.to_string().contains("KOALA_TOKEN")));
    let server =
        HttpServer::start(TcpListener::bind("0.0.0.0:0").unwrap(), live, events_tx, Some(token), None)
            .unwrap();
    let answered = std::thread::spawn(move || {
        let mut n = 0;
        for event in events.iter().take(1) {
            if let Event::Client(_, reply) = event {
                let _ = reply.send(ClientReply::Accepted { epoch: 1 });
                n += 1;
            }
        }
        n
    });
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], server.addr().port()));
    let right = "Authorization: Bearer 0123456789abcdef-http\r\n";
    let wrong = "Authorization: Bearer not-the-token\r\n";
    let gets =
        ["/", "/index.html", "/api/job", "/api/metrics?seconds=5", "/api/reconfigurations", "/metrics"];
    for path in gets {
        let (status, text) = call(addr, "GET", path, b"");
        assert_eq!(status, 401, "GET {path} without the token: {text}");
        assert!(!text.contains("run-1") && !text.contains("aggregate"), "GET {path} leaked: {text}");
        let (status, text) = call_with(addr, "GET", path, b"", wrong);
        assert_eq!(status, 403, "GET {path} with another token: {text}");
        let (status, text) = call_with(addr, "GET", path, b"", right);
        assert_eq!(status, 200, "GET {path} with the token: {text}");
    }
    // Without the token the page says how to open it, in words.
    let (_, text) = call(addr, "GET", "/", b"");
    assert!(text.contains("/?token=") && !text.starts_with('{'), "{text}");
    // The page (only the page) takes the token as a query.
    let (status, text) = call(addr, "GET", "/?token=0123456789abcdef-http", b"");
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("<html"), "{text}");
    assert_eq!(call(addr, "GET", "/?token=not-the-token", b"").0, 403);
    assert_eq!(call(addr, "GET", "/api/job?token=0123456789abcdef-http", b"").0, 401);
    let body = br#"{"operator": "aggregate", "parallelism": 3}"#;
    for path in ["/api/rescale", "/api/rebalance", "/api/migrate"] {
        let (status, text) = call(addr, "POST", path, body);
        assert_eq!(status, 401, "POST {path}: {text}");
        assert!(error_of(&text).contains("Authorization: Bearer"), "{text}");
        let (status, text) = call_with(addr, "POST", path, body, wrong);
        assert_eq!((status, error_of(&text)), (403, "wrong job token".to_string()), "POST {path}");
    }
    let (status, text) = call_with(addr, "POST", "/api/rescale", body, right);
    assert_eq!(status, 200, "{text}");
    // Only the authenticated POST reached the event loop.
    assert_eq!(answered.join().unwrap(), 1);
}

/// On loopback every route stays open without a token (as `koala run` serves it).
#[test]
fn on_loopback_reads_need_no_token() {
    let dir = tempfile::tempdir().unwrap();
    let live = Arc::new(live(dir.path().join("metrics.db")));
    let token = koala_types::handshake::Token::parse("0123456789abcdef-http", "test").unwrap();
    let server =
        HttpServer::start(TcpListener::bind("127.0.0.1:0").unwrap(), live, unbounded().0, Some(token), None)
            .unwrap();
    for path in ["/", "/api/job", "/api/reconfigurations", "/metrics"] {
        assert_eq!(call(server.addr(), "GET", path, b"").0, 200, "GET {path}");
    }
    let wrong = "Authorization: Bearer not-the-token\r\n";
    assert_eq!(call_with(server.addr(), "GET", "/api/job", b"", wrong).0, 403);
}

#[test]
fn the_job_shows_checkpoints_as_data_and_reconfigurations_in_words() {
    use crate::metrics_store::{CheckpointRecord, MetricsStore, ReconfigurationStart, RunInfo};
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("metrics.db");
    let mut live = live(db.clone());
    live.info.checkpoint_interval_ms = Some(1000);
    live.info.checkpoints_retained = 3;
    let live = Arc::new(live);
    let server =
        HttpServer::start(TcpListener::bind("127.0.0.1:0").unwrap(), live, unbounded().0, None, None)
            .unwrap();
    let job = |addr| -> Value { serde_json::from_str(&call(addr, "GET", "/api/job", b"").1).unwrap() };
    // Before the run is recorded: on, nothing completed yet.
    let before = job(server.addr());
    assert_eq!(before["checkpoints"]["enabled"], Value::Bool(true), "{before}");
    assert_eq!(before["checkpoints"]["interval_ms"], 1000);
    assert_eq!(
        (&before["checkpoints"]["completed"], &before["checkpoints"]["last"]),
        (&Value::from(0), &Value::Null)
    );

    let mut store = MetricsStore::open(&db).unwrap();
    let info = RunInfo {
        run: "run-1".into(),
        started_ms: 1_000,
        query: "keyed-aggregate".into(),
        protocol: "koala".into(),
        config: String::new(),
    };
    store.begin_run(&info).unwrap();
    for id in 1..=2 {
        let c = CheckpointRecord {
            id,
            epoch: 0,
            started_ms: 2_000 * id,
            completed_ms: 2_000 * id + 40,
            bytes: 4096 * id,
            written_bytes: Some(1024 * id),
            entries: 10,
            alignment_ms: 3,
            path: format!("out/checkpoints/{id}"),
            deployment: Vec::new(),
        };
        store.checkpoint_completed("run-1", &c).unwrap();
    }
    let request = ReconfigRequest::Rescale { operator: "aggregate".into(), parallelism: 4 };
    store
        .reconfiguration_started(
            "run-1",
            &ReconfigurationStart {
                epoch: 1,
                operator: "aggregate".into(),
                kind: "scale_out".into(),
                protocol: "koala".into(),
                started_ms: 3_000,
                buckets_moved: 64,
                detail: crate::request_record::to_json(&request).to_string(),
            },
        )
        .unwrap();
    drop(store);
    let checkpoints = job(server.addr())["checkpoints"].clone();
    assert_eq!(checkpoints["completed"], 2, "{checkpoints}");
    assert_eq!(checkpoints["recoveries"], 0, "{checkpoints}");
    let last = &checkpoints["last"];
    assert_eq!(
        (&last["id"], &last["duration_ms"], &last["bytes"]),
        (&Value::from(2), &Value::from(40), &Value::from(8192)),
        "{checkpoints}"
    );
    let (_, body) = call(server.addr(), "GET", "/api/reconfigurations", b"");
    let history: Value = serde_json::from_str(&body).unwrap();
    let first = &history["reconfigurations"][0];
    assert_eq!(first["detail"], "rescale aggregate to 4 tasks", "{history}");
    assert_eq!(first["request"]["type"], "rescale", "{history}");
    assert_eq!(first["request"]["parallelism"], 4, "{history}");
}
