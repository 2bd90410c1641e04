//! The Koala task loop against hand-driven neighbours: the worker's commands, a sender's peer
//! messages and fetch answers, and a sink queue the test reads.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

use crossbeam_channel::unbounded;
use koala_dataflow::{
    Dataflow, JobGraph, KeyContext, KeyedStream, SourceOptions, TimeDomain, ValueState, Window, WindowSpec,
};
use koala_protocol::koala::KeyFilter;
use koala_protocol::koala::{KeyLookupTable, Reconfiguration};
use koala_protocol::{ReconfigPlan, WorkerMessage};
use koala_state::{MemoryEnv, StateEnv};
use koala_types::{OperatorId, Record, bucket_of, encode};

use crate::task::location::Bundle;

use super::test_harness::{Inbox, WORKER, deployment, task_setup};
use super::*;
use crate::channel::TaskInput;
use crate::channel::{FETCH_INPUT, PEER_INPUT};
use crate::links::Links;
use crate::net::TaskInboxes;
use crate::queue::data_queue;

const WAIT: Duration = Duration::from_secs(10);

/// src → key_by → "count" (built by `count`) → "out".
fn graph(count: impl FnOnce(&KeyedStream<u64, u64>)) -> JobGraph {
    let df = Dataflow::new();
    count(
        &df.source("src", SourceOptions::default(), |_| Vec::<(u64, u64)>::new().into_iter())
            .key_by(|x: &u64| *x),
    );
    df.build().expect("graph")
}

fn id(graph: &JobGraph, name: &str) -> OperatorId {
    graph.by_name(name).expect("operator").id
}

fn peer(from: TaskId, wire: &Wire) -> TaskInput {
    let bytes = encode(wire).expect("encode");
    let input = if matches!(wire, Wire::Peer(_)) { PEER_INPUT } else { FETCH_INPUT };
    TaskInput { channel: InputChannel { input, from }, message: ChannelMessage::Protocol(bytes) }
}

/// What the sink got: up to and with the task's end of stream, then after it; the acks; and
/// the fetches count.0 got.
struct Outcome {
    key: u64,
    until_end: Vec<ChannelMessage>,
    after_end: Vec<ChannelMessage>,
    acks: Vec<TaskAck>,
    fetches: usize,
}

impl Outcome {
    /// The records of the batches before end of stream, decoded.
    fn outputs<T: serde::de::DeserializeOwned>(&self) -> Vec<T> {
        self.until_end
            .iter()
            .filter_map(|m| match m {
                ChannelMessage::Batch(records) => Some(records.clone()),
                _ => None,
            })
            .flatten()
            .map(|r| decode(&r.value).expect("output"))
            .collect()
    }
}

