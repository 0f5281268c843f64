//! KL estimators to the reference policy (verl's `kl_penalty`), the KL loss and the KL in reward.
//!
//! With `x = logp - ref`: `k1` = `x`; `abs` = `|x|`; `k2` (`mse`) = `x^2 / 2`;
//! `k3` (`low_var_kl`): `u = clamp(ref - logp, -20, 20)`, `clamp(exp(u) - u - 1, -10, 10)`.
//! A `+` suffix (`k3+`, `k1+`, `abs+`) is straight-through: the value of the estimator with the
//! gradient of `k2` (`k2+`/`mse+` are plain `k2`).

use std::str::FromStr;

use anyhow::{bail, Result};
use tch::{Kind, Tensor};

use crate::masked::{mask_like, masked_mean_eps};
use crate::names::{named_enum, UnknownName};
use crate::Metrics;

named_enum! {
    /// The estimator of a [`KlType`].
    pub enum KlEstimator ("kl estimator") {
        K1 => "k1" | "kl",
        Abs => "abs",
        K2 => "k2" | "mse",
        K3 => "k3" | "low_var_kl",
    }
}

/// `actor.kl_loss_type` / `algorithm.kl_penalty`: an estimator, optionally straight-through (`+`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KlType {
    pub estimator: KlEstimator,
    /// `+` suffix: forward value of the estimator, gradient of k2.
    pub straight_through: bool,
}

impl KlType {
    pub const fn plain(estimator: KlEstimator) -> Self {
        KlType {
            estimator,
            straight_through: false,
        }
    }

    /// Every accepted spelling.
    pub fn known_names() -> Vec<String> {
        let base = KlEstimator::known_names();
        let mut v: Vec<String> = base.iter().map(|s| s.to_string()).collect();
        v.extend(base.iter().map(|s| format!("{s}+")));
        v
    }
}

impl Default for KlType {
    fn default() -> Self {
        KlType::plain(KlEstimator::K3)
    }
}

impl FromStr for KlType {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Self, UnknownName> {
        let (base, st) = match s.strip_suffix('+') {
            Some(b) => (b, true),
            None => (s, false),
        };
        match base.parse::<KlEstimator>() {
            Ok(e) => Ok(KlType {
                estimator: e,
                straight_through: st && e != KlEstimator::K2,
            }),
            Err(_) => Err(UnknownName {
                what: "kl type",
                got: s.to_string(),
                known: vec![
                    "k1",
                    "kl",
                    "abs",
                    "k2",
                    "mse",
                    "k3",
                    "low_var_kl",
                    "k1+",
                    "kl+",
                    "abs+",
                    "k2+",
                    "mse+",
                    "k3+",
                    "low_var_kl+",
                ],
            }),
        }
    }
}

impl std::fmt::Display for KlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}{}",
            self.estimator,
            if self.straight_through { "+" } else { "" }
        )
    }
}

impl serde::Serialize for KlType {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> serde::Deserialize<'de> for KlType {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

fn forward(logp: &Tensor, reference: &Tensor, e: KlEstimator) -> Tensor {
    match e {
        KlEstimator::K1 => logp - reference,
        KlEstimator::Abs => (logp - reference).abs(),
        KlEstimator::K2 => (logp - reference).square() * 0.5,
        KlEstimator::K3 => {
            let u = (reference - logp).clamp(-20.0, 20.0);
            (u.exp() - &u - 1.0).clamp(-10.0, 10.0)
        }
    }
}

/// Per-token KL estimate of `logp` against `reference` (same shapes).
pub fn kl_penalty(logp: &Tensor, reference: &Tensor, kl: KlType) -> Tensor {
    let reference = reference.to_kind(logp.kind());
    let value = forward(logp, &reference, kl.estimator);
    if !kl.straight_through {
        return value;
    }
    let k2 = (logp - &reference).square() * 0.5;
    &k2 - k2.detach() + value.detach()
}

fn default_kl_coef() -> f64 {
    0.001
}
fn default_target_kl() -> f64 {
    0.1
}
fn default_horizon() -> f64 {
    10000.0
}
named_enum! {
    /// `algorithm.kl_ctrl.type`.
    #[derive(Default)]
    pub enum KlCtrlKind ("kl_ctrl type") {
        #[default]
        Fixed => "fixed",
        Adaptive => "adaptive",
    }
}

/// `algorithm.kl_ctrl`: `type` (`fixed` | `adaptive`), `kl_coef`, `target_kl`, `horizon` (the
/// trainer's config section itself).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KlCtrlConfig {
    #[serde(rename = "type", default)]
    pub kind: KlCtrlKind,
    #[serde(default = "default_kl_coef")]
    pub kl_coef: f64,
    #[serde(default = "default_target_kl")]
    pub target_kl: f64,
    #[serde(default = "default_horizon")]
    pub horizon: f64,
}

