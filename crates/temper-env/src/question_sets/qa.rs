//! `qa`: question/answer pairs; the response answers in `<SOLUTION>..</SOLUTION>`, graded by
//! exact match of the trimmed content. A response without the tags is a parse failure
//! (reward 0, counted).
use super::{opt_str, Question, RewardOutput, Task};
use anyhow::{bail, Result};
use serde_json::Value;
use temper_reward::Reward;

/// The built-in set: eight arithmetic questions (for smoke runs without a dataset).
pub const BUILTIN: [(&str, &str); 8] = [
    ("What is 7 + 5?", "12"),
    ("What is 9 * 3?", "27"),
    ("What is 15 - 8?", "7"),
    ("What is 36 / 4?", "9"),
    ("What is 6 * 7?", "42"),
    ("What is 23 + 19?", "42"),
    ("What is 100 - 37?", "63"),
    ("What is 8 * 8?", "64"),
];

pub const DEFAULT_INSTRUCTION: &str =
    "Answer the question. Put only your final answer between <SOLUTION> and </SOLUTION>.";

pub struct Qa {
    items: Vec<(String, String)>,
    instruction: String,
}

impl Qa {
    /// `rows`: records with `question` and `answer` fields (names set by `env.question_key` and
    /// `env.answer_key`); `None` for the built-in set.
    pub fn new(rows: Option<Vec<Value>>, opts: &Value) -> Result<Self> {
        let instruction = opt_str(opts, "instruction", DEFAULT_INSTRUCTION)?.to_string();
        let items = match rows {
            None => BUILTIN
                .iter()
                .map(|(q, a)| (q.to_string(), a.to_string()))
                .collect(),
            Some(rows) => {
                let qk = opt_str(opts, "question_key", "question")?;
                let ak = opt_str(opts, "answer_key", "answer")?;
                let mut items = vec![];
                for (i, r) in rows.iter().enumerate() {
                    let field = |k: &str| -> Result<String> {
                        match r.get(k) {
                            Some(Value::String(s)) if !s.trim().is_empty() => Ok(s.clone()),
                            Some(Value::Number(n)) => Ok(n.to_string()),
                            Some(v) => bail!(
                                "record {} field {k:?}: expected a non-empty string, got {v}",
                                i + 1
                            ),
                            None => bail!("record {} has no field {k:?}", i + 1),
                        }
                    };
                    items.push((field(qk)?, field(ak)?));
                }
                items
            }
        };
        if items.is_empty() {
            bail!("the qa task has no questions");
        }
        Ok(Qa { items, instruction })
    }
}

/// The content of the last `<SOLUTION>..</SOLUTION>` pair.
pub fn solution(text: &str) -> Option<&str> {
    let end = text.rfind("</SOLUTION>")?;
    let start = text[..end].rfind("<SOLUTION>")? + "<SOLUTION>".len();
    Some(text[start..end].trim())
}

impl Task for Qa {
    fn question_count(&self) -> Option<usize> {
        Some(self.items.len())
    }
    fn question(&self, _seed: u64, i: u64) -> Question {
        let i = i as usize % self.items.len();
        let (q, a) = &self.items[i];
        Question {
            id: format!("qa-{i}"),
            prompt: format!("{q}\n{}", self.instruction),
            answer: Some(a.clone()),
            metadata: Value::Null,
        }
    }
}

/// The answer in the last `<SOLUTION>` block, exactly the reference (trimmed): 1, else 0.
impl Reward for Qa {
    fn name(&self) -> &str {
        "qa"
    }
    fn score(&self, _prompt: &str, response: &str, answer: &str, _meta: &Value) -> RewardOutput {
        let Some(got) = solution(response) else {
            return RewardOutput {
                parse_failed: true,
                metrics: [("parse_failure".to_string(), 1.0)].into(),
                ..RewardOutput::default()
            };
        };
        let correct = answer.trim() == got;
        let r = if correct { 1.0 } else { 0.0 };
        RewardOutput {
            reward: r,
            metrics: [
                ("parse_failure".to_string(), 0.0),
                ("correct".to_string(), r),
            ]
            .into(),
            extracted: Some(got.to_string()),
            ..RewardOutput::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_match_inside_the_last_solution_tags() {
        let t = Qa::new(None, &Value::Null).unwrap();
        assert_eq!(t.question_count(), Some(8));
        let q = t.question(0, 0);
        assert!(q.prompt.starts_with("What is 7 + 5?"));
        assert_eq!(
            t.score_question(&q, "so <SOLUTION> 12 </SOLUTION>").reward,
            1.0
        );
        assert_eq!(
            t.score_question(&q, "<SOLUTION>11</SOLUTION><SOLUTION>12</SOLUTION>")
                .reward,
            1.0
        );
        assert_eq!(
            t.score_question(&q, "<SOLUTION>12.0</SOLUTION>").reward,
            0.0
        );
        let s = t.score_question(&q, "12");
        assert!(s.parse_failed && s.reward == 0.0);
        assert_eq!(s.metrics["parse_failure"], 1.0);
    }

    #[test]
    fn rows_need_both_fields() {
        let rows = vec![serde_json::json!({"question": "2+2?", "answer": 4})];
        let t = Qa::new(Some(rows), &Value::Null).unwrap();
        assert_eq!(t.question(0, 0).answer.as_deref(), Some("4"));
        let e = Qa::new(Some(vec![serde_json::json!({"q": "x"})]), &Value::Null)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("record 1 has no field \"question\""), "{e}");
    }
}
