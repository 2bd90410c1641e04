//! The real-world queries as the paper defines them (appendix C), over the generators or CSV
//! replays. Operator names are part of the contract: configs and reconfiguration requests name
//! them. Every sink row carries the key of the operator that produced it as `key`.

use std::marker::PhantomData;

use koala_dataflow::{
    Data, Dataflow, DataflowError, Generator, JobGraph, ListState, SourceOptions, Stream, TaskInstance,
    ValueState,
};
use serde::{Deserialize, Serialize};

use super::generator::{Azure, Borg, RealWorldConfig, Taxi, TaxiTrip, Twitch, TwitchEvent, Workload};
use super::{AzureReading, BorgUsage, csv};
use crate::params::SinkKind;

/// Where the records come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Input {
    /// The embedded generator (`[params.generator]`).
    #[default]
    Generator,
    /// CSV files of the real trace (`[params.csv]`).
    Csv,
}

/// The CSV replay: files and whether each starts with a header line.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CsvParams {
    /// The files; source task `i` of `n` reads files `i, i + n, …` (one per task, as the paper's
    /// producers read one file each).
    pub paths: Vec<String>,
    /// Whether every file's first line is a header (skipped).
    pub header: bool,
}

/// How the Taxi query partitions its operator.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaxiPartition {
    /// Per origin–destination route.
    #[default]
    Route,
    /// Per pickup zone (the paper's skewed rebalance experiment, Figure 11): a key's recent trips
    /// are its zone's, the median is over those of the trip's route.
    PickupArea,
}

/// Parameters of the real-world queries (`[params]` of a config). Unknown fields are rejected.
///
/// ```
/// use koala_workloads::realworld::{Input, RealWorldParams};
/// let p: RealWorldParams = serde_json::from_str(r#"{"input": "csv", "csv": {"paths": ["a.csv"]}}"#)?;
/// assert_eq!(p.input, Input::Csv);
/// assert!(serde_json::from_str::<RealWorldParams>(r#"{"recnt": 5}"#).is_err());
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RealWorldParams {
    /// Generator or CSV replay.
    pub input: Input,
    /// The generator's knobs (`input = "generator"`).
    pub generator: RealWorldConfig,
    /// The CSV files (`input = "csv"`).
    pub csv: CsvParams,
    /// Rate schedule, watermark cadence and bounded disorder of the source.
    pub source: SourceOptions,
    /// Readings kept per key: Taxi trips, Azure readings, Borg usage records. `None` = the
    /// paper artifact's 150, 80 and 10.
    pub recent: Option<usize>,
    /// Taxi: route or pickup-area partitioning.
    pub taxi_partition: TaxiPartition,
    /// Twitch: watch time after which a viewer counts as loyal to a streamer.
    pub loyal_watch_ms: u64,
    /// Bytes of padding in each key's state (the artifact's `DummyFieldSize`, 15 360 for Twitch
    /// in its AWS runs): created on a key's first record.
    pub state_padding_bytes: usize,
    /// Where the sink writes.
    pub sink: SinkKind,
}

impl Default for RealWorldParams {
    fn default() -> Self {
        Self {
            input: Input::Generator,
            generator: RealWorldConfig::default(),
            csv: CsvParams::default(),
            source: SourceOptions::default(),
            recent: None,
            taxi_partition: TaxiPartition::Route,
            loyal_watch_ms: 30 * 60_000,
            state_padding_bytes: 0,
            sink: SinkKind::default(),
        }
    }
}

impl RealWorldParams {
    /// Checks the parameters, naming the first bad one and the fix.
    pub fn validate(&self) -> Result<(), String> {
        self.generator.validate().map_err(|e| format!("params.generator.{e}"))?;
        self.source.validate()?;
        if self.recent == Some(0) {
            return Err("recent = 0: keep at least one reading per key (or leave it out)".into());
        }
        if self.input == Input::Csv {
            csv::check_paths(&self.csv)?;
        }
        Ok(())
    }

    fn recent_or(&self, default: usize) -> usize {
        self.recent.unwrap_or(default)
    }
}

