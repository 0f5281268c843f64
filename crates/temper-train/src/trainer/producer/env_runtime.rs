//! What a run with `env.name` set holds besides the trainer: the environment (built by name from
//! temper-env's registry), and the data set of its questions (so data order, epochs and resume
//! work as for any data set).
use crate::config::Config;
use crate::data::{read_records, Dataset, Example, Prompt};
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::path::Path;
use temper_env::{EnvSettings, Environment};
use temper_model::{ComputeKind, Tokenizer};
use temper_rollout::SamplingParams;

pub(crate) struct EnvRuntime {
    /// Built by name from temper-env's registry; the trainer runs it through its interface.
    pub env: Box<dyn Environment>,
    /// `env.skip_zero_advantage`: a step whose advantages are all zero is skipped, not an error.
    pub skip_zero_advantage: bool,
    /// `rollout.async_steps >= 1`: the next step's episodes, played during this step's update.
    pub ahead: Option<super::env_step::PlayedEpisodes>,
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
        // Its errors name the file (and the line or row).
        let recs = read_records(path)?;
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
        let Some(len) = task.question_count() else {
            bail!(
                "env: the {} task generates its questions without end; an environment needs a fixed set",
                task.name()
            );
        };
        if len < groups {
            bail!(
                "env: the {} task has {len} questions, fewer than data.train_batch_size = {groups} question groups per \
                 step",
                task.name(),
            );
        }
        // The questions as a data set: prompts for logs and evaluation, ids for the order.
        let examples = (0..len as u64)
            .map(|i| {
                let q = task.question(0, i);
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
        // One sample per turn; the turns end at EOS (rollout.stop is not applied to them).
        let params = SamplingParams {
            n: 1,
            stop: vec![],
            ..cfg.rollout.sampling_params(cfg.data.max_response_length)
        };
        let options = serde_json::to_value(e)?;
        let env = temper_env::build_environment(
            &e.name,
            EnvSettings {
                task,
                tokenizer,
                eos_ids: eos_ids.to_vec(),
                options: &options,
                params,
                device,
                compute,
            },
        )?;
        Ok((
            EnvRuntime {
                env,
                skip_zero_advantage: e.skip_zero_advantage,
                ahead: None,
            },
            dataset,
        ))
    }
}
