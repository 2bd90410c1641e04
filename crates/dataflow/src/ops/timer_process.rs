//! The logic behind [`crate::KeyedStream::process_with_timers`]: a keyed operator with value
//! state, list state and user event-time and processing-time timers per key.
//!
//! Processing-time timers share the queue and the per-key state with event-time ones, marked by
//! [`PROCESSING_TIME`] in their time ([`TimeDomain`]): every protocol moves them the same way,
//! and under Koala a handed-over one fetches its key's state once the task's clock reaches it,
//! before it fires. They fire when the task's clock (milliseconds since the Unix epoch, read every
//! 10 ms while one waits) reaches their time; the end of input fires every timer left.
//!
//! The timers reuse the runtime's window timer machinery (`OperatorContext::timers`): the runtime
//! keeps (time, key) pairs in fire order and moves them with their buckets under every protocol
//! (under Koala lazily: a handed-over timer fetches its key's state before it fires). What the
//! runtime cannot do — delete a timer — is done here: each key's registered times are part of
//! its state (state id [`TIMER_STATE`]), so they move with the key's value and list. A runtime
//! timer whose time is no longer registered for its key (deleted, or already fired) is dropped
//! without calling the user; the runtime entry of a deleted timer lingers until its time.

use std::collections::BTreeSet;
use std::marker::PhantomData;
use std::sync::Arc;

use koala_types::{PROCESSING_TIME, Record, TimeDomain, Timestamp, decode};

use crate::data::Data;
use crate::logic::{DataflowError, OperatorContext, OperatorLogic, StateId};
use crate::ops::keyed_output;
use crate::state::{BatchStates, LIST_STATE, ListState, VALUE_STATE, ValueState};

/// State id of the registered timers of a key (both domains).
pub const TIMER_STATE: StateId = 2;

/// The timers of the key being processed: register, delete, list, in event time and in
/// processing time (times below 2^63).
///
/// ```
/// use koala_dataflow::Timers;
///
/// let mut timers = Timers::default();
/// timers.register(30);
/// timers.register(10);
/// timers.register(10); // a time registers once
/// assert!(timers.delete(30));
/// assert!(!timers.delete(99));
/// assert_eq!(timers.pending().collect::<Vec<_>>(), vec![10]);
/// timers.register_processing_time(10); // its own domain: no clash with the event-time one
/// assert_eq!(timers.pending_processing_time().collect::<Vec<_>>(), vec![10]);
/// assert!(timers.delete_processing_time(10));
/// assert_eq!(timers.pending().collect::<Vec<_>>(), vec![10]);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Timers {
    pending: BTreeSet<Timestamp>,
    /// Registered since loaded: handed to the runtime.
    new: Vec<Timestamp>,
    changed: bool,
    watermark: Option<Timestamp>,
    now: Timestamp,
    domain: Option<TimeDomain>,
}

impl Timers {
    /// Registers a timer at event time `time`: the operator's `on_timer` runs for this key once
    /// the task's watermark reaches `time` (right away at the next watermark if it already has).
    /// Registering a pending time again changes nothing.
    pub fn register(&mut self, time: Timestamp) {
        if self.pending.insert(time) {
            self.new.push(time);
            self.changed = true;
        }
    }

    /// Deletes the pending timer at `time`; true if there was one.
    pub fn delete(&mut self, time: Timestamp) -> bool {
        let removed = self.pending.remove(&time);
        self.changed |= removed;
        removed
    }

    /// Registers a timer at processing time `time` (milliseconds since the Unix epoch, as
    /// [`Self::processing_time`] reads it): the operator's `on_timer` runs for this key once the
    /// task's clock reaches `time` (within about 10 ms), or at the end of input if that comes
    /// first. Registering a pending time again changes nothing.
    pub fn register_processing_time(&mut self, time: Timestamp) {
        self.register(TimeDomain::ProcessingTime.queue_time(time));
    }

    /// Deletes the pending processing-time timer at `time`; true if there was one.
    pub fn delete_processing_time(&mut self, time: Timestamp) -> bool {
        self.delete(TimeDomain::ProcessingTime.queue_time(time))
    }

    /// Deletes every pending timer of the key, of both domains.
    pub fn delete_all(&mut self) {
        self.changed |= !self.pending.is_empty();
        self.pending.clear();
    }

