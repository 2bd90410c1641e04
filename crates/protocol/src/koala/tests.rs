//! Hand-driven unit tests of the task core: per-key FIFO at a receiver, an idle sender, typed
//! errors (never panics) for input the protocol does not allow, and self-joins (one upstream task
//! on both inputs: markers and ends of stream per channel, inputs kept through parking and
//! forwarding).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use koala_types::{InputChannel, OperatorId, Record, TaskId, TimeDomain, bucket_of};

use super::task::limits::MAX_BATCH_RECORDS;
use super::task::lookahead::LOOK_AHEAD_REQUEST_KEYS;
use super::*;

const NB: u16 = 4;

pub(super) fn up() -> TaskId {
    TaskId::new(OperatorId(0), 0)
}

/// Input `input` from the upstream task.
pub(super) fn ch(input: usize) -> InputChannel {
    InputChannel { input, from: up() }
}

pub(super) fn t(i: u32) -> TaskId {
    TaskId::new(OperatorId(1), i)
}

pub(super) fn key_in(bucket: u16) -> Vec<u8> {
    keys_in(bucket).next().unwrap_or_default()
}

fn keys_in(bucket: u16) -> impl Iterator<Item = Vec<u8>> {
    (0..).map(|i| format!("k{i}").into_bytes()).filter(move |k| bucket_of(k, NB) == bucket)
}

pub(super) fn rec(bucket: u16, time: u64) -> Record {
    Record { key: key_in(bucket), value: time.to_le_bytes().to_vec(), time, due_ms: 0 }
}

fn task(id: TaskId, owned: &[u16]) -> KoalaTask {
    task_with_inputs(id, owned, &[0])
}

/// A task fed by the one upstream task on each of `inputs` (`[0, 1]`: a self-join).
pub(super) fn task_with_inputs(id: TaskId, owned: &[u16], inputs: &[usize]) -> KoalaTask {
    KoalaTask::new(TaskConfig {
        id,
        num_buckets: NB,
        owned: owned.iter().copied().collect(),
        inputs: inputs.iter().map(|&i| ch(i)).collect(),
    })
}

/// Bucket 3 moves from t0 to the existing task t1.
pub(super) fn reconf() -> Arc<Reconfiguration> {
    Arc::new(Reconfiguration {
        operator: OperatorId(1),
        epoch: 1,
        moves: BTreeMap::from([((t(0), t(1)), vec![3])]),
        upstreams: BTreeSet::from([up()]),
        new_tasks: BTreeSet::new(),
        cancelled: BTreeSet::new(),
        retired: BTreeSet::new(),
        extra_keys: 0,
        drain_keys_per_sec: 0,
    })
}

pub(super) fn peer_messages(out: &[TaskAction]) -> Vec<PeerMessage> {
    out.iter()
        .filter_map(|a| match a {
            TaskAction::SendToPeer { message, .. } => Some(message.clone()),
            _ => None,
        })
        .collect()
}

pub(super) fn processed(out: &[TaskAction]) -> Vec<u64> {
    processed_with_input(out).into_iter().map(|(_, time)| time).collect()
}

/// (input, time) of every processed record, in order.
fn processed_with_input(out: &[TaskAction]) -> Vec<(usize, u64)> {
    out.iter()
        .filter_map(|a| match a {
            TaskAction::Process { input, records } => {
                Some(records.iter().map(|r| (*input, r.time)).collect::<Vec<_>>())
            }
            _ => None,
        })
        .flatten()
        .collect()
}

fn records(channel: InputChannel, records: Vec<Record>) -> TaskEvent {
    TaskEvent::Records { channel, records }
}

fn marker(channel: InputChannel) -> TaskEvent {
    TaskEvent::Marker { channel, epoch: 1 }
}

pub(super) fn deliver(to: &mut KoalaTask, from: TaskId, messages: Vec<PeerMessage>) -> Vec<TaskAction> {
    messages.into_iter().flat_map(|message| to.on(TaskEvent::Peer { from, message })).collect()
}

