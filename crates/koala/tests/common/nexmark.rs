//! The output-equivalence oracle (docs/testing.md §1) for the Nexmark queries: a run with a
//! reconfiguration of a query's operator must write the same sink output as a run deployed with
//! the final configuration from the start, under every protocol; both runs must prove they used
//! their parameters ([`super::verify`]). The keys each operator holds are computed from the
//! generator, so the run checks know which moved buckets held state.

use std::collections::{BTreeMap, BTreeSet};

use koala_workloads::nexmark::{Event, NexmarkConfig, NexmarkGenerator, closed_auction_of};
use serde_json::Value;

use super::oracle::{compare_rows, remote_state, rows_per_key_by};
use super::run_job_logged;

/// How the outputs of two runs must agree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Compare {
    /// Per key, equal multisets of rows.
    Rows,
    /// A running aggregate fed by several tasks of a timer operator, whose interleaving no run
    /// controls: per key, the running counts are exactly 1..=n in both runs (a lost, duplicated
    /// or restarted state shows), and the rows' (auction, price) are equal multisets (every
    /// closed auction arrives once with its price); `sum` of the last row, if the rows have one,
    /// is equal.
    Running,
}

/// One query of the matrix.
struct Query {
    name: &'static str,
    /// Its source and how many tasks it has.
    source: (&'static str, u32),
    /// The operator reconfigured, then the other operators between source and sink, with their
    /// tasks.
    target: &'static str,
    others: &'static [(&'static str, u32)],
    /// Events generated: enough for ~8 000 records of the source's kinds.
    events: u64,
    /// More `[params]` lines.
    params: &'static str,
    compare: Compare,
}

/// Every Nexmark query. Q4* and Q6* have one source task: their running per-key outputs depend
/// on the order of a key's records, which one source keeps (several interleave them). So do Q1
/// and Q2: a stateless operator with as many tasks as its source is connected one-to-one and
/// cannot be rescaled.
const QUERIES: &[Query] = &[
    Query {
        name: "nexmark-q1",
        source: ("bids", 1),
        target: "convert",
        others: &[],
        events: 8_700,
        params: "",
        compare: Compare::Rows,
    },
    Query {
        name: "nexmark-q2",
        source: ("bids", 1),
        target: "filter",
        others: &[],
        events: 8_700,
        params: Q2_AUCTIONS,
        compare: Compare::Rows,
    },
    // The keyed running aggregate of the demo over the generator's bids (`bid-aggregate`,
    // `koala_connectors::queries`; over Kafka in `kafka_end_to_end.rs`): ~12 000 bids, so ~1.5 s
    // of input for a scale-out, a rebalance and a scale-in in one run.
    Query {
        name: "bid-aggregate",
        source: ("bids", 1),
        target: "aggregate",
        others: &[],
        events: 13_000,
        params: "",
        compare: Compare::Rows,
    },
    Query {
        name: "nexmark-q3",
        source: ("events", 2),
        target: "join",
        others: &[("filter", 2)],
        events: 100_000,
        params: "state_padding_bytes = 64\n",
        compare: Compare::Rows,
    },
    Query {
        name: "nexmark-q4",
        source: ("events", 2),
        target: "closed_auction",
        others: &[("category", 2)],
        events: 8_200,
        params: "",
        compare: Compare::Running,
    },
    Query {
        name: "nexmark-q5",
        source: ("bids", 2),
        target: "count",
        others: &[("hottest", 2)],
        events: 8_700,
        params: "window_ms = 400\nslide_ms = 100\n",
        compare: Compare::Rows,
    },
    Query {
        name: "nexmark-q6",
        source: ("events", 2),
        target: "closed_auction",
        others: &[("seller", 2)],
        events: 8_200,
        params: "last_prices = 3\n",
        compare: Compare::Running,
    },
    Query {
        name: "nexmark-q7",
        source: ("bids", 2),
        target: "max_bid",
        others: &[("highest", 2)],
        events: 8_700,
        params: "window_ms = 300\n",
        compare: Compare::Rows,
    },
    Query {
        name: "nexmark-q8",
        source: ("events", 2),
        target: "new_users",
        others: &[],
        events: 100_000,
        params: "new_user_period_ms = 2000\n",
        compare: Compare::Rows,
    },
    Query {
        name: "nexmark-q4star",
        source: ("closed_auctions", 1),
        target: "category",
        others: &[],
        events: 135_000,
        params: "state_padding_bytes = 64\n",
        compare: Compare::Rows,
    },
    Query {
        name: "nexmark-q6star",
        source: ("closed_auctions", 1),
        target: "seller",
        others: &[],
        events: 135_000,
        params: "state_padding_bytes = 64\nlast_prices = 3\n",
        compare: Compare::Rows,
    },
];

