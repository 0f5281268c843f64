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
mod agreement;

use std::collections::BTreeMap;

use agreement::{fixture, print_table, Case, Graders, Stats};
use temper_reward::grader::Grader;

/// What `tools/grader_cases.py` handed to math-verify for a bare answer.
fn wrap(s: &str) -> String {
    if s.contains('$') || s.contains("\\boxed") {
        s.to_string()
    } else {
        format!("${s}$")
    }
}

fn cases() -> Vec<Case> {
    let realistic = fixture("grader_corpus.jsonl");
    assert!(realistic.len() >= 5000, "at least 5,000 realistic pairs");
    let mut out: Vec<Case> = realistic.iter().map(Case::from_json).collect();
    for v in fixture("grader_cases.jsonl") {
        let mut c = Case::from_json(&v);
        c.family = format!("constructed/{}", c.family);
        c.gold = wrap(&c.gold);
        c.pred = wrap(&c.pred);
        c.options = serde_json::Value::Null;
        out.push(c);
    }
    out
}

#[test]
fn temper_agrees_with_math_verify() {
    let mut stats: BTreeMap<String, Stats> = BTreeMap::new();
    let mut graders = Graders::default();
    for c in cases() {
        let ours = graders.grade(&c).correct;
        stats.entry(c.family.clone()).or_default().add(&c, ours);
    }
    print_table("per family", &stats);
    let (all, all_agree) = stats
        .values()
        .fold((0, 0), |(n, a), s| (n + s.pairs, a + s.agree));
    let overall = all_agree as f64 / all as f64;
    println!("overall {all_agree}/{all} = {overall:.4}");
    assert!(overall >= 0.97, "overall agreement {overall:.4} < 0.97");
    let failures: Vec<String> = stats
        .iter()
        .filter_map(|(family, s)| s.check(family).err())
        .collect();
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
