//! The attention's slow reference, for tests: the same function in f64 with every key set
//! materialised.

use crate::attention::{check, AttnShape, Element, KvSegment};
use crate::Result;

/// Slow reference: the same function in f64 with every key set materialised (for tests).
pub fn attention_reference<Q: Element, T: Element>(
    q: &[Q],
    segs: &[KvSegment<'_, T>],
    shape: AttnShape,
    scale: f32,
) -> Result<Vec<f64>> {
    check(q, segs, shape, q.len())?;
    let AttnShape {
        q_rows,
        heads,
        kv_heads,
        head_dim: d,
    } = shape;
    let group = heads / kv_heads;
    let widen = |x: &[T]| {
        let mut o = vec![0f32; x.len()];
        T::to_f32_slice(x, &mut o);
        o
    };
    let qf = {
        let q = &q[..q_rows * heads * d];
        let mut o = vec![0f32; q.len()];
        Q::to_f32_slice(q, &mut o);
        o
    };
    let mut keys: Vec<(Vec<f32>, Vec<f32>)> = Vec::new(); // per kept row, all kv heads
    for g in segs {
        let mut cursor = 0;
        for r in 0..g.rows {
            if !g.skip.contains(r, &mut cursor) {
                let off = r * g.row_stride;
                keys.push((
                    widen(&g.k[off..off + kv_heads * d]),
                    widen(&g.v[off..off + kv_heads * d]),
                ));
            }
        }
    }
    let mut out = vec![0f64; q_rows * heads * d];
    for r in 0..q_rows {
        for h in 0..heads {
            let kh = h / group;
            let qv = &qf[(r * heads + h) * d..][..d];
            let scores: Vec<f64> = keys
                .iter()
                .map(|(k, _)| {
                    scale as f64
                        * (0..d)
                            .map(|i| qv[i] as f64 * k[kh * d + i] as f64)
                            .sum::<f64>()
                })
                .collect();
            let mx = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            if keys.is_empty() {
                continue;
            }
            let w: Vec<f64> = scores.iter().map(|s| (s - mx).exp()).collect();
            let z: f64 = w.iter().sum();
            for (wi, (_, v)) in w.iter().zip(&keys) {
                for i in 0..d {
                    out[(r * heads + h) * d + i] += wi / z * v[kh * d + i] as f64;
                }
            }
        }
    }
    Ok(out)
}
