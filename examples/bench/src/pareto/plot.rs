//! `pareto.svg`: accuracy (with its Wilson interval) against the projected latency per answer,
//! one panel per question set — the fresh set's first, then the confirmation set's — with the projected frontier;
//! verification-on mbsd configurations in a colour of their own, verification-off ones in
//! another, the baselines grey, oracle rows purple, and a ring around every configuration whose
//! projection rests partly on extrapolated forwards.

use std::path::Path;

use anyhow::{anyhow, Result};
use plotters::prelude::*;

use super::{frontier_of, placed, verifies, Picture, SetRun};
use crate::rows::RowResult;
use crate::stats::{wilson, Z95};

const FRONTIER: RGBColor = RGBColor(214, 39, 40);
const VERIFY_ON: RGBColor = RGBColor(31, 119, 180);
const VERIFY_OFF: RGBColor = RGBColor(255, 127, 14);
const BASELINE: RGBColor = RGBColor(120, 120, 120);
const ORACLE: RGBColor = RGBColor(148, 103, 189);

fn err<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow!("plotting: {e}")
}

/// The colour of a configuration.
fn color(r: &RowResult) -> RGBColor {
    if r.spec.oracle {
        ORACLE
    } else if !r.spec.params.strategy.is_mbsd() {
        BASELINE
    } else if verifies(&r.spec.params) {
        VERIFY_ON
    } else {
        VERIFY_OFF
    }
}

/// Write `pareto.svg`.
pub fn write(out: &Path, pic: &Picture) -> Result<()> {
    let path = out.join("pareto.svg");
    let mut order: Vec<&SetRun> = pic.sets.iter().collect();
    // The newest set first (the one that chose nothing), the tuning set last.
    order.sort_by_key(|s| std::cmp::Reverse(s.set));
    let n = order.len().max(1) as u32;
    let root = SVGBackend::new(&path, (720 * n, 640)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let areas = root.split_evenly((1, n as usize));
    for (area, set) in areas.iter().zip(&order) {
        panel(area, set)?;
    }
    root.present().map_err(err)?;
    Ok(())
}

fn panel(area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>, set: &SetRun) -> Result<()> {
    let rows: Vec<(usize, &RowResult)> = set
        .rows
        .iter()
        .enumerate()
        .filter(|(_, r)| placed(r))
        .collect();
    let (lo, hi) = rows
        .iter()
        .map(|(_, r)| r.projected_per_answer().max(1e-6))
        .fold((f64::INFINITY, 0f64), |(a, b), x| (a.min(x), b.max(x)));
    let (lo, hi) = if lo.is_finite() {
        (lo / 1.3, hi * 1.3)
    } else {
        (0.1, 1.0)
    };
    // Accuracy from just below the lowest Wilson bound, in steps of 10 points.
    let floor = rows
        .iter()
        .filter_map(|(_, r)| {
            let right = r.correct().iter().filter(|&&c| c).count();
            wilson(right, r.answers.len(), Z95).map(|w| w.0)
        })
        .fold(1.0f64, f64::min);
    let y_lo = ((floor * 10.0).floor() * 10.0).clamp(0.0, 90.0);
    let title = format!(
        "{} set ({} questions): projected LLaDA-8B Q4_0 on SM8750",
        set.set.name(),
        set.questions
    );
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 15))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d((lo..hi).log_scale(), y_lo..100.5f64)
        .map_err(err)?;
    chart
        .configure_mesh()
        .light_line_style(WHITE)
        .x_labels(8)
        .x_label_formatter(&|x| {
            if *x >= 10.0 {
                format!("{x:.0}")
            } else {
                format!("{x:.1}")
            }
        })
        .y_label_formatter(&|y| format!("{y:.0}"))
        .x_desc("projected s per answer (log scale; not measured)")
        .y_desc("final-answer accuracy % (Wilson 95%)")
        .draw()
        .map_err(err)?;
    let front = frontier_of(&set.rows);
    let line: Vec<(f64, f64)> = front
        .iter()
        .map(|&i| {
            let r = &set.rows[i];
            (r.projected_per_answer(), 100.0 * r.accuracy_all())
        })
        .collect();
    // The frontier as a staircase: accuracy holds until the next frontier point.
    let mut stairs = Vec::new();
    for w in line.windows(2) {
        stairs.push(w[0]);
        stairs.push((w[1].0, w[0].1));
    }
    if let Some(&l) = line.last() {
        stairs.push(l);
    }
    chart
        .draw_series(LineSeries::new(stairs, FRONTIER.stroke_width(2)))
        .map_err(err)?
        .label("frontier")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], FRONTIER));
    let pos = |r: &RowResult| (r.projected_per_answer().max(1e-6), 100.0 * r.accuracy_all());
    // Wilson intervals.
    for (_, r) in &rows {
        let right = r.correct().iter().filter(|&&c| c).count();
        if let Some((a, b)) = wilson(right, r.answers.len(), Z95) {
            let (x, _) = pos(r);
            chart
                .draw_series([PathElement::new(
                    vec![(x, 100.0 * a), (x, 100.0 * b)],
                    color(r).mix(0.4),
                )])
                .map_err(err)?;
        }
    }
    let legend: [(&str, RGBColor); 4] = [
        ("mbsd, verification on", VERIFY_ON),
        ("mbsd, verification off", VERIFY_OFF),
        ("baselines (vanilla, prefix, dual)", BASELINE),
        ("oracle revision (instrument)", ORACLE),
    ];
    for (name, c) in legend {
        let pts: Vec<(f64, f64)> = rows
            .iter()
            .filter(|(_, r)| color(r) == c)
            .map(|(_, r)| pos(r))
            .collect();
        chart
            .draw_series(pts.into_iter().map(|p| Circle::new(p, 4, c.filled())))
            .map_err(err)?
            .label(name)
            .legend(move |(x, y)| Circle::new((x + 10, y), 4, c.filled()));
    }
    let extrapolated: Vec<(f64, f64)> = rows
        .iter()
        .filter(|(_, r)| r.projected.extrapolated_s > 0.0)
        .map(|(_, r)| pos(r))
        .collect();
    chart
        .draw_series(
            extrapolated
                .into_iter()
                .map(|p| Circle::new(p, 7, BLACK.mix(0.6).stroke_width(1))),
        )
        .map_err(err)?
        .label("projection partly extrapolated (forwards past 128 rows)")
        .legend(|(x, y)| Circle::new((x + 10, y), 7, BLACK.stroke_width(1)));
    // Labels on the frontier only (forty labels would cover each other); configurations at the
    // same point share one label.
    let mut labelled: Vec<((f64, f64), Vec<&str>)> = Vec::new();
    for &i in &front {
        let r = &set.rows[i];
        let p = pos(r);
        match labelled.iter_mut().find(|(q, _)| *q == p) {
            Some((_, v)) => v.push(&r.spec.label),
            None => labelled.push((p, vec![&r.spec.label])),
        }
    }
    for (p, v) in labelled {
        let text = match v.len() {
            1 => v[0].to_string(),
            n => format!("{} (+{} at the same point)", v[0], n - 1),
        };
        chart
            .draw_series([Text::new(
                text,
                p,
                ("sans-serif", 10).into_font().color(&BLACK),
            )])
            .map_err(err)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    Ok(())
}
