//! The checkpoint-independent [`Role`] of each transformer parameter, and its name in each
//! architecture's Hugging Face checkpoint.

use crate::lm::Arch;

/// The role of a parameter in the shared transformer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Token embedding `(vocab, hidden)`.
    Embed,
    /// Final norm `(hidden)`.
    FinalNorm,
    /// LM head `(vocab, hidden)`.
    Head,
    /// Layer `i`'s pre-attention norm.
    AttnNorm(usize),
    /// Layer `i`'s query projection.
    Q(usize),
    /// Layer `i`'s key projection.
    K(usize),
    /// Layer `i`'s value projection.
    V(usize),
    /// Layer `i`'s query bias (Dream).
    QBias(usize),
    /// Layer `i`'s key bias (Dream).
    KBias(usize),
    /// Layer `i`'s value bias (Dream).
    VBias(usize),
    /// Layer `i`'s attention output projection.
    O(usize),
    /// Layer `i`'s pre-MLP norm.
    FfnNorm(usize),
    /// Layer `i`'s gate projection (SiLU applied).
    Gate(usize),
    /// Layer `i`'s up projection.
    Up(usize),
    /// Layer `i`'s down projection.
    Down(usize),
}

impl Role {
    /// The tensor name in the architecture's Hugging Face checkpoint.
    pub fn hf_name(self, arch: Arch) -> String {
        match arch {
            Arch::Llada => {
                let b = |i: usize, s: &str| format!("model.transformer.blocks.{i}.{s}");
                match self {
                    Role::Embed => "model.transformer.wte.weight".into(),
                    Role::FinalNorm => "model.transformer.ln_f.weight".into(),
                    Role::Head => "model.transformer.ff_out.weight".into(),
                    Role::AttnNorm(i) => b(i, "attn_norm.weight"),
                    Role::Q(i) => b(i, "q_proj.weight"),
                    Role::K(i) => b(i, "k_proj.weight"),
                    Role::V(i) => b(i, "v_proj.weight"),
                    Role::QBias(i) => b(i, "q_proj.bias"),
                    Role::KBias(i) => b(i, "k_proj.bias"),
                    Role::VBias(i) => b(i, "v_proj.bias"),
                    Role::O(i) => b(i, "attn_out.weight"),
                    Role::FfnNorm(i) => b(i, "ff_norm.weight"),
                    Role::Gate(i) => b(i, "ff_proj.weight"),
                    Role::Up(i) => b(i, "up_proj.weight"),
                    Role::Down(i) => b(i, "ff_out.weight"),
                }
            }
            Arch::Dream => {
                let b = |i: usize, s: &str| format!("model.layers.{i}.{s}");
                match self {
                    Role::Embed => "model.embed_tokens.weight".into(),
                    Role::FinalNorm => "model.norm.weight".into(),
                    Role::Head => "lm_head.weight".into(),
                    Role::AttnNorm(i) => b(i, "input_layernorm.weight"),
                    Role::Q(i) => b(i, "self_attn.q_proj.weight"),
                    Role::K(i) => b(i, "self_attn.k_proj.weight"),
                    Role::V(i) => b(i, "self_attn.v_proj.weight"),
                    Role::QBias(i) => b(i, "self_attn.q_proj.bias"),
                    Role::KBias(i) => b(i, "self_attn.k_proj.bias"),
                    Role::VBias(i) => b(i, "self_attn.v_proj.bias"),
                    Role::O(i) => b(i, "self_attn.o_proj.weight"),
                    Role::FfnNorm(i) => b(i, "post_attention_layernorm.weight"),
                    Role::Gate(i) => b(i, "mlp.gate_proj.weight"),
                    Role::Up(i) => b(i, "mlp.up_proj.weight"),
                    Role::Down(i) => b(i, "mlp.down_proj.weight"),
                }
            }
        }
    }

    /// The tensor name in a llama.cpp GGUF file.
    pub fn gguf_name(self) -> String {
        let b = |i: usize, s: &str| format!("blk.{i}.{s}");
        match self {
            Role::Embed => "token_embd.weight".into(),
            Role::FinalNorm => "output_norm.weight".into(),
            Role::Head => "output.weight".into(),
            Role::AttnNorm(i) => b(i, "attn_norm.weight"),
            Role::Q(i) => b(i, "attn_q.weight"),
            Role::K(i) => b(i, "attn_k.weight"),
            Role::V(i) => b(i, "attn_v.weight"),
            Role::QBias(i) => b(i, "attn_q.bias"),
            Role::KBias(i) => b(i, "attn_k.bias"),
            Role::VBias(i) => b(i, "attn_v.bias"),
            Role::O(i) => b(i, "attn_output.weight"),
            Role::FfnNorm(i) => b(i, "ffn_norm.weight"),
            Role::Gate(i) => b(i, "ffn_gate.weight"),
            Role::Up(i) => b(i, "ffn_up.weight"),
            Role::Down(i) => b(i, "ffn_down.weight"),
        }
    }

    /// Whether the parameter is a matrix that a linear layer (or embedding) consumes.
    pub fn is_matrix(self) -> bool {
        !matches!(
            self,
            Role::FinalNorm
                | Role::AttnNorm(_)
                | Role::FfnNorm(_)
                | Role::QBias(_)
                | Role::KBias(_)
                | Role::VBias(_)
        )
    }
}
