//! `temper grade --jsonl` on bad input: a line that is not UTF-8 and an answer the grader gives
//! up on each score 0 with the reason in the line's `error` and a count on stderr; the other
//! lines are graded; one output line per input line.
use temper_testkit as common;

use std::process::Command;

#[test]
fn bad_lines_score_zero_with_the_reason_and_the_rest_is_graded() {
    let dir = std::env::temp_dir().join(format!("temper-grade-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let input = dir.join("pairs.jsonl");
    let mut bytes = Vec::new();
    bytes.extend_from_slice(b"{\"gold\": \"2\", \"pred\": \"The answer is $\\\\boxed{2}$.\"}\n");
    bytes.extend_from_slice(b"{\"gold\": \"2\", \"pred\": \"caf\xe9 \xff 2\"}\r\n");
    bytes.extend_from_slice(b"{\"gold\": \"5\", \"pred\": \"So \\\\boxed{5\"}\n");
    bytes.extend_from_slice(b"{\"gold\": \"0.33\", \"pred\": \"\\\\frac{1}{3}\"}\n");
    std::fs::write(&input, bytes).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_temper"))
        .args(["grade", "--jsonl"])
        .arg(&input)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let rows: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 4);
    assert_eq!(rows[0]["correct"], true);
    assert_eq!(rows[1]["correct"], false);
    assert_eq!(rows[1]["error"], "not_utf8");
    assert_eq!(rows[2]["correct"], false);
    assert_eq!(rows[2]["error"], "unbalanced");
    // math-verify 0.9.0 does not accept 1/3 for a gold of 0.33 (its verdict, checked by hand).
    assert_eq!(rows[3]["correct"], false);
    assert!(
        stderr.contains("2 of 4 lines could not be graded")
            && stderr.contains("not_utf8 1")
            && stderr.contains("unbalanced 1"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--options` reaches the grader: on a pair whose verdict math-verify changes with `strict`, temper
/// gives math-verify's verdict (computed here by math-verify itself) under both settings.
#[test]
fn options_change_the_verdict_as_they_change_math_verifys() {
    let (gold, pred) = ("$f(x) = x^2 + 1$", "$f(y) = y^2 + 1$");
    for strict in [true, false] {
        let py = common::output_ok(std::process::Command::new(common::python()).args([
            "-c",
            "import sys; from math_verify import parse, verify; \
             print(verify(parse(sys.argv[1]), parse(sys.argv[2]), strict=sys.argv[3] == 'true'))",
            gold,
            pred,
            &strict.to_string(),
        ]));
        let math_verify = String::from_utf8_lossy(&py.stdout).trim() == "True";
        let out = common::output_ok(
            std::process::Command::new(env!("CARGO_BIN_EXE_temper"))
                .args(["grade", "--gold", gold, "--pred", pred, "--options"])
                .arg(format!("{{\"strict\": {strict}}}")),
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["correct"], math_verify, "strict = {strict}: {v}");
    }
    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_temper"))
        .args([
            "grade",
            "--gold",
            "1",
            "--pred",
            "1",
            "--options",
            "{\"strict\": 2}",
        ])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("strict"));
}
