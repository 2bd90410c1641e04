//! What a task loop runs with: its setup (channels, queues, store, options) and the commands its
//! worker sends it, with the steps every kind of task shares — acks, routing switches, the
//! upstream side of stop-and-restart, metric reports.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::{Receiver, RecvTimeoutError, Select, Sender, TryRecvError};
use koala_dataflow::OperatorSpec;
use koala_protocol::stop_restart::{UpstreamAction, UpstreamCore, UpstreamEvent};
use koala_protocol::switch::RoutingSwitch;
use koala_protocol::{Deployment, ReconfigPlan, RuntimeOptions, TaskAck, WorkerMessage};
use koala_state::StateBackend;
use koala_types::{ChannelMessage, Epoch, TaskId};

use crate::RuntimeError;
use crate::channel::{InputChannel, TaskInput};
use crate::links::{Links, open_channel, switch_event};
use crate::metrics::TaskMetrics;
use crate::output::Outputs;
use crate::queue::DataReceiver;

/// Commands a worker sends to one of its tasks.
#[derive(Debug)]
pub enum TaskCommand {
    /// A source ends now, as if exhausted.
    StopSource,
    /// The task belongs to the reconfigured operator: learn what it sends and receives.
    Prepare(Arc<ReconfigPlan>),
    /// The task consumes the reconfigured operator: expect these new input channels.
    AddInputs {
        /// The reconfiguration.
        epoch: Epoch,
        /// Channels from the operator's new tasks.
        channels: Vec<InputChannel>,
    },
    /// The task feeds the reconfigured operator: send a marker on every output and pause.
    Drain {
        /// The reconfiguration.
        epoch: Epoch,
    },
    /// Switch to this routing and resume (after `Drain`).
    Resume(Arc<RoutingSwitch>),
    /// Koala: every task of the reconfiguration is prepared; start the hand-over of the
    /// reconfiguration the coordinator's Koala core planned.
    Begin(Arc<koala_protocol::koala::Reconfiguration>),
    /// DRRS: start a subscale.
    DrrsBegin(Arc<koala_protocol::drrs::Subscale>),
    /// Switch to this routing without pausing (Koala, a stateless operator, a DRRS subscale).
    Switch(Arc<RoutingSwitch>),
    /// Koala: stop serving state and exit.
    Release,
    /// The reconfigured operator's tasks: every task of the reconfiguration is prepared
    /// (stop-and-restart's `Drain`, Koala's `Switch` of a stateless operator), so moved state sent
    /// from now on finds its receiver ready; send it once every marker arrived.
    HandOver {
        /// The reconfiguration.
        epoch: Epoch,
    },
    /// A new task: this upstream finished before it switched routing; it will never send here.
    UpstreamEnded(TaskId),
    /// A source: inject the barrier of this checkpoint (docs/architecture.md §10).
    Checkpoint(koala_types::CheckpointId),
    /// A sink: this checkpoint completed; commit the output it covers.
    CheckpointCommitted(koala_types::CheckpointId),
}

impl TaskCommand {
    /// The command's name, for errors.
    pub fn name(&self) -> &'static str {
        match self {
            Self::StopSource => "StopSource",
            Self::Prepare(_) => "Prepare",
            Self::AddInputs { .. } => "AddInputs",
            Self::Drain { .. } => "Drain",
            Self::Resume(_) => "Resume",
            Self::Begin(_) => "Begin",
            Self::DrrsBegin(_) => "DrrsBegin",
            Self::Switch(_) => "Switch",
            Self::Release => "Release",
            Self::HandOver { .. } => "HandOver",
            Self::UpstreamEnded(_) => "UpstreamEnded",
            Self::Checkpoint(_) => "Checkpoint",
            Self::CheckpointCommitted(_) => "CheckpointCommitted",
        }
    }
}

