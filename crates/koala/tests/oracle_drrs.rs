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

/// Five reconfigurations of the aggregate that once hung DRRS: 1 → 5, 5 → 4, a migration, a rebalance, 4 → 5.
const FIVE_RECONFIGURATIONS: &str = "[[reconfigurations]]\nat_s = 0.3\noperator = \"aggregate\"\nparallelism = 5\n\
    [[reconfigurations]]\nat_s = 0.6\noperator = \"aggregate\"\nparallelism = 4\n\
    [[reconfigurations]]\nat_s = 0.9\noperator = \"aggregate\"\ntask = 1\nworker = 0\n\
    [[reconfigurations]]\nat_s = 1.2\noperator = \"aggregate\"\n\
    moves = [{ buckets = [1, 2, 3, 40, 41, 90], to = 2 }]\n\
    [[reconfigurations]]\nat_s = 1.5\noperator = \"aggregate\"\nparallelism = 5\n";

/// The schedule of a DRRS hang: three sources, one-record batches, data queues of four,
/// 1 → 5 (four pairs: four subscales, each a slice of every pair), 5 → 4, a migration, a
/// rebalance and 4 → 5.
#[test]
fn five_reconfigurations_three_sources_one_record_batches() {
    check(&Case {
        protocol: "drrs",
        top: "[runtime]\nbatch_records = 1\nchannel_capacity = 4\n",
        query: "keyed-aggregate",
        start: &[("source", 3), ("aggregate", 1), ("sink", 1)],
        end: &[("source", 3), ("aggregate", 5), ("sink", 1)],
        schedule: FIVE_RECONFIGURATIONS,
        params: "",
        records: 20_000,
        seed: 26,
        expect_reconfigurations: 5,
    });
}

/// The original DRRS's overlapping schedule (one subscale per pair, several at once, at most two
/// per task) over the same five reconfigurations: 1 → 5 (four pairs from one sender: two at a time), 5 → 4,
/// a migration, a rebalance and 4 → 5, with a wait buffer of one record.
#[test]
fn overlapping_schedule_five_reconfigurations() {
    check(&Case {
        protocol: "drrs",
        top: "[drrs]\nschedule = \"overlapping\"\nwait_records = 1\n",
        query: "keyed-aggregate",
        start: &[("source", 3), ("aggregate", 1), ("sink", 1)],
        end: &[("source", 3), ("aggregate", 5), ("sink", 1)],
        schedule: FIVE_RECONFIGURATIONS,
        params: "",
        // Input for 4 s: under load a queued fifth reconfiguration must still find its sources
        // running (the coordinator skips one whose input ended).
        records: 32_000,
        seed: 16,
        expect_reconfigurations: 5,
    });
}

/// The overlapping schedule on windows and list state: a sliding window and last-N scaled out
/// 2 → 4 and back in to 3.
#[test]
fn overlapping_schedule_windows_and_lists() {
    for (query, op, params) in [
        ("sliding-window", "window", "window_ms = 400\nslide_ms = 100\n"),
        ("last-n", "last_n", "last_n = 3\n"),
    ] {
        let schedule = format!(
            "[[reconfigurations]]\nat_s = 0.4\noperator = \"{op}\"\nparallelism = 4\n\
             [[reconfigurations]]\nat_s = 0.9\noperator = \"{op}\"\nparallelism = 3\n"
        );
        check(&Case {
            protocol: "drrs",
            top: "[drrs]\nschedule = \"overlapping\"\n",
            query,
            start: &[("source", 2), (op, 2), ("sink", 1)],
            end: &[("source", 2), (op, 3), ("sink", 1)],
            schedule: &schedule,
            params,
            records: 16_000,
            seed: 17,
            expect_reconfigurations: 2,
        });
    }
}
