//! temper-train: the GRPO loop, optimizer, schedules, eval, checkpoints/resume, metrics and the
//! run directory.
pub mod config;
pub mod optim;
