//! Test harness shared by the integration tests: 128-byte aligned buffers, a context wrapper
//! around the FFI, descriptor builders, a seeded PRNG, and the "skip unless CI" policy for
//! external tools. Reference implementations live in `reference.rs`.
#![allow(dead_code)]

pub mod reference;

use kernels_dsp::*;
use std::alloc::{alloc_zeroed, dealloc, Layout};

/// Whether the suite runs under `CI=true` (missing tools then fail tests instead of skipping them).
pub fn in_ci() -> bool {
    std::env::var("CI").map(|v| v == "true").unwrap_or(false)
}

/// Skips a test whose external tool is missing, or fails it under `CI=true`.
/// Returns `true` when the caller should return early.
pub fn skip_or_fail(test: &str, missing: &str, install: &str) -> bool {
    let why =
        format!("{missing}. Install it with `{install}` (on Debian 12: `.ci/install-test-deps`)");
    if in_ci() {
        panic!("{test}: FAILED because CI=true and {why}");
    }
    announce(&format!("{test}: SKIPPED: {why}"));
    true
}

/// Prints a line to the real stderr, bypassing the test harness's capture, so summaries and skip
/// notices show up in `cargo test` output even without `--nocapture`.
pub fn announce(msg: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{msg}");
}

/// A zero-initialised, 128-byte aligned heap buffer (the alignment registered buffers need).
pub struct Buf {
    ptr: *mut u8,
    len: usize,
}

unsafe impl Send for Buf {}

impl Buf {
    pub fn new(len: usize) -> Buf {
        let layout = Layout::from_size_align(len.max(1), 128).expect("layout");
        // SAFETY: non-zero size, valid alignment.
        let ptr = unsafe { alloc_zeroed(layout) };
        assert!(!ptr.is_null(), "allocation of {len} bytes failed");
        Buf { ptr, len }
    }

    pub fn from_bytes(bytes: &[u8]) -> Buf {
        let mut b = Buf::new(bytes.len());
        b.bytes_mut().copy_from_slice(bytes);
        b
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    pub fn bytes(&self) -> &[u8] {
        // SAFETY: ptr is valid for len bytes for the lifetime of self.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    pub fn write_f32(&mut self, off: usize, v: &[f32]) {
        for (i, x) in v.iter().enumerate() {
            self.bytes_mut()[off + 4 * i..off + 4 * i + 4].copy_from_slice(&x.to_le_bytes());
        }
    }

    pub fn write_u16(&mut self, off: usize, v: &[u16]) {
        for (i, x) in v.iter().enumerate() {
            self.bytes_mut()[off + 2 * i..off + 2 * i + 2].copy_from_slice(&x.to_le_bytes());
        }
    }

    pub fn write_i32(&mut self, off: usize, v: &[i32]) {
        for (i, x) in v.iter().enumerate() {
            self.bytes_mut()[off + 4 * i..off + 4 * i + 4].copy_from_slice(&x.to_le_bytes());
        }
    }

    pub fn read_f32(&self, off: usize, n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| {
                f32::from_le_bytes(
                    self.bytes()[off + 4 * i..off + 4 * i + 4]
                        .try_into()
                        .unwrap(),
                )
            })
            .collect()
    }

    pub fn read_u16(&self, off: usize, n: usize) -> Vec<u16> {
        (0..n)
            .map(|i| {
                u16::from_le_bytes(
                    self.bytes()[off + 2 * i..off + 2 * i + 2]
                        .try_into()
                        .unwrap(),
                )
            })
            .collect()
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        // SAFETY: allocated in new() with this layout.
        unsafe {
            dealloc(
                self.ptr,
                Layout::from_size_align(self.len.max(1), 128).unwrap(),
            )
        }
    }
}

/// An owned kernels-dsp context with its buffers (ids are indices into `bufs`).
pub struct Ctx {
    _mem: Buf,
    _scratch: Buf,
    raw: *mut kdsp_ctx,
    bufs: Vec<Option<Buf>>,
    pub n_workers: u32,
}

pub const DEFAULT_SCRATCH: u64 = 16 << 20;

