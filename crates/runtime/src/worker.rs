//! A worker process: registers with the coordinator, instantiates the tasks the coordinator
//! places on it, forwards their events and metrics, relays reconfiguration phases to the tasks
//! they concern, and serves its data-plane listener.

use std::collections::HashMap;
use std::io::{BufReader, BufWriter, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender, bounded, unbounded};
use koala_dataflow::JobGraph;
use koala_dataflow::OperatorKind;
use koala_dataflow::graph::QueryResolver;
use koala_protocol::drrs::DrrsCommand;
use koala_protocol::plan::{Edge, consumer_inputs};
use koala_protocol::relay::{Relayed, relay};
use koala_protocol::switch::RoutingSwitch;
use koala_protocol::{ControlHello, CoordinatorMessage, Deployment, ReconfigPlan, WorkerMessage};
use koala_state::StateEnv;
use koala_types::frame::{read_frame, write_frame};
use koala_types::handshake::{ControlLimits, Gate, GateLimits, Role, Token, connect_control};
use koala_types::tls::ConnWriter;
use koala_types::{Epoch, TaskId, WorkerId};

use crate::RuntimeError;
use crate::channel::TaskInput;
use crate::links::{Links, build_outputs, input_channels};
use crate::memory::WorkerMemory;
use crate::net::{Inboxes, TaskInboxes, serve};
use crate::peer::peer_capacity;
use crate::queue::{DataReceiver, data_queue};
use crate::task::{TaskCommand, TaskSetup, run_operator, run_sink, run_source, run_task};
use crate::throttle::SharedLink;
use crate::worker_state::{data_dir_of, open_state, restore_warm_state};

/// How to start a worker.
pub struct WorkerOptions {
    /// The coordinator's control address (`host:port`).
    pub coordinator: String,
    /// Where the worker keeps its state stores; [`crate::WORKER_ID_PLACEHOLDER`] in it becomes the id
    /// the coordinator assigns at registration.
    pub data_dir: PathBuf,
    /// The host the data plane listens on (port chosen by the OS). Not loopback: the data port
    /// requires the job token.
    pub listen_host: String,
    /// The host other workers reach this one's data port at (default: `listen_host`, or, when
    /// that is a wildcard such as 0.0.0.0, this host's address on its route to the coordinator).
    pub advertise_host: Option<String>,
    /// The job token this worker presents to the coordinator and to other workers, and that its
    /// data port requires when not on loopback.
    pub token: Option<Token>,
    /// TLS, if the job runs it (`--tls-cert/--tls-key/--tls-ca`): the data port accepts only
    /// TLS, and every connection this worker opens checks the listener's certificate.
    pub tls: Option<koala_types::tls::Tls>,
    /// Builds the job graph from a query name and parameters.
    pub resolver: QueryResolver,
    /// Warm state (`koala warmup`): before it reports `Deployed`, each stateful task of this
    /// worker loads the buckets it owns from `<dir>/<operator name>`, if that holds a snapshot.
    pub warm_state: Option<PathBuf>,
}

/// How often a worker tells the coordinator it is alive.
const HEARTBEAT_EVERY: Duration = Duration::from_secs(1);

struct Job {
    /// The deployment the job's first tasks start with (later tasks start with their plan's).
    initial: Arc<Deployment>,
    links: Links,
    /// Tasks created but not started yet (between `Deploy` and `Start`).
    pending: Vec<(TaskId, TaskQueues)>,
    commands: HashMap<TaskId, Sender<TaskCommand>>,
    plans: HashMap<Epoch, Arc<ReconfigPlan>>,
}