#[test]
fn receiver_parks_direct_records_until_the_peer_channel_closes() {
    let (mut s, mut r) = (task(t(0), &[0, 1, 2, 3]), task(t(1), &[]));
    s.on(TaskEvent::Watermark { channel: ch(0), time: 1 });
    // The receiver starts and asks the (idle) sender to hand over; no input needed at the sender.
    let open = peer_messages(&r.on(TaskEvent::Start(reconf())));
    s.on(TaskEvent::Start(reconf()));
    let hand_over = peer_messages(&deliver(&mut s, t(1), open));
    assert!(matches!(hand_over[..], [PeerMessage::HandOver { .. }]));
    assert!(!s.owns(3));
    let out = deliver(&mut r, t(0), hand_over);
    assert!(out.contains(&TaskAction::Ack { epoch: 1, ack: TaskAck::PeerReady }));
    assert!(r.owns(3));
    // An in-flight record of bucket 3 reaches the sender and is forwarded ...
    let forwarded = peer_messages(&s.on(records(ch(0), vec![rec(3, 5)])));
    // ... while, after the switch, a newer one arrives directly at the receiver: parked.
    r.on(marker(ch(0)));
    assert!(processed(&r.on(records(ch(0), vec![rec(3, 6)]))).is_empty());
    // The forwarded record needs the key's state, still at the sender: one fetch, then processing.
    let out = deliver(&mut r, t(0), forwarded);
    let Some(TaskAction::FetchState { from, request }) = out.last().cloned() else { panic!("{out:?}") };
    assert_eq!((from, request.keys.clone()), (t(0), vec![key_in(3)]));
    let serve = s.on(TaskEvent::FetchRequest { from: t(1), request: request.clone() });
    assert_eq!(serve, vec![TaskAction::ServeFetch { to: t(1), request }]);
    let value = Some(b"state".to_vec());
    let response =
        FetchResponse { id: 1, values: vec![(key_in(3), value)], extra: vec![], exhausted: vec![] };
    let out = r.on(TaskEvent::FetchResponse { from: t(0), response });
    assert!(matches!(out[0], TaskAction::InstallState { .. }));
    assert_eq!(processed(&out), vec![5]);
    let close = peer_messages(&s.on(marker(ch(0))));
    assert!(matches!(close[..], [PeerMessage::Close { epoch: 1 }]));
    // The parked record runs after everything that came over the peer channel, on the state
    // the runtime installed (its store answers first: no second fetch).
    let mut store = Store(BTreeSet::from([key_in(3)]));
    let [message] = close.try_into().unwrap_or_else(|c| panic!("{c:?}"));
    let out = r.on_with(TaskEvent::Peer { from: t(0), message }, &mut store);
    assert_eq!(processed(&out), vec![6]);
    assert!(out.contains(&TaskAction::Ack { epoch: 1, ack: TaskAck::Done }));
}

#[test]
fn protocol_surprises_are_typed_errors() {
    let is_error = |out: Vec<TaskAction>| out.iter().any(|a| matches!(a, TaskAction::Error(_)));
    let mut a = task(t(0), &[0, 1]);
    assert!(is_error(a.on(records(InputChannel { input: 0, from: t(9) }, vec![rec(0, 1)]))));
    assert!(is_error(a.on(records(ch(1), vec![rec(0, 1)]))), "input 1 is not open");
    assert!(is_error(a.on(records(ch(0), vec![rec(2, 1)]))));
    assert!(is_error(a.on(TaskEvent::Marker { channel: ch(0), epoch: 3 })));
    assert!(is_error(a.on(TaskEvent::Start(reconf()))), "t0 does not own bucket 3");
    let close = PeerMessage::Close { epoch: 0 };
    assert!(is_error(a.on(TaskEvent::Peer { from: t(1), message: close })));
    let response = FetchResponse { id: 7, values: vec![], extra: vec![], exhausted: vec![] };
    assert!(is_error(a.on(TaskEvent::FetchResponse { from: t(1), response })));
    let request = FetchRequest { id: 1, keys: vec![key_in(1)], extra: None, checkpoint: 0 };
    assert!(is_error(a.on(TaskEvent::FetchRequest { from: t(1), request })));
    assert!(is_error(
        a.on(TaskEvent::Watermark { channel: ch(0), time: 5 })
            .into_iter()
            .chain(a.on(TaskEvent::Watermark { channel: ch(0), time: 4 }))
            .collect()
    ));
    // After all that the task still works.
    assert_eq!(processed(&a.on(records(ch(0), vec![rec(0, 9)]))), vec![9]);
}

/// A window of a moved bucket whose timer is due at the sender's event time fires at the sender,
/// right before the hand-over, so it never reaches a receiver whose watermark is already past it;
/// the sender keeps emitting watermarks during the transition (only receivers gate).
#[test]
fn timers_due_at_hand_over_fire_at_the_sender_before_it() {
    let (mut s, mut r) = (task(t(0), &[0, 1, 2, 3]), task(t(1), &[0]));
    // The receiver t1 (an existing task: it owns nothing here but is not new) emitted 10 already;
    // the sender's upstream is at 20 but a transition starts before it emitted anything past 10.
    let out = s.on(TaskEvent::Watermark { channel: ch(0), time: 10 });
    assert_eq!(out, vec![TaskAction::EmitWatermark(10)]);
    r.on(TaskEvent::Watermark { channel: ch(0), time: 10 });
    let open = peer_messages(&r.on(TaskEvent::Start(reconf())));
    assert!(matches!(open[..], [PeerMessage::Open { watermark: Some(10), .. }]), "{open:?}");
    s.on(TaskEvent::Start(reconf()));
    let out = s.on(TaskEvent::Watermark { channel: ch(0), time: 20 });
    // A sender only: it keeps its event time.
    assert!(out.contains(&TaskAction::EmitWatermark(20)), "{out:?}");
    let out = deliver(&mut s, t(1), open);
    let fire = out.iter().position(|a| matches!(a, TaskAction::FireTimers { up_to: 20, .. }));
    let hand_over = out
        .iter()
        .position(|a| matches!(a, TaskAction::SendToPeer { message: PeerMessage::HandOver { .. }, .. }));
    assert!(matches!((fire, hand_over), (Some(f), Some(h)) if f < h), "{out:?}");
    assert!(out.contains(&TaskAction::FireTimers { buckets: vec![3], up_to: 20 }), "{out:?}");
    // The receiver holds its event time until every marker arrived.
    let out = deliver(&mut r, t(0), peer_messages(&out));
    assert!(!out.iter().any(|a| matches!(a, TaskAction::EmitWatermark(_))), "{out:?}");
}

