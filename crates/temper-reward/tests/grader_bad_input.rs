//! Input the grader must survive: deeply nested or huge expressions, unbalanced braces. Each
//! scores 0 with the reason (`Graded::error`, `RewardOutput::error` -> the trainer's
//! `reward/errors`), never a hang or a panic. The 60 s bounds only catch hangs; they are not
//! timings. (Text that is not UTF-8 never reaches the grader as `&str`; `temper grade --jsonl`
//! scores such a line 0 with the reason `not_utf8`: see temper-cli's grade_cli test.)
use std::time::{Duration, Instant};

use serde_json::Value;
use temper_reward::{grade, reward_by_name, Grader, Unscored};

fn nested_fracs(depth: usize) -> String {
    let mut s = String::from("1");
    for _ in 0..depth {
        s = format!("\\frac{{{s}}}{{2}}");
    }
    s
}

#[test]
fn deep_nesting_is_refused_quickly() {
    for depth in [200, 5_000] {
        let t = Instant::now();
        let g = grade("1", &format!("\\boxed{{{}}}", nested_fracs(depth)));
        assert!(!g.correct);
        assert_eq!(g.error, Some(Unscored::TooDeep), "depth {depth}");
        assert!(t.elapsed() < Duration::from_secs(60));
    }
    // Square roots nest the same way.
    let g = grade(
        "2",
        &format!(
            "\\boxed{{{}4{}}}",
            "\\sqrt{".repeat(3_000),
            "}".repeat(3_000)
        ),
    );
    assert!(!g.correct);
    assert_eq!(g.error, Some(Unscored::TooDeep));
    // Depth the engine follows still grades.
    assert!(grade("\\frac{1}{8}", &format!("\\boxed{{{}}}", nested_fracs(3))).correct);
}

#[test]
fn huge_expressions_are_refused_not_parsed() {
    let sum = vec!["1"; 200_000].join("+");
    let t = Instant::now();
    let g = grade("200000", &format!("\\boxed{{{sum}}}"));
    assert!(!g.correct);
    assert_eq!(g.error, Some(Unscored::TooLong));
    assert!(t.elapsed() < Duration::from_secs(60));
    // A long free-form solution whose answer is short is fine.
    let prose = "We think about it. ".repeat(20_000) + "The answer is $\\boxed{7}$.";
    let g = grade("7", &prose);
    assert!(g.correct && g.error.is_none());
}

#[test]
fn unbalanced_braces_score_zero_with_the_reason() {
    for pred in [
        "So the answer is \\boxed{5",
        "\\frac{1}{2",
        "The answer is $\\frac{1}{2$.",
        "}{",
    ] {
        let g = grade("\\frac12", pred);
        assert!(!g.correct, "{pred}");
        assert_eq!(g.error, Some(Unscored::Unbalanced), "{pred}");
    }
    // A plain wrong answer, or prose with a `1)` list, is wrong, not an error.
    assert_eq!(grade("5", "6").error, None);
    assert_eq!(grade("5", "1) we add, 2) we get 6").error, None);
}

#[test]
fn the_time_limit_holds_and_is_reported() {
    // A comparison that cannot finish in the limit: a tower of powers evaluated at random points.
    let tower = (0..60).map(|_| "x").collect::<Vec<_>>().join("^");
    let grader = Grader {
        timeout: Duration::from_millis(0),
        ..Grader::default()
    };
    let (ok, why) = grader.judge(&format!("{tower}+1"), &format!("1+{tower}"));
    assert!(!ok);
    assert_eq!(why, Some(Unscored::Timeout));
}

#[test]
fn rewards_report_why_they_gave_up() {
    let deep = format!("\\boxed{{{}}}", nested_fracs(500));
    for name in ["math", "gsm8k"] {
        let r = reward_by_name(name, &Value::Null).unwrap();
        let out = r.score("", &deep, "1", &Value::Null);
        assert_eq!(out.reward, 0.0);
        assert_eq!(out.error.as_deref(), Some("too_deep"), "{name}");
        // A wrong answer is not an error.
        let out = r.score("", "\\boxed{2}", "1", &Value::Null);
        assert_eq!((out.reward, out.error), (0.0, None));
    }
    let r1 = reward_by_name("r1_zero", &Value::Null).unwrap();
    let out = r1.score(
        "",
        "x</think> <answer>\\boxed{5</answer>",
        "5",
        &Value::Null,
    );
    assert_eq!(out.reward, 0.0);
    assert_eq!(out.error.as_deref(), Some("unbalanced"));
    let out = r1.score(
        "",
        &format!("x</think> <answer>{deep}</answer>"),
        "1",
        &Value::Null,
    );
    assert_eq!(out.error.as_deref(), Some("too_deep"));
}

/// Long texts built to make answer finding scan again and again (unclosed delimiters, runs of
/// numbers with no operator, many anchor words) stay linear enough: each is graded well inside
/// the bound (which only catches hangs; it is not a timing).
#[test]
fn adversarial_texts_do_not_hang_answer_finding() {
    let patterns = [
        "\\[".repeat(100_000),
        "\\(".repeat(100_000),
        "$$ x ".repeat(40_000),
        "$".repeat(200_000),
        "1 ".repeat(100_000),
        "1+".repeat(100_000),
        "answer ".repeat(30_000),
        "final answer ".repeat(15_000),
        "\\boxed{".repeat(30_000),
        "\\boxed{1}".repeat(20_000),
        " [".repeat(100_000),
        "-\\frac{1}{".repeat(20_000),
        "1,000".repeat(40_000),
        // Words, separators and commands the external corpus's rules read.
        "(1,2)or".repeat(30_000),
        " and ".repeat(40_000),
        "1,2;".repeat(50_000),
        "\\\\left(".repeat(30_000),
        "$a \\to b$ ".repeat(20_000),
        "$x = 1,$ ".repeat(20_000),
        "$|x - 1| < 3$ ".repeat(15_000),
    ];
    for p in &patterns {
        // As a response, and as a ground truth (read as a response when it is prose).
        for (gold, pred) in [("1", p.as_str()), (p.as_str(), "1")] {
            let t = Instant::now();
            let g = grade(gold, pred);
            let took = t.elapsed();
            println!("{:?}...: {took:?}", &p[..12.min(p.len())]);
            assert!(took < Duration::from_secs(60), "{:?}", &p[..12]);
            let _ = g;
        }
    }
}

/// Multi-byte characters where answer finding measures windows in bytes (after "answer", "final
/// answer", around `$`, in numbers) never split a character.
#[test]
fn windows_never_split_characters() {
    for fill in ["é", "€", "数", "🙂", "\u{200b}"] {
        for n in 0..120 {
            let f = fill.repeat(n);
            for text in [
                format!("answer {f}= 5"),
                format!("answer: {f} 5 {f}"),
                format!("final answer {f} is 5"),
                format!("The final answer is {f}$5$. I hope"),
                format!("answer {f}$\\frac{{1}}{{2}}$"),
                format!("{f}$5{f}$ {f}\\(6{f}\\) 7{f}"),
                format!("**{f}** 1,{f}000 -{f}.5 3/{f}4. A{f}"),
                format!("(1,{f}2)or{f}(2,1) and{f} $x{f},$ $a{f}\\to b$ 1,{f}5"),
            ] {
                let _ = grade("5", &text);
            }
        }
    }
}
