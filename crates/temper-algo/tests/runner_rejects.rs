//! The runner fails (never skips) a case with an unknown op or key, a wrong number, a missing
//! NaN, or an unreadable file; and passes a correct one.

use std::path::Path;

use temper_algo::vectors::run_file;

fn run(dir: &Path, name: &str, body: &str) -> temper_algo::CaseResult {
    let path = dir.join(format!("{name}.json"));
    std::fs::write(&path, body).unwrap();
    run_file(&path)
}

const GOOD: &str = r#"{"name":"good","op":"masked_mean","args":{"dim":null},
  "inputs":{"tensor":[[1,2],[3,4]],"mask":[[1,0],[1,1]]},"expected":{"mean":[2.6666666666666665]},
  "rtol":1e-9,"atol":1e-12,"note":"free text"}"#;

#[test]
fn runner_fails_bad_cases_and_passes_good_ones() {
    let dir = std::env::temp_dir().join(format!("temper-algo-runner-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = run(&dir, "good", GOOD);
    assert!(good.passed, "{good}");

    let bad = [
        (
            "unknown_op",
            GOOD.replace("\"masked_mean\"", "\"masked_median\""),
            "unknown op",
        ),
        (
            "unknown_top_key",
            GOOD.replace("\"note\"", "\"notes\""),
            "unknown top-level key",
        ),
        (
            "unknown_arg",
            GOOD.replace("\"dim\":null", "\"dim\":null,\"axis\":1"),
            "unknown key args.axis",
        ),
        (
            "unknown_input",
            GOOD.replace("\"mask\":", "\"weights\":"),
            "unknown key inputs.weights",
        ),
        (
            "unknown_expected",
            GOOD.replace("\"mean\":", "\"avg\":"),
            "unknown key expected.avg",
        ),
        (
            "wrong_value",
            GOOD.replace("2.6666666666666665", "2.67"),
            "expected 2.67",
        ),
        (
            "want_nan",
            GOOD.replace("[2.6666666666666665]", "null"),
            "expected NaN",
        ),
        (
            "missing_rtol",
            GOOD.replace("\"rtol\":1e-9,", ""),
            "missing key `rtol`",
        ),
        (
            "empty_expected",
            GOOD.replace("{\"mean\":[2.6666666666666665]}", "{}"),
            "nothing to check",
        ),
        (
            "ragged",
            GOOD.replace("[[1,2],[3,4]]", "[[1,2],[3]]"),
            "ragged",
        ),
        (
            "bad_shape",
            GOOD.replace("[[1,0],[1,1]]", "[[1,0,1],[1,1,1]]"),
            "does not broadcast",
        ),
        ("not_json", "{".to_string(), "cannot read case"),
    ];
    for (name, body, why) in bad {
        let r = run(&dir, name, &body);
        assert!(!r.passed, "{name} passed");
        let reason = r.reason.clone().unwrap_or_default();
        assert!(
            reason.contains(why),
            "{name}: reason {reason:?} lacks {why:?}"
        );
    }
    let report = temper_algo::run_vectors(&dir).unwrap();
    assert_eq!((report.passed(), report.failed()), (1, 12), "{report}");
    assert!(report.to_string().ends_with("1 passed, 12 failed"));
    std::fs::remove_dir_all(&dir).ok();
}
