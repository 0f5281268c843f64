//! `temper grade`: offline grading with the math grader, one pair (`--gold G --pred P`) or a
//! JSON-lines file of `{"gold", "pred"}` (one output line per input line, in order).
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::io::{BufRead, BufWriter, Write};
use std::path::PathBuf;
use std::time::Duration;
use temper_reward::{r1_zero, Grader};

#[derive(clap::Args)]
pub struct Args {
    /// Ground truth: an answer, a solution with `\boxed{}`, or a GSM8K answer with `####`.
    #[arg(long, requires = "pred", conflicts_with = "jsonl")]
    gold: Option<String>,
    /// Prediction: an answer or a full response (the answer is extracted).
    #[arg(long, requires = "gold")]
    pred: Option<String>,
    /// JSON lines with string (or number) fields "gold" and "pred"; `-` reads stdin.
    #[arg(long)]
    jsonl: Option<PathBuf>,
    /// Write the result lines here instead of stdout.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Time limit per comparison, in seconds.
    #[arg(long, default_value_t = 1.0)]
    timeout_s: f64,
    /// Score with the r1_zero reward (format `</think> <answer> ... </answer>` required).
    #[arg(long)]
    r1_zero: bool,
    /// math-verify's options as JSON, the same keys a reward's kwargs take: `strict`,
    /// `allow_set_relation_comp`, `float_rounding`, `numeric_precision`, `extraction_config`
    /// (e.g. `{"strict": false, "allow_set_relation_comp": true}`).
    #[arg(long)]
    options: Option<String>,
}

fn grade_one(grader: &Grader, use_r1: bool, gold: &str, pred: &str) -> Value {
    if use_r1 {
        let s = r1_zero(grader, pred, gold);
        json!({
            "correct": s.answer_reward == 1.0,
            "format_reward": s.format_reward,
            "answer_reward": s.answer_reward,
            "reward": s.reward,
            "gold_answer": s.gold_answer,
            "pred_answer": s.pred_answer,
            "error": s.error,
        })
    } else {
        let g = grader.grade(gold, pred);
        let a = if g.correct { 1.0 } else { 0.0 };
        json!({
            "correct": g.correct,
            "format_reward": if g.pred_answer.is_some() { 1.0 } else { 0.0 },
            "answer_reward": a,
            "reward": a,
            "gold_answer": g.gold_answer,
            "pred_answer": g.pred_answer,
            "error": g.error,
        })
    }
}

/// A field that must be a string (numbers are accepted and written in decimal).
fn text_field(v: &Value, key: &str) -> Result<String> {
    match v.get(key) {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Number(n)) => Ok(n.to_string()),
        Some(other) => bail!("field {key:?} must be a string, got {other}"),
        None => bail!("missing field {key:?}"),
    }
}

pub fn run(args: Args) -> Result<()> {
    if !(args.timeout_s > 0.0 && args.timeout_s.is_finite()) {
        bail!("--timeout-s must be positive, got {}", args.timeout_s);
    }
    let options = match &args.options {
        Some(text) => {
            let v: Value = serde_json::from_str(text).context("--options: not JSON")?;
            temper_reward::GraderOptions::from_json(&v).context("--options")?
        }
        None => temper_reward::GraderOptions::default(),
    };
    let grader = Grader {
        timeout: Duration::from_secs_f64(args.timeout_s),
        options,
    };
    let sink: Box<dyn Write> = match &args.out {
        Some(p) => {
            Box::new(std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?)
        }
        None => Box::new(std::io::stdout().lock()),
    };
    let mut out = BufWriter::new(sink);
    match (&args.gold, &args.pred, &args.jsonl) {
        (Some(g), Some(p), None) => {
            writeln!(out, "{}", grade_one(&grader, args.r1_zero, g, p))?;
        }
        (None, None, Some(path)) => {
            let name = path.display().to_string();
            let reader: Box<dyn BufRead> = if name == "-" {
                Box::new(std::io::stdin().lock())
            } else {
                Box::new(std::io::BufReader::new(
                    std::fs::File::open(path).with_context(|| format!("opening {name}"))?,
                ))
            };
            let (mut n, mut bad, mut first_err) = (0usize, 0usize, None);
            // Grader give-ups (timeout, nesting, unbalanced braces, text that is not UTF-8):
            // reward 0, counted by reason.
            let mut unscored: std::collections::BTreeMap<String, usize> = Default::default();
            for (i, bytes) in reader.split(b'\n').enumerate() {
                let bytes = bytes.with_context(|| format!("reading {name} line {}", i + 1))?;
                n += 1;
                let Ok(line) = String::from_utf8(bytes) else {
                    *unscored.entry("not_utf8".into()).or_default() += 1;
                    let row = json!({"correct": false, "reward": 0.0, "error": "not_utf8"});
                    writeln!(out, "{row}")?;
                    continue;
                };
                let line = line.strip_suffix('\r').unwrap_or(&line);
                let result = (|| -> Result<Value> {
                    let v: Value = serde_json::from_str(line).context("not a JSON object")?;
                    let g = text_field(&v, "gold")?;
                    let p = text_field(&v, "pred")?;
                    Ok(grade_one(&grader, args.r1_zero, &g, &p))
                })();
                let row = match result {
                    Ok(v) => {
                        if let Some(e) = v["error"].as_str() {
                            *unscored.entry(e.to_string()).or_default() += 1;
                        }
                        v
                    }
                    Err(e) => {
                        // Keep one output line per input line; the run fails at the end.
                        bad += 1;
                        let msg = format!("{name}:{}: {e:#}", i + 1);
                        first_err.get_or_insert_with(|| msg.clone());
                        json!({"correct": false, "error": msg})
                    }
                };
                writeln!(out, "{row}")?;
            }
            out.flush()?;
            if !unscored.is_empty() {
                let total: usize = unscored.values().sum();
                let parts: Vec<String> = unscored.iter().map(|(k, v)| format!("{k} {v}")).collect();
                eprintln!(
                    "temper grade: {total} of {n} lines could not be graded and score 0 ({})",
                    parts.join(", ")
                );
            }
            if let Some(e) = first_err {
                bail!("{bad} of {n} lines could not be graded; first: {e}");
            }
        }
        _ => bail!("give either --gold and --pred, or --jsonl FILE"),
    }
    out.flush()?;
    Ok(())
}
