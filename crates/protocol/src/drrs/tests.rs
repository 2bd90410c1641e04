//! Unit tests of the DRRS task core: out-of-order processing, per-key order across the peer and
//! the direct path, backpressure and the watermark hold.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use koala_types::{InputChannel, OperatorId, Record, TaskId, bucket_of};

use super::{DrrsPeer, DrrsTask, Subscale, TaskAction, TaskConfig, TaskEvent};
use crate::control::TaskAck;

const OP: OperatorId = OperatorId(1);
const EPOCH: u64 = 1 << 16;

fn key_in(bucket: u16, n: usize) -> Vec<u8> {
    (0..)
        .map(|i: u32| format!("k{i}").into_bytes())
        .filter(|k| bucket_of(k, 4) == bucket)
        .nth(n)
        .expect("key")
}

fn rec(key: &[u8], time: u64) -> Record {
    Record { key: key.to_vec(), value: vec![], time, due_ms: 0 }
}

fn processed(out: &[TaskAction]) -> Vec<u64> {
    out.iter()
        .flat_map(|a| match a {
            TaskAction::Process { records, .. } => records.iter().map(|r| r.time).collect(),
            _ => Vec::new(),
        })
        .collect()
}

/// A receiver (task 1) that takes buckets 2 and 3 from task 0, fed by one upstream.
fn receiver(wait_records: usize) -> (DrrsTask, InputChannel, TaskId) {
    let (up, sender, me) = (TaskId::new(OperatorId(0), 0), TaskId::new(OP, 0), TaskId::new(OP, 1));
    let channel = InputChannel { input: 0, from: up };
    let mut task = DrrsTask::new(TaskConfig {
        id: me,
        num_buckets: 4,
        owned: BTreeSet::from([0, 1]),
        inputs: BTreeSet::from([channel]),
    });
    task.on(TaskEvent::Watermark { channel, time: 1 });
    let sub = Subscale {
        operator: OP,
        epoch: EPOCH,
        index: 0,
        count: 1,
        moves: BTreeMap::from([((sender, me), vec![2, 3])]),
        upstreams: BTreeSet::from([up]),
        wait_records,
    };
    let out = task.on(TaskEvent::Start(Arc::new(sub)));
    assert_eq!(
        out[0],
        TaskAction::SendToPeer {
            to: sender,
            message: DrrsPeer::Open {
                epoch: EPOCH,
                watermark: Some(1),
                credit: super::peer_window(wait_records, 1)
            }
        }
    );
    let out = task.on(TaskEvent::Peer {
        from: sender,
        message: DrrsPeer::FastForward { epoch: EPOCH, watermark: Some(2) },
    });
    assert!(out.contains(&TaskAction::Ack { epoch: EPOCH, ack: TaskAck::PeerReady }), "{out:?}");
    (task, channel, sender)
}

#[test]
fn records_wait_for_state_others_go_on_and_order_holds_across_paths() {
    let (mut task, channel, sender) = receiver(8);
    let (k0, k2) = (key_in(0, 0), key_in(2, 0));
    // A forwarded record of bucket 2 waits; its bucket is asked for first.
    let out = task.on(TaskEvent::Peer {
        from: sender,
        message: DrrsPeer::Records { epoch: EPOCH, input: 0, records: vec![rec(&k2, 3)] },
    });
    assert_eq!(
        out,
        vec![TaskAction::SendToPeer {
            to: sender,
            message: DrrsPeer::Prioritize { epoch: EPOCH, bucket: 2 }
        }]
    );
    // After the switch: a direct record of bucket 2 waits behind it, bucket 0 is processed.
    task.on(TaskEvent::Marker { channel, epoch: EPOCH });
    let out = task.on(TaskEvent::Records { channel, records: vec![rec(&k2, 5), rec(&k0, 6)] });
    assert_eq!(processed(&out), vec![6]);
    // The state arrives: the forwarded record goes; the direct one still waits for the close.
    let out = task.on(TaskEvent::BucketArrived { from: sender, epoch: EPOCH, bucket: 2 });
    assert_eq!(processed(&out), vec![3]);
    task.on(TaskEvent::BucketArrived { from: sender, epoch: EPOCH, bucket: 3 });
    let out = task.on(TaskEvent::Peer { from: sender, message: DrrsPeer::Close { epoch: EPOCH } });
    assert_eq!(processed(&out), vec![5]);
    assert_eq!(out.last(), Some(&TaskAction::Ack { epoch: EPOCH, ack: TaskAck::Done }));
}

