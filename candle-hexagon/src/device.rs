//! The device: a DSP session opened from a [`HexagonConfig`], owning the transport, the NPU
//! address window, the weight arena, the buffer pool (staging and activations) and the routing
//! counters.
//!
//! candle's `Device` enum is closed, so tensors stay `Device::Cpu` (on a phone the NPU shares that
//! memory); a [`HexagonDevice`] is a handle the weight-owning modules and custom ops carry.
//! Cloning it is cheap (an `Arc`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use candle_core::DType;
use kernels_dsp::kdsp_op;

use crate::error::{Error, KernelStatus, Result};
use crate::memory::leases::batch_touches;
use crate::memory::{
    BufferPool, DeviceBuffer, Memory, MemoryStats, PooledBuffer, VaWindow, WeightArena, WeightSlot,
};
use crate::routing::{
    Decision, OpDesc, OpKind, Reason, RoutingReport, RoutingStats, Support, Tier, WeightFormat,
};
use crate::transport::emulated::EmulatedTransport;
use crate::transport::{Batch, Completion, Fence, OpCheck, Transport};

/// Default DSP worker threads (HVX contexts on a phone; pthreads on the emulated DSP).
pub const DEFAULT_WORKERS: usize = 2;
/// Default NPU address window: about what one v75 FastRPC session can map.
pub const DEFAULT_VA_WINDOW_BYTES: u64 = 3 << 30;
/// Largest window: the DSP process has a 32-bit address space.
pub const MAX_VA_WINDOW_BYTES: u64 = 4 << 30;
/// Default mapper entries of a session (an assumption: the real limit is not public).
pub const DEFAULT_MAPPER_ENTRIES: usize = 256;
/// Default scratch arena: the size of VTCM on SM8550..SM8850.
pub const DEFAULT_SCRATCH_BYTES: u64 = 8 << 20;
/// Default size of one weight chunk (packed weights share chunks to save mapper entries).
pub const DEFAULT_WEIGHT_CHUNK_BYTES: u64 = 32 << 20;
/// The FastRPC library of the compute DSP.
pub const DEFAULT_FASTRPC_LIBRARY: &str = "libcdsprpc.so";
/// Largest head dimension of the FlashAttention kernel.
pub const MAX_HEAD_DIM: usize = kernels_dsp::KDSP_FA_MAX_HEAD_DIM as usize;
/// Largest dim the kernels accept.
pub const MAX_DIM: usize = kernels_dsp::KDSP_MAX_NE as usize;

/// How to reach the DSP.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum TransportConfig {
    /// A DSP thread on the host running the kernels-dsp host build.
    #[default]
    Emulated,
    /// FastRPC through the named library (`libcdsprpc.so` on a phone, or a path to the host
    /// shim, see [`crate::shim_library_path`]).
    FastRpc {
        /// Library name or path given to `dlopen`.
        library: PathBuf,
    },
}

impl TransportConfig {
    /// From command-line spellings: `emulated`, or `fastrpc` with `library` naming what to
    /// `dlopen` (`libcdsprpc.so` on a phone, a path) or `shim` for the host FastRPC shim built
    /// with this crate ([`crate::shim_library_path`]). `library` is ignored for `emulated`.
    pub fn from_names(transport: &str, library: &str) -> Result<Self> {
        match transport {
            "emulated" => Ok(Self::Emulated),
            "fastrpc" if library == "shim" => match crate::shim_library_path() {
                Some(library) => Ok(Self::FastRpc { library }),
                None => Err(Error::Config {
                    field: "fastrpc library",
                    reason: "`shim`: this build has no host FastRPC shim".into(),
                }),
            },
            "fastrpc" => Ok(Self::FastRpc {
                library: PathBuf::from(library),
            }),
            t => Err(Error::Config {
                field: "transport",
                reason: format!("`{t}` (expected emulated or fastrpc)"),
            }),
        }
    }
}

/// Device options (all fields have `DEFAULT_*` constants).
#[derive(Debug, Clone, PartialEq)]
pub struct HexagonConfig {
    /// DSP worker threads, 1..=16.
    pub workers: usize,
    /// NPU address window in bytes (page multiple, at most 4 GiB).
    pub va_window_bytes: u64,
    /// Mapper entries (live mappings) of the session, >= 2.
    pub mapper_entries: usize,
    /// Scratch arena (VTCM stand-in) in bytes.
    pub scratch_bytes: u64,
    /// Size of one shared weight chunk.
    pub weight_chunk_bytes: u64,
    /// Ops forced onto the CPU (for bisecting).
    pub deny: Vec<OpKind>,
    /// Transport.
    pub transport: TransportConfig,
}

