//! The loop of a sink task: write every record out in arrival order until every input has ended,
//! measuring each record's end-to-end latency (written − due at its source).

use std::collections::VecDeque;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crossbeam_channel::select;
use koala_dataflow::logic::{SinkFormat, SinkLogic, ValueToJson};
use koala_dataflow::{OperatorKind, TaskInstance};
use koala_protocol::checkpoint::TaskCheckpoint;
use koala_protocol::{TaskAck, WorkerMessage};
use koala_types::{ChannelMessage, Record};

use super::sink_parts::PartFiles;
use super::{TaskCommand, TaskSetup};
use crate::RuntimeError;
use crate::checkpoint::{BarrierGate, Gate};
use crate::metrics::TaskMetrics;

enum Writer {
    Lines(Box<dyn Write + Send>, ValueToJson),
    /// Exactly once (checkpoints on): per-checkpoint part files (`sink_parts`).
    Parts(PartFiles, ValueToJson),
    Discard,
    Custom(Box<dyn SinkLogic>),
}

impl Writer {
    fn write(&mut self, records: &[Record]) -> Result<(), RuntimeError> {
        match self {
            Self::Lines(out, to_json) => {
                for r in records {
                    let line = to_json(&r.value)?;
                    out.write_all(line.as_bytes())
                        .and_then(|()| out.write_all(b"\n"))
                        .map_err(|e| RuntimeError::io("writing sink output", e))?;
                }
                Ok(())
            }
            Self::Parts(parts, to_json) => {
                for r in records {
                    parts.write_line(to_json(&r.value)?.as_bytes())?;
                }
                Ok(())
            }
            Self::Discard => Ok(()),
            Self::Custom(sink) => Ok(sink.write(records)?),
        }
    }

    fn flush(&mut self) -> Result<(), RuntimeError> {
        match self {
            Self::Lines(out, _) => out.flush().map_err(|e| RuntimeError::io("flushing sink output", e)),
            Self::Parts(parts, _) => parts.flush(),
            Self::Discard => Ok(()),
            Self::Custom(sink) => Ok(sink.flush()?),
        }
    }
}

/// The file a JSON-lines sink task writes: `<dir>/<sink>-<index>.jsonl`.
pub fn sink_file(dir: &str, sink: &str, index: u32) -> PathBuf {
    PathBuf::from(dir).join(format!("{sink}-{index}.jsonl"))
}

/// Runs a sink task until every input channel has ended.
pub fn run_sink(setup: TaskSetup) -> Result<(), RuntimeError> {
    let OperatorKind::Sink { format } = setup.spec.kind.clone() else {
        return Err(RuntimeError::deployment(&setup.spec.name, "is not a sink"));
    };
    let mut writer = match format {
        SinkFormat::JsonLines(to_json) if setup.options.checkpoint.dir.is_some() => {
            let stem = format!("{}-{}", setup.spec.name, setup.task.index);
            let restored = setup.options.checkpoint.restore.as_ref().map(|r| r.id);
            Writer::Parts(PartFiles::open(Path::new(&setup.options.sink_dir), &stem, restored)?, to_json)
        }
        SinkFormat::JsonLines(to_json) => {
            let path = sink_file(&setup.options.sink_dir, &setup.spec.name, setup.task.index);
            let file = File::create(&path)
                .map_err(|e| RuntimeError::io(format!("creating sink file {}", path.display()), e))?;
            Writer::Lines(Box::new(BufWriter::new(file)), to_json)
        }
        SinkFormat::Stdout(to_json) => Writer::Lines(Box::new(std::io::stdout()), to_json),
        SinkFormat::Discard => Writer::Discard,
        SinkFormat::Custom(factory) => {
            Writer::Custom(factory(TaskInstance { index: setup.task.index, parallelism: setup.parallelism })?)
        }
    };
    let mut open = setup.inputs.clone();
    let mut barriers =
        BarrierGate::new(setup.task, setup.inputs.iter().copied(), setup.inbox.alignment_hold());
    let mut metrics = TaskMetrics::new(setup.task, false);
    // Records written since the job's start, a restored sink counting on from its checkpoint
    // (`metric::RECORDS_TOTAL`).
    let mut total = setup.restored_records_total().unwrap_or(0);
    metrics.records_total = Some(total);
    let mut outputs = crate::output::Outputs::new(Vec::new(), 1, Duration::ZERO);
    // A sink of a restored job reports its first write: where the recovery ends for its output.
    let mut report_first_output =
        setup.options.checkpoint.restore.is_some() && !setup.created_by_reconfiguration;
    while !open.is_empty() {
        let timeout = metrics.next_tick().saturating_duration_since(Instant::now());
        select! {
            recv(setup.commands) -> cmd => match cmd {
                Ok(TaskCommand::AddInputs { epoch, channels }) => {
                    for c in &channels {
                        barriers.add_channel(*c);
                    }
                    open.extend(channels);
                    setup.ack(epoch, TaskAck::Prepared);
                }
                Ok(TaskCommand::CheckpointCommitted(id)) => {
                    if let Writer::Parts(parts, _) = &mut writer {
                        parts.commit(id)?;
                    }
                }
                Ok(other) => tracing::error!(task = %setup.task, command = ?other, "command a sink cannot apply; ignored"),
                Err(_) => return Err(RuntimeError::WorkerGone(setup.task)),
            },
            recv(setup.inbox.queue()) -> item => {
                let Ok(item) = item else {
                    return Err(RuntimeError::InputClosed(setup.task));
                };
                setup.inbox.took();
                let mut queue = VecDeque::from([(item.channel, item.message)]);
                while let Some((channel, message)) = queue.pop_front() {
                    let aligned = match barriers.admit(channel, message)? {
                        Gate::Take(ChannelMessage::Batch(records)) => {
                            let started = Instant::now();
                            writer.write(&records)?;
                            let now_ms = crate::metrics::unix_ms();
                            if report_first_output && !records.is_empty() {
                                report_first_output = false;
                                let first = WorkerMessage::FirstOutput { task: setup.task, unix_ms: now_ms };
                                let _ = setup.events.send(first);
                            }
                            metrics.record_arrivals(&records, now_ms);
                            metrics.records_in += records.len() as u64;
                            total += records.len() as u64;
                            metrics.records_total = Some(total);
                            metrics.records_out += records.len() as u64;
                            metrics.record_batch(started, Instant::now());
                            None
                        }
                        Gate::Take(ChannelMessage::EndOfStream) => {
                            open.remove(&channel);
                            barriers.on_end(&channel)
                        }
                        Gate::Take(_) | Gate::Held | Gate::Waiting => None,
                        Gate::Aligned(id) => Some(id),
                    };
                    if let Some(id) = aligned {
                        let (held, alignment_ms) = barriers.release();
                        if let Writer::Parts(parts, _) = &mut writer {
                            parts.barrier(id)?;
                        }
                        let ack = TaskCheckpoint { alignment_ms, records: total, ..TaskCheckpoint::default() };
                        crate::checkpoint::acknowledge(&setup, id, ack);
                        queue.extend(held);
                    }
                }
            },
            default(timeout) => writer.flush()?,
        }
        setup.report(&mut metrics, &mut outputs, Instant::now());
    }
    writer.flush()?;
    if let Writer::Parts(parts, _) = &mut writer {
        // The final commit: the input ended, nothing after it can be replayed.
        parts.finish()?;
    }
    setup.report_last(&mut metrics, &mut outputs);
    Ok(())
}
