//! The loop of a source task: pace the source by its rate schedule, stamp every record with the
//! time it was due (unix ms, `Record::due_ms`) and measure its lag against it, emit periodic
//! watermarks (maximum event time − bounded disorder).

use std::time::{Duration, Instant};

use crossbeam_channel::RecvTimeoutError;
use koala_dataflow::logic::SourceLogic;
use koala_dataflow::{OperatorKind, Restored, SourcePoll, TaskInstance};
use koala_protocol::checkpoint::TaskCheckpoint;
use koala_protocol::stop_restart::{UpstreamCore, UpstreamEvent};
use koala_types::{ChannelMessage, Timestamp};

use super::{TaskCommand, TaskSetup};
use crate::RuntimeError;
use crate::metrics::TaskMetrics;
use crate::output::Outputs;

/// How long a self-paced source that returned nothing waits before asking again.
const IDLE_WAIT: Duration = Duration::from_millis(5);

/// Runs a source task until it is exhausted or told to stop.
pub fn run_source(mut setup: TaskSetup) -> Result<(), RuntimeError> {
    let OperatorKind::Source { factory, options } = setup.spec.kind.clone() else {
        return Err(RuntimeError::deployment(&setup.spec.name, "is not a source"));
    };
    let mut logic = factory(TaskInstance { index: setup.task.index, parallelism: setup.parallelism });
    let paced = logic.paced_by_runtime();
    let mut outputs = std::mem::replace(&mut setup.outputs, Outputs::new(Vec::new(), 1, Duration::ZERO));
    let mut metrics = TaskMetrics::new(setup.task, true);
    let mut upstream = UpstreamCore::new();
    let batch = setup.options.batch_records.max(1);
    let wm_interval = Duration::from_millis(options.watermark_interval_ms.max(1));
    // A restored source resumes where the checkpoint recorded it (a generator skips what it
    // emitted before and goes on at the schedule's rate from there; docs/architecture.md §10).
    let Restored { skipped, finished } = rewind(&setup, logic.as_mut())?;
    let offset_ms = if paced { options.rate.due_ms(skipped, setup.parallelism).unwrap_or(0.0) } else { 0.0 };
    let offset = Duration::from_secs_f64(offset_ms / 1000.0);
    let started = Instant::now().checked_sub(offset).unwrap_or_else(Instant::now);
    // Wall-clock start in unix ms, to turn schedule offsets into due times.
    let started_unix_ms = crate::metrics::unix_ms() as f64 - offset_ms;
    // Paced sources: the due time of the `emitted`-th record, the oldest not yet emitted.
    let pending_due = |emitted: u64| {
        options.rate.due_ms(emitted, setup.parallelism).map(|due| (started_unix_ms + due) as u64)
    };
    let mut emitted: u64 = skipped;
    // Records emitted since the job's start, restored ones included (`metric::RECORDS_TOTAL`): a
    // generator's skipped records, a Kafka source's count at the checkpoint.
    let restored_total = setup.restored_records_total().unwrap_or(skipped);
    let total = move |emitted: u64| restored_total + emitted.saturating_sub(skipped);
    metrics.records_total = Some(total(emitted));
    metrics.pending_due_ms = if paced { pending_due(emitted) } else { None };
    // Watermarks go on from the skipped records' event time: a restored source never sends one
    // below what it sent before the checkpoint (downstream, a watermark does not go back).
    let mut max_time: Option<Timestamp> = setup
        .options
        .checkpoint
        .restore
        .as_ref()
        .filter(|_| !setup.created_by_reconfiguration)
        .and_then(|p| p.event_times.get(&setup.task).copied());
    let mut last_wm: Option<Timestamp> = None;
    let mut next_wm = started + wm_interval;
    let mut buf = Vec::with_capacity(batch);
    let mut lag_samples = Vec::new();
    // A source that had finished at the checkpoint emits nothing.
    loop {
        if finished {
            break;
        }
        // Commands first: a stop request ends the source between two batches.
        if let Ok(cmd) = setup.commands.try_recv()
            && on_command(
                &setup,
                cmd,
                logic.as_mut(),
                &mut upstream,
                &mut outputs,
                &mut metrics,
                SourceProgress { emitted, max_time, total: total(emitted) },
            )?
        {
            break;
        }
        let now = Instant::now();
        let elapsed_ms = now.duration_since(started).as_secs_f64() * 1000.0;
        // How many records are due by now (paced sources), capped at one batch.
        let mut allowed = batch;
        if paced {
            let mut n = 0;
            while n < batch {
                match options.rate.due_ms(emitted + n as u64, setup.parallelism) {
                    Some(due) if due > elapsed_ms => break,
                    _ => n += 1,
                }
            }
            allowed = n;
        }
        if allowed == 0 {
            let due_ms = options.rate.due_ms(emitted, setup.parallelism).unwrap_or(elapsed_ms);
            let due_at = started + Duration::from_secs_f64(due_ms / 1000.0);
            // Buffered records go out when their batch fills or has lingered (the bottom of the
            // loop), not whenever the next record is not due yet: at 15 000 records/s that was
            // after nearly every record, one record per message, and `linger_ms` meant nothing.
            let mut wake = due_at.min(next_wm).min(metrics.next_tick());
            if let Some(deadline) = outputs.next_deadline() {
                wake = wake.min(deadline);
            }
            match setup.commands.recv_timeout(wake.saturating_duration_since(Instant::now())) {
                Ok(cmd) => {
                    if on_command(
                        &setup,
                        cmd,
                        logic.as_mut(),
                        &mut upstream,
                        &mut outputs,
                        &mut metrics,
                        SourceProgress { emitted, max_time, total: total(emitted) },
                    )? {
                        break;
                    }
                }
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {}
            }
        } else {
            buf.clear();
            let poll = logic.poll(allowed, &mut buf)?;
            if paced {
                let now_ms = Instant::now().duration_since(started).as_secs_f64() * 1000.0;
                for (i, record) in buf.iter_mut().enumerate() {
                    // An unlimited schedule makes every record due the moment it is generated.
                    let due = options.rate.due_ms(emitted + i as u64, setup.parallelism).unwrap_or(now_ms);
                    metrics.record_lag((now_ms - due).max(0.0) as u64);
                    record.due_ms = (started_unix_ms + due) as u64;
                }
            } else {
                // Self-paced sources stamp their records (Kafka: the record's timestamp); one
                // that does not gets the time it was read.
                let now_unix_ms = crate::metrics::unix_ms();
                for record in buf.iter_mut().filter(|r| r.due_ms == 0) {
                    record.due_ms = now_unix_ms;
                }
                logic.drain_lag_samples(&mut lag_samples);
                for lag in lag_samples.drain(..) {
                    metrics.record_lag(lag);
                }
            }
            emitted += buf.len() as u64;
            metrics.records_total = Some(total(emitted));
            metrics.pending_due_ms = if paced { pending_due(emitted) } else { logic.pending_due_ms() };
            metrics.records_in += buf.len() as u64;
            metrics.records_out += buf.len() as u64;
            if let Some(t) = buf.iter().map(|r| r.time).max() {
                max_time = Some(max_time.map_or(t, |m| m.max(t)));
            }
            let was_empty = buf.is_empty();
            outputs.emit_from(&mut buf)?;
            if poll == SourcePoll::Finished {
                break;
            }
            if was_empty && !paced {
                outputs.flush_all()?;
                if let Ok(cmd) = setup.commands.recv_timeout(IDLE_WAIT)
                    && on_command(
                        &setup,
                        cmd,
                        logic.as_mut(),
                        &mut upstream,
                        &mut outputs,
                        &mut metrics,
                        SourceProgress { emitted, max_time, total: total(emitted) },
                    )?
                {
                    break;
                }
            }
        }
        let now = Instant::now();
        if now >= next_wm {
            next_wm = now + wm_interval;
            if let Some(m) = max_time {
                let wm = m.saturating_sub(options.max_disorder_ms);
                if last_wm.is_none_or(|l| wm > l) {
                    last_wm = Some(wm);
                    outputs.broadcast(&ChannelMessage::Watermark(wm))?;
                }
            }
        }
        outputs.flush_due(now)?;
        if now >= metrics.next_tick() {
            metrics.offset_lag = logic.offset_lag();
            metrics.malformed = logic.malformed_records();
        }
        setup.report(&mut metrics, &mut outputs, now);
    }
    // Nothing is pending once the source ended (the schedule would name a record never made).
    metrics.pending_due_ms = None;
    outputs.broadcast(&ChannelMessage::Watermark(Timestamp::MAX))?;
    outputs.broadcast(&ChannelMessage::EndOfStream)?;
    // The last sample carries the final offset lag (a short run may never have reached a tick).
    metrics.offset_lag = logic.offset_lag();
    metrics.malformed = logic.malformed_records();
    setup.report_last(&mut metrics, &mut outputs);
    Ok(())
}

