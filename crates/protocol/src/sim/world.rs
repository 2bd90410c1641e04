//! The simulated job: upstream tasks (a source, a router per operator input and, under
//! stop-and-restart, its pause core), target task cores with their stores, the consumer tasks
//! they feed, the job's reconfiguration engine, and every channel between them as a FIFO queue.
//! A step delivers the head of one randomly chosen non-empty channel, or lets a source emit, so
//! every interleaving that respects per-channel FIFO is reachable (a consumer takes a target
//! task's outputs in the step that produced them, see `consumer.rs`). The coordinator's
//! side (plans, the engine's broadcasts) is in `coordinator.rs`, Koala task delivery in
//! `koala.rs`, DRRS and stop-and-restart in theirs, the consumers in `consumer.rs`.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use koala_types::{BucketId, ChannelMessage, Epoch, InputChannel, TaskId, Timestamp, WorkerId};

use super::consumer::Downstream;
use super::rng::SplitMix64;
use super::scenario::{CONSUMER, TARGET, UPSTREAM};
use super::{Fault, SimConfig, SimStats};
use crate::control::{Deployment, Protocol, ReconfigPlan, RuntimeOptions};
use crate::drrs::{DrrsLife, DrrsOptions, DrrsTask};
use crate::engine::Engine;
use crate::koala::{KoalaTask, PeerMessage, PullCursors, TaskConfig, TaskEvent, TaskLife, UpstreamRouter};
use crate::stop_restart::{TargetCore, UpstreamCore};
use crate::watermark::WatermarkAligner;

pub(crate) use super::channels::{ChannelKey, Channels, Kind, Msg, Node};

/// A target task's protocol core.
pub(crate) enum Core {
    Koala(Box<KoalaTask>),
    /// Stop-and-restart: the core, and the watermark aligner the runtime keeps beside it.
    StopAndRestart(TargetCore<InputChannel>, WatermarkAligner<InputChannel>),
    /// DRRS.
    Drrs(Box<DrrsTask>),
}

impl Core {
    /// Whether the task is still in a reconfiguration or holds records it has not processed.
    pub(crate) fn busy(&self) -> bool {
        match self {
            Core::Koala(k) => k.in_transition() || k.is_busy(),
            Core::StopAndRestart(c, _) => c.busy(),
            Core::Drrs(d) => d.in_transition() || d.is_busy(),
        }
    }
}

/// A target task with the store the runtime would keep next to it.
pub(crate) struct SimTask {
    pub(crate) core: Core,
    /// Per-key counter: the records processed since the key's state was last deleted.
    pub(crate) store: BTreeMap<Vec<u8>, u64>,
    /// Where progressive pulls of each requester stopped in each bucket of `store`.
    pub(crate) pull_cursors: PullCursors<Vec<u8>>,
    pub(crate) last_watermark: Option<Timestamp>,
    /// Released by the coordinator; a Koala task also tracks when its inputs ended and exits
    /// by the runtime's rule ([`TaskLife`]).
    pub(crate) life: TaskLife,
    /// A task exited by the runtime's rule, checked after every event it handles: a Koala task
    /// by [`TaskLife::may_exit`], a stop-and-restart or Remote task by
    /// [`TaskLife::target_may_exit`], a DRRS task by [`DrrsLife::may_exit`].
    pub(crate) gone: bool,
    /// DRRS: the exit rule's state and a new task's channels until its first subscale, as the
    /// runtime keeps them.
    pub(crate) drrs: DrrsLife,
    /// Event-time timers (time, key): every processed record of a window key (of every key when
    /// state outlives timers) sets one at its own time (a window's end); they fire when the task
    /// emits a watermark at or past them and travel with their bucket's hand-over (Koala: without
    /// their keys' state).
    pub(crate) timers: BTreeSet<(Timestamp, Vec<u8>)>,
    /// DRRS: timers of buckets a sender stopped processing, set aside until their bucket's push.
    pub(crate) aside: BTreeSet<(Timestamp, Vec<u8>)>,
}

