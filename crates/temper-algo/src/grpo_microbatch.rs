//! CS336 assignment 5's GRPO helpers, under their names.

use anyhow::{bail, Result};
use tch::{Kind, Tensor};

use crate::advantage::{compute_advantages, contiguous_groups, AdvConfig, AdvEstimator};
use crate::agg::AggContext;
use crate::masked::masked_mean;
use crate::policy_loss::{policy_loss, PolicyLossInput, PolicyLossMode, PolicyLossParams};
use crate::Metrics;

/// `compute_group_normalized_rewards(normalize_by_std, advantage_eps)`: GRPO advantages of
/// `raw_rewards` in contiguous groups of `group_size`. (A group of one follows verl: mean 0, std 1.)
pub fn compute_group_normalized_rewards(
    raw_rewards: &[f64],
    group_size: usize,
    advantage_eps: f64,
    normalize_by_std: bool,
) -> Result<Vec<f64>> {
    let index = contiguous_groups(raw_rewards.len(), group_size)?;
    let cfg = AdvConfig {
        adv_estimator: AdvEstimator::Grpo,
        norm_adv_by_std_in_grpo: normalize_by_std,
        epsilon: advantage_eps,
        gamma: 1.0,
    };
    let r = Tensor::from_slice(raw_rewards).unsqueeze(-1);
    let a = compute_advantages(&cfg, &r, &r.ones_like(), &index)?;
    Ok(Vec::<f64>::try_from(&a.reshape([-1]))?)
}

/// Inputs of `grpo_microbatch_train_step`, as CS336 names them.
pub struct MicrobatchStep<'a> {
    /// `(B, T)`, requires grad.
    pub policy_log_probs: &'a Tensor,
    pub response_mask: &'a Tensor,
    pub gradient_accumulation_steps: usize,
    /// `no_baseline`, `reinforce_with_baseline` or `grpo_clip`.
    pub loss_type: PolicyLossMode,
    pub raw_rewards: Option<&'a Tensor>,
    pub advantages: Option<&'a Tensor>,
    pub old_log_probs: Option<&'a Tensor>,
    pub cliprange: Option<f64>,
}

/// `grpo_microbatch_train_step`: per-token loss, `masked_mean` over the last dim, mean over the
/// batch, divided by `gradient_accumulation_steps`; runs `backward()` and returns the loss.
pub fn grpo_microbatch_train_step(s: &MicrobatchStep) -> Result<(Tensor, Metrics)> {
    if s.gradient_accumulation_steps == 0 {
        bail!("gradient_accumulation_steps must be >= 1");
    }
    let (adv, name) = match s.loss_type {
        PolicyLossMode::NoBaseline => (s.raw_rewards, "raw_rewards"),
        PolicyLossMode::ReinforceWithBaseline | PolicyLossMode::GrpoClip => (s.advantages, "advantages"),
        other => bail!("loss_type {other} is not a CS336 loss type (no_baseline, reinforce_with_baseline, grpo_clip)"),
    };
    let Some(adv) = adv else {
        bail!("loss_type {} needs {name}", s.loss_type);
    };
    let mut params = PolicyLossParams {
        clip_ratio_c: None,
        ..Default::default()
    };
    if s.loss_type == PolicyLossMode::GrpoClip {
        let Some(c) = s.cliprange else {
            bail!("loss_type grpo_clip needs cliprange");
        };
        params.clip_ratio = c;
    }
    let ctx = AggContext::from_mask(crate::agg::AggMode::TokenMean, s.response_mask, None)?;
    let out = policy_loss(
        s.loss_type,
        &params,
        &PolicyLossInput {
            log_prob: s.policy_log_probs,
            old_log_prob: s.old_log_probs,
            advantages: adv,
            response_mask: s.response_mask,
            rollout_is_weights: None,
            ratio_mask: None,
        },
        &ctx,
    )?;
    let loss = masked_mean(&out.pg_losses, s.response_mask, Some(-1)).mean(None::<Kind>)
        / s.gradient_accumulation_steps as f64;
    loss.f_backward()?;
    Ok((loss.detach(), out.metrics.read()))
}
