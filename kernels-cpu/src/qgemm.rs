//! GEMM over packed quantized weights: `y[m][n] = sum_k x[m][k] W[n][k] (+ bias[n])`.
//!
//! Activations are quantized per call, by the tasks that use them ([`crate::act`]); the weights
//! stay in their packed layout ([`crate::qlayout`]). A *slab* is `LANES` consecutive weight rows
//! (one vector of outputs); the micro-kernel runs one slab against `MR` activation rows, keeping
//! the slab's unpacked codes of one K block in registers and one accumulator per activation row.
//! Per block and row it does eight 4-byte dots (`vpdpbusd` or its emulation) into an integer
//! accumulator started at the code-offset correction, converts it to f32 once, and accumulates
//! with the product of the two scales, so each output element sees the same operations in the
//! same order whichever `MR`, task split or thread count computed it.

use std::ops::Range;

use crate::act::{self, Acts};
use crate::act_row::ActSpec;
use crate::aligned::AlignedBytes;
use crate::error::check_len;
use crate::ggml::GgmlType;
use crate::isa::Isa;
use crate::par::{self, OutPtr};
use crate::qgemm_rows::{Generic, RunRows, Slab};
use crate::qlayout::{self, packed_len, QFormat, TILE};
use crate::scratch;
#[cfg(target_arch = "aarch64")]
use crate::simd::neon::Neon;
use crate::simd::portable::Portable;
#[cfg(target_arch = "x86_64")]
use crate::simd::x86::{V256, V512};
use crate::simd::Simd;
use crate::{Error, Result};

/// A packed quantized matrix `W[n][k]` borrowed from memory someone else owns (a model's
/// weights, or the NPU's shared buffer holding the same Q4_0 tiles).
#[derive(Debug, Clone, Copy)]
pub struct QuantView<'a> {
    fmt: QFormat,
    n: usize,
    k: usize,
    bytes: &'a [u8],
}

/// A packed quantized matrix that owns its (64-byte aligned) bytes.
#[derive(Debug, Clone)]
pub struct QuantMatrix {
    fmt: QFormat,
    n: usize,
    k: usize,
    data: AlignedBytes,
}

impl QuantMatrix {
    /// Repack ggml row-major blocks of type `ty` (`n` rows of `k` values) once.
    pub fn from_ggml(ty: GgmlType, n: usize, k: usize, blocks: &[u8]) -> Result<Self> {
        let fmt = QFormat::of(ty).ok_or_else(|| Error::Unsupported(ty.name().into()))?;
        let mut data = AlignedBytes::zeroed(packed_len(fmt, n, k)?);
        qlayout::pack_into(fmt, data.as_mut_slice(), blocks, n, k)?;
        Ok(Self { fmt, n, k, data })
    }

    /// Take bytes already in the packed layout (e.g. Q4_0 tiles made for the NPU).
    pub fn from_packed(fmt: QFormat, n: usize, k: usize, packed: &[u8]) -> Result<Self> {
        let view = QuantView::new(fmt, n, k, packed)?;
        let mut data = AlignedBytes::zeroed(packed.len());
        data.as_mut_slice().copy_from_slice(view.bytes);
        Ok(Self { fmt, n, k, data })
    }

    /// The borrowed view the kernels run on.
    pub fn view(&self) -> QuantView<'_> {
        QuantView {
            fmt: self.fmt,
            n: self.n,
            k: self.k,
            bytes: self.data.as_slice(),
        }
    }
}

impl<'a> QuantView<'a> {
    /// View `bytes` as a packed `n x k` matrix of `fmt`; an error names a wrong length or shape.
    pub fn new(fmt: QFormat, n: usize, k: usize, bytes: &'a [u8]) -> Result<Self> {
        check_len("packed weights", bytes.len(), packed_len(fmt, n, k)?)?;
        Ok(Self { fmt, n, k, bytes })
    }

    /// View the NPU's Q4_0 tiles (`KDSP_LAYOUT_Q4_0_TILES`) of an `n x k` matrix.
    pub fn q4_0_tiles(bytes: &'a [u8], n: usize, k: usize) -> Result<Self> {
        Self::new(QFormat::Q4_0, n, k, bytes)
    }

    /// The format.
    pub fn format(&self) -> QFormat {
        self.fmt
    }

