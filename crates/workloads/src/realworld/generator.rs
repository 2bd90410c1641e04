//! The generators of the real-world queries: one configuration ([`RealWorldConfig`]) shapes
//! key skew (a fixed set of hot keys taking `hot_ratio` of the events), temporal locality (an
//! active window of `active_keys` keys that slides one key every `active_shift_events` events)
//! and the key count; each [`Workload`] turns the chosen keys into its trace's records.

use koala_dataflow::{Data, splitmix64};
use serde::{Deserialize, Serialize};

/// Taxi zones of New York's TLC trip records (pickup and dropoff `LocationID` 1–263).
pub const TAXI_ZONES: u64 = 263;

/// How a real-world generator shapes its events. Unknown fields are rejected.
///
/// ```
/// use koala_workloads::realworld::RealWorldConfig;
/// let c: RealWorldConfig = serde_json::from_str(r#"{"events": 1000, "hot_ratio": 0.5}"#)?;
/// assert_eq!(c.events, Some(1000));
/// assert!(serde_json::from_str::<RealWorldConfig>(r#"{"hot_ration": 0.5}"#).is_err());
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RealWorldConfig {
    /// Events over all source tasks; `None` = unbounded.
    pub events: Option<u64>,
    /// Seed of every pseudo-random choice.
    pub seed: u64,
    /// The key space: Twitch streamers, Taxi zones (routes are zone pairs), Azure VMs, Borg
    /// tasks. `None` = the query's default (10 000 streamers, 263 zones, 100 000 VMs or tasks).
    pub keys: Option<u64>,
    /// Keys in the active window (temporal locality); `None` = a tenth of `keys`.
    pub active_keys: Option<u64>,
    /// Events per one-key step of the active window (0 = the window never moves).
    pub active_shift_events: u64,
    /// Probability that an event's key is one of the `hot_keys` fixed hot keys (skew).
    pub hot_ratio: f64,
    /// Hot keys, spread evenly over the key space.
    pub hot_keys: u64,
    /// Twitch: viewers (each event is one viewer of one streamer); they have their own active
    /// window of `active_keys` viewers sliding at the same pace.
    pub viewers: u64,
    /// Event time of event number 0, in milliseconds.
    pub base_time_ms: u64,
    /// Event time between consecutive event numbers, in microseconds.
    pub inter_event_delay_us: u64,
}

impl Default for RealWorldConfig {
    fn default() -> Self {
        Self {
            events: None,
            seed: 1,
            keys: None,
            active_keys: None,
            active_shift_events: 10,
            hot_ratio: 0.25,
            hot_keys: 16,
            viewers: 1_000_000,
            base_time_ms: 0,
            inter_event_delay_us: 1_000,
        }
    }
}

impl RealWorldConfig {
    /// Checks the knobs, naming the first bad one and the fix.
    pub fn validate(&self) -> Result<(), String> {
        if !(0.0..=1.0).contains(&self.hot_ratio) {
            return Err(format!("hot_ratio = {}: give a probability in [0, 1]", self.hot_ratio));
        }
        for (name, value) in [("keys", self.keys), ("active_keys", self.active_keys)] {
            if value == Some(0) {
                return Err(format!("{name} = 0: give at least one key (or leave it out for the default)"));
            }
        }
        if self.hot_ratio > 0.0 && self.hot_keys == 0 {
            return Err("hot_keys = 0 with hot_ratio > 0: give at least one hot key, or hot_ratio = 0".into());
        }
        if self.viewers == 0 {
            return Err("viewers = 0: give at least one viewer".into());
        }
        Ok(())
    }

    /// The key space of workload `W`.
    pub fn keys_of<W: Workload>(&self) -> u64 {
        self.keys.unwrap_or(W::DEFAULT_KEYS).max(1)
    }

    /// The event time of event number `n`.
    pub fn time_of(&self, n: u64) -> u64 {
        self.base_time_ms + n.saturating_mul(self.inter_event_delay_us) / 1_000
    }

