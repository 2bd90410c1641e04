//! A worker process: registers with the coordinator, instantiates the tasks the coordinator
//! places on it, forwards their events and metrics, and serves its data-plane listener.

use std::collections::{BTreeSet, HashMap};
use std::io::{BufReader, BufWriter, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender, bounded, unbounded};
use koala_dataflow::graph::QueryResolver;
use koala_dataflow::{JobGraph, OperatorKind, Partitioning};
use koala_protocol::{CoordinatorMessage, Deployment, WorkerMessage};
use koala_state::{FjallEnv, StateEnv};
use koala_types::frame::{read_frame, write_frame};
use koala_types::{OperatorId, TaskId, WorkerId};

use crate::RuntimeError;
use crate::channel::{ChannelSender, InputChannel, TaskInput};
use crate::net::{Inboxes, serve};
use crate::output::{OutputEdge, Outputs, Route};
use crate::task::{TaskCommand, TaskSetup, run_operator, run_sink, run_source, run_task};

/// How to start a worker.
pub struct WorkerOptions {
    /// The coordinator's control address (`host:port`).
    pub coordinator: String,
    /// Where the worker keeps its state stores.
    pub data_dir: PathBuf,
    /// The host the data plane listens on (port chosen by the OS).
    pub listen_host: String,
    /// Builds the job graph from a query name and parameters.
    pub resolver: QueryResolver,
}

struct Job {
    deployment: Arc<Deployment>,
    graph: Arc<JobGraph>,
    pending: Vec<(TaskId, Receiver<TaskInput>, Receiver<TaskCommand>)>,
    commands: HashMap<TaskId, Sender<TaskCommand>>,
}

/// Runs a worker until the coordinator says `Shutdown` (Ok) or disappears (Err).
pub fn run_worker(options: WorkerOptions) -> Result<(), RuntimeError> {
    let listener = TcpListener::bind((options.listen_host.as_str(), 0)).map_err(|e| {
        RuntimeError::io(
            format!("binding the data plane on {}", options.listen_host),
            e,
        )
    })?;
    let data_addr = listener
        .local_addr()
        .map_err(|e| RuntimeError::io("reading the data address", e))?;
    let inboxes: Inboxes = Arc::new(RwLock::new(HashMap::new()));
    {
        let inboxes = inboxes.clone();
        std::thread::Builder::new()
            .name("koala-data-listener".into())
            .spawn(move || serve(listener, inboxes))
            .map_err(|e| RuntimeError::io("spawning the data listener", e))?;
    }
    let stream = TcpStream::connect(&options.coordinator).map_err(|e| {
        RuntimeError::io(
            format!("connecting to the coordinator at {}", options.coordinator),
            e,
        )
    })?;
    let _ = stream.set_nodelay(true);
    let write_half = stream
        .try_clone()
        .map_err(|e| RuntimeError::io("cloning the control socket", e))?;
    let mut reader = BufReader::new(stream);
    let (out_tx, out_rx) = unbounded::<WorkerMessage>();
    std::thread::Builder::new()
        .name("koala-control-out".into())
        .spawn(move || forward_to_coordinator(write_half, &out_rx))
        .map_err(|e| RuntimeError::io("spawning the control writer", e))?;
    let send = |m: WorkerMessage| {
        out_tx
            .send(m)
            .map_err(|_| RuntimeError::Deployment("control connection closed".into()))
    };
    send(WorkerMessage::Register {
        data_addr: data_addr.to_string(),
        pid: std::process::id(),
    })?;

    let mut me = WorkerId(u32::MAX);
    let mut job: Option<Job> = None;
    let mut env: Option<Arc<dyn StateEnv>> = None;
    loop {
        let msg: CoordinatorMessage = match read_frame(&mut reader) {
            Ok(Some(m)) => m,
            Ok(None) => {
                return Err(RuntimeError::Deployment(
                    "the coordinator closed the connection".into(),
                ));
            }
            Err(e) => return Err(RuntimeError::io("reading from the coordinator", e)),
        };
        match msg {
            CoordinatorMessage::Welcome { worker } => {
                me = worker;
                tracing::info!(%worker, %data_addr, "registered with the coordinator");
            }
            CoordinatorMessage::Deploy(d) => {
                if env.is_none() {
                    std::fs::create_dir_all(&options.data_dir).map_err(|e| {
                        RuntimeError::io(
                            format!("creating data dir {}", options.data_dir.display()),
                            e,
                        )
                    })?;
                    env = Some(Arc::new(FjallEnv::open(&options.data_dir)?));
                }
                match prepare(me, *d, &options.resolver, &inboxes) {
                    Ok(j) => {
                        job = Some(j);
                        send(WorkerMessage::Deployed)?;
                    }
                    Err(error) => send(WorkerMessage::DeployFailed { error })?,
                }
            }
            CoordinatorMessage::Start => {
                let (Some(j), Some(env)) = (job.as_mut(), env.as_ref()) else {
                    return Err(RuntimeError::Deployment("Start before Deploy".into()));
                };
                start(me, j, env, &inboxes, &out_tx)?;
            }
            CoordinatorMessage::StopSources => {
                if let Some(j) = &job {
                    for (task, tx) in &j.commands {
                        if j.graph
                            .operator(task.operator)
                            .is_some_and(|o| o.is_source())
                        {
                            let _ = tx.send(TaskCommand::StopSource);
                        }
                    }
                }
            }
            CoordinatorMessage::Shutdown => {
                tracing::info!(worker = %me, "shutting down");
                // Give the writer a moment to send what is queued; correctness does not depend on it.
                drop(out_tx);
                std::thread::sleep(Duration::from_millis(50));
                return Ok(());
            }
        }
    }
}