    /// `(n, k)`: output features, input features.
    pub fn dims(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    /// The packed bytes.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// Dequantize row `row` into `out` (`k` values).
    pub fn dequantize_row(&self, row: usize, out: &mut [f32]) -> Result<()> {
        qlayout::dequantize_packed_row(self.fmt, self.bytes, self.n, self.k, row, out)
    }

    /// `out[m][n] = sum_k x[m][k] W[n][k] + bias[n]` on the best path of this CPU.
    pub fn gemm(&self, x: &[f32], m: usize, bias: Option<&[f32]>, out: &mut [f32]) -> Result<()> {
        self.gemm_with(Isa::best(), x, m, bias, out)
    }

    /// [`QuantView::gemm`] on an explicit path (an error if this CPU cannot run it).
    pub fn gemm_with(
        &self,
        isa: Isa,
        x: &[f32],
        m: usize,
        bias: Option<&[f32]>,
        out: &mut [f32],
    ) -> Result<()> {
        let len = out.len();
        self.gemm_raw(isa, x, m, bias, out.as_mut_ptr(), len)
    }

    /// [`Self::gemm`] into uninitialised memory (every element is written), so callers need not
    /// zero a buffer the kernel overwrites.
    pub fn gemm_uninit(
        &self,
        x: &[f32],
        m: usize,
        bias: Option<&[f32]>,
        out: &mut [std::mem::MaybeUninit<f32>],
    ) -> Result<()> {
        let len = out.len();
        self.gemm_raw(Isa::best(), x, m, bias, out.as_mut_ptr().cast(), len)
    }

    /// The GEMM into `len` floats at `out`, which it only writes.
    fn gemm_raw(
        &self,
        isa: Isa,
        x: &[f32],
        m: usize,
        bias: Option<&[f32]>,
        out: *mut f32,
        len: usize,
    ) -> Result<()> {
        isa.require()?;
        let (n, k) = (self.n, self.k);
        check_len(
            "activations",
            x.len(),
            crate::error::mul("activations", m, k)?,
        )?;
        check_len("output", len, crate::error::mul("output", m, n)?)?;
        if let Some(b) = bias {
            check_len("bias", b.len(), n)?;
        }
        if m == 0 {
            return Ok(());
        }
        let spec = act_spec(self.fmt, isa);
        let task = task_for(isa);
        let n_slabs = n.div_ceil(lanes(isa));
        let slab_bytes = self.bytes.len() / n_slabs;
        let grid = par::grid(n_slabs, slab_bytes, m, rayon::current_num_threads());
        let call = scratch::call_id();
        let out = OutPtr(out);
        // One parallel region: each task quantizes the rows it covers into its thread's reused
        // buffers (once per thread and row range), then runs its slabs.
        par::for_each_tile(grid, n_slabs, m, |slabs, rows| {
            scratch::with(|s| {
                let tag = (call, rows.start, rows.end);
                if s.tag != tag {
                    let xr = &x[rows.start * k..rows.end * k];
                    act::quantize_into(
                        &mut s.acts,
                        &mut s.row,
                        xr,
                        rows.len(),
                        grid.max_rows,
                        k,
                        spec,
                        isa,
                    );
                    s.tag = tag;
                }
                let job = Job {
                    w: *self,
                    acts: &s.acts,
                    // SAFETY: row `rows.start` is inside the `m x n` output.
                    out: OutPtr(unsafe { out.get().add(rows.start * n) }),
                    bias,
                };
                // Row passes outside, slabs inside: the task's slab range stays in L2 while
                // each pass of rows goes over it.
                for pass in par::passes(rows.len()) {
                    // SAFETY: the ISA was checked above; tasks write disjoint output rectangles
                    // (rows of `job.out` are relative to `rows.start`, as the activations).
                    unsafe { task(&job, slabs.clone(), pass) }
                }
            })
        });
        Ok(())
    }
}

/// The activation scheme a weight format pairs with on `isa`.
fn act_spec(fmt: QFormat, isa: Isa) -> ActSpec {
    match fmt {
        QFormat::Q4_0 => ActSpec {
            k_quant: false,
            off_group: 32,
            offset: 8,
            fsum: false,
        },
        QFormat::Q8_0 => ActSpec {
            k_quant: false,
            off_group: 32,
            // VNNI multiplies unsigned weight bytes: codes are biased by 128 on load.
            offset: if s8_biased(isa) { 128 } else { 0 },
            fsum: false,
        },
        QFormat::Q4K => ActSpec {
            k_quant: true,
            off_group: 32,
            offset: 0,
            fsum: true,
        },
        QFormat::Q6K => ActSpec {
            k_quant: true,
            off_group: 16,
            offset: 32,
            fsum: false,
        },
    }
}

fn s8_biased(isa: Isa) -> bool {
    matches!(isa, Isa::AvxVnni | Isa::Avx512Vnni)
}

/// The most 32-bit lanes of any path's vector.
pub(crate) const MAX_LANES: usize = 16;

/// 32-bit lanes of a vector on `isa` (= weight rows per slab).
pub(crate) fn lanes(isa: Isa) -> usize {
    match isa {
        Isa::Avx512 | Isa::Avx512Vnni => 16,
        Isa::Neon | Isa::NeonDotprod | Isa::NeonI8mm => 4,
        _ => 8,
    }
}

/// One task of a GEMM call: the weights, the quantized activations of the task's rows, and
/// the output and bias from the task's first row.
pub(crate) struct Job<'a> {
    w: QuantView<'a>,
    acts: &'a Acts,
    out: OutPtr,
    /// `n` values (not padded: a partial last slab reads a padded copy of its tail).
    bias: Option<&'a [f32]>,
}