/// A self-join: the upstream task feeds both inputs, so the sender waits for a marker on each of
/// its two channels before it closes the peer channel. Until the second marker, old-table
/// records on the other channel are still forwarded (not refused as records after a marker), and
/// every forwarded, queued or parked record keeps its input; the receiver processes them in
/// arrival order, one run per input.
#[test]
fn self_join_counts_markers_per_channel_and_keeps_inputs() {
    let (mut s, mut r) =
        (task_with_inputs(t(0), &[0, 1, 2, 3], &[0, 1]), task_with_inputs(t(1), &[], &[0, 1]));
    for i in [0, 1] {
        s.on(TaskEvent::Watermark { channel: ch(i), time: 1 });
    }
    let open = peer_messages(&r.on(TaskEvent::Start(reconf())));
    s.on(TaskEvent::Start(reconf()));
    let hand_over = peer_messages(&deliver(&mut s, t(1), open));
    let out = deliver(&mut r, t(0), hand_over);
    assert!(out.contains(&TaskAction::Ack { epoch: 1, ack: TaskAck::PeerReady }));
    // Old-table records of bucket 3 on both inputs reach the sender: forwarded with their input.
    let forwarded: Vec<PeerMessage> = [(1, 5), (0, 6)]
        .into_iter()
        .flat_map(|(i, time)| peer_messages(&s.on(records(ch(i), vec![rec(3, time)]))))
        .collect();
    assert!(
        matches!(
            forwarded[..],
            [PeerMessage::Records { input: 1, .. }, PeerMessage::Records { input: 0, .. }]
        ),
        "{forwarded:?}"
    );
    // The marker on input 0 does not end the epoch at the sender: input 1 still carries old-table
    // records, which are forwarded, not refused.
    assert!(peer_messages(&s.on(marker(ch(0)))).is_empty(), "no close before the second marker");
    let late = s.on(records(ch(1), vec![rec(3, 7)]));
    assert!(!late.iter().any(|a| matches!(a, TaskAction::Error(_))), "{late:?}");
    let mut forwarded_late = peer_messages(&late);
    assert!(matches!(forwarded_late[..], [PeerMessage::Records { input: 1, .. }]), "{forwarded_late:?}");
    // A record on input 0 after its marker is an old-table record after the marker: refused.
    let refused = s.on(records(ch(0), vec![rec(3, 8)]));
    assert!(
        refused.iter().any(|a| matches!(
            a,
            TaskAction::Error(ProtocolError::RecordAfterMarker { channel, .. }) if *channel == ch(0)
        )),
        "{refused:?}"
    );
    // A second marker on one channel is a surprise.
    assert!(s.on(marker(ch(0))).iter().any(|a| matches!(a, TaskAction::Error(_))));
    let close = peer_messages(&s.on(marker(ch(1))));
    assert!(matches!(close[..], [PeerMessage::Close { epoch: 1 }]), "{close:?}");

    // The receiver: switched records arrive directly on both inputs and are parked with them.
    for i in [0, 1] {
        r.on(marker(ch(i)));
    }
    let parked = [(1, 9), (0, 10)].into_iter().flat_map(|(i, time)| r.on(records(ch(i), vec![rec(3, time)])));
    assert!(processed(&parked.collect::<Vec<_>>()).is_empty());
    // The forwarded records need the key's state from the sender first.
    let mut out = Vec::new();
    forwarded_late.splice(0..0, forwarded);
    for message in forwarded_late {
        out.extend(r.on(TaskEvent::Peer { from: t(0), message }));
    }
    let Some(TaskAction::FetchState { request, .. }) =
        out.iter().find(|a| matches!(a, TaskAction::FetchState { .. })).cloned()
    else {
        panic!("{out:?}")
    };
    let response =
        FetchResponse { id: request.id, values: vec![(key_in(3), None)], extra: vec![], exhausted: vec![] };
    let mut out = r.on(TaskEvent::FetchResponse { from: t(0), response });
    out.extend(deliver(&mut r, t(0), close));
    // Forwarded first (1, 0, 1), then the parked ones (1, 0): runs of one input in arrival order.
    assert_eq!(processed_with_input(&out), vec![(1, 5), (0, 6), (1, 7), (1, 9), (0, 10)]);
    assert!(out.contains(&TaskAction::Ack { epoch: 1, ack: TaskAck::Done }), "{out:?}");
}

