//! Scoring many responses safely: a reward that panics or returns a value that is not a finite
//! number gives a [`RewardFailure`] for that response (the caller decides, with
//! `reward.on_error`, whether that stops the run), never an unwinding thread or a NaN in the
//! advantages. Responses are scored on up to eight threads; results come back in input order.

use serde_json::Value;

use crate::reward::{Reward, RewardOutput};

/// One response to score.
pub struct ScoreInput<'a> {
    pub prompt: &'a str,
    pub completion: &'a str,
    pub ground_truth: &'a str,
    pub metadata: &'a Value,
}

/// Why a reward gave no score.
#[derive(Debug, Clone, PartialEq)]
pub enum RewardFailure {
    /// The reward panicked (its message).
    Panicked(String),
    /// The reward returned NaN or an infinity.
    NotFinite(f64),
}

impl std::fmt::Display for RewardFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RewardFailure::Panicked(m) => write!(f, "{m}"),
            RewardFailure::NotFinite(v) => write!(f, "reward is {v}"),
        }
    }
}

impl std::error::Error for RewardFailure {}

/// [`Reward::score`] that neither unwinds into the caller nor returns a non-finite reward.
pub fn score_checked(
    reward: &dyn Reward,
    input: &ScoreInput<'_>,
) -> Result<RewardOutput, RewardFailure> {
    let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        reward.score(
            input.prompt,
            input.completion,
            input.ground_truth,
            input.metadata,
        )
    }));
    match out {
        Ok(o) if o.reward.is_finite() => Ok(o),
        Ok(o) => Err(RewardFailure::NotFinite(o.reward)),
        Err(p) => Err(RewardFailure::Panicked(
            p.downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "a panic without a message".into()),
        )),
    }
}

/// [`score_checked`] for every input, on up to eight threads; results in input order.
pub fn score_all(
    reward: &dyn Reward,
    inputs: &[ScoreInput<'_>],
) -> Vec<Result<RewardOutput, RewardFailure>> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, 8);
    let chunk = inputs.len().div_ceil(threads).max(1);
    std::thread::scope(|s| {
        let handles: Vec<_> = inputs
            .chunks(chunk)
            .map(|part| {
                s.spawn(move || {
                    part.iter()
                        .map(|i| score_checked(reward, i))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("scoring never unwinds"))
            .collect()
    })
}
