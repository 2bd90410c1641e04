//! An experiment's outputs: the overlay PNGs (one set per group of runs; the paper's 10 s moving
//! average, drawn at its middle), the CSVs (every run's seconds; the table) and the page,
//! `index.html`: what the experiment shows, its settings (emulation, partition policy, memory,
//! each run's protocol knobs), the table, its conclusions, the plots and links to every run's own
//! report and config.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context;
use koala_coordinator::metrics_store::MetricsStore;
use koala_coordinator::report::{
    ReportSummary, SecondRow, moving_average, write_overlay, write_throughput_overlay,
};

use super::engine::{Done, Table, groups, slug};
use super::{Info, Mode};

type Field = fn(&SecondRow) -> Option<f64>;

/// Overlay lines: legend name, points.
type Series = Vec<(&'static str, Vec<(f64, f64)>)>;

/// The metrics every group gets a plot of: file stem, title, unit, value.
const METRICS: [(&str, &str, &str, Field); 5] = [
    ("throughput", "Throughput (source records)", "records/s", |r| Some(r.throughput)),
    ("lag", "Source lag, mean", "ms", |r| r.lag_mean_ms),
    ("latency", "End-to-end latency, worst sink's median", "ms", |r| r.latency_p50_ms),
    ("batch_latency", "Per-batch latency, mean of the processing tasks", "µs", |r| r.batch_latency_mean_us),
    ("state_moved", "State moved per second (all kinds)", "MB/s", |r| Some(r.state_bytes_moved / 1e6)),
];

/// A legend name that lives as long as the plots need it (the overlay takes `&'static str`;
/// an experiment draws a few dozen).
fn leak(name: &str) -> &'static str {
    Box::leak(name.to_string().into_boxed_str())
}

/// Writes the overlay plots; returns their paths.
pub fn plots(
    done: &[Done],
    out: &Path,
    mode: Mode,
    per_task_of: Option<&str>,
) -> anyhow::Result<Vec<PathBuf>> {
    let window = mode.smoothing_s();
    let groups = groups(done);
    let mut files = Vec::new();
    for (group, runs) in &groups {
        let suffix = if groups.len() > 1 { format!("-{}", slug(group)) } else { String::new() };
        let reports: Vec<&ReportSummary> = runs.iter().map(|d| &d.report).collect();
        for (stem, title, unit, field) in METRICS {
            let series: Series = runs
                .iter()
                .map(|d| {
                    let points: Vec<(i64, f64)> =
                        d.report.table.rows.iter().filter_map(|r| Some((r.t_s, field(r)?))).collect();
                    (leak(&d.spec.label), smooth(&points, if stem == "state_moved" { 1 } else { window }))
                })
                .collect();
            let path = out.join(format!("{stem}{suffix}.png"));
            let smoothing = if stem == "state_moved" || window == 1 {
                String::new()
            } else {
                format!(" ({window} s moving average, drawn at its middle)")
            };
            let group_title = if groups.len() > 1 { format!("{group}: ") } else { String::new() };
            let title = format!("{group_title}{title}{smoothing}");
            if stem == "throughput" {
                // With the offered rate, as each run's own throughput plot.
                write_throughput_overlay(&path, &format!("{title} and the offered rate"), &series, &reports)?;
            } else {
                write_overlay(&path, &title, unit, &series, &reports)?;
            }
            files.push(path);
        }
    }
    if let Some(operator) = per_task_of {
        for d in done {
            let path = out.join(format!("tasks-{}.png", slug(&d.spec.label)));
            let series = per_task(d, operator, window)?;
            write_overlay(
                &path,
                &format!("{}: records/s into each {operator} task", d.spec.label),
                "records/s",
                &series,
                &[&d.report],
            )?;
            files.push(path);
        }
    }
    Ok(files)
}

fn smooth(points: &[(i64, f64)], window: i64) -> Vec<(f64, f64)> {
    if window <= 1 {
        return points.iter().map(|(t, v)| (*t as f64, *v)).collect();
    }
    moving_average(points, window)
        .into_iter()
        .map(|(t, v)| (t as f64 + 1.0 - window as f64 / 2.0, v))
        .collect()
}