impl SimTask {
    /// Whether the task exited by the runtime's rule: a Koala task once released and its inputs
    /// ended, a stop-and-restart or Remote task once every input ended and no part of a
    /// reconfiguration runs, a DRRS task by [`DrrsLife::may_exit`]. Nothing may ask an exited
    /// task for state: the request would never be answered.
    pub(crate) fn exited(&self) -> bool {
        self.gone
    }
}

/// An upstream task: a source of keyed records plus one router per operator input (all with the
/// same table: they switch, mark and end together, as `Outputs::switch_edges` does).
pub(crate) struct SimUpstream {
    pub(crate) id: TaskId,
    pub(crate) routers: Vec<UpstreamRouter>,
    /// Stop-and-restart: paused between `Drain` and `Resume`.
    pub(crate) pause: UpstreamCore,
    /// Whether it may end before every requested reconfiguration started (else later requests
    /// would mostly find every input ended and be skipped, as the engine does).
    pub(crate) may_end_early: bool,
    pub(crate) clock: Timestamp,
    pub(crate) remaining: usize,
    pub(crate) ended: bool,
    /// With [`SimConfig::channel_capacity`]: the task's sends not done yet, in order (the first
    /// waits for room in its channel; while any wait the task is blocked).
    pub(crate) sending: VecDeque<(ChannelKey, Msg)>,
}

/// The whole simulated job.
pub(crate) struct World {
    pub(crate) cfg: SimConfig,
    pub(crate) rng: SplitMix64,
    pub(crate) step: u64,
    pub(crate) channels: Channels,
    pub(crate) tasks: BTreeMap<TaskId, SimTask>,
    pub(crate) upstreams: Vec<SimUpstream>,
    /// The job's reconfiguration engine (the one `crates/coordinator` runs).
    pub(crate) engine: Engine,
    pub(crate) targets: Vec<Vec<TaskId>>,
    pub(crate) triggers: Vec<u64>,
    pub(crate) next_request: usize,
    /// Requested assignments not started yet (the engine runs one at a time).
    pub(crate) pending: VecDeque<Vec<TaskId>>,
    /// The last epoch started.
    pub(crate) epoch: Epoch,
    /// Requests skipped because every upstream had finished.
    pub(crate) skipped: u64,
    /// Every started reconfiguration's plan, by epoch.
    pub(crate) plans: BTreeMap<Epoch, Arc<ReconfigPlan>>,
    pub(crate) claims: Vec<Option<TaskId>>,
    pub(crate) holder: BTreeMap<Vec<u8>, TaskId>,
    /// Remote: the state servers' store shared by every task (a task's `store` is then its
    /// write-back buffer, and `holder` the task with a buffered, unwritten value).
    pub(crate) shared: BTreeMap<Vec<u8>, u64>,
    /// Records emitted per key.
    pub(crate) emitted: BTreeMap<Vec<u8>, u64>,
    /// Records emitted per (key, input): the last sequence number of that lane.
    pub(crate) lane_emitted: BTreeMap<(Vec<u8>, usize), u64>,
    /// What the operator has done to each key so far (see `checks.rs`).
    pub(crate) ledger: BTreeMap<Vec<u8>, super::checks::KeyLedger>,
    pub(crate) emitted_total: u64,
    pub(crate) processed_total: u64,
    pub(crate) early_switched: BTreeSet<Epoch>,
    pub(crate) stats: SimStats,
    /// Tasks whose end the coordinator has heard of.
    pub(crate) finished: BTreeSet<TaskId>,
    /// Background pulls sent and not answered: (requester, location, request id).
    pub(crate) pulls_in_flight: BTreeSet<(TaskId, TaskId, u64)>,
    /// Tasks that stopped taking data input (DRRS: a full wait buffer; Koala: `max_queued_records`
    /// held); their data channels wait.
    pub(crate) paused: BTreeSet<TaskId>,
    /// Koala: (task, key) whose timers a hand-over brought to the task while the key's state was
    /// elsewhere, until a record of the key or its timer comes first (for the stats).
    pub(crate) handed: BTreeSet<(TaskId, Vec<u8>)>,
    /// Koala tasks with a [`Msg::Clock`] in flight.
    pub(crate) clock_queued: BTreeSet<TaskId>,
    /// The consumer operator's tasks and what the target tasks output to them.
    pub(crate) downstream: Downstream,
}

