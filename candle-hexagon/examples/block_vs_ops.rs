//! Per-op path vs block path on the shipped 4-layer model (`models/tiny-llada`: d 128, 4 heads,
//! ffn 384, vocab 913, f16), on the emulated DSP.
//!
//! - per-op: what `generate --device hexagon` runs today through `dllm-models`: every op
//!   (`HexLinear` q, k, v, o, gate, up, down, head; `ops::rms_norm`, `ops::rope`,
//!   `ops::flash_attn`, `ops::swiglu`) is one synchronous DSP batch that stages its inputs in and
//!   its output out; K/V are concatenated on the CPU (cached prefix ++ window) and staged as f16
//!   on every attention call.
//! - block: `HexTransformer` + `DeviceKv`: one batch per block, weights/norms/RoPE tables/KV
//!   resident, only the embedded input and the logits cross the host boundary.
//!
//! Prints batches, bytes staged and wall time per forward for a window of `n` rows over `len`
//! cached rows, and the largest logit difference between the two paths. The DSP here is the
//! kernels' host build on x86 threads: the timings say nothing about Hexagon speed.
//!
//! `cargo run --release -p candle-hexagon --example block_vs_ops [-- ITERS]`

use std::collections::HashMap;
use std::time::Instant;

use candle_core::{DType, Device, Tensor, D};
use candle_hexagon::{
    ops, DeviceKv, HexLinear, HexTransformer, HexTransformerConfig, HexagonDevice, LayerWeights,
    Matrix, Part, Placed, TransformerWeights, WeightRef,
};

#[path = "../tests/common/llama_program.rs"]
mod llama_program;
use llama_program::{llama_program, Geometry};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

const HIDDEN: usize = 128;
const HEADS: usize = 4;
const HEAD_DIM: usize = 32;
const LAYERS: usize = 4;
const EPS: f32 = 1e-5;
const THETA: f64 = 10000.0;
const MAX_POS: usize = 256;

fn lin(dev: &HexagonDevice, w: &Tensor) -> Res<HexLinear> {
    match HexLinear::from_dense(dev, w, None)? {
        Placed::Npu(l) => Ok(l),
        Placed::Cpu(r) => Err(format!("linear refused: {r}").into()),
    }
}

struct OpsLayer {
    attn_norm: Tensor,
    ffn_norm: Tensor,
    q: HexLinear,
    k: HexLinear,
    v: HexLinear,
    o: HexLinear,
    gate: HexLinear,
    up: HexLinear,
    down: HexLinear,
}

/// The per-op model (the structure of dllm-models' Hexagon path).
struct OpsModel {
    dev: HexagonDevice,
    layers: Vec<OpsLayer>,
    norm: Tensor,
    head: HexLinear,
    cos: Tensor,
    sin: Tensor,
}

impl OpsModel {
    /// Logits of the window `x (1, n, hidden)` at `[ws, ws + n)`; `cache` holds each layer's
    /// K/V of rows `[0, len)` and gets the window's when `store`.
    fn forward(
        &self,
        x: &Tensor,
        ws: usize,
        cache: &mut [(Tensor, Tensor)],
        store: bool,
    ) -> Res<Tensor> {
        let (b, n, _) = x.dims3()?;
        let (cos, sin) = (self.cos.narrow(0, ws, n)?, self.sin.narrow(0, ws, n)?);
        let mut x = x.clone();
        for (l, (ck, cv)) in self.layers.iter().zip(cache.iter_mut()) {
            let h = ops::rms_norm(&self.dev, &x, &l.attn_norm, EPS)?;
            let shape = (b, n, HEADS, HEAD_DIM);
            let q = ops::rope(&self.dev, &l.q.forward_hex(&h)?.reshape(shape)?, &cos, &sin)?;
            let k = ops::rope(&self.dev, &l.k.forward_hex(&h)?.reshape(shape)?, &cos, &sin)?;
            let v = l.v.forward_hex(&h)?.reshape(shape)?;
            let len = ck.dim(1)?;
            let (kk, vv) = if len > 0 {
                let before = ws.min(len);
                (
                    Tensor::cat(&[&ck.narrow(1, 0, before)?, &k], 1)?,
                    Tensor::cat(&[&cv.narrow(1, 0, before)?, &v], 1)?,
                )
            } else {
                (k.clone(), v.clone())
            };
            let att = ops::flash_attn(&self.dev, &q, &kk, &vv, 1.0 / (HEAD_DIM as f32).sqrt())?;
            x = (x + l.o.forward_hex(&att.reshape((b, n, HIDDEN))?)?)?;
            let h2 = ops::rms_norm(&self.dev, &x, &l.ffn_norm, EPS)?;
            let act = ops::swiglu(
                &self.dev,
                &l.gate.forward_hex(&h2)?,
                &l.up.forward_hex(&h2)?,
            )?;
            x = (x + l.down.forward_hex(&act)?)?;
            if store {
                *ck = kk;
                *cv = vv;
            }
        }
        let x = ops::rms_norm(&self.dev, &x, &self.norm, EPS)?;
        Ok(self.head.forward_hex(&x)?.to_dtype(DType::F32)?)
    }
}

