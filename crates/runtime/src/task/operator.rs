//! The loop of a transform task: batches in, state fetched per batch, timers fired as event time
//! advances, records out.

use std::time::{Duration, Instant};

use crossbeam_channel::select;
use koala_dataflow::logic::OperatorLogic;
use koala_dataflow::{OperatorContext, OperatorKind, TaskInstance};
use koala_protocol::WatermarkAligner;
use koala_types::{ChannelMessage, Record, Timestamp};

use super::{TaskCommand, TaskSetup};
use crate::RuntimeError;
use crate::batch_state::{BatchState, NoState};
use crate::channel::InputChannel;
use crate::metrics::TaskMetrics;
use crate::output::Outputs;
use crate::timers::TimerService;

/// Keys fetched per round of timer firing.
const TIMER_BATCH: usize = 1024;

struct OperatorTask {
    logic: Box<dyn OperatorLogic>,
    event_time: bool,
    allowed_lateness: u64,
    aligner: WatermarkAligner<InputChannel>,
    timers: TimerService,
    metrics: TaskMetrics,
}

/// Runs a transform task until every input channel has ended.
pub fn run_operator(mut setup: TaskSetup) -> Result<(), RuntimeError> {
    let OperatorKind::Transform {
        factory,
        event_time,
        allowed_lateness,
        ..
    } = setup.spec.kind.clone()
    else {
        return Err(RuntimeError::Deployment(format!(
            "{} is not a transform",
            setup.spec.name
        )));
    };
    let logic = factory(TaskInstance {
        index: setup.task.index,
        parallelism: setup.parallelism,
    });
    let mut task = OperatorTask {
        logic,
        event_time,
        allowed_lateness,
        aligner: WatermarkAligner::new(setup.inputs.iter().copied()),
        timers: TimerService::default(),
        metrics: TaskMetrics::new(setup.task, false),
    };
    let mut outputs = std::mem::replace(
        &mut setup.outputs,
        Outputs::new(Vec::new(), 1, Duration::ZERO),
    );
    if setup.inputs.is_empty() {
        return Err(RuntimeError::Deployment(format!(
            "{} has no inputs",
            setup.task
        )));
    }
    loop {
        let now = Instant::now();
        let deadline = outputs
            .next_deadline()
            .map_or(task.metrics.next_tick(), |d| {
                d.min(task.metrics.next_tick())
            });
        let timeout = deadline.saturating_duration_since(now);
        select! {
            recv(setup.commands) -> cmd => match cmd {
                Ok(TaskCommand::StopSource) | Err(_) => {}
            },
            recv(setup.inbox) -> item => {
                let Ok(item) = item else {
                    return Err(RuntimeError::Deployment(format!("input queue of {} closed", setup.task)));
                };
                if task.on_message(&setup, &mut outputs, item.channel, item.message)? {
                    outputs.flush_all()?;
                    outputs.broadcast(&ChannelMessage::EndOfStream)?;
                    setup.report(&mut task.metrics, &mut outputs, Instant::now() + Duration::from_secs(1));
                    return Ok(());
                }
            },
            default(timeout) => {}
        }
        let now = Instant::now();
        outputs.flush_due(now)?;
        setup.report(&mut task.metrics, &mut outputs, now);
    }
}

impl OperatorTask {
    /// Handles one input message; returns true once every input has ended.
    fn on_message(
        &mut self,
        setup: &TaskSetup,
        outputs: &mut Outputs,
        channel: InputChannel,
        message: ChannelMessage,
    ) -> Result<bool, RuntimeError> {
        match message {
            ChannelMessage::Batch(records) => {
                self.on_batch(setup, outputs, channel.input, records)?
            }
            ChannelMessage::Watermark(w) => {
                if let Some(w) = self.aligner.update(&channel, w) {
                    self.advance(setup, outputs, w)?;
                }
            }
            ChannelMessage::Marker(epoch) => {
                tracing::debug!(task = %setup.task, epoch, ?channel, "marker");
            }
            ChannelMessage::EndOfStream => {
                if let Some(w) = self.aligner.close(&channel) {
                    self.advance(setup, outputs, w)?;
                }
                return Ok(self.aligner.live_channels() == 0);
            }
        }
        Ok(false)
    }

    fn on_batch(
        &mut self,
        setup: &TaskSetup,
        outputs: &mut Outputs,
        input: usize,
        mut records: Vec<Record>,
    ) -> Result<(), RuntimeError> {
        let started = Instant::now();
        self.metrics.records_in += records.len() as u64;
        let watermark = self.aligner.current();
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
        let mut output = Vec::new();
        let mut timers = Vec::new();
        match setup.store.as_deref() {
            Some(store) if !self.logic.state_ids().is_empty() => {
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
                self.metrics.state_writes += state.write_back(store, setup.num_buckets)?.writes;
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
        self.metrics.record_batch(started.elapsed());
        outputs.emit(output)
    }

    /// Event time reached `watermark`: fire due timers, then forward the watermark.
    fn advance(
        &mut self,
        setup: &TaskSetup,
        outputs: &mut Outputs,
        watermark: Timestamp,
    ) -> Result<(), RuntimeError> {
        loop {
            let due = self.timers.pop_due(watermark);
            if due.is_empty() {
                break;
            }
            for chunk in due.chunks(TIMER_BATCH) {
                self.fire(setup, outputs, watermark, chunk)?;
            }
        }
        outputs.broadcast(&ChannelMessage::Watermark(watermark))
    }

    fn fire(
        &mut self,
        setup: &TaskSetup,
        outputs: &mut Outputs,
        watermark: Timestamp,
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
                        watermark: Some(watermark),
                    };
                    self.logic.on_timer(key, *time, &mut ctx)?;
                }
                self.metrics.state_writes += state.write_back(store, setup.num_buckets)?.writes;
            }
            _ => {
                for (time, key) in due {
                    let mut ctx = OperatorContext {
                        state: &mut NoState,
                        output: &mut output,
                        timers: &mut timers,
                        watermark: Some(watermark),
                    };
                    self.logic.on_timer(key, *time, &mut ctx)?;
                }
            }
        }
        self.timers.register(timers);
        self.metrics.records_out += output.len() as u64;
        self.metrics.record_batch(started.elapsed());
        outputs.emit(output)
    }
}
