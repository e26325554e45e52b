//! The result of a generation.

/// Why decoding ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// Every position was decoded.
    Completed,
    /// A completed block ended in EOS/EoT; the positions after it were filled with EOS.
    EndOfSequence,
    /// The step observer asked to stop; undecoded positions are still `[MASK]`.
    Observer,
}

/// A finished (or stopped) generation.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    /// The whole canvas: prompt then `gen_length` positions.
    pub canvas: Vec<u32>,
    /// Prompt length.
    pub prompt_len: usize,
    /// Model forward calls (a classifier-free-guidance pair counts as one batched call).
    pub forwards: usize,
    /// Denoising steps run.
    pub steps: usize,
    /// Positions unmasked by the decoder (excludes EOS filled in after an early stop).
    pub tokens_decoded: usize,
    /// Why decoding ended.
    pub stop: StopReason,
}

impl Generation {
    /// An empty generation for a prompt of `prompt_len` tokens (the canvas is filled in at the end).
    pub(crate) fn start(prompt_len: usize) -> Self {
        Self {
            canvas: Vec::new(),
            prompt_len,
            forwards: 0,
            steps: 0,
            tokens_decoded: 0,
            stop: StopReason::Completed,
        }
    }

    /// The generated positions, as produced (EOS included).
    pub fn generated(&self) -> &[u32] {
        &self.canvas[self.prompt_len..]
    }

    /// The generated ids up to (excluding) the first of `stop_ids`.
    pub fn answer(&self, stop_ids: &[u32]) -> &[u32] {
        let g = self.generated();
        let end = g
            .iter()
            .position(|t| stop_ids.contains(t))
            .unwrap_or(g.len());
        &g[..end]
    }

    /// Decoded tokens per forward call.
    pub fn tokens_per_forward(&self) -> f64 {
        if self.forwards == 0 {
            0.0
        } else {
            self.tokens_decoded as f64 / self.forwards as f64
        }
    }
}
