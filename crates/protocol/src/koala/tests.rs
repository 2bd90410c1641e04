//! Hand-driven unit tests of the task core: per-key FIFO at a receiver, an idle sender, and typed
//! errors (never panics) for input the protocol does not allow.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use koala_types::{OperatorId, Record, TaskId, bucket_of};

use super::*;

const NB: u16 = 4;

fn up() -> TaskId {
    TaskId::new(OperatorId(0), 0)
}

fn t(i: u32) -> TaskId {
    TaskId::new(OperatorId(1), i)
}

fn key_in(bucket: u16) -> Vec<u8> {
    (0..).map(|i| format!("k{i}").into_bytes()).find(|k| bucket_of(k, NB) == bucket).unwrap_or_default()
}

fn rec(bucket: u16, time: u64) -> Record {
    Record { key: key_in(bucket), value: time.to_le_bytes().to_vec(), time }
}

fn task(id: TaskId, owned: &[u16]) -> KoalaTask {
    KoalaTask::new(TaskConfig {
        id,
        num_buckets: NB,
        owned: owned.iter().copied().collect(),
        upstreams: BTreeSet::from([up()]),
    })
}

/// Bucket 3 moves from t0 to the existing task t1.
fn reconf() -> Arc<Reconfiguration> {
    Arc::new(Reconfiguration {
        operator: OperatorId(1),
        epoch: 1,
        moves: BTreeMap::from([((t(0), t(1)), vec![3])]),
        upstreams: BTreeSet::from([up()]),
        new_tasks: BTreeSet::new(),
        cancelled: BTreeSet::new(),
        retired: BTreeSet::new(),
        extra_keys: 0,
    })
}

fn peer_messages(out: &[TaskAction]) -> Vec<PeerMessage> {
    out.iter()
        .filter_map(|a| match a {
            TaskAction::SendToPeer { message, .. } => Some(message.clone()),
            _ => None,
        })
        .collect()
}

fn processed(out: &[TaskAction]) -> Vec<u64> {
    out.iter()
        .filter_map(|a| match a {
            TaskAction::Process(rs) => Some(rs.iter().map(|r| r.time).collect::<Vec<_>>()),
            _ => None,
        })
        .flatten()
        .collect()
}

fn deliver(to: &mut KoalaTask, from: TaskId, messages: Vec<PeerMessage>) -> Vec<TaskAction> {
    messages.into_iter().flat_map(|message| to.on(TaskEvent::Peer { from, message })).collect()
}

#[test]
fn receiver_parks_direct_records_until_the_peer_channel_closes() {
    let (mut s, mut r) = (task(t(0), &[0, 1, 2, 3]), task(t(1), &[]));
    s.on(TaskEvent::Watermark { from: up(), time: 1 });
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
    let forwarded = peer_messages(&s.on(TaskEvent::Records { from: up(), records: vec![rec(3, 5)] }));
    // ... while, after the switch, a newer one arrives directly at the receiver: parked.
    r.on(TaskEvent::Marker { from: up(), epoch: 1 });
    assert!(processed(&r.on(TaskEvent::Records { from: up(), records: vec![rec(3, 6)] })).is_empty());
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
    let close = peer_messages(&s.on(TaskEvent::Marker { from: up(), epoch: 1 }));
    assert!(matches!(close[..], [PeerMessage::Close { epoch: 1 }]));
    // The parked record runs after everything that came over the peer channel.
    let out = deliver(&mut r, t(0), close);
    assert_eq!(processed(&out), vec![6]);
    assert!(out.contains(&TaskAction::Ack { epoch: 1, ack: TaskAck::Done }));
}

#[test]
fn protocol_surprises_are_typed_errors() {
    let is_error = |out: Vec<TaskAction>| out.iter().any(|a| matches!(a, TaskAction::Error(_)));
    let mut a = task(t(0), &[0, 1]);
    assert!(is_error(a.on(TaskEvent::Records { from: t(9), records: vec![rec(0, 1)] })));
    assert!(is_error(a.on(TaskEvent::Records { from: up(), records: vec![rec(2, 1)] })));
    assert!(is_error(a.on(TaskEvent::Marker { from: up(), epoch: 3 })));
    assert!(is_error(a.on(TaskEvent::Start(reconf()))), "t0 does not own bucket 3");
    let close = PeerMessage::Close { epoch: 0 };
    assert!(is_error(a.on(TaskEvent::Peer { from: t(1), message: close })));
    let response = FetchResponse { id: 7, values: vec![], extra: vec![], exhausted: vec![] };
    assert!(is_error(a.on(TaskEvent::FetchResponse { from: t(1), response })));
    let request = FetchRequest { id: 1, keys: vec![key_in(1)], extra: None };
    assert!(is_error(a.on(TaskEvent::FetchRequest { from: t(1), request })));
    assert!(is_error(
        a.on(TaskEvent::Watermark { from: up(), time: 5 })
            .into_iter()
            .chain(a.on(TaskEvent::Watermark { from: up(), time: 4 }))
            .collect()
    ));
    // After all that the task still works.
    assert_eq!(processed(&a.on(TaskEvent::Records { from: up(), records: vec![rec(0, 9)] })), vec![9]);
}

/// A window of a moved bucket whose timer is due at the sender's event time fires at the sender,
/// right before the hand-over, so it never reaches a receiver whose watermark is already past it;
/// the sender keeps emitting watermarks during the transition (only receivers gate).
#[test]
fn timers_due_at_hand_over_fire_at_the_sender_before_it() {
    let (mut s, mut r) = (task(t(0), &[0, 1, 2, 3]), task(t(1), &[0]));
    // The receiver t1 (an existing task: it owns nothing here but is not new) emitted 10 already;
    // the sender's upstream is at 20 but a transition starts before it emitted anything past 10.
    let out = s.on(TaskEvent::Watermark { from: up(), time: 10 });
    assert_eq!(out, vec![TaskAction::EmitWatermark(10)]);
    r.on(TaskEvent::Watermark { from: up(), time: 10 });
    let open = peer_messages(&r.on(TaskEvent::Start(reconf())));
    assert!(matches!(open[..], [PeerMessage::Open { watermark: Some(10), .. }]), "{open:?}");
    s.on(TaskEvent::Start(reconf()));
    let out = s.on(TaskEvent::Watermark { from: up(), time: 20 });
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
