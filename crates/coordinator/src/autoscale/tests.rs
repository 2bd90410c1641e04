//! The policy on synthetic per-second metrics.

use koala_protocol::ReconfigRequest;

use super::*;

const BUDGET: f64 = 20_000.0;

fn config() -> AutoscaleSection {
    AutoscaleSection { enabled: true, operator: Some("aggregate".into()), ..AutoscaleSection::default() }
}

/// `tasks` tasks each taking `per_task` records/s under a budget of [`BUDGET`], the sources
/// emitting their sum, mean lag `lag_ms`, latency as given.
fn second(t: u64, per_task: &[f64], lag_ms: f64, latency_ms: f64) -> Second {
    Second {
        t,
        input_per_s: per_task.iter().sum(),
        lag_mean_ms: Some(lag_ms),
        lag_p99_ms: Some(lag_ms * 1.5),
        latency_p99_ms: Some(latency_ms),
        tasks: per_task
            .iter()
            .enumerate()
            .map(|(i, r)| TaskSecond {
                index: i as u32,
                records_in: *r,
                busy_ms: busy_ms(*r, 50.0, Some(BUDGET)),
                buckets: Vec::new(),
            })
            .collect(),
    }
}

/// Buckets 0..n dealt to `tasks` tasks round-robin.
fn routing(n: usize, tasks: u32) -> Vec<u32> {
    (0..n as u32).map(|b| b % tasks).collect()
}

/// Feeds seconds `from..` of `make` until a decision; returns it and its second.
fn until_decision(
    a: &mut Autoscaler,
    from: u64,
    seconds: u64,
    routing: &[u32],
    make: impl Fn(u64) -> Second,
) -> Option<(u64, Decision)> {
    let live: Vec<u32> = (0..=routing.iter().copied().max().unwrap_or(0)).collect();
    (from..from + seconds).find_map(|t| a.on_second(make(t), routing, &live).map(|d| (t, d)))
}

#[test]
fn a_surge_scales_out_after_one_window_to_the_ds2_parallelism() {
    let mut a = Autoscaler::new(config(), "aggregate", Some(BUDGET));
    let r = routing(128, 2);
    // Keeping up: no decision.
    assert!(until_decision(&mut a, 100, 30, &r, |t| second(t, &[15_000.0, 15_000.0], 40.0, 60.0)).is_none());
    // A surge to 60 000/s: both tasks at their 20 000/s budget, lag growing 1/3 s per s.
    let surge = |t: u64| second(t, &[20_000.0, 20_000.0], 333.3 * (t - 129) as f64, 500.0 + (t - 129) as f64);
    let (t, d) = until_decision(&mut a, 130, 30, &r, surge).expect("a scale-out");
    assert_eq!(t, 139, "after exactly one window of 10 overloaded seconds");
    assert_eq!(d.kind, DecisionKind::ScaleOut);
    // Demand 40 000 / (1 − 1/3) = 60 000; 60 000 / (20 000 × 0.8) = 3.75 → 4.
    assert_eq!(
        d.request,
        ReconfigRequest::Rescale { operator: "aggregate".into(), parallelism: 4 },
        "{}",
        d.reason
    );
    assert!((d.window.demand_rate - 60_000.0).abs() < 100.0, "{}", d.window);
    assert_eq!(d.window.task_rate.map(f64::round), Some(20_000.0));
    assert!(d.reason.contains("DS2") && d.reason.contains("2 → 4"), "{}", d.reason);
}

#[test]
fn the_parallelism_is_bounded_by_max_parallelism() {
    let mut a =
        Autoscaler::new(AutoscaleSection { max_parallelism: 3, ..config() }, "aggregate", Some(BUDGET));
    let r = routing(128, 2);
    let surge = |t: u64| second(t, &[20_000.0, 20_000.0], 500.0 * t as f64, 900.0);
    let (_, d) = until_decision(&mut a, 1, 20, &r, surge).expect("a scale-out");
    assert_eq!(d.request, ReconfigRequest::Rescale { operator: "aggregate".into(), parallelism: 3 });
    // At the bound, still overloaded: nothing more to do.
    assert!(
        until_decision(&mut a, 21, 40, &routing(128, 3), |t| second(
            t,
            &[20_000.0; 3],
            500.0 * t as f64,
            900.0
        ))
        .is_none()
    );
}

