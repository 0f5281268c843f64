//! How each op of [`super::ops::OPS`] is computed: temper-algo's functions on the case's inputs
//! (f64), returning the named outputs the case expects.

use anyhow::{anyhow, bail, Context, Result};
use tch::{Kind, Tensor};

use super::ops::{Args, Inputs, Outputs, Want};
use crate::actor::{actor_loss, ActorLossConfig, ActorLossInput};
use crate::advantage::{
    compute_advantages, contiguous_groups, outcome_to_token_rewards, scalar_advantages, AdvConfig,
    AdvEstimator,
};
use crate::agg::{AggContext, AggMode};
use crate::grpo_microbatch::{grpo_microbatch_train_step, MicrobatchStep};
use crate::kl::{apply_kl_in_reward, kl_penalty, KlController, KlCtrlConfig, KlType};
use crate::masked::masked_mean;
use crate::policy_loss::{policy_loss, PolicyLossInput, PolicyLossMode, PolicyLossParams};
use crate::rollout_correction::{rollout_correction, CorrectionLevel, IsCap, RolloutCorrection};

fn want_dims(t: &Tensor, dims: usize, name: &str) -> Result<()> {
    if t.dim() != dims {
        bail!(
            "inputs.{name}: expected {dims} dims, got shape {:?}",
            t.size()
        );
    }
    Ok(())
}

pub(super) fn run_advantages(a: &Args, inp: &Inputs, wants: &Want) -> Result<Outputs> {
    let estimator: AdvEstimator = a
        .parse("estimator")?
        .ok_or_else(|| anyhow!("args.estimator is required"))?;
    let cfg = AdvConfig {
        adv_estimator: estimator,
        norm_adv_by_std_in_grpo: a.bool_or("norm_adv_by_std", true)?,
        epsilon: a.f64_or("eps", 1e-6)?,
        gamma: a.f64_or("gamma", 1.0)?,
    };
    let rewards = inp.req("rewards")?;
    let n = rewards.size().first().copied().unwrap_or(0) as usize;
    let mask = match inp.opt("response_mask") {
        Some(m) => {
            want_dims(&m, 2, "response_mask")?;
            if m.size()[0] as usize != n {
                bail!(
                    "inputs.response_mask has {} rows for {n} rewards",
                    m.size()[0]
                );
            }
            m
        }
        None => Tensor::ones([n as i64, 1], (Kind::Double, tch::Device::Cpu)),
    };
    let index: Vec<i64> = match (inp.0.get("index"), a.usize_opt("group_size")?) {
        (Some(ix), _) => ix.data.iter().map(|&x| x as i64).collect(),
        (None, Some(g)) => contiguous_groups(n, g)?,
        (None, None) => bail!("args.group_size (or inputs.index) is required"),
    };
    let token_rewards = match rewards.dim() {
        2 => rewards,
        1 if estimator == AdvEstimator::ReinforcePlusPlus => {
            outcome_to_token_rewards(&rewards, &mask)?
        }
        1 => {
            // Only the row sums matter to the group estimators: put each score in column 0.
            let t = mask.size()[1];
            Tensor::cat(
                &[rewards.unsqueeze(-1), mask.zeros_like().narrow(1, 0, t - 1)],
                1,
            )
        }
        _ => bail!(
            "inputs.rewards: expected (N,) or (N, T), got shape {:?}",
            rewards.size()
        ),
    };
    let adv = compute_advantages(&cfg, &token_rewards, &mask, &index)?;
    if wants.dims("advantages") == Some(1) {
        return Ok(vec![(
            "advantages",
            match estimator {
                AdvEstimator::ReinforcePlusPlus => {
                    bail!(
                        "expected.advantages: reinforce_plus_plus advantages are per token, (N, T)"
                    )
                }
                // Whitened over tokens: the per-row value (0 for a row without a valid token).
                AdvEstimator::ReinforcePlusPlusBaseline => per_row(&adv, &mask),
                _ => {
                    let sum = |t: &Tensor| {
                        Vec::<f64>::try_from(&t.sum_dim_intlist(-1, false, None::<Kind>))
                            .unwrap_or_default()
                    };
                    let a = scalar_advantages(&cfg, &sum(&token_rewards), &sum(&mask), &index)?;
                    Tensor::from_slice(&a)
                }
            },
        )]);
    }
    Ok(vec![("advantages", adv)])
}

/// Per-row advantages from token-level ones for a 1-D `expected`: the mean over valid tokens
/// (0 for a row without one).
fn per_row(adv: &Tensor, mask: &Tensor) -> Tensor {
    let m = mask.to_kind(Kind::Double);
    let count = m.sum_dim_intlist(-1, false, None::<Kind>);
    (adv * &m).sum_dim_intlist(-1, false, None::<Kind>) / count.clamp_min(1.0)
}

