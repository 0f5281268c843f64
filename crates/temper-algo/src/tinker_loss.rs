//! Tinker's five built-in losses (`forward_backward(data, loss_fn, loss_fn_config)`), exactly as
//! Tinker documents them. Per datum and target position t: `lp_t` = the training model's logprob
//! of `target_tokens[t]` (with gradient), `q_t` = `loss_fn_inputs["logprobs"][t]` (the sampler's),
//! `A_t` = `advantages[t]`, `w_t` = `weights[t]`, `r_t = exp(lp_t - q_t)`:
//!
//! | `loss_fn` | loss |
//! | --- | --- |
//! | `cross_entropy` | `-sum w_t lp_t` (any real weights, negative included) |
//! | `importance_sampling` | `-sum r_t A_t` |
//! | `ppo` | `-sum min(r_t A_t, clamp(r_t, lo, hi) A_t)` |
//! | `cispo` | `-sum sg(clamp(r_t, lo, hi)) lp_t A_t` |
//! | `dro` | `-sum (lp_t A_t - beta/2 (lp_t - q_t)^2)` |
//! | `gspo` | `-sum min(s_t A_t, clamp(s_t, lo, hi) A_t)`, `s_t = exp(mean_{u in M} sg(lp_u - q_u) + lp_t - sg(lp_t))` over `M` = `sequence_ratio_mask` != 0 |
//! | `stable_reinforce` | `-sum_{t in S} (sg(min(r'_t, cap)) lp_t A_t - kl_coeff (r'_t - 1 - log r'_t))`, `r'_t = exp(lp_t - q'_t)` |
//!
//! `stable_reinforce` is temper's reading of Tinker's StableReinforce, whose formula Tinker does
//! not publish (docs/tinker.md): `q'_t` is the logprob the sampler RECORDED for the token
//! (`record_stability_info`), not the request's `logprobs`, and `S` the positions whose target
//! the datum's provenance names as a sampled token; `cap` = `ratio_cap` (default 2),
//! `kl_coeff` (default 0). The server resolves the provenance into [`RECORDED_LOGPROBS`] and
//! [`SAMPLED_MASK`], the inputs this module reads besides `advantages`.
//!
//! `lo`/`hi` are `loss_fn_config`'s `clip_low_threshold`/`clip_high_threshold`, absolute ratio
//! bounds (default 0.8 / 1.2). Every loss is a plain SUM over tokens (and, by the caller, over
//! datums): no mean, no normalisation. No ratio is clamped before `exp` (Tinker's snippets do not).
//! `dro`'s `beta` has no documented default: temper uses 0.05, the docs' example value.
//!
//! This module only reads the request: each loss is a row of the one loss table,
//! [`crate::policy_loss`] (`tinker_importance_sampling`, `tinker_ppo`, `tinker_cispo`,
//! `tinker_dro`; `cross_entropy` is `no_baseline` with the weights as advantages), aggregated
//! with `token-sum`.

use std::collections::BTreeMap;

use anyhow::{bail, Result};
use tch::{Kind, Tensor};

use crate::agg::{AggContext, AggMode};
use crate::policy_loss::{policy_loss, PolicyLossInput, PolicyLossMode, PolicyLossParams};
pub use crate::policy_loss::{DRO_DEFAULT_BETA, STABLE_REINFORCE_DEFAULT_CAP};

/// A Tinker loss with its `loss_fn_config` resolved.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TinkerLoss {
    CrossEntropy,
    ImportanceSampling,
    Ppo { lo: f64, hi: f64 },
    Cispo { lo: f64, hi: f64 },
    Dro { beta: f64 },
    Gspo { lo: f64, hi: f64 },
    StableReinforce { kl_coeff: f64, ratio_cap: f64 },
}

/// Loss names the Tinker SDK knows that temper does not implement yet.
const NOT_YET: [&str; 1] = ["custom"];

