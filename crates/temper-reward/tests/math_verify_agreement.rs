//! temper's grader against math-verify on generated (gold, prediction) pairs, 2000 per answer
//! family (labels, intervals, unordered lists, matrices, free-form solutions, decimal commas,
//! malformed math): `tests/fixtures/grader_cases.jsonl`, written by `tools/grader_cases.py` and
//! labelled by math-verify 0.9.0 and by sympy on the values the generator built each text from.
//!
//! - Where the two labels agree, temper agrees with them on at least 97% of the pairs of every
//!   family and never accepts a pair both reject.
//! - Every pair where temper and math-verify differ is listed, with the reviewed reason, in
//!   `tests/fixtures/grader_disagreements.jsonl` (written by `tools/grader_disagreements.py`), and
//!   every listed pair still differs: a grader change that moves a verdict must be reviewed.
use std::collections::{BTreeMap, HashMap};

use temper_reward::grader::grade;

fn fixture(name: &str) -> Vec<serde_json::Value> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    std::fs::read_to_string(&path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn text(v: &serde_json::Value, key: &str) -> String {
    v[key].as_str().unwrap().to_string()
}

#[test]
fn temper_agrees_with_math_verify() {
    let cases = fixture("grader_cases.jsonl");
    assert!(cases.len() >= 7 * 2000, "a few thousand pairs per family");
    // family -> (pairs both labels agree on, temper agrees, false accepts, examples)
    let mut stats: BTreeMap<String, (usize, usize, usize, Vec<String>)> = BTreeMap::new();
    for v in &cases {
        let (mv, by_sympy) = (
            v["math_verify"].as_bool().unwrap(),
            v["sympy"].as_bool().unwrap(),
        );
        if mv != by_sympy {
            continue;
        }
        let (gold, pred) = (text(v, "gold"), text(v, "pred"));
        let ours = grade(&gold, &pred).correct;
        let s = stats.entry(text(v, "family")).or_default();
        s.0 += 1;
        if ours == mv {
            s.1 += 1;
        } else if s.3.len() < 5 {
            s.3.push(format!("gold={gold:?} pred={pred:?} want={mv}"));
        }
        if ours && !mv {
            s.2 += 1;
        }
    }
    assert_eq!(stats.len(), 7, "every family has labelled pairs");
    for (family, (n, agree, false_accepts, examples)) in &stats {
        let rate = *agree as f64 / *n as f64;
        println!("{family}: {agree}/{n} = {rate:.4}, false accepts {false_accepts}");
        assert!(
            rate >= 0.97,
            "{family}: {rate:.4} < 0.97; e.g. {examples:#?}"
        );
        assert_eq!(
            *false_accepts, 0,
            "{family}: accepted what both labels reject: {examples:#?}"
        );
    }
}

#[test]
fn every_disagreement_with_math_verify_is_reviewed() {
    let reviewed: HashMap<(String, String), serde_json::Value> =
        fixture("grader_disagreements.jsonl")
            .into_iter()
            .map(|v| ((text(&v, "gold"), text(&v, "pred")), v))
            .collect();
    let mut unlisted = vec![];
    let mut listed = 0;
    for v in fixture("grader_cases.jsonl") {
        let (gold, pred) = (text(&v, "gold"), text(&v, "pred"));
        let ours = grade(&gold, &pred).correct;
        let mv = v["math_verify"].as_bool().unwrap();
        match reviewed.get(&(gold.clone(), pred.clone())) {
            Some(r) => {
                assert_ne!(
                    ours, mv,
                    "listed as a disagreement but temper now agrees with math-verify: {gold:?} vs {pred:?}"
                );
                assert_eq!(r["temper"].as_bool(), Some(ours), "{gold:?} vs {pred:?}");
                assert!(text(r, "reason").len() > 20, "a reason is written out");
                listed += 1;
            }
            None if ours != mv => unlisted.push(format!("{gold:?} vs {pred:?}: temper {ours}")),
            None => {}
        }
    }
    assert!(
        unlisted.is_empty(),
        "{} disagreements with math-verify are not reviewed in grader_disagreements.jsonl \
         (tools/grader_disagreements.py): {:#?}",
        unlisted.len(),
        &unlisted[..unlisted.len().min(10)]
    );
    assert_eq!(
        listed,
        reviewed.len(),
        "every listed pair is a current case"
    );
}
