//! A deterministic simulator for the protocol cores (docs/testing.md §2): the job's
//! reconfiguration engine (`crate::engine`, the one `crates/coordinator` runs) with Koala's task
//! cores or stop-and-restart's (also in remote mode, over a shared store with per-task write-back
//! buffers), the upstream routers and pause cores.
//!
//! One keyed operator with 16 buckets runs as target tasks behind two upstream tasks, feeding a
//! consumer operator ([`SimConfig::consumers`], `consumer.rs`): the target tasks' outputs (records
//! processed, timers fired) go to it, it learns the created tasks' channels at each `Prepare` by
//! the runtime's rule and finishes once they all ended — also before it answered a `Prepare`
//! ([`SimConfig::sources_end_early`]), which the engine must then forget. Every channel
//! (data, peer, state fetch, control, acks) is a FIFO queue. Each step delivers the head of a
//! randomly chosen non-empty channel, lets a source emit, or gives a task an idle turn, driven by a
//! seeded splitmix64 generator, so a seed replays exactly and many seeds explore the interleavings
//! per-channel FIFO allows. Invariants are checked on every step (see `checks.rs`).
//!
//! The operator counts records per key: its state is the number of records processed since the
//! key's state was last deleted. Half the keys are *window keys*: each record sets an event-time
//! timer at its own time, and when the key's last pending timer fires (the task emits a watermark
//! at or past it, or a sender fires due timers before a hand-over) the key's state is deleted, as
//! a window operator purges a key whose windows all closed. As the runtime does, a Koala
//! hand-over carries the moved buckets' timers but not their keys' state (lazy windows): the
//! receiver's core holds its event time below each such timer until the key was accessed — by a
//! record, or by the timer itself once its upstreams' event time reached it — and a check
//! asserts every timer fires on its key's whole state, where it is. Stop-and-restart's transfer
//! carries timers and state. The other keys are plain counters without timers whose state stays
//! put until fetched (lazy fetch, progressive migration). With [`SimConfig::state_outlives_timers`] every key sets timers and
//! none deletes state: a key whose timers all fired keeps its state where they fired, so its
//! bucket's next hand-over must name that task as its location (one hop, nothing stranded).
//!
//! With [`SimConfig::inputs`] = 2 the operator has two inputs fed by the same upstream tasks (a
//! self-join): each upstream runs one router per input with the same table (they switch, mark
//! and end together), every record goes on a random input, and the two channels from one
//! upstream task are independent FIFO queues, so a key's records on different inputs may be
//! reordered against each other. Records carry a sequence number per (key, input).
//!
//! The harness keeps a ledger per key (records processed, and how many there were when its state
//! was last deleted), never read from a store. Processing record `#s` of (key, input) proves:
//! `s` follows the last one processed on that input (no loss, duplicate or reordering within an
//! input), the core reports the input the record came on, and the stored count equals the records
//! processed since the last delete (no stale read, no lost state, and no deleted value that came
//! back from a copy at another location). At the end every key's records were all processed,
//! a deleted key is stored nowhere, and no store holds a key anywhere but at its one location.
//!
//! ```
//! use koala_protocol::Protocol;
//! use koala_protocol::sim::{Scenario, SimConfig, run};
//! let stats = run(&SimConfig::new(Scenario::ScaleOut, 7)).expect("seed 7 passes");
//! assert_eq!(stats.epochs, 1);
//! let config = SimConfig { protocol: Protocol::StopAndRestart, ..SimConfig::new(Scenario::Chain, 7) };
//! assert_eq!(run(&config).expect("seed 7 passes").epochs, 4);
//! // The same with a two-input (self-join) operator.
//! let config = SimConfig { inputs: 2, ..SimConfig::new(Scenario::Rebalance, 7) };
//! let stats = run(&config).expect("seed 7 passes");
//! assert!(stats.by_input.iter().all(|&n| n > 0));
//! ```

mod backpressure;
mod channels;
pub mod checkpoint;
mod checks;
mod consumer;
mod coordinator;
pub mod cut;
mod drrs;
mod end_checks;
mod koala;
mod rng;
mod scenario;
mod stop_restart;
mod upstream;
mod world;

use std::fmt;

use crate::control::Protocol;

pub use rng::SplitMix64;
pub use scenario::Scenario;

