//! Environments by name (`env.name`): the registry the trainer builds its environment from, and
//! the one interface it runs every environment through, so that it names none of them. An
//! [`Environment`] holds a task's questions and makes, per question, an [`EnvRun`]: an
//! [`EnvGroup`] the batched driver advances, which when done gives the step its datums, rewards,
//! counts and log records ([`GroupOutcome`]). Every task of [`crate::TASKS`] is a one-turn
//! environment ([`crate::single_turn`]); `debate` is self-play debate about a task's questions
//! ([`crate::debate::env`]).

use std::collections::BTreeMap;

use anyhow::{bail, Result};
use serde_json::Value;
use temper_model::{CausalLm, ComputeKind, Tokenizer};
use temper_rollout::SamplingParams;

use crate::chat::Codec;
use crate::driver::EnvGroup;
use crate::question_sets::{Question, Task};
use crate::train_data::Datum;

/// What an environment's builder gets.
pub struct EnvSettings<'a> {
    /// The questions (`env.task` for a debate, the environment's own name otherwise).
    pub task: Box<dyn Task>,
    pub tokenizer: &'a Tokenizer,
    pub eos_ids: Vec<i64>,
    /// The `env.*` settings, as JSON under their config names.
    pub options: &'a Value,
    /// How the policy samples an answer (the run's `rollout.*`, `data.max_response_length`).
    pub params: SamplingParams,
    /// Where a frozen model the environment loads computes.
    pub device: tch::Device,
    pub compute: ComputeKind,
}

/// What one question's group needs from the step.
pub struct GroupContext<'a> {
    pub codec: &'a dyn Codec,
    /// The question's prompt ids as the run's template renders it (one-turn environments).
    pub prompt: Option<Vec<i64>>,
    /// The policy's sampling for this group (`n` answers, its seed).
    pub params: SamplingParams,
    /// The group's seed.
    pub seed: u64,
    /// Rollouts per question (`rollout.n`).
    pub n: usize,
}

/// What a finished group gives the step.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct GroupOutcome {
    pub datums: Vec<Datum>,
    /// The task rewards the step reports as `critic/score`.
    pub rewards: Vec<f64>,
    /// Answers whose format the task could not read (`env/parse_failures`).
    pub parse_failures: usize,
    /// Further step metrics, summed over groups (e.g. `env/debates`).
    pub counts: BTreeMap<String, f64>,
    /// Log records `(kind, record)`, written as `<kind>_<k>.json`.
    pub records: Vec<(String, Value)>,
}

/// One question's episodes as the driver advances them.
pub trait EnvRun: EnvGroup {
    /// Once the driver is done with the group; `step` numbers its records.
    fn outcome(&self, step: usize) -> GroupOutcome;
}

/// An environment the trainer runs.
pub trait Environment: Send {
    fn task(&self) -> &dyn Task;
    /// Whether the datums come with their advantages; `false`: the trainer's advantage estimator
    /// sets them, one group per question.
    fn sets_advantages(&self) -> bool;
    /// Whether the group of a question needs the question's prompt ids rendered by the run's
    /// template ([`GroupContext::prompt`]).
    fn needs_prompt(&self) -> bool;
    /// The group of question `q`.
    fn group<'a>(&'a self, q: Question, ctx: GroupContext<'a>) -> Result<Box<dyn EnvRun + 'a>>;
    /// The frozen model answering [`crate::Responder::Judge`] requests, if any.
    fn judge_model(&self) -> Option<&CausalLm> {
        None
    }
    /// A progress line after the driver's round `round` of `asks` requests, if any.
    fn round_line(&self, _round: usize, _asks: usize) -> Option<String> {
        None
    }
}

/// Builds an environment from its settings.
pub type EnvBuilder = fn(EnvSettings<'_>) -> Result<Box<dyn Environment>>;

/// How long a training datum of an environment is, for estimates made before anything runs
/// (the trainer's memory plan): one-turn environments' datums are a prompt and one answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DatumShape {
    /// Answers in one datum (a debater's: its own three and the opponent's two earlier ones).
    pub answers: u64,
    /// Further tokens in it (a debate's two round instructions, about 64 tokens each).
    pub extra_tokens: u64,
    /// Whether a question's datums share their prompt (a debater's prompt names its side).
    pub shared_prompt: bool,
}

impl DatumShape {
    pub const ONE_TURN: DatumShape = DatumShape {
        answers: 1,
        extra_tokens: 0,
        shared_prompt: true,
    };
}

/// A registered environment: its name, builder and datum shape.
pub struct EnvEntry {
    pub name: &'static str,
    pub build: EnvBuilder,
    pub datum: DatumShape,
}

/// The environments besides the one-turn tasks, by name.
pub const ENVIRONMENTS: &[EnvEntry] = &[EnvEntry {
    name: "debate",
    build: crate::debate::env::build,
    datum: DatumShape {
        answers: 5,
        extra_tokens: 2 * 64,
        shared_prompt: false,
    },
}];

/// The datum shape of environment `name` (one-turn for a task's name or an unknown one).
pub fn datum_shape(name: &str) -> DatumShape {
    ENVIRONMENTS
        .iter()
        .find(|e| e.name == name)
        .map_or(DatumShape::ONE_TURN, |e| e.datum)
}

/// Every `env.name`: the environments and the tasks.
pub fn environment_names() -> Vec<&'static str> {
    ENVIRONMENTS
        .iter()
        .map(|e| e.name)
        .chain(crate::question_sets::task_names())
        .collect()
}

/// Whether environment `name` asks its questions of another task (`env.task`), as debate does;
/// one-turn environments are their task.
pub fn takes_a_task(name: &str) -> bool {
    ENVIRONMENTS.iter().any(|e| e.name == name)
}

/// The environment `name` (a registered one, or a task run one turn).
pub fn build_environment(name: &str, settings: EnvSettings<'_>) -> Result<Box<dyn Environment>> {
    if let Some(e) = ENVIRONMENTS.iter().find(|e| e.name == name) {
        return (e.build)(settings);
    }
    if crate::question_sets::task_names().contains(&name) {
        return Ok(Box::new(crate::single_turn::OneTurnEnv {
            task: settings.task,
        }));
    }
    bail!(
        "env.name = {name:?}: expected one of {}",
        environment_names().join(", ")
    )
}
