//! The seed corpus: representative inputs of every target, as the tests build them — valid
//! messages of every kind a peer sends, greetings and verdicts, the example job configs and
//! request bodies. `examples/write_corpus.rs` writes them into `corpus/<target>/`; libFuzzer
//! starts from them and mutates.

use std::collections::{BTreeMap, BTreeSet};

use koala_protocol::koala::{
    ExtraKeys, FetchRequest, FetchResponse, FilterRequest, FilterResponse, KeyFilter, PeerMessage,
};
use koala_protocol::{
    ClientReply, ControlHello, CoordinatorMessage, Deployment, Protocol, ReconfigRequest, RuntimeOptions,
    StateBackendKind, StateOptions, TaskAck, TaskSample, WorkerMessage,
};
use koala_runtime::fuzzing::{ChannelHello, DrrsWire, KoalaWire};
use koala_state::remote::{StateRequest, StateResponse};
use koala_state::{StateKey, StateWrite};
use koala_types::handshake::{Role, greeting_bytes_of};
use koala_types::{ChannelMessage, InputChannel, OperatorId, Record, StateEntry, TaskId, WorkerId};
use serde::Serialize;

/// One seed: the target it is for, a file name, its bytes.
pub struct Seed {
    /// The fuzz target (`fuzz_targets/<target>.rs`).
    pub target: &'static str,
    /// The file name under `corpus/<target>/`.
    pub name: String,
    /// The input.
    pub bytes: Vec<u8>,
}

fn task(operator: u32, index: u32) -> TaskId {
    TaskId::new(OperatorId(operator), index)
}

fn encoded<T: Serialize>(message: &T) -> Vec<u8> {
    koala_types::encode(message).unwrap_or_else(|e| panic!("encoding a seed: {e}"))
}

fn framed(payload: &[u8]) -> Vec<u8> {
    let mut out = u32::try_from(payload.len()).unwrap_or(u32::MAX).to_le_bytes().to_vec();
    out.extend_from_slice(payload);
    out
}

fn deployment() -> Deployment {
    Deployment {
        run: "run-1".into(),
        query: "keyed-aggregate".into(),
        query_params: "rate = 10".into(),
        workers: BTreeMap::from([(WorkerId(0), "10.0.0.1:7100".to_string())]),
        placement: BTreeMap::from([(task(0, 0), WorkerId(0)), (task(1, 0), WorkerId(0))]),
        tasks: BTreeMap::from([(OperatorId(0), vec![0]), (OperatorId(1), vec![0])]),
        epoch: 2,
        routing: BTreeMap::from([(OperatorId(1), vec![0; 8])]),
        num_buckets: 8,
        options: RuntimeOptions {
            batch_records: 64,
            linger_ms: 1,
            channel_capacity: 64,
            sink_dir: "out".into(),
            capacity: Default::default(),
            max_queued_records: 1000,
            checkpoint: Default::default(),
        },
        protocol: Protocol::Koala,
        extra_keys: 0,
        drain_keys_per_sec: 0,
        finished: BTreeSet::from([task(0, 0)]),
    }
}

/// Control messages, each encoded (no length prefix).
fn control() -> Vec<Vec<u8>> {
    let state = StateOptions {
        backend: StateBackendKind::Remote,
        cache_bytes: 1 << 20,
        servers: vec!["10.0.0.2:7200".into()],
        ..Default::default()
    };
    vec![
        encoded(&ControlHello::Worker { data_addr: "10.0.0.1:7100".into(), pid: 42 }),
        encoded(&ControlHello::Client(ReconfigRequest::Rebalance {
            operator: "aggregate".into(),
            moves: vec![(vec![0, 1, 2], 1)],
        })),
        encoded(&ControlHello::Client(ReconfigRequest::Rescale {
            operator: "aggregate".into(),
            parallelism: 4,
        })),
        encoded(&ClientReply::Rejected { error: "no operator".into() }),
        encoded(&ClientReply::Accepted { epoch: 3 }),
        encoded(&CoordinatorMessage::Welcome { worker: WorkerId(1) }),
        encoded(&CoordinatorMessage::Deploy(Box::new(deployment()), state)),
        encoded(&CoordinatorMessage::Drain { epoch: 2 }),
        encoded(&CoordinatorMessage::UpstreamEnded {
            upstream: task(0, 0),
            tasks: vec![task(1, 0), task(1, 1)],
        }),
        encoded(&WorkerMessage::Metrics(vec![TaskSample {
            time_s: 9,
            task: task(1, 0),
            metric: "records_in".into(),
            value: 1.5,
        }])),
        encoded(&WorkerMessage::TaskAck {
            task: task(1, 0),
            epoch: 2,
            ack: TaskAck::StateSent { bytes: 10, entries: 2 },
        }),
        encoded(&WorkerMessage::Heartbeat),
    ]
}