/// The soak's interleaving at a new task: count.1, created by epoch 1 to take buckets 2 and 3
/// from count.0, hears that its only upstream finished (it never switched routing: the
/// coordinator's `UpstreamEnded`) before it hears `Begin`. Count.0 then hands the buckets over
/// with a queued record of bucket 2 (time 7) and closes. With `handed_timer`, the hand-over
/// carries a timer of the record's key at that time, as count.0's `take_timers` sends it.
/// With `state`, count.0 answers the fetch of the key with that bundle (else: not here).
fn upstream_ends_before_begin(
    graph: JobGraph,
    handed_timer: Option<Timestamp>,
    state: Option<Bundle>,
) -> Outcome {
    let (src, count, out) = (id(&graph, "src"), id(&graph, "count"), id(&graph, "out"));
    let (up, old, new, sink) =
        (TaskId::new(src, 0), TaskId::new(count, 0), TaskId::new(count, 1), TaskId::new(out, 0));
    let d = deployment(&[up, old, new, sink], count, 1, vec![0, 0, 1, 1]);
    let moves = BTreeMap::from([((old, new), vec![2, 3])]);
    let plan = ReconfigPlan {
        epoch: 1,
        operator: count,
        deployment: d.clone(),
        moves: moves.clone(),
        upstreams: vec![up],
        created: vec![1],
        cancelled: Vec::new(),
        retired: Vec::new(),
    };
    let reconfiguration = Reconfiguration {
        operator: count,
        epoch: 1,
        moves,
        upstreams: BTreeSet::from([up]),
        new_tasks: BTreeSet::from([new]),
        cancelled: BTreeSet::new(),
        retired: BTreeSet::new(),
        extra_keys: 0,
        drain_keys_per_sec: 0,
    };

    // The sink's and count.0's queues are read by the test; count.1's are fed by it.
    let inboxes = Arc::new(RwLock::new(HashMap::new()));
    let (sink_tx, sink_rx) = data_queue(1024);
    let (old_tx, old_rx) = unbounded::<TaskInput>();
    let (old_data, _old_data_rx) = data_queue(64);
    let (data_tx, data_rx) = data_queue(64);
    let (peer_tx, peer_rx) = unbounded::<TaskInput>();
    let (fetch_tx, fetch_rx) = unbounded::<TaskInput>();
    {
        let mut map = inboxes.write().expect("registry");
        let (unused, _unused_rx) = unbounded::<TaskInput>();
        map.insert(sink, TaskInboxes { data: sink_tx, peer: unused.clone(), fetch: unused });
        map.insert(old, TaskInboxes { data: old_data, peer: old_tx.clone(), fetch: old_tx });
        map.insert(new, TaskInboxes { data: data_tx, peer: peer_tx.clone(), fetch: fetch_tx.clone() });
    }
    let links = Links { me: WORKER, graph: Arc::new(graph), inboxes, token: None, tls: None };
    let (cmd_tx, cmd_rx) = unbounded::<TaskCommand>();
    let (events_tx, events_rx) = unbounded::<WorkerMessage>();
    let inbox = Inbox { data: data_rx, peer: peer_rx, fetch: fetch_rx, commands: cmd_rx };
    let store = MemoryEnv::new().open_task(new).expect("store");
    let setup = task_setup(links, &d, new, true, inbox, events_tx, store);
    let task = std::thread::spawn(move || run_koala_operator(setup));

    // In this order on the task's command queue, as the worker relays them; the task handles
    // one command per turn, so it acts on the upstream's end before it learns its buckets.
    cmd_tx.send(TaskCommand::Prepare(Arc::new(plan))).expect("prepare");
    cmd_tx.send(TaskCommand::UpstreamEnded(up)).expect("upstream ended");
    cmd_tx.send(TaskCommand::Begin(Arc::new(reconfiguration))).expect("begin");

    // Count.0's side: hand-over (its event time 5), its queued record of bucket 2, close.
    let key = (0u64..).find(|k| bucket_of(&encode(k).expect("key"), 4) == 2).expect("a key of bucket 2");
    let record =
        Record { key: encode(&key).expect("key"), value: encode(&key).expect("value"), time: 7, due_ms: 0 };
    let mut hand_over = KeyLookupTable::new(old, 0..4).take(&[2, 3], 1);
    hand_over.watermark = Some(5);
    if let Some(time) = handed_timer {
        hand_over.timers = vec![(time, record.key.clone())];
    }
    for message in [
        PeerMessage::HandOver { epoch: 1, hand_over: Box::new(hand_over) },
        PeerMessage::Records { epoch: 1, input: 0, records: vec![record] },
        PeerMessage::Close { epoch: 1 },
    ] {
        peer_tx.send(peer(old, &Wire::Peer(message))).expect("peer");
    }
    let mut fetches = 0;
    // Count.0 holds none of the buckets' keys: it answers each filter request with an empty
    // filter (every request is answered, and the task ends its outputs only once the filters
    // it asked for arrived).
    let answer_filter = |request: &FilterRequest| {
        let filter = FilterResponse {
            bucket: request.bucket,
            since: request.since,
            filter: KeyFilter::build(Vec::new()),
        };
        // After the task exited (the last `serve`) nobody reads the answer.
        let _ = fetch_tx.send(peer(old, &Wire::Filter(filter)));
    };
    // What count.0 got since: filter requests are answered, fetches counted.
    let serve = |fetches: &mut usize| {
        for input in old_rx.try_iter() {
            let ChannelMessage::Protocol(bytes) = &input.message else { continue };
            match decode::<Wire>(bytes) {
                Ok(Wire::FilterRequest(request)) => answer_filter(&request),
                Ok(Wire::Fetch(_)) => *fetches += 1,
                _ => {}
            }
        }
    };
    {
        // The key's state location is still count.0: answer the fetch (count.0 holds none),
        // whether the record or the handed-over timer asks first; the other finds it here.
        let request = loop {
            let fetch = old_rx.recv_timeout(WAIT).expect("a fetch from count.0");
            let ChannelMessage::Protocol(bytes) = fetch.message else { panic!("not a protocol message") };
            match decode::<Wire>(&bytes) {
                Ok(Wire::Fetch(request)) => break request,
                Ok(Wire::FilterRequest(request)) => {
                    answer_filter(&request);
                    continue;
                }
                _ => panic!("neither a fetch nor a filter request"),
            }
        };
        let bundle = state.map(|b| encode(&b).expect("bundle"));
        let values = request.keys.iter().map(|k| (k.clone(), bundle.clone())).collect();
        let answer = FetchResponse { id: request.id, values, extra: Vec::new(), exhausted: Vec::new() };
        fetch_tx.send(peer(old, &Wire::Answer(answer))).expect("answer");
        fetches += 1;
    }

    let mut until_end = Vec::new();
    let deadline = Instant::now() + WAIT;
    while until_end.last() != Some(&ChannelMessage::EndOfStream) {
        serve(&mut fetches);
        match sink_rx.recv_timeout(Duration::from_millis(10)) {
            Ok(input) => until_end.push(input.message),
            Err(_) => assert!(Instant::now() < deadline, "the task's output: nothing for {WAIT:?}"),
        }
    }
    // The task reports its inputs ended once it has processed them; then it is released, and
    // whatever it still sends before it exits comes after its end of stream.
    let ack_of = |e: WorkerMessage| match e {
        WorkerMessage::TaskAck { ack, .. } => Some(ack),
        _ => None,
    };
    let mut acks = Vec::new();
    while acks.last() != Some(&TaskAck::InputsEnded) {
        acks.extend(ack_of(events_rx.recv_timeout(WAIT).expect("the task's acks up to InputsEnded")));
    }
    cmd_tx.send(TaskCommand::Release).expect("release");
    task.join().expect("task thread").expect("task");
    let after_end = sink_rx.queue().try_iter().map(|i| i.message).collect();
    serve(&mut fetches);
    acks.extend(events_rx.try_iter().filter_map(ack_of));
    Outcome { key, until_end, after_end, acks, fetches }
}

