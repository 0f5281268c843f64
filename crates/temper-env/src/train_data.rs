//! Training data from episodes: one datum per trained transcript, with a per-token advantage on
//! every completion token (0 on injected tokens, which are also masked out).
//!
//! Debate modes (`env.debate_train`), for the debates of one question that have a verdict:
//! - `rejection`: winners only; each of a winner's T sampled tokens gets 1/T.
//! - `rs_grpo`: winners only; r = the winner's R1 task reward (as if the debate had not
//!   happened), centred over the winners of the question (`grpo_std = false`: r - mean; `true`:
//!   (r - mean) / std with the population std, 0 when std is 0), divided by T.
//! - `r1_r23`: both debaters; R1 tokens get the z-score of their R1 task reward over all R1
//!   answers of the question (population std, 0 when std is 0); R2/R3 tokens get +c for the
//!   winner and -c for the loser (`r23_constant`).
use crate::debate::judge::Verdict;
use crate::debate::DebateGroup;
use crate::transcript::Transcript;
use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

/// One training sequence, in the shape of `training_step_<k>.json`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Datum {
    pub prompt_tokens: Vec<i64>,
    pub completion_tokens: Vec<i64>,
    pub completion_logprobs: Vec<f32>,
    pub completion_advantages: Vec<f32>,
    /// 1 where the policy sampled the token, 0 where it was injected.
    pub completion_mask: Vec<u8>,
    /// The question's id (its advantage group).
    pub group: String,
    /// The reward the advantages were computed from.
    pub reward: f64,
}

