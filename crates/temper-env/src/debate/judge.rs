//! Judges of a debate and the verdict format. `policy` and `model` judges read both
//! transcripts and answer `<VERDICT>A</VERDICT>` or `<VERDICT>B</VERDICT>`; `mock` flips a
//! seeded coin; `confidence` picks the debater with the higher `<CONFIDENCE>` in round 1.
use anyhow::{bail, Result};
use rand::{Rng, SeedableRng};
use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Side {
    A,
    B,
}

impl Side {
    pub fn index(self) -> usize {
        match self {
            Side::A => 0,
            Side::B => 1,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Side::A => "A",
            Side::B => "B",
        }
    }
}

/// A judge's decision; `Invalid` debates are skipped (and counted).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Verdict {
    Winner(Side),
    Invalid,
}

impl Verdict {
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Winner(s) => s.name(),
            Verdict::Invalid => "INVALID",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum JudgeKind {
    /// The current policy, sampled at `temperature`.
    Policy,
    /// A separate frozen model (its path is the trainer's business).
    Model,
    Mock,
    Confidence,
}

/// The names [`JudgeKind::parse`] accepts.
pub const JUDGES: &[&str] = &["mock", "confidence", "policy", "model"];

impl JudgeKind {
    pub fn parse(s: &str) -> Result<Self> {
        Ok(match s {
            "policy" => JudgeKind::Policy,
            "model" => JudgeKind::Model,
            "mock" => JudgeKind::Mock,
            "confidence" => JudgeKind::Confidence,
            other => bail!(
                "env.judge = {other:?}: expected one of {}",
                JUDGES.join(", ")
            ),
        })
    }
    /// Whether the judge is a model that has to be sampled.
    pub fn samples(&self) -> bool {
        matches!(self, JudgeKind::Policy | JudgeKind::Model)
    }
}

/// The verdict in a judge's text: the last `<VERDICT>..</VERDICT>`, `A` or `B` (case and
/// surrounding spaces ignored); anything else is `Invalid`.
pub fn parse_verdict(text: &str) -> Verdict {
    let Some(end) = text.rfind("</VERDICT>") else {
        return Verdict::Invalid;
    };
    let Some(start) = text[..end].rfind("<VERDICT>") else {
        return Verdict::Invalid;
    };
    match text[start + "<VERDICT>".len()..end]
        .trim()
        .to_ascii_uppercase()
        .as_str()
    {
        "A" => Verdict::Winner(Side::A),
        "B" => Verdict::Winner(Side::B),
        _ => Verdict::Invalid,
    }
}

/// The number in the last `<CONFIDENCE>..</CONFIDENCE>` (a trailing `%` allowed).
pub fn parse_confidence(text: &str) -> Option<f64> {
    let end = text.rfind("</CONFIDENCE>")?;
    let start = text[..end].rfind("<CONFIDENCE>")? + "<CONFIDENCE>".len();
    let v: f64 = text[start..end]
        .trim()
        .trim_end_matches('%')
        .trim()
        .parse()
        .ok()?;
    v.is_finite().then_some(v)
}

/// Higher round-1 confidence wins; a missing one loses to a present one; equal or both
/// missing is `Invalid`.
pub fn confidence_verdict(r1_a: &str, r1_b: &str) -> Verdict {
    match (parse_confidence(r1_a), parse_confidence(r1_b)) {
        (Some(a), Some(b)) if a > b => Verdict::Winner(Side::A),
        (Some(a), Some(b)) if b > a => Verdict::Winner(Side::B),
        (Some(_), None) => Verdict::Winner(Side::A),
        (None, Some(_)) => Verdict::Winner(Side::B),
        _ => Verdict::Invalid,
    }
}

/// A fair coin from `seed` (the debate's own seed): the same seed, the same verdict.
pub fn mock_verdict(seed: u64) -> Verdict {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    if rng.random::<bool>() {
        Verdict::Winner(Side::A)
    } else {
        Verdict::Winner(Side::B)
    }
}

/// What the judge reads: the question and both debaters' three rounds.
pub fn judge_prompt(question: &str, rounds: &[[String; 3]; 2]) -> String {
    let mut s = format!(
        "You are the judge of a debate between two debaters, A and B, about this question:\n\n{question}\n\n"
    );
    for (side, r) in ["A", "B"].iter().zip(rounds) {
        s.push_str(&format!(
            "Debater {side}, round 1 (proposal):\n{}\n\nDebater {side}, round 2 (argument):\n{}\n\nDebater {side}, \
             round 3 (response):\n{}\n\n",
            r[0].trim(),
            r[1].trim(),
            r[2].trim()
        ));
    }
    s.push_str(
        "Which debater is right? Explain briefly, then answer with <VERDICT>A</VERDICT> or <VERDICT>B</VERDICT>.",
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_parse_or_are_invalid() {
        assert_eq!(
            parse_verdict("B is right. <VERDICT> a </VERDICT>"),
            Verdict::Winner(Side::A)
        );
        assert_eq!(
            parse_verdict("<VERDICT>A</VERDICT> no, <VERDICT>B</VERDICT>"),
            Verdict::Winner(Side::B)
        );
        assert_eq!(parse_verdict("<VERDICT>both</VERDICT>"), Verdict::Invalid);
        assert_eq!(parse_verdict("A wins"), Verdict::Invalid);
        assert_eq!(parse_verdict("</VERDICT>A<VERDICT>"), Verdict::Invalid);
    }

    #[test]
    fn confidence_and_mock() {
        let c = |x: &str| format!("answer <CONFIDENCE>{x}</CONFIDENCE>");
        assert_eq!(
            confidence_verdict(&c("80"), &c("60%")),
            Verdict::Winner(Side::A)
        );
        assert_eq!(
            confidence_verdict(&c("10"), &c("60")),
            Verdict::Winner(Side::B)
        );
        assert_eq!(confidence_verdict(&c("60"), &c("60")), Verdict::Invalid);
        assert_eq!(
            confidence_verdict("none", &c("1")),
            Verdict::Winner(Side::B)
        );
        assert_eq!(confidence_verdict("none", "none"), Verdict::Invalid);
        assert_eq!(mock_verdict(7), mock_verdict(7));
        let a = (0..1000)
            .filter(|&s| mock_verdict(s) == Verdict::Winner(Side::A))
            .count();
        assert!((400..600).contains(&a), "a fair coin: {a}");
    }
}
