//! The latency table: what one forward costs as a function of the window size, the logits rows
//! requested and the cached length — written by `latency-profile` (measured on the CPU or the
//! Hexagon device) or derived from published numbers, and read by decoding policies that decide how
//! much work to put in a forward (the adaptive lookahead of multi-block speculative decoding).
//!
//! A table is a list of points `(window, rows, cached) -> ms`. Lookups interpolate one axis at a
//! time: the windows present; for each window, the row counts measured for it (rows never exceed
//! the window); for each `(window, rows)`, the cached lengths. Along the window axis the table's
//! [`Interpolation`] applies: `linear` for smooth (CPU-like) costs, `step` for tile-bucketed
//! accelerators whose latency stays flat inside a bucket and jumps at its boundary (a window between
//! two points costs what the larger one costs). Rows and cached lengths are always linear; values
//! beyond the last point extrapolate the last segment.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{DecodeError, Result};

/// Current format version of the JSON file.
pub const LATENCY_TABLE_VERSION: u32 = 1;

/// How costs between two measured window sizes are estimated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Interpolation {
    /// Straight line between neighbouring points.
    #[default]
    Linear,
    /// The cost of the next larger point (flat buckets, jumps at the measured sizes).
    Step,
}

/// One measured (or derived) forward.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LatencyPoint {
    /// Positions forwarded.
    pub window: usize,
    /// Logits rows requested (at most `window`).
    pub rows: usize,
    /// Positions in the KV cache the window attends to.
    pub cached: usize,
    /// Median milliseconds.
    pub ms: f64,
    /// Fastest run, when measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_ms: Option<f64>,
    /// Slowest run, when measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_ms: Option<f64>,
}

/// The model a table was measured with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct ModelDesc {
    /// Where it came from (path, hub id, `synthetic ...`).
    pub source: String,
    /// `llada` or `dream`.
    pub arch: String,
    /// Parameter count.
    pub params: usize,
    /// Transformer blocks.
    pub layers: usize,
    /// Hidden size.
    pub hidden: usize,
    /// Vocabulary.
    pub vocab: usize,
}

/// A latency table (see the module docs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LatencyTable {
    /// Format version ([`LATENCY_TABLE_VERSION`]).
    pub version: u32,
    /// The device (`cpu`, `hexagon: <transport description>`, or a phone for derived tables).
    pub device: String,
    /// The model.
    pub model: ModelDesc,
    /// `measured` (by `latency-profile`) or a sentence saying where derived numbers come from.
    pub provenance: String,
    /// Along the window axis.
    #[serde(default)]
    pub interpolation: Interpolation,
    /// CPU threads of the measurement, when known.
    #[serde(default)]
    pub threads: Option<usize>,
    /// Timed runs per point.
    #[serde(default)]
    pub runs: usize,
    /// The points.
    pub points: Vec<LatencyPoint>,
}

/// LLaDA-8B Q4_0 on the SM8750 Hexagon NPU, **derived from the paper's Table 2, not measured**:
/// 478.1 / 861.6 / 1531.6 ms for 32 / 64 / 128 tokens in stepwise 32-token buckets (the file
/// `profiles/sm8750-npu-llada-8b-q4_0.json`). The default price list of the adaptive lookahead.
pub fn sm8750_npu() -> LatencyTable {
    serde_json::from_str(include_str!("../profiles/sm8750-npu-llada-8b-q4_0.json"))
        .expect("the embedded SM8750 NPU profile parses (tested)")
}

/// LLaDA-8B Q4_0 on the SM8750 CPU, derived from the paper's Table 2 (4239.6 / 7728.4 / 14758.7 ms
/// for 32 / 64 / 128 tokens), not measured (`profiles/sm8750-cpu-llada-8b-q4_0.json`).
pub fn sm8750_cpu() -> LatencyTable {
    serde_json::from_str(include_str!("../profiles/sm8750-cpu-llada-8b-q4_0.json"))
        .expect("the embedded SM8750 CPU profile parses (tested)")
}

fn bad(reason: impl Into<String>) -> DecodeError {
    DecodeError::LatencyTable(reason.into())
}

/// `(x, y)` pairs sorted by x: the value at `x` (linear, or step = next point up; extrapolates the
/// last segment, or the only point's value).
fn interp(pts: &[(usize, f64)], x: usize, mode: Interpolation) -> f64 {
    debug_assert!(!pts.is_empty());
    if pts.len() == 1 {
        return pts[0].1;
    }
    if let Some(p) = pts.iter().find(|p| p.0 == x) {
        return p.1;
    }
    let i = pts.partition_point(|p| p.0 < x);
    let (a, b) = if i == 0 {
        (pts[0], pts[1])
    } else if i >= pts.len() {
        (pts[pts.len() - 2], pts[pts.len() - 1])
    } else {
        (pts[i - 1], pts[i])
    };
    if mode == Interpolation::Step && i < pts.len() {
        // Inside (or below) a bucket: the cost of the bucket's upper edge.
        return if i == 0 { pts[0].1 } else { b.1 };
    }
    let t = (x as f64 - a.0 as f64) / (b.0 as f64 - a.0 as f64);
    (a.1 + t * (b.1 - a.1)).max(0.0)
}

