//! Pieces of answer finding that are not math-verify's ranking (that is `ranked.rs`): `<answer>`
//! blocks and boxes for r1_zero, GSM8K `####`, the last number for the procedural tasks.

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
            let open = i;
            match crate::normalize::matching_brace(&s[open..]).map(|c| open + c) {
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
