//! Rendering of a [`ReportSummary`](super::ReportSummary): PNG plots (plotters, bitmap backend)
//! with reconfigurations marked, and the HTML page that embeds them (docs/architecture.md §9).
//!
//! Plot text needs a font; plotters' `ab_glyph` feature renders a TrueType file registered at
//! run time (pure Rust, no fontconfig/freetype). Without a font the plots are drawn without text.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::prelude::*;

use super::{MIB, ReportError, ReportSummary, SecondRow};

/// Font files tried, in order, for plot text; without any, plots are drawn without text.
pub(super) const FONT_CANDIDATES: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
];
const PLOT_SIZE: (u32, u32) = (1400, 450);

/// Registers a system font with plotters once per process; `false` if none could be loaded.
pub(super) fn plot_font_ready() -> bool {
    static READY: OnceLock<bool> = OnceLock::new();
    *READY.get_or_init(|| {
        FONT_CANDIDATES.iter().any(|path| match std::fs::read(path) {
            // plotters keeps fonts for the whole process, so the bytes must live as long.
            Ok(bytes) => plotters::style::register_font(
                "sans-serif",
                FontStyle::Normal,
                Box::leak(bytes.into_boxed_slice()),
            )
            .is_ok(),
            Err(_) => false,
        })
    })
}

