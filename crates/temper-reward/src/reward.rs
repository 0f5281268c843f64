//! The [`Reward`] trait the trainer calls, and the registry that builds a reward from its name
//! and options in the config.
use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::collections::BTreeMap;

/// A scalar reward plus named metrics (logged as `reward/<name>` by the trainer).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RewardOutput {
    pub reward: f64,
    pub metrics: BTreeMap<String, f64>,
    /// Why the response could not be scored (`timeout`, `too_deep`, `unbalanced`, a failed
    /// command): the reward is 0 and the trainer counts it in `reward/errors`. A wrong answer
    /// is not an error.
    pub error: Option<String>,
    /// The response had no answer in the task's format (an environment counts it in
    /// `env/parse_failures`; the reward is 0 or the task's penalty). A wrong answer is not one.
    pub parse_failed: bool,
    /// What the reward read out of the response (the `<SOLUTION>` content, the summary), for the
    /// logs.
    pub extracted: Option<String>,
}

impl RewardOutput {
    pub fn new(reward: f64) -> Self {
        RewardOutput {
            reward,
            ..RewardOutput::default()
        }
    }

    /// Reward 0 because the response could not be scored, for `reason`.
    pub fn failed(reason: impl Into<String>) -> Self {
        RewardOutput {
            error: Some(reason.into()),
            ..RewardOutput::new(0.0)
        }
    }

    pub fn with(mut self, key: &str, value: f64) -> Self {
        self.metrics.insert(key.to_string(), value);
        self
    }
}

/// A reward function: temper's one interface for scoring a response, whatever scores it (the
/// math grader, a command, a task's verifier, an environment task's rule). `score` is called
/// from several threads at once.
pub trait Reward: Send + Sync {
    fn name(&self) -> &str;
    fn score(
        &self,
        prompt: &str,
        completion: &str,
        ground_truth: &str,
        metadata: &Value,
    ) -> RewardOutput;
}

/// Builds a reward from its config name and options.
pub type RewardBuilder = fn(&str, &Value) -> Result<Box<dyn Reward>>;

/// The rewards by name, besides the procedural tasks' verifiers (every task of
/// [`crate::tasks::PROCEDURAL_TASKS`] is also a reward of its name).
pub const REWARDS: &[(&str, RewardBuilder)] = &[
    ("r1_zero", |_, o| {
        Ok(Box::new(crate::math_reward::R1Zero::from_opts(o)?))
    }),
    ("math", |n, o| {
        Ok(Box::new(crate::math_reward::AnswerReward::from_opts(n, o)?))
    }),
    ("gsm8k", |n, o| {
        Ok(Box::new(crate::math_reward::AnswerReward::from_opts(n, o)?))
    }),
    ("command", |_, o| {
        Ok(Box::new(
            crate::command::CommandReward::from_opts(o).context("reward \"command\"")?,
        ))
    }),
];

/// Every name [`reward_by_name`] accepts.
pub fn reward_names() -> Vec<&'static str> {
    let tasks = crate::tasks::PROCEDURAL_TASKS.iter().map(|(n, _)| *n);
    REWARDS.iter().map(|(n, _)| *n).chain(tasks).collect()
}

/// Build a reward from its config name and options (a JSON object, or null for defaults).
///
/// Options: `r1_zero`, `math`, `gsm8k`: `timeout_s` (per comparison, default 1) and math-verify's
/// options under its names and defaults (`strict` = true, `allow_set_relation_comp` = false,
/// `float_rounding` = 6, `numeric_precision` = 15, `extraction_config` = `["latex", "expr"]`;
/// see [`crate::GraderOptions`]). `math`/`gsm8k`: `extraction` = `"last_number"` (default) or
/// `"strict"` (LaTeX only). Task verifiers (`arith`,
/// `countdown`, `chain_sum`): the task's own options (see [`crate::tasks`]). `command`: `cmd`
/// (argv array, required), `timeout_s` (default 10).
pub fn reward_by_name(name: &str, opts: &Value) -> Result<Box<dyn Reward>> {
    let opts = if opts.is_null() {
        &Value::Object(Default::default())
    } else {
        opts
    };
    if !opts.is_object() {
        bail!("reward {name:?}: options must be a JSON object, got {opts}");
    }
    if let Some((_, build)) = REWARDS.iter().find(|(n, _)| *n == name) {
        return build(name, opts);
    }
    if crate::tasks::PROCEDURAL_TASKS
        .iter()
        .any(|(n, _)| *n == name)
    {
        // A task is its own reward.
        let task: Box<dyn Reward> = crate::tasks::procedural_task(name, opts)?;
        return Ok(task);
    }
    bail!(
        "unknown reward {name:?}; known rewards: {}",
        reward_names().join(", ")
    )
}

/// Read an optional positive number of seconds from the options.
pub(crate) fn opt_seconds(opts: &Value, key: &str, default: f64) -> Result<std::time::Duration> {
    let v = match opts.get(key) {
        None | Some(Value::Null) => default,
        Some(v) => v
            .as_f64()
            .with_context(|| format!("option {key:?} must be a number of seconds, got {v}"))?,
    };
    if !(v > 0.0 && v.is_finite()) {
        bail!("option {key:?} must be positive, got {v}");
    }
    Ok(std::time::Duration::from_secs_f64(v))
}

/// Read an optional string option.
pub(crate) fn opt_str<'a>(opts: &'a Value, key: &str, default: &'a str) -> Result<&'a str> {
    match opts.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::String(s)) => Ok(s),
        Some(v) => bail!("option {key:?} must be a string, got {v}"),
    }
}

/// Read an optional unsigned integer option.
pub(crate) fn opt_u64(opts: &Value, key: &str, default: u64) -> Result<u64> {
    match opts.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => v
            .as_u64()
            .with_context(|| format!("option {key:?} must be a non-negative integer, got {v}")),
    }
}