/// Q2 keeps the bids of every third auction among the first 1 000.
const Q2_AUCTIONS: &str = "q2_auctions = [1000, 1003, 1006, 1009, 1012, 1015, 1018, 1021, 1024, 1027, 1030, 1033, 1036, 1039, 1042, 1045, 1048, 1051, 1054, 1057, 1060, 1063, 1066, 1069, 1072, 1075, 1078, 1081, 1084, 1087, 1090, 1093, 1096, 1099, 1102, 1105, 1108, 1111, 1114, 1117, 1120, 1123, 1126, 1129, 1132, 1135, 1138, 1141, 1144, 1147, 1150, 1153, 1156, 1159, 1162, 1165, 1168, 1171, 1174, 1177, 1180, 1183, 1186, 1189, 1192, 1195, 1198]\n";

/// Records per second: ~1 s of input, so a reconfiguration at 0.4 s lands mid-stream.
const RATE: u32 = 8_000;

/// The generator of every case: few active people and auctions (joins match, auctions get
/// bids), auctions open for 2 s of event time (timers fire throughout the run).
fn generator(events: u64) -> NexmarkConfig {
    NexmarkConfig {
        events: Some(events),
        active_people: 20,
        active_auctions: 40,
        auction_duration_ms: 2_000,
        hot_ratio: 0.2,
        seed: 7,
        ..Default::default()
    }
}

/// The keys `op` of `query` holds state for, from the generator's events.
fn operator_keys(query: &str, op: &str, events: &[Event]) -> BTreeSet<u64> {
    let mut keys = BTreeSet::new();
    for e in events {
        match (op, e) {
            ("join", Event::Person(p)) if p.state != "OR" => {
                keys.insert(p.id);
            }
            ("join", Event::Auction(a)) if a.category != 10 => {
                keys.insert(a.seller);
            }
            ("new_users", Event::Person(p)) => {
                keys.insert(p.id);
            }
            ("new_users", Event::Auction(a)) => {
                keys.insert(a.seller);
            }
            ("closed_auction", Event::Auction(a)) => {
                keys.insert(a.id);
            }
            ("closed_auction", Event::Bid(b)) | ("count", Event::Bid(b)) => {
                keys.insert(b.auction);
            }
            ("max_bid", Event::Bid(b)) => {
                keys.insert(b.bidder);
            }
            ("category", Event::Auction(a)) if query == "nexmark-q4star" => {
                keys.insert(closed_auction_of(a).category);
            }
            ("seller", Event::Auction(a)) if query == "nexmark-q6star" => {
                keys.insert(a.seller);
            }
            ("aggregate", Event::Bid(b)) if query == "bid-aggregate" => {
                keys.insert(b.auction);
            }
            _ => {}
        }
    }
    keys
}

/// Whether moved keys of `op` are surely accessed again, so Koala must fetch some state.
fn permanent_state(query: &str, op: &str) -> bool {
    // The categories: a handful of keys every record reaches again. Sellers and Q3's persons
    // keep their state, but the generator's active people slide on, so the sellers a move hands
    // over may never be seen again (a Koala rebalance of Q6* then rightly fetches nothing). The
    // bid aggregate's auctions: the 40 active ones get bids for the next ~700 events (~90 ms),
    // and a moved bucket set holds some of them.
    op == "category" || (query == "bid-aggregate" && op == "aggregate")
}

