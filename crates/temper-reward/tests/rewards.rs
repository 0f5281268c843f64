//! r1_zero (ALGORITHMS.md section 6), the answer-only rewards and the registry.
use serde_json::{json, Value};
use temper_reward::{r1_zero, reward_by_name, Grader};

fn r1(resp: &str, gt: &str) -> (f64, f64, f64) {
    let s = r1_zero(&Grader::default(), resp, gt);
    (s.format_reward, s.answer_reward, s.reward)
}

#[test]
fn r1_zero_format_and_answer() {
    // Right format, right answer.
    assert_eq!(
        r1("<think> 2+2 </think> <answer> 4 </answer>", "4"),
        (1.0, 1.0, 1.0)
    );
    // GSM8K ground truth after ####.
    assert_eq!(
        r1(
            "reason </think> <answer>18</answer>",
            "She makes 9 * 2 = $18.\n#### 18"
        ),
        (1.0, 1.0, 1.0)
    );
    // Boxed inside the answer block: the last box counts.
    assert_eq!(
        r1(
            "</think> <answer> \\boxed{3} then \\boxed{\\frac{1}{2}} </answer>",
            "0.5"
        ),
        (1.0, 1.0, 1.0)
    );
    // Unbalanced box: formatted, answer 0.
    assert_eq!(
        r1("</think> <answer> \\boxed{\\frac{1}{2} </answer>", "0.5"),
        (1.0, 0.0, 0.0)
    );
    // Wrong answer keeps format reward but reward 0.
    assert_eq!(r1("</think> <answer> 5 </answer>", "4"), (1.0, 0.0, 0.0));
    // Missing the exact "</think> <answer>" separator or the closing tag: all zero.
    assert_eq!(r1("</think><answer> 4 </answer>", "4"), (0.0, 0.0, 0.0));
    assert_eq!(r1("</think> <answer> 4", "4"), (0.0, 0.0, 0.0));
    assert_eq!(r1("4", "4"), (0.0, 0.0, 0.0));
    // The answer is the text after the LAST <answer>.
    assert_eq!(
        r1("<answer> 4 </answer> </think> <answer> 7 </answer>", "4"),
        (1.0, 0.0, 0.0)
    );
    // Prose inside the tags.
    assert_eq!(
        r1(
            "</think> <answer> The answer is $\\frac{3}{4}$. </answer>",
            "0.75"
        ),
        (1.0, 1.0, 1.0)
    );
    // Ground truth in \boxed.
    assert_eq!(
        r1(
            "</think> <answer> 2\\sqrt{2} </answer>",
            "so \\boxed{\\sqrt{8}}"
        ),
        (1.0, 1.0, 1.0)
    );
}

fn score(name: &str, opts: Value, completion: &str, gt: &str) -> temper_reward::RewardOutput {
    reward_by_name(name, &opts)
        .unwrap()
        .score("prompt", completion, gt, &Value::Null)
}

#[test]
fn registry_and_answer_rewards() {
    let out = score("r1_zero", Value::Null, "</think> <answer> 4 </answer>", "4");
    assert_eq!(out.reward, 1.0);
    assert_eq!(out.metrics["format_reward"], 1.0);
    assert_eq!(out.metrics["answer_reward"], 1.0);

    // math: no format requirement; boxed, "the answer is", last number.
    for (completion, want) in [
        ("so \\boxed{12}", 1.0),
        ("The answer is 12.", 1.0),
        ("I get 3 then 12", 1.0),
        ("I get 12 then 3", 0.0),
    ] {
        let got = score("math", Value::Null, completion, "12").reward;
        assert_eq!(got, want, "{completion:?}");
    }
    // strict extraction refuses the last-number fallback.
    assert_eq!(
        score(
            "math",
            json!({"extraction": "strict"}),
            "I get 3 then 12",
            "12"
        )
        .reward,
        0.0
    );
    assert_eq!(
        score("gsm8k", Value::Null, "... #### 70,000", "blah\n#### 70000").reward,
        1.0
    );

    let err = reward_by_name("nope", &Value::Null)
        .err()
        .unwrap()
        .to_string();
    for known in [
        "r1_zero",
        "math",
        "gsm8k",
        "arith",
        "countdown",
        "chain_sum",
        "command",
    ] {
        assert!(err.contains(known), "{err}");
    }
    assert!(reward_by_name("math", &json!({"extraction": "fuzzy"})).is_err());
    assert!(reward_by_name("r1_zero", &json!({"timeout_s": -1})).is_err());
    assert!(reward_by_name("command", &json!({})).is_err());
    assert!(reward_by_name("command", &json!({"cmd": "python3 x.py"})).is_err());
}

