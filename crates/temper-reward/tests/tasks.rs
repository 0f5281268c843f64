//! Procedural tasks: generation reproduces the fixture checked in Python by
//! tools/reward_task_fixtures.py, and the verifiers accept right answers in the forms a small
//! model writes and reject wrong ones.
use serde_json::{json, Value};
use temper_reward::{procedural_task, Task};

/// The task's reward of `completion` against the answer `gt` (what the verifier said).
fn verify(task: &dyn Task, completion: &str, gt: &str, meta: &Value) -> f64 {
    task.score("", completion, gt, meta).reward
}

fn fixture() -> Vec<Value> {
    let text = include_str!("fixtures/tasks.jsonl");
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn generation_matches_python_checked_fixture() {
    let rows = fixture();
    assert_eq!(rows.len(), 192);
    for r in &rows {
        let task = procedural_task(r["task"].as_str().unwrap(), &r["opts"]).unwrap();
        let ex = task.question(r["seed"].as_u64().unwrap(), r["index"].as_u64().unwrap());
        assert_eq!(ex.prompt, r["prompt"].as_str().unwrap());
        assert_eq!(ex.answer.as_deref(), r["answer"].as_str());
        assert_eq!(ex.metadata, r["metadata"]);
    }
}

#[test]
fn numeric_verifiers_accept_answer_forms() {
    for r in fixture().iter().filter(|r| r["task"] != "countdown") {
        let task = procedural_task(r["task"].as_str().unwrap(), &r["opts"]).unwrap();
        let ans = r["answer"].as_str().unwrap();
        let n: i64 = ans.parse().unwrap();
        let meta = &r["metadata"];
        for good in [
            format!("The answer is {n}."),
            ans.to_string(),
            format!("\\boxed{{{n}}}"),
            format!("<think> easy </think> <answer> {n} </answer>"),
            format!("Let me add them up: result is {n}"),
        ] {
            assert_eq!(verify(&*task, &good, ans, meta), 1.0, "{good:?} for {ans}");
        }
        for bad in [
            format!("The answer is {}.", n + 1),
            "I don't know".to_string(),
            format!("{n} or maybe {}", n - 1),
        ] {
            assert_eq!(verify(&*task, &bad, ans, meta), 0.0, "{bad:?} for {ans}");
        }
    }
}

#[test]
fn answer_modes() {
    let boxed = procedural_task("arith", &json!({"answer_mode": "boxed"})).unwrap();
    assert_eq!(verify(&*boxed, "\\boxed{12}", "12", &Value::Null), 1.0);
    assert_eq!(
        verify(&*boxed, "The answer is 12.", "12", &Value::Null),
        0.0
    );
    let last = procedural_task("arith", &json!({"answer_mode": "last_number"})).unwrap();
    assert_eq!(verify(&*last, "7 + 5 = 12", "12", &Value::Null), 1.0);
    let tag = procedural_task("arith", &json!({"answer_mode": "answer_tag"})).unwrap();
    assert_eq!(
        verify(&*tag, "<answer> 12 </answer>", "12", &Value::Null),
        1.0
    );
    assert_eq!(verify(&*tag, "12", "12", &Value::Null), 0.0);
}

#[test]
fn countdown_verifier() {
    for r in fixture().iter().filter(|r| r["task"] == "countdown") {
        let task = procedural_task("countdown", &r["opts"]).unwrap();
        let meta = &r["metadata"];
        let ans = r["answer"].as_str().unwrap();
        let sol = meta["solution"].as_str().unwrap();
        assert_eq!(
            verify(
                &*task,
                &format!("<think> ok </think> <answer> {sol} </answer>"),
                ans,
                meta
            ),
            1.0,
            "{sol}"
        );
        assert_eq!(
            verify(
                &*task,
                &format!("<answer> {sol} = {ans} </answer>"),
                ans,
                meta
            ),
            1.0,
            "{sol}"
        );
        // Wrong target, a number missing, a number repeated: all rejected.
        let target: i64 = ans.parse().unwrap();
        assert_eq!(
            verify(
                &*task,
                &format!("<answer> {sol} </answer>"),
                &(target + 1).to_string(),
                meta
            ),
            0.0
        );
        let first = meta["numbers"][0].as_i64().unwrap();
        assert_eq!(
            verify(
                &*task,
                &format!("<answer> {sol} + {first} - {first} </answer>"),
                ans,
                meta
            ),
            0.0
        );
    }
    let meta = json!({"numbers": [3, 5, 7], "target": 22});
    let t = procedural_task("countdown", &json!({"numbers": 3})).unwrap();
    assert_eq!(
        verify(&*t, "<answer> 3 * 5 + 7 </answer>", "22", &meta),
        1.0
    );
    assert_eq!(
        verify(&*t, "<answer> 7 * 3 + 1 </answer>", "22", &meta),
        0.0
    );
    assert_eq!(
        verify(&*t, "<answer> (3 + 5) / 7 </answer>", "22", &meta),
        0.0
    );
    assert_eq!(
        verify(&*t, "<answer> import os </answer>", "22", &meta),
        0.0
    );
    let subset = procedural_task("countdown", &json!({"use_all": false})).unwrap();
    assert_eq!(
        verify(&*subset, "<answer> 3 * 7 + 1 </answer>", "22", &meta),
        0.0
    );
    assert_eq!(
        verify(&*subset, "<answer> 3 * 5 + 7 </answer>", "22", &meta),
        1.0
    );
    let m2 = json!({"numbers": [3, 7, 1], "target": 22});
    assert_eq!(
        verify(&*subset, "<answer> 3 * 7 + 1 </answer>", "22", &m2),
        1.0
    );
}

#[test]
fn streams_are_deterministic_and_differ_by_seed_and_index() {
    let t = procedural_task("arith", &json!({"digits": 4})).unwrap();
    assert_eq!(t.question(9, 3), t.question(9, 3));
    let a: Vec<String> = (0..20).map(|i| t.question(1, i).prompt).collect();
    let b: Vec<String> = (0..20).map(|i| t.question(2, i).prompt).collect();
    assert_ne!(a, b);
    let distinct: std::collections::BTreeSet<_> = a.iter().collect();
    assert!(distinct.len() >= 19, "{a:?}");
    // Template knob.
    let q = procedural_task("arith", &json!({"template": "Q: {expr} = ?"}))
        .unwrap()
        .question(0, 0);
    assert!(
        q.prompt.starts_with("Q: ") && q.prompt.ends_with(" = ?"),
        "{}",
        q.prompt
    );
}

#[test]
fn bad_options_are_errors() {
    for (name, opts) in [
        ("arith", json!({"ops": "+%"})),
        ("arith", json!({"digits": 0})),
        ("arith", json!({"digits": 12})),
        ("arith", json!({"operands": 1})),
        ("arith", json!({"template": "no placeholder"})),
        ("arith", json!({"answer_mode": "guess"})),
        ("chain_sum", json!({"ops": "*"})),
        ("countdown", json!({"numbers": 1})),
        ("countdown", json!({"min_target": 10, "max_target": 5})),
    ] {
        assert!(procedural_task(name, &opts).is_err(), "{name} {opts}");
    }
    assert!(procedural_task("sudoku", &Value::Null)
        .err()
        .unwrap()
        .to_string()
        .contains("countdown"));
}
