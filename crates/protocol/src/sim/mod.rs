//! A deterministic simulator for the protocol cores (docs/testing.md §2): the job's
//! reconfiguration engine (`crate::engine`, the one `crates/coordinator` runs) with Koala's task
//! cores or stop-and-restart's, the upstream routers and pause cores.
//!
//! One keyed operator with 16 buckets runs as target tasks behind two upstream tasks; every channel
//! (data, peer, state fetch, control, acks) is a FIFO queue. Each step delivers the head of a
//! randomly chosen non-empty channel, lets a source emit, or gives a task an idle turn, driven by a
//! seeded splitmix64 generator, so a seed replays exactly and many seeds explore the interleavings
//! per-channel FIFO allows. The operator is a per-key counter whose output is (key, count after the
//! record); invariants are checked on every step (see `checks.rs`).
//!
//! ```
//! use koala_protocol::Protocol;
//! use koala_protocol::sim::{Scenario, SimConfig, run};
//! let stats = run(&SimConfig::new(Scenario::ScaleOut, 7)).expect("seed 7 passes");
//! assert_eq!(stats.epochs, 1);
//! let config = SimConfig { protocol: Protocol::StopAndRestart, ..SimConfig::new(Scenario::Chain, 7) };
//! assert_eq!(run(&config).expect("seed 7 passes").epochs, 4);
//! ```

mod checks;
mod rng;
mod scenario;
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
            _ => None,
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
    /// Distinct keys (key `k` is produced by upstream `k % upstreams`).
    pub keys: usize,
    /// Records each upstream emits.
    pub records_per_upstream: usize,
    /// Buckets of the operator.
    pub num_buckets: u16,
    /// Give up after this many steps.
    pub max_steps: u64,
    /// The protocol the target tasks run.
    pub protocol: Protocol,
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
            records_per_upstream: 40,
            num_buckets: 16,
            max_steps: 20_000,
            protocol: Protocol::Koala,
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
    /// Whether the run used progressive migration (N > 0) and cancelled tasks.
    pub progressive: bool,
    /// Requests skipped because every upstream had finished before they could start.
    pub skipped: u64,
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
    /// The step at which the check failed.
    pub step: u64,
    /// What went wrong.
    pub message: String,
}

impl fmt::Display for SimFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let protocol = self.protocol.name();
        write!(f, "{} {protocol} seed {} step {}: {}", self.scenario, self.seed, self.step, self.message)?;
        let fault = match self.fault {
            Some(Fault::SwitchBeforePeerReady) => " KOALA_SIM_FAULT=switch_before_peer_ready",
            Some(Fault::NoParking) => " KOALA_SIM_FAULT=no_parking",
            Some(Fault::NoTimerFiringAtHandOver) => " KOALA_SIM_FAULT=no_timer_firing_at_hand_over",
            Some(Fault::ReleaseWithoutEpoch) => " KOALA_SIM_FAULT=release_without_epoch",
            Some(Fault::RerouteAtDrain) => " KOALA_SIM_FAULT=reroute_at_drain",
            None => "",
        };
        write!(
            f,
            "\nreplay: KOALA_SIM_SEED={} KOALA_SIM_SCENARIO={} KOALA_SIM_PROTOCOL={protocol}{fault} cargo test -p koala-protocol --test protocol_sim replay -- --ignored --nocapture",
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
