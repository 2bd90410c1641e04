//! The loop of a transform task: batches in, state fetched per batch, timers fired as event time
//! advances, records out.

use std::time::{Duration, Instant};

use crossbeam_channel::select;
use koala_dataflow::logic::OperatorLogic;
use koala_dataflow::{OperatorContext, OperatorKind, TaskInstance, TimerDue};
use koala_protocol::WatermarkAligner;
use koala_protocol::koala::TaskLife;
use koala_protocol::stop_restart::{TargetEvent, UpstreamCore, UpstreamEvent};
use koala_types::{ChannelMessage, Record, Timestamp};

use super::transfer::{StateTransfer, TransferIo, message_kind};
use super::{TaskCommand, TaskSetup};
use crate::RuntimeError;
use crate::batch_state::{BatchState, NoState};
use crate::channel::{InputChannel, PEER_INPUT};
use crate::checkpoint::{BarrierGate, CheckpointWriter, Gate, TaskMeta};
use crate::metrics::TaskMetrics;
use crate::output::Outputs;
use crate::throttle::RecordBudget;
use crate::timers::TimerService;

/// Keys fetched per round of timer firing.
const TIMER_BATCH: usize = 1024;

/// How often a task reads its clock for processing-time timers.
pub(super) const PROCESSING_TICK: Duration = Duration::from_millis(10);

