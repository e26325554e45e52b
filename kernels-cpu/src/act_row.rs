//! What the activation quantizer ([`crate::act`]) and its SIMD row quantizers (`act_x86.rs`,
//! `aarch64/act.rs`) share: the scheme of one call ([`ActSpec`]), one row's outputs ([`RowOut`])
//! and the per-group sums every row quantizer fills the same way ([`sums`]).

/// Which scheme and which sums.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ActSpec {
    /// Q8_K (256-value scale groups) instead of Q8_0 (32).
    pub k_quant: bool,
    /// Values per offset sum (16 or 32).
    pub off_group: usize,
    /// The weight code offset `o` (0 for none).
    pub offset: i32,
    /// Also produce `fsum`.
    pub fsum: bool,
}

impl ActSpec {
    /// Values per scale group (256 for Q8_K, 32 for Q8_0).
    pub(crate) fn scale_group(self) -> usize {
        if self.k_quant {
            256
        } else {
            32
        }
    }
}

/// One row's outputs.
pub(crate) struct RowOut<'a> {
    pub q: &'a mut [i8],
    pub scale: &'a mut [f32],
    pub off: &'a mut [i32],
    pub fsum: &'a mut [f32],
}

/// Fill the per-group outputs of one block from its 16-value sums (the SIMD row quantizers).
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
#[inline(always)]
pub(crate) fn sums(o: &mut RowOut<'_>, spec: ActSpec, first16: usize, s16: &[i32]) {
    match spec.off_group {
        16 => {
            for (j, &s) in s16.iter().enumerate() {
                o.off[first16 + j] = -spec.offset * s;
            }
        }
        _ => {
            for (j, p) in s16.chunks_exact(2).enumerate() {
                o.off[first16 / 2 + j] = -spec.offset * (p[0] + p[1]);
            }
        }
    }
    if spec.fsum {
        for (j, p) in s16.chunks_exact(2).enumerate() {
            o.fsum[first16 / 2 + j] = (p[0] + p[1]) as f32;
        }
    }
}
