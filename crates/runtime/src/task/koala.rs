//! The loop of a stateful task under the Koala protocol (paper §3; docs/protocols.md §3). Every input —
//! records, watermarks, markers, peer messages, fetches — goes through the protocol's sans-IO core
//! ([`KoalaTask`]), which decides; this loop only executes the core's actions: process a batch
//! whose keys are local, fetch remote keys from their KLT location in one hop, serve (and delete:
//! one live copy) keys others fetch, hand buckets over, emit watermarks, acknowledge.
//!
//! Records keep the operator input they arrived on through the core (`TaskEvent::Records` names
//! the channel, `TaskAction::Process` the input), and the core counts markers and ends of stream
//! per channel, so a self-join (one upstream task on both inputs) needs nothing special here.
//!
//! Operator metadata travels with a hand-over: the timers of the moved buckets and, with them, the
//! state of the keys that have timers (open windows), so a timer always fires on local state.
//! Everything else stays where it is until first accessed.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::select;
use koala_protocol::koala::{
    FetchRequest, FetchResponse, KoalaTask, PeerMessage, TaskAction, TaskConfig, TaskEvent,
};
use koala_protocol::{Deployment, TaskAck};
use koala_state::{StateKey, StateWrite};
use koala_types::{BucketId, ChannelMessage, TaskId, Timestamp, bucket_of, decode, encode};
use serde::{Deserialize, Serialize};

use super::operator::OperatorTask;
use super::{TaskCommand, TaskSetup};
use crate::RuntimeError;
use crate::channel::{ChannelSender, InputChannel};
use crate::links::{PEER_INPUT, open_channel};
use crate::output::Outputs;

/// How often an idle task lets the core pull extra keys from cancelled tasks.
const IDLE_PULL: Duration = Duration::from_millis(10);

/// What one task sends another on a peer channel under Koala.
#[derive(Serialize, Deserialize)]
enum Wire {
    Peer(PeerMessage),
    Fetch(FetchRequest),
    Answer(FetchResponse),
}

/// A key's state over all the operator's state ids, as one value for the core.
type Bundle = Vec<(u8, Vec<u8>)>;

/// A key and its state, if it had any here.
type Taken = (Vec<u8>, Option<Bundle>);

/// The runtime's part of a hand-over: timers of the moved buckets and the state of their keys.
#[derive(Serialize, Deserialize, Default)]
struct Metadata {
    timers: Vec<(Timestamp, Vec<u8>)>,
    state: Vec<(Vec<u8>, Bundle)>,
}

struct KoalaOperator {
    op: OperatorTask,
    core: KoalaTask,
    deployment: Arc<Deployment>,
    peers: HashMap<TaskId, ChannelSender>,
    watermark: Option<Timestamp>,
    epoch: u64,
    inputs_ended: bool,
    /// The coordinator released the task; it exits once its inputs ended too.
    released: bool,
}

/// Runs a stateful task under Koala until every input ended and the coordinator released it.
pub fn run_koala_operator(mut setup: TaskSetup) -> Result<(), RuntimeError> {
    let op = OperatorTask::new(&setup)?;
    let d = setup.deployment.clone();
    let me = setup.task;
    // A task a reconfiguration created owns nothing until buckets are handed over to it.
    let owned: BTreeSet<BucketId> = d
        .routing
        .get(&me.operator)
        .filter(|_| !setup.created_by_reconfiguration)
        .map(|t| t.iter().enumerate().filter(|(_, o)| **o == me.index).map(|(b, _)| b as BucketId).collect())
        .unwrap_or_default();
    let core = KoalaTask::new(TaskConfig {
        id: me,
        num_buckets: setup.num_buckets,
        owned,
        inputs: setup.inputs.clone(),
    });
    let mut task = KoalaOperator {
        op,
        core,
        deployment: d,
        peers: HashMap::new(),
        watermark: None,
        epoch: 0,
        inputs_ended: false,
        released: false,
    };
    let mut outputs = std::mem::replace(&mut setup.outputs, Outputs::new(Vec::new(), 1, Duration::ZERO));
    let mut last_idle = Instant::now();
    loop {
        let now = Instant::now();
        let deadline = outputs
            .next_deadline()
            .map_or(task.op.metrics.next_tick(), |d| d.min(task.op.metrics.next_tick()))
            .min(last_idle + IDLE_PULL);
        select! {
            recv(setup.commands) -> cmd => match cmd {
                Ok(cmd) => task.on_command(&setup, &mut outputs, cmd)?,
                Err(_) => return Err(RuntimeError::WorkerGone(me)),
            },
            recv(setup.peer_inbox) -> item => {
                if let Ok(item) = item {
                    task.on_peer(&setup, &mut outputs, item.channel.from, item.message)?;
                }
            },
            recv(setup.inbox) -> item => {
                let Ok(item) = item else {
                    return Err(RuntimeError::InputClosed(me));
                };
                task.on_data(&setup, &mut outputs, item.channel, item.message)?;
            },
            default(deadline.saturating_duration_since(now)) => {}
        }
        let now = Instant::now();
        if now >= last_idle + IDLE_PULL {
            last_idle = now;
            let actions = task.core.on(TaskEvent::Idle);
            task.execute(&setup, &mut outputs, actions)?;
        }
        task.check_inputs_ended(&setup, &mut outputs)?;
        if task.released && task.inputs_ended {
            // Released (no live task points here any more) and nothing left to process.
            task.sample_klt();
            setup.report(&mut task.op.metrics, &mut outputs, Instant::now() + Duration::from_secs(1));
            return Ok(());
        }
        if now >= task.op.metrics.next_tick() {
            task.sample_klt();
        }
        outputs.flush_due(now)?;
        setup.report(&mut task.op.metrics, &mut outputs, now);
    }
}

