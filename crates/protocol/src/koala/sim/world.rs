//! The simulated job: upstream routers, target task cores with their stores, the coordinator, and
//! every channel between them as a FIFO queue. A step delivers the head of one randomly chosen
//! non-empty channel (or lets a source emit, or nudges an idle task), so every interleaving that
//! respects per-channel FIFO is reachable.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use koala_types::{ChannelMessage, Epoch, OperatorId, Record, TaskId, Timestamp};

use super::rng::SplitMix64;
use super::scenario::TARGET;
use super::{Fault, SimConfig, SimStats};
use crate::koala::{
    CoordinatorAction, CoordinatorEvent, FetchRequest, FetchResponse, KeyedOperator, KoalaCoordinator,
    KoalaTask, NewAssignment, PeerMessage, Reconfiguration, RouterAction, RouterEvent, TaskAck, TaskConfig,
    TaskEvent, UpstreamRouter,
};

/// An endpoint of a channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Node {
    Upstream(TaskId),
    Task(TaskId),
    Coordinator,
}

/// Channels between the same endpoints that are independent connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Kind {
    Data,
    Peer,
    State,
    Control,
}

/// What travels on a channel.
#[derive(Clone, Debug)]
pub(crate) enum Msg {
    Data(ChannelMessage),
    Peer(PeerMessage),
    FetchRequest(FetchRequest),
    FetchResponse(FetchResponse),
    Start(Arc<Reconfiguration>),
    Switch {
        epoch: Epoch,
        assignment: Vec<TaskId>,
    },
    Ack(Epoch, TaskAck),
    /// An upstream finished (to the coordinator, as the job's coordinator hears of it).
    UpstreamEnded(TaskId),
    /// The coordinator tells a new task that an upstream finished before it switched.
    EndedUpstream(TaskId),
}

type ChannelKey = (Node, Node, Kind);

/// All FIFO queues, with the set of non-empty ones kept for O(1) random choice.
#[derive(Default)]
pub(crate) struct Channels {
    queues: Vec<(ChannelKey, VecDeque<Msg>)>,
    index: BTreeMap<ChannelKey, usize>,
    nonempty: Vec<usize>,
    position: Vec<Option<usize>>,
}

impl Channels {
    pub(crate) fn push(&mut self, key: ChannelKey, msg: Msg) {
        let id = match self.index.get(&key) {
            Some(&id) => id,
            None => {
                self.queues.push((key, VecDeque::new()));
                self.position.push(None);
                self.index.insert(key, self.queues.len() - 1);
                self.queues.len() - 1
            }
        };
        self.queues[id].1.push_back(msg);
        if self.position[id].is_none() {
            self.position[id] = Some(self.nonempty.len());
            self.nonempty.push(id);
        }
    }

    pub(crate) fn nonempty(&self) -> usize {
        self.nonempty.len()
    }

    /// Pops the head of the `i`-th non-empty channel.
    pub(crate) fn pop(&mut self, i: usize) -> Option<(ChannelKey, Msg)> {
        let id = *self.nonempty.get(i)?;
        let (key, queue) = &mut self.queues[id];
        let msg = queue.pop_front()?;
        let key = *key;
        if queue.is_empty() {
            self.position[id] = None;
            self.nonempty.swap_remove(i);
            if let Some(&moved) = self.nonempty.get(i) {
                self.position[moved] = Some(i);
            }
        }
        Some((key, msg))
    }
}

/// A target task with the store the runtime would keep next to it.
pub(crate) struct SimTask {
    pub(crate) core: KoalaTask,
    pub(crate) store: BTreeMap<Vec<u8>, u64>,
    pub(crate) last_watermark: Option<Timestamp>,
    pub(crate) released: bool,
    /// Event-time timers (time, key): every processed record sets one at its own time (a
    /// window's end); they fire when the task emits a watermark at or past them and travel
    /// with their bucket's hand-over.
    pub(crate) timers: BTreeSet<(Timestamp, Vec<u8>)>,
}

