//! Deterministic simulation of the protocol cores (docs/testing.md §2): the job's reconfiguration
//! engine with Koala's and stop-and-restart's task cores (and stop-and-restart's in remote mode
//! over a shared store), every scenario over many seeds with all
//! invariants checked on every step, plus broken variants that the checks must catch.
//!
//! A failure prints a one-line replay command, e.g.
//! `KOALA_SIM_SEED=123 KOALA_SIM_SCENARIO=scale_out KOALA_SIM_PROTOCOL=koala cargo test -p koala-protocol --test protocol_sim replay -- --ignored --nocapture`.

use koala_protocol::Protocol;
use koala_protocol::drrs::DrrsSchedule;
use koala_protocol::sim::{Fault, Scenario, SimConfig, SimStats, run};

#[path = "protocol_sim/broken.rs"]
mod broken;
#[path = "protocol_sim/drrs.rs"]
mod drrs;
#[path = "protocol_sim/drrs_exit.rs"]
mod drrs_exit;

const SEEDS: u64 = 1_000;

/// Every scenario once, without the variants that only add keys (`ScaleIn`/`Mixed` with
/// `extra_keys`): the set the stop-and-restart, Remote and DRRS sweeps run.
const EVERY_SHAPE: [Scenario; 6] = [
    Scenario::ScaleOut,
    Scenario::ScaleIn { extra_keys: 0 },
    Scenario::Rebalance,
    Scenario::Migration,
    Scenario::Chain,
    Scenario::Mixed { extra_keys: 0 },
];

fn sweep(scenario: Scenario) -> SimStats {
    sweep_with(scenario, Protocol::Koala)
}

fn sweep_with(scenario: Scenario, protocol: Protocol) -> SimStats {
    sweep_seeds(scenario, protocol, 1, SEEDS)
}

/// Runs seeds `0..seeds` of `scenario` with `inputs` operator inputs per upstream task.
fn sweep_seeds(scenario: Scenario, protocol: Protocol, inputs: usize, seeds: u64) -> SimStats {
    sweep_configs(&SimConfig { protocol, inputs, ..SimConfig::new(scenario, 0) }, seeds)
}

/// Runs seeds `0..seeds` of `config`; panics with the replay command at the first failure.
fn sweep_configs(config: &SimConfig, seeds: u64) -> SimStats {
    let (scenario, protocol, inputs) = (config.scenario, config.protocol, config.inputs);
    let mut total = SimStats::default();
    for seed in 0..seeds {
        match run(&SimConfig { seed, ..config.clone() }) {
            Ok(s) => total.absorb(&s),
            Err(f) => panic!("{f}"),
        }
    }
    let outlive = if config.state_outlives_timers { ", state outliving timers" } else { "" };
    println!(
        "{scenario} under {} with {inputs} input(s){outlive}: {seeds} seeds, {total:?}",
        protocol.name()
    );
    total
}

#[test]
fn scale_out_2_to_4() {
    let s = sweep(Scenario::ScaleOut);
    assert_eq!(s.epochs, SEEDS);
    assert!(s.moved_keys > 0, "some state must move lazily");
    assert!(s.cleared > 0, "windows must fire and delete their keys' state");
    // Local first, then filters (with forced false positives): all of it exercised.
    assert!(s.local_probes > 0 && s.filters_built > 0, "{s:?}");
    assert!(s.not_here > 0, "false positives and missing filters must cost 'not here' answers: {s:?}");
    assert!(s.look_ahead_fetches > 0, "queued records' keys must be asked for ahead of their batch: {s:?}");
}