/// Data-connection and peer-lane messages, each encoded.
fn data_channel() -> Vec<Vec<u8>> {
    let record = Record { key: b"k".to_vec(), value: b"v".to_vec(), time: 5, due_ms: 6 };
    vec![
        encoded(&ChannelHello { to: task(1, 0), channel: InputChannel { input: 0, from: task(0, 0) } }),
        encoded(&ChannelMessage::Batch(vec![record.clone(), record.clone()])),
        encoded(&ChannelMessage::Watermark(77)),
        encoded(&ChannelMessage::Marker(2)),
        encoded(&ChannelMessage::EndOfStream),
        encoded(&ChannelMessage::State {
            epoch: 2,
            entries: vec![StateEntry { bucket: 3, state: 0, key: b"k".to_vec(), value: b"v".to_vec() }],
        }),
        encoded(&KoalaWire::Peer(PeerMessage::Open { epoch: 2, watermark: Some(40) })),
        encoded(&KoalaWire::Fetch(FetchRequest {
            id: 9,
            keys: vec![b"user-1".to_vec(), b"user-2".to_vec()],
            extra: Some(ExtraKeys { buckets: vec![3, 4], max: 8 }),
            checkpoint: 0,
        })),
        encoded(&KoalaWire::Answer(FetchResponse {
            id: 9,
            values: vec![
                (b"user-1".to_vec(), Some(encoded(&vec![(0u8, b"3".to_vec())]))),
                (b"user-2".to_vec(), None),
            ],
            extra: vec![(b"user-3".to_vec(), encoded(&vec![(0u8, b"1".to_vec())]))],
            exhausted: vec![4],
        })),
        encoded(&KoalaWire::FilterRequest(FilterRequest { bucket: 3, since: 2 })),
        encoded(&KoalaWire::Filter(FilterResponse {
            bucket: 3,
            since: 2,
            filter: KeyFilter::build(vec![1, 2, 3]),
        })),
        encoded(&KoalaWire::Filter(FilterResponse {
            bucket: 3,
            since: 2,
            filter: KeyFilter::build(Vec::new()),
        })),
        encoded(&DrrsWire::Chunk {
            bucket: 3,
            entries: vec![StateEntry { bucket: 3, state: 1, key: b"k".to_vec(), value: b"v".to_vec() }],
        }),
        encoded(&DrrsWire::BucketEnd { epoch: 2, bucket: 3, timers: vec![(100, b"k".to_vec())] }),
        encoded(&vec![(0u8, b"3".to_vec()), (1u8, b"window".to_vec())]),
    ]
}

/// State-server requests and answers, each encoded.
fn state_server() -> Vec<Vec<u8>> {
    let key = StateKey::new(3, 0, b"user-7".to_vec());
    vec![
        encoded(&StateRequest::Get { operator: OperatorId(1), keys: vec![key.clone()] }),
        encoded(&StateRequest::Write {
            operator: OperatorId(1),
            writes: vec![StateWrite::Put(key.clone(), b"3".to_vec()), StateWrite::Delete(key.clone())],
        }),
        encoded(&StateRequest::Scan { operator: OperatorId(1), bucket: 3 }),
        encoded(&StateRequest::KeysAfter {
            operator: OperatorId(1),
            bucket: 3,
            after: Some(key.clone()),
            limit: 10,
        }),
        encoded(&StateRequest::DeleteBuckets { operator: OperatorId(1), buckets: vec![3, 4] }),
        encoded(&StateRequest::Len { operator: OperatorId(1) }),
        encoded(&StateRequest::Persist),
        encoded(&StateResponse::Values(vec![Some(b"3".to_vec()), None])),
        encoded(&StateResponse::Chunk(vec![(key.clone(), b"3".to_vec())])),
        encoded(&StateResponse::Keys(vec![key])),
        encoded(&StateResponse::Failed("no space".into())),
    ]
}

/// Greetings of every role with and without a token, and verdicts, as sent.
fn handshake() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for role in [Role::Worker, Role::Client, Role::Channel, Role::State] {
        for token in [&b""[..], b"0123456789abcdef-job"] {
            out.push(
                greeting_bytes_of(koala_types::handshake::PROTOCOL_VERSION, role, token).unwrap_or_default(),
            );
        }
    }
    for (status, reason) in [(0u8, &b""[..]), (1, b"wrong job token")] {
        let mut payload = b"KOAL".to_vec();
        payload.extend_from_slice(&koala_types::handshake::PROTOCOL_VERSION.to_le_bytes());
        payload.push(status);
        payload.extend_from_slice(&u16::try_from(reason.len()).unwrap_or(0).to_le_bytes());
        payload.extend_from_slice(reason);
        out.push(framed(&payload));
    }
    out.push(b"0123456789abcdef0123456789abcdef".to_vec());
    out
}

