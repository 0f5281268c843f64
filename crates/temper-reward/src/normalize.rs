//! String-level clean-up of an extracted answer before parsing: dollar signs, degree marks,
//! thousands separators, trailing punctuation, units (`\text{ cm}^2`, `18 dollars`), `and` lists.

/// Plain number with thousands commas, currency and trailing period, as an exact decimal
/// `(mantissa, scale)` meaning `mantissa / 10^scale`. `None` for anything else. This is the fast
/// path: GSM8K answers and most predictions are plain numbers.
pub fn plain_number(s: &str) -> Option<(i128, u32)> {
    let mut s = s.trim();
    s = s
        .strip_prefix("\\$")
        .or_else(|| s.strip_prefix('$'))
        .unwrap_or(s);
    s = s.strip_suffix('$').unwrap_or(s).trim();
    s = s.strip_suffix('.').unwrap_or(s);
    let (neg, body) = match s.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, s),
    };
    let b = body.as_bytes();
    if b.is_empty() {
        return None;
    }
    let mut mant: i128 = 0;
    let mut scale = 0u32;
    let mut seen_dot = false;
    let mut digits_in_group = 0usize;
    let mut saw_comma = false;
    let mut n_digits = 0usize;
    for (i, &c) in b.iter().enumerate() {
        match c {
            b'0'..=b'9' => {
                mant = mant.checked_mul(10)?.checked_add((c - b'0') as i128)?;
                n_digits += 1;
                if seen_dot {
                    scale += 1;
                } else {
                    digits_in_group += 1;
                }
            }
            b',' if !seen_dot => {
                // Thousands separator: 1-3 digits before the first, exactly 3 between; never
                // after a lone leading 0 (`0,332` is a decimal comma, not 332).
                if digits_in_group == 0
                    || (!saw_comma && digits_in_group == 1 && mant == 0)
                    || (saw_comma && digits_in_group != 3)
                    || (!saw_comma && digits_in_group > 3)
                {
                    return None;
                }
                saw_comma = true;
                digits_in_group = 0;
                if i + 1 >= b.len() {
                    return None;
                }
            }
            b'.' if !seen_dot => {
                if saw_comma && digits_in_group != 3 {
                    return None;
                }
                seen_dot = true;
            }
            _ => return None,
        }
    }
    if n_digits == 0 || (saw_comma && !seen_dot && digits_in_group != 3) {
        return None;
    }
    Some((if neg { -mant } else { mant }, scale))
}

/// Compare two plain numbers exactly. `None` if scaling would overflow.
pub fn plain_equal(a: (i128, u32), b: (i128, u32)) -> Option<bool> {
    let (ma, sa) = a;
    let (mb, sb) = b;
    if sa == sb {
        return Some(ma == mb);
    }
    let (lo, hi, d) = if sa < sb {
        (ma, mb, sb - sa)
    } else {
        (mb, ma, sa - sb)
    };
    let f = 10i128.checked_pow(d)?;
    Some(lo.checked_mul(f)? == hi)
}

/// Words dropped after a number (`18 dollars`, `5 cm`); compared case-insensitively, with an
/// optional plural `s`.
const UNIT_WORDS: &[&str] = &[
    "dollar",
    "cent",
    "euro",
    "pound",
    "yuan",
    "rupee",
    "unit",
    "meter",
    "metre",
    "cm",
    "mm",
    "km",
    "m",
    "inch",
    "inches",
    "foot",
    "feet",
    "ft",
    "yard",
    "mile",
    "mph",
    "kg",
    "g",
    "gram",
    "lb",
    "ounce",
    "oz",
    "liter",
    "litre",
    "ml",
    "gallon",
    "second",
    "sec",
    "minute",
    "min",
    "hour",
    "hr",
    "day",
    "week",
    "month",
    "year",
    "degree",
    "point",
    "way",
    "item",
    "people",
    "person",
    "student",
    "child",
    "children",
    "apple",
    "egg",
    "book",
    "page",
    "time",
    "piece",
    "square",
    "sq",
    "cubic",
    "times",
    "percent",
    "pct",
    "percentage",
    "mile",
    "calorie",
];

