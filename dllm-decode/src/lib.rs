#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

mod blocks;
pub mod confidence;
mod decide;
mod dream;
mod error;
pub mod generation;
mod joint;
pub mod latency;
pub mod observer;
pub mod params;
pub mod rng;
pub mod roles;
pub mod select;
pub mod states;
mod strategy;
pub mod stream;
mod verify;
pub mod window;

use std::sync::Arc;

use dllm_models::{Arch, DiffusionLm, LoadedModel, ModelInfo, TextTokenizer};

/// The model crate, whose types (`DiffusionLm`, `LoadedModel`, `DecodeDefaults`) appear in this
/// crate's signatures.
pub use dllm_models;
/// candle, as the model crate uses it (its `Tensor`, `Device`, `DType`).
pub use dllm_models::candle_core;
/// candle-nn, as the model crate uses it (the `VarBuilder` of `llada::Model::new(&cfg, vb)`).
pub use dllm_models::candle_nn;
/// What a generation asks of a model for one step, and the model's answer (the model crate's
/// types: a model answers asks without knowing any decoder).
pub use dllm_models::{Answer, Ask};
pub use error::{DecodeError, Result};
pub use generation::{ForwardTrace, Generation, Outcome, StopReason};
pub use latency::{LatencyPoint, LatencyTable};
pub use observer::{final_prefix, Control, StepEvent, StepObserver};
pub use params::{
    Decide, DecodeParams, DreamAlg, DreamParams, Joint, JointRule, MbsdParams, NearWait, Remasking,
    Requested, Staged, Strategy, Verify,
};
pub use roles::{DecodeView, Selector, WindowPlan, WindowPolicy};
pub use stream::FinalTextStream;

/// Check the prompt against the model and build `prompt ++ [MASK] * gen_length`.
pub fn prepare_canvas(info: &ModelInfo, prompt: &[u32], p: &DecodeParams) -> Result<Vec<u32>> {
    let mask = info.special.mask;
    if let Some(i) = prompt.iter().position(|&t| t == mask) {
        return Err(DecodeError::InvalidPrompt(format!(
            "position {i} holds the mask token id {mask}"
        )));
    }
    if let Some((i, &t)) = prompt
        .iter()
        .enumerate()
        .find(|(_, &t)| t as usize >= info.vocab_size)
    {
        return Err(DecodeError::InvalidPrompt(format!(
            "token id {t} at position {i} is outside the vocabulary ({} ids)",
            info.vocab_size
        )));
    }
    let total = prompt.len().saturating_add(p.gen_length);
    if total > info.max_seq_len {
        return Err(DecodeError::param(
            "gen_length",
            format!(
                "prompt ({}) + gen_length ({}) = {total} exceeds the model's maximum sequence length {}",
                prompt.len(),
                p.gen_length,
                info.max_seq_len
            ),
        ));
    }
    let mut canvas = prompt.to_vec();
    canvas.resize(total, mask);
    Ok(canvas)
}

/// Generate `p.gen_length` tokens after `prompt` with the built-in roles of `p.strategy`.
///
/// Weights are shared and the KV cache is per sequence: `new_sequence()` gives another sequence
/// over the same weights (no copy), and two sequences decode on two threads at once:
///
/// ```
/// use dllm_decode::prelude::*;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../models/tiny-llada");
/// let loaded = load(&ModelSource::parse(dir)?, &LoadOptions::default())?;
/// let params = loaded.decode_params();
/// let tok = loaded.tokenizer.as_ref().ok_or("no tokenizer.json")?;
/// let (mut a, mut b) = (loaded.model.new_sequence()?, loaded.model.new_sequence()?);
/// let (ta, tb) = std::thread::scope(|s| {
///     let ta = s.spawn(|| generate_text(&mut a, tok, "Tom has 23 apples. He buys 5 more. How many apples does Tom have now?", false, &params));
///     let tb = s.spawn(|| generate_text(&mut b, tok, "Mia has 33 eggs. She buys 3 more. How many eggs does Mia have now?", false, &params));
///     (ta.join().unwrap(), tb.join().unwrap())
/// });
/// assert_eq!((ta?.as_str(), tb?.as_str()), ("23 + 5 = 28. Answer: 28", "33 + 3 = 36. Answer: 36"));
/// # Ok(())
/// # }
/// ```
pub fn generate(
    model: &mut dyn DiffusionLm,
    prompt: &[u32],
    p: &DecodeParams,
    observer: &mut dyn StepObserver,
) -> Result<Outcome> {
    Decoder::new(*p).run(model, prompt, observer)
}