/// Small configs that reach the checks after parsing (the examples are added from the files).
const CONFIGS: &[&str] = &[
    "query = \"keyed-aggregate\"\n",
    "query = \"keyed-aggregate\"\nworkers = 2\nnum_buckets = 16\n\n[parallelism]\naggregate = 2\n\n[[reconfigurations]]\nat_s = 1.0\noperator = \"aggregate\"\nparallelism = 4\n\n[[reconfigurations]]\nat_s = 2.0\noperator = \"aggregate\"\nmoves = [{ buckets = [0, 1, 2], to = 1 }]\n",
    "query = \"tumbling-window\"\nprotocol = \"drrs\"\npartition_policy = \"uniform\"\n\n[drrs]\nschedule = \"overlapping\"\n\n[state]\nbackend = \"remote\"\ncache_mb = 1\n",
    "query = \"keyed-aggregate\"\ncheckpoint_interval_ms = 0\n[runtime]\nbatch_records = 0\nworker_memory_mb = 63\n",
    "query = \"keyed-aggregate\"\n[params]\nsink = \"discard\"\n[params.generator]\nkey_space = 300\nrecords = 1000\n[params.source]\nrate = [{ at_ms = 0, records_per_sec = 5000.0 }]\n",
];

/// Request bodies (byte 0 picks the route: 0 rescale, 1 rebalance, 2 migrate) and query strings.
fn http_bodies() -> Vec<Vec<u8>> {
    let with_route = |route: u8, body: &str| {
        let mut out = vec![route];
        out.extend_from_slice(body.as_bytes());
        out
    };
    vec![
        with_route(0, r#"{"operator": "aggregate", "parallelism": 4}"#),
        with_route(1, r#"{"operator": "aggregate", "moves": ["3,4,10-12:1", "0-3:0"]}"#),
        with_route(2, r#"{"operator": "aggregate", "task": 0, "worker": 1}"#),
        with_route(0, r#"{"operator": "aggregate", "parallelism": -1, "extra": true}"#),
        with_route(3, "seconds=60"),
        with_route(3, "Bearer 0123456789abcdef-fuzz\ntoken=0123456789abcdef%2Dfuzz&seconds=5"),
    ]
}

/// Every seed; `examples` holds the text of the example job configs.
pub fn all(examples: &[(String, String)]) -> Vec<Seed> {
    let mut out = Vec::new();
    let mut add = |target: &'static str, name: String, bytes: Vec<u8>| out.push(Seed { target, name, bytes });
    let control = control();
    let data = data_channel();
    let state = state_server();
    for (i, m) in control.iter().enumerate() {
        add("control", format!("message-{i:02}"), m.clone());
    }
    for (i, m) in data.iter().enumerate() {
        add("data_channel", format!("message-{i:02}"), m.clone());
    }
    for (i, m) in state.iter().enumerate() {
        add("state_server", format!("message-{i:02}"), m.clone());
    }
    // The frame target: the type's index (as `crate::frames` numbers them), the read size, then
    // two frames of that type.
    let kinds: [(u8, &[Vec<u8>], &[usize]); 5] = [
        (0, &control, &[0, 1]),
        (2, &control, &[6, 7]),
        (3, &control, &[9, 10]),
        (5, &data, &[1, 5]),
        (8, &state, &[1, 3]),
    ];
    for (kind, messages, picks) in kinds {
        for piece in [0u8, 3] {
            let mut bytes = vec![kind, piece];
            for &p in picks {
                bytes.extend_from_slice(&framed(&messages[p]));
            }
            add("frame", format!("kind-{kind}-piece-{piece}"), bytes);
        }
    }
    for (i, g) in handshake().into_iter().enumerate() {
        add("handshake", format!("greeting-{i:02}"), g);
    }
    for (i, c) in CONFIGS.iter().enumerate() {
        add("config", format!("small-{i:02}.toml"), c.as_bytes().to_vec());
    }
    for (name, text) in examples {
        add("config", name.clone(), text.as_bytes().to_vec());
    }
    for (i, b) in http_bodies().into_iter().enumerate() {
        add("http_body", format!("body-{i:02}"), b);
    }
    out
}
