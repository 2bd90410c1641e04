//! `koala experiment`'s overlays: several runs' series of one metric on one plot, each run's
//! reconfigurations as spans in its line's colour, and beside throughput the offered rate, drawn
//! as a run's own report draws them ([`super::render`]).

use std::path::Path;

use super::{ReportError, ReportSummary, Span, render};

/// Writes one PNG overlaying several runs' series of one metric (name, (second, value) points),
/// with every run's reconfigurations as spans in its line's colour (`runs[i]` for `series[i]`):
/// `koala experiment`'s comparison plots, drawn as the report's.
pub fn write_overlay(
    path: &Path,
    title: &str,
    unit: &str,
    series: &[(&'static str, Vec<(f64, f64)>)],
    runs: &[&ReportSummary],
) -> Result<(), ReportError> {
    overlay(path, title, unit, series, &[], runs)
}

/// The overlay's drawing: the runs' `series`, then the `extra` lines (the offered rate).
fn overlay(
    path: &Path,
    title: &str,
    unit: &str,
    series: &[(&'static str, Vec<(f64, f64)>)],
    extra: &[(&'static str, Vec<(f64, f64)>)],
    runs: &[&ReportSummary],
) -> Result<(), ReportError> {
    let spans: Vec<Span> = runs
        .iter()
        .enumerate()
        .flat_map(|(i, run)| {
            render::spans(run).into_iter().map(move |s| Span {
                label: format!("{} {}", series.get(i).map_or("", |s| s.0), s.label),
                legend: format!("{} {}", series.get(i).map_or("", |s| s.0), s.legend),
                colour_of: Some(i),
                ..s
            })
        })
        .collect();
    render::draw_overlay(path, title, unit, series, extra, &spans)
        .map_err(|message| ReportError::Plot { path: path.to_path_buf(), message })
}

/// [`write_overlay`] of throughput series with the offered rate beside them ([`overlay_offered`]),
/// as each run's own `throughput.png` draws it.
pub fn write_throughput_overlay(
    path: &Path,
    title: &str,
    series: &[(&'static str, Vec<(f64, f64)>)],
    runs: &[&ReportSummary],
) -> Result<(), ReportError> {
    let offered: Vec<_> = overlay_offered(runs).into_iter().collect();
    overlay(path, title, "records/s", series, &offered, runs)
}

/// The offered-rate line of an overlay: the first run's with a rate schedule (the runs of one
/// `koala experiment` or `compare` share their settings, so one line stands for all), each
/// second's value at its middle; `None` if no run has a finite schedule.
pub fn overlay_offered(runs: &[&ReportSummary]) -> Option<(&'static str, Vec<(f64, f64)>)> {
    runs.iter()
        .map(|run| render::offered_points(&run.table.rows))
        .find(|points| !points.is_empty())
        .map(|points| (render::OFFERED_NAME, points))
}