/// A self-join's end of stream comes per channel: the task keeps its other channel open (and its
/// event time bound by it) and completes an epoch once the remaining channel's marker arrived.
#[test]
fn self_join_ends_each_channel_on_its_own() {
    let mut a = task_with_inputs(t(0), &[0, 1, 2, 3], &[0, 1]);
    assert_eq!(a.inputs_from(up()), vec![ch(0), ch(1)]);
    a.on(TaskEvent::Watermark { channel: ch(1), time: 4 });
    let out = a.on(TaskEvent::EndOfStream { channel: ch(0) });
    // Input 1 still holds the event time at its watermark.
    assert_eq!(out, vec![TaskAction::EmitWatermark(4)]);
    assert_eq!(a.inputs_from(up()), vec![ch(1)]);
    let out = a.on(TaskEvent::EndOfStream { channel: ch(0) });
    assert!(
        matches!(out[..], [TaskAction::Error(ProtocolError::UnknownChannel { channel })] if channel == ch(0)),
        "{out:?}"
    );
    assert!(a.on(records(ch(0), vec![rec(0, 5)])).iter().any(|x| matches!(x, TaskAction::Error(_))));
    assert_eq!(processed_with_input(&a.on(records(ch(1), vec![rec(0, 5)]))), vec![(1, 5)]);
    // An epoch (nothing moves at this task) waits for the marker of the open channel only.
    let moves_elsewhere =
        Arc::new(Reconfiguration { moves: BTreeMap::from([((t(1), t(2)), vec![0])]), ..(*reconf()).clone() });
    let out = a.on(TaskEvent::Start(moves_elsewhere));
    assert!(!out.contains(&TaskAction::Ack { epoch: 1, ack: TaskAck::Done }), "{out:?}");
    let out = a.on(marker(ch(1)));
    assert!(out.contains(&TaskAction::Ack { epoch: 1, ack: TaskAck::Done }), "{out:?}");
    let out = a.on(TaskEvent::EndOfStream { channel: ch(1) });
    assert_eq!(out, vec![TaskAction::EmitWatermark(u64::MAX)]);
    assert!(a.inputs_from(up()).is_empty());
}

/// A store of keys, as the runtime's local-first lookups see it.
struct Store(BTreeSet<Vec<u8>>);

impl LocalKeys for Store {
    fn contains_many(&mut self, keys: &[&[u8]]) -> Vec<bool> {
        keys.iter().map(|k| self.0.contains(*k)).collect()
    }
}

/// Local first, then the filters: a key in the receiver's own store (here one it kept from an
/// earlier ownership) needs no fetch; until the sender's filter
/// arrives any other key may be at the sender and is fetched from it, in one hop; afterwards a
/// key outside the filter is new, with no round trip and no KLT entry.
#[test]
fn local_keys_then_filters_decide_what_is_fetched() {
    let (mut s, mut r) = (task(t(0), &[0, 1, 2, 3]), task(t(1), &[]));
    s.on(TaskEvent::Watermark { channel: ch(0), time: 1 });
    let open = peer_messages(&r.on(TaskEvent::Start(reconf())));
    s.on(TaskEvent::Start(reconf()));
    let hand_over = peer_messages(&deliver(&mut s, t(1), open));
    let mut keys = keys_in(3);
    let (kept, plain, fresh) =
        (keys.next().unwrap_or_default(), keys.next().unwrap_or_default(), keys.next().unwrap_or_default());
    let out = deliver(&mut r, t(0), hand_over);
    let ask = TaskAction::RequestFilter { from: t(0), request: FilterRequest { bucket: 3, since: 1 } };
    assert!(out.contains(&ask), "{out:?}");
    r.on(marker(ch(0)));
    let close = peer_messages(&s.on(marker(ch(0))));
    let out = deliver(&mut r, t(0), close);
    assert!(out.contains(&TaskAction::Ack { epoch: 1, ack: TaskAck::Done }), "{out:?}");

    let mut store = Store(BTreeSet::from([kept.clone()]));
    let record = |key: &[u8], time| Record { key: key.to_vec(), value: vec![], time, due_ms: 0 };
    let out = r.on_with(records(ch(0), vec![record(&kept, 5)]), &mut store);
    assert_eq!(processed(&out), vec![5], "{out:?}");
    assert!(!out.iter().any(|a| matches!(a, TaskAction::FetchState { .. })), "{out:?}");
    let out = r.on_with(records(ch(0), vec![record(&fresh, 6)]), &mut store);
    let [TaskAction::FetchState { from, request }] = &out[..] else { panic!("{out:?}") };
    assert_eq!((*from, &request.keys), (t(0), &vec![fresh.clone()]), "no filter yet: ask the sender");
    let answer = FetchResponse {
        id: request.id,
        values: vec![(fresh.clone(), None)],
        extra: vec![],
        exhausted: vec![],
    };
    let out = r.on_with(TaskEvent::FetchResponse { from: t(0), response: answer }, &mut store);
    assert_eq!(processed(&out), vec![6], "not there: new");
    assert_eq!(r.klt().entries(), 1, "recorded as here-or-nowhere while the filter is missing");
    // The sender's filter: it holds `plain` (and not `fresh`, which it never had).
    let filter = KeyFilter::build(vec![key_hash(&plain)]);
    let out = r.on_with(
        TaskEvent::Filter { from: t(0), response: FilterResponse { bucket: 3, since: 1, filter } },
        &mut store,
    );
    assert!(out.is_empty(), "{out:?}");
    assert_eq!(r.klt().entries(), 0, "the filter answers for `fresh` now");
    let out = r.on_with(records(ch(0), vec![record(&fresh, 7)]), &mut store);
    assert_eq!(processed(&out), vec![7], "outside the filter: no round trip");
    let out = r.on_with(records(ch(0), vec![record(&plain, 8)]), &mut store);
    assert!(
        matches!(&out[..], [TaskAction::FetchState { from, request }] if *from == t(0) && request.keys == vec![plain.clone()]),
        "{out:?}"
    );
}

