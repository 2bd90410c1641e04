//! Broken variants of the protocol cores and the simulator's harness (`Fault`): each must be
//! caught by the invariant checks, so the checks are shown to bite.

use koala_protocol::Protocol;
use koala_protocol::sim::{Fault, Scenario, SimConfig, run};

/// A DRRS receiver that processes records of a bucket whose state has not arrived: it works on
/// state it does not hold.
#[test]
fn broken_drrs_process_before_state_is_caught() {
    let failure = caught_under(Protocol::Drrs, Fault::ProcessBeforeState);
    println!("{failure}");
    assert!(
        failure.contains("single owner")
            || failure.contains("per-key order")
            || failure.contains("one live copy"),
        "{failure}"
    );
}

/// DRRS receivers that lend unbounded credit (forwarded records uncounted, as before the
/// bounded wait buffer): a receiver holds more than `wait_records`, which the harness's bound check catches.
#[test]
fn broken_drrs_unbounded_credit_is_caught() {
    let failure = (0..300)
        .find_map(|seed| {
            let config = SimConfig {
                protocol: Protocol::Drrs,
                fault: Some(Fault::UnboundedCredit),
                wait_records: 2,
                ..SimConfig::new(Scenario::ScaleOut, seed)
            };
            run(&config).err()
        })
        .expect("the bound check never caught unbounded credit in 300 seeds");
    println!("{failure}");
    assert!(failure.message.contains("bounded wait buffer"), "{failure}");
}

/// A DRRS receiver that emits watermarks before a moved bucket's state and timers arrived (DRRS
/// without the paper's watermark propagation): the timers arrive behind its event time.
#[test]
fn broken_drrs_watermark_before_state_is_caught() {
    let failure = caught_under(Protocol::Drrs, Fault::WatermarkBeforeState);
    println!("{failure}");
    assert!(failure.contains("timers:") || failure.contains("watermark"), "{failure}");
}

/// Remote whose old owners send `StateEnd` before writing back what they buffered: a new owner
/// reads a key whose latest value is still in the old owner's buffer (or deletes it while the
/// old owner's copy survives).
#[test]
fn broken_remote_flush_after_state_end_is_caught() {
    let failure = caught_under(Protocol::Remote, Fault::FlushAfterStateEnd);
    println!("{failure}");
    // The stale buffered copy is read ("one live copy", a wrong count) or outlives a delete.
    assert!(["one live copy", "count", "deletes"].iter().any(|m| failure.contains(m)), "{failure}");
}

fn caught(fault: Fault) -> String {
    caught_under(Protocol::Koala, fault)
}

/// The first failure the checks report for `fault` under `protocol`, searching 300 seeds of the
/// scenarios that move state.
fn caught_under(protocol: Protocol, fault: Fault) -> String {
    for scenario in [Scenario::Rebalance, Scenario::ScaleOut, Scenario::ScaleIn { extra_keys: 0 }] {
        for seed in 0..300 {
            let config = SimConfig { fault: Some(fault), protocol, ..SimConfig::new(scenario, seed) };
            if let Err(f) = run(&config) {
                return f.to_string();
            }
        }
    }
    panic!("the checks never caught {fault:?} under {protocol:?} in 300 seeds per scenario");
}

#[test]
fn broken_switch_before_peer_ready_is_caught() {
    println!("{}", caught(Fault::SwitchBeforePeerReady));
}

#[test]
fn broken_no_timer_firing_at_hand_over_is_caught() {
    let failure = caught(Fault::NoTimerFiringAtHandOver);
    println!("{failure}");
    assert!(failure.contains("timers:"), "{failure}");
}

#[test]
fn broken_release_without_epoch_is_caught() {
    let mut found = None;
    for scenario in [Scenario::Mixed { extra_keys: 0 }, Scenario::Mixed { extra_keys: 8 }, Scenario::Chain] {
        for seed in 0..300 {
            let config =
                SimConfig { fault: Some(Fault::ReleaseWithoutEpoch), ..SimConfig::new(scenario, seed) };
            if let Err(f) = run(&config) {
                found = Some(f.to_string());
                break;
            }
        }
        if found.is_some() {
            break;
        }
    }
    let failure = found.expect("the checks never caught a release on drain reports of an older epoch");
    println!("{failure}");
}

/// Stop-and-restart whose upstreams switch routing at `Drain` instead of pausing until the
/// moved state arrived: a receiver processes a moved bucket's records before its state.
#[test]
fn broken_stop_and_restart_reroute_at_drain_is_caught() {
    let failure = caught_under(Protocol::StopAndRestart, Fault::RerouteAtDrain);
    println!("{failure}");
    // Records of a moved bucket overtake its state (per-key order, or two owners), or its
    // timers arrive behind the receiver's event time.
    assert!(
        failure.contains("single owner") || failure.contains("per-key order") || failure.contains("timers:"),
        "{failure}"
    );
}

