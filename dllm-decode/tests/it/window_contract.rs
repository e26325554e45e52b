//! The window contract a custom policy is held to: a window must hold at least one undecided
//! position of the current block (else the loop would make no progress: an error naming the
//! policy); undecided positions it leaves out wait for a later forward, and the generation still
//! decides every position.

use candle_core::{DType, Device};
use dllm_decode::{
    Decide, DecodeParams, DecodeView, Decoder, Result, Strategy, WindowPlan, WindowPolicy,
};
use dllm_models::synthetic::{random_weights, tiny_llada};
use dllm_models::weights::HfWeights;
use dllm_models::{DiffusionTransformer, OpMode};

fn model() -> DiffusionTransformer {
    let cfg = tiny_llada();
    let w = random_weights(&cfg, 3).unwrap();
    let src = HfWeights::from_tensors(w, cfg.arch, DType::F32, &Device::Cpu);
    DiffusionTransformer::new(cfg, &src, OpMode::Fused).unwrap()
}

const PROMPT: &[u32] = &[2, 40, 41, 42, 43, 4];

fn params() -> DecodeParams {
    DecodeParams {
        gen_length: 16,
        block_length: 8,
        steps: 16,
        decide: Decide::Threshold(0.9),
        strategy: Strategy::DualCache,
        early_stop: false,
        ..Default::default()
    }
}

/// A dual cache whose block windows hold only the block's first `keep` undecided positions
/// (`None`: a window entirely past the block, which holds none).
struct Partial {
    keep: Option<usize>,
    windows: Vec<(usize, usize)>,
}

impl WindowPolicy for Partial {
    fn plan(&mut self, v: &DecodeView<'_>) -> Result<WindowPlan> {
        let len = v.canvas.len();
        let plan = if v.cache_len == 0 || v.step_in_block == 0 {
            WindowPlan {
                start: 0,
                end: len,
                fresh_cache: true,
                drafts: false,
            }
        } else {
            let masked: Vec<usize> = v.block.clone().filter(|&p| v.is_masked(p)).collect();
            let (start, end) = match self.keep {
                Some(k) => (v.block.start, masked[k.min(masked.len()) - 1] + 1),
                None => (v.block.end, (v.block.end + 1).min(len)),
            };
            WindowPlan {
                start,
                end,
                fresh_cache: false,
                drafts: false,
            }
        };
        self.windows.push((plan.start, plan.end));
        Ok(plan)
    }
    fn commit(&mut self, v: &DecodeView<'_>, plan: &WindowPlan) -> Option<(usize, usize)> {
        plan.fresh_cache.then_some((0, v.canvas.len()))
    }
    fn name(&self) -> &str {
        "partial"
    }
}

#[test]
fn a_window_may_leave_undecided_positions_for_later_but_must_hold_one() {
    // Windows holding one undecided position: every position is still decided, one or more per
    // forward, and no window after a block's first forward covers the whole block.
    let mut policy = Partial {
        keep: Some(1),
        windows: Vec::new(),
    };
    let mut m = model();
    let g = Decoder::new(params())
        .window_policy(&mut policy)
        .run(&mut m, PROMPT, &mut ())
        .unwrap();
    let plen = PROMPT.len();
    assert!(g.canvas[plen..].iter().all(|&t| t != m_mask()), "{g:?}");
    let partial = policy
        .windows
        .iter()
        .filter(|&&(s, e)| s >= plen && e - s < 8)
        .count();
    assert!(partial > 0, "{:?}", policy.windows);

    // A window past the block holds none of its undecided positions: an error naming the policy.
    let mut none = Partial {
        keep: None,
        windows: Vec::new(),
    };
    let e = Decoder::new(params())
        .window_policy(&mut none)
        .run(&mut model(), PROMPT, &mut ())
        .unwrap_err()
        .to_string();
    assert!(e.contains("partial") && e.contains("holds none"), "{e}");
}

fn m_mask() -> u32 {
    tiny_llada().special.mask
}
