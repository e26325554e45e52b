//! Write your own decoding policy: a window that always forwards the current block plus the next 8
//! positions (scored as drafts) against a dual cache, run on the embedded tiny model.
//! `cargo run --release -p dllm-decode --example custom_policy`

use dllm_decode::{DecodeParams, DecodeView, Decoder, Result, WindowPlan, WindowPolicy};
use dllm_models::{load, DiffusionLm, LoadOptions, ModelSource};

struct BlockPlusEight;

impl WindowPolicy for BlockPlusEight {
    fn plan(&mut self, v: &DecodeView<'_>) -> Result<WindowPlan> {
        let len = v.canvas.len();
        Ok(if v.step_in_block == 0 {
            WindowPlan {
                start: 0,
                end: len,
                fresh_cache: true,
                drafts: false,
            }
        } else {
            let end = (v.block.end + 8).min(len);
            WindowPlan {
                start: v.block.start,
                end,
                fresh_cache: false,
                drafts: true,
            }
        })
    }
    fn commit(&mut self, v: &DecodeView<'_>, plan: &WindowPlan) -> Option<(usize, usize)> {
        plan.fresh_cache.then_some((0, v.canvas.len()))
    }
}

fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../models/tiny-llada");
    let mut m = load(&ModelSource::parse(dir)?, &LoadOptions::default())?;
    let tok = m.tokenizer.clone().ok_or("the model has a tokenizer")?;
    let prompt = tok.encode_prompt("Ana has 41 coins. She finds 6 more. How many coins?", false)?;
    let params = DecodeParams::for_model(&m);
    let g =
        Decoder::new(params)
            .window_policy(BlockPlusEight)
            .run(&mut m.model, &prompt, &mut ())?;
    let stop = m.model.info().special.stop_ids();
    println!(
        "{} ({} forwards, {} drafts scored)",
        tok.decode(g.answer(&stop), true)?,
        g.forwards,
        g.draft_predictions
    );
    Ok(())
}
