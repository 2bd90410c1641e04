//! In-process scenarios of whole task loops over the real queues, peer lanes and TCP listener
//! (docs/architecture.md §4, `crate::peer`): two tasks of one keyed operator swap all their
//! buckets, then fetch (Koala) or stream (stop-and-restart) state from each other through
//! one-message peer lanes, on one worker or on two workers over loopback TCP; and a sender faster
//! than its receiver never grows a peer lane beyond its bound. The test thread plays the
//! coordinator, the source task (it feeds the tasks' data queues) and the sink task (a thread
//! drains its queue). Every wait has a watchdog that fails the test instead of hanging it.

use std::collections::{BTreeMap, HashMap};
use std::net::TcpListener;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, bounded, unbounded};
use koala_dataflow::{Dataflow, JobGraph, SourceOptions, ValueState};
use koala_protocol::koala::Reconfiguration;
use koala_protocol::{Deployment, Protocol, ReconfigPlan, RuntimeOptions, TaskAck, WorkerMessage};
use koala_state::{MemoryEnv, StateEnv};
use koala_types::{BucketId, ChannelMessage, Record, TaskId, Timestamp, WorkerId, bucket_of, decode, encode};

use crate::channel::{InputChannel, TaskInput};
use crate::links::{Links, open_peer};
use crate::net::{Inboxes, serve};
use crate::peer::peer_capacity;
use crate::queue::DataSender;
use crate::task::TaskCommand;
use crate::worker::{create_inbox, spawn_task};

/// How long a scenario may take before it counts as stuck: generous, the machine may be busy.
const WATCHDOG: Duration = Duration::from_secs(90);
/// Buckets of the keyed operator.
const BUCKETS: u16 = 16;
/// Records per batch the source sends.
const BATCH: usize = 64;

/// Fails the test once the deadline has passed instead of letting a deadlock hang it.
struct Watchdog {
    deadline: Instant,
}

impl Watchdog {
    fn new() -> Self {
        Self { deadline: Instant::now() + WATCHDOG }
    }

    fn left(&self, what: &str) -> Duration {
        let left = self.deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "no progress within {WATCHDOG:?} while {what}: deadlocked");
        left
    }

    fn feed(&self, tx: &DataSender, item: TaskInput, what: &str) {
        if tx.send_timeout(item, self.left(what)).is_err() {
            panic!("stuck while {what}: deadlocked (or the receiver is gone)");
        }
    }

    fn send<T>(&self, tx: &Sender<T>, item: T, what: &str) {
        if tx.send_timeout(item, self.left(what)).is_err() {
            panic!("stuck while {what}: deadlocked (or the receiver is gone)");
        }
    }

    fn recv<T>(&self, rx: &Receiver<T>, what: &str) -> T {
        rx.recv_timeout(self.left(what)).unwrap_or_else(|_| panic!("stuck while {what}: deadlocked"))
    }
}

/// One worker's data plane: its queue registry, served by a listener on an OS-chosen port.
struct DataPlane {
    id: WorkerId,
    inboxes: Inboxes,
    addr: String,
}

/// The data port's gate of a loopback test worker: no token.
fn loopback_gate() -> koala_types::handshake::Gate {
    koala_types::handshake::Gate::new("data port", None, false, Default::default())
}

fn data_plane(id: u32) -> DataPlane {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a data port");
    let addr = listener.local_addr().expect("the data address").to_string();
    let inboxes: Inboxes = Arc::new(RwLock::new(HashMap::new()));
    let served = inboxes.clone();
    std::thread::spawn(move || serve(listener, served, Default::default(), loopback_gate(), None));
    DataPlane { id: WorkerId(id), inboxes, addr }
}

/// A record of the source: key and a payload the operator keeps as its state.
type Event = (u64, Vec<u8>);

/// source → by key → "count" (per key: records seen, and the last payload as ballast so moved
/// state spans many messages) → sink, emitting (key, records seen so far).
fn graph() -> JobGraph {
    let df = Dataflow::new();
    df.source("source", SourceOptions::default(), |_| std::iter::empty::<(Event, Timestamp)>())
        .key_by(|e: &Event| e.0)
        .stateful_map("count", |key: &u64, e: Event, seen: &mut ValueState<(u64, Vec<u8>)>| {
            let n = seen.update(move |(n, last)| {
                *n += 1;
                *last = e.1;
                *n
            });
            (*key, n)
        })
        .sink_discard("sink");
    df.build().expect("the scenario graph builds")
}

