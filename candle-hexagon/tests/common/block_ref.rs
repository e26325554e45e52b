//! An independent f64 reference of a bidirectional llama-style block stack (pre-RMSNorm, q/k/v
//! with optional biases, GQA, NeoX RoPE, softmax attention over cached ++ window keys, SwiGLU
//! MLP, final norm, LM head), its KV cache, and random tiny checkpoints for it. It shares no
//! code with the crate: weights are read back from the candle tensors the device packs.

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};
use candle_hexagon::{
    HexTransformerConfig, LayerWeights, Matrix, Part, TransformerWeights, WeightRef,
};

use super::llama_program::{llama_program, Geometry};

use super::{tensor, uniform};

/// Shape of a random model.
#[derive(Debug, Clone)]
pub struct Spec {
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub ffn: usize,
    pub vocab: usize,
    pub layers: usize,
    pub bias: bool,
    pub head: bool,
    /// Dense weights in this dtype, or Q4_0 when `q4`.
    pub dtype: DType,
    pub q4: bool,
}

impl Spec {
    /// 3 blocks of ~1.25 MiB of fp16 weights plus a head (~3.9 MiB): more than a 2 MiB window,
    /// so the memory runtime must stream (the swap and weights-once tests).
    pub fn three_blocks() -> Spec {
        Spec {
            hidden: 256,
            heads: 4,
            kv_heads: 2,
            head_dim: 64,
            ffn: 512,
            vocab: 256,
            layers: 3,
            bias: true,
            head: true,
            dtype: DType::F32,
            q4: false,
        }
    }
}

/// A checkpoint weight: the tensor the device packs, and the values the NPU holds (f16-rounded
/// for dense weights, dequantized for Q4_0), row-major `[out][in]`.
pub struct W {
    pub dense: Option<Tensor>,
    pub quant: Option<QTensor>,
    pub vals: Vec<f64>,
}

impl W {
    fn new(out: usize, inp: usize, seed: u64, spec: &Spec) -> W {
        let scale = 1.7 / (inp as f32).sqrt();
        let t = tensor(&[out, inp], seed, scale, DType::F32);
        if spec.q4 {
            let q = QTensor::quantize(&t, GgmlDType::Q4_0).unwrap();
            let vals = values_of(&q.dequantize(&Device::Cpu).unwrap());
            W {
                dense: None,
                quant: Some(q),
                vals,
            }
        } else {
            let t = t.to_dtype(spec.dtype).unwrap();
            let vals = values_of(&t.to_dtype(DType::F16).unwrap());
            W {
                dense: Some(t),
                quant: None,
                vals,
            }
        }
    }

    pub fn r(&self) -> WeightRef<'_> {
        match (&self.dense, &self.quant) {
            (Some(t), _) => WeightRef::Dense(t),
            (None, Some(q)) => WeightRef::Quant(q),
            _ => unreachable!(),
        }
    }
}

/// A vector parameter: the tensor and its values.
pub struct V {
    pub t: Tensor,
    pub vals: Vec<f64>,
}

