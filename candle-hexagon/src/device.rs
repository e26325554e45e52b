//! The device: a DSP session opened from a [`HexagonConfig`], owning the transport, the NPU
//! address window, the weight arena, the staging buffer and the routing counters.
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
use crate::memory::{
    DeviceBuffer, Memory, MemoryStats, Staging, VaWindow, WeightArena, WeightSlot,
};
use crate::routing::{
    Decision, OpDesc, OpKind, Reason, RoutingReport, RoutingStats, Support, Tier, WeightFormat,
};
use crate::transport::emulated::EmulatedTransport;
use crate::transport::{Batch, Fence, OpCheck, Transport};

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
    staging: Mutex<Staging>,
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
                staging: Mutex::new(Staging::default()),
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
    /// NPU, `npu` gets the staging buffer (locked for the call, at least `staging_bytes` long);
    /// otherwise `cpu` runs. A full address window sends the call to the CPU (counted as
    /// `va_budget`); other errors are returned.
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
            Support::Yes(tier) => {
                let mut staging = self.inner.staging.lock().expect("staging lock");
                match staging.ensure(&self.inner.mem, staging_bytes) {
                    Ok(buf) => (Decision::Npu(tier), npu(buf)),
                    Err(e) => match Reason::from_error(&e) {
                        Some(r) => {
                            drop(staging);
                            (Decision::Cpu(r.key()), cpu())
                        }
                        None => return Err(e),
                    },
                }
            }
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

    /// Map a shared buffer of at least `len` bytes into the NPU window and register it with the
    /// DSP. Fails with [`Error::VaBudget`] / [`Error::MapperEntries`] when the session is full.
    pub fn map_buffer(&self, len: usize) -> Result<DeviceBuffer> {
        self.inner.mem.map(len)
    }

    /// Queue a batch; returns at once. See [`Fence`].
    pub fn submit(&self, batch: &Batch) -> Result<Fence> {
        let fence = self.inner.mem.transport.submit(batch)?;
        self.inner.stats.record_batch(batch.len());
        Ok(fence)
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
    /// found with `kdsp_op_check` and remembered per shape.
    pub(crate) fn rows_per_op(
        &self,
        key: PlanKey,
        m: usize,
        make: impl Fn(usize) -> kdsp_op,
    ) -> Result<usize> {
        let mut plans = self.inner.plans.lock().expect("plan lock");
        let plan = plans.entry(key).or_default();
        if m <= plan.max_ok {
            return Ok(m);
        }
        if plan.min_fail.is_some_and(|f| f <= m) && plan.max_ok > 0 {
            return Ok(plan.max_ok);
        }
        let mut rows = m;
        loop {
            let c = self.check(&make(rows))?;
            if c.status == kernels_dsp::KDSP_STATUS_OK {
                plan.max_ok = plan.max_ok.max(rows);
                return Ok(rows);
            }
            if c.status != kernels_dsp::KDSP_STATUS_OUT_OF_BUDGET || rows == 1 {
                return Err(Error::Kernel {
                    op: "plan",
                    index: 0,
                    status: KernelStatus(c.status),
                });
            }
            plan.min_fail = Some(plan.min_fail.map_or(rows, |f| f.min(rows)));
            // Keep chunks whole tiles where possible.
            rows = if rows > 64 {
                (rows / 2).div_ceil(32) * 32
            } else {
                rows / 2
            };
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
