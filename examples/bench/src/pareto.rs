//! The speed/quality picture: every decoding configuration as one point — final-answer accuracy on
//! the held-out long-math questions against the projected SM8750 latency per answer and against
//! the CPU wall time per answer measured here — with the frontier of configurations no other one
//! beats on both axes. Written as `pareto.md`, `pareto.svg` and `pareto.json`.

use std::path::Path;

use anyhow::{anyhow, Result};
use dllm_decode::{Decide, DecodeParams, MbsdParams, Staged, Strategy, Verify};
use plotters::prelude::*;

use crate::projection::Target;
use crate::rows::{Dev, RowResult, RowSpec};

/// One configuration of the picture: a label and how it decodes.
fn spec(label: impl Into<String>, params: DecodeParams, oracle: bool) -> RowSpec {
    RowSpec {
        label: label.into(),
        dev: Dev::Cpu,
        project_to: Target::Npu,
        params,
        oracle,
    }
}

/// The configurations: the baselines, the mechanisms each on and off, the theta grid with and
/// without verification, and the oracle. `quick` keeps a handful.
pub fn specs(base: &DecodeParams, quick: bool) -> Vec<RowSpec> {
    let with = |strategy: Strategy, decide: Decide| DecodeParams {
        strategy,
        decide,
        ..*base
    };
    let staged = |visible: f32, stable: f32, verify: Option<Verify>| {
        Decide::Staged(Staged {
            visible,
            stable,
            no_adjacent: dllm_decode::params::DEFAULT_NO_ADJACENT,
            verify,
        })
    };
    let mbsd_with = |f: &dyn Fn(&mut MbsdParams), decide: Decide| {
        let mut m = MbsdParams::default();
        f(&mut m);
        with(Strategy::Mbsd(m), decide)
    };
    let mbsd = mbsd_with(&|_| {}, Decide::Staged(Staged::default()));
    let mut v = vec![
        spec("vanilla", with(Strategy::Vanilla, Decide::Schedule), false),
        spec(
            "vanilla, threshold 0.9",
            with(Strategy::Vanilla, Decide::Threshold(0.9)),
            false,
        ),
        spec(
            "dual-cache, threshold 0.9",
            with(Strategy::DualCache, Decide::Threshold(0.9)),
            false,
        ),
        spec("mbsd (defaults)", mbsd, false),
        spec("mbsd, oracle revision", mbsd, true),
    ];
    if quick {
        return v;
    }
    let d = Decide::Staged(Staged::default());
    let mut m = |label: &str, p: DecodeParams| v.push(spec(format!("mbsd, {label}"), p, false));
    m(
        "no verification (--no-verify)",
        mbsd_with(&|_| {}, staged(0.9, 0.9, None)),
    );
    m("no lookahead", mbsd_with(&|m| m.lookahead = false, d));
    m(
        "no bucket fit (--no-bucket-fit)",
        mbsd_with(&|m| m.fit_bucket = false, d),
    );
    m("no sliding", mbsd_with(&|m| m.sliding = false, d));
    m(
        "no sliding, no lookahead",
        mbsd_with(
            &|m| {
                m.sliding = false;
                m.lookahead = false
            },
            d,
        ),
    );
    m(
        "no STS, threshold 0.9",
        mbsd_with(&|_| {}, Decide::Threshold(0.9)),
    );
    for (tv, ts) in [
        (0.5, 0.9),
        (0.6, 0.9),
        (0.7, 0.9),
        (0.8, 0.9),
        (0.8, 0.95),
        (0.9, 0.95),
        (0.95, 0.95),
    ] {
        let (tv, ts) = (tv as f32, ts as f32);
        m(
            &format!("theta {tv} / {ts}"),
            mbsd_with(&|_| {}, staged(tv, ts, Some(Verify::default()))),
        );
        m(
            &format!("theta {tv} / {ts}, no verification"),
            mbsd_with(&|_| {}, staged(tv, ts, None)),
        );
    }
    for tv in [0.5f32, 0.7, 0.8] {
        v.push(spec(
            format!("mbsd, theta {tv} / 0.9, oracle revision"),
            mbsd_with(&|_| {}, staged(tv, 0.9, None)),
            true,
        ));
    }
    v.extend([
        spec(
            "prefix-cache",
            with(Strategy::PrefixCache, Decide::Schedule),
            false,
        ),
        spec(
            "dual-cache",
            with(Strategy::DualCache, Decide::Schedule),
            false,
        ),
        spec(
            "vanilla, threshold 0.8",
            with(Strategy::Vanilla, Decide::Threshold(0.8)),
            false,
        ),
        spec(
            "vanilla, threshold 0.7",
            with(Strategy::Vanilla, Decide::Threshold(0.7)),
            false,
        ),
        spec(
            "dual-cache, threshold 0.8",
            with(Strategy::DualCache, Decide::Threshold(0.8)),
            false,
        ),
        spec(
            "dual-cache, threshold 0.7",
            with(Strategy::DualCache, Decide::Threshold(0.7)),
            false,
        ),
    ]);
    v
}

