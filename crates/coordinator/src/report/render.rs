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
const PLOT_SIZE: (u32, u32) = (1000, 450);

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

pub(super) fn write_plots(summary: &ReportSummary, out_dir: &Path) -> Result<Vec<PathBuf>, ReportError> {
    let rows = &summary.table.rows;
    let line = |f: &dyn Fn(&SecondRow) -> Option<f64>| -> Vec<(f64, f64)> {
        rows.iter().filter_map(|r| Some((r.t_s as f64, f(r)?))).collect()
    };
    let mut marks = Vec::new();
    for r in &summary.reconfigurations {
        marks.push((r.start_t_s as f64, RED));
        marks.extend(r.end_t_s.map(|t| (t as f64, GREEN)));
    }
    let plots: [(&str, &str, &str, Vec<Line>); 5] = [
        (
            "throughput.png",
            "Throughput (source records in)",
            "records/s",
            vec![("throughput", BLUE, line(&|r| Some(r.throughput)))],
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
    ];
    let x_range = match (rows.first(), rows.last()) {
        (Some(a), Some(b)) if b.t_s > a.t_s => a.t_s as f64..b.t_s as f64,
        (Some(a), _) => a.t_s as f64..a.t_s as f64 + 1.0,
        _ => 0.0..1.0,
    };
    let mut files = Vec::with_capacity(plots.len());
    for (file, title, unit, lines) in plots {
        let path = out_dir.join(file);
        draw_plot(&path, title, unit, &lines, &marks, x_range.clone(), summary.plots_have_text)
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
    marks: &[(f64, RGBColor)],
    x_range: std::ops::Range<f64>,
    text: bool,
) -> Result<(), String> {
    let err = |e: &dyn fmt::Display| e.to_string();
    let root = BitMapBackend::new(path, PLOT_SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let y_max = lines.iter().flat_map(|(_, _, points)| points.iter().map(|p| p.1)).fold(0.0_f64, f64::max);
    let y_top = if y_max > 0.0 { y_max * 1.1 } else { 1.0 };
    let mut builder = ChartBuilder::on(&root);
    builder.margin(15);
    if text {
        builder.caption(title, ("sans-serif", 22)).x_label_area_size(45).y_label_area_size(80);
    }
    let mut chart = builder.build_cartesian_2d(x_range, 0.0..y_top).map_err(|e| err(&e))?;
    let mut mesh = chart.configure_mesh();
    if text {
        mesh.x_desc("time since run start (s)").y_desc(unit);
    } else {
        mesh.x_labels(0).y_labels(0);
    }
    mesh.draw().map_err(|e| err(&e))?;
    for &(x, colour) in marks {
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(x, 0.0), (x, y_top)],
                colour.stroke_width(2),
            )))
            .map_err(|e| err(&e))?;
    }
    for (name, colour, points) in lines {
        let series = chart
            .draw_series(LineSeries::new(points.iter().copied(), colour.stroke_width(2)))
            .map_err(|e| err(&e))?;
        let colour = *colour;
        series.label(*name).legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], colour));
    }
    if text {
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))
}

/// Draws several runs' series of one metric on one plot (`koala experiment`), with vertical
/// marks (red) at `marks`.
pub(super) fn draw_overlay(
    path: &Path,
    title: &str,
    unit: &str,
    series: &[(&'static str, Vec<(f64, f64)>)],
    marks: &[f64],
) -> Result<(), String> {
    const COLOURS: [RGBColor; 4] = [BLUE, MAGENTA, GREEN, BLACK];
    let lines: Vec<Line> = series
        .iter()
        .zip(COLOURS.iter().cycle())
        .map(|((name, points), colour)| (*name, *colour, points.clone()))
        .collect();
    let xs = lines.iter().flat_map(|(_, _, p)| p.iter().map(|(x, _)| *x));
    let (lo, hi) = xs.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| (lo.min(x), hi.max(x)));
    let x_range = if lo < hi { lo..hi } else { 0.0..1.0 };
    let marks: Vec<(f64, RGBColor)> = marks.iter().map(|m| (*m, RED)).collect();
    draw_plot(path, title, unit, &lines, &marks, x_range, plot_font_ready())
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
         </head>\n<body>\n<h1>koala report: {run}</h1>\n<p>Red lines: reconfiguration start; \
         green: completion.</p>\n<h2>Summary</h2>\n<pre>{summary_text}</pre>\n<h2>Plots</h2>\n\
         {images}<h2>Per second</h2>\n<pre>{table}</pre>\n</body></html>\n",
        run = escape_html(&summary.run.run),
        summary_text = escape_html(&summary.to_string()),
        table = escape_html(&summary.table.to_string()),
    )
}