/// A backlog is processed as batches of at most `MAX_BATCH_RECORDS`, in order: each waits for
/// the state of its own keys only, so a task short of capacity never takes its whole (growing)
/// backlog as one ever longer batch. Without the look-ahead each batch asks for its keys when
/// taken; with it every key is asked for ahead, in requests of at most 32 keys in the records'
/// order, and each batch waits only for the request of its first record.
#[test]
fn a_backlog_is_processed_in_bounded_batches_in_order() {
    for look_ahead in [false, true] {
        let (mut s, mut r) = (task(t(0), &[0, 1, 2, 3]), task(t(1), &[]));
        r.set_look_ahead(look_ahead);
        s.on(TaskEvent::Watermark { channel: ch(0), time: 1 });
        let open = peer_messages(&r.on(TaskEvent::Start(reconf())));
        s.on(TaskEvent::Start(reconf()));
        deliver(&mut r, t(0), peer_messages(&deliver(&mut s, t(1), open)));
        r.on(marker(ch(0)));
        deliver(&mut r, t(0), peer_messages(&s.on(marker(ch(0)))));

        // No filter from the sender yet: every key of bucket 3 may be there.
        let n = MAX_BATCH_RECORDS + MAX_BATCH_RECORDS / 4;
        let backlog: Vec<Record> = keys_in(3)
            .take(n)
            .zip(0u64..)
            .map(|(key, time)| Record { key, value: vec![], time, due_ms: 0 })
            .collect();
        let mut out = r.on(records(ch(0), backlog.clone()));
        let mut done = Vec::new();
        let mut asked = 0;
        let max_keys = if look_ahead { LOOK_AHEAD_REQUEST_KEYS } else { MAX_BATCH_RECORDS };
        // Requests answered in the order they went out (the fetch lane is FIFO).
        let mut requests = VecDeque::new();
        loop {
            requests.extend(out.iter().filter_map(|a| match a {
                TaskAction::FetchState { from, request } => Some((*from, request.clone())),
                _ => None,
            }));
            let Some((from, request)) = requests.pop_front() else { break };
            assert_eq!(from, t(0));
            assert!(request.keys.len() <= max_keys, "{} keys in one fetch", request.keys.len());
            let expected: Vec<Vec<u8>> =
                backlog[asked..asked + request.keys.len()].iter().map(|r| r.key.clone()).collect();
            let mut keys = request.keys.clone();
            keys.sort();
            let mut expected_sorted = expected.clone();
            expected_sorted.sort();
            assert_eq!(keys, expected_sorted, "requests ask for the records' keys, in order");
            asked += request.keys.len();
            let values = request.keys.iter().map(|k| (k.clone(), None)).collect();
            let response = FetchResponse { id: request.id, values, extra: vec![], exhausted: vec![] };
            out = r.on(TaskEvent::FetchResponse { from: t(0), response });
            let batch = processed(&out);
            assert!(batch.len() <= max_keys, "a batch of {} records", batch.len());
            done.extend(batch);
        }
        assert_eq!(asked, n, "every key asked for once");
        assert_eq!(done, (0..n as u64).collect::<Vec<_>>(), "every record once, in arrival order");
    }
}

