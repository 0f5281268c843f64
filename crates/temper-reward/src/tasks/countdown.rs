//! Countdown: reach a target with given numbers and + - * / (TinyZero's task), each number used
//! once. The verifier parses the expression and checks the numbers and the exact value.
use super::{example_rng, fill, Generated, TaskExample};
use crate::expr::{exact_value, parse, Expr};
use crate::extract::{answer_block, last_boxed};
use crate::reward::{opt_str, opt_u64};
use anyhow::{bail, Result};
use num_traits::ToPrimitive;
use rand::Rng;
use serde_json::{json, Value};

const DEFAULT_TEMPLATE: &str =
    "Using the numbers {numbers}, create an equation that equals {target}. \
You can use basic arithmetic operations (+, -, *, /) and each number must be used exactly once. \
Show your work in <think> </think> tags. And return the final answer in <answer> </answer> tags, \
for example <answer> (1 + 2) / 3 </answer>.";

/// Options: `numbers` (4 numbers), `max_number` (99), `min_target` (1), `max_target` (100),
/// `use_all` (true: every number exactly once; false: each at most once), `template`.
pub struct Countdown {
    count: usize,
    max_number: i64,
    min_target: i64,
    max_target: i64,
    use_all: bool,
    template: String,
}

impl Countdown {
    pub fn from_opts(opts: &Value) -> Result<Self> {
        let count = opt_u64(opts, "numbers", 4)? as usize;
        if !(2..=8).contains(&count) {
            bail!("option \"numbers\" must be between 2 and 8, got {count}");
        }
        let max_number = opt_u64(opts, "max_number", 99)? as i64;
        let min_target = opt_u64(opts, "min_target", 1)? as i64;
        let max_target = opt_u64(opts, "max_target", 100)? as i64;
        if !(1..=100_000).contains(&max_number) || min_target > max_target {
            bail!("countdown options out of range: max_number {max_number}, targets {min_target}..={max_target}");
        }
        let use_all = match opts.get("use_all") {
            None | Some(Value::Null) => true,
            Some(Value::Bool(b)) => *b,
            Some(v) => bail!("option \"use_all\" must be true or false, got {v}"),
        };
        Ok(Countdown {
            count,
            max_number,
            min_target,
            max_target,
            use_all,
            template: opt_str(opts, "template", DEFAULT_TEMPLATE)?.to_string(),
        })
    }

    /// Combine all numbers into one value by random valid operations; returns (value, solution).
    fn random_solution(&self, rng: &mut impl Rng, numbers: &[i64]) -> (i64, String) {
        let mut pool: Vec<(i64, String)> = numbers.iter().map(|n| (*n, n.to_string())).collect();
        while pool.len() > 1 {
            let a = pool.swap_remove(rng.random_range(0..pool.len()));
            let b = pool.swap_remove(rng.random_range(0..pool.len()));
            let (x, y) = if a.0 >= b.0 { (a, b) } else { (b, a) };
            let choice = rng.random_range(0..4);
            let combined = match choice {
                1 => (x.0 - y.0, format!("({} - {})", x.1, y.1)),
                2 if x.0.checked_mul(y.0).is_some_and(|v| v <= 1_000_000) => {
                    (x.0 * y.0, format!("{} * {}", x.1, y.1))
                }
                3 if y.0 != 0 && x.0 % y.0 == 0 => (x.0 / y.0, format!("{} / {}", x.1, y.1)),
                _ => (x.0 + y.0, format!("({} + {})", x.1, y.1)),
            };
            pool.push(combined);
        }
        pool.pop().expect("at least two numbers")
    }
}

/// Integer literals in an expression; `None` if it has anything but integers and + - * /.
fn literals(e: &Expr, out: &mut Vec<i64>) -> Option<()> {
    match e {
        Expr::Num { value, decimals: 0 } if value.is_integer() => {
            out.push(value.to_integer().to_i64()?);
            Some(())
        }
        Expr::Add(a, b) | Expr::Sub(a, b) | Expr::Mul(a, b) | Expr::Div(a, b) => {
            literals(a, out)?;
            literals(b, out)
        }
        Expr::Neg(a) => literals(a, out),
        _ => None,
    }
}

/// The equation a completion proposes: the `<answer>` block, else the last `\boxed{}`, else
/// the last line; with a trailing `= target` removed.
fn proposed_equation(completion: &str) -> Option<String> {
    let raw = if completion.contains("</answer>") {
        answer_block(completion)?
    } else if let Some(b) = last_boxed(completion) {
        b
    } else {
        completion
            .lines()
            .rev()
            .find(|l| l.chars().any(|c| c.is_ascii_digit()))?
            .to_string()
    };
    let lhs = raw.split('=').next()?.trim().to_string();
    (!lhs.is_empty()).then_some(lhs)
}

impl Generated for Countdown {
    fn name(&self) -> &str {
        "countdown"
    }

    fn generate(&self, seed: u64, index: u64) -> TaskExample {
        let mut rng = example_rng(seed, index);
        let mut best = None;
        for _ in 0..1000 {
            let numbers: Vec<i64> = (0..self.count)
                .map(|_| rng.random_range(1..=self.max_number))
                .collect();
            let (value, solution) = self.random_solution(&mut rng, &numbers);
            let ok = (self.min_target..=self.max_target).contains(&value);
            best = Some((numbers, value, solution));
            if ok {
                break;
            }
        }
        let (numbers, target, solution) = best.expect("at least one attempt");
        let shown = format!(
            "[{}]",
            numbers
                .iter()
                .map(|n| n.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
        TaskExample {
            prompt: fill(
                &self.template,
                &[("numbers", shown), ("target", target.to_string())],
            ),
            answer: target.to_string(),
            metadata: json!({"task": "countdown", "numbers": numbers, "target": target, "solution": solution}),
        }
    }

    fn verify(&self, completion: &str, answer: &str, metadata: &Value) -> f64 {
        let target = match answer
            .trim()
            .parse::<i64>()
            .ok()
            .or_else(|| metadata.get("target")?.as_i64())
        {
            Some(t) => t,
            None => return 0.0,
        };
        let Some(numbers) = metadata.get("numbers").and_then(|v| v.as_array()) else {
            tracing::warn!("countdown verifier: metadata has no \"numbers\" array");
            return 0.0;
        };
        let mut allowed: Vec<i64> = numbers.iter().filter_map(|v| v.as_i64()).collect();
        let Some(eq) = proposed_equation(completion) else {
            return 0.0;
        };
        if !eq
            .chars()
            .all(|c| c.is_ascii_digit() || " +-*/()x×÷·\\timesdivcdot".contains(c))
        {
            return 0.0;
        }
        let Ok(e) = parse(&eq) else { return 0.0 };
        let mut used = vec![];
        if literals(&e, &mut used).is_none() {
            return 0.0;
        }
        allowed.sort_unstable();
        used.sort_unstable();
        let numbers_ok = if self.use_all {
            used == allowed
        } else {
            used.iter().all(|u| {
                let c = used.iter().filter(|x| *x == u).count();
                c <= allowed.iter().filter(|x| *x == u).count()
            })
        };
        let value_ok = exact_value(&e)
            .is_some_and(|v| v == num_rational::BigRational::from_integer(target.into()));
        if numbers_ok && value_ok {
            1.0
        } else {
            0.0
        }
    }
}