fn uniq(v: impl Iterator<Item = usize>) -> Vec<usize> {
    let mut v: Vec<usize> = v.collect();
    v.sort_unstable();
    v.dedup();
    v
}

impl LatencyTable {
    /// Read and validate a table (errors name the file and what is wrong).
    pub fn load(path: &Path) -> Result<Self> {
        // A regular file within the JSON size limit: never a device read without end or a FIFO
        // that blocks (errors name the file and what it is).
        let text = dllm_models::files::read_text(
            path,
            "latency table",
            dllm_models::files::MAX_JSON_BYTES,
        )
        .map_err(|e| bad(e.to_string()))?;
        let t: LatencyTable =
            serde_json::from_str(&text).map_err(|e| bad(format!("{}: {e}", path.display())))?;
        t.validate()
            .map_err(|e| bad(format!("{}: {e}", path.display())))?;
        Ok(t)
    }

    /// Write as pretty JSON.
    pub fn save(&self, path: &Path) -> Result<()> {
        self.validate()?;
        let s = serde_json::to_string_pretty(self).map_err(|e| bad(e.to_string()))?;
        std::fs::write(path, s + "\n").map_err(|e| bad(format!("{}: {e}", path.display())))
    }

    /// Check the table: a known version, at least one point, positive windows, rows within the
    /// window, finite non-negative costs, no duplicate points.
    pub fn validate(&self) -> Result<()> {
        if self.version != LATENCY_TABLE_VERSION {
            return Err(bad(format!(
                "version {} (this build reads version {LATENCY_TABLE_VERSION})",
                self.version
            )));
        }
        if self.points.is_empty() {
            return Err(bad("no points"));
        }
        let mut seen = std::collections::HashSet::new();
        for p in &self.points {
            if p.window == 0 || p.rows > p.window {
                return Err(bad(format!(
                    "point window {} rows {}: the window must be positive and hold the rows",
                    p.window, p.rows
                )));
            }
            if !(p.ms.is_finite() && p.ms >= 0.0) {
                return Err(bad(format!(
                    "point window {} rows {} cached {}: ms {} is not a finite non-negative number",
                    p.window, p.rows, p.cached, p.ms
                )));
            }
            if !seen.insert((p.window, p.rows, p.cached)) {
                return Err(bad(format!(
                    "duplicate point window {} rows {} cached {}",
                    p.window, p.rows, p.cached
                )));
            }
        }
        Ok(())
    }

    /// Estimated milliseconds of one forward of `window` positions requesting `rows` logits rows
    /// against `cached` cached positions.
    pub fn cost_ms(&self, window: usize, rows: usize, cached: usize) -> f64 {
        let rows = rows.min(window);
        let windows = uniq(self.points.iter().map(|p| p.window));
        let at_window = |w: usize| -> f64 {
            let rs = uniq(self.points.iter().filter(|p| p.window == w).map(|p| p.rows));
            let at_rows = |r: usize| -> f64 {
                let mut cs: Vec<(usize, f64)> = self
                    .points
                    .iter()
                    .filter(|p| p.window == w && p.rows == r)
                    .map(|p| (p.cached, p.ms))
                    .collect();
                cs.sort_by_key(|c| c.0);
                interp(&cs, cached, Interpolation::Linear)
            };
            let pts: Vec<(usize, f64)> = rs.iter().map(|&r| (r, at_rows(r))).collect();
            interp(&pts, rows.min(w), Interpolation::Linear)
        };
        let pts: Vec<(usize, f64)> = windows.iter().map(|&w| (w, at_window(w))).collect();
        interp(&pts, window, self.interpolation)
    }

    /// On a table in tile buckets (step interpolation), the largest bucket edge below `window`
    /// (a profiled window the forward would fit by dropping its last positions): `None` on a
    /// linear table, or when `window` is not above the smallest bucket.
    pub fn bucket_edge_below(&self, window: usize) -> Option<usize> {
        if self.interpolation != Interpolation::Step {
            return None;
        }
        self.points
            .iter()
            .map(|p| p.window)
            .filter(|&w| w < window)
            .max()
    }

    /// Milliseconds per position of the table's smallest measured forward (its cost divided by
    /// its window): the price of a sparse pass over a few positions, proportional to their number.
    /// A linear fit through the measured windows would instead charge every small pass the fit's
    /// intercept (751 ms for the SM8750 CPU profile, more than its 32-position forward's cost per
    /// position times 5), an artefact of extrapolating below the smallest measurement.
    pub fn per_position_ms(&self) -> f64 {
        self.points
            .iter()
            .min_by_key(|p| (p.window, p.cached, std::cmp::Reverse(p.rows)))
            .map(|p| p.ms / p.window as f64)
            .unwrap_or(0.0)
    }