type TaskFn = unsafe fn(&Job<'_>, Range<usize>, Range<usize>);

fn task_for(isa: Isa) -> TaskFn {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => task_avx2,
        #[cfg(target_arch = "x86_64")]
        Isa::AvxVnni => task_avx_vnni,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => task_avx512,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni => task_avx512_vnni,
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => task_neon,
        #[cfg(target_arch = "aarch64")]
        Isa::NeonDotprod => task_dotprod,
        #[cfg(target_arch = "aarch64")]
        Isa::NeonI8mm => task_i8mm,
        _ => task::<Portable>,
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn task_avx2(job: &Job<'_>, slabs: Range<usize>, rows: Range<usize>) {
    task::<V256<false>>(job, slabs, rows)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn task_avx_vnni(job: &Job<'_>, slabs: Range<usize>, rows: Range<usize>) {
    task::<V256<true>>(job, slabs, rows)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn task_avx512(job: &Job<'_>, slabs: Range<usize>, rows: Range<usize>) {
    task::<V512<false>>(job, slabs, rows)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn task_avx512_vnni(job: &Job<'_>, slabs: Range<usize>, rows: Range<usize>) {
    task::<V512<true>>(job, slabs, rows)
}

/// Quantized GEMM task, NEON.
#[cfg(target_arch = "aarch64")]
#[target_feature(enable = "neon")]
unsafe fn task_neon(job: &Job<'_>, slabs: Range<usize>, rows: Range<usize>) {
    task::<Neon<false>>(job, slabs, rows)
}

/// Quantized GEMM task, NEON + dotprod (`sdot`).
#[cfg(target_arch = "aarch64")]
#[target_feature(enable = "neon,dotprod")]
unsafe fn task_dotprod(job: &Job<'_>, slabs: Range<usize>, rows: Range<usize>) {
    task::<Neon<true>>(job, slabs, rows)
}

/// Quantized GEMM task, NEON + dotprod + i8mm (`smmla`; one leftover row through `sdot`).
#[cfg(target_arch = "aarch64")]
#[target_feature(enable = "neon,dotprod,i8mm")]
unsafe fn task_i8mm(job: &Job<'_>, slabs: Range<usize>, rows: Range<usize>) {
    task_with::<Neon<true>, crate::aarch64::i8mm::Mmla>(job, slabs, rows)
}

/// All slabs x rows of one task.
#[inline(always)]
pub(crate) unsafe fn task<S: Simd>(job: &Job<'_>, slabs: Range<usize>, rows: Range<usize>) {
    task_with::<S, Generic<S>>(job, slabs, rows)
}

/// All slabs (of `S::LANES` rows) x rows of one task, each slab's rows through `R`.
#[inline(always)]
pub(crate) unsafe fn task_with<S: Simd, R: RunRows>(
    job: &Job<'_>,
    slabs: Range<usize>,
    rows: Range<usize>,
) {
    let w = &job.w;
    let fmt = w.fmt;
    let (nt_n, kb_n) = (w.n.div_ceil(TILE), w.k / fmt.block());
    let (cb, sb) = (fmt.code_bytes(), fmt.scale_bytes());
    let base = w.bytes.as_ptr();
    let scale_base = base.add(nt_n * kb_n * cb);
    let per_tile = TILE / S::LANES;
    for s in slabs {
        let (nt, g) = (s / per_tile, s % per_tile);
        let n0 = s * S::LANES;
        let nvalid = (w.n - n0).min(S::LANES);
        // A partial last slab reads its bias from a zero-padded copy (the kernels load a whole
        // vector of it and store `nvalid` lanes).
        let mut tail = [0f32; MAX_LANES];
        let bias = match job.bias {
            None => std::ptr::null(),
            Some(b) if nvalid == S::LANES => b.as_ptr().add(n0),
            Some(b) => {
                tail[..nvalid].copy_from_slice(&b[n0..n0 + nvalid]);
                tail.as_ptr()
            }
        };
        let sl = Slab {
            codes: base.add(nt * kb_n * cb + g * S::LANES * 4),
            scales: scale_base.add(nt * kb_n * sb),
            g_off: g * S::LANES,
            kb_n,
            out: job.out.0.add(n0),
            ldo: w.n,
            bias,
            nvalid,
        };
        let mut m = rows.start;
        while m < rows.end {
            m += R::run(fmt, &sl, job.acts, m, rows.end - m);
        }
    }
}