/// The look-ahead off (a batch asks for its keys only when taken) and on over the scenarios
/// that move state, progressive and bounded included: both keep every invariant, and the
/// switch is honoured (no look-ahead request when off, some when on).
#[test]
fn look_ahead_on_and_off() {
    for scenario in [
        Scenario::ScaleOut,
        Scenario::ScaleIn { extra_keys: 0 },
        Scenario::ScaleIn { extra_keys: 4 },
        Scenario::Mixed { extra_keys: 8 },
    ] {
        let off = sweep_configs(&SimConfig { look_ahead: false, ..SimConfig::new(scenario, 0) }, SEEDS / 4);
        assert_eq!(off.look_ahead_fetches, 0, "{scenario}: look-ahead off, yet it asked: {off:?}");
        let on = SimConfig { max_queued_records: 6, channel_capacity: 2, ..SimConfig::new(scenario, 0) };
        let on = sweep_configs(&on, SEEDS / 4);
        assert!(on.look_ahead_fetches > 0, "{scenario}: bounded, the look-ahead never asked: {on:?}");
    }
}

#[test]
fn scale_in_4_to_2_fetch_on_demand() {
    let s = sweep(Scenario::ScaleIn { extra_keys: 0 });
    assert_eq!(s.extra_keys, 0);
}

#[test]
fn scale_in_4_to_2_progressive() {
    let s = sweep(Scenario::ScaleIn { extra_keys: 4 });
    assert!(s.extra_keys > 0, "progressive migration must move cold keys");
    assert_eq!(s.released, 2 * SEEDS, "both cancelled tasks are released in every run");
    assert_eq!(s.exited, 4 * SEEDS, "every task exits by the runtime's rule in every run");
    // A batch's fetch goes out while a pull to the same location is in flight (pulls never
    // block a batch); their answers come back in order.
    assert!(s.fetches_racing_pulls > 0, "no fetch ever raced a pull: {s:?}");
    // Pulls yield to input: the world fails a run whose task pulls while batches wait for it,
    // and this proves such events happened.
    assert!(s.fed_with_backlog > 0, "no task was ever fed while input waited: {s:?}");
}

/// The background drain of live old owners: scale-out, rebalance, migration, the chain and mixed
/// schedules (with and without progressive migration) end with every bucket in one place.
#[test]
fn background_drain_converges_every_bucket() {
    for scenario in [
        Scenario::ScaleOut,
        Scenario::Rebalance,
        Scenario::Migration,
        Scenario::Chain,
        Scenario::Mixed { extra_keys: 0 },
        Scenario::Mixed { extra_keys: 8 },
    ] {
        let s = sweep_configs(&SimConfig { drain: true, ..SimConfig::new(scenario, 0) }, SEEDS / 2);
        assert!(s.extra_keys > 0, "{scenario}: the drain moved nothing: {s:?}");
    }
}

#[test]
fn rebalance_between_existing_tasks() {
    sweep(Scenario::Rebalance);
}

#[test]
fn task_migration_to_a_new_task() {
    let s = sweep(Scenario::Migration);
    assert_eq!(s.released, SEEDS, "the migrated task is released once drained");
}

/// Random mixed schedules: scale to 1–5 tasks (scale-in then scale-out leaves cold state on
/// retired tasks that new tasks fetch from), rebalance, migrate; on demand only.
#[test]
fn mixed_random_schedules_on_demand_only() {
    let s = sweep(Scenario::Mixed { extra_keys: 0 });
    assert!(s.epochs > 3 * SEEDS, "{s:?}");
}

/// The same with progressive migration.
#[test]
fn mixed_random_schedules_progressive() {
    let s = sweep(Scenario::Mixed { extra_keys: 8 });
    assert!(s.released > 0, "{s:?}");
}

#[test]
fn chain_2_4_6_3_2_one_hop() {
    let s = sweep(Scenario::Chain);
    // A request that would start after every upstream finished is skipped (nothing is left to
    // reconfigure), as the job's coordinator does; most runs complete all four.
    assert_eq!(s.epochs + s.skipped, 4 * SEEDS);
    assert!(s.epochs > 3 * SEEDS, "{s:?}");
}

/// Every key sets timers and none deletes its state, so state outlives its timers: a hand-over
/// carries the timers, the keys' state stays put and is fetched in one hop when a record or a
/// timer needs it, also after its bucket moved on. Chains and mixed schedules hand buckets over again and again.
fn sweep_state_outliving_timers(scenario: Scenario) -> SimStats {
    let config = SimConfig { state_outlives_timers: true, ..SimConfig::new(scenario, 0) };
    let s = sweep_configs(&config, SEEDS);
    assert_eq!(s.cleared, 0, "{scenario}: no timer deletes state: {s:?}");
    assert!(s.moved_keys > 0 && s.fetched_keys > 0, "{scenario}: state must move and be fetched: {s:?}");
    s
}

