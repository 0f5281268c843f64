//! Chain sums: start from a number and apply a chain of additions and subtractions given in
//! words ("Start with 7. Add 5. Subtract 3. What number do you end with?").
use super::{
    example_rng, fill, opt_digits, random_operand, verify_number, AnswerMode, Generated,
    TaskExample,
};
use crate::reward::{opt_str, opt_u64};
use anyhow::{bail, Result};
use rand::Rng;
use serde_json::{json, Value};

/// Options: `steps` (4), `digits` (1), `ops` (`"+-"`), `template`
/// (`"Start with {start}. {steps} What number do you end with?"`), `answer_mode` (`auto`).
pub struct ChainSum {
    steps: usize,
    digits: u32,
    ops: Vec<char>,
    template: String,
    mode: AnswerMode,
}

impl ChainSum {
    pub fn from_opts(opts: &Value) -> Result<Self> {
        let ops: Vec<char> = opt_str(opts, "ops", "+-")?
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        if ops.is_empty() || ops.iter().any(|c| !"+-".contains(*c)) {
            bail!("option \"ops\" must be made of + and -, got {ops:?}");
        }
        let steps = opt_u64(opts, "steps", 4)? as usize;
        if !(1..=64).contains(&steps) {
            bail!("option \"steps\" must be between 1 and 64, got {steps}");
        }
        let template = opt_str(
            opts,
            "template",
            "Start with {start}. {steps} What number do you end with?",
        )?
        .to_string();
        if !template.contains("{start}") || !template.contains("{steps}") {
            bail!("option \"template\" must contain {{start}} and {{steps}}, got {template:?}");
        }
        Ok(ChainSum {
            steps,
            digits: opt_digits(opts, "digits", 1)?,
            ops,
            template,
            mode: AnswerMode::from_opts(opts)?,
        })
    }
}

impl Generated for ChainSum {
    fn name(&self) -> &str {
        "chain_sum"
    }

    fn generate(&self, seed: u64, index: u64) -> TaskExample {
        let mut rng = example_rng(seed, index);
        let start = random_operand(&mut rng, self.digits);
        let mut value = start;
        let mut words = vec![];
        let mut terms = vec![start];
        for _ in 0..self.steps {
            let op = self.ops[rng.random_range(0..self.ops.len())];
            let x = random_operand(&mut rng, self.digits);
            if op == '+' {
                value += x;
                words.push(format!("Add {x}."));
                terms.push(x);
            } else {
                value -= x;
                words.push(format!("Subtract {x}."));
                terms.push(-x);
            }
        }
        TaskExample {
            prompt: fill(
                &self.template,
                &[("start", start.to_string()), ("steps", words.join(" "))],
            ),
            answer: value.to_string(),
            metadata: json!({"task": "chain_sum", "terms": terms}),
        }
    }

    fn verify(&self, completion: &str, answer: &str, _metadata: &Value) -> f64 {
        verify_number(self.mode, completion, answer)
    }
}
