//! Step observers: progress bars, streaming output and visualisation hook into decoding here.

use std::ops::Range;

use crate::states::TokenState;

/// Whether decoding should go on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    /// Keep decoding.
    Continue,
    /// Stop now; the generation returns what it has (remaining positions stay `[MASK]`).
    Stop,
}

/// What happened in one denoising step.
#[derive(Debug)]
pub struct StepEvent<'a> {
    /// Step index over the whole generation (0-based).
    pub step: usize,
    /// Current block (0-based); Dream's whole-canvas algorithm reports block 0.
    pub block: usize,
    /// Number of blocks.
    pub num_blocks: usize,
    /// Model forward calls so far.
    pub forwards: usize,
    /// The canvas after this step.
    pub canvas: &'a [u32],
    /// Prompt length (generated positions start here).
    pub prompt_len: usize,
    /// Positions unmasked in this step.
    pub unmasked: &'a [usize],
    /// The confidence each of `unmasked` was decided at (the same order).
    pub confidences: &'a [f64],
    /// Visible positions whose token the oracle instrument replaced in this step.
    pub revised: &'a [usize],
    /// Tentative positions verification sent back to the mask in this step (they are undecided
    /// again: `canvas` holds the mask there).
    pub remasked: &'a [usize],
    /// The tentative positions this step's forward verified, with the probability its shadow row
    /// gave the token the position then held.
    pub verified: &'a [(usize, f64)],
    /// Canvas positions the forward of this step computed.
    pub window: Range<usize>,
    /// Positions still masked in the whole canvas.
    pub masked_left: usize,
    /// The mask id (to render the canvas).
    pub mask_id: u32,
    /// The state of every canvas position after this step (`canvas.len()` entries): the prompt and
    /// final tokens are Stable, decided but still revisable tokens (staged stabilization) Visible,
    /// undecided positions Invisible.
    pub states: &'a [TokenState],
    /// How many generated positions, from the first, are final: `canvas[prompt_len..prompt_len +
    /// final_len]` is Stable and never changes again, so its text can be shown as final. (When the
    /// generation returns, everything it produced is final, Visible tokens included.)
    pub final_len: usize,
    /// What this step's forward predicted for the positions it left undecided (the current block's
    /// candidates that were not chosen, and drafts beyond the block), as `(position, token)`:
    /// tentative tokens, neither context nor final.
    pub tentative: &'a [(usize, u32)],
    /// The canvas position whose guess this step's forward showed
    /// ([`crate::MbsdParams::show_guess`]), and whether its shadow confirmed it: the forward saw
    /// that position's guessed token, not the mask.
    pub guess: Option<(usize, bool)>,
}

/// The length of the final prefix of the generated positions: the Stable positions from
/// `prompt_len` on, up to the first that is not ([`StepEvent::final_len`]).
pub fn final_prefix(states: &[TokenState], prompt_len: usize) -> usize {
    states
        .get(prompt_len..)
        .unwrap_or(&[])
        .iter()
        .take_while(|&&s| s == TokenState::Stable)
        .count()
}

/// Receives every step. `()` observes nothing; a closure `FnMut(&StepEvent<'_>) -> Control` is an
/// observer (write its argument's type: Rust does not infer it for a `&mut dyn StepObserver`).
///
/// ```
/// use dllm_decode::prelude::*;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../models/tiny-llada");
/// let mut loaded = load(&ModelSource::parse(dir)?, &LoadOptions::default())?;
/// let params = loaded.decode_params(); // 3 blocks of 8
/// let tok = loaded.tokenizer.as_ref().ok_or("no tokenizer.json")?;
/// let prompt = tok.encode_prompt("Tom has 23 apples. He buys 5 more. How many apples does Tom have now?", false)?;
/// // Stream: print what each step decided, and stop after the first block.
/// let mut first_block = |e: &StepEvent<'_>| {
///     for &p in e.unmasked {
///         print!("[{}]={} ", p, e.canvas[p]);
///     }
///     if e.block == 0 && e.masked_left == 16 { Control::Stop } else { Control::Continue }
/// };
/// let g = generate(&mut loaded.model, &prompt, &params, &mut first_block)?;
/// assert_eq!(g.stop, StopReason::Observer);
/// assert_eq!(g.generated().iter().filter(|&&t| t == 5).count(), 16); // two blocks left masked
/// # Ok(())
/// # }
/// ```
pub trait StepObserver {
    /// Called after each denoising step.
    fn on_step(&mut self, event: &StepEvent<'_>) -> Control;
}

/// Observes nothing.
impl StepObserver for () {
    fn on_step(&mut self, _: &StepEvent<'_>) -> Control {
        Control::Continue
    }
}

impl<F: FnMut(&StepEvent<'_>) -> Control> StepObserver for F {
    fn on_step(&mut self, event: &StepEvent<'_>) -> Control {
        self(event)
    }
}
