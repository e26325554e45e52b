//! Fixed-length SFT rows, bucketed by prompt length so a batch needs no padding inside the prompt
//! and every row's response region is exactly `gen_len` long — the shape of an inference canvas.

use std::collections::BTreeMap;

use tokenizers::Tokenizer;

use crate::tasks::{Example, TrainStream};
use crate::tokenizer::{encode_response, sft_row};
use crate::{Error, Result};

/// Rows of one prompt length and one response-region length.
#[derive(Debug, Clone)]
pub struct Batch {
    /// `prompt ++ response ++ EOS...`, all `prompt_len + gen_len` long.
    pub rows: Vec<Vec<u32>>,
    /// Where responses start (the same for every row).
    pub prompt_len: usize,
}

/// Draws examples from the train stream and emits a batch whenever one bucket (prompt length,
/// response-region length) fills.
pub struct Batcher {
    stream: TrainStream,
    buckets: BTreeMap<(usize, usize), Vec<Vec<u32>>>,
    batch_size: usize,
    /// Allowed response-region lengths, ascending; a row gets the shortest its answer fits.
    gen_lens: Vec<usize>,
}

impl Batcher {
    /// Batches of `batch_size` rows with `gen_len`-token response regions.
    pub fn new(stream: TrainStream, batch_size: usize, gen_len: usize) -> Self {
        Self::with_gen_lens(stream, batch_size, vec![gen_len])
    }

    /// Batches whose rows have the shortest response region of `gen_lens` that holds the
    /// answer and its EOS (e.g. `[64, 128]`: small training instances on cheap 64-position
    /// canvases, full ones on the 128 positions of inference).
    pub fn with_gen_lens(stream: TrainStream, batch_size: usize, mut gen_lens: Vec<usize>) -> Self {
        gen_lens.sort_unstable();
        gen_lens.dedup();
        Self {
            stream,
            buckets: BTreeMap::new(),
            batch_size,
            gen_lens,
        }
    }

    /// The stream's generator state (for resuming; rows waiting in partial buckets are dropped).
    pub fn stream_state(&self) -> [u64; 4] {
        self.stream.rng_state()
    }

    /// The next full batch.
    pub fn next_batch(&mut self, tok: &Tokenizer) -> Result<Batch> {
        loop {
            let ex: Example = self.stream.next().expect("the train stream is infinite");
            let gen_len = match self.gen_lens.as_slice() {
                [only] => *only,
                lens => {
                    let need = encode_response(tok, &ex.response)?.len() + 1;
                    *lens.iter().find(|&&g| g >= need).ok_or(Error::TooLong {
                        what: "response + EOS",
                        len: need,
                        max: lens.last().copied().unwrap_or(0),
                    })?
                }
            };
            let (row, pl) = sft_row(tok, &ex.prompt, &ex.response, gen_len)?;
            let bucket = self.buckets.entry((pl, gen_len)).or_default();
            bucket.push(row);
            if bucket.len() == self.batch_size {
                let rows = std::mem::take(bucket);
                return Ok(Batch {
                    rows,
                    prompt_len: pl,
                });
            }
        }
    }
}