/// The input of `stable_reinforce` that holds, per position, the logprob the sampler recorded
/// for the target token (0 where the target is not a sampled token).
pub const RECORDED_LOGPROBS: &str = "recorded_logprobs";
/// The input of `stable_reinforce` that is 1 where the target is a sampled token, else 0.
pub const SAMPLED_MASK: &str = "sampled_mask";
/// The input of `gspo` that marks the positions of the sequence ratio.
pub const SEQUENCE_RATIO_MASK: &str = "sequence_ratio_mask";

/// Every `loss_fn` temper serves, as the SDK names them.
pub const TINKER_LOSSES: [&str; 7] = [
    "cross_entropy",
    "importance_sampling",
    "ppo",
    "cispo",
    "dro",
    "gspo",
    "stable_reinforce",
];

impl TinkerLoss {
    /// `loss_fn` and `loss_fn_config` of a request. Unknown config keys are errors (a typo would
    /// otherwise silently train with the default).
    pub fn from_request(name: &str, config: &BTreeMap<String, f64>) -> Result<TinkerLoss> {
        let allowed: &[&str] = match name {
            "ppo" | "cispo" | "gspo" => &["clip_low_threshold", "clip_high_threshold"],
            "dro" => &["beta"],
            "stable_reinforce" => &["kl_coeff", "ratio_cap"],
            "cross_entropy" | "importance_sampling" => &[],
            n if NOT_YET.contains(&n) => {
                bail!(
                    "loss_fn `{n}` is not served by temper: compute a custom loss client-side \
                     with forward_backward_custom, or use one of {}",
                    TINKER_LOSSES.join(", ")
                )
            }
            n => bail!(
                "unknown loss_fn `{n}` (one of {})",
                TINKER_LOSSES.join(", ")
            ),
        };
        if let Some(k) = config.keys().find(|k| !allowed.contains(&k.as_str())) {
            bail!(
                "loss_fn_config key `{k}` does not apply to loss_fn `{name}` (it takes {})",
                if allowed.is_empty() {
                    "no config".to_string()
                } else {
                    allowed.join(", ")
                }
            );
        }
        let get = |k: &str, d: f64| config.get(k).copied().unwrap_or(d);
        let (lo, hi) = (
            get("clip_low_threshold", 0.8),
            get("clip_high_threshold", 1.2),
        );
        if matches!(name, "ppo" | "cispo" | "gspo")
            && !(lo.is_finite() && hi.is_finite() && lo <= hi)
        {
            bail!(
                "loss_fn_config: clip_low_threshold {lo} must not exceed clip_high_threshold {hi}"
            );
        }
        Ok(match name {
            "cross_entropy" => TinkerLoss::CrossEntropy,
            "importance_sampling" => TinkerLoss::ImportanceSampling,
            "ppo" => TinkerLoss::Ppo { lo, hi },
            "cispo" => TinkerLoss::Cispo { lo, hi },
            "gspo" => TinkerLoss::Gspo { lo, hi },
            "stable_reinforce" => {
                let kl_coeff = get("kl_coeff", 0.0);
                let ratio_cap = get("ratio_cap", STABLE_REINFORCE_DEFAULT_CAP);
                if !(kl_coeff.is_finite() && kl_coeff >= 0.0) {
                    bail!("loss_fn_config: kl_coeff {kl_coeff} must be a finite number >= 0");
                }
                if !(ratio_cap.is_finite() && ratio_cap > 0.0) {
                    bail!("loss_fn_config: ratio_cap {ratio_cap} must be a finite number > 0");
                }
                TinkerLoss::StableReinforce {
                    kl_coeff,
                    ratio_cap,
                }
            }
            _ => TinkerLoss::Dro {
                beta: get("beta", DRO_DEFAULT_BETA),
            },
        })
    }

