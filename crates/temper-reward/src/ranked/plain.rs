//! Plain numbers and arithmetic expressions in prose (math-verify's expression target): thousands
//! groups, decimal points and commas, currency signs and percent words around a number.
use super::PERCENT_WORDS;

/// A plain number at `i` (math-verify's number forms): thousands groups (`1,234`, `1 234`),
/// a decimal point or comma, a leading `.`; then an optional percent. Returns (text, end, pct).
fn number_at(s: &str, i: usize) -> Option<(String, usize, bool)> {
    let b = s.as_bytes();
    if i > 0 && b[i - 1].is_ascii_digit() {
        return None;
    }
    let mut j = i;
    let neg = b.get(j) == Some(&b'-');
    if neg {
        j += 1;
    }
    let digits = |from: usize| {
        let mut e = from;
        while e < b.len() && b[e].is_ascii_digit() {
            e += 1;
        }
        e
    };
    let int_end = digits(j);
    let mut text: String;
    let mut end;
    if int_end == j {
        // `.5`
        if neg || b.get(j) != Some(&b'.') {
            return None;
        }
        let e = digits(j + 1);
        if e == j + 1 {
            return None;
        }
        text = format!("0{}", &s[j..e]);
        end = e;
    } else {
        // Thousands groups after a 1-3 digit lead that does not start with 0.
        let lead = &s[j..int_end];
        let mut e = int_end;
        let mut groups = String::new();
        if lead.len() <= 3 && !lead.starts_with('0') {
            while e + 3 < b.len()
                && matches!(b[e], b',' | b' ')
                && b[e + 1..e + 4].iter().all(u8::is_ascii_digit)
                && !b.get(e + 4).is_some_and(u8::is_ascii_digit)
            {
                groups.push_str(&s[e + 1..e + 4]);
                e += 4;
            }
        }
        if !groups.is_empty() {
            text = format!("{}{lead}{groups}", if neg { "-" } else { "" });
            end = e;
            if b.get(e) == Some(&b'.') && b.get(e + 1).is_some_and(u8::is_ascii_digit) {
                let d = digits(e + 1);
                text.push_str(&s[e..d]);
                end = d;
            }
        } else {
            text = s[i..int_end].to_string();
            end = int_end;
            if matches!(b.get(int_end), Some(b'.' | b','))
                && b.get(int_end + 1).is_some_and(u8::is_ascii_digit)
            {
                let d = digits(int_end + 1);
                text = format!("{}.{}", &s[i..int_end], &s[int_end + 1..d]);
                end = d;
            }
        }
    }
    let rest = &s[end..];
    let t = rest.trim_start();
    let pct = PERCENT_WORDS.iter().find(|w| t.starts_with(**w));
    if let Some(w) = pct {
        end += rest.len() - t.len() + w.len();
    }
    Some((text, end, pct.is_some()))
}

/// The text `s` as one plain number, when it is nothing else (`1,22` is 1.22, `1 000` is 1000,
/// `.4` is 0.4), read as numbers in prose are.
pub fn whole_plain_number(s: &str) -> Option<String> {
    let t = s.trim();
    match number_at(t, 0) {
        Some((text, end, false)) if end == t.len() => Some(text),
        _ => None,
    }
}

const OPERATORS: &[char] = &['+', '-', '*', '×', '/', '^', '(', ')', '÷'];