/// Lazy windows: a hand-over brings timers, not their keys' state. Each holds the receiver's
/// event time below it until its key was accessed: a timer the upstreams' event time reached is
/// fetched like a record's key (one hop) and the watermark that fires it comes after the state
/// is installed; a key a record accessed first is found local when its timer comes due.
#[test]
fn handed_timers_hold_the_watermark_until_their_key_is_accessed() {
    let (mut s, mut r) = (task(t(0), &[0, 1, 2, 3]), task(t(1), &[]));
    s.on(TaskEvent::Watermark { channel: ch(0), time: 1 });
    r.on(TaskEvent::Watermark { channel: ch(0), time: 1 });
    let open = peer_messages(&r.on(TaskEvent::Start(reconf())));
    s.on(TaskEvent::Start(reconf()));
    let mut hand_over = peer_messages(&deliver(&mut s, t(1), open));
    let mut keys = keys_in(3);
    let (fired_first, record_first) = (keys.next().unwrap_or_default(), keys.next().unwrap_or_default());
    let timers = vec![(10, fired_first.clone()), (20, record_first.clone()), (30, record_first.clone())];
    let [PeerMessage::HandOver { hand_over: h, .. }] = &mut hand_over[..] else { panic!("{hand_over:?}") };
    // What the sender's runtime adds: its timers of bucket 3.
    h.timers = timers.clone();
    let out = deliver(&mut r, t(0), hand_over);
    assert!(out.contains(&TaskAction::InstallTimers { from: t(0), timers }), "{out:?}");
    r.on(marker(ch(0)));
    let out = deliver(&mut r, t(0), peer_messages(&s.on(marker(ch(0)))));
    assert!(out.contains(&TaskAction::Ack { epoch: 1, ack: TaskAck::Done }), "{out:?}");
    let watermarks = |out: &[TaskAction]| -> Vec<u64> {
        out.iter()
            .filter_map(|a| if let TaskAction::EmitWatermark(w) = a { Some(*w) } else { None })
            .collect()
    };

    // The upstream reaches 15: the timer at 10 is due, its key is fetched from the sender, and
    // the event time stops below it.
    let out = r.on(TaskEvent::Watermark { channel: ch(0), time: 15 });
    let [TaskAction::FetchState { from, request }, TaskAction::EmitWatermark(9)] = &out[..] else {
        panic!("{out:?}")
    };
    assert_eq!((*from, &request.keys), (t(0), &vec![fired_first.clone()]));
    assert!(r.is_busy());
    // A record of the other key comes meanwhile (its timer, at 20, is not due).
    let record = Record { key: record_first.clone(), value: vec![], time: 16, due_ms: 0 };
    // One batch waits for state at a time; the look-ahead asks for the queued record's key now.
    let out = r.on(records(ch(0), vec![record]));
    let [TaskAction::FetchState { from: ahead_from, request: ahead }] = &out[..] else { panic!("{out:?}") };
    assert_eq!((*ahead_from, &ahead.keys), (t(0), &vec![record_first.clone()]));
    let ahead = ahead.clone();
    let state = (fired_first.clone(), Some(b"window".to_vec()));
    let response = FetchResponse { id: request.id, values: vec![state], extra: vec![], exhausted: vec![] };
    let out = r.on(TaskEvent::FetchResponse { from: t(0), response });
    let install = out.iter().position(|a| matches!(a, TaskAction::InstallState { .. }));
    let emit = out.iter().position(|a| matches!(a, TaskAction::EmitWatermark(15)));
    assert!(install.is_some() && install < emit, "the state is installed before the timer fires: {out:?}");
    assert!(
        !out.iter().any(|a| matches!(a, TaskAction::FetchState { .. })),
        "the record's batch waits for the look-ahead's request, not a second one: {out:?}"
    );
    let request = ahead;
    let response = FetchResponse {
        id: request.id,
        values: vec![(record_first.clone(), None)],
        extra: vec![],
        exhausted: vec![],
    };
    let out = r.on(TaskEvent::FetchResponse { from: t(0), response });
    assert_eq!(processed(&out), vec![16]);
    assert!(watermarks(&out).is_empty(), "held below the timer at 20: {out:?}");

    // The timer at 20 comes due: its key is local since the record's batch, no round trip.
    let out = r.on(TaskEvent::Watermark { channel: ch(0), time: 40 });
    assert!(!out.iter().any(|a| matches!(a, TaskAction::FetchState { .. })), "{out:?}");
    assert_eq!(watermarks(&out), vec![40], "{out:?}");
    assert!(!r.is_busy());
}

/// Without the hold, the handed-over timer's watermark goes out with its key's state still at
/// the sender (the broken variant the simulator must catch).
#[test]
fn without_the_hold_a_handed_timer_fires_before_its_state_is_here() {
    let (mut s, mut r) = (task(t(0), &[0, 1, 2, 3]), task(t(1), &[]));
    r.inject_fault_no_timer_access();
    s.on(TaskEvent::Watermark { channel: ch(0), time: 1 });
    r.on(TaskEvent::Watermark { channel: ch(0), time: 1 });
    let open = peer_messages(&r.on(TaskEvent::Start(reconf())));
    s.on(TaskEvent::Start(reconf()));
    let mut hand_over = peer_messages(&deliver(&mut s, t(1), open));
    let [PeerMessage::HandOver { hand_over: h, .. }] = &mut hand_over[..] else { panic!("{hand_over:?}") };
    h.timers = vec![(10, key_in(3))];
    deliver(&mut r, t(0), hand_over);
    r.on(marker(ch(0)));
    deliver(&mut r, t(0), peer_messages(&s.on(marker(ch(0)))));
    let out = r.on(TaskEvent::Watermark { channel: ch(0), time: 15 });
    assert_eq!(out, vec![TaskAction::EmitWatermark(15)]);
}

