//! `bench-kernels`: one matmul `y = x W^T` of an `n x k` weight against windows of 1..256
//! activation rows, for every weight type, timed three ways in one run (alternated per
//! repetition): the kernels-cpu GEMM (best ISA path of this CPU, or `--isa`), candle's
//! `QMatMul` on the same ggml blocks, and candle's dense f32 matmul (`x @ W^T` with `W^T`
//! stored contiguous, the layout inference models use).
//!
//! ```text
//! bench-kernels --threads 1                  # 2048 x 768 (the 100M LLaDA's MLP up/gate)
//! bench-kernels --n 768 --k 2048 --types q4_0,q8_0 --rows 8,64
//! ```

use anyhow::{bail, Context, Result};
use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};
use clap::Parser;
use kernels_cpu::{DenseMatrix, DenseType, GgmlType, Isa, QuantMatrix};

/// A kernels-cpu weight matrix of either family.
enum Ours {
    Quant(QuantMatrix),
    Dense(DenseMatrix),
}

impl Ours {
    fn gemm(&self, isa: Isa, x: &[f32], m: usize, out: &mut [f32]) -> kernels_cpu::Result<()> {
        match self {
            Ours::Quant(q) => q.view().gemm_with(isa, x, m, None, out),
            Ours::Dense(d) => d.view().gemm_with(isa, x, m, None, out),
        }
    }
}

#[derive(Parser, Debug)]
#[command(about = "kernels-cpu GEMM vs candle QMatMul and dense gemm, per window size.")]
struct Args {
    /// Output features (weight rows).
    #[arg(long, default_value_t = 2048)]
    n: usize,
    /// Input features.
    #[arg(long, default_value_t = 768)]
    k: usize,
    /// Activation rows (window sizes).
    #[arg(long, value_delimiter = ',', default_value = "1,8,32,64,160,256")]
    rows: Vec<usize>,
    /// Weight types.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "q4_0,q8_0,q4_k,q6_k,f16,bf16,f32"
    )]
    types: Vec<String>,
    /// Timed repetitions (the median is reported).
    #[arg(long, default_value_t = 7)]
    iters: usize,
    /// Threads for every kernel (kernels-cpu and candle).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Statistic over the repetitions: min (best of N: robust when other jobs share the CPU)
    /// or median.
    #[arg(long, default_value = "min")]
    stat: String,
    /// Clock: wall, or cpu (this process's CPU time: immune to preemption when other jobs
    /// share the machine; meaningful with --threads 1).
    #[arg(long, default_value = "wall")]
    clock: String,
    /// kernels-cpu path (portable, avx2, avx-vnni, avx512, avx512-vnni) [default: best].
    #[arg(long)]
    isa: Option<String>,
}

/// Seconds on the chosen clock.
fn now(cpu: bool) -> f64 {
    if cpu {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid clock id and a valid out-pointer.
        unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
        ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
    } else {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0)
    }
}

fn stat(mut v: Vec<f64>, min: bool) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if min {
        v[0]
    } else {
        v[v.len() / 2]
    }
}

fn ggml_of(name: &str) -> Result<(GgmlType, GgmlDType)> {
    Ok(match name {
        "q4_0" => (GgmlType::Q4_0, GgmlDType::Q4_0),
        "q8_0" => (GgmlType::Q8_0, GgmlDType::Q8_0),
        "q4_k" => (GgmlType::Q4K, GgmlDType::Q4K),
        "q6_k" => (GgmlType::Q6K, GgmlDType::Q6K),
        "f16" => (GgmlType::F16, GgmlDType::F16),
        "bf16" => (GgmlType::BF16, GgmlDType::BF16),
        "f32" => (GgmlType::F32, GgmlDType::F32),
        other => bail!("--types: unknown weight type `{other}`"),
    })
}

fn main() -> Result<()> {
    let a = Args::parse();
    kernels_cpu::threads::configure(a.threads).context("--threads")?;
    // candle sizes its own pools from these (read when they first start).
    std::env::set_var("RAYON_NUM_THREADS", a.threads.to_string());
    std::env::set_var("CANDLE_NUM_THREADS", a.threads.to_string());
    let isa = match &a.isa {
        None => Isa::best(),
        Some(s) => Isa::from_name(s).with_context(|| format!("--isa: unknown path `{s}`"))?,
    };
    if !isa.is_available() {
        bail!(
            "--isa {isa}: this CPU cannot run it (available: {:?})",
            Isa::available()
        );
    }
    let min = match a.stat.as_str() {
        "min" => true,
        "median" => false,
        s => bail!("--stat: `{s}` (expected min or median)"),
    };
    let cpu = match a.clock.as_str() {
        "wall" => false,
        "cpu" => true,
        s => bail!("--clock: `{s}` (expected wall or cpu)"),
    };
    if a.iters == 0 || a.rows.is_empty() || a.rows.contains(&0) {
        bail!("--iters and --rows must be positive");
    }
    let (n, k) = (a.n, a.k);
    let dev = Device::Cpu;
    let w = Tensor::randn(0f32, 0.05, (n, k), &dev)?;
    let wt = w.t()?.contiguous()?;
    println!(
        "W: {n} x {k}; {} thread(s); kernels-cpu path {isa}; {} of {} on the {} clock (each row of the table alternates the three)\n",
        a.threads, if min { "best" } else { "median" }, a.iters, a.clock
    );
    println!("| weights | rows | kernels-cpu ms | GFLOP/s | candle QMatMul ms | GFLOP/s | dense f32 gemm ms | GFLOP/s | vs QMatMul | vs dense |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for ty in &a.types {
        let (gt, cd) = ggml_of(ty)?;
        let q = QTensor::quantize(&w, cd)?;
        let blocks = q.data()?;
        let ours = match DenseType::of(gt) {
            Some(dt) => Ours::Dense(DenseMatrix::from_row_major(dt, n, k, &blocks)?),
            None => Ours::Quant(QuantMatrix::from_ggml(gt, n, k, &blocks)?),
        };
        let qmm = QMatMul::from_qtensor(q)?;
        for &m in &a.rows {
            let x = Tensor::randn(0f32, 1.0, (m, k), &dev)?;
            let xv: Vec<f32> = x.flatten_all()?.to_vec1()?;
            let mut out = vec![0f32; m * n];
            let (mut t_ours, mut t_q, mut t_d) = (vec![], vec![], vec![]);
            for it in 0..=a.iters {
                let t = now(cpu);
                ours.gemm(isa, &xv, m, &mut out)?;
                let e1 = now(cpu) - t;
                let t = now(cpu);
                let y = qmm.forward(&x)?;
                let e2 = now(cpu) - t;
                let t = now(cpu);
                let z = x.matmul(&wt)?;
                let e3 = now(cpu) - t;
                std::hint::black_box((&y, &z, &out));
                if it > 0 {
                    t_ours.push(e1);
                    t_q.push(e2);
                    t_d.push(e3);
                }
            }
            let flop = 2.0 * (m * n * k) as f64;
            let (o, qq, d) = (stat(t_ours, min), stat(t_q, min), stat(t_d, min));
            println!(
                "| {ty} | {m} | {:.3} | {:.1} | {:.3} | {:.1} | {:.3} | {:.1} | {:.2}x | {:.2}x |",
                o * 1e3,
                flop / o / 1e9,
                qq * 1e3,
                flop / qq / 1e9,
                d * 1e3,
                flop / d / 1e9,
                qq / o,
                d / o
            );
        }
    }
    Ok(())
}
