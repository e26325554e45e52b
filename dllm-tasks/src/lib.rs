//! The synthetic task suite that llada-rs trains and evaluates its tiny masked-diffusion
//! models on, its tokenizer, and answer checking.
//!
//! No real checkpoint can be downloaded where this project runs, so instead of the LLaDA
//! paper's benchmarks the project ships a small model trained on four generated tasks, each
//! standing in for one of the paper's evaluation sets and each exactly checkable:
//!
//! | task ([`TaskKind`]) | paper set | example prompt → response |
//! |---|---|---|
//! | `math` | GSM8K | `Tom has 23 apples. He buys 5 more. How many apples does Tom have now?` → `23 + 5 = 28. Answer: 28` |
//! | `yesno` | BoolQ | `The cat is big. The dog is slow. Is the dog fast?` → `The dog is slow. Answer: no` |
//! | `choice` | ARC-C | `Which of these is a metal? A. hammer B. gold C. Mars D. circle` → `A: tool B: metal C: planet D: shape. Answer: B` |
//! | `completion` | HellaSwag | `It started to rain, so Anna opened her` → `umbrella. Answer: umbrella` |
//!
//! Responses are a short rationale that restates the relevant fact or classifies the options, then
//! `Answer: X`: tiny models learn to copy far faster than to produce a bare answer, and the
//! final answer depends on the rationale, so decoding order matters. [`check`] scores a
//! response both exactly and on the final answer alone.
//!
//! # Data
//! - [`generate`] draws one example of a task from the crate's own PRNG ([`rng::Rng`]), so
//!   the suite never changes with a dependency's version.
//! - [`test_set`] is the held-out set: [`TEST_SET_SIZE`] unique prompts per task from fixed
//!   seeds; [`train_stream`] mixes the four tasks uniformly and never yields a held-out
//!   prompt.
//!
//! # Format
//! A model sees `<bos> prompt <sep> response <eos> <eos> ...` (the response padded with EOS
//! to the generation length, as in LLaDA's SFT). The tokenizer's post-processor makes
//! `encode(prompt, true)` produce exactly the `<bos> prompt <sep>` block, so a raw question
//! is a valid prompt with no chat template. See [`tokenizer`].

#![warn(missing_docs)]

pub mod error;
pub mod eval;
pub mod export;
pub mod first_wrong;
pub mod long_tokenizer;
pub mod oracle;
pub mod probe;
pub mod sets;
pub mod tasks;
pub mod tokenizer;
pub mod train;

/// The project's PRNG (defined in `dllm-decode`, which samples with it too).
pub use dllm_decode::rng;

pub use error::{Error, Result};
pub use rng::Rng;
pub use tasks::long::{check_steps, StepScore};
pub use tasks::{
    check, extract_answer, generate, held_out_prompts, is_held_out, normalize_whitespace,
    suite_train_stream, test_set, test_suite, train_stream, Example, Suite, TaskKind, TrainStream,
    Verdict, ANSWER_MARKER, TEST_SET_SIZE,
};
pub use tokenizer::{
    build_long_suite_tokenizer, build_suite_tokenizer, build_tokenizer, encode_prompt,
    encode_response, suite_of, train_tokenizer, BOS_ID, EOS_ID, LONG_GEN_LENGTH,
    LONG_MAX_PROMPT_TOKENS, LONG_MAX_RESPONSE_TOKENS, MASK_ID, MAX_PROMPT_TOKENS,
    MAX_RESPONSE_TOKENS, PAD_ID, SEP_ID, UNK_ID,
};
