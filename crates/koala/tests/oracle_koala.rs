//! Koala × {scale-out, scale-in, rebalance, task migration} × {keyed aggregate, last-N list
//! state, tumbling window, sliding window, window join}, judged by the oracle, plus repeated
//! reconfigurations (one-hop fetch, progressive migration), the delete-then-return case, and a
//! self-join rescaled and rebalanced with and without progressive migration.
//! Every run uses 2 worker processes over loopback TCP.

mod common;

use common::oracle::{Case, check};

oracle_matrix!("koala");

/// 2→4→6→3→2 in one run: keys fetched in one hop from wherever they are after several moves;
/// cancelled tasks drained by progressive migration (8 extra keys per fetch).
#[test]
fn chain_2_4_6_3_2_keyed_aggregate() {
    check(&Case {
        protocol: "koala",
        top: "",
        query: "keyed-aggregate",
        start: &[("source", 2), ("aggregate", 2), ("sink", 1)],
        end: &[("source", 2), ("aggregate", 2), ("sink", 1)],
        schedule: "[[reconfigurations]]\nat_s = 0.3\noperator = \"aggregate\"\nparallelism = 4\n\
                   [[reconfigurations]]\nat_s = 0.7\noperator = \"aggregate\"\nparallelism = 6\n\
                   [[reconfigurations]]\nat_s = 1.1\noperator = \"aggregate\"\nparallelism = 3\n\
                   [[reconfigurations]]\nat_s = 1.5\noperator = \"aggregate\"\nparallelism = 2\n",
        params: "",
        records: 20_000,
        seed: 5,
        expect_reconfigurations: 4,
    });
}

/// The same chain with fetch on demand only (no progressive migration): cancelled tasks keep
/// serving until the input ends.
#[test]
fn chain_2_4_6_3_2_last_n_on_demand_only() {
    check(&Case {
        protocol: "koala",
        top: "extra_keys = 0\n",
        query: "last-n",
        start: &[("source", 2), ("last_n", 2), ("sink", 1)],
        end: &[("source", 2), ("last_n", 2), ("sink", 1)],
        schedule: "[[reconfigurations]]\nat_s = 0.3\noperator = \"last_n\"\nparallelism = 4\n\
                   [[reconfigurations]]\nat_s = 0.7\noperator = \"last_n\"\nparallelism = 6\n\
                   [[reconfigurations]]\nat_s = 1.1\noperator = \"last_n\"\nparallelism = 3\n\
                   [[reconfigurations]]\nat_s = 1.5\noperator = \"last_n\"\nparallelism = 2\n",
        params: "last_n = 3\n",
        records: 20_000,
        seed: 6,
        expect_reconfigurations: 4,
    });
}

/// A scale-out with the background drain of live old owners on: the old tasks' state moves to the
/// new ones without records asking for it (the run must report pulled bytes), and the output is
/// the same as without any reconfiguration.
#[test]
fn scale_out_with_background_drain() {
    check(&Case {
        protocol: "koala",
        top: "drain_keys_per_sec = 20000
",
        query: "keyed-aggregate",
        start: &[("source", 2), ("aggregate", 2), ("sink", 1)],
        end: &[("source", 2), ("aggregate", 4), ("sink", 1)],
        schedule: "[[reconfigurations]]\nat_s = 0.4\noperator = \"aggregate\"\nparallelism = 4\n",
        params: "",
        records: 16_000,
        seed: 9,
        expect_reconfigurations: 1,
    });
}

/// Two operators reconfigured together: both requests run back to back (epochs 1 and 2), the
/// second starting while the first one's state still moves lazily; the second operator's
/// upstream is the first one, so it also learns new input channels.
#[test]
fn two_operators_reconfigured_together() {
    check(&Case {
        protocol: "koala",
        top: "",
        query: "two-stage-aggregate",
        start: &[("source", 2), ("aggregate", 2), ("rollup", 2), ("sink", 1)],
        end: &[("source", 2), ("aggregate", 4), ("rollup", 3), ("sink", 1)],
        schedule: "[[reconfigurations]]\nat_s = 0.6\noperator = \"aggregate\"\nparallelism = 4\n\
                   [[reconfigurations]]\nat_s = 0.6\noperator = \"rollup\"\nparallelism = 3\n",
        params: "",
        records: 16_000,
        seed: 3,
        expect_reconfigurations: 2,
    });
}

/// A self-join (one upstream operator on both inputs) scaled out, rebalanced and scaled in, with
/// fetch on demand only: markers and ends of stream are counted per channel, not per upstream.
#[test]
fn self_join_rescaled_and_rebalanced_on_demand_only() {
    common::oracle::self_join_rescaled_and_rebalanced("koala", "extra_keys = 0\n");
}

/// The same with progressive migration (8 extra keys per fetch).
#[test]
fn self_join_rescaled_and_rebalanced_progressive() {
    common::oracle::self_join_rescaled_and_rebalanced("koala", "extra_keys = 8\n");
}

/// The self-join with a bound of 2 held records per task (`max_queued_records`): a task stops
/// taking data input while it holds two, and its rebalance, in which tasks hand buckets to each
/// other with two channels from each upstream, completes (the simulator deadlocked exactly this
/// at bound 1 when parked records counted before a task's own markers were in).
#[test]
fn self_join_rescaled_and_rebalanced_with_a_queue_bound_of_two() {
    common::oracle::self_join_rescaled_and_rebalanced(
        "koala",
        "extra_keys = 0\n[runtime]\nmax_queued_records = 2\n",
    );
}

/// Every bucket swapped between two tasks on two workers with one held record per task and
/// one-message queues: each task fetches all of its state from the other while it takes one
/// record at a time; the output is the reference run's.
#[test]
fn every_bucket_swapped_with_a_queue_bound_of_one() {
    common::oracle::swap_with_one_message_queues("koala", "max_queued_records = 1\n");
}