/// Direct records that would wait fill only their part of the buffer (the bound less two
/// subscales' windows): past it the receiver refuses them — the rest of the batch stays at the
/// channel's head — while records of its own buckets still go in, and it takes them again once the
/// buffer drained to the low-water mark.
#[test]
fn a_receiver_refuses_waiting_direct_records_past_its_buffer_until_the_low_water_mark() {
    let (mut task, channel, sender) = receiver(16);
    task.on(TaskEvent::Marker { channel, epoch: EPOCH });
    let (k0, k2, k3) = (key_in(0, 0), key_in(2, 0), key_in(3, 0));
    // Window 4 per sender, two subscales' worth reserved: 8 direct records may wait.
    let batch: Vec<Record> =
        (0..5).map(|t| rec(&k2, 10 + t)).chain((0..5).map(|t| rec(&k3, 20 + t))).collect();
    assert_eq!(task.data_room(channel, &batch), 8);
    task.on(TaskEvent::Records { channel, records: batch[..8].to_vec() });
    assert_eq!((task.queued_records(), task.is_paused()), (8, true));
    assert_eq!(task.data_room(channel, &batch[8..]), 0, "a record that would wait is refused");
    assert_eq!(task.data_room(channel, &[rec(&k0, 30)]), 1, "a record of an owned bucket goes in");
    // State alone frees nothing: direct records also wait for the close (per-key order).
    let out = task.on(TaskEvent::BucketArrived { from: sender, epoch: EPOCH, bucket: 2 });
    assert!(processed(&out).is_empty() && task.is_paused());
    // The close releases bucket 2's five; three of bucket 3 still wait: at most half of 8.
    let out = task.on(TaskEvent::Peer { from: sender, message: DrrsPeer::Close { epoch: EPOCH } });
    assert_eq!(processed(&out), vec![10, 11, 12, 13, 14]);
    assert_eq!((task.queued_records(), task.is_paused()), (3, false));
    assert_eq!(task.data_room(channel, &batch[8..]), 2);
}

/// Forwarded records count against the wait buffer too: the receiver lends its sender a window
/// in `Open`, refuses records past it as a protocol error, and gives credit back as it processes
/// them — so a sender that forwards faster than the receiver gets state stops, and its backlog
/// waits upstream.
#[test]
fn forwarded_records_are_bounded_by_the_credit_the_receiver_lends() {
    let (mut task, _, sender) = receiver(16);
    let k2 = key_in(2, 0);
    let forwarded = |n: u64| DrrsPeer::Records {
        epoch: EPOCH,
        input: 0,
        records: (0..n).map(|t| rec(&k2, 3 + t)).collect(),
    };
    let out = task.on(TaskEvent::Peer { from: sender, message: forwarded(5) });
    assert!(matches!(out[..], [TaskAction::Error(_)]), "five past a window of four: {out:?}");
    task.on(TaskEvent::Peer { from: sender, message: forwarded(4) });
    assert_eq!(task.queued_records(), 4);
    assert!(task.queued_records() <= task.hold_bound());
    let out = task.on(TaskEvent::BucketArrived { from: sender, epoch: EPOCH, bucket: 2 });
    assert_eq!(processed(&out), vec![3, 4, 5, 6]);
    let credit = DrrsPeer::Credit { epoch: EPOCH, records: 4 };
    assert!(out.contains(&TaskAction::SendToPeer { to: sender, message: credit }), "{out:?}");
    task.on(TaskEvent::Peer { from: sender, message: forwarded(4) });
    assert_eq!(task.queued_records(), 0, "bucket 2 is here: forwarded records go straight in");
}

