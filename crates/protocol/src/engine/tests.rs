//! The engine's unit tests.

use super::*;

const SRC: OperatorId = OperatorId(0);
const AGG: OperatorId = OperatorId(1);
const ROLL: OperatorId = OperatorId(2);

fn t(op: OperatorId, i: u32) -> TaskId {
    TaskId::new(op, i)
}

/// src (2 tasks) → agg (keyed, 2 tasks) → roll (keyed, 1 task), 4 buckets.
fn engine(protocol: Protocol) -> Engine {
    let tasks = BTreeMap::from([(SRC, vec![0, 1]), (AGG, vec![0, 1]), (ROLL, vec![0])]);
    let routing = BTreeMap::from([(AGG, vec![0, 0, 1, 1]), (ROLL, vec![0, 0, 0, 0])]);
    let deployment = Deployment::for_tests(tasks, routing, 4, protocol);
    let inputs =
        BTreeMap::from([(SRC, BTreeSet::new()), (AGG, BTreeSet::from([SRC])), (ROLL, BTreeSet::from([AGG]))]);
    Engine::new(deployment, inputs).expect("engine")
}

/// `op` scaled out by one new task that takes bucket 3.
fn scale_out(e: &Engine, op: OperatorId, epoch: Epoch) -> (ReconfigPlan, Participants) {
    let mut d = e.deployment().clone();
    d.epoch = epoch;
    let old = assignment(&d, op);
    let new_index = d.tasks[&op].iter().max().map_or(0, |m| m + 1);
    d.tasks.get_mut(&op).expect("tasks").push(new_index);
    let mut routing = d.routing[&op].clone();
    routing[3] = new_index;
    d.routing.insert(op, routing);
    let moves = crate::moves_between(&old, &assignment(&d, op)).expect("moves");
    let who = Participants {
        stateful: true,
        old_targets: e.deployment().tasks[&op].iter().map(|i| t(op, *i)).collect(),
        consumers: vec![],
    };
    let plan = ReconfigPlan {
        epoch,
        operator: op,
        deployment: d,
        moves,
        upstreams: e.upstream_tasks(op),
        created: vec![new_index],
        cancelled: vec![],
        retired: vec![],
    };
    (plan, who)
}

fn ended_broadcasts(actions: &[EngineAction]) -> Vec<TaskId> {
    actions
        .iter()
        .filter_map(|a| match a {
            EngineAction::Broadcast(CoordinatorMessage::UpstreamEnded { upstream, .. }) => Some(*upstream),
            _ => None,
        })
        .collect()
}

/// Stop-and-restart: an upstream that finishes before it paused is not waited for, and the
/// new task hears that it ended.
#[test]
fn an_upstream_finishing_mid_drain_is_forgotten_and_announced() {
    let mut e = engine(Protocol::StopAndRestart);
    let (plan, who) = scale_out(&e, AGG, 1);
    e.start(plan, who).expect("start");
    for task in [t(AGG, 0), t(AGG, 1), t(AGG, 2)] {
        e.on_ack(task, 1, TaskAck::Prepared).expect("prepared");
    }
    e.on_ack(t(SRC, 0), 1, TaskAck::Paused).expect("paused");
    let actions = e.task_finished(t(SRC, 1)).expect("finished");
    assert_eq!(ended_broadcasts(&actions), vec![t(SRC, 1)]);
    e.on_ack(t(AGG, 0), 1, TaskAck::StateSent { bytes: 0, entries: 0 }).expect("sent");
    e.on_ack(t(AGG, 1), 1, TaskAck::StateSent { bytes: 5, entries: 1 }).expect("sent");
    let resume = e.on_ack(t(AGG, 2), 1, TaskAck::StateReceived).expect("received");
    assert_eq!(resume, vec![EngineAction::Broadcast(CoordinatorMessage::Resume { epoch: 1 })]);
    let done = e.on_ack(t(SRC, 0), 1, TaskAck::Resumed).expect("resumed");
    assert_eq!(done, vec![EngineAction::Completed { epoch: 1, operator: AGG, bytes_moved: 5 }]);
    assert!(e.on_ack(t(SRC, 1), 1, TaskAck::Resumed).is_err(), "a forgotten upstream is not awaited");
}