/// Decode a text prompt with any model and a tokenizer: encode it (as written, or in the model's
/// chat template with `chat`), generate with `params`, and return the text up to the first
/// EOS/EoT (the model's, or the tokenizer's end-of-turn token). For a [`LoadedModel`] the same is
/// `loaded.generate_text(prompt, chat, &params)` ([`LoadedModelExt`]).
///
/// ```
/// use dllm_decode::prelude::*;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../models/tiny-llada");
/// let mut loaded = load(&ModelSource::parse(dir)?, &LoadOptions::default())?;
/// let params = loaded.decode_params();
/// let tok = loaded.tokenizer.as_ref().ok_or("no tokenizer.json")?;
/// let prompt = "Tom has 23 apples. He buys 5 more. How many apples does Tom have now?";
/// assert_eq!(generate_text(&mut loaded.model, tok, prompt, false, &params)?, "23 + 5 = 28. Answer: 28");
/// # Ok(())
/// # }
/// ```
pub fn generate_text(
    model: &mut dyn DiffusionLm,
    tokenizer: &TextTokenizer,
    prompt: &str,
    chat: bool,
    params: &DecodeParams,
) -> Result<String> {
    Ok(generate_text_with(model, tokenizer, prompt, chat, params, &mut ())?.0)
}

/// [`generate_text`] reporting every step to `observer` (a progress bar, streaming, a stop
/// condition), and returning the [`Outcome`] (counters, the canvas) beside the text.
///
/// A closure is an observer; give its argument's type (`&StepEvent<'_>`), which Rust does not
/// infer for a `&mut dyn StepObserver`:
///
/// ```
/// use dllm_decode::prelude::*;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../models/tiny-llada");
/// let mut loaded = load(&ModelSource::parse(dir)?, &LoadOptions::default())?;
/// let params = loaded.decode_params();
/// let tok = loaded.tokenizer.as_ref().ok_or("no tokenizer.json")?;
/// let mut decided = Vec::new(); // positions in the order they were decided
/// let mut watch = |e: &StepEvent<'_>| {
///     decided.extend_from_slice(e.unmasked);
///     Control::Continue // Control::Stop ends the generation early
/// };
/// let prompt = "Tom has 23 apples. He buys 5 more. How many apples does Tom have now?";
/// let (text, g) = generate_text_with(&mut loaded.model, tok, prompt, false, &params, &mut watch)?;
/// assert_eq!(text, "23 + 5 = 28. Answer: 28");
/// assert_eq!(decided.len(), g.tokens_decoded);
/// # Ok(())
/// # }
/// ```
pub fn generate_text_with(
    model: &mut dyn DiffusionLm,
    tokenizer: &TextTokenizer,
    prompt: &str,
    chat: bool,
    params: &DecodeParams,
    observer: &mut dyn StepObserver,
) -> Result<(String, Outcome)> {
    if chat && !tokenizer.has_chat_template() {
        return Err(DecodeError::InvalidPrompt(
            "the tokenizer has no chat template (`chat` asks for one)".into(),
        ));
    }
    let ids = tokenizer.encode_prompt(prompt, chat)?;
    let g = generate(model, &ids, params, observer)?;
    let mut stop = model.info().special.stop_ids();
    stop.extend(tokenizer.eot_id());
    let text = tokenizer.decode(g.answer(&stop), true)?;
    Ok((text, g))
}