impl World {
    pub(crate) fn new(cfg: SimConfig) -> Result<Self, String> {
        if cfg.upstreams == 0 || cfg.keys < cfg.upstreams || cfg.num_buckets < 8 {
            return Err("the simulator needs an upstream, a key per upstream and 8 buckets".into());
        }
        if !(1..=2).contains(&cfg.inputs) {
            return Err("the simulated operator has one or two inputs".into());
        }
        let mut rng = SplitMix64::new(cfg.seed);
        let (initial, targets, extra_keys) = cfg.scenario.plan(cfg.num_buckets, &mut rng);
        let up_ids: Vec<TaskId> = (0..cfg.upstreams as u32).map(|i| TaskId::new(UPSTREAM, i)).collect();
        let total = (cfg.upstreams * cfg.records_per_upstream) as u64;
        let mut triggers: Vec<u64> = targets.iter().map(|_| rng.next_u64() % total.max(1)).collect();
        if cfg.sources_end_early {
            // Requested as the first target task ends its outputs (`World::request_late`).
            triggers.iter_mut().for_each(|t| *t = u64::MAX);
        }
        triggers.sort_unstable();
        let live: BTreeSet<TaskId> = initial.iter().copied().collect();
        let consumer_ids: Vec<TaskId> = Downstream::ids(cfg.consumers).collect();
        let deployment = Deployment {
            run: "sim".into(),
            query: "per-key counter".into(),
            query_params: String::new(),
            workers: BTreeMap::from([(WorkerId(0), "sim".into())]),
            placement: up_ids.iter().chain(&live).chain(&consumer_ids).map(|&t| (t, WorkerId(0))).collect(),
            tasks: BTreeMap::from([
                (UPSTREAM, up_ids.iter().map(|t| t.index).collect()),
                (TARGET, live.iter().map(|t| t.index).collect()),
                (CONSUMER, consumer_ids.iter().map(|t| t.index).collect()),
            ]),
            epoch: 0,
            routing: BTreeMap::from([(TARGET, initial.iter().map(|t| t.index).collect())]),
            num_buckets: cfg.num_buckets,
            options: RuntimeOptions {
                batch_records: 3,
                linger_ms: 0,
                channel_capacity: 1,
                sink_dir: String::new(),
                capacity: Default::default(),
                max_queued_records: crate::koala::DEFAULT_MAX_QUEUED_RECORDS,
                checkpoint: Default::default(),
            },
            protocol: cfg.protocol,
            extra_keys,
            drain_keys_per_sec: if cfg.drain { 1000 } else { 0 },
            finished: BTreeSet::new(),
        };
        let mut inputs = BTreeMap::from([(UPSTREAM, BTreeSet::new()), (TARGET, BTreeSet::from([UPSTREAM]))]);
        if cfg.consumers > 0 {
            inputs.insert(CONSUMER, BTreeSet::from([TARGET]));
        }
        let mut engine = Engine::new(deployment, inputs).map_err(|e| e.to_string())?;
        if cfg.fault == Some(Fault::ReleaseWithoutEpoch) {
            engine.inject_fault_release_without_epoch();
        }
        engine.set_drrs_options(DrrsOptions {
            schedule: cfg.drrs_schedule,
            subscales: cfg.subscales,
            wait_records: cfg.wait_records,
        });
        let mut tasks = BTreeMap::new();
        for &id in &live {
            let owned = (0..cfg.num_buckets).filter(|&b| initial[usize::from(b)] == id).collect();
            tasks.insert(id, Self::sim_task(id, owned, &up_ids, &cfg, false));
        }
        let mut upstreams = Vec::new();
        for &id in &up_ids {
            let routers = (0..cfg.inputs)
                .map(|_| UpstreamRouter::new(initial.clone()))
                .collect::<Result<_, _>>()
                .map_err(|e| e.to_string())?;
            upstreams.push(SimUpstream {
                id,
                routers,
                pause: UpstreamCore::new(),
                may_end_early: rng.chance(1, 4) || cfg.sources_end_early,
                clock: 0,
                remaining: cfg.records_per_upstream,
                ended: false,
                sending: VecDeque::new(),
            });
        }
        let progressive = extra_keys > 0 && cfg.protocol == Protocol::Koala;
        let downstream = Downstream::new(cfg.consumers, &live);
        Ok(Self {
            claims: initial.iter().map(|&t| Some(t)).collect(),
            cfg,
            rng,
            step: 0,
            channels: Channels::default(),
            tasks,
            upstreams,
            engine,
            targets,
            triggers,
            next_request: 0,
            pending: VecDeque::new(),
            epoch: 0,
            skipped: 0,
            plans: BTreeMap::new(),
            holder: BTreeMap::new(),
            shared: BTreeMap::new(),
            emitted: BTreeMap::new(),
            lane_emitted: BTreeMap::new(),
            ledger: BTreeMap::new(),
            emitted_total: 0,
            processed_total: 0,
            early_switched: BTreeSet::new(),
            finished: BTreeSet::new(),
            pulls_in_flight: BTreeSet::new(),
            paused: BTreeSet::new(),
            handed: BTreeSet::new(),
            clock_queued: BTreeSet::new(),
            downstream,
            stats: SimStats { progressive, ..SimStats::default() },
        })
    }

