//! Hand-written cases for each grader rule: (gold, prediction, math-verify's verdict). People
//! chose the pairs; the verdicts are math-verify 0.9.0's, on the pair as the test hands it to
//! temper (a bare answer inside `$..$`), and `tools/grader_rules_check.py` checks
//! that every one still is (`--fix` rewrites any that is not).
use temper_reward::grade;

#[path = "grader_rules/model_answers.rs"]
mod model_answers;

/// A bare answer (no math markup, no words) is an answer in math mode; prose is handed over as
/// it is (the same rule as tools/grader_rules_check.py).
fn wrap(s: &str) -> String {
    let markup = ["$", "\\(", "\\[", "\\boxed", "\\fbox"]
        .iter()
        .any(|m| s.contains(m));
    if markup || is_prose(s) {
        s.to_string()
    } else {
        format!("${s}$")
    }
}

/// Four letters or more in a row outside LaTeX commands and `\text{}` groups.
fn is_prose(s: &str) -> bool {
    let mut bare = String::new();
    let mut rest = s;
    while let Some(k) = rest.find('\\') {
        bare.push_str(&rest[..k]);
        bare.push(' ');
        let after = &rest[k + 1..];
        let name_len = after
            .find(|c: char| !c.is_ascii_alphabetic())
            .unwrap_or(after.len());
        rest = &after[name_len..];
        if matches!(&after[..name_len], "text" | "begin" | "end") && rest.starts_with('{') {
            rest = rest.find('}').map_or("", |e| &rest[e + 1..]);
        }
    }
    bare.push_str(rest);
    let mut run = 0;
    bare.chars().any(|c| {
        run = if c.is_ascii_alphabetic() { run + 1 } else { 0 };
        run >= 4
    })
}

fn check(cases: &[(&str, &str, bool)]) {
    let mut bad = vec![];
    for &(g, p, want) in cases {
        let got = grade(&wrap(g), &wrap(p));
        if got.correct != want {
            bad.push(format!(
                "gold={g:?} pred={p:?} want={want} got={} (gold_answer={:?}, pred_answer={:?})",
                got.correct, got.gold_answer, got.pred_answer
            ));
        }
    }
    assert!(
        bad.is_empty(),
        "{} failures:\n{}",
        bad.len(),
        bad.join("\n")
    );
}

#[test]
fn plain_numbers() {
    check(&[
        ("18", "18", true),
        ("18", "$18", true),
        ("18", "18.00", true),
        ("18", "\\boxed{18}", true),
        ("18", "18 dollars", true),
        ("18", "18.", true),
        ("18", "19", false),
        ("18", "17", false),
        ("-5", "-5", true),
        ("-5", "5", false),
        ("7425000", "7,425,000", true),
        ("1000", "1 000", false),
        ("1000", "1000.0", true),
        ("1000.0", "1,000.0", true),
        ("1000.99", "$1,000.99", true),
        ("0.4", ".4", true),
        ("70000", "$70,000", true),
        ("32349", "\\boxed{32,\\! 349}", true),
        ("32349", "\\boxed{32, 349}", false),
        (
            "11111111100",
            "is $\\boxed{11,\\! 111,\\! 111,\\! 100}$",
            true,
        ),
        ("14916", "\\boxed{14{,}916}", true),
        ("2", "AZYUK2A", false),
        ("1000.99", "1000,99", false),
        ("1.22", "1,22", false),
    ]);
}