/// Two tasks of "count", fed by one source task and feeding one sink task, none of which runs:
/// the test sends what the source would and a thread collects what reaches the sink.
struct Scenario {
    source: TaskId,
    tasks: [TaskId; 2],
    deployment: Deployment,
    commands: [Sender<TaskCommand>; 2],
    data: [DataSender; 2],
    events: Receiver<WorkerMessage>,
    seen: Vec<WorkerMessage>,
    sink: Receiver<Vec<(u64, u64)>>,
    /// Records sent per key.
    sent: BTreeMap<u64, u64>,
    watchdog: Watchdog,
}

impl Scenario {
    /// Starts both tasks with one-message data queues and peer lanes; `two_workers` puts them on
    /// two workers (peer lanes over TCP), else both on one.
    fn start(protocol: Protocol, two_workers: bool) -> Self {
        let graph = Arc::new(graph());
        let id = |name: &str| graph.by_name(name).expect("operator").id;
        let (source, count, sink) = (TaskId::new(id("source"), 0), id("count"), TaskId::new(id("sink"), 0));
        let tasks = [TaskId::new(count, 0), TaskId::new(count, 1)];
        let planes = [data_plane(0), data_plane(1)];
        let home = if two_workers { [0, 1] } else { [0, 0] };
        let mut placement = BTreeMap::from([(source, planes[0].id), (sink, planes[0].id)]);
        for (t, h) in tasks.iter().zip(home) {
            placement.insert(*t, planes[h].id);
        }
        let deployment = Deployment {
            run: "scenario".into(),
            query: "scenario".into(),
            query_params: String::new(),
            workers: planes.iter().map(|p| (p.id, p.addr.clone())).collect(),
            placement,
            tasks: BTreeMap::from([
                (source.operator, vec![0]),
                (count, vec![0, 1]),
                (sink.operator, vec![0]),
            ]),
            epoch: 0,
            routing: BTreeMap::from([(count, (0..BUCKETS).map(|b| u32::from(b >= BUCKETS / 2)).collect())]),
            num_buckets: BUCKETS,
            options: RuntimeOptions {
                batch_records: BATCH,
                linger_ms: 1,
                channel_capacity: 1,
                sink_dir: ".".into(),
                capacity: Default::default(),
                max_queued_records: koala_protocol::koala::DEFAULT_MAX_QUEUED_RECORDS,
                checkpoint: Default::default(),
            },
            protocol,
            extra_keys: 0,
            drain_keys_per_sec: 0,
            finished: Default::default(),
        };
        assert_eq!(
            peer_capacity(deployment.options.channel_capacity),
            1,
            "the scenarios need one-message peer lanes"
        );

        let (sink_queues, _) = create_inbox(sink, 1024, &planes[0].inboxes).expect("sink queues");
        let (sink_tx, sink_rx) = bounded(1);
        std::thread::spawn(move || {
            let mut rows = Vec::new();
            let mut ended = 0;
            while ended < 2 {
                let Ok(item) = sink_queues.data.recv() else { break };
                match item.message {
                    ChannelMessage::Batch(records) => rows
                        .extend(records.iter().map(|r| decode::<(u64, u64)>(&r.value).expect("a sink row"))),
                    ChannelMessage::EndOfStream => ended += 1,
                    _ => {}
                }
            }
            let _ = sink_tx.send(rows);
        });

        let env: Arc<dyn StateEnv> = Arc::new(MemoryEnv::new());
        let (events_tx, events) = unbounded();
        let d = Arc::new(deployment.clone());
        let mut commands = Vec::new();
        let mut data = Vec::new();
        for (task, h) in tasks.iter().zip(home) {
            let plane = &planes[h];
            let (queues, command) = create_inbox(*task, 1, &plane.inboxes).expect("task queues");
            let inbox = plane.inboxes.read().expect("registry").get(task).expect("registered").data.clone();
            let links = Links {
                me: plane.id,
                graph: graph.clone(),
                inboxes: plane.inboxes.clone(),
                token: None,
                tls: None,
            };
            spawn_task(*task, &d, &links, &env, queues, &events_tx, false, None).expect("spawn a task");
            commands.push(command);
            data.push(inbox);
        }
        Self {
            source,
            tasks,
            deployment,
            commands: pair(commands),
            data: pair(data),
            events,
            seen: Vec::new(),
            sink: sink_rx,
            sent: BTreeMap::new(),
            watchdog: Watchdog::new(),
        }
    }