impl Default for HexagonConfig {
    fn default() -> Self {
        HexagonConfig {
            workers: DEFAULT_WORKERS,
            va_window_bytes: DEFAULT_VA_WINDOW_BYTES,
            mapper_entries: DEFAULT_MAPPER_ENTRIES,
            scratch_bytes: DEFAULT_SCRATCH_BYTES,
            weight_chunk_bytes: DEFAULT_WEIGHT_CHUNK_BYTES,
            deny: Vec::new(),
            transport: TransportConfig::Emulated,
        }
    }
}

impl HexagonConfig {
    /// Check every field; errors name the field.
    pub fn validate(&self) -> Result<()> {
        let bad = |field, reason: String| Err(Error::Config { field, reason });
        if !(1..=kernels_dsp::KDSP_MAX_WORKERS as usize).contains(&self.workers) {
            return bad(
                "workers",
                format!(
                    "{} is not in 1..={}",
                    self.workers,
                    kernels_dsp::KDSP_MAX_WORKERS
                ),
            );
        }
        if self.va_window_bytes < (1 << 20) || self.va_window_bytes > MAX_VA_WINDOW_BYTES {
            return bad(
                "va_window_bytes",
                format!(
                    "{} is not in 1 MiB..=4 GiB (the DSP has a 32-bit address space)",
                    self.va_window_bytes
                ),
            );
        }
        if !(2..=kernels_dsp::KDSP_MAX_BUFFERS as usize).contains(&self.mapper_entries) {
            return bad(
                "mapper_entries",
                format!(
                    "{} is not in 2..={} (one staging buffer plus at least one weight chunk)",
                    self.mapper_entries,
                    kernels_dsp::KDSP_MAX_BUFFERS
                ),
            );
        }
        // FlashAttention needs ~280 KiB per worker at head dim 256; keep 1 MiB on top.
        let min_scratch = self.workers as u64 * (320 << 10) + (1 << 20);
        if self.scratch_bytes < min_scratch {
            return bad(
                "scratch_bytes",
                format!(
                    "{} is below the {min_scratch} bytes {} workers need",
                    self.scratch_bytes, self.workers
                ),
            );
        }
        if self.weight_chunk_bytes < (64 << 10) {
            return bad(
                "weight_chunk_bytes",
                format!("{} is below 64 KiB", self.weight_chunk_bytes),
            );
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct PlanKey {
    pub(crate) opcode: u32,
    pub(crate) k: u32,
    pub(crate) n: u32,
    pub(crate) a_dtype: u32,
    pub(crate) d_dtype: u32,
}

#[derive(Debug, Clone, Copy, Default)]
struct Plan {
    max_ok: usize,
    min_fail: Option<usize>,
}

struct Inner {
    cfg: HexagonConfig,
    mem: Arc<Memory>,
    pool: Arc<BufferPool>,
    arena: Mutex<WeightArena>,
    stats: RoutingStats,
    plans: Mutex<HashMap<PlanKey, Plan>>,
}

/// A Hexagon NPU session. Cheap to clone.
#[derive(Clone)]
pub struct HexagonDevice {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for HexagonDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "HexagonDevice({})",
            self.inner.mem.transport.description()
        )
    }
}

impl HexagonDevice {
    /// Open a session.
    pub fn open(cfg: HexagonConfig) -> Result<Self> {
        cfg.validate()?;
        let ids = cfg.mapper_entries as u32;
        let transport: Box<dyn Transport> = match &cfg.transport {
            TransportConfig::Emulated => Box::new(EmulatedTransport::start(
                cfg.workers,
                ids,
                cfg.scratch_bytes,
            )?),
            #[cfg(feature = "fastrpc")]
            TransportConfig::FastRpc { library } => {
                Box::new(crate::transport::fastrpc::FastRpcTransport::open(
                    library,
                    cfg.workers,
                    ids,
                    cfg.scratch_bytes,
                )?)
            }
            #[cfg(not(feature = "fastrpc"))]
            TransportConfig::FastRpc { .. } => {
                return Err(Error::Config {
                    field: "transport",
                    reason: "this build of candle-hexagon has no `fastrpc` feature".into(),
                })
            }
        };
        let window = if transport.needs_reserved_window() {
            VaWindow::reserve(cfg.va_window_bytes, cfg.mapper_entries)?
        } else {
            VaWindow::accounting(cfg.va_window_bytes, cfg.mapper_entries)
        };
        let mem = Arc::new(Memory::new(transport, window, ids));
        Ok(HexagonDevice {
            inner: Arc::new(Inner {
                arena: Mutex::new(WeightArena::new(cfg.weight_chunk_bytes as usize)),
                cfg,
                mem,
                pool: Arc::new(BufferPool::default()),
                stats: RoutingStats::default(),
                plans: Mutex::new(HashMap::new()),
            }),
        })
    }

