//! DRRS tasks exit by the runtime's rule (`koala_protocol::drrs::DrrsLife`), which the simulator
//! checks after every event: seeds that found a task exiting too early.

use koala_protocol::Protocol;
use koala_protocol::sim::{Scenario, SimConfig, run};

/// A task whose inputs all ended exited at once, unreleased, while the coordinator's `Prepare`
/// (sent before it heard that the upstreams finished) waited in its queue: the reconfiguration
/// waited for its `Prepared` forever, and the tasks it created never started, so never exited.
/// The task now reports `InputsEnded` and exits once released, which never happens while a
/// reconfiguration runs. Seed 486 of `scale_out`; seed 688 of `rebalance` with two subscales.
#[test]
fn drrs_a_task_whose_inputs_ended_answers_a_prepare_sent_meanwhile() {
    let scale_out = SimConfig { protocol: Protocol::Drrs, ..SimConfig::new(Scenario::ScaleOut, 486) };
    let rebalance = SimConfig {
        protocol: Protocol::Drrs,
        subscales: 2,
        wait_records: 0,
        ..SimConfig::new(Scenario::Rebalance, 688)
    };
    for config in [scale_out, rebalance] {
        let s = run(&config).unwrap_or_else(|f| panic!("{f}"));
        assert!(s.epochs > 0 && s.pushed_buckets > 0, "{s:?}");
    }
}