#[test]
fn state_outliving_timers_chain_2_4_6_3_2() {
    let s = sweep_state_outliving_timers(Scenario::Chain);
    assert_eq!(s.epochs + s.skipped, 4 * SEEDS);
}

#[test]
fn state_outliving_timers_mixed_on_demand_only() {
    let s = sweep_state_outliving_timers(Scenario::Mixed { extra_keys: 0 });
    assert!(s.epochs > 3 * SEEDS, "{s:?}");
}

#[test]
fn state_outliving_timers_mixed_progressive() {
    let s = sweep_state_outliving_timers(Scenario::Mixed { extra_keys: 8 });
    assert!(s.released > 0, "{s:?}");
}

/// Lazy windows: a hand-over brings timers without their keys' state. Over the scenarios that
/// hand buckets over, with one input (tumbling and sliding windows) and two (a window join), some
/// keys' timers fire before any record of them reaches the receiver (the timer's access fetches
/// the state and the watermark waits for it) and some keys are first accessed by a record; every
/// timer fires on its key's whole state (checked on every firing).
#[test]
fn lazy_windows_timers_fire_before_and_after_first_access() {
    for inputs in [1, 2] {
        for scenario in
            [Scenario::ScaleOut, Scenario::Rebalance, Scenario::Chain, Scenario::Mixed { extra_keys: 8 }]
        {
            let s = sweep_seeds(scenario, Protocol::Koala, inputs, SEEDS / 4);
            assert!(
                s.handed_timers_fired_first > 0 && s.handed_timers_record_first > 0,
                "{scenario} with {inputs} input(s): {s:?}"
            );
        }
    }
}

/// Stop-and-restart over the same scenarios: the engine's Prepare → Drain → Resume with the
/// task and upstream cores; every epoch completes and moved state arrives before any record of
/// its bucket.
#[test]
fn stop_and_restart_scale_out_scale_in_rebalance_migration() {
    for scenario in
        [Scenario::ScaleOut, Scenario::ScaleIn { extra_keys: 0 }, Scenario::Rebalance, Scenario::Migration]
    {
        let s = sweep_with(scenario, Protocol::StopAndRestart);
        assert_eq!(
            s.epochs + s.skipped,
            SEEDS,
            "{scenario}: every request completes or finds its input ended"
        );
        assert!(s.moved_keys > 0, "{scenario}: state must move eagerly");
        assert_eq!(s.fetches, 0, "{scenario}: stop-and-restart never fetches");
        assert!(s.cleared > 0, "{scenario}: windows must fire and delete their keys' state");
    }
}

/// Seeds per scenario of the two-input sweeps (every scenario under both protocols).
const TWO_INPUT_SEEDS: u64 = SEEDS;

/// Every scenario of `scenarios` with each upstream task feeding both inputs of the operator
/// (a self-join): two routers per upstream with one table, a marker and an end on each channel,
/// a key's records spread over both inputs; order is checked per (key, input).
fn two_input_sweep(scenarios: &[Scenario], protocol: Protocol) {
    for &scenario in scenarios {
        let s = sweep_seeds(scenario, protocol, 2, TWO_INPUT_SEEDS);
        assert!(s.epochs > 0 && s.cleared > 0, "{scenario}: {s:?}");
        assert!(s.by_input.iter().all(|&n| n > 0), "{scenario}: both inputs must carry records: {s:?}");
        let expected = if scenario == Scenario::Chain { 4 } else { 1 };
        assert!(s.epochs + s.skipped >= expected * TWO_INPUT_SEEDS, "{scenario}: {s:?}");
    }
}

#[test]
fn two_input_scale_out_scale_in_rebalance_migration() {
    two_input_sweep(
        &[
            Scenario::ScaleOut,
            Scenario::ScaleIn { extra_keys: 0 },
            Scenario::ScaleIn { extra_keys: 4 },
            Scenario::Rebalance,
            Scenario::Migration,
        ],
        Protocol::Koala,
    );
}