    /// An emulated device with the default config.
    pub fn emulated() -> Result<Self> {
        Self::open(HexagonConfig::default())
    }

    /// The config the session was opened with.
    pub fn config(&self) -> &HexagonConfig {
        &self.inner.cfg
    }

    /// The transport's name (`emulated`, `fastrpc`).
    pub fn transport_name(&self) -> &'static str {
        self.inner.mem.transport.name()
    }

    /// One line describing the session.
    pub fn description(&self) -> String {
        self.inner.mem.transport.description()
    }

    /// Routing counters.
    pub fn stats(&self) -> &RoutingStats {
        &self.inner.stats
    }

    /// Memory counters (maps, unmaps, peak VA, bytes staged).
    pub fn memory_stats(&self) -> MemoryStats {
        self.inner.mem.stats()
    }

    /// DSP batches and ops submitted and bytes staged so far, as numbers (take two snapshots and
    /// [`DeviceCounters::since`] for one run).
    pub fn counters(&self) -> DeviceCounters {
        let m = self.inner.mem.stats();
        DeviceCounters {
            dsp_batches: self.inner.stats.batches(),
            dsp_ops: self.inner.stats.dsp_ops(),
            bytes_staged_in: m.staged_in,
            bytes_staged_out: m.staged_out,
        }
    }

    /// The routing decisions and memory counters as a printable table.
    pub fn routing_report(&self) -> RoutingReport {
        RoutingReport::new(
            format!("Hexagon routing report — {}", self.description()),
            &self.inner.stats,
            self.memory_stats(),
        )
    }