#[test]
fn fractions_and_decimals() {
    check(&[
        ("\\frac{1}{2}", "0.5", true),
        ("0.5", "\\frac{1}{2}", true),
        ("\\frac{1}{2}", "1/2", true),
        ("\\boxed{1}", "1/2", false),
        ("10/9", "\\frac{10}{9}", true),
        ("-10/9", "-\\frac{10}{9}", true),
        ("$1/3$", "$\\frac13 $", true),
        ("$1$", "$\\frac3{3} $", true),
        ("$1/3$", "$\\dfrac{1}{3}$", true),
        ("$1/3$", "$\\tfrac{1}{3}$", true),
        ("$1/3$", "$\\cfrac{1}{3}$", true),
        ("$1/3$", "$\\left( \\frac{1}{3} \\right)$", true),
        ("$1/3$", "$\\frac{1}{3} \\text{meters}$", true),
        ("$\\frac{1}{12}$", "$0.0833333333333333$", true),
        ("\\frac{1}{3}", "0.3333", false),
        ("\\frac{1}{3}", "0.333333", true),
        ("\\frac{1}{3}", "\\frac{2}{6}", true),
        ("3\\frac{1}{2}", "3.5", true),
        ("3\\frac{1}{2}", "\\frac{7}{2}", true),
        ("7 3/4", "7.75", false),
        ("1.5e3", "1500", false),
        ("\\frac{9}{4}\\pi", "\\frac94\\pi", true),
        (
            "$\\frac{14}{3}$",
            "$2+\\frac{5}{3}+1=\\boxed{\\frac{14}{3}}$",
            true,
        ),
    ]);
}

#[test]
fn percent_degrees_units_text() {
    check(&[
        ("$28\\%$", "28 percent", true),
        ("$28\\%$", "28 pct", true),
        ("$28\\%$", "28 %", true),
        ("$28\\%$", "$\\boxed{28 percent}", true),
        ("$28\\%$", "28", true),
        ("$28\\%$", "0.28", true),
        ("$0.28$", "28", false),
        ("$28/100$", "28", false),
        ("$28$", "28/100", false),
        ("90^\\circ", "90", true),
        ("$90^\\circ$", "\\boxed{90^{\\circ}}", true),
        ("$15\\mbox{ cm}^2$", "\\boxed{15\\mbox{ cm}^2}", true),
        ("15", "15\\text{ cm}^2", true),
        (
            "$125$ miles",
            "The distance is $\\boxed{125\\textnormal{ miles}}.$",
            true,
        ),
        (
            "\\text{Evelyn}",
            "Therefore, $\\boxed{\\text{Evelyn}}$ is our answer.",
            true,
        ),
        ("\\text{(C)}", "\\boxed{\\text{C}}", true),
        ("$\\text{E}$", "$E$", true),
        ("\\text{E}", "\\text{D}", false),
    ]);
}

#[test]
fn roots_powers_constants() {
    check(&[
        ("$\\sqrt{3}$", "$\\sqrt3 $", true),
        ("3\\sqrt{13}", "\\sqrt{117}", true),
        ("2\\sqrt{2}", "\\sqrt{8}", true),
        (
            "\\sqrt{2}+\\sqrt{5}",
            "The answer is $\\boxed{\\sqrt 2+\\sqrt 5}$",
            true,
        ),
        ("$2$", "$\\frac{1+\\sqrt{5}}{2}$", false),
        ("$4$", "$4\\sqrt{2}$", false),
        ("$1\\sqrt{19}$", "$1$", false),
        ("\\sqrt[3]{8}", "2", true),
        ("2^{10}", "1024", true),
        ("$2$", "$2^{10}.$", true),
        ("\\pi", "3.14", false),
        ("2\\pi", "\\pi \\cdot 2", true),
        ("\\frac{\\pi}{2}", "90", false),
        ("e^2", "\\exp(2)", true),
        ("\\ln 8", "3\\ln 2", true),
        ("\\log_2 8", "3", true),
        (
            "$\\frac{\\sqrt{\\sqrt{11}+\\sqrt{194}}}{15+2\\sqrt{33}}$",
            "$\\frac{\\sqrt{\\sqrt{11}+\\sqrt{194}}}{2\\sqrt{33}+15}$",
            true,
        ),
        ("$4$", "$\\frac{34}{16}+\\frac{\\sqrt{1358}}{16}$", false),
        ("\\sqrt{17}", "4.123105625617661", true),
        ("3+4i", "4i+3", true),
        ("\\binom{5}{2}", "10", true),
        ("5!", "120", true),
    ]);
}

