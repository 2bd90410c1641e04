//! Unit tests of the stop-and-restart task cores: phase order, acks and the errors each core
//! refuses with.

use std::collections::BTreeMap;

use koala_types::OperatorId;

use super::*;
use crate::control::{Deployment, Protocol};

const OP: OperatorId = OperatorId(1);

fn task(index: u32) -> TaskId {
    TaskId::new(OP, index)
}

/// A plan of `epoch` for operator 1 with `moves` (from, to, buckets) and `created` tasks.
fn plan(epoch: Epoch, moves: &[(u32, u32, &[BucketId])], created: &[u32]) -> Arc<ReconfigPlan> {
    let mut deployment = Deployment::for_tests(
        BTreeMap::from([(OP, vec![0, 1, 2])]),
        BTreeMap::new(),
        8,
        Protocol::StopAndRestart,
    );
    deployment.epoch = epoch;
    Arc::new(ReconfigPlan {
        epoch,
        operator: OP,
        deployment,
        moves: moves.iter().map(|(from, to, b)| ((task(*from), task(*to)), b.to_vec())).collect(),
        upstreams: vec![],
        created: created.to_vec(),
        cancelled: vec![],
        retired: vec![],
    })
}

fn ack(epoch: Epoch, ack: TaskAck) -> TargetAction {
    TargetAction::Ack { epoch, ack }
}

/// Prepare, then the coordinator's Drain (it comes once every task is prepared).
fn prepare(core: &mut TargetCore<u32>, plan: &Arc<ReconfigPlan>, inputs: &[u32]) -> Vec<TargetAction> {
    let mut actions = core.on(TargetEvent::Prepare { plan: plan.clone(), inputs: inputs.to_vec() });
    if !actions.iter().any(|a| matches!(a, TargetAction::Error(_))) {
        actions.extend(core.on(TargetEvent::Drain { epoch: plan.epoch }));
    }
    actions
}

/// A task whose inputs all ended awaits no marker, but sends only after the Drain: before
/// it, a receiver may not have seen its Prepare.
#[test]
fn state_waits_for_the_drain() {
    let p = plan(1, &[(0, 1, &[3])], &[]);
    let mut core: TargetCore<u32> = TargetCore::new(task(0));
    let actions = core.on(TargetEvent::Prepare { plan: p.clone(), inputs: vec![] });
    assert_eq!(actions, vec![ack(1, TaskAck::Prepared)], "no state before the Drain");
    let moves = vec![(task(1), vec![3])];
    assert_eq!(core.on(TargetEvent::Drain { epoch: 1 }), vec![TargetAction::SendState { epoch: 1, moves }]);
    assert_eq!(core.on(TargetEvent::Drain { epoch: 1 }), vec![], "a Drain after the part is done");
    assert_eq!(
        error(core.on(TargetEvent::Drain { epoch: 2 })),
        StopRestartError::DrainWithoutPrepare { epoch: 2 }
    );
}

fn marker(channel: u32, epoch: Epoch) -> TargetEvent<u32> {
    TargetEvent::Marker { channel, epoch }
}

fn error(actions: Vec<TargetAction>) -> StopRestartError {
    match &actions[..] {
        [TargetAction::Error(e)] => e.clone(),
        other => panic!("expected one error, got {other:?}"),
    }
}

#[test]
fn a_sender_sends_once_every_marker_arrived() {
    let p = plan(1, &[(0, 1, &[3, 4]), (0, 2, &[5])], &[]);
    let mut core = TargetCore::new(task(0));
    assert_eq!(prepare(&mut core, &p, &[10, 11]), vec![ack(1, TaskAck::Prepared)]);
    assert_eq!((core.busy(), core.epoch()), (true, Some(1)));
    assert_eq!(core.on(marker(10, 1)), vec![]);
    assert!(core.busy(), "a marker is still awaited");
    let moves = vec![(task(1), vec![3, 4]), (task(2), vec![5])];
    assert_eq!(core.on(marker(11, 1)), vec![TargetAction::SendState { epoch: 1, moves }]);
    assert_eq!((core.busy(), core.epoch()), (false, None));
}

