//! Policy losses (`actor.policy_loss.loss_mode`), chosen by name, with verl's metrics.
//!
//! `D = logp - old`, `r = exp(D)`; `lo`/`hi` = `clip_ratio_low`/`clip_ratio_high` (default
//! `clip_ratio` = 0.2), `c` = `clip_ratio_c` (3.0, `None` disables dual clip). Per-token losses:
//! - `vanilla`: `Lc = max(-A r, -A clip(r, 1-lo, 1+hi))`, `L = min(Lc, -c A)` where `A < 0`
//!   (D clamped to [-20, 20]). `grpo_clip` (CS336): the same without dual clip.
//! - `no_baseline`, `reinforce_with_baseline` (CS336), `gpg`: `L = -A logp`.
//! - `cispo`: `L = -sg(clip(r, 1-lo, 1+hi)) A logp`; `trl_cispo`: `-sg(min(r, cap)) A logp`
//!   (`cispo_max_ratio`, default 5).
//! - `gspo`: sequence ratio `s_i = exp(sum_t M D / max(|y_i|, 1))`, token form
//!   `exp(min(logp - sg(logp) + sg(log s_i), 10))`, PPO-clipped; aggregated `seq-mean-token-mean`.
//! - `geo_mean` (GMPO): sign-aware clip of `D` in log space, `rho_i = exp(sum_t M Dc / |y_i|)`,
//!   loss `mean_i(-mean_t(A) rho_i)` whatever the aggregation mode.
//! - `sapo`: `L = -A (4/tau) sigmoid(tau (r - 1))`, tau = `tau_pos` if A > 0 else `tau_neg`;
//!   aggregated `seq-mean-token-mean`.
//! - Tinker (`tinker_importance_sampling`, `tinker_ppo`, `tinker_cispo`, `tinker_dro`): `-r A`,
//!   `-min(r A, clip(r, 1-lo, 1+hi) A)`, `-sg(clip(r, 1-lo, 1+hi)) A logp`,
//!   `-(A logp - beta/2 D^2)` (`dro_beta`, default 0.05), SUMMED (Tinker's `clip_low_threshold` /
//!   `clip_high_threshold` are `1 - lo` / `1 + hi`, default 0.8 / 1.2), with `D` not clamped
//!   (Tinker's own formulas). These rows are the Tinker API's losses too
//!   ([`crate::tinker_loss`]); its `cross_entropy` is `no_baseline` with the weights as `A`.
//! - `tinker_gspo` (Tinker's GSPO-token): `log s = mean_{t in R} sg(D_t)` over the ratio mask `R`
//!   (`ratio_mask`, Tinker's `sequence_ratio_mask`), `s_t = exp(log s + logp - sg(logp))`,
//!   `-min(s_t A, clip(s_t, 1-lo, 1+hi) A)`, SUMMED over every position; nothing clamped.
//! - `tinker_stable_reinforce` (temper's reading of Tinker's StableReinforce, docs/tinker.md):
//!   `-sg(min(r, cap)) A logp + kl_coeff (r - 1 - D)` with `old` = the sampler's recorded logprobs
//!   and `cap` = `ratio_cap` (default 2), SUMMED over the sampled positions (`response_mask`).
//!
//! Metrics (full verl names): `actor/pg_clipfrac`, `actor/pg_clipfrac_lower`, `actor/ppo_kl`
//! (verl's masked means `sum / (count + 1e-8)` over the micro-batch's valid tokens: 0 when it has
//! none); losses without a ratio report none.

use anyhow::{bail, Result};
use tch::{Kind, Tensor};

use crate::agg::{AggContext, AggMode};
use crate::masked::{mask_like, masked, masked_mean_eps as masked_mean};
use crate::names::named_enum;
use crate::DeviceMetrics;

named_enum! {
    /// `actor.policy_loss.loss_mode` (verl), CS336's `loss_type`, Tinker's `loss_fn`.
    #[derive(Default)]
    pub enum PolicyLossMode ("policy loss_mode") {
        #[default]
        Vanilla => "vanilla",
        /// CS336's `grpo_clip`: PPO-clip with `cliprange` on both sides and no dual clip.
        GrpoClip => "grpo_clip",
        NoBaseline => "no_baseline",
        ReinforceWithBaseline => "reinforce_with_baseline",
        Gpg => "gpg",
        Cispo => "cispo",
        /// TRL's CISPO: `min(r, cispo_max_ratio)` (absolute cap, no lower bound).
        TrlCispo => "trl_cispo",
        Gspo => "gspo",
        GeoMean => "geo_mean" | "gmpo",
        Sapo => "sapo",
        TinkerImportanceSampling => "tinker_importance_sampling" | "importance_sampling",
        TinkerPpo => "tinker_ppo",
        TinkerCispo => "tinker_cispo",
        TinkerDro => "tinker_dro",
        TinkerGspo => "tinker_gspo",
        TinkerStableReinforce => "tinker_stable_reinforce",
    }
}

