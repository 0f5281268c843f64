//! The grader on real data: every GSM8K test answer and every answer in mmath-en.json, in the
//! surface forms models write them, against off-by-one and other wrong answers. Reads
//! `../shared/data` beside the repository (as CI has it).
use serde_json::Value;
use std::path::PathBuf;
use temper_reward::grader::{gold_answer, Grader};

fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data")
}

fn gsm8k_test_answers() -> Vec<String> {
    let path = data_dir().join("gsm8k/test.jsonl");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    text.lines()
        .enumerate()
        .map(|(i, l)| {
            let v: Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("line {}: {e}", i + 1));
            let a = v["answer"].as_str().expect("answer field");
            gold_answer(a)
        })
        .collect()
}

#[test]
fn gsm8k_answers_in_six_forms_and_not_off_by_one() {
    let answers = gsm8k_test_answers();
    assert_eq!(answers.len(), 1319);
    let g = Grader::default();
    let mut failures = vec![];
    for gold in &answers {
        let n: i64 = gold
            .replace(',', "")
            .parse()
            .unwrap_or_else(|_| panic!("GSM8K gold {gold:?} is not an integer"));
        let right = [
            format!("{n}"),
            format!("${n}"),
            format!("{n}.00"),
            format!("\\boxed{{{n}}}"),
            format!("{n} dollars"),
            format!("{n}."),
            format!("The answer is {n}."),
            format!("#### {n}"),
        ];
        let wrong = [
            format!("{}", n + 1),
            format!("{}", n - 1),
            format!("\\boxed{{{}}}", n + 1),
            format!("{}.5", n),
        ];
        for p in &right {
            if !g.grade(gold, p).correct {
                failures.push(format!("{gold:?} vs {p:?} should be correct"));
            }
        }
        for p in &wrong {
            if g.grade(gold, p).correct {
                failures.push(format!("{gold:?} vs {p:?} should be wrong"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures, first: {:?}",
        failures.len(),
        &failures[..failures.len().min(10)]
    );
}

/// Hand-made equivalent rewrites of the non-integer answers in mmath-en.json.
fn rewrite(answer: &str) -> Option<&'static str> {
    Some(match answer {
        "$[-\\frac{1}{4}, 0) \\cup (0, 2)$" => "[-0.25,0)\\cup(0,2)",
        "$\\frac{3}{4}$" => "0.75",
        "$\\frac{4}{21}$" => "4/21",
        "$\\frac{\\sqrt{6}}{4}$" => "\\sqrt{6}/4",
        "$\\frac{\\sqrt{7}}{4}$" => "\\frac{\\sqrt{28}}{8}",
        "$2\\sqrt{2}$" => "\\sqrt{8}",
        "$8\\sqrt{5} - 16$" => "-16+8\\sqrt{5}",
        "$(-\\infty,-1)\\cup(6,+\\infty)$" => "(6, \\infty) \\cup (-\\infty, -1)",
        "$2\\sqrt{2}-2$" => "2(\\sqrt{2}-1)",
        "$\\frac{1}{2}$" => "0.5",
        "$10^{2^n-n-1}$" => "10^{2^{n}-(n+1)}",
        _ => return None,
    })
}

#[test]
fn mmath_answers_self_boxed_and_rewritten() {
    let path = data_dir().join("math/mmath-en.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let items: Vec<Value> = serde_json::from_str(&text).expect("mmath-en.json is a JSON array");
    assert_eq!(items.len(), 374);
    let g = Grader::default();
    let mut failures = vec![];
    let mut rewritten = 0;
    for it in &items {
        let a = it["answer"].as_str().expect("answer");
        let inner = a.trim().trim_matches('$');
        let mut right = vec![
            a.to_string(),
            format!("\\boxed{{{inner}}}"),
            format!("The final answer is ${inner}$."),
        ];
        if let Ok(n) = inner.parse::<i64>() {
            right.push(format!("{n}.0"));
            right.push(format!("\\frac{{{}}}{{2}}", 2 * n));
            right.push(format!("{n}^{{1}}"));
            for w in [n + 1, n - 1, -n - 1] {
                if g.grade(a, &w.to_string()).correct {
                    failures.push(format!("{a:?} vs {w} should be wrong"));
                }
            }
        } else if let Some(r) = rewrite(a) {
            right.push(format!("${r}$"));
            rewritten += 1;
        }
        for p in &right {
            if !g.grade(a, p).correct {
                failures.push(format!("{a:?} vs {p:?} should be correct"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures: {:#?}",
        failures.len(),
        &failures[..failures.len().min(20)]
    );
    assert!(
        rewritten >= 10,
        "only {rewritten} rewrites of non-integer answers"
    );
}