fn is_unit_word(w: &str) -> bool {
    let w = w.to_ascii_lowercase();
    let singular = w.strip_suffix('s').unwrap_or(&w);
    UNIT_WORDS.contains(&w.as_str()) || UNIT_WORDS.contains(&singular)
}

/// Commands rewritten before parsing, in this order (`\u{1}` keeps a `\\` row break from being
/// read as `\ `; `\u{3}` marks a `\!` whose following spaces go too).
const COMMAND_REWRITES: [(&str, &str); 17] = [
    ("\\!", "\u{3}"),
    ("\\angle", ""),
    ("\\mathbb{R}", "(-\\infty,\\infty)"),
    ("\\dfrac", "\\frac"),
    ("\\tfrac", "\\frac"),
    ("^{\\circ}", ""),
    ("^\\circ", ""),
    ("{}^\\circ", ""),
    ("\\circ", ""),
    ("\\text{ and }", " and "),
    ("\\text{and}", " and "),
    ("\\text{ or }", " or "),
    ("\\,", " "),
    ("\\;", " "),
    ("\\\\", "\u{1}"),
    ("\\ ", " "),
    ("\u{1}", "\\\\"),
];

/// Clean an extracted answer for parsing.
pub fn normalize(s: &str) -> String {
    let mut s = s.trim().to_string();
    // Enclosing math delimiters.
    for (open, close) in [("\\(", "\\)"), ("\\[", "\\]"), ("$$", "$$")] {
        if s.starts_with(open) && s.ends_with(close) && s.len() >= open.len() + close.len() {
            s = s[open.len()..s.len() - close.len()].to_string();
        }
    }
    let percent_words = ["percentage", "percent", "pct"];
    let s = single_backslash_commands(&s);
    let mut t = s.replace("\\$", "").replace('$', "").replace("{,}", ",");
    // The rewrites of commands, in order; only text with a backslash has any (most answers and
    // much prose have none, and each `replace` is a scan and a new string).
    if t.contains('\\') {
        for (from, to) in COMMAND_REWRITES {
            if t.contains(from) {
                t = t.replace(from, to);
            }
        }
    }
    let mut t = t.replace('\n', " ");
    // `\!` goes with the spaces after it (`32,\! 349` is 32,349).
    while let Some(k) = t.find('\u{3}') {
        let rest = t[k + 1..].trim_start().to_string();
        t.truncate(k);
        t.push_str(&rest);
    }
    for w in percent_words {
        if let Some(k) = t.find(w) {
            t.replace_range(k..k + w.len(), "%");
        }
    }
    t = and_or_as_commas(&t);
    t = strip_trailing_punct(&t);
    t = strip_text_units(&t);
    t = strip_unit_words(&t);
    t = strip_trailing_punct(&t);
    // Spaces between digit groups (`1 000`, `90\,952`) are not thousands separators in LaTeX
    // (the expression parser reads them); a plain number found in prose arrives without them.
    t = strip_comma_thousands(&t);
    leading_zero_decimal_comma(t.trim())
}

/// `\\left(`, `\\frac` (a command written with a doubled backslash, as text escaped twice
/// reads) is the command, as math-verify reads it; in a matrix `\\` ends a row and stays.
fn single_backslash_commands(s: &str) -> String {
    if s.contains("matrix") || !s.contains("\\\\") {
        return s.to_string();
    }
    let b = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let mut copied = 0;
    let mut i = 0;
    while i + 2 < b.len() {
        if b[i] == b'\\' && b[i + 1] == b'\\' && b[i + 2].is_ascii_alphabetic() {
            out.push_str(&s[copied..i]);
            copied = i + 1;
            i += 2;
        } else {
            i += 1;
        }
    }
    out.push_str(&s[copied..]);
    out
}