impl Default for KlCtrlConfig {
    fn default() -> Self {
        KlCtrlConfig {
            kind: KlCtrlKind::Fixed,
            kl_coef: default_kl_coef(),
            target_kl: default_target_kl(),
            horizon: default_horizon(),
        }
    }
}

/// The in-reward KL coefficient `beta`: fixed, or adaptive (Ziegler et al.):
/// `beta *= 1 + clip(kl / target - 1, -0.2, 0.2) * n_steps / horizon`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KlController {
    Fixed {
        value: f64,
    },
    Adaptive {
        value: f64,
        target: f64,
        horizon: f64,
    },
}

impl KlController {
    pub fn new(cfg: &KlCtrlConfig) -> Result<Self> {
        match cfg.kind {
            KlCtrlKind::Fixed => Ok(KlController::Fixed { value: cfg.kl_coef }),
            KlCtrlKind::Adaptive => {
                if cfg.horizon.is_nan() || cfg.horizon <= 0.0 {
                    bail!("kl_ctrl.horizon must be > 0, got {}", cfg.horizon);
                }
                Ok(KlController::Adaptive {
                    value: cfg.kl_coef,
                    target: cfg.target_kl,
                    horizon: cfg.horizon,
                })
            }
        }
    }

    pub fn value(&self) -> f64 {
        match *self {
            KlController::Fixed { value } | KlController::Adaptive { value, .. } => value,
        }
    }

    /// Update after a batch whose mean KL was `current_kl`, over `n_steps` samples.
    pub fn update(&mut self, current_kl: f64, n_steps: f64) {
        if let KlController::Adaptive {
            value,
            target,
            horizon,
        } = self
        {
            let err = (current_kl / *target - 1.0).clamp(-0.2, 0.2);
            *value *= 1.0 + err * n_steps / *horizon;
        }
    }
}

/// `algorithm.use_kl_in_reward` (verl's `apply_kl_penalty`): token rewards
/// `scores - beta * kl(old, ref) * M`, then the controller is updated with the batch KL (mean over
/// responses of each response's masked-mean KL, verl's `sum / (count + 1e-8)`, so a response
/// without a valid token counts as 0) and `n_steps` = number of responses.
/// Metrics: `actor/reward_kl_penalty` (that KL), `actor/reward_kl_penalty_coeff` (beta used).
pub fn apply_kl_in_reward(
    token_level_scores: &Tensor,
    old_log_prob: &Tensor,
    ref_log_prob: &Tensor,
    response_mask: &Tensor,
    kl: KlType,
    ctrl: &mut KlController,
) -> Result<(Tensor, Metrics)> {
    for (n, t) in [
        ("old_log_prob", old_log_prob),
        ("ref_log_prob", ref_log_prob),
        ("response_mask", response_mask),
    ] {
        crate::agg::check_same_shape("token_level_scores", token_level_scores, n, t)?;
    }
    let m = mask_like(response_mask, token_level_scores);
    let kld = kl_penalty(&old_log_prob.to_kind(m.kind()), ref_log_prob, kl) * &m;
    let beta = ctrl.value();
    let rewards = token_level_scores - &kld * beta;
    let per_row = masked_mean_eps(&kld, &m, Some(-1));
    let current = per_row.mean(Kind::Double).double_value(&[]);
    ctrl.update(current, token_level_scores.size()[0] as f64);
    let mut metrics = Metrics::new();
    metrics.insert("actor/reward_kl_penalty", current);
    metrics.insert("actor/reward_kl_penalty_coeff", beta);
    Ok((rewards, metrics))
}
