//! Host throughput of the kernels-dsp portable paths beside candle's CPU kernels, at LLaDA-8B-like
//! shapes (d_model 4096, MLP 12288, head_dim 128) with N scaled down so a run takes seconds.
//!
//! `cargo run --release -p kernels-dsp --example bench` prints a markdown table of GFLOP/s.
//! These are HOST numbers of the portable C paths (x86-64 baseline ISA, no HVX/HMX), useful to
//! compare the host emulation against candle's CPU backend -- they say nothing about Hexagon speed.

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{DType, Device, Module, Tensor, D};
use kernels_dsp::*;
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::time::{Duration, Instant};

const WORKERS: u32 = 2;

/// 128-byte aligned zeroed bytes (registered buffers need the alignment).
struct Buf(*mut u8, usize);

impl Buf {
    fn new(len: usize) -> Buf {
        // SAFETY: non-zero size, valid alignment.
        let p = unsafe { alloc_zeroed(Layout::from_size_align(len.max(1), 128).unwrap()) };
        assert!(!p.is_null());
        Buf(p, len)
    }
    fn fill_with(&mut self, mut f: impl FnMut(usize) -> u8) {
        // SAFETY: self.0 is valid for self.1 bytes.
        let s = unsafe { std::slice::from_raw_parts_mut(self.0, self.1) };
        for (i, b) in s.iter_mut().enumerate() {
            *b = f(i);
        }
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        // SAFETY: allocated in new() with this layout.
        unsafe { dealloc(self.0, Layout::from_size_align(self.1.max(1), 128).unwrap()) }
    }
}

struct Ctx {
    raw: *mut kdsp_ctx,
    _mem: Buf,
    _scratch: Buf,
    bufs: Vec<Buf>,
}

impl Ctx {
    fn new() -> Ctx {
        let cfg = kdsp_ctx_config {
            n_workers: WORKERS,
            max_buffers: 16,
            scratch_bytes: 64 << 20,
        };
        // SAFETY: valid pointers; memory outlives the context (released in Drop first).
        unsafe {
            let need = kdsp_ctx_bytes(&cfg);
            let (mem, scratch) = (
                Buf::new(need as usize),
                Buf::new(cfg.scratch_bytes as usize),
            );
            let mut raw = std::ptr::null_mut();
            assert_eq!(
                kdsp_ctx_init(mem.0.cast(), need, scratch.0.cast(), &cfg, &mut raw),
                KDSP_STATUS_OK
            );
            Ctx {
                raw,
                _mem: mem,
                _scratch: scratch,
                bufs: Vec::new(),
            }
        }
    }
    /// Registers a buffer of `len` bytes filled by `f`; returns its id.
    fn add(&mut self, len: usize, f: impl FnMut(usize) -> u8) -> u32 {
        let mut b = Buf::new(len);
        b.fill_with(f);
        let id = self.bufs.len() as u32;
        // SAFETY: the buffer is kept alive in self.bufs.
        assert_eq!(
            unsafe { kdsp_buffer_register(self.raw, id, b.0.cast(), len as u64) },
            KDSP_STATUS_OK
        );
        self.bufs.push(b);
        id
    }
    fn run(&mut self, op: &kdsp_op) {
        let mut st = 0;
        // SAFETY: valid op and status pointers.
        assert_eq!(
            unsafe { kdsp_execute(self.raw, op, 1, 0, &mut st) },
            KDSP_STATUS_OK
        );
    }
}

impl Drop for Ctx {
    fn drop(&mut self) {
        // SAFETY: raw came from kdsp_ctx_init.
        unsafe { kdsp_ctx_release(self.raw) }
    }
}

fn rows(id: u32, dtype: u32, ne: [u32; 4], unit: u64) -> kdsp_tensor {
    let nb1 = ne[0] as u64 * unit;
    let nb = [
        unit,
        nb1,
        nb1 * ne[1] as u64,
        nb1 * ne[1] as u64 * ne[2] as u64,
    ];
    kdsp_tensor {
        buffer_id: id,
        dtype,
        layout: KDSP_LAYOUT_ROW_MAJOR,
        _pad0: 0,
        offset: 0,
        ne,
        nb,
    }
}