impl PolicyLossMode {
    /// The aggregation this loss uses regardless of `loss_agg_mode`, if any.
    pub fn forced_agg(self) -> Option<AggMode> {
        match self {
            PolicyLossMode::Gspo | PolicyLossMode::Sapo => Some(AggMode::SeqMeanTokenMean),
            m if m.is_tinker() => Some(AggMode::TokenSum),
            _ => None,
        }
    }

    /// Tinker's losses: summed, their ratio not clamped before `exp`.
    pub fn is_tinker(self) -> bool {
        matches!(
            self,
            PolicyLossMode::TinkerImportanceSampling
                | PolicyLossMode::TinkerPpo
                | PolicyLossMode::TinkerCispo
                | PolicyLossMode::TinkerDro
                | PolicyLossMode::TinkerGspo
                | PolicyLossMode::TinkerStableReinforce
        )
    }

    /// Whether the loss needs `old_log_prob`.
    pub fn needs_old(self) -> bool {
        !matches!(
            self,
            PolicyLossMode::NoBaseline
                | PolicyLossMode::ReinforceWithBaseline
                | PolicyLossMode::Gpg
        )
    }
}

fn default_clip_ratio() -> f64 {
    0.2
}
fn default_clip_ratio_c() -> Option<f64> {
    Some(3.0)
}
fn default_tau_pos() -> f64 {
    1.0
}
fn default_tau_neg() -> f64 {
    1.05
}
/// `tinker_dro`'s `beta` (the Tinker docs' example value; they document no default).
pub const DRO_DEFAULT_BETA: f64 = 0.05;
/// `tinker_stable_reinforce`'s cap on the importance weight: verl's default truncation
/// (`rollout_is_threshold`) for off-policy rollouts.
pub const STABLE_REINFORCE_DEFAULT_CAP: f64 = 2.0;

/// Parameters of the policy losses (verl's `actor.*` names; slime's and CS336's as aliases).
#[derive(Debug, Clone, Copy, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyLossParams {
    /// Default of both sides (slime's `eps_clip`, CS336's `cliprange`).
    #[serde(
        default = "default_clip_ratio",
        alias = "eps_clip",
        alias = "cliprange"
    )]
    pub clip_ratio: f64,
    #[serde(default)]
    pub clip_ratio_low: Option<f64>,
    /// slime's `eps_clip_high`.
    #[serde(default, alias = "eps_clip_high")]
    pub clip_ratio_high: Option<f64>,
    /// Dual-clip bound (> 1); `None` disables dual clip. slime's `eps_clip_c`.
    #[serde(default = "default_clip_ratio_c", alias = "eps_clip_c")]
    pub clip_ratio_c: Option<f64>,
    #[serde(default = "default_tau_pos")]
    pub tau_pos: f64,
    #[serde(default = "default_tau_neg")]
    pub tau_neg: f64,
    /// Absolute ratio cap of `trl_cispo` (default 5).
    #[serde(default)]
    pub cispo_max_ratio: Option<f64>,
    /// `beta` of `tinker_dro` (default [`DRO_DEFAULT_BETA`]).
    #[serde(default)]
    pub dro_beta: Option<f64>,
    /// The KL coefficient of `tinker_stable_reinforce` (default 0).
    #[serde(default)]
    pub kl_coeff: Option<f64>,
    /// The importance-weight cap of `tinker_stable_reinforce` (default
    /// [`STABLE_REINFORCE_DEFAULT_CAP`]).
    #[serde(default)]
    pub ratio_cap: Option<f64>,
}

impl Default for PolicyLossParams {
    fn default() -> Self {
        PolicyLossParams {
            clip_ratio: default_clip_ratio(),
            clip_ratio_low: None,
            clip_ratio_high: None,
            clip_ratio_c: default_clip_ratio_c(),
            tau_pos: default_tau_pos(),
            tau_neg: default_tau_neg(),
            cispo_max_ratio: None,
            dro_beta: None,
            kl_coeff: None,
            ratio_cap: None,
        }
    }
}

impl PolicyLossParams {
    pub fn lo(&self) -> f64 {
        self.clip_ratio_low.unwrap_or(self.clip_ratio)
    }
    pub fn hi(&self) -> f64 {
        self.clip_ratio_high.unwrap_or(self.clip_ratio)
    }
}

