//! The roles of block-wise decoding, as traits a user can implement: the **window policy** (which
//! positions a forward computes and which of its K/V enter the cache) and the **selector** (which
//! masked positions of the current block a step unmasks, and which drafts a block accepts when it
//! becomes current). The block algorithm (a [`crate::Generation`]) owns the canvas, the blocks and
//! the bookkeeping, and asks for forwards; the roles only decide.
//!
//! Plans are small `Copy` structs ([`WindowPlan`]); the loop validates every plan (a window must
//! cover the current block's masked positions and start inside the cache) and reports a bad one as
//! an error naming the policy.
//!
//! Each trait's docs hold an example that runs: a window policy on [`WindowPolicy`], a selector
//! on [`Selector`].

use std::ops::Range;

use dllm_models::ModelInfo;

use crate::error::Result;
use crate::states::Thresholds;

/// What a role sees of the decoding state.
#[derive(Debug, Clone, Copy)]
pub struct DecodeView<'a> {
    /// Decided tokens; undecided positions hold the mask id.
    pub canvas: &'a [u32],
    /// The mask id.
    pub mask: u32,
    /// Prompt length (generated positions start here).
    pub prompt_len: usize,
    /// The current block.
    pub block: &'a Range<usize>,
    /// Index of the current block.
    pub block_index: usize,
    /// Number of blocks.
    pub num_blocks: usize,
    /// Forwards already run in the current block.
    pub step_in_block: usize,
    /// Positions `[0, cache_len)` with cached K/V.
    pub cache_len: usize,
    /// Decided positions whose cached K/V were computed from another input (the mask, or a token
    /// since revised) and that a window should recompute, ascending.
    pub stale: &'a [usize],
    /// Rows the forward will carry besides the window for verification (the shadow rows of the
    /// tentative tokens still waiting for their first look, see `crate::Verify`): a policy that
    /// prices its window (bucket fit, lookahead) leaves room for them first.
    pub verify_rows: usize,
    /// Rows of the shown guess's shadow, when the window shows one at the frontier
    /// ([`crate::MbsdParams::show_guess`]; two with shifted logits). A policy may make room for
    /// them by leaving decided positions out of its window, never by cutting undecided ones.
    pub guess_rows: usize,
    /// The model.
    pub info: &'a ModelInfo,
}

impl DecodeView<'_> {
    /// Whether position `p` is undecided.
    pub fn is_masked(&self, p: usize) -> bool {
        self.canvas[p] == self.mask
    }

    /// Undecided positions of the current block.
    pub fn masked_in_block(&self) -> usize {
        self.block.clone().filter(|&p| self.is_masked(p)).count()
    }

    /// The first undecided position before the current block's end (the commit frontier), or the
    /// block's end. (A position of an earlier block is undecided only when verification sent it
    /// back to the mask.)
    pub fn frontier(&self) -> usize {
        (self.prompt_len..self.block.end)
            .find(|&p| self.is_masked(p))
            .unwrap_or(self.block.end)
    }
}

/// The forward of one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowPlan {
    /// First canvas position forwarded.
    pub start: usize,
    /// One past the last.
    pub end: usize,
    /// Empty the KV cache first (the forward then starts from nothing; `start` must be 0).
    pub fresh_cache: bool,
    /// Also request logits for undecided positions of the window beyond the current block: their
    /// predictions become drafts.
    pub drafts: bool,
}

