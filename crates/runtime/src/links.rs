//! How a task's channels follow from a deployment: which channels it receives on, and the
//! output edges (route + one channel per downstream task) it sends on. Used when a task starts
//! and again when a reconfiguration changes the routing of an edge.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use koala_dataflow::{JobGraph, Partitioning};
use koala_protocol::koala::{RouterEvent, UpstreamRouter};
use koala_protocol::switch::{RoutingSwitch, SwitchedEdge};
use koala_protocol::{Deployment, plan};
use koala_types::{OperatorId, TaskId, WorkerId};

use crate::RuntimeError;
use crate::channel::{ChannelSender, InputChannel, PEER_INPUT};
use crate::net::{Inboxes, TaskInboxes};
use crate::output::{OutputEdge, Outputs, Spread};
use crate::peer::PeerSender;

/// What a task needs to open channels: where it runs, the graph, and the local input queues.
#[derive(Clone)]
pub struct Links {
    /// This worker.
    pub me: WorkerId,
    /// The job graph.
    pub graph: Arc<JobGraph>,
    /// Input queues of this worker's tasks.
    pub inboxes: Inboxes,
    /// The job token channels to other workers present (`None`: the job has none).
    pub token: Option<koala_types::handshake::Token>,
    /// TLS, if the job runs it: channels to other workers check their certificates.
    pub tls: Option<koala_types::tls::Tls>,
}

/// Whether input `input` of `consumer` connects task i to task i only in `d`
/// ([`koala_protocol::plan::is_one_to_one`], the rule the coordinator plans by).
pub fn is_one_to_one(d: &Deployment, graph: &JobGraph, consumer: OperatorId, input: usize) -> bool {
    edge(graph, consumer, input).is_some_and(|e| plan::is_one_to_one(d, &e))
}

/// Input `input` of `consumer` as planning sees it.
fn edge(graph: &JobGraph, consumer: OperatorId, input: usize) -> Option<plan::Edge> {
    let from = graph.operator(consumer)?.inputs.get(input)?.from;
    Some(plan::Edge::new(from, consumer, graph.is_forward_stateless(consumer, input)))
}

/// The channels a task receives on (peer channels excluded).
pub fn input_channels(d: &Deployment, graph: &JobGraph, task: TaskId) -> BTreeSet<InputChannel> {
    let mut out = BTreeSet::new();
    let Some(spec) = graph.operator(task.operator) else { return out };
    for (i, input) in spec.inputs.iter().enumerate() {
        let froms: Vec<TaskId> = if is_one_to_one(d, graph, task.operator, i) {
            vec![TaskId::new(input.from, task.index)]
        } else {
            d.live(input.from).iter().map(|u| TaskId::new(input.from, *u)).collect()
        };
        // A finished upstream sent its end of stream already; a task created later never hears
        // from it.
        out.extend(
            froms.into_iter().filter(|f| !d.finished.contains(f)).map(|from| InputChannel { input: i, from }),
        );
    }
    out
}

/// Where a task runs: its queues on this worker, or the data address of its worker.
enum Place {
    Local(TaskInboxes),
    Remote(String),
}

fn place(links: &Links, d: &Deployment, to: TaskId) -> Result<Place, RuntimeError> {
    let worker = d.placement.get(&to).ok_or(RuntimeError::NotPlaced(to))?;
    if *worker == links.me {
        let inboxes =
            links.inboxes.read().ok().and_then(|m| m.get(&to).cloned()).ok_or(RuntimeError::NoInbox(to))?;
        Ok(Place::Local(inboxes))
    } else {
        Ok(Place::Remote(d.workers.get(worker).ok_or(RuntimeError::NoAddress(*worker))?.clone()))
    }
}

/// Opens a data or fetch-lane channel to `to` as `d` places it (peer lanes: [`open_peer`]).
pub fn open_channel(
    links: &Links,
    d: &Deployment,
    to: TaskId,
    channel: InputChannel,
) -> Result<ChannelSender, RuntimeError> {
    // A blocking send into a bounded peer lane could deadlock two tasks sending to each other.
    debug_assert_ne!(channel.input, PEER_INPUT, "peer lanes are opened with open_peer");
    match place(links, d, to)? {
        Place::Local(inboxes) => {
            Ok(ChannelSender::Local { to, inbox: inboxes.for_input(channel.input), channel })
        }
        Place::Remote(addr) => {
            ChannelSender::connect(&addr, to, channel, links.token.as_ref(), links.tls.as_ref())
        }
    }
}