/// One micro-batch's inputs, all `(B, T)` (advantages may be `(B, 1)`).
pub struct PolicyLossInput<'a> {
    /// Current policy logprobs (carries the gradient).
    pub log_prob: &'a Tensor,
    /// `old` (None is allowed only for losses without a ratio).
    pub old_log_prob: Option<&'a Tensor>,
    pub advantages: &'a Tensor,
    pub response_mask: &'a Tensor,
    /// Rollout-correction weights (already detached), multiplied into the per-token loss.
    pub rollout_is_weights: Option<&'a Tensor>,
    /// The positions `tinker_gspo`'s sequence ratio averages over (Tinker's
    /// `sequence_ratio_mask`; `None`: `response_mask`). Other losses ignore it.
    pub ratio_mask: Option<&'a Tensor>,
}

pub struct PolicyLossOutput {
    /// Per-token loss `(B, T)`, unmasked (`geo_mean`: per sequence, `(B,)`).
    pub pg_losses: Tensor,
    /// Aggregated scalar (has the gradient).
    pub pg_loss: Tensor,
    /// On the loss's device until read ([`DeviceMetrics::read`]).
    pub metrics: DeviceMetrics,
}

fn as_float(b: &Tensor, like: &Tensor) -> Tensor {
    b.to_kind(like.kind())
}

fn check_shapes(inp: &PolicyLossInput) -> Result<()> {
    let s = inp.log_prob.size();
    if s.len() != 2 {
        bail!("log_prob: expected 2 dims (B, T), got shape {s:?}");
    }
    if inp.response_mask.size() != s {
        bail!(
            "response_mask has shape {:?} but log_prob has shape {s:?}",
            inp.response_mask.size()
        );
    }
    if let Some(old) = inp.old_log_prob {
        if old.size() != s {
            bail!(
                "old_log_prob has shape {:?} but log_prob has shape {s:?}",
                old.size()
            );
        }
    }
    let a = inp.advantages.size();
    if !(a == s || a == [s[0], 1] || a == [s[0]]) {
        bail!(
            "advantages has shape {a:?}; expected {s:?}, [{}, 1] or [{}]",
            s[0],
            s[0]
        );
    }
    if let Some(w) = inp.rollout_is_weights {
        if w.size() != s {
            bail!(
                "rollout_is_weights has shape {:?} but log_prob has shape {s:?}",
                w.size()
            );
        }
    }
    Ok(())
}