    /// Which task (0 or 1) owns `bucket` before the swap.
    fn owner_before(bucket: BucketId) -> usize {
        usize::from(bucket >= BUCKETS / 2)
    }

    /// Every bucket of each task moves to the other.
    fn swap(&self) -> BTreeMap<(TaskId, TaskId), Vec<BucketId>> {
        let [a, b] = self.tasks;
        let (first, second): (Vec<BucketId>, Vec<BucketId>) =
            (0..BUCKETS).partition(|bucket| Self::owner_before(*bucket) == 0);
        BTreeMap::from([((a, b), first), ((b, a), second)])
    }

    /// As the source: one record for each of `keys`, to the task `owner` gives its bucket.
    fn feed(&mut self, keys: std::ops::Range<u64>, payload: usize, owner: impl Fn(BucketId) -> usize) {
        let mut batches: [Vec<Record>; 2] = [Vec::new(), Vec::new()];
        for k in keys {
            let key = encode(&k).expect("a key");
            let to = owner(bucket_of(&key, BUCKETS));
            let value = encode(&(k, vec![k as u8; payload])).expect("a value");
            batches[to].push(Record { key, value, time: 1, due_ms: 0 });
            *self.sent.entry(k).or_default() += 1;
            if batches[to].len() == BATCH {
                let batch = std::mem::take(&mut batches[to]);
                self.to_task(to, ChannelMessage::Batch(batch));
            }
        }
        for (to, batch) in batches.into_iter().enumerate() {
            if !batch.is_empty() {
                self.to_task(to, ChannelMessage::Batch(batch));
            }
        }
    }

    fn to_task(&self, i: usize, message: ChannelMessage) {
        let item = TaskInput { channel: InputChannel { input: 0, from: self.source }, message };
        self.watchdog.feed(&self.data[i], item, &format!("feeding {}", self.tasks[i]));
    }

    fn to_both(&self, message: &ChannelMessage) {
        for i in 0..2 {
            self.to_task(i, message.clone());
        }
    }

    fn command(&self, i: usize, command: TaskCommand) {
        self.watchdog.send(&self.commands[i], command, "commanding a task");
    }

    /// Waits until `done` holds for the events seen so far; a failed task fails the test.
    fn wait(&mut self, what: &str, done: impl Fn(&[WorkerMessage]) -> bool) {
        while !done(&self.seen) {
            let event = self.watchdog.recv(&self.events, what);
            match &event {
                WorkerMessage::TaskFailed { task, error } => panic!("{task} failed while {what}: {error}"),
                WorkerMessage::TaskAck { ack: TaskAck::ProtocolError { error }, task, .. } => {
                    panic!("{task} refused input while {what}: {error}")
                }
                _ => {}
            }
            self.seen.push(event);
        }
    }

    /// Waits until both tasks acknowledged `ack`.
    fn wait_ack(&mut self, ack: TaskAck) {
        let tasks = self.tasks;
        let what = format!("waiting for {ack:?}");
        self.wait(&what, |seen| {
            tasks.iter().all(|t| {
                seen.iter().any(
                    |e| matches!(e, WorkerMessage::TaskAck { task, ack: a, .. } if task == t && *a == ack),
                )
            })
        });
    }

    fn wait_finished(&mut self) {
        let tasks = self.tasks;
        self.wait("waiting for both tasks to finish", |seen| {
            tasks
                .iter()
                .all(|t| seen.iter().any(|e| matches!(e, WorkerMessage::TaskFinished { task } if task == t)))
        });
    }

    /// Σ of `metric` over the samples `task` reported.
    fn total(&self, task: TaskId, metric: &str) -> f64 {
        let samples = self.seen.iter().filter_map(|e| match e {
            WorkerMessage::Metrics(samples) => Some(samples),
            _ => None,
        });
        samples.flatten().filter(|s| s.task == task && s.metric == metric).map(|s| s.value).sum()
    }

