//! The Remote baseline (`protocol = "remote"` over `[state] backend = "remote"`: stop-and-restart
//! over state servers, docs/protocols.md §7.1) × {scale-out, scale-in, rebalance, task migration} ×
//! {keyed aggregate, last-N list state, tumbling window, sliding window, window join}, judged by
//! the oracle: the output with the reconfiguration equals the output of the final deployment
//! from the start. `common/verify.rs` proves each run used the remote protocol and backend (its
//! servers' addresses are in the recorded config) and that no state moved between tasks.
//! Every run uses 2 worker processes and one state server process over loopback TCP.

mod common;

use common::oracle::{Case, check};

oracle_matrix!("remote");

/// Three reconfigurations in a row (out, out, in) with a client cache in front of the state
/// server: a task's dirty entries of a moved bucket must reach the server before the new owner
/// reads, and buckets that come back to a task must not be served from its old cached copies.
#[test]
fn out_out_in_keyed_aggregate_with_a_client_cache() {
    check(&Case {
        protocol: "remote",
        top: "state.cache_mb = 1\n",
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
    common::oracle::self_join_rescaled_and_rebalanced("remote", "");
}