    /// A target task: `owned` buckets, fed by `upstreams` (a task a reconfiguration creates owns
    /// nothing until a hand-over).
    pub(crate) fn sim_task(
        id: TaskId,
        owned: BTreeSet<BucketId>,
        upstreams: &[TaskId],
        cfg: &SimConfig,
        created: bool,
    ) -> SimTask {
        let core = match cfg.protocol {
            Protocol::Koala => {
                let config = TaskConfig {
                    id,
                    num_buckets: cfg.num_buckets,
                    owned,
                    inputs: upstreams.iter().flat_map(|&u| sim_inputs(u, cfg.inputs)).collect(),
                };
                let mut core = KoalaTask::new(config);
                core.set_max_queued_records(cfg.max_queued_records);
                core.set_look_ahead(cfg.look_ahead);
                if cfg.fault == Some(Fault::NoParking) {
                    core.inject_fault_no_parking();
                }
                if cfg.fault == Some(Fault::TimerBeforeAccess) {
                    core.inject_fault_no_timer_access();
                }
                if cfg.fault == Some(Fault::HoldBackAfterMarker) {
                    core.inject_fault_hold_back_after_marker();
                }
                Core::Koala(Box::new(core))
            }
            Protocol::StopAndRestart | Protocol::Remote => Core::StopAndRestart(
                if cfg.protocol == Protocol::Remote {
                    TargetCore::new_remote(id)
                } else {
                    TargetCore::new(id)
                },
                WatermarkAligner::new(upstreams.iter().flat_map(|&u| sim_inputs(u, cfg.inputs))),
            ),
            Protocol::Drrs => {
                let config = crate::drrs::TaskConfig {
                    id,
                    num_buckets: cfg.num_buckets,
                    owned,
                    inputs: upstreams.iter().flat_map(|&u| sim_inputs(u, cfg.inputs)).collect(),
                };
                let mut core = DrrsTask::new(config);
                match cfg.fault {
                    Some(Fault::ProcessBeforeState) => core.inject_fault_process_before_state(),
                    Some(Fault::WatermarkBeforeState) => core.inject_fault_watermark_before_state(),
                    Some(Fault::UnboundedCredit) => core.inject_fault_unbounded_credit(),
                    _ => {}
                }
                Core::Drrs(Box::new(core))
            }
        };
        SimTask {
            core,
            store: BTreeMap::new(),
            pull_cursors: PullCursors::new(),
            last_watermark: None,
            life: TaskLife::new(created),
            gone: false,
            // A new task's channels are set where it is deployed (`World::broadcast`).
            drrs: DrrsLife::new(created, upstreams.iter().flat_map(|&u| sim_inputs(u, cfg.inputs))),
            timers: BTreeSet::new(),
            aside: BTreeSet::new(),
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
            // Backpressure: a paused task's data channels, a channel whose head a Koala task
            // refuses, and the commands of a blocked upstream are not delivered.
            let filtered = !self.paused.is_empty()
                || self.cfg.protocol == Protocol::Drrs
                || self.cfg.max_queued_records != usize::MAX
                || self.cfg.channel_capacity > 0;
            let open: Option<Vec<usize>> =
                filtered.then(|| (0..channels).filter(|&i| self.deliverable(i)).collect());
            let deliverable = open.as_ref().map_or(channels, Vec::len);
            if deliverable < channels && self.refuses_a_head(open.as_deref().unwrap_or_default()) {
                self.stats.refused_heads += 1;
            }
            // No idle turns: a task's core pulls as answers arrive and needs no timer, so
            // quiescence with work left undone (a cancelled task never drained) fails the run.
            if deliverable == 0 && sources.is_empty() {
                if channels > 0 {
                    let blocked: Vec<TaskId> =
                        self.upstreams.iter().filter(|u| !u.sending.is_empty()).map(|u| u.id).collect();
                    return Err(format!(
                        "backpressure deadlock: {:?} stopped taking direct input, upstreams {blocked:?} are blocked on a send, and nothing else can move",
                        self.paused
                    ));
                }
                return self.check_end();
            }
            // Remote: now and then a task's write-back buffer overflows (its own draws, so other
            // protocols keep their seeds' schedules).
            if self.cfg.protocol == Protocol::Remote && self.rng.below(8) == 0 {
                let ids: Vec<TaskId> = self.tasks.keys().copied().collect();
                let victim = ids[self.rng.below(ids.len())];
                self.remote_evict(victim);
            }
            let pick = self.rng.below(deliverable + sources.len());
            if pick < deliverable {
                let pick = open.as_ref().map_or(pick, |o| o[pick]);
                if let Some(((from, to, kind), msg)) = self.channels.pop(pick) {
                    let msg = self.take_part((from, to, kind), msg);
                    self.deliver(from, to, kind, msg)?;
                    if self.cfg.channel_capacity > 0 && matches!(kind, Kind::Data(_)) {
                        self.unblock_senders()?;
                    }
                }
            } else {
                self.emit(sources[pick - deliverable])?;
            }
            self.flush_outputs()?;
            self.request_late()?;
        }
    }