    /// Every record reached the sink exactly once, each key's counts 1..=sent: no state was lost,
    /// duplicated or counted twice on its way between the tasks.
    fn check_output(&self) {
        let rows = self.watchdog.recv(&self.sink, "collecting the sink's rows");
        let mut counts: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
        for (key, n) in rows {
            counts.entry(key).or_default().push(n);
        }
        assert_eq!(counts.len(), self.sent.len(), "keys that reached the sink");
        for (key, sent) in &self.sent {
            let mut got = counts.get(key).cloned().unwrap_or_default();
            got.sort_unstable();
            assert_eq!(got, (1..=*sent).collect::<Vec<_>>(), "running counts of key {key}");
        }
    }
}

/// Koala: both tasks hand all their buckets to each other, then every record of every key needs
/// the key's state from the other task: fetches both ways, while hand-overs, forwarded records
/// and peer watermarks share the one-message peer lanes.
fn koala_tasks_fetching_from_each_other(two_workers: bool, keys: u64, payload: usize) {
    let mut s = Scenario::start(Protocol::Koala, two_workers);
    // State for every key where the initial routing puts it.
    s.feed(0..keys, payload, Scenario::owner_before);
    s.to_both(&ChannelMessage::Watermark(10));
    let reconfiguration = Arc::new(Reconfiguration {
        operator: s.tasks[0].operator,
        epoch: 1,
        moves: s.swap(),
        upstreams: [s.source].into(),
        new_tasks: Default::default(),
        cancelled: Default::default(),
        retired: Default::default(),
        extra_keys: 0,
        drain_keys_per_sec: 0,
    });
    for i in 0..2 {
        s.command(i, TaskCommand::Begin(reconfiguration.clone()));
    }
    // Still routed by the old table: what reaches a task after its hand-over is forwarded to the
    // new owner over the peer lane, both ways at once.
    s.feed(0..keys, payload, Scenario::owner_before);
    s.to_both(&ChannelMessage::Watermark(20));
    s.wait_ack(TaskAck::PeerReady);
    // The source switches routing: a marker, then everything by the new table, so each task
    // fetches every key from the other.
    s.to_both(&ChannelMessage::Marker(1));
    for _ in 0..3 {
        s.feed(0..keys, payload, |b| 1 - Scenario::owner_before(b));
    }
    s.to_both(&ChannelMessage::Watermark(Timestamp::MAX));
    s.to_both(&ChannelMessage::EndOfStream);
    s.wait_ack(TaskAck::Done);
    s.wait_ack(TaskAck::InputsEnded);
    for i in 0..2 {
        s.command(i, TaskCommand::Release);
    }
    s.wait_finished();
    s.check_output();
    // Each task served the other about half the keys' state: fetches really went both ways.
    for task in s.tasks {
        let served = s.total(task, koala_types::metric::STATE_BYTES_ON_DEMAND);
        assert!(served >= (keys / 4 * payload as u64) as f64, "{task} served only {served} bytes of state");
    }
}

/// Without the fetch lane and the outbox (every peer message a blocking send into a one-message
/// lane), two tasks that forward records to each other, each blocked sending while the other's
/// lane holds one message, wait on each other for ever; the watchdog would fail this test.
#[test]
fn koala_tasks_fetching_from_each_other_on_one_worker_finish() {
    koala_tasks_fetching_from_each_other(false, 3000, 256);
}

#[test]
fn koala_tasks_fetching_from_each_other_over_tcp_finish() {
    koala_tasks_fetching_from_each_other(true, 1500, 4 * 1024);
}