/// A deliberately broken harness, to show the checks catch real protocol bugs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Upstreams switch routing as soon as the coordinator starts an epoch, before `PeerReady`.
    SwitchBeforePeerReady,
    /// Receivers process direct records of moved buckets without parking them.
    NoParking,
    /// Senders hand timers over without firing those due at their event time first.
    NoTimerFiringAtHandOver,
    /// The coordinator releases a retired task on drain reports of any epoch.
    ReleaseWithoutEpoch,
    /// Stop-and-restart: upstreams switch to the new routing at `Drain` instead of pausing
    /// until `Resume` (records of a moved bucket may overtake its state).
    RerouteAtDrain,
    /// A location answers a fetch without deleting what it answered (breaks one live copy).
    ServeWithoutDelete,
    /// Koala: a receiver neither holds its event time for the timers a hand-over brought nor
    /// accesses their keys, so a window fires at the receiver on state that is still at the
    /// sender (lazy windows).
    TimerBeforeAccess,
    /// A location's membership filter leaves out one key it holds (a false negative): the owner
    /// creates that key anew while its state sits at the location.
    FilterMissesKey,
    /// DRRS: a receiver processes records of an incoming bucket without waiting for its state.
    ProcessBeforeState,
    /// DRRS: a receiver emits watermarks while a moved bucket's state and timers have not
    /// arrived (the watermark propagation the paper adds to DRRS, left out).
    WatermarkBeforeState,
    /// Remote: an old owner sends `StateEnd` without writing back what it buffered for the moved
    /// buckets first (they reach the shared store only at a later eviction), so the new owner
    /// may read a stale value.
    FlushAfterStateEnd,
    /// Stop-and-restart: a task exits as soon as its inputs ended, without waiting for the
    /// coordinator's release (the runtime's rule before): a reconfiguration the coordinator
    /// started before it heard of the end sends the task a `Prepare` it never answers.
    ExitWithoutRelease,
    /// Koala with a bound: the hold-back rule tried and reverted on 2026-12-02 (channels whose
    /// marker is in wait at their senders until the task's markers are all in; parked records
    /// do not count meanwhile). With blocking senders ([`SimConfig::channel_capacity`]) it
    /// deadlocks.
    HoldBackAfterMarker,
    /// DRRS: receivers lend their senders unbounded credit, so forwarded records do not count
    /// against `wait_records` (the rule before the bounded wait buffer: a receiver held 187 303 records).
    UnboundedCredit,
    /// A consumer of the operator that finished (every input ended) is not reported to the
    /// coordinator: a reconfiguration whose `Prepare` it never answers (its worker drops commands
    /// to finished tasks) waits for it forever.
    ConsumerFinishUnreported,
    /// A consumer's worker tells it no channel of the created tasks at `Prepare`: their outputs
    /// come on channels it does not know (and it may finish before they end).
    ConsumerMissesCreatedInputs,
}

impl Fault {
    /// Parses the name the replay command prints (`switch_before_peer_ready`, `no_parking`, …).
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "switch_before_peer_ready" => Some(Self::SwitchBeforePeerReady),
            "no_parking" => Some(Self::NoParking),
            "no_timer_firing_at_hand_over" => Some(Self::NoTimerFiringAtHandOver),
            "release_without_epoch" => Some(Self::ReleaseWithoutEpoch),
            "reroute_at_drain" => Some(Self::RerouteAtDrain),
            "serve_without_delete" => Some(Self::ServeWithoutDelete),
            "timer_before_access" => Some(Self::TimerBeforeAccess),
            "filter_misses_key" => Some(Self::FilterMissesKey),
            "process_before_state" => Some(Self::ProcessBeforeState),
            "watermark_before_state" => Some(Self::WatermarkBeforeState),
            "flush_after_state_end" => Some(Self::FlushAfterStateEnd),
            "exit_without_release" => Some(Self::ExitWithoutRelease),
            "hold_back_after_marker" => Some(Self::HoldBackAfterMarker),
            "unbounded_credit" => Some(Self::UnboundedCredit),
            "consumer_finish_unreported" => Some(Self::ConsumerFinishUnreported),
            "consumer_misses_created_inputs" => Some(Self::ConsumerMissesCreatedInputs),
            _ => None,
        }
    }

    /// The name [`Fault::parse`] reads.
    pub fn name(self) -> &'static str {
        match self {
            Self::SwitchBeforePeerReady => "switch_before_peer_ready",
            Self::NoParking => "no_parking",
            Self::NoTimerFiringAtHandOver => "no_timer_firing_at_hand_over",
            Self::ReleaseWithoutEpoch => "release_without_epoch",
            Self::RerouteAtDrain => "reroute_at_drain",
            Self::ServeWithoutDelete => "serve_without_delete",
            Self::TimerBeforeAccess => "timer_before_access",
            Self::FilterMissesKey => "filter_misses_key",
            Self::ProcessBeforeState => "process_before_state",
            Self::WatermarkBeforeState => "watermark_before_state",
            Self::FlushAfterStateEnd => "flush_after_state_end",
            Self::ExitWithoutRelease => "exit_without_release",
            Self::HoldBackAfterMarker => "hold_back_after_marker",
            Self::UnboundedCredit => "unbounded_credit",
            Self::ConsumerFinishUnreported => "consumer_finish_unreported",
            Self::ConsumerMissesCreatedInputs => "consumer_misses_created_inputs",
        }
    }
}

