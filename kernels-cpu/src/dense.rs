//! GEMM over dense weights (f32, f16, bf16) stored in the NPU's HMX weight-tile order, with f32
//! activations and f32 accumulation; half-precision weights stay half in memory and are widened
//! in registers.
//!
//! The layout is `KDSP_LAYOUT_HMX_WEIGHT_TILES` (kernels-dsp `kdsp_ops.h`) for any element type:
//! 32 x 32 tiles, tile `(nt, kt)` at element `(nt * KT + kt) * 1024`, element `(k, n)` of a tile
//! at `(k / 2) * 64 + n * 2 + k % 2` (pairs of K interleaved; in bytes for f16,
//! `(k/2)*128 + n*4 + (k%2)*2`). Padding is zero. For f16 the bytes are exactly the NPU's, so
//! one copy of the weights serves both; the CPU gives nothing up for it: a vector load of one
//! K pair across `LANES / 2` outputs, multiplied by the broadcast activation pair, accumulates
//! each output's even and odd K terms in neighbouring lanes, summed once at the end.

use std::ops::Range;

use half::{bf16, f16};

use crate::aligned::AlignedBytes;
use crate::error::{check_len, mul};
use crate::ggml::GgmlType;
use crate::isa::Isa;
use crate::par::{self, OutPtr};
use crate::qgemm::{lanes, MAX_LANES};
use crate::scratch;
#[cfg(target_arch = "aarch64")]
use crate::simd::neon::Neon;
use crate::simd::portable::Portable;
#[cfg(target_arch = "x86_64")]
use crate::simd::x86::{V256, V512};
use crate::simd::Simd;
use crate::{Error, Result};

const TILE: usize = 32;
/// Elements per tile.
const TILE_ELEMS: usize = TILE * TILE;

/// Element type of dense weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DenseType {
    /// IEEE binary32.
    F32,
    /// IEEE binary16.
    F16,
    /// bfloat16.
    BF16,
}

impl DenseType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DenseType::F32 => 4,
            DenseType::F16 | DenseType::BF16 => 2,
        }
    }

    /// The dense type of a ggml type, if it is one.
    pub fn of(ty: GgmlType) -> Option<DenseType> {
        match ty {
            GgmlType::F32 => Some(DenseType::F32),
            GgmlType::F16 => Some(DenseType::F16),
            GgmlType::BF16 => Some(DenseType::BF16),
            _ => None,
        }
    }
}

/// Bytes of an `n x k` matrix of `ty` in tile order.
pub fn tiles_len(ty: DenseType, n: usize, k: usize) -> Result<usize> {
    if n == 0 || k == 0 {
        return Err(Error::Shape {
            op: "dense weights",
            what: format!("{n} x {k} has no elements"),
        });
    }
    let tiles = mul("dense weights", n.div_ceil(TILE), k.div_ceil(TILE))?;
    mul("dense weights", tiles, TILE_ELEMS * ty.size())
}

/// Row `row` (row-major elements of `ES` bytes) into its place in tile order: a tile row holds
/// its K pairs 64 elements apart, each pair two consecutive elements.
fn scatter_row<const ES: usize>(dst: &mut [u8], kt_n: usize, row: usize, src: &[u8]) {
    let mut pairs = src.chunks_exact(2 * ES);
    for (p, pair) in pairs.by_ref().enumerate() {
        let at = tile_index(kt_n, row, 2 * p) * ES;
        dst[at..at + 2 * ES].copy_from_slice(pair);
    }
    let last = pairs.remainder();
    if !last.is_empty() {
        let at = tile_index(kt_n, row, src.len() / ES - 1) * ES;
        dst[at..at + ES].copy_from_slice(last);
    }
}

/// Element index of `(row n, column k)` in tile order.
fn tile_index(kt_n: usize, row: usize, col: usize) -> usize {
    let tile = (row / TILE) * kt_n + col / TILE;
    let (k, n) = (col % TILE, row % TILE);
    tile * TILE_ELEMS + (k / 2) * 64 + n * 2 + k % 2
}

/// Dense weights borrowed in tile order (a model's weights, or the NPU's fp16 HMX tiles).
#[derive(Debug, Clone, Copy)]
pub struct DenseView<'a> {
    ty: DenseType,
    n: usize,
    k: usize,
    bytes: &'a [u8],
}