impl Ctx {
    pub fn new(n_workers: u32) -> Ctx {
        Ctx::with(n_workers, 64, DEFAULT_SCRATCH)
    }

    pub fn with(n_workers: u32, max_buffers: u32, scratch_bytes: u64) -> Ctx {
        let cfg = kdsp_ctx_config {
            n_workers,
            max_buffers,
            scratch_bytes,
        };
        // SAFETY: cfg is a valid pointer.
        let need = unsafe { kdsp_ctx_bytes(&cfg) };
        assert!(
            need > 0,
            "invalid config {n_workers} workers / {max_buffers} buffers"
        );
        let mem = Buf::new(need as usize);
        let scratch = Buf::new(scratch_bytes as usize);
        let mut raw = std::ptr::null_mut();
        // SAFETY: mem/scratch outlive the context (dropped after kdsp_ctx_release in Drop).
        let st =
            unsafe { kdsp_ctx_init(mem.ptr().cast(), need, scratch.ptr().cast(), &cfg, &mut raw) };
        assert_eq!(st, KDSP_STATUS_OK, "kdsp_ctx_init");
        Ctx {
            _mem: mem,
            _scratch: scratch,
            raw,
            bufs: (0..max_buffers).map(|_| None).collect(),
            n_workers,
        }
    }

    pub fn raw(&mut self) -> *mut kdsp_ctx {
        self.raw
    }

    /// Registers `buf` under the lowest free id.
    pub fn add(&mut self, buf: Buf) -> u32 {
        let id = self
            .bufs
            .iter()
            .position(|b| b.is_none())
            .expect("buffer table full") as u32;
        self.add_at(id, buf);
        id
    }

    pub fn add_at(&mut self, id: u32, buf: Buf) {
        // SAFETY: the Buf is kept alive in self.bufs while registered.
        let st = unsafe { kdsp_buffer_register(self.raw, id, buf.ptr().cast(), buf.len() as u64) };
        assert_eq!(st, KDSP_STATUS_OK, "register buffer {id}");
        self.bufs[id as usize] = Some(buf);
    }

    pub fn add_bytes(&mut self, bytes: &[u8]) -> u32 {
        self.add(Buf::from_bytes(bytes))
    }

    pub fn add_f32(&mut self, v: &[f32]) -> u32 {
        let mut b = Buf::new(4 * v.len());
        b.write_f32(0, v);
        self.add(b)
    }

    pub fn add_u16(&mut self, v: &[u16]) -> u32 {
        let mut b = Buf::new(2 * v.len());
        b.write_u16(0, v);
        self.add(b)
    }

    pub fn add_i32(&mut self, v: &[i32]) -> u32 {
        let mut b = Buf::new(4 * v.len());
        b.write_i32(0, v);
        self.add(b)
    }

    pub fn add_zeroed(&mut self, len: usize) -> u32 {
        self.add(Buf::new(len))
    }

    pub fn buf(&self, id: u32) -> &Buf {
        self.bufs[id as usize].as_ref().expect("registered buffer")
    }

    pub fn buf_mut(&mut self, id: u32) -> &mut Buf {
        self.bufs[id as usize].as_mut().expect("registered buffer")
    }

    pub fn f32s(&self, id: u32) -> Vec<f32> {
        let b = self.buf(id);
        b.read_f32(0, b.len() / 4)
    }

    pub fn u16s(&self, id: u32) -> Vec<u16> {
        let b = self.buf(id);
        b.read_u16(0, b.len() / 2)
    }

    /// Runs one op; returns its status.
    pub fn run(&mut self, op: &kdsp_op) -> kdsp_status_t {
        let mut st = KDSP_STATUS_NOT_RUN;
        // SAFETY: op and st are valid; buffers are registered and alive.
        let ret = unsafe { kdsp_execute(self.raw, op, 1, 0, &mut st) };
        assert_eq!(ret, st, "kdsp_execute return value vs per-op status");
        st
    }