/// One simulation run.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// What to reconfigure.
    pub scenario: Scenario,
    /// The seed.
    pub seed: u64,
    /// A broken variant to run instead of the real protocol.
    pub fault: Option<Fault>,
    /// Upstream tasks.
    pub upstreams: usize,
    /// Distinct keys (key `k` is produced by upstream `k % upstreams`; half of them are window
    /// keys, see the module docs).
    pub keys: usize,
    /// Operator inputs each upstream task feeds (1, or 2 for a self-join: two routers per
    /// upstream with the same table, and each record goes on a random one).
    pub inputs: usize,
    /// Records each upstream emits.
    pub records_per_upstream: usize,
    /// Buckets of the operator.
    pub num_buckets: u16,
    /// Give up after this many steps.
    pub max_steps: u64,
    /// The protocol the target tasks run.
    pub protocol: Protocol,
    /// Every key sets timers and a firing timer deletes nothing: state outlives its timers, as
    /// in an operator with per-key state beside its timers (a running aggregate that also
    /// schedules a flush). Off: window keys purge their state when their last timer fires and
    /// the other keys set no timers (see the module docs).
    pub state_outlives_timers: bool,
    /// The counter keys (`c…`) also set a processing-time timer each record, due 20 steps of the
    /// world's clock later; a Koala task gets its clock (`TaskEvent::ProcessingTime`) at random
    /// later steps while it has any. Such a timer fires on its key's whole, local state, as an
    /// event-time one does.
    pub processing_timers: bool,
    /// Koala's background drain of live old owners is on (`drain_keys_per_sec` > 0): every old
    /// location is drained, and at the end no KLT names another task. The drain's rate-limit
    /// timer is a message to the task itself, delivered at a random later step.
    pub drain: bool,
    /// DRRS: subscales per reconfiguration (0 = one per sender→receiver pair; ported only).
    pub subscales: usize,
    /// DRRS: which schedule runs the subscales (`[drrs] schedule`).
    pub drrs_schedule: crate::drrs::DrrsSchedule,
    /// DRRS: records a receiver lets wait (`DrrsOptions::wait_records`; forwarded ones count).
    pub wait_records: usize,
    /// Koala: `[runtime] max_queued_records`, the records a task holds before it stops taking
    /// data input (its data channels then wait, as DRRS's do).
    pub max_queued_records: usize,
    /// Messages a data channel from an upstream holds (0: unbounded, the default, so the other
    /// sweeps keep their schedules). With a capacity an upstream is a thread with blocking sends,
    /// as the runtime's are: a send to a full channel blocks it — it emits nothing and takes no
    /// command (no `Switch`, so no markers) until the receiver takes from that channel. A Koala
    /// task leaves a channel full by refusing its head ([`crate::koala::KoalaTask::data_room`]).
    pub channel_capacity: usize,
    /// Koala: whether tasks ask for the state of queued records' keys before their batch is
    /// taken (`KoalaTask::set_look_ahead`; on, as in the runtime).
    pub look_ahead: bool,
    /// Tasks of the consumer operator the target operator feeds (0: none, the job ends at the
    /// target operator). Each target task sends its outputs to them (see `consumer.rs`).
    pub consumers: usize,
    /// Every source may end before the requested reconfigurations started (else only a random
    /// quarter of them may), and they are requested as the last source ends: the operator's
    /// tasks, then its consumers, then often finish while the first is being prepared, so a
    /// consumer may finish after its `Prepare` went out.
    pub sources_end_early: bool,
}