/// Stop-and-restart: both tasks stream all their state (many 256 KiB chunks) to each other at
/// once through one-message peer lanes. Each sender is blocked by the other's full lane, so
/// both only finish because a waiting sender takes in the state arriving for it meanwhile.
fn stop_and_restart_tasks_swapping_state(two_workers: bool, payload: usize) {
    const KEYS: u64 = 4000;
    let mut s = Scenario::start(Protocol::StopAndRestart, two_workers);
    s.feed(0..KEYS, payload, Scenario::owner_before);
    let mut after = s.deployment.clone();
    after.epoch = 1;
    after.routing.insert(s.tasks[0].operator, (0..BUCKETS).map(|b| u32::from(b < BUCKETS / 2)).collect());
    let plan = Arc::new(ReconfigPlan {
        epoch: 1,
        operator: s.tasks[0].operator,
        deployment: after,
        moves: s.swap(),
        upstreams: vec![s.source],
        created: Vec::new(),
        cancelled: Vec::new(),
        retired: Vec::new(),
    });
    for i in 0..2 {
        s.command(i, TaskCommand::Prepare(plan.clone()));
    }
    s.wait_ack(TaskAck::Prepared);
    // The coordinator's Drain (as `HandOver`), then the paused source's markers: both tasks are
    // drained and start sending at the same time.
    for i in 0..2 {
        s.command(i, TaskCommand::HandOver { epoch: 1 });
    }
    s.to_both(&ChannelMessage::Marker(1));
    s.wait_ack(TaskAck::StateReceived);
    s.wait("waiting for both StateSent", |seen| {
        seen.iter()
            .filter(|e| matches!(e, WorkerMessage::TaskAck { ack: TaskAck::StateSent { .. }, .. }))
            .count()
            == 2
    });
    // Resumed with the new routing: every key's count continues where the other task left it.
    s.feed(0..KEYS, payload, |b| 1 - Scenario::owner_before(b));
    s.to_both(&ChannelMessage::Watermark(Timestamp::MAX));
    s.to_both(&ChannelMessage::EndOfStream);
    s.wait_ack(TaskAck::InputsEnded);
    for i in 0..2 {
        s.command(i, TaskCommand::Release);
    }
    s.wait_finished();
    s.check_output();
}

/// Without draining while blocked (a plain blocking send), both senders stop after one chunk and
/// the watchdog fails this test.
#[test]
fn stop_and_restart_swap_on_one_worker_finishes() {
    stop_and_restart_tasks_swapping_state(false, 1024);
}

/// Enough state each way (16 MiB) that socket buffers cannot hide a blocked receiver.
#[test]
fn stop_and_restart_swap_over_tcp_finishes() {
    stop_and_restart_tasks_swapping_state(true, 8 * 1024);
}