fn rope_tables() -> Res<(Tensor, Tensor)> {
    let half = HEAD_DIM / 2;
    let (mut c, mut s) = (Vec::new(), Vec::new());
    for p in 0..MAX_POS {
        for i in 0..half {
            let a = p as f64 * THETA.powf(-(2.0 * i as f64) / HEAD_DIM as f64);
            c.push(a.cos() as f32);
            s.push(a.sin() as f32);
        }
    }
    Ok((
        Tensor::from_vec(c, (MAX_POS, half), &Device::Cpu)?,
        Tensor::from_vec(s, (MAX_POS, half), &Device::Cpu)?,
    ))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() -> Res<()> {
    let iters: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(20);
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../models/tiny-llada/model.safetensors");
    let w: HashMap<String, Tensor> = candle_core::safetensors::load(&path, &Device::Cpu)?;
    let get = |name: &str| -> Res<&Tensor> {
        w.get(name)
            .ok_or_else(|| format!("{}: no tensor `{name}`", path.display()).into())
    };
    let b = |i: usize, s: &str| get(&format!("model.transformer.blocks.{i}.{s}.weight"));
    let dev = HexagonDevice::emulated()?;

    let mut layers = Vec::new();
    for i in 0..LAYERS {
        layers.push(OpsLayer {
            attn_norm: b(i, "attn_norm")?.clone(),
            ffn_norm: b(i, "ff_norm")?.clone(),
            q: lin(&dev, b(i, "q_proj")?)?,
            k: lin(&dev, b(i, "k_proj")?)?,
            v: lin(&dev, b(i, "v_proj")?)?,
            o: lin(&dev, b(i, "attn_out")?)?,
            gate: lin(&dev, b(i, "ff_proj")?)?,
            up: lin(&dev, b(i, "up_proj")?)?,
            down: lin(&dev, b(i, "ff_out")?)?,
        });
    }
    // f32 tables for the block path (as it pins them); f16 for the per-op path.
    let (rope_cos, rope_sin) = rope_tables()?;
    let (cos, sin) = (
        rope_cos.to_dtype(DType::F16)?,
        rope_sin.to_dtype(DType::F16)?,
    );
    let per_op = OpsModel {
        dev: dev.clone(),
        layers,
        norm: get("model.transformer.ln_f.weight")?.clone(),
        head: lin(&dev, get("model.transformer.ff_out.weight")?)?,
        cos,
        sin,
    };

    let cfg = HexTransformerConfig {
        program: llama_program(&Geometry {
            hidden: HIDDEN,
            heads: HEADS,
            kv_heads: HEADS,
            head_dim: HEAD_DIM,
            ffn: 384,
            vocab: Some(913),
            eps: EPS,
        }),
        heads: HEADS,
        kv_heads: HEADS,
        head_dim: HEAD_DIM,
        max_positions: MAX_POS,
    };
    let matrix = |name: String, parts: &[&str], i: usize| -> Res<Matrix<'_>> {
        Ok(Matrix {
            name,
            parts: parts
                .iter()
                .map(|p| -> Res<(String, Part<'_>)> {
                    Ok((
                        format!("block {i} {p}"),
                        Part {
                            weight: WeightRef::Dense(b(i, p)?),
                            bias: None,
                        },
                    ))
                })
                .collect::<Res<_>>()?,
        })
    };
    let layers = (0..LAYERS)
        .map(|i| -> Res<LayerWeights<'_>> {
            Ok(LayerWeights {
                vectors: vec![
                    (format!("block {i} attn norm"), b(i, "attn_norm")?),
                    (format!("block {i} ffn norm"), b(i, "ff_norm")?),
                ],
                matrices: vec![
                    matrix(
                        format!("block {i} q/k/v"),
                        &["q_proj", "k_proj", "v_proj"],
                        i,
                    )?,
                    matrix(format!("block {i} o"), &["attn_out"], i)?,
                    matrix(format!("block {i} gate/up"), &["ff_proj", "up_proj"], i)?,
                    matrix(format!("block {i} down"), &["ff_out"], i)?,
                ],
            })
        })
        .collect::<Res<Vec<_>>>()?;
    let tw = TransformerWeights {
        layers,
        tail: LayerWeights {
            vectors: vec![("final norm".into(), get("model.transformer.ln_f.weight")?)],
            matrices: vec![Matrix {
                name: "lm head".into(),
                parts: vec![(
                    "lm head".into(),
                    Part {
                        weight: WeightRef::Dense(get("model.transformer.ff_out.weight")?),
                        bias: None,
                    },
                )],
            }],
        },
        rope_cos: &rope_cos,
        rope_sin: &rope_sin,
    };
    let block = match HexTransformer::new(&dev, &cfg, &tw)? {
        Placed::Npu(t) => t,
        Placed::Cpu(r) => return Err(format!("block stack refused: {r}").into()),
    };

    // Embedded rows of arbitrary token ids (the embedding gather stays on the CPU in both paths).
    let wte = get("model.transformer.wte.weight")?;
    let embed = |n: usize, seed: usize| -> Res<Tensor> {
        let ids: Vec<u32> = (0..n)
            .map(|i| ((i * 37 + seed * 11) % 913) as u32)
            .collect();
        Ok(wte
            .index_select(&Tensor::new(ids, &Device::Cpu)?, 0)?
            .unsqueeze(0)?)
    };

    println!(
        "Per-op vs block path, models/tiny-llada (4 layers, d 128, 4 heads, ffn 384, vocab 913, \
         f16), emulated DSP ({}), {iters} forwards per row, median wall time.\n\
         The emulated DSP is the kernels' host build on x86 threads: these timings say nothing \
         about Hexagon speed.\n",
        dev.description()
    );
    println!(
        "| window | cached | path | DSP batches / forward | bytes staged / forward | ms / forward | \
         per-op / block time | max abs logit diff (of max abs logit) |"
    );
    println!("|---:|---:|---|---:|---:|---:|---:|---:|");
    for (n, len) in [(32usize, 0usize), (32, 64), (32, 192), (8, 64)] {
        // Both caches hold the same prefix [0, len).
        let mut cache: Vec<(Tensor, Tensor)> = (0..LAYERS)
            .map(|_| {
                let z = Tensor::zeros((1, 0, HEADS, HEAD_DIM), DType::F16, &Device::Cpu)?;
                Ok((z.clone(), z))
            })
            .collect::<Res<_>>()?;
        let mut kv: DeviceKv = block.new_kv(1, len + n)?;
        if len > 0 {
            let prefix = embed(len, 1)?;
            per_op.forward(&prefix, 0, &mut cache, true)?;
            block.forward(&mut kv, &prefix, 0, None)?;
            kv.set_len(len)?; // the prefix's rows, written at [0, len), become the cache
        }
        let x = embed(n, 2)?;
        // The two paths alternate, so drift in the machine's load hits both alike.
        let mut times = [Vec::new(), Vec::new()];
        let mut batches = [0u64; 2];
        let mut bytes = [0u64; 2];
        let mut outs: [Option<Tensor>; 2] = [None, None];
        for it in 0..iters + 2 {
            for (p, out) in outs.iter_mut().enumerate() {
                let before = dev.counters();
                let t0 = Instant::now();
                let y = if p == 0 {
                    per_op.forward(&x, len, &mut cache, false)?
                } else {
                    block.forward(&mut kv, &x, len, None)?
                };
                let ms = t0.elapsed().as_secs_f64() * 1e3;
                let c = dev.counters().since(&before);
                if it >= 2 {
                    times[p].push(ms);
                }
                batches[p] = c.dsp_batches;
                bytes[p] = c.bytes_staged();
                *out = Some(y);
            }
        }
        let [a, b] = outs.map(|o| o.expect("ran"));
        let diff = (&a - &b)?
            .abs()?
            .flatten_all()?
            .max(D::Minus1)?
            .to_scalar::<f32>()?;
        let scale = a.abs()?.flatten_all()?.max(D::Minus1)?.to_scalar::<f32>()?;
        let ms = times.map(median);
        for (p, path) in ["per-op", "block"].into_iter().enumerate() {
            let (r, d) = if p == 1 {
                (
                    format!("{:.2}x", ms[0] / ms[1]),
                    format!("{diff:.1e} (of {scale:.1})"),
                )
            } else {
                ("-".into(), "-".into())
            };
            println!(
                "| {n} | {len} | {path} | {} | {} | {:.2} | {r} | {d} |",
                batches[p],
                candle_hexagon::fmt_bytes(bytes[p]),
                ms[p]
            );
        }
    }
    println!("\n{}", dev.routing_report());
    Ok(())
}