/// Indices of the rows on the frontier of (cost, accuracy): no other row is at least as accurate
/// and strictly cheaper, or strictly more accurate and at most as expensive. Oracle rows are
/// instruments, not decoders: they are never on the frontier.
pub fn frontier(points: &[(f64, f64, bool)]) -> Vec<usize> {
    let mut on: Vec<usize> = (0..points.len())
        .filter(|&i| {
            let (c, a, oracle) = points[i];
            !oracle
                && !points
                    .iter()
                    .any(|&(c2, a2, o2)| !o2 && ((a2 >= a && c2 < c) || (a2 > a && c2 <= c)))
        })
        .collect();
    on.sort_by(|&x, &y| points[x].0.total_cmp(&points[y].0));
    on
}

/// The completed rows (failed ones cannot be placed).
fn placed(rows: &[RowResult]) -> Vec<&RowResult> {
    rows.iter()
        .filter(|r| r.failed.is_none() && !r.answers.is_empty())
        .collect()
}

/// Write `pareto.md`, `pareto.svg` and `pareto.json`.
pub fn write_all(out: &Path, rows: &[RowResult], header: &str) -> Result<()> {
    let ok = placed(rows);
    let proj: Vec<(f64, f64, bool)> = ok
        .iter()
        .map(|r| (r.projected_per_answer(), r.accuracy_all(), r.spec.oracle))
        .collect();
    let wall: Vec<(f64, f64, bool)> = ok
        .iter()
        .map(|r| (r.wall_per_answer(), r.accuracy_all(), r.spec.oracle))
        .collect();
    let fp = frontier(&proj);
    let fw = frontier(&wall);
    let mut md = String::new();
    md.push_str("# Speed / quality\n\n");
    md.push_str(header);
    md.push_str(
        "\n\nOne point per configuration: final-answer accuracy against the **projected** latency per answer \
         of LLaDA-8B Q4_0 on an SM8750 phone (each run's own forwards replayed through the paper's Table 2, \
         see `src/projection.rs`: not measured on a phone) and against the CPU wall time per answer measured \
         on this machine. *Frontier*: no other configuration is at least as accurate and cheaper. Oracle rows \
         revise with the reference answer: they bound what revision can recover and are not decoders.\n\n",
    );
    md.push_str("| configuration | accuracy % | worked lines % | forwards/answer | projected s/answer (SM8750) | frontier (projected) | CPU wall ms/answer | frontier (CPU) | drafts accepted | lookahead positions | verified | remasks |\n");
    md.push_str("|---|---:|---:|---:|---:|:-:|---:|:-:|---:|---:|---:|---:|\n");
    for (i, r) in ok.iter().enumerate() {
        let task = r.answers[0].task;
        md.push_str(&format!(
            "| {} | {:.0} | {} | {:.1} | {:.1} | {} | {:.0} | {} | {} | {} | {} | {} |\n",
            r.spec.label,
            100.0 * r.accuracy_all(),
            r.step_accuracy(task)
                .map(|s| format!("{:.0}", 100.0 * s))
                .unwrap_or_else(|| "-".into()),
            r.forwards_per_answer(),
            r.projected_per_answer(),
            if fp.contains(&i) { "yes" } else { "" },
            r.wall_per_answer() * 1e3,
            if fw.contains(&i) { "yes" } else { "" },
            r.counter("drafts_accepted"),
            r.counter("lookahead_positions"),
            r.counter("verified"),
            r.counter("remasks"),
        ));
    }
    for r in rows.iter().filter(|r| r.failed.is_some()) {
        md.push_str(&format!(
            "| {} | failed: {} |||||||||||\n",
            r.spec.label,
            r.failed.as_deref().unwrap_or("")
        ));
    }
    std::fs::write(out.join("pareto.md"), md)?;
    let json: Vec<serde_json::Value> = ok
        .iter()
        .enumerate()
        .map(|(i, r)| {
            serde_json::json!({
                "label": r.spec.label,
                "switches": r.spec.switches(),
                "accuracy": r.accuracy_all(),
                "step_accuracy": r.step_accuracy(r.answers[0].task),
                "answers": r.answers.len(),
                "forwards_per_answer": r.forwards_per_answer(),
                "projected_s_per_answer": r.projected_per_answer(),
                "cpu_wall_ms_per_answer": r.wall_per_answer() * 1e3,
                "frontier_projected": fp.contains(&i),
                "frontier_cpu": fw.contains(&i),
                "counters": r.counters,
            })
        })
        .collect();
    std::fs::write(
        out.join("pareto.json"),
        serde_json::to_string_pretty(&serde_json::json!({ "points": json }))?,
    )?;
    plot(out, &ok, (&proj, &fp), (&wall, &fw))
}