/// A sender takes a batch only as far as its credit reaches: the first record it could not
/// forward and everything after it stay at the channel's head until credit comes back.
#[test]
fn a_sender_takes_records_to_forward_only_with_credit() {
    let (up, me, to) = (TaskId::new(OperatorId(0), 0), TaskId::new(OP, 0), TaskId::new(OP, 1));
    let channel = InputChannel { input: 0, from: up };
    let owned = BTreeSet::from([0, 1, 2, 3]);
    let mut task =
        DrrsTask::new(TaskConfig { id: me, num_buckets: 4, owned, inputs: BTreeSet::from([channel]) });
    let sub = Subscale {
        operator: OP,
        epoch: EPOCH,
        index: 0,
        count: 1,
        moves: BTreeMap::from([((me, to), vec![2])]),
        upstreams: BTreeSet::from([up]),
        wait_records: 16,
    };
    task.on(TaskEvent::Start(Arc::new(sub)));
    task.on(TaskEvent::Peer {
        from: to,
        message: DrrsPeer::Open { epoch: EPOCH, watermark: None, credit: 1 },
    });
    let (k0, k2) = (key_in(0, 0), key_in(2, 0));
    let batch = vec![rec(&k2, 1), rec(&k0, 2), rec(&k2, 3), rec(&k0, 4)];
    assert_eq!(task.data_room(channel, &batch), 2, "one forward, one kept record");
    let out = task.on(TaskEvent::Records { channel, records: batch[..2].to_vec() });
    assert_eq!(processed(&out), vec![2]);
    assert_eq!(task.data_room(channel, &batch[2..]), 0);
    task.on(TaskEvent::Peer { from: to, message: DrrsPeer::Credit { epoch: EPOCH, records: 1 } });
    assert_eq!(task.data_room(channel, &batch[2..]), 2);
}

#[test]
fn the_watermark_waits_for_every_moved_bucket() {
    let (mut task, channel, sender) = receiver(8);
    task.on(TaskEvent::Marker { channel, epoch: EPOCH });
    let out = task.on(TaskEvent::Watermark { channel, time: 10 });
    assert!(!out.iter().any(|a| matches!(a, TaskAction::EmitWatermark(_))), "{out:?}");
    task.on(TaskEvent::Peer { from: sender, message: DrrsPeer::Watermark { epoch: EPOCH, time: 9 } });
    task.on(TaskEvent::BucketArrived { from: sender, epoch: EPOCH, bucket: 2 });
    let out = task.on(TaskEvent::BucketArrived { from: sender, epoch: EPOCH, bucket: 3 });
    assert!(out.contains(&TaskAction::EmitWatermark(9)), "{out:?}");
}

