//! Step observers: progress bars, streaming output and visualisation hook into decoding here.

use std::ops::Range;

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
    /// Visible positions whose token a refresh changed in this step (staged stabilization).
    pub revised: &'a [usize],
    /// Canvas positions the forward of this step computed.
    pub window: Range<usize>,
    /// Positions still masked in the whole canvas.
    pub masked_left: usize,
    /// The mask id (to render the canvas).
    pub mask_id: u32,
}

/// Receives every step.
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