/// An upstream task: a source of keyed records plus its router.
pub(crate) struct SimUpstream {
    pub(crate) id: TaskId,
    pub(crate) router: UpstreamRouter,
    clock: Timestamp,
    remaining: usize,
    ended: bool,
}

/// The whole simulated job.
pub(crate) struct World {
    pub(crate) cfg: SimConfig,
    pub(crate) rng: SplitMix64,
    pub(crate) step: u64,
    pub(crate) channels: Channels,
    pub(crate) tasks: BTreeMap<TaskId, SimTask>,
    pub(crate) upstreams: Vec<SimUpstream>,
    pub(crate) coordinator: KoalaCoordinator,
    targets: Vec<Vec<TaskId>>,
    triggers: Vec<u64>,
    next_request: usize,
    extra_keys: usize,
    pub(crate) claims: Vec<Option<TaskId>>,
    pub(crate) holder: BTreeMap<Vec<u8>, TaskId>,
    pub(crate) emitted: BTreeMap<Vec<u8>, u64>,
    pub(crate) emitted_total: u64,
    pub(crate) processed_total: u64,
    early_switched: BTreeSet<Epoch>,
    pub(crate) stats: SimStats,
    /// Upstreams whose end the coordinator has heard of.
    pub(crate) finished: BTreeSet<TaskId>,
}

impl World {
    pub(crate) fn new(cfg: SimConfig) -> Result<Self, String> {
        if cfg.upstreams == 0 || cfg.keys < cfg.upstreams || cfg.num_buckets < 8 {
            return Err("the simulator needs an upstream, a key per upstream and 8 buckets".into());
        }
        let mut rng = SplitMix64::new(cfg.seed);
        let (initial, targets, extra_keys) = cfg.scenario.plan(cfg.num_buckets, &mut rng);
        let up_ids: Vec<TaskId> = (0..cfg.upstreams as u32).map(|i| TaskId::new(OperatorId(0), i)).collect();
        let total = (cfg.upstreams * cfg.records_per_upstream) as u64;
        let mut triggers: Vec<u64> = targets.iter().map(|_| rng.next_u64() % total.max(1)).collect();
        triggers.sort_unstable();
        let mut coordinator = KoalaCoordinator::new();
        if cfg.fault == Some(Fault::ReleaseWithoutEpoch) {
            coordinator.inject_fault_release_without_epoch();
        }
        let spec = KeyedOperator {
            operator: TARGET,
            assignment: initial.clone(),
            upstreams: up_ids.iter().copied().collect(),
        };
        coordinator.register(spec).map_err(|e| e.to_string())?;
        let mut tasks = BTreeMap::new();
        for &id in initial.iter().collect::<BTreeSet<_>>() {
            let owned = (0..cfg.num_buckets).filter(|&b| initial[usize::from(b)] == id).collect();
            let config = TaskConfig {
                id,
                num_buckets: cfg.num_buckets,
                owned,
                upstreams: up_ids.iter().copied().collect(),
            };
            tasks.insert(id, Self::sim_task(KoalaTask::new(config), cfg.fault));
        }
        let mut upstreams = Vec::new();
        for &id in &up_ids {
            let router = UpstreamRouter::new(initial.clone()).map_err(|e| e.to_string())?;
            upstreams.push(SimUpstream {
                id,
                router,
                clock: 0,
                remaining: cfg.records_per_upstream,
                ended: false,
            });
        }
        Ok(Self {
            claims: initial.iter().map(|&t| Some(t)).collect(),
            cfg,
            rng,
            step: 0,
            channels: Channels::default(),
            tasks,
            upstreams,
            coordinator,
            targets,
            triggers,
            next_request: 0,
            extra_keys,
            holder: BTreeMap::new(),
            emitted: BTreeMap::new(),
            emitted_total: 0,
            processed_total: 0,
            early_switched: BTreeSet::new(),
            finished: BTreeSet::new(),
            stats: SimStats { progressive: extra_keys > 0, ..SimStats::default() },
        })
    }