#[test]
fn two_input_chain_and_mixed_schedules() {
    two_input_sweep(
        &[Scenario::Chain, Scenario::Mixed { extra_keys: 0 }, Scenario::Mixed { extra_keys: 8 }],
        Protocol::Koala,
    );
}

/// Stop-and-restart ignores N, so `scale_in_n4` and `mixed_n8` would replay `scale_in_n0` and
/// `mixed_n0` seed for seed.
#[test]
fn two_input_stop_and_restart_every_scenario() {
    two_input_sweep(&EVERY_SHAPE, Protocol::StopAndRestart);
}

#[test]
fn stop_and_restart_chain_and_mixed_schedules() {
    let chain = sweep_with(Scenario::Chain, Protocol::StopAndRestart);
    assert_eq!(chain.epochs + chain.skipped, 4 * SEEDS);
    let mixed = sweep_with(Scenario::Mixed { extra_keys: 0 }, Protocol::StopAndRestart);
    assert!(mixed.epochs > 3 * SEEDS, "{mixed:?}");
}

/// Koala tasks exit by the runtime's rule in every sweep, and nothing may ask an exited task for
/// state. Seed 288 of `scale_in_n4`: a task reported `InputsEnded` before the epoch's `Prepare`
/// reached it, then received buckets in the epoch; its stale report released every task after the
/// epoch, and it sent a filter request and a pull to a cancelled task that had exited. The report
/// no longer counts (the engine drops a participant's report older than the epoch it starts) and
/// the task reports again after its part (`TaskLife::started`).
#[test]
fn koala_a_stale_inputs_ended_releases_nobody_another_task_still_pulls_from() {
    let s = run(&SimConfig::new(Scenario::ScaleIn { extra_keys: 4 }, 288)).unwrap_or_else(|f| panic!("{f}"));
    assert!(s.exited > 0 && s.extra_keys > 0, "{s:?}");
}

/// The Remote baseline: stop-and-restart's phases and cores in remote mode over a shared store
/// (each task's store is its write-back buffer, overflowing at random steps): every epoch
/// completes, no state moves between tasks, old owners flush buffered keys of the buckets they
/// give away, and every record reads the count all earlier records of its key left.
#[test]
fn remote_every_scenario() {
    for scenario in EVERY_SHAPE {
        let s = sweep_with(scenario, Protocol::Remote);
        let per_seed = if scenario == Scenario::Chain { 4 } else { 1 };
        assert!(s.epochs + s.skipped >= per_seed * SEEDS, "{scenario}: {s:?}");
        assert_eq!((s.moved_keys, s.fetches), (0, 0), "{scenario}: remote moves and fetches no state");
        assert!(s.flushed_keys > 0, "{scenario}: old owners must have flushed buffered keys: {s:?}");
        assert!(s.cleared > 0, "{scenario}: windows must fire and delete their keys' state");
    }
    let two = sweep_seeds(Scenario::Mixed { extra_keys: 0 }, Protocol::Remote, 2, SEEDS);
    assert!(two.flushed_keys > 0 && two.by_input.iter().all(|&n| n > 0), "{two:?}");
}

/// Counter keys also set processing-time timers: a hand-over carries them without their keys'
/// state, and each fires only once its key's whole state is at its task (the world checks every
/// firing), also after its bucket moved on again. Some must fire while the run goes on, and some
/// of those must have come with a hand-over before their state did; a run that reports none did
/// not exercise the lazy path.
#[test]
fn processing_time_timers_fire_on_their_keys_state_chain_and_mixed() {
    for scenario in [Scenario::Chain, Scenario::Mixed { extra_keys: 0 }] {
        let config = SimConfig { processing_timers: true, ..SimConfig::new(scenario, 0) };
        let s = sweep_configs(&config, SEEDS);
        assert!(s.processing_timers_fired > 0, "{scenario}: {s:?}");
        assert!(s.handed_processing_timers_fired > 0, "{scenario}: no handed timer fired first: {s:?}");
    }
}