/// What a [`LoadedModel`] (a model with its tokenizer and its checkpoint's decoding
/// recommendations) adds for decoding; in [`prelude`].
///
/// ```
/// use dllm_decode::prelude::*;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../models/tiny-llada");
/// let mut loaded = load(&ModelSource::parse(dir)?, &LoadOptions::default())?;
/// let params = DecodeParams { strategy: Strategy::Mbsd(MbsdParams::default()), ..loaded.decode_params() };
/// let text = loaded.generate_text("Mia has 33 eggs. She buys 3 more. How many eggs does Mia have now?", false, &params)?;
/// assert_eq!(text, "33 + 3 = 36. Answer: 36");
/// # Ok(())
/// # }
/// ```
pub trait LoadedModelExt {
    /// The checkpoint's recommended lengths and schedule over the defaults
    /// ([`DecodeParams::for_model`]).
    fn decode_params(&self) -> DecodeParams;

    /// [`generate_text`] with the model's own tokenizer (an error naming the source when it has
    /// none).
    fn generate_text(&mut self, prompt: &str, chat: bool, params: &DecodeParams) -> Result<String>;
}

impl LoadedModelExt for LoadedModel {
    fn decode_params(&self) -> DecodeParams {
        DecodeParams::for_model(self)
    }

    fn generate_text(&mut self, prompt: &str, chat: bool, params: &DecodeParams) -> Result<String> {
        let tok = self.tokenizer.as_ref().ok_or_else(|| {
            DecodeError::InvalidPrompt(format!(
                "{} has no tokenizer: encode the prompt yourself and call `generate`",
                self.source
            ))
        })?;
        if chat && !tok.has_chat_template() {
            return Err(DecodeError::InvalidPrompt(format!(
                "the tokenizer of {} has no chat template",
                self.source
            )));
        }
        generate_text(&mut self.model, tok, prompt, chat, params)
    }
}

/// The names an app uses most: `use dllm_decode::prelude::*;` brings `dllm_models::prelude`
/// (the loader, `llada` / `dream`, `DiffusionLm`, candle's `Tensor`, `Device`, `DType`,
/// `VarBuilder`), the decoding entry points, the parameters, the observer types, the two roles a
/// user can implement, and [`LoadedModelExt`] (`loaded.decode_params()`).
pub mod prelude {
    pub use crate::{
        generate, generate_text, generate_text_with, Answer, Ask, Control, Decide, DecodeParams,
        DecodeView, Decoder, Generation, LoadedModelExt, MbsdParams, Outcome, Requested, Selector,
        Staged, StepEvent, StepObserver, StopReason, Strategy, Verify, WindowPlan, WindowPolicy,
    };
    pub use dllm_models::prelude::*;
}

/// A decoder: parameters plus the roles of the block algorithm. The built-in roles follow
/// `params.strategy` and `params.decide`; a user's own [`WindowPolicy`] or [`Selector`] replaces
/// them (each trait's docs hold an example). [`Decoder::start`] gives a [`Generation`] (a value
/// that asks for forwards: batch or interleave it with others); [`Decoder::run`] drives one
/// against a model.
///
/// ```
/// use dllm_decode::prelude::*;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../models/tiny-llada");
/// let mut loaded = load(&ModelSource::parse(dir)?, &LoadOptions::default())?;
/// let tok = loaded.tokenizer.clone().ok_or("no tokenizer.json")?;
/// let prompt = tok.encode_prompt("Tom has 23 apples. He buys 5 more. How many apples does Tom have now?", false)?;
/// let params = DecodeParams { strategy: Strategy::DualCache, ..loaded.decode_params() };
/// let g = Decoder::new(params).run(&mut loaded.model, &prompt, &mut ())?;
/// let stop = loaded.model.info().special.stop_ids();
/// assert_eq!(tok.decode(g.answer(&stop), true)?, "23 + 5 = 28. Answer: 28");
/// # Ok(())
/// # }
/// ```
pub struct Decoder<'a> {
    params: DecodeParams,
    latency: Option<Arc<LatencyTable>>,
    oracle: Option<Vec<u32>>,
    window: Option<Box<dyn WindowPolicy + 'a>>,
    selector: Option<Box<dyn Selector + 'a>>,
}

