//! Where the answer is in a long text, ranked the way math-verify 0.9.0 ranks it, so that temper
//! reads the same expression out of a response as verl / TRL runs do.
//!
//! Candidates come in priority groups, best first:
//! 0. "final answer is X. I hope" (the Minerva few-shot ending);
//! 50. `\boxed{}` (the last box, with boxes just before it joined by `,`/"and"/"or"), and
//!     "final answer ... is X";
//! 100. "answer: ... X"; 200. "answer ... X";
//! 300. any math environment (`$..$`, `$$..$$`, `\(..\)`, `\[..\]`, ` [..] `, a bare
//!     `\frac{a}{b}`) and any number or arithmetic expression standing after a space or `=`.
//!
//! Inside a group the candidate ending furthest right wins; math environments joined by `,`,
//! "and" or "or" form one list. Inline math (`$..$`, `\(..\)`) does not span lines, and a `$`
//! right after a digit does not open math.
use crate::grader_options::ExtractionTargets;

mod anchors;
mod plain;
use anchors::{after_anchor_latex, after_anchor_plain, floor_boundary};
pub use plain::whole_plain_number;
use plain::{all_plain, plain_at};

/// One extracted candidate: its text (LaTeX, or a plain number / expression) and where it ends.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    pub text: String,
    /// `\%` / "percent" written after it.
    pub percent: bool,
    pub priority: u32,
    /// Found by the LaTeX target (math environment, box, bare `\frac`), not as a plain number.
    pub latex: bool,
    end: usize,
    start: usize,
}

/// A text with the positions of its delimiters, so that an unclosed one is found out with a
/// binary search instead of a scan to the end (a text of many unclosed `\[` stays linear).
struct Text<'a> {
    s: &'a str,
    /// Byte positions of `$`, `\]`, `\)` and newlines, in order.
    dollars: Vec<usize>,
    bracket_closes: Vec<usize>,
    paren_closes: Vec<usize>,
    newlines: Vec<usize>,
    /// Byte positions of "answer" in any case: every anchor word ("answer", "answer:", "final
    /// answer") is found from these, in one scan of the text.
    answers: Vec<usize>,
}

impl<'a> Text<'a> {
    fn new(s: &'a str) -> Self {
        let at = |pat: &str| s.match_indices(pat).map(|(k, _)| k).collect::<Vec<_>>();
        Text {
            s,
            dollars: at("$"),
            bracket_closes: at("\\]"),
            paren_closes: at("\\)"),
            newlines: at("\n"),
            answers: find_all_ci(s, "answer"),
        }
    }

    /// [`find_all_ci`] of an anchor word, from the positions of "answer".
    fn anchors(&self, word: &str) -> Vec<usize> {
        let b = self.s.as_bytes();
        let it = self.answers.iter().copied();
        match word {
            "answer" => self.answers.clone(),
            "answer:" => it.filter(|&k| b.get(k + 6) == Some(&b':')).collect(),
            "final answer" => it
                .filter(|&k| k >= 6 && b[k - 6..k].eq_ignore_ascii_case(b"final "))
                .map(|k| k - 6)
                .collect(),
            w => find_all_ci(self.s, w),
        }
    }

    /// The first position in `positions` at or after `from` that `ok` accepts.
    fn first_from(positions: &[usize], from: usize, ok: impl Fn(usize) -> bool) -> Option<usize> {
        let k = positions.partition_point(|&p| p < from);
        positions[k..].iter().copied().find(|&p| ok(p))
    }

    fn next_newline(&self, from: usize) -> usize {
        Self::first_from(&self.newlines, from, |_| true).unwrap_or(self.s.len())
    }
}

