//! Prompts and answers: JSONL / Parquet files or a procedural task, field mapping, prompt
//! templates, and the seeded epoch order.
mod files;
mod order;
mod template;

pub use files::{load_file, read_records};
pub use order::DataOrder;
pub use template::{PromptTemplate, R1_ZERO_TEMPLATE};

use crate::config::DataConfig;
use anyhow::{bail, Context, Result};
use serde_json::Value;

/// The prompt as found in the data: plain text, or chat messages (verl's `prompt` column).
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    Text(String),
    Messages(Vec<(String, String)>),
}

impl Prompt {
    /// The text of the last user message (or the text), for logs and rewards.
    pub fn text(&self) -> &str {
        match self {
            Prompt::Text(t) => t,
            Prompt::Messages(m) => m
                .iter()
                .rev()
                .find(|(r, _)| r == "user")
                .map_or("", |(_, c)| c.as_str()),
        }
    }
}

/// One example: prompt, ground truth for the reward, and task data the verifier needs.
#[derive(Debug, Clone, PartialEq)]
pub struct Example {
    pub prompt: Prompt,
    pub answer: String,
    pub metadata: Value,
}

/// A named list of examples (never empty).
#[derive(Debug, Clone)]
pub struct Dataset {
    pub name: String,
    pub examples: Vec<Example>,
}

impl Dataset {
    pub fn len(&self) -> usize {
        self.examples.len()
    }
    pub fn is_empty(&self) -> bool {
        self.examples.is_empty()
    }
}

/// Seed of the validation stream of a task, distinct from the training stream.
const VAL_SEED_SALT: u64 = 0x7661_6c5f_7365_6564;

/// The training set (`train = true`) or the held-out set described by `cfg`. A task dataset
/// draws `task_train_size` / `task_val_size` examples from disjoint seed streams. Files without
/// `val_files` give no held-out set (`Ok(None)`).
pub fn load_dataset(cfg: &DataConfig, seed: u64, train: bool) -> Result<Option<Dataset>> {
    if let Some(task_name) = &cfg.task {
        let opts = serde_json::to_value(&cfg.task_args).context("data.task_args")?;
        let task = temper_reward::procedural_task(task_name, &opts).context("data.task")?;
        let (n, s) = if train {
            (cfg.task_train_size, seed)
        } else {
            (cfg.task_val_size, seed ^ VAL_SEED_SALT)
        };
        if n == 0 {
            if train {
                bail!("data.task_train_size = 0: empty dataset");
            }
            return Ok(None);
        }
        let examples = (0..n as u64)
            .map(|i| {
                let q = task.question(s, i);
                Example {
                    prompt: Prompt::Text(q.prompt),
                    answer: q.answer.unwrap_or_default(),
                    metadata: q.metadata,
                }
            })
            .collect();
        let name = format!("{task_name}/{}", if train { "train" } else { "val" });
        return Ok(Some(Dataset { name, examples }));
    }
    let files = if train {
        &cfg.train_files
    } else {
        &cfg.val_files
    };
    if files.is_empty() {
        if train {
            bail!("data.train_files is empty and data.task is not set");
        }
        return Ok(None);
    }
    let mut examples = Vec::new();
    for f in files {
        examples.extend(load_file(std::path::Path::new(f), cfg)?);
    }
    if examples.is_empty() {
        bail!("{}: no examples (empty dataset)", files.join(", "));
    }
    Ok(Some(Dataset {
        name: files.join(","),
        examples,
    }))
}