fn loss_params(a: &Args) -> Result<PolicyLossParams> {
    let d = PolicyLossParams::default();
    Ok(PolicyLossParams {
        clip_ratio: a.f64_or("clip_ratio", d.clip_ratio)?,
        clip_ratio_low: a.opt_f64("clip_ratio_low", None)?,
        clip_ratio_high: a.opt_f64("clip_ratio_high", None)?,
        clip_ratio_c: a.opt_f64("clip_ratio_c", d.clip_ratio_c)?,
        tau_pos: a.f64_or("tau_pos", d.tau_pos)?,
        tau_neg: a.f64_or("tau_neg", d.tau_neg)?,
        cispo_max_ratio: a.opt_f64("cispo_max_ratio", None)?,
        dro_beta: a.opt_f64("dro_beta", None)?,
        kl_coeff: a.opt_f64("kl_coeff", None)?,
        ratio_cap: a.opt_f64("ratio_cap", None)?,
    })
}

pub(super) fn run_policy_loss(a: &Args, inp: &Inputs, wants: &Want) -> Result<Outputs> {
    let mode: PolicyLossMode = a
        .parse("loss_mode")?
        .ok_or_else(|| anyhow!("args.loss_mode is required"))?;
    let agg: AggMode = a.parse("loss_agg_mode")?.unwrap_or_default();
    let params = loss_params(a)?;
    let logp = inp.req("log_prob")?.set_requires_grad(true);
    let old = inp.opt("old_log_prob");
    let adv = inp.req("advantages")?;
    let mask = inp.req("response_mask")?;
    let weights = inp.opt("rollout_is_weights");
    let ctx = AggContext::from_mask(agg, &mask, a.opt_f64("loss_scale_factor", None)?)?;
    let o = policy_loss(
        mode,
        &params,
        &PolicyLossInput {
            log_prob: &logp,
            old_log_prob: old.as_ref(),
            advantages: &adv,
            response_mask: &mask,
            rollout_is_weights: weights.as_ref(),
            ratio_mask: None,
        },
        &ctx,
    )?;
    let mut out = Outputs::new();
    for (key, metric) in [
        ("pg_clipfrac", "actor/pg_clipfrac"),
        ("pg_clipfrac_lower", "actor/pg_clipfrac_lower"),
        ("ppo_kl", "actor/ppo_kl"),
    ] {
        if wants.has(key) {
            let v = o
                .metrics
                .read()
                .get(metric)
                .copied()
                .ok_or_else(|| anyhow!("loss_mode {mode} does not report {key}"))?;
            out.push((key, Tensor::from(v)));
        }
    }
    if wants.has("grad_log_prob") {
        o.pg_loss.f_backward().context("backward of pg_loss")?;
        out.push(("grad_log_prob", logp.grad()));
    }
    if wants.has("pg_losses") {
        out.push(("pg_losses", o.pg_losses.detach()));
    }
    if wants.has("pg_loss") {
        out.push(("pg_loss", o.pg_loss.detach()));
    }
    Ok(out)
}

pub(super) fn run_actor_loss(a: &Args, inp: &Inputs, wants: &Want) -> Result<Outputs> {
    let d = ActorLossConfig::default();
    let cfg = ActorLossConfig {
        loss_mode: a
            .parse("loss_mode")?
            .ok_or_else(|| anyhow!("args.loss_mode is required"))?,
        params: loss_params(a)?,
        loss_agg_mode: a.parse("loss_agg_mode")?.unwrap_or_default(),
        loss_scale_factor: a.opt_f64("loss_scale_factor", None)?,
        use_kl_loss: a.bool_or("use_kl_loss", d.use_kl_loss)?,
        kl_loss_coef: a.f64_or("kl_loss_coef", d.kl_loss_coef)?,
        kl_loss_type: a.parse("kl_loss_type")?.unwrap_or(d.kl_loss_type),
        entropy_coeff: a.f64_or("entropy_coeff", d.entropy_coeff)?,
    };
    let logp = inp.req("log_prob")?.set_requires_grad(true);
    let (old, reference, entropy) = (
        inp.opt("old_log_prob"),
        inp.opt("ref_log_prob"),
        inp.opt("entropy"),
    );
    let mask = inp.req("response_mask")?;
    let ctx = cfg.context(&[&mask])?;
    let out = actor_loss(
        &cfg,
        &ActorLossInput {
            log_prob: &logp,
            old_log_prob: old.as_ref(),
            ref_log_prob: reference.as_ref(),
            advantages: &inp.req("advantages")?,
            response_mask: &mask,
            entropy: entropy.as_ref(),
            rollout_is_weights: None,
        },
        &ctx,
    )?;
    let mut outputs = Outputs::new();
    if wants.has("grad_log_prob") {
        out.loss.f_backward()?;
        outputs.push(("grad_log_prob", logp.grad()));
    }
    outputs.push(("loss", out.loss.detach()));
    Ok(outputs)
}

