//! Outcome advantage estimators (`algorithm.adv_estimator`), with verl's conventions.
//!
//! Inputs are verl's: `token_level_rewards` `(N, T)` (an outcome reward sits on one token; the
//! score of a response is the row sum), `response_mask` `(N, T)` and a group id per response
//! (`index`, the prompt uid; groups need not be contiguous). Output: advantages `(N, T)`, zero
//! outside the mask.
//! - `grpo`: `(s_i - mean_g) / (std_g + eps)` (std unbiased), or `s_i - mean_g` without std;
//!   a group of one has mean 0, std 1.
//! - `rloo`: `n/(n-1) (s_i - mean_g)`; a group of one keeps its raw score.
//! - `reinforce_plus_plus_baseline`: `masked_whiten(s_i - mean_g)` over all valid tokens.
//! - `reinforce_plus_plus`: discounted returns `G_t = r_t + gamma G_{t+1}` (reset after the last
//!   valid token), then `masked_whiten`.
//! - `opo`: `s_i - sum_j |y_j| s_j / sum_j |y_j|`; a group of one has baseline 0.
//! - `dr_grpo`: `grpo` without std; see [`Preset`] for the rest of the recipe.

use anyhow::{bail, Result};
use tch::{Kind, Tensor};

use crate::agg::AggMode;
use crate::masked::{mask_like, masked_whiten};
use crate::names::named_enum;

named_enum! {
    /// `algorithm.adv_estimator`.
    pub enum AdvEstimator ("adv_estimator") {
        Grpo => "grpo",
        Rloo => "rloo",
        ReinforcePlusPlus => "reinforce_plus_plus",
        ReinforcePlusPlusBaseline => "reinforce_plus_plus_baseline",
        Opo => "opo",
        /// Shorthand: `grpo` without std, `seq-mean-token-sum-norm`, no KL loss.
        DrGrpo => "dr_grpo",
    }
}

/// Settings a named recipe overrides besides the estimator (the trainer applies them).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Preset {
    pub norm_adv_by_std_in_grpo: bool,
    pub loss_agg_mode: AggMode,
    pub use_kl_loss: bool,
}

impl AdvEstimator {
    /// The recipe this name implies beyond the advantages (`dr_grpo` only).
    pub fn preset(self) -> Option<Preset> {
        match self {
            AdvEstimator::DrGrpo => Some(Preset {
                norm_adv_by_std_in_grpo: false,
                loss_agg_mode: AggMode::SeqMeanTokenSumNorm,
                use_kl_loss: false,
            }),
            _ => None,
        }
    }
}

/// `algorithm.*` settings the estimators read.
#[derive(Debug, Clone, Copy, PartialEq, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdvConfig {
    pub adv_estimator: AdvEstimator,
    pub norm_adv_by_std_in_grpo: bool,
    /// GRPO's epsilon (CS336's `advantage_eps`).
    #[serde(alias = "advantage_eps")]
    pub epsilon: f64,
    /// Discount of `reinforce_plus_plus`.
    pub gamma: f64,
}

impl Default for AdvConfig {
    fn default() -> Self {
        AdvConfig {
            adv_estimator: AdvEstimator::Grpo,
            norm_adv_by_std_in_grpo: true,
            epsilon: 1e-6,
            gamma: 1.0,
        }
    }
}

/// Groups as lists of row indices, in order of first appearance.
pub(crate) fn groups_of(index: &[i64]) -> Vec<Vec<usize>> {
    let mut order: Vec<i64> = Vec::new();
    let mut members: std::collections::HashMap<i64, Vec<usize>> = Default::default();
    for (i, &g) in index.iter().enumerate() {
        members
            .entry(g)
            .or_insert_with(|| {
                order.push(g);
                Vec::new()
            })
            .push(i);
    }
    order
        .into_iter()
        .map(|g| members.remove(&g).unwrap_or_default())
        .collect()
}