    /// Whether the NPU runs `op`, and on which unit; or why not. The one routing entry point.
    ///
    /// For a linear layer at load time (`rows == 0`) this includes whether its packed weights fit
    /// the NPU address window. Nothing is counted here; see [`Self::stats`].
    pub fn supports(&self, op: &OpDesc) -> Support {
        if self.inner.cfg.deny.contains(&op.kind()) {
            return Support::No(Reason::Denied);
        }
        let dt = op.dtype();
        if !matches!(dt, DType::F32 | DType::F16 | DType::BF16) {
            return Support::No(Reason::Dtype(format!(
                "{dt:?} activations (the kernels take f32 and f16; bf16 is converted)"
            )));
        }
        let too_big = |what: &str, v: usize| -> Option<Support> {
            (v == 0 || v > MAX_DIM).then(|| {
                Support::No(Reason::Shape(format!(
                    "{what} = {v} is outside 1..={MAX_DIM}"
                )))
            })
        };
        match op {
            OpDesc::Linear {
                weights,
                n,
                k,
                rows,
                ..
            } => {
                let tier = match weights {
                    WeightFormat::Dense(wdt) => {
                        if !matches!(wdt, DType::F32 | DType::F16 | DType::BF16) {
                            return Support::No(Reason::Dtype(format!(
                                "{wdt:?} weights (dense weights must be float)"
                            )));
                        }
                        Tier::Hmx
                    }
                    WeightFormat::Q4_0 => {
                        if k % 32 != 0 {
                            return Support::No(Reason::Alignment(format!(
                                "Q4_0 rows of {k} values are not whole 32-value blocks"
                            )));
                        }
                        Tier::Hvx
                    }
                    WeightFormat::OtherQuant(name) => {
                        return Support::No(Reason::Dtype(format!(
                            "{name} weights (the NPU kernels take Q4_0 and dense weights)"
                        )))
                    }
                };
                if let Some(s) = too_big("n", *n).or_else(|| too_big("k", *k)) {
                    return s;
                }
                if *rows == 0 {
                    let bytes = crate::layout::packed_len(weights, *n, *k);
                    let arena = self.inner.arena.lock().expect("arena lock");
                    if let Err(e) = arena.check(&self.inner.mem, bytes) {
                        return Support::No(Reason::from_error(&e).unwrap_or(Reason::VaBudget {
                            need: bytes as u64,
                            have: 0,
                        }));
                    }
                } else if let Some(s) = too_big("rows", *rows) {
                    return s;
                }
                Support::Yes(tier)
            }
            OpDesc::FlashAttn {
                q_len,
                kv_len,
                q_heads,
                kv_heads,
                head_dim,
                ..
            } => {
                if *head_dim == 0 || *head_dim > MAX_HEAD_DIM {
                    return Support::No(Reason::Shape(format!(
                        "head dim {head_dim} is outside 1..={MAX_HEAD_DIM}"
                    )));
                }
                if *kv_heads == 0 || q_heads % kv_heads != 0 {
                    return Support::No(Reason::Shape(format!(
                        "{q_heads} query heads are not a multiple of {kv_heads} key/value heads"
                    )));
                }
                too_big("q_len", *q_len)
                    .or_else(|| too_big("kv_len", *kv_len))
                    .unwrap_or(Support::Yes(Tier::Hvx))
            }
            OpDesc::RmsNorm { rows, hidden, .. } => too_big("rows", *rows)
                .or_else(|| too_big("hidden", *hidden))
                .unwrap_or(Support::Yes(Tier::Hvx)),
            OpDesc::Swiglu { elems, .. } => {
                if *elems == 0 || *elems > kernels_dsp::KDSP_MAX_ELEMS as usize {
                    return Support::No(Reason::Shape(format!("{elems} elements")));
                }
                Support::Yes(Tier::Hvx)
            }
            OpDesc::Block {
                heads,
                kv_heads,
                head_dim,
                widest,
            } => {
                if head_dim % 2 != 0 || *head_dim == 0 || *head_dim > MAX_HEAD_DIM {
                    return Support::No(Reason::Shape(format!(
                        "head dim {head_dim} (RoPE needs it even, FlashAttention at most \
                         {MAX_HEAD_DIM})"
                    )));
                }
                if *kv_heads == 0 || heads % kv_heads != 0 {
                    return Support::No(Reason::Shape(format!(
                        "{heads} query heads are not a multiple of {kv_heads} key/value heads"
                    )));
                }
                too_big("a dimension", *widest).unwrap_or(Support::Yes(Tier::Hmx))
            }
            OpDesc::Rope {
                rows,
                heads,
                head_dim,
                ..
            } => {
                if head_dim % 2 != 0 {
                    return Support::No(Reason::Shape(format!("odd head dim {head_dim}")));
                }
                too_big("rows", *rows)
                    .or_else(|| too_big("heads", *heads))
                    .or_else(|| too_big("head_dim", *head_dim))
                    .unwrap_or(Support::Yes(Tier::Hvx))
            }
        }
    }

    /// Run one call where [`Self::supports`] sends it, and count it with its wall time: on the
    /// NPU, `npu` gets a staging buffer of at least `staging_bytes` from the pool (the call's own
    /// until it returns: concurrent calls get different buffers); otherwise `cpu` runs. A full
    /// address window sends the call to the CPU (counted as `va_budget`); other errors are
    /// returned.
    pub(crate) fn dispatch<T>(
        &self,
        op: &OpDesc,
        staging_bytes: usize,
        npu: impl FnOnce(&DeviceBuffer) -> Result<T>,
        cpu: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        let start = std::time::Instant::now();
        let kind = op.kind();
        let (decision, out) = match self.supports(op) {
            Support::No(r) => (Decision::Cpu(r.key()), cpu()),
            Support::Yes(tier) => match self.take_buffer(staging_bytes) {
                Ok(buf) => (Decision::Npu(tier), npu(&buf)),
                Err(e) => match Reason::from_error(&e) {
                    Some(r) => (Decision::Cpu(r.key()), cpu()),
                    None => return Err(e),
                },
            },
        };
        let bytes = if matches!(decision, Decision::Npu(_)) {
            staging_bytes as u64
        } else {
            0
        };
        self.inner
            .stats
            .record_call(kind, decision, bytes, start.elapsed().as_nanos() as u64);
        out
    }

