//! The swap-optimized memory runtime: how a weight-owning module's tensors share the bounded
//! NPU address window when they do not all fit (paper §3.4).
//!
//! The runtime is mechanism only: it is given the op batches a forward would submit (weights
//! named by *virtual* buffer ids, activations by byte ranges of a buffer) and learns the graph
//! from them; it knows nothing of tokens or models. Three policies, one switch
//! ([`MemoryPolicy`], `HexagonConfig::memory_policy`):
//!
//! - **`naive`**: every weight gets its own mapping when a batch first uses it and keeps it
//!   (its range of the module's weight file mapped in place when the transport can);
//!   activations come from the device's generic buffer pool. A model larger than the window
//!   fails with the window's own error ([`crate::Error::VaBudget`] / `MapperEntries`).
//! - **`paging`**: the same on-demand mappings, with replacement: when the window or the mapper
//!   table is full, the least recently used weight mapping not needed by the batch being built
//!   is unmapped (after the batches reading it) and the mapping retried. No graph plan, no
//!   prefetch: every miss is a synchronous map + copy.
//! - **`somr`** (the default): [`graph`] capture, [`placement`] under the VA budget from a
//!   profile, [`packing`] (residents in consumption order inside a few large mappings: mapped in
//!   place from the weight file when the transport can, else copied; activations sharing
//!   offsets by live range), and double-buffered staging (`somr`): while
//!   the DSP runs one stage from a slot, the host fills the other slot for the next stage, and
//!   slots change hands only when the fence of the stage reading them has completed (the leases
//!   refuse any host write into a slot a batch in flight still reads).
//!
//! Counters ([`SwapStats`], reported by `HexagonDevice::counters` and the routing report): maps
//! and unmaps (the window's), bytes streamed into slots or on-demand mappings, synchronous stall
//! (time the DSP had nothing to run because the host was still preparing weights) and
//! overlapped staging time.

pub(crate) mod cost;
pub(crate) mod fit;
pub mod graph;
pub mod packing;
pub(crate) mod pager;
pub mod placement;
pub(crate) mod report;
pub(crate) mod somr;
pub(crate) mod stats;

use std::sync::{Arc, Mutex, MutexGuard};

pub use crate::kinds::{MemoryPolicy, SwapSnapshot};
pub use report::{MemoryPlan, PlanRow};
pub use stats::SwapStats;

use crate::device::HexagonDevice;
use crate::error::{Error, Result, TransportFault};
use crate::memory::{WeightBytes, WeightFileBuilder};
use crate::transport::{Batch, Completion};
use pager::Pager;
use somr::Somr;

/// Bit marking a virtual weight buffer id in op descriptors built before placement.
pub(crate) const VIRTUAL_WEIGHT: u32 = 1 << 30;

/// The buffer id standing for activations while a graph is captured.
pub(crate) const VIRTUAL_ACT: u32 = u32::MAX;

/// The virtual buffer id of weight `w`.
pub(crate) fn virtual_id(w: usize) -> u32 {
    VIRTUAL_WEIGHT | w as u32
}

/// The weight a virtual buffer id names.
pub(crate) fn weight_of(id: u32) -> Option<usize> {
    (id != VIRTUAL_ACT && id & VIRTUAL_WEIGHT != 0).then_some((id & !VIRTUAL_WEIGHT) as usize)
}

/// The weight an op reads, if any (its first virtual source).
pub(crate) fn op_weight(op: &kernels_dsp::kdsp_op) -> Option<usize> {
    let n = (op.n_src as usize).min(kernels_dsp::KDSP_MAX_SRC as usize);
    op.src[..n].iter().find_map(|t| weight_of(t.buffer_id))
}

/// A packed weight as the host holds it; the runtime decides where the DSP reads it from.
#[derive(Debug)]
pub(crate) struct HostWeight {
    /// Name for the plan printout (`block 3 gate/up`).
    pub(crate) name: String,
    /// The packed bytes (tiles): a read-only view of the module's weight file in shared memory,
    /// shared with whoever else reads them on the host (the CPU refresh path of `dllm-models`
    /// reads these same bytes; see [`crate::HexTransformer::packed_matrix`]) and, when resident,
    /// with the NPU (mapped in place, see [`crate::memory::WeightBytes`]).
    pub(crate) bytes: WeightBytes,
}

/// A module's packed weights while they are being written at load time, straight into the
/// shared weight file (no host heap copy in between).
pub(crate) struct HostWeights {
    file: WeightFileBuilder,
    names: Vec<String>,
}