    /// A pseudo-random 64-bit value of event `n` for choice `salt`.
    fn draw(&self, n: u64, salt: u64) -> u64 {
        splitmix64(self.seed ^ splitmix64(n.wrapping_mul(16).wrapping_add(salt)))
    }

    /// A uniform draw in `[0, 1)`.
    fn unit(&self, n: u64, salt: u64) -> f64 {
        (self.draw(n, salt) >> 11) as f64 / (1u64 << 53) as f64
    }

    /// The key of event `n` (choice `salt`) in a space of `keys`: a hot key with probability
    /// `hot_ratio` if `hot`, else uniform over the active window at `n`.
    fn pick(&self, n: u64, salt: u64, keys: u64, hot: bool) -> u64 {
        let active = self.active_keys.unwrap_or(keys / 10).clamp(1, keys);
        if hot && self.hot_keys > 0 && self.unit(n, salt) < self.hot_ratio {
            let hot_keys = self.hot_keys.min(keys);
            return (self.draw(n, salt + 1) % hot_keys) * (keys / hot_keys);
        }
        let start = n.checked_div(self.active_shift_events).unwrap_or(0);
        (start % keys + self.draw(n, salt + 2) % active) % keys
    }
}

/// One real-world trace: its record type, its default key count, how the generator makes its
/// records and how a CSV row of the real trace reads into one.
pub trait Workload: Send + Sync + 'static {
    /// A record of the trace.
    type Event: Data + Clone + std::fmt::Debug + PartialEq;
    /// The query's name.
    const NAME: &'static str;
    /// Keys when the config gives none.
    const DEFAULT_KEYS: u64;
    /// The CSV columns, in order (docs/workloads.md describes them).
    const CSV_COLUMNS: &'static [&'static str];
    /// Event number `n` of the generator.
    fn generate(config: &RealWorldConfig, n: u64) -> Self::Event;
    /// Its event time, ms.
    fn time(event: &Self::Event) -> u64;
    /// Reads one CSV row (already split into `CSV_COLUMNS.len()` fields); on a bad field, its
    /// index and what is wrong with it.
    fn from_fields(fields: &[&str]) -> Result<Self::Event, (usize, String)>;
}

/// Every event of one source task (`task` of `tasks`) of a bounded generator, in order.
pub fn events_of<W: Workload>(config: &RealWorldConfig, task: u32, tasks: u32) -> Vec<W::Event> {
    let total = config.events.unwrap_or(0);
    (u64::from(task)..total).step_by(tasks.max(1) as usize).map(|n| W::generate(config, n)).collect()
}

/// An id field: a number, or any other text hashed to 64 bits (trace ids are often hashes).
pub(crate) fn id_field(fields: &[&str], i: usize) -> Result<u64, (usize, String)> {
    let text = fields[i].trim();
    if text.is_empty() {
        return Err((i, "empty id".into()));
    }
    Ok(text.parse::<u64>().unwrap_or_else(|_| {
        // FNV-1a: stable across runs and processes.
        text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
    }))
}

/// An unsigned integer field.
pub(crate) fn uint_field(fields: &[&str], i: usize) -> Result<u64, (usize, String)> {
    let text = fields[i].trim();
    text.parse::<u64>().map_err(|_| (i, format!("{text:?} is not a non-negative integer")))
}

/// A decimal field in `[0, max]`, scaled by `scale` and rounded.
pub(crate) fn scaled_field(fields: &[&str], i: usize, max: f64, scale: f64) -> Result<u32, (usize, String)> {
    let text = fields[i].trim();
    match text.parse::<f64>() {
        Ok(v) if v.is_finite() && (0.0..=max).contains(&v) => Ok((v * scale).round() as u32),
        _ => Err((i, format!("{text:?} is not a number in [0, {max}]"))),
    }
}