#[test]
fn symbolic_expressions() {
    check(&[
        ("$2-2p$", "Thus $x-p=\\boxed{2-2p}$.", true),
        ("$\\frac{x+2}{7}$", "$\\frac{x}{7}+\\frac{2}{7}$", true),
        ("$\\tan^2(y)+1$", "$\\sec^2(y)$", true),
        ("$(a+5)(b+2)$", "$(+5)(b+2)$", false),
        ("$x+2n+1$", "$x+1$", false),
        ("2 \\sin b \\cos a", "2\\cos a \\sin b", true),
        ("\\frac{\\pi r}{h+r}", "\\frac{r\\pi}{r+h}", true),
        ("x^2+2x+1", "(x+1)^2", true),
        ("x^2+2x+1", "(x-1)^2", false),
        ("2x", "2*x", true),
        ("xy", "yx", true),
        ("\\sin^{-1}(x)", "\\arcsin x", true),
    ]);
}

#[test]
fn equations_and_relations() {
    check(&[
        ("x=3", "3", true),
        ("3", "x=3", true),
        ("$k=1$", "$1$", true),
        ("$1$", "$k = \\frac{1}{3}$", false),
        ("$1/3$", "$k = \\frac{1}{3}$", true),
        ("$x = 11$", "$x = 5+5+1 = 7 =11$", true),
        ("$7 = 11a+c$", "$11a+c$", false),
        ("$x = 1/3$", "$x = 5+5+1 = 1/3 \\approx 11$", true),
        ("$11$", "$x\\approx11$", true),
        ("$1/3$", "$x=1/3\\approx1.3$", true),
        ("$a +3z = 0$", "$0$", false),
        ("$2x + z = 1$", "$1$", false),
        ("$a^2 + b = 0$", "$0$", false),
        ("$z = 1 + 1 = 2$", "$z = 3+3 = 2$", true),
        ("$2x+4y-3=0$", "$y=-\\frac{1}{2}x+\\frac{3}{4}$", true),
        ("$x^2/4 + y^2/3 = 1$", "$x^2/16 + y^2/12 = 1/4$", true),
        ("$34x+45y-20z+100=0$", "$-34x-45y+20z-100=0$", true),
        (
            "$x-2y+z-1=0$",
            "so the plane is $\\boxed{x-2y+z-1=0}$.",
            true,
        ),
        ("x = 3", "y = 3", false),
        ("$x >= 5$", "Therefore $x \\geq 5$ is the solution.", true),
        ("$x < 3$", "We find that $x \\lt 3$.", true),
        ("$x \\leq 2$", "$x <= 2$", true),
        ("$x != 3$", "$x \\neq 3$", true),
        ("$x > 5$", "$x < 5$", false),
        ("$x \\geq 5$", "$x \\leq 5$", false),
        ("$x \\leq 5$", "$5 \\geq x$", true),
        ("$x < 1$", "$-x > -1$", true),
        ("$x < 1$", "$x > -1$", false),
        ("$x <= 1$", "$-x >= -1$", true),
        ("$-2 \\le x \\le 7$", "$x \\in [-2,7]$", true),
        ("x > 5", "(5, \\infty)", true),
    ]);
}