#[test]
fn seconds_of_a_reconfiguration_and_its_cooldown_are_never_judged_and_one_decision_per_window() {
    let mut a = Autoscaler::new(config(), "aggregate", Some(BUDGET));
    let r = routing(128, 2);
    let over = |t: u64| second(t, &[20_000.0, 20_000.0], 400.0 * t as f64, 900.0);
    // A reconfiguration runs during 100..=120 (the coordinator says so each second).
    for t in 100..=120 {
        a.busy(t);
        assert!(
            a.on_second(over(t - 1), &r, &[0, 1]).is_none(),
            "second {} judged during a reconfiguration",
            t - 1
        );
    }
    // Cooldown 5 s: seconds up to 125 are not judged; the first window is 126..=135.
    let (t, _) = until_decision(&mut a, 121, 40, &r, over).expect("a decision");
    assert_eq!(t, 135);
    // The next decision needs a fresh window after the decision's cooldown: 141..=150.
    let (t2, _) = until_decision(&mut a, 136, 40, &r, over).expect("another");
    assert_eq!(t2, 150, "at most one reconfiguration per window");
}

#[test]
fn a_short_spike_does_not_act() {
    let mut a = Autoscaler::new(config(), "aggregate", Some(BUDGET));
    let r = routing(128, 2);
    // 9 of every 10 seconds overloaded: never a whole window.
    let spiky = |t: u64| {
        let lat = if t.is_multiple_of(10) { 50.0 } else { 900.0 };
        Second { lag_p99_ms: Some(10.0), ..second(t, &[20_000.0, 20_000.0], 10.0, lat) }
    };
    assert!(until_decision(&mut a, 1, 60, &r, spiky).is_none());
}

#[test]
fn an_overload_that_drains_with_enough_tasks_waits() {
    let mut a = Autoscaler::new(config(), "aggregate", Some(BUDGET));
    let r = routing(128, 4);
    // 4 tasks at 15 000/s draining a backlog: lag falls 0.2 s per s, still above target.
    let draining = |t: u64| second(t, &[15_000.0; 4], 20_000.0 - 200.0 * t as f64, 5_000.0);
    assert!(until_decision(&mut a, 1, 30, &r, draining).is_none());
}

#[test]
fn a_hot_task_is_rebalanced_instead_of_scaled_out() {
    let mut a = Autoscaler::new(config(), "aggregate", Some(BUDGET));
    let mut r = routing(128, 4);
    // Task 0 also owns every bucket ≡ 1 mod 4 (48 more): a hot range.
    for (b, owner) in r.iter_mut().enumerate() {
        if b % 4 == 1 {
            *owner = 0;
        }
    }
    let hot = |t: u64| second(t, &[20_000.0, 0.0, 6_000.0, 5_000.0], 300.0 * t as f64, 900.0);
    let (_, d) = until_decision(&mut a, 1, 20, &r, hot).expect("a decision");
    assert_eq!(d.kind, DecisionKind::Rebalance, "{}", d.reason);
    let ReconfigRequest::Rebalance { operator, moves } = &d.request else { panic!("{:?}", d.request) };
    assert_eq!(operator, "aggregate");
    let moved: Vec<u16> = moves.iter().flat_map(|m| m.0.iter().copied()).collect();
    assert!(moved.iter().all(|b| r[usize::from(*b)] == 0), "only the hot task's buckets move: {moves:?}");
    // No per-bucket counts: its 64 buckets count as even. It is offered 20 000/s plus the
    // demand no task took (31 000 / 0.7 − 31 000 = 13 286/s): 33 286/s, 520/s per bucket,
    // packed onto the coldest until the loads even out at ~11 070/s each: the idle task 1 takes
    // ~21 buckets, task 2 (6 000/s) ~10, task 3 (5 000/s) ~12; task 0 keeps ~21.
    let to = |t: u32| moves.iter().find(|m| m.1 == t).map_or(0, |m| m.0.len());
    assert!(
        (19..=23).contains(&to(1)) && (8..=12).contains(&to(2)) && (10..=14).contains(&to(3)),
        "{moves:?}"
    );
    assert!((19..=23).contains(&(64 - moved.len())), "{moves:?}");
    assert!(d.reason.contains("even split"), "{}", d.reason);
    assert!(d.reason.contains("task 0 is hot"), "{}", d.reason);
    // Evenly loaded tasks at the same rates are not hot: a scale-out instead.
    let mut b = Autoscaler::new(config(), "aggregate", Some(BUDGET));
    let even = |t: u64| second(t, &[20_000.0; 4], 300.0 * t as f64, 900.0);
    let (_, d) = until_decision(&mut b, 1, 20, &routing(128, 4), even).expect("a decision");
    assert_eq!(d.kind, DecisionKind::ScaleOut);
}

