//! The ops of `VECTORS.md` (plus temper's own: `rollout_correction`, `kl_in_reward`,
//! `kl_controller`): their known keys and how each is computed (in f64).

use std::collections::BTreeMap;

use anyhow::{anyhow, bail, Result};
use serde_json::{Map, Value};
use tch::Tensor;

use super::json::Array;
use super::run_ops::*;

pub(crate) type Outputs = Vec<(&'static str, Tensor)>;

/// One op: its keys and its computation.
pub(crate) struct OpSpec {
    pub name: &'static str,
    pub args: &'static [&'static str],
    pub inputs: &'static [&'static str],
    pub expected: &'static [&'static str],
    pub run: fn(&Args, &Inputs, &Want) -> Result<Outputs>,
}

pub(crate) const OPS: &[OpSpec] = &[
    OpSpec {
        name: "advantages",
        args: &["estimator", "group_size", "norm_adv_by_std", "eps", "gamma"],
        inputs: &["rewards", "response_mask", "index"],
        expected: &["advantages"],
        run: run_advantages,
    },
    OpSpec {
        name: "policy_loss",
        args: &[
            "loss_mode",
            "clip_ratio",
            "clip_ratio_low",
            "clip_ratio_high",
            "clip_ratio_c",
            "loss_agg_mode",
            "loss_scale_factor",
            "tau_pos",
            "tau_neg",
            "cispo_max_ratio",
        ],
        inputs: &[
            "log_prob",
            "old_log_prob",
            "advantages",
            "response_mask",
            "rollout_is_weights",
        ],
        expected: &[
            "pg_losses",
            "pg_loss",
            "pg_clipfrac",
            "pg_clipfrac_lower",
            "ppo_kl",
            "grad_log_prob",
        ],
        run: run_policy_loss,
    },
    OpSpec {
        name: "actor_loss",
        args: &[
            "loss_mode",
            "clip_ratio",
            "clip_ratio_low",
            "clip_ratio_high",
            "clip_ratio_c",
            "loss_agg_mode",
            "loss_scale_factor",
            "tau_pos",
            "tau_neg",
            "cispo_max_ratio",
            "use_kl_loss",
            "kl_loss_coef",
            "kl_loss_type",
            "entropy_coeff",
        ],
        inputs: &[
            "log_prob",
            "old_log_prob",
            "ref_log_prob",
            "advantages",
            "response_mask",
            "entropy",
        ],
        expected: &["loss", "grad_log_prob"],
        run: run_actor_loss,
    },
    OpSpec {
        name: "agg_loss",
        args: &["loss_agg_mode", "loss_scale_factor"],
        inputs: &["loss_mat", "response_mask"],
        expected: &["loss", "grad_loss_mat"],
        run: run_agg_loss,
    },
    OpSpec {
        name: "masked_mean",
        args: &["dim"],
        inputs: &["tensor", "mask"],
        expected: &["mean"],
        run: run_masked_mean,
    },
    OpSpec {
        name: "kl",
        args: &["kl_type"],
        inputs: &["log_prob", "ref_log_prob", "response_mask"],
        expected: &["kl", "grad_log_prob"],
        run: run_kl,
    },
    OpSpec {
        name: "entropy",
        args: &[],
        inputs: &["logits"],
        expected: &["entropy"],
        run: run_entropy,
    },
    OpSpec {
        name: "microbatch_step",
        args: &[
            "loss_type",
            "cliprange",
            "gradient_accumulation_steps",
            "steps",
        ],
        inputs: &[
            "log_prob",
            "old_log_prob",
            "raw_rewards",
            "advantages",
            "response_mask",
        ],
        expected: &["loss", "grad_log_prob"],
        run: run_microbatch_step,
    },
    OpSpec {
        name: "rollout_correction",
        args: &[
            "rollout_is",
            "rollout_is_threshold",
            "rollout_is_cap",
            "rollout_rs",
            "rollout_rs_threshold",
        ],
        inputs: &["old_log_prob", "rollout_log_prob", "response_mask"],
        expected: &[
            "rollout_is_weights",
            "response_mask",
            "logprob_abs_diff_mean",
            "logprob_abs_diff_max",
            "kl",
            "k3_kl",
        ],
        run: run_rollout_correction,
    },
    OpSpec {
        name: "kl_in_reward",
        args: &["kl_type", "kl_ctrl", "kl_coef", "target_kl", "horizon"],
        inputs: &[
            "token_level_scores",
            "old_log_prob",
            "ref_log_prob",
            "response_mask",
        ],
        expected: &["token_level_rewards", "current_kl", "next_kl_coef"],
        run: run_kl_in_reward,
    },
    OpSpec {
        name: "kl_controller",
        args: &["kl_ctrl", "kl_coef", "target_kl", "horizon"],
        inputs: &["current_kl", "n_steps"],
        expected: &["values"],
        run: run_kl_controller,
    },
];