/// A plain arithmetic expression at `i` (`3/4`, `2 * (5+1)`): an optional `-`, `(`, `-`, a
/// digit, then digits, `.`, spaces and operators with at least one operator that has something
/// after it; the longest such text that is followed by the end, a space, `.`, `,`, `:`, `)` or
/// `$`. Returns (text, end), or where the next attempt may start: past the whole run when it has
/// no operator (no start inside it can have one either), else the next byte.
fn expression_at(s: &str, i: usize) -> Result<(String, usize), usize> {
    let mut j = i;
    for pre in ['-', '(', '-'] {
        if s[j..].starts_with(pre) {
            j += 1;
        }
    }
    if !s[j..].starts_with(|c: char| c.is_ascii_digit()) {
        return Err(i + 1);
    }
    let in_run =
        |c: char| c.is_ascii_digit() || c == '.' || c.is_whitespace() || OPERATORS.contains(&c);
    let run: Vec<(usize, char)> = s[j + 1..]
        .char_indices()
        .take_while(|&(_, c)| in_run(c))
        .map(|(k, c)| (j + 1 + k, c))
        .collect();
    let run_end = run.last().map_or(j + 1, |&(k, c)| k + c.len_utf8());
    let Some(first_op) = run.iter().position(|&(_, c)| OPERATORS.contains(&c)) else {
        return Err(run_end.max(i + 1));
    };
    let suffix_ok = |end: usize| {
        let after = &s[end..];
        after.is_empty()
            || after.starts_with(['.', ',', ':', ')', '$'])
            || after.starts_with(char::is_whitespace)
            || after.strip_prefix("**").is_some_and(|r| {
                r.is_empty() || r.starts_with(['.', ',', ':', ')', '$', ' ', '\n'])
            })
    };
    // Longest first, as the regex backtracks from the longest run; an operator must have
    // something after it.
    for len in (first_op + 2..=run.len()).rev() {
        let (k, c) = run[len - 1];
        let end = k + c.len_utf8();
        if suffix_ok(end) {
            return Ok((s[i..end].to_string(), end));
        }
    }
    Err(i + 1)
}

fn currency_len(s: &str) -> usize {
    match s.chars().next() {
        Some(c) if "$€£¥₹₽₪₩₫฿".contains(c) => c.len_utf8(),
        _ => 0,
    }
}

/// Whether a plain match may start at `i` (after math-verify's prefix: the start, a space or
/// `=`), the prefix not being part of the previous match (which ended at `taken`).
fn prefix_ok(s: &str, i: usize, taken: usize) -> bool {
    if i == 0 {
        return true;
    }
    if i <= taken {
        return false;
    }
    // The byte before `i` decides for ASCII (this runs at every byte of a response); only a
    // multi-byte character (Unicode whitespace such as U+00A0) needs decoding.
    match s.as_bytes()[i - 1] {
        b'=' | b' ' | b'\t' | b'\n' | b'\x0B' | b'\x0C' | b'\r' => true,
        b if b.is_ascii() => false,
        _ => s[..i].ends_with(char::is_whitespace),
    }
}

/// An optional `**` at `i`: its length.
fn bold(s: &str, i: usize) -> usize {
    if s[i..].starts_with("**") {
        2
    } else {
        0
    }
}

/// Every prefixed plain expression and every prefixed number (optional currency sign), each
/// found left to right without overlap, as two separate searches.
pub(super) fn all_plain(s: &str) -> Vec<(usize, usize, String, bool)> {
    let mut out = vec![];
    for numbers in [false, true] {
        let (mut i, mut taken) = (0, 0);
        while i < s.len() {
            if s.is_char_boundary(i) && prefix_ok(s, i, taken) {
                let mut j = i + bold(s, i);
                let found = if numbers {
                    j += currency_len(&s[j..]);
                    number_at(s, j)
                } else {
                    match expression_at(s, j) {
                        Ok((t, e)) => Some((t, e, false)),
                        Err(next) => {
                            i = next.max(i + 1);
                            continue;
                        }
                    }
                };
                if let Some((t, e, pct)) = found {
                    out.push((i, e, t, pct));
                    taken = e;
                    i = e.max(i + 1);
                    continue;
                }
            }
            i += 1;
        }
    }
    out
}

/// A number or expression at `i` (the expression first), with an optional `**` and currency
/// sign before a number. Returns (text, end, percent).
pub(super) fn plain_at(s: &str, i: usize) -> Option<(String, usize, bool)> {
    let j = i + bold(s, i);
    if let Ok((t, e)) = expression_at(s, j) {
        return Some((t, e, false));
    }
    number_at(s, j + currency_len(&s[j..]))
}
