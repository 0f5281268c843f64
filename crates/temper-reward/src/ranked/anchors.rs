//! Candidates after the anchor words "answer:" and "answer" (math-verify's priority groups 100
//! and 200): the first math environment, or plain number or expression, after each occurrence.
use super::{envs_at, joined, plain_at, BoxMode, Candidate, Text};

/// Walks the occurrences of `word` (case-insensitive) that do not start inside the previous
/// candidate: `find(start)` looks right after the word (at byte `start`) and returns the candidate
/// found there, if any, which is pushed with the occurrence as its start.
fn after_anchor(
    t: &Text,
    word: &str,
    out: &mut Vec<Candidate>,
    mut find: impl FnMut(usize) -> Option<Candidate>,
) {
    let mut from = 0;
    for k in t.anchors(word) {
        if k < from {
            continue;
        }
        if let Some(c) = find(k + word.len()) {
            from = c.end;
            out.push(Candidate { start: k, ..c });
        }
    }
}

/// Candidates after an anchor word: for each occurrence of `word` (case-insensitive), the first
/// environment chain within `window` bytes after it (lazy `.{0,window}?`).
pub(super) fn after_anchor_latex(
    t: &Text,
    word: &str,
    window: usize,
    out: &mut Vec<Candidate>,
    prio: u32,
) {
    let s = t.s;
    after_anchor(t, word, out, |start| {
        for off in 0..=window {
            let i = start + off;
            if i > s.len() {
                break;
            }
            if !s.is_char_boundary(i) {
                continue;
            }
            if let Some((parts, end)) = envs_at(t, i, false) {
                let (text, percent) = joined(&parts, BoxMode::All);
                return Some(Candidate {
                    text,
                    percent,
                    priority: prio,
                    latex: true,
                    start,
                    end,
                });
            }
        }
        None
    });
}

/// As [`after_anchor_latex`] for plain numbers / expressions; the window does not cross a line,
/// and a `=` within 100 bytes moves the answer after the last one.
pub(super) fn after_anchor_plain(t: &Text, word: &str, out: &mut Vec<Candidate>, prio: u32) {
    let s = t.s;
    after_anchor(t, word, out, |start| {
        let line_end = s[start..].find('\n').map_or(s.len(), |n| start + n);
        let mut found = None;
        // `answer ... = X` (greedy: the last `=` within 100 bytes), then `answer ... X` (lazy).
        let zone_end = floor_boundary(s, line_end.min(start + 101).min(s.len()));
        let eq_zone = &s[start..zone_end.max(start)];
        for (q, _) in eq_zone.rmatch_indices('=') {
            let mut i = start + q + 1;
            while s[i..].starts_with(char::is_whitespace) && i < line_end {
                i += 1;
            }
            if let Some((t, e, pct)) = anchored_plain(s, i) {
                if !s[e..].trim_start().starts_with('=') {
                    found = Some((t, e, pct));
                    break;
                }
            }
        }
        if found.is_none() {
            for off in 0..=50 {
                let i = start + off;
                if i > line_end {
                    break;
                }
                if !s.is_char_boundary(i) {
                    continue;
                }
                if let Some((t, e, pct)) = anchored_plain(s, i) {
                    if !s[e..].trim_start().starts_with('=') {
                        found = Some((t, e, pct));
                        break;
                    }
                }
            }
        }
        found.map(|(text, end, percent)| Candidate {
            text,
            percent,
            priority: prio,
            latex: false,
            start,
            end,
        })
    });
}

pub(super) fn floor_boundary(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// A number or expression at `i` right after math-verify's prefix (a space or `=`).
fn anchored_plain(s: &str, i: usize) -> Option<(String, usize, bool)> {
    let prefixed = s[..i].ends_with(char::is_whitespace) || s[..i].ends_with('=');
    if prefixed {
        plain_at(s, i)
    } else {
        None
    }
}
