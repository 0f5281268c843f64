//! The math grader: extract the final answer from a text, then decide whether two answers are
//! the same (plain-number fast path, normalised strings, then the expression engine).
use crate::expr::{equivalent, exact_value, parse, EquivOptions, Expr};
use crate::extract::after_hashes;
use crate::grader_options::ExtractionTargets;
use crate::grader_options::GraderOptions;
use crate::normalize::{normalize, plain_equal, plain_number};
use crate::ranked::{candidates, Candidate};
use num_traits::ToPrimitive;
use serde::Serialize;
use std::time::{Duration, Instant};

/// Longest answer handed to the expression engine; longer ones are compared as strings only.
const MAX_PARSE_LEN: usize = 1000;

/// How far answer extraction may go when the text has no `\boxed{}` / `####` / answer marker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Extraction {
    /// The whole text if it is an answer, else "the answer is ...", else the last math span.
    Strict,
    /// As `Strict`, then the last number in the text.
    LastNumber,
}

/// The result of grading one prediction.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Graded {
    pub correct: bool,
    pub gold_answer: Option<String>,
    pub pred_answer: Option<String>,
    /// Why the prediction could not be graded (it then counts as wrong): see [`Unscored`].
    pub error: Option<Unscored>,
}

/// Why a comparison gave up instead of deciding. Each is a wrong answer for the reward, and
/// the trainer counts it in `reward/errors` under this name.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Unscored {
    /// The comparison ran past the grader's time limit.
    Timeout,
    /// Brackets nested deeper than the expression engine follows.
    TooDeep,
    /// An answer longer than the expression engine reads (`MAX_PARSE_LEN`).
    TooLong,
    /// Unbalanced braces (`\boxed{5`, `\frac{1}{2`).
    Unbalanced,
}

impl Unscored {
    pub fn as_str(self) -> &'static str {
        match self {
            Unscored::Timeout => "timeout",
            Unscored::TooDeep => "too_deep",
            Unscored::TooLong => "too_long",
            Unscored::Unbalanced => "unbalanced",
        }
    }
}

/// Whether `{}`, `()` and `[]` each open and close the same number of times, braces in order.
/// (Parentheses and brackets are only counted: half-open intervals mix them.)
fn balanced(s: &str) -> bool {
    let count = |c: char| s.chars().filter(|&x| x == c).count();
    braces_balanced(s) && count('(') + count('[') == count(')') + count(']')
}

/// Brackets nested deeper than this are not an answer anyone writes (the parser's own limit
/// is on its recursion, which a long answer may reach sooner).
const MAX_NESTING: usize = 60;

/// The deepest nesting of `{}`, `()` and `[]` in `s`.
fn nesting(s: &str) -> usize {
    let (mut depth, mut max) = (0usize, 0usize);
    for c in s.chars() {
        match c {
            '{' | '(' | '[' => {
                depth += 1;
                max = max.max(depth);
            }
            '}' | ')' | ']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    max
}

/// Whether every `{` is closed by a later `}`.
pub fn braces_balanced(s: &str) -> bool {
    let mut depth = 0i64;
    for c in s.chars() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth < 0 {
                    return false;
                }
            }
            _ => {}
        }
    }
    depth == 0
}

/// Grader settings: the time limit per comparison and math-verify's options.
#[derive(Clone, Debug)]
pub struct Grader {
    pub timeout: Duration,
    pub options: GraderOptions,
}

impl Default for Grader {
    fn default() -> Self {
        Grader {
            timeout: Duration::from_secs(1),
            options: GraderOptions::default(),
        }
    }
}

