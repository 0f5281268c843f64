//! The learning-rate schedules (verl's), from the trainer's `optim` config. The optimizer itself
//! (AdamW, gradient clipping) is [`temper_algo::optim`].
mod schedule;

pub use schedule::{LrSchedule, ScheduleKind};