impl V {
    fn new(n: usize, seed: u64, center: f32, scale: f32, dtype: DType) -> V {
        let v: Vec<f32> = uniform(n, seed)
            .iter()
            .map(|u| center + scale * u)
            .collect();
        let t = Tensor::from_vec(v, n, &Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let vals = values_of(&t);
        V { t, vals }
    }
}

pub fn values_of(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

pub struct Layer {
    pub attn_norm: V,
    pub q: W,
    pub k: W,
    pub v: W,
    pub qb: Option<V>,
    pub kb: Option<V>,
    pub vb: Option<V>,
    pub o: W,
    pub ffn_norm: V,
    pub gate: W,
    pub up: W,
    pub down: W,
}

pub struct Model {
    pub spec: Spec,
    pub layers: Vec<Layer>,
    pub final_norm: V,
    pub head: Option<W>,
    /// Rotary `(cos, sin)` tables for [`ROPE_ROWS`] positions, f32.
    pub rope: (Tensor, Tensor),
}

/// Positions the reference's rotary tables cover.
pub const ROPE_ROWS: usize = 512;

/// NeoX tables `(positions, head_dim / 2)`: the angle in f64, rounded once to f32.
fn rope_tables(hd: usize) -> (Tensor, Tensor) {
    let half = hd / 2;
    let (mut c, mut s) = (Vec::new(), Vec::new());
    for p in 0..ROPE_ROWS {
        for i in 0..half {
            let a = p as f64 * THETA.powf(-(2.0 * i as f64) / hd as f64);
            c.push(a.cos() as f32);
            s.push(a.sin() as f32);
        }
    }
    (
        Tensor::from_vec(c, (ROPE_ROWS, half), &Device::Cpu).unwrap(),
        Tensor::from_vec(s, (ROPE_ROWS, half), &Device::Cpu).unwrap(),
    )
}

pub const THETA: f64 = 10000.0;
pub const EPS: f32 = 1e-5;

impl Model {
    pub fn random(spec: &Spec, seed: u64) -> Model {
        let (h, hd) = (spec.hidden, spec.head_dim);
        let (nq, nkv, ff) = (spec.heads * hd, spec.kv_heads * hd, spec.ffn);
        let vdt = if spec.q4 { DType::F32 } else { spec.dtype };
        let mut s = seed * 1000;
        let mut next = || {
            s += 1;
            s
        };
        let layers = (0..spec.layers)
            .map(|_| Layer {
                attn_norm: V::new(h, next(), 1.0, 0.2, vdt),
                q: W::new(nq, h, next(), spec),
                k: W::new(nkv, h, next(), spec),
                v: W::new(nkv, h, next(), spec),
                qb: spec.bias.then(|| V::new(nq, next(), 0.0, 0.3, vdt)),
                kb: spec.bias.then(|| V::new(nkv, next(), 0.0, 0.3, vdt)),
                vb: spec.bias.then(|| V::new(nkv, next(), 0.0, 0.3, vdt)),
                o: W::new(h, nq, next(), spec),
                ffn_norm: V::new(h, next(), 1.0, 0.2, vdt),
                gate: W::new(ff, h, next(), spec),
                up: W::new(ff, h, next(), spec),
                down: W::new(h, ff, next(), spec),
            })
            .collect();
        Model {
            spec: spec.clone(),
            layers,
            final_norm: V::new(h, next(), 1.0, 0.2, vdt),
            head: spec.head.then(|| W::new(spec.vocab, h, next(), spec)),
            rope: rope_tables(hd),
        }
    }

    pub fn config(&self, max_positions: usize) -> HexTransformerConfig {
        let s = &self.spec;
        assert!(
            max_positions <= ROPE_ROWS,
            "the reference's rotary tables cover {ROPE_ROWS}"
        );
        HexTransformerConfig {
            program: llama_program(&Geometry {
                hidden: s.hidden,
                heads: s.heads,
                kv_heads: s.kv_heads,
                head_dim: s.head_dim,
                ffn: s.ffn,
                vocab: s.head.then_some(s.vocab),
                eps: EPS,
            }),
            heads: s.heads,
            kv_heads: s.kv_heads,
            head_dim: s.head_dim,
            max_positions,
        }
    }

    pub fn weights(&self) -> TransformerWeights<'_> {
        TransformerWeights {
            layers: self
                .layers
                .iter()
                .enumerate()
                .map(|(i, l)| LayerWeights {
                    vectors: vec![
                        (format!("block {i} attn norm"), &l.attn_norm.t),
                        (format!("block {i} ffn norm"), &l.ffn_norm.t),
                    ],
                    matrices: vec![
                        Matrix {
                            name: format!("block {i} q/k/v"),
                            parts: vec![
                                part(format!("block {i} q"), &l.q, l.qb.as_ref()),
                                part(format!("block {i} k"), &l.k, l.kb.as_ref()),
                                part(format!("block {i} v"), &l.v, l.vb.as_ref()),
                            ],
                        },
                        one(format!("block {i} o"), &l.o),
                        Matrix {
                            name: format!("block {i} gate/up"),
                            parts: vec![
                                part(format!("block {i} gate"), &l.gate, None),
                                part(format!("block {i} up"), &l.up, None),
                            ],
                        },
                        one(format!("block {i} down"), &l.down),
                    ],
                })
                .collect(),
            tail: LayerWeights {
                vectors: vec![("final norm".into(), &self.final_norm.t)],
                matrices: self.head.iter().map(|h| one("lm head".into(), h)).collect(),
            },
            rope_cos: &self.rope.0,
            rope_sin: &self.rope.1,
        }
    }
}

fn part<'a>(name: String, w: &'a W, b: Option<&'a V>) -> (String, Part<'a>) {
    (
        name,
        Part {
            weight: w.r(),
            bias: b.map(|b| &b.t),
        },
    )
}

