//! Stop-and-restart × {scale-out, scale-in, rebalance, task migration} × {keyed aggregate,
//! last-N list state, tumbling window, sliding window, window join}, judged by the oracle: the
//! output with the reconfiguration equals the output of the final deployment from the start.
//! Every run uses 2 worker processes over loopback TCP.

mod common;

use common::oracle::{Case, check};

/// Query, its stateful operator, its sources, extra params.
const QUERIES: &[(&str, &str, &[&str], &str)] = &[
    ("keyed-aggregate", "aggregate", &["source"], ""),
    ("last-n", "last_n", &["source"], "last_n = 3\n"),
    ("tumbling-window", "window", &["source"], "window_ms = 300\n"),
    ("sliding-window", "window", &["source"], "window_ms = 400\nslide_ms = 100\n"),
    ("window-join", "join", &["left", "right"], "window_ms = 300\n"),
];

fn parallelism<'a>(sources: &[&'a str], op: &'a str, n: u32) -> Vec<(&'a str, u32)> {
    let mut v: Vec<(&str, u32)> = sources.iter().map(|s| (*s, 2)).collect();
    v.push((op, n));
    v.push(("sink", 1));
    v
}

fn scenario(query: &str, scenario: &str) {
    let (q, op, sources, params) =
        QUERIES.iter().find(|(q, ..)| *q == query).copied().unwrap_or_else(|| panic!("no query {query}"));
    let (start, end, schedule) = match scenario {
        "scale-out" => {
            (2, 4, format!("[[reconfigurations]]\nat_s = 0.6\noperator = \"{op}\"\nparallelism = 4\n"))
        }
        "scale-in" => {
            (4, 2, format!("[[reconfigurations]]\nat_s = 0.6\noperator = \"{op}\"\nparallelism = 2\n"))
        }
        "rebalance" => (
            2,
            2,
            format!(
                "[[reconfigurations]]\nat_s = 0.6\noperator = \"{op}\"\nmoves = [{{ buckets = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31], to = 1 }}, {{ buckets = [100, 101, 102, 103, 104, 105, 106, 107], to = 0 }}]\n"
            ),
        ),
        "migrate" => {
            (2, 2, format!("[[reconfigurations]]\nat_s = 0.6\noperator = \"{op}\"\ntask = 0\nworker = 1\n"))
        }
        other => panic!("no scenario {other}"),
    };
    check(&Case {
        query: q,
        start: &parallelism(sources, op, start),
        end: &parallelism(sources, op, end),
        schedule: &schedule,
        params,
        records: 16_000,
        seed: 21,
        expect_reconfigurations: 1,
    });
}

macro_rules! oracle_tests {
    ($($name:ident: $query:literal, $scenario:literal;)*) => {
        $(
            #[test]
            fn $name() {
                scenario($query, $scenario);
            }
        )*
    };
}

oracle_tests! {
    scale_out_keyed_aggregate: "keyed-aggregate", "scale-out";
    scale_in_keyed_aggregate: "keyed-aggregate", "scale-in";
    rebalance_keyed_aggregate: "keyed-aggregate", "rebalance";
    migrate_keyed_aggregate: "keyed-aggregate", "migrate";
    scale_out_last_n: "last-n", "scale-out";
    scale_in_last_n: "last-n", "scale-in";
    rebalance_last_n: "last-n", "rebalance";
    migrate_last_n: "last-n", "migrate";
    scale_out_tumbling_window: "tumbling-window", "scale-out";
    scale_in_tumbling_window: "tumbling-window", "scale-in";
    rebalance_tumbling_window: "tumbling-window", "rebalance";
    migrate_tumbling_window: "tumbling-window", "migrate";
    scale_out_sliding_window: "sliding-window", "scale-out";
    scale_in_sliding_window: "sliding-window", "scale-in";
    rebalance_sliding_window: "sliding-window", "rebalance";
    migrate_sliding_window: "sliding-window", "migrate";
    scale_out_window_join: "window-join", "scale-out";
    scale_in_window_join: "window-join", "scale-in";
    rebalance_window_join: "window-join", "rebalance";
    migrate_window_join: "window-join", "migrate";
}

/// Three reconfigurations in a row: out, out, in.
#[test]
fn out_out_in_keyed_aggregate() {
    check(&Case {
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

/// A key's window state is deleted when its windows fire after its bucket moved away; when the
/// bucket moves back, the old location must not serve the stale copy (one live copy). Short
/// windows make every key's state come and go between the two moves.
#[test]
fn cleared_state_does_not_come_back_when_the_bucket_returns() {
    check(&Case {
        query: "tumbling-window",
        start: &[("source", 2), ("window", 2), ("sink", 1)],
        end: &[("source", 2), ("window", 2), ("sink", 1)],
        schedule: "[[reconfigurations]]\nat_s = 0.4\noperator = \"window\"\nparallelism = 4\n\
                   [[reconfigurations]]\nat_s = 1.2\noperator = \"window\"\nparallelism = 2\n",
        params: "window_ms = 50\n",
        records: 20_000,
        seed: 9,
        expect_reconfigurations: 2,
    });
}
