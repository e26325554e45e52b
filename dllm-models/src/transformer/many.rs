//! Many sequences in one call: [`DiffusionTransformer::forward_many`] answers each sequence's
//! [`Ask`] with the rows of all of them going through every block together (ragged: each brings
//! its own window, verification rows, positions and cache), attention per sequence over its own
//! cache. Each answer is bit for bit the one the sequence would get alone.

use candle_core::DType;
use half::{bf16, f16};

use super::{DiffusionTransformer, SeqKv};
use crate::ask::{Answer, Ask};
use crate::kv_cache::KvElem;
use crate::lm::answer_with;
use crate::lm::{DiffusionLm, Rows};
use crate::weights_model::TransformerWeights;
use crate::{AskDefect, Error, Result};

impl DiffusionTransformer {
    /// Answer every sequence's ask in one call: empty the caches asked to be emptied, run all the
    /// windows (with their verification rows) through the model together, then commit what each
    /// ask names. Every sequence must belong to these weights (an error naming the first that
    /// does not); the answers come in the order of `seqs`.
    ///
    /// On the CPU the rows of all sequences share every matrix product (the point of batching:
    /// the weights are read once per call); each sequence's logits equal its solo answer bit for
    /// bit. On the NPU's block-level module the sequences run one after the other (each its own
    /// DSP batches over its own device cache), and verification rows run as single-position
    /// forwards against the committed cache ([`answer_with`]).
    ///
    /// ```
    /// use dllm_models::{load, Ask, DiffusionLm, DiffusionTransformer, LoadOptions, ModelSource};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../models/tiny-llada");
    /// let loaded = load(&ModelSource::parse(dir)?, &LoadOptions::default())?;
    /// let (mut a, mut b) = (loaded.model.new_sequence()?, loaded.model.new_sequence()?);
    /// let ask = |canvas: Vec<u32>| Ask {
    ///     window: 0..canvas.len(),
    ///     rows: vec![canvas.len() - 1],
    ///     canvas: vec![canvas],
    ///     clear_cache: true,
    ///     verify: vec![],
    ///     verify_hidden: vec![],
    ///     commit: None,
    /// };
    /// let (ka, kb) = (ask(vec![2, 10, 11, 5]), ask(vec![2, 10, 11, 12, 13, 5]));
    /// let both = DiffusionTransformer::forward_many(&mut [(&mut a, &ka), (&mut b, &kb)])?;
    /// let alone = b.answer(&kb)?;
    /// assert_eq!(both[1].logits.to_vec3::<f32>()?, alone.logits.to_vec3::<f32>()?);
    /// # Ok(())
    /// # }
    /// ```
    pub fn forward_many(seqs: &mut [(&mut DiffusionTransformer, &Ask)]) -> Result<Vec<Answer>> {
        let Some(first) = seqs.first() else {
            return Ok(Vec::new());
        };
        let weights = first.0.weights.clone();
        for (index, (s, _)) in seqs.iter().enumerate() {
            if s.weights.id() != weights.id() {
                return Err(AskDefect::OtherModel {
                    index,
                    other: s.weights.id(),
                    model: weights.id(),
                }
                .into());
            }
        }
        if weights.hex.is_some() {
            return seqs
                .iter_mut()
                .map(|(s, a)| answer_with(&mut **s, a))
                .collect();
        }
        let mut dtype = None;
        for (s, a) in seqs.iter_mut() {
            dtype = Some(s.prepare(a)?);
        }
        let answers = match dtype {
            Some(DType::F32) => many_on::<f32>(&weights, seqs)?,
            Some(DType::F16) => many_on::<f16>(&weights, seqs)?,
            _ => many_on::<bf16>(&weights, seqs)?,
        };
        for (s, a) in seqs.iter_mut() {
            if let Some(c) = &a.commit {
                s.commit(c.clone())?;
            }
        }
        Ok(answers)
    }

    /// Check an ask against this sequence, empty the cache when asked and make room for the
    /// window's K/V; returns the cache's dtype.
    fn prepare(&mut self, ask: &Ask) -> Result<DType> {
        let shift = self.weights.shift();
        ask.check(shift)?;
        if ask.clear_cache {
            self.truncate_cache(0)?;
        }
        let canvas = ask.canvas_tensor(&self.weights.device)?;
        let b = self.check_window(&canvas, &ask.window)?;
        let len = self.len();
        if let Some(&p) = (ask.verify.iter())
            .chain(ask.verify_hidden.iter().flatten())
            .find(|&&p| p >= len && !ask.window.contains(&p))
        {
            return Err(AskDefect::VerifyUnseen {
                position: p,
                cache_len: len,
                window: ask.window.clone(),
            }
            .into());
        }
        let n = shift.window_rows(ask.window.len());
        let SeqKv::Host(cache) = &mut self.kv else {
            return Err(Error::Internal {
                what: "a CPU forward of a sequence whose cache is on the device",
            });
        };
        cache.reserve(b, len + n)?;
        self.pending = None;
        Ok(cache.dtype())
    }
}

/// The CPU forward of prepared sequences whose caches hold `T`.
fn many_on<T: KvElem>(
    w: &TransformerWeights,
    seqs: &mut [(&mut DiffusionTransformer, &Ask)],
) -> Result<Vec<Answer>> {
    let mut parts = Vec::with_capacity(seqs.len());
    let mut pendings = Vec::with_capacity(seqs.len());
    for (s, a) in seqs.iter_mut() {
        let SeqKv::Host(cache) = &mut s.kv else {
            return Err(Error::Internal {
                what: "a CPU forward of a sequence whose cache is on the device",
            });
        };
        let len = cache.len();
        let (cached, free) = cache.split::<T>().ok_or(Error::Internal {
            what: "the KV cache's buffers are not of the dtype it stores",
        })?;
        let (part, pending) = w.window_part(
            cached,
            free,
            len,
            a.canvas.clone(),
            a.window.clone(),
            Rows::Positions(&a.rows),
            (&a.verify, &a.verify_hidden),
        )?;
        parts.push(part);
        pendings.push(pending);
    }
    let outs = w.run_parts(&mut parts)?;
    drop(parts);
    for ((s, _), p) in seqs.iter_mut().zip(pendings) {
        s.pending = Some(p);
    }
    Ok(outs
        .into_iter()
        .map(|(logits, verify_logits)| Answer {
            logits,
            verify_logits,
        })
        .collect())
}