impl KoalaOperator {
    /// Records the KLT's size for the next metrics sample.
    fn sample_klt(&mut self) {
        let klt = self.core.klt();
        self.op.metrics.klt_size = Some((klt.approx_bytes() as u64, klt.entries() as u64));
    }

    fn on_command(
        &mut self,
        setup: &TaskSetup,
        outputs: &mut Outputs,
        cmd: TaskCommand,
    ) -> Result<(), RuntimeError> {
        match cmd {
            TaskCommand::Prepare(plan) => {
                // Every task of the operator that may still be asked for state (live, cancelled,
                // retired) learns the new placement before any new task can ask it.
                self.epoch = plan.epoch;
                self.deployment = Arc::new(plan.deployment.clone());
                setup.ack(plan.epoch, TaskAck::Prepared);
            }
            TaskCommand::Begin(reconfiguration) => {
                self.epoch = reconfiguration.epoch;
                let actions = self.core.on(TaskEvent::Start(reconfiguration));
                self.execute(setup, outputs, actions)?;
            }
            TaskCommand::Release => self.released = true,
            TaskCommand::Switch(plan) => {
                setup.switch_and_ack(&plan, outputs)?;
            }
            TaskCommand::UpstreamEnded(upstream) => {
                // Every channel from it: a self-join's upstream has two.
                for channel in self.core.inputs_from(upstream) {
                    let actions = self.core.on(TaskEvent::EndOfStream { channel });
                    self.execute(setup, outputs, actions)?;
                }
            }
            TaskCommand::AddInputs { epoch, channels } => {
                for c in channels {
                    self.core.add_input(c);
                }
                setup.ack(epoch, TaskAck::Prepared);
            }
            other => {
                let name = format!("{other:?}").chars().take(40).collect::<String>();
                tracing::error!(task = %setup.task, command = %name, "command a Koala task does not take; ignored");
            }
        }
        Ok(())
    }

    fn on_data(
        &mut self,
        setup: &TaskSetup,
        outputs: &mut Outputs,
        channel: InputChannel,
        message: ChannelMessage,
    ) -> Result<(), RuntimeError> {
        let event = match message {
            ChannelMessage::Batch(records) => {
                let started = Instant::now();
                let actions = self.core.on(TaskEvent::Records { channel, records });
                self.op.metrics.klt_lookup.0 += started.elapsed();
                self.op.metrics.klt_lookup.1 += 1;
                return self.execute(setup, outputs, actions);
            }
            ChannelMessage::Watermark(time) => TaskEvent::Watermark { channel, time },
            ChannelMessage::Marker(epoch) => TaskEvent::Marker { channel, epoch },
            ChannelMessage::EndOfStream => TaskEvent::EndOfStream { channel },
            other => {
                tracing::error!(task = %setup.task, %channel, message = ?other, "unexpected message on a data channel; ignored");
                return Ok(());
            }
        };
        let actions = self.core.on(event);
        self.execute(setup, outputs, actions)
    }

    fn on_peer(
        &mut self,
        setup: &TaskSetup,
        outputs: &mut Outputs,
        from: TaskId,
        message: ChannelMessage,
    ) -> Result<(), RuntimeError> {
        // Peer messages come from our own tasks: one that is not understood means lost protocol
        // state, so the task fails (and with it the job) instead of dropping it.
        let ChannelMessage::Protocol(bytes) = message else {
            let reason = "a non-protocol message on the peer channel".into();
            return Err(RuntimeError::Peer { task: setup.task, from, reason });
        };
        let event = match decode::<Wire>(&bytes) {
            Ok(Wire::Peer(message)) => TaskEvent::Peer { from, message },
            Ok(Wire::Fetch(request)) => TaskEvent::FetchRequest { from, request },
            Ok(Wire::Answer(response)) => TaskEvent::FetchResponse { from, response },
            Err(e) => {
                let reason = format!("an undecodable peer message ({e})");
                return Err(RuntimeError::Peer { task: setup.task, from, reason });
            }
        };
        let actions = self.core.on(event);
        self.execute(setup, outputs, actions)
    }