/// Runs a worker until the coordinator says `Shutdown` (Ok) or disappears (Err).
pub fn run_worker(options: WorkerOptions) -> Result<(), RuntimeError> {
    let listener = TcpListener::bind((options.listen_host.as_str(), 0))
        .map_err(|e| RuntimeError::io(format!("binding the data plane on {}", options.listen_host), e))?;
    let bound = listener.local_addr().map_err(|e| RuntimeError::io("reading the data address", e))?;
    let gate = Gate::for_listener("data port", bound.ip(), options.token.clone(), GateLimits::default())
        .map_err(RuntimeError::Control)?;
    if options.tls.as_ref().is_some_and(|t| !t.can_listen()) {
        return Err(RuntimeError::Control(
            "TLS is on (--tls-ca) but the data port has no certificate: give --tls-cert and --tls-key \
             (a certificate naming the host other workers dial, `koala certs`)"
                .into(),
        ));
    }
    // Bounded, and a peer that is not a control port (the HTTP API) is named.
    let limits = ControlLimits::default();
    let stream = connect_control(&options.coordinator, Role::Worker, options.token.as_ref(), options.tls.as_ref(), limits)
        .map_err(|e| {
            tracing::error!(coordinator = %options.coordinator, error = %e, "could not register with the coordinator");
            RuntimeError::io(format!("registering with the coordinator at {}", options.coordinator), e)
        })?;
    let data_addr = advertised(&options, bound, stream.tcp());
    let inboxes: Inboxes = Arc::new(RwLock::new(HashMap::new()));
    let link = Arc::new(SharedLink::default());
    {
        let inboxes = inboxes.clone();
        let link = link.clone();
        let tls = options.tls.clone();
        std::thread::Builder::new()
            .name("koala-data-listener".into())
            .spawn(move || serve(listener, inboxes, link, gate, tls))
            .map_err(|e| RuntimeError::io("spawning the data listener", e))?;
    }
    let (read_half, mut write_half) =
        stream.split().map_err(|e| RuntimeError::io("splitting the control connection", e))?;
    write_frame(
        &mut write_half,
        &ControlHello::Worker { data_addr: data_addr.to_string(), pid: std::process::id() },
    )
    .and_then(|_| write_half.flush())
    .map_err(|e| RuntimeError::io("registering with the coordinator", e))?;
    let mut reader = BufReader::new(read_half);
    let (out_tx, out_rx) = unbounded::<WorkerMessage>();
    std::thread::Builder::new()
        .name("koala-control-out".into())
        .spawn(move || forward_to_coordinator(write_half, &out_rx))
        .map_err(|e| RuntimeError::io("spawning the control writer", e))?;
    {
        let out = out_tx.clone();
        std::thread::Builder::new()
            .name("koala-heartbeat".into())
            .spawn(move || {
                while out.send(WorkerMessage::Heartbeat).is_ok() {
                    std::thread::sleep(HEARTBEAT_EVERY);
                }
            })
            .map_err(|e| RuntimeError::io("spawning the heartbeat thread", e))?;
    }
    let send = |m: WorkerMessage| {
        out_tx.send(m).map_err(|_| RuntimeError::Control("the control connection closed".into()))
    };

    let mut me = WorkerId(u32::MAX);
    let mut data_dir = options.data_dir.clone();
    let mut job: Option<Job> = None;
    let mut env: Option<Arc<dyn StateEnv>> = None;
    let mut memory: Option<Arc<WorkerMemory>> = None;
    loop {
        let msg: CoordinatorMessage = match read_frame(&mut reader) {
            Ok(Some(m)) => m,
            Ok(None) => return Err(RuntimeError::Control("the coordinator closed the connection".into())),
            Err(e) => return Err(RuntimeError::io("reading from the coordinator", e)),
        };
        // Which local tasks hear what: the rule the simulator runs (`koala_protocol::relay`).
        let plan = phase_epoch(&msg).and_then(|e| job.as_ref()?.plans.get(&e).cloned());
        let relayed = relay(&msg, plan.as_deref());
        match msg {
            CoordinatorMessage::Welcome { worker } => {
                me = worker;
                data_dir = data_dir_of(&options.data_dir, worker);
                tracing::info!(
                    %worker, pid = std::process::id(), %data_addr, data_dir = %data_dir.display(),
                    "registered with the coordinator as {worker}"
                );
            }
            CoordinatorMessage::Deploy(d, state) => {
                let env = match &env {
                    Some(env) => env.clone(),
                    None => env
                        .insert(open_state(
                            &data_dir,
                            &state,
                            &link,
                            options.token.as_ref(),
                            options.tls.as_ref(),
                        )?)
                        .clone(),
                };
                let memory = memory
                    .get_or_insert_with(|| {
                        Arc::new(WorkerMemory::new(&state, &d, me, env.clone(), out_tx.clone()))
                    })
                    .clone();
                // Warm state is set-up, not the run: it is restored (into a remote backend's
                // servers too) at full speed, and the emulated link applies from the start.
                link.set_rate(None);
                let rate = d.options.capacity.link_mb_per_sec;
                // A job restored from a checkpoint has its state there: warm state loaded now
                // would only be deleted by each task's restore.
                let warm = options.warm_state.as_ref().filter(|_| d.options.checkpoint.restore.is_none());
                let prepared = prepare(me, *d, &options, &inboxes).and_then(|j| {
                    // Every cache gets its share before its task opens it (the warm restore).
                    memory.add(j.pending.iter().map(|(t, _)| *t).filter(|t| is_stateful(&j, *t)));
                    match warm {
                        Some(dir) => restore_warm_state(
                            &j.initial,
                            &j.links.graph,
                            j.pending.iter().map(|(t, _)| t),
                            env.as_ref(),
                            dir,
                        )
                        .map(|()| j),
                        None => Ok(j),
                    }
                });
                link.set_rate(rate);
                match prepared {
                    Ok(j) => {
                        job = Some(j);
                        send(WorkerMessage::Deployed)?;
                    }
                    Err(error) => send(WorkerMessage::DeployFailed { error })?,
                }
            }
            CoordinatorMessage::Start => {
                let (Some(j), Some(env)) = (job.as_mut(), env.as_ref()) else {
                    return Err(RuntimeError::Control("Start before Deploy".into()));
                };
                let deployment = j.initial.clone();
                for (task, queues) in std::mem::take(&mut j.pending) {
                    spawn_task(task, &deployment, &j.links, env, queues, &out_tx, false, memory.as_ref())?;
                }
            }
            CoordinatorMessage::StopSources => {
                if let Some(j) = &job {
                    for (task, tx) in &j.commands {
                        if j.links.graph.operator(task.operator).is_some_and(|o| o.is_source()) {
                            let _ = tx.send(TaskCommand::StopSource);
                        }
                    }
                }
            }
            CoordinatorMessage::Prepare(plan) => {
                let (Some(j), Some(env)) = (job.as_mut(), env.as_ref()) else {
                    return Err(RuntimeError::Control("Prepare before Deploy".into()));
                };
                prepare_reconfiguration(j, Arc::new(*plan), env, &out_tx, memory.as_ref(), &relayed)?;
            }
            CoordinatorMessage::Drain { epoch } => {
                if let Some(j) = &job {
                    if plan.is_none() {
                        tracing::error!(epoch, "drain of an unknown reconfiguration; ignored");
                    }
                    send_to(j, &relayed, |r| match r {
                        Relayed::Drain => TaskCommand::Drain { epoch },
                        _ => TaskCommand::HandOver { epoch },
                    });
                }
            }
            CoordinatorMessage::Resume { epoch } | CoordinatorMessage::Switch { epoch } => {
                // The last phase for upstream tasks: stop-and-restart resumes them, Koala switches
                // them without a pause; either way they take the plan's routing.
                if let Some(j) = job.as_mut() {
                    let Some(plan) = j.plans.remove(&epoch) else {
                        return Err(RuntimeError::Control(format!(
                            "routing switch of unknown epoch {epoch}"
                        )));
                    };
                    // Only the live upstream tasks the plan names: a cancelled task that still
                    // serves state (Koala) must not switch and send markers to the operator.
                    let switch = Arc::new(RoutingSwitch::to_plan(plan));
                    send_to(j, &relayed, |r| match r {
                        Relayed::HandOver => TaskCommand::HandOver { epoch },
                        Relayed::Resume => TaskCommand::Resume(switch.clone()),
                        _ => TaskCommand::Switch(switch.clone()),
                    });
                }
            }
            CoordinatorMessage::Begin { reconfiguration, tasks } => {
                if let Some(j) = &job {
                    let reconfiguration = Arc::new(*reconfiguration);
                    debug_assert_eq!(relayed.len(), tasks.len());
                    send_to(j, &relayed, |_| TaskCommand::Begin(reconfiguration.clone()));
                }
            }
            CoordinatorMessage::UpstreamEnded { upstream, .. } => {
                if let Some(j) = &job {
                    send_to(j, &relayed, |_| TaskCommand::UpstreamEnded(upstream));
                }
            }
            CoordinatorMessage::Release { .. } => {
                if let Some(j) = &job {
                    send_to(j, &relayed, |_| TaskCommand::Release);
                }
            }
            CoordinatorMessage::Drrs(control) => {
                if let Some(j) = job.as_mut() {
                    // The DRRS core decides what the tasks hear (docs/protocols.md §11).
                    match control.into_command(&mut j.plans).map_err(RuntimeError::Control)? {
                        DrrsCommand::Begin(s) => send_to(j, &relayed, |_| TaskCommand::DrrsBegin(s.clone())),
                        DrrsCommand::Switch(p) => send_to(j, &relayed, |_| TaskCommand::Switch(p.clone())),
                    }
                }
            }
            CoordinatorMessage::Checkpoint { id } => {
                if let Some(j) = &job {
                    send_to_kind(j, |o| o.is_source(), || TaskCommand::Checkpoint(id));
                }
            }
            CoordinatorMessage::CheckpointCommitted { id } => {
                if let Some(j) = &job {
                    send_to_kind(
                        j,
                        |o| matches!(o.kind, OperatorKind::Sink { .. }),
                        || TaskCommand::CheckpointCommitted(id),
                    );
                }
            }
            CoordinatorMessage::Restart => {
                tracing::warn!(worker = %me, "restarting for a recovery from the last checkpoint");
                return Err(restart_process());
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

/// The data address other workers dial: `advertise_host`, else the bound address, unless that
/// is a wildcard (0.0.0.0, ::), then this host's address on its route to the coordinator.
fn advertised(options: &WorkerOptions, bound: std::net::SocketAddr, control: &TcpStream) -> String {
    match (&options.advertise_host, control.local_addr()) {
        (Some(host), _) if host.contains(':') => format!("[{host}]:{}", bound.port()),
        (Some(host), _) => format!("{host}:{}", bound.port()),
        (None, Ok(local)) if bound.ip().is_unspecified() => {
            std::net::SocketAddr::new(local.ip(), bound.port()).to_string()
        }
        (None, _) => bound.to_string(),
    }
}

fn forward_to_coordinator(stream: ConnWriter, rx: &Receiver<WorkerMessage>) {
    let mut w = BufWriter::new(stream);
    while let Ok(m) = rx.recv() {
        if write_frame(&mut w, &m).and_then(|_| w.flush()).is_err() {
            tracing::error!("lost the control connection to the coordinator");
            return;
        }
    }
}

/// Builds the graph and the input queues of this worker's tasks.
fn prepare(me: WorkerId, d: Deployment, options: &WorkerOptions, inboxes: &Inboxes) -> Result<Job, String> {
    let graph = (options.resolver)(&d.query, &d.query_params)?;
    koala_types::name_operators(graph.operators.iter().map(|o| o.name.clone()).collect());
    for (op, tasks) in &d.tasks {
        if graph.operator(*op).is_none() || tasks.is_empty() {
            return Err(format!(
                "deployment names operator {op} with {} tasks, which the query lacks",
                tasks.len()
            ));
        }
    }
    let mut pending = Vec::new();
    let mut commands = HashMap::new();
    for (task, worker) in &d.placement {
        if *worker == me && d.live(task.operator).contains(&task.index) {
            let (queues, ctx) = create_inbox(*task, d.options.channel_capacity, inboxes)?;
            commands.insert(*task, ctx);
            pending.push((*task, queues));
        }
    }
    let links = Links {
        me,
        graph: Arc::new(graph),
        inboxes: inboxes.clone(),
        token: options.token.clone(),
        tls: options.tls.clone(),
    };
    Ok(Job { initial: Arc::new(d), links, pending, commands, plans: HashMap::new() })
}

/// The receiving ends of a task's queues.
pub(crate) struct TaskQueues {
    pub(crate) data: DataReceiver,
    pub(crate) peer: Receiver<TaskInput>,
    pub(crate) fetch: Receiver<TaskInput>,
    pub(crate) commands: Receiver<TaskCommand>,
}

/// Creates a task's queues (docs/architecture.md §4) and registers their sending ends.
pub(crate) fn create_inbox(
    task: TaskId,
    capacity: usize,
    inboxes: &Inboxes,
) -> Result<(TaskQueues, Sender<TaskCommand>), String> {
    let (data_tx, data) = data_queue(capacity);
    let (peer_tx, peer) = bounded(peer_capacity(capacity));
    // Bounded by credit, not by the queue (crate::peer): nobody may ever wait for room here.
    let (fetch_tx, fetch) = unbounded();
    let (ctx, commands) = unbounded();
    inboxes
        .write()
        .map_err(|_| "inbox registry poisoned".to_string())?
        .insert(task, TaskInboxes { data: data_tx, peer: peer_tx, fetch: fetch_tx });
    Ok((TaskQueues { data, peer, fetch, commands }, ctx))
}

/// Reconfiguration phase 1 on this worker: start the operator's new tasks placed here, tell its
/// local tasks their part, and tell local consumers of the operator which channels to expect.
fn prepare_reconfiguration(
    job: &mut Job,
    plan: Arc<ReconfigPlan>,
    env: &Arc<dyn StateEnv>,
    events: &Sender<WorkerMessage>,
    memory: Option<&Arc<WorkerMemory>>,
    relayed: &[(TaskId, Relayed)],
) -> Result<(), RuntimeError> {
    let op = plan.operator;
    let d = &plan.deployment;
    let me = job.links.me;
    for &index in &plan.created {
        let task = TaskId::new(op, index);
        if d.placement.get(&task) != Some(&me) {
            continue;
        }
        let (queues, ctx) = create_inbox(task, d.options.channel_capacity, &job.links.inboxes)
            .map_err(RuntimeError::Control)?;
        job.commands.insert(task, ctx);
        if let Some(memory) = memory
            && is_stateful(job, task)
        {
            // The new task's share, and the smaller shares of the others, before it opens its store.
            memory.add([task]);
        }
        spawn_task(task, &Arc::new(d.clone()), &job.links, env, queues, events, true, memory)?;
    }
    send_to(job, relayed, |_| TaskCommand::Prepare(plan.clone()));
    for (consumer, input) in job.links.graph.consumers(op) {
        let edge = Edge::new(op, consumer, job.links.graph.is_forward_stateless(consumer, input));
        for (task, tx) in &job.commands {
            // Live, unfinished consumers only (the rule the simulator checks): a retired one
            // (Koala) gets no channel from the new tasks.
            if task.operator != consumer {
                continue;
            }
            let Some(channels) = consumer_inputs(&plan, &edge, input, *task) else { continue };
            let _ = tx.send(TaskCommand::AddInputs { epoch: plan.epoch, channels });
        }
    }
    job.plans.insert(plan.epoch, plan);
    Ok(())
}

/// The epoch whose plan a phase message is read against.
fn phase_epoch(msg: &CoordinatorMessage) -> Option<Epoch> {
    match msg {
        CoordinatorMessage::Drain { epoch }
        | CoordinatorMessage::Switch { epoch }
        | CoordinatorMessage::Resume { epoch } => Some(*epoch),
        _ => None,
    }
}

/// Sends each relayed task that runs on this worker its command (others are skipped; a task
/// that already finished is logged, not an error: its work is done).
fn send_to(job: &Job, relayed: &[(TaskId, Relayed)], command: impl Fn(Relayed) -> TaskCommand) {
    for &(task, r) in relayed {
        if let Some(tx) = job.commands.get(&task)
            && tx.send(command(r)).is_err()
        {
            tracing::debug!(%task, "command to a task that already finished");
        }
    }
}

/// Sends every local task of the operators `which` selects a command.
fn send_to_kind(
    job: &Job,
    which: impl Fn(&koala_dataflow::OperatorSpec) -> bool,
    command: impl Fn() -> TaskCommand,
) {
    for (task, tx) in &job.commands {
        if job.links.graph.operator(task.operator).is_some_and(&which) && tx.send(command()).is_err() {
            tracing::debug!(%task, "checkpoint command to a task that already finished");
        }
    }
}

/// Recovery (docs/architecture.md §10): the process replaces itself with a fresh copy of the
/// same command (same pid, same arguments), which registers with the coordinator again. Every
/// task, queue, connection and open store of the failed run is gone at once, so nothing of it
/// can reach the restored job. Returns only if that failed.
fn restart_process() -> RuntimeError {
    use std::os::unix::process::CommandExt;
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => return RuntimeError::io("finding the worker's executable to restart it", e),
    };
    let e = std::process::Command::new(&exe).args(std::env::args_os().skip(1)).exec();
    RuntimeError::io(format!("restarting the worker as {}", exe.display()), e)
}

/// Whether `task` is of a stateful operator (it shares the worker's memory budget).
fn is_stateful(job: &Job, task: TaskId) -> bool {
    job.links.graph.operator(task.operator).is_some_and(|o| o.is_stateful())
}

/// Starts a task's thread; when it ends, the task leaves `memory`'s split (if it was in it).
#[allow(clippy::too_many_arguments)]
pub(crate) fn spawn_task(
    task: TaskId,
    deployment: &Arc<Deployment>,
    links: &Links,
    env: &Arc<dyn StateEnv>,
    queues: TaskQueues,
    events: &Sender<WorkerMessage>,
    created_by_reconfiguration: bool,
    memory: Option<&Arc<WorkerMemory>>,
) -> Result<(), RuntimeError> {
    let memory = memory.cloned();
    let d = deployment.clone();
    let links = links.clone();
    let env = env.clone();
    let events = events.clone();
    std::thread::Builder::new()
        .name(format!("koala-task-{task}"))
        .spawn(move || {
            let leave = || {
                if let Some(memory) = &memory {
                    memory.remove(task);
                }
            };
            let setup =
                match build_setup(task, d, links, &env, queues, events.clone(), created_by_reconfiguration) {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::error!(%task, error = %e, "task could not start");
                        let _ = events.send(WorkerMessage::TaskFailed { task, error: e.to_string() });
                        leave();
                        return;
                    }
                };
            let body = match setup.spec.kind {
                OperatorKind::Source { .. } => run_source,
                OperatorKind::Transform { .. } => run_operator,
                OperatorKind::Sink { .. } => run_sink,
            };
            run_task(setup, body);
            leave();
        })
        .map_err(|e| RuntimeError::io("spawning a task thread", e))?;
    Ok(())
}

fn build_setup(
    task: TaskId,
    d: Arc<Deployment>,
    links: Links,
    env: &Arc<dyn StateEnv>,
    queues: TaskQueues,
    events: Sender<WorkerMessage>,
    created_by_reconfiguration: bool,
) -> Result<TaskSetup, RuntimeError> {
    let graph: &JobGraph = &links.graph;
    let spec = graph.operator(task.operator).cloned().ok_or(RuntimeError::UnknownOperator(task.operator))?;
    let outputs = build_outputs(&links, &d, task)?;
    let store = match spec.is_stateful() {
        true => Some(crate::checkpoint::tracked_store(
            env.open_task(task)?,
            &d.options,
            d.protocol,
            d.num_buckets,
        )),
        false => None,
    };
    if let Some(store) = store.as_deref()
        && created_by_reconfiguration
        && d.protocol != koala_protocol::Protocol::Remote
    {
        // A new task owns nothing yet, so its private store starts empty: a store of the same
        // task left by an attempt a recovery rolled back (or by an earlier task of that index)
        // would otherwise answer Koala's local-first lookups with stale state.
        store.delete_buckets(&(0..d.num_buckets).collect::<Vec<_>>())?;
    }
    Ok(TaskSetup {
        task,
        parallelism: d.live(task.operator).len() as u32,
        inputs: input_channels(&d, graph, task),
        spec,
        inbox: queues.data,
        peer_inbox: queues.peer,
        fetch_inbox: queues.fetch,
        commands: queues.commands,
        events,
        outputs,
        options: d.options.clone(),
        num_buckets: d.num_buckets,
        store,
        deployment: d,
        created_by_reconfiguration,
        links,
    })
}
