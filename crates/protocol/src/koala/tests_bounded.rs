//! The bounded inbox (`[runtime] max_queued_records`): a task that holds the bound stops taking
//! data input and takes it again once what it holds drains, which needs no data input; parked
//! records fill at most the bound minus one (`KoalaTask::data_room`); and batches report the
//! intake tag of their first record (per-batch latency includes the wait for state).

use koala_types::{Record, TaskId};

use super::tests::{ch, deliver, key_in, peer_messages, processed, rec, reconf, t, task_with_inputs};
use super::*;

/// A task owning `owned`, fed by the upstream on inputs 0 and 1 (two channels, so a marker can
/// be pending on one while records arrive on the other).
fn task(id: TaskId, owned: &[u16]) -> KoalaTask {
    task_with_inputs(id, owned, &[0, 1])
}

/// Sender t0 and receiver t1 (bound 3) after the hand-over of bucket 3; the sender has not
/// closed the peer channel yet.
fn handed_over() -> (KoalaTask, KoalaTask) {
    let (mut s, mut r) = (task(t(0), &[1, 2, 3]), task(t(1), &[0]));
    r.set_max_queued_records(3);
    for i in [0, 1] {
        s.on(TaskEvent::Watermark { channel: ch(i), time: 1 });
        r.on(TaskEvent::Watermark { channel: ch(i), time: 1 });
    }
    let open = peer_messages(&r.on(TaskEvent::Start(reconf())));
    s.on(TaskEvent::Start(reconf()));
    let hand_over = peer_messages(&s.on(TaskEvent::Peer { from: t(1), message: open[0].clone() }));
    let out = deliver(&mut r, t(0), hand_over);
    assert!(out.contains(&TaskAction::Ack { epoch: 1, ack: TaskAck::PeerReady }), "{out:?}");
    (s, r)
}

/// Queued records that wait for state fill the bound: intake stops, and resumes once the fetch is
/// answered (on the fetch lane, with no data input) and the batch ran.
#[test]
fn a_full_inbox_stops_data_intake_until_a_fetch_answer_drains_it() {
    let (mut s, mut r) = handed_over();
    for i in [0, 1] {
        r.on(TaskEvent::Marker { channel: ch(i), epoch: 1 });
    }
    // The sender forwards an in-flight record of bucket 3: its key's state is still at the sender.
    let forwarded = peer_messages(&s.on(TaskEvent::Records { channel: ch(0), records: vec![rec(3, 5)] }));
    r.set_intake_tag(100);
    let out = deliver(&mut r, t(0), forwarded);
    let Some(TaskAction::FetchState { request, .. }) = out.last().cloned() else { panic!("{out:?}") };
    assert_eq!((r.queued_records(), r.takes_data()), (1, true));
    // Records of the receiver's own bucket queue behind the batch waiting for state.
    r.set_intake_tag(200);
    assert!(processed(&r.on(TaskEvent::Records { channel: ch(0), records: vec![rec(0, 6)] })).is_empty());
    assert!(r.takes_data(), "2 of 3");
    assert!(processed(&r.on(TaskEvent::Records { channel: ch(1), records: vec![rec(0, 7)] })).is_empty());
    assert_eq!((r.queued_records(), r.takes_data()), (3, false));
    // The answer drains what the task holds: it takes data again.
    r.set_intake_tag(300);
    let response =
        FetchResponse { id: request.id, values: vec![(key_in(3), None)], extra: vec![], exhausted: vec![] };
    let out = r.on(TaskEvent::FetchResponse { from: t(0), response });
    assert_eq!(processed(&out), vec![5, 6, 7]);
    assert_eq!((r.queued_records(), r.takes_data()), (0, true));
    // Two batches: the one that waited for state (taken at 100), then the records queued behind
    // it (taken at 200; one run per input).
    assert_eq!(
        r.take_batches(),
        vec![BatchTaken { taken: 100, actions: 1 }, BatchTaken { taken: 200, actions: 2 }]
    );
    assert!(r.take_batches().is_empty());
}

/// Parked records wait for the sender's `Close`, which waits for the sender's markers and for the
/// records it forwards: they fill at most the bound minus one, so a record that would park past
/// that is refused (it waits in its channel) while a channel whose marker is still to come — and
/// forwarded records — still find room; the `Close` releases them.
#[test]
fn parked_records_fill_at_most_the_bound_minus_one() {
    let (mut s, mut r) = handed_over();
    // The upstream switched: its marker on input 0, then records of bucket 3 directly to t1.
    r.on(TaskEvent::Marker { channel: ch(0), epoch: 1 });
    let parked: Vec<Record> = (5..9).map(|time| rec(3, time)).collect();
    assert_eq!(r.data_room(ch(0), &parked), 2, "bound 3: two may park");
    assert!(
        processed(&r.on(TaskEvent::Records { channel: ch(0), records: parked[..2].to_vec() })).is_empty()
    );
    assert_eq!(r.queued_records(), 2);
    assert!(r.takes_data());
    assert_eq!(r.data_room(ch(0), &parked[2..]), 0, "a third would park: the channel waits");
    // Input 1's marker is still to come: its records (of the receiver's own bucket) fit.
    let own = vec![rec(0, 9), rec(0, 10)];
    assert_eq!(r.data_room(ch(1), &own), 1, "one record of room left");
    assert_eq!(r.peer_room(2), 1, "or one forwarded record");
    assert_eq!(processed(&r.on(TaskEvent::Records { channel: ch(1), records: own[..1].to_vec() })), vec![9]);
    r.on(TaskEvent::Marker { channel: ch(1), epoch: 1 });
    assert_eq!(r.queued_records(), 2);
    assert_eq!(r.data_room(ch(1), &own[1..]), 1);
    // The sender's markers close the peer channel; the parked records run (a fetch first: the
    // key's state may be at the sender).
    let mut close = Vec::new();
    for i in [0, 1] {
        close.extend(peer_messages(&s.on(TaskEvent::Marker { channel: ch(i), epoch: 1 })));
    }
    assert!(matches!(close[..], [PeerMessage::Close { epoch: 1 }]), "{close:?}");
    let out = deliver(&mut r, t(0), close);
    assert!(out.contains(&TaskAction::Ack { epoch: 1, ack: TaskAck::Done }), "{out:?}");
    let Some(TaskAction::FetchState { request, .. }) =
        out.iter().find(|a| matches!(a, TaskAction::FetchState { .. })).cloned()
    else {
        panic!("{out:?}")
    };
    assert_eq!(r.queued_records(), 2, "the released records wait for state");
    let response =
        FetchResponse { id: request.id, values: vec![(key_in(3), None)], extra: vec![], exhausted: vec![] };
    let out = r.on(TaskEvent::FetchResponse { from: t(0), response });
    assert_eq!(processed(&out), vec![5, 6]);
    assert!(r.takes_data());
    assert_eq!(r.data_room(ch(0), &parked[2..]), 2, "no transition: the rest fits");
}
