//! Training-inference mismatch: diagnostics and importance-sampling correction
//! (`algorithm.rollout_correction`).
//!
//! With `rho_t = exp(old_t - roll_t)` (log-ratio clamped to [-20, 20]) and the sequence ratio
//! `rho_i = exp(sum_t M (old - roll))`:
//! - truncated IS (`rollout_is`): token weights `min(rho_t, C)`, or the sequence weight
//!   `min(rho_i, C)` on every token of the sequence; detached; `C` = `rollout_is_threshold` (2).
//!   With `rollout_is_cap = "drop"` a weight above `C` is 0 instead (the token stays in the
//!   loss's denominator): AReaL's `behav_imp_weight_cap`, its decoupled PPO's behaviour weight
//!   `pi_prox / pi_behav` with `old` the proximal policy and `roll` the behaviour one.
//! - masked IS / rejection (`rollout_rs`): tokens (or whole sequences) whose ratio is outside
//!   `[1/C, C]` are removed from the mask; `C` = `rollout_rs_threshold`, else the IS threshold.
//! - `bypass_mode`: the trainer uses `roll` as `old` (no recompute); nothing to compute here.
//!
//! Metrics (always): `rollout/logprob_abs_diff_mean`, `rollout/logprob_abs_diff_max`
//! (`|old - roll|` over valid tokens), `rollout_corr/kl` (`mean(roll - old)`, an estimate of
//! KL(rollout || train) on the sampled tokens), `rollout_corr/k3_kl`; with IS:
//! `rollout_corr/rollout_is_mean`; with RS: `rollout_corr/rollout_rs_masked_fraction`.

use anyhow::{bail, Result};
use tch::{Kind, Tensor};

use crate::masked::{mask_like, masked, masked_mean_eps as masked_mean};
use crate::names::named_enum;
use crate::Metrics;

named_enum! {
    /// Level of the importance correction.
    pub enum CorrectionLevel ("rollout correction level") {
        Token => "token",
        Sequence => "sequence",
    }
}

named_enum! {
    /// What a truncated-IS weight above the threshold becomes.
    #[derive(Default)]
    pub enum IsCap ("rollout_is_cap") {
        /// The threshold (verl's truncated IS).
        #[default]
        Truncate => "truncate",
        /// 0: the token adds nothing (AReaL's `behav_imp_weight_cap`).
        Drop => "drop",
    }
}

fn default_threshold() -> f64 {
    2.0
}

/// `algorithm.rollout_correction`.
#[derive(Debug, Clone, Copy, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RolloutCorrection {
    #[serde(default)]
    pub rollout_is: Option<CorrectionLevel>,
    #[serde(default = "default_threshold")]
    pub rollout_is_threshold: f64,
    #[serde(default)]
    pub rollout_is_cap: IsCap,
    #[serde(default)]
    pub rollout_rs: Option<CorrectionLevel>,
    #[serde(default)]
    pub rollout_rs_threshold: Option<f64>,
    #[serde(default)]
    pub bypass_mode: bool,
}

impl Default for RolloutCorrection {
    fn default() -> Self {
        RolloutCorrection {
            rollout_is: None,
            rollout_is_threshold: default_threshold(),
            rollout_is_cap: IsCap::Truncate,
            rollout_rs: None,
            rollout_rs_threshold: None,
            bypass_mode: false,
        }
    }
}

pub struct RolloutCorrectionOutput {
    /// Detached weights `(B, T)` for the per-token loss (None without `rollout_is`).
    pub rollout_is_weights: Option<Tensor>,
    /// The response mask after rejection (the input mask without `rollout_rs`).
    pub response_mask: Tensor,
    pub metrics: Metrics,
}

fn value(t: &Tensor) -> f64 {
    t.to_kind(Kind::Double).double_value(&[]) + 0.0
}

/// Compute the correction for one batch: `old` = trainer logprobs, `roll` = rollout engine's.
pub fn rollout_correction(
    old_log_prob: &Tensor,
    rollout_log_prob: &Tensor,
    response_mask: &Tensor,
    cfg: &RolloutCorrection,
) -> Result<RolloutCorrectionOutput> {
    crate::agg::check_same_shape(
        "old_log_prob",
        old_log_prob,
        "rollout_log_prob",
        rollout_log_prob,
    )?;
    crate::agg::check_same_shape("old_log_prob", old_log_prob, "response_mask", response_mask)?;
    if cfg.rollout_is_threshold.is_nan() || cfg.rollout_is_threshold <= 1.0 {
        bail!(
            "rollout_is_threshold must be > 1, got {}",
            cfg.rollout_is_threshold
        );
    }
    let old = old_log_prob.detach();
    let roll = rollout_log_prob.detach().to_kind(old.kind());
    let m = mask_like(response_mask, &old);
    let diff = &old - &roll;
    let mut metrics = Metrics::new();
    metrics.insert(
        "rollout/logprob_abs_diff_mean",
        value(&masked_mean(&diff.abs(), &m, None)),
    );
    let max = masked(&diff.abs(), &m).max();
    metrics.insert("rollout/logprob_abs_diff_max", value(&max));
    metrics.insert("rollout_corr/kl", value(&masked_mean(&-&diff, &m, None)));
    // k3 of KL(roll || old) sampled from roll: u = old - roll, exp(u) - u - 1.
    let u = diff.clamp(-20.0, 20.0);
    metrics.insert(
        "rollout_corr/k3_kl",
        value(&masked_mean(&(u.exp() - &u - 1.0), &m, None)),
    );

    let log_tok = diff.clamp(-20.0, 20.0);
    let log_seq = masked(&diff, &m)
        .sum_dim_intlist(-1, false, None::<Kind>)
        .clamp(-20.0, 20.0)
        .unsqueeze(-1)
        .expand_as(&diff);
    let log_ratio = |level: CorrectionLevel| match level {
        CorrectionLevel::Token => log_tok.shallow_clone(),
        CorrectionLevel::Sequence => log_seq.shallow_clone(),
    };

    let weights = cfg.rollout_is.map(|level| {
        let rho = log_ratio(level).exp();
        let c = cfg.rollout_is_threshold;
        let w = match cfg.rollout_is_cap {
            IsCap::Truncate => rho.clamp_max(c),
            IsCap::Drop => {
                let kept = rho.le(c).to_kind(rho.kind());
                &rho * kept
            }
        };
        metrics.insert(
            "rollout_corr/rollout_is_mean",
            value(&masked_mean(&w, &m, None)),
        );
        w
    });

    let mask_out = match cfg.rollout_rs {
        None => response_mask.shallow_clone(),
        Some(level) => {
            let c = cfg.rollout_rs_threshold.unwrap_or(cfg.rollout_is_threshold);
            if c.is_nan() || c <= 1.0 {
                bail!("rollout_rs_threshold must be > 1, got {c}");
            }
            let ratio = log_ratio(level).exp();
            let keep = ratio
                .ge(1.0 / c)
                .logical_and(&ratio.le(c))
                .to_kind(m.kind());
            let new_mask = &m * keep;
            let total = value(&m.sum(Kind::Double));
            let removed = total - value(&new_mask.sum(Kind::Double));
            metrics.insert(
                "rollout_corr/rollout_rs_masked_fraction",
                if total > 0.0 { removed / total } else { 0.0 },
            );
            new_mask.to_kind(response_mask.kind())
        }
    };
    Ok(RolloutCorrectionOutput {
        rollout_is_weights: weights,
        response_mask: mask_out,
        metrics,
    })
}
