//! n-digit arithmetic: `What is 37 + 58?` with knobs for digits, operand count and operators.
use super::{
    example_rng, fill, opt_digits, random_operand, verify_number, AnswerMode, Generated,
    TaskExample,
};
use crate::reward::{opt_str, opt_u64};
use anyhow::{bail, Result};
use rand::Rng;
use serde_json::{json, Value};

/// Options: `digits` (1; a dividend is divisor x quotient and may be longer), `operands` (2), `ops` (`"+"`; any of `+-*/`), `allow_negative`
/// (true), `template` (`"What is {expr}?"`), `answer_mode` (`auto`).
pub struct Arith {
    digits: u32,
    operands: usize,
    ops: Vec<char>,
    allow_negative: bool,
    template: String,
    mode: AnswerMode,
}

impl Arith {
    pub fn from_opts(opts: &Value) -> Result<Self> {
        let ops: Vec<char> = opt_str(opts, "ops", "+")?
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        if ops.is_empty() || ops.iter().any(|c| !"+-*/".contains(*c)) {
            bail!("option \"ops\" must be made of + - * /, got {ops:?}");
        }
        let operands = opt_u64(opts, "operands", 2)? as usize;
        if !(2..=12).contains(&operands) {
            bail!("option \"operands\" must be between 2 and 12, got {operands}");
        }
        let allow_negative = match opts.get("allow_negative") {
            None | Some(Value::Null) => true,
            Some(Value::Bool(b)) => *b,
            Some(v) => bail!("option \"allow_negative\" must be true or false, got {v}"),
        };
        let template = opt_str(opts, "template", "What is {expr}?")?.to_string();
        if !template.contains("{expr}") {
            bail!("option \"template\" must contain {{expr}}, got {template:?}");
        }
        Ok(Arith {
            digits: opt_digits(opts, "digits", 1)?,
            operands,
            ops,
            allow_negative,
            template,
            mode: AnswerMode::from_opts(opts)?,
        })
    }
}

/// Value of `n0 op0 n1 op1 n2 ...` with `*` and `/` binding tighter; `None` if a division is
/// not exact or the value overflows.
pub(crate) fn evaluate(nums: &[i64], ops: &[char]) -> Option<i64> {
    let mut terms: Vec<(char, i64)> = vec![('+', nums[0])];
    for (k, &op) in ops.iter().enumerate() {
        let x = nums[k + 1];
        match op {
            '*' => terms.last_mut()?.1 = terms.last()?.1.checked_mul(x)?,
            '/' => {
                let t = terms.last()?.1;
                if x == 0 || t % x != 0 {
                    return None;
                }
                terms.last_mut()?.1 = t / x;
            }
            _ => terms.push((op, x)),
        }
    }
    terms.iter().try_fold(0i64, |acc, &(op, x)| match op {
        '-' => acc.checked_sub(x),
        _ => acc.checked_add(x),
    })
}

pub(crate) fn render(nums: &[i64], ops: &[char]) -> String {
    let mut s = nums[0].to_string();
    for (k, op) in ops.iter().enumerate() {
        s.push_str(&format!(" {op} {}", nums[k + 1]));
    }
    s
}

impl Generated for Arith {
    fn name(&self) -> &str {
        "arith"
    }

    fn generate(&self, seed: u64, index: u64) -> TaskExample {
        let mut rng = example_rng(seed, index);
        // Divisions are made exact by construction (the dividend is the divisor times an operand
        // of `digits` digits, so it may have more digits); rejection sampling handles the rest
        // (chained divisions, negative results when they are not allowed).
        loop {
            let ops: Vec<char> = (1..self.operands)
                .map(|_| self.ops[rng.random_range(0..self.ops.len())])
                .collect();
            let mut nums: Vec<i64> = (0..self.operands)
                .map(|_| random_operand(&mut rng, self.digits))
                .collect();
            for k in (0..ops.len()).rev() {
                if ops[k] == '/' {
                    nums[k + 1] = nums[k + 1].max(1);
                    nums[k] = nums[k + 1] * random_operand(&mut rng, self.digits);
                }
            }
            let Some(v) = evaluate(&nums, &ops) else {
                continue;
            };
            if !self.allow_negative && v < 0 {
                continue;
            }
            let expr = render(&nums, &ops);
            return TaskExample {
                prompt: fill(&self.template, &[("expr", expr.clone())]),
                answer: v.to_string(),
                metadata: json!({"task": "arith", "expr": expr, "digits": self.digits}),
            };
        }
    }

    fn verify(&self, completion: &str, answer: &str, _metadata: &Value) -> f64 {
        verify_number(self.mode, completion, answer)
    }
}