/// The soak's `keyed-aggregate`: records processed after the end of stream reach a sink that
/// may have exited (`task aggregate.8 failed: channel to op2.1 closed`).
#[test]
fn a_new_task_whose_upstream_ended_before_begin_ends_after_the_records_handed_to_it() {
    let o = upstream_ends_before_begin(
        graph(|keyed| {
            keyed
                .stateful_map("count", |k: &u64, _x: u64, n: &mut ValueState<u64>| {
                    (
                        *k,
                        n.update(|n| {
                            *n += 1;
                            *n
                        }),
                    )
                })
                .sink_discard("out");
        }),
        None,
        None,
    );
    assert_eq!(o.outputs::<(u64, u64)>(), vec![(o.key, 1)], "before end of stream: {:?}", o.until_end);
    assert!(o.after_end.is_empty(), "after end of stream: {:?}", o.after_end);
    assert_eq!(o.acks.last(), Some(&TaskAck::InputsEnded), "acks {:?}", o.acks);
}

/// Event time: a new task emits no watermark before it owns anything, or the records handed
/// to it would be dropped as late (their window lost).
#[test]
fn a_new_task_whose_upstream_ended_before_begin_fires_the_windows_of_records_handed_to_it() {
    let o = upstream_ends_before_begin(window_count(), None, None);
    assert_eq!(
        o.outputs::<(u64, u64, u64)>(),
        vec![(o.key, 0, 1)],
        "before end of stream: {:?}",
        o.until_end
    );
    assert!(o.after_end.is_empty(), "after end of stream: {:?}", o.after_end);
    let early = o.until_end.iter().take_while(|m| !matches!(m, ChannelMessage::Batch(_)));
    assert!(
        early.clone().all(|m| !matches!(m, ChannelMessage::Watermark(t) if *t >= 7)),
        "no watermark past the handed-over record before its window: {:?}",
        o.until_end
    );
}

