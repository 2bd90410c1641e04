//! DRRS × {scale-out, scale-in, rebalance, task migration} × {keyed aggregate, last-N list state,
//! tumbling window, sliding window, window join}, judged by the oracle: the output with the
//! reconfiguration equals the output of the final deployment from the start; and a self-join
//! rescaled and rebalanced. Every run uses the uniform partition policy (as the paper's DRRS
//! does; docs/protocols.md §11) and 2 worker processes over loopback TCP.

mod common;

use common::oracle::{Case, check};

oracle_matrix!("drrs");

/// Three reconfigurations in a row: out, out, in — with two subscales each (several pairs per
/// subscale), and a wait buffer of one record, so receivers stop taking direct input.
#[test]
fn out_out_in_keyed_aggregate_two_subscales() {
    check(&Case {
        protocol: "drrs",
        top: "[drrs]\nsubscales = 2\nwait_records = 1\n",
        query: "keyed-aggregate",
        start: &[("source", 2), ("aggregate", 2), ("sink", 1)],
        end: &[("source", 2), ("aggregate", 3), ("sink", 1)],
        schedule: "[[reconfigurations]]\nat_s = 0.4\noperator = \"aggregate\"\nparallelism = 3\n\
                   [[reconfigurations]]\nat_s = 0.9\noperator = \"aggregate\"\nparallelism = 5\n\
                   [[reconfigurations]]\nat_s = 1.4\noperator = \"aggregate\"\nparallelism = 3\n",
        params: "",
        records: 20_000,
        seed: 5,
        expect_reconfigurations: 3,
    });
}

/// A self-join (one upstream operator on both inputs) scaled out, rebalanced and scaled in.
#[test]
fn self_join_rescaled_and_rebalanced() {
    common::oracle::self_join_rescaled_and_rebalanced("drrs", "partition_policy = \"uniform\"\n");
}
