//! What the config's algorithm and reward names become: the reward, and temper-algo's loss,
//! advantage and rollout-correction configs (an unknown name is an error naming its key).
use crate::config::Config;
use anyhow::{Context, Result};
use temper_algo::{ActorLossConfig, AdvConfig};
use temper_reward::Reward;

/// The reward named in `reward.name` with `reward.kwargs` (or, for a task reward with no kwargs,
/// the task's own `data.task_args`, so generator and verifier agree).
pub(super) fn build_reward(cfg: &Config) -> Result<Box<dyn Reward>> {
    let kwargs = if cfg.reward.kwargs.is_empty()
        && cfg.data.task.as_deref() == Some(cfg.reward.name.as_str())
    {
        &cfg.data.task_args
    } else {
        &cfg.reward.kwargs
    };
    let opts = serde_json::to_value(kwargs)?;
    temper_reward::reward_by_name(&cfg.reward.name, &opts).context("reward.name / reward.kwargs")
}

/// temper-algo's configs from the config's algorithm choices (parsed when the config loaded).
pub(super) fn algo_configs(
    cfg: &Config,
) -> Result<(ActorLossConfig, AdvConfig, temper_algo::RolloutCorrection)> {
    let a = &cfg.actor;
    let loss_mode = a.policy_loss.loss_mode;
    let mut agg = a.loss_agg_mode;
    let kl_loss_type = a.kl_loss_type;
    let adv_estimator = cfg.algorithm.adv_estimator;
    let mut use_kl_loss = a.use_kl_loss;
    let mut norm_by_std = cfg.algorithm.norm_adv_by_std_in_grpo;
    if let Some(p) = adv_estimator.preset() {
        agg = p.loss_agg_mode;
        use_kl_loss = p.use_kl_loss;
        norm_by_std = p.norm_adv_by_std_in_grpo;
    }
    let params = temper_algo::PolicyLossParams {
        clip_ratio: a.clip_ratio,
        clip_ratio_low: a.clip_ratio_low,
        clip_ratio_high: a.clip_ratio_high,
        clip_ratio_c: a.clip_ratio_c,
        tau_pos: a.tau_pos,
        tau_neg: a.tau_neg,
        dro_beta: Some(a.dro_beta),
        ..Default::default()
    };
    let loss_cfg = ActorLossConfig {
        loss_mode,
        params,
        loss_agg_mode: agg,
        loss_scale_factor: Some(
            a.loss_scale_factor
                .unwrap_or(cfg.data.max_response_length as f64),
        ),
        use_kl_loss,
        kl_loss_coef: a.kl_loss_coef,
        kl_loss_type,
        entropy_coeff: a.entropy_coeff,
    };
    let adv_cfg = AdvConfig {
        adv_estimator,
        norm_adv_by_std_in_grpo: norm_by_std,
        epsilon: cfg.algorithm.advantage_eps,
        gamma: cfg.algorithm.gamma,
    };
    let rc = &cfg.algorithm.rollout_correction;
    let corr = temper_algo::RolloutCorrection {
        rollout_is: rc.rollout_is,
        rollout_is_threshold: rc.rollout_is_threshold,
        rollout_is_cap: rc.rollout_is_cap,
        rollout_rs: rc.rollout_rs,
        rollout_rs_threshold: Some(rc.rollout_rs_threshold),
        bypass_mode: rc.bypass_mode,
    };
    Ok((loss_cfg, adv_cfg, corr))
}