#[test]
fn rewards_are_callable_from_several_threads() {
    let r = reward_by_name("r1_zero", &Value::Null).unwrap();
    std::thread::scope(|s| {
        for t in 0..4 {
            let r = &r;
            s.spawn(move || {
                for k in 0..50 {
                    let n = t * 100 + k;
                    let out = r.score(
                        "",
                        &format!("</think> <answer> {n} </answer>"),
                        &n.to_string(),
                        &Value::Null,
                    );
                    assert_eq!(out.reward, 1.0);
                }
            });
        }
    });
}

/// math-verify's options reach the grader through the reward's options. Each pair's verdict
/// under each setting is math-verify 0.9.0's (`verify(parse(gold), parse(pred), **options)`,
/// `parse(..., extraction_config=[LatexExtractionConfig()])` for the LaTeX-only row).
#[test]
fn math_verify_options_select_the_grading() {
    let cases = [
        (
            json!({}),
            "$f(x) = 2x + 3$",
            "The answer is $\\boxed{f(t) = 2t + 3}$.",
            0.0,
        ),
        (
            json!({"strict": false}),
            "$f(x) = 2x + 3$",
            "The answer is $\\boxed{f(t) = 2t + 3}$.",
            1.0,
        ),
        (json!({}), "$[-3,6]$", "So $-3 \\le x \\le 6$.", 0.0),
        (
            json!({"allow_set_relation_comp": true}),
            "$[-3,6]$",
            "So $-3 \\le x \\le 6$.",
            1.0,
        ),
        (
            json!({}),
            "$\\frac{\\pi}{4}$",
            "So the answer is 0.79.",
            0.0,
        ),
        (
            json!({"float_rounding": 2}),
            "$\\frac{\\pi}{4}$",
            "So the answer is 0.79.",
            1.0,
        ),
        (json!({}), "$42$", "The answer is 42", 1.0),
        (
            json!({"extraction_config": ["latex"]}),
            "$42$",
            "The answer is 42",
            0.0,
        ),
    ];
    for (opts, gold, pred, want) in cases {
        let out = score("math", opts.clone(), pred, gold);
        assert_eq!(out.reward, want, "{opts} {gold:?} {pred:?}");
    }
    for bad in [
        json!({"strict": "yes"}),
        json!({"float_rounding": -1}),
        json!({"extraction_config": ["latex", "regex"]}),
        json!({"extraction_config": []}),
    ] {
        assert!(reward_by_name("math", &bad).is_err(), "{bad}");
    }
}

/// The registries are the one list of names: every reward name builds (`command` with its
/// required argv), every procedural task is also a reward, and an unknown name lists them all.
#[test]
fn every_registered_name_builds_and_an_unknown_one_lists_them() {
    let names = temper_reward::reward_names();
    for (task, _) in temper_reward::PROCEDURAL_TASKS {
        assert!(names.contains(task), "{task} is not a reward");
    }
    for name in &names {
        let opts = match *name {
            "command" => json!({"cmd": ["true"]}),
            _ => Value::Null,
        };
        let r = reward_by_name(name, &opts).unwrap_or_else(|e| panic!("{name}: {e:#}"));
        assert!(!r.name().is_empty(), "{name}");
    }
    let e = format!(
        "{:#}",
        reward_by_name("arithh", &Value::Null).err().unwrap()
    );
    for name in &names {
        assert!(e.contains(name), "{e}");
    }
}

/// A reward that panics or returns NaN fails for that response only, in input order, on the
/// threads of `score_all`.
#[test]
fn scoring_catches_panics_and_non_finite_rewards() {
    struct Odd;
    impl temper_reward::Reward for Odd {
        fn name(&self) -> &str {
            "odd"
        }
        fn score(&self, _: &str, c: &str, _: &str, _: &Value) -> temper_reward::RewardOutput {
            match c {
                "panic" => panic!("grader exploded"),
                "nan" => temper_reward::RewardOutput::new(f64::NAN),
                _ => temper_reward::RewardOutput::new(c.len() as f64),
            }
        }
    }
    let meta = Value::Null;
    let completions = ["a", "panic", "bbb", "nan", "cc"];
    let inputs: Vec<temper_reward::ScoreInput<'_>> = completions
        .iter()
        .map(|c| temper_reward::ScoreInput {
            prompt: "",
            completion: c,
            ground_truth: "",
            metadata: &meta,
        })
        .collect();
    let out = temper_reward::score_all(&Odd, &inputs);
    let rewards: Vec<Option<f64>> = out
        .iter()
        .map(|o| o.as_ref().ok().map(|o| o.reward))
        .collect();
    assert_eq!(rewards, [Some(1.0), None, Some(3.0), None, Some(2.0)]);
    assert_eq!(
        out[1].as_ref().unwrap_err(),
        &temper_reward::RewardFailure::Panicked("grader exploded".into())
    );
    assert!(matches!(out[3], Err(temper_reward::RewardFailure::NotFinite(v)) if v.is_nan()));
}