    fn deliver(&mut self, from: Node, to: Node, kind: Kind, msg: Msg) -> Result<(), String> {
        match (to, msg) {
            (Node::Coordinator, Msg::Ack(epoch, ack)) => {
                let (Node::Task(from) | Node::Upstream(from) | Node::Consumer(from)) = from else {
                    return Err("ack from the coordinator".into());
                };
                let actions = self.engine.on_ack(from, epoch, ack).map_err(|e| format!("engine: {e}"))?;
                self.exec_engine(actions)
            }
            (Node::Coordinator, Msg::Finished(t)) => {
                self.finished.insert(t);
                let actions = self.engine.task_finished(t).map_err(|e| format!("engine: {e}"))?;
                self.exec_engine(actions)
            }
            (Node::Upstream(id), msg) => self.deliver_to_upstream(id, msg),
            (Node::Consumer(id), msg) => self.deliver_to_consumer(from, id, kind, msg),
            (Node::Task(id), Msg::Release) => {
                // A live task is released with its state once every input of the operator
                // ended (`InputsEnded`); a cancelled one once nobody fetches from it: empty.
                let live = |d: &Deployment| d.tasks.get(&TARGET).is_some_and(|t| t.contains(&id.index));
                let live = live(self.engine.deployment())
                    || self.engine.running().is_some_and(|p| live(&p.deployment));
                let all_ended = self.tasks.values().all(|t| t.life.inputs_ended());
                let t = self.tasks.get_mut(&id).ok_or("release of unknown task")?;
                if !live && !all_ended && !t.store.is_empty() {
                    return Err(format!("{id} released while holding {} keys", t.store.len()));
                }
                if !t.life.released() {
                    t.life.release();
                    t.drrs.release();
                    self.stats.released += u64::from(!live);
                }
                self.sr_check_exit(id);
                self.koala_check_exit(id);
                self.drrs_check_exit(id);
                Ok(())
            }
            (Node::Task(id), msg) => {
                match self.tasks.get(&id).map(SimTask::exited) {
                    None => return Err(format!("message for unknown task {id}: {msg:?}")),
                    // Records would be lost; anything else the runtime drops with the task's
                    // queues (an end or marker sent before it exited, a request it no longer
                    // needs to answer: nothing fetches once it is released).
                    Some(true)
                        if matches!(
                            msg,
                            Msg::Data(ChannelMessage::Batch(_)) | Msg::Peer(PeerMessage::Records { .. })
                        ) =>
                    {
                        return Err(format!("records for {id}, which exited: {msg:?}"));
                    }
                    // The requester would wait for an answer forever.
                    Some(true) if matches!(msg, Msg::FetchRequest(_) | Msg::FilterRequest(_)) => {
                        return Err(format!("exit: {from:?} asks {id}, which exited, for state: {msg:?}"));
                    }
                    // So would the owner whose filter was still to be built when it exited.
                    Some(true) if matches!(msg, Msg::BuildFilter { .. }) => {
                        return Err(format!("exit: {id} exited before it built the filter of {msg:?}"));
                    }
                    Some(true) => {
                        self.stats.after_exit += 1;
                        return Ok(());
                    }
                    Some(false) => {}
                }
                let src = match from {
                    Node::Upstream(t) | Node::Task(t) | Node::Consumer(t) => Some(t),
                    Node::Coordinator => None,
                };
                // A data message names its channel: the upstream task and the input.
                let channel = match (kind, src) {
                    (Kind::Data(input), Some(from)) => Some(InputChannel { input, from }),
                    _ => None,
                };
                if matches!(self.tasks.get(&id).map(|t| &t.core), Some(Core::StopAndRestart(..))) {
                    self.deliver_stop_and_restart(id, src, channel, msg)?;
                    self.sr_check_exit(id);
                    return Ok(());
                }
                if matches!(self.tasks.get(&id).map(|t| &t.core), Some(Core::Drrs(..))) {
                    return self.deliver_drrs(id, src, channel, msg);
                }
                let event = match (msg, channel) {
                    (Msg::Data(ChannelMessage::Batch(records)), Some(channel)) => {
                        TaskEvent::Records { channel, records }
                    }
                    (Msg::Data(ChannelMessage::Watermark(time)), Some(channel)) => {
                        TaskEvent::Watermark { channel, time }
                    }
                    (Msg::Data(ChannelMessage::Marker(epoch)), Some(channel)) => {
                        TaskEvent::Marker { channel, epoch }
                    }
                    (Msg::Data(ChannelMessage::EndOfStream), Some(channel)) => {
                        TaskEvent::EndOfStream { channel }
                    }
                    (msg, _) => return self.deliver_koala_control(id, src, msg),
                };
                self.feed(id, event)
            }
            (to, m) => Err(format!("unroutable message {m:?} to {to:?}")),
        }
    }
}

/// The data channels from simulated upstream `from`: one per operator input.
pub(crate) fn sim_inputs(from: TaskId, inputs: usize) -> impl Iterator<Item = InputChannel> {
    (0..inputs).map(move |input| InputChannel { input, from })
}
