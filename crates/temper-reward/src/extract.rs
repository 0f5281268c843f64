//! Finding the final answer in a model's text: `<answer>` blocks, `\boxed{}`, GSM8K `####`,
//! "the answer is ...", the last math span, the last number.

/// The text after the last `<answer>`, with `</answer>` removed (the r1_zero rule).
pub fn answer_block(response: &str) -> Option<String> {
    let k = response.rfind("<answer>")?;
    Some(response[k + "<answer>".len()..].replace("</answer>", ""))
}

/// A `\boxed{...}` / `\fbox{...}` occurrence: byte range of the whole command and its content.
struct Boxed<'a> {
    start: usize,
    end: usize,
    content: &'a str,
}

/// All balanced boxed groups, in order. An unbalanced last one ends the scan.
fn all_boxed(s: &str) -> Vec<Boxed<'_>> {
    let mut out = vec![];
    let mut from = 0;
    while let Some(rel) = next_box(&s[from..]) {
        let (k, cmd_len) = rel;
        let start = from + k;
        let after = start + cmd_len;
        let b = s.as_bytes();
        let mut i = after;
        while i < b.len() && b[i] == b' ' {
            i += 1;
        }
        if i < b.len() && b[i] == b'{' {
            let mut depth = 0i32;
            let open = i;
            let mut close = None;
            while i < b.len() {
                match b[i] {
                    b'{' => depth += 1,
                    b'}' => {
                        depth -= 1;
                        if depth == 0 {
                            close = Some(i);
                            break;
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
            match close {
                Some(c) => {
                    out.push(Boxed {
                        start,
                        end: c + 1,
                        content: &s[open + 1..c],
                    });
                    from = c + 1;
                }
                None => break,
            }
        } else {
            // `\boxed 5`: up to the next space or `$`.
            let rest = &s[i..];
            let len = rest.find([' ', '$', '\n']).unwrap_or(rest.len());
            if len > 0 {
                out.push(Boxed {
                    start,
                    end: i + len,
                    content: &rest[..len],
                });
            }
            from = i + len.max(1);
            if from >= s.len() {
                break;
            }
        }
    }
    out
}

fn next_box(s: &str) -> Option<(usize, usize)> {
    let a = s.find("\\boxed").map(|k| (k, "\\boxed".len()));
    let b = s.find("\\fbox").map(|k| (k, "\\fbox".len()));
    match (a, b) {
        (Some(x), Some(y)) => Some(if x.0 < y.0 { x } else { y }),
        (x, y) => x.or(y),
    }
}

/// Whether the text between two boxes only joins them (`\boxed{1}, \boxed{2}`,
/// `\boxed{-2} and \boxed{1}`).
fn is_connector(gap: &str) -> bool {
    let cleaned = gap
        .replace("\\text", "")
        .replace("\\quad", "")
        .replace("\\qquad", "")
        .replace("and", "")
        .replace("or", "");
    gap.len() <= 24
        && cleaned
            .chars()
            .all(|c| c.is_whitespace() || ",;$\\()[]{}.".contains(c))
}

/// Content of the last `\boxed{}` (balanced braces); adjacent boxes joined by only commas or
/// "and" are read together as a list. `None` if there is no balanced box.
pub fn last_boxed(s: &str) -> Option<String> {
    if !s.contains("\\boxed") && !s.contains("\\fbox") {
        return None;
    }
    let boxes = all_boxed(s);
    let last = boxes.len().checked_sub(1)?;
    let mut first = last;
    while first > 0 && is_connector(&s[boxes[first - 1].end..boxes[first].start]) {
        first -= 1;
    }
    let parts: Vec<&str> = boxes[first..=last].iter().map(|b| b.content).collect();
    // ", " and not ",": `\boxed{99}, \boxed{100}` are two answers, not 99,100 (thousands).
    Some(parts.join(", "))
}

/// Whether the text has a boxed command at all (balanced or not).
pub fn has_boxed(s: &str) -> bool {
    s.contains("\\boxed") || s.contains("\\fbox")
}

/// GSM8K: the text after the last `####`.
pub fn after_hashes(s: &str) -> Option<&str> {
    let k = s.rfind("####")?;
    Some(s[k + 4..].trim())
}

/// The region after the last "the answer is" / "final answer:" marker, up to the end of that
/// sentence.
pub fn answer_is(s: &str) -> Option<String> {
    let lower = s.to_ascii_lowercase();
    let markers = [
        "final answer is",
        "the answer is",
        "answer is:",
        "answer is",
        "final answer:",
        "answer:",
    ];
    let (k, len) = markers
        .iter()
        .filter_map(|m| lower.rfind(m).map(|k| (k, m.len())))
        .max_by_key(|&(k, len)| (k + len, len))?;
    let mut region = s[k + len..]
        .trim_start_matches([':', ' ', '\n'])
        .to_string();
    if let Some(cut) = sentence_end(&region) {
        region.truncate(cut);
    }
    let region = region.trim().to_string();
    (!region.is_empty()).then_some(region)
}

/// End of the first sentence: a newline, or a period followed by a space (not a decimal point and
/// not inside `$...$`).
fn sentence_end(s: &str) -> Option<usize> {
    let b = s.as_bytes();
    let mut in_math = false;
    for i in 0..b.len() {
        match b[i] {
            b'$' => in_math = !in_math,
            b'\n' => return Some(i),
            b'.' if !in_math => {
                let next = b.get(i + 1).copied();
                if next.is_none() || next == Some(b' ') || next == Some(b'\n') {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

/// The last `$...$`, `$$...$$`, `\(...\)` or `\[...\]` span's content.
pub fn math_spans(s: &str) -> Vec<String> {
    let mut out = vec![];
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let (open, close): (&str, &str) = if b[i..].starts_with(b"$$") {
            ("$$", "$$")
        } else if b[i] == b'$' && (i == 0 || b[i - 1] != b'\\') {
            ("$", "$")
        } else if b[i..].starts_with(b"\\(") {
            ("\\(", "\\)")
        } else if b[i..].starts_with(b"\\[") {
            ("\\[", "\\]")
        } else {
            i += 1;
            continue;
        };
        let from = i + open.len();
        let mut j = from;
        let mut found = None;
        while j < b.len() {
            if b[j..].starts_with(close.as_bytes()) && !(close == "$" && j > 0 && b[j - 1] == b'\\')
            {
                found = Some(j);
                break;
            }
            j += 1;
        }
        match found {
            Some(j) => {
                let content = s[from..j].trim();
                // Inline math does not span lines.
                let inline = open == "$" || open == "\\(";
                if !(content.is_empty() || inline && content.contains('\n')) {
                    out.push(content.to_string());
                }
                i = j + close.len();
            }
            None => break,
        }
    }
    out
}

/// The last number in the text (`-3`, `1,234.5`, `2/3`), as written.
pub fn last_number(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut best = None;
    let mut i = 0;
    while i < b.len() {
        if b[i].is_ascii_digit() {
            let mut st = i;
            if st > 0 && b[st - 1] == b'.' {
                st -= 1;
            }
            if st > 0 && b[st - 1] == b'-' {
                st -= 1;
            }
            let mut j = i;
            while j < b.len() {
                let c = b[j];
                let next_digit = b.get(j + 1).is_some_and(|d| d.is_ascii_digit());
                if c.is_ascii_digit()
                    || ((c == b'.' || c == b'/') && next_digit)
                    || (c == b','
                        && b.get(j + 1..j + 4)
                            .is_some_and(|g| g.iter().all(u8::is_ascii_digit)))
                {
                    j += 1;
                } else {
                    break;
                }
            }
            // `x^2` and `a_1` are not numbers on their own, nor is the 2 in `AZYUK2A`.
            let attached =
                st > 0 && (matches!(b[st - 1], b'^' | b'_') || b[st - 1].is_ascii_alphabetic());
            if !attached {
                best = Some(s[st..j].to_string());
            }
            i = j;
        } else {
            i += 1;
        }
    }
    best
}
