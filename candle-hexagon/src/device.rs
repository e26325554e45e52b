//! The device: a DSP session opened from a [`HexagonConfig`], owning the transport, the NPU
//! address window, the weight arena, the buffer pool (staging and activations) and the routing
//! counters.
//!
//! candle's `Device` enum is closed, so tensors stay `Device::Cpu` (on a phone the NPU shares that
//! memory); a [`HexagonDevice`] is a handle the weight-owning modules and custom ops carry.
//! Cloning it is cheap (an `Arc`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use candle_core::DType;
use kernels_dsp::kdsp_op;

pub use crate::config::{
    window_bytes_from_mib, HexagonConfig, TransportConfig, DEFAULT_FASTRPC_LIBRARY,
    DEFAULT_MAPPER_ENTRIES, DEFAULT_MEMORY_POLICY, DEFAULT_SCRATCH_BYTES, DEFAULT_STAGING_BYTES,
    DEFAULT_VA_WINDOW_BYTES, DEFAULT_VA_WINDOW_MIB, DEFAULT_WEIGHT_CHUNK_BYTES, DEFAULT_WORKERS,
    MAX_DIM, MAX_HEAD_DIM, MAX_VA_WINDOW_BYTES,
};
use crate::error::{Error, KernelStatus, Result, TransportFault};
use crate::kinds::SwapSnapshot;
use crate::memory::leases::batch_touches;
use crate::memory::{
    BufferPool, DeviceBuffer, Memory, MemoryStats, PooledBuffer, VaWindow, WeightArena, WeightSlot,
};
use crate::routing::{
    Decision, OpDesc, Reason, RoutingReport, RoutingStats, Support, Tier, WeightFormat,
};
use crate::runtime::report::MemoryPlan;
use crate::runtime::stats::SwapStats;
use crate::transport::emulated::EmulatedTransport;
use crate::transport::{Batch, Completion, Fence, OpCheck, Transport};

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
    swap: SwapStats,
    last_plan: Mutex<Option<MemoryPlan>>,
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

/// A dimension the kernels cannot take (`0`, or past [`MAX_DIM`]), as the reason.
fn too_big(what: &str, v: usize) -> Option<Support> {
    (v == 0 || v > MAX_DIM).then(|| {
        Support::No(Reason::Shape(format!(
            "{what} = {v} is outside 1..={MAX_DIM}"
        )))
    })
}