/// Lazy windows: a key whose timer came with the hand-over, without its state, is fetched
/// from the sender once (by its timer's access or its record, whichever comes first), and its
/// window fires once, with the record in it.
#[test]
fn a_key_with_a_handed_timer_is_fetched_once_and_its_window_fires_once() {
    let o = upstream_ends_before_begin(window_count(), Some(10), None);
    assert_eq!(o.fetches, 1, "acks {:?}", o.acks);
    assert_eq!(o.outputs::<(u64, u64, u64)>(), vec![(o.key, 0, 1)], "{:?}", o.until_end);
    assert!(o.after_end.is_empty(), "after end of stream: {:?}", o.after_end);
}

/// A processing-time timer that came with the hand-over, without its key's state (its time
/// already reached: it comes due at the task's first clock reading), fetches the key once
/// and fires once at the new owner, on the key's state: the count of 5 and the registered
/// timer count.0 holds (one fetch: whichever of the record and the timer asks first, the
/// other finds the state here).
#[test]
fn a_handed_processing_time_timer_fires_once_at_the_new_owner_on_its_keys_state() {
    let graph = graph(|keyed| {
        keyed
            .process_with_timers(
                "count",
                |_k: &u64, _x: u64, c: &mut KeyContext<u64, ()>, _out: &mut Vec<(u64, u64)>| {
                    c.value.update(|n| *n += 1);
                },
                |k: &u64, time, c: &mut KeyContext<u64, ()>, out: &mut Vec<(u64, u64)>| {
                    assert_eq!(c.timers.fired_domain(), Some(TimeDomain::ProcessingTime));
                    assert_eq!(time, 0);
                    out.push((*k, c.value.get().copied().unwrap_or(0)));
                },
            )
            .sink_discard("out");
    });
    let timer = TimeDomain::ProcessingTime.queue_time(0);
    let timers: std::collections::BTreeSet<Timestamp> = [timer].into();
    let state = vec![
        (koala_dataflow::state::VALUE_STATE, encode(&5u64).expect("count")),
        (koala_dataflow::TIMER_STATE, encode(&timers).expect("timers")),
    ];
    let o = upstream_ends_before_begin(graph, Some(timer), Some(state));
    assert_eq!(o.fetches, 1, "acks {:?}", o.acks);
    // The clock and the record race (processing time is not deterministic): the timer fires
    // on the fetched count, before (5) or after (6) the record; never on a missing state (0).
    let out = o.outputs::<(u64, u64)>();
    assert!(out == vec![(o.key, 5)] || out == vec![(o.key, 6)], "{:?}", o.until_end);
    assert!(o.after_end.is_empty(), "after end of stream: {:?}", o.after_end);
}

/// A tumbling window of 10 counting records per key.
fn window_count() -> JobGraph {
    graph(|keyed| {
        keyed
            .window(WindowSpec::tumbling(10))
            .aggregate(
                "count",
                || 0u64,
                |n: &mut u64, _: &u64| *n += 1,
                |k: &u64, w: Window, n: u64| (*k, w.start, n),
            )
            .sink_discard("out");
    })
}