fn tiles(id: u32, layout: u32, k: u32, r: u32) -> kdsp_tensor {
    let dtype = if layout == KDSP_LAYOUT_Q4_0_TILES {
        KDSP_DTYPE_Q4_0
    } else {
        KDSP_DTYPE_F16
    };
    kdsp_tensor {
        buffer_id: id,
        dtype,
        layout,
        _pad0: 0,
        offset: 0,
        ne: [k, r, 1, 1],
        nb: [0; 4],
    }
}

/// Mean seconds per call after one warm-up, over at least `min` time and 3 calls.
fn time(mut f: impl FnMut(), min: Duration) -> f64 {
    f();
    let (start, mut n) = (Instant::now(), 0u32);
    while n < 3 || start.elapsed() < min {
        f();
        n += 1;
    }
    start.elapsed().as_secs_f64() / n as f64
}

/// Byte generator: small random-ish values (f32 in [-1, 1), f16 finite, nibbles/scales valid).
fn lcg(seed: u64) -> impl FnMut(usize) -> u8 {
    let mut s = seed;
    move |_| {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (s >> 56) as u8
    }
}

fn f32_bytes(seed: u64) -> impl FnMut(usize) -> u8 {
    let mut g = lcg(seed);
    let mut cur = [0u8; 4];
    move |i| {
        if i % 4 == 0 {
            let v = (g(0) as f32 - 128.0) / 128.0;
            cur = v.to_le_bytes();
        }
        cur[i % 4]
    }
}

fn f16_bytes(seed: u64) -> impl FnMut(usize) -> u8 {
    let mut g = lcg(seed);
    let mut cur = [0u8; 2];
    move |i| {
        if i % 2 == 0 {
            cur = half::f16::from_f32((g(0) as f32 - 128.0) / 256.0).to_le_bytes();
        }
        cur[i % 2]
    }
}