/// The keys of a case's `expected` (and their ranks).
pub(crate) struct Want<'a>(pub &'a BTreeMap<String, Array>);

impl Want<'_> {
    pub fn has(&self, k: &str) -> bool {
        self.0.contains_key(k)
    }
    pub fn dims(&self, k: &str) -> Option<usize> {
        self.0.get(k).map(|a| a.shape.len())
    }
}

/// A case's `args`, with typed getters that name the key in errors.
pub(crate) struct Args<'a>(pub &'a Map<String, Value>);

impl Args<'_> {
    pub(super) fn str(&self, k: &str) -> Result<Option<&str>> {
        match self.0.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => bail!("args.{k}: expected a string, got {v}"),
        }
    }
    pub(super) fn parse<T: std::str::FromStr>(&self, k: &str) -> Result<Option<T>>
    where
        T::Err: std::fmt::Display,
    {
        match self.str(k)? {
            None => Ok(None),
            Some(s) => s
                .parse::<T>()
                .map(Some)
                .map_err(|e| anyhow!("args.{k}: {e}")),
        }
    }
    /// Missing: `default`; null: None ("off").
    pub(super) fn opt_f64(&self, k: &str, default: Option<f64>) -> Result<Option<f64>> {
        match self.0.get(k) {
            None => Ok(default),
            Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| anyhow!("args.{k}: expected a number, got {v}")),
        }
    }
    pub(super) fn f64_or(&self, k: &str, default: f64) -> Result<f64> {
        Ok(self.opt_f64(k, Some(default))?.unwrap_or(default))
    }
    pub(super) fn bool_or(&self, k: &str, default: bool) -> Result<bool> {
        match self.0.get(k) {
            None | Some(Value::Null) => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(v) => bail!("args.{k}: expected true or false, got {v}"),
        }
    }
    pub(super) fn usize_opt(&self, k: &str) -> Result<Option<usize>> {
        match self.0.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) => Ok(Some(n as usize)),
                None => bail!("args.{k}: expected a non-negative integer, got {v}"),
            },
        }
    }
    pub(super) fn i64_opt(&self, k: &str) -> Result<Option<i64>> {
        match self.0.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_i64()
                .map(Some)
                .ok_or_else(|| anyhow!("args.{k}: expected an integer, got {v}")),
        }
    }
}

/// A case's `inputs` as f64 tensors.
pub(crate) struct Inputs(pub BTreeMap<String, Array>);

impl Inputs {
    pub(super) fn opt(&self, k: &str) -> Option<Tensor> {
        self.0.get(k).map(|a| a.tensor())
    }
    pub(super) fn req(&self, k: &str) -> Result<Tensor> {
        self.opt(k).ok_or_else(|| anyhow!("inputs.{k} is required"))
    }
    pub(super) fn shape(&self, k: &str) -> Option<Vec<i64>> {
        self.0.get(k).map(|a| a.shape.clone())
    }
}
