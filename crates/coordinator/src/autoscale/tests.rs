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
                busy_ms: observe::busy_ms(*r, 100.0, 500.0, Some(BUDGET)),
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
    // Its 64 buckets dealt over 4 tasks: it keeps 16, each other gets 16.
    assert_eq!(moved.len(), 48, "{moves:?}");
    for to in [1, 2, 3] {
        assert_eq!(moves.iter().find(|m| m.1 == to).map(|m| m.0.len()), Some(16), "{moves:?}");
    }
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
    assert_eq!(observe::busy_ms(10_000.0, 100.0, 500.0, Some(20_000.0)), 500.0);
    assert_eq!(observe::busy_ms(10_000.0, 100.0, 500.0, None), 50.0);
    assert_eq!(observe::busy_ms(90_000.0, 100.0, 500.0, Some(20_000.0)), 1000.0);
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