fn one(name: String, w: &W) -> Matrix<'_> {
    Matrix {
        name: name.clone(),
        parts: vec![part(name, w, None)],
    }
}

/// `[layer][batch][row][value]`.
type Rows4 = Vec<Vec<Vec<Vec<f64>>>>;

/// The reference cache: `[layer][batch]` rows of `kv_heads * head_dim` values, positions
/// `[0, len)`, keys with RoPE applied.
#[derive(Clone)]
pub struct RefKv {
    pub k: Vec<Vec<Vec<Vec<f64>>>>,
    pub v: Vec<Vec<Vec<Vec<f64>>>>,
    /// The last forward's window K/V `[layer][batch][row]` and its start.
    pending: Option<(usize, Rows4, Rows4)>,
}

impl RefKv {
    pub fn new(layers: usize, batch: usize) -> Self {
        RefKv {
            k: vec![vec![Vec::new(); batch]; layers],
            v: vec![vec![Vec::new(); batch]; layers],
            pending: None,
        }
    }

    pub fn len(&self) -> usize {
        self.k[0][0].len()
    }

    pub fn commit(&mut self, range: std::ops::Range<usize>) {
        let (ws, pk, pv) = self.pending.as_ref().unwrap();
        for l in 0..self.k.len() {
            for b in 0..self.k[l].len() {
                for p in range.clone() {
                    let (kr, vr) = (pk[l][b][p - ws].clone(), pv[l][b][p - ws].clone());
                    if p < self.k[l][b].len() {
                        self.k[l][b][p] = kr;
                        self.v[l][b][p] = vr;
                    } else {
                        assert_eq!(p, self.k[l][b].len());
                        self.k[l][b].push(kr);
                        self.v[l][b].push(vr);
                    }
                }
            }
        }
    }
}

fn rms(x: &[f64], w: &[f64]) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let r = 1.0 / (ms + EPS as f64).sqrt();
    x.iter().zip(w).map(|(v, g)| v * r * g).collect()
}

fn linear(x: &[f64], w: &[f64], b: Option<&[f64]>, out: usize) -> Vec<f64> {
    let k = x.len();
    (0..out)
        .map(|j| {
            let d: f64 = (0..k).map(|i| x[i] * w[j * k + i]).sum();
            d + b.map_or(0.0, |b| b[j])
        })
        .collect()
}

fn rope(x: &mut [f64], heads: usize, hd: usize, pos: usize) {
    let half = hd / 2;
    for h in 0..heads {
        let r = &mut x[h * hd..(h + 1) * hd];
        for i in 0..half {
            let a = pos as f64 * THETA.powf(-(2.0 * i as f64) / hd as f64);
            let (c, s) = (a.cos(), a.sin());
            let (x0, x1) = (r[i], r[i + half]);
            r[i] = x0 * c - x1 * s;
            r[i + half] = x1 * c + x0 * s;
        }
    }
}