impl SimConfig {
    /// The suite's default small workload.
    pub fn new(scenario: Scenario, seed: u64) -> Self {
        Self {
            scenario,
            seed,
            fault: None,
            upstreams: 2,
            keys: 24,
            inputs: 1,
            records_per_upstream: 40,
            num_buckets: 16,
            max_steps: 20_000,
            protocol: Protocol::Koala,
            state_outlives_timers: false,
            processing_timers: false,
            drain: false,
            subscales: 0,
            drrs_schedule: crate::drrs::DrrsSchedule::Ported,
            wait_records: 8,
            max_queued_records: usize::MAX,
            channel_capacity: 0,
            look_ahead: true,
            consumers: 1,
            sources_end_early: false,
        }
    }
}

/// What a passing run did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SimStats {
    /// Steps taken.
    pub steps: u64,
    /// Epochs completed.
    pub epochs: u64,
    /// Fetch requests sent.
    pub fetches: u64,
    /// Keys requested by fetches.
    pub fetched_keys: u64,
    /// Keys moved by progressive migration.
    pub extra_keys: u64,
    /// Key states installed at a new location.
    pub moved_keys: u64,
    /// Cancelled tasks released.
    pub released: u64,
    /// Messages that reached a task after it exited (ends, markers, requests it need not
    /// answer; the runtime drops them with its queues), never records.
    pub after_exit: u64,
    /// Whether the run used progressive migration (N > 0) and cancelled tasks.
    pub progressive: bool,
    /// Requests skipped because every upstream had finished before they could start.
    pub skipped: u64,
    /// Window keys whose state a firing timer deleted.
    pub cleared: u64,
    /// Records processed per operator input.
    pub by_input: [u64; 2],
    /// Keys the cores asked their own store about (local first).
    pub local_probes: u64,
    /// Membership filters built and sent.
    pub filters_built: u64,
    /// Keys a fetch asked a location for that it did not hold (false positives, layers whose
    /// filter was not there yet, keys asked of two candidates).
    pub not_here: u64,
    /// Fetches for a batch sent to a location while a pull to it was unanswered.
    pub fetches_racing_pulls: u64,
    /// Koala: events fed to a task while record batches waited on its data channels (then it
    /// sends no background pull: `KoalaTask::set_input_backlog`).
    pub fed_with_backlog: u64,
    /// Koala: fetch requests the look-ahead sent for queued records before their batch.
    pub look_ahead_fetches: u64,
    /// DRRS: buckets pushed.
    pub pushed_buckets: u64,
    /// DRRS: `Done` acks of subscales (one per task taking part).
    pub subscale_acks: u64,
    /// DRRS: records that waited for their bucket's state (or for the peer channel's close).
    pub waited: u64,
    /// DRRS: the most subscales one task took part in at once.
    pub max_running_subscales: usize,
    /// DRRS: the most subscales one task sent or received buckets in at once.
    pub max_moving_subscales: usize,
    /// Times a task stopped taking data input (DRRS: backpressure from its wait buffer; Koala:
    /// `max_queued_records` held).
    pub pauses: u64,
    /// Koala tasks that exited by the runtime's rule ([`crate::koala::TaskLife::may_exit`]).
    pub exited: u64,
    /// Koala and DRRS: the most records one task held at once (`queued_records`).
    pub max_queued: usize,
    /// Koala with a bound: steps in which a task that took data input refused the head of one
    /// of its data channels (a record that would park past the bound; the reverted rule: a
    /// channel whose marker was in).
    pub refused_heads: u64,
    /// Koala with a bound: batches (on a data channel or forwarded on a peer lane) split because
    /// only their first records fitted.
    pub split_batches: u64,
    /// With [`SimConfig::channel_capacity`]: times an upstream blocked on a full channel.
    pub blocked_sends: u64,
    /// Koala: the most steps a batch's first record waited before the batch was processed.
    pub max_batch_wait: u64,
    /// Remote: buffered (dirty) keys an old owner wrote back to the shared store when it gave
    /// their bucket away.
    pub flushed_keys: u64,
    /// Koala: keys whose timers came with a hand-over without their state, first accessed by a
    /// record (the record's batch fetched the state; the timer fired on it later).
    pub handed_timers_record_first: u64,
    /// Koala: such keys whose timer fired before any record of them came (the timer's access
    /// fetched the state, and the watermark waited for it).
    pub handed_timers_fired_first: u64,
    /// Processing-time timers fired ([`SimConfig::processing_timers`]); of them, how many came
    /// with a hand-over before their key's state did.
    pub processing_timers_fired: u64,
    /// See [`Self::processing_timers_fired`].
    pub handed_processing_timers_fired: u64,
    /// Consumer tasks that finished (every input ended).
    pub consumers_finished: u64,
    /// `AddInputs` (a `Prepare`) that reached a consumer after it finished: dropped, the engine
    /// forgets the consumer when it hears it finished.
    pub prepares_after_finish: u64,
}