    /// Once every input ended and nothing is left to process: fire every timer, close the
    /// outputs, tell the coordinator — and keep serving state until released.
    fn check_inputs_ended(&mut self, setup: &TaskSetup, outputs: &mut Outputs) -> Result<(), RuntimeError> {
        if self.inputs_ended || self.core.has_inputs() || self.core.is_busy() || self.core.in_transition() {
            return Ok(());
        }
        self.inputs_ended = true;
        self.op.advance(setup, outputs, Timestamp::MAX)?;
        outputs.flush_all()?;
        outputs.broadcast(&ChannelMessage::EndOfStream)?;
        setup.ack(self.epoch, TaskAck::InputsEnded);
        Ok(())
    }

    fn execute(
        &mut self,
        setup: &TaskSetup,
        outputs: &mut Outputs,
        actions: Vec<TaskAction>,
    ) -> Result<(), RuntimeError> {
        for action in actions {
            match action {
                TaskAction::Process { input, records } => {
                    self.op.on_batch(setup, outputs, input, records, self.watermark)?;
                }
                TaskAction::FetchState { from, request } => self.send(setup, from, &Wire::Fetch(request))?,
                TaskAction::InstallState { entries } => self.install(setup, entries)?,
                TaskAction::ServeFetch { to, request } => {
                    let response = self.serve(setup, request)?;
                    self.send(setup, to, &Wire::Answer(response))?;
                }
                TaskAction::SendToPeer { to, mut message } => {
                    if let PeerMessage::HandOver { hand_over, .. } = &mut message {
                        let buckets: BTreeSet<BucketId> =
                            hand_over.buckets.iter().map(|b| b.bucket).collect();
                        hand_over.metadata = self.take_metadata(setup, &buckets)?;
                    }
                    self.send(setup, to, &Wire::Peer(message))?;
                }
                TaskAction::FireTimers { buckets, up_to } => {
                    let buckets: BTreeSet<BucketId> = buckets.into_iter().collect();
                    let nb = setup.num_buckets;
                    self.op
                        .fire_due_where(setup, outputs, up_to, |key| buckets.contains(&bucket_of(key, nb)))?;
                }
                TaskAction::InstallMetadata { metadata, .. } => self.install_metadata(setup, &metadata)?,
                TaskAction::EmitWatermark(t) => {
                    self.watermark = Some(t);
                    self.op.advance(setup, outputs, t)?;
                }
                TaskAction::Ack { epoch, ack } => setup.ack(epoch, ack),
                TaskAction::Error(error) => {
                    tracing::error!(task = %setup.task, %error, "protocol surprise refused");
                    setup.ack(self.epoch, TaskAck::ProtocolError { error });
                }
            }
        }
        Ok(())
    }

    fn send(&mut self, setup: &TaskSetup, to: TaskId, wire: &Wire) -> Result<(), RuntimeError> {
        let bytes = encode(wire)
            .map_err(|source| RuntimeError::Codec { what: "encoding a peer message".into(), source })?;
        if !self.peers.contains_key(&to) {
            let sender = open_channel(
                &setup.links,
                &self.deployment,
                to,
                InputChannel { input: PEER_INPUT, from: setup.task },
            )?;
            self.peers.insert(to, sender);
        }
        if let Some(peer) = self.peers.get_mut(&to) {
            self.op.metrics.backpressure += peer.send(ChannelMessage::Protocol(bytes))?;
        }
        Ok(())
    }

    fn state_ids(&self) -> Vec<u8> {
        self.op.logic.state_ids().to_vec()
    }

    /// Reads every state id of `keys` and deletes them here (one live copy).
    fn take_keys(&mut self, setup: &TaskSetup, keys: &[Vec<u8>]) -> Result<Vec<Taken>, RuntimeError> {
        let store = store(setup)?;
        let ids = self.state_ids();
        let wanted: Vec<StateKey> = keys
            .iter()
            .flat_map(|k| {
                ids.iter().map(move |s| StateKey {
                    bucket: bucket_of(k, setup.num_buckets),
                    state: *s,
                    key: k.clone(),
                })
            })
            .collect();
        if wanted.is_empty() {
            return Ok(keys.iter().map(|k| (k.clone(), None)).collect());
        }
        let values = store.get_many(&wanted)?;
        let mut bundles: HashMap<Vec<u8>, Bundle> = HashMap::new();
        let mut deletes = Vec::new();
        for (k, v) in wanted.into_iter().zip(values) {
            if let Some(v) = v {
                bundles.entry(k.key.clone()).or_default().push((k.state, v));
                deletes.push(StateWrite::Delete(k));
            }
        }
        let moved: u64 = bundles.values().flatten().map(|(_, v)| v.len() as u64).sum();
        self.op.metrics.state_bytes_moved += moved;
        self.op.metrics.state_reads += deletes.len() as u64;
        if !deletes.is_empty() {
            store.write_many(deletes)?;
        }
        Ok(keys.iter().map(|k| (k.clone(), bundles.remove(k))).collect())
    }

