//! DRRS under the simulator: every scenario, the wait buffer's bound, overlapping subscales,
//! grouped subscales and two inputs.

use koala_protocol::Protocol;
use koala_protocol::drrs::DrrsSchedule;
use koala_protocol::sim::{Scenario, SimConfig, run};

use super::*;

/// DRRS over every scenario (it ignores N, so `scale_in_n4` and `mixed_n8` replay `scale_in_n0`
/// and `mixed_n0` seed for seed): every request completes or finds its input ended, whole
/// buckets are pushed, records wait out of order and receivers refuse records past their wait
/// buffer.
#[test]
fn drrs_every_scenario() {
    let (mut pauses, mut refused) = (0, 0);
    for scenario in EVERY_SHAPE {
        let s = sweep_with(scenario, Protocol::Drrs);
        let expected = if scenario == Scenario::Chain { 4 * SEEDS } else { SEEDS };
        assert!(s.epochs + s.skipped >= expected, "{scenario}: {s:?}");
        assert!(s.pushed_buckets > 0 && s.moved_keys > 0, "{scenario}: state must be pushed: {s:?}");
        assert_eq!(s.fetches, 0, "{scenario}: DRRS never fetches");
        assert!(s.waited > 0, "{scenario}: records must wait out of order: {s:?}");
        assert!(s.cleared > 0, "{scenario}: windows must fire and delete their keys' state");
        pauses += s.pauses;
        refused += s.refused_heads;
    }
    assert!(pauses > 0 && refused > 0, "backpressure never set in: {pauses} pauses, {refused} refusals");
}

/// A DRRS task holds at most `wait_records` records, those its senders forwarded
/// included (credit), under both schedules, with one and two inputs, and with upstreams that block
/// on full one- or two-message channels (or unbounded ones): the harness checks every task's
/// records against its bound after every event, takes refused batches in part, and fails a run
/// that deadlocks. The buffer fills to its bound and records are refused at channel heads.
#[test]
fn drrs_wait_buffer_bounds_every_record_it_holds() {
    for drrs_schedule in DrrsSchedule::ALL {
        for wait_records in [4, 16] {
            let mut total = SimStats::default();
            for inputs in [1, 2] {
                for scenario in Scenario::ALL {
                    for seed in 0..SEEDS / 40 {
                        let config = SimConfig {
                            protocol: Protocol::Drrs,
                            drrs_schedule,
                            wait_records,
                            inputs,
                            channel_capacity: [1, 2, 0][seed as usize % 3],
                            ..SimConfig::new(scenario, seed)
                        };
                        let s = run(&config).unwrap_or_else(|f| panic!("wait_records = {wait_records}: {f}"));
                        total.absorb(&s);
                    }
                }
            }
            let SimStats { epochs, waited, refused_heads, split_batches, blocked_sends, max_queued, .. } =
                total;
            println!(
                "{} schedule, wait_records {wait_records}: {epochs} epochs, {waited} records waited, {refused_heads} steps with a refused channel head, {split_batches} batches split, {blocked_sends} blocked sends, at most {max_queued} records held",
                drrs_schedule.name()
            );
            assert!(max_queued <= wait_records, "{max_queued} held past {wait_records}");
            assert!(
                max_queued * 2 >= wait_records,
                "the buffer never filled: {max_queued} of {wait_records}"
            );
            assert!(refused_heads > 0 && split_batches > 0 && blocked_sends > 0, "{total:?}");
        }
    }
}

/// DRRS under the original DRRS's overlapping schedule over every scenario: single-pair subscales,
/// several running at once — a task sends or receives in two at once (the
/// ported schedule never runs two), never in more — and every invariant holds.
#[test]
fn drrs_overlapping_every_scenario() {
    let (mut running, mut moving) = (0, 0);
    for scenario in Scenario::ALL {
        for inputs in [1, 2] {
            let config = SimConfig {
                protocol: Protocol::Drrs,
                drrs_schedule: DrrsSchedule::Overlapping,
                inputs,
                ..SimConfig::new(scenario, 0)
            };
            let s = sweep_configs(&config, SEEDS / 4);
            assert!(s.pushed_buckets > 0 && s.epochs > 0, "{scenario}: {s:?}");
            assert!(s.max_moving_subscales <= 2, "{scenario}: a task moved in more than two: {s:?}");
            running = running.max(s.max_running_subscales);
            moving = moving.max(s.max_moving_subscales);
        }
    }
    assert!(running >= 2 && moving == 2, "subscales never overlapped: {running} running, {moving} moving");
    let ported =
        sweep_configs(&SimConfig { protocol: Protocol::Drrs, ..SimConfig::new(Scenario::Chain, 0) }, 50);
    assert_eq!((ported.max_running_subscales, ported.max_moving_subscales), (1, 1), "{ported:?}");
}

/// DRRS with two subscales whatever the pairs (several pairs per subscale, a task sending and
/// receiving in one) and a wait buffer that stops direct input at the first record waiting for
/// state, and with a self-join's two inputs.
#[test]
fn drrs_grouped_subscales_and_two_inputs() {
    for scenario in [Scenario::Rebalance, Scenario::Chain, Scenario::Mixed { extra_keys: 0 }] {
        let config = SimConfig {
            protocol: Protocol::Drrs,
            subscales: 2,
            wait_records: 0,
            ..SimConfig::new(scenario, 0)
        };
        let s = sweep_configs(&config, SEEDS);
        assert!(s.pushed_buckets > 0 && s.epochs > 0, "{scenario}: {s:?}");
        assert!(s.refused_heads > 0, "{scenario}: backpressure must set in: {s:?}");
    }
    for scenario in
        [Scenario::ScaleOut, Scenario::ScaleIn { extra_keys: 0 }, Scenario::Mixed { extra_keys: 0 }]
    {
        let s = sweep_seeds(scenario, Protocol::Drrs, 2, SEEDS);
        assert!(s.by_input.iter().all(|&n| n > 0), "{scenario}: {s:?}");
    }
}
