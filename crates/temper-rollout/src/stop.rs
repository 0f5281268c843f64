//! Stop strings, matched on decoded completion text.
//!
//! Semantics (documented in `docs/rollout.md`): a stop string ends a sample when an occurrence of it
//! is *completed by the newest token*, i.e. ends inside the text that token added. The completion
//! keeps every generated token up to and including that one (tokens are the source of truth; the
//! text of the stop string is part of `decode(completion_ids)`, possibly followed by a few more
//! characters from the same token). Occurrences completed before `min_tokens` do not count.
//!
//! Only a window of the last tokens is decoded each step, so the cost per step does not grow with
//! the completion length.

use anyhow::Result;

/// Turns token ids into text. Special tokens must be kept (not skipped) so that a stop string
/// like `<|im_end|>` can match.
pub trait Decode {
    fn decode(&self, ids: &[i64]) -> Result<String>;
}

/// The stop strings of one request.
#[derive(Clone, Debug)]
pub struct StopStrings {
    stops: Vec<String>,
    /// How many trailing tokens to decode: enough for the longest stop string (at least one byte
    /// per token) plus a few tokens of a UTF-8 character split across tokens.
    window: usize,
}

impl StopStrings {
    pub fn new(stops: &[String]) -> Self {
        let longest = stops.iter().map(|s| s.len()).max().unwrap_or(0);
        Self {
            stops: stops.to_vec(),
            window: longest + 4,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.stops.is_empty()
    }

    /// If the last id of `completion` completes one of the stop strings, its index (the one whose
    /// occurrence starts first; ties go to the lower index).
    pub fn completed_by_last(
        &self,
        completion: &[i64],
        decoder: &dyn Decode,
    ) -> Result<Option<usize>> {
        if self.stops.is_empty() || completion.is_empty() {
            return Ok(None);
        }
        let start = completion.len().saturating_sub(self.window);
        let before = decoder.decode(&completion[start..completion.len() - 1])?;
        let after = decoder.decode(&completion[start..])?;
        // Text that was already final before the newest token: drop a trailing partial character
        // (decoded as U+FFFD) and anything the newest token rewrote.
        let stable = before.trim_end_matches('\u{FFFD}');
        let old_len = common_prefix_len(stable, &after);
        let mut best: Option<(usize, usize)> = None; // (start byte, stop index)
        for (i, stop) in self.stops.iter().enumerate() {
            let from = floor_char_boundary(&after, old_len.saturating_sub(stop.len() - 1));
            let hit = after[from..]
                .match_indices(stop.as_str())
                .map(|(p, _)| from + p)
                .find(|&p| p + stop.len() > old_len);
            if let Some(p) = hit {
                if best.is_none_or(|(b, _)| p < b) {
                    best = Some((p, i));
                }
            }
        }
        Ok(best.map(|(_, i)| i))
    }
}

fn common_prefix_len(a: &str, b: &str) -> usize {
    let mut n = 0;
    for ((i, ca), cb) in a.char_indices().zip(b.chars()) {
        if ca != cb {
            return i;
        }
        n = i + ca.len_utf8();
    }
    n
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Byte-level "tokenizer": token id = one byte; invalid UTF-8 decodes to U+FFFD like HF's.
    struct Bytes;
    impl Decode for Bytes {
        fn decode(&self, ids: &[i64]) -> Result<String> {
            let bytes: Vec<u8> = ids.iter().map(|&i| i as u8).collect();
            Ok(String::from_utf8_lossy(&bytes).into_owned())
        }
    }

    /// Word-level: each id is a whole string from a table.
    struct Words(&'static [&'static str]);
    impl Decode for Words {
        fn decode(&self, ids: &[i64]) -> Result<String> {
            Ok(ids.iter().map(|&i| self.0[i as usize]).collect())
        }
    }

    fn ids(s: &str) -> Vec<i64> {
        s.bytes().map(|b| b as i64).collect()
    }

    /// The first prefix length at which a stop fires, and which.
    fn first_stop(stops: &[&str], text: &str) -> Option<(usize, usize)> {
        let s = StopStrings::new(&stops.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        let all = ids(text);
        (1..=all.len()).find_map(|n| {
            s.completed_by_last(&all[..n], &Bytes)
                .unwrap()
                .map(|i| (n, i))
        })
    }

    #[test]
    fn fires_on_the_completing_token() {
        assert_eq!(
            first_stop(&["</answer>"], "x = 4</answer> more"),
            Some((14, 0))
        );
        assert_eq!(first_stop(&["\n\n"], "a\nb\n\nc"), Some((5, 0)));
        assert_eq!(first_stop(&["zz"], "abc"), None);
        // The earliest-starting occurrence wins when two complete on the same token.
        assert_eq!(first_stop(&["bc", "abc"], "xabc"), Some((4, 1)));
    }

    #[test]
    fn old_occurrences_do_not_fire_again() {
        let s = StopStrings::new(&["ab".to_string()]);
        // "ab" was completed by token 2; tokens after it do not re-trigger it.
        assert_eq!(s.completed_by_last(&ids("ab"), &Bytes).unwrap(), Some(0));
        assert_eq!(s.completed_by_last(&ids("abc"), &Bytes).unwrap(), None);
        assert_eq!(s.completed_by_last(&ids("abcab"), &Bytes).unwrap(), Some(0));
    }

    #[test]
    fn multibyte_characters_split_across_tokens() {
        // "é" is two bytes: the stop string completes only when its second byte arrives.
        assert_eq!(first_stop(&["é!"], "caf\u{e9}!"), Some((6, 0)));
        assert_eq!(first_stop(&["\u{e9}"], "caf\u{e9}"), Some((5, 0)));
        // Long completions only decode a window, yet still find strings spanning many tokens.
        let text = format!("{}\u{4e16}\u{754c}END", "x".repeat(500));
        assert_eq!(first_stop(&["\u{754c}END"], &text), Some((text.len(), 0)));
    }

    #[test]
    fn multi_character_tokens() {
        let table: &[&str] = &["Hello", " wor", "ld", "</s", "top>", "!"];
        let s = StopStrings::new(&["world".to_string(), "</stop>".to_string()]);
        assert_eq!(s.completed_by_last(&[0, 1], &Words(table)).unwrap(), None);
        assert_eq!(
            s.completed_by_last(&[0, 1, 2], &Words(table)).unwrap(),
            Some(0)
        );
        assert_eq!(s.completed_by_last(&[5, 3], &Words(table)).unwrap(), None);
        assert_eq!(
            s.completed_by_last(&[5, 3, 4], &Words(table)).unwrap(),
            Some(1)
        );
        // A token can carry text past the stop string; it still fires on that token.
        let table: &[&str] = &["a", "b", "bcd"];
        let s = StopStrings::new(&["ab".to_string()]);
        assert_eq!(
            s.completed_by_last(&[0, 2], &Words(table)).unwrap(),
            Some(0)
        );
    }
}
