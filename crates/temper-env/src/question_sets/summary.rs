//! `summary`: summarise an article; scored by a summary reward (`env.reward`, default
//! `compression`). Articles come from records with an `article` field (CNN/DailyMail's layout:
//! JSONL or Parquet, read by the trainer's data loader). The summary is the response with
//! surrounding whitespace removed: exactly the text the reward sees, and what is logged.
use super::summary_rewards::SummaryReward;
use super::{opt_str, Question, RewardOutput, Task};
use anyhow::{bail, Result};
use serde_json::{json, Value};
use temper_reward::Reward;

pub const DEFAULT_INSTRUCTION: &str =
    "Summarize the following article in a few sentences. Reply with the summary only.";

pub struct Summary {
    articles: Vec<String>,
    instruction: String,
    reward: SummaryReward,
}

impl Summary {
    pub fn new(rows: Option<Vec<Value>>, opts: &Value) -> Result<Self> {
        let Some(rows) = rows else {
            bail!("the summary task needs articles: set data.train_files to JSONL/Parquet records with an \"article\" field");
        };
        let key = opt_str(opts, "article_key", "article")?;
        let mut articles = vec![];
        for (i, r) in rows.iter().enumerate() {
            match r.get(key) {
                Some(Value::String(s)) if !s.trim().is_empty() => articles.push(s.clone()),
                Some(Value::String(_)) => {
                    bail!("record {} field {key:?}: the article is empty", i + 1)
                }
                Some(v) => bail!("record {} field {key:?}: expected a string, got {v}", i + 1),
                None => bail!("record {} has no field {key:?}", i + 1),
            }
        }
        if articles.is_empty() {
            bail!("the summary task has no articles");
        }
        Ok(Summary {
            articles,
            instruction: opt_str(opts, "instruction", DEFAULT_INSTRUCTION)?.to_string(),
            reward: SummaryReward::parse(opt_str(opts, "reward", "compression")?)?,
        })
    }
}

impl Task for Summary {
    fn question_count(&self) -> Option<usize> {
        Some(self.articles.len())
    }
    fn question(&self, _seed: u64, i: u64) -> Question {
        let k = i as usize % self.articles.len();
        let article = &self.articles[k];
        Question {
            id: format!("summary-{k}"),
            prompt: format!("{}\n\n{article}", self.instruction),
            answer: None,
            metadata: json!({ "article": article }),
        }
    }
}

/// The summary reward (`env.reward`) of the trimmed response against the question's article
/// (`metadata.article`).
impl Reward for Summary {
    fn name(&self) -> &str {
        "summary"
    }
    fn score(&self, _prompt: &str, response: &str, _answer: &str, meta: &Value) -> RewardOutput {
        let summary = response.trim();
        let article = meta["article"].as_str().unwrap_or("");
        let (reward, metrics) = self.reward.score(summary, article);
        RewardOutput {
            reward,
            metrics,
            extracted: Some(summary.to_string()),
            ..RewardOutput::default()
        }
    }
}
