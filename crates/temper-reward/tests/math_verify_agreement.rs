//! temper's grader against math-verify on generated (gold, prediction) pairs, one set per answer
//! family (labels, intervals, unordered lists, matrices, free-form solutions, decimal commas,
//! malformed math): `tests/fixtures/grader_cases.jsonl`, written by `tools/grader_cases.py` and
//! labelled by math-verify 0.9.0 and by the generator's own construction. Where the two labels
//! agree, temper must agree with them on at least 97% of the pairs in every family, and must never
//! accept a pair both reject.
use std::collections::BTreeMap;

use temper_reward::grader::grade;

#[test]
fn temper_agrees_with_math_verify() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/grader_cases.jsonl");
    let text = std::fs::read_to_string(&path).unwrap();
    // family -> (labelled pairs, temper agrees, false accepts, examples of disagreement)
    let mut stats: BTreeMap<String, (usize, usize, usize, Vec<String>)> = BTreeMap::new();
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let (mv, by_construction) = (
            v["math_verify"].as_bool().unwrap(),
            v["sympy"].as_bool().unwrap(),
        );
        if mv != by_construction {
            continue;
        }
        let (gold, pred) = (v["gold"].as_str().unwrap(), v["pred"].as_str().unwrap());
        let ours = grade(gold, pred).correct;
        let s = stats
            .entry(v["family"].as_str().unwrap().to_string())
            .or_default();
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
