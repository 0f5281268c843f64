//! temper's grader against math-verify 0.9.0's verdicts, the only reference: no label of ours
//! overrides one of math-verify's.
//!
//! - `tests/fixtures/grader_corpus.jsonl` (`tools/grader_corpus.py`): realistic pairs, responses
//!   shaped like model outputs (chain of thought ending in an answer, labelled answers in math
//!   delimiters, relations, sets, matrices, strictness, text that is not an answer, MATH-style
//!   golds), labelled by `verify(parse(gold), parse(pred), **options)`.
//! - `tests/fixtures/grader_cases.jsonl` (`tools/grader_cases.py`): constructed pairs per answer
//!   family, labelled by math-verify on `wrap(gold)`, `wrap(pred)` (bare text inside `$..$`);
//!   temper is given the same wrapped texts.
//!
//! For every family: temper agrees with math-verify on at least 97% of the pairs and never
//! accepts a pair math-verify rejects. Where temper differs on purpose, the difference is one of
//! the named rules of docs/rewards.md ("Deliberate differences"); they are counted per rule and
//! stay at or below 1% of every family.
use std::collections::BTreeMap;

use serde_json::Value;
use temper_reward::grader::{deliberate_difference, Grader};
use temper_reward::GraderOptions;

fn fixture(name: &str) -> Vec<Value> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn text(v: &Value, key: &str) -> String {
    v[key].as_str().unwrap().to_string()
}

/// What `tools/grader_cases.py` handed to math-verify for a bare answer.
fn wrap(s: &str) -> String {
    if s.contains('$') || s.contains("\\boxed") {
        s.to_string()
    } else {
        format!("${s}$")
    }
}

/// One graded pair: family, gold, pred, the grader options of the case, math-verify's verdict.
struct Case {
    family: String,
    gold: String,
    pred: String,
    options: Value,
    math_verify: bool,
}

fn cases() -> Vec<Case> {
    let mut out = vec![];
    let realistic = fixture("grader_corpus.jsonl");
    assert!(realistic.len() >= 5000, "at least 5,000 realistic pairs");
    for v in realistic {
        out.push(Case {
            family: text(&v, "family"),
            gold: text(&v, "gold"),
            pred: text(&v, "pred"),
            options: v.get("options").cloned().unwrap_or(Value::Null),
            math_verify: v["math_verify"].as_bool().unwrap(),
        });
    }
    for v in fixture("grader_cases.jsonl") {
        out.push(Case {
            family: format!("constructed/{}", text(&v, "family")),
            gold: wrap(&text(&v, "gold")),
            pred: wrap(&text(&v, "pred")),
            options: Value::Null,
            math_verify: v["math_verify"].as_bool().unwrap(),
        });
    }
    out
}

/// With `GRADER_DISAGREEMENTS=path`, every disagreement is appended to `path` as JSON (for
/// working on the grader; the test does not read it).
fn dump(c: &Case, graded: &temper_reward::Graded) {
    let Ok(path) = std::env::var("GRADER_DISAGREEMENTS") else {
        return;
    };
    use std::io::Write;
    let line = serde_json::json!({
        "family": c.family, "gold": c.gold, "pred": c.pred, "options": c.options,
        "math_verify": c.math_verify, "gold_answer": graded.gold_answer,
        "pred_answer": graded.pred_answer,
    });
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    writeln!(f, "{line}").unwrap();
}

#[derive(Default)]
struct FamilyStats {
    pairs: usize,
    agree: usize,
    false_accepts: usize,
    false_rejects: usize,
    /// Disagreements explained by a named deliberate rule, per rule.
    deliberate: BTreeMap<&'static str, usize>,
    examples: Vec<String>,
}

#[test]
fn temper_agrees_with_math_verify() {
    let mut stats: BTreeMap<String, FamilyStats> = BTreeMap::new();
    let mut graders: BTreeMap<String, Grader> = BTreeMap::new();
    for c in cases() {
        let key = c.options.to_string();
        let grader = graders.entry(key).or_insert_with(|| Grader {
            options: GraderOptions::from_json(&c.options).unwrap(),
            ..Grader::default()
        });
        let graded = grader.grade(&c.gold, &c.pred);
        let ours = graded.correct;
        if ours != c.math_verify {
            dump(&c, &graded);
        }
        let s = stats.entry(c.family.clone()).or_default();
        s.pairs += 1;
        if ours == c.math_verify {
            s.agree += 1;
            continue;
        }
        if ours {
            s.false_accepts += 1;
        } else {
            s.false_rejects += 1;
        }
        if let Some(rule) = deliberate_difference(&c.gold, &c.pred) {
            *s.deliberate.entry(rule).or_default() += 1;
        }
        if s.examples.len() < 8 {
            s.examples.push(format!(
                "gold={:?} pred={:?} options={} math_verify={}",
                c.gold,
                &c.pred[c.pred.len().saturating_sub(160)..],
                c.options,
                c.math_verify
            ));
        }
    }
    let (mut all, mut all_agree) = (0, 0);
    let mut failures = vec![];
    for (family, s) in &stats {
        all += s.pairs;
        all_agree += s.agree;
        let rate = s.agree as f64 / s.pairs as f64;
        let deliberate: usize = s.deliberate.values().sum();
        println!(
            "{family:32} {:5}/{:5} = {:.4}  false accepts {:3}  false rejects {:3}  deliberate {:?}",
            s.agree, s.pairs, rate, s.false_accepts, s.false_rejects, s.deliberate
        );
        if rate < 0.97 || s.false_accepts > 0 || deliberate as f64 > 0.01 * s.pairs as f64 {
            failures.push(format!("{family}: {rate:.4}; e.g. {:#?}", s.examples));
        }
    }
    let overall = all_agree as f64 / all as f64;
    println!("overall {all_agree}/{all} = {overall:.4}");
    assert!(overall >= 0.97, "overall agreement {overall:.4} < 0.97");
    assert!(
        failures.is_empty(),
        "families below 97% agreement, with a false accept, or over 1% deliberate differences:\n{}",
        failures.join("\n")
    );
}

/// Release-mode timing of the grader on the corpus (`cargo test --release -- --ignored
/// grading_speed --nocapture`): the per-pair time to compare with tools/math_verify_bench.py.
#[test]
#[ignore]
fn grading_speed() {
    let cases = cases();
    let grader = Grader::default();
    let started = std::time::Instant::now();
    let rounds = 5;
    let mut accepted = 0;
    for _ in 0..rounds {
        for c in &cases {
            accepted += grader.grade(&c.gold, &c.pred).correct as usize;
        }
    }
    let per_pair = started.elapsed().as_secs_f64() / (rounds * cases.len()) as f64;
    println!(
        "{} pairs x {rounds}: {:.1} us per pair ({accepted} accepted)",
        cases.len(),
        per_pair * 1e6
    );
}