/// A tool, not a test: replays one seed from the environment (see the module docs).
#[test]
#[ignore = "a replay tool; run with KOALA_SIM_SEED set and --ignored"]
fn replay() {
    let seed = std::env::var("KOALA_SIM_SEED").expect("set KOALA_SIM_SEED to the seed to replay");
    let seed: u64 = seed.parse().expect("KOALA_SIM_SEED is a number");
    let name = std::env::var("KOALA_SIM_SCENARIO").unwrap_or_else(|_| "scale_out".into());
    let scenario = Scenario::parse(&name).expect("KOALA_SIM_SCENARIO names a scenario");
    let protocol = match std::env::var("KOALA_SIM_PROTOCOL").as_deref() {
        Ok("stop-and-restart") => Protocol::StopAndRestart,
        Ok("drrs") => Protocol::Drrs,
        Ok("remote") => Protocol::Remote,
        Ok("koala") | Err(_) => Protocol::Koala,
        Ok(other) => panic!("KOALA_SIM_PROTOCOL is koala, stop-and-restart, remote or drrs, not {other}"),
    };
    let fault = std::env::var("KOALA_SIM_FAULT")
        .ok()
        .map(|f| Fault::parse(&f).expect("KOALA_SIM_FAULT names a fault"));
    let inputs = env_or("KOALA_SIM_INPUTS", 1);
    let state_outlives_timers = env_or("KOALA_SIM_STATE_OUTLIVES_TIMERS", 0) != 0;
    let drain = env_or("KOALA_SIM_DRAIN", 0) != 0;
    let processing_timers = env_or("KOALA_SIM_PROCESSING_TIMERS", 0) != 0;
    let mut config = SimConfig {
        fault,
        protocol,
        inputs,
        state_outlives_timers,
        processing_timers,
        drain,
        ..SimConfig::new(scenario, seed)
    };
    config.subscales = env_or("KOALA_SIM_SUBSCALES", config.subscales);
    if let Ok(name) = std::env::var("KOALA_SIM_DRRS_SCHEDULE") {
        config.drrs_schedule =
            DrrsSchedule::parse(&name).expect("KOALA_SIM_DRRS_SCHEDULE is ported or overlapping");
    }
    config.max_queued_records = env_or("KOALA_SIM_MAX_QUEUED", config.max_queued_records);
    config.channel_capacity = env_or("KOALA_SIM_CHANNEL_CAPACITY", config.channel_capacity);
    config.look_ahead = env_or("KOALA_SIM_LOOK_AHEAD", 1) != 0;
    config.consumers = env_or("KOALA_SIM_CONSUMERS", config.consumers);
    config.sources_end_early = env_or("KOALA_SIM_SOURCES_END_EARLY", 0) != 0;
    match run(&config) {
        Ok(stats) => println!("{scenario} seed {seed} passes: {stats:?}"),
        Err(f) => panic!("{f}"),
    }
}