    /// Runs a batch; returns (first failing status, per-op statuses).
    pub fn run_batch(
        &mut self,
        ops: &[kdsp_op],
        flags: u32,
    ) -> (kdsp_status_t, Vec<kdsp_status_t>) {
        let mut st = vec![u32::MAX; ops.len()];
        // SAFETY: ops/st have ops.len() entries.
        let ret = unsafe {
            kdsp_execute(
                self.raw,
                ops.as_ptr(),
                ops.len() as u32,
                flags,
                st.as_mut_ptr(),
            )
        };
        (ret, st)
    }

    /// Validates an op without running it; returns (status, scratch bytes).
    pub fn check(&self, op: &kdsp_op) -> (kdsp_status_t, u64) {
        let mut scratch = u64::MAX;
        // SAFETY: valid pointers; check mode does not touch tensor memory.
        let st = unsafe { kdsp_op_check(self.raw, op, &mut scratch) };
        (st, scratch)
    }
}

impl Drop for Ctx {
    fn drop(&mut self) {
        // SAFETY: raw came from kdsp_ctx_init; buffers and memory are freed after this.
        unsafe { kdsp_ctx_release(self.raw) }
    }
}

/// Bytes per element (plain dtypes) or per 32-value block (Q8_0, Q4_0).
pub fn unit_bytes(dtype: u32) -> u64 {
    match dtype {
        KDSP_DTYPE_F32 | KDSP_DTYPE_I32 => 4,
        KDSP_DTYPE_F16 => 2,
        KDSP_DTYPE_Q8_0 => 34,
        KDSP_DTYPE_Q4_0 => 18,
        _ => panic!("dtype {dtype}"),
    }
}

/// Contiguous row-major descriptor, dims innermost first (missing dims are 1).
pub fn rows(buffer_id: u32, dtype: u32, dims: &[u32]) -> kdsp_tensor {
    let mut ne = [1u32; 4];
    ne[..dims.len()].copy_from_slice(dims);
    let unit = unit_bytes(dtype);
    let row = if matches!(dtype, KDSP_DTYPE_Q8_0 | KDSP_DTYPE_Q4_0) {
        (ne[0] / 32) as u64 * unit
    } else {
        ne[0] as u64 * unit
    };
    let nb = [
        unit,
        row,
        row * ne[1] as u64,
        row * ne[1] as u64 * ne[2] as u64,
    ];
    kdsp_tensor {
        buffer_id,
        dtype,
        layout: KDSP_LAYOUT_ROW_MAJOR,
        _pad0: 0,
        offset: 0,
        ne,
        nb,
    }
}

/// Tiled descriptor of logical [rows][k].
pub fn tiles(buffer_id: u32, layout: u32, k: u32, rows: u32) -> kdsp_tensor {
    let dtype = if layout == KDSP_LAYOUT_Q4_0_TILES {
        KDSP_DTYPE_Q4_0
    } else {
        KDSP_DTYPE_F16
    };
    kdsp_tensor {
        buffer_id,
        dtype,
        layout,
        _pad0: 0,
        offset: 0,
        ne: [k, rows, 1, 1],
        nb: [0; 4],
    }
}

pub fn ceil32(x: usize) -> usize {
    x.div_ceil(32)
}

/// splitmix64: small, seedable, identical everywhere.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    pub fn sym(&mut self) -> f32 {
        ((self.next_u64() >> 40) as i32) as f32 * (1.0 / 8_388_608.0) - 1.0
    }

    /// Uniform integer in lo..=hi.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next_u64() % (hi - lo + 1) as u64) as usize
    }

    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.sym() * scale).collect()
    }

    pub fn byte(&mut self) -> u8 {
        (self.next_u64() >> 56) as u8
    }
}

pub fn f16_bits(x: f32) -> u16 {
    half::f16::from_f32(x).to_bits()
}

pub fn f16_val(b: u16) -> f32 {
    half::f16::from_bits(b).to_f32()
}

/// Rounds every value through f16 (what the kernels see from f16 inputs).
pub fn round_f16(v: &[f32]) -> Vec<f32> {
    v.iter().map(|&x| f16_val(f16_bits(x))).collect()
}