fn main() -> candle_core::Result<()> {
    let min = Duration::from_millis(
        std::env::var("KDSP_BENCH_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(600),
    );
    let dev = Device::Cpu;
    // (label, K, N): q/k/v/o-like (K = d_model) and down-proj-like (K = MLP width), N scaled down
    let mm_shapes = [("K=d_model", 4096u32, 1024u32), ("K=mlp", 12288, 512)];
    println!("| op | M | N | K | kernels-dsp host GFLOP/s | candle CPU GFLOP/s | candle op |");
    println!("|---|---:|---:|---:|---:|---:|---|");
    for &(_, k, n) in &mm_shapes {
        for m in [32u32, 64, 128] {
            let flops = 2.0 * m as f64 * n as f64 * k as f64;
            let (kt, nt) = (k.div_ceil(32), n.div_ceil(32));
            let mut ctx = Ctx::new();
            let a = ctx.add((m * k * 4) as usize, f32_bytes(1));
            let w16 = ctx.add((kt * nt * 2048) as usize, f16_bytes(2));
            let q4 = ctx.add((kt * nt * 576) as usize, {
                let (mut g, nib) = (lcg(3), (kt * nt * 512) as usize);
                move |i| {
                    if i < nib {
                        g(i)
                    } else if i % 2 == 0 {
                        0x00
                    } else {
                        0x20
                    }
                } // scales: f16 0x2000 = 2^-7
            });
            let dst = ctx.add((m * n * 4) as usize, |_| 0);
            let act = rows(a, KDSP_DTYPE_F32, [k, m, 1, 1], 4);
            let out = rows(dst, KDSP_DTYPE_F32, [n, m, 1, 1], 4);
            let mm16 = kdsp_op::new(
                KDSP_OP_MATMUL_F16,
                out,
                &[tiles(w16, KDSP_LAYOUT_HMX_WEIGHT_TILES, k, n), act],
            );
            let mmq4 = kdsp_op::new(
                KDSP_OP_MATMUL_Q4_0,
                out,
                &[tiles(q4, KDSP_LAYOUT_Q4_0_TILES, k, n), act],
            );
            let t16 = time(|| ctx.run(&mm16), min);
            let tq4 = time(|| ctx.run(&mmq4), min);

            let x = Tensor::randn(0f32, 1.0, (m as usize, k as usize), &dev)?;
            let wt = Tensor::randn(0f32, 1.0, (n as usize, k as usize), &dev)?;
            let wtt = wt.t()?;
            let tc = time(|| drop(x.matmul(&wtt).unwrap()), min);
            let qm = QMatMul::from_qtensor(QTensor::quantize(&wt, GgmlDType::Q4_0)?)?;
            let tcq = time(|| drop(qm.forward(&x).unwrap()), min);
            let g = |t: f64| flops / t / 1e9;
            println!("| matmul fp16 (HMX-tile engine, f32 acts packed in-op) | {m} | {n} | {k} | {:.1} | {:.1} | f32 matmul |", g(t16), g(tc));
            println!("| matmul Q4_0 x Q8_0 (acts quantized in-op) | {m} | {n} | {k} | {:.1} | {:.1} | QMatMul Q4_0 |", g(tq4), g(tcq));
        }
    }
    // FlashAttention: a window of M queries against prefix (512) + window keys, 32 heads x 128
    let (h, d, prefix) = (32u32, 128u32, 512u32);
    for m in [32u32, 64, 128] {
        let tk = prefix + m;
        let flops = 4.0 * m as f64 * tk as f64 * h as f64 * d as f64;
        let mut ctx = Ctx::new();
        let q = ctx.add((m * h * d * 4) as usize, f32_bytes(4));
        let kk = ctx.add((tk * h * d * 2) as usize, f16_bytes(5));
        let vv = ctx.add((tk * h * d * 2) as usize, f16_bytes(6));
        let dst = ctx.add((m * h * d * 4) as usize, |_| 0);
        let mut fa = kdsp_op::new(
            KDSP_OP_FLASH_ATTN,
            rows(dst, KDSP_DTYPE_F32, [d, h, m, 1], 4),
            &[
                rows(q, KDSP_DTYPE_F32, [d, h, m, 1], 4),
                rows(kk, KDSP_DTYPE_F16, [d, h, tk, 1], 2),
                rows(vv, KDSP_DTYPE_F16, [d, h, tk, 1], 2),
            ],
        );
        fa.params.attn.scale = 1.0 / (d as f32).sqrt();
        let tf = time(|| ctx.run(&fa), min);

        let qc = Tensor::randn(0f32, 1.0, (h as usize, m as usize, d as usize), &dev)?;
        let kc = Tensor::randn(0f32, 1.0, (h as usize, tk as usize, d as usize), &dev)?;
        let vc = Tensor::randn(0f32, 1.0, (h as usize, tk as usize, d as usize), &dev)?;
        let kt = kc.t()?.contiguous()?;
        let scale = 1.0 / (d as f64).sqrt();
        let naive = || -> candle_core::Result<Tensor> {
            let s = (qc.matmul(&kt)? * scale)?;
            let e = s.broadcast_sub(&s.max_keepdim(D::Minus1)?)?.exp()?;
            let p = e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?;
            p.to_dtype(DType::F32)?.matmul(&vc)
        };
        let tc = time(|| drop(naive().unwrap()), min);
        println!(
            "| FlashAttention (f32 Q, f16 K/V, {h} heads x {d}, {prefix}-token prefix) | {m} | - | {tk} keys | {:.1} | {:.1} | f32 softmax(QK^T)V |",
            flops / tf / 1e9,
            flops / tc / 1e9
        );
    }
    Ok(())
}