#[test]
fn tuples_sets_intervals() {
    check(&[
        ("$[0,1)$", "$[0,1)$", true),
        ("$[0,9)$", "$[0,1)$", false),
        ("$(0,9)$", "$[0,9)$", false),
        ("$1$", "$-[0,1)$", false),
        ("$(3, \\frac{\\pi}{2})$", "the polar coordinates are $\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}.$", true),
        ("$-2,1$", "the only integer roots are $\\boxed{-2,1}.$", true),
        ("$-2,1$", "$\\boxed{1,-2}$", true),
        ("$(6,31,-1)$", "$(p,q,r) = \\boxed{(6,31,-1)}.$", true),
        ("(6,31,-1)", "(31,6,-1)", false),
        ("$1 \\pm \\sqrt{19}$", "$x = \\boxed{1 \\pm \\sqrt{19}}.$", true),
        ("1 \\pm \\sqrt{19}", "1 + \\sqrt{19}, 1 - \\sqrt{19}", true),
        ("$3 \\pm 2 \\sqrt{2}$", "$3 \\pm \\sqrt{8}$", true),
        ("$\\{1\\pm\\sqrt{5},-2\\}$", "$\\boxed{\\{1\\pm\\sqrt{5},-2\\}}.$", true),
        ("\\{1,2,3\\}", "\\{3,2,1\\}", true),
        ("\\{1,2,3\\}", "\\{3,2\\}", false),
        ("(1,2)", "(2,1)", false),
        ("$(3,1)$", "${1,3}$", false),
        ("$(1,3)$", "${1,3}$", true),
        ("$[-1, -\\frac{1}{2}) \\cup (-\\frac{1}{2}, 0) \\cup (0, 1) \\cup (1, \\infty)$", "$\\boxed{[-1, -\\tfrac12) \\cup (-\\tfrac12, 0) \\cup (0, 1) \\cup (1, \\infty)}.$", true),
        ("x \\in \\boxed{\\{-1\\} \\cup [0,7)}.$", "x \\in \\boxed{\\{-1\\} \\cup [0,7)}.$", true),
        ("$(-\\infty,-1)\\cup(6,+\\infty)$", "(-\\infty, -1) \\cup (6, \\infty)", true),
        ("$(-\\infty,-1)\\cup(6,+\\infty)$", "(-\\infty, -1] \\cup (6, \\infty)", false),
        ("$(\\frac{3}{5},\\frac{8}{3}]$", "$(0.6,\\frac{8}{3}]$", true),
        ("$(1,\\frac{9}{2})$", "$(1,4.5)$", true),
        ("$[-3,2]$", "$\\boxed{(-\\infty, -3] \\cup [2, \\infty)}$", false),
        ("\\boxed{(-6, 10)}", "The solution is \\( x \\in (-6, 10) \\). Final Answer: The final answer is \\((-6, 10)\\).", true),
        ("$\\boxed{1}\\boxed{2}$", "$\\boxed{1,2}$", true),
        ("1, -2", "The integers are \\boxed{-2} and \\boxed{1}.", true),
        ("\\emptyset", "\\varnothing", false),
    ]);
}

#[test]
fn matrices() {
    check(&[
        (
            r"$\begin{pmatrix}1 & 0 \\ 0 & 1\end{pmatrix}$",
            r"The identity matrix is $ \begin{pmatrix}1 & 0 \\ 0 & 1\end{pmatrix} $.",
            true,
        ),
        (
            r"$\begin{bmatrix}0 & 0 \\0 & 0\end{bmatrix}$",
            r"$ \begin{pmatrix}0 & 0 \\0 & 0\end{pmatrix} $",
            true,
        ),
        (
            r"$\begin{pmatrix}1 & 2 \\3 & 4\end{pmatrix}$",
            r"$ \left[\begin{array}{cc}1 & 2 \\3 & 4\end{array}\right] $",
            true,
        ),
        (
            r"$\begin{pmatrix}1 & 2 \\ 3 & 4\end{pmatrix}$",
            r"The matrix is $\begin{pmatrix}1 & 2 \\ 3 & 5\end{pmatrix}$",
            false,
        ),
        (
            r"\begin{pmatrix} 3 \\ 2 \\ -6 \end{pmatrix}",
            r"\begin{pmatrix} 3 \\ 2 \\ -6 \end{pmatrix}",
            true,
        ),
        (
            r"\begin{pmatrix} \frac{1}{2} \\ 1 \end{pmatrix}",
            r"\begin{pmatrix} 0.5 \\ 1 \end{pmatrix}",
            true,
        ),
    ]);
}