/// A hand-over's timer of a bucket it does not move is refused.
#[test]
fn a_handed_timer_of_another_bucket_is_refused() {
    let (mut s, mut r) = (task(t(0), &[0, 1, 2, 3]), task(t(1), &[]));
    s.on(TaskEvent::Watermark { channel: ch(0), time: 1 });
    let open = peer_messages(&r.on(TaskEvent::Start(reconf())));
    s.on(TaskEvent::Start(reconf()));
    let mut hand_over = peer_messages(&deliver(&mut s, t(1), open));
    let [PeerMessage::HandOver { hand_over: h, .. }] = &mut hand_over[..] else { panic!("{hand_over:?}") };
    h.timers = vec![(10, key_in(2))];
    let out = deliver(&mut r, t(0), hand_over);
    assert!(matches!(&out[..], [TaskAction::Error(ProtocolError::UnexpectedPeerMessage { .. })]), "{out:?}");
    assert!(!r.owns(3));
}

/// A handed-over processing-time timer holds no event time, but the processing time the runtime
/// may fire up to stays below it until its key was accessed: once the task's clock reaches it,
/// its key is fetched like a record's, and the firing bound passes it only after the state is
/// installed.
#[test]
fn handed_processing_time_timers_hold_the_firing_bound_until_their_key_is_accessed() {
    let (mut s, mut r) = (task(t(0), &[0, 1, 2, 3]), task(t(1), &[]));
    s.on(TaskEvent::Watermark { channel: ch(0), time: 1 });
    r.on(TaskEvent::Watermark { channel: ch(0), time: 1 });
    let open = peer_messages(&r.on(TaskEvent::Start(reconf())));
    s.on(TaskEvent::Start(reconf()));
    let mut hand_over = peer_messages(&deliver(&mut s, t(1), open));
    let key = key_in(3);
    // An event-time timer of the same key far ahead must not stand in for the processing-time one.
    let timers = vec![(TimeDomain::ProcessingTime.queue_time(100), key.clone()), (1_000, key.clone())];
    let [PeerMessage::HandOver { hand_over: h, .. }] = &mut hand_over[..] else { panic!("{hand_over:?}") };
    h.timers = timers.clone();
    let out = deliver(&mut r, t(0), hand_over);
    assert!(out.contains(&TaskAction::InstallTimers { from: t(0), timers }), "{out:?}");
    r.on(marker(ch(0)));
    deliver(&mut r, t(0), peer_messages(&s.on(marker(ch(0)))));
    let fired = |out: &[TaskAction]| -> Vec<u64> {
        out.iter()
            .filter_map(
                |a| if let TaskAction::FireProcessingTimers { up_to } = a { Some(*up_to) } else { None },
            )
            .collect()
    };

    // Event time is not held by the processing-time timer (only by the one at 1 000).
    let out = r.on(TaskEvent::Watermark { channel: ch(0), time: 15 });
    assert!(out.contains(&TaskAction::EmitWatermark(15)), "{out:?}");
    // The clock before the timer: fire up to it, nothing fetched.
    let out = r.on(TaskEvent::ProcessingTime { now: 50 });
    assert_eq!(out, vec![TaskAction::FireProcessingTimers { up_to: 50 }]);
    // The clock passes the timer: its key is fetched, and the bound stops below it.
    let out = r.on(TaskEvent::ProcessingTime { now: 150 });
    let Some(TaskAction::FetchState { from, request }) =
        out.iter().find(|a| matches!(a, TaskAction::FetchState { .. }))
    else {
        panic!("the timer's key is fetched: {out:?}")
    };
    assert_eq!((*from, &request.keys), (t(0), &vec![key.clone()]));
    assert_eq!(fired(&out), vec![99], "{out:?}");
    assert!(r.is_busy());
    let response = FetchResponse {
        id: request.id,
        values: vec![(key.clone(), Some(b"state".to_vec()))],
        extra: vec![],
        exhausted: vec![],
    };
    let out = r.on(TaskEvent::FetchResponse { from: t(0), response });
    let install = out.iter().position(|a| matches!(a, TaskAction::InstallState { .. }));
    let fire = out.iter().position(|a| matches!(a, TaskAction::FireProcessingTimers { up_to: 150 }));
    assert!(install.is_some() && install < fire, "the state is installed before the timer fires: {out:?}");
    // The event-time timer of the key is on local state now: no second fetch.
    let out = r.on(TaskEvent::Watermark { channel: ch(0), time: 2_000 });
    assert!(!out.iter().any(|a| matches!(a, TaskAction::FetchState { .. })), "{out:?}");
    assert!(out.contains(&TaskAction::EmitWatermark(2_000)), "{out:?}");
    assert!(!r.is_busy());
}