pub(super) fn run_agg_loss(a: &Args, inp: &Inputs, wants: &Want) -> Result<Outputs> {
    let mode: AggMode = a
        .parse("loss_agg_mode")?
        .ok_or_else(|| anyhow!("args.loss_agg_mode is required"))?;
    let loss_mat = inp.req("loss_mat")?.set_requires_grad(true);
    let mask = inp.req("response_mask")?;
    want_dims(&loss_mat, 2, "loss_mat")?;
    let loss = crate::agg::agg_loss(
        &loss_mat,
        &mask,
        mode,
        a.opt_f64("loss_scale_factor", None)?,
    )?;
    let mut out = Outputs::new();
    if wants.has("grad_loss_mat") {
        loss.f_backward()?;
        out.push(("grad_loss_mat", loss_mat.grad()));
    }
    out.push(("loss", loss.detach()));
    Ok(out)
}

pub(super) fn run_masked_mean(a: &Args, inp: &Inputs, _: &Want) -> Result<Outputs> {
    let t = inp.req("tensor")?;
    let m = inp.req("mask")?;
    if t.f_expand_as(&m).is_err() && m.f_expand_as(&t).is_err() {
        bail!(
            "inputs.mask shape {:?} does not broadcast with inputs.tensor shape {:?}",
            m.size(),
            t.size()
        );
    }
    let dim = a.i64_opt("dim")?;
    if let Some(d) = dim {
        let nd = t.dim() as i64;
        if d >= nd || d < -nd {
            bail!("args.dim {d} is out of range for a {nd}-dim tensor");
        }
    }
    Ok(vec![("mean", masked_mean(&t, &m, dim))])
}

pub(super) fn run_kl(a: &Args, inp: &Inputs, wants: &Want) -> Result<Outputs> {
    let kl_type: KlType = a
        .parse("kl_type")?
        .ok_or_else(|| anyhow!("args.kl_type is required"))?;
    let logp = inp.req("log_prob")?.set_requires_grad(true);
    let reference = inp.req("ref_log_prob")?;
    crate::agg::check_same_shape("inputs.log_prob", &logp, "inputs.ref_log_prob", &reference)?;
    let kl = kl_penalty(&logp, &reference, kl_type);
    let mut out = Outputs::new();
    if wants.has("grad_log_prob") {
        let mask = inp.opt("response_mask").unwrap_or_else(|| logp.ones_like());
        masked_mean(&kl, &mask, None).f_backward()?;
        out.push(("grad_log_prob", logp.grad()));
    }
    out.push(("kl", kl.detach()));
    Ok(out)
}

pub(super) fn run_entropy(_: &Args, inp: &Inputs, _: &Want) -> Result<Outputs> {
    let logits = inp.req("logits")?;
    if logits.dim() < 1 || logits.size().last() == Some(&0) {
        bail!(
            "inputs.logits: expected (..., V) with V > 0, got shape {:?}",
            logits.size()
        );
    }
    Ok(vec![(
        "entropy",
        crate::entropy::entropy_from_logits(&logits),
    )])
}

pub(super) fn run_microbatch_step(a: &Args, inp: &Inputs, wants: &Want) -> Result<Outputs> {
    let loss_type: PolicyLossMode = a
        .parse("loss_type")?
        .ok_or_else(|| anyhow!("args.loss_type is required"))?;
    let gas = a.usize_opt("gradient_accumulation_steps")?.unwrap_or(1);
    let steps = a.usize_opt("steps")?.unwrap_or(1);
    if steps == 0 {
        bail!("args.steps must be >= 1");
    }
    let logp = inp.req("log_prob")?.set_requires_grad(true);
    let mask = inp.req("response_mask")?;
    let (old, raw, adv) = (
        inp.opt("old_log_prob"),
        inp.opt("raw_rewards"),
        inp.opt("advantages"),
    );
    let (mut losses, mut grads) = (Vec::new(), Vec::new());
    for _ in 0..steps {
        let (loss, _) = grpo_microbatch_train_step(&MicrobatchStep {
            policy_log_probs: &logp,
            response_mask: &mask,
            gradient_accumulation_steps: gas,
            loss_type,
            raw_rewards: raw.as_ref(),
            advantages: adv.as_ref(),
            old_log_probs: old.as_ref(),
            cliprange: a.opt_f64("cliprange", None)?,
        })?;
        losses.push(loss);
        if wants.has("grad_log_prob") {
            grads.push(logp.grad().copy());
        }
    }
    let mut out = vec![("loss", Tensor::stack(&losses, 0))];
    if wants.has("grad_log_prob") {
        out.push(("grad_log_prob", Tensor::stack(&grads, 0)));
    }
    Ok(out)
}