/// Opens the peer lane from `from` to `to` as `d` places them.
pub fn open_peer(
    links: &Links,
    d: &Deployment,
    to: TaskId,
    from: TaskId,
) -> Result<PeerSender, RuntimeError> {
    let channel = InputChannel { input: PEER_INPUT, from };
    match place(links, d, to)? {
        Place::Local(inboxes) => Ok(PeerSender::local(to, inboxes.peer, channel)),
        Place::Remote(addr) => {
            PeerSender::connect(&addr, to, channel, links.token.as_ref(), links.tls.as_ref())
        }
    }
}

/// Where the edge from `task` to input `input` of `consumer` sends in `d`: its routing table
/// (bucket → task; empty unless the edge is keyed) and the tasks it has a channel to.
fn edge_routing(
    d: &Deployment,
    graph: &JobGraph,
    task: TaskId,
    consumer: OperatorId,
    input: usize,
) -> Result<(Vec<TaskId>, Vec<TaskId>), RuntimeError> {
    let spec = graph.operator(consumer).ok_or(RuntimeError::UnknownOperator(consumer))?;
    if is_one_to_one(d, graph, consumer, input) {
        return Ok((Vec::new(), vec![TaskId::new(consumer, task.index)]));
    }
    let outputs: Vec<TaskId> = d.live(consumer).iter().map(|&j| TaskId::new(consumer, j)).collect();
    if !matches!(spec.inputs[input].partitioning, Partitioning::Key(_)) {
        return Ok((Vec::new(), outputs));
    }
    let table = d
        .routing
        .get(&consumer)
        .ok_or_else(|| RuntimeError::deployment(&spec.name, "a keyed operator without a routing table"))?;
    let table: Vec<TaskId> = table.iter().map(|&i| TaskId::new(consumer, i)).collect();
    if let Some(t) = table.iter().find(|t| !outputs.contains(t)) {
        return Err(RuntimeError::deployment(
            &spec.name,
            format!("routing names task {t}, which is not live"),
        ));
    }
    Ok((table, outputs))
}

/// The routing core's event that switches the edge from `task` to input `input` of the switched
/// operator ([`RoutingSwitch::event`]: the rule the simulator's upstreams follow too).
pub fn switch_event(
    switch: &RoutingSwitch,
    graph: &JobGraph,
    task: TaskId,
    input: usize,
    resume: bool,
) -> Result<RouterEvent, RuntimeError> {
    let consumer = switch.operator;
    let spec = graph.operator(consumer).ok_or(RuntimeError::UnknownOperator(consumer))?;
    let edge = edge(graph, consumer, input).ok_or(RuntimeError::UnknownOperator(consumer))?;
    let keyed = matches!(spec.inputs[input].partitioning, Partitioning::Key(_));
    switch
        .event(SwitchedEdge { edge, keyed }, task, resume)
        .map_err(|e| RuntimeError::deployment(&spec.name, e.to_string()))
}

/// The edge from `task` to input `input` of `consumer` as `d` deploys it: its routing core and
/// a channel to each of its outputs.
pub fn build_edge(
    links: &Links,
    d: &Deployment,
    task: TaskId,
    consumer: OperatorId,
    input: usize,
) -> Result<OutputEdge, RuntimeError> {
    let spec = links.graph.operator(consumer).ok_or(RuntimeError::UnknownOperator(consumer))?;
    let (table, outputs) = edge_routing(d, &links.graph, task, consumer, input)?;
    let channel = InputChannel { input, from: task };
    let targets =
        outputs.iter().map(|&to| open_channel(links, d, to, channel)).collect::<Result<Vec<_>, _>>()?;
    let refused =
        |e: koala_protocol::koala::ProtocolError| RuntimeError::deployment(&spec.name, e.to_string());
    let (spread, router) = match &spec.inputs[input].partitioning {
        Partitioning::Key(key_fn) if !table.is_empty() => {
            (Spread::Key(key_fn.clone()), UpstreamRouter::keeping(table, outputs).map_err(refused)?)
        }
        _ => (Spread::RoundRobin, UpstreamRouter::unkeyed(outputs).map_err(refused)?),
    };
    OutputEdge::new(consumer, input, spread, router, targets)
}

/// All output edges of `task`.
pub fn build_outputs(links: &Links, d: &Deployment, task: TaskId) -> Result<Outputs, RuntimeError> {
    let mut edges = Vec::new();
    for (consumer, input) in links.graph.consumers(task.operator) {
        edges.push(build_edge(links, d, task, consumer, input)?);
    }
    Ok(Outputs::new(edges, d.options.batch_records, Duration::from_millis(d.options.linger_ms)))
}