    /// What adding `extra` positions (all requesting logits when `with_rows`) to a forward of
    /// `window` positions and `rows` rows costs, in milliseconds.
    pub fn marginal_ms(
        &self,
        window: usize,
        rows: usize,
        extra: usize,
        with_rows: bool,
        cached: usize,
    ) -> f64 {
        let rows2 = if with_rows { rows + extra } else { rows };
        self.cost_ms(window + extra, rows2, cached) - self.cost_ms(window, rows, cached)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(points: &[(usize, usize, usize, f64)], mode: Interpolation) -> LatencyTable {
        LatencyTable {
            version: LATENCY_TABLE_VERSION,
            device: "test".into(),
            model: ModelDesc::default(),
            provenance: "measured".into(),
            interpolation: mode,
            threads: None,
            runs: 1,
            points: points
                .iter()
                .map(|&(window, rows, cached, ms)| LatencyPoint {
                    window,
                    rows,
                    cached,
                    ms,
                    min_ms: None,
                    max_ms: None,
                })
                .collect(),
        }
    }

    #[test]
    fn interpolation_table() {
        // Window 32 and 64, rows = window, cached 0 and 100.
        let t = table(
            &[
                (32, 32, 0, 10.0),
                (32, 32, 100, 20.0),
                (64, 64, 0, 30.0),
                (64, 64, 100, 50.0),
                (64, 8, 0, 25.0),
                (64, 8, 100, 45.0),
            ],
            Interpolation::Linear,
        );
        let cases: &[(usize, usize, usize, f64)] = &[
            (32, 32, 0, 10.0),
            (32, 32, 50, 15.0),
            (32, 32, 200, 30.0), // extrapolated
            (48, 8, 0, 17.5),    // halfway between windows
            (64, 8, 50, 35.0),
            (64, 36, 0, 27.5), // halfway between 8 and 64 rows
            (96, 96, 0, 50.0), // extrapolated along windows
            (8, 8, 0, 0.0),    // extrapolated below, clamped at zero
        ];
        for &(w, r, c, want) in cases {
            let got = t.cost_ms(w, r, c);
            assert!(
                (got - want).abs() < 1e-9,
                "({w}, {r}, {c}): {got} != {want}"
            );
        }
        assert!((t.marginal_ms(32, 32, 32, true, 0) - 20.0).abs() < 1e-9);
    }

    #[test]
    fn shipped_phone_profiles_are_valid_and_say_they_are_derived() {
        for t in [sm8750_npu(), sm8750_cpu()] {
            t.validate().unwrap();
            assert!(t
                .provenance
                .starts_with("derived from published numbers, not measured"));
            assert!(t.device.contains("derived, not measured"));
        }
        let npu = sm8750_npu();
        assert_eq!(npu.interpolation, Interpolation::Step);
        assert_eq!(npu.cost_ms(32, 32, 0), 478.1);
        assert_eq!(npu.cost_ms(10, 10, 0), 478.1); // a small window costs a whole tile
        assert_eq!(npu.cost_ms(64, 64, 0), 861.6);
        assert_eq!(npu.cost_ms(128, 128, 0), 1531.6);
        let cpu = sm8750_cpu();
        assert_eq!(cpu.cost_ms(128, 128, 0), 14758.7);
        assert!(cpu.cost_ms(48, 48, 0) > cpu.cost_ms(32, 32, 0));
    }

    #[test]
    fn step_interpolation_is_flat_inside_a_bucket() {
        let t = table(
            &[
                (32, 32, 0, 478.1),
                (64, 64, 0, 861.6),
                (128, 128, 0, 1531.6),
            ],
            Interpolation::Step,
        );
        assert_eq!(t.cost_ms(33, 33, 0), 861.6);
        assert_eq!(t.cost_ms(64, 64, 0), 861.6);
        assert_eq!(t.cost_ms(65, 65, 0), 1531.6);
        assert_eq!(t.marginal_ms(40, 40, 20, true, 0), 0.0);
    }

    #[test]
    fn bad_tables_are_named_errors() {
        let cases: Vec<(LatencyTable, &str)> = vec![
            (table(&[], Interpolation::Linear), "no points"),
            (table(&[(0, 0, 0, 1.0)], Interpolation::Linear), "window"),
            (table(&[(8, 9, 0, 1.0)], Interpolation::Linear), "rows"),
            (
                table(&[(8, 8, 0, f64::NAN)], Interpolation::Linear),
                "finite",
            ),
            (
                table(&[(8, 8, 0, 1.0), (8, 8, 0, 2.0)], Interpolation::Linear),
                "duplicate",
            ),
            (
                LatencyTable {
                    version: 99,
                    ..table(&[(8, 8, 0, 1.0)], Interpolation::Linear)
                },
                "version",
            ),
        ];
        for (t, want) in cases {
            let e = t.validate().unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        }
        let dir = std::env::temp_dir().join(format!("latency-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("t.json");
        std::fs::write(&p, "{\"version\": 1}").unwrap();
        let e = LatencyTable::load(&p).unwrap_err().to_string();
        assert!(e.contains("t.json"), "{e}");
        let t = table(&[(8, 8, 0, 1.0), (16, 4, 32, 2.5)], Interpolation::Step);
        t.save(&p).unwrap();
        assert_eq!(LatencyTable::load(&p).unwrap(), t);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