/// Records in per second of each task of `operator` in `d`'s run.
fn per_task(d: &Done, operator: &str, window: i64) -> anyhow::Result<Series> {
    let db = d.config.metrics_path();
    let store = MetricsStore::open(&db).with_context(|| format!("opening {}", db.display()))?;
    let samples = store.task_samples(&d.report.run.run, koala_types::metric::RECORDS_IN)?;
    let start_s = (d.report.run.started_ms / 1000) as i64;
    let prefix = format!("{operator}.");
    let mut by_task: std::collections::BTreeMap<String, Vec<(i64, f64)>> = Default::default();
    for (task, t, v) in samples {
        if task.starts_with(&prefix) {
            by_task.entry(task).or_default().push((t as i64 - start_s, v));
        }
    }
    Ok(by_task.into_iter().map(|(task, points)| (leak(&task), smooth(&points, window))).collect())
}

/// Writes `runs.csv` (every run's seconds) and `summary.csv` (the table); returns their paths.
pub fn csvs(done: &[Done], table: &Table, out: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut rows = String::from(
        "run,group,protocol,t_s,throughput,offered,lag_mean_ms,lag_p99_ms,latency_p50_ms,latency_p99_ms,batch_latency_mean_us,state_bytes_moved\n",
    );
    let opt = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v}"));
    for d in done {
        for r in &d.report.table.rows {
            let _ = writeln!(
                rows,
                "{},{},{},{},{},{},{},{},{},{},{},{}",
                csv_cell(&d.spec.label),
                csv_cell(&d.spec.group),
                d.report.run.protocol,
                r.t_s,
                r.throughput,
                opt(r.offered),
                opt(r.lag_mean_ms),
                opt(r.lag_p99_ms),
                opt(r.latency_p50_ms),
                opt(r.latency_p99_ms),
                opt(r.batch_latency_mean_us),
                r.state_bytes_moved
            );
        }
    }
    let mut summary = table.columns.join(",");
    for r in &table.rows {
        summary.push('\n');
        summary.push_str(&r.iter().map(|c| csv_cell(c)).collect::<Vec<_>>().join(","));
    }
    summary.push('\n');
    let mut files = Vec::new();
    for (name, text) in [("runs.csv", rows), ("summary.csv", summary)] {
        let path = out.join(name);
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        files.push(path);
    }
    Ok(files)
}

fn csv_cell(s: &str) -> String {
    if s.contains([',', '"', '\n']) { format!("\"{}\"", s.replace('"', "\"\"")) } else { s.to_string() }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// Everything the page shows.
pub struct Page<'a> {
    pub info: &'a Info,
    pub mode: Mode,
    pub head: &'a [String],
    pub table: &'a Table,
    pub conclusions: &'a [String],
    pub plots: &'a [PathBuf],
    pub csvs: &'a [PathBuf],
    pub runs: &'a [Done],
    pub failed: &'a [String],
}

/// A path relative to `out` for a link.
fn rel(path: &Path, out: &Path) -> String {
    esc(&path.strip_prefix(out).unwrap_or(path).display().to_string())
}

/// Each protocol's knobs as the run's config set them.
pub fn knobs(config: &koala_coordinator::JobConfig) -> String {
    use koala_protocol::Protocol;
    let own = match config.protocol {
        Protocol::Koala => format!(
            "extra_keys = {}, drain_keys_per_sec = {}, max_queued_records = {}",
            config.extra_keys, config.drain_keys_per_sec, config.runtime.max_queued_records
        ),
        Protocol::Drrs => format!("[drrs] {:?}", config.drrs),
        Protocol::Remote => format!(
            "[state] backend = remote, state servers: {}",
            config.state.servers.map_or("1".to_string(), |n| n.to_string())
        ),
        Protocol::StopAndRestart => {
            "moves every reassigned bucket while the affected tasks pause".to_string()
        }
    };
    format!(
        "{}: {own}; {}; batch_records = {}, channel_capacity = {}, partition policy {}",
        config.protocol_label(),
        config.runtime.capacity_line(),
        config.runtime.batch_records,
        config.runtime.channel_capacity,
        crate::settings::policy_name(config.partition_policy)
    )
}