fn forward_to_coordinator(stream: TcpStream, rx: &Receiver<WorkerMessage>) {
    let mut w = BufWriter::new(stream);
    while let Ok(m) = rx.recv() {
        if write_frame(&mut w, &m).and_then(|_| w.flush()).is_err() {
            tracing::error!("lost the control connection to the coordinator");
            return;
        }
    }
}

/// Builds the graph and the input queues of this worker's tasks.
fn prepare(
    me: WorkerId,
    d: Deployment,
    resolver: &QueryResolver,
    inboxes: &Inboxes,
) -> Result<Job, String> {
    let graph = resolver(&d.query, &d.query_params)?;
    for (op, p) in &d.parallelism {
        if graph.operator(*op).is_none() || *p == 0 {
            return Err(format!(
                "deployment names operator {op} with {p} tasks, which the query lacks"
            ));
        }
    }
    let mut pending = Vec::new();
    let mut commands = HashMap::new();
    let mut map = inboxes
        .write()
        .map_err(|_| "inbox registry poisoned".to_string())?;
    for (task, worker) in &d.placement {
        if *worker != me {
            continue;
        }
        let (tx, rx) = bounded(d.options.channel_capacity.max(1));
        let (ctx, crx) = unbounded();
        map.insert(*task, tx);
        commands.insert(*task, ctx);
        pending.push((*task, rx, crx));
    }
    drop(map);
    Ok(Job {
        deployment: Arc::new(d),
        graph: Arc::new(graph),
        pending,
        commands,
    })
}

fn start(
    me: WorkerId,
    job: &mut Job,
    env: &Arc<dyn StateEnv>,
    inboxes: &Inboxes,
    events: &Sender<WorkerMessage>,
) -> Result<(), RuntimeError> {
    for (task, inbox, commands) in job.pending.drain(..) {
        let d = job.deployment.clone();
        let graph = job.graph.clone();
        let env = env.clone();
        let inboxes = inboxes.clone();
        let events = events.clone();
        std::thread::Builder::new()
            .name(format!("koala-task-{task}"))
            .spawn(move || {
                let setup = match build_setup(
                    me,
                    task,
                    &d,
                    &graph,
                    &env,
                    &inboxes,
                    inbox,
                    commands,
                    events.clone(),
                ) {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::error!(%task, error = %e, "task could not start");
                        let _ = events.send(WorkerMessage::TaskFailed {
                            task,
                            error: e.to_string(),
                        });
                        return;
                    }
                };
                let body = match setup.spec.kind {
                    OperatorKind::Source { .. } => run_source,
                    OperatorKind::Transform { .. } => run_operator,
                    OperatorKind::Sink { .. } => run_sink,
                };
                run_task(setup, body);
            })
            .map_err(|e| RuntimeError::io("spawning a task thread", e))?;
    }
    Ok(())
}

fn parallelism(d: &Deployment, op: OperatorId) -> u32 {
    d.parallelism.get(&op).copied().unwrap_or(1)
}

