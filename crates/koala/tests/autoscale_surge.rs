//! The reconfiguration policy (`[autoscale]`) reaches the running job: a keyed aggregate whose
//! two tasks may each process 2 000 records/s gets a surge to 8 000/s; the policy must decide a
//! scale-out and the job must run it. Judged from the job's own records — the metrics DB's
//! `reconfigurations` (started and completed epochs) and `autoscale_decisions` tables — never by
//! timing: the config schedules no reconfiguration, so every one the job ran was the policy's.

mod common;

use common::verify::RunRecord;
use koala_coordinator::metrics_store::MetricsStore;

const BUDGET: f64 = 2_000.0;
const RECORDS: u64 = 36_000;

#[test]
fn a_surge_makes_the_policy_scale_the_running_job_out() {
    let dir = tempfile::tempdir().expect("tempdir");
    let generator = common::generator(RECORDS, 5);
    let mut config = common::config_top(
        dir.path(),
        "keyed-aggregate",
        "protocol = \"koala\"",
        &[("source", 2), ("aggregate", 2), ("sink", 1)],
        &generator,
        "",
    );
    // 2 000/s for 3 s (half the 2 × 2 000 the aggregate may take), then 8 000/s: a backlog
    // grows by 4 000/s until the policy adds tasks. Windows of 2 s keep the run short.
    config.push_str(&format!(
        "rate = [{{ at_ms = 0, records_per_sec = 2000.0 }}, {{ at_ms = 3000, records_per_sec = 8000.0 }}]\n\n\
         [runtime]\ntask_records_per_sec = {BUDGET}\n\n\
         [autoscale]\nenabled = true\nwindow_s = 2\ncooldown_s = 1\ntarget_latency_ms = 200\nmax_parallelism = 6\n"
    ));
    let (out, stdout) = common::run_job_logged(dir.path(), &config);
    let db = out.join("metrics.db");
    let rec = RunRecord::read(&db).expect("run record");
    let store = MetricsStore::open(&db).expect("metrics db");
    let decisions = store.autoscale_decisions(&rec.run).expect("decisions");
    let first = decisions
        .iter()
        .find(|d| d.kind == "scale_out")
        .unwrap_or_else(|| panic!("the policy decided no scale-out: {decisions:?}\n{stdout}"));
    assert!(
        first.request.contains(r#""type":"rescale""#) && first.request.contains("aggregate"),
        "{first:?}"
    );
    assert!(first.reason.contains("DS2"), "the decision does not say why: {first:?}");
    // The coordinator accepted it as an epoch, and that epoch ran to completion as a scale-out.
    let epoch: u64 = first
        .outcome
        .strip_prefix("accepted as reconfiguration ")
        .and_then(|e| e.parse().ok())
        .unwrap_or_else(|| panic!("the scale-out was not accepted: {first:?}\n{stdout}"));
    let run = rec
        .reconfigurations
        .iter()
        .find(|r| r.epoch == epoch)
        .unwrap_or_else(|| panic!("no reconfiguration {epoch} recorded: {:?}", rec.reconfigurations));
    assert_eq!((run.kind.as_str(), run.operator.as_str()), ("scale_out", "aggregate"), "{run:?}");
    assert!(run.completed_ms.is_some(), "the policy's scale-out never completed: {run:?}\n{stdout}");
    assert!(
        run.detail.contains(&first.request),
        "the job ran {} for the decision {}",
        run.detail,
        first.request
    );
    // Every reconfiguration the job ran was one of the policy's decisions, and it printed each.
    assert_eq!(
        rec.reconfigurations.len(),
        decisions.iter().filter(|d| d.outcome.starts_with("accepted")).count()
    );
    assert!(stdout.contains("autoscale: scale_out"), "koala run did not print the decision:\n{stdout}");
    // The report shows it too.
    let report = common::koala()
        .arg("report")
        .arg(&db)
        .arg("--out")
        .arg(dir.path().join("report"))
        .output()
        .expect("koala report");
    let text = String::from_utf8_lossy(&report.stdout);
    assert!(text.contains("autoscale at t="), "koala report does not show the decisions:\n{text}");
    // And the job still processed every record once.
    let processed: f64 = rec
        .sums
        .iter()
        .filter(|((task, metric), _)| {
            task.starts_with("aggregate.") && metric == koala_types::metric::RECORDS_IN
        })
        .map(|(_, v)| v)
        .sum();
    assert_eq!(processed as u64, RECORDS, "records the aggregate processed");
}
