//! The sender side of the Koala task loop against a hand-driven receiver: a fetch waits for at
//! most one filter-build step, not behind the filter requests queued ahead of it on the fetch
//! lane.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use crossbeam_channel::unbounded;
use koala_dataflow::{Dataflow, SourceOptions, ValueState};
use koala_protocol::ReconfigPlan;
use koala_protocol::koala::{FetchRequest, FilterRequest, PeerMessage, Reconfiguration};
use koala_state::{MemoryEnv, StateEnv, StateKey, StateWrite};
use koala_types::{ChannelMessage, InputChannel, TaskId, bucket_of, decode, encode};

use super::test_harness::{Inbox, WORKER, deployment, task_setup};
use super::{TaskCommand, Wire, run_koala_operator};
use crate::channel::TaskInput;
use crate::channel::{FETCH_INPUT, PEER_INPUT};
use crate::links::Links;
use crate::net::TaskInboxes;
use crate::queue::data_queue;

const WAIT: Duration = Duration::from_secs(10);
const BUCKETS: u16 = 64;
/// Buckets count.0 hands to count.1; each holds more keys than one build step reads.
const MOVED: u16 = 48;

fn message(from: TaskId, wire: &Wire) -> TaskInput {
    let bytes = encode(wire).expect("encode");
    let input = if matches!(wire, Wire::Peer(_)) { PEER_INPUT } else { FETCH_INPUT };
    TaskInput { channel: InputChannel { input, from }, message: ChannelMessage::Protocol(bytes) }
}