#[test]
fn a_sender_fast_forwards_then_pushes_requested_buckets_first() {
    let (up, me, to) = (TaskId::new(OperatorId(0), 0), TaskId::new(OP, 0), TaskId::new(OP, 1));
    let channel = InputChannel { input: 0, from: up };
    let owned = BTreeSet::from([0, 1, 2, 3]);
    let mut task =
        DrrsTask::new(TaskConfig { id: me, num_buckets: 4, owned, inputs: BTreeSet::from([channel]) });
    task.on(TaskEvent::Watermark { channel, time: 4 });
    let sub = Subscale {
        operator: OP,
        epoch: EPOCH,
        index: 0,
        count: 1,
        moves: BTreeMap::from([((me, to), vec![1, 2, 3])]),
        upstreams: BTreeSet::from([up]),
        wait_records: 8,
    };
    task.on(TaskEvent::Start(Arc::new(sub)));
    // The receiver emitted 6: the sender waits until its own event time caught up.
    let out = task.on(TaskEvent::Peer {
        from: to,
        message: DrrsPeer::Open { epoch: EPOCH, watermark: Some(6), credit: 8 },
    });
    assert!(
        out.iter()
            .all(|a| !matches!(a, TaskAction::SendToPeer { message: DrrsPeer::FastForward { .. }, .. }))
    );
    let out = task.on(TaskEvent::Watermark { channel, time: 7 });
    assert_eq!(out[0], TaskAction::DetachTimers { buckets: vec![1, 2, 3], up_to: Some(7) });
    assert_eq!(
        out[1],
        TaskAction::SendToPeer { to, message: DrrsPeer::FastForward { epoch: EPOCH, watermark: Some(7) } }
    );
    assert_eq!(out[2], TaskAction::PushBucket { to, epoch: EPOCH, bucket: 1 });
    task.on(TaskEvent::Peer { from: to, message: DrrsPeer::Prioritize { epoch: EPOCH, bucket: 3 } });
    let out = task.on(TaskEvent::Pushed { to, bucket: 1 });
    assert_eq!(out, vec![TaskAction::PushBucket { to, epoch: EPOCH, bucket: 3 }]);
    // A record of a moved bucket is forwarded, one of a kept bucket processed.
    let out =
        task.on(TaskEvent::Records { channel, records: vec![rec(&key_in(2, 0), 8), rec(&key_in(0, 0), 9)] });
    assert!(matches!(&out[0], TaskAction::SendToPeer { message: DrrsPeer::Records { .. }, .. }), "{out:?}");
    assert_eq!(processed(&out), vec![9]);
}

/// A hang once seen under DRRS: a task a reconfiguration created learned its channels when deployed; an
/// upstream finished before the task's first subscale, so it never opens its channel there and
/// the coordinator tells nobody. The task must not wait for its marker.
#[test]
fn a_new_task_expects_nothing_from_an_upstream_that_finished_before_its_first_subscale() {
    let (up0, up1) = (TaskId::new(OperatorId(0), 0), TaskId::new(OperatorId(0), 1));
    let (sender, me) = (TaskId::new(OP, 0), TaskId::new(OP, 1));
    let (c0, c1) = (InputChannel { input: 0, from: up0 }, InputChannel { input: 0, from: up1 });
    let config = TaskConfig { id: me, num_buckets: 4, owned: BTreeSet::new(), inputs: BTreeSet::new() };
    let mut task = DrrsTask::new(config);
    task.add_input(c0);
    task.add_input(c1);
    let sub = Subscale {
        operator: OP,
        epoch: EPOCH,
        index: 0,
        count: 1,
        moves: BTreeMap::from([((sender, me), vec![3])]),
        upstreams: BTreeSet::from([up0]),
        wait_records: 8,
    };
    task.on(TaskEvent::Start(Arc::new(sub)));
    assert_eq!(task.inputs_from(up1), vec![], "up1 finished: no channel from it");
    let ff = DrrsPeer::FastForward { epoch: EPOCH, watermark: Some(2) };
    task.on(TaskEvent::Peer { from: sender, message: ff });
    task.on(TaskEvent::Marker { channel: c0, epoch: EPOCH });
    task.on(TaskEvent::BucketArrived { from: sender, epoch: EPOCH, bucket: 3 });
    let out = task.on(TaskEvent::Peer { from: sender, message: DrrsPeer::Close { epoch: EPOCH } });
    assert!(out.contains(&TaskAction::Ack { epoch: EPOCH, ack: TaskAck::Done }), "{out:?}");
    assert!(!task.in_transition());
}

