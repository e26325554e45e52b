//! A llama-style bidirectional block as a candle-hexagon [`Program`], for the crate's tests and
//! examples (the crate itself knows no model; the project's model crate records its own block
//! definition). Layer vectors: 0 attention norm, 1 MLP norm; layer matrices: 0 fused q/k/v,
//! 1 o, 2 fused gate/up, 3 down. Tail: vector 0 final norm, matrix 0 the LM head (when given).

use candle_hexagon::{Cols, Node, Program};

/// Geometry of the block.
pub struct Geometry {
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub ffn: usize,
    /// Rows of the LM head; `None`: the tail is the final norm only.
    pub vocab: Option<usize>,
    pub eps: f32,
}

pub fn llama_program(g: &Geometry) -> Program {
    let (h, hd) = (g.hidden, g.head_dim);
    let (nq, nkv, f) = (g.heads * hd, g.kv_heads * hd, g.ffn);
    let mut acts: Vec<(String, usize)> = Vec::new();
    let mut act = |name: &str, w: usize| {
        acts.push((name.into(), w));
        Cols::all(acts.len() - 1, w)
    };
    let x = act("x", h);
    let hh = act("h", h);
    let qkv = act("qkv", nq + 2 * nkv);
    let qs = act("qkv rows", nq);
    let xs = act("x rows", h);
    let att = act("att", nq);
    let gu = act("gu", 2 * f);
    let a = act("act", f);
    let out = g.vocab.map(|v| act("out", v));
    let (q, k, v) = (qkv.sub(0, nq), qkv.sub(nq, nkv), qkv.sub(nq + nkv, nkv));
    let eps = g.eps;
    let layer = vec![
        Node::RmsNorm {
            x,
            weight: 0,
            eps,
            out: hh,
        },
        Node::MatMul {
            x: hh,
            weight: 0,
            out: qkv,
        },
        Node::CacheKeysRoped { x: k },
        Node::CacheValues { x: v },
        Node::Rope { x: q },
        Node::SelectRows { x: q, out: qs },
        Node::SelectRows { x, out: xs },
        Node::Attention {
            q: qs,
            out: att,
            scale: 1.0 / (hd as f32).sqrt(),
        },
        Node::MatMul {
            x: att,
            weight: 1,
            out: hh,
        },
        Node::Add { acc: xs, x: hh },
        Node::RmsNorm {
            x: xs,
            weight: 1,
            eps,
            out: hh,
        },
        Node::MatMul {
            x: hh,
            weight: 2,
            out: gu,
        },
        Node::SwiGlu {
            gate: gu.sub(0, f),
            up: gu.sub(f, f),
            out: a,
        },
        Node::MatMul {
            x: a,
            weight: 3,
            out: hh,
        },
        Node::Add { acc: xs, x: hh },
    ];
    let mut tail = vec![Node::RmsNorm {
        x: xs,
        weight: 0,
        eps,
        out: hh,
    }];
    if let Some(out) = out {
        tail.push(Node::MatMul {
            x: hh,
            weight: 0,
            out,
        });
    }
    Program {
        acts,
        input: x.act,
        layer,
        layer_output: xs,
        tail,
        output: out.unwrap_or(hh),
    }
}