impl<'a> Decoder<'a> {
    /// A decoder with the built-in roles.
    pub fn new(params: DecodeParams) -> Self {
        Self {
            params,
            latency: None,
            oracle: None,
            window: None,
            selector: None,
        }
    }

    /// The latency table that prices multi-block lookahead and verification rows (default: the
    /// SM8750 NPU profile derived from the paper, [`latency::sm8750_npu`]).
    pub fn latency_table(mut self, table: Arc<LatencyTable>) -> Self {
        self.latency = Some(table);
        self
    }

    /// An evaluation instrument, not a decoder: with staged decisions, every Visible token that
    /// differs from `reference` (the reference answer's ids for the generated positions,
    /// `reference[i]` for position `prompt_len + i`) is replaced by the reference token at each
    /// step boundary. It bounds what any revision could recover.
    pub fn oracle_revision(mut self, reference: Vec<u32>) -> Self {
        self.oracle = Some(reference);
        self
    }

    /// Use this window policy instead of the strategy's.
    pub fn window_policy(mut self, policy: impl WindowPolicy + 'a) -> Self {
        self.window = Some(Box::new(policy));
        self
    }

    /// Use this selector instead of the schedule / threshold rule.
    pub fn selector(mut self, selector: impl Selector + 'a) -> Self {
        self.selector = Some(Box::new(selector));
        self
    }

    /// Decode `params.gen_length` positions after `prompt` with `model`: the generation's loop.
    pub fn run(
        self,
        model: &mut dyn DiffusionLm,
        prompt: &[u32],
        observer: &mut dyn StepObserver,
    ) -> Result<Outcome> {
        let mut g = self.start(model.info(), prompt)?;
        while let Some(ask) = g.next()? {
            let answer = model.answer(&ask)?;
            if observer.on_step(&g.absorb(answer)?) == Control::Stop {
                g.stop();
            }
        }
        Ok(g.finish())
    }

    /// A generation of `params.gen_length` positions after `prompt` for a model described by
    /// `info`: a value that says what each forward must compute ([`Generation::next`]) and takes
    /// the answers ([`Generation::absorb`]). Parameters, the prompt and the roles are checked here.
    pub fn start(self, info: &ModelInfo, prompt: &[u32]) -> Result<Generation<'a>> {
        let p = self.params;
        p.validate()?;
        check_options_apply(info.arch, &p)?;
        let canvas = prepare_canvas(info, prompt, &p)?;
        if uses_dream_algorithm(info.arch, &p) && self.window.is_none() && self.selector.is_none() {
            let d = dream::Dream::new(p, info.special.mask, canvas, prompt.len());
            return Ok(Generation::new(Box::new(d)));
        }
        check_roles(&p, self.window.is_some(), self.selector.is_some())?;
        if self.oracle.is_some() && p.decide.staged().is_none() {
            return Err(DecodeError::param(
                "decide",
                "the oracle revision replaces Visible tokens: it needs staged decisions",
            ));
        }
        let npu = self
            .latency
            .unwrap_or_else(|| Arc::new(latency::sm8750_npu()));
        let policy: Box<dyn WindowPolicy + 'a> = match self.window {
            Some(w) => w,
            None => match p.strategy {
                Strategy::Vanilla => Box::new(window::VanillaWindow),
                Strategy::PrefixCache => Box::new(window::PrefixCacheWindow),
                Strategy::DualCache => Box::new(window::DualCacheWindow),
                Strategy::Mbsd(m) => Box::new(window::MbsdWindow::new(m, npu.clone())),
            },
        };
        let selector: Box<dyn Selector + 'a> = match (self.selector, p.decide) {
            (Some(s), _) => s,
            (None, Decide::Staged(s)) => Box::new(select::StsSelector {
                thresholds: states::Thresholds {
                    visible: s.visible as f64,
                    stable: s.stable as f64,
                },
                no_adjacent: s.no_adjacent,
                wait_left: s.wait_left,
                near_wait: s.near_wait,
                guess: None,
            }),
            (None, Decide::Threshold(t)) => Box::new(select::ThresholdSelector {
                threshold: t as f64,
            }),
            (None, Decide::Schedule) => Box::new(
                select::ScheduleSelector::new(p.steps_per_block())
                    .with_block_length(p.block_length),
            ),
        };
        let b = blocks::Blocks::new(blocks::Setup {
            params: p,
            info: info.clone(),
            canvas,
            prompt_len: prompt.len(),
            policy,
            selector,
            npu,
            oracle: self.oracle,
        })?;
        Ok(Generation::new(Box::new(b)))
    }
}