impl Page<'_> {
    /// Writes `index.html` into `out`; returns its path.
    pub fn write(&self, out: &Path) -> anyhow::Result<PathBuf> {
        let mut html = format!(
            "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>koala experiment {name}</title>\
             <style>body{{font-family:sans-serif}} td,th{{padding:2px 8px;text-align:right}} \
             td:first-child,th:first-child{{text-align:left}} table{{border-collapse:collapse}} \
             tr:nth-child(even){{background:#f2f2f2}}</style></head>\n<body>\n\
             <h1>koala experiment {name} ({mode})</h1>\n<p><b>{figure}</b>: {shows}</p>\n\
             <p>Command: <code>koala experiment {name}{flag}</code> (quick: {quick}; full: {full})</p>\n<h2>Settings</h2>\n<ul>\n",
            name = esc(self.info.name),
            mode = self.mode.name(),
            figure = esc(self.info.figure),
            shows = esc(self.info.shows),
            flag = self.mode.flag(),
            quick = esc(self.info.quick),
            full = esc(self.info.full),
        );
        for line in self.head.iter().skip(1) {
            let _ = writeln!(html, "<li>{}</li>", esc(line));
        }
        html.push_str("</ul>\n<h3>Each run's protocol knobs and emulation</h3>\n<ul>\n");
        for d in self.runs {
            let _ = writeln!(
                html,
                "<li>{}: {} (<a href=\"{}\">config</a>, <a href=\"{}\">report</a>)</li>",
                esc(&d.spec.label),
                esc(&knobs(&d.config)),
                rel(&d.dir.join("job.toml"), out),
                rel(&d.dir.join("report.html"), out)
            );
        }
        html.push_str("</ul>\n<h2>Results</h2>\n<table>\n<tr>");
        for c in &self.table.columns {
            let _ = write!(html, "<th>{}</th>", esc(c));
        }
        html.push_str("</tr>\n");
        for r in &self.table.rows {
            html.push_str("<tr>");
            for c in r {
                let _ = write!(html, "<td>{}</td>", esc(c));
            }
            html.push_str("</tr>\n");
        }
        html.push_str("</table>\n");
        if !self.runs.is_empty() {
            html.push_str("<p>Recovery: seconds from the reconfiguration's start until end-to-end latency (lag rec.: source lag) is back to its level before the surge; '&gt; N s' = not seen before the input ended. Batch latency: mean in the 5 s before the reconfiguration → 1–11 s after.</p>\n");
        }
        if !self.conclusions.is_empty() {
            html.push_str("<h3>Conclusions</h3>\n<ul>\n");
            for line in self.conclusions {
                let _ = writeln!(html, "<li>{}</li>", esc(line));
            }
            html.push_str("</ul>\n");
        }
        if !self.failed.is_empty() {
            html.push_str("<h3>Runs that failed</h3>\n<ul>\n");
            for line in self.failed {
                let _ = writeln!(html, "<li>{}</li>", esc(line));
            }
            html.push_str("</ul>\n");
        }
        html.push_str("<h2>Data</h2>\n<p>");
        for f in self.csvs {
            let _ = write!(html, "<a href=\"{0}\">{0}</a> ", rel(f, out));
        }
        html.push_str("</p>\n<h2>Plots</h2>\n<p>Shaded spans: reconfigurations, in each run's colour.</p>\n");
        for p in self.plots {
            let _ = writeln!(html, "<img src=\"{0}\" alt=\"{0}\"><br>", rel(p, out));
        }
        html.push_str("</body></html>\n");
        let path = out.join("index.html");
        std::fs::write(&path, html).with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    }
}