/// Which positions a forward computes, and which of its K/V the cache keeps.
///
/// ```
/// use dllm_decode::roles::{DecodeView, WindowPlan, WindowPolicy};
///
/// /// Forward the current block plus the next 8 positions (as drafts) against a dual cache.
/// struct BlockPlusEight;
///
/// impl WindowPolicy for BlockPlusEight {
///     fn plan(&mut self, v: &DecodeView<'_>) -> dllm_decode::Result<WindowPlan> {
///         if v.step_in_block == 0 {
///             // A full forward that rebuilds the cache, as Fast-dLLM's dual cache does.
///             return Ok(WindowPlan { start: 0, end: v.canvas.len(), fresh_cache: true, drafts: false });
///         }
///         let end = (v.block.end + 8).min(v.canvas.len());
///         Ok(WindowPlan { start: v.block.start, end, fresh_cache: false, drafts: true })
///     }
///     fn commit(&mut self, v: &DecodeView<'_>, plan: &WindowPlan) -> Option<(usize, usize)> {
///         plan.fresh_cache.then_some((0, v.canvas.len()))
///     }
///     fn name(&self) -> &str {
///         "block+8"
///     }
/// }
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use candle_core::{DType, Device};
/// use dllm_decode::{Decide, DecodeParams, Decoder, Strategy};
/// use dllm_models::{synthetic, weights::HfWeights, DiffusionTransformer, OpMode};
///
/// let cfg = synthetic::tiny_llada(); // a random 2-layer LLaDA, for the example
/// let w = HfWeights::from_tensors(synthetic::random_weights(&cfg, 0)?, cfg.arch, DType::F32, &Device::Cpu);
/// let mut model = DiffusionTransformer::new(cfg, &w, OpMode::Fused)?;
/// let params = DecodeParams {
///     gen_length: 16, block_length: 8, steps: 16, decide: Decide::Threshold(0.9),
///     strategy: Strategy::DualCache, ..Default::default()
/// };
/// let g = Decoder::new(params).window_policy(BlockPlusEight).run(&mut model, &[2, 10, 11, 4], &mut ())?;
/// assert_eq!(g.generated().len(), 16);
/// assert!(g.draft_predictions > 0); // the 8 positions after the first block were scored as drafts
/// # Ok(())
/// # }
/// ```
pub trait WindowPolicy {
    /// The next forward. It must hold at least one undecided position of the current block;
    /// undecided positions it leaves out wait for a later forward.
    fn plan(&mut self, view: &DecodeView<'_>) -> Result<WindowPlan>;

    /// After the forward of `plan` (`view` shows the canvas the forward saw): the range
    /// `[a, b)` of the window to commit into the KV cache, if any.
    fn commit(&mut self, view: &DecodeView<'_>, plan: &WindowPlan) -> Option<(usize, usize)>;

    /// Confident drafts (confidence at least this) are shown to later forwards as context instead
    /// of the mask (they are still not decided). `None`: drafts stay masked.
    fn draft_context(&self) -> Option<f64> {
        None
    }

    /// A short name for errors and reports.
    fn name(&self) -> &str {
        "custom"
    }
}

/// A borrowed policy is a policy: the caller keeps it and can read what it recorded after the run.
impl<P: WindowPolicy + ?Sized> WindowPolicy for &mut P {
    fn plan(&mut self, view: &DecodeView<'_>) -> Result<WindowPlan> {
        (**self).plan(view)
    }
    fn commit(&mut self, view: &DecodeView<'_>, plan: &WindowPlan) -> Option<(usize, usize)> {
        (**self).commit(view, plan)
    }
    fn draft_context(&self) -> Option<f64> {
        (**self).draft_context()
    }
    fn name(&self) -> &str {
        (**self).name()
    }
}

/// Which undecided positions of the current block a step decides: `select` gets the step's
/// candidates as `(position, confidence)` (the current block's undecided canvas positions in
/// ascending order, confidence per [`crate::Remasking`]) and returns the positions to decide now,
/// each one of the candidates (anything else is an error naming the selector). A step may decide
/// nothing, but a block that makes no progress past its step budget is an error too.
///
/// ```
/// use dllm_decode::prelude::*;
///
/// /// Decide the two most confident positions per step.
/// struct TopTwo;
///
/// impl Selector for TopTwo {
///     fn select(&mut self, candidates: &[(usize, f64)], _step_in_block: usize) -> Vec<usize> {
///         let mut c = candidates.to_vec();
///         c.sort_by(|a, b| b.1.total_cmp(&a.1));
///         c.iter().take(2).map(|&(position, _)| position).collect()
///     }
/// }
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../models/tiny-llada");
/// let mut loaded = load(&ModelSource::parse(dir)?, &LoadOptions::default())?;
/// let params = loaded.decode_params(); // 24 positions in blocks of 8
/// let tok = loaded.tokenizer.as_ref().ok_or("no tokenizer.json")?;
/// let prompt = tok.encode_prompt("Tom has 23 apples. He buys 5 more. How many apples does Tom have now?", false)?;
/// let g = Decoder::new(params).selector(TopTwo).run(&mut loaded.model, &prompt, &mut ())?;
/// assert_eq!(g.steps, 12); // two positions a step
/// let stop = loaded.model.info().special.stop_ids();
/// assert_eq!(tok.decode(g.answer(&stop), true)?, "23 + 5 = 28. Answer: 28");
/// # Ok(())
/// # }
/// ```
pub trait Selector {
    /// A block becomes current with `masked` undecided positions.
    fn begin_block(&mut self, masked: usize) {
        let _ = masked;
    }

    /// Step `step_in_block` of the block: choose among `(position, confidence)` candidates.
    fn select(&mut self, candidates: &[(usize, f64)], step_in_block: usize) -> Vec<usize>;

    /// This step showed a guess at `pos` and its shadow confirmed it (`None`: no guess, or a
    /// rejected one; see `MbsdParams::show_guess`): the step's other rows saw it as the token it
    /// becomes, so it is decided context for them. Called before [`Selector::select`]; default:
    /// ignored.
    fn guess_confirmed(&mut self, pos: Option<usize>) {
        let _ = pos;
    }

    /// The block that just became current has drafts `(position, confidence)` from earlier
    /// forwards: those that meet the commit criterion now are accepted without a forward.
    /// Default: none (drafts are re-decided by the block's own forwards).
    fn accept_drafts(&mut self, drafts: &[(usize, f64)]) -> Vec<usize> {
        let _ = drafts;
        Vec::new()
    }

    /// Staged stabilization: decisions start Visible (context, revisable) and become Stable at these
    /// thresholds (see [`crate::states`]). `None` (the default): every decision is final at once.
    fn thresholds(&self) -> Option<Thresholds> {
        None
    }
}
