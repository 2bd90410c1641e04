//! The query builders behind [`crate::build_query`]. Operator names are part of the contract:
//! job configs and reconfiguration requests refer to them.

use koala_dataflow::{
    Data, Dataflow, DataflowError, JobGraph, KeyedEvent, KeyedEvents, KeyedStream, ListState, Stream,
    ValueState, Window, WindowSpec,
};

use crate::outputs::{GroupCount, JoinPair, KeyedJoinPair, KeyedTotal, LastN, WindowTotal};
use crate::params::{QueryParams, SinkKind};

#[cfg(test)]
mod tests;

/// Builds one query's graph from (validated) parameters.
type QueryBuilder = fn(&QueryParams) -> Result<JobGraph, DataflowError>;

/// Every query: its name, what it computes (its operators named as configs and reconfiguration
/// requests name them), and its builder. The one list `koala queries`, `koala run --help` and
/// [`crate::query_names`] come from.
const QUERIES: &[(&str, &str, QueryBuilder)] = &[
    (
        "keyed-aggregate",
        "source → key_by key → \"aggregate\" (running count and sum per key, state padded by state_padding_bytes) → sink",
        keyed_aggregate,
    ),
    ("last-n", "source → key_by key → \"last_n\" (the newest `last_n` values per key) → sink", last_n),
    (
        "tumbling-window",
        "source → key_by key → \"window\" (count and sum per key and tumbling `window_ms` window) → sink",
        tumbling_window,
    ),
    (
        "sliding-window",
        "source → key_by key → \"window\" (count and sum per key and sliding window of `window_ms`, every `slide_ms`) → sink",
        sliding_window,
    ),
    (
        "window-join",
        "sources \"left\" and \"right\" → \"join\" (pairs per key and tumbling `window_ms` window) → sink",
        window_join,
    ),
    (
        "keyed-join",
        "sources \"left\" and \"right\" → \"join\" (every pair per key, no window) → sink",
        keyed_join,
    ),
    ("self-join", "source → \"join\" with itself (every ordered pair per key) → sink", self_join),
    (
        "two-stage-aggregate",
        "source → \"aggregate\" (running count and sum per key) → \"rollup\" (records per key mod 16) → sink",
        two_stage_aggregate,
    ),
    (
        "filtered-window",
        "source → \"sample\" (stateless: drops values divisible by 3) → key_by → \"window\" (tumbling `window_ms`) → sink",
        filtered_window,
    ),
];

/// Every query name, in registry order.
pub(crate) fn names() -> impl Iterator<Item = &'static str> {
    QUERIES.iter().map(|(name, _, _)| *name)
}

/// Every query's name and description, in registry order.
pub(crate) fn described() -> impl Iterator<Item = (&'static str, &'static str)> {
    QUERIES.iter().map(|(name, about, _)| (*name, *about))
}

/// The builder of `name`.
pub(crate) fn lookup(name: &str) -> Option<QueryBuilder> {
    QUERIES.iter().find(|(n, _, _)| *n == name).map(|(_, _, b)| *b)
}

/// A keyed-event source `name` with `seed`, keyed by event key.
fn keyed_events(df: &Dataflow, name: &str, params: &QueryParams, seed: u64) -> KeyedStream<u64, KeyedEvent> {
    let config = koala_dataflow::KeyedEventsConfig { seed, ..params.generator.clone() };
    KeyedEvents::source(df, name, params.source.clone(), config).key_by(|e: &KeyedEvent| e.key)
}

/// The sink "sink" of the configured kind.
fn sink<T: Data>(stream: &Stream<T>, kind: SinkKind) {
    match kind {
        SinkKind::Jsonl => stream.sink_json_lines("sink"),
        SinkKind::Stdout => stream.sink_stdout("sink"),
        SinkKind::Discard => stream.sink_discard("sink"),
    }
}

/// The "aggregate" operator's state with `state_padding_bytes` > 0: count, sum, padding.
pub(crate) type PaddedTotal = (u64, i64, Padding);

/// The aggregate's padding bytes, encoded as one byte string. The codec (postcard) writes a
/// byte string exactly as a sequence of `u8` — its length, then the bytes — so state written
/// as a `Vec<u8>` decodes as this and back; but serde takes a `Vec<u8>` one element at a time,
/// and with 2 KB of padding that per-byte encode and decode on every record was a third of an
/// aggregate task's CPU (`perf`, 2026-12-03), the part of each record that scales with the
/// value's size, where one copy of the bytes does.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Padding(pub(crate) Vec<u8>);