/// A math environment starting exactly at `i`: (content start, content end, end of the match).
fn env_at(t: &Text, i: usize) -> Option<(usize, usize, usize)> {
    let s = t.s;
    let b = s.as_bytes();
    let rest = &s[i..];
    let escaped = i > 0 && b[i - 1] == b'\\';
    let unescaped = |p: usize| b[p - 1] != b'\\';
    if !escaped {
        // `$$ .. $$` (may span lines).
        if rest.starts_with("$$") {
            let from = i + 2;
            let close = Text::first_from(&t.dollars, from + 1, |p| {
                b.get(p + 1) == Some(&b'$') && unescaped(p)
            });
            if let Some(j) = close {
                return Some((from, j, j + 2));
            }
        }
        // `\[ .. \]` (may span lines): the first `\]`.
        if rest.starts_with("\\[") {
            let from = i + 2;
            if let Some(j) = Text::first_from(&t.bracket_closes, from, |_| true) {
                if j > from && unescaped(j) {
                    return Some((from, j, j + 2));
                }
            }
        }
        // Inline `$ .. $` and `\( .. \)`: on one line; a `$` right after a digit opens nothing.
        let line_end = || t.next_newline(i);
        if rest.starts_with('$') && !(i > 0 && b[i - 1].is_ascii_digit()) {
            let from = i + 1;
            if let Some(j) = Text::first_from(&t.dollars, from + 1, unescaped) {
                if j < line_end() {
                    return Some((from, j, j + 1));
                }
            }
        }
        if rest.starts_with("\\(") {
            let from = i + 2;
            if let Some(j) = Text::first_from(&t.paren_closes, from + 1, unescaped) {
                if j < line_end() {
                    return Some((from, j, j + 2));
                }
            }
        }
    }
    // ` [ .. ] ` between spaces, on one line, no nested brackets.
    if rest.starts_with('[') && i > 0 && b[i - 1].is_ascii_whitespace() {
        let from = i + 1;
        if let Some(k) = s[from..].find([']', '[', '\n']) {
            let close = from + k;
            if k > 0 && b[close] == b']' && b.get(close + 1).is_some_and(u8::is_ascii_whitespace) {
                return Some((from, close, close + 1));
            }
        }
    }
    // A bare `\frac{a}{b}` of two plain numbers.
    let (neg, frac) = match rest.strip_prefix('-') {
        Some(r) => (1, r),
        None => (0, rest),
    };
    if let Some(after) = frac.strip_prefix("\\frac{") {
        let simple = |x: &str| -> Option<usize> {
            let n = x.find('}')?;
            let body = x[..n].trim_start_matches('-');
            let (a, b) = body.split_once(['.', ',']).unwrap_or((body, "1"));
            (!a.is_empty()
                && !b.is_empty()
                && a.bytes().all(|c| c.is_ascii_digit())
                && b.bytes().all(|c| c.is_ascii_digit()))
            .then_some(n)
        };
        if let Some(n1) = simple(after) {
            if let Some(den) = after[n1 + 1..].strip_prefix('{') {
                if let Some(n2) = simple(den) {
                    let end = i + neg + "\\frac{".len() + n1 + 2 + n2 + 1;
                    return Some((i, end, end));
                }
            }
        }
    }
    None
}

/// How plain text writes "percent" after a number ("percentage" before its prefix "percent").
pub(crate) const PERCENT_WORDS: &[&str] = &[
    "%",
    "percentage",
    "Percentage",
    "percent",
    "Percent",
    "pct",
    "Pct",
];

/// `%`, `\%`, "percent", "percentage" or "pct" after optional spaces: its length.
fn percent_at(s: &str) -> Option<usize> {
    let t = s.trim_start();
    let skipped = s.len() - t.len();
    std::iter::once(&"\\%")
        .chain(PERCENT_WORDS)
        .find(|w| t.starts_with(**w))
        .map(|w| skipped + w.len())
}

/// Math environments chained by `,`, "and", "or" from `i`: the candidate and the match end.
fn envs_at(t: &Text, i: usize, need_box: bool) -> Option<(EnvParts, usize)> {
    let s = t.s;
    let (cs, ce, mut end) = env_at(t, i)?;
    if need_box && !s[cs..ce].contains("\\boxed") {
        return None;
    }
    let pct = percent_at(&s[end..]);
    end += pct.unwrap_or(0);
    let mut parts = vec![(s[cs..ce].to_string(), pct.is_some())];
    while parts.len() < 6 {
        let rest = &s[end..];
        let trimmed = rest.trim_start();
        let mut k = rest.len() - trimmed.len();
        let sep = [",and", ",or", "and", "or", ","]
            .iter()
            .find(|w| trimmed.starts_with(*w));
        let Some(sep) = sep else { break };
        k += sep.len();
        let t2 = &rest[k..];
        k += t2.len() - t2.trim_start().len();
        let Some((cs, ce, e)) = env_at(t, end + k) else {
            break;
        };
        if need_box && !s[cs..ce].contains("\\boxed") {
            break;
        }
        let pct = percent_at(&s[e..]);
        parts.push((s[cs..ce].to_string(), pct.is_some()));
        end = e + pct.unwrap_or(0);
    }
    Some((parts, end))
}

/// Math environments joined into one answer, each with whether a percent sign follows it.
type EnvParts = Vec<(String, bool)>;

