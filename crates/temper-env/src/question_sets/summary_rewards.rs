//! Rewards for a summary of an article, and weighted combinations of them
//! (`compression:0.5,length:0.5` -> sum(w * r) / sum(w)). Lengths are in characters (Unicode
//! scalar values), as the runbook's Python `len` counts them.
use anyhow::{bail, Result};
use std::collections::BTreeMap;

/// The compression target: a summary a tenth of the article's length.
pub const TARGET_RATIO: f64 = 0.1;

/// rho = summary chars / article chars; rho / 0.1 below the target (too short), min(1, 0.1 / rho)
/// above it; 0 for an empty summary or article.
pub fn compression(summary: &str, article: &str) -> f64 {
    let (s, a) = (summary.chars().count(), article.chars().count());
    if s == 0 || a == 0 {
        return 0.0;
    }
    let rho = s as f64 / a as f64;
    if rho < TARGET_RATIO {
        (rho / TARGET_RATIO).max(0.0)
    } else {
        (TARGET_RATIO / rho).min(1.0)
    }
}

/// 1 for 50 to 500 characters; n / 50 below, 1 - (n - 500) / 500 (not below 0) above.
pub fn length(summary: &str) -> f64 {
    let (min, max) = (50.0, 500.0);
    let n = summary.chars().count() as f64;
    if n < min {
        n / min
    } else if n > max {
        (1.0 - (n - max) / max).max(0.0)
    } else {
        1.0
    }
}

/// A sentence-structure sanity check: the mean of a sentence-count score (1 for 2 to 5
/// sentences) and a words-per-sentence score (1 for 10 to 40).
pub fn fluency(summary: &str) -> f64 {
    if summary.is_empty() {
        return 0.0;
    }
    let text = summary.replace(['!', '?'], ".");
    let sentences: Vec<&str> = text
        .split('.')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if sentences.is_empty() {
        return 0.0;
    }
    let k = sentences.len() as f64;
    let count = if k < 2.0 {
        (k / 2.0).min(1.0)
    } else if k <= 5.0 {
        1.0
    } else {
        (1.0 - (k - 5.0) / 10.0).max(0.5)
    };
    let words = sentences
        .iter()
        .map(|s| s.split_whitespace().count())
        .sum::<usize>() as f64
        / k;
    let per = if (10.0..=40.0).contains(&words) {
        1.0
    } else {
        (1.0 - (words - 25.0).abs() / 25.0).max(0.0)
    };
    (count + per) / 2.0
}

pub const COMPONENTS: &[&str] = &["compression", "length", "fluency"];

/// A weighted combination of summary rewards.
#[derive(Clone, Debug, PartialEq)]
pub struct SummaryReward {
    pub weights: Vec<(String, f64)>,
}

impl SummaryReward {
    /// `compression`, `compression:0.5,length:0.5` (a name without a weight weighs 1).
    pub fn parse(spec: &str) -> Result<Self> {
        let mut weights = vec![];
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, w) = match part.split_once(':') {
                Some((n, w)) => {
                    let w: f64 = w.trim().parse().map_err(|_| {
                        anyhow::anyhow!(
                            "env.reward {spec:?}: weight {w:?} of {n:?} is not a number"
                        )
                    })?;
                    (n.trim(), w)
                }
                None => (part, 1.0),
            };
            if !COMPONENTS.contains(&name) {
                bail!(
                    "env.reward {spec:?}: unknown summary reward {name:?}; known: {}",
                    COMPONENTS.join(", ")
                );
            }
            if !(w.is_finite() && w >= 0.0) {
                bail!("env.reward {spec:?}: weight of {name:?} must be >= 0, got {w}");
            }
            weights.push((name.to_string(), w));
        }
        if weights.is_empty() || weights.iter().all(|(_, w)| *w == 0.0) {
            bail!("env.reward {spec:?}: no reward with a positive weight");
        }
        Ok(SummaryReward { weights })
    }

    /// The combined reward and each component.
    pub fn score(&self, summary: &str, article: &str) -> (f64, BTreeMap<String, f64>) {
        let mut parts = BTreeMap::new();
        let (mut total, mut wsum) = (0.0, 0.0);
        for (name, w) in &self.weights {
            let r = match name.as_str() {
                "compression" => compression(summary, article),
                "length" => length(summary),
                "fluency" => fluency(summary),
                _ => unreachable!("checked in parse"),
            };
            parts.insert(name.clone(), r);
            total += w * r;
            wsum += w;
        }
        (total / wsum, parts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compression_at_its_edges() {
        let article = "a".repeat(1000);
        assert_eq!(compression("", &article), 0.0);
        assert_eq!(compression("abc", ""), 0.0);
        assert_eq!(compression(&"b".repeat(100), &article), 1.0);
        assert!((compression(&"b".repeat(50), &article) - 0.5).abs() < 1e-12);
        assert!((compression(&"b".repeat(200), &article) - 0.5).abs() < 1e-12);
        assert!((compression(&"b".repeat(1000), &article) - 0.1).abs() < 1e-12);
        // Characters, not bytes.
        assert_eq!(compression(&"é".repeat(10), &"é".repeat(100)), 1.0);
    }

    #[test]
    fn weighted_combinations() {
        let r = SummaryReward::parse("compression:0.5,length:0.5").unwrap();
        let article = "a".repeat(1000);
        let (total, parts) = r.score(&"b".repeat(25), &article);
        assert!((parts["compression"] - 0.25).abs() < 1e-12);
        assert!((parts["length"] - 0.5).abs() < 1e-12);
        assert!((total - 0.375).abs() < 1e-12);
        assert_eq!(
            SummaryReward::parse("compression").unwrap().weights.len(),
            1
        );
        assert!(SummaryReward::parse("rouge:1")
            .unwrap_err()
            .to_string()
            .contains("unknown summary reward"));
        assert!(SummaryReward::parse("compression:x").is_err());
    }
}