/// The words `and` and `or` between items are commas, wherever no letter touches them
/// (`(2,9)or(9,2)`, `2 and3`, `19, 46, and 82`: a comma before the word goes with it), as
/// math-verify's LaTeX normalisation reads them; `Rand`, `order` and `\lor` are left alone.
fn and_or_as_commas(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let (mut i, mut copied) = (0, 0);
    while i < b.len() {
        let word = [&b"and"[..], &b"or"[..]]
            .into_iter()
            .find(|w| b[i..].starts_with(w));
        let Some(word) = word else {
            i += 1;
            continue;
        };
        let end = i + word.len();
        let letter_before = i > 0 && b[i - 1].is_ascii_alphabetic();
        let letter_after = end < b.len() && b[end].is_ascii_alphabetic();
        if letter_before || letter_after {
            i += 1;
            continue;
        }
        out.push_str(&s[copied..i]);
        // `, and`: one comma, not two.
        let kept = out.trim_end().len();
        if out[..kept].ends_with(',') {
            out.truncate(kept - 1);
        }
        out.push(',');
        i = end;
        copied = end;
    }
    out.push_str(&s[copied..]);
    out
}

/// The whole answer `0,ddd` is the decimal `0.ddd` (math-verify's reading); other single commas
/// separate list items.
fn leading_zero_decimal_comma(t: &str) -> String {
    let (sign, body) = t.strip_prefix('-').map_or(("", t), |b| ("-", b));
    match body.strip_prefix("0,") {
        Some(d) if d.len() == 3 && d.bytes().all(|c| c.is_ascii_digit()) => format!("{sign}0.{d}"),
        _ => t.to_string(),
    }
}

fn strip_trailing_punct(s: &str) -> String {
    let mut t = s.trim();
    loop {
        let before = t;
        if !t.ends_with("..") {
            t = t.strip_suffix('.').unwrap_or(t).trim_end();
        }
        t = t.strip_suffix(',').unwrap_or(t).trim_end();
        t = t.strip_suffix(';').unwrap_or(t).trim_end();
        t = t.strip_suffix("\\.").unwrap_or(t).trim_end();
        if t == before {
            break;
        }
    }
    t.to_string()
}

/// `15\mbox{ cm}^2` -> `15`: a trailing text group after something else is a unit.
fn strip_text_units(s: &str) -> String {
    let mut t = s.trim_end().to_string();
    // math-verify drops everything from the first `\text{`/`\mbox{` on when the answer ends
    // with a text group (`-7\text{ cm}, -4\text{ cm}` reads as `-7`).
    let ends_in_group = {
        let u = t.trim_end_matches(|c: char| c.is_ascii_digit());
        let u = u.strip_suffix('^').unwrap_or(u);
        u.ends_with('}')
    };
    if ends_in_group {
        let first = ["\\text{", "\\mbox{"]
            .iter()
            .filter_map(|c| t.find(c))
            .min();
        if let Some(k) = first.filter(|&k| !t[..k].trim().is_empty()) {
            let head = t[..k].trim_end();
            if !head.ends_with(['=', '(', ',', '{', '+', '-']) {
                t = head.to_string();
            }
        }
    }
    for _ in 0..3 {
        let mut changed = false;
        for cmd in [
            "\\text",
            "\\mbox",
            "\\textnormal",
            "\\textrm",
            "\\mathrm",
            "\\textbf",
        ] {
            if let Some(k) = t.rfind(cmd) {
                let after = &t[k + cmd.len()..];
                if !after.trim_start().starts_with('{') {
                    continue;
                }
                let Some(close) = matching_brace(after) else {
                    continue;
                };
                let rest = after[close + 1..].trim();
                let rest_ok =
                    rest.is_empty() || rest.starts_with('^') && rest.len() <= 4 || rest == "%";
                let head = t[..k].trim_end();
                if rest_ok && !head.is_empty() && !head.ends_with(['=', '(', ',', '{', '+', '-']) {
                    let pct = if rest == "%" { "%" } else { "" };
                    t = format!("{head}{pct}");
                    changed = true;
                }
            }
        }
        if !changed {
            break;
        }
    }
    t
}

