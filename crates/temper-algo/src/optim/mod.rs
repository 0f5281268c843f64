//! AdamW and gradient-norm clipping, each equal to PyTorch's: the one optimizer of the trainer,
//! the Tinker training models and the benchmarks (the learning-rate schedules, which read the
//! trainer's config, are in temper-train).
mod adamw;
mod clip;

pub use adamw::AdamW;
pub use clip::{clip_grad_norm, zero_grad};
