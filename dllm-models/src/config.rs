//! The architecture hyper-parameters shared by LLaDA and Dream, normalised from either model's
//! `config.json` (or GGUF metadata), and their validation.

use crate::lm::{Arch, SpecialTokens};
use crate::role::Role;
use crate::{Error, Result};

/// Architecture hyper-parameters, normalised from either model's config.
#[derive(Debug, Clone, PartialEq)]
pub struct TransformerConfig {
    /// Model family.
    pub arch: Arch,
    /// Hidden size.
    pub hidden_size: usize,
    /// Blocks.
    pub num_layers: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads.
    pub num_kv_heads: usize,
    /// MLP hidden size.
    pub intermediate_size: usize,
    /// Rows of the embedding table and of the LM head.
    pub vocab_size: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// RoPE base.
    pub rope_theta: f64,
    /// q/k/v projections carry biases.
    pub qkv_bias: bool,
    /// The LM head is the embedding table.
    pub tie_word_embeddings: bool,
    /// Logits are shifted by one position.
    pub shift_logits: bool,
    /// Longest canvas.
    pub max_seq_len: usize,
    /// Special tokens.
    pub special: SpecialTokens,
}

/// [`TransformerConfig::matrix_dims`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct MatrixDims {
    /// Query features (`heads * head_dim`).
    pub(crate) nq: usize,
    /// Key (and value) features (`kv_heads * head_dim`).
    pub(crate) nkv: usize,
    /// MLP hidden size.
    pub(crate) ff: usize,
    /// Vocabulary size.
    pub(crate) vocab: usize,
}

impl TransformerConfig {
    /// Every parameter with its shape (checkpoint `[out, in]` for matrices), in a fixed order.
    pub fn param_shapes(&self) -> Vec<(Role, Vec<usize>)> {
        let cfg = self;
        let h = cfg.hidden_size;
        let MatrixDims {
            nq,
            nkv,
            ff,
            vocab: v,
        } = cfg.matrix_dims();
        let mut roles: Vec<(Role, Vec<usize>)> =
            vec![(Role::Embed, vec![v, h]), (Role::FinalNorm, vec![h])];
        if !cfg.tie_word_embeddings {
            roles.push((Role::Head, vec![v, h]));
        }
        for i in 0..cfg.num_layers {
            roles.extend([
                (Role::AttnNorm(i), vec![h]),
                (Role::Q(i), vec![nq, h]),
                (Role::K(i), vec![nkv, h]),
                (Role::V(i), vec![nkv, h]),
                (Role::O(i), vec![h, nq]),
                (Role::FfnNorm(i), vec![h]),
                (Role::Gate(i), vec![ff, h]),
                (Role::Up(i), vec![ff, h]),
                (Role::Down(i), vec![h, ff]),
            ]);
            if cfg.qkv_bias {
                roles.extend([
                    (Role::QBias(i), vec![nq]),
                    (Role::KBias(i), vec![nkv]),
                    (Role::VBias(i), vec![nkv]),
                ]);
            }
        }
        roles
    }