/// The Twitch query's first stage: one viewer's accumulated engagement with one streamer after
/// an event.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ViewerEngagement {
    /// The streamer.
    pub streamer: u64,
    /// The viewer.
    pub viewer: u64,
    /// This event's watch time, ms.
    pub watch_ms: u64,
    /// This event's interactions (chat messages, a follow).
    pub interactions: u64,
    /// The viewer's watch time on this channel so far.
    pub total_watch_ms: u64,
    /// Whether this event made the viewer loyal (crossed `loyal_watch_ms`).
    pub became_loyal: bool,
}

/// The Twitch query's output: a streamer's loyalty score after one more engagement signal.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Loyalty {
    /// The streamer.
    pub key: u64,
    /// Signals of the streamer so far.
    pub count: u64,
    /// The viewer of this signal.
    pub viewer: u64,
    /// Its watch time, ms.
    pub watch_ms: u64,
    /// The streamer's accumulated watch time, ms.
    pub total_watch_ms: u64,
    /// Its accumulated interactions.
    pub interactions: u64,
    /// Its loyal viewers.
    pub loyal_viewers: u64,
    /// Watch minutes + 10 × interactions + 100 × loyal viewers.
    pub score: u64,
}

/// The Taxi query's output: the median duration of the route's recent trips after one more.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RouteMedian {
    /// The partition key: the route, or the pickup zone.
    pub key: u64,
    /// The route (`pickup · 263 + dropoff`).
    pub route: u64,
    /// Trips of the key so far.
    pub count: u64,
    /// Median duration of the route's trips among the key's recent ones, seconds.
    pub median_s: u32,
}

/// The Azure query's output: a VM's CPU over its recent readings after one more.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct VmCpu {
    /// The VM.
    pub key: u64,
    /// Readings of the VM so far.
    pub count: u64,
    /// Lowest minimum.
    pub min: u32,
    /// Highest maximum.
    pub max: u32,
    /// Median of the averages.
    pub median: u32,
}

/// The Borg query's output: a task's median usage over its recent readings after one more.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TaskUsage {
    /// The task.
    pub key: u64,
    /// Readings of the task so far.
    pub count: u64,
    /// Median CPU.
    pub cpu: u32,
    /// Median memory.
    pub ram: u32,
    /// Median local disk.
    pub disk: u32,
}

/// Builds one query's graph from (validated) parameters.
type Builder = fn(&RealWorldParams) -> Result<JobGraph, DataflowError>;

/// Every real-world query: name, what it computes with its operators named, builder.
pub const QUERIES: &[(&str, &str, Builder)] = &[
    (
        "twitch",
        "Twitch (paper App. C): \"events\" (viewer heartbeats) → \"engagement\" (per streamer and viewer: watch time, interactions, loyal after loyal_watch_ms) → \"loyalty\" (per streamer: watch time, interactions, loyal viewers → a loyalty score) → sink",
        twitch,
    ),
    (
        "taxi",
        "Taxi (paper App. C): \"trips\" → \"median_trip\" (per route, or per pickup zone with taxi_partition = \"pickup_area\": median duration over the `recent` (150) latest trips) → sink",
        taxi,
    ),
    (
        "azure",
        "Azure (paper App. C): \"readings\" (VM CPU) → \"cpu_stats\" (per VM: min, max and median CPU over the `recent` (80) latest readings) → sink",
        azure,
    ),
    (
        "borg",
        "Borg (paper App. C): \"usage\" (task resource usage) → \"task_stats\" (per task: median CPU, RAM and disk over the `recent` (10) latest readings) → sink",
        borg,
    ),
];

/// Builds the real-world query `name`, or `None` if none has that name.
pub fn build(name: &str, params: &RealWorldParams) -> Option<Result<JobGraph, String>> {
    let (_, _, builder) = QUERIES.iter().find(|(n, _, _)| *n == name)?;
    Some(params.validate().and_then(|()| builder(params).map_err(|e| e.to_string())))
}