/// Whether input `input` of `consumer` is a one-to-one forward edge.
fn is_forward(d: &Deployment, graph: &JobGraph, consumer: OperatorId, input: usize) -> bool {
    graph
        .operator(consumer)
        .and_then(|c| c.inputs.get(input))
        .is_some_and(|i| {
            matches!(i.partitioning, Partitioning::Forward)
                && parallelism(d, i.from) == parallelism(d, consumer)
        })
}

/// The channels a task receives on.
pub(crate) fn input_channels(
    d: &Deployment,
    graph: &JobGraph,
    task: TaskId,
) -> BTreeSet<InputChannel> {
    let mut out = BTreeSet::new();
    let Some(spec) = graph.operator(task.operator) else {
        return out;
    };
    for (i, input) in spec.inputs.iter().enumerate() {
        if is_forward(d, graph, task.operator, i) {
            out.insert(InputChannel {
                input: i,
                from: TaskId::new(input.from, task.index),
            });
        } else {
            for u in 0..parallelism(d, input.from) {
                out.insert(InputChannel {
                    input: i,
                    from: TaskId::new(input.from, u),
                });
            }
        }
    }
    out
}

#[allow(clippy::too_many_arguments)]
fn build_setup(
    me: WorkerId,
    task: TaskId,
    d: &Deployment,
    graph: &JobGraph,
    env: &Arc<dyn StateEnv>,
    inboxes: &Inboxes,
    inbox: Receiver<TaskInput>,
    commands: Receiver<TaskCommand>,
    events: Sender<WorkerMessage>,
) -> Result<TaskSetup, RuntimeError> {
    let spec = graph
        .operator(task.operator)
        .cloned()
        .ok_or_else(|| RuntimeError::Deployment(format!("no operator {}", task.operator)))?;
    let mut edges = Vec::new();
    for (consumer, input) in graph.consumers(task.operator) {
        let consumer_spec = graph
            .operator(consumer)
            .ok_or_else(|| RuntimeError::Deployment(format!("no operator {consumer}")))?;
        let pc = parallelism(d, consumer);
        let forward = is_forward(d, graph, consumer, input);
        let route = match &consumer_spec.inputs[input].partitioning {
            _ if forward => Route::Forward(task.index as usize),
            Partitioning::Forward | Partitioning::Rebalance => Route::Rebalance,
            Partitioning::Key(key_fn) => {
                let table = d.routing.get(&consumer).cloned().ok_or_else(|| {
                    RuntimeError::Deployment(format!(
                        "no routing table for keyed operator {}",
                        consumer_spec.name
                    ))
                })?;
                Route::Key {
                    key_fn: key_fn.clone(),
                    table: Arc::new(table),
                    num_buckets: d.num_buckets,
                }
            }
        };
        let mut targets = Vec::new();
        for j in 0..pc {
            let to = TaskId::new(consumer, j);
            let channel = InputChannel { input, from: task };
            if forward && j != task.index {
                // Forward edges only connect task i to task i; keep a placeholder-free vector by
                // connecting the one real target at its own index below.
                continue;
            }
            let worker = d
                .placement
                .get(&to)
                .ok_or_else(|| RuntimeError::Deployment(format!("{to} is not placed")))?;
            let sender = if *worker == me {
                let inbox = inboxes
                    .read()
                    .ok()
                    .and_then(|m| m.get(&to).cloned())
                    .ok_or_else(|| RuntimeError::Deployment(format!("no input queue for {to}")))?;
                ChannelSender::Local { to, inbox, channel }
            } else {
                let addr = d
                    .workers
                    .get(worker)
                    .ok_or_else(|| RuntimeError::Deployment(format!("no address for {worker}")))?;
                ChannelSender::connect(addr, to, channel)?
            };
            targets.push(sender);
        }
        let route = if forward { Route::Forward(0) } else { route };
        edges.push(OutputEdge::new(route, targets));
    }
    let store = if spec.is_stateful() {
        Some(env.open_task(task)?)
    } else {
        None
    };
    Ok(TaskSetup {
        task,
        parallelism: parallelism(d, task.operator),
        inputs: input_channels(d, graph, task),
        spec,
        inbox,
        commands,
        events,
        outputs: Outputs::new(
            edges,
            d.options.batch_records,
            Duration::from_millis(d.options.linger_ms),
        ),
        options: d.options.clone(),
        num_buckets: d.num_buckets,
        store,
    })
}