    /// Head dimension.
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_heads
    }

    /// Output widths of the block matrices and the vocabulary (the shapes every builder uses).
    pub(crate) fn matrix_dims(&self) -> MatrixDims {
        let hd = self.head_dim();
        MatrixDims {
            nq: self.num_heads * hd,
            nkv: self.num_kv_heads * hd,
            ff: self.intermediate_size,
            vocab: self.vocab_size,
        }
    }

    /// Parameters of one transformer block, `None` on overflow.
    fn layer_params(&self) -> Option<u64> {
        let h = self.hidden_size as u64;
        let hd = (self.hidden_size / self.num_heads.max(1)) as u64;
        let nq = (self.num_heads as u64).checked_mul(hd)?;
        let nkv = (self.num_kv_heads as u64).checked_mul(hd)?;
        let ff = self.intermediate_size as u64;
        let attn = nq
            .checked_mul(2)?
            .checked_add(nkv.checked_mul(2)?)?
            .checked_mul(h)?;
        let mlp = ff.checked_mul(3)?.checked_mul(h)?;
        let bias = if self.qkv_bias {
            nq.checked_add(nkv.checked_mul(2)?)?
        } else {
            0
        };
        attn.checked_add(mlp)?
            .checked_add(h.checked_mul(2)?)?
            .checked_add(bias)
    }

    /// Parameters outside the blocks (embedding, final norm, untied head), `None` on overflow.
    fn outer_params(&self) -> Option<u64> {
        let table = (self.vocab_size as u64).checked_mul(self.hidden_size as u64)?;
        let heads = if self.tie_word_embeddings { 1 } else { 2 };
        table
            .checked_mul(heads)?
            .checked_add(self.hidden_size as u64)
    }

    /// Total parameter count, computed without allocating (`None` when it does not fit a `u64`).
    pub fn param_count(&self) -> Option<u64> {
        self.layer_params()?
            .checked_mul(self.num_layers as u64)?
            .checked_add(self.outer_params()?)
    }

    /// Check internal consistency; `field` names are the architecture's config keys.
    pub fn validate(&self, names: &ConfigNames) -> Result<()> {
        self.validate_shape(names)?;
        self.validate_sizes(names)?;
        self.validate_numbers_and_ids()
    }

    /// Sizes are positive and the heads split the hidden size (RoPE needs an even head size).
    fn validate_shape(&self, names: &ConfigNames) -> Result<()> {
        let pos = |v: usize, f: &str| {
            if v == 0 {
                Err(Error::invalid(f, "must be positive"))
            } else {
                Ok(())
            }
        };
        pos(self.hidden_size, names.hidden)?;
        pos(self.num_layers, names.layers)?;
        pos(self.num_heads, names.heads)?;
        pos(self.num_kv_heads, names.kv_heads)?;
        pos(self.intermediate_size, names.ffn)?;
        pos(self.vocab_size, names.vocab)?;
        pos(self.max_seq_len, names.max_len)?;
        if !self.hidden_size.is_multiple_of(self.num_heads) {
            return Err(Error::invalid(
                names.heads,
                format!(
                    "{} heads do not divide {} = {}",
                    self.num_heads, names.hidden, self.hidden_size
                ),
            ));
        }
        if !self.head_dim().is_multiple_of(2) {
            return Err(Error::invalid(
                names.heads,
                format!("head dimension {} must be even for RoPE", self.head_dim()),
            ));
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return Err(Error::invalid(
                names.kv_heads,
                format!(
                    "{} key/value heads do not divide {} query heads",
                    self.num_kv_heads, self.num_heads
                ),
            ));
        }
        Ok(())
    }

    /// The context is within the supported length and no parameter count overflows.
    fn validate_sizes(&self, names: &ConfigNames) -> Result<()> {
        if self.max_seq_len > crate::limits::MAX_SEQ_LEN {
            return Err(Error::invalid(
                names.max_len,
                format!(
                    "{} positions is beyond the supported {}",
                    self.max_seq_len,
                    crate::limits::MAX_SEQ_LEN
                ),
            ));
        }
        // Sizes come from a file: their products must not overflow before anything is allocated
        // from them (the memory check against the machine comes when the weights are built).
        let too_many = |field: &str| {
            Err(Error::invalid(
                field,
                format!(
                    "with {} = {}, {} = {}, {} = {}, {} = {} and {} = {} the model would have more than 2^64 parameters",
                    names.hidden, self.hidden_size, names.ffn, self.intermediate_size,
                    names.vocab, self.vocab_size, names.heads, self.num_heads,
                    names.layers, self.num_layers
                ),
            ))
        };
        if self.layer_params().is_none() {
            return too_many(names.hidden);
        }
        if self.outer_params().is_none() {
            return too_many(names.vocab);
        }
        if self.param_count().is_none() {
            return too_many(names.layers);
        }
        Ok(())
    }

    /// The norm's epsilon, RoPE's theta and the special ids.
    fn validate_numbers_and_ids(&self) -> Result<()> {
        if !(self.rms_norm_eps > 0.0 && self.rms_norm_eps < 1.0) {
            return Err(Error::invalid(
                "rms_norm_eps",
                format!("{} is not in (0, 1)", self.rms_norm_eps),
            ));
        }
        if !self.rope_theta.is_finite() || self.rope_theta <= 1.0 {
            return Err(Error::invalid(
                "rope_theta",
                format!("{} must be a finite value > 1", self.rope_theta),
            ));
        }
        for (id, name) in [
            (Some(self.special.mask), "mask_token_id"),
            (Some(self.special.eos), "eos_token_id"),
            (self.special.pad, "pad_token_id"),
            (self.special.bos, "bos_token_id"),
        ] {
            let Some(id) = id else { continue };
            if id as usize >= self.vocab_size {
                return Err(Error::invalid(
                    name,
                    format!("{id} is outside the vocabulary ({} rows)", self.vocab_size),
                ));
            }
        }
        // A mask id that is also EOS would make every EOS prediction a still-masked position.
        if self.special.mask == self.special.eos {
            return Err(Error::invalid(
                "mask_token_id",
                format!(
                    "{} is also eos_token_id: the mask must be a token of its own",
                    self.special.mask
                ),
            ));
        }
        Ok(())
    }
}

/// Config-file spellings of the fields [`TransformerConfig::validate`] reports on.
#[derive(Debug, Clone, Copy)]
pub struct ConfigNames {
    /// Hidden size key.
    pub hidden: &'static str,
    /// Layer count key.
    pub layers: &'static str,
    /// Head count key.
    pub heads: &'static str,
    /// KV head count key.
    pub kv_heads: &'static str,
    /// MLP size key.
    pub ffn: &'static str,
    /// Vocabulary key.
    pub vocab: &'static str,
    /// Max length key.
    pub max_len: &'static str,
}