/// The generator share of one source task: event numbers `n, n + step, …` below `end`.
struct Share<W: Workload> {
    config: RealWorldConfig,
    n: u64,
    step: u64,
    _workload: PhantomData<fn() -> W>,
}

impl<W: Workload> Generator<W::Event> for Share<W> {
    fn next(&mut self) -> Option<(W::Event, u64)> {
        if self.config.events.is_some_and(|end| self.n >= end) {
            return None;
        }
        let event = W::generate(&self.config, self.n);
        self.n += self.step;
        let time = W::time(&event);
        Some((event, time))
    }
}

/// The source `name` of workload `W`: the generator, or the CSV files.
fn source<W: Workload>(df: &Dataflow, name: &str, p: &RealWorldParams) -> Stream<W::Event> {
    match p.input {
        Input::Csv => csv::source::<W>(df, name, p.source.clone(), &p.csv),
        Input::Generator => {
            let config = p.generator.clone();
            df.source(name, p.source.clone(), move |task: TaskInstance| Share::<W> {
                config: config.clone(),
                n: u64::from(task.index),
                step: u64::from(task.parallelism.max(1)),
                _workload: PhantomData,
            })
        }
    }
}

/// The sink "sink" of the configured kind.
fn sink<T: Data>(stream: &Stream<T>, kind: SinkKind) {
    match kind {
        SinkKind::Jsonl => stream.sink_json_lines("sink"),
        SinkKind::Stdout => stream.sink_stdout("sink"),
        SinkKind::Discard => stream.sink_discard("sink"),
    }
}

/// Fills `pad` to `bytes` on a key's first record (as the artifact's dummy field).
fn pad_to(pad: &mut String, bytes: usize) {
    if pad.len() != bytes {
        *pad = "x".repeat(bytes);
    }
}

/// The lower median (the middle element; of two, the smaller) of `values`; 0 if empty.
pub(crate) fn median(mut values: Vec<u32>) -> u32 {
    if values.is_empty() {
        return 0;
    }
    let mid = (values.len() - 1) / 2;
    *values.select_nth_unstable(mid).1
}

/// Twitch's "engagement" state per (streamer, viewer): watch time, interactions, padding.
pub type EngagementState = (u64, u64, String);
/// Twitch's "loyalty" state per streamer: signals, watch time, interactions, loyal viewers,
/// padding.
pub type LoyaltyState = (u64, u64, u64, u64, String);

/// Twitch: "events" → key_by (streamer, viewer) → "engagement" → key_by streamer → "loyalty".
fn twitch(p: &RealWorldParams) -> Result<JobGraph, DataflowError> {
    let df = Dataflow::new();
    let (padding, loyal_ms) = (p.state_padding_bytes, p.loyal_watch_ms);
    let engagement =
        source::<Twitch>(&df, "events", p).key_by(|e: &TwitchEvent| (e.streamer, e.viewer)).stateful_map(
            "engagement",
            move |_: &(u64, u64), e: TwitchEvent, state: &mut ValueState<EngagementState>| {
                let interactions = u64::from(e.chats) + u64::from(e.follow);
                state.update(|(watch, total_interactions, pad)| {
                    pad_to(pad, padding);
                    let before = *watch;
                    *watch += e.watch_ms;
                    *total_interactions += interactions;
                    ViewerEngagement {
                        streamer: e.streamer,
                        viewer: e.viewer,
                        watch_ms: e.watch_ms,
                        interactions,
                        total_watch_ms: *watch,
                        became_loyal: before < loyal_ms && *watch >= loyal_ms,
                    }
                })
            },
        );
    let loyalty = engagement.key_by(|e: &ViewerEngagement| e.streamer).stateful_map(
        "loyalty",
        move |streamer: &u64, e: ViewerEngagement, state: &mut ValueState<LoyaltyState>| {
            state.update(|(count, watch, interactions, loyal, pad)| {
                pad_to(pad, padding);
                *count += 1;
                *watch += e.watch_ms;
                *interactions += e.interactions;
                *loyal += u64::from(e.became_loyal);
                Loyalty {
                    key: *streamer,
                    count: *count,
                    viewer: e.viewer,
                    watch_ms: e.watch_ms,
                    total_watch_ms: *watch,
                    interactions: *interactions,
                    loyal_viewers: *loyal,
                    score: *watch / 60_000 + 10 * *interactions + 100 * *loyal,
                }
            })
        },
    );
    sink(&loyalty, p.sink);
    df.build()
}

