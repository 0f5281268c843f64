//! Procedural tasks generated from a seed (as grail does): each is a generator plus a verifier,
//! deterministic for `(seed, index)`, with difficulty knobs in its options.
mod arith;
mod chain_sum;
mod countdown;

pub use arith::Arith;
pub use chain_sum::ChainSum;
pub use countdown::Countdown;

use crate::extract::{answer_block, last_boxed, last_number};
use crate::grader::{extract_answer, Extraction, Grader};
use crate::reward::{opt_str, Reward, RewardOutput};
use anyhow::{bail, Result};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use serde_json::Value;

/// One question of a task: what a single-turn episode answers, what a debate argues about, a
/// row of a generated data set.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Question {
    /// Its id (the advantage group of its episodes), stable across runs.
    pub id: String,
    /// The user message.
    pub prompt: String,
    /// The reference answer, where the task has one.
    pub answer: Option<String>,
    /// What the reward needs besides the answer (a countdown's numbers, the text a summary is
    /// of); null when nothing.
    pub metadata: Value,
}

/// A task: where questions come from, and (as a [`Reward`]) how a response to one is scored.
/// temper's one task trait: the generated tasks here (`data.task`, also rewards by their names)
/// and temper-env's fixed sets (`env.task`: qa, summary, sat) implement it.
pub trait Task: Reward {
    /// How many questions a fixed set holds; `None` for a stream generated without end.
    fn question_count(&self) -> Option<usize>;
    /// Question `index` (of the stream for `seed` when generated; a fixed set ignores `seed`).
    /// The same inputs give the same question.
    fn question(&self, seed: u64, index: u64) -> Question;
    /// The reward of `response` to `q`: [`Reward::score`] on its prompt, answer and metadata.
    fn score_question(&self, q: &Question, response: &str) -> RewardOutput {
        let answer = q.answer.as_deref().unwrap_or("");
        self.score(&q.prompt, response, answer, &q.metadata)
    }
}

/// How a generated task is written: an example per `(seed, index)` and a verifier in [0, 1]. Every
/// such task is a [`Task`] and a [`Reward`] (ground truth: the example's answer; metadata: its
/// metadata; the metric `answer_reward`).
pub(crate) trait Generated: Send + Sync {
    fn name(&self) -> &str;
    /// The `index`-th example of the stream for `seed`.
    fn generate(&self, seed: u64, index: u64) -> TaskExample;
    /// Reward in [0, 1] for a completion, given the example's answer and metadata.
    fn verify(&self, completion: &str, answer: &str, metadata: &Value) -> f64;
}

/// One generated problem: the prompt text, its reference answer, and task data the verifier
/// needs (numbers, target, expression).
pub(crate) struct TaskExample {
    pub prompt: String,
    pub answer: String,
    pub metadata: Value,
}

impl<T: Generated> Reward for T {
    fn name(&self) -> &str {
        Generated::name(self)
    }

    fn score(&self, _prompt: &str, completion: &str, gt: &str, meta: &Value) -> RewardOutput {
        let r = self.verify(completion, gt, meta);
        RewardOutput::new(r).with("answer_reward", r)
    }
}

impl<T: Generated> Task for T {
    fn question_count(&self) -> Option<usize> {
        None
    }

    fn question(&self, seed: u64, index: u64) -> Question {
        let e = self.generate(seed, index);
        Question {
            id: format!("{}-{seed}-{index}", Generated::name(self)),
            prompt: e.prompt,
            answer: Some(e.answer),
            metadata: e.metadata,
        }
    }
}

/// Every procedural task, by name (`data.task`): the one list of names.
pub const PROCEDURAL_TASKS: &[(&str, TaskBuilder)] = &[
    ("arith", |o| Ok(Box::new(Arith::from_opts(o)?))),
    ("countdown", |o| Ok(Box::new(Countdown::from_opts(o)?))),
    ("chain_sum", |o| Ok(Box::new(ChainSum::from_opts(o)?))),
];

/// Builds a procedural task from its options.
pub type TaskBuilder = fn(&Value) -> Result<Box<dyn Task>>;

/// Build a task from its name and options (see each task's `from_opts` for the knobs).
pub fn procedural_task(name: &str, opts: &Value) -> Result<Box<dyn Task>> {
    let empty = Value::Object(Default::default());
    let opts = if opts.is_null() { &empty } else { opts };
    match PROCEDURAL_TASKS.iter().find(|(n, _)| *n == name) {
        Some((_, build)) => build(opts),
        None => bail!(
            "unknown task {name:?}; known tasks: {}",
            PROCEDURAL_TASKS
                .iter()
                .map(|(n, _)| *n)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// The random stream of one example: ChaCha8 seeded by `seed`, stream `index`.
pub(crate) fn example_rng(seed: u64, index: u64) -> ChaCha8Rng {
    let mut r = ChaCha8Rng::seed_from_u64(seed);
    r.set_stream(index);
    r
}

/// Where a numeric verifier reads the model's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AnswerMode {
    /// `<answer>` block, `\boxed{}`, "the answer is", the whole text, else the last number.
    Auto,
    /// The last number anywhere in the completion.
    LastNumber,
    /// Only `\boxed{}`.
    Boxed,
    /// Only the `<answer>...</answer>` block.
    AnswerTag,
}

impl AnswerMode {
    pub fn from_opts(opts: &Value) -> Result<Self> {
        Ok(match opt_str(opts, "answer_mode", "auto")? {
            "auto" => AnswerMode::Auto,
            "last_number" => AnswerMode::LastNumber,
            "boxed" => AnswerMode::Boxed,
            "answer_tag" => AnswerMode::AnswerTag,
            other => bail!(
                "option \"answer_mode\" must be auto, last_number, boxed or answer_tag, got {other:?}"
            ),
        })
    }

    /// The answer text a completion gives under this mode.
    pub fn extract(self, completion: &str) -> Option<String> {
        match self {
            AnswerMode::Auto => extract_answer(completion, Extraction::LastNumber),
            AnswerMode::LastNumber => last_number(completion),
            AnswerMode::Boxed => last_boxed(completion),
            AnswerMode::AnswerTag => {
                if !completion.contains("</answer>") {
                    return None;
                }
                answer_block(completion).map(|s| s.trim().to_string())
            }
        }
    }
}

/// 1.0 if the completion's answer (under `mode`) equals `answer` as a number or expression.
pub(crate) fn verify_number(mode: AnswerMode, completion: &str, answer: &str) -> f64 {
    match mode.extract(completion) {
        Some(a) if Grader::default().answers_match(answer, &a) => 1.0,
        _ => 0.0,
    }
}

/// Replace `{key}` placeholders in a prompt template.
pub(crate) fn fill(template: &str, pairs: &[(&str, String)]) -> String {
    let mut s = template.to_string();
    for (k, v) in pairs {
        s = s.replace(&format!("{{{k}}}"), v);
    }
    s
}

/// A uniformly random integer with exactly `digits` digits (0-9 for one digit).
pub(crate) fn random_operand(rng: &mut impl rand::Rng, digits: u32) -> i64 {
    if digits <= 1 {
        return rng.random_range(0..=9);
    }
    let lo = 10i64.pow(digits - 1);
    rng.random_range(lo..lo * 10)
}

/// Number of digits option, checked to a range where results fit in i64.
pub(crate) fn opt_digits(opts: &Value, key: &str, default: u64) -> Result<u32> {
    let d = crate::reward::opt_u64(opts, key, default)?;
    if !(1..=9).contains(&d) {
        bail!("option {key:?} must be between 1 and 9, got {d}");
    }
    Ok(d as u32)
}
