//! AdamW, gradient-norm clipping and the learning-rate schedule, each equal to PyTorch's / verl's.
mod adamw;
mod clip;
mod schedule;

pub use adamw::AdamW;
pub use clip::{clip_grad_norm, zero_grad};
pub use schedule::{LrSchedule, ScheduleKind};