/// Forward of the window `x (b, n, hidden)` at positions `[ws, ws + n)` against `kv`: returns
/// `(b, rows, width)` logits (or normalised hidden rows without a head) and records the window's
/// K/V as pending. Attention sees the cached rows outside `[ws, ws + n)` and the window's rows.
pub fn forward(
    m: &Model,
    kv: &mut RefKv,
    x: &[f64],
    b: usize,
    ws: usize,
    rows: &[usize],
) -> Vec<f64> {
    let s = &m.spec;
    let (h, hd, hq, hkv) = (s.hidden, s.head_dim, s.heads, s.kv_heads);
    let (nq, nkv) = (hq * hd, hkv * hd);
    let n = x.len() / (b * h);
    let len = kv.len();
    let mut xs: Vec<Vec<Vec<f64>>> = (0..b)
        .map(|bi| {
            (0..n)
                .map(|j| x[(bi * n + j) * h..][..h].to_vec())
                .collect()
        })
        .collect();
    let mut pk = vec![vec![Vec::new(); b]; s.layers];
    let mut pv = vec![vec![Vec::new(); b]; s.layers];
    for (li, l) in m.layers.iter().enumerate() {
        let last = li + 1 == s.layers;
        for bi in 0..b {
            let mut qs = Vec::new();
            for (j, xj) in xs[bi].iter().enumerate() {
                let hn = rms(xj, &l.attn_norm.vals);
                let mut q = linear(&hn, &l.q.vals, l.qb.as_ref().map(|v| &v.vals[..]), nq);
                let mut k = linear(&hn, &l.k.vals, l.kb.as_ref().map(|v| &v.vals[..]), nkv);
                let v = linear(&hn, &l.v.vals, l.vb.as_ref().map(|v| &v.vals[..]), nkv);
                rope(&mut q, hq, hd, ws + j);
                rope(&mut k, hkv, hd, ws + j);
                qs.push(q);
                pk[li][bi].push(k);
                pv[li][bi].push(v);
            }
            // keys: cached rows outside the window, then the window's rows
            let mut keys: Vec<&Vec<f64>> = Vec::new();
            let mut vals: Vec<&Vec<f64>> = Vec::new();
            for p in (0..len).filter(|p| !(ws..ws + n).contains(p)) {
                keys.push(&kv.k[li][bi][p]);
                vals.push(&kv.v[li][bi][p]);
            }
            keys.extend(pk[li][bi].iter());
            vals.extend(pv[li][bi].iter());
            let sel: Vec<usize> = if last {
                rows.to_vec()
            } else {
                (0..n).collect()
            };
            let mut out_rows = Vec::new();
            for &j in &sel {
                let q = &qs[j];
                let mut att = vec![0.0; nq];
                for hh in 0..hq {
                    let kh = hh / (hq / hkv);
                    let sc: Vec<f64> = keys
                        .iter()
                        .map(|k| {
                            (0..hd)
                                .map(|d| q[hh * hd + d] * k[kh * hd + d])
                                .sum::<f64>()
                                / (hd as f64).sqrt()
                        })
                        .collect();
                    let mx = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let p: Vec<f64> = sc.iter().map(|v| (v - mx).exp()).collect();
                    let z: f64 = p.iter().sum();
                    for d in 0..hd {
                        att[hh * hd + d] = (0..keys.len())
                            .map(|t| p[t] * vals[t][kh * hd + d])
                            .sum::<f64>()
                            / z;
                    }
                }
                let mut xr: Vec<f64> = xs[bi][j].clone();
                for (a, o) in xr.iter_mut().zip(linear(&att, &l.o.vals, None, h)) {
                    *a += o;
                }
                let h2 = rms(&xr, &l.ffn_norm.vals);
                let g = linear(&h2, &l.gate.vals, None, s.ffn);
                let u = linear(&h2, &l.up.vals, None, s.ffn);
                let act: Vec<f64> = g
                    .iter()
                    .zip(&u)
                    .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                    .collect();
                for (a, d) in xr.iter_mut().zip(linear(&act, &l.down.vals, None, h)) {
                    *a += d;
                }
                out_rows.push(xr);
            }
            xs[bi] = out_rows;
        }
    }
    kv.pending = Some((ws, pk, pv));
    let mut out = Vec::new();
    for row in xs.iter().flatten() {
        let hn = rms(row, &m.final_norm.vals);
        match &m.head {
            Some(w) => out.extend(linear(&hn, &w.vals, None, s.vocab)),
            None => out.extend(hn),
        }
    }
    out
}

/// `(nmse, max |a - b|)` of a device result against reference values.
pub fn compare(got: &Tensor, want: &[f64]) -> (f64, f64) {
    let g = values_of(got);
    assert_eq!(g.len(), want.len(), "result size");
    let num: f64 = g.iter().zip(want).map(|(a, b)| (a - b) * (a - b)).sum();
    let den: f64 = want.iter().map(|b| b * b).sum();
    let max = g
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max);
    (if den > 0.0 { num / den } else { num }, max)
}