#[test]
fn a_receiver_acks_once_every_sender_ended() {
    let p = plan(1, &[(0, 2, &[3]), (1, 2, &[4])], &[]);
    let mut core = TargetCore::new(task(2));
    assert_eq!(prepare(&mut core, &p, &[10]), vec![ack(1, TaskAck::Prepared)]);
    // An old task also passes the markers; it sends nothing but still reports (0 bytes).
    assert_eq!(core.on(marker(10, 1)), vec![TargetAction::SendState { epoch: 1, moves: vec![] }]);
    assert!(core.busy(), "state still arrives");
    assert_eq!(core.on(TargetEvent::StateChunk { from: task(0), epoch: 1 }), vec![]);
    assert_eq!(core.on(TargetEvent::StateEnd { from: task(0), epoch: 1 }), vec![]);
    assert_eq!(core.on(TargetEvent::StateChunk { from: task(1), epoch: 1 }), vec![]);
    assert_eq!(
        core.on(TargetEvent::StateEnd { from: task(1), epoch: 1 }),
        vec![ack(1, TaskAck::StateReceived)]
    );
    assert!(!core.busy());
}

#[test]
fn a_created_task_awaits_no_marker_and_only_receives() {
    let p = plan(1, &[(0, 2, &[3])], &[2]);
    let mut core = TargetCore::new(task(2));
    assert_eq!(prepare(&mut core, &p, &[10]), vec![ack(1, TaskAck::Prepared)], "no SendState");
    assert!(core.busy());
    assert_eq!(core.on(TargetEvent::EndOfStream { channel: 10 }), vec![], "no channel is awaited");
    assert_eq!(
        core.on(TargetEvent::StateEnd { from: task(0), epoch: 1 }),
        vec![ack(1, TaskAck::StateReceived)]
    );
    assert!(!core.busy());
    // A created task nobody sends to is done at Prepare.
    let mut idle = TargetCore::new(task(1));
    let p = plan(2, &[(0, 2, &[3])], &[1, 2]);
    assert_eq!(prepare(&mut idle, &p, &[]), vec![ack(2, TaskAck::Prepared)]);
    assert!(!idle.busy());
}

#[test]
fn a_task_that_sends_and_receives_acks_both_in_either_order() {
    let p = plan(1, &[(0, 1, &[3]), (1, 0, &[4])], &[]);
    let mut core = TargetCore::new(task(0));
    prepare(&mut core, &p, &[10]);
    // State arrives before this task's own marker.
    assert_eq!(
        core.on(TargetEvent::StateEnd { from: task(1), epoch: 1 }),
        vec![ack(1, TaskAck::StateReceived)]
    );
    assert!(core.busy(), "its own marker is still awaited");
    let send = TargetAction::SendState { epoch: 1, moves: vec![(task(1), vec![3])] };
    assert_eq!(core.on(marker(10, 1)), vec![send.clone()]);
    assert!(!core.busy());

    let mut core = TargetCore::new(task(1));
    prepare(&mut core, &p, &[10]);
    assert_eq!(
        core.on(marker(10, 1)),
        vec![TargetAction::SendState { epoch: 1, moves: vec![(task(0), vec![4])] }]
    );
    assert!(core.busy(), "state still arrives");
    assert_eq!(
        core.on(TargetEvent::StateEnd { from: task(0), epoch: 1 }),
        vec![ack(1, TaskAck::StateReceived)]
    );
    assert!(!core.busy());
}

