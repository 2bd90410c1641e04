//! Lazy windows, measured (docs/protocols.md §6; issue 26): `examples/lazy-windows.toml` — a
//! tumbling window padded to 1 KiB per key with 1 048 576 keys in open windows, scaled out 2 → 4
//! — under stop-and-restart and under Koala, printing the bytes each hand-over shipped
//! (Σ `state_bytes_eager` from the run's metrics database). A Koala hand-over carries timers, not
//! the windows' state, so it ships at most a tenth of what stop-and-restart moves. `#[ignore]`d:
//! each run writes about 1.1 GB of state and takes about 40 s; run it with
//! `cargo test --profile ci -p koala --test lazy_windows -- --ignored --nocapture`.

mod common;

use std::time::Duration;

use common::run_koala;
use common::verify::RunRecord;
use koala_types::metric;

/// What one run of the example under `protocol` shipped at its hand-over.
struct HandOver {
    eager: f64,
    on_demand: f64,
    /// Records the window tasks took in the seconds before the scale-out's: the keys of the first
    /// 1 048 576 records are all distinct, so at least this many keys (up to that) had open windows.
    before: f64,
    completed: usize,
}

fn run(protocol: &str) -> HandOver {
    let example = common::repo_root().join("examples/lazy-windows.toml");
    let text = std::fs::read_to_string(&example).expect("examples/lazy-windows.toml");
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("out");
    // Top-level keys go before the example's first table.
    let config = format!("protocol = \"{protocol}\"\noutput_dir = \"{}\"\n{text}", out.display());
    let run = run_koala(dir.path(), &config, Duration::from_secs(600));
    assert!(run.success(), "{protocol}: {}", run.failure());
    let rec = RunRecord::read(&out.join("metrics.db")).expect("metrics");
    let start_s = rec.reconfigurations.first().map_or(0, |r| r.started_ms / 1000);
    let db = rusqlite::Connection::open(out.join("metrics.db")).expect("metrics db");
    let before: f64 = db
        .query_row(
            "SELECT COALESCE(SUM(value), 0) FROM metrics WHERE run = ?1 AND metric = ?2 AND task LIKE 'window.%' AND time < ?3",
            rusqlite::params![rec.run, metric::RECORDS_IN, start_s as i64],
            |r| r.get(0),
        )
        .expect("records before the scale-out");
    HandOver {
        eager: rec.total(metric::STATE_BYTES_EAGER),
        on_demand: rec.total(metric::STATE_BYTES_ON_DEMAND),
        before,
        completed: rec.completed(),
    }
}

#[test]
#[ignore = "a measurement: ~1.1 GB of state per run, about 40 s each"]
fn koala_hand_over_ships_a_tenth_of_stop_and_restarts() {
    let mib = |b: f64| b / (1024.0 * 1024.0);
    let sr = run("stop-and-restart");
    let koala = run("koala");
    for (name, r) in [("stop-and-restart", &sr), ("koala", &koala)] {
        println!(
            "{name:>16}: hand-over {:>10.0} B ({:.1} MiB), on demand over the run {:.1} MiB, {} reconfiguration(s), {:.0} records into the windows before it",
            r.eager,
            mib(r.eager),
            mib(r.on_demand),
            r.completed,
            r.before
        );
    }
    let ratio = koala.eager / sr.eager;
    println!("koala / stop-and-restart hand-over bytes: {:.2} %", ratio * 100.0);
    assert_eq!((sr.completed, koala.completed), (1, 1));
    for r in [&sr, &koala] {
        assert!(r.before >= 1_048_576.0, "only {} keys in open windows at the scale-out", r.before);
    }
    // Half of 1 048 576 keys of ~1 KiB move under stop-and-restart.
    assert!(sr.eager > 400.0 * 1024.0 * 1024.0, "stop-and-restart moved only {:.1} MiB", mib(sr.eager));
    assert!(ratio <= 0.10, "koala shipped {:.2} % of stop-and-restart's hand-over", ratio * 100.0);
}
