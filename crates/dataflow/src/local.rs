//! A tiny single-threaded reference executor for doc examples and unit tests — not the runtime.
//!
//! Runs every operator of a [`JobGraph`] as one task, with state in memory. Sources are polled
//! round-robin in small batches until exhausted; after each batch a source emits the watermark
//! `max event time seen − max_disorder_ms`, and `u64::MAX` once finished, so all windows fire.
//! An operator's watermark is the minimum over its inputs; timers fire when it reaches them, and
//! event-time operators drop records later than the watermark by more than their allowed
//! lateness, as the runtime does. State access is limited to the keys of the current batch (or
//! timer) and the declared state ids, so operators that break the contract fail here too.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};

use koala_types::{Record, Timestamp};

use crate::graph::{JobGraph, OperatorKind, Partitioning, TaskInstance};
use crate::logic::{
    DataflowError, KeyedStateAccess, OperatorContext, OperatorLogic, SinkFormat, SinkLogic, SourceLogic,
    SourcePoll, StateId, TimerDue,
};

/// What each sink received, by sink name, as JSON values in arrival order (discard and custom
/// sinks have empty lists).
pub type SinkOutputs = BTreeMap<String, Vec<serde_json::Value>>;

/// Knobs of the local executor.
#[derive(Clone, Debug)]
pub struct LocalOptions {
    /// Records a source returns per poll.
    pub batch_size: usize,
    /// A source producing more records than this fails the run (guards unbounded sources).
    pub max_source_records: u64,
}

impl Default for LocalOptions {
    fn default() -> Self {
        Self { batch_size: 64, max_source_records: 10_000_000 }
    }
}

/// Runs `graph` to completion with default options.
///
/// ```
/// # use koala_dataflow::{Dataflow, SourceOptions, local};
/// let df = Dataflow::new();
/// df.source("src", SourceOptions::default(), |_| (0..3u8).map(|x| (x, 0))).sink_json_lines("out");
/// assert_eq!(local::run(&df.build()?)?["out"].len(), 3);
/// # Ok::<(), koala_dataflow::DataflowError>(())
/// ```
pub fn run(graph: &JobGraph) -> Result<SinkOutputs, DataflowError> {
    run_with(graph, &LocalOptions::default())
}

/// Runs `graph` to completion.
pub fn run_with(graph: &JobGraph, options: &LocalOptions) -> Result<SinkOutputs, DataflowError> {
    Executor::new(graph)?.run(options)
}

/// In-band messages between operators.
#[derive(Clone)]
enum Message {
    Records(Vec<Record>),
    Watermark(Timestamp),
}

/// One source task.
struct SourceTask {
    logic: Box<dyn SourceLogic>,
    max_disorder: u64,
    max_seen: Option<Timestamp>,
    emitted: u64,
    finished: bool,
}

/// One transform task with its in-memory state and pending timers.
struct TransformTask {
    logic: Box<dyn OperatorLogic>,
    event_time: bool,
    allowed_lateness: u64,
    state: BTreeMap<StateId, HashMap<Vec<u8>, Vec<u8>>>,
    timers: BTreeSet<(Timestamp, Vec<u8>)>,
    /// The due time its timer outputs get.
    timer_due: TimerDue,
}

/// One sink task.
enum SinkTask {
    Json(crate::logic::ValueToJson),
    Discard,
    Custom(Box<dyn SinkLogic>),
}

enum Task {
    Source(SourceTask),
    Transform(TransformTask),
    Sink(SinkTask),
}

struct Node {
    name: String,
    task: Task,
    /// Latest watermark per input.
    input_watermarks: Vec<Option<Timestamp>>,
    watermark: Option<Timestamp>,
    queue: VecDeque<(usize, Message)>,
}

struct Executor<'g> {
    graph: &'g JobGraph,
    nodes: Vec<Node>,
    /// Per operator: (consumer, input index at the consumer).
    consumers: Vec<Vec<(usize, usize)>>,
    outputs: SinkOutputs,
}

