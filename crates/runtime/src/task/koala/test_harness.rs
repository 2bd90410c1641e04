//! What the Koala task-loop tests share: a one-worker deployment of `src → count → out` with two
//! `count` tasks, and the setup of one task of it over queues the test holds.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender};
use koala_protocol::{Deployment, Protocol, RuntimeOptions, WorkerMessage};
use koala_state::StateBackend;
use koala_types::{TaskId, WorkerId};

use super::{TaskCommand, TaskSetup};
use crate::channel::TaskInput;
use crate::links::{Links, build_outputs, input_channels};
use crate::queue::DataReceiver;

/// The only worker of these tests.
pub(super) const WORKER: WorkerId = WorkerId(0);

/// A Koala deployment at `epoch` of `tasks` (the source's, the count's, the sink's), all on
/// [`WORKER`], with `routing` the count operator's bucket owners (its length the bucket count).
pub(super) fn deployment(
    tasks: &[TaskId],
    count: koala_types::OperatorId,
    epoch: u64,
    routing: Vec<u32>,
) -> Deployment {
    let mut per_operator: BTreeMap<_, Vec<u32>> = BTreeMap::new();
    for t in tasks {
        per_operator.entry(t.operator).or_default().push(t.index);
    }
    Deployment {
        run: "t".into(),
        query: String::new(),
        query_params: String::new(),
        workers: BTreeMap::from([(WORKER, "127.0.0.1:9".to_string())]),
        placement: tasks.iter().map(|t| (*t, WORKER)).collect(),
        tasks: per_operator,
        epoch,
        num_buckets: u16::try_from(routing.len()).expect("bucket count"),
        routing: BTreeMap::from([(count, routing)]),
        options: RuntimeOptions {
            batch_records: 64,
            linger_ms: 1,
            channel_capacity: 64,
            sink_dir: String::new(),
            capacity: Default::default(),
            max_queued_records: koala_protocol::koala::DEFAULT_MAX_QUEUED_RECORDS,
            checkpoint: Default::default(),
        },
        protocol: Protocol::Koala,
        extra_keys: 0,
        drain_keys_per_sec: 0,
        finished: BTreeSet::new(),
    }
}

/// The queues a task under test reads, fed by the test.
pub(super) struct Inbox {
    pub(super) data: DataReceiver,
    pub(super) peer: Receiver<TaskInput>,
    pub(super) fetch: Receiver<TaskInput>,
    pub(super) commands: Receiver<TaskCommand>,
}

/// The setup of `task` in deployment `d`, its outputs opened through `links`.
pub(super) fn task_setup(
    links: Links,
    d: &Deployment,
    task: TaskId,
    created_by_reconfiguration: bool,
    inbox: Inbox,
    events: Sender<WorkerMessage>,
    store: Box<dyn StateBackend>,
) -> TaskSetup {
    TaskSetup {
        task,
        spec: links.graph.operator(task.operator).cloned().expect("spec"),
        parallelism: u32::try_from(d.tasks[&task.operator].len()).expect("parallelism"),
        outputs: build_outputs(&links, d, task).expect("outputs"),
        inputs: input_channels(d, &links.graph, task),
        deployment: Arc::new(d.clone()),
        created_by_reconfiguration,
        links,
        inbox: inbox.data,
        peer_inbox: inbox.peer,
        fetch_inbox: inbox.fetch,
        commands: inbox.commands,
        events,
        options: d.options.clone(),
        num_buckets: d.num_buckets,
        store: Some(store),
    }
}