/// A key's readings so far and its padding (the value state of the list queries).
pub type CountState = (u64, String);

/// Taxi: "trips" → key_by route (or pickup zone) → "median_trip".
fn taxi(p: &RealWorldParams) -> Result<JobGraph, DataflowError> {
    let df = Dataflow::new();
    let (recent, padding) = (p.recent_or(150), p.state_padding_bytes);
    let by_pickup = p.taxi_partition == TaxiPartition::PickupArea;
    let out = source::<Taxi>(&df, "trips", p)
        .key_by(move |t: &TaxiTrip| if by_pickup { t.pickup } else { t.route() })
        .stateful_flat_map2(
            "median_trip",
            move |key: &u64,
                  t: TaxiTrip,
                  count: &mut ValueState<CountState>,
                  trips: &mut ListState<(u64, u32)>,
                  out: &mut Vec<RouteMedian>| {
                let route = t.route();
                let n = count.update(|(n, pad)| {
                    pad_to(pad, padding);
                    *n += 1;
                    *n
                });
                trips.push((route, t.duration_s));
                trips.truncate_front(recent);
                let durations = trips.items().iter().filter(|(r, _)| *r == route).map(|(_, d)| *d).collect();
                out.push(RouteMedian { key: *key, route, count: n, median_s: median(durations) });
            },
        );
    sink(&out, p.sink);
    df.build()
}

/// Azure: "readings" → key_by VM → "cpu_stats".
fn azure(p: &RealWorldParams) -> Result<JobGraph, DataflowError> {
    let df = Dataflow::new();
    let (recent, padding) = (p.recent_or(80), p.state_padding_bytes);
    let out = source::<Azure>(&df, "readings", p).key_by(|r: &AzureReading| r.vm).stateful_flat_map2(
        "cpu_stats",
        move |vm: &u64,
              r: AzureReading,
              count: &mut ValueState<CountState>,
              readings: &mut ListState<(u32, u32, u32)>,
              out: &mut Vec<VmCpu>| {
            let n = count.update(|(n, pad)| {
                pad_to(pad, padding);
                *n += 1;
                *n
            });
            readings.push((r.min_cpu, r.max_cpu, r.avg_cpu));
            readings.truncate_front(recent);
            let items = readings.items();
            out.push(VmCpu {
                key: *vm,
                count: n,
                min: items.iter().map(|r| r.0).min().unwrap_or(0),
                max: items.iter().map(|r| r.1).max().unwrap_or(0),
                median: median(items.iter().map(|r| r.2).collect()),
            });
        },
    );
    sink(&out, p.sink);
    df.build()
}

/// Borg: "usage" → key_by task → "task_stats".
fn borg(p: &RealWorldParams) -> Result<JobGraph, DataflowError> {
    let df = Dataflow::new();
    let (recent, padding) = (p.recent_or(10), p.state_padding_bytes);
    let out = source::<Borg>(&df, "usage", p).key_by(|u: &BorgUsage| u.task).stateful_flat_map2(
        "task_stats",
        move |task: &u64,
              u: BorgUsage,
              count: &mut ValueState<CountState>,
              readings: &mut ListState<(u32, u32, u32)>,
              out: &mut Vec<TaskUsage>| {
            let n = count.update(|(n, pad)| {
                pad_to(pad, padding);
                *n += 1;
                *n
            });
            readings.push((u.cpu, u.ram, u.disk));
            readings.truncate_front(recent);
            let items = readings.items();
            out.push(TaskUsage {
                key: *task,
                count: n,
                cpu: median(items.iter().map(|r| r.0).collect()),
                ram: median(items.iter().map(|r| r.1).collect()),
                disk: median(items.iter().map(|r| r.2).collect()),
            });
        },
    );
    sink(&out, p.sink);
    df.build()
}