impl<'g> Executor<'g> {
    fn new(graph: &'g JobGraph) -> Result<Self, DataflowError> {
        let one = TaskInstance { index: 0, parallelism: 1 };
        let mut nodes = Vec::new();
        let mut consumers = Vec::new();
        let mut outputs = SinkOutputs::new();
        for (position, op) in graph.operators.iter().enumerate() {
            if op.id.0 as usize != position || op.inputs.iter().any(|i| i.from >= op.id) {
                return Err(DataflowError::Other(format!(
                    "operator {:?} is out of order in the job graph",
                    op.name
                )));
            }
            let task = match &op.kind {
                OperatorKind::Source { factory, options } => Task::Source(SourceTask {
                    logic: factory(one),
                    max_disorder: options.max_disorder_ms,
                    max_seen: None,
                    emitted: 0,
                    finished: false,
                }),
                OperatorKind::Transform { factory, event_time, allowed_lateness, .. } => {
                    Task::Transform(TransformTask {
                        logic: factory(one),
                        event_time: *event_time,
                        allowed_lateness: *allowed_lateness,
                        state: BTreeMap::new(),
                        timers: BTreeSet::new(),
                        timer_due: TimerDue::default(),
                    })
                }
                OperatorKind::Sink { format } => {
                    outputs.insert(op.name.clone(), Vec::new());
                    Task::Sink(match format {
                        SinkFormat::JsonLines(f) | SinkFormat::Stdout(f) => SinkTask::Json(f.clone()),
                        SinkFormat::Discard => SinkTask::Discard,
                        SinkFormat::Custom(factory) => SinkTask::Custom(factory(one)?),
                    })
                }
            };
            nodes.push(Node {
                name: op.name.clone(),
                task,
                input_watermarks: vec![None; op.inputs.len()],
                watermark: None,
                queue: VecDeque::new(),
            });
            consumers.push(graph.consumers(op.id).into_iter().map(|(c, i)| (c.0 as usize, i)).collect());
        }
        Ok(Self { graph, nodes, consumers, outputs })
    }

    fn run(mut self, options: &LocalOptions) -> Result<SinkOutputs, DataflowError> {
        let sources: Vec<usize> =
            (0..self.nodes.len()).filter(|i| matches!(self.nodes[*i].task, Task::Source(_))).collect();
        loop {
            let mut active = false;
            for &s in &sources {
                let messages = self.poll_source(s, options)?;
                active |= !messages.is_empty();
                for message in messages {
                    self.deliver(s, message)?;
                }
                self.drain()?;
            }
            if !active {
                break;
            }
        }
        for node in &mut self.nodes {
            if let Task::Sink(SinkTask::Custom(sink)) = &mut node.task {
                sink.flush()?;
            }
        }
        Ok(self.outputs)
    }

    /// Polls one batch of source `s`; returns the records and watermark to send downstream.
    fn poll_source(&mut self, s: usize, options: &LocalOptions) -> Result<Vec<Message>, DataflowError> {
        let node = &mut self.nodes[s];
        let Task::Source(source) = &mut node.task else {
            return Ok(Vec::new());
        };
        if source.finished {
            return Ok(Vec::new());
        }
        let mut records = Vec::new();
        let poll = source.logic.poll(options.batch_size.max(1), &mut records)?;
        source.emitted += records.len() as u64;
        if source.emitted > options.max_source_records {
            return Err(DataflowError::Other(format!(
                "source {:?} produced more than {} records; the local executor needs bounded sources",
                node.name, options.max_source_records
            )));
        }
        for r in &records {
            source.max_seen = Some(source.max_seen.map_or(r.time, |m| m.max(r.time)));
        }
        let watermark = if poll == SourcePoll::Finished {
            source.finished = true;
            Some(Timestamp::MAX)
        } else {
            source.max_seen.map(|m| m.saturating_sub(source.max_disorder))
        };
        let mut messages = vec![Message::Records(records)];
        messages.extend(watermark.map(Message::Watermark));
        Ok(messages)
    }

    /// Sends a message of operator `from` to every consumer, applying the edge's partitioning.
    fn deliver(&mut self, from: usize, message: Message) -> Result<(), DataflowError> {
        for &(consumer, input) in &self.consumers[from] {
            let partitioning = &self.graph.operators[consumer].inputs[input].partitioning;
            let message = match (&message, partitioning) {
                (Message::Records(records), Partitioning::Key(key_fn)) => Message::Records(
                    records
                        .iter()
                        .map(|r| {
                            Ok(Record {
                                key: key_fn(&r.value)?,
                                value: r.value.clone(),
                                time: r.time,
                                due_ms: r.due_ms,
                            })
                        })
                        .collect::<Result<_, DataflowError>>()?,
                ),
                _ => message.clone(),
            };
            self.nodes[consumer].queue.push_back((input, message));
        }
        Ok(())
    }

    /// Processes every queued message; topological order means one pass reaches the sinks.
    fn drain(&mut self) -> Result<(), DataflowError> {
        for n in 0..self.nodes.len() {
            while let Some((input, message)) = self.nodes[n].queue.pop_front() {
                let emitted = match message {
                    Message::Records(records) => self.on_records(n, input, records)?,
                    Message::Watermark(w) => self.on_watermark(n, input, w)?,
                };
                for message in emitted {
                    self.deliver(n, message)?;
                }
            }
        }
        Ok(())
    }