impl HostWeights {
    /// Room for weights of `lens` bytes (an upper bound: room never written costs nothing).
    pub(crate) fn new(dev: &HexagonDevice, lens: impl IntoIterator<Item = usize>) -> Result<Self> {
        let page = dev.mem().window.page() as usize;
        let capacity = lens
            .into_iter()
            .map(|l| WeightFileBuilder::footprint(page, l))
            .sum();
        Ok(HostWeights {
            file: WeightFileBuilder::new(dev.mem(), capacity)?,
            names: Vec::new(),
        })
    }

    /// Add weight `name` of `len` bytes, written by `fill`; its index.
    pub(crate) fn push(
        &mut self,
        name: String,
        len: usize,
        fill: impl FnOnce(&mut [u8]) -> Result<()>,
    ) -> Result<usize> {
        let w = self.file.push(len, fill)?;
        self.names.push(name);
        Ok(w)
    }

    /// Seal the file: the weights, read-only from now on.
    pub(crate) fn seal(self, dev: &HexagonDevice) -> Vec<HostWeight> {
        self.names
            .into_iter()
            .zip(self.file.seal(dev.mem()))
            .map(|(name, bytes)| HostWeight { name, bytes })
            .collect()
    }
}

/// Where the DSP finds a weight for one batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Loc {
    pub(crate) buffer: u32,
    pub(crate) offset: usize,
}

/// Point every virtual weight operand of `batch` at its location.
pub(crate) fn relocate(batch: &mut Batch, locs: &[(usize, Loc)]) -> Result<()> {
    for op in batch.ops_mut() {
        let n = (op.n_src as usize).min(kernels_dsp::KDSP_MAX_SRC as usize);
        for t in op.src[..n].iter_mut() {
            if let Some(w) = weight_of(t.buffer_id) {
                let loc =
                    locs.iter()
                        .find(|(x, _)| *x == w)
                        .map(|(_, l)| *l)
                        .ok_or(Error::Transport(TransportFault::WeightNotPrepared {
                            weight: w,
                        }))?;
                t.buffer_id = loc.buffer;
                t.offset += loc.offset as u64;
            }
        }
    }
    Ok(())
}

/// The runtime's state for one weight-owning module.
pub(crate) enum Policy {
    Pager(Pager),
    Somr(Box<Somr>),
}

/// The memory runtime of one weight-owning module: its weights (the one copy, in the module's
/// shared weight file) and the policy's state. Forwards of the module are prepared one at a time ([`Runtime::lock`]).
pub(crate) struct Runtime {
    pub(crate) dev: HexagonDevice,
    pub(crate) policy: MemoryPolicy,
    pub(crate) weights: Vec<HostWeight>,
    state: Mutex<State>,
}

/// What the lock protects.
pub(crate) struct State {
    pub(crate) policy: Policy,
    /// The last batch this module submitted (to tell overlapped staging from DSP idle time).
    pub(crate) last: Option<Completion>,
    /// Forwards submitted.
    pub(crate) forwards: u64,
}

impl Runtime {
    pub(crate) fn new(dev: &HexagonDevice, weights: Vec<HostWeight>) -> Arc<Self> {
        let policy = dev.config().memory_policy;
        let p = match policy {
            MemoryPolicy::Naive => Policy::Pager(Pager::new(false)),
            MemoryPolicy::Paging => Policy::Pager(Pager::new(true)),
            MemoryPolicy::Somr => Policy::Somr(Box::default()),
        };
        Arc::new(Runtime {
            dev: dev.clone(),
            policy,
            weights,
            state: Mutex::new(State {
                policy: p,
                last: None,
                forwards: 0,
            }),
        })
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("runtime lock")
    }

    pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, State>> {
        self.state.try_lock().ok()
    }

    pub(crate) fn stats(&self) -> &SwapStats {
        self.dev.swap_stats()
    }

    /// The printable plan (`somr`, once made).
    pub(crate) fn plan(&self) -> Option<MemoryPlan> {
        match &self.lock().policy {
            Policy::Somr(s) => s.report(self),
            Policy::Pager(_) => None,
        }
    }

    /// Run `f`; when it fails for lack of window or mapper entries, give back what the policy
    /// can (evict weight mappings, demote residents) and try again while that freed something.
    pub(crate) fn reclaiming<T>(
        &self,
        st: &mut State,
        mut f: impl FnMut() -> Result<T>,
    ) -> Result<T> {
        loop {
            match f() {
                Err(e) if e.is_resource_exhausted() => {
                    let freed = match &mut st.policy {
                        Policy::Pager(p) => p.evict_all(self),
                        Policy::Somr(s) => s.demote(self),
                    };
                    if !freed {
                        return Err(e);
                    }
                }
                r => return r,
            }
        }
    }
}