#[test]
fn low_utilisation_for_three_windows_scales_in() {
    let mut a = Autoscaler::new(config(), "aggregate", Some(BUDGET));
    let r = routing(128, 4);
    // 4 tasks at 2 000/s of 20 000: 10 % busy. Demand 8 000 → 8 000 / 16 000 → 1 task.
    let idle = |t: u64| second(t, &[2_000.0; 4], 20.0, 30.0);
    let (t, d) = until_decision(&mut a, 1, 60, &r, idle).expect("a scale-in");
    assert_eq!(t, 30, "after 3 windows of 10 s");
    assert_eq!(d.kind, DecisionKind::ScaleIn);
    assert_eq!(d.request, ReconfigRequest::Rescale { operator: "aggregate".into(), parallelism: 1 });
    // min_parallelism bounds it.
    let mut b =
        Autoscaler::new(AutoscaleSection { min_parallelism: 2, ..config() }, "aggregate", Some(BUDGET));
    let (_, d) = until_decision(&mut b, 1, 60, &r, idle).expect("a scale-in");
    assert_eq!(d.request, ReconfigRequest::Rescale { operator: "aggregate".into(), parallelism: 2 });
    // Half busy: no scale-in.
    let mut c = Autoscaler::new(config(), "aggregate", Some(BUDGET));
    assert!(until_decision(&mut c, 1, 90, &r, |t| second(t, &[10_000.0; 4], 20.0, 30.0)).is_none());
}

#[test]
fn busy_time_counts_the_emulated_capacity() {
    // 10 000 records under a 20 000/s budget: half a second busy, though processing took 50 ms.
    assert_eq!(busy_ms(10_000.0, 50.0, Some(20_000.0)), 500.0);
    assert_eq!(busy_ms(10_000.0, 50.0, None), 50.0);
    // Not clamped: a sample that covers more than a second (the task held at the boundary).
    assert_eq!(busy_ms(90_000.0, 50.0, Some(20_000.0)), 4500.0);
}

#[test]
fn the_lag_slope_is_a_least_squares_fit() {
    assert!((slope(&[(0.0, 1.0), (1.0, 1.5), (2.0, 2.0)]) - 0.5).abs() < 1e-9);
    assert_eq!(slope(&[(0.0, 1.0)]), 0.0);
}

/// A keyed count behind a source, its stateful operator `count`.
fn graph() -> koala_dataflow::JobGraph {
    use koala_dataflow::{Dataflow, KeyedEvent, KeyedEvents, KeyedEventsConfig, SourceOptions, ValueState};
    let df = Dataflow::new();
    let config = KeyedEventsConfig { key_space: 3, records: Some(30), ..Default::default() };
    KeyedEvents::source(&df, "events", SourceOptions::default(), config)
        .key_by(|e: &KeyedEvent| e.key)
        .stateful_map("count", |key: &u64, _e: KeyedEvent, n: &mut ValueState<u64>| {
            (
                *key,
                n.update(|n| {
                    *n += 1;
                    *n
                }),
            )
        })
        .sink_json_lines("counts");
    df.build().expect("graph")
}