#[test]
fn inputs_ended_at_prepare_send_at_once() {
    let p = plan(1, &[(0, 1, &[3])], &[]);
    let mut core = TargetCore::new(task(0));
    let send = TargetAction::SendState { epoch: 1, moves: vec![(task(1), vec![3])] };
    assert_eq!(prepare(&mut core, &p, &[]), vec![ack(1, TaskAck::Prepared), send]);
    assert!(!core.busy());
    // A task with no part at all still reports StateSent (0 bytes): the phase driver waits
    // for it from every old task.
    let mut bystander = TargetCore::new(task(2));
    let nothing = TargetAction::SendState { epoch: 1, moves: vec![] };
    assert_eq!(prepare(&mut bystander, &p, &[]), vec![ack(1, TaskAck::Prepared), nothing]);
    assert!(!bystander.busy());
}

#[test]
fn an_end_of_stream_counts_as_the_marker() {
    let p = plan(1, &[(0, 1, &[3])], &[]);
    let mut core = TargetCore::new(task(0));
    prepare(&mut core, &p, &[10, 11]);
    assert_eq!(core.on(marker(10, 1)), vec![]);
    let send = TargetAction::SendState { epoch: 1, moves: vec![(task(1), vec![3])] };
    assert_eq!(core.on(TargetEvent::EndOfStream { channel: 11 }), vec![send]);
    // The end of a channel whose marker already arrived, or outside a reconfiguration, is not an error.
    assert_eq!(core.on(TargetEvent::EndOfStream { channel: 10 }), vec![]);
}

#[test]
fn markers_of_other_epochs_pass_through() {
    let mut core = TargetCore::new(task(0));
    assert_eq!(core.on(marker(10, 7)), vec![], "idle: another operator's reconfiguration");
    let p = plan(2, &[(0, 1, &[3])], &[]);
    prepare(&mut core, &p, &[10]);
    assert_eq!(core.on(marker(10, 1)), vec![], "the switch marker of an earlier epoch");
    assert!(core.busy());
    assert!(matches!(core.on(marker(10, 2))[..], [TargetAction::SendState { .. }]));
    assert_eq!(core.on(marker(10, 2)), vec![], "the switch marker of a finished epoch");
}

#[test]
fn a_second_marker_of_the_running_epoch_is_an_error() {
    let p = plan(1, &[(0, 1, &[3])], &[]);
    let mut core = TargetCore::new(task(0));
    prepare(&mut core, &p, &[10, 11]);
    core.on(marker(10, 1));
    let e = error(core.on(marker(10, 1)));
    assert_eq!(e, StopRestartError::UnexpectedMarker { epoch: 1, channel: "10".into() });
    assert_eq!(
        error(core.on(marker(12, 1))),
        StopRestartError::UnexpectedMarker { epoch: 1, channel: "12".into() }
    );
    assert!(core.busy(), "unchanged: channel 11 is still awaited");
    assert!(matches!(core.on(marker(11, 1))[..], [TargetAction::SendState { .. }]));

    // A created task owes no marker, and the markers the routing switch sends on its new
    // channels (Koala's stateless `Switch` may deliver one before the `HandOver` command)
    // pass through.
    let p = plan(2, &[(0, 2, &[3])], &[2]);
    let mut created = TargetCore::new(task(2));
    created.on(TargetEvent::Prepare { plan: p.clone(), inputs: vec![10] });
    assert_eq!(created.on(marker(10, 2)), vec![]);
    assert!(created.busy(), "state still arrives");
    // A created task nobody sends to is done at its `Prepared`, before any `HandOver`.
    let mut idle = TargetCore::new(task(1));
    let p = plan(2, &[(0, 2, &[3])], &[1, 2]);
    let actions = idle.on(TargetEvent::Prepare { plan: p, inputs: vec![10] });
    assert_eq!(actions, vec![ack(2, TaskAck::Prepared)]);
    assert!(!idle.busy());
    assert_eq!(idle.on(marker(10, 2)), vec![]);
    assert_eq!(idle.on(TargetEvent::Drain { epoch: 2 }), vec![]);
}