    fn sim_task(mut core: KoalaTask, fault: Option<Fault>) -> SimTask {
        if fault == Some(Fault::NoParking) {
            core.inject_fault_no_parking();
        }
        SimTask {
            core,
            store: BTreeMap::new(),
            last_watermark: None,
            released: false,
            timers: BTreeSet::new(),
        }
    }

    /// Runs to quiescence; `Err` names the first violated invariant.
    pub(crate) fn run(&mut self) -> Result<(), String> {
        loop {
            self.step += 1;
            if self.step > self.cfg.max_steps {
                return Err(format!(
                    "no quiescence after {} steps (livelock or stuck epoch)",
                    self.cfg.max_steps
                ));
            }
            let sources: Vec<usize> = (0..self.upstreams.len()).filter(|&u| self.can_emit(u)).collect();
            let channels = self.channels.nonempty();
            if channels == 0 && sources.is_empty() {
                if !self.nudge_idle()? {
                    return self.check_end();
                }
                continue;
            }
            // One extra choice: an idle nudge to a random task (progressive migration runs on idle).
            let pick = self.rng.below(channels + sources.len() + 1);
            if pick < channels {
                if let Some(((from, to, _), msg)) = self.channels.pop(pick) {
                    self.deliver(from, to, msg)?;
                }
            } else if pick < channels + sources.len() {
                self.emit(sources[pick - channels])?;
            } else {
                let ids: Vec<TaskId> =
                    self.tasks.iter().filter(|(_, t)| !t.released).map(|(&id, _)| id).collect();
                let id = ids[self.rng.below(ids.len())];
                self.feed(id, TaskEvent::Idle)?;
            }
        }
    }

    fn can_emit(&self, u: usize) -> bool {
        // A source may end at any time, also in the middle of a reconfiguration.
        let up = &self.upstreams[u];
        up.remaining > 0 || !up.ended
    }

    /// With nothing in flight, gives every task an idle turn; true if that produced messages.
    fn nudge_idle(&mut self) -> Result<bool, String> {
        let ids: Vec<TaskId> = self.tasks.iter().filter(|(_, t)| !t.released).map(|(&id, _)| id).collect();
        for id in ids {
            self.feed(id, TaskEvent::Idle)?;
        }
        Ok(self.channels.nonempty() > 0)
    }

    /// A source emits 1–3 records (and maybe a watermark), or its end of stream.
    fn emit(&mut self, u: usize) -> Result<(), String> {
        let up_count = self.upstreams.len();
        let keys_here: Vec<usize> = (0..self.cfg.keys).filter(|k| k % up_count == u).collect();
        let n = 1 + self.rng.below(3);
        let up = &mut self.upstreams[u];
        if up.remaining == 0 {
            up.ended = true;
            let id = up.id;
            let actions = up.router.on(RouterEvent::EndOfStream);
            self.route(u, actions)?;
            self.channels
                .push((Node::Upstream(id), Node::Coordinator, Kind::Control), Msg::UpstreamEnded(id));
            return Ok(());
        }
        let mut records = Vec::new();
        for _ in 0..n.min(self.upstreams[u].remaining) {
            let key = format!("k{}", keys_here[self.rng.below(keys_here.len())]).into_bytes();
            let seq = self.emitted.entry(key.clone()).or_insert(0);
            *seq += 1;
            let up = &mut self.upstreams[u];
            up.clock += 1 + self.rng.below(3) as u64;
            up.remaining -= 1;
            records.push(Record { key, value: seq.to_le_bytes().to_vec(), time: up.clock });
        }
        self.emitted_total += records.len() as u64;
        let actions = self.upstreams[u].router.on(RouterEvent::Records(records));
        self.route(u, actions)?;
        if self.rng.chance(1, 3) || self.upstreams[u].remaining == 0 {
            let clock = self.upstreams[u].clock;
            let actions = self.upstreams[u].router.on(RouterEvent::Watermark(clock));
            self.route(u, actions)?;
        }
        while self.next_request < self.targets.len() && self.triggers[self.next_request] < self.emitted_total
        {
            let request = NewAssignment {
                operator: TARGET,
                assignment: self.targets[self.next_request].clone(),
                extra_keys: self.extra_keys,
                epoch: self.next_request as Epoch + 1,
            };
            self.next_request += 1;
            let actions = self.coordinator.on(CoordinatorEvent::Request(request));
            self.exec_coordinator(actions)?;
        }
        Ok(())
    }