    /// The key's pending event-time timers, earliest first.
    pub fn pending(&self) -> impl Iterator<Item = Timestamp> + '_ {
        self.pending.iter().copied().filter(|t| TimeDomain::of(*t).0 == TimeDomain::EventTime)
    }

    /// The key's pending processing-time timers, earliest first.
    pub fn pending_processing_time(&self) -> impl Iterator<Item = Timestamp> + '_ {
        self.pending.range(PROCESSING_TIME..).filter_map(|t| match TimeDomain::of(*t) {
            (TimeDomain::ProcessingTime, t) => Some(t),
            (TimeDomain::EventTime, _) => None,
        })
    }

    /// The clock processing-time timers fire by: milliseconds since the Unix epoch, now.
    pub fn processing_time(&self) -> Timestamp {
        processing_time_now()
    }

    /// The domain of the timer that fired (`None` while a record is processed).
    pub fn fired_domain(&self) -> Option<TimeDomain> {
        self.domain
    }

    /// The task's watermark when the call began (`None` before any input sent one).
    pub fn watermark(&self) -> Option<Timestamp> {
        self.watermark
    }

    /// The event time of the record being processed, or the time of the timer that fired (in
    /// its domain, [`Self::fired_domain`]).
    pub fn now(&self) -> Timestamp {
        self.now
    }

    fn load(
        state: &dyn crate::logic::KeyedStateAccess,
        key: &[u8],
        watermark: Option<Timestamp>,
    ) -> Result<Self, DataflowError> {
        let pending = state.get(TIMER_STATE, key)?.map(decode).transpose()?.unwrap_or_default();
        Ok(Self { pending, new: Vec::new(), changed: false, watermark, now: 0, domain: None })
    }

    fn store(&mut self, ctx: &mut OperatorContext<'_>, key: &[u8]) -> Result<(), DataflowError> {
        for time in self.new.drain(..) {
            if self.pending.contains(&time) {
                ctx.timers.push((key.to_vec(), time));
            }
        }
        if !self.changed {
            Ok(())
        } else if self.pending.is_empty() {
            ctx.state.delete(TIMER_STATE, key)
        } else {
            let pending = &self.pending;
            ctx.state.put_encoded(TIMER_STATE, key, &mut |buf| koala_types::encode_into(pending, buf))
        }
    }
}

/// Milliseconds since the Unix epoch, now.
pub(crate) fn processing_time_now() -> Timestamp {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as Timestamp)
}

/// Everything a timer operator's closures get for one key: its value, its list and its timers.
/// Changes are written back after the call (a cleared value or emptied list deletes it).
#[derive(Debug)]
pub struct KeyContext<S, L> {
    /// The key's value state.
    pub value: ValueState<S>,
    /// The key's list state.
    pub list: ListState<L>,
    /// The key's event-time timers.
    pub timers: Timers,
}

impl<S: Data, L: Data> KeyContext<S, L> {
    fn load(
        state: &dyn crate::logic::KeyedStateAccess,
        key: &[u8],
        watermark: Option<Timestamp>,
    ) -> Result<Self, DataflowError> {
        Ok(Self {
            value: ValueState::load(state, VALUE_STATE, key)?,
            list: ListState::load(state, LIST_STATE, key)?,
            timers: Timers::load(state, key, watermark)?,
        })
    }

    fn store(&mut self, ctx: &mut OperatorContext<'_>, key: &[u8]) -> Result<(), DataflowError> {
        self.value.store(ctx.state, VALUE_STATE, key)?;
        self.list.store(ctx.state, LIST_STATE, key)?;
        self.timers.store(ctx, key)
    }
}

/// Called per record: key, value, the key's context, outputs.
pub(crate) type OnRecordFn<K, T, S, L, O> = dyn Fn(&K, T, &mut KeyContext<S, L>, &mut Vec<O>) + Send + Sync;
/// Called per fired timer: key, the timer's time (in its domain, `KeyContext::timers`'s
/// `fired_domain`), the key's context, outputs.
pub(crate) type OnTimerFn<K, S, L, O> =
    dyn Fn(&K, Timestamp, &mut KeyContext<S, L>, &mut Vec<O>) + Send + Sync;

/// A keyed operator task with user timers.
pub(crate) struct TimerProcessLogic<K, T, S, L, O> {
    on_record: Arc<OnRecordFn<K, T, S, L, O>>,
    on_timer: Arc<OnTimerFn<K, S, L, O>>,
    out: Vec<O>,
    _input: PhantomData<fn(T)>,
}

impl<K, T, S, L, O> TimerProcessLogic<K, T, S, L, O> {
    pub(crate) fn new(
        on_record: Arc<OnRecordFn<K, T, S, L, O>>,
        on_timer: Arc<OnTimerFn<K, S, L, O>>,
    ) -> Self {
        Self { on_record, on_timer, out: Vec::new(), _input: PhantomData }
    }
}

