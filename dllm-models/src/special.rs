//! Completing a model's special tokens from its tokenizer and generation config (shared by
//! [`crate::load`] and the candle-style constructors).

use crate::lm::{Arch, ModelInfo, SpecialTokens};
use crate::tokenizer::TextTokenizer;
use crate::{Error, Result};

/// LLaDA-8B-Instruct's `<|eot_id|>` (end of turn), used when a tokenizer is not available.
pub const LLADA_8B_EOT_ID: u32 = 126348;

/// The special tokens of a model once its config's are completed: EoT from the tokenizer (or
/// LLaDA-8B's own id when there is none), BOS from `generation_config.json`; each checked to be a
/// vocabulary row other than the mask. [`load`] and the candle-style constructors
/// ([`crate::llada::Model::new`], [`crate::dream::Model::new`]) share this rule.
pub(crate) fn complete_special(
    info: &ModelInfo,
    tokenizer: Option<&TextTokenizer>,
    bos: Option<u32>,
) -> Result<SpecialTokens> {
    let mut special = info.special.clone();
    if special.eot.is_none() {
        special.eot = match tokenizer {
            Some(t) => t.eot_id(),
            None if info.arch == Arch::Llada && info.vocab_size == 126464 => Some(LLADA_8B_EOT_ID),
            None => None,
        };
    }
    if special.bos.is_none() {
        special.bos = bos;
    }
    for (field, id) in [("bos_token_id", special.bos), ("eot", special.eot)] {
        match id {
            Some(id) if id as usize >= info.vocab_size => {
                return Err(Error::invalid(
                    field,
                    format!("{id} is outside the vocabulary ({} rows)", info.vocab_size),
                ))
            }
            Some(id) if id == special.mask => {
                return Err(Error::invalid(
                    field,
                    format!("{id} is the mask token id: the mask must be a token of its own"),
                ))
            }
            _ => {}
        }
    }
    Ok(special)
}
