//! temper-train: the GRPO loop, optimizer, schedules, eval, checkpoints/resume, metrics and the
//! run directory.
pub mod checkpoint;
pub mod config;
pub mod data;
pub mod dist;
pub mod eval_metrics;
pub mod loggers;
pub mod optim;
pub mod pyworker;
pub mod report;
pub mod rundir;
pub mod trainer;