fn err<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow!("plotting: {e}")
}

type Panel<'a> = (&'a [(f64, f64, bool)], &'a [usize]);

fn plot(out: &Path, rows: &[&RowResult], proj: Panel<'_>, wall: Panel<'_>) -> Result<()> {
    let path = out.join("pareto.svg");
    let root = SVGBackend::new(&path, (1300, 620)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let (left, right) = root.split_horizontally(650);
    panel(
        &left,
        "Projected LLaDA-8B Q4_0 on SM8750 (not measured)",
        "s per answer (log scale)",
        rows,
        proj,
    )?;
    panel(
        &right,
        "CPU wall time, this machine (1 thread)",
        "ms per answer (log scale)",
        rows,
        (
            &wall
                .0
                .iter()
                .map(|p| (p.0 * 1e3, p.1, p.2))
                .collect::<Vec<_>>(),
            wall.1,
        ),
    )?;
    root.present().map_err(err)?;
    Ok(())
}

fn panel(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    title: &str,
    x_desc: &str,
    rows: &[&RowResult],
    (pts, front): Panel<'_>,
) -> Result<()> {
    let xs = pts.iter().map(|p| p.0.max(1e-6));
    let (lo, hi) = xs.fold((f64::INFINITY, 0f64), |(a, b), x| (a.min(x), b.max(x)));
    let (lo, hi) = if lo.is_finite() {
        (lo / 1.3, hi * 1.3)
    } else {
        (0.1, 1.0)
    };
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d((lo..hi).log_scale(), 0f64..100f64)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc("final-answer accuracy %")
        .draw()
        .map_err(err)?;
    let line: Vec<(f64, f64)> = front
        .iter()
        .flat_map(|&i| {
            let (c, a, _) = pts[i];
            [(c, 100.0 * a)]
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
        .draw_series(LineSeries::new(
            stairs,
            RGBColor(214, 39, 40).stroke_width(2),
        ))
        .map_err(err)?
        .label("frontier")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RGBColor(214, 39, 40)));
    for (i, r) in rows.iter().enumerate() {
        let (c, a, oracle) = pts[i];
        let color = if oracle {
            RGBColor(148, 103, 189)
        } else if r.spec.params.strategy.is_mbsd() {
            RGBColor(31, 119, 180)
        } else {
            RGBColor(120, 120, 120)
        };
        let p = (c.max(1e-6), 100.0 * a);
        chart
            .draw_series([Circle::new(p, 4, color.filled())])
            .map_err(err)?;
        chart
            .draw_series([Text::new(
                r.spec.label.clone(),
                p,
                ("sans-serif", 10).into_font().color(&BLACK),
            )])
            .map_err(err)?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_frontier_keeps_only_unbeaten_points_and_never_an_oracle() {
        // (cost, accuracy, oracle)
        let pts = [
            (10.0, 0.70, false), // 0: on (most accurate of the decoders)
            (5.0, 0.60, false),  // 1: on
            (6.0, 0.55, false),  // 2: beaten by 1
            (1.0, 0.20, false),  // 3: on (cheapest)
            (1.0, 0.99, true),   // 4: oracle, never on, beats nobody
            (5.0, 0.60, false),  // 5: ties 1: both on
        ];
        assert_eq!(frontier(&pts), vec![3, 1, 5, 0]);
    }
}