/// All non-overlapping environment chains, left to right (regex `finditer`).
fn all_envs(t: &Text, need_box: bool) -> Vec<(usize, usize, EnvParts)> {
    let s = t.s;
    let mut out = vec![];
    if need_box && !s.contains("\\boxed") {
        return out;
    }
    let b = s.as_bytes();
    let mut i = 0;
    while i < s.len() {
        // Only these bytes start an environment (`$`, `\[`, `\(`, ` [`, `\frac`, `-\frac`).
        if !matches!(b[i], b'$' | b'\\' | b'[' | b'-') {
            i += 1;
            continue;
        }
        if s.is_char_boundary(i) {
            if let Some((parts, end)) = envs_at(t, i, need_box) {
                out.push((i, end, parts));
                i = end.max(i + 1);
                continue;
            }
        }
        i += 1;
    }
    out
}

fn joined(parts: &[(String, bool)], boxes: BoxMode) -> (String, bool) {
    let texts: Vec<String> = parts.iter().map(|(t, _)| boxed_content(t, boxes)).collect();
    (texts.join(", "), parts.len() == 1 && parts[0].1)
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum BoxMode {
    /// Every box in the text, joined by `,`.
    All,
    /// The last box, with the boxes before it that are close to it or joined by a separator.
    Last,
}

/// The content of the boxes in `s` (`s` itself when it has none); an unclosed last box gives
/// the rest of the text.
pub fn boxed_content(s: &str, mode: BoxMode) -> String {
    let mut results: Vec<String> = vec![];
    let mut to = s.len();
    let mut limit = s.len();
    let mut later_start: Option<usize> = None;
    let has_fbox = s.contains("\\fbox");
    loop {
        let hay = &s[..to];
        // (`\\fbox` is looked for only when the text has one: each search runs to the start.)
        let fbox = if has_fbox { hay.rfind("\\fbox") } else { None };
        let k = match (hay.rfind("\\boxed"), fbox) {
            (Some(a), Some(b)) => a.max(b),
            (a, b) => match a.or(b) {
                Some(k) => k,
                None => break,
            },
        };
        let cmd = if s[k..].starts_with("\\boxed") { 6 } else { 5 };
        let mut j = k + cmd;
        while j < limit && s.as_bytes()[j].is_ascii_whitespace() {
            j += 1;
        }
        if j >= limit {
            break;
        }
        if s.as_bytes()[j] != b'{' {
            if results.is_empty() {
                results.push(s[j..].to_string());
            }
            break;
        }
        let Some(close) = crate::normalize::matching_brace(&s[j..limit]).map(|c| j + c) else {
            if results.is_empty() {
                results.push(s[j..].to_string());
            }
            break;
        };
        let content = s[j + 1..close].trim().to_string();
        if mode == BoxMode::Last {
            if let Some(next) = later_start {
                let gap = s.get(close + 1..next).unwrap_or("");
                let prev = results.last().map(String::as_str).unwrap_or("");
                let separated = gap.contains(',')
                    || gap.contains(';')
                    || gap
                        .split(|c: char| !c.is_alphanumeric())
                        .any(|w| w == "and" || w == "or");
                if !(gap.len() < 10 || content != prev && gap.len() < 70 && separated) {
                    break;
                }
            }
        }
        if results.last() != Some(&content) {
            results.push(content);
        }
        later_start = Some(k);
        limit = k;
        to = k;
    }
    if results.is_empty() {
        return s.to_string();
    }
    results.reverse();
    results.join(",")
}

/// Case-insensitive positions of `word` in `s` (ASCII).
fn find_all_ci(s: &str, word: &str) -> Vec<usize> {
    // `word` is lowercase ASCII and cannot overlap itself, so this finds what
    // `s.to_ascii_lowercase().match_indices(word)` finds, without a lowercase copy of `s`.
    let (b, w) = (s.as_bytes(), word.as_bytes());
    if w.is_empty() || b.len() < w.len() {
        return vec![];
    }
    (0..=b.len() - w.len())
        .filter(|&i| b[i].to_ascii_lowercase() == w[0] && b[i..i + w.len()].eq_ignore_ascii_case(w))
        .collect()
}

/// math-verify's candidates for `text`, best first.
pub fn candidates(text: &str, targets: ExtractionTargets) -> Vec<Candidate> {
    let t = Text::new(text);
    let mut all: Vec<Candidate> = vec![];
    if targets.latex {
        // 0 and 50: "final answer is ... I hope", "final answer ... is ...".
        for k in t.anchors("final answer") {
            let rest = &text[k + "final answer".len()..];
            // Lazy `.{0,100}?\s+is`: the first " is" within 100 bytes.
            let zone = &rest[..floor_boundary(rest, rest.len().min(104))];
            let Some(is) = zone
                .match_indices("is")
                .find(|(q, _)| *q > 0 && zone[..*q].ends_with(char::is_whitespace))
                .map(|(q, _)| q)
            else {
                continue;
            };
            let mut i = k + "final answer".len() + is + 2;
            if text[i..].starts_with(':') {
                i += 1;
            }
            while text[i..].starts_with(char::is_whitespace) {
                i += 1;
            }
            if let Some((parts, end)) = envs_at(&t, i, false) {
                let (t, percent) = joined(&parts, BoxMode::All);
                let hope = text[end..]
                    .trim_start_matches('.')
                    .trim_start_matches(char::is_whitespace);
                let prio = if is == 1 && hope.starts_with("I hope") {
                    0
                } else {
                    50
                };
                all.push(Candidate {
                    text: t,
                    percent,
                    priority: prio,
                    latex: true,
                    start: k,
                    end,
                });
            }
        }
        // 50: boxes inside math environments, and the plain `\boxed{...}` up to the last `}`.
        for (start, end, parts) in all_envs(&t, true) {
            let (t, percent) = joined(&parts, BoxMode::All);
            all.push(Candidate {
                text: t,
                percent,
                priority: 50,
                latex: true,
                start,
                end,
            });
        }
        if let Some(k) = text.find("\\boxed{") {
            if let Some(last) = text.rfind('}').filter(|&e| e > k + 6) {
                all.push(Candidate {
                    text: boxed_content(&text[k..=last], BoxMode::Last),
                    percent: false,
                    priority: 50,
                    latex: true,
                    start: k,
                    end: last + 1,
                });
            }
        }
        after_anchor_latex(&t, "answer:", 50, &mut all, 100);
        after_anchor_latex(&t, "answer", 50, &mut all, 200);
        for (start, end, parts) in all_envs(&t, false) {
            let (t, percent) = joined(&parts, BoxMode::All);
            all.push(Candidate {
                text: t,
                percent,
                priority: 300,
                latex: true,
                start,
                end,
            });
        }
    }
    if targets.expr {
        after_anchor_plain(&t, "answer:", &mut all, 100);
        after_anchor_plain(&t, "answer", &mut all, 200);
        for (start, end, t, percent) in all_plain(text) {
            all.push(Candidate {
                text: t,
                percent,
                priority: 300,
                latex: false,
                start,
                end,
            });
        }
    }
    if targets.string {
        string_candidates(text, &mut all);
    }
    // Best priority first; inside one, the match ending last first, then the one starting first.
    all.sort_by(|a, b| {
        a.priority
            .cmp(&b.priority)
            .then(b.end.cmp(&a.end))
            .then(a.start.cmp(&b.start))
    });
    all
}

/// A choice letter `A`..`D` at `k`, standing alone (after the start, a space or `**`; before the
/// end, a space, `.`, `,`, `:` or `**`).
fn choice_at(text: &str, k: usize) -> Option<(char, usize)> {
    let c = text[k..].chars().next()?;
    let before = &text[..k];
    let alone_before = before.is_empty()
        || before.ends_with(char::is_whitespace)
        || before
            .strip_suffix("**")
            .is_some_and(|b| b.is_empty() || b.ends_with(char::is_whitespace));
    let after = &text[k + 1..];
    let alone_after = after.is_empty()
        || after.starts_with(['.', ',', ':', ' ', '\n'])
        || after.starts_with("**");
    ("ABCD".contains(c) && alone_before && alone_after).then_some((c, k + 1))
}

/// math-verify's `StringExtractionConfig` candidates (the letters A to D): after "final answer
/// ... is" (50), after "answer:" (100) or "answer" (200) within 50 bytes, at the start (250),
/// anywhere standing alone (300).
fn string_candidates(text: &str, out: &mut Vec<Candidate>) {
    let mut push = |c: char, start: usize, end: usize, priority: u32| {
        out.push(Candidate {
            text: c.to_ascii_lowercase().to_string(),
            percent: false,
            priority,
            latex: false,
            start,
            end,
        })
    };
    for (word, prio) in [("answer:", 100), ("answer", 200)] {
        let mut from = 0;
        for k in find_all_ci(text, word) {
            if k < from {
                continue;
            }
            let start = k + word.len();
            let found = (0..=50)
                .map(|off| start + off)
                .take_while(|&i| i < text.len())
                .filter(|&i| text.is_char_boundary(i))
                .find_map(|i| choice_at(text, i));
            if let Some((c, end)) = found {
                push(c, k, end, prio);
                from = end;
            }
        }
    }
    if let Some((c, end)) = choice_at(text, 0) {
        push(c, 0, end, 250);
    }
    for (k, _) in text.char_indices() {
        if let Some((c, end)) = choice_at(text, k) {
            push(c, k, end, 300);
        }
    }
}