    fn on_records(
        &mut self,
        n: usize,
        input: usize,
        mut records: Vec<Record>,
    ) -> Result<Vec<Message>, DataflowError> {
        let node = &mut self.nodes[n];
        match &mut node.task {
            Task::Source(_) => Ok(Vec::new()),
            Task::Sink(sink) => {
                let out = self.outputs.entry(node.name.clone()).or_default();
                write_sink(sink, &records, out)?;
                Ok(Vec::new())
            }
            Task::Transform(task) => {
                let watermark = node.watermark;
                if let (true, Some(w)) = (task.event_time, watermark) {
                    records.retain(|r| r.time.saturating_add(task.allowed_lateness) >= w);
                }
                task.timer_due.saw(&records);
                let fetched: HashSet<Vec<u8>> = records.iter().map(|r| r.key.clone()).collect();
                let mut output = Vec::new();
                task.call(&fetched, watermark, &mut output, |logic, ctx| {
                    logic.on_records(input, &records, ctx)
                })?;
                let mut messages = vec![Message::Records(output)];
                messages.extend(fire_timers(task, watermark)?);
                Ok(messages)
            }
        }
    }

    fn on_watermark(
        &mut self,
        n: usize,
        input: usize,
        watermark: Timestamp,
    ) -> Result<Vec<Message>, DataflowError> {
        let node = &mut self.nodes[n];
        let slot = &mut node.input_watermarks[input];
        *slot = Some(slot.map_or(watermark, |w| w.max(watermark)));
        let Some(new) = node.input_watermarks.iter().copied().min().flatten() else {
            return Ok(Vec::new());
        };
        if node.watermark.is_some_and(|w| w >= new) {
            return Ok(Vec::new());
        }
        node.watermark = Some(new);
        let mut messages = match &mut node.task {
            Task::Transform(task) => fire_timers(task, Some(new))?,
            _ => Vec::new(),
        };
        messages.push(Message::Watermark(new));
        Ok(messages)
    }
}

impl TransformTask {
    /// Calls the logic with access to the state of the `fetched` keys only.
    fn call(
        &mut self,
        fetched: &HashSet<Vec<u8>>,
        watermark: Option<Timestamp>,
        output: &mut Vec<Record>,
        f: impl FnOnce(&mut dyn OperatorLogic, &mut OperatorContext<'_>) -> Result<(), DataflowError>,
    ) -> Result<(), DataflowError> {
        let declared: Vec<StateId> = self.logic.state_ids().to_vec();
        let mut state = LocalState { state: &mut self.state, declared: &declared, fetched };
        let mut timers = Vec::new();
        let mut ctx = OperatorContext { state: &mut state, output, timers: &mut timers, watermark };
        f(self.logic.as_mut(), &mut ctx)?;
        self.timers.extend(timers.into_iter().map(|(key, time)| (time, key)));
        Ok(())
    }
}

/// Fires the timers at or below `watermark`, earliest first (including ones they register), then
/// the processing-time ones the clock reached (every one at the end of input, `Timestamp::MAX`).
fn fire_timers(
    task: &mut TransformTask,
    watermark: Option<Timestamp>,
) -> Result<Vec<Message>, DataflowError> {
    let Some(w) = watermark else {
        return Ok(Vec::new());
    };
    let clock =
        koala_types::TimeDomain::ProcessingTime.queue_time(crate::ops::timer_process::processing_time_now());
    let mut output = Vec::new();
    loop {
        let due = task.timers.first().filter(|(t, _)| *t <= w).or_else(|| {
            task.timers
                .range((koala_types::PROCESSING_TIME, Vec::new())..)
                .next()
                .filter(|(t, _)| *t <= clock)
        });
        let Some((time, key)) = due.cloned() else { break };
        task.timers.remove(&(time, key.clone()));
        let fetched = HashSet::from([key.clone()]);
        task.call(&fetched, watermark, &mut output, |logic, ctx| logic.on_timer(&key, time, ctx))?;
    }
    task.timer_due.stamp(&mut output);
    Ok(vec![Message::Records(output)])
}

fn write_sink(
    sink: &mut SinkTask,
    records: &[Record],
    out: &mut Vec<serde_json::Value>,
) -> Result<(), DataflowError> {
    match sink {
        SinkTask::Json(render) => {
            for r in records {
                let line = render(&r.value)?;
                let value = serde_json::from_str(&line)
                    .map_err(|e| DataflowError::Other(format!("sink rendered invalid JSON {line:?}: {e}")))?;
                out.push(value);
            }
            Ok(())
        }
        SinkTask::Discard => Ok(()),
        SinkTask::Custom(sink) => sink.write(records),
    }
}

/// The executor's state, restricted to the declared state ids and the fetched keys.
struct LocalState<'a> {
    state: &'a mut BTreeMap<StateId, HashMap<Vec<u8>, Vec<u8>>>,
    declared: &'a [StateId],
    fetched: &'a HashSet<Vec<u8>>,
}