/// One line of a plot: name, colour, points.
type Line = (&'static str, RGBColor, Vec<(f64, f64)>);

/// A reconfiguration drawn as a shaded span from its start to its completion (seconds since the
/// run's start second, to the millisecond), labelled on the plot and named in the legend.
#[derive(Debug, Clone, PartialEq)]
pub struct Span {
    /// Start, s.
    pub start_s: f64,
    /// Completion, s (`None`: it did not complete; drawn to the end of the plot).
    pub end_s: Option<f64>,
    /// The label drawn at the span's top (the epoch).
    pub label: String,
    /// The legend's words for it.
    pub legend: String,
    /// Which line's colour it takes (`None`: the reconfiguration colour): `koala experiment`
    /// gives every protocol's span its line's colour.
    pub colour_of: Option<usize>,
}

/// The colour of reconfiguration spans.
const SPAN_COLOUR: RGBColor = RGBColor(230, 120, 0);
/// The narrowest a span is drawn, s (a hand-over of a few ms must stay visible).
const SPAN_MIN_WIDTH_S: f64 = 0.15;
/// Width of the legend panel right of the data, pixels.
const LEGEND_WIDTH: u32 = 390;

/// The spans of a report's reconfigurations: `1: 6.20→6.23 s scale_out window`.
pub(super) fn spans(summary: &ReportSummary) -> Vec<Span> {
    summary
        .reconfigurations
        .iter()
        .map(|r| {
            let c = &r.reconfiguration;
            let end = r.end_s.map_or_else(|| "not completed".to_string(), |e| format!("{e:.2} s"));
            Span {
                start_s: r.start_s,
                end_s: r.end_s,
                label: c.epoch.to_string(),
                legend: format!("{}: {:.2}→{end} {} {}", c.epoch, r.start_s, c.kind, c.operator),
                colour_of: None,
            }
        })
        .collect()
}

/// The offered rate's line: its name and colour, the same in a run's report and in the overlays.
pub(super) const OFFERED_NAME: &str = "offered (rate schedule)";
const OFFERED_COLOUR: RGBColor = BLACK;

/// A run's offered rate per second, each second's value at its middle (as every line is drawn).
pub(super) fn offered_points(rows: &[SecondRow]) -> Vec<(f64, f64)> {
    rows.iter().filter_map(|r| Some((r.t_s as f64 + 0.5, r.offered?))).collect()
}

/// One plot: file name, title, unit of its y axis, lines.
type Plot = (&'static str, &'static str, &'static str, Vec<Line>);

/// The plots of a run's per-second rows, each with its lines.
pub(super) fn plots(rows: &[SecondRow]) -> [Plot; 5] {
    // A second's value is drawn at its middle: the spans are placed to the millisecond, so state
    // moved in second 8 by a reconfiguration at 8.47 s is drawn under its span, not before it.
    let line = |f: &dyn Fn(&SecondRow) -> Option<f64>| -> Vec<(f64, f64)> {
        rows.iter().filter_map(|r| Some((r.t_s as f64 + 0.5, f(r)?))).collect()
    };
    [
        (
            "throughput.png",
            "Throughput: offered, taken by the sources, written by the sinks",
            "records/s",
            vec![
                (OFFERED_NAME, OFFERED_COLOUR, offered_points(rows)),
                ("input (sources)", BLUE, line(&|r| Some(r.throughput))),
                ("output (sinks)", GREEN, line(&|r| Some(r.output))),
            ],
        ),
        (
            "lag.png",
            "Source lag",
            "ms",
            vec![
                ("mean", BLUE, line(&|r| r.lag_mean_ms)),
                ("p99 (worst source)", MAGENTA, line(&|r| r.lag_p99_ms)),
            ],
        ),
        (
            "latency.png",
            "End-to-end latency (sink arrival - due at source)",
            "ms",
            vec![
                ("p50 (worst sink)", BLUE, line(&|r| r.latency_p50_ms)),
                ("p99 (worst sink)", MAGENTA, line(&|r| r.latency_p99_ms)),
            ],
        ),
        (
            "batch_latency.png",
            "Per-batch latency",
            "µs",
            vec![
                ("mean", BLUE, line(&|r| r.batch_latency_mean_us)),
                ("p99 (worst task)", MAGENTA, line(&|r| r.batch_latency_p99_us)),
                ("max (longest batch)", GREEN, line(&|r| r.batch_latency_max_us)),
            ],
        ),
        (
            "state_moved.png",
            "State moved between tasks",
            "MiB/s",
            vec![("moved", BLUE, line(&|r| Some(r.state_bytes_moved / MIB)))],
        ),
    ]
}

pub(super) fn write_plots(summary: &ReportSummary, out_dir: &Path) -> Result<Vec<PathBuf>, ReportError> {
    let rows = &summary.table.rows;
    let spans = spans(summary);
    let x_range = match (rows.first(), rows.last()) {
        (Some(a), Some(b)) => a.t_s as f64..b.t_s as f64 + 1.0,
        _ => 0.0..1.0,
    };
    let plots = plots(rows);
    let mut files = Vec::with_capacity(plots.len());
    for (file, title, unit, lines) in plots {
        let path = out_dir.join(file);
        draw_plot(&path, title, unit, &lines, &spans, x_range.clone(), summary.plots_have_text)
            .map_err(|message| ReportError::Plot { path: path.clone(), message })?;
        files.push(path);
    }
    Ok(files)
}

fn draw_plot(
    path: &Path,
    title: &str,
    unit: &str,
    lines: &[Line],
    spans: &[Span],
    x_range: std::ops::Range<f64>,
    text: bool,
) -> Result<(), String> {
    let err = |e: &dyn fmt::Display| e.to_string();
    let root = BitMapBackend::new(path, PLOT_SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    // The legend has a panel of its own, right of the data: it never covers a curve.
    let (plot_area, legend_area) = root.split_horizontally(PLOT_SIZE.0 - LEGEND_WIDTH);
    let y_max = lines.iter().flat_map(|(_, _, points)| points.iter().map(|p| p.1)).fold(0.0_f64, f64::max);
    let y_top = if y_max > 0.0 { y_max * 1.15 } else { 1.0 };
    let mut builder = ChartBuilder::on(&plot_area);
    builder.margin(15);
    if text {
        builder.caption(title, ("sans-serif", 20)).x_label_area_size(45).y_label_area_size(80);
    }
    let mut chart = builder.build_cartesian_2d(x_range.clone(), 0.0..y_top).map_err(|e| err(&e))?;
    let mut mesh = chart.configure_mesh();
    if text {
        mesh.x_desc("time since run start (s; a second's value at its middle)").y_desc(unit);
    } else {
        mesh.x_labels(0).y_labels(0);
    }
    mesh.draw().map_err(|e| err(&e))?;
    let span_colour = |s: &Span| s.colour_of.and_then(|i| lines.get(i)).map_or(SPAN_COLOUR, |l| l.1);
    for (i, span) in spans.iter().enumerate() {
        let colour = span_colour(span);
        let end = span.end_s.unwrap_or(x_range.end).max(span.start_s + SPAN_MIN_WIDTH_S);
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(span.start_s, 0.0), (end, y_top)],
                colour.mix(0.25).filled(),
            )))
            .map_err(|e| err(&e))?;
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(span.start_s, 0.0), (span.start_s, y_top)],
                colour.stroke_width(1),
            )))
            .map_err(|e| err(&e))?;
        if text {
            // Staggered, so labels of reconfigurations close together (one per protocol in an
            // experiment's overlay) do not overlap.
            let y = y_top * (0.99 - 0.06 * (i % LABEL_ROWS) as f64);
            chart
                .draw_series(std::iter::once(Text::new(
                    span.label.clone(),
                    (span.start_s, y),
                    ("sans-serif", 14).into_font().color(&colour),
                )))
                .map_err(|e| err(&e))?;
        }
    }
    for (_, colour, points) in lines {
        for run in gapless_runs(points) {
            chart
                .draw_series(LineSeries::new(run.iter().copied(), colour.stroke_width(2)))
                .map_err(|e| err(&e))?;
        }
    }
    if text {
        draw_legend(&legend_area, lines, spans, &span_colour).map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))
}