/// Count.0 holds ~5 000 keys in each of 64 buckets and hands 48 of them to count.1 (driven by
/// the test), which then asks for the 48 filters and fetches one key, all at once on the fetch
/// lane. Taking one message per turn with a build step after each, count.0 answered the fetch
/// only after about half the filters (two steps each); taking the lane before each step, it
/// answers before the second filter is done.
#[test]
fn a_fetch_is_answered_before_the_filters_requested_ahead_of_it() {
    let df = Dataflow::new();
    df.source("src", SourceOptions::default(), |_| Vec::<(u64, u64)>::new().into_iter())
        .key_by(|x: &u64| *x)
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
    let graph = df.build().expect("graph");
    let op = |name: &str| graph.by_name(name).expect("operator").id;
    let (src, count, out) = (op("src"), op("count"), op("out"));
    let (up, old, new, sink) =
        (TaskId::new(src, 0), TaskId::new(count, 0), TaskId::new(count, 1), TaskId::new(out, 0));
    let moved: Vec<u16> = (0..MOVED).collect();
    let before: Vec<u32> = (0..BUCKETS).map(|b| if b < MOVED { 0 } else { 1 }).collect();
    let tasks = [up, old, new, sink];
    let d0 = deployment(&tasks, count, 0, (0..BUCKETS).map(|_| 0).collect());
    let d1 = deployment(&tasks, count, 1, before);
    let moves = BTreeMap::from([((old, new), moved.clone())]);
    let plan = ReconfigPlan {
        epoch: 1,
        operator: count,
        deployment: d1,
        moves: moves.clone(),
        upstreams: vec![up],
        created: Vec::new(),
        cancelled: Vec::new(),
        retired: Vec::new(),
    };
    let reconfiguration = Reconfiguration {
        operator: count,
        epoch: 1,
        moves,
        upstreams: BTreeSet::from([up]),
        new_tasks: BTreeSet::new(),
        cancelled: BTreeSet::new(),
        retired: BTreeSet::new(),
        extra_keys: 0,
        drain_keys_per_sec: 0,
    };

    // Count.0's store: 320 000 keys, ~5 000 per bucket (two build steps of 4 096 each).
    let store = MemoryEnv::new().open_task(old).expect("store");
    let writes = (0u64..320_000)
        .map(|k| {
            let key = encode(&k).expect("key");
            let bucket = bucket_of(&key, BUCKETS);
            StateWrite::Put(StateKey { bucket, state: koala_dataflow::state::VALUE_STATE, key }, vec![1])
        })
        .collect();
    store.write_many(writes).expect("write");

    let inboxes = Arc::new(RwLock::new(HashMap::new()));
    let (sink_tx, _sink_rx) = data_queue(1024);
    let (data_tx, data_rx) = data_queue(64);
    let (peer_tx, peer_rx) = unbounded::<TaskInput>();
    let (fetch_tx, fetch_rx) = unbounded::<TaskInput>();
    // What count.0 sends count.1: peer messages and the fetch lane, read by the test.
    let (to_new_peer, new_peer_rx) = unbounded::<TaskInput>();
    let (to_new_fetch, new_fetch_rx) = unbounded::<TaskInput>();
    let (new_data, _new_data_rx) = data_queue(64);
    {
        let mut map = inboxes.write().expect("registry");
        let (unused, _unused_rx) = unbounded::<TaskInput>();
        map.insert(sink, TaskInboxes { data: sink_tx, peer: unused.clone(), fetch: unused });
        map.insert(old, TaskInboxes { data: data_tx, peer: peer_tx.clone(), fetch: fetch_tx.clone() });
        map.insert(new, TaskInboxes { data: new_data, peer: to_new_peer, fetch: to_new_fetch });
    }
    let links = Links { me: WORKER, graph: Arc::new(graph), inboxes, token: None, tls: None };
    let (cmd_tx, cmd_rx) = unbounded::<TaskCommand>();
    let (events_tx, _events_rx) = unbounded();
    let inbox = Inbox { data: data_rx, peer: peer_rx, fetch: fetch_rx, commands: cmd_rx };
    let setup = task_setup(links, &d0, old, false, inbox, events_tx, store);
    let task = std::thread::spawn(move || run_koala_operator(setup));
    cmd_tx.send(TaskCommand::Prepare(Arc::new(plan))).expect("prepare");
    cmd_tx.send(TaskCommand::Begin(Arc::new(reconfiguration))).expect("begin");
    peer_tx.send(message(new, &Wire::Peer(PeerMessage::Open { epoch: 1, watermark: None }))).expect("open");
    loop {
        let m = new_peer_rx.recv_timeout(WAIT).expect("the hand-over");
        let ChannelMessage::Protocol(bytes) = m.message else { continue };
        if let Ok(Wire::Peer(PeerMessage::HandOver { .. })) = decode::<Wire>(&bytes) {
            break;
        }
    }

    // Count.1's side: the 48 filter requests, then a fetch of a key of the first moved bucket.
    let key = (0u64..).map(|k| encode(&k).expect("key")).find(|k| bucket_of(k, BUCKETS) == 0).expect("key");
    let mut lane: Vec<TaskInput> = moved
        .iter()
        .map(|&bucket| message(new, &Wire::FilterRequest(FilterRequest { bucket, since: 1 })))
        .collect();
    lane.push(message(
        new,
        &Wire::Fetch(FetchRequest { id: 1, keys: vec![key.clone()], extra: None, checkpoint: 0 }),
    ));
    for m in lane {
        fetch_tx.send(m).expect("fetch lane");
    }
    let (mut filters_before, deadline) = (0, Instant::now() + WAIT);
    let answer = loop {
        let m = new_fetch_rx.recv_deadline(deadline).expect("the fetch's answer");
        let ChannelMessage::Protocol(bytes) = m.message else { continue };
        match decode::<Wire>(&bytes).expect("decode") {
            Wire::Answer(answer) => break answer,
            Wire::Filter(_) => filters_before += 1,
            _ => {}
        }
    };
    assert_eq!(answer.id, 1);
    assert!(answer.values.iter().any(|(k, v)| *k == key && v.is_some()), "the key's state comes back");
    assert!(filters_before <= 2, "the fetch was answered after {filters_before} of {MOVED} filters");
    drop(cmd_tx);
    let _ = task.join().expect("task thread");
}