/// Bucket 3 moves from t0, cancelled (so retired, pulled from with `extra_keys`), to t1.
fn scale_in_reconf(extra_keys: usize) -> Arc<Reconfiguration> {
    Arc::new(Reconfiguration {
        cancelled: BTreeSet::from([t(0)]),
        retired: BTreeSet::from([t(0)]),
        extra_keys,
        ..(*reconf()).clone()
    })
}

/// t0 (bucket 3) hands over to t1 (buckets 0–2) in epoch 1 and is cancelled; returns the
/// receiver after the epoch, its filter request to t0 unanswered, and everything it did since the
/// hand-over.
fn received_awaiting_filter(extra_keys: usize) -> (KoalaTask, FilterRequest, Vec<TaskAction>) {
    let (mut s, mut r) = (task(t(0), &[3]), task(t(1), &[0, 1, 2]));
    let open = peer_messages(&r.on(TaskEvent::Start(scale_in_reconf(extra_keys))));
    s.on(TaskEvent::Start(scale_in_reconf(extra_keys)));
    let hand_over = peer_messages(&deliver(&mut s, t(1), open));
    let mut done = deliver(&mut r, t(0), hand_over);
    let asked: Vec<FilterRequest> = done
        .iter()
        .filter_map(|a| match a {
            TaskAction::RequestFilter { from, request } if *from == t(0) => Some(request.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(asked.len(), 1, "the receiver asks the sender for its filter: {done:?}");
    done.extend(r.on(marker(ch(0))));
    let close = peer_messages(&s.on(marker(ch(0))));
    done.extend(deliver(&mut r, t(0), close));
    assert!(done.contains(&TaskAction::Ack { epoch: 1, ack: TaskAck::Done }), "{done:?}");
    assert!(r.awaits_filters());
    (r, asked[0].clone(), done)
}

fn drained_reports(out: &[TaskAction]) -> Vec<TaskId> {
    out.iter()
        .filter_map(|a| match a {
            TaskAction::Ack { ack: TaskAck::LocationDrained { location }, .. } => Some(*location),
            _ => None,
        })
        .collect()
}

/// A retired location is released once every live task reported it drained, and then exits
/// with its background filter builds. A task whose layer at the location went — a pull emptied
/// the bucket — while its filter request was still unanswered must not report the location
/// drained until the filter came: else the location was released and exited owing it, and the
/// task waited for it for ever, never reported its inputs ended, and the job never ended (the
/// job-end soak's hang: three aggregate tasks and the sink alive after the input ended).
#[test]
fn a_location_owing_a_filter_is_not_reported_drained() {
    let (mut r, asked, end) = received_awaiting_filter(8);
    // The epoch's end pulls from the retired sender; its answer: bucket 3 is empty there.
    let pulls: Vec<FetchRequest> = end
        .into_iter()
        .filter_map(|a| match a {
            TaskAction::FetchState { from, request } if from == t(0) => Some(request),
            _ => None,
        })
        .collect();
    let id = pulls.first().map(|p| p.id).expect("a pull from the retired sender");
    let response = FetchResponse { id, values: vec![], extra: vec![], exhausted: vec![3] };
    let out = r.on(TaskEvent::FetchResponse { from: t(0), response });
    assert!(!r.klt().references(t(0)), "the pull emptied the layer");
    assert_eq!(drained_reports(&out), vec![], "t0 still owes the filter: {out:?}");
    let filter =
        FilterResponse { bucket: asked.bucket, since: asked.since, filter: KeyFilter::build(vec![]) };
    let out = r.on(TaskEvent::Filter { from: t(0), response: filter });
    assert_eq!(drained_reports(&out), vec![t(0)]);
    assert!(!r.awaits_filters());
}

/// A task does not hand a bucket over while it awaits that bucket's filter: a task cancelled by
/// the reconfiguration would otherwise retire still owing nothing to anyone's release condition
/// but waiting for the answer, and the location could be released and exit first.
#[test]
fn a_bucket_is_not_handed_over_while_its_filter_is_awaited() {
    // Fetch on demand only: no pull keeps the task busy.
    let (mut r, asked, _) = received_awaiting_filter(0);
    let (mut n, next) = (
        task(t(2), &[]),
        Arc::new(Reconfiguration {
            epoch: 2,
            moves: BTreeMap::from([((t(1), t(2)), vec![3])]),
            new_tasks: BTreeSet::from([t(2)]),
            cancelled: BTreeSet::new(),
            ..(*scale_in_reconf(0)).clone()
        }),
    );
    n.on(TaskEvent::Start(next.clone()));
    let out = r.on(TaskEvent::Start(next));
    assert!(peer_messages(&out).iter().all(|m| !matches!(m, PeerMessage::HandOver { .. })), "{out:?}");
    let filter =
        FilterResponse { bucket: asked.bucket, since: asked.since, filter: KeyFilter::build(vec![]) };
    let out = r.on(TaskEvent::Filter { from: t(0), response: filter });
    assert!(peer_messages(&out).iter().any(|m| matches!(m, PeerMessage::HandOver { .. })), "{out:?}");
}