/// A restored source's position (`checkpoint.restore`): the source resumes where the checkpoint
/// recorded it ([`SourceLogic::restore`]).
fn rewind(setup: &TaskSetup, logic: &mut dyn SourceLogic) -> Result<Restored, RuntimeError> {
    // A source a reconfiguration created is not in the checkpoint.
    let Some(point) = setup.options.checkpoint.restore.as_ref().filter(|_| !setup.created_by_reconfiguration)
    else {
        return Ok(Restored::default());
    };
    let Some(position) = point.positions.get(&setup.task) else { return Ok(Restored::default()) };
    let restored = logic.restore(position).map_err(|e| RuntimeError::Checkpoint {
        task: setup.task,
        what: format!("restoring the source at {position} from checkpoint {}: {e}", point.id),
    })?;
    tracing::info!(
        task = %setup.task, checkpoint = point.id, skipped = restored.skipped,
        "source restored at {position} from checkpoint {}", point.id
    );
    Ok(restored)
}

/// How far a source got: what its checkpoint acknowledgement records.
#[derive(Clone, Copy)]
struct SourceProgress {
    /// Records emitted.
    emitted: u64,
    /// Records emitted since the job's start, restored ones included.
    total: u64,
    /// The largest event time among them: a restored source's watermarks go on from there, never
    /// below one it sent before the checkpoint (downstream, a watermark does not go back).
    max_time: Option<Timestamp>,
}

