//! The actor loss of one micro-batch: policy loss + `kl_loss_coef * agg(kl)` - `entropy_coeff *
//! agg(H)`, all aggregated with the mini-batch's [`AggContext`] (so micro-batch losses sum to the
//! mini-batch loss).

use anyhow::{bail, Result};
use tch::Tensor;

use crate::agg::{AggContext, AggMode};
use crate::kl::{kl_penalty, KlType};
use crate::policy_loss::{policy_loss, PolicyLossInput, PolicyLossMode, PolicyLossParams};
use crate::DeviceMetrics;

/// `actor.*` settings of the loss.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ActorLossConfig {
    pub loss_mode: PolicyLossMode,
    pub params: PolicyLossParams,
    pub loss_agg_mode: AggMode,
    pub loss_scale_factor: Option<f64>,
    pub use_kl_loss: bool,
    pub kl_loss_coef: f64,
    pub kl_loss_type: KlType,
    pub entropy_coeff: f64,
}

impl Default for ActorLossConfig {
    fn default() -> Self {
        ActorLossConfig {
            loss_mode: PolicyLossMode::Vanilla,
            params: PolicyLossParams::default(),
            loss_agg_mode: AggMode::TokenMean,
            loss_scale_factor: None,
            use_kl_loss: false,
            kl_loss_coef: 0.001,
            kl_loss_type: KlType::default(),
            entropy_coeff: 0.0,
        }
    }
}

impl ActorLossConfig {
    /// The mini-batch context for this config from the micro-batch masks of one mini-batch.
    pub fn context(&self, masks: &[&Tensor]) -> Result<AggContext> {
        AggContext::from_masks(self.loss_agg_mode, masks, self.loss_scale_factor)
    }
}

/// One micro-batch, `(B, T)` tensors.
pub struct ActorLossInput<'a> {
    pub log_prob: &'a Tensor,
    pub old_log_prob: Option<&'a Tensor>,
    /// Needed when `use_kl_loss`.
    pub ref_log_prob: Option<&'a Tensor>,
    pub advantages: &'a Tensor,
    pub response_mask: &'a Tensor,
    /// Per-token entropy (with gradient), needed when `entropy_coeff != 0`; reported when given.
    pub entropy: Option<&'a Tensor>,
    pub rollout_is_weights: Option<&'a Tensor>,
}

pub struct ActorLossOutput {
    /// The scalar to backpropagate.
    pub loss: Tensor,
    /// Policy metrics plus `actor/pg_loss`, `actor/entropy`, `actor/kl_loss`, `actor/kl_coef`,
    /// on the loss's device until read.
    pub metrics: DeviceMetrics,
}

/// Compute the actor loss of a micro-batch with the mini-batch context `ctx`.
pub fn actor_loss(
    cfg: &ActorLossConfig,
    inp: &ActorLossInput,
    ctx: &AggContext,
) -> Result<ActorLossOutput> {
    let pl = policy_loss(
        cfg.loss_mode,
        &cfg.params,
        &PolicyLossInput {
            log_prob: inp.log_prob,
            old_log_prob: inp.old_log_prob,
            advantages: inp.advantages,
            response_mask: inp.response_mask,
            rollout_is_weights: inp.rollout_is_weights,
            ratio_mask: None,
        },
        ctx,
    )?;
    let mut metrics = pl.metrics;
    metrics.put("actor/pg_loss", &pl.pg_loss);
    let mut loss = pl.pg_loss;
    if let Some(h) = inp.entropy {
        crate::agg::check_same_shape("entropy", h, "response_mask", inp.response_mask)?;
        let ent = ctx.aggregate(h, inp.response_mask);
        metrics.put("actor/entropy", &ent);
        if cfg.entropy_coeff != 0.0 {
            loss -= ent * cfg.entropy_coeff;
        }
    } else if cfg.entropy_coeff != 0.0 {
        bail!(
            "entropy_coeff is {} but no entropy was given",
            cfg.entropy_coeff
        );
    }
    if cfg.use_kl_loss {
        let Some(r) = inp.ref_log_prob else {
            bail!("use_kl_loss needs ref_log_prob");
        };
        crate::agg::check_same_shape("ref_log_prob", r, "log_prob", inp.log_prob)?;
        let kl = ctx.aggregate(
            &kl_penalty(inp.log_prob, r, cfg.kl_loss_type),
            inp.response_mask,
        );
        metrics.put("actor/kl_loss", &kl);
        metrics.put_value("actor/kl_coef", cfg.kl_loss_coef);
        loss += kl * cfg.kl_loss_coef;
    }
    Ok(ActorLossOutput { loss, metrics })
}