#[test]
fn a_prepare_while_running_or_stale_or_foreign_is_an_error() {
    let p = plan(2, &[(0, 1, &[3])], &[]);
    let mut core = TargetCore::new(task(0));
    prepare(&mut core, &p, &[10]);
    let e = error(prepare(&mut core, &plan(3, &[], &[]), &[10]));
    assert_eq!(e, StopRestartError::PrepareWhileRunning { running: 2, got: 3 });
    assert_eq!(core.epoch(), Some(2), "unchanged");
    core.on(marker(10, 2));
    assert_eq!(error(prepare(&mut core, &p, &[10])), StopRestartError::StaleEpoch { got: 2, last: 2 });
    assert_eq!(
        error(prepare(&mut core, &plan(1, &[], &[]), &[10])),
        StopRestartError::StaleEpoch { got: 1, last: 2 }
    );
    let mut other = TargetCore::new(TaskId::new(OperatorId(5), 0));
    let e = error(prepare(&mut other, &p, &[10]));
    assert_eq!(e, StopRestartError::OtherOperator { epoch: 2, operator: OP });
    assert!(!other.busy());
    // A newer epoch after the last one finished is fine.
    assert_eq!(prepare(&mut core, &plan(3, &[], &[]), &[10]), vec![ack(3, TaskAck::Prepared)]);
}

#[test]
fn unexpected_state_is_an_error() {
    let mut core = TargetCore::new(task(1));
    let chunk = |from, epoch| TargetEvent::StateChunk { from, epoch };
    let end = |from, epoch| TargetEvent::StateEnd { from, epoch };
    assert_eq!(
        error(core.on(chunk(task(0), 1))),
        StopRestartError::StateOutsideReconfiguration { from: task(0), epoch: 1 }
    );
    assert_eq!(
        error(core.on(end(task(0), 1))),
        StopRestartError::StateOutsideReconfiguration { from: task(0), epoch: 1 }
    );
    let p = plan(2, &[(0, 1, &[3])], &[]);
    prepare(&mut core, &p, &[10]);
    assert_eq!(
        error(core.on(chunk(task(0), 1))),
        StopRestartError::StateOfOtherEpoch { from: task(0), got: 1, running: 2 }
    );
    assert_eq!(error(core.on(chunk(task(2), 2))), StopRestartError::NotASender { from: task(2), epoch: 2 });
    assert_eq!(error(core.on(end(task(2), 2))), StopRestartError::NotASender { from: task(2), epoch: 2 });
    // Its own marker is still awaited, so the part keeps running after the sender ended.
    assert_eq!(core.on(end(task(0), 2)), vec![ack(2, TaskAck::StateReceived)]);
    assert_eq!(
        error(core.on(chunk(task(0), 2))),
        StopRestartError::StateAfterEnd { from: task(0), epoch: 2 }
    );
    assert_eq!(error(core.on(end(task(0), 2))), StopRestartError::StateAfterEnd { from: task(0), epoch: 2 });
    assert!(matches!(core.on(marker(10, 2))[..], [TargetAction::SendState { .. }]));
    // Done: state now comes from outside a reconfiguration.
    assert!(matches!(
        error(core.on(chunk(task(0), 2))),
        StopRestartError::StateOutsideReconfiguration { .. }
    ));
}