    fn serve(&mut self, setup: &TaskSetup, request: FetchRequest) -> Result<FetchResponse, RuntimeError> {
        let mut values = Vec::with_capacity(request.keys.len());
        for (key, bundle) in self.take_keys(setup, &request.keys)? {
            values.push((key, bundle.map(|b| encode(&b)).transpose().map_err(codec)?));
        }
        let mut extra = Vec::new();
        let mut exhausted = Vec::new();
        if let Some(x) = request.extra.filter(|x| x.max > 0 && !x.buckets.is_empty()) {
            let store = store(setup)?;
            // Distinct keys per bucket, in key order, up to the limit overall.
            let mut found: Vec<Vec<u8>> = Vec::new();
            let mut left_over: BTreeSet<BucketId> = BTreeSet::new();
            let mut seen: BTreeSet<Vec<u8>> = BTreeSet::new();
            store.scan_buckets(&x.buckets, 256 * 1024, &mut |chunk| {
                for (k, _) in chunk {
                    if seen.contains(&k.key) {
                        continue;
                    }
                    if found.len() < x.max {
                        seen.insert(k.key.clone());
                        found.push(k.key);
                    } else {
                        left_over.insert(k.bucket);
                    }
                }
                Ok(())
            })?;
            for (key, bundle) in self.take_keys(setup, &found)? {
                if let Some(b) = bundle {
                    extra.push((key, encode(&b).map_err(codec)?));
                }
            }
            exhausted = x.buckets.iter().copied().filter(|b| !left_over.contains(b)).collect();
        }
        Ok(FetchResponse { id: request.id, values, extra, exhausted })
    }

    fn install(&mut self, setup: &TaskSetup, entries: Vec<(Vec<u8>, Vec<u8>)>) -> Result<(), RuntimeError> {
        let mut writes = Vec::new();
        for (key, bundle) in entries {
            let bundle: Bundle = decode(&bundle).map_err(codec)?;
            for (state, value) in bundle {
                writes.push(StateWrite::Put(
                    StateKey { bucket: bucket_of(&key, setup.num_buckets), state, key: key.clone() },
                    value,
                ));
            }
        }
        self.op.metrics.state_writes += writes.len() as u64;
        if !writes.is_empty() {
            store(setup)?.write_many(writes)?;
        }
        Ok(())
    }

    /// Timers of the handed-over buckets and the state of their keys, removed from here.
    fn take_metadata(
        &mut self,
        setup: &TaskSetup,
        buckets: &BTreeSet<BucketId>,
    ) -> Result<Vec<u8>, RuntimeError> {
        let nb = setup.num_buckets;
        let timers = self.op.timers.take_where(|key| buckets.contains(&bucket_of(key, nb)));
        let keys: Vec<Vec<u8>> =
            timers.iter().map(|(_, k)| k.clone()).collect::<BTreeSet<_>>().into_iter().collect();
        let state =
            self.take_keys(setup, &keys)?.into_iter().filter_map(|(k, b)| b.map(|b| (k, b))).collect();
        encode(&Metadata { timers, state }).map_err(codec)
    }

    fn install_metadata(&mut self, setup: &TaskSetup, metadata: &[u8]) -> Result<(), RuntimeError> {
        if metadata.is_empty() {
            return Ok(());
        }
        let m: Metadata = decode(metadata).map_err(codec)?;
        self.op.timers.register(m.timers.into_iter().map(|(t, k)| (k, t)));
        let entries = m
            .state
            .into_iter()
            .map(|(k, b)| encode(&b).map(|b| (k, b)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(codec)?;
        self.install(setup, entries)
    }
}

fn store(setup: &TaskSetup) -> Result<&dyn koala_state::StateBackend, RuntimeError> {
    setup
        .store
        .as_deref()
        .ok_or_else(|| RuntimeError::deployment(setup.task, "a keyed task without a state store"))
}

fn codec(e: koala_types::CodecError) -> RuntimeError {
    RuntimeError::Codec { what: "a key's state bundle".into(), source: e }
}