/// The policy loss of one micro-batch, aggregated with the mini-batch context `ctx` (its mode is
/// the configured `loss_agg_mode`; losses with their own aggregation override it).
pub fn policy_loss(
    mode: PolicyLossMode,
    params: &PolicyLossParams,
    inp: &PolicyLossInput,
    ctx: &AggContext,
) -> Result<PolicyLossOutput> {
    check_shapes(inp)?;
    if let Some(c) = params.clip_ratio_c {
        if mode == PolicyLossMode::Vanilla && (c.is_nan() || c <= 1.0) {
            bail!("clip_ratio_c must be > 1 for dual-clip PPO, got {c}");
        }
    }
    let logp = inp.log_prob;
    let mask = inp.response_mask;
    let mut adv = inp.advantages.to_kind(logp.kind());
    if adv.dim() == 1 {
        adv = adv.unsqueeze(-1);
    }
    let old = match (inp.old_log_prob, mode.needs_old()) {
        (Some(o), _) => Some(o.to_kind(logp.kind())),
        (None, false) => None,
        (None, true) => bail!("loss_mode {mode} needs old_log_prob"),
    };
    let (lo, hi) = (params.lo(), params.hi());
    let ctx = ctx.with_mode(mode.forced_agg().unwrap_or(ctx.mode));
    let mut metrics = DeviceMetrics::new();
    // verl clamps D to [-20, 20] before exp; Tinker's formulas do not.
    let ratio_clamped = |old: &Tensor| -> (Tensor, Tensor) {
        let d = if mode.is_tinker() {
            logp - old
        } else {
            (logp - old).clamp(-20.0, 20.0)
        };
        let r = d.exp();
        (d, r)
    };
    let pg_losses = match mode {
        PolicyLossMode::Vanilla | PolicyLossMode::GrpoClip | PolicyLossMode::TinkerPpo => {
            let (d, r) = ratio_clamped(old.as_ref().expect("checked"));
            metrics.put("actor/ppo_kl", &masked_mean(&-&d, mask, None));
            let l1 = -&adv * &r;
            let l2 = -&adv * r.clamp(1.0 - lo, 1.0 + hi);
            let lc = l1.maximum(&l2);
            let clipfrac = masked_mean(&as_float(&l2.gt_tensor(&l1), logp), mask, None);
            metrics.put("actor/pg_clipfrac", &clipfrac);
            let dual = if mode == PolicyLossMode::Vanilla {
                params.clip_ratio_c
            } else {
                None
            };
            match dual {
                Some(c) => {
                    let l3 = -&adv * c;
                    let neg = adv.lt(0.0);
                    let lower = masked_mean(
                        &as_float(&lc.gt_tensor(&l3).logical_and(&neg), logp),
                        mask,
                        None,
                    );
                    metrics.put("actor/pg_clipfrac_lower", &lower);
                    l3.minimum(&lc).where_self(&neg.expand_as(&lc), &lc)
                }
                None => {
                    metrics.put_value("actor/pg_clipfrac_lower", 0.0);
                    lc
                }
            }
        }
        PolicyLossMode::NoBaseline
        | PolicyLossMode::ReinforceWithBaseline
        | PolicyLossMode::Gpg => -&adv * logp,
        PolicyLossMode::Cispo | PolicyLossMode::TrlCispo | PolicyLossMode::TinkerCispo => {
            let (d, r) = ratio_clamped(old.as_ref().expect("checked"));
            metrics.put("actor/ppo_kl", &masked_mean(&-&d, mask, None));
            let clipped = match mode {
                PolicyLossMode::TrlCispo => r.clamp_max(params.cispo_max_ratio.unwrap_or(5.0)),
                // Tinker's cispo clamps to clip_low_threshold / clip_high_threshold = 1 - lo /
                // 1 + hi (default 0.8 / 1.2), as cispo does; it only sums instead of averaging.
                _ => r.clamp(1.0 - lo, 1.0 + hi),
            };
            let clipfrac = masked_mean(&as_float(&r.ne_tensor(&clipped), logp), mask, None);
            metrics.put("actor/pg_clipfrac", &clipfrac);
            metrics.put_value("actor/pg_clipfrac_lower", 0.0);
            -clipped.detach() * &adv * logp
        }
        PolicyLossMode::TinkerImportanceSampling => {
            let (d, r) = ratio_clamped(old.as_ref().expect("checked"));
            metrics.put("actor/ppo_kl", &masked_mean(&-&d, mask, None));
            metrics.put_value("actor/pg_clipfrac", 0.0);
            -&adv * r
        }
        PolicyLossMode::TinkerDro => {
            let d = logp - old.as_ref().expect("checked");
            let beta = params.dro_beta.unwrap_or(DRO_DEFAULT_BETA);
            metrics.put("actor/ppo_kl", &masked_mean(&-&d, mask, None));
            metrics.put_value("actor/pg_clipfrac", 0.0);
            -(&adv * logp - d.square() * (0.5 * beta))
        }
        PolicyLossMode::Gspo => {
            let d = logp - old.as_ref().expect("checked");
            let m = mask_like(mask, logp);
            let len = m.sum_dim_intlist(-1, false, None::<Kind>).clamp_min(1.0);
            let d_seq = masked(&d, mask).sum_dim_intlist(-1, false, None::<Kind>) / len;
            let log_s = (logp - logp.detach() + d_seq.detach().unsqueeze(-1)).clamp_max(10.0);
            sequence_clip(&log_s.exp(), &adv, &d, mask, (lo, hi), &mut metrics)
        }
        PolicyLossMode::TinkerGspo => {
            let d = logp - old.as_ref().expect("checked");
            let m = mask_like(inp.ratio_mask.unwrap_or(mask), logp);
            // A row whose mask is empty has ratio 1 (its positions carry no advantage); Tinker
            // refuses such a datum before it gets here.
            let len = m.sum_dim_intlist(-1, false, None::<Kind>).clamp_min(1.0);
            let d_seq = (d.detach() * &m).sum_dim_intlist(-1, false, None::<Kind>) / len;
            let s = (logp - logp.detach() + d_seq.unsqueeze(-1)).exp();
            sequence_clip(&s, &adv, &d, mask, (lo, hi), &mut metrics)
        }
        PolicyLossMode::TinkerStableReinforce => {
            let d = logp - old.as_ref().expect("checked");
            let r = d.exp();
            let cap = params.ratio_cap.unwrap_or(STABLE_REINFORCE_DEFAULT_CAP);
            let weight = r.clamp_max(cap);
            let clipfrac = masked_mean(&as_float(&r.gt(cap), logp), mask, None);
            metrics.put("actor/pg_clipfrac", &clipfrac);
            metrics.put_value("actor/pg_clipfrac_lower", 0.0);
            metrics.put("actor/ppo_kl", &masked_mean(&-&d, mask, None));
            let pg = -weight.detach() * &adv * logp;
            let k = params.kl_coeff.unwrap_or(0.0);
            if k == 0.0 {
                pg
            } else {
                pg + (r - 1.0 - d) * k
            }
        }
        PolicyLossMode::Sapo => {
            let (d, r) = ratio_clamped(old.as_ref().expect("checked"));
            let tau = adv
                .full_like(params.tau_pos)
                .where_self(&adv.gt(0.0), &adv.full_like(params.tau_neg));
            let gates: Tensor = (&tau * (&r - 1.0)).sigmoid() * tau.reciprocal() * 4.0;
            metrics.put("actor/ppo_kl", &masked_mean(&-&d, mask, None));
            metrics.put_value("actor/pg_clipfrac", 0.0);
            metrics.put_value("actor/pg_clipfrac_lower", 0.0);
            -gates * &adv
        }
        PolicyLossMode::GeoMean => {
            return geo_mean(
                logp,
                old.as_ref().expect("checked"),
                &adv,
                mask,
                lo,
                hi,
                inp.rollout_is_weights,
                &ctx,
            );
        }
    };
    let pg_losses = match inp.rollout_is_weights {
        Some(w) => pg_losses * w.detach().to_kind(logp.kind()),
        None => pg_losses,
    };
    let pg_loss = ctx.aggregate(&pg_losses, mask);
    Ok(PolicyLossOutput {
        pg_losses,
        pg_loss,
        metrics,
    })
}

