//! The environments' tasks (fixed sets of questions: qa, summary, sat), temper-reward's [`Task`]s:
//! what a single-turn episode answers and what a debate argues about (its R1 reward is the
//! task's [`temper_reward::Reward`]).
pub mod qa;
pub mod sat;
pub mod summary;
pub mod summary_rewards;

use anyhow::{bail, Result};
use serde_json::Value;

pub use temper_reward::{Question, RewardOutput, Task};

/// Builds a task: `rows` are the dataset's records (`None`: the task's built-in set, where it
/// has one); `opts` the `env.*` settings it reads.
pub type TaskBuilder = fn(Option<Vec<Value>>, &Value) -> Result<Box<dyn Task>>;

/// Every task, by name (`env.name` for one-turn runs, `env.task` for debates): the one list.
pub const TASKS: &[(&str, TaskBuilder)] = &[
    ("qa", |rows, o| Ok(Box::new(qa::Qa::new(rows, o)?))),
    ("summary", |rows, o| {
        Ok(Box::new(summary::Summary::new(rows, o)?))
    }),
    ("sat", |_, o| Ok(Box::new(sat::Sat::new(o)?))),
];

/// The names of [`TASKS`].
pub fn task_names() -> Vec<&'static str> {
    TASKS.iter().map(|(n, _)| *n).collect()
}

/// Build the task `name` (see [`TaskBuilder`]).
pub fn task_by_name(name: &str, rows: Option<Vec<Value>>, opts: &Value) -> Result<Box<dyn Task>> {
    match TASKS.iter().find(|(n, _)| *n == name) {
        Some((_, build)) => build(rows, opts),
        None => bail!("unknown task {name:?}; known: {}", task_names().join(", ")),
    }
}

/// A string option with a default; a wrong type is an error naming the key.
pub(crate) fn opt_str<'a>(opts: &'a Value, key: &str, default: &'a str) -> Result<&'a str> {
    match opts.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::String(s)) => Ok(s),
        Some(v) => bail!("env.{key} must be a string, got {v}"),
    }
}

/// A number option with a default.
pub(crate) fn opt_f64(opts: &Value, key: &str, default: f64) -> Result<f64> {
    match opts.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => v
            .as_f64()
            .filter(|x| x.is_finite())
            .ok_or_else(|| anyhow::anyhow!("env.{key} must be a number, got {v}")),
    }
}
