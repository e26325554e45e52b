//! One attention shape run `reps` times on one thread, on an explicit path, printing the
//! milliseconds per call (best of `reps`): f32 queries over an f16 K/V segment, the shape of one
//! layer of a full-canvas forward.
//!
//! `attn_reps <path> <q_rows> <keys> <heads> <head_dim> <reps>`, e.g. `attn_reps avx512 160 160 12 64 50`.

#[path = "../tests/common/mod.rs"]
mod common;

use common::Rng;
use half::f16;
use kernels_cpu::attention::{attention_with, AttnShape, KvSegment, Skip};
use kernels_cpu::Isa;

fn main() -> Result<(), String> {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let [isa, q_rows, keys, heads, d, reps] = &a[..] else {
        return Err("usage: attn_reps <path> <q_rows> <keys> <heads> <head_dim> <reps>".into());
    };
    let isa = Isa::from_name(isa).ok_or_else(|| format!("unknown path `{isa}`"))?;
    let num = |s: &str| s.parse::<usize>().map_err(|e| format!("`{s}`: {e}"));
    let (q_rows, keys, heads, d, reps) =
        (num(q_rows)?, num(keys)?, num(heads)?, num(d)?, num(reps)?);
    let mut rng = Rng::new(3);
    let q = rng.vec(q_rows * heads * d);
    let kv: Vec<f16> = rng
        .vec(keys * heads * d)
        .iter()
        .map(|&x| f16::from_f32(x))
        .collect();
    let seg = KvSegment {
        k: &kv,
        v: &kv,
        rows: keys,
        row_stride: heads * d,
        skip: Skip::None,
    };
    let shape = AttnShape {
        q_rows,
        heads,
        kv_heads: heads,
        head_dim: d,
    };
    let mut out = vec![0f32; q.len()];
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .use_current_thread()
        .build()
        .map_err(|e| e.to_string())?;
    let best = pool.install(|| {
        let mut best = f64::INFINITY;
        for _ in 0..reps {
            let t = std::time::Instant::now();
            attention_with(isa, &q, &[seg], shape, 0.125, &mut out).map_err(|e| e.to_string())?;
            best = best.min(t.elapsed().as_secs_f64());
        }
        Ok::<_, String>(best)
    })?;
    let sum: f64 = out.iter().map(|&x| x as f64).sum();
    println!("{:.3} ms per call (checksum {sum:.6})", best * 1e3);
    Ok(())
}
