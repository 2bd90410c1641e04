//! The Koala paper's four real-world queries (§5.1.1, appendix C) over deterministic generators
//! shaped like the public traces they ran on — Twitch audience engagement, New York taxi trips,
//! Azure VM CPU readings, Google Borg task usage — or over those traces themselves, replayed from
//! CSV files ([`csv`]). docs/workloads.md says which of the paper's figures each generator
//! matches and where it differs.
//!
//! Every generated value is a pure function of (seed, event number), and source task `i` of `n`
//! generates the event numbers `i, i + n, i + 2n, …`, so a run's input is the same for any
//! source parallelism and the oracle can recompute it.

pub mod csv;
mod generator;
mod queries;
#[cfg(test)]
mod reference_tests;

pub use generator::{
    Azure, AzureReading, Borg, BorgUsage, RealWorldConfig, TAXI_ZONES, Taxi, TaxiTrip, Twitch, TwitchEvent,
    Workload, events_of,
};
pub use queries::{
    CountState, CsvParams, EngagementState, Input, Loyalty, LoyaltyState, QUERIES, RealWorldParams,
    RouteMedian, TaskUsage, TaxiPartition, ViewerEngagement, VmCpu, build,
};