/// Group ids for `n` responses in contiguous groups of `group_size` (rollout `n`).
pub fn contiguous_groups(n: usize, group_size: usize) -> Result<Vec<i64>> {
    if group_size == 0 || !n.is_multiple_of(group_size) {
        bail!("{n} responses cannot be split into groups of {group_size}");
    }
    Ok((0..n).map(|i| (i / group_size) as i64).collect())
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

fn std_unbiased(v: &[f64]) -> f64 {
    let m = mean(v);
    (v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (v.len() as f64 - 1.0)).sqrt()
}

/// Per-response advantages of the group estimators (before broadcasting over tokens).
fn group_scalar_advantages_unchecked(
    cfg: &AdvConfig,
    scores: &[f64],
    lengths: &[f64],
    index: &[i64],
) -> Vec<f64> {
    let mut adv = scores.to_vec();
    for g in groups_of(index) {
        let s: Vec<f64> = g.iter().map(|&i| scores[i]).collect();
        let n = s.len();
        match cfg.adv_estimator {
            AdvEstimator::Grpo | AdvEstimator::DrGrpo => {
                let by_std = cfg.norm_adv_by_std_in_grpo && cfg.adv_estimator == AdvEstimator::Grpo;
                let (m, sd) = if n == 1 {
                    (0.0, 1.0)
                } else {
                    (mean(&s), std_unbiased(&s))
                };
                for &i in &g {
                    adv[i] = if by_std {
                        (scores[i] - m) / (sd + cfg.epsilon)
                    } else {
                        scores[i] - m
                    };
                }
            }
            AdvEstimator::Rloo => {
                if n > 1 {
                    let m = mean(&s);
                    let k = n as f64 / (n as f64 - 1.0);
                    for &i in &g {
                        adv[i] = scores[i] * k - m * k;
                    }
                }
            }
            AdvEstimator::ReinforcePlusPlusBaseline => {
                let m = if n == 1 { 0.0 } else { mean(&s) };
                for &i in &g {
                    adv[i] = scores[i] - m;
                }
            }
            AdvEstimator::Opo => {
                let b = if n == 1 {
                    0.0
                } else {
                    let len: f64 = g.iter().map(|&i| lengths[i]).sum();
                    g.iter().map(|&i| lengths[i] * scores[i]).sum::<f64>() / len
                };
                for &i in &g {
                    adv[i] = scores[i] - b;
                }
            }
            AdvEstimator::ReinforcePlusPlus => {}
        }
    }
    adv
}

/// Per-response (scalar) advantages of `grpo`, `dr_grpo`, `rloo` and `opo` from outcome scores,
/// response lengths `|y_i|` (used by `opo`) and group ids. The estimators that whiten over tokens
/// (`reinforce_plus_plus*`) have no per-response form: use [`compute_advantages`].
pub fn scalar_advantages(
    cfg: &AdvConfig,
    scores: &[f64],
    lengths: &[f64],
    index: &[i64],
) -> Result<Vec<f64>> {
    if matches!(
        cfg.adv_estimator,
        AdvEstimator::ReinforcePlusPlus | AdvEstimator::ReinforcePlusPlusBaseline
    ) {
        bail!(
            "{} advantages are per token; use compute_advantages",
            cfg.adv_estimator
        );
    }
    if scores.len() != index.len() || lengths.len() != index.len() {
        bail!(
            "{} scores, {} lengths and {} group ids do not match",
            scores.len(),
            lengths.len(),
            index.len()
        );
    }
    Ok(group_scalar_advantages_unchecked(
        cfg, scores, lengths, index,
    ))
}

fn to_vec(t: &Tensor) -> Vec<f64> {
    Vec::<f64>::try_from(
        &t.to_kind(Kind::Double)
            .to_device(tch::Device::Cpu)
            .reshape([-1]),
    )
    .unwrap_or_default()
}

/// Advantages `(N, T)` for `token_level_rewards` `(N, T)`, `response_mask` `(N, T)` and one group
/// id per response. Computed in f64, returned in the rewards' dtype.
pub fn compute_advantages(
    cfg: &AdvConfig,
    token_level_rewards: &Tensor,
    response_mask: &Tensor,
    index: &[i64],
) -> Result<Tensor> {
    crate::agg::check_same_shape(
        "token_level_rewards",
        token_level_rewards,
        "response_mask",
        response_mask,
    )?;
    let size = token_level_rewards.size();
    if size.len() != 2 {
        bail!("token_level_rewards: expected 2 dims (N, T), got shape {size:?}");
    }
    if index.len() as i64 != size[0] {
        bail!("{} group ids for {} responses", index.len(), size[0]);
    }
    let kind = token_level_rewards.kind();
    let rewards = token_level_rewards.to_kind(Kind::Double);
    let mask = mask_like(response_mask, &rewards);
    let out = match cfg.adv_estimator {
        AdvEstimator::ReinforcePlusPlus => {
            let t_len = size[1];
            let returns = rewards.zeros_like();
            let mut running = rewards.select(1, 0).zeros_like();
            for t in (0..t_len).rev() {
                running = rewards.select(1, t) + running * cfg.gamma;
                returns.select(1, t).copy_(&running);
                running *= mask.select(1, t);
            }
            masked_whiten(&returns, &mask, true)? * &mask
        }
        _ => {
            let scores = to_vec(&rewards.sum_dim_intlist(-1, false, None::<Kind>));
            let lengths = to_vec(&mask.sum_dim_intlist(-1, false, None::<Kind>));
            let adv = group_scalar_advantages_unchecked(cfg, &scores, &lengths, index);
            let a = Tensor::from_slice(&adv)
                .to_device(rewards.device())
                .unsqueeze(-1);
            if cfg.adv_estimator == AdvEstimator::ReinforcePlusPlusBaseline {
                let tiled = a.expand_as(&mask) * &mask;
                masked_whiten(&tiled, &mask, true)? * &mask
            } else {
                a * &mask
            }
        }
    };
    Ok(out.to_kind(kind))
}

/// Outcome scores `(N,)` as verl's token-level rewards: each score on the response's last valid
/// token (`(N, T)` on the scores' device, zero elsewhere; a response without a valid token gets
/// nothing).
pub fn outcome_to_token_rewards(scores: &Tensor, response_mask: &Tensor) -> Result<Tensor> {
    let ms = response_mask.size();
    if ms.len() != 2 || scores.size() != [ms[0]] {
        bail!(
            "scores shape {:?} does not match response_mask shape {ms:?}",
            scores.size()
        );
    }
    let m = response_mask.to_kind(Kind::Double);
    let lengths = to_vec(&m.sum_dim_intlist(-1, false, None::<Kind>));
    let s = to_vec(scores);
    let mut out = vec![0.0; (ms[0] * ms[1]) as usize];
    for (i, (&len, &score)) in lengths.iter().zip(&s).enumerate() {
        // verl puts the score at index (valid_response_length - 1), right-padded responses.
        if len >= 1.0 {
            out[i * ms[1] as usize + len as usize - 1] = score;
        }
    }
    // On the scores' device: a CUDA trainer's advantages must not come back on the CPU.
    Ok(Tensor::from_slice(&out)
        .reshape(ms)
        .to_kind(scores.kind())
        .to_device(scores.device()))
}

/// Number of groups (of more than one response) whose scores are all equal: their group-relative
/// advantage is zero (`batch/zero_adv_groups`).
pub fn zero_adv_groups(scores: &[f64], index: &[i64]) -> usize {
    groups_of(index)
        .iter()
        .filter(|g| g.len() > 1 && g.iter().all(|&i| scores[i] == scores[g[0]]))
        .count()
}

/// DAPO's dynamic sampling (`filter_groups`): true for the responses to keep, i.e. those whose
/// group has a nonzero reward spread, or is a group of one.
pub fn filter_groups(scores: &[f64], index: &[i64]) -> Vec<bool> {
    let mut keep = vec![true; scores.len()];
    for g in groups_of(index) {
        if g.len() > 1 && g.iter().all(|&i| scores[i] == scores[g[0]]) {
            for &i in &g {
                keep[i] = false;
            }
        }
    }
    keep
}