/// Everything a task loop runs with.
pub struct TaskSetup {
    /// The task.
    pub task: TaskId,
    /// Its operator.
    pub spec: OperatorSpec,
    /// Tasks of its operator.
    pub parallelism: u32,
    /// The deployment the task started with (protocol, routing, placement).
    pub deployment: Arc<Deployment>,
    /// Whether a reconfiguration created the task (it then owns buckets only once they are handed
    /// over to it).
    pub created_by_reconfiguration: bool,
    /// What it needs to open channels later (reconfiguration).
    pub links: Links,
    /// Its input queue (data channels): wait on `inbox.queue()`, then `inbox.took()` for each
    /// message taken (`crate::queue`).
    pub inbox: DataReceiver,
    /// Its peer lane (hand-overs, forwarded records, state transfer): bounded (`crate::peer`).
    pub peer_inbox: Receiver<TaskInput>,
    /// Its fetch lane (Koala fetch requests and responses): bounded by credit (`crate::peer`).
    pub fetch_inbox: Receiver<TaskInput>,
    /// Commands from the worker.
    pub commands: Receiver<TaskCommand>,
    /// Events to the worker.
    pub events: Sender<WorkerMessage>,
    /// Its outputs (channels already open).
    pub outputs: Outputs,
    /// The input channels it expects (for watermarks and end of stream).
    pub inputs: BTreeSet<InputChannel>,
    /// Batching and queue sizes.
    pub options: RuntimeOptions,
    /// Buckets of stateful operators.
    pub num_buckets: u16,
    /// Its state store (stateful operators).
    pub store: Option<Box<dyn StateBackend>>,
}

impl TaskSetup {
    /// A source's or sink's records emitted or written since the job's start as the checkpoint
    /// it restores from recorded them (`metric::RECORDS_TOTAL` counts on from there); `None`
    /// without a restore, or for a task a reconfiguration created (it is not in the checkpoint).
    pub(crate) fn restored_records_total(&self) -> Option<u64> {
        self.options
            .checkpoint
            .restore
            .as_ref()
            .filter(|_| !self.created_by_reconfiguration)
            .and_then(|p| p.records.get(&self.task).copied())
    }

    /// Acknowledges a reconfiguration phase to the coordinator.
    pub(crate) fn ack(&self, epoch: Epoch, ack: TaskAck) {
        let _ = self.events.send(WorkerMessage::TaskAck { task: self.task, epoch, ack });
    }

    /// Switches this task's edges to the reconfigured operator to `switch`'s routing: each
    /// edge's routing core decides (with markers, or without when `resume`-ing after a drain);
    /// new channels open as the reconfiguration's plan places their tasks.
    pub(crate) fn switch_routing(
        &self,
        switch: &RoutingSwitch,
        resume: bool,
        outputs: &mut Outputs,
    ) -> Result<(), RuntimeError> {
        let d = &switch.plan.deployment;
        outputs.switch_edges(
            switch.operator,
            |input, _| switch_event(switch, &self.links.graph, self.task, input, resume),
            |input, to| open_channel(&self.links, d, to, InputChannel { input, from: self.task }),
        )
    }

    /// A `Switch` for a task feeding the reconfigured operator: switch without pausing.
    pub(crate) fn switch_and_ack(
        &self,
        switch: &RoutingSwitch,
        outputs: &mut Outputs,
    ) -> Result<(), RuntimeError> {
        self.switch_routing(switch, false, outputs)?;
        self.ack(switch.epoch, TaskAck::Switched);
        Ok(())
    }