/// Remote mode: the sender flushes instead of sending; a receiver may not read a moved
/// bucket until the sender's flush is acknowledged (`StateEnd`), nor ack `StateReceived`
/// (which the phase driver waits for before it resumes the upstreams); state chunks are
/// refused, timers pass.
#[test]
fn remote_mode_flushes_and_a_receiver_reads_only_after_the_flush() {
    let p = plan(1, &[(0, 1, &[3]), (2, 1, &[5])], &[]);
    let mut sender = TargetCore::new_remote(task(0));
    let mut receiver = TargetCore::new_remote(task(1));
    assert!(receiver.may_read(3), "no reconfiguration: everything it owns is readable");
    prepare(&mut sender, &p, &[10]);
    prepare(&mut receiver, &p, &[10]);
    assert!(!receiver.may_read(3) && !receiver.may_read(5), "incoming buckets wait for flushes");
    assert!(receiver.may_read(4), "a bucket that does not move is readable");
    let flush = TargetAction::Flush { epoch: 1, moves: vec![(task(1), vec![3])] };
    assert_eq!(sender.on(marker(10, 1)), vec![flush], "a flush, not a state transfer");
    // The receiver's own marker: it gives nothing away, so an empty flush (it still acks).
    assert_eq!(receiver.on(marker(10, 1)), vec![TargetAction::Flush { epoch: 1, moves: vec![] }]);
    let e = error(receiver.on(TargetEvent::StateChunk { from: task(0), epoch: 1 }));
    assert_eq!(e, StopRestartError::StateUnderRemote { from: task(0), epoch: 1 });
    assert!(!receiver.may_read(3), "unchanged by the refused chunk");
    assert_eq!(receiver.on(TargetEvent::TimersChunk { from: task(0), epoch: 1 }), vec![]);
    assert!(!receiver.may_read(3), "timers arrived, the flush is not acknowledged yet");
    assert_eq!(receiver.on(TargetEvent::StateEnd { from: task(0), epoch: 1 }), vec![]);
    assert!(receiver.may_read(3), "task 0 flushed bucket 3");
    assert!(!receiver.may_read(5), "task 2 has not flushed bucket 5: no StateReceived yet");
    assert_eq!(
        receiver.on(TargetEvent::StateEnd { from: task(2), epoch: 1 }),
        vec![ack(1, TaskAck::StateReceived)]
    );
    assert!(receiver.may_read(5) && !receiver.busy());
    // Under stop-and-restart the same gate holds until the state arrived.
    let mut sr = TargetCore::new(task(1));
    prepare(&mut sr, &p, &[]);
    assert!(!sr.may_read(3));
    assert_eq!(sr.on(TargetEvent::StateChunk { from: task(0), epoch: 1 }), vec![]);
    assert!(!sr.may_read(3));
    sr.on(TargetEvent::StateEnd { from: task(0), epoch: 1 });
    assert!(sr.may_read(3));
}

#[test]
fn an_upstream_drains_then_resumes() {
    let mut core = UpstreamCore::new();
    assert_eq!(core.paused(), None);
    assert_eq!(
        core.on(UpstreamEvent::Drain { epoch: 4 }),
        vec![
            UpstreamAction::MarkAndPause { epoch: 4 },
            UpstreamAction::Ack { epoch: 4, ack: TaskAck::Paused }
        ]
    );
    assert_eq!(core.paused(), Some(4));
    assert_eq!(
        core.on(UpstreamEvent::Resume { epoch: 4 }),
        vec![
            UpstreamAction::SwitchAndResume { epoch: 4 },
            UpstreamAction::Ack { epoch: 4, ack: TaskAck::Resumed }
        ]
    );
    assert_eq!(core.paused(), None);
    assert!(matches!(
        core.on(UpstreamEvent::Drain { epoch: 5 })[..],
        [UpstreamAction::MarkAndPause { .. }, _]
    ));
}

#[test]
fn an_upstream_refuses_what_does_not_follow_drain_then_resume() {
    let refused = |e| vec![UpstreamAction::Error(e)];
    let mut core = UpstreamCore::new();
    assert_eq!(
        core.on(UpstreamEvent::Resume { epoch: 4 }),
        refused(StopRestartError::ResumeWithoutDrain { epoch: 4 })
    );
    core.on(UpstreamEvent::Drain { epoch: 4 });
    assert_eq!(
        core.on(UpstreamEvent::Drain { epoch: 5 }),
        refused(StopRestartError::DrainWhilePaused { paused: 4, got: 5 })
    );
    assert_eq!(
        core.on(UpstreamEvent::Resume { epoch: 3 }),
        refused(StopRestartError::ResumeOfOtherEpoch { paused: 4, got: 3 })
    );
    assert_eq!(core.paused(), Some(4), "unchanged");
}
