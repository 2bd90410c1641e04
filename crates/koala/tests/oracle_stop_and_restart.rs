//! Stop-and-restart × {scale-out, scale-in, rebalance, task migration} × {keyed aggregate,
//! last-N list state, tumbling window, sliding window, window join}, judged by the oracle: the
//! output with the reconfiguration equals the output of the final deployment from the start; and
//! a self-join rescaled and rebalanced.
//! Every run uses 2 worker processes over loopback TCP.

mod common;

use common::oracle::{Case, check};

oracle_matrix!("stop-and-restart");

/// Three reconfigurations in a row: out, out, in.
#[test]
fn out_out_in_keyed_aggregate() {
    check(&Case {
        protocol: "stop-and-restart",
        top: "",
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

/// A self-join (one upstream operator on both inputs) scaled out, rebalanced and scaled in: a
/// target sends its state once the marker arrived on both channels from every source task.
#[test]
fn self_join_rescaled_and_rebalanced() {
    common::oracle::self_join_rescaled_and_rebalanced("stop-and-restart", "");
}