impl SimStats {
    /// Adds `run`'s counts to these (the largest of each `max_` figure; `progressive` if any
    /// run was), for a sweep's total.
    pub fn absorb(&mut self, run: &SimStats) {
        self.steps += run.steps;
        self.epochs += run.epochs;
        self.fetches += run.fetches;
        self.fetched_keys += run.fetched_keys;
        self.extra_keys += run.extra_keys;
        self.moved_keys += run.moved_keys;
        self.released += run.released;
        self.after_exit += run.after_exit;
        self.progressive |= run.progressive;
        self.skipped += run.skipped;
        self.cleared += run.cleared;
        for (sum, n) in self.by_input.iter_mut().zip(run.by_input) {
            *sum += n;
        }
        self.local_probes += run.local_probes;
        self.filters_built += run.filters_built;
        self.not_here += run.not_here;
        self.fetches_racing_pulls += run.fetches_racing_pulls;
        self.fed_with_backlog += run.fed_with_backlog;
        self.look_ahead_fetches += run.look_ahead_fetches;
        self.pushed_buckets += run.pushed_buckets;
        self.subscale_acks += run.subscale_acks;
        self.waited += run.waited;
        self.max_running_subscales = self.max_running_subscales.max(run.max_running_subscales);
        self.max_moving_subscales = self.max_moving_subscales.max(run.max_moving_subscales);
        self.pauses += run.pauses;
        self.exited += run.exited;
        self.max_queued = self.max_queued.max(run.max_queued);
        self.refused_heads += run.refused_heads;
        self.split_batches += run.split_batches;
        self.blocked_sends += run.blocked_sends;
        self.max_batch_wait = self.max_batch_wait.max(run.max_batch_wait);
        self.flushed_keys += run.flushed_keys;
        self.handed_timers_record_first += run.handed_timers_record_first;
        self.handed_timers_fired_first += run.handed_timers_fired_first;
        self.processing_timers_fired += run.processing_timers_fired;
        self.handed_processing_timers_fired += run.handed_processing_timers_fired;
        self.consumers_finished += run.consumers_finished;
        self.prepares_after_finish += run.prepares_after_finish;
    }
}

/// A violated invariant, with what is needed to replay it.
#[derive(Clone, Debug)]
pub struct SimFailure {
    /// The configuration that failed.
    pub scenario: Scenario,
    /// The seed.
    pub seed: u64,
    /// The broken variant, if any.
    pub fault: Option<Fault>,
    /// The protocol.
    pub protocol: Protocol,
    /// Operator inputs per upstream task.
    pub inputs: usize,
    /// Whether state outlived its timers ([`SimConfig::state_outlives_timers`]).
    pub state_outlives_timers: bool,
    /// Whether counter keys set processing-time timers ([`SimConfig::processing_timers`]).
    pub processing_timers: bool,
    /// Whether the background drain was on ([`SimConfig::drain`]).
    pub drain: bool,
    /// Koala's bound on held records ([`SimConfig::max_queued_records`]).
    pub max_queued_records: usize,
    /// DRRS: subscales ([`SimConfig::subscales`]).
    pub subscales: usize,
    /// DRRS: the schedule ([`SimConfig::drrs_schedule`]).
    pub drrs_schedule: crate::drrs::DrrsSchedule,
    /// Data channel capacity ([`SimConfig::channel_capacity`]).
    pub channel_capacity: usize,
    /// Whether Koala's look-ahead was on ([`SimConfig::look_ahead`]).
    pub look_ahead: bool,
    /// Consumer tasks ([`SimConfig::consumers`]).
    pub consumers: usize,
    /// Whether every source could end early ([`SimConfig::sources_end_early`]).
    pub sources_end_early: bool,
    /// The step at which the check failed.
    pub step: u64,
    /// What went wrong.
    pub message: String,
}