/// A Twitch audience event: one viewer's watch heartbeat on one streamer's channel, with the
/// chat messages sent and whether the viewer followed the channel since the last one.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TwitchEvent {
    /// The streamer (channel).
    pub streamer: u64,
    /// The viewer.
    pub viewer: u64,
    /// Watch time since the viewer's last event, ms.
    pub watch_ms: u64,
    /// Chat messages since the last event.
    pub chats: u32,
    /// Whether the viewer followed the channel.
    pub follow: bool,
    /// Event time, ms.
    pub time: u64,
}

/// The Twitch workload.
pub struct Twitch;

impl Workload for Twitch {
    type Event = TwitchEvent;
    const NAME: &'static str = "twitch";
    const DEFAULT_KEYS: u64 = 10_000;
    const CSV_COLUMNS: &'static [&'static str] =
        &["time_ms", "streamer", "viewer", "watch_ms", "chats", "follow"];

    fn generate(c: &RealWorldConfig, n: u64) -> TwitchEvent {
        let streamer = c.pick(n, 0, c.keys_of::<Self>(), true);
        let viewer = c.pick(n, 4, c.viewers, false);
        // Heartbeats of 1–5 minutes; most viewers do not chat.
        let watch_ms = 60_000 * (1 + c.draw(n, 8) % 5);
        let chats = [0, 0, 0, 0, 1, 1, 2, 5][(c.draw(n, 9) % 8) as usize];
        let follow = c.draw(n, 10).is_multiple_of(100);
        TwitchEvent { streamer, viewer, watch_ms, chats, follow, time: c.time_of(n) }
    }

    fn time(e: &TwitchEvent) -> u64 {
        e.time
    }

    fn from_fields(f: &[&str]) -> Result<TwitchEvent, (usize, String)> {
        let follow = match f[5].trim() {
            "1" | "true" => true,
            "0" | "false" | "" => false,
            other => return Err((5, format!("{other:?} is not 0, 1, true or false"))),
        };
        Ok(TwitchEvent {
            time: uint_field(f, 0)?,
            streamer: id_field(f, 1)?,
            viewer: id_field(f, 2)?,
            watch_ms: uint_field(f, 3)?,
            chats: u32::try_from(uint_field(f, 4)?).map_err(|_| (4, "chat count too large".to_string()))?,
            follow,
        })
    }
}

/// A finished New York taxi trip.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TaxiTrip {
    /// Pickup zone.
    pub pickup: u64,
    /// Dropoff zone.
    pub dropoff: u64,
    /// Vendor (1 or 2 in the TLC records).
    pub vendor: u8,
    /// Trip duration, seconds.
    pub duration_s: u32,
    /// Event time (dropoff), ms.
    pub time: u64,
}

impl TaxiTrip {
    /// The origin–destination route: `pickup · 263 + dropoff` for the TLC's zone ids.
    pub fn route(&self) -> u64 {
        self.pickup.wrapping_mul(TAXI_ZONES).wrapping_add(self.dropoff)
    }
}

/// The Taxi workload.
pub struct Taxi;

