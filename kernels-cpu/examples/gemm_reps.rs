//! One GEMM shape run `reps` times on one thread, on an explicit path: the program whose executed
//! instructions `kernels-cpu/count-insns-aarch64.sh` counts under qemu-aarch64 (the difference
//! between two runs and one is one GEMM, activation quantization included).
//!
//! `gemm_reps <path> <type> <n> <k> <m> <reps>`, e.g. `gemm_reps neon-i8mm q4_0 512 768 64 2`;
//! types `q4_0 q8_0 q4_k q6_k f32 f16 bf16`.

#[path = "../tests/common/mod.rs"]
mod common;

use common::{random_blocks, Rng};
use half::{bf16, f16};
use kernels_cpu::{DenseMatrix, GgmlType, Isa, QuantMatrix};

fn main() -> Result<(), String> {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let [isa, ty, n, k, m, reps] = &a[..] else {
        return Err("usage: gemm_reps <path> <type> <n> <k> <m> <reps>".into());
    };
    let isa = Isa::from_name(isa).ok_or_else(|| format!("unknown path `{isa}`"))?;
    let num = |s: &str, what: &str| s.parse::<usize>().map_err(|e| format!("{what} `{s}`: {e}"));
    let (n, k, m, reps) = (num(n, "n")?, num(k, "k")?, num(m, "m")?, num(reps, "reps")?);
    let mut rng = Rng::new(1);
    let x = rng.vec(m * k);
    let mut out = vec![0f32; m * n];
    // A pool of one thread, the main thread itself: the kernels run in place and no other
    // thread exists whose spinning would be counted.
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .use_current_thread()
        .build()
        .map_err(|e| e.to_string())?;
    let run = |f: &(dyn Fn(&mut [f32]) -> kernels_cpu::Result<()> + Sync), out: &mut [f32]| {
        pool.install(|| (0..reps).try_for_each(|_| f(out)))
            .map_err(|e| e.to_string())
    };
    let gt = match ty.as_str() {
        "q4_0" => Some(GgmlType::Q4_0),
        "q8_0" => Some(GgmlType::Q8_0),
        "q4_k" => Some(GgmlType::Q4K),
        "q6_k" => Some(GgmlType::Q6K),
        _ => None,
    };
    if let Some(gt) = gt {
        let w = QuantMatrix::from_ggml(gt, n, k, &random_blocks(ty, n, k, &mut rng))
            .map_err(|e| e.to_string())?;
        run(&|o| w.view().gemm_with(isa, &x, m, None, o), &mut out)?;
    } else {
        let v = rng.vec(n * k);
        let w = match ty.as_str() {
            "f32" => DenseMatrix::from_f32(&v, n, k),
            "f16" => DenseMatrix::from_f16(
                &v.iter().map(|&x| f16::from_f32(x)).collect::<Vec<_>>(),
                n,
                k,
            ),
            "bf16" => DenseMatrix::from_bf16(
                &v.iter().map(|&x| bf16::from_f32(x)).collect::<Vec<_>>(),
                n,
                k,
            ),
            other => return Err(format!("unknown type `{other}`")),
        }
        .map_err(|e| e.to_string())?;
        run(&|o| w.view().gemm_with(isa, &x, m, None, o), &mut out)?;
    }
    // Use the result, so no part of the work can be optimised away.
    println!("{}", out.iter().map(|v| *v as f64).sum::<f64>());
    Ok(())
}
