//! Training the project's small models: LLaDA's SFT objective, AdamW with a warmup + cosine
//! schedule and gradient clipping, and the batching of suite examples into fixed-length rows.
//!
//! The model being trained is the very `DiffusionTransformer` used for inference, built with
//! differentiable ops (`OpMode::Differentiable`) over a `candle_nn::VarMap`, so the shipped
//! checkpoint is guaranteed to load and run the same computation in the inference path.

pub mod batch;
pub mod model;
pub mod objective;
pub mod optim;

pub use batch::{Batch, Batcher};
pub use model::{
    inference_copy, init_from, init_varmap, named_vars, suite_config, trainable, ModelShape,
    WarmStart, SUITE_MAX_SEQ_LEN,
};
pub use objective::{mask_row, sft_loss, sft_loss_with, BlockMasking, SftLoss, MASK_EPS};
pub use optim::{lr_at, AdamW, AdamWConfig};