impl HexagonDevice {
    /// Open a session ([`Error::Unsupported`] on targets without memfd shared memory).
    pub fn open(cfg: HexagonConfig) -> Result<Self> {
        crate::memory::check_target("HexagonDevice::open")?;
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
                return Err(Error::config(
                    "transport",
                    crate::error::ConfigProblem::NoFastRpc,
                ))
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
                swap: SwapStats::default(),
                last_plan: Mutex::new(None),
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

    /// Swap counters of the memory runtime (bytes streamed, stall, overlap).
    pub fn swap_counters(&self) -> SwapSnapshot {
        self.inner.swap.snapshot()
    }

    pub(crate) fn swap_stats(&self) -> &SwapStats {
        &self.inner.swap
    }

    /// The memory plan a module on this device made last (policy `somr`): where its weights
    /// live, the stages of a forward and the expected stall. Per module: see
    /// `HexTransformer::memory_plan`.
    pub fn last_memory_plan(&self) -> Option<MemoryPlan> {
        self.inner.last_plan.lock().expect("plan lock").clone()
    }

    pub(crate) fn note_plan(&self, p: &MemoryPlan) {
        *self.inner.last_plan.lock().expect("plan lock") = Some(p.clone());
    }

    /// Memory counters (maps, unmaps, peak VA, bytes staged).
    pub fn memory_stats(&self) -> MemoryStats {
        self.inner.mem.stats()
    }

    /// DSP batches and ops submitted and bytes staged so far, as numbers (take two snapshots and
    /// [`DeviceCounters::since`] for one run).
    pub fn counters(&self) -> DeviceCounters {
        let m = self.inner.mem.stats();
        let s = self.inner.swap.snapshot();
        DeviceCounters {
            dsp_batches: self.inner.stats.batches(),
            dsp_ops: self.inner.stats.dsp_ops(),
            bytes_staged_in: m.staged_in,
            bytes_staged_out: m.staged_out,
            maps: m.va.maps,
            unmaps: m.va.unmaps,
            forwards: s.forwards,
            bytes_streamed: s.bytes_streamed,
            stall_ns: s.stall_ns,
            overlapped_ns: s.overlapped_ns,
            plans_built: s.plans,
            shape_plans_built: s.shape_plans,
            host_weight_bytes: m.host_weight_bytes,
            shared_weight_bytes: m.shared_weight_bytes,
            npu_weight_bytes: m.npu_weight_bytes,
        }
    }

    /// The routing decisions and memory counters as a printable table.
    pub fn routing_report(&self) -> RoutingReport {
        RoutingReport::new(
            format!("Hexagon routing report — {}", self.description()),
            &self.inner.stats,
            self.memory_stats(),
            (self.inner.cfg.memory_policy, self.swap_counters()),
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
        match op {
            OpDesc::Linear {
                weights,
                n,
                k,
                rows,
                ..
            } => self.supports_linear(weights, *n, *k, *rows),
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

    /// [`Self::supports`] for a linear layer: its weight format's unit and alignment, its shape,
    /// and at load time (`rows == 0`) whether its packed weights fit the NPU address window.
    fn supports_linear(&self, weights: &WeightFormat, n: usize, k: usize, rows: usize) -> Support {
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
                if !k.is_multiple_of(32) {
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
        if let Some(s) = too_big("n", n).or_else(|| too_big("k", k)) {
            return s;
        }
        if rows == 0 {
            let bytes = crate::layout::packed_len(weights, n, k);
            let arena = self.inner.arena.lock().expect("arena lock");
            if let Err(e) = arena.check(&self.inner.mem, bytes) {
                return Support::No(Reason::from_error(&e).unwrap_or(Reason::VaBudget {
                    need: bytes as u64,
                    have: 0,
                }));
            }
        } else if let Some(s) = too_big("rows", rows) {
            return s;
        }
        Support::Yes(tier)
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

    /// [`Self::take_buffer`], mapping exactly `bytes` (page-rounded) when `exact` and no idle
    /// buffer fits.
    pub(crate) fn take_buffer_exact(&self, bytes: usize, exact: bool) -> Result<PooledBuffer> {
        self.inner.pool.take_with(&self.inner.mem, bytes, exact)
    }

    /// Unmap the pool's idle buffers (a planner reclaiming their window space).
    pub(crate) fn release_idle_buffers(&self) {
        self.inner.pool.release_idle();
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
    /// Mappings made in the NPU window.
    pub maps: u64,
    /// Mappings removed from the NPU window.
    pub unmaps: u64,
    /// Forwards of weight-owning modules (the block module) under the memory runtime.
    pub forwards: u64,
    /// Weight bytes the memory runtime copied into staging slots or on-demand mappings.
    pub bytes_streamed: u64,
    /// Synchronous stall: time the DSP had nothing to run while weights were being staged.
    pub stall_ns: u64,
    /// Staging time hidden behind DSP work.
    pub overlapped_ns: u64,
    /// Placement plans the memory runtime built (`somr`: one per placement, a re-plan after the
    /// window filled up counts again; profiling forwards are not plans).
    pub plans_built: u64,
    /// Activation layouts the weight-owning modules built: one per shape bucket (rows rounded
    /// up to whole 32-row tiles) while it stays in a module's bounded cache.
    pub shape_plans_built: u64,
    /// Gauge (the value now, kept as is by [`Self::since`]): packed linear weight bytes held in
    /// host memory the NPU never maps (a host copy beside the NPU's: the transport cannot map
    /// ranges of shared memory, so resident weights are copied). 0 on the emulated DSP.
    pub host_weight_bytes: u64,
    /// Gauge: packed linear weight bytes held once, in shared memory the host reads in place and
    /// the NPU maps in place when they are resident.
    pub shared_weight_bytes: u64,
    /// Gauge: packed linear weight bytes the NPU side holds in mappings that are separate
    /// copies: resident weights copied into mappings of their own, the `naive` / `paging`
    /// policies' on-demand mappings, and the `somr` staging slots' capacity. Norm vectors and
    /// RoPE tables (one pinned copy) are not counted in any of the three.
    pub npu_weight_bytes: u64,
}

impl DeviceCounters {
    /// Bytes staged in both directions.
    pub fn bytes_staged(&self) -> u64 {
        self.bytes_staged_in + self.bytes_staged_out
    }

    /// [`Self::stall_ns`] in milliseconds.
    pub fn stall_ms(&self) -> f64 {
        self.stall_ns as f64 / 1e6
    }

    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &DeviceCounters) -> DeviceCounters {
        let d = |a: u64, b: u64| a.saturating_sub(b);
        DeviceCounters {
            dsp_batches: d(self.dsp_batches, earlier.dsp_batches),
            dsp_ops: d(self.dsp_ops, earlier.dsp_ops),
            bytes_staged_in: d(self.bytes_staged_in, earlier.bytes_staged_in),
            bytes_staged_out: d(self.bytes_staged_out, earlier.bytes_staged_out),
            maps: d(self.maps, earlier.maps),
            unmaps: d(self.unmaps, earlier.unmaps),
            forwards: d(self.forwards, earlier.forwards),
            bytes_streamed: d(self.bytes_streamed, earlier.bytes_streamed),
            stall_ns: d(self.stall_ns, earlier.stall_ns),
            overlapped_ns: d(self.overlapped_ns, earlier.overlapped_ns),
            plans_built: d(self.plans_built, earlier.plans_built),
            shape_plans_built: d(self.shape_plans_built, earlier.shape_plans_built),
            // Gauges: what is held now.
            host_weight_bytes: self.host_weight_bytes,
            shared_weight_bytes: self.shared_weight_bytes,
            npu_weight_bytes: self.npu_weight_bytes,
        }
    }
}

/// Turn per-op statuses into an error naming the first failing op.
pub(crate) fn check_statuses(batch: &Batch, statuses: &[u32]) -> Result<()> {
    if statuses.len() != batch.len() {
        return Err(Error::Transport(TransportFault::StatusCount {
            statuses: statuses.len(),
            ops: batch.len(),
        }));
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