/// Replace `\text{...}` groups by a placeholder so their words do not count as prose.
fn without_text_groups(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(k) = rest.find("\\text") {
        out.push_str(&rest[..k]);
        let after = &rest[k..];
        match after
            .find('{')
            .and_then(|o| crate::normalize::matching_brace(&after[o..]).map(|i| o + i + 1))
        {
            Some(end) => {
                out.push('T');
                rest = &after[end..];
            }
            None => {
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out
}

const MATH_WORDS: &[&str] = &[
    "sqrt", "sin", "cos", "tan", "sec", "csc", "cot", "arcsin", "arccos", "arctan", "sinh", "cosh",
    "tanh", "log", "ln", "exp", "pi", "inf", "infty", "oo", "abs",
];

/// Whether the text reads as words: a run of four or more plain letters that is not a math name,
/// or two runs of two or more (`xy` and `2ab` are products of variables, `the answer` is prose).
fn is_prose(s: &str) -> bool {
    let s = without_text_groups(s);
    let mut short_runs = 0;
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i].is_ascii_alphabetic() {
            let st = i;
            while i < b.len() && b[i].is_ascii_alphabetic() {
                i += 1;
            }
            let escaped = st > 0 && b[st - 1] == b'\\';
            // `\begin{pmatrix}` names an environment.
            let env = st > 0 && b[st - 1] == b'{' && s[..st].ends_with("\\begin{")
                || s[..st].ends_with("\\end{");
            let run = &s[st..i];
            if !escaped && !env && run.len() >= 2 && !MATH_WORDS.contains(&run) {
                short_runs += 1;
                if run.len() >= 4 || short_runs >= 2 {
                    return true;
                }
            }
        } else {
            i += 1;
        }
    }
    false
}

/// Whether the whole text reads as one answer (`18`, `$18`, `18 dollars`, `x = 3`).
pub fn looks_like_answer(s: &str) -> bool {
    let t = s.trim();
    if t.is_empty() || t.len() > MAX_PARSE_LEN {
        return false;
    }
    let n = normalize(t);
    if plain_number(&n).is_some() {
        return true;
    }
    !is_prose(&n) && parse(&n).is_ok()
}

/// The final answer in a text, found the way math-verify ranks candidates (see [`crate::ranked`]):
/// `\boxed{}` and "final answer ... is", then "answer: ...", then the last math environment or
/// plain number. In `Strict` mode only LaTeX is read (no plain numbers). An `<answer>` block, if
/// present, is searched alone. `None` when nothing qualifies.
pub fn extract_answer(text: &str, mode: Extraction) -> Option<String> {
    let targets = match mode {
        Extraction::LastNumber => ExtractionTargets::default(),
        Extraction::Strict => ExtractionTargets {
            expr: false,
            ..ExtractionTargets::default()
        },
    };
    ranked_answer(text, targets)
}

/// The answer in `text` for the given extraction targets: the best-ranked candidate.
pub fn ranked_answer(text: &str, targets: ExtractionTargets) -> Option<String> {
    let found = candidates(text, targets);
    let render = |c: &Candidate| {
        let t = c.text.trim();
        if c.percent && !t.ends_with('%') {
            format!("{t}\\%")
        } else {
            t.to_string()
        }
    };
    found.iter().find(|c| !unreadable(c)).map(render)
}

/// Whether math-verify cannot read a candidate, and so moves on to the next one. Its LaTeX parser
/// rarely fails; the one case models hit often is math ending in a period (`$\frac{1}{3}.$`, but
/// not the number `$5.$`) or a comma (`$b^{17} = 1,$`), and a plain expression it cannot read.
/// Otherwise the first is taken, so that a too-deep or too-long answer stays an error rather than
/// a reason to read some other number.
fn unreadable(c: &Candidate) -> bool {
    let t = c.text.trim_end();
    if c.latex {
        let trailing_mark = t.ends_with(['.', ',']) && plain_number(&t[..t.len() - 1]).is_none();
        trailing_mark || has_arrow(t)
    } else {
        // Too long to parse: kept, so that judging reports it (`too_long`).
        t.len() <= MAX_PARSE_LEN && parse(&normalize(t)).is_err()
    }
}

/// Whether LaTeX holds an arrow between statements (`5+b=8 \Rightarrow b=3`, `a \to b` outside
/// a limit), which math-verify's parser rejects.
fn has_arrow(t: &str) -> bool {
    const ARROWS: &[&str] = &[
        "\\Rightarrow",
        "\\implies",
        "\\Longrightarrow",
        "\\iff",
        "\\Leftrightarrow",
        "\\rightarrow",
        "\\to",
    ];
    let in_limit = t.contains("\\lim");
    ARROWS.iter().any(|a| {
        t.match_indices(a).any(|(k, _)| {
            let after = t[k + a.len()..].chars().next();
            let command_ends = !after.is_some_and(|c| c.is_ascii_alphabetic());
            command_ends && !(*a == "\\to" && in_limit)
        })
    })
}

/// Whether a ground truth is written with math markup (then its answer is found in it as in a
/// response); otherwise the whole text is the answer, as verl boxes a dataset's answer field.
fn has_math_markup(s: &str) -> bool {
    ["$", "\\(", "\\[", "\\boxed", "\\fbox"]
        .iter()
        .any(|m| s.contains(m))
}

/// The answer in a ground truth: GSM8K `####`, an answer found in math markup, or the text
/// itself. Without markup, a plain number is read as numbers in a response are (`1,22` is 1.22)
/// and prose (a sentence, a solution) as a response is; anything else is the answer as a whole.
pub fn gold_answer(gold: &str) -> String {
    match gold_reading(gold) {
        GoldReading::Answer(a) | GoldReading::TextOnly(a) => a,
    }
}

/// What a ground truth gives to compare with.
enum GoldReading {
    Answer(String),
    /// Math in the ground truth that math-verify cannot read (`$a = b = \frac{1}{4},$`, every
    /// candidate passed over): it keeps the text it found and compares it as text only.
    TextOnly(String),
}

fn gold_reading(gold: &str) -> GoldReading {
    if let Some(a) = readable_gold_answer(gold) {
        return GoldReading::Answer(a);
    }
    match candidates(gold, ExtractionTargets::default()).first() {
        Some(first) => GoldReading::TextOnly(first.text.trim().to_string()),
        None => GoldReading::Answer(gold.trim().to_string()),
    }
}

/// The answer of a ground truth as [`gold_answer`] reads it, `None` when its math markup holds
/// nothing math-verify can read.
fn readable_gold_answer(gold: &str) -> Option<String> {
    if let Some(h) = after_hashes(gold) {
        return Some(h.to_string());
    }
    if has_math_markup(gold) {
        return ranked_answer(gold, ExtractionTargets::default());
    }
    if is_prose(gold) {
        if let Some(a) = ranked_answer(gold, ExtractionTargets::default()) {
            return Some(a);
        }
    } else if let Some(number) = crate::ranked::whole_plain_number(gold) {
        return Some(number);
    }
    Some(gold.trim().to_string())
}

fn text_key(s: &str) -> String {
    without_text_braces(s)
        .chars()
        .filter(|c| !c.is_whitespace() && !matches!(c, '(' | ')' | '{' | '}' | '.'))
        .collect::<String>()
        .to_lowercase()
}

fn without_text_braces(s: &str) -> String {
    s.replace("\\text", "")
        .replace("\\mathrm", "")
        .replace("\\textbf", "")
}

impl Grader {
    /// Grade a prediction text against a ground-truth text (both may be full solutions).
    pub fn grade(&self, gold: &str, pred: &str) -> Graded {
        let (g, text_only) = match gold_reading(gold) {
            GoldReading::Answer(a) => (a, false),
            GoldReading::TextOnly(t) => (t, true),
        };
        let p = ranked_answer(pred, self.options.extraction_config);
        // A gold read as text only matches the same text, which may be a response's own
        // unreadable math (`$a = b = c,$` answers `$a = b = c,$`: math-verify compares the texts
        // it kept on both sides).
        let p = match p {
            None if text_only => candidates(pred, self.options.extraction_config)
                .first()
                .map(|c| c.text.trim().to_string()),
            p => p,
        };
        let (correct, mut error) = match &p {
            Some(p) if text_only => (p.trim() == g, None),
            Some(p) => self.judge(&g, p),
            None => (false, None),
        };
        // Unbalanced braces in the response (an unclosed `\boxed{`, `\frac{1}{2`): whatever
        // was read out of it is not trusted to be the intended answer. Parentheses are not
        // counted here: prose has `1)` lists.
        if !correct && error.is_none() && !braces_balanced(pred) {
            error = Some(Unscored::Unbalanced);
        }
        Graded {
            correct,
            gold_answer: Some(g),
            pred_answer: p,
            error,
        }
    }

    /// Whether two extracted answers are equivalent and, when they are not, whether that is
    /// because the comparison gave up ([`Unscored`]) rather than decided.
    pub fn judge(&self, gold: &str, pred: &str) -> (bool, Option<Unscored>) {
        let started = Instant::now();
        // An answer with unclosed braces (`\frac{1}{2`) is not read.
        if !braces_balanced(pred) {
            return (false, Some(Unscored::Unbalanced));
        }
        if self.answers_match(gold, pred) {
            return (true, None);
        }
        (false, self.why_unscored(gold, pred, started))
    }

    /// The diagnosis of a rejected comparison, run only on the reject path.
    fn why_unscored(&self, gold: &str, pred: &str, started: Instant) -> Option<Unscored> {
        if started.elapsed() >= self.timeout {
            return Some(Unscored::Timeout);
        }
        if !balanced(pred) {
            return Some(Unscored::Unbalanced);
        }
        if nesting(gold).max(nesting(pred)) > MAX_NESTING {
            return Some(Unscored::TooDeep);
        }
        let (g, p) = (normalize(gold), normalize(pred));
        if g.len() > MAX_PARSE_LEN || p.len() > MAX_PARSE_LEN {
            return Some(Unscored::TooLong);
        }
        let too_deep = |s: &str| parse(s).is_err_and(|e| e.is::<crate::expr::NestedTooDeeply>());
        (too_deep(&g) || too_deep(&p)).then_some(Unscored::TooDeep)
    }

    /// Whether two extracted answers are equivalent.
    pub fn answers_match(&self, gold: &str, pred: &str) -> bool {
        if let Some(v) = float_quotient(pred) {
            return self.float_quotient_matches(gold, v);
        }
        // Matrices and vectors: the same shape, entries equal one by one (`pmatrix`, `bmatrix`
        // and `matrix` alike). One side written another way (`\left[\begin{array}...`) goes
        // through the general rules.
        if let (Some(g), Some(p)) = (matrix_cells(gold), matrix_cells(pred)) {
            return g.len() == p.len()
                && g.iter().zip(&p).all(|(gr, pr)| {
                    gr.len() == pr.len() && gr.iter().zip(pr).all(|(a, b)| self.answers_match(a, b))
                });
        }
        if let (Some(a), Some(b)) = (plain_number(gold), plain_number(pred)) {
            if let Some(eq) = plain_equal(a, b) {
                return eq;
            }
        }
        let g = normalize(gold);
        let p = normalize(pred);
        if g.is_empty() || p.is_empty() {
            return false;
        }
        if g == p {
            return true;
        }
        if let (Some(a), Some(b)) = (plain_number(&g), plain_number(&p)) {
            if let Some(eq) = plain_equal(a, b) {
                return eq;
            }
        }
        // Word answers compare without case, spaces and brackets (`\text{(C)}` is `C`); numbers
        // do not (`90\,952` is not 90952 to math-verify).
        let (gk, pk) = (text_key(&g), text_key(&p));
        let words = |k: &str| k.chars().any(|c| c.is_alphabetic());
        if !gk.is_empty() && gk == pk && words(&gk) {
            return true;
        }
        if g.len() > MAX_PARSE_LEN || p.len() > MAX_PARSE_LEN {
            return false;
        }
        let opts = EquivOptions {
            strict: self.options.strict,
            allow_set_relation_comp: self.options.allow_set_relation_comp,
            float_rounding: self.options.float_rounding,
            ..EquivOptions::with_deadline(Instant::now() + self.timeout)
        };
        // Only a response's chain falls back to its last side: a gold chain that math-verify
        // reads whole (`\gcd(a,b) = \gcd(40,40) = 40`) is no assignment, and does not answer 40.
        let (Ok(ge), Ok(pe)) = (parse(&g), read(&p)) else {
            return false;
        };
        if equivalent(&ge, &pe, &opts) {
            return true;
        }
        // A percentage on one side only: `28\%` also answers `0.28`.
        let (gp, pp) = (g.contains('%'), p.contains('%'));
        if gp != pp && ge.is_scalar() && pe.is_scalar() {
            let hundredth = |e: Expr| Expr::Div(Box::new(e), Box::new(Expr::int(100)));
            let (a, b) = if gp {
                (hundredth(ge), pe)
            } else {
                (ge, hundredth(pe))
            };
            if equivalent(&a, &b, &opts) {
                return true;
            }
        }
        false
    }
}

/// A plain quotient of integers written at the end of a sentence (`9/14.`): math-verify reads
/// the period as part of the number, so the value is computed in floating point, `a * (1/b.)`.
fn float_quotient(pred: &str) -> Option<f64> {
    let body = pred.trim().strip_suffix('.')?;
    let (a, b) = body.split_once('/')?;
    let int = |x: &str| {
        let d = x.trim_start_matches('-');
        (!d.is_empty() && d.bytes().all(|c| c.is_ascii_digit()))
            .then(|| x.parse::<f64>().ok())
            .flatten()
    };
    Some(int(a)? * (1.0 / int(b)?))
}

impl Grader {
    /// math-verify compares such a float with an exact gold by value at double precision: `1/3.`
    /// answers `\frac{1}{3}` while `9/14.` does not answer `\frac{9}{14}` (9 * (1/14) rounds
    /// differently from 9/14).
    fn float_quotient_matches(&self, gold: &str, v: f64) -> bool {
        let g = normalize(gold);
        if g.len() > MAX_PARSE_LEN {
            return false;
        }
        let Ok(g) = read(&g) else {
            return false;
        };
        match exact_value(&g) {
            Some(exact) => exact.to_f64() == Some(v),
            None => false,
        }
    }
}

/// Parse a response's answer; a chain of three or more equal sides that does not parse as a
/// whole is read as its last side (`1 = \zzz = x = 0` is `0`, `\gcd(a,b) = \gcd(40,40) = 40`
/// is `40`), as math-verify does with a chain it cannot read.
fn read(s: &str) -> anyhow::Result<Expr> {
    parse(s).or_else(|e| {
        let parts = top_level_split(s, '=');
        // Commas inside brackets (`\gcd(a,b) = \gcd(40,40) = 40`) do not make a list.
        let list = top_level_split(s, ',').len() > 1 || top_level_split(s, ';').len() > 1;
        if parts.len() > 2 && !list {
            parse(parts[parts.len() - 1].trim())
        } else {
            Err(e)
        }
    })
}

/// Grade with default settings.
pub fn grade(gold: &str, pred: &str) -> Graded {
    Grader::default().grade(gold, pred)
}

/// Compare two extracted answers with default settings.
pub fn answers_match(gold: &str, pred: &str) -> bool {
    Grader::default().answers_match(gold, pred)
}

/// `s` split at `sep` outside brackets, braces and parentheses.
fn top_level_split(s: &str, sep: char) -> Vec<&str> {
    let (mut depth, mut start, mut out) = (0i32, 0usize, vec![]);
    for (i, c) in s.char_indices() {
        match c {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => depth -= 1,
            c if c == sep && depth == 0 => {
                out.push(&s[start..i]);
                start = i + c.len_utf8();
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

/// The rows and cells of a `pmatrix`, `bmatrix` or `matrix` environment that is the whole
/// answer (`$..$` allowed around it); `None` otherwise.
fn matrix_cells(s: &str) -> Option<Vec<Vec<String>>> {
    let t = s.trim().trim_matches('$').trim();
    for env in ["pmatrix", "bmatrix", "matrix", "Bmatrix"] {
        let (open, close) = (format!("\\begin{{{env}}}"), format!("\\end{{{env}}}"));
        let Some(body) = t
            .strip_prefix(open.as_str())
            .and_then(|r| r.strip_suffix(close.as_str()))
        else {
            continue;
        };
        // `A + B`, `A B`: several matrices are an expression, not one matrix.
        if body.contains("\\begin") || body.contains("\\end") {
            return None;
        }
        let rows: Vec<Vec<String>> = body
            .split("\\\\")
            .map(str::trim)
            .filter(|r| !r.is_empty())
            .map(|r| r.split('&').map(|c| c.trim().to_string()).collect())
            .collect();
        return (!rows.is_empty() && rows.iter().flatten().all(|c| !c.is_empty())).then_some(rows);
    }
    None
}

/// The named rule of docs/rewards.md ("Deliberate differences from math-verify") under which
/// temper's verdict on this pair may differ from math-verify's on purpose, if any:
/// - `gold_field_whole`: a ground truth with no math markup that is neither one plain number nor
///   prose is the answer as a whole (as verl boxes a dataset's answer field), where
///   math-verify's `parse` reads only what its patterns find in it (a bare `(3, 2)` gives
///   nothing, a bare `2x+3` gives `2`).
/// - `unbalanced_braces`: an answer with unclosed braces scores 0 with the reason `unbalanced`.
pub fn deliberate_difference(gold: &str, pred: &str) -> Option<&'static str> {
    let read_whole = !has_math_markup(gold)
        && after_hashes(gold).is_none()
        && crate::ranked::whole_plain_number(gold).is_none()
        && !is_prose(gold);
    if read_whole {
        return Some("gold_field_whole");
    }
    if !braces_balanced(pred) {
        return Some("unbalanced_braces");
    }
    None
}