    /// Place packed weights of `bytes` (load time). Counted by the caller.
    pub(crate) fn alloc_weights(&self, bytes: usize) -> Result<WeightSlot> {
        self.inner
            .arena
            .lock()
            .expect("arena lock")
            .alloc(&self.inner.mem, bytes)
    }

    pub(crate) fn mem(&self) -> &Arc<Memory> {
        &self.inner.mem
    }

    /// A pooled shared buffer of at least `bytes`, the caller's until the guard drops.
    pub(crate) fn take_buffer(&self, bytes: usize) -> Result<PooledBuffer> {
        self.inner.pool.take(&self.inner.mem, bytes)
    }

    /// Idle buffers in the staging/activation pool.
    pub fn pooled_buffers(&self) -> usize {
        self.inner.pool.idle_count()
    }

    /// Map `count` pool buffers of `bytes` each ahead of time (at most the pool's idle limit),
    /// so that the first concurrent calls do not each pay a mapping (mapping and registering a
    /// buffer is a DSP round trip that queues behind work already submitted).
    pub fn prewarm_pool(&self, count: usize, bytes: usize) -> Result<()> {
        let held: Vec<PooledBuffer> = (0..count.min(crate::memory::MAX_IDLE_BUFFERS))
            .map(|_| self.take_buffer(bytes))
            .collect::<Result<_>>()?;
        drop(held);
        Ok(())
    }

    /// Map a shared buffer of at least `len` bytes into the NPU window and register it with the
    /// DSP. Fails with [`Error::VaBudget`] / [`Error::MapperEntries`] when the session is full.
    pub fn map_buffer(&self, len: usize) -> Result<DeviceBuffer> {
        self.inner.mem.map(len)
    }

    /// Queue a batch; returns at once. See [`Fence`].
    ///
    /// Before the batch can start, the byte ranges its ops read (sources) and write
    /// (destination) are leased on their buffers until it completes, whether or not the fence is
    /// waited for: meanwhile a conflicting host access through [`DeviceBuffer`]'s safe methods
    /// fails with [`Error::Busy`].
    pub fn submit(&self, batch: &Batch) -> Result<Fence> {
        let done = Completion::default();
        let touches = batch_touches(batch.ops(), |i| batch.label(i));
        self.inner.mem.leases.register(&touches, &done);
        match self.inner.mem.transport.submit(batch, &done) {
            Ok(fence) => {
                self.inner.stats.record_batch(batch.len());
                Ok(fence)
            }
            Err(e) => {
                // Nothing was queued: the DSP will never touch the batch's memory.
                done.set();
                Err(e)
            }
        }
    }

    /// Run a batch and fail with [`Error::Kernel`] naming the first op that did not succeed.
    pub fn execute(&self, batch: &Batch) -> Result<()> {
        let statuses = self.submit(batch)?.wait()?;
        check_statuses(batch, &statuses)
    }

    /// Validate one op on the DSP without running it.
    pub fn check(&self, op: &kdsp_op) -> Result<OpCheck> {
        self.inner.mem.transport.check(op)
    }

    /// Hold DSP work (submissions still return fences) until [`Self::resume_queue`].
    pub fn pause_queue(&self) {
        self.inner.mem.transport.pause();
    }

    /// Release held DSP work.
    pub fn resume_queue(&self) {
        self.inner.mem.transport.resume();
    }

    /// The largest number of rows `<= m` whose op (built by `make`) fits the DSP scratch arena,
    /// found with `kdsp_op_check` and remembered per shape. (The plan lock is not held during
    /// the checks, which are DSP round trips.)
    pub(crate) fn rows_per_op(
        &self,
        key: PlanKey,
        m: usize,
        make: impl Fn(usize) -> kdsp_op,
    ) -> Result<usize> {
        let known = *self
            .inner
            .plans
            .lock()
            .expect("plan lock")
            .entry(key)
            .or_default();
        if m <= known.max_ok {
            return Ok(m);
        }
        if known.min_fail.is_some_and(|f| f <= m) && known.max_ok > 0 {
            return Ok(known.max_ok);
        }
        let update = |ok: Option<usize>, fail: Option<usize>| {
            let mut plans = self.inner.plans.lock().expect("plan lock");
            let plan = plans.entry(key).or_default();
            if let Some(r) = ok {
                plan.max_ok = plan.max_ok.max(r);
            }
            if let Some(r) = fail {
                plan.min_fail = Some(plan.min_fail.map_or(r, |f| f.min(r)));
            }
        };
        let mut rows = m;
        loop {
            let c = self.check(&make(rows))?;
            if c.status == kernels_dsp::KDSP_STATUS_OK {
                update(Some(rows), None);
                return Ok(rows);
            }
            if c.status != kernels_dsp::KDSP_STATUS_OUT_OF_BUDGET || rows == 1 {
                return Err(Error::Kernel {
                    op: "plan",
                    index: 0,
                    status: KernelStatus(c.status),
                });
            }
            update(None, Some(rows));
            // Keep chunks whole tiles where possible.
            rows = if rows > 64 {
                (rows / 2).div_ceil(32) * 32
            } else {
                rows / 2
            };
        }
    }
}