/// A longer sweep for soak runs:
/// `KOALA_SIM_SEEDS=100000 cargo test --release -p koala-protocol --test protocol_sim deep_sweep -- --ignored`.
#[test]
#[ignore = "soak test; run explicitly"]
fn deep_sweep() {
    let seeds: u64 = env_or("KOALA_SIM_SEEDS", 20_000);
    let inputs: usize = env_or("KOALA_SIM_INPUTS", 1);
    let state_outlives_timers = env_or("KOALA_SIM_STATE_OUTLIVES_TIMERS", 0) != 0;
    let processing_timers = env_or("KOALA_SIM_PROCESSING_TIMERS", 0) != 0;
    let drain = env_or("KOALA_SIM_DRAIN", 0) != 0;
    let overlapping = DrrsSchedule::Overlapping;
    for (scenario, protocol, drrs_schedule) in Scenario::ALL.into_iter().flat_map(|s| {
        [
            (s, Protocol::Koala, DrrsSchedule::Ported),
            (s, Protocol::StopAndRestart, DrrsSchedule::Ported),
            (s, Protocol::Drrs, DrrsSchedule::Ported),
            (s, Protocol::Drrs, overlapping),
        ]
    }) {
        for seed in SEEDS..SEEDS + seeds {
            let mut config = SimConfig {
                protocol,
                drrs_schedule,
                inputs,
                state_outlives_timers,
                processing_timers,
                drain,
                ..SimConfig::new(scenario, seed)
            };
            config.upstreams = env_or("KOALA_SIM_UPSTREAMS", config.upstreams);
            config.keys = env_or("KOALA_SIM_KEYS", config.keys);
            config.records_per_upstream = env_or("KOALA_SIM_RECORDS", config.records_per_upstream);
            if let Err(f) = run(&config) {
                panic!("{f}");
            }
        }
    }
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

/// Koala with a tiny `max_queued_records` (1–4), one and two inputs, and data channels that hold
/// 1 or 2 messages with upstreams that block on a full one (as the runtime's threads do) or
/// unbounded ones: no task ever holds more than the bound (the harness checks it after every
/// event, and a batch that does not fit is taken in part), a task refuses the head of a channel
/// whose record would park past the bound while it takes the others, and every scenario still
/// completes every reconfiguration with every invariant — no backpressure deadlock (the harness
/// fails a run whose only deliverable messages wait behind a refusing task or a blocked upstream).
#[test]
fn koala_with_a_bounded_inbox_completes_every_reconfiguration() {
    for max_queued_records in 1..=4 {
        for inputs in [1, 2] {
            let mut total = SimStats::default();
            for scenario in Scenario::ALL {
                for seed in 0..SEEDS / 16 {
                    let channel_capacity = [1, 2, 0][seed as usize % 3];
                    let config = SimConfig {
                        inputs,
                        max_queued_records,
                        channel_capacity,
                        ..SimConfig::new(scenario, seed)
                    };
                    let s = run(&config)
                        .unwrap_or_else(|f| panic!("max_queued_records = {max_queued_records}: {f}"));
                    total.absorb(&s);
                }
            }
            let SimStats { epochs, pauses, refused_heads, split_batches, blocked_sends, max_queued, .. } =
                total;
            println!(
                "bound {max_queued_records}, {inputs} input(s): {epochs} epochs, {pauses} pauses, {refused_heads} steps with a refused channel head, {split_batches} batches split, {blocked_sends} blocked sends, at most {max_queued} records held"
            );
            assert!(max_queued <= max_queued_records, "bound {max_queued_records}: {max_queued} held");
            assert_eq!(max_queued, max_queued_records, "bound {max_queued_records}: never reached");
            assert!(pauses > 0, "bound {max_queued_records}: no task ever stopped taking data");
            assert!(refused_heads > 0, "bound {max_queued_records}: no channel head was ever refused");
            assert!(split_batches > 0, "bound {max_queued_records}: no batch was taken in part");
            assert!(blocked_sends > 0, "bound {max_queued_records}: no upstream ever blocked");
        }
    }
}

/// Two consumer tasks behind the operator, and sources that may all end while reconfigurations
/// are requested or running, under every protocol: every output reaches a consumer exactly once,
/// on a channel it was told about, and some consumers finish after a `Prepare` went out (they
/// never answer it; the engine forgets them when it hears they finished) yet every run ends.
#[test]
fn consumers_finish_early_under_every_protocol() {
    for protocol in [Protocol::Koala, Protocol::StopAndRestart, Protocol::Remote, Protocol::Drrs] {
        let mut early = 0;
        for scenario in [Scenario::ScaleOut, Scenario::Chain, Scenario::Mixed { extra_keys: 2 }] {
            let config =
                SimConfig { protocol, consumers: 2, sources_end_early: true, ..SimConfig::new(scenario, 0) };
            let stats = sweep_configs(&config, 200);
            assert!(stats.consumers_finished >= 2 * 200, "{scenario} {}: {stats:?}", protocol.name());
            early += stats.prepares_after_finish;
        }
        assert!(early > 0, "no consumer finished after a Prepare went out under {}", protocol.name());
    }
}