/// Per-batch latency: a `Process` of records that waited for their bucket carries the intake tag
/// the oldest of them was taken with, so the runtime's latency includes the wait; records
/// processed at once carry the event's tag. `queued_records` counts the wait buffer.
#[test]
fn process_tags_name_when_the_oldest_record_was_taken() {
    let (mut task, channel, sender) = receiver(8);
    let (k0, k2) = (key_in(0, 0), key_in(2, 0));
    task.on(TaskEvent::Marker { channel, epoch: EPOCH });
    task.set_intake_tag(10);
    let out = task.on(TaskEvent::Records { channel, records: vec![rec(&k2, 5), rec(&k0, 6)] });
    assert_eq!((processed(&out), task.take_process_tags()), (vec![6], vec![10]));
    assert_eq!(task.queued_records(), 1);
    task.set_intake_tag(20);
    for bucket in [2, 3] {
        task.on(TaskEvent::BucketArrived { from: sender, epoch: EPOCH, bucket });
    }
    task.set_intake_tag(30);
    let out = task.on(TaskEvent::Peer { from: sender, message: DrrsPeer::Close { epoch: EPOCH } });
    assert_eq!(processed(&out), vec![5]);
    assert_eq!(task.take_process_tags(), vec![10], "the record waited since it was taken at 10");
    assert_eq!(task.queued_records(), 0);
    let out = task.on(TaskEvent::Records { channel, records: vec![rec(&k2, 7)] });
    assert_eq!((processed(&out), task.take_process_tags()), (vec![7], vec![30]));
}

/// A `Begin` among coordinator steps: the subscale's index and its pairs.
type Begun = (usize, Vec<(TaskId, TaskId)>);

/// The `Begin`s and `Switch`es (epoch, last) among coordinator steps.
fn coordinator_steps(steps: &[super::DrrsStep]) -> (Vec<Begun>, Vec<(u64, bool)>) {
    use super::{DrrsControl, DrrsStep};
    let (mut begins, mut switches) = (Vec::new(), Vec::new());
    for step in steps {
        if let DrrsStep::Broadcast(crate::CoordinatorMessage::Drrs(control)) = step {
            match control.as_ref() {
                DrrsControl::Begin { subscale, .. } => {
                    begins.push((subscale.index, subscale.moves.keys().copied().collect()))
                }
                DrrsControl::Switch { epoch, last, .. } => switches.push((*epoch, *last)),
            }
        }
    }
    (begins, switches)
}