/// A user's own role replaces a built-in one: the options only the built-in role reads would be
/// ignored, so setting them is an error.
fn check_roles(p: &DecodeParams, custom_window: bool, custom_selector: bool) -> Result<()> {
    let ignored = |name: &'static str, role: &str| {
        Err(DecodeError::param(
            name,
            format!(
                "a custom {role} replaces the built-in one that reads it, so it would be ignored"
            ),
        ))
    };
    if custom_selector && p.decide != Decide::Schedule {
        return ignored("decide", "selector");
    }
    if custom_window
        && p.strategy
            .mbsd()
            .is_some_and(|m| m != MbsdParams::default())
    {
        return ignored("mbsd", "window policy");
    }
    Ok(())
}

/// Whether `generate` runs Dream's own `diffusion_generate` (a Dream model with the vanilla
/// strategy) rather than the block-wise decoder.
pub fn uses_dream_algorithm(arch: Arch, p: &DecodeParams) -> bool {
    arch == Arch::Dream && p.strategy == Strategy::Vanilla
}

/// Options the chosen decoder would ignore are errors, not silent no-ops.
fn check_options_apply(arch: Arch, p: &DecodeParams) -> Result<()> {
    let unused = |name: &'static str, why: &str| Err(DecodeError::param(name, why.to_string()));
    if uses_dream_algorithm(arch, p) {
        let why = "Dream's own algorithm (a Dream model with the vanilla strategy) does not use \
                   it; the block-wise strategies (prefix-cache, dual-cache, mbsd) do";
        if p.decide != Decide::Schedule {
            return unused("threshold", why);
        }
        if p.cfg_scale > 0.0 {
            return unused("cfg_scale", why);
        }
        if p.remasking != Remasking::LowConfidence {
            return unused(
                "remasking",
                "Dream's algorithm chooses positions with dream.alg",
            );
        }
        if p.logits_eos_inf {
            return unused("logits_eos_inf", why);
        }
        if p.confidence_eos_eot_inf {
            return unused("confidence_eos_eot_inf", why);
        }
    } else {
        let why = "only Dream's own algorithm (a Dream model with the vanilla strategy) uses it";
        let (d, default) = (p.dream, DreamParams::default());
        let given = [
            ("dream.alg", d.alg != default.alg),
            ("dream.eps", d.eps != default.eps),
            ("dream.alg_temp", d.alg_temp.is_some()),
            ("dream.top_p", d.top_p.is_some()),
            ("dream.top_k", d.top_k.is_some()),
        ];
        if let Some((name, _)) = given.iter().find(|g| g.1) {
            return unused(name, why);
        }
    }
    Ok(())
}