#[test]
fn extraction_from_prose() {
    check(&[
        ("$9$", "Answer \\[ 9 \\]", true),
        ("$9$", "Answer $ 9 $", true),
        ("$9$", "Answer \\( 9 \\)", true),
        ("$10$", "Answer \\( (9+1) \\)", true),
        ("$34$", "Final Answer: The largest $n$ is 34.", true),
        (
            "$2/3$",
            "P(A) = 2/3 Therefore, the probability that Alice wins the game is 2/3.",
            true,
        ),
        (
            "$12$",
            "Therefore, there are 12 distinct arithmetic sequences that meet the conditions.",
            true,
        ),
        ("$\\frac{1}{3}$", "The answer is $\\frac{1}{3}.$", false),
        ("$1$", "The answer is $1/3.$", true),
        ("$(1,2)$", "$(1,2).$", false),
        ("$5$", "$5 \\text{ cm}.$", true),
        ("$42$", "$42.$", true),
        ("$1, 2, 3$", "$1, 2, 3, ...$", false),
        (
            "12000023",
            "Final Answer: The final answer is 12,000,023. I hope it is correct.",
            true,
        ),
        (
            "$16386.20$",
            "worth $\\boxed{\\$16,\\!386.20}$ at the end.",
            true,
        ),
        (
            "$[0,1)$",
            "Final Answer: The final answer is $(0, 1)$. I hope it is correct.",
            false,
        ),
        ("#### 18", "She makes 9 * 2 = $18 every day.\n#### 18", true),
        ("Janet makes $2 per egg.\n#### 18", "\\boxed{18}", true),
    ]);
}

#[test]
fn more_forms() {
    check(&[
        ("\\frac{\\sqrt{3}}{2}", "\\sqrt{3}/2", true),
        ("\\dfrac{1}{2}", "0.50", true),
        ("$10^{2^n-n-1}$", "10^{2^{n}-(n+1)}", true),
        ("18", "\\$18.00", false),
        ("18\\%", "18%", true),
        ("x \\in (-\\infty, 3)", "(-\\infty, 3)", true),
        ("(-\\infty, 3)", "x < 3", false),
        ("(-\\infty, 3)", "x \\le 3", false),
        ("\\text{yes}", "Yes", true),
        ("5\\text{ inches}", "5", true),
        ("\\frac{5}{2}", "2\\frac{1}{2}", true),
        ("1/2", "2/4", true),
        ("-\\frac{1}{2}", "\\frac{-1}{2}", true),
        ("\\frac12", ".5", true),
        ("\\left[ 0, 1 \\right]", "[0,1]", true),
        ("2, 3", "\\{2, 3\\}", true),
        ("12", "12,000", false),
        ("\\infty", "\\infty", true),
        ("-\\infty", "\\infty", false),
        ("x^2", "x^{2}", true),
        ("\\sqrt{x}", "x^{1/2}", true),
        ("0", "-0", true),
        (
            "\\boxed{5}",
            "<think> hmm </think> <answer>5</answer>",
            false,
        ),
        ("\\frac{1}{2}", "\\frac{1}{3}", false),
        ("3", "3x", false),
        ("\\sqrt{2}", "1.414", false),
        ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}", true),
        ("\\cos(\\pi/3)", "1/2", true),
    ]);
}

#[test]
fn time_limit_per_comparison() {
    use std::time::Duration;
    use temper_reward::Grader;
    let g = Grader::default();
    assert!(g.answers_match("x^2+2x+1", "(x+1)^2"));
    // With no time at all, anything needing the expression engine is "not equal"; plain numbers
    // and identical strings are decided before it.
    let none = Grader {
        timeout: Duration::ZERO,
        ..Grader::default()
    };
    assert!(!none.answers_match("x^2+2x+1", "(x+1)^2"));
    assert!(none.answers_match("18", "18.0"));
    assert!(none.answers_match("\\frac{1}{2}", "\\frac{1}{2}"));
}