/// GSPO's per-token loss from the token-form sequence ratio `s`: PPO's clip of `s` to
/// `[1 - lo, 1 + hi]` (no dual clip), with its metrics (verl's `gspo`, Tinker's `gspo`).
fn sequence_clip(
    s: &Tensor,
    adv: &Tensor,
    d: &Tensor,
    mask: &Tensor,
    (lo, hi): (f64, f64),
    metrics: &mut DeviceMetrics,
) -> Tensor {
    let l1 = -adv * s;
    let l2 = -adv * s.clamp(1.0 - lo, 1.0 + hi);
    let clipfrac = masked_mean(&as_float(&l2.gt_tensor(&l1), s), mask, None);
    metrics.put("actor/pg_clipfrac", &clipfrac);
    metrics.put_value("actor/pg_clipfrac_lower", 0.0);
    metrics.put("actor/ppo_kl", &masked_mean(&-d, mask, None));
    l1.maximum(&l2)
}

/// GMPO (verl's `geo_mean`): per-sequence loss, averaged over all rows of the mini-batch.
#[allow(clippy::too_many_arguments)]
fn geo_mean(
    logp: &Tensor,
    old: &Tensor,
    adv: &Tensor,
    mask: &Tensor,
    lo: f64,
    hi: f64,
    weights: Option<&Tensor>,
    ctx: &AggContext,
) -> Result<PolicyLossOutput> {
    let d = logp - old;
    let m = mask_like(mask, logp);
    let mut metrics = DeviceMetrics::new();
    metrics.put("actor/ppo_kl", &masked_mean(&-&d, mask, None));
    let sgn = adv.sign();
    let dc = d.clamp(-lo, hi);
    let dmin = &sgn * (&sgn * &d).minimum(&(&sgn * &dc));
    let len = m.sum_dim_intlist(-1, false, None::<Kind>);
    let ratio = ((&dmin * &m).sum_dim_intlist(-1, false, None::<Kind>) / (&len + 1e-8)).exp();
    let a_seq = (adv * &m).sum_dim_intlist(-1, false, None::<Kind>) / (&len + 1e-8);
    let mut pg_losses = -a_seq * ratio;
    if let Some(w) = weights {
        let w = w.detach().to_kind(logp.kind());
        let seq_w = (((w + 1e-10).log() * &m).sum_dim_intlist(-1, false, None::<Kind>)
            / (&len + 1e-8))
            .exp();
        pg_losses *= seq_w;
    }
    let pg_loss = pg_losses.sum(None::<Kind>) / ctx.global_rows;
    let clipped = d.ne_tensor(&dc);
    let upper = masked_mean(
        &as_float(&clipped.logical_and(&adv.gt(0.0)), logp),
        mask,
        None,
    );
    let lower = masked_mean(
        &as_float(&clipped.logical_and(&adv.lt(0.0)), logp),
        mask,
        None,
    );
    metrics.put("actor/pg_clipfrac", &upper);
    metrics.put("actor/pg_clipfrac_lower", &lower);
    Ok(PolicyLossOutput {
        pg_losses,
        pg_loss,
        metrics,
    })
}