    fn route(&mut self, u: usize, actions: Vec<RouterAction>) -> Result<(), String> {
        let from = self.upstreams[u].id;
        for a in actions {
            match a {
                RouterAction::Send { to, message } => {
                    self.channels.push((Node::Upstream(from), Node::Task(to), Kind::Data), Msg::Data(message))
                }
                RouterAction::Error(e) => {
                    return Err(format!("upstream {from} refused an event: {e}"));
                }
            }
        }
        Ok(())
    }

    fn deliver(&mut self, from: Node, to: Node, msg: Msg) -> Result<(), String> {
        match (to, msg) {
            (Node::Coordinator, Msg::Ack(epoch, ack)) => {
                let Node::Task(from) = from else {
                    return Err("ack from a non-task".into());
                };
                let actions = self.coordinator.on(CoordinatorEvent::Ack { from, epoch, ack });
                self.exec_coordinator(actions)
            }
            (Node::Coordinator, Msg::UpstreamEnded(u)) => {
                // As the job's coordinator does: no later epoch counts on it, and the running
                // epoch's new tasks hear that it finished if it never switched.
                self.finished.insert(u);
                let live =
                    self.upstreams.iter().map(|x| x.id).filter(|x| !self.finished.contains(x)).collect();
                self.coordinator.set_upstreams(TARGET, live);
                let switched = self.upstreams.iter().find(|x| x.id == u).map_or(0, |x| x.router.epoch());
                if let Some(reconf) = self.coordinator.running(TARGET)
                    && switched < reconf.epoch
                {
                    for &n in &reconf.new_tasks {
                        self.channels
                            .push((Node::Coordinator, Node::Task(n), Kind::Control), Msg::EndedUpstream(u));
                    }
                }
                Ok(())
            }
            (Node::Task(id), Msg::EndedUpstream(u)) => {
                if self.tasks.get(&id).is_some_and(|t| t.core.has_upstream(u)) {
                    self.feed(id, TaskEvent::EndOfStream { from: u })?;
                }
                Ok(())
            }
            (Node::Upstream(id), Msg::Switch { epoch, assignment }) => {
                let u = self.upstreams.iter().position(|x| x.id == id).ok_or("switch to unknown upstream")?;
                let actions = self.upstreams[u].router.on(RouterEvent::SwitchRouting { epoch, assignment });
                self.route(u, actions)
            }
            (Node::Task(id), msg) => {
                let src = match from {
                    Node::Upstream(t) | Node::Task(t) => Some(t),
                    Node::Coordinator => None,
                };
                let event = match (msg, src) {
                    (Msg::Data(ChannelMessage::Batch(records)), Some(from)) => {
                        TaskEvent::Records { from, records }
                    }
                    (Msg::Data(ChannelMessage::Watermark(time)), Some(from)) => {
                        TaskEvent::Watermark { from, time }
                    }
                    (Msg::Data(ChannelMessage::Marker(epoch)), Some(from)) => {
                        TaskEvent::Marker { from, epoch }
                    }
                    (Msg::Data(ChannelMessage::EndOfStream), Some(from)) => TaskEvent::EndOfStream { from },
                    (Msg::Peer(message), Some(from)) => TaskEvent::Peer { from, message },
                    (Msg::FetchRequest(request), Some(from)) => TaskEvent::FetchRequest { from, request },
                    (Msg::FetchResponse(response), Some(from)) => TaskEvent::FetchResponse { from, response },
                    (Msg::Start(r), None) => TaskEvent::Start(r),
                    (m, _) => return Err(format!("unroutable message {m:?} to {id}")),
                };
                if self.tasks.get(&id).is_none_or(|t| t.released) {
                    return Err(format!("message for released or unknown task {id}: {event:?}"));
                }
                self.feed(id, event)
            }
            (to, m) => Err(format!("unroutable message {m:?} to {to:?}")),
        }
    }

