//! Fast-dLLM's cached block loops (NVlabs/Fast-dLLM, `llada/generate.py`:
//! `generate_with_prefix_cache`, `generate_with_dual_cache`, `get_transfer_index`) as a test
//! oracle, written from the published Python over the f64 [`Reference`] with its explicit KV cache
//! ([`Reference::forward_window`]), not from `dllm-decode`.
//!
//! Per block: one full forward (which caches every position's keys and values) that also decodes,
//! then steps until the block has no mask left, each forwarding
//! * prefix cache: `x[:, block_start:]` (the block and everything after it) over the cached keys
//!   and values of `[0, block_start)`;
//! * dual cache: `x[:, block_start:block_end]` over the cached prefix *and* suffix.
//!
//! `get_transfer_index` at temperature 0: `x0 = argmax`, confidence = softmax probability of `x0`
//! on masked positions of the block (-inf elsewhere); without a threshold the `topk` of the step's
//! scheduled count (`get_num_transfer_tokens` of the block's masks), with a threshold the `topk` of
//! all masked positions, keeping the first and then only those with confidence `>= threshold`.
//! Ties: lowest id for `argmax`, lowest position for `topk` (as the other oracles).

use std::ops::Range;

use anyhow::Result;

use crate::generate::{argmax, block_schedule, num_transfer_tokens, Generation};
use crate::reference::{softmax, Reference};

/// Which cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cache {
    /// `generate_with_prefix_cache`.
    Prefix,
    /// `generate_with_dual_cache`.
    Dual,
}

/// Parameters, named as in the Python.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FastParams {
    /// `steps` (over all blocks).
    pub steps: usize,
    /// `gen_length`.
    pub gen_length: usize,
    /// `block_length`.
    pub block_length: usize,
    /// `threshold` (`None`: the step schedule).
    pub threshold: Option<f64>,
    /// `mask_id`.
    pub mask_id: u32,
}

/// `get_transfer_index` over rows of the window starting at `start`: `(position, token)` pairs to
/// write. `eligible(pos)` is `mask_index`.
fn transfer_index(
    rows: &[Vec<f64>],
    start: usize,
    x: &[u32],
    eligible: impl Fn(usize) -> bool,
    num: usize,
    threshold: Option<f64>,
) -> Vec<(usize, u32)> {
    let mut x0 = Vec::with_capacity(rows.len());
    let mut conf = Vec::with_capacity(rows.len());
    for (j, row) in rows.iter().enumerate() {
        let pos = start + j;
        let tok = argmax(row);
        if eligible(pos) {
            x0.push(tok as u32);
            conf.push(softmax(row)[tok]);
        } else {
            x0.push(x[pos]);
            conf.push(f64::NEG_INFINITY);
        }
    }
    let k = match threshold {
        Some(_) => (0..rows.len()).filter(|&j| eligible(start + j)).count(),
        None => num,
    };
    let mut order: Vec<usize> = (0..rows.len()).collect();
    order.sort_by(|&a, &b| conf[b].total_cmp(&conf[a]).then(a.cmp(&b)));
    order
        .iter()
        .take(k)
        .enumerate()
        .filter(|&(rank, &j)| match threshold {
            Some(t) => rank == 0 || conf[j] >= t,
            None => true,
        })
        .map(|(_, &j)| (start + j, x0[j]))
        .collect()
}

/// Fast-dLLM's cached generation over the reference; `post` adjusts every row of logits before it
/// is used (the caller's hook for a documented deviation, e.g. excluding the mask id).
pub fn fast_dllm_generate(
    model: &Reference,
    prompt: &[u32],
    p: &FastParams,
    cache: Cache,
    post: &dyn Fn(&mut Vec<f64>),
) -> Result<Generation> {
    let (num_blocks, steps) = block_schedule(p.gen_length, p.block_length, p.steps)?;
    let pl = prompt.len();
    let mut x: Vec<u32> = prompt.to_vec();
    x.extend(std::iter::repeat_n(p.mask_id, p.gen_length));
    let len = x.len();
    let mask = p.mask_id;
    let mut nfe = 0;
    let adjust = |mut rows: Vec<Vec<f64>>| {
        rows.iter_mut().for_each(post);
        rows
    };
    for b in 0..num_blocks {
        let (bs, be) = (pl + b * p.block_length, pl + (b + 1) * p.block_length);
        let masked = x[bs..be].iter().filter(|&&t| t == mask).count();
        let schedule = num_transfer_tokens(masked, steps);
        let (rows, kv) = model.forward_with_cache(&x)?;
        let rows = adjust(rows);
        nfe += 1;
        let snapshot = x.clone();
        for (pos, tok) in transfer_index(
            &rows,
            0,
            &snapshot,
            |pos| snapshot[pos] == mask && pos < be,
            schedule[0],
            p.threshold,
        ) {
            x[pos] = tok;
        }
        let (window, cached): (Range<usize>, Vec<Range<usize>>) = match cache {
            Cache::Prefix => (bs..len, std::iter::once(0..bs).collect()),
            Cache::Dual => (bs..be, [0..bs, be..len].into_iter().collect()),
        };
        let mut i = 1;
        while x[bs..be].contains(&mask) {
            nfe += 1;
            let rows = adjust(model.forward_window(&x, window.clone(), &kv, &cached)?);
            let num = match p.threshold {
                Some(_) => 0,
                None => *schedule
                    .get(i)
                    .ok_or_else(|| anyhow::anyhow!("block {b}: masks left after the schedule"))?,
            };
            let snapshot = x.clone();
            for (pos, tok) in transfer_index(
                &rows,
                window.start,
                &snapshot,
                |pos| snapshot[pos] == mask && pos < be,
                num,
                p.threshold,
            ) {
                x[pos] = tok;
            }
            i += 1;
        }
    }
    Ok(Generation {
        canvas: x,
        forwards: nfe,
    })
}
