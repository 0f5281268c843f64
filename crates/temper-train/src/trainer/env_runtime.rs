//! What a run with `env.name` set holds besides the trainer: the task, the debate settings and
//! the judge model, and the data set of its questions (so data order, epochs and resume work
//! as for any data set).
use crate::config::Config;
use crate::data::{read_records, Dataset, Example, Prompt};
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::path::Path;
use temper_env::debate::judge::JudgeKind;
use temper_env::debate::{DebateConfig, DebateTemplates};
use temper_env::{ChatTurns, DebateTrain, Task};
use temper_model::{CausalLm, ComputeKind, Tokenizer};
use temper_rollout::SamplingParams;

pub(crate) struct EnvRuntime {
    pub task: Box<dyn Task>,
    /// Debate only.
    pub debate: Option<DebateRuntime>,
}

pub(crate) struct DebateRuntime {
    pub cfg: DebateConfig,
    pub turns: ChatTurns,
    pub train: DebateTrain,
    /// `env.judge = "model"`: the frozen judge.
    pub judge_model: Option<CausalLm>,
}

/// The `env.*` options a task reads, as JSON.
fn task_options(cfg: &Config) -> Value {
    let e = &cfg.env;
    let mut o = json!({
        "reward": e.reward,
        "problem_seed": e.problem_seed,
    });
    if let Some(i) = &e.instruction {
        o["instruction"] = i.clone().into();
    }
    if let Some(d) = e.difficulty {
        o["difficulty"] = d.into();
    }
    o
}

/// The records of `data.train_files` (all files, in order), or `None` when there are none.
fn records(cfg: &Config) -> Result<Option<Vec<Value>>> {
    if cfg.data.train_files.is_empty() {
        return Ok(None);
    }
    let mut rows = vec![];
    for f in &cfg.data.train_files {
        let path = Path::new(f);
        let recs = read_records(path).with_context(|| format!("reading {}", path.display()))?;
        rows.extend(recs.into_iter().map(|(_, v)| v));
    }
    Ok(Some(rows))
}

impl EnvRuntime {
    /// The environment of `cfg` and the data set of its questions.
    pub fn build(
        cfg: &Config,
        tokenizer: &Tokenizer,
        eos_ids: &[i64],
        device: tch::Device,
        compute: ComputeKind,
    ) -> Result<(Self, Dataset)> {
        let e = &cfg.env;
        let task = temper_env::task_by_name(e.task_name(), records(cfg)?, &task_options(cfg))
            .with_context(|| format!("env task {:?}", e.task_name()))?;
        let groups = cfg.data.train_batch_size;
        if task.len() < groups {
            bail!(
                "env: the {} task has {} questions, fewer than data.train_batch_size = {groups} question groups per \
                 step",
                task.name(),
                task.len()
            );
        }
        // The questions as a data set: prompts for logs and evaluation, ids for the order.
        let examples = (0..task.len())
            .map(|i| {
                let q = task.question(i);
                Example {
                    prompt: Prompt::Text(q.prompt),
                    answer: q.answer.unwrap_or_default(),
                    metadata: json!({"id": q.id}),
                }
            })
            .collect();
        let dataset = Dataset {
            name: format!("env/{}", task.name()),
            examples,
        };
        let debate = if e.is_debate() {
            let turns = ChatTurns::from_template(tokenizer).context("env.name = \"debate\"")?;
            let judge = JudgeKind::parse(&e.judge)?;
            let judge_model = match (&judge, &e.judge_model) {
                (JudgeKind::Model, Some(path)) => {
                    let dir = temper_model::resolve::resolve_model(path)
                        .with_context(|| format!("env.judge_model = {path:?}"))?;
                    let m = CausalLm::load(&dir, device, compute)
                        .with_context(|| format!("loading the judge {}", dir.display()))?;
                    if (m.config().vocab_size as usize) < tokenizer.vocab_size() {
                        bail!(
                            "env.judge_model {}: its vocabulary ({}) does not cover the policy's tokenizer ({})",
                            dir.display(),
                            m.config().vocab_size,
                            tokenizer.vocab_size()
                        );
                    }
                    Some(m)
                }
                _ => None,
            };
            let d = DebateTemplates::default();
            let or = |s: &str, default: String| if s.is_empty() { default } else { s.to_string() };
            let templates = DebateTemplates {
                r1: or(&e.r1_instruction, d.r1),
                r2_before: or(&e.r2_before, d.r2_before),
                r2_after: or(&e.r2_after, d.r2_after),
                r3_before: or(&e.r3_before, d.r3_before),
                r3_after: or(&e.r3_after, d.r3_after),
            };
            let r = &cfg.rollout;
            let params = SamplingParams {
                n: 1,
                temperature: r.temperature,
                top_p: r.top_p,
                top_k: r.top_k,
                max_tokens: cfg.data.max_response_length,
                min_tokens: r.min_tokens,
                ..SamplingParams::default()
            };
            let judge_params = SamplingParams {
                n: 1,
                temperature: e.judge_temperature,
                max_tokens: e.judge_max_tokens,
                ..SamplingParams::default()
            };
            Some(DebateRuntime {
                cfg: DebateConfig {
                    judge,
                    params,
                    judge_params,
                    templates,
                    eos_ids: eos_ids.to_vec(),
                },
                turns,
                train: DebateTrain::parse(&e.debate_train, e.grpo_std, e.r23_constant)?,
                judge_model,
            })
        } else {
            None
        };
        Ok((EnvRuntime { task, debate }, dataset))
    }
}
