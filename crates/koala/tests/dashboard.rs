//! The coordinator's HTTP side on a running job (`koala run`): the JSON API shows the job and
//! rejects a bad request with the CLI's words, `/metrics` passes a strict exposition-format
//! parser with the labels the deployment implies, and the dashboard, loaded in headless
//! Chromium, draws live data and carries out a rescale submitted from its form. The screenshot
//! is kept at `$CARGO_TARGET_TMPDIR/dashboard.png`.
//!
//! Without a `chromium` binary the test fails, unless `KOALA_SKIP_BROWSER=1` is set (a person's
//! choice; CI never sets it): then the rescale goes through the API instead of the page, and
//! every check of the job itself still runs.

#[path = "dashboard/cdp.rs"]
mod cdp;
mod common;
#[path = "dashboard/exposition.rs"]
mod exposition;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::koala;
use serde_json::Value;

/// Kills the job if the test fails before it ends.
struct Job(Child);

impl Drop for Job {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// One HTTP/1.1 exchange: (status, body).
fn http(addr: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).expect("connect to the coordinator's HTTP port");
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("send");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("answer");
    let status = out.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, out.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default())
}

fn get_json(addr: &str, path: &str) -> Value {
    let (status, body) = http(addr, "GET", path, "");
    assert_eq!(status, 200, "GET {path}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: not JSON ({e}): {body}"))
}

