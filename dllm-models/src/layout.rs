//! A checkpoint's tensor list against the config, checked from names and shapes alone before any
//! tensor is read or anything is allocated from the config's sizes: the number of transformer
//! blocks, every expected tensor with its shape, and no tensor the config has no place for (an
//! LM head while the config ties it to the embedding, blocks beyond the declared count, tensors of
//! another model).
//!
//! The layer count is compared first, from the block indices in the names, so a config declaring
//! 10^9 layers over a checkpoint of four is reported before a per-layer list is built.

use std::collections::{BTreeSet, HashMap};

use crate::config::TransformerConfig;
use crate::role::Role;
use crate::{Error, Result};

/// How a checkpoint format spells things.
pub(crate) struct Spelling<'a> {
    /// Name of a parameter.
    pub name: &'a dyn Fn(Role) -> String,
    /// What every per-block tensor name starts with, up to the block index (`blk.`).
    pub block_prefix: &'a str,
    /// The config field holding the layer count, for messages.
    pub layers_field: &'a str,
    /// The config field that ties the LM head, for messages (`None`: the format ties by omitting
    /// the head, as GGUF does).
    pub tie_field: Option<&'a str>,
}

/// HF buffers some exporters save beside the parameters; they carry nothing the model uses
/// (RoPE frequencies are recomputed from `rope_theta`).
fn ignorable(name: &str) -> bool {
    name.ends_with("rotary_emb.inv_freq")
}

/// The block index of a per-block tensor name (`None` for other names).
fn block_index(name: &str, prefix: &str) -> Option<Option<usize>> {
    let rest = name.strip_prefix(prefix)?;
    let digits = rest.split('.').next().unwrap_or("");
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // Digits that do not fit a usize are a block index beyond anything the config can declare.
    Some(digits.parse::<usize>().ok())
}

/// Check `shapes` (checkpoint name -> shape) against `cfg`.
pub(crate) fn check(
    cfg: &TransformerConfig,
    shapes: &HashMap<String, Vec<usize>>,
    spell: &Spelling<'_>,
    source_desc: &str,
) -> Result<()> {
    let mut blocks = 0usize;
    for name in shapes.keys() {
        if let Some(i) = block_index(name, spell.block_prefix) {
            blocks = blocks.max(i.map_or(usize::MAX, |i| i.saturating_add(1)));
        }
    }
    if blocks != cfg.num_layers {
        return Err(Error::LayerCount {
            field: spell.layers_field.to_string(),
            config: cfg.num_layers,
            checkpoint: blocks,
            source_desc: source_desc.to_string(),
        });
    }
    // The layer count now matches the checkpoint's, so the expected list is bounded by it.
    let expected = cfg.param_shapes();
    for (role, shape) in &expected {
        let name = (spell.name)(*role);
        match shapes.get(&name) {
            None => {
                return Err(Error::MissingTensor {
                    name,
                    source_desc: source_desc.to_string(),
                })
            }
            Some(got) if got != shape => {
                return Err(Error::TensorShape {
                    name,
                    expected: shape.clone(),
                    got: got.clone(),
                })
            }
            Some(_) => {}
        }
    }
    let known: BTreeSet<String> = expected.iter().map(|(r, _)| (spell.name)(*r)).collect();
    let extra: BTreeSet<&String> = shapes
        .keys()
        .filter(|n| !known.contains(*n) && !ignorable(n))
        .collect();
    if extra.is_empty() {
        return Ok(());
    }
    let head = (spell.name)(Role::Head);
    let hint = match spell.tie_field {
        Some(field) if cfg.tie_word_embeddings && extra.contains(&head) => format!(
            " (`{head}` is an untied LM head, but the config's `{field}` is true: set it to \
             false, or drop the tensor)"
        ),
        _ if cfg.qkv_bias => String::new(),
        _ if extra.iter().any(|n| n.ends_with(".bias")) => {
            " (biases: the config declares none)".to_string()
        }
        _ => String::new(),
    };
    Err(Error::UnexpectedTensors {
        count: extra.len(),
        names: extra.iter().take(5).map(|s| s.to_string()).collect(),
        source_desc: source_desc.to_string(),
        hint,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_indices() {
        assert_eq!(block_index("blk.12.attn_q.weight", "blk."), Some(Some(12)));
        assert_eq!(block_index("blk.x.attn_q.weight", "blk."), None);
        assert_eq!(block_index("output.weight", "blk."), None);
        assert_eq!(
            block_index("blk.99999999999999999999999.ffn_up.weight", "blk."),
            Some(None)
        );
    }
}