/// Per-device totals, as numbers (e.g. for `generate --json`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceCounters {
    /// Batches submitted to the DSP (one round trip each).
    pub dsp_batches: u64,
    /// Ops in those batches.
    pub dsp_ops: u64,
    /// Bytes the host copied into shared buffers.
    pub bytes_staged_in: u64,
    /// Bytes the host copied out of shared buffers.
    pub bytes_staged_out: u64,
}

impl DeviceCounters {
    /// Bytes staged in both directions.
    pub fn bytes_staged(&self) -> u64 {
        self.bytes_staged_in + self.bytes_staged_out
    }

    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &DeviceCounters) -> DeviceCounters {
        DeviceCounters {
            dsp_batches: self.dsp_batches.saturating_sub(earlier.dsp_batches),
            dsp_ops: self.dsp_ops.saturating_sub(earlier.dsp_ops),
            bytes_staged_in: self.bytes_staged_in.saturating_sub(earlier.bytes_staged_in),
            bytes_staged_out: self
                .bytes_staged_out
                .saturating_sub(earlier.bytes_staged_out),
        }
    }
}

/// Turn per-op statuses into an error naming the first failing op.
pub(crate) fn check_statuses(batch: &Batch, statuses: &[u32]) -> Result<()> {
    if statuses.len() != batch.len() {
        return Err(Error::Transport(format!(
            "{} statuses for a batch of {} ops",
            statuses.len(),
            batch.len()
        )));
    }
    match statuses
        .iter()
        .position(|&s| s != kernels_dsp::KDSP_STATUS_OK)
    {
        None => Ok(()),
        Some(i) => Err(Error::Kernel {
            op: batch.label(i),
            index: i,
            status: KernelStatus(statuses[i]),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transports_from_their_command_line_names() {
        use TransportConfig as T;
        assert_eq!(T::from_names("emulated", "shim").unwrap(), T::Emulated);
        assert_eq!(
            T::from_names("fastrpc", "libcdsprpc.so").unwrap(),
            T::FastRpc {
                library: "libcdsprpc.so".into()
            }
        );
        match (T::from_names("fastrpc", "shim"), crate::shim_library_path()) {
            (Ok(T::FastRpc { library }), Some(p)) => assert_eq!(library, p),
            (Err(e), None) => assert!(e.to_string().contains("shim"), "{e}"),
            (r, p) => panic!("{r:?} with shim {p:?}"),
        }
        let e = T::from_names("usb", "shim").unwrap_err().to_string();
        assert!(e.contains("`usb`") && e.contains("transport"), "{e}");
    }

    #[test]
    fn config_errors_name_the_field() {
        let cases: Vec<(HexagonConfig, &str)> = vec![
            (
                HexagonConfig {
                    workers: 0,
                    ..Default::default()
                },
                "workers",
            ),
            (
                HexagonConfig {
                    va_window_bytes: 5 << 30,
                    ..Default::default()
                },
                "va_window_bytes",
            ),
            (
                HexagonConfig {
                    mapper_entries: 1,
                    ..Default::default()
                },
                "mapper_entries",
            ),
            (
                HexagonConfig {
                    scratch_bytes: 4096,
                    ..Default::default()
                },
                "scratch_bytes",
            ),
            (
                HexagonConfig {
                    weight_chunk_bytes: 1,
                    ..Default::default()
                },
                "weight_chunk_bytes",
            ),
        ];
        for (cfg, field) in cases {
            let e = HexagonDevice::open(cfg).unwrap_err().to_string();
            assert!(e.contains(&format!("`{field}`")), "{e}");
        }
        HexagonConfig::default().validate().unwrap();
    }
}