#[test]
fn bad_autoscale_settings_are_refused_naming_the_field_and_the_fix() {
    let g = graph();
    let check = |section: &str| -> Result<Option<koala_types::OperatorId>, String> {
        let text = format!("query = \"q\"\n[autoscale]\n{section}\n");
        let config = crate::JobConfig::parse(&text, "test").map_err(|e| e.to_string())?;
        config.autoscale.validate(&g, config.num_buckets).map_err(|e| e.to_string())
    };
    assert_eq!(check("enabled = true"), Ok(g.by_name("count").map(|o| o.id)), "the only stateful operator");
    assert_eq!(check(""), Ok(None), "off by default");
    for (section, field, fix) in [
        ("enabled = true\nwindow_s = 1", "autoscale.window_s", "outside 2..=3600"),
        ("enabled = true\nmax_parallelism = 500", "autoscale.max_parallelism", "num_buckets"),
        ("enabled = true\nmin_parallelism = 0", "autoscale.min_parallelism", "at least 1"),
        ("enabled = true\ntarget_utilisation = 1.5", "autoscale.target_utilisation", "(0, 1]"),
        (
            "enabled = true\nscale_in_utilisation = 0.9",
            "autoscale.scale_in_utilisation",
            "below target_utilisation",
        ),
        ("enabled = true\nhot_factor = 1.0", "autoscale.hot_factor", "above 1"),
        ("enabled = true\ntarget_latency_ms = -5", "autoscale.target_latency_ms", "positive"),
        ("enabled = true\noperator = \"events\"", "autoscale.operator", "stateful operators are count"),
        ("enabled = true\nwindow = 10", "unknown field `window`", "window_s"),
    ] {
        let err = check(section).expect_err(section);
        assert!(err.contains(field) && err.contains(fix), "{section}: {err}");
    }
}

/// Routing of 128 buckets over 4 tasks, and seconds of 4 tasks whose records in a second
/// jitter as the samples of a task held at the second's boundary do: task 0 alternates
/// `2 × hot` and 0 records (mean `hot`), the others take `other` each second.
fn jittery(t: u64, hot: f64, other: f64, lag_ms: f64) -> Second {
    let h = if t.is_multiple_of(2) { 2.0 * hot } else { 0.0 };
    second(t, &[h, other, other, other], lag_ms, 900.0)
}

#[test]
fn a_hot_task_whose_seconds_jitter_is_still_saturated_over_the_window() {
    // Task 0 takes 19 000/s on average (95 % of its 20 000/s budget) but its samples alternate
    // 38 000 and 0: a per-second busy clamped at 100 % averages 50 %, and the hot task went
    // unnoticed (the quick experiment's miss at 125 s). Busy time is summed over the window.
    let mut a = Autoscaler::new(config(), "aggregate", Some(BUDGET));
    let r = routing(128, 4);
    let (_, d) = until_decision(&mut a, 1, 20, &r, |t| jittery(t, 19_000.0, 4_000.0, 300.0 * t as f64))
        .expect("a decision");
    assert_eq!(d.kind, DecisionKind::Rebalance, "{}", d.reason);
    assert!(d.reason.contains("task 0 is hot"), "{}", d.reason);
    let ReconfigRequest::Rebalance { moves, .. } = &d.request else { panic!("{:?}", d.request) };
    assert!(moves.iter().all(|m| m.1 != 0 && m.0.iter().all(|b| r[usize::from(*b)] == 0)), "{moves:?}");
}