/// Handles a command between two batches; returns true if the source must end now.
fn on_command(
    setup: &TaskSetup,
    cmd: TaskCommand,
    logic: &mut dyn SourceLogic,
    upstream: &mut UpstreamCore,
    outputs: &mut Outputs,
    metrics: &mut TaskMetrics,
    progress: SourceProgress,
) -> Result<bool, RuntimeError> {
    match cmd {
        TaskCommand::StopSource => Ok(true),
        TaskCommand::Checkpoint(id) => {
            // Everything emitted so far precedes the barrier on every channel.
            outputs.broadcast_barrier(id)?;
            let position = Some(logic.checkpoint_position(progress.emitted));
            let ack = TaskCheckpoint {
                position,
                event_time: progress.max_time,
                records: progress.total,
                ..TaskCheckpoint::default()
            };
            crate::checkpoint::acknowledge(setup, id, ack);
            Ok(false)
        }
        TaskCommand::Drain { epoch } => setup.drain_and_pause(upstream, epoch, outputs, metrics),
        TaskCommand::Resume(switch) => {
            // Not paused (a pause takes its Resume itself): the core refuses it.
            let event = UpstreamEvent::Resume { epoch: switch.epoch };
            setup.on_upstream(upstream, event, Some(&switch), outputs)?;
            Ok(false)
        }
        TaskCommand::Switch(switch) => {
            setup.switch_and_ack(&switch, outputs)?;
            Ok(false)
        }
        other => {
            tracing::error!(task = %setup.task, command = ?other, "command a source cannot apply; ignored");
            Ok(false)
        }
    }
}