/// Rows the span labels are staggered over.
const LABEL_ROWS: usize = 6;

/// A line's points split where a second has no value (no output reached a sink, say, while a
/// job was paused), so the plot shows the gap instead of a straight line across it.
fn gapless_runs(points: &[(f64, f64)]) -> Vec<&[(f64, f64)]> {
    let mut runs = Vec::new();
    let mut from = 0;
    for i in 1..=points.len() {
        if i == points.len() || points[i].0 - points[i - 1].0 > 1.5 {
            runs.push(&points[from..i]);
            from = i;
        }
    }
    runs
}

/// The legend panel: one entry per line, then one per reconfiguration span.
fn draw_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    lines: &[Line],
    spans: &[Span],
    span_colour: &dyn Fn(&Span) -> RGBColor,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    const ROW: i32 = 20;
    const MAX_SPANS: usize = 12;
    let font = ("sans-serif", 14).into_font();
    let mut y = 50;
    for (name, colour, _) in lines {
        area.draw(&PathElement::new(vec![(5, y), (30, y)], colour.stroke_width(2)))?;
        area.draw(&Text::new(name.to_string(), (36, y - 7), font.clone()))?;
        y += ROW;
    }
    if spans.is_empty() {
        return Ok(());
    }
    y += ROW / 2;
    area.draw(&Text::new("reconfigurations (start→end):".to_string(), (5, y - 7), font.clone()))?;
    y += ROW;
    for span in spans.iter().take(MAX_SPANS) {
        area.draw(&Rectangle::new([(5, y - 6), (30, y + 6)], span_colour(span).mix(0.4).filled()))?;
        area.draw(&Text::new(span.legend.clone(), (36, y - 7), font.clone()))?;
        y += ROW;
    }
    if spans.len() > MAX_SPANS {
        area.draw(&Text::new(format!("… and {} more", spans.len() - MAX_SPANS), (36, y - 7), font))?;
    }
    Ok(())
}

/// Draws several runs' series of one metric on one plot (`koala experiment`), with each run's
/// reconfigurations as spans in its line's colour (`Span::colour_of`), and after the runs' lines
/// the `extra` ones (the offered rate, in the report's colour): the report's look.
pub(super) fn draw_overlay(
    path: &Path,
    title: &str,
    unit: &str,
    series: &[(&'static str, Vec<(f64, f64)>)],
    extra: &[(&'static str, Vec<(f64, f64)>)],
    spans: &[Span],
) -> Result<(), String> {
    // Black is the offered rate's, as in a run's own throughput plot.
    const COLOURS: [RGBColor; 5] = [BLUE, MAGENTA, GREEN, RGBColor(200, 30, 30), RGBColor(120, 60, 160)];
    let mut lines: Vec<Line> = series
        .iter()
        .zip(COLOURS.iter().cycle())
        .map(|((name, points), colour)| (*name, *colour, points.clone()))
        .collect();
    for (name, points) in extra {
        let colour = if *name == OFFERED_NAME { OFFERED_COLOUR } else { CYAN };
        lines.push((name, colour, points.clone()));
    }
    let xs = lines.iter().flat_map(|(_, _, p)| p.iter().map(|(x, _)| *x));
    let (lo, hi) = xs.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| (lo.min(x), hi.max(x)));
    let x_range = if lo < hi { lo..hi } else { 0.0..1.0 };
    draw_plot(path, title, unit, &lines, spans, x_range, plot_font_ready())
}

fn escape_html(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

pub(super) fn render_html(summary: &ReportSummary) -> String {
    let images: String = summary
        .files
        .iter()
        .filter_map(|p| p.file_name()?.to_str())
        .map(|name| format!("<img src=\"{0}\" alt=\"{0}\"><br>\n", escape_html(name)))
        .collect();
    format!(
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>koala report: {run}</title>\
         </head>\n<body>\n<h1>koala report: {run}</h1>\n<p>Shaded spans: reconfigurations, \
         from start to completion, numbered by epoch (the legend gives their times).</p>\n<h2>Summary</h2>\n<pre>{summary_text}</pre>\n<h2>Plots</h2>\n\
         {images}<h2>Per second</h2>\n<pre>{table}</pre>\n</body></html>\n",
        run = escape_html(&summary.run.run),
        summary_text = escape_html(&summary.to_string()),
        table = escape_html(&summary.table.to_string()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_breaks_where_seconds_have_no_value() {
        let points = [(0.5, 1.0), (1.5, 2.0), (5.5, 3.0), (6.5, 4.0), (9.5, 5.0)];
        let runs = gapless_runs(&points);
        assert_eq!(runs, vec![&points[0..2], &points[2..4], &points[4..5]]);
        assert!(gapless_runs(&[]).is_empty());
    }
}