impl LocalState<'_> {
    fn check(&self, state: StateId, key: &[u8]) -> Result<(), DataflowError> {
        if self.declared.contains(&state) && self.fetched.contains(key) {
            Ok(())
        } else {
            Err(DataflowError::StateNotFetched { state, key: key.to_vec() })
        }
    }
}

impl KeyedStateAccess for LocalState<'_> {
    fn get(&self, state: StateId, key: &[u8]) -> Result<Option<&[u8]>, DataflowError> {
        self.check(state, key)?;
        Ok(self.state.get(&state).and_then(|m| m.get(key)).map(Vec::as_slice))
    }

    fn put(&mut self, state: StateId, key: &[u8], value: Vec<u8>) -> Result<(), DataflowError> {
        self.check(state, key)?;
        self.state.entry(state).or_default().insert(key.to_vec(), value);
        Ok(())
    }

    fn delete(&mut self, state: StateId, key: &[u8]) -> Result<(), DataflowError> {
        self.check(state, key)?;
        if let Some(m) = self.state.get_mut(&state) {
            m.remove(key);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Dataflow, SourceOptions, Window, WindowSpec};

    /// (value, time) events, out of order within a disorder bound of 5.
    fn disordered() -> Vec<(u32, u64)> {
        vec![(1, 3), (2, 1), (3, 9), (4, 12), (5, 8), (6, 21), (7, 17), (8, 30)]
    }

    #[test]
    fn tumbling_window_counts_match_a_plain_loop() -> Result<(), DataflowError> {
        let df = Dataflow::new();
        let options = SourceOptions { max_disorder_ms: 5, ..Default::default() };
        df.source("src", options, |_| disordered().into_iter())
            .key_by(|v: &u32| v % 2)
            .window(WindowSpec::tumbling(10))
            .aggregate(
                "count",
                || 0u32,
                |n: &mut u32, _: &u32| *n += 1,
                |k: &u32, w: Window, n: u32| (*k, w.start, n),
            )
            .sink_json_lines("out");
        let mut got: Vec<(u32, u64, u32)> = local_values(&df, "out")?;
        got.sort_unstable();
        let mut expected: BTreeMap<(u32, u64), u32> = BTreeMap::new();
        for (v, t) in disordered() {
            *expected.entry((v % 2, t - t % 10)).or_default() += 1;
        }
        let expected: Vec<_> = expected.into_iter().map(|((k, s), n)| (k, s, n)).collect();
        assert_eq!(got, expected);
        Ok(())
    }

    #[test]
    fn allowed_lateness_reemits_updated_windows() -> Result<(), DataflowError> {
        // Disorder 0: the watermark follows the max time, so (5, 8) arrives after window
        // [0, 10) fired; with lateness 10 it is accepted and the window is re-emitted.
        let df = Dataflow::new();
        df.source("src", SourceOptions::default(), |_| disordered().into_iter())
            .key_by(|_: &u32| ())
            .window(WindowSpec::tumbling(10))
            .allowed_lateness(10)
            .aggregate(
                "sum",
                || 0u32,
                |s: &mut u32, v: &u32| *s += v,
                |_: &(), w: Window, s: u32| (w.start, s),
            )
            .sink_json_lines("out");
        let got: Vec<(u64, u32)> = local_values(&df, "out")?;
        // [0,10): 1+2+3 fires at 12, then +5 late; [10,20) fires at 21 (4), then +7 late; [20,30): 6;
        // [30,40): 8 at the end.
        assert_eq!(got, vec![(0, 6), (0, 11), (10, 4), (10, 11), (20, 6), (30, 8)]);
        Ok(())
    }

    #[test]
    fn late_records_are_dropped_without_lateness() -> Result<(), DataflowError> {
        let df = Dataflow::new();
        df.source("src", SourceOptions::default(), |_| disordered().into_iter())
            .key_by(|_: &u32| ())
            .window(WindowSpec::tumbling(10))
            .aggregate(
                "sum",
                || 0u32,
                |s: &mut u32, v: &u32| *s += v,
                |_: &(), w: Window, s: u32| (w.start, s),
            )
            .sink_json_lines("out");
        let got: Vec<(u64, u32)> = local_values(&df, "out")?;
        // (2, 1) is late (watermark 3), (5, 8) too (12), (7, 17) too (21).
        assert_eq!(got, vec![(0, 4), (10, 4), (20, 6), (30, 8)]);
        Ok(())
    }

    fn local_values<T: serde::de::DeserializeOwned>(
        df: &Dataflow,
        sink: &str,
    ) -> Result<Vec<T>, DataflowError> {
        let outputs = run_with(&df.build()?, &LocalOptions { batch_size: 1, ..Default::default() })?;
        outputs
            .get(sink)
            .into_iter()
            .flatten()
            .map(|v| serde_json::from_value(v.clone()).map_err(|e| DataflowError::Other(e.to_string())))
            .collect()
    }
}
