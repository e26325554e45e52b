//! The decision oracle (`eval --oracle-decisions`): how few forwards a decoder could take with a
//! model if it knew which of the model's predictions are right.
//!
//! [`OracleDecisions`] wraps a model for one question. Its answers keep every logits row's
//! prediction (the argmax) but make it certain when it already equals the reference answer's
//! token at that position and nearly uniform otherwise: a confidence rule then decides, in each
//! forward, exactly the positions the model already predicts right (and, when it predicts none of
//! them right, the most confident wrong one, as its fallback). The forwards it takes bound what
//! any decision rule on this model's predictions could reach; the gap to a real rule is what the
//! model's confidence cannot tell apart (`examples/bench/defaults.md`, *The forwards frontier*).
//!
//! Only the decision rows change: verification (shadow) rows, the cache and the K/V are the
//! model's own.

use std::ops::Range;

use candle_core::{Device, Tensor};
use dllm_models::{Answer, Ask, DiffusionLm, ModelInfo, Refresh, Rows, SequenceToken};

/// Logit margin that makes a right prediction certain (its probability is then 1 - e^-50 or
/// more of the row's mass).
const CERTAIN: f32 = 50.0;

/// A model whose answers reveal which predictions are right (see the module docs).
pub struct OracleDecisions<'m, 'r> {
    model: &'m mut dyn DiffusionLm,
    /// The reference answer's token of each generated position (`reference[i]` for canvas
    /// position `prompt_len + i`), padded with EOS to the generated length.
    reference: &'r [u32],
    prompt_len: usize,
}

impl<'m, 'r> OracleDecisions<'m, 'r> {
    /// Wrap `model` for one question: `reference` as [`crate::eval::reference_ids`] builds it, for
    /// a prompt of `prompt_len` tokens.
    pub fn new(model: &'m mut dyn DiffusionLm, reference: &'r [u32], prompt_len: usize) -> Self {
        Self {
            model,
            reference,
            prompt_len,
        }
    }

    /// The reference token at canvas position `pos` (none inside the prompt or past the answer).
    fn reference_at(&self, pos: usize) -> Option<u32> {
        pos.checked_sub(self.prompt_len)
            .and_then(|i| self.reference.get(i).copied())
    }

    /// `logits` (`(batch, rows, vocab)`, row `k` predicting canvas position `rows[k]`) with every
    /// row's argmax made certain where it is the reference token, nearly uniform elsewhere.
    fn reveal(&self, logits: &Tensor, rows: &[usize]) -> candle_core::Result<Tensor> {
        if rows.is_empty() {
            // A forward that only verifies or fills the cache: no decision rows.
            return Ok(logits.clone());
        }
        let mut items = logits.to_dtype(candle_core::DType::F32)?.to_vec3::<f32>()?;
        for item in &mut items {
            if item.len() != rows.len() {
                candle_core::bail!(
                    "the answer holds {} logits rows for the ask's {} positions",
                    item.len(),
                    rows.len()
                );
            }
            for (row, &pos) in item.iter_mut().zip(rows) {
                reveal_row(row, self.reference_at(pos));
            }
        }
        let flat: Vec<f32> = items.into_iter().flatten().flatten().collect();
        Tensor::from_vec(flat, logits.dims(), logits.device())
    }
}

/// One row: certain when its argmax is `right`, else only the argmax a little above a flat row.
fn reveal_row(row: &mut [f32], right: Option<u32>) {
    let Some((argmax, &top)) = row
        .iter()
        .enumerate()
        .filter(|(_, x)| !x.is_nan())
        .max_by(|a, b| a.1.total_cmp(b.1))
    else {
        return;
    };
    if right == Some(argmax as u32) {
        row[argmax] = top + CERTAIN;
    } else {
        row.iter_mut().for_each(|x| *x = 0.0);
        row[argmax] = 1.0;
    }
}

impl DiffusionLm for OracleDecisions<'_, '_> {
    fn token(&self) -> SequenceToken {
        self.model.token()
    }
    fn info(&self) -> &ModelInfo {
        self.model.info()
    }
    fn device(&self) -> &Device {
        self.model.device()
    }
    fn forward(
        &mut self,
        canvas: &Tensor,
        window: Range<usize>,
        rows: Rows<'_>,
    ) -> dllm_models::Result<Tensor> {
        self.model.forward(canvas, window, rows)
    }
    fn commit(&mut self, range: Range<usize>) -> dllm_models::Result<()> {
        self.model.commit(range)
    }
    fn cache_len(&self) -> usize {
        self.model.cache_len()
    }
    fn truncate_cache(&mut self, len: usize) -> dllm_models::Result<()> {
        self.model.truncate_cache(len)
    }
    fn compute_refresh(
        &self,
        canvas: &Tensor,
        positions: &[usize],
        logits: Option<&[usize]>,
    ) -> dllm_models::Result<Refresh> {
        self.model.compute_refresh(canvas, positions, logits)
    }
    fn apply_refresh(&mut self, refresh: &Refresh) -> dllm_models::Result<()> {
        self.model.apply_refresh(refresh)
    }
    fn answer(&mut self, ask: &Ask) -> dllm_models::Result<Answer> {
        let mut a = self.model.answer(ask)?;
        a.logits = self.reveal(&a.logits, &ask.rows)?;
        Ok(a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_right_prediction_becomes_certain_and_a_wrong_one_flat_with_the_same_argmax() {
        let mut right = vec![0.1, 2.0, 1.9, -3.0];
        reveal_row(&mut right, Some(1));
        assert_eq!(right, vec![0.1, 52.0, 1.9, -3.0]);
        let mut wrong = vec![0.1, 2.0, 1.9, -3.0];
        reveal_row(&mut wrong, Some(2));
        assert_eq!(wrong, vec![0.0, 1.0, 0.0, 0.0]);
        let mut prompt = vec![0.1, 2.0];
        reveal_row(&mut prompt, None);
        assert_eq!(prompt, vec![0.0, 1.0]);
    }
}