impl fmt::Display for SimFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let protocol = self.protocol.name();
        write!(f, "{} {protocol} seed {} step {}: {}", self.scenario, self.seed, self.step, self.message)?;
        let fault = self.fault.map(|x| format!(" KOALA_SIM_FAULT={}", x.name())).unwrap_or_default();
        let inputs =
            if self.inputs == 1 { String::new() } else { format!(" KOALA_SIM_INPUTS={}", self.inputs) };
        let outlive = if self.state_outlives_timers { " KOALA_SIM_STATE_OUTLIVES_TIMERS=1" } else { "" };
        let drain = if self.drain { " KOALA_SIM_DRAIN=1" } else { "" };
        let ptimers = if self.processing_timers { " KOALA_SIM_PROCESSING_TIMERS=1" } else { "" };
        let drain =
            if self.look_ahead { drain.to_string() } else { format!("{drain} KOALA_SIM_LOOK_AHEAD=0") };
        let bound = if self.max_queued_records == usize::MAX {
            String::new()
        } else {
            format!(" KOALA_SIM_MAX_QUEUED={}", self.max_queued_records)
        };
        let mut drrs = String::new();
        if self.protocol == Protocol::Drrs && self.subscales != 0 {
            drrs += &format!(" KOALA_SIM_SUBSCALES={}", self.subscales);
        }
        if self.protocol == Protocol::Drrs && self.drrs_schedule != crate::drrs::DrrsSchedule::Ported {
            drrs += &format!(" KOALA_SIM_DRRS_SCHEDULE={}", self.drrs_schedule.name());
        }
        let bound = if self.channel_capacity == 0 {
            bound
        } else {
            format!("{bound} KOALA_SIM_CHANNEL_CAPACITY={}", self.channel_capacity)
        };
        let mut bound = if self.consumers == 1 {
            bound
        } else {
            format!("{bound} KOALA_SIM_CONSUMERS={}", self.consumers)
        };
        if self.sources_end_early {
            bound += " KOALA_SIM_SOURCES_END_EARLY=1";
        }
        write!(
            f,
            "\nreplay: KOALA_SIM_SEED={} KOALA_SIM_SCENARIO={} KOALA_SIM_PROTOCOL={protocol}{inputs}{outlive}{ptimers}{drain}{bound}{drrs}{fault} cargo test -p koala-protocol --test protocol_sim replay -- --ignored --nocapture",
            self.seed, self.scenario
        )
    }
}

/// Runs one simulation.
pub fn run(config: &SimConfig) -> Result<SimStats, SimFailure> {
    let fail = |step, message| SimFailure {
        scenario: config.scenario,
        seed: config.seed,
        fault: config.fault,
        protocol: config.protocol,
        inputs: config.inputs,
        state_outlives_timers: config.state_outlives_timers,
        processing_timers: config.processing_timers,
        drain: config.drain,
        look_ahead: config.look_ahead,
        max_queued_records: config.max_queued_records,
        subscales: config.subscales,
        drrs_schedule: config.drrs_schedule,
        channel_capacity: config.channel_capacity,
        consumers: config.consumers,
        sources_end_early: config.sources_end_early,
        step,
        message,
    };
    let mut world = world::World::new(config.clone()).map_err(|m| fail(0, m))?;
    match world.run() {
        Ok(()) => {
            let mut stats = world.stats.clone();
            stats.steps = world.step;
            stats.skipped = world.skipped;
            Ok(stats)
        }
        Err(message) => Err(fail(world.step, message)),
    }
}