impl Workload for Taxi {
    type Event = TaxiTrip;
    const NAME: &'static str = "taxi";
    const DEFAULT_KEYS: u64 = TAXI_ZONES;
    const CSV_COLUMNS: &'static [&'static str] = &["time_ms", "pickup", "dropoff", "vendor", "duration_s"];

    fn generate(c: &RealWorldConfig, n: u64) -> TaxiTrip {
        let zones = c.keys_of::<Self>();
        // Busy areas: pickups skewed to the hot zones; half the trips stay near their pickup.
        let pickup = c.pick(n, 0, zones, true);
        let dropoff = if c.draw(n, 4).is_multiple_of(2) {
            (pickup + c.draw(n, 5) % 8) % zones
        } else {
            c.pick(n, 6, zones, true)
        };
        // A route's typical duration (5–35 min) with ±25 % noise.
        let base = 300 + splitmix64(pickup.wrapping_mul(TAXI_ZONES) ^ dropoff ^ c.seed) % 1_800;
        let duration_s = (base * (75 + c.draw(n, 9) % 51) / 100) as u32;
        TaxiTrip { pickup, dropoff, vendor: 1 + (c.draw(n, 10) % 2) as u8, duration_s, time: c.time_of(n) }
    }

    fn time(e: &TaxiTrip) -> u64 {
        e.time
    }

    fn from_fields(f: &[&str]) -> Result<TaxiTrip, (usize, String)> {
        Ok(TaxiTrip {
            time: uint_field(f, 0)?,
            pickup: uint_field(f, 1)?,
            dropoff: uint_field(f, 2)?,
            vendor: u8::try_from(uint_field(f, 3)?).map_err(|_| (3, "vendor id above 255".to_string()))?,
            duration_s: u32::try_from(uint_field(f, 4)?)
                .map_err(|_| (4, "duration too large".to_string()))?,
        })
    }
}

/// An Azure VM's CPU reading over one 5-minute interval, in hundredths of a percent.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct AzureReading {
    /// The VM.
    pub vm: u64,
    /// Minimum CPU, 0–10 000.
    pub min_cpu: u32,
    /// Maximum CPU.
    pub max_cpu: u32,
    /// Average CPU.
    pub avg_cpu: u32,
    /// Event time, ms.
    pub time: u64,
}

/// The Azure workload.
pub struct Azure;

impl Workload for Azure {
    type Event = AzureReading;
    const NAME: &'static str = "azure";
    const DEFAULT_KEYS: u64 = 100_000;
    const CSV_COLUMNS: &'static [&'static str] = &["time_ms", "vm", "min_cpu", "max_cpu", "avg_cpu"];

    fn generate(c: &RealWorldConfig, n: u64) -> AzureReading {
        let vm = c.pick(n, 0, c.keys_of::<Self>(), true);
        // Each VM has its own typical load (most VMs are lightly used).
        let typical = 200 + splitmix64(vm ^ c.seed) % 6_000;
        let avg_cpu = (typical + c.draw(n, 4) % 2_000).min(10_000) as u32;
        let min_cpu = avg_cpu.saturating_sub((c.draw(n, 5) % 1_000) as u32);
        let max_cpu = (avg_cpu + (c.draw(n, 6) % 3_000) as u32).min(10_000);
        AzureReading { vm, min_cpu, max_cpu, avg_cpu, time: c.time_of(n) }
    }

    fn time(e: &AzureReading) -> u64 {
        e.time
    }

    fn from_fields(f: &[&str]) -> Result<AzureReading, (usize, String)> {
        let cpu = |i| scaled_field(f, i, 100.0, 100.0);
        Ok(AzureReading {
            time: uint_field(f, 0)?,
            vm: id_field(f, 1)?,
            min_cpu: cpu(2)?,
            max_cpu: cpu(3)?,
            avg_cpu: cpu(4)?,
        })
    }
}

/// A Borg task's resource usage over one interval, in millionths of a machine (normalised as
/// the trace is).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct BorgUsage {
    /// The task: its job and index within the job.
    pub task: u64,
    /// CPU.
    pub cpu: u32,
    /// Memory.
    pub ram: u32,
    /// Local disk.
    pub disk: u32,
    /// Event time, ms.
    pub time: u64,
}

/// The Borg workload.
pub struct Borg;

/// Tasks per job in the generator, and how a CSV's (job, index) becomes one task key.
const BORG_TASK_BITS: u32 = 16;

