//! Due times (`Record::due_ms`, end-to-end latency) through the operators, run by the local
//! executor: a record operator's output carries the due time of the input that produced it; a
//! timer's output the latest due time its task processed before the timer fired.

use std::sync::{Arc, Mutex};

use koala_types::{Record, decode};

use crate::local::{LocalOptions, run_with};
use crate::logic::{DataflowError, SinkLogic, SourceLogic, SourcePoll, TimerDue};
use crate::{Dataflow, SourceOptions, Stream, ValueState, Window, WindowSpec};

/// Value `v` has event time `v` and is due at `due_of(v)` (not monotone in `v`, so an output
/// that took a neighbour's due time shows).
fn due_of(v: u32) -> u64 {
    10_000 + u64::from(v * 7 % 13) * 100 + u64::from(v)
}

/// Emits 0..n, each with its due time, like a runtime source stamps them.
struct DueSource {
    next: u32,
    n: u32,
}

impl SourceLogic for DueSource {
    fn poll(&mut self, max: usize, out: &mut Vec<Record>) -> Result<SourcePoll, DataflowError> {
        for _ in 0..max {
            if self.next == self.n {
                return Ok(SourcePoll::Finished);
            }
            let v = self.next;
            self.next += 1;
            out.push(Record {
                key: Vec::new(),
                value: koala_types::encode(&v)?,
                time: u64::from(v),
                due_ms: due_of(v),
            });
        }
        Ok(SourcePoll::More)
    }
}

/// Keeps every record a sink task is given.
struct Capture(Arc<Mutex<Vec<Record>>>);

impl SinkLogic for Capture {
    fn write(&mut self, records: &[Record]) -> Result<(), DataflowError> {
        self.0.lock().map_err(|_| DataflowError::Other("poisoned".into()))?.extend_from_slice(records);
        Ok(())
    }

    fn flush(&mut self) -> Result<(), DataflowError> {
        Ok(())
    }
}

fn source(df: &Dataflow, n: u32) -> Stream<u32> {
    let options = SourceOptions { max_disorder_ms: 0, ..Default::default() };
    df.source_from(
        "src",
        options,
        Arc::new(move |_| Box::new(DueSource { next: 0, n }) as Box<dyn SourceLogic>),
    )
}

/// Runs the job with its sink `out` wired to a capture (`sink` attaches it) and returns the
/// records it received.
fn captured(
    df: &Dataflow,
    sink: impl FnOnce(crate::logic::SinkFactory),
) -> Result<Vec<Record>, DataflowError> {
    let got = Arc::new(Mutex::new(Vec::new()));
    let shared = got.clone();
    sink(Arc::new(move |_| Ok(Box::new(Capture(shared.clone())) as Box<dyn SinkLogic>)));
    run_with(&df.build()?, &LocalOptions { batch_size: 1, ..Default::default() })?;
    let records = got.lock().map_err(|_| DataflowError::Other("poisoned".into()))?.clone();
    Ok(records)
}

#[test]
fn record_operators_pass_on_the_due_time_of_the_input_that_produced_each_output() -> Result<(), DataflowError>
{
    let df = Dataflow::new();
    let out = source(&df, 40)
        .map("double", |v: u32| v * 2)
        .filter("all", |_: &u32| true)
        .flat_map("pair", |v: u32| [v, v + 1])
        .key_by(|v: &u32| v % 3)
        .stateful_map("count", |_: &u32, v: u32, seen: &mut ValueState<u32>| {
            seen.update(|n| *n += 1);
            v
        })
        .rebalance();
    let records = captured(&df, |f| out.sink_with("out", f))?;
    assert_eq!(records.len(), 80);
    for r in &records {
        let w: u32 = decode(&r.value)?;
        assert_eq!(r.due_ms, due_of(w / 2), "output {w} comes from input {}", w / 2);
    }
    Ok(())
}

#[test]
fn a_window_result_carries_the_latest_due_time_its_task_processed_before_the_firing_watermark()
-> Result<(), DataflowError> {
    let df = Dataflow::new();
    let out = source(&df, 25).key_by(|v: &u32| v % 2).window(WindowSpec::tumbling(10)).aggregate(
        "count",
        || 0u32,
        |n: &mut u32, _: &u32| *n += 1,
        |k: &u32, w: Window, n: u32| (*k, w.start, n),
    );
    let records = captured(&df, |f| out.sink_with("out", f))?;
    let mut got: Vec<(u32, u64, u32, u64)> = Vec::new();
    for r in &records {
        let (k, start, n): (u32, u64, u32) = decode(&r.value)?;
        got.push((k, start, n, r.due_ms));
    }
    got.sort_unstable();
    // One record per batch, each followed by its watermark: window [0, 10) fires on watermark 10,
    // after record 10 was processed; [10, 20) on 20; [20, 30) at the end, after record 24. The
    // latest due time processed is the maximum over the records so far, not the last record's.
    let latest = |upto: u32| (0..=upto).map(due_of).max().unwrap_or(0);
    let expected = vec![
        (0, 0, 5, latest(10)),
        (0, 10, 5, latest(20)),
        (0, 20, 3, latest(24)),
        (1, 0, 5, latest(10)),
        (1, 10, 5, latest(20)),
        (1, 20, 2, latest(24)),
    ];
    assert_eq!(got, expected);
    Ok(())
}

#[test]
fn timer_due_is_unknown_until_a_record_was_processed_and_never_goes_back() {
    let record = |due_ms| Record { key: Vec::new(), value: Vec::new(), time: 0, due_ms };
    let mut due = TimerDue::default();
    let mut out = vec![record(77)];
    due.stamp(&mut out);
    assert_eq!(out[0].due_ms, 0, "a task that processed nothing stamps unknown");
    due.saw(&[record(500), record(300)]);
    due.saw(&[record(400)]);
    due.saw(&[]);
    due.stamp(&mut out);
    assert_eq!((due.due_ms(), out[0].due_ms), (500, 500));
}