/// Dense weights in tile order, owning their (64-byte aligned) bytes.
#[derive(Debug, Clone)]
pub struct DenseMatrix {
    ty: DenseType,
    n: usize,
    k: usize,
    data: AlignedBytes,
}

impl DenseMatrix {
    /// Re-lay row-major raw little-endian elements of `ty` (`n` rows of `k`) into tile order.
    pub fn from_row_major(ty: DenseType, n: usize, k: usize, raw: &[u8]) -> Result<Self> {
        let mut m = Self::zeroed(ty, n, k)?;
        check_len(
            "dense weight bytes",
            raw.len(),
            mul("dense weight bytes", m.row_bytes(), n)?,
        )?;
        m.set_rows(0, raw)?;
        Ok(m)
    }

    /// An `n x k` matrix of `ty` with every element zero, to be filled a few rows at a time
    /// with [`DenseMatrix::set_rows`]: a loader streams a matrix from its file into the tiles
    /// without holding the matrix's rows whole on the way.
    pub fn zeroed(ty: DenseType, n: usize, k: usize) -> Result<Self> {
        Ok(Self {
            ty,
            n,
            k,
            data: AlignedBytes::zeroed(tiles_len(ty, n, k)?),
        })
    }

    /// Bytes of one row-major row (`k` elements of the matrix's type; no overflow: the tiles,
    /// which hold at least a row, were allocated).
    pub fn row_bytes(&self) -> usize {
        self.k * self.ty.size()
    }

    /// Write rows `first..first + raw.len() / row_bytes` from row-major raw little-endian
    /// elements of the matrix's type; `raw` must hold whole rows that fit in the matrix.
    pub fn set_rows(&mut self, first: usize, raw: &[u8]) -> Result<()> {
        let row_bytes = self.row_bytes();
        if !raw.len().is_multiple_of(row_bytes)
            || raw.len() / row_bytes > self.n.saturating_sub(first)
        {
            return Err(Error::Shape {
                op: "dense weight rows",
                what: format!(
                    "{} bytes at row {first}: not whole rows of {row_bytes} bytes inside the {} rows",
                    raw.len(),
                    self.n
                ),
            });
        }
        let kt_n = self.k.div_ceil(TILE);
        let dst = self.data.as_mut_slice();
        for (i, src_row) in raw.chunks_exact(row_bytes).enumerate() {
            // Sized copies (not a `memcpy` call per element): a 1.5B-parameter file packs in
            // seconds rather than a minute.
            match self.ty.size() {
                4 => scatter_row::<4>(dst, kt_n, first + i, src_row),
                _ => scatter_row::<2>(dst, kt_n, first + i, src_row),
            }
        }
        Ok(())
    }

    /// From f32 values (kept f32).
    pub fn from_f32(w: &[f32], n: usize, k: usize) -> Result<Self> {
        Self::from_row_major(
            DenseType::F32,
            n,
            k,
            &le_bytes(w, |v| v.to_le_bytes().to_vec()),
        )
    }

    /// From f16 values (kept f16).
    pub fn from_f16(w: &[f16], n: usize, k: usize) -> Result<Self> {
        Self::from_row_major(
            DenseType::F16,
            n,
            k,
            &le_bytes(w, |v| v.to_le_bytes().to_vec()),
        )
    }

    /// From bf16 values (kept bf16).
    pub fn from_bf16(w: &[bf16], n: usize, k: usize) -> Result<Self> {
        Self::from_row_major(
            DenseType::BF16,
            n,
            k,
            &le_bytes(w, |v| v.to_le_bytes().to_vec()),
        )
    }

    /// Take bytes already in tile order (e.g. fp16 tiles made for the NPU).
    pub fn from_tiles(ty: DenseType, n: usize, k: usize, tiles: &[u8]) -> Result<Self> {
        let v = DenseView::new(ty, n, k, tiles)?;
        let mut data = AlignedBytes::zeroed(tiles.len());
        data.as_mut_slice().copy_from_slice(v.bytes);
        Ok(Self { ty, n, k, data })
    }

    /// The borrowed view the kernels run on.
    pub fn view(&self) -> DenseView<'_> {
        DenseView {
            ty: self.ty,
            n: self.n,
            k: self.k,
            bytes: self.data.as_slice(),
        }
    }
}