#[test]
fn overlapping_subscales_run_at_most_two_per_task_and_switch_in_order() {
    use super::{DrrsCoordinator, DrrsOptions, DrrsSchedule, DrrsStep, subscale_epoch};
    let t = |i| TaskId::new(OP, i);
    let up = TaskId::new(OperatorId(0), 0);
    // 1 → 5 over 10 buckets: four pairs, all from t0.
    let old = vec![t(0); 10];
    let new: Vec<TaskId> = (0..10).map(|b| t(b / 2)).collect();
    let all: Vec<TaskId> = (0..5).map(t).collect();
    let options = DrrsOptions { schedule: DrrsSchedule::Overlapping, ..DrrsOptions::default() };
    let mut c = DrrsCoordinator::new(options);
    let out = c.start(OP, 1, old.clone(), new.clone(), BTreeSet::from([up])).expect("start");
    // One subscale per pair; t0 sends in two at once, not more.
    let (begins, _) = coordinator_steps(&out);
    assert_eq!(begins, vec![(0, vec![(t(0), t(1))]), (1, vec![(t(0), t(2))])]);
    assert_eq!(c.waiting_for().len(), 2 * all.len(), "every task takes part in both");
    let e = |i| subscale_epoch(1, i);
    let ack = |c: &mut DrrsCoordinator, i: usize, ack: TaskAck| {
        all.iter().flat_map(|&task| c.on_ack(task, e(i), &ack).expect("ack")).collect::<Vec<_>>()
    };
    // Subscale 1 is ready first: its switch waits for subscale 0's, then both go, in order.
    assert_eq!(coordinator_steps(&ack(&mut c, 1, TaskAck::PeerReady)), (vec![], vec![]));
    let (_, switches) = coordinator_steps(&ack(&mut c, 0, TaskAck::PeerReady));
    assert_eq!(switches, vec![(e(0), false), (e(1), false)]);
    // Subscale 1 completes first: the third begins (t0 is in two again), then the fourth.
    assert_eq!(coordinator_steps(&ack(&mut c, 1, TaskAck::Done)).0, vec![(2, vec![(t(0), t(3))])]);
    assert_eq!(coordinator_steps(&ack(&mut c, 0, TaskAck::Done)).0, vec![(3, vec![(t(0), t(4))])]);
    assert_eq!(coordinator_steps(&ack(&mut c, 3, TaskAck::PeerReady)), (vec![], vec![]));
    let (_, switches) = coordinator_steps(&ack(&mut c, 2, TaskAck::PeerReady));
    assert_eq!(switches, vec![(e(2), false), (e(3), true)]);
    ack(&mut c, 2, TaskAck::Done);
    assert!(ack(&mut c, 3, TaskAck::Done).contains(&DrrsStep::Completed));
    assert!(c.is_idle());
    // The ported schedule runs the same moves one subscale at a time, each with every pair.
    let mut ported = DrrsCoordinator::new(DrrsOptions::default());
    let (begins, _) = coordinator_steps(&ported.start(OP, 1, old, new, BTreeSet::from([up])).expect("start"));
    assert_eq!(begins.len(), 1);
    assert_eq!(begins[0].1.len(), 4);
    // A subscale count is the ported schedule's knob: the overlapping one refuses it.
    let options = DrrsOptions { schedule: DrrsSchedule::Overlapping, subscales: 2, ..DrrsOptions::default() };
    let err = DrrsCoordinator::new(options).start(OP, 1, vec![t(0); 2], vec![t(0), t(1)], BTreeSet::new());
    assert!(err.expect_err("refused").contains("subscales"));
}

/// The overlapping schedule cuts pairs into subscales of at least 7 buckets (about two per pair)
/// and begins them as the original DRRS's `MinHoldScheduler` picks: the least-loaded task first,
/// new tasks before old ones, and of its pairs the one with the most subscales left — not in
/// pair order (with pair order both assertions below fail).
#[test]
fn overlapping_subscales_begin_least_loaded_task_first() {
    use super::{DrrsCoordinator, DrrsOptions, DrrsSchedule};
    let t = |i| TaskId::new(OP, i);
    let up = BTreeSet::from([TaskId::new(OperatorId(0), 0)]);
    let options = DrrsOptions { schedule: DrrsSchedule::Overlapping, ..DrrsOptions::default() };
    let pairs = |begins: Vec<Begun>| begins.into_iter().map(|(i, p)| (i, p[0], p.len())).collect::<Vec<_>>();
    // 1 → 3 over 42 buckets: two pairs of 14, each cut in two. t1 (new, idle) takes its first
    // half, then t2 (new, idle) — not t1's second half, which pair order would begin next.
    let old = vec![t(0); 42];
    let new: Vec<TaskId> = (0..42).map(|b| t(b / 14)).collect();
    let mut c = DrrsCoordinator::new(options);
    let (begins, _) = coordinator_steps(&c.start(OP, 1, old, new, up.clone()).expect("start"));
    assert_eq!(pairs(begins), vec![(0, (t(0), t(1)), 1), (1, (t(0), t(2)), 1)]);
    // t2 receives 7 buckets from t0 and 14 (two subscales) from t1: t1's pair goes first, as it
    // has more subscales left; then t0's, t2 being the only new task.
    let old: Vec<TaskId> = (0..28).map(|b| if b < 7 { t(0) } else { t(1) }).collect();
    let new: Vec<TaskId> = (0..28).map(|b| if (7..14).contains(&b) { t(1) } else { t(2) }).collect();
    let mut c = DrrsCoordinator::new(options);
    let (begins, _) = coordinator_steps(&c.start(OP, 1, old, new, up).expect("start"));
    assert_eq!(pairs(begins), vec![(0, (t(1), t(2)), 1), (1, (t(0), t(2)), 1)]);
}

