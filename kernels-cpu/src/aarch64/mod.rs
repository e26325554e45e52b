//! The AArch64 kernels that are not the generic bodies over [`Neon`](crate::simd::neon::Neon):
//! the GEMMs' entry points for NEON, NEON + dotprod and NEON + dotprod + i8mm, picked at run time
//! ([`crate::Isa::Neon`], [`crate::Isa::NeonDotprod`], [`crate::Isa::NeonI8mm`]), are compiled
//! beside the x86 ones in [`crate::qgemm`] and [`crate::dense`].
//!
//! - Quantized GEMM with i8mm: [`i8mm`]'s `smmla` micro-kernels (two activation rows x two weight
//!   rows x 8 values per instruction), whose float stage is the generic one lane for lane, so
//!   every path computes the same bits. Without i8mm the generic bodies of [`crate::qgemm`] run
//!   over `Neon` (4-row slabs; the byte dot is `smull` + `addp` + `sadalp`, or one `sdot` with
//!   dotprod).
//! - Dense GEMM: the generic body over `Neon` (f16 weights widened with `fcvtl`), one code for
//!   every NEON path (it has no integer dot).
//! - Activation quantization: [`act`], bit-identical to the portable quantizer.
//! - Attention needs no entry point here: NEON is the AArch64 baseline, so its explicit-lane body
//!   (`crate::attention`) is already compiled to NEON for every path.

pub(crate) mod act;
pub(crate) mod i8mm;