    /// The upstream side of stop-and-restart, driven by `upstream`: on `Drain`, a marker on every
    /// output, then pause until `Resume`, switch the edges to the reconfigured operator and go on.
    /// Returns true if a `StopSource` arrived while paused. Any other command while paused fails
    /// the task.
    pub(crate) fn drain_and_pause(
        &self,
        upstream: &mut UpstreamCore,
        epoch: Epoch,
        outputs: &mut Outputs,
        metrics: &mut TaskMetrics,
    ) -> Result<bool, RuntimeError> {
        self.on_upstream(upstream, UpstreamEvent::Drain { epoch }, None, outputs)?;
        let mut stop = false;
        // Input paused: a source always has input waiting (its schedule or topic goes on); an
        // operator when its data queue holds something.
        let waiting = || self.spec.is_source() || !self.inbox.queue().is_empty();
        // Stops watching the data queue once it reads ready while empty (every sender gone).
        let mut watch_data = true;
        while upstream.paused().is_some() {
            let held = waiting();
            metrics.input_paused(held, Instant::now());
            let wait = metrics.next_tick().saturating_duration_since(Instant::now());
            // Until input is held back, its arrival also wakes the loop: the pause counts from
            // the moment the first message waits, not from the next command or tick.
            let mut select = Select::new();
            select.recv(&self.commands);
            if !held && watch_data {
                select.recv(self.inbox.queue());
            }
            let command = match select.ready_timeout(wait) {
                Ok(0) => match self.commands.try_recv() {
                    Ok(command) => Ok(command),
                    Err(TryRecvError::Empty) => Err(RecvTimeoutError::Timeout),
                    Err(TryRecvError::Disconnected) => Err(RecvTimeoutError::Disconnected),
                },
                Ok(_) => {
                    watch_data = !self.inbox.queue().is_empty();
                    Err(RecvTimeoutError::Timeout)
                }
                Err(_) => Err(RecvTimeoutError::Timeout),
            };
            match command {
                Ok(TaskCommand::Resume(plan)) => {
                    self.on_upstream(
                        upstream,
                        UpstreamEvent::Resume { epoch: plan.epoch },
                        Some(&plan),
                        outputs,
                    )?;
                }
                Ok(TaskCommand::Drain { epoch }) => {
                    self.on_upstream(upstream, UpstreamEvent::Drain { epoch }, None, outputs)?;
                }
                Ok(TaskCommand::StopSource) => stop = true,
                Ok(other) => {
                    return Err(RuntimeError::UnexpectedCommand {
                        task: self.task,
                        command: other.name(),
                        context: "while paused for a reconfiguration",
                    });
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(RuntimeError::WorkerGone(self.task));
                }
            }
            metrics.input_paused(waiting(), Instant::now());
            self.report(metrics, outputs, Instant::now());
        }
        metrics.input_paused(false, Instant::now());
        Ok(stop)
    }

    /// Feeds `event` to this task's upstream core and carries out what it decides; `plan` is
    /// the plan a `Resume` came with.
    pub(crate) fn on_upstream(
        &self,
        upstream: &mut UpstreamCore,
        event: UpstreamEvent,
        switch: Option<&RoutingSwitch>,
        outputs: &mut Outputs,
    ) -> Result<(), RuntimeError> {
        for action in upstream.on(event) {
            match action {
                UpstreamAction::MarkAndPause { epoch } => {
                    outputs.broadcast(&ChannelMessage::Marker(epoch))?;
                }
                UpstreamAction::SwitchAndResume { epoch } => {
                    let Some(switch) = switch.filter(|s| s.epoch == epoch) else {
                        debug_assert!(false, "SwitchAndResume of epoch {epoch} without its routing");
                        return Err(RuntimeError::Invariant {
                            task: self.task,
                            what: "a resume without its routing",
                        });
                    };
                    self.switch_routing(switch, true, outputs)?;
                }
                UpstreamAction::Ack { epoch, ack } => self.ack(epoch, ack),
                UpstreamAction::Error(source) => {
                    return Err(RuntimeError::StopRestart { task: self.task, source });
                }
            }
        }
        Ok(())
    }

    /// Sends the second's samples if one ended.
    /// The task's last report as it exits: due whenever its next tick would have come
    /// ([`TaskMetrics::last_report_at`]).
    pub(crate) fn report_last(&self, metrics: &mut TaskMetrics, outputs: &mut Outputs) {
        let at = metrics.last_report_at();
        self.report(metrics, outputs, at);
    }

    pub(crate) fn report(&self, metrics: &mut TaskMetrics, outputs: &mut Outputs, now: Instant) {
        metrics.backpressure += std::mem::take(&mut outputs.backpressure);
        if now >= metrics.next_tick()
            && let Some(store) = self.store.as_deref()
        {
            metrics.cache_counts = store.cache_counts();
            // The KLT draws from the task's memory share: its cache makes room for it.
            if let Some((klt_bytes, _)) = metrics.klt_size {
                store.charge_outside(usize::try_from(klt_bytes).unwrap_or(usize::MAX));
            }
        }
        if let Some(samples) = metrics.take_if_due(now) {
            let _ = self.events.send(WorkerMessage::Metrics(samples));
        }
    }
}