/// A task in two running subscales at once (the overlapping schedule): it sends to one receiver
/// and receives from another, each subscale finishing on its own.
#[test]
fn a_task_runs_two_subscales_at_once() {
    let up = TaskId::new(OperatorId(0), 0);
    let (left, me, right) = (TaskId::new(OP, 0), TaskId::new(OP, 1), TaskId::new(OP, 2));
    let channel = InputChannel { input: 0, from: up };
    let mut task = DrrsTask::new(TaskConfig {
        id: me,
        num_buckets: 4,
        owned: BTreeSet::from([1]),
        inputs: BTreeSet::from([channel]),
    });
    let sub = |index: usize, moves| {
        Arc::new(Subscale {
            operator: OP,
            epoch: EPOCH + index as u64,
            index,
            count: 2,
            moves,
            upstreams: BTreeSet::from([up]),
            wait_records: 8,
        })
    };
    // Subscale 0: bucket 0 comes from `left`; subscale 1: bucket 1 goes to `right`.
    task.on(TaskEvent::Start(sub(0, BTreeMap::from([((left, me), vec![0])]))));
    task.on(TaskEvent::Start(sub(1, BTreeMap::from([((me, right), vec![1])]))));
    assert_eq!((task.running_subscales(), task.moving_subscales()), (2, 2));
    let out = task.on(TaskEvent::Peer {
        from: right,
        message: DrrsPeer::Open { epoch: EPOCH + 1, watermark: None, credit: 8 },
    });
    assert!(out.contains(&TaskAction::PushBucket { to: right, epoch: EPOCH + 1, bucket: 1 }), "{out:?}");
    // A record of bucket 0 from upstream waits for subscale 0's state, in subscale 0.
    task.on(TaskEvent::Peer { from: left, message: DrrsPeer::FastForward { epoch: EPOCH, watermark: None } });
    let k0 = key_in(0, 0);
    let out = task.on(TaskEvent::Records { channel, records: vec![rec(&k0, 5)] });
    assert_eq!(
        out,
        vec![TaskAction::SendToPeer { to: left, message: DrrsPeer::Prioritize { epoch: EPOCH, bucket: 0 } }]
    );
    // Subscale 1 finishes on its own while subscale 0 still waits for its bucket.
    task.on(TaskEvent::Pushed { to: right, bucket: 1 });
    task.on(TaskEvent::Marker { channel, epoch: EPOCH });
    let out = task.on(TaskEvent::Marker { channel, epoch: EPOCH + 1 });
    assert!(
        out.contains(&TaskAction::SendToPeer { to: right, message: DrrsPeer::Close { epoch: EPOCH + 1 } })
    );
    let out = task.on(TaskEvent::Peer { from: right, message: DrrsPeer::Received { epoch: EPOCH + 1 } });
    assert!(out.contains(&TaskAction::Ack { epoch: EPOCH + 1, ack: TaskAck::Done }), "{out:?}");
    assert_eq!(task.running_subscales(), 1);
    // Subscale 0's bucket and close arrive: the record is processed and it is done too.
    task.on(TaskEvent::Peer { from: left, message: DrrsPeer::Close { epoch: EPOCH } });
    let out = task.on(TaskEvent::BucketArrived { from: left, epoch: EPOCH, bucket: 0 });
    assert_eq!(processed(&out), vec![5]);
    assert!(out.contains(&TaskAction::Ack { epoch: EPOCH, ack: TaskAck::Done }), "{out:?}");
    assert!(!task.in_transition());
}