pub(super) fn run_rollout_correction(a: &Args, inp: &Inputs, wants: &Want) -> Result<Outputs> {
    let d = RolloutCorrection::default();
    let cfg = RolloutCorrection {
        rollout_is: a.parse::<CorrectionLevel>("rollout_is")?,
        rollout_is_threshold: a.f64_or("rollout_is_threshold", d.rollout_is_threshold)?,
        rollout_is_cap: a.parse::<IsCap>("rollout_is_cap")?.unwrap_or_default(),
        rollout_rs: a.parse::<CorrectionLevel>("rollout_rs")?,
        rollout_rs_threshold: a.opt_f64("rollout_rs_threshold", None)?,
        bypass_mode: false,
    };
    let o = rollout_correction(
        &inp.req("old_log_prob")?,
        &inp.req("rollout_log_prob")?,
        &inp.req("response_mask")?,
        &cfg,
    )?;
    let mut out = Outputs::new();
    if wants.has("rollout_is_weights") {
        let w = o.rollout_is_weights.ok_or_else(|| {
            anyhow!("expected.rollout_is_weights given but args.rollout_is is off")
        })?;
        out.push(("rollout_is_weights", w));
    }
    out.push(("response_mask", o.response_mask));
    for (key, metric) in [
        ("logprob_abs_diff_mean", "rollout/logprob_abs_diff_mean"),
        ("logprob_abs_diff_max", "rollout/logprob_abs_diff_max"),
        ("kl", "rollout_corr/kl"),
        ("k3_kl", "rollout_corr/k3_kl"),
    ] {
        out.push((key, Tensor::from(o.metrics[metric])));
    }
    Ok(out)
}

fn kl_ctrl(a: &Args) -> Result<KlController> {
    let d = KlCtrlConfig::default();
    KlController::new(&KlCtrlConfig {
        kind: a.str("kl_ctrl")?.unwrap_or("fixed").parse()?,
        kl_coef: a.f64_or("kl_coef", d.kl_coef)?,
        target_kl: a.f64_or("target_kl", d.target_kl)?,
        horizon: a.f64_or("horizon", d.horizon)?,
    })
}

pub(super) fn run_kl_in_reward(a: &Args, inp: &Inputs, _: &Want) -> Result<Outputs> {
    let kl_type: KlType = a
        .parse("kl_type")?
        .ok_or_else(|| anyhow!("args.kl_type is required"))?;
    let mut ctrl = kl_ctrl(a)?;
    let (rewards, metrics) = apply_kl_in_reward(
        &inp.req("token_level_scores")?,
        &inp.req("old_log_prob")?,
        &inp.req("ref_log_prob")?,
        &inp.req("response_mask")?,
        kl_type,
        &mut ctrl,
    )?;
    Ok(vec![
        ("token_level_rewards", rewards),
        (
            "current_kl",
            Tensor::from(metrics["actor/reward_kl_penalty"]),
        ),
        ("next_kl_coef", Tensor::from(ctrl.value())),
    ])
}

pub(super) fn run_kl_controller(a: &Args, inp: &Inputs, _: &Want) -> Result<Outputs> {
    let mut ctrl = kl_ctrl(a)?;
    let kls = &inp
        .0
        .get("current_kl")
        .ok_or_else(|| anyhow!("inputs.current_kl is required"))?
        .data;
    let steps = &inp
        .0
        .get("n_steps")
        .ok_or_else(|| anyhow!("inputs.n_steps is required"))?
        .data;
    if kls.len() != steps.len() || inp.shape("current_kl").map_or(0, |s| s.len()) != 1 {
        bail!("inputs.current_kl and inputs.n_steps must be lists of the same length");
    }
    let values: Vec<f64> = kls
        .iter()
        .zip(steps)
        .map(|(&kl, &n)| {
            ctrl.update(kl, n);
            ctrl.value()
        })
        .collect();
    Ok(vec![("values", Tensor::from_slice(&values))])
}