impl Datum {
    /// A datum of `t` with advantage `adv(position)` on sampled tokens and 0 elsewhere.
    pub fn from_transcript(
        t: &Transcript,
        group: &str,
        reward: f64,
        adv: impl Fn(usize) -> f32,
    ) -> Self {
        Datum {
            prompt_tokens: t.first_prompt().to_vec(),
            completion_tokens: t.completion().to_vec(),
            completion_logprobs: t.logprobs.clone(),
            completion_advantages: t
                .mask
                .iter()
                .enumerate()
                .map(|(i, &m)| if m == 1 { adv(i) } else { 0.0 })
                .collect(),
            completion_mask: t.mask.clone(),
            group: group.to_string(),
            reward,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum DebateTrain {
    Rejection,
    RsGrpo { std: bool },
    R1R23 { constant: f64 },
}

/// The names [`DebateTrain::parse`] accepts.
pub const DEBATE_TRAIN_MODES: &[&str] = &["rejection", "rs_grpo", "r1_r23"];

impl DebateTrain {
    pub fn parse(mode: &str, grpo_std: bool, r23_constant: f64) -> Result<Self> {
        Ok(match mode {
            "rejection" => DebateTrain::Rejection,
            "rs_grpo" => DebateTrain::RsGrpo { std: grpo_std },
            "r1_r23" => DebateTrain::R1R23 {
                constant: r23_constant,
            },
            other => bail!(
                "env.debate_train = {other:?}: expected one of {}",
                DEBATE_TRAIN_MODES.join(", ")
            ),
        })
    }
}

/// `(x - mean) / std` (population std), or `x - mean` when `!use_std`; 0 when std is 0.
pub fn centred(xs: &[f64], use_std: bool) -> Vec<f64> {
    if xs.is_empty() {
        return vec![];
    }
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    if !use_std {
        return xs.iter().map(|x| x - mean).collect();
    }
    let std = (xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n).sqrt();
    xs.iter()
        .map(|x| if std == 0.0 { 0.0 } else { (x - mean) / std })
        .collect()
}

/// The datums of one question's debates.
pub fn debate_datums(group: &DebateGroup, mode: DebateTrain) -> Vec<Datum> {
    let id = &group.question.id;
    let decided: Vec<(usize, usize)> = group
        .debates
        .iter()
        .enumerate()
        .filter_map(|(d, deb)| match deb.verdict {
            Some(Verdict::Winner(s)) => Some((d, s.index())),
            _ => None,
        })
        .collect();
    let winner = |d: usize, w: usize| &group.debates[d].agents[w];
    let r1 = |d: usize, a: usize| group.debates[d].r1_scores[a].reward;
    match mode {
        DebateTrain::Rejection => decided
            .iter()
            .map(|&(d, w)| {
                let t = winner(d, w);
                let inv_t = 1.0 / t.sampled_tokens().max(1) as f32;
                Datum::from_transcript(t, id, 1.0, |_| inv_t)
            })
            .collect(),
        DebateTrain::RsGrpo { std } => {
            let rewards: Vec<f64> = decided.iter().map(|&(d, w)| r1(d, w)).collect();
            let adv = centred(&rewards, std);
            decided
                .iter()
                .zip(adv.iter().zip(&rewards))
                .map(|(&(d, w), (&a, &r))| {
                    let t = winner(d, w);
                    let per = (a / t.sampled_tokens().max(1) as f64) as f32;
                    Datum::from_transcript(t, id, r, |_| per)
                })
                .collect()
        }
        DebateTrain::R1R23 { constant } => {
            let agents: Vec<(usize, usize, bool)> = decided
                .iter()
                .flat_map(|&(d, w)| [(d, w, true), (d, 1 - w, false)])
                .collect();
            let rewards: Vec<f64> = agents.iter().map(|&(d, a, _)| r1(d, a)).collect();
            let z = centred(&rewards, true);
            agents
                .iter()
                .zip(z.iter().zip(&rewards))
                .map(|(&(d, a, won), (&z1, &r))| {
                    let t = &group.debates[d].agents[a];
                    let r1_span = t.turn_positions(0);
                    let c = if won { constant } else { -constant };
                    Datum::from_transcript(t, id, r, |i| {
                        if r1_span.contains(&i) {
                            z1 as f32
                        } else {
                            c as f32
                        }
                    })
                })
                .collect()
        }
    }
}

/// Datums of single-turn groups from GRPO-style per-sample advantages (`adv[i]` for episode
/// `i`, the same on every sampled token).
pub fn episode_datums(
    episodes: &[Transcript],
    group: &str,
    rewards: &[f64],
    adv: &[f64],
) -> Vec<Datum> {
    episodes
        .iter()
        .zip(rewards.iter().zip(adv))
        .map(|(t, (&r, &a))| Datum::from_transcript(t, group, r, |_| a as f32))
        .collect()
}

/// Nonzero-advantage statistics: `Advantage stats (nonzero): n=.. min=.. max=.. mean=..`, or
/// `None` when every token advantage is 0 (no learning signal).
pub fn advantage_stats<'a>(datums: impl IntoIterator<Item = &'a Datum>) -> Option<String> {
    let nz: Vec<f64> = datums
        .into_iter()
        .flat_map(|d| d.completion_advantages.iter())
        .filter(|&&a| a != 0.0)
        .map(|&a| a as f64)
        .collect();
    if nz.is_empty() {
        return None;
    }
    let min = nz.iter().copied().fold(f64::INFINITY, f64::min);
    let max = nz.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let mean = nz.iter().sum::<f64>() / nz.len() as f64;
    Some(format!(
        "Advantage stats (nonzero): n={} min={min:.6} max={max:.6} mean={mean:.6}",
        nz.len()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn centring() {
        assert_eq!(
            centred(&[1.0, 0.0, 0.0, 1.0], false),
            vec![0.5, -0.5, -0.5, 0.5]
        );
        assert_eq!(
            centred(&[1.0, 0.0, 0.0, 1.0], true),
            vec![1.0, -1.0, -1.0, 1.0]
        );
        assert_eq!(centred(&[0.3, 0.3], true), vec![0.0, 0.0]);
        assert_eq!(centred(&[0.3], false), vec![0.0]);
    }
}