/// Processing time now: milliseconds since the Unix epoch.
pub(super) fn processing_time_now() -> Timestamp {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// A transform task's operator, timers and counters; shared by the stop-and-restart loop here and
/// the Koala loop (`koala.rs`), which differ in who decides what runs when.
pub(super) struct OperatorTask {
    pub(super) logic: Box<dyn OperatorLogic>,
    event_time: bool,
    allowed_lateness: u64,
    aligner: WatermarkAligner<InputChannel>,
    pub(super) timers: TimerService,
    pub(super) metrics: TaskMetrics,
    /// This task's part in the reconfigurations of its own operator (stop-and-restart).
    transfer: StateTransfer,
    /// When its inputs ended and when it may exit (the loop here; Koala's loop has its own).
    life: TaskLife,
    /// This task as an upstream of a reconfigured operator (stop-and-restart).
    upstream: UpstreamCore,
    /// Its processing budget (`[runtime] task_records_per_sec`, stateful operators only).
    budget: Option<RecordBudget>,
    /// The due time its timer outputs get (docs/architecture.md §9).
    timer_due: TimerDue,
    /// The loop records each batch's latency itself, from when its first record was taken (Koala,
    /// DRRS: records wait inside the protocol core); `on_batch` counts only its busy time.
    pub(super) latency_by_caller: bool,
    /// The last watermark it forwarded (what processing-time timers see).
    last_watermark: Option<Timestamp>,
    /// When it reads its clock next ([`PROCESSING_TICK`]).
    next_clock: Instant,
    /// Checkpoint barrier alignment over its data inputs (docs/architecture.md §10).
    barriers: BarrierGate,
    /// Writes its checkpoints in the background (started at its first barrier).
    checkpoints: Option<CheckpointWriter>,
}

/// Runs a transform task until every input channel has ended.
pub fn run_operator(mut setup: TaskSetup) -> Result<(), RuntimeError> {
    if setup.spec.is_stateful() && setup.deployment.protocol == koala_protocol::Protocol::Koala {
        return super::koala::run_koala_operator(setup);
    }
    if setup.spec.is_stateful() && setup.deployment.protocol == koala_protocol::Protocol::Drrs {
        return super::drrs::run_drrs_operator(setup);
    }
    let mut task = OperatorTask::new(&mut setup)?;
    let mut outputs = std::mem::replace(&mut setup.outputs, Outputs::new(Vec::new(), 1, Duration::ZERO));
    if setup.inputs.is_empty() {
        return Err(RuntimeError::deployment(setup.task, "a transform without inputs"));
    }
    let closed = crossbeam_channel::never();
    loop {
        let now = Instant::now();
        let gate = task.data_closed_until(now);
        let deadline =
            outputs.next_deadline().map_or(task.metrics.next_tick(), |d| d.min(task.metrics.next_tick()));
        let deadline = task.clock_deadline().map_or(deadline, |c| c.min(deadline));
        let timeout = gate.map_or(deadline, |g| g.min(deadline)).saturating_duration_since(now);
        // Whether an event was handled (a timeout changes nothing).
        let handled = select! {
            recv(setup.commands) -> cmd => match cmd {
                Ok(cmd) => {
                    task.on_command(&setup, &mut outputs, cmd)?;
                    true
                }
                Err(_) => return Err(RuntimeError::WorkerGone(setup.task)),
            },
            recv(setup.peer_inbox) -> item => match item {
                Ok(item) => {
                    task.on_message(&setup, &mut outputs, item.channel, item.message)?;
                    true
                }
                Err(_) => false,
            },
            recv(if gate.is_some() { &closed } else { setup.inbox.queue() }) -> item => {
                let Ok(item) = item else {
                    return Err(RuntimeError::InputClosed(setup.task));
                };
                setup.inbox.took();
                task.on_input(&setup, &mut outputs, item.channel, item.message)?;
                true
            },
            default(timeout) => false,
        };
        // The rules of `TaskLife` (the simulator's too), after every event whatever it was. A
        // `HandOver` that arrives after the last end of stream is such an event: the task sends
        // its state and its part is over; waiting for another message first hung the task.
        if handled && let Some(epoch) = task.check_inputs_ended() {
            outputs.flush_all()?;
            outputs.broadcast(&ChannelMessage::EndOfStream)?;
            setup.ack(epoch, koala_protocol::TaskAck::InputsEnded);
        }
        if handled && task.life.target_may_exit(task.transfer.busy()) {
            if let Some(writer) = task.checkpoints.as_mut() {
                writer.finish()?;
            }
            setup.report_last(&mut task.metrics, &mut outputs);
            return Ok(());
        }
        let now = Instant::now();
        task.processing_tick(&setup, &mut outputs, now)?;
        if let Some(writer) = &task.checkpoints {
            writer.check()?;
        }
        outputs.flush_due(now)?;
        setup.report(&mut task.metrics, &mut outputs, now);
    }
}

impl OperatorTask {
    pub(super) fn new(setup: &mut TaskSetup) -> Result<Self, RuntimeError> {
        let OperatorKind::Transform { factory, event_time, allowed_lateness, .. } = setup.spec.kind.clone()
        else {
            return Err(RuntimeError::deployment(&setup.spec.name, "is not a transform"));
        };
        let budget = setup
            .options
            .capacity
            .task_records_per_sec
            .filter(|_| setup.spec.is_stateful())
            .map(|rate| RecordBudget::new(rate, Instant::now()));
        let mut metrics = TaskMetrics::new(setup.task, false);
        metrics.budget = budget.as_ref().map(RecordBudget::rate);
        // Stop-and-restart and Remote process what they take: nothing is ever queued inside.
        metrics.queued_records = setup.spec.is_stateful().then_some(0);
        let mut aligner = WatermarkAligner::new(setup.inputs.iter().copied());
        let mut timers = TimerService::default();
        let mut last_watermark = None;
        let logic = factory(TaskInstance { index: setup.task.index, parallelism: setup.parallelism });
        if let Some(restored) = crate::checkpoint::restore_task(setup, logic.state_ids())? {
            for (channel, w) in restored.watermarks {
                if let Some(w) = w {
                    aligner.update(&channel, w);
                }
            }
            last_watermark = aligner.current();
            timers.register(restored.timers.into_iter().map(|(t, k)| (k, t)));
        }
        Ok(Self {
            logic,
            event_time,
            allowed_lateness,
            aligner,
            timers,
            metrics,
            transfer: StateTransfer::new(
                setup.task,
                setup.deployment.protocol == koala_protocol::Protocol::Remote,
            ),
            upstream: UpstreamCore::new(),
            life: TaskLife::new(false),
            budget,
            timer_due: TimerDue::default(),
            latency_by_caller: false,
            last_watermark,
            next_clock: Instant::now(),
            barriers: BarrierGate::new(
                setup.task,
                setup.inputs.iter().copied(),
                setup.inbox.alignment_hold(),
            ),
            checkpoints: None,
        })
    }

    /// Each input channel's watermark as the task knows it now (a restored task: as its
    /// checkpoint recorded it).
    pub(super) fn input_watermarks(&self) -> impl Iterator<Item = (InputChannel, Timestamp)> + '_ {
        self.aligner.watermarks().filter_map(|(c, w)| Some((c, w?)))
    }

    /// Until when the processing budget holds data input back (`None`: take data now). The loop
    /// then waits on everything but data input — commands, peer and fetch lanes — until then.
    pub(super) fn data_closed_until(&mut self, now: Instant) -> Option<Instant> {
        let (until, newly) = self.budget.as_mut()?.closed_until(now)?;
        self.metrics.throttled += newly;
        Some(until)
    }

    /// Applies a command (the loop checks the exit rule after it).
    fn on_command(
        &mut self,
        setup: &TaskSetup,
        outputs: &mut Outputs,
        cmd: TaskCommand,
    ) -> Result<(), RuntimeError> {
        match cmd {
            TaskCommand::UpstreamEnded(upstream) => {
                let channels: Vec<InputChannel> =
                    self.aligner.channels().filter(|c| c.from == upstream).collect();
                for channel in channels {
                    self.on_message(setup, outputs, channel, ChannelMessage::EndOfStream)?;
                }
            }
            TaskCommand::Prepare(plan) => {
                self.life.prepared(plan.epoch, false);
                let inputs = self.aligner.channels().collect();
                self.on_transfer(setup, outputs, TargetEvent::Prepare { plan, inputs })?;
            }
            TaskCommand::AddInputs { epoch, channels } => {
                for c in channels {
                    self.aligner.add_channel(c);
                    self.barriers.add_channel(c);
                }
                setup.ack(epoch, koala_protocol::TaskAck::Prepared);
            }
            TaskCommand::Drain { epoch } => {
                setup.drain_and_pause(&mut self.upstream, epoch, outputs, &mut self.metrics)?;
            }
            TaskCommand::Switch(switch) => {
                setup.switch_and_ack(&switch, outputs)?;
            }
            TaskCommand::HandOver { epoch } => {
                self.on_transfer(setup, outputs, TargetEvent::Drain { epoch })?;
            }
            TaskCommand::Release => self.life.release(),
            TaskCommand::StopSource
            | TaskCommand::Begin(_)
            | TaskCommand::DrrsBegin(_)
            | TaskCommand::Checkpoint(_)
            | TaskCommand::CheckpointCommitted(_) => {}
            TaskCommand::Resume(switch) => {
                // Not paused (a pause takes its Resume itself): the core refuses it.
                let event = UpstreamEvent::Resume { epoch: switch.epoch };
                setup.on_upstream(&mut self.upstream, event, Some(&switch), outputs)?;
            }
        }
        Ok(())
    }

    /// Takes one message of a data input through the barrier gate: a held channel's messages
    /// wait; an aligned checkpoint is written, its barrier forwarded and acknowledged, and the
    /// held messages are taken in order (the loop checks the exit rule after it).
    fn on_input(
        &mut self,
        setup: &TaskSetup,
        outputs: &mut Outputs,
        channel: InputChannel,
        message: ChannelMessage,
    ) -> Result<(), RuntimeError> {
        let mut queue = std::collections::VecDeque::from([(channel, message)]);
        while let Some((channel, message)) = queue.pop_front() {
            let aligned = match self.barriers.admit(channel, message)? {
                Gate::Take(ChannelMessage::EndOfStream) => {
                    self.on_message(setup, outputs, channel, ChannelMessage::EndOfStream)?;
                    self.barriers.on_end(&channel)
                }
                Gate::Take(message) => {
                    self.on_message(setup, outputs, channel, message)?;
                    None
                }
                Gate::Held | Gate::Waiting => None,
                Gate::Aligned(id) => Some(id),
            };
            if let Some(id) = aligned {
                let (held, alignment_ms) = self.barriers.release();
                let meta = TaskMeta {
                    watermarks: self.aligner.watermarks().collect(),
                    timers: self.timers.pending(),
                    cut: Default::default(),
                };
                // Only the freeze runs here; the writer writes the part and acknowledges it.
                let view = crate::checkpoint::freeze(setup, || self.transfer.owned(setup))?;
                outputs.broadcast_barrier(id)?;
                let writer = match &mut self.checkpoints {
                    Some(writer) => writer,
                    None => self.checkpoints.insert(CheckpointWriter::start(setup, id)?),
                };
                writer.submit(id, view, meta, alignment_ms)?;
                queue.extend(held);
            }
        }
        Ok(())
    }

    /// Handles one input message (the loop checks the exit rule after it).
    fn on_message(
        &mut self,
        setup: &TaskSetup,
        outputs: &mut Outputs,
        channel: InputChannel,
        message: ChannelMessage,
    ) -> Result<(), RuntimeError> {
        if channel.input == PEER_INPUT {
            let mut io = TransferIo { outputs, timers: &mut self.timers, metrics: &mut self.metrics };
            return self.transfer.on_peer(setup, channel, message, &mut io);
        }
        match message {
            ChannelMessage::Batch(records) => {
                let w = self.aligner.current();
                self.on_batch(setup, outputs, channel.input, records, w)?;
            }
            ChannelMessage::Watermark(w) => {
                if let Some(w) = self.aligner.update(&channel, w) {
                    self.advance(setup, outputs, w)?;
                }
            }
            // A marker of another epoch (another operator's reconfiguration, or a switch marker
            // of one this task is done with) passes through the core.
            ChannelMessage::Marker(epoch) => {
                self.on_transfer(setup, outputs, TargetEvent::Marker { channel, epoch })?
            }
            ChannelMessage::Barrier(_) => {
                // The gate takes barriers (`on_input`); one here came on a lane without one.
                return Err(RuntimeError::MisplacedMessage { task: setup.task, channel, message: "Barrier" });
            }
            ChannelMessage::EndOfStream => {
                if let Some(w) = self.aligner.close(&channel) {
                    self.advance(setup, outputs, w)?;
                }
                self.on_transfer(setup, outputs, TargetEvent::EndOfStream { channel })?;
            }
            other @ (ChannelMessage::State { .. }
            | ChannelMessage::Timers { .. }
            | ChannelMessage::StateEnd { .. }
            | ChannelMessage::Protocol(_)) => {
                let message = message_kind(&other);
                return Err(RuntimeError::MisplacedMessage { task: setup.task, channel, message });
            }
        }
        Ok(())
    }

    /// The epoch to report `InputsEnded` with, once every input ended and no reconfiguration
    /// part runs (with every input ended but state still to send or arriving, not yet).
    fn check_inputs_ended(&mut self) -> Option<koala_types::Epoch> {
        self.life.check_target_inputs_ended(self.aligner.live_channels(), self.transfer.busy())
    }

    /// Feeds the stop-and-restart target core and carries out what it decides.
    fn on_transfer(
        &mut self,
        setup: &TaskSetup,
        outputs: &mut Outputs,
        event: TargetEvent<InputChannel>,
    ) -> Result<(), RuntimeError> {
        let mut io = TransferIo { outputs, timers: &mut self.timers, metrics: &mut self.metrics };
        self.transfer.on(setup, event, &mut io)
    }

    /// Runs the operator on a batch of one input, in order: drop late records, fetch the keys'
    /// state, process, write back what changed, register timers, emit. Returns when the output was
    /// ready to emit: the end of the batch's latency (emitting may wait for room downstream,
    /// which is backpressure).
    pub(super) fn on_batch(
        &mut self,
        setup: &TaskSetup,
        outputs: &mut Outputs,
        input: usize,
        mut records: Vec<Record>,
        watermark: Option<Timestamp>,
    ) -> Result<Instant, RuntimeError> {
        let started = Instant::now();
        // The budget counts what `records_in` counts: records handed to the operator.
        let taken = records.len() as u64;
        self.metrics.records_in += taken;
        if self.event_time
            && let Some(w) = watermark
        {
            let before = records.len();
            let lateness = self.allowed_lateness;
            records.retain(|r| r.time.saturating_add(lateness) >= w);
            let dropped = (before - records.len()) as u64;
            if dropped > 0 {
                tracing::debug!(task = %setup.task, dropped, watermark = w, "dropped late records");
                self.metrics.late_dropped += dropped;
            }
        }
        self.timer_due.saw(&records);
        if self.transfer.busy()
            && records
                .iter()
                .any(|r| !self.transfer.may_read(koala_types::bucket_of(&r.key, setup.num_buckets)))
        {
            // The core's gate: a bucket still arriving (remote: not flushed by its old owner)
            // must not be read. Upstreams stay paused until then, so this never happens.
            return Err(RuntimeError::Invariant {
                task: setup.task,
                what: "a record of a bucket whose state has not arrived (or not been flushed)",
            });
        }
        let mut output = Vec::new();
        let mut timers = Vec::new();
        match setup.store.as_deref() {
            Some(store) if !self.logic.state_ids().is_empty() => {
                self.metrics.count_buckets(&records, setup.num_buckets);
                let keys = records.iter().map(|r| r.key.as_slice());
                let (mut state, io) =
                    BatchState::fetch(store, setup.num_buckets, self.logic.state_ids(), keys)?;
                self.metrics.state_reads += io.reads;
                let mut ctx = OperatorContext {
                    state: &mut state,
                    output: &mut output,
                    timers: &mut timers,
                    watermark,
                };
                self.logic.on_records(input, &records, &mut ctx)?;
                self.metrics.state_writes += state.write_back(store)?.writes;
            }
            _ => {
                let mut ctx = OperatorContext {
                    state: &mut NoState,
                    output: &mut output,
                    timers: &mut timers,
                    watermark,
                };
                self.logic.on_records(input, &records, &mut ctx)?;
            }
        }
        self.timers.register(timers);
        self.metrics.records_out += output.len() as u64;
        let done = Instant::now();
        if self.latency_by_caller {
            self.metrics.record_busy(done - started);
        } else {
            self.metrics.record_batch(started, done);
        }
        if let Some(budget) = self.budget.as_mut() {
            budget.charge(taken, done);
        }
        outputs.emit(output)?;
        Ok(done)
    }

    /// Event time reached `watermark`: fire due timers, then forward the watermark.
    pub(super) fn advance(
        &mut self,
        setup: &TaskSetup,
        outputs: &mut Outputs,
        watermark: Timestamp,
    ) -> Result<(), RuntimeError> {
        self.last_watermark = Some(watermark);
        self.fire_until_none_due(setup, outputs, Some(watermark), |timers| timers.pop_due(watermark))?;
        outputs.broadcast(&ChannelMessage::Watermark(watermark))
    }

    /// The clock reached `up_to`: fire the processing-time timers due then (their keys' state is
    /// here: under Koala the core says up to when, `TaskAction::FireProcessingTimers`).
    pub(super) fn fire_processing(
        &mut self,
        setup: &TaskSetup,
        outputs: &mut Outputs,
        up_to: Timestamp,
    ) -> Result<(), RuntimeError> {
        let watermark = self.last_watermark;
        self.fire_until_none_due(setup, outputs, watermark, |timers| timers.pop_processing_due(up_to))
    }

    /// When the loop must wake to read the clock: only while a processing-time timer waits.
    pub(super) fn clock_deadline(&self) -> Option<Instant> {
        self.timers.has_processing().then_some(self.next_clock)
    }

    /// The clock, if a processing-time timer waits and it is time to read it again
    /// ([`PROCESSING_TICK`]).
    pub(super) fn clock_due(&mut self, now: Instant) -> Option<Timestamp> {
        if now < self.next_clock || !self.timers.has_processing() {
            return None;
        }
        self.next_clock = now + PROCESSING_TICK;
        Some(processing_time_now())
    }

    /// Stop-and-restart and DRRS: the state of every timer's key is here (moved buckets' timers
    /// travel with their state), so due processing-time timers fire on the clock.
    pub(super) fn processing_tick(
        &mut self,
        setup: &TaskSetup,
        outputs: &mut Outputs,
        now: Instant,
    ) -> Result<(), RuntimeError> {
        match self.clock_due(now) {
            Some(clock) => self.fire_processing(setup, outputs, clock),
            None => Ok(()),
        }
    }

    /// Fires the timers due at `up_to` whose key matches, without emitting a watermark (a
    /// sender does this for the buckets it hands over, so no timer due at its event time moves to
    /// a receiver that may already have emitted a later watermark).
    pub(super) fn fire_due_where(
        &mut self,
        setup: &TaskSetup,
        outputs: &mut Outputs,
        up_to: Timestamp,
        mut matches: impl FnMut(&[u8]) -> bool,
    ) -> Result<(), RuntimeError> {
        self.fire_until_none_due(setup, outputs, Some(up_to), |timers| {
            timers.pop_due_where(up_to, &mut matches)
        })
    }

    /// Fires what `pop` takes from the timers, in batches, until it takes nothing (firing may
    /// register timers that are due at once).
    fn fire_until_none_due(
        &mut self,
        setup: &TaskSetup,
        outputs: &mut Outputs,
        watermark: Option<Timestamp>,
        mut pop: impl FnMut(&mut TimerService) -> Vec<(Timestamp, Vec<u8>)>,
    ) -> Result<(), RuntimeError> {
        loop {
            let due = pop(&mut self.timers);
            if due.is_empty() {
                return Ok(());
            }
            for chunk in due.chunks(TIMER_BATCH) {
                self.fire(setup, outputs, watermark, chunk)?;
            }
        }
    }

    fn fire(
        &mut self,
        setup: &TaskSetup,
        outputs: &mut Outputs,
        watermark: Option<Timestamp>,
        due: &[(Timestamp, Vec<u8>)],
    ) -> Result<(), RuntimeError> {
        let started = Instant::now();
        let mut output = Vec::new();
        let mut timers = Vec::new();
        match setup.store.as_deref() {
            Some(store) if !self.logic.state_ids().is_empty() => {
                let keys = due.iter().map(|(_, k)| k.as_slice());
                let (mut state, io) =
                    BatchState::fetch(store, setup.num_buckets, self.logic.state_ids(), keys)?;
                self.metrics.state_reads += io.reads;
                for (time, key) in due {
                    let mut ctx = OperatorContext {
                        state: &mut state,
                        output: &mut output,
                        timers: &mut timers,
                        watermark,
                    };
                    self.logic.on_timer(key, *time, &mut ctx)?;
                }
                self.metrics.state_writes += state.write_back(store)?.writes;
            }
            _ => {
                for (time, key) in due {
                    let mut ctx = OperatorContext {
                        state: &mut NoState,
                        output: &mut output,
                        timers: &mut timers,
                        watermark,
                    };
                    self.logic.on_timer(key, *time, &mut ctx)?;
                }
            }
        }
        self.timers.register(timers);
        self.timer_due.stamp(&mut output);
        self.metrics.records_out += output.len() as u64;
        self.metrics.record_batch(started, Instant::now());
        outputs.emit(output)
    }
}