impl<'a> DenseView<'a> {
    /// View `bytes` (tile order) as an `n x k` matrix of `ty`.
    pub fn new(ty: DenseType, n: usize, k: usize, bytes: &'a [u8]) -> Result<Self> {
        check_len("dense weight tiles", bytes.len(), tiles_len(ty, n, k)?)?;
        Ok(Self { ty, n, k, bytes })
    }

    /// View the NPU's fp16 HMX weight tiles (`KDSP_LAYOUT_HMX_WEIGHT_TILES`) of `W[n][k]`.
    pub fn hmx_f16_tiles(bytes: &'a [u8], n: usize, k: usize) -> Result<Self> {
        Self::new(DenseType::F16, n, k, bytes)
    }

    /// The element type.
    pub fn dtype(&self) -> DenseType {
        self.ty
    }

    /// `(n, k)`.
    pub fn dims(&self) -> (usize, usize) {
        (self.n, self.k)
    }

    /// The bytes, in tile order.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// Row `row` as f32 (`k` values).
    pub fn row(&self, row: usize, out: &mut [f32]) -> Result<()> {
        check_len("row output", out.len(), self.k)?;
        if row >= self.n {
            return Err(Error::Shape {
                op: "row index",
                what: format!("{row} is outside the {} rows", self.n),
            });
        }
        let kt_n = self.k.div_ceil(TILE);
        for (col, o) in out.iter_mut().enumerate() {
            let at = tile_index(kt_n, row, col) * self.ty.size();
            let b = &self.bytes[at..];
            *o = match self.ty {
                DenseType::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
                DenseType::F16 => f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32(),
                DenseType::BF16 => bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32(),
            };
        }
        Ok(())
    }

    /// `out[m][n] = sum_k x[m][k] W[n][k] + bias[n]` on the best path of this CPU.
    pub fn gemm(&self, x: &[f32], m: usize, bias: Option<&[f32]>, out: &mut [f32]) -> Result<()> {
        self.gemm_with(Isa::best(), x, m, bias, out)
    }

