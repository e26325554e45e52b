//! The AArch64 paths: entry points compiled for NEON, NEON + dotprod and NEON + dotprod + i8mm,
//! picked at run time ([`crate::Isa::Neon`], [`crate::Isa::NeonDotprod`],
//! [`crate::Isa::NeonI8mm`]).
//!
//! - Quantized GEMM: the generic bodies of [`crate::qgemm`] over [`Neon`] (4-row slabs; the byte
//!   dot is `smull` + `addp` + `sadalp`, or one `sdot` with dotprod); with i8mm, [`i8mm`]'s `smmla`
//!   micro-kernels (two activation rows x two weight rows x 8 values per instruction), whose float
//!   stage is the generic one lane for lane, so every path computes the same bits.
//! - Dense GEMM: the generic body over [`Neon`] (f16 weights widened with `fcvtl`), one code for
//!   every NEON path (it has no integer dot).
//! - Activation quantization: [`act`], bit-identical to the portable quantizer.
//! - Attention needs no entry point here: NEON is the AArch64 baseline, so its explicit-lane body
//!   (`crate::attention`) is already compiled to NEON for every path.

use std::ops::Range;

use crate::simd::neon::Neon;
use crate::{dense, qgemm};

pub(crate) mod act;
mod i8mm;

/// Quantized GEMM task, NEON.
#[target_feature(enable = "neon")]
pub(crate) unsafe fn qgemm_neon(job: &qgemm::Job<'_>, slabs: Range<usize>, rows: Range<usize>) {
    qgemm::task::<Neon<false>>(job, slabs, rows)
}

/// Quantized GEMM task, NEON + dotprod (`sdot`).
#[target_feature(enable = "neon,dotprod")]
pub(crate) unsafe fn qgemm_dotprod(job: &qgemm::Job<'_>, slabs: Range<usize>, rows: Range<usize>) {
    qgemm::task::<Neon<true>>(job, slabs, rows)
}

/// Quantized GEMM task, NEON + dotprod + i8mm (`smmla`; one leftover row through `sdot`).
#[target_feature(enable = "neon,dotprod,i8mm")]
pub(crate) unsafe fn qgemm_i8mm(job: &qgemm::Job<'_>, slabs: Range<usize>, rows: Range<usize>) {
    qgemm::task_with::<Neon<true>, i8mm::Mmla>(job, slabs, rows)
}

/// Dense GEMM task, every NEON path.
#[target_feature(enable = "neon")]
pub(crate) unsafe fn dense_neon(job: &dense::Job<'_>, slabs: Range<usize>, rows: Range<usize>) {
    dense::task::<Neon<false>>(job, slabs, rows)
}
