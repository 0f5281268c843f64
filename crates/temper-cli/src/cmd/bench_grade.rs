//! `temper bench grade`: graded pairs per second on GSM8K test answers (target >= 100k/s for
//! plain numbers), for the plain-number path, the full extraction pipeline, and LaTeX forms.
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::Instant;
use temper_reward::grader::{gold_answer, Grader};

#[derive(clap::Args)]
pub struct Args {
    /// GSM8K-style JSON lines with an "answer" field ending in `#### N`.
    #[arg(long, default_value = "../shared/data/gsm8k/test.jsonl")]
    data: PathBuf,
    /// Passes over the data per measurement.
    #[arg(long, default_value_t = 50)]
    repeat: usize,
    /// (gold, pred) pairs graded by temper and by math-verify for the side-by-side.
    #[arg(
        long,
        default_value = "crates/temper-reward/tests/fixtures/grader_cases.jsonl"
    )]
    cases: PathBuf,
    /// The Python with math-verify (default: the repository's venv, as every Python temper runs);
    /// `none` skips the side-by-side.
    #[arg(long)]
    python: Option<PathBuf>,
}

/// The text both graders get: bare text in `$...$`, as tools/math_verify_bench.py hands it to
/// math-verify (whose LaTeX extraction needs a math environment or a box).
fn wrap(s: &str) -> String {
    if s.contains('$') || s.contains("\\boxed") {
        s.to_string()
    } else {
        format!("${s}$")
    }
}

/// temper and math-verify on the same pairs: pairs per second each, and what each accepted.
fn side_by_side(args: &Args, grader: &Grader) -> Result<()> {
    if args.python.as_deref() == Some(Path::new("none")) {
        return Ok(());
    }
    let text = std::fs::read_to_string(&args.cases)
        .with_context(|| format!("reading {}", args.cases.display()))?;
    let mut pairs = vec![];
    for (i, line) in text.lines().enumerate() {
        let v: Value = serde_json::from_str(line)
            .with_context(|| format!("{}:{}: not JSON", args.cases.display(), i + 1))?;
        let field = |k: &str| -> Result<String> {
            v[k].as_str().map(str::to_string).with_context(|| {
                format!(
                    "{}:{}: missing string field {k:?}",
                    args.cases.display(),
                    i + 1
                )
            })
        };
        pairs.push((wrap(&field("gold")?), wrap(&field("pred")?)));
    }
    let (ours, accepted) = measure(&pairs, 3, |g, p| grader.grade(g, p).correct);
    let script = temper_base::python::tool_script("math_verify_bench.py")?;
    let out = std::process::Command::new(temper_base::python::python(args.python.as_deref()))
        .arg(&script)
        .arg(&args.cases)
        .output()
        .context("running tools/math_verify_bench.py")?;
    if !out.status.success() {
        bail!(
            "tools/math_verify_bench.py: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mv: Value = serde_json::from_slice(&out.stdout).context("math_verify_bench.py output")?;
    let theirs = mv["pairs"].as_f64().unwrap_or(0.0) / mv["seconds"].as_f64().unwrap_or(f64::NAN);
    println!(
        "grader cases ({}): temper {ours:.0} pairs/s ({accepted} accepted), math-verify {theirs:.0} pairs/s ({} accepted): {:.0}x",
        pairs.len(),
        mv["accepted"],
        ours / theirs
    );
    Ok(())
}

fn measure(
    pairs: &[(String, String)],
    repeat: usize,
    f: impl Fn(&str, &str) -> bool,
) -> (f64, usize) {
    let t = Instant::now();
    let mut correct = 0;
    for _ in 0..repeat {
        for (g, p) in pairs {
            correct += f(g, p) as usize;
        }
    }
    let n = pairs.len() * repeat;
    (
        n as f64 / t.elapsed().as_secs_f64(),
        correct / repeat.max(1),
    )
}

pub fn run(args: Args) -> Result<()> {
    if args.repeat == 0 {
        bail!("--repeat must be at least 1");
    }
    let path = &args.data;
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut golds = vec![];
    for (i, line) in text.lines().enumerate() {
        let v: Value = serde_json::from_str(line)
            .with_context(|| format!("{}:{}: not JSON", path.display(), i + 1))?;
        let a = v["answer"].as_str().with_context(|| {
            format!(
                "{}:{}: missing string field \"answer\"",
                path.display(),
                i + 1
            )
        })?;
        golds.push((a.to_string(), gold_answer(a)));
    }
    let grader = Grader::default();
    // Plain numbers: extracted gold vs a plain prediction (half right, half off by one).
    let plain: Vec<(String, String)> = golds
        .iter()
        .enumerate()
        .map(|(i, (_, g))| {
            let p = if i % 2 == 0 {
                g.clone()
            } else {
                format!("{}1", g)
            };
            (g.clone(), p)
        })
        .collect();
    // Full pipeline: raw dataset answer (with ####) vs a model-style sentence.
    let full: Vec<(String, String)> = golds
        .iter()
        .map(|(raw, g)| {
            (
                raw.clone(),
                format!("So she makes ${g} every day. The answer is {g}."),
            )
        })
        .collect();
    // LaTeX forms through the expression engine.
    let latex: Vec<(String, String)> = golds
        .iter()
        .map(|(_, g)| (g.clone(), format!("\\boxed{{\\frac{{2\\cdot {g}}}{{2}}}}")))
        .collect();
    let (plain_rate, plain_ok) = measure(&plain, args.repeat, |g, p| grader.answers_match(g, p));
    let (full_rate, full_ok) = measure(&full, args.repeat, |g, p| grader.grade(g, p).correct);
    let latex_repeat = (args.repeat / 10).max(1);
    let (latex_rate, latex_ok) = measure(&latex, latex_repeat, |g, p| grader.grade(g, p).correct);
    let n = golds.len();
    println!("GSM8K test answers: {n} (single thread)");
    println!(
        "plain numbers      {plain_rate:>12.0} pairs/s  ({plain_ok}/{n} correct, expected {})",
        n.div_ceil(2)
    );
    println!("full text pipeline {full_rate:>12.0} pairs/s  ({full_ok}/{n} correct)");
    println!("latex expressions  {latex_rate:>12.0} pairs/s  ({latex_ok}/{n} correct)");
    side_by_side(&args, &grader)?;
    println!(
        "{}",
        json!({"bench": "grade", "answers": n, "plain_pairs_per_s": plain_rate,
               "full_pairs_per_s": full_rate, "latex_pairs_per_s": latex_rate})
    );
    Ok(())
}
