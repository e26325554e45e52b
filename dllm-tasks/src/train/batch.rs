//! Fixed-length SFT rows, bucketed by prompt length so a batch needs no padding inside the prompt
//! and every row's response region is exactly `gen_len` long — the shape of an inference canvas.

use std::collections::BTreeMap;

use tokenizers::Tokenizer;

use crate::tasks::{Example, TrainStream};
use crate::tokenizer::sft_row;
use crate::Result;

/// Rows of one prompt length.
#[derive(Debug, Clone)]
pub struct Batch {
    /// `prompt ++ response ++ EOS...`, all `prompt_len + gen_len` long.
    pub rows: Vec<Vec<u32>>,
    /// Where responses start (the same for every row).
    pub prompt_len: usize,
}

/// Draws examples from the train stream and emits a batch whenever one prompt-length bucket fills.
pub struct Batcher {
    stream: TrainStream,
    buckets: BTreeMap<usize, Vec<Vec<u32>>>,
    batch_size: usize,
    gen_len: usize,
}

impl Batcher {
    /// Batches of `batch_size` rows with `gen_len`-token response regions.
    pub fn new(stream: TrainStream, batch_size: usize, gen_len: usize) -> Self {
        Self {
            stream,
            buckets: BTreeMap::new(),
            batch_size,
            gen_len,
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
            let (row, pl) = sft_row(tok, &ex.prompt, &ex.response, self.gen_len)?;
            let bucket = self.buckets.entry(pl).or_default();
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