#[test]
fn never_panics_on_odd_text() {
    let samples = [
        "Janet’s ducks lay 16 eggs — she sells them for €2 each: $ 3 × 4 = 12 $ …",
        "π ≈ 3.14159 and √2 ≈ 1.414, answer: ½",
        "\\boxed{",
        "\\boxed{\\frac{1}{",
        "$$",
        "\\(",
        "\\[ \\]",
        "#### ",
        "}{",
        "^^^",
        "\\",
        "\\frac{}{}",
        "\\sqrt[",
        "((((((((((((((((((((((((((((((((((((((((((((((((((((1",
        "2^{2^{2^{2^{2^{2^{2^{2}}}}}}}",
        "10^{100000}",
        "1/0",
        "0/0",
        "\\log_1 5",
        "0^{-1}",
        "\\begin{pmatrix} 1 & 2 \\\\ 3 \\end{pmatrix}",
        "x = = 3",
        ",,,",
        "e^{e^{e^{e^{10}}}}",
        "100000000000000000000000000000000000000000000000000!",
        "\\binom{10000000}{5000000}",
    ];
    for a in samples {
        for b in samples {
            let _ = grade(a, b);
        }
        let _ = grade("18", a);
        let _ = grade(a, "18");
    }
    // Every byte-prefix of a unicode-heavy string (cut points inside characters).
    let s = samples[0];
    for k in 0..=s.len() {
        if let Some(prefix) = s.get(..k) {
            let _ = grade(prefix, s);
        }
    }
}

#[test]
fn rounded_gold_is_answered_by_an_exact_value_that_rounds_to_it() {
    check(&[
        ("0.33", "\\frac13", false),
        ("0.333", "\\frac{1}{3}", false),
        ("2.6667", "\\frac83", false),
        ("1.41", "\\sqrt2", false),
        ("3.14", "\\pi", false),
        ("-0.67", "-\\frac23", false),
        ("0.34", "\\frac13", false),
        // The prediction is the rounding: not accepted for an exact gold.
        ("\\frac13", "0.33", false),
        // A terminating exact value or a decimal compares as it is.
        ("0.33", "\\frac{33}{100}", true),
        ("0.33", "\\frac{331}{1000}", false),
        ("0.33", "0.333", false),
        // One decimal is taken as exact: 2.45 does not answer 2.5.
        ("2.5", "\\frac{49}{20}", false),
        ("(0.6, 2.6667]", "(\\frac35, \\frac83]", false),
        (
            "\\begin{pmatrix}0.33\\\\0.5\\end{pmatrix}",
            "\\begin{pmatrix}\\frac13\\\\\\frac12\\end{pmatrix}",
            false,
        ),
    ]);
}

#[test]
fn inequalities_answer_intervals_and_unions() {
    check(&[
        ("(0,1)", "0<f(x)<1", false),
        ("(0,1)", "0<f(x)\\le 1", false),
        ("[2,5)", "2 \\le x < 5", false),
        ("(3,\\infty)", "x>3", false),
        ("(3,\\infty)", "x \\ge 3", false),
        (
            "(-\\infty,1]\\cup[2,\\infty)",
            "x \\le 1 \\text{ or } x \\ge 2",
            false,
        ),
        (
            "(-\\infty,1]\\cup[2,\\infty)",
            "x \\ge 2 \\text{ or } x \\le 1",
            false,
        ),
        (
            "(-\\infty,1]\\cup[2,\\infty)",
            "x < 1 \\text{ or } x \\ge 2",
            false,
        ),
    ]);
}

#[test]
fn thousands_groups_are_not_decimal_commas() {
    check(&[
        ("1234", "1,234", true),
        ("1.234", "1,234", false),
        ("0.234", "0,234", true),
        ("2.74", "2,74", false),
        ("1234567", "1,234,567", true),
        ("1234.5", "1,234.5", true),
        (
            "99, 100",
            "The roots are $\\boxed{99}$ and $\\boxed{100}$.",
            true,
        ),
    ]);
}