#[test]
fn overloaded_with_enough_tasks_by_ds2_and_not_draining_is_skew_and_rebalances() {
    // 4 tasks: task 0 saturated at 20 000/s, the others at 11 000/s (55 %: not hot by
    // hot_factor 2), the lag grows 0.1 s per s. Demand 53 000 / 0.9 = 58 900/s; DS2: 58 900 ÷
    // (20 000 × 0.8) → 4 tasks, as many as run. A fifth task would not help task 0: its buckets
    // must spread.
    let mut a = Autoscaler::new(config(), "aggregate", Some(BUDGET));
    let r = routing(128, 4);
    let skewed = |t: u64| second(t, &[20_000.0, 11_000.0, 11_000.0, 11_000.0], 100.0 * t as f64, 900.0);
    let (_, d) = until_decision(&mut a, 1, 20, &r, skewed).expect("a decision");
    assert_eq!(d.kind, DecisionKind::Rebalance, "{}", d.reason);
    assert!(d.reason.contains("skew"), "{}", d.reason);
    let ReconfigRequest::Rebalance { moves, .. } = &d.request else { panic!("{:?}", d.request) };
    assert!(!moves.is_empty() && moves.iter().all(|m| m.0.iter().all(|b| r[usize::from(*b)] == 0)));
    // Evenly loaded and not draining: the estimate is short, one task more (as before).
    let mut b = Autoscaler::new(config(), "aggregate", Some(BUDGET));
    let even = |t: u64| second(t, &[14_000.0; 4], 100.0 * t as f64, 900.0);
    let (_, d) = until_decision(&mut b, 1, 20, &r, even).expect("a decision");
    assert_eq!(d.kind, DecisionKind::ScaleOut, "{}", d.reason);
    assert_eq!(d.request, ReconfigRequest::Rescale { operator: "aggregate".into(), parallelism: 5 });
}

#[test]
fn a_hot_task_moves_its_hot_buckets_by_their_measured_rates() {
    // Task 0 owns 32 buckets; two of them (0 and 4) take 8 000/s each, its 30 others 100/s
    // each: 19 000/s of a 20 000/s budget. The others take 2 000/s each. Dealing its buckets
    // out evenly would move cold buckets and perhaps keep both hot ones; the per-bucket counts
    // say which to move: the two hot buckets, to two of the cold tasks, and nothing else.
    let mut a = Autoscaler::new(config(), "aggregate", Some(BUDGET));
    let r = routing(128, 4);
    let with_buckets = |t: u64| {
        let mut s = second(t, &[19_000.0, 2_000.0, 2_000.0, 2_000.0], 20.0 * t as f64, 900.0);
        s.tasks[0].buckets =
            (0..128u16).filter(|b| b % 4 == 0).map(|b| (b, if b < 8 { 8_000.0 } else { 100.0 })).collect();
        for task in 1..4u16 {
            s.tasks[usize::from(task)].buckets =
                (0..128u16).filter(|b| b % 4 == task).map(|b| (b, 2_000.0 / 32.0)).collect();
        }
        s
    };
    let (_, d) = until_decision(&mut a, 1, 20, &r, with_buckets).expect("a decision");
    assert_eq!(d.kind, DecisionKind::Rebalance, "{}", d.reason);
    let ReconfigRequest::Rebalance { moves, .. } = &d.request else { panic!("{:?}", d.request) };
    let mut moved: Vec<u16> = moves.iter().flat_map(|m| m.0.iter().copied()).collect();
    moved.sort_unstable();
    assert_eq!(moved, vec![0, 4], "the two hot buckets, and none of the 30 cold ones: {moves:?}");
    assert_eq!(moves.len(), 2, "to two different tasks: {moves:?}");
    assert!(d.reason.contains("measured rates"), "{}", d.reason);
    assert!(d.window.bucket_rate.contains(&(0, 8_000.0)), "{:?}", d.window.bucket_rate);
}

#[test]
fn the_packing_stops_once_the_hot_task_is_no_longer_the_most_loaded() {
    // Loads 10/1/1 with the hot task's buckets at 6, 3, 1: moving 6 to task 1 leaves 4 < 7.
    let load = skew::Load {
        tasks: [(0, 10.0), (1, 1.0), (2, 1.0)].into_iter().collect(),
        buckets: vec![6.0, 3.0, 1.0, 0.5, 0.5, 0.5, 0.5],
        measured: true,
    };
    let routing = [0, 0, 0, 1, 1, 2, 2];
    let (moves, after) = skew::plan(&load, 0, &routing);
    assert_eq!(moves, vec![(vec![0], 1)]);
    assert_eq!(after.get(&0), Some(&4.0));
    assert_eq!(after.get(&1), Some(&7.0));
}