impl serde::Serialize for Padding {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for Padding {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Bytes;
        impl<'de> serde::de::Visitor<'de> for Bytes {
            type Value = Padding;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("padding bytes")
            }
            fn visit_bytes<E: serde::de::Error>(self, bytes: &[u8]) -> Result<Padding, E> {
                Ok(Padding(bytes.to_vec()))
            }
            fn visit_byte_buf<E: serde::de::Error>(self, bytes: Vec<u8>) -> Result<Padding, E> {
                Ok(Padding(bytes))
            }
            // Self-describing formats (JSON) write bytes as a sequence.
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Padding, A::Error> {
                let mut bytes = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 16));
                while let Some(b) = seq.next_element()? {
                    bytes.push(b);
                }
                Ok(Padding(bytes))
            }
        }
        deserializer.deserialize_byte_buf(Bytes)
    }
}

/// The byte the aggregate's padding (and its warm state's, `crate::warm`) is made of.
pub(crate) const PADDING_BYTE: u8 = 0xA5;

/// The "aggregate" operator: running count and sum per key. With `padding` > 0 its state also
/// holds `padding` bytes, created on a key's first record and kept on every update, so a key
/// the job touched is as large as a warm key (`koala warmup`) and a reconfiguration moves what
/// a real operator's state would weigh (the paper's `DummyFieldSize`); the output is the same.
fn running_totals(events: &KeyedStream<u64, KeyedEvent>, padding: usize) -> Stream<KeyedTotal> {
    if padding > 0 {
        return events.stateful_map(
            "aggregate",
            move |key: &u64, e: KeyedEvent, total: &mut ValueState<PaddedTotal>| {
                let (count, sum) = total.update(|(count, sum, pad)| {
                    if pad.0.len() != padding {
                        *pad = Padding(vec![PADDING_BYTE; padding]);
                    }
                    *count += 1;
                    *sum = sum.wrapping_add(e.value);
                    (*count, *sum)
                });
                KeyedTotal { key: *key, count, sum }
            },
        );
    }
    events.stateful_map("aggregate", |key: &u64, e: KeyedEvent, total: &mut ValueState<(u64, i64)>| {
        let (count, sum) = total.update(|(count, sum)| {
            *count += 1;
            *sum = sum.wrapping_add(e.value);
            (*count, *sum)
        });
        KeyedTotal { key: *key, count, sum }
    })
}

/// source → key_by key → "aggregate" (running count and sum per key) → sink.
fn keyed_aggregate(params: &QueryParams) -> Result<JobGraph, DataflowError> {
    let df = Dataflow::new();
    let totals = running_totals(
        &keyed_events(&df, "source", params, params.generator.seed),
        params.state_padding_bytes,
    );
    sink(&totals, params.sink);
    df.build()
}

/// Groups of `two-stage-aggregate`'s second stage.
pub const ROLLUP_GROUPS: u64 = 16;

/// source → key_by key → "aggregate" (running count and sum per key) → key_by key mod 16 →
/// "rollup" (records per group) → sink. Two stateful operators, for multi-operator
/// reconfiguration. The rollup emits a running count per group, whose multiset does not depend on
/// the order in which the aggregate's tasks feed it.
fn two_stage_aggregate(params: &QueryParams) -> Result<JobGraph, DataflowError> {
    let df = Dataflow::new();
    let totals = running_totals(
        &keyed_events(&df, "source", params, params.generator.seed),
        params.state_padding_bytes,
    );
    let groups = totals.key_by(|t: &KeyedTotal| t.key % ROLLUP_GROUPS).stateful_map(
        "rollup",
        |group: &u64, _t: KeyedTotal, count: &mut ValueState<u64>| {
            let n = count.update(|c| {
                *c += 1;
                *c
            });
            GroupCount { key: *group, count: n }
        },
    );
    sink(&groups, params.sink);
    df.build()
}

/// source → key_by key → "last_n" (the newest `last_n` values per key) → sink.
fn last_n(params: &QueryParams) -> Result<JobGraph, DataflowError> {
    let df = Dataflow::new();
    let n = params.last_n;
    let last = keyed_events(&df, "source", params, params.generator.seed).stateful_flat_map_list(
        "last_n",
        move |key: &u64, e: KeyedEvent, values: &mut ListState<i64>, out: &mut Vec<LastN>| {
            values.push(e.value);
            values.truncate_front(n);
            out.push(LastN { key: *key, values: values.items().to_vec() });
        },
    );
    sink(&last, params.sink);
    df.build()
}

/// Count and sum per key and window, operator "window".
fn window_totals(params: &QueryParams, spec: WindowSpec) -> Result<JobGraph, DataflowError> {
    let df = Dataflow::new();
    let events = keyed_events(&df, "source", params, params.generator.seed);
    sink(&window_aggregate(&events, spec, params), params.sink);
    df.build()
}