/// Index of the `}` closing the first `{` in `s` (the grader's one brace matcher).
pub(crate) fn matching_brace(s: &str) -> Option<usize> {
    let mut depth = 0i32;
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

/// `18 dollars`, `5 square feet` -> `18`, `5` (only when a number or closing bracket precedes).
fn strip_unit_words(s: &str) -> String {
    let mut words: Vec<&str> = s.split(' ').filter(|w| !w.is_empty()).collect();
    let mut dropped = false;
    while words.len() > 1 {
        let last = words[words.len() - 1].trim_end_matches(['.', ',']);
        if last.chars().all(|c| c.is_ascii_alphabetic()) && is_unit_word(last) {
            words.pop();
            dropped = true;
        } else {
            break;
        }
    }
    if !dropped {
        return s.to_string();
    }
    let head = words.join(" ");
    if head.ends_with(|c: char| c.is_ascii_digit() || c == '}' || c == ')' || c == '%') {
        head
    } else {
        s.to_string()
    }
}

/// Thousands commas (`7,425,000`, `1,000.5`, `14{,}916`) when the whole answer is one such number,
/// as latex2sympy groups them; anywhere else a comma separates items (`x = 1,000` is `x = {1, 0}`,
/// `(12,102)` an interval), as it does there.
fn strip_comma_thousands(s: &str) -> String {
    let t = s.trim();
    let body = t.strip_prefix('-').unwrap_or(t);
    let (int, frac) = body.split_once('.').unwrap_or((body, ""));
    let groups: Vec<&str> = int.split(',').collect();
    let digits = |g: &str| !g.is_empty() && g.bytes().all(|c| c.is_ascii_digit());
    let grouped = groups.len() > 1
        && (1..=3).contains(&groups[0].len())
        && digits(groups[0])
        // `0,234` is the decimal 0.234 (below).
        && groups[0] != "0"
        && groups[1..].iter().all(|g| g.len() == 3 && digits(g))
        && (frac.is_empty() && !body.contains('.') || digits(frac));
    if grouped {
        t.replace(',', "")
    } else {
        braced_thousands(s)
    }
}

/// Thousands commas inside a command's braces (`\frac{2\cdot 1,000}{2}`): latex2sympy cannot
/// read a comma there, and math-verify then reads the grouped number from the text (1000), so a
/// `d,ddd` group inside braces is one number.
fn braced_thousands(s: &str) -> String {
    let b = s.as_bytes();
    if !b.contains(&b'{') || !b.contains(&b',') {
        return s.to_string();
    }
    let mut out = Vec::with_capacity(b.len());
    let (mut depth, mut i) = (0usize, 0usize);
    while i < b.len() {
        match b[i] {
            b'{' => depth += 1,
            b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        let starts_number = b[i].is_ascii_digit()
            && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'.'));
        if depth > 0 && starts_number {
            let st = i;
            while i < b.len() && b[i].is_ascii_digit() {
                i += 1;
            }
            let lead = i - st;
            let mut j = i;
            while j + 3 < b.len()
                && b[j] == b','
                && b[j + 1..j + 4].iter().all(u8::is_ascii_digit)
                && (j + 4 >= b.len() || !b[j + 4].is_ascii_digit())
            {
                j += 4;
            }
            let grouped = j > i && lead <= 3 && !(lead == 1 && b[st] == b'0');
            let end = if grouped { j } else { i };
            out.extend(b[st..end].iter().filter(|&&c| !grouped || c != b','));
            i = end;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8(out).unwrap_or_else(|_| s.to_string())
}