impl Workload for Borg {
    type Event = BorgUsage;
    const NAME: &'static str = "borg";
    const DEFAULT_KEYS: u64 = 100_000;
    const CSV_COLUMNS: &'static [&'static str] = &["time_ms", "job", "task_index", "cpu", "ram", "disk"];

    fn generate(c: &RealWorldConfig, n: u64) -> BorgUsage {
        let task = c.pick(n, 0, c.keys_of::<Self>(), true);
        let typical = splitmix64(task ^ c.seed);
        let around = |base: u64, salt| (base + c.draw(n, salt) % (base / 4 + 1)) as u32;
        BorgUsage {
            task,
            cpu: around(1_000 + typical % 50_000, 4),
            ram: around(2_000 + (typical >> 20) % 80_000, 5),
            disk: around(100 + (typical >> 40) % 5_000, 6),
            time: c.time_of(n),
        }
    }

    fn time(e: &BorgUsage) -> u64 {
        e.time
    }

    fn from_fields(f: &[&str]) -> Result<BorgUsage, (usize, String)> {
        let job = id_field(f, 1)?;
        let index = uint_field(f, 2)?;
        let usage = |i| scaled_field(f, i, 1.0, 1e6);
        Ok(BorgUsage {
            time: uint_field(f, 0)?,
            task: (job << BORG_TASK_BITS) ^ index,
            cpu: usage(3)?,
            ram: usage(4)?,
            disk: usage(5)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn config(events: u64) -> RealWorldConfig {
        RealWorldConfig { events: Some(events), ..Default::default() }
    }

    #[test]
    fn tasks_split_the_sequence_and_regenerate_it_exactly() {
        let c = config(1_001);
        let single = events_of::<Azure>(&c, 0, 1);
        let mut merged: Vec<AzureReading> = (0..3).flat_map(|t| events_of::<Azure>(&c, t, 3)).collect();
        assert_eq!(merged.len(), 1_001);
        merged.sort_by_key(|e| e.time);
        assert_eq!(merged, single);
        assert_eq!(events_of::<Azure>(&c, 0, 1), single, "deterministic");
    }

    #[test]
    fn hot_ratio_concentrates_events_on_the_hot_keys() {
        let c = RealWorldConfig { hot_ratio: 0.5, hot_keys: 4, ..config(20_000) };
        let mut per_zone = BTreeMap::new();
        for trip in events_of::<Taxi>(&c, 0, 1) {
            *per_zone.entry(trip.pickup).or_insert(0u64) += 1;
        }
        let hot: u64 = (0..4).map(|i| per_zone.get(&(i * (TAXI_ZONES / 4))).copied().unwrap_or(0)).sum();
        // Half the pickups are one of the 4 hot zones (plus their share of the uniform half).
        assert!((9_500..11_500).contains(&hot), "{hot} of 20 000 trips start in a hot zone");
    }

    #[test]
    fn the_active_window_slides_so_keys_are_temporally_local() {
        let c = RealWorldConfig {
            keys: Some(1_000_000),
            active_keys: Some(100),
            active_shift_events: 10,
            hot_ratio: 0.0,
            ..config(10_000)
        };
        let events = events_of::<Borg>(&c, 0, 1);
        for (n, e) in events.iter().enumerate() {
            let start = n as u64 / 10;
            assert!((start..start + 100).contains(&e.task), "event {n}: task {}", e.task);
        }
        // Over the run the window covers ~1 100 distinct tasks, not a million.
        let distinct: std::collections::BTreeSet<u64> = events.iter().map(|e| e.task).collect();
        assert!(distinct.len() > 900 && distinct.len() <= 1_100, "{}", distinct.len());
    }

    #[test]
    fn bad_configs_name_the_field() {
        let err = |c: RealWorldConfig| c.validate().expect_err("rejected");
        assert!(err(RealWorldConfig { hot_ratio: 2.0, ..Default::default() }).contains("hot_ratio"));
        assert!(err(RealWorldConfig { keys: Some(0), ..Default::default() }).contains("keys"));
        assert!(err(RealWorldConfig { hot_keys: 0, ..Default::default() }).contains("hot_keys"));
    }
}