/// The config of one run.
fn config(
    dir: &std::path::Path,
    protocol: &str,
    q: &Query,
    target_tasks: u32,
    schedule: &str,
    rate: u32,
) -> String {
    let policy = if protocol == "drrs" { "partition_policy = \"uniform\"\n" } else { "" };
    let mut text = format!(
        "query = \"{}\"\nworkers = 2\noutput_dir = \"{}\"\nprotocol = \"{protocol}\"\n{}{policy}\n[parallelism]\n{} = {}\n{} = {target_tasks}\n",
        q.name,
        dir.join("out").display(),
        remote_state(protocol),
        q.source.0,
        q.source.1,
        q.target,
    );
    for (op, n) in q.others {
        text.push_str(&format!("{op} = {n}\n"));
    }
    let g = generator(q.events);
    // `bid-aggregate` names its sink kind `output` (it can also write Kafka).
    let sink = if q.name == "bid-aggregate" { "output" } else { "sink" };
    text.push_str(&format!(
        "sink = 1\n\n{schedule}\n[params]\n{sink} = \"jsonl\"\n{}\n[params.nexmark]\nevents = {}\nactive_people = {}\nactive_auctions = {}\nauction_duration_ms = {}\nhot_ratio = {}\nseed = {}\n\n[params.source]\nrate = [{{ at_ms = 0, records_per_sec = {rate}.0 }}]\nmax_disorder_ms = 0\nwatermark_interval_ms = 20\n",
        q.params,
        q.events,
        g.active_people,
        g.active_auctions,
        g.auction_duration_ms,
        g.hot_ratio,
        g.seed,
    ));
    text
}

/// Records the source emits (its kinds among the events), for the input's duration.
fn source_records(q: &Query, events: &[Event]) -> u64 {
    let kept = |e: &Event| match q.source.0 {
        "bids" => matches!(e, Event::Bid(_)),
        "closed_auctions" => matches!(e, Event::Auction(_)),
        _ if q.target == "closed_auction" => matches!(e, Event::Auction(_) | Event::Bid(_)),
        _ => matches!(e, Event::Person(_) | Event::Auction(_)),
    };
    events.iter().filter(|e| kept(e)).count() as u64
}