    /// The `loss_fn_inputs` fields this loss reads besides `target_tokens`.
    pub fn inputs(self) -> &'static [&'static str] {
        match self {
            TinkerLoss::CrossEntropy => &["weights"],
            TinkerLoss::Gspo { .. } => &["logprobs", "advantages", SEQUENCE_RATIO_MASK],
            TinkerLoss::StableReinforce { .. } => &["advantages"],
            _ => &["logprobs", "advantages"],
        }
    }

    /// Whether the loss reads what the sampler recorded ([`RECORDED_LOGPROBS`],
    /// [`SAMPLED_MASK`]), which needs the datum's provenance.
    pub fn needs_provenance(self) -> bool {
        matches!(self, TinkerLoss::StableReinforce { .. })
    }

    /// This loss as a row of the loss table: its mode and parameters (Tinker's absolute
    /// thresholds become the table's `1 - lo` / `1 + hi` offsets; no dual clip).
    pub fn row(self) -> (PolicyLossMode, PolicyLossParams) {
        let clip = |lo: f64, hi: f64| PolicyLossParams {
            clip_ratio_low: Some(1.0 - lo),
            clip_ratio_high: Some(hi - 1.0),
            clip_ratio_c: None,
            ..Default::default()
        };
        let plain = PolicyLossParams {
            clip_ratio_c: None,
            ..Default::default()
        };
        match self {
            TinkerLoss::CrossEntropy => (PolicyLossMode::NoBaseline, plain),
            TinkerLoss::ImportanceSampling => (PolicyLossMode::TinkerImportanceSampling, plain),
            TinkerLoss::Ppo { lo, hi } => (PolicyLossMode::TinkerPpo, clip(lo, hi)),
            TinkerLoss::Cispo { lo, hi } => (PolicyLossMode::TinkerCispo, clip(lo, hi)),
            TinkerLoss::Dro { beta } => (
                PolicyLossMode::TinkerDro,
                PolicyLossParams {
                    dro_beta: Some(beta),
                    ..plain
                },
            ),
            TinkerLoss::Gspo { lo, hi } => (PolicyLossMode::TinkerGspo, clip(lo, hi)),
            TinkerLoss::StableReinforce {
                kl_coeff,
                ratio_cap,
            } => (
                PolicyLossMode::TinkerStableReinforce,
                PolicyLossParams {
                    kl_coeff: Some(kl_coeff),
                    ratio_cap: Some(ratio_cap),
                    ..plain
                },
            ),
        }
    }

    /// The loss of one datum: a scalar, the sum over its positions. `lp` (N,) has gradient;
    /// `input(name)` gives the (N,) `loss_fn_inputs` tensors named by [`TinkerLoss::inputs`].
    pub fn datum_loss(self, lp: &Tensor, input: &dyn Fn(&str) -> Tensor) -> Result<Tensor> {
        let (mode, params) = self.row();
        let lp = lp.unsqueeze(0);
        let n = lp.size()[1] as f64;
        let (advantages, old) = match self {
            TinkerLoss::CrossEntropy => (input("weights"), None),
            TinkerLoss::StableReinforce { .. } => (
                input("advantages"),
                Some(input(RECORDED_LOGPROBS).unsqueeze(0)),
            ),
            _ => (input("advantages"), Some(input("logprobs").unsqueeze(0))),
        };
        let mask = match self {
            TinkerLoss::StableReinforce { .. } => input(SAMPLED_MASK).unsqueeze(0).ne(0.0),
            _ => lp.ones_like().to_kind(Kind::Bool),
        };
        let ratio_mask = match self {
            TinkerLoss::Gspo { .. } => Some(input(SEQUENCE_RATIO_MASK).unsqueeze(0).ne(0.0)),
            _ => None,
        };
        let out = policy_loss(
            mode,
            &params,
            &PolicyLossInput {
                log_prob: &lp,
                old_log_prob: old.as_ref(),
                advantages: &advantages.unsqueeze(0),
                response_mask: &mask,
                rollout_is_weights: None,
                ratio_mask: ratio_mask.as_ref(),
            },
            &AggContext {
                mode: AggMode::TokenSum,
                global_tokens: n,
                global_seqs: 1.0,
                global_rows: 1.0,
                loss_scale_factor: n,
            },
        )?;
        Ok(out.pg_loss)
    }
}
