//! temper-algo: the RL math of `ALGORITHMS.md` (sections 1-5) on tch tensors (f32 or f64).
//!
//! - [`advantage`]: outcome advantage estimators (`grpo`, `rloo`, `reinforce_plus_plus(_baseline)`,
//!   `opo`, the `dr_grpo` preset), zero-advantage group count and DAPO's `filter_groups`.
//! - [`policy_loss`]: per-token policy losses chosen by name (verl's `loss_mode`, CS336's
//!   `loss_type`, Tinker's summed losses) and their metrics.
//! - [`agg`]: the five `loss_agg_mode`s, normalised by mini-batch-global counts ([`AggContext`]).
//! - [`kl`]: KL estimators (`k1`, `abs`, `k2`/`mse`, `k3`/`low_var_kl`, `+` straight-through),
//!   KL in reward with a fixed or adaptive coefficient.
//! - [`entropy`]: entropy from logits.
//! - [`rollout_correction`]: training-vs-rollout mismatch metrics, truncated / masked importance sampling.
//! - [`actor`]: the whole actor loss of one micro-batch (policy loss + KL loss - entropy bonus).
//! - [`optim`]: AdamW and gradient-norm clipping (PyTorch's).
//! - [`grpo_microbatch`]: CS336 assignment 5's `grpo_microbatch_train_step` and group-normalised rewards.
//! - [`vectors`]: the test-vector runner of `VECTORS.md` (used by `temper check-vectors`).
//!
//! Metric names are returned in full, exactly as verl logs them (`actor/pg_clipfrac`,
//! `actor/ppo_kl`, ...): callers must not add a prefix.

pub mod actor;
pub mod advantage;
pub mod agg;
pub mod device_metrics;
pub mod entropy;
pub mod grpo_microbatch;
pub mod kl;
pub mod masked;
pub mod names;
pub mod optim;
pub mod policy_loss;
pub mod rollout_correction;
pub mod tinker_loss;
pub mod vectors;

pub use actor::{actor_loss, ActorLossConfig, ActorLossInput, ActorLossOutput};
pub use advantage::{
    compute_advantages, contiguous_groups, filter_groups, outcome_to_token_rewards,
    scalar_advantages, zero_adv_groups, AdvConfig, AdvEstimator, Preset,
};
pub use agg::{agg_loss, AggContext, AggMode};
pub use device_metrics::{read_all, DeviceMetrics};
pub use entropy::entropy_from_logits;
pub use kl::{apply_kl_in_reward, kl_penalty, KlController, KlCtrlConfig, KlCtrlKind, KlType};
pub use masked::{masked_mean, masked_mean_eps, masked_sum, masked_whiten};
pub use names::UnknownName;
pub use policy_loss::{
    policy_loss, PolicyLossInput, PolicyLossMode, PolicyLossOutput, PolicyLossParams,
};
pub use rollout_correction::{
    rollout_correction, CorrectionLevel, IsCap, RolloutCorrection, RolloutCorrectionOutput,
};
pub use tinker_loss::TinkerLoss;
pub use vectors::{run_vectors, CaseResult, Report};

/// Metrics as returned by this crate: full verl names -> value.
pub type Metrics = std::collections::BTreeMap<&'static str, f64>;