/// Stop-and-restart tasks that exit as soon as their inputs ended instead of waiting for the
/// coordinator's release: a reconfiguration started just before the coordinator heard of the
/// end sends one of them a `Prepare` it never answers, and the epoch never completes (the
/// runtime's coordinator then failed the job after `reconfiguration_timeout_s`).
#[test]
fn broken_stop_and_restart_exit_without_release_is_caught() {
    let failure = caught_under(Protocol::StopAndRestart, Fault::ExitWithoutRelease);
    println!("{failure}");
    assert!(failure.contains("did not complete") && failure.contains("Prepared"), "{failure}");
}

/// A location that answers a fetch but keeps what it answered: the key lives twice.
#[test]
fn broken_serve_without_delete_is_caught() {
    let failure = caught(Fault::ServeWithoutDelete);
    println!("{failure}");
    assert!(failure.contains("one live copy"), "{failure}");
}

/// A receiver that lets the timers a hand-over brought fire without accessing their keys: the
/// window fires on state that is still at the sender.
#[test]
fn broken_timer_before_access_is_caught() {
    let failure = caught(Fault::TimerBeforeAccess);
    println!("{failure}");
    assert!(failure.contains("lazy timers:"), "{failure}");
}

/// A membership filter that leaves out a key its location holds: the owner creates the key anew
/// while its state sits at the location.
#[test]
fn broken_filter_missing_a_key_is_caught() {
    let failure = caught(Fault::FilterMissesKey);
    println!("{failure}");
    assert!(
        ["final count", "one live copy", "one hop", "lazy timers"].iter().any(|m| failure.contains(m)),
        "{failure}"
    );
}

#[test]
fn broken_no_parking_is_caught() {
    let failure = caught(Fault::NoParking);
    println!("{failure}");
    assert!(failure.contains("per-key order") || failure.contains("watermark"), "{failure}");
}

/// The rule tried and reverted on 2026-12-02 (`Fault::HoldBackAfterMarker`: channels whose marker
/// is in wait at their senders until the task's markers are all in, parked records uncounted
/// meanwhile) deadlocks a self-join under bound 2 with upstreams that block on one-message
/// channels, the hang the runtime showed in 1 of 5 oracle runs.
#[test]
fn the_reverted_hold_back_rule_deadlocks_a_self_join_with_blocking_senders() {
    let (mut deadlocks, mut runs) = (0, 0);
    let mut first = None;
    for scenario in Scenario::ALL {
        for seed in 0..10 {
            let config = SimConfig {
                inputs: 2,
                max_queued_records: 2,
                channel_capacity: 1,
                fault: Some(Fault::HoldBackAfterMarker),
                ..SimConfig::new(scenario, seed)
            };
            runs += 1;
            if let Err(f) = run(&config) {
                assert!(f.message.contains("backpressure deadlock"), "{f}");
                deadlocks += 1;
                first.get_or_insert(f.to_string());
            }
        }
    }
    println!("{deadlocks} of {runs} runs deadlocked; first: {}", first.unwrap_or_default());
    assert!(deadlocks > 0, "the reverted rule never deadlocked");
}

/// A consumer that finished is not reported to the coordinator: a reconfiguration whose `Prepare`
/// reached it after it finished waits for its `Prepared` forever, and the run does not end.
#[test]
fn broken_consumer_finish_unreported_is_caught() {
    let failure = consumer_fault_caught(Fault::ConsumerFinishUnreported);
    println!("{failure}");
    assert!(failure.contains("did not complete") || failure.contains("no quiescence"), "{failure}");
}

/// Consumers not told the created tasks' channels at `Prepare`: a created task's output comes
/// on a channel its consumer does not know.
#[test]
fn broken_consumer_misses_created_inputs_is_caught() {
    let failure = consumer_fault_caught(Fault::ConsumerMissesCreatedInputs);
    println!("{failure}");
    assert!(failure.contains("consumer:"), "{failure}");
}

/// The first failure of `fault` with two consumers and sources that may end early, under each
/// protocol in turn (every protocol must catch it; DRRS tasks taking part in a reconfiguration
/// end late, so its consumers rarely finish after a `Prepare`: it needs the mixed schedules).
fn consumer_fault_caught(fault: Fault) -> String {
    let mut first = None;
    for protocol in [Protocol::Koala, Protocol::StopAndRestart, Protocol::Remote, Protocol::Drrs] {
        let scenarios = [Scenario::ScaleOut, Scenario::Chain, Scenario::Mixed { extra_keys: 2 }];
        let failure = scenarios
            .into_iter()
            .flat_map(|scenario| (0..300).map(move |seed| SimConfig::new(scenario, seed)))
            .find_map(|base| {
                let config =
                    SimConfig { protocol, fault: Some(fault), consumers: 2, sources_end_early: true, ..base };
                run(&config).err()
            })
            .unwrap_or_else(|| {
                panic!("{} was never caught under {} in 900 runs", fault.name(), protocol.name())
            });
        first.get_or_insert(failure.to_string());
    }
    first.unwrap_or_default()
}