/// Polls `probe` until it returns `Some`, at most `limit`.
fn wait<T>(what: &str, limit: Duration, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = probe() {
            return v;
        }
        assert!(Instant::now() < deadline, "waited {limit:?} for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn parallelism(job: &Value, op: &str) -> Option<u64> {
    job["deployment"]["parallelism"][op].as_u64()
}

/// The browser to drive, or `None` when `KOALA_SKIP_BROWSER=1` names the skip; no browser and
/// no skip variable fails the test.
fn browser_binary() -> Option<String> {
    let skip = std::env::var("KOALA_SKIP_BROWSER").is_ok_and(|v| v == "1");
    match cdp::chromium() {
        Some(binary) => Some(binary),
        None if skip => {
            println!(
                "KOALA_SKIP_BROWSER=1: the dashboard's browser part is skipped; the API and the job are checked"
            );
            None
        }
        None => panic!(
            "no chromium binary: the dashboard test drives the page in headless Chromium. Install it \
             (`apt-get install chromium`; scripts/test does), or set KOALA_SKIP_BROWSER=1 to skip the browser part"
        ),
    }
}

#[test]
fn api_metrics_and_dashboard_of_a_running_job() {
    let browser_binary = browser_binary();
    let dir = tempfile::tempdir().expect("tempdir");
    let config = format!(
        "query = \"keyed-aggregate\"\nworkers = 2\nduration_s = 20\nnum_buckets = 16\noutput_dir = \"{}\"\n\
         [parallelism]\nsource = 2\naggregate = 2\nsink = 1\n\
         [params]\nsink = \"discard\"\n[params.source]\nrate = [{{ at_ms = 0, records_per_sec = 4000.0 }}]\n",
        dir.path().join("out").display()
    );
    let path = dir.path().join("job.toml");
    std::fs::write(&path, config).expect("write config");
    let mut child = koala().arg("run").arg(&path).stdout(Stdio::piped()).spawn().expect("start job");
    let stdout = child.stdout.take().expect("stdout");
    let mut job = Job(child);
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line.clone());
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    let (mut control, mut web) = (None, None);
    while control.is_none() || web.is_none() {
        let line = rx.recv_timeout(Duration::from_secs(60)).expect("koala run prints its addresses");
        if let Some(rest) = line.strip_prefix("coordinator at ") {
            control = rest.split_whitespace().next().map(str::to_string);
        }
        if let Some(rest) = line.strip_prefix("dashboard at http://") {
            web = rest.split('/').next().map(str::to_string);
        }
    }
    let (control, web) = (control.unwrap_or_default(), web.unwrap_or_default());

    // The job and its deployment.
    let job_json = wait("the job to run", Duration::from_secs(60), || {
        let j = get_json(&web, "/api/job");
        (j["phase"] == "running").then_some(j)
    });
    let names: Vec<&str> =
        job_json["operators"].as_array().into_iter().flatten().filter_map(|o| o["name"].as_str()).collect();
    assert_eq!(names, ["source", "aggregate", "sink"], "{job_json}");
    assert_eq!(parallelism(&job_json, "aggregate"), Some(2), "{job_json}");
    // Checkpoints as data: off in this job, nothing completed.
    let checkpoints = &job_json["checkpoints"];
    assert_eq!(
        (&checkpoints["enabled"], &checkpoints["interval_ms"], &checkpoints["last"]),
        (&Value::Bool(false), &Value::Null, &Value::Null),
        "{job_json}"
    );
    let tasks = job_json["deployment"]["tasks"].as_array().cloned().unwrap_or_default();
    let buckets: u64 =
        tasks.iter().filter(|t| t["operator"] == "aggregate").filter_map(|t| t["buckets"].as_u64()).sum();
    assert_eq!(buckets, 16, "every bucket has an aggregate task: {job_json}");
    let worker_of = |task: &str| tasks.iter().find(|t| t["task"] == task).and_then(|t| t["worker"].as_u64());

    // A bad request: the CLI's words over HTTP, from the same path.
    for (body, args) in [
        (r#"{"operator": "nope", "parallelism": 2}"#, ["--operator", "nope", "--parallelism", "2"]),
        (
            r#"{"operator": "aggregate", "parallelism": 17}"#,
            ["--operator", "aggregate", "--parallelism", "17"],
        ),
    ] {
        let (status, answer) = http(&web, "POST", "/api/rescale", body);
        let error: Value = serde_json::from_str(&answer).expect("JSON error");
        let error = error["error"].as_str().unwrap_or_default().to_string();
        assert_eq!(status, 422, "{answer}");
        let cli =
            koala().args(["rescale", "--coordinator", &control]).args(args).output().expect("koala rescale");
        assert!(!cli.status.success());
        assert_eq!(
            String::from_utf8_lossy(&cli.stderr).trim(),
            format!("error: {error}"),
            "HTTP and CLI differ"
        );
    }

    // Prometheus: strictly valid, labelled by the deployment, counters growing.
    let scrape = || {
        let (status, text) = http(&web, "GET", "/metrics", "");
        assert_eq!(status, 200);
        exposition::parse(&text)
            .unwrap_or_else(|e| panic!("/metrics is not valid exposition text: {e}\n{text}"))
    };
    let records_in = |samples: &[exposition::Sample], task: &str| {
        samples
            .iter()
            .find(|s| s.name == "koala_records_in_total" && s.labels["task"] == task)
            .map(|s| s.value)
    };
    let (types, first) = wait("source records in /metrics", Duration::from_secs(20), || {
        let (types, samples) = scrape();
        let has_latency = samples.iter().any(|s| s.name == "koala_e2e_latency_seconds");
        (records_in(&samples, "source.0").is_some_and(|v| v > 0.0) && has_latency).then_some((types, samples))
    });
    assert_eq!(types.get("koala_records_in_total").map(String::as_str), Some("counter"));
    assert_eq!(types.get("koala_e2e_latency_seconds").map(String::as_str), Some("gauge"));
    for s in first.iter().filter(|s| s.labels.contains_key("task")) {
        let task = &s.labels["task"];
        assert_eq!(Some(s.labels["operator"].as_str()), task.rsplit_once('.').map(|(op, _)| op), "{s:?}");
        assert_eq!(s.labels["worker"].parse::<u64>().ok(), worker_of(task), "{s:?}");
    }
    let quantiles: Vec<&str> = first
        .iter()
        .filter(|s| s.name == "koala_e2e_latency_seconds")
        .map(|s| s.labels["quantile"].as_str())
        .collect();
    assert!(quantiles.contains(&"0.5") && quantiles.contains(&"0.99"), "{quantiles:?}");
    let before = records_in(&first, "source.0").unwrap_or(0.0);
    wait("the records_in counter to grow", Duration::from_secs(10), || {
        records_in(&scrape().1, "source.0").is_some_and(|v| v > before).then_some(())
    });

    match browser_binary {
        Some(binary) => dashboard_in_a_browser(&binary, &web, dir.path()),
        None => {
            // The rescale the page would submit, through the same API.
            let (status, answer) =
                http(&web, "POST", "/api/rescale", r#"{"operator": "aggregate", "parallelism": 3}"#);
            assert_eq!(status, 200, "{answer}");
            wait("the API to show 3 aggregate tasks", Duration::from_secs(15), || {
                (parallelism(&get_json(&web, "/api/job"), "aggregate") == Some(3)).then_some(())
            });
        }
    }
    let history = wait("the rescale to complete", Duration::from_secs(15), || {
        let history = get_json(&web, "/api/reconfigurations");
        (history["reconfigurations"][0]["completed"] == Value::Bool(true)).then_some(history)
    });
    let first_reconfiguration = &history["reconfigurations"][0];
    assert_eq!(
        (
            &first_reconfiguration["epoch"],
            &first_reconfiguration["kind"],
            &first_reconfiguration["completed"]
        ),
        (&Value::from(1), &Value::from("scale_out"), &Value::Bool(true)),
        "{history}"
    );

    let status = job.0.wait().expect("job exits");
    let log = reader.join().expect("reader");
    assert!(status.success(), "the job failed:\n{log}");
    assert!(
        log.contains("epoch 1 scale_out of aggregate"),
        "the report lacks the dashboard's rescale:\n{log}"
    );
}

/// The dashboard in headless Chromium: the charts fill with live data and the form's rescale is
/// accepted and shown.
fn dashboard_in_a_browser(binary: &str, web: &str, dir: &std::path::Path) {
    let profile = dir.join("chromium");
    let mut browser = cdp::Browser::open(binary, &format!("http://{web}/"), &profile);
    let charts_have_data = "Number(document.body.dataset.updates || 0) >= 2 && \
        ['throughput', 'latency', 'lag', 'batch', 'queued'].every(id => Number(document.getElementById('chart-' + id).dataset.points) > 0)";
    assert!(
        browser.wait_for(charts_have_data, Duration::from_secs(15)),
        "the charts got no data: {}",
        browser.eval(
            "JSON.stringify([...document.querySelectorAll('canvas')].map(c => [c.id, c.dataset.points]))"
        )
    );
    browser.eval(
        "(() => { document.getElementById('kind').value = 'rescale'; document.getElementById('kind').dispatchEvent(new Event('change')); \
         document.getElementById('operator').value = 'aggregate'; document.getElementById('parallelism').value = '3'; \
         document.getElementById('submit').click(); return true; })()",
    );
    assert!(
        browser
            .wait_for("document.getElementById('answer').dataset.status === '200'", Duration::from_secs(10)),
        "the page's rescale was not accepted: {}",
        browser.eval("document.getElementById('answer').textContent")
    );
    assert_eq!(
        browser.eval("document.getElementById('answer').textContent"),
        "accepted as reconfiguration 1"
    );
    wait("the API to show 3 aggregate tasks", Duration::from_secs(15), || {
        (parallelism(&get_json(web, "/api/job"), "aggregate") == Some(3)).then_some(())
    });
    assert!(
        browser.wait_for(
            "document.querySelector('tr[data-operator=aggregate]')?.dataset.tasks === '3' && \
             (window.koala.metrics?.reconfigurations || []).some(r => r.epoch === 1 && r.end_s !== null)",
            Duration::from_secs(10)
        ),
        "the page does not show the new deployment and the completed reconfiguration"
    );
    assert_eq!(
        browser.eval("document.getElementById('checkpoints').textContent"),
        "checkpoints off (set checkpoint_interval_ms to turn them on)"
    );
    let shot = browser.screenshot();
    assert!(shot.starts_with(b"\x89PNG") && shot.len() > 10_000, "screenshot of {} bytes", shot.len());
    let artifact = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard.png");
    std::fs::write(&artifact, &shot).expect("write the screenshot");
    println!("dashboard screenshot: {}", artifact.display());
    drop(browser);
}