    /// [`DenseView::gemm`] on an explicit path (an error if this CPU cannot run it).
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
        check_len("activations", x.len(), mul("activations", m, k)?)?;
        check_len("output", len, mul("output", m, n)?)?;
        if let Some(b) = bias {
            check_len("bias", b.len(), n)?;
        }
        if m == 0 {
            return Ok(());
        }
        let kp = k.div_ceil(TILE) * TILE;
        let task = task_for(isa);
        let n_slabs = n.div_ceil(lanes(isa));
        let slab_bytes = self.bytes.len() / n_slabs;
        let grid = par::grid(n_slabs, slab_bytes, m, rayon::current_num_threads());
        let call = scratch::call_id();
        let out = OutPtr(out);
        // One parallel region: each task packs the rows it covers into its thread's reused
        // buffer (once per thread and row range), then runs its slabs.
        par::for_each_tile(grid, n_slabs, m, |slabs, rows| {
            scratch::with(|s| {
                let tag = (call, rows.start, rows.end);
                let buf = crate::work_buf::grow(&mut s.pairs, grid.max_rows * kp);
                let xs = &mut buf[..rows.len() * kp];
                if s.tag != tag {
                    pack_pairs(&x[rows.start * k..rows.end * k], rows.len(), k, kp, xs);
                    s.tag = tag;
                }
                let job = Job {
                    w: *self,
                    x: xs,
                    m: rows.len(),
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

/// Activations re-laid K-pair-major into `v` (`m * kp` floats, every one written): pair `p` of
/// row `r` (`x[r][2p], x[r][2p + 1]`) at floats `(p * m + r) * 2`, K zero-padded to whole tiles.
/// A micro-kernel's broadcasts for one K pair are then consecutive pairs at one address plus
/// constant offsets (no per-row pointer arithmetic on the ports the FMAs need, one stream instead
/// of one per row); the copy is one pass over `x`.
fn pack_pairs(x: &[f32], m: usize, k: usize, kp: usize, v: &mut [f32]) {
    debug_assert_eq!(v.len(), m * kp);
    debug_assert_eq!(x.len(), m * k);
    // Eight rows at a time: for each pair, the eight rows' pairs are 64 consecutive bytes of `v`
    // (one cache line written whole), read from eight row streams of `x`.
    const RB: usize = 8;
    let full = k / 2;
    let mut r0 = 0;
    while r0 < m {
        let rb = (m - r0).min(RB);
        if rb == RB {
            // A whole block: eight fixed row streams, each pair moved as one 8-byte word (the
            // general loop below re-derives its row count and bounds for every element).
            let rows: [&[f32]; RB] = std::array::from_fn(|i| &x[(r0 + i) * k..][..2 * full]);
            let dst = &mut v[r0 * 2..];
            assert!(full == 0 || dst.len() >= ((full - 1) * m + RB) * 2);
            for p in 0..full {
                // SAFETY: pair `p < full` of each row is inside its `2 * full` elements, and
                // floats `(p * m + r0) * 2 .. + 16` inside `v` (asserted above).
                unsafe {
                    let d = dst.as_mut_ptr().add(p * m * 2).cast::<u64>();
                    for (i, row) in rows.iter().enumerate() {
                        let w = row.as_ptr().add(2 * p).cast::<u64>().read_unaligned();
                        d.add(i).write_unaligned(w);
                    }
                }
            }
        } else {
            for p in 0..full {
                let dst = &mut v[(p * m + r0) * 2..][..rb * 2];
                for (i, d) in dst.chunks_exact_mut(2).enumerate() {
                    d.copy_from_slice(&x[(r0 + i) * k + 2 * p..][..2]);
                }
            }
        }
        for r in r0..r0 + rb {
            // An odd K's last pair, then the padding pairs of this row.
            if k % 2 == 1 {
                let at = (full * m + r) * 2;
                v[at] = x[r * k + k - 1];
                v[at + 1] = 0.0;
            }
            for p in k.div_ceil(2)..kp / 2 {
                let at = (p * m + r) * 2;
                v[at] = 0.0;
                v[at + 1] = 0.0;
            }
        }
        r0 += rb;
    }
}

pub(crate) struct Job<'a> {
    w: DenseView<'a>,
    /// Activations, K-pair-major ([`pack_pairs`]).
    x: &'a [f32],
    /// Activation rows.
    m: usize,
    out: OutPtr,
    /// `n` values (not padded: a partial last slab reads a padded copy of its tail).
    bias: Option<&'a [f32]>,
}

type TaskFn = unsafe fn(&Job<'_>, Range<usize>, Range<usize>);

fn task_for(isa: Isa) -> TaskFn {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::AvxVnni => task_avx2,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 | Isa::Avx512Vnni => task_avx512,
        // The dense kernels use no integer dot: every NEON path runs the same code.
        #[cfg(target_arch = "aarch64")]
        Isa::Neon | Isa::NeonDotprod | Isa::NeonI8mm => task_neon,
        _ => task::<Portable>,
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn task_avx2(job: &Job<'_>, slabs: Range<usize>, rows: Range<usize>) {
    task::<V256<false>>(job, slabs, rows)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn task_avx512(job: &Job<'_>, slabs: Range<usize>, rows: Range<usize>) {
    task::<V512<false>>(job, slabs, rows)
}

/// Dense GEMM task, every NEON path (f16 weights widened with `fcvtl`).
#[cfg(target_arch = "aarch64")]
#[target_feature(enable = "neon")]
unsafe fn task_neon(job: &Job<'_>, slabs: Range<usize>, rows: Range<usize>) {
    task::<Neon<false>>(job, slabs, rows)
}

/// One slab's operands.
struct Slab {
    /// Tile `(nt, 0)` plus this slab's lane offset, in elements of the weight type.
    tiles: *const u8,
    kt_n: usize,
    out: *mut f32,
    ldo: usize,
    bias: *const f32,
    nvalid: usize,
}

#[inline(always)]
pub(crate) unsafe fn task<S: Simd>(job: &Job<'_>, slabs: Range<usize>, rows: Range<usize>) {
    let w = &job.w;
    let kt_n = w.k.div_ceil(TILE);
    let es = w.ty.size();
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
            tiles: w
                .bytes
                .as_ptr()
                .add((nt * kt_n * TILE_ELEMS + g * S::LANES * 2) * es),
            kt_n,
            out: job.out.0.add(n0),
            ldo: w.n,
            bias,
            nvalid,
        };
        let mut m = rows.start;
        while m < rows.end {
            let left = rows.end - m;
            macro_rules! go {
                ($mr:literal) => {{
                    match w.ty {
                        DenseType::F32 => k_dense::<S, $mr, 0>(&sl, job, m),
                        DenseType::F16 => k_dense::<S, $mr, 1>(&sl, job, m),
                        DenseType::BF16 => k_dense::<S, $mr, 2>(&sl, job, m),
                    }
                    $mr
                }};
            }
            // Eight or more independent accumulators wherever the rows allow (an FMA's latency
            // is four cycles at two per cycle): a pass's last rows are not left to one- and
            // two-row kernels that wait on their own few chains. 14 rows with 16 lanes fill 28 of
            // the 32 vector registers with accumulators (two for the weights, one broadcast), so
            // each weight load (and f16 conversion) feeds 28 FMAs; a 64-row pass is 14 x 4 + 8.
            m += if S::LANES >= 16 && left >= 14 {
                go!(14)
            } else if S::LANES >= 16 && left >= 12 {
                go!(12)
            } else if S::LANES >= 16 && left >= 8 {
                go!(8)
            } else if left >= 6 {
                go!(6)
            } else if left >= 4 {
                go!(4)
            } else if left >= 3 {
                go!(3)
            } else if left >= 2 {
                go!(2)
            } else {
                go!(1)
            };
        }
    }
}

/// Load `LANES` weights of type `T` (0 = f32, 1 = f16, 2 = bf16) at element `i` of `p`.
#[inline(always)]
unsafe fn load_w<S: Simd, const T: u8>(p: *const u8, i: usize) -> S::F {
    match T {
        0 => S::load_f32(p.cast::<f32>().add(i)),
        1 => S::load_f16(p.cast::<u16>().add(i)),
        _ => S::load_bf16(p.cast::<u16>().add(i)),
    }
}

#[inline(always)]
unsafe fn k_dense<S: Simd, const MR: usize, const T: u8>(sl: &Slab, job: &Job<'_>, m0: usize) {
    let mut a0 = [S::fzero(); MR];
    let mut a1 = [S::fzero(); MR];
    // Pair p of rows m0.. starts at (p * m + m0) * 2.
    let mut x = job.x.as_ptr().add(m0 * 2);
    let step = job.m * 2;
    for kt in 0..sl.kt_n {
        let t = kt * TILE_ELEMS;
        for kp in 0..TILE / 2 {
            let e = t + kp * 64;
            let w0 = load_w::<S, T>(sl.tiles, e);
            let w1 = load_w::<S, T>(sl.tiles, e + S::LANES);
            for i in 0..MR {
                let xb = S::splat_pair(x.add(2 * i));
                a0[i] = S::fma(w0, xb, a0[i]);
                a1[i] = S::fma(w1, xb, a1[i]);
            }
            x = x.add(step);
        }
    }
    for i in 0..MR {
        let mut v = S::pair_sum(a0[i], a1[i]);
        if !sl.bias.is_null() {
            v = S::fadd(v, S::load_f32(sl.bias));
        }
        S::store(sl.out.add((m0 + i) * sl.ldo), v, sl.nvalid);
    }
}

/// The little-endian bytes of `w`: the values' own memory on a little-endian target (no copy:
/// packing a matrix then needs no second buffer of its size), `each`'s bytes collected otherwise.
fn le_bytes<T: Plain>(w: &[T], each: impl Fn(&T) -> Vec<u8>) -> std::borrow::Cow<'_, [u8]> {
    if cfg!(target_endian = "little") {
        // SAFETY: `T: Plain` (f32, f16, bf16): values without padding, so every byte of the
        // slice is initialised; `u8` has alignment 1, the length is the slice's size in
        // bytes, and the borrow keeps `w` alive and unmodified.
        std::borrow::Cow::Borrowed(unsafe {
            std::slice::from_raw_parts(w.as_ptr().cast::<u8>(), std::mem::size_of_val(w))
        })
    } else {
        std::borrow::Cow::Owned(w.iter().flat_map(each).collect())
    }
}

/// Element types whose memory is their bytes (no padding, every bit pattern a value).
trait Plain: Copy {}
impl Plain for f32 {}
impl Plain for f16 {}
impl Plain for bf16 {}