/// Koala: a consumer that finishes after the `Prepare` went out (the coordinator heard of
/// the end of its input before it heard of the operator's upstreams finishing) never answers
/// it: the epoch stops waiting for its `Prepared` and goes on (the CI hang of
/// `oracle_koala::chain_2_4_6_3_2_keyed_aggregate`: "still waiting for sink.0:Prepared").
#[test]
fn a_consumer_finishing_before_it_prepared_is_not_awaited() {
    for last in [false, true] {
        let mut e = engine(Protocol::Koala);
        let (plan, mut who) = scale_out(&e, AGG, 1);
        who.consumers = vec![t(ROLL, 0)];
        e.start(plan, who).expect("start");
        let prepared = [t(AGG, 0), t(AGG, 1), t(AGG, 2)];
        let (before, after) = if last { (&prepared[..], &[][..]) } else { (&prepared[..1], &prepared[1..]) };
        for task in before {
            assert!(e.on_ack(*task, 1, TaskAck::Prepared).expect("prepared").is_empty());
        }
        assert!(e.waiting_for().contains(&(t(ROLL, 0), "Prepared".to_string())));
        let mut actions = e.task_finished(t(ROLL, 0)).expect("finished");
        for task in after {
            actions.extend(e.on_ack(*task, 1, TaskAck::Prepared).expect("prepared"));
        }
        assert!(
            matches!(actions[..], [EngineAction::Broadcast(CoordinatorMessage::Begin { .. })]),
            "last = {last}: {actions:?}"
        );
        assert!(e.waiting_for().iter().all(|(task, _)| *task != t(ROLL, 0)), "{:?}", e.waiting_for());
    }
}

/// Koala: a keyed task whose inputs ended (it only serves state) is no upstream of a later
/// reconfiguration of its consumer: not awaited, and the consumer's new task expects nothing
/// from it; with every upstream in that state there is nothing to reconfigure.
#[test]
fn a_koala_task_whose_inputs_ended_is_no_upstream_any_more() {
    let mut e = engine(Protocol::Koala);
    e.on_ack(t(AGG, 1), 0, TaskAck::InputsEnded).expect("inputs ended");
    assert_eq!(e.upstream_tasks(ROLL), vec![t(AGG, 0)]);
    let (mut plan, who) = scale_out(&e, ROLL, 1);
    // Planned before the coordinator heard of it: the engine still leaves it out.
    plan.upstreams = vec![t(AGG, 0), t(AGG, 1)];
    let actions = e.start(plan, who).expect("start");
    assert_eq!(ended_broadcasts(&actions), vec![t(AGG, 1)]);
    e.on_ack(t(ROLL, 0), 1, TaskAck::Prepared).expect("prepared");
    let begin = e.on_ack(t(ROLL, 1), 1, TaskAck::Prepared).expect("prepared");
    assert!(matches!(begin[..], [EngineAction::Broadcast(CoordinatorMessage::Begin { .. })]), "{begin:?}");

    let mut e = engine(Protocol::Koala);
    e.on_ack(t(AGG, 0), 0, TaskAck::InputsEnded).expect("inputs ended");
    e.on_ack(t(AGG, 1), 0, TaskAck::InputsEnded).expect("inputs ended");
    let (plan, who) = scale_out(&e, ROLL, 1);
    let mut plan = plan;
    plan.upstreams = vec![t(AGG, 0), t(AGG, 1)];
    assert_eq!(e.start(plan, who), Err(StartError::InputEnded));
}