/// Runs `query` under `protocol` with `scenario` (scale-out 2 → 4, scale-in 4 → 2, a rebalance
/// of 40 buckets, a migration of task 0 to worker 1, or scale-out, rebalance and scale-in in one
/// run: [`super::scenario_schedule`]) and against the final deployment, and compares their
/// outputs.
pub fn scenario(protocol: &str, query: &str, scenario: &str) {
    let q = QUERIES.iter().find(|q| q.name == query).unwrap_or_else(|| panic!("no query {query}"));
    let op = q.target;
    let at_s = if scenario == "out-rebalance-in" { 0.3 } else { 0.4 };
    let (start, end, schedule) = super::scenario_schedule(scenario, op, at_s);
    let events: Vec<Event> = NexmarkGenerator::new(generator(q.events)).expect("valid").events().collect();
    let keys_of = |o: &str| super::verify::key_bytes(operator_keys(query, o, &events));
    let min_state_keys = |o: &str| if o == "category" { 3 } else { 20 };
    let permanent = |o: &str| permanent_state(query, o);
    let top = format!("protocol = \"{protocol}\"\n");
    let verify = |out: &std::path::Path, text: &str, input_ms: u64| {
        let expect = super::verify::Expect {
            config_text: text,
            protocol,
            extra_keys: super::verify::extra_keys_of(&top),
            input_ms,
            keys: &keys_of,
            min_state_keys: &min_state_keys,
            permanent_state: &permanent,
        };
        super::verify::check_run(out, &expect)
    };

    let run = super::run_scheduled(RATE, |dir, rate| config(dir, protocol, q, start, &schedule, rate));
    let input_ms = source_records(q, &events) * 1000 / u64::from(run.rate);
    let (text, out_a, log) = (&run.text, &run.out, &run.log);
    match verify(out_a, text, input_ms) {
        Ok(rec) => println!("{query} ({protocol}, {scenario}): checked {}", rec.checked.join(", ")),
        Err(e) => panic!("{query} ({protocol}, {scenario}): {e}\nconfig:\n{text}\nlog:\n{log}"),
    }
    let reference = tempfile::tempdir().expect("tempdir");
    let ref_text = config(reference.path(), protocol, q, end, "", run.rate);
    let (out_b, ref_log) = run_job_logged(reference.path(), &ref_text);
    if let Err(e) = verify(&out_b, &ref_text, input_ms) {
        panic!("{query} ({protocol}) reference run: {e}\nconfig:\n{ref_text}\nlog:\n{ref_log}");
    }
    // `bid-aggregate`'s rows (`BidTotal`) are keyed by `auction`.
    let key = if q.name == "bid-aggregate" { "auction" } else { "key" };
    let (a, b) = (rows_per_key_by(out_a, key), rows_per_key_by(&out_b, key));
    assert!(
        b.len() >= 5,
        "{query}: the reference run wrote rows for {} keys; the test proves little",
        b.len()
    );
    // The reference test of `bid-aggregate` without a broker: the final deployment's rows are
    // the generator's bids folded per auction by a plain loop (one source task: each auction's
    // bids in generator order, so every running row is determined).
    if q.name == "bid-aggregate"
        && let Err(e) = compare_rows(&bid_totals(&events), &b)
    {
        panic!("bid-aggregate reference run against a plain fold of the generator's bids: {e}");
    }
    let result = match q.compare {
        Compare::Rows => compare_rows(&b, &a),
        Compare::Running => compare_running(&b, &a),
    };
    if let Err(e) = result {
        panic!("{query} ({protocol}, {scenario}): {e}\nconfig:\n{text}\nlog:\n{log}");
    }
}

/// `bid-aggregate`'s rows computed by a plain loop: per auction, after each of its bids in
/// generator order, the bids so far and the sum of their prices.
fn bid_totals(events: &[Event]) -> BTreeMap<String, Vec<String>> {
    let mut totals: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    let mut rows: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for e in events {
        if let Event::Bid(b) = e {
            let (count, sum) = totals.entry(b.auction).or_default();
            *count += 1;
            *sum = sum.wrapping_add(b.price);
            let row = serde_json::json!({ "auction": b.auction, "count": *count, "sum_price": *sum });
            rows.entry(b.auction.to_string()).or_default().push(row.to_string());
        }
    }
    for r in rows.values_mut() {
        r.sort();
    }
    rows
}

/// A key's running rows reduced to what no interleaving changes: sorted counts, sorted
/// (auction, price) pairs, the last row's sum.
type Facets = (Vec<u64>, Vec<(u64, u64)>, Option<u64>);

