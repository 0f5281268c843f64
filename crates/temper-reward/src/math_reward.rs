//! Math rewards: `r1_zero` (format + answer, ALGORITHMS.md section 6) and the answer-only
//! `math` / `gsm8k` rewards.
use crate::extract::{answer_block, has_boxed, last_boxed};
use crate::grader::{
    braces_balanced, extract_answer, gold_answer, looks_like_answer, ranked_answer, Extraction,
    Grader, Unscored,
};
use crate::grader_options::GraderOptions;
use crate::reward::{opt_seconds, opt_str, Reward, RewardOutput};
use anyhow::{bail, Result};
use serde_json::Value;

/// Scores of the r1_zero reward.
#[derive(Clone, Debug, PartialEq)]
pub struct R1ZeroScore {
    pub format_reward: f64,
    pub answer_reward: f64,
    pub reward: f64,
    /// The answer taken from the response (None when the format is wrong or the box unbalanced).
    pub pred_answer: Option<String>,
    pub gold_answer: String,
    /// Why the answer could not be graded (it scores 0): a timeout, nesting, an unclosed box.
    pub error: Option<Unscored>,
}

/// r1_zero: format reward 1 iff the response has `</think> <answer>` and `</answer>`; the answer
/// is the text after the last `<answer>` (the last `\boxed{}` in it if there is one); answer
/// reward 1 iff it matches the ground truth; reward = answer reward.
pub fn r1_zero(grader: &Grader, response: &str, ground_truth: &str) -> R1ZeroScore {
    let gold = gold_answer(ground_truth);
    let zero = |format: f64, pred: Option<String>, gold: String, error| R1ZeroScore {
        format_reward: format,
        answer_reward: 0.0,
        reward: 0.0,
        pred_answer: pred,
        gold_answer: gold,
        error,
    };
    if !(response.contains("</think> <answer>") && response.contains("</answer>")) {
        return zero(0.0, None, gold, None);
    }
    let block = answer_block(response).unwrap_or_default();
    let pred = if has_boxed(&block) {
        match last_boxed(&block) {
            Some(b) => b,
            None => return zero(1.0, None, gold, Some(Unscored::Unbalanced)),
        }
    } else {
        block.trim().to_string()
    };
    let (mut correct, mut error) = grader.judge(&gold, &pred);
    let mut taken = pred.clone();
    // Prose inside the tags ("The answer is 5."): read the answer out of it.
    if !correct && error.is_none() && !looks_like_answer(&pred) {
        if let Some(inner) = extract_answer(&pred, Extraction::Strict) {
            (correct, error) = grader.judge(&gold, &inner);
            taken = inner;
        }
    }
    let a = if correct { 1.0 } else { 0.0 };
    R1ZeroScore {
        format_reward: 1.0,
        answer_reward: a,
        reward: a,
        pred_answer: Some(taken),
        gold_answer: gold,
        error,
    }
}

pub struct R1Zero {
    grader: Grader,
}

impl R1Zero {
    pub fn from_opts(opts: &Value) -> Result<Self> {
        Ok(R1Zero {
            grader: Grader {
                timeout: opt_seconds(opts, "timeout_s", 1.0)?,
                options: GraderOptions::from_json(opts)?,
            },
        })
    }
}

impl Reward for R1Zero {
    fn name(&self) -> &str {
        "r1_zero"
    }

    fn score(&self, _prompt: &str, completion: &str, gt: &str, _meta: &Value) -> RewardOutput {
        let s = r1_zero(&self.grader, completion, gt);
        let out = match s.error {
            Some(e) => RewardOutput::failed(e.as_str()),
            None => RewardOutput::new(s.reward),
        };
        out.with("format_reward", s.format_reward)
            .with("answer_reward", s.answer_reward)
    }
}

/// Answer-only reward (`math`, `gsm8k`): no format requirement; the answer is taken from
/// `\boxed{}`, `####`, "the answer is", the last math span, or the last number.
pub struct AnswerReward {
    name: String,
    grader: Grader,
    mode: Extraction,
}

impl AnswerReward {
    pub fn from_opts(name: &str, opts: &Value) -> Result<Self> {
        let mode = match opt_str(opts, "extraction", "last_number")? {
            "last_number" => Extraction::LastNumber,
            "strict" => Extraction::Strict,
            other => {
                bail!("option \"extraction\" must be \"last_number\" or \"strict\", got {other:?}")
            }
        };
        Ok(AnswerReward {
            name: name.to_string(),
            grader: Grader {
                timeout: opt_seconds(opts, "timeout_s", 1.0)?,
                options: GraderOptions::from_json(opts)?,
            },
            mode,
        })
    }
}

impl Reward for AnswerReward {
    fn name(&self) -> &str {
        &self.name
    }

    fn score(&self, _prompt: &str, completion: &str, gt: &str, _meta: &Value) -> RewardOutput {
        let gold = gold_answer(gt);
        let mut targets = self.grader.options.extraction_config;
        if self.mode == Extraction::Strict {
            targets.expr = false;
        }
        let pred = ranked_answer(completion, targets);
        let (correct, mut error) = match pred.as_deref() {
            Some(p) => self.grader.judge(&gold, p),
            None => (false, None),
        };
        if !correct && error.is_none() && !braces_balanced(completion) {
            error = Some(Unscored::Unbalanced);
        }
        let a = if correct { 1.0 } else { 0.0 };
        let out = match error {
            Some(e) => RewardOutput::failed(e.as_str()),
            None => RewardOutput::new(a),
        };
        out.with("answer_reward", a)
            .with("answer_found", if pred.is_some() { 1.0 } else { 0.0 })
    }
}
