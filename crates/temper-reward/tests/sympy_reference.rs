//! The expression engine against sympy: pairs written by tools/reward_sympy_cases.py (sympy's
//! LaTeX and plain-text forms, expanded / factored / combined rewrites, and wrong rewrites),
//! labelled equal or not by sympy.
use serde_json::Value;
use temper_reward::answers_match;

#[test]
fn agrees_with_sympy_on_random_expressions() {
    let text = include_str!("fixtures/sympy_cases.jsonl");
    let mut bad = vec![];
    let mut n = 0;
    for line in text.lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        let (g, p, want) = (
            v["gold"].as_str().unwrap(),
            v["pred"].as_str().unwrap(),
            v["equal"].as_bool().unwrap(),
        );
        n += 1;
        if answers_match(g, p) != want {
            bad.push(format!("gold={g:?} pred={p:?} sympy says equal={want}"));
        }
    }
    assert!(n >= 400);
    assert!(
        bad.is_empty(),
        "{} of {n} disagree:\n{}",
        bad.len(),
        bad.join("\n")
    );
}