/// [`Compare::Running`]: per key, counts 1..=n, equal (auction, price) multisets, equal final sum.
fn compare_running(
    expected: &BTreeMap<String, Vec<String>>,
    got: &BTreeMap<String, Vec<String>>,
) -> Result<(), String> {
    let facets = |rows: &[String]| -> Result<Facets, String> {
        let mut counts = Vec::new();
        let mut closed = Vec::new();
        let mut last: Option<(u64, Option<u64>)> = None;
        for row in rows {
            let v: Value = serde_json::from_str(row).map_err(|e| format!("bad row {row}: {e}"))?;
            let field =
                |f: &str| v.get(f).and_then(Value::as_u64).ok_or_else(|| format!("row {row} has no {f}"));
            let count = field("count")?;
            counts.push(count);
            closed.push((field("auction")?, field("price")?));
            if last.is_none_or(|(c, _)| count > c) {
                last = Some((count, v.get("sum").and_then(Value::as_u64)));
            }
        }
        counts.sort_unstable();
        closed.sort_unstable();
        Ok((counts, closed, last.and_then(|(_, sum)| sum)))
    };
    for (key, exp) in expected {
        let (exp_counts, exp_closed, exp_sum) = facets(exp)?;
        let (counts, closed, sum) = facets(got.get(key).map(Vec::as_slice).unwrap_or_default())?;
        let one_to_n: Vec<u64> = (1..=counts.len() as u64).collect();
        if counts != one_to_n || exp_counts.len() != counts.len() {
            return Err(format!(
                "key {key}: running counts {counts:?} under reconfiguration, {} rows expected",
                exp_counts.len()
            ));
        }
        if closed != exp_closed || sum != exp_sum {
            return Err(format!(
                "key {key}: closed auctions or final sum differ: {closed:?} / {sum:?} vs {exp_closed:?} / {exp_sum:?}"
            ));
        }
    }
    let extra: Vec<&String> = got.keys().filter(|k| !expected.contains_key(*k)).take(5).collect();
    if !extra.is_empty() {
        return Err(format!("keys only in the reconfigured run: {extra:?}"));
    }
    Ok(())
}

/// The Nexmark oracle tests of one protocol: every query × scale-out, scale-in and rebalance
/// (Q1 and Q2 rescale a stateless operator, which has no buckets to rebalance: the coordinator
/// refuses bucket moves of an operator without keyed state; their load is rebalanced by
/// migrating a task to the other worker), and the bid aggregate scaled out, rebalanced and
/// scaled in in one run.
#[macro_export]
macro_rules! nexmark_matrix {
    ($protocol:literal) => {
        $crate::nexmark_matrix!(@tests $protocol;
            q1_scale_out: "nexmark-q1", "scale-out";
            q2_scale_out: "nexmark-q2", "scale-out";
            q3_scale_out: "nexmark-q3", "scale-out";
            q3_scale_in: "nexmark-q3", "scale-in";
            q3_rebalance: "nexmark-q3", "rebalance";
            q4_scale_out: "nexmark-q4", "scale-out";
            q4_scale_in: "nexmark-q4", "scale-in";
            q4_rebalance: "nexmark-q4", "rebalance";
            q5_scale_out: "nexmark-q5", "scale-out";
            q5_scale_in: "nexmark-q5", "scale-in";
            q5_rebalance: "nexmark-q5", "rebalance";
            q6_scale_out: "nexmark-q6", "scale-out";
            q6_scale_in: "nexmark-q6", "scale-in";
            q6_rebalance: "nexmark-q6", "rebalance";
            q7_scale_out: "nexmark-q7", "scale-out";
            q7_scale_in: "nexmark-q7", "scale-in";
            q7_rebalance: "nexmark-q7", "rebalance";
            q8_scale_out: "nexmark-q8", "scale-out";
            q8_scale_in: "nexmark-q8", "scale-in";
            q8_rebalance: "nexmark-q8", "rebalance";
            q4star_scale_out: "nexmark-q4star", "scale-out";
            q4star_scale_in: "nexmark-q4star", "scale-in";
            q4star_rebalance: "nexmark-q4star", "rebalance";
            q6star_scale_out: "nexmark-q6star", "scale-out";
            q6star_scale_in: "nexmark-q6star", "scale-in";
            q6star_rebalance: "nexmark-q6star", "rebalance";
            q1_scale_in: "nexmark-q1", "scale-in";
            q2_scale_in: "nexmark-q2", "scale-in";
            q1_migrate: "nexmark-q1", "migrate";
            q2_migrate: "nexmark-q2", "migrate";
            bid_aggregate_scaled_out_rebalanced_scaled_in: "bid-aggregate", "out-rebalance-in";
        );
    };
    (@tests $protocol:literal; $($name:ident: $query:literal, $scenario:literal;)*) => {
        $(
            #[test]
            fn $name() {
                common::nexmark::scenario($protocol, $query, $scenario);
            }
        )*
    };
}