impl<K: Data, T: Data, S: Data, L: Data, O: Data> OperatorLogic for TimerProcessLogic<K, T, S, L, O> {
    fn state_ids(&self) -> &[StateId] {
        &[VALUE_STATE, LIST_STATE, TIMER_STATE]
    }

    fn on_records(
        &mut self,
        _input: usize,
        records: &[Record],
        ctx: &mut OperatorContext<'_>,
    ) -> Result<(), DataflowError> {
        let mut batch = BatchStates::with_capacity(records.len());
        let watermark = ctx.watermark;
        for record in records {
            let value: T = decode(&record.value)?;
            let state = &*ctx.state;
            let (key, entry) = batch.entry(&record.key, || {
                Ok((decode::<K>(&record.key)?, KeyContext::<S, L>::load(state, &record.key, watermark)?))
            })?;
            entry.timers.now = record.time;
            (self.on_record)(key, value, entry, &mut self.out);
            for o in self.out.drain(..) {
                ctx.output.push(keyed_output(&record.key, &o, record.time, record.due_ms)?);
            }
        }
        for (key, (_, mut entry)) in batch.into_entries() {
            entry.store(ctx, key)?;
        }
        Ok(())
    }

    fn on_timer(
        &mut self,
        key_bytes: &[u8],
        time: Timestamp,
        ctx: &mut OperatorContext<'_>,
    ) -> Result<(), DataflowError> {
        let mut entry = KeyContext::<S, L>::load(&*ctx.state, key_bytes, ctx.watermark)?;
        if !entry.timers.delete(time) {
            return Ok(()); // deleted, or fired already: the runtime's entry outlived it
        }
        let key: K = decode(key_bytes)?;
        let (domain, at) = TimeDomain::of(time);
        entry.timers.now = at;
        entry.timers.domain = Some(domain);
        (self.on_timer)(&key, at, &mut entry, &mut self.out);
        // A processing-time timer's outputs carry the task's event time (its watermark).
        let event_time = match domain {
            TimeDomain::EventTime => at,
            TimeDomain::ProcessingTime => ctx.watermark.unwrap_or(0),
        };
        for o in self.out.drain(..) {
            ctx.output.push(keyed_output(key_bytes, &o, event_time, 0)?);
        }
        entry.store(ctx, key_bytes)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use crate::local::{LocalOptions, run_with};
    use crate::{Dataflow, KeyContext, SourceOptions};

    /// What a test record asks the operator to do with its key's timers.
    #[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
    enum Op {
        Register(u64),
        Delete(u64),
    }

    /// A fired timer: key, time, the key's count, its pending timers.
    type Fired = (u8, u64, Option<u32>, Vec<u64>);

    /// Runs `ops` ((key, op) at event time) through a timer operator that counts the records of
    /// each key in its value state and, when a timer fires, emits (key, time, count, pending).
    fn run(ops: Vec<((u8, Op), u64)>) -> Vec<Value> {
        let df = Dataflow::new();
        let options = SourceOptions { max_disorder_ms: 0, ..Default::default() };
        df.source("src", options, move |_| ops.clone().into_iter())
            .key_by(|(k, _): &(u8, Op)| *k)
            .process_with_timers(
                "timers",
                |_k: &u8, (_, op): (u8, Op), c: &mut KeyContext<u32, ()>, _out: &mut Vec<Fired>| {
                    c.value.update(|n| *n += 1);
                    match op {
                        Op::Register(t) => c.timers.register(t),
                        Op::Delete(t) => {
                            c.timers.delete(t);
                        }
                    }
                },
                |k: &u8, time, c: &mut KeyContext<u32, ()>, out: &mut Vec<Fired>| {
                    assert_eq!(c.timers.now(), time);
                    let pending: Vec<u64> = c.timers.pending().collect();
                    out.push((*k, time, c.value.get().copied(), pending));
                    // A timer that registers a later one: it fires too, in order.
                    if time == 50 {
                        c.timers.register(55);
                    }
                },
            )
            .sink_json_lines("out");
        let graph = df.build().expect("graph");
        let options = LocalOptions { batch_size: 2, ..Default::default() };
        run_with(&graph, &options).expect("run").remove("out").unwrap_or_default()
    }

    #[test]
    fn timers_fire_in_time_order_with_the_keys_state_and_deleted_ones_do_not() {
        let out = run(vec![
            ((1, Op::Register(30)), 1),
            ((2, Op::Register(20)), 2),
            ((1, Op::Register(10)), 3),
            ((2, Op::Register(40)), 4),
            ((2, Op::Delete(20)), 5),
            ((1, Op::Register(50)), 6),
            ((1, Op::Delete(99)), 7),
        ]);
        assert_eq!(
            out,
            vec![
                json!([1, 10, 4, [30, 50]]),
                json!([1, 30, 4, [50]]),
                json!([2, 40, 3, []]),
                json!([1, 50, 4, []]),
                json!([1, 55, 4, []]),
            ]
        );
    }

    #[test]
    fn a_deleted_then_registered_again_timer_fires_once() {
        // The runtime still holds the deleted entry at 20: the second registration must not make
        // the timer fire twice, and a timer deleted and never registered again must not fire.
        let out = run(vec![
            ((1, Op::Register(20)), 1),
            ((1, Op::Delete(20)), 2),
            ((1, Op::Register(20)), 3),
            ((2, Op::Register(20)), 4),
            ((2, Op::Delete(20)), 5),
        ]);
        assert_eq!(out, vec![json!([1, 20, 3, []])]);
    }

    #[test]
    fn processing_time_timers_fire_by_the_clock_in_order_with_the_keys_state() {
        // Each record counts itself and registers a processing-time timer: key 1 at times the
        // clock passed long ago (due at the next firing, by time, not by event time), key 2 far
        // ahead (due only at the end of input). Event-time watermarks never fire them early.
        #[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
        struct In(u8, u64);
        /// Key, time, count, pending, watermark.
        type Seen = (u8, u64, Option<u32>, Vec<u64>, Option<u64>);
        let far = 1 << 60;
        let ops = vec![(In(1, 30), 1), (In(1, 10), 2), (In(2, far), 3), (In(1, 20), 4), (In(3, 0), 50)];
        let df = Dataflow::new();
        let options = SourceOptions { max_disorder_ms: 0, ..Default::default() };
        df.source("src", options, move |_| ops.clone().into_iter())
            .key_by(|i: &In| i.0)
            .process_with_timers(
                "timers",
                |_k: &u8, i: In, c: &mut KeyContext<u32, ()>, _out: &mut Vec<Seen>| {
                    c.value.update(|n| *n += 1);
                    if i.0 != 3 {
                        c.timers.register_processing_time(i.1);
                        assert_eq!(c.timers.pending().count(), 0, "no event-time timer");
                    }
                },
                |k: &u8, time, c: &mut KeyContext<u32, ()>, out: &mut Vec<Seen>| {
                    assert_eq!(c.timers.fired_domain(), Some(crate::TimeDomain::ProcessingTime));
                    assert_eq!(c.timers.now(), time);
                    let pending: Vec<u64> = c.timers.pending_processing_time().collect();
                    out.push((*k, time, c.value.get().copied(), pending, c.timers.watermark()));
                },
            )
            .sink_json_lines("out");
        let graph = df.build().expect("graph");
        let options = LocalOptions { batch_size: 2, ..Default::default() };
        let out = run_with(&graph, &options).expect("run").remove("out").unwrap_or_default();
        // Key 1's timers fire at the first firing after they were registered (the batch of
        // two at event time 2 brings 30 and 10, the one at 4 brings 20), earliest first, on the
        // key's count then; key 2's fires only at the end.
        let fired: Vec<(u64, u64)> =
            out.iter().map(|v| (v[0].as_u64().unwrap_or(0), v[1].as_u64().unwrap_or(0))).collect();
        assert_eq!(fired, vec![(1, 10), (1, 30), (1, 20), (2, far)], "{out:?}");
        assert_eq!(out[0][2], json!(2), "{out:?}");
        assert_eq!(out[0][3], json!([30]), "{out:?}");
        assert_eq!(out[2][2], json!(3), "{out:?}");
        assert_eq!(out[3][4], json!(u64::MAX), "the end of input fires it: {out:?}");
    }

    #[test]
    fn records_later_than_the_watermark_are_dropped() {
        // A timer at 10 fires at watermark 12; the record at 5 arrives after it and must not
        // count (max_disorder_ms = 0: the watermark is the newest time).
        let out =
            run(vec![((1, Op::Register(10)), 1), ((2, Op::Register(100)), 12), ((1, Op::Register(60)), 5)]);
        assert_eq!(out[0], json!([1, 10, 1, []]));
        assert_eq!(out.len(), 2, "{out:?}");
    }
}