    /// Feeds an event to a task core and executes its actions.
    pub(crate) fn feed(&mut self, id: TaskId, event: TaskEvent) -> Result<(), String> {
        let Some(task) = self.tasks.get_mut(&id) else {
            return Err(format!("no task {id}"));
        };
        let actions = task.core.on(event);
        // Buckets the core took over in this event came with a hand-over the sender let go of.
        for b in task.core.owned_buckets() {
            match self.claims.get_mut(usize::from(b)) {
                Some(slot @ None) => *slot = Some(id),
                Some(Some(owner)) if *owner == id => {}
                other => {
                    return Err(format!("single owner: {id} takes bucket {b} claimed by {other:?}"));
                }
            }
        }
        for a in actions {
            self.exec_task(id, a)?;
        }
        self.check_claims(id)
    }

    pub(crate) fn exec_coordinator(&mut self, actions: Vec<CoordinatorAction>) -> Result<(), String> {
        for a in actions {
            match a {
                CoordinatorAction::DeployTask { task } => {
                    let config = TaskConfig {
                        id: task,
                        num_buckets: self.cfg.num_buckets,
                        owned: BTreeSet::new(),
                        upstreams: BTreeSet::new(),
                    };
                    let t = Self::sim_task(KoalaTask::new(config), self.cfg.fault);
                    if self.tasks.insert(task, t).is_some() {
                        return Err(format!("task {task} deployed twice"));
                    }
                }
                CoordinatorAction::Start { to, reconfiguration } => {
                    let epoch = reconfiguration.epoch;
                    self.channels.push(
                        (Node::Coordinator, Node::Task(to), Kind::Control),
                        Msg::Start(reconfiguration),
                    );
                    if self.cfg.fault == Some(Fault::SwitchBeforePeerReady)
                        && self.early_switched.insert(epoch)
                    {
                        let assignment =
                            self.targets[usize::try_from(epoch).unwrap_or(1).saturating_sub(1)].clone();
                        for up in self.upstreams.iter().map(|u| u.id).collect::<Vec<_>>() {
                            let msg = Msg::Switch { epoch, assignment: assignment.clone() };
                            self.channels.push((Node::Coordinator, Node::Upstream(up), Kind::Control), msg);
                        }
                    }
                }
                CoordinatorAction::SwitchRouting { to, epoch, assignment } => {
                    if !self.early_switched.contains(&epoch) {
                        self.channels.push(
                            (Node::Coordinator, Node::Upstream(to), Kind::Control),
                            Msg::Switch { epoch, assignment },
                        );
                    }
                }
                CoordinatorAction::Completed { .. } => self.stats.epochs += 1,
                CoordinatorAction::ReleaseTask { task } => {
                    let t = self.tasks.get_mut(&task).ok_or("release of unknown task")?;
                    if !t.store.is_empty() {
                        return Err(format!("{task} released while holding {} keys", t.store.len()));
                    }
                    t.released = true;
                    self.stats.released += 1;
                }
                CoordinatorAction::Aborted { epoch, error, .. } => {
                    return Err(format!("epoch {epoch} aborted: {error}"));
                }
                CoordinatorAction::Error(e) => return Err(format!("coordinator error: {e}")),
            }
        }
        Ok(())
    }
}
