//! The handle of a submitted block-level forward: the fences of its batches (one per block) and
//! the activation buffer the result will be read from.

use std::time::Instant;

use candle_core::{DType, Device, Tensor};

use crate::device::{check_statuses, HexagonDevice};
use crate::error::{Error, Result};
use crate::memory::PooledBuffer;
use crate::ops::typed;
use crate::routing::{Decision, OpKind, Tier};
use crate::runtime::somr::{prefetch, Prefetch};
use crate::runtime::Runtime;
use crate::transport::{Batch, Fence};

/// What a forward returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForwardOutput {
    /// The program's output (the whole tail ran on the NPU).
    Complete,
    /// The input of tail node `.0`, a matmul whose weights stay on the CPU: the caller runs
    /// the rest of the tail.
    BeforeTailNode(usize),
}

/// A forward in flight. Dropping it without [`Self::wait`] is safe: the batches still run and
/// keep their leases until they complete; the result is discarded.
pub struct ForwardHandle {
    dev: HexagonDevice,
    /// One per stage (DSP batch), with the block it belongs to.
    fences: Vec<(Fence, Batch, usize)>,
    blocks: usize,
    act: PooledBuffer,
    out_off: usize,
    dims: (usize, usize, usize),
    output: ForwardOutput,
    tier: Tier,
    staged_in: usize,
    started: Instant,
    prefetch: Option<(std::sync::Arc<Runtime>, Prefetch)>,
}

impl std::fmt::Debug for ForwardHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForwardHandle")
            .field("batches", &self.fences.len())
            .field("done", &self.is_done())
            .field("dims", &self.dims)
            .field("output", &self.output)
            .finish()
    }
}

impl ForwardHandle {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        dev: HexagonDevice,
        fences: Vec<(Fence, Batch, usize)>,
        blocks: usize,
        act: PooledBuffer,
        out_off: usize,
        dims: (usize, usize, usize),
        output: ForwardOutput,
        tier: Tier,
        staged_in: usize,
        started: Instant,
        prefetch: Option<(std::sync::Arc<Runtime>, Prefetch)>,
    ) -> Self {
        ForwardHandle {
            dev,
            fences,
            blocks,
            act,
            out_off,
            dims,
            output,
            tier,
            staged_in,
            started,
            prefetch,
        }
    }

    /// True once every block's batch has finished.
    pub fn is_done(&self) -> bool {
        self.fences.iter().all(|(f, ..)| f.is_signaled())
    }

    /// Batches this forward submitted: one per block, more when the memory runtime cuts blocks
    /// into stages around streamed weights.
    pub fn batches(&self) -> usize {
        self.fences.len()
    }

    /// What [`Self::wait`] returns.
    pub fn output(&self) -> ForwardOutput {
        self.output
    }

    /// Wait for every layer and return the `(batch, rows, width)` f32 result (the program's
    /// output, or the input of the tail node it was cut before: see [`Self::output`]). A failed op is [`Error::InBlock`] naming the block, the op
    /// and the kernel status; the K/V rows the window wrote after the cache are then garbage
    /// (do not make them cached rows).
    pub fn wait(self) -> Result<Tensor> {
        let blocks = self.blocks;
        let mut first_err = None;
        // While the last stages run, the memory runtime stages the next forward's first
        // streamed weights into the slot the earlier stages have released.
        let mut prefetch = self.prefetch;
        for (k, (fence, batch, li)) in self.fences.into_iter().enumerate() {
            if let Some((rt, p)) = prefetch.take_if(|(_, p)| p.after == k) {
                prefetch_or_note(&rt, p, &mut first_err);
            }
            let r = fence.wait().and_then(|st| check_statuses(&batch, &st));
            if let (Err(e), None) = (r, &first_err) {
                first_err = Some(Error::InBlock {
                    block: li,
                    source: Box::new(e),
                });
            }
        }
        if let Some((rt, p)) = prefetch {
            prefetch_or_note(&rt, p, &mut first_err);
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        let (b, r, w) = self.dims;
        let n = b * r * w;
        let mut v = vec![0f32; n];
        if n > 0 {
            self.act.with_host_view(self.out_off, n * 4, |bytes| {
                typed::<f32>(bytes).map(|s| v.copy_from_slice(s))
            })??;
        }
        self.dev.mem().count_staged(0, n * 4);
        let ns = self.started.elapsed().as_nanos() as u64;
        let stats = self.dev.stats();
        for li in 0..blocks {
            // Wall time from submission to the result, spread over the blocks; the host bytes
            // go to the block that staged them.
            let bytes = match (li == 0, li + 1 == blocks) {
                (true, true) => self.staged_in + n * 4,
                (true, false) => self.staged_in,
                (false, true) => n * 4,
                (false, false) => 0,
            };
            stats.record_call(
                OpKind::Block,
                Decision::Npu(self.tier),
                bytes as u64,
                ns / blocks as u64,
            );
        }
        Ok(Tensor::from_vec(v, (b, r, w), &Device::Cpu)?.to_dtype(DType::F32)?)
    }
}

/// A failed prefetch is an error of the forward only when nothing failed before it.
fn prefetch_or_note(rt: &Runtime, p: Prefetch, first_err: &mut Option<Error>) {
    if let Err(e) = prefetch(rt, p) {
        first_err.get_or_insert(e);
    }
}
