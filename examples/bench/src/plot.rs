//! The three pictures: active positions per forward (paper Figure 5a), the commit step of every
//! generated position (the commit frontier, Figure 8), and latency per ablation row (measured here
//! and projected to SM8750), as SVG.

use std::path::Path;

use anyhow::{anyhow, Result};
use plotters::prelude::*;

use crate::rows::RowResult;

const COLORS: [RGBColor; 5] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
];

fn err<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow!("plotting: {e}")
}

/// The rows each picture compares: the best cached baseline and the decoding mechanisms.
fn picked(rows: &[RowResult]) -> Vec<&RowResult> {
    let wanted = ["NPU + prefix KV cache", "+ MBSD", "+ STS", "+ verification"];
    rows.iter()
        .filter(|r| wanted.contains(&r.spec.label.as_str()) && !r.answers.is_empty())
        .collect()
}

/// How an x-y chart draws its series.
#[derive(Clone, Copy)]
enum Mark {
    Line,
    Points,
}

/// One x-y chart of labelled series, written to `path`.
fn xy_chart(
    path: &Path,
    title: &str,
    (x_desc, y_desc): (&str, &str),
    xmax: f64,
    series: Vec<(&str, Vec<(f64, f64)>)>,
    mark: Mark,
) -> Result<()> {
    let root = SVGBackend::new(path, (900, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let ymax = series
        .iter()
        .flat_map(|s| s.1.iter().map(|p| p.1))
        .fold(1.0f64, f64::max);
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(0f64..xmax.max(1.0), 0f64..ymax * 1.05)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .draw()
        .map_err(err)?;
    for (i, (label, pts)) in series.into_iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        match mark {
            Mark::Line => chart
                .draw_series(LineSeries::new(pts, c.stroke_width(2)))
                .map_err(err)?
                .label(label)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2))
                }),
            Mark::Points => chart
                .draw_series(pts.into_iter().map(move |p| Circle::new(p, 3, c.filled())))
                .map_err(err)?
                .label(label)
                .legend(move |(x, y)| Circle::new((x + 10, y), 3, c.filled())),
        };
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

/// Active positions in each forward of the first answer.
fn active(out: &Path, rows: &[&RowResult]) -> Result<()> {
    let series: Vec<(&str, Vec<(f64, f64)>)> = rows
        .iter()
        .map(|r| {
            let pts = r.answers[0]
                .trace
                .iter()
                .enumerate()
                .map(|(i, f)| (i as f64, f.active as f64))
                .collect();
            (r.spec.label.as_str(), pts)
        })
        .collect();
    let xmax = series.iter().map(|s| s.1.len()).max().unwrap_or(1) as f64;
    xy_chart(
        &out.join("active_per_forward.svg"),
        "Active (undecided) positions per forward, first prompt",
        ("forward", "active positions"),
        xmax,
        series,
        Mark::Line,
    )
}

/// The step at which each generated position of the first answer was committed.
fn frontier(out: &Path, rows: &[&RowResult]) -> Result<()> {
    let series: Vec<(&str, Vec<(f64, f64)>)> = rows
        .iter()
        .map(|r| {
            let pts = r.answers[0]
                .commit_step
                .iter()
                .enumerate()
                .filter_map(|(p, s)| s.map(|s| (p as f64, s as f64)))
                .collect();
            (r.spec.label.as_str(), pts)
        })
        .collect();
    let xmax = rows
        .iter()
        .map(|r| r.answers[0].commit_step.len())
        .max()
        .unwrap_or(1) as f64;
    xy_chart(
        &out.join("commit_frontier.svg"),
        "Commit frontier: the step at which each position was committed, first prompt",
        ("generated position", "commit step"),
        xmax,
        series,
        Mark::Points,
    )
}

/// Horizontal bars, one per row, in one panel.
fn bars(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    title: &str,
    unit: &str,
    labels: &[String],
    values: &[f64],
) -> Result<()> {
    let n = values.len().max(1);
    let xmax = values.iter().cloned().fold(1e-9f64, f64::max) * 1.1;
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(36)
        .y_label_area_size(170)
        .build_cartesian_2d(0f64..xmax, -0.5f64..(n as f64 - 0.5))
        .map_err(err)?;
    let labels_rev: Vec<String> = labels.iter().rev().cloned().collect();
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(n)
        .y_label_formatter(&|y| {
            let i = y.round();
            if (y - i).abs() > 1e-6 || i < 0.0 {
                return String::new();
            }
            labels_rev.get(i as usize).cloned().unwrap_or_default()
        })
        .x_desc(unit)
        .draw()
        .map_err(err)?;
    chart
        .draw_series(values.iter().rev().enumerate().map(|(i, &v)| {
            let y = i as f64;
            Rectangle::new([(0.0, y - 0.35), (v, y + 0.35)], COLORS[0].filled())
        }))
        .map_err(err)?;
    Ok(())
}

/// Measured and projected latency per ablation row.
fn latency(out: &Path, rows: &[RowResult]) -> Result<()> {
    let path = out.join("latency.svg");
    let root = SVGBackend::new(&path, (1100, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let (left, right) = root.split_horizontally(550);
    let labels: Vec<String> = rows.iter().map(|r| r.spec.label.clone()).collect();
    let measured: Vec<f64> = rows.iter().map(|r| r.wall_per_answer() * 1e3).collect();
    let projected: Vec<f64> = rows.iter().map(|r| r.projected_per_answer()).collect();
    bars(
        &left,
        "Measured here (NPU rows: emulated DSP)",
        "ms per answer",
        &labels,
        &measured,
    )?;
    bars(
        &right,
        "Projected, LLaDA-8B Q4_0 on SM8750",
        "s per answer",
        &labels,
        &projected,
    )?;
    root.present().map_err(err)?;
    Ok(())
}

/// Write the three SVGs.
pub fn write_all(out: &Path, rows: &[RowResult]) -> Result<()> {
    let p = picked(rows);
    active(out, &p)?;
    frontier(out, &p)?;
    latency(out, rows)?;
    Ok(())
}