/// Stop-and-restart scales "count" in 2 → 1 as its input ends: both tasks take their last end of
/// stream after `Prepare` and before the coordinator's `Drain` (`HandOver`). That `HandOver` is
/// the last event the cancelled task ever gets: it must send its state, report its inputs ended
/// and exit once released. The task loop used to decide whether it was done only after an end
/// of stream, a peer message or a `Prepare`, so the cancelled task sent its state and then waited
/// for ever (the hang of Nexmark Q1/Q2 scaled in as their source ended); the watchdog fails this
/// test then.
#[test]
fn stop_and_restart_scale_in_after_the_input_ended_finishes() {
    let mut s = Scenario::start(Protocol::StopAndRestart, false);
    s.feed(0..500, 16, Scenario::owner_before);
    let [t0, t1] = s.tasks;
    let mut after = s.deployment.clone();
    after.epoch = 1;
    after.tasks.insert(t0.operator, vec![0]);
    after.routing.insert(t0.operator, vec![0; usize::from(BUCKETS)]);
    let plan = Arc::new(ReconfigPlan {
        epoch: 1,
        operator: t0.operator,
        deployment: after,
        moves: BTreeMap::from([((t1, t0), (BUCKETS / 2..BUCKETS).collect())]),
        upstreams: vec![s.source],
        created: Vec::new(),
        cancelled: vec![1],
        retired: Vec::new(),
    });
    for i in 0..2 {
        s.command(i, TaskCommand::Prepare(plan.clone()));
    }
    s.wait_ack(TaskAck::Prepared);
    s.to_both(&ChannelMessage::Watermark(Timestamp::MAX));
    s.to_both(&ChannelMessage::EndOfStream);
    // Both took their end of stream (a task handles what it took before its next command).
    while s.data.iter().any(|q| q.queued() > 0) {
        s.watchdog.left("waiting for both tasks to take their end of stream");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(
        !s.seen.iter().any(|e| matches!(e, WorkerMessage::TaskAck { ack: TaskAck::InputsEnded, .. })),
        "a task part of a reconfiguration reported its inputs ended before its part was done"
    );
    for i in 0..2 {
        s.command(i, TaskCommand::HandOver { epoch: 1 });
    }
    s.wait_ack(TaskAck::InputsEnded);
    let sent = s.seen.iter().find_map(|e| match e {
        WorkerMessage::TaskAck { task, ack: TaskAck::StateSent { entries, .. }, .. } if *task == t1 => {
            Some(*entries)
        }
        _ => None,
    });
    assert!(sent.is_some_and(|n| n > 0), "the cancelled task sent no state: {sent:?}");
    for i in 0..2 {
        s.command(i, TaskCommand::Release);
    }
    s.wait_finished();
    s.check_output();
}

/// A sender much faster than its receiver: the receiving task's peer lane never holds more than
/// its bound, the sender waits instead, and every message arrives once, in order.
fn fast_sender_stays_within_the_peer_bound(two_workers: bool) {
    const MESSAGES: u64 = 400;
    let capacity = 4;
    let watchdog = Watchdog::new();
    let planes = [data_plane(0), data_plane(1)];
    let (from, to) = (TaskId::new(koala_types::OperatorId(1), 0), TaskId::new(koala_types::OperatorId(1), 1));
    let (queues, _commands) = create_inbox(to, capacity, &planes[0].inboxes).expect("queues");
    let sender_plane = &planes[usize::from(two_workers)];
    let d = Deployment {
        run: "bound".into(),
        query: "bound".into(),
        query_params: String::new(),
        workers: planes.iter().map(|p| (p.id, p.addr.clone())).collect(),
        placement: BTreeMap::from([(to, planes[0].id), (from, sender_plane.id)]),
        tasks: BTreeMap::new(),
        epoch: 0,
        routing: BTreeMap::new(),
        num_buckets: BUCKETS,
        options: RuntimeOptions {
            batch_records: 1,
            linger_ms: 0,
            channel_capacity: capacity,
            sink_dir: ".".into(),
            capacity: Default::default(),
            max_queued_records: koala_protocol::koala::DEFAULT_MAX_QUEUED_RECORDS,
            checkpoint: Default::default(),
        },
        protocol: Protocol::StopAndRestart,
        extra_keys: 0,
        drain_keys_per_sec: 0,
        finished: Default::default(),
    };
    let graph = Arc::new(graph());
    let links =
        Links { me: sender_plane.id, graph, inboxes: sender_plane.inboxes.clone(), token: None, tls: None };
    let lane = open_peer(&links, &d, to, from).expect("open the peer lane");
    let (_own_tx, own) = bounded::<TaskInput>(1);
    let sender = std::thread::spawn(move || {
        let mut waited = Duration::ZERO;
        for i in 0..MESSAGES {
            // 64 KiB each: 25 MiB in all, more than loopback socket buffers hold.
            let mut bytes = vec![0u8; 64 * 1024];
            bytes[..8].copy_from_slice(&i.to_le_bytes());
            let message = ChannelMessage::Protocol(bytes);
            waited += lane.send_draining(message, &own, |_| Ok(())).expect("send on the peer lane");
        }
        waited
    });
    let bound = peer_capacity(capacity);
    let mut most = 0;
    for i in 0..MESSAGES {
        // Slower than the sender: it must wait for room, never overfill the lane.
        std::thread::sleep(Duration::from_micros(300));
        most = most.max(queues.peer.len());
        let item = watchdog.recv(&queues.peer, "receiving on the peer lane");
        let ChannelMessage::Protocol(bytes) = item.message else { panic!("not what was sent") };
        let n = u64::from_le_bytes(bytes[..8].try_into().expect("eight bytes"));
        assert_eq!(n, i, "peer lane order");
    }
    let waited = sender.join().expect("the sender thread");
    assert!(most <= bound, "the peer lane held {most} messages, bound {bound}");
    assert_eq!(most, bound, "the sender never filled the lane; the test proves nothing");
    assert!(waited > Duration::ZERO, "the sender never waited; the test proves nothing");
}

#[test]
fn a_fast_sender_on_the_same_worker_stays_within_the_peer_bound() {
    fast_sender_stays_within_the_peer_bound(false);
}

#[test]
fn a_fast_sender_over_tcp_stays_within_the_peer_bound() {
    fast_sender_stays_within_the_peer_bound(true);
}

/// The two elements of `v`.
fn pair<T>(v: Vec<T>) -> [T; 2] {
    v.try_into().unwrap_or_else(|_| panic!("two tasks"))
}