/// The "window" operator: count and sum per key and window, its state padded to
/// `window_padding_bytes` more.
fn window_aggregate(
    events: &KeyedStream<u64, KeyedEvent>,
    spec: WindowSpec,
    params: &QueryParams,
) -> Stream<WindowTotal> {
    let windows = events.window(spec).allowed_lateness(params.allowed_lateness_ms);
    let padding = params.window_padding_bytes;
    if padding > 0 {
        return windows.aggregate(
            "window",
            move || (0u64, 0i64, vec![0u8; padding]),
            |(count, sum, _): &mut (u64, i64, Vec<u8>), e: &KeyedEvent| {
                *count += 1;
                *sum = sum.wrapping_add(e.value);
            },
            |key: &u64, w: Window, (count, sum, _): (u64, i64, Vec<u8>)| WindowTotal {
                key: *key,
                start: w.start,
                end: w.end,
                count,
                sum,
            },
        );
    }
    windows.aggregate(
        "window",
        || (0u64, 0i64),
        |(count, sum): &mut (u64, i64), e: &KeyedEvent| {
            *count += 1;
            *sum = sum.wrapping_add(e.value);
        },
        |key: &u64, w: Window, (count, sum): (u64, i64)| WindowTotal {
            key: *key,
            start: w.start,
            end: w.end,
            count,
            sum,
        },
    )
}

/// source → "sample" (stateless: drops events whose value is a multiple of 3) → key_by →
/// tumbling `window_ms` "window" → sink. The stateless operator can be reconfigured; windows make
/// the output independent of the order in which its tasks forward a key's events.
fn filtered_window(params: &QueryParams) -> Result<JobGraph, DataflowError> {
    let df = Dataflow::new();
    let config =
        koala_dataflow::KeyedEventsConfig { seed: params.generator.seed, ..params.generator.clone() };
    let events = KeyedEvents::source(&df, "source", params.source.clone(), config)
        .filter("sample", |e: &KeyedEvent| e.value % 3 != 0)
        .key_by(|e: &KeyedEvent| e.key);
    let spec = WindowSpec::tumbling(params.window_ms);
    sink(&window_aggregate(&events, spec, params), params.sink);
    df.build()
}

/// source → key_by → tumbling `window_ms` "window" → sink.
fn tumbling_window(params: &QueryParams) -> Result<JobGraph, DataflowError> {
    window_totals(params, WindowSpec::tumbling(params.window_ms))
}

/// source → key_by → sliding (`window_ms`, `slide_ms`) "window" → sink.
fn sliding_window(params: &QueryParams) -> Result<JobGraph, DataflowError> {
    window_totals(params, WindowSpec::sliding(params.window_ms, params.slide_ms))
}

/// Sources "left" (seed) and "right" (seed + 1), keyed, joined per tumbling window → sink.
fn window_join(params: &QueryParams) -> Result<JobGraph, DataflowError> {
    let df = Dataflow::new();
    let seed = params.generator.seed;
    let left = keyed_events(&df, "left", params, seed);
    let right = keyed_events(&df, "right", params, seed.wrapping_add(1));
    let pairs = left.window_join(
        "join",
        &right,
        WindowSpec::tumbling(params.window_ms),
        |key: &u64, w: Window, l: &KeyedEvent, r: &KeyedEvent| JoinPair {
            key: *key,
            start: w.start,
            left_seq: l.seq,
            right_seq: r.seq,
        },
    );
    sink(&pairs, params.sink);
    df.build()
}

/// Sources "left" (seed) and "right" (seed + 1), keyed, joined without windows → sink.
fn keyed_join(params: &QueryParams) -> Result<JobGraph, DataflowError> {
    let df = Dataflow::new();
    let seed = params.generator.seed;
    let left = keyed_events(&df, "left", params, seed);
    let right = keyed_events(&df, "right", params, seed.wrapping_add(1));
    let pairs = left.join("join", &right, join_pair);
    sink(&pairs, params.sink);
    df.build()
}

/// The output of the unwindowed joins: a key and the sequence numbers of the two records.
fn join_pair(key: &u64, l: &KeyedEvent, r: &KeyedEvent) -> KeyedJoinPair {
    KeyedJoinPair { key: *key, left_seq: l.seq, right_seq: r.seq }
}

/// Source "source", keyed, joined with itself without windows → sink: one upstream operator
/// feeds both inputs of "join", so every source task has two channels to every join task. Each
/// arriving record is joined with the records of its key that arrived earlier on the other input,
/// so every ordered pair (a, b) of records of a key — a record with itself included — is emitted
/// exactly once, whatever the interleaving of the two inputs.
fn self_join(params: &QueryParams) -> Result<JobGraph, DataflowError> {
    let df = Dataflow::new();
    let events = keyed_events(&df, "source", params, params.generator.seed);
    let pairs = events.join("join", &events, join_pair);
    sink(&pairs, params.sink);
    df.build()
}
