//! The loop of a sink task: write every record out in arrival order until every input has ended,
//! measuring each record's end-to-end latency (written − due at its source).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crossbeam_channel::select;
use koala_dataflow::logic::{SinkFormat, SinkLogic, ValueToJson};
use koala_dataflow::{OperatorKind, TaskInstance};
use koala_protocol::TaskAck;
use koala_types::{ChannelMessage, Record};

use super::{TaskCommand, TaskSetup};
use crate::RuntimeError;
use crate::metrics::TaskMetrics;

enum Writer {
    Lines(Box<dyn Write + Send>, ValueToJson),
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
            Self::Discard => Ok(()),
            Self::Custom(sink) => Ok(sink.write(records)?),
        }
    }

    fn flush(&mut self) -> Result<(), RuntimeError> {
        match self {
            Self::Lines(out, _) => out.flush().map_err(|e| RuntimeError::io("flushing sink output", e)),
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
    let mut metrics = TaskMetrics::new(setup.task, false);
    let mut outputs = crate::output::Outputs::new(Vec::new(), 1, Duration::ZERO);
    while !open.is_empty() {
        let timeout = metrics.next_tick().saturating_duration_since(Instant::now());
        select! {
            recv(setup.commands) -> cmd => match cmd {
                Ok(TaskCommand::AddInputs { epoch, channels }) => {
                    open.extend(channels);
                    setup.ack(epoch, TaskAck::Prepared);
                }
                Ok(other) => tracing::error!(task = %setup.task, command = ?other, "command a sink cannot apply; ignored"),
                Err(_) => return Err(RuntimeError::WorkerGone(setup.task)),
            },
            recv(setup.inbox.queue()) -> item => {
                let Ok(item) = item else {
                    return Err(RuntimeError::InputClosed(setup.task));
                };
                setup.inbox.took();
                match item.message {
                    ChannelMessage::Batch(records) => {
                        let started = Instant::now();
                        writer.write(&records)?;
                        metrics.record_arrivals(&records, crate::metrics::unix_ms());
                        metrics.records_in += records.len() as u64;
                        metrics.records_out += records.len() as u64;
                        metrics.record_batch(started.elapsed());
                    }
                    ChannelMessage::EndOfStream => {
                        open.remove(&item.channel);
                    }
                    _ => {}
                }
            },
            default(timeout) => writer.flush()?,
        }
        setup.report(&mut metrics, &mut outputs, Instant::now());
    }
    writer.flush()?;
    setup.report(&mut metrics, &mut outputs, Instant::now() + Duration::from_secs(1));
    Ok(())
}