/// Koala: tasks whose inputs all ended are released, also when the last one reported it while
/// a reconfiguration ran (checked again at completion).
#[test]
fn tasks_whose_inputs_ended_are_released_after_a_running_reconfiguration() {
    let mut e = engine(Protocol::Koala);
    let (plan, who) = scale_out(&e, ROLL, 1);
    e.start(plan, who).expect("start");
    let mut actions = e.on_ack(t(AGG, 0), 0, TaskAck::InputsEnded).expect("ack");
    actions.extend(e.on_ack(t(AGG, 1), 0, TaskAck::InputsEnded).expect("ack"));
    assert!(
        !actions.iter().any(|a| matches!(a, EngineAction::Release(_))),
        "not while a reconfiguration runs"
    );
    // Both upstreams of the running epoch are gone before they switched: the new task hears
    // of each.
    assert_eq!(ended_broadcasts(&actions), vec![t(AGG, 0), t(AGG, 1)]);
    e.on_ack(t(ROLL, 0), 1, TaskAck::Prepared).expect("prepared");
    e.on_ack(t(ROLL, 1), 1, TaskAck::Prepared).expect("prepared");
    e.on_ack(t(ROLL, 0), 1, TaskAck::PeerReady).expect("ready");
    e.on_ack(t(ROLL, 1), 1, TaskAck::PeerReady).expect("ready");
    e.on_ack(t(ROLL, 0), 1, TaskAck::Done).expect("done");
    let actions = e.on_ack(t(ROLL, 1), 1, TaskAck::Done).expect("done");
    assert!(actions.contains(&EngineAction::Completed { epoch: 1, operator: ROLL, bytes_moved: 0 }));
    let released: Vec<&EngineAction> =
        actions.iter().filter(|a| matches!(a, EngineAction::Release(_))).collect();
    assert_eq!(released, vec![&EngineAction::Release(t(AGG, 0)), &EngineAction::Release(t(AGG, 1))]);
}

/// What keeps a job from ending, as the end-of-input watchdog names it: the keyed tasks whose
/// upstreams have not ended wait for their end of stream; once one reported its inputs ended it
/// waits for its release, naming the tasks of its operator that have not reported; the last
/// report releases them all, and a released task waits only to exit. A task the running
/// reconfiguration waits for is named with the ack.
#[test]
fn unfinished_tasks_are_named_with_what_they_wait_for() {
    let mut e = engine(Protocol::Koala);
    let waits = |e: &Engine, task: TaskId| {
        e.unfinished().into_iter().find(|(t, _)| *t == task).map(|(_, w)| w).expect("unfinished")
    };
    assert_eq!(waits(&e, t(AGG, 0)), Waiting::Inputs { from: vec![t(SRC, 0), t(SRC, 1)] });
    e.task_finished(t(SRC, 0)).expect("finished");
    e.task_finished(t(SRC, 1)).expect("finished");
    assert!(e.unfinished().iter().all(|(t, _)| t.operator != SRC), "finished tasks are not named");
    assert_eq!(waits(&e, t(AGG, 0)), Waiting::ReportInputsEnded);
    assert_eq!(waits(&e, t(ROLL, 0)), Waiting::Inputs { from: vec![t(AGG, 0), t(AGG, 1)] });
    e.on_ack(t(AGG, 1), 0, TaskAck::InputsEnded).expect("ended");
    assert_eq!(waits(&e, t(AGG, 1)), Waiting::Release { not_ended: vec![t(AGG, 0)], reconfiguring: None });
    assert_eq!(waits(&e, t(ROLL, 0)), Waiting::Inputs { from: vec![t(AGG, 0)] });
    let described = waits(&e, t(AGG, 1))
        .describe(|t| format!("{}.{}", ["src", "agg", "roll"][t.operator.0 as usize], t.index));
    assert_eq!(
        described,
        "reported its inputs ended; waits for its release, which waits for agg.0 to report theirs"
    );
    let progress = e.end_progress();
    e.on_ack(t(AGG, 0), 0, TaskAck::InputsEnded).expect("ended");
    assert_ne!(e.end_progress(), progress, "a report is progress");
    assert_eq!(waits(&e, t(AGG, 0)), Waiting::Exit);
    assert_eq!(waits(&e, t(ROLL, 0)), Waiting::ReportInputsEnded);
    // A running reconfiguration: its tasks, the new one included, are named with the ack it
    // waits for.
    let mut e = engine(Protocol::Koala);
    let (plan, who) = scale_out(&e, AGG, 1);
    e.start(plan, who).expect("start");
    assert_eq!(waits(&e, t(AGG, 2)), Waiting::Reconfiguration { epoch: 1, what: "Prepared".into() });
}
