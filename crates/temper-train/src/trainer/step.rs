//! One training step: generate, score, build the batch, recompute old/ref logprobs, compute
//! advantages, update the policy.
use super::batch::{to_rows, Batch};
use super::partition::Partition;
use super::rollout::{mix, Group};
use super::stats::{put_mmm, MetricAcc, StepMetrics};
use super::Trainer;
use crate::dist::Dist;
use anyhow::{Context, Result};
use serde_json::json;
use std::time::Instant;
use tch::{Kind, Tensor};
use temper_rollout::{Finish, Sample, SamplingParams};

impl Trainer {
    pub(crate) fn train_params(&self) -> SamplingParams {
        let r = &self.cfg.rollout;
        SamplingParams {
            n: r.n,
            temperature: r.temperature,
            top_p: r.top_p,
            top_k: r.top_k,
            max_tokens: self.cfg.data.max_response_length,
            stop: r.stop.clone(),
            min_tokens: r.min_tokens,
            ..SamplingParams::default()
        }
    }

    /// One step (1-based `step`); returns its metrics.
    pub(crate) fn train_step(&mut self, step: usize) -> Result<StepMetrics> {
        if self.env.is_some() {
            return self.env_step(step);
        }
        let t_step = Instant::now();
        let mut m = StepMetrics::new();
        let n = self.cfg.rollout.n;
        let want = self.cfg.data.train_batch_size;
        let filter = self.cfg.algorithm.filter_groups.enable;
        let max_rounds = match self.cfg.algorithm.filter_groups.max_num_gen_batches {
            0 => 100,
            k => k,
        };

        // 1. Rollout and rewards (DAPO: keep drawing until enough groups have a reward spread).
        let t_gen = Instant::now();
        let params = self.train_params();
        let (mut groups, mut drawn, mut zero_groups, mut rounds, mut errors) =
            (Vec::new(), 0usize, 0usize, 0usize, 0usize);
        loop {
            let batch_index = self.state.batches_drawn;
            self.state.batches_drawn += 1;
            rounds += 1;
            // Data-parallel: each rank samples its share of the prompts, then every rank gets
            // every group (in batch order), so the rest of the step sees the whole batch.
            let local = self.train_batch_groups(batch_index, &params)?;
            for g in self.dist.all_gather_json(&local)?.into_iter().flatten() {
                drawn += 1;
                errors += g.reward_errors;
                if g.zero_variance() {
                    zero_groups += 1;
                    if filter {
                        continue;
                    }
                }
                groups.push(g);
            }
            if !filter || groups.len() >= want {
                break;
            }
            if rounds >= max_rounds {
                eprintln!(
                    "warning: step {step}: only {} of {want} groups with a reward spread after {rounds} generation \
                     rounds (algorithm.filter_groups.max_num_gen_batches); training on those",
                    groups.len()
                );
                break;
            }
        }
        groups.truncate(want);
        // DAPO may end with fewer groups than asked for; data-parallel, keep a multiple of the
        // world size so that every rank gets the same share of each mini-batch.
        let world = self.dist.world;
        groups.truncate(groups.len() - groups.len() % world);
        m.insert("timing_s/gen".into(), t_gen.elapsed().as_secs_f64());
        // Overlap: the next steps' batches go to the servers now, sampled while this one trains.
        self.generate_ahead(self.state.batches_drawn, &params)?;
        if let Some(oldest) = groups.iter().map(|g| g.policy_version).min() {
            let now = self.state.policy_version;
            let lags: Vec<f64> = groups
                .iter()
                .map(|g| now.saturating_sub(g.policy_version) as f64)
                .collect();
            m.insert("rollout/policy_version".into(), oldest as f64);
            m.insert(
                "rollout/policy_lag_mean".into(),
                lags.iter().sum::<f64>() / lags.len() as f64,
            );
            m.insert(
                "rollout/policy_lag_max".into(),
                lags.iter().copied().fold(0.0, f64::max),
            );
        }
        m.insert("batch/zero_adv_groups".into(), zero_groups as f64);
        m.insert(
            "batch/zero_adv_groups_frac".into(),
            zero_groups as f64 / drawn.max(1) as f64,
        );
        m.insert("batch/groups".into(), groups.len() as f64);
        m.insert("batch/gen_rounds".into(), rounds as f64);
        m.insert("reward/errors".into(), errors as f64);
        if groups.is_empty() {
            eprintln!("warning: step {step}: no usable prompt groups; skipping the update");
            m.insert("batch/skipped_update".into(), 1.0);
            m.insert("timing_s/step".into(), t_step.elapsed().as_secs_f64());
            return Ok(m);
        }

        // Flatten: row i = group i / n, sample i % n.
        let samples: Vec<&Sample> = groups.iter().flat_map(|g| g.samples.iter()).collect();
        let scores: Vec<f64> = groups
            .iter()
            .flat_map(|g| g.scores.iter().copied())
            .collect();
        let index: Vec<i64> = groups
            .iter()
            .enumerate()
            .flat_map(|(gi, g)| std::iter::repeat_n(gi as i64, g.samples.len()))
            .collect();
        let device = self.model.device();
        let rows: Vec<(&[i64], &[i64], &[f32])> = samples
            .iter()
            .map(|s| {
                (
                    s.prompt_ids.as_slice(),
                    s.completion_ids.as_slice(),
                    s.completion_logprobs.as_slice(),
                )
            })
            .collect();
        let mut batch = Batch::new(&rows, self.pad_id, device);
        if self.cfg.actor.shared_prefix {
            batch.share_prompts(&rows.iter().map(|r| r.0).collect::<Vec<_>>());
        }
        let nrows = batch.rows;

        // Response / prompt statistics.
        let resp_len: Vec<f64> = samples
            .iter()
            .map(|s| s.completion_ids.len() as f64)
            .collect();
        let prompt_len: Vec<f64> = samples.iter().map(|s| s.prompt_ids.len() as f64).collect();
        put_mmm(&mut m, "response_length", &resp_len);
        put_mmm(&mut m, "prompt_length", &prompt_len);
        let clipped = samples
            .iter()
            .filter(|s| s.finish == Finish::Length)
            .count() as f64
            / nrows as f64;
        m.insert("response_length/clip_ratio".into(), clipped);
        if clipped == 1.0 && self.warned.insert("no_eos") {
            eprintln!(
                "warning: step {step}: no response ended within data.max_response_length = {} tokens (does the model \
                 emit EOS? are rollout.stop strings reachable?)",
                self.cfg.data.max_response_length
            );
        }
        put_mmm(&mut m, "critic/score", &scores);
        let mut reward_acc = MetricAcc::default();
        for g in &groups {
            for rm in &g.reward_metrics {
                for (k, v) in rm {
                    reward_acc.add(&format!("reward/{k}"), *v, 1.0);
                }
            }
        }
        reward_acc.finish(&mut m);

        // 2. The mini/micro-batch partition of the first epoch; old logprobs use exactly these
        // micro-batches so that the first update sees ratio == 1 bitwise.
        let mini = self.cfg.actor.ppo_mini_batch_size * n;
        let micro = self
            .cfg
            .actor
            .ppo_micro_batch_size_per_gpu
            .unwrap_or(mini / world)
            .min(mini / world);
        let partition = Partition {
            rows: nrows,
            mini,
            micro,
            shuffle: self.cfg.actor.shuffle,
            seed: mix(self.cfg.trainer.seed, step as u64, 0x7368_7566),
            rank: self.dist.rank,
            world,
        };
        let first = partition.parts(0);
        let temperature = self.cfg.rollout.temperature;
        // Each rank computes its micro-batches' rows; the sum over ranks fills the others'.
        let logprobs_of = |model: &temper_model::CausalLm, dist: &Dist| -> Result<Tensor> {
            let out = Tensor::zeros([nrows as i64, batch.response_len], (Kind::Float, device));
            tch::no_grad(|| -> Result<()> {
                for idx in first.iter().flat_map(|mb| &mb.mine) {
                    let (lp, _) = batch.response_logprobs(model, idx, temperature)?;
                    let _ = out.shallow_clone().index_copy_(
                        0,
                        &Tensor::from_slice(idx).to(device),
                        &lp,
                    );
                }
                Ok(())
            })?;
            dist.sum_tensor(&out)?;
            Ok(out)
        };
        // With one mini-batch and one epoch the first (only) update sees the weights that sampled:
        // its own detached log-probs are the old ones, bitwise, so the separate forward is skipped
        // (unless something needs `old` before the update, or `check_on_policy` is to compare the
        // two passes).
        let rc_cfg = self.rollout_corr;
        let check_on_policy = self.cfg.trainer.check_on_policy;
        let reuse_first = !check_on_policy
            && !rc_cfg.bypass_mode
            && rc_cfg.rollout_is.is_none()
            && rc_cfg.rollout_rs.is_none()
            && self.kl_ctrl.is_none()
            && self.cfg.actor.ppo_epochs == 1
            && first.len() == 1;
        let t_old = Instant::now();
        let mut old = if rc_cfg.bypass_mode {
            Some(batch.rollout_logprobs.shallow_clone())
        } else if reuse_first {
            None
        } else {
            Some(logprobs_of(&self.model, &self.dist)?)
        };
        m.insert(
            "timing_s/old_log_prob".into(),
            t_old.elapsed().as_secs_f64(),
        );
        let t_ref = Instant::now();
        let reference = match &self.reference {
            Some(r) => Some(logprobs_of(r, &self.dist)?),
            None => None,
        };
        m.insert("timing_s/ref".into(), t_ref.elapsed().as_secs_f64());

        // 3. Rewards -> advantages; rollout-vs-trainer mismatch.
        let t_adv = Instant::now();
        let score_t = Tensor::from_slice(&scores).to_kind(Kind::Float).to(device);
        let mut token_rewards =
            temper_algo::advantage::outcome_to_token_rewards(&score_t, &batch.response_mask)?;
        if let (Some(ctrl), Some(r)) = (&mut self.kl_ctrl, &reference) {
            let kl: temper_algo::KlType = self
                .cfg
                .algorithm
                .kl_penalty
                .parse()
                .map_err(anyhow::Error::msg)
                .context("algorithm.kl_penalty")?;
            let (tr, km) = temper_algo::apply_kl_in_reward(
                &token_rewards,
                old.as_ref()
                    .expect("old log-probs are computed when KL is in the reward"),
                r,
                &batch.response_mask,
                kl,
                ctrl,
            )?;
            token_rewards = tr;
            m.extend(km.into_iter().map(|(k, v)| (k.to_string(), v)));
        }
        let seq_rewards: Vec<f64> = Vec::try_from(
            token_rewards
                .to_kind(Kind::Double)
                .sum_dim_intlist(-1, false, None::<Kind>)
                .to(tch::Device::Cpu),
        )?;
        put_mmm(&mut m, "critic/rewards", &seq_rewards);
        let advantages = temper_algo::compute_advantages(
            &self.adv_cfg,
            &token_rewards,
            &batch.response_mask,
            &index,
        )?
        .to_kind(Kind::Float);
        let adv_rows = to_rows(&advantages);
        let mask_rows = to_rows(&batch.response_mask);
        let valid_adv: Vec<f64> = adv_rows
            .iter()
            .zip(&mask_rows)
            .flat_map(|(a, mk)| {
                a.iter()
                    .zip(mk)
                    .filter(|(_, m)| **m > 0.0)
                    .map(|(a, _)| *a)
                    .collect::<Vec<_>>()
            })
            .collect();
        put_mmm(&mut m, "critic/advantages", &valid_adv);
        let mut response_mask = batch.response_mask.shallow_clone();
        let mut is_weights = None;
        if let (false, Some(old)) = (rc_cfg.bypass_mode, &old) {
            let rc = temper_algo::rollout_correction(
                old,
                &batch.rollout_logprobs,
                &batch.response_mask,
                &self.rollout_corr,
            )?;
            m.extend(rc.metrics.into_iter().map(|(k, v)| (k.to_string(), v)));
            response_mask = rc.response_mask;
            is_weights = rc.rollout_is_weights;
        }
        m.insert("timing_s/adv".into(), t_adv.elapsed().as_secs_f64());

        // 4. Policy update.
        let t_upd = Instant::now();
        let lr = self.schedule.lr(step - 1);
        m.insert("actor/lr".into(), lr);
        if valid_adv.iter().all(|a| *a == 0.0) {
            eprintln!(
                "warning: step {step}: every advantage is zero (all {} groups have equal rewards); skipping the update",
                groups.len()
            );
            m.insert("batch/skipped_update".into(), 1.0);
        } else {
            m.insert("batch/skipped_update".into(), 0.0);
            if let Some(mut hook) = self.before_update.take() {
                hook(&self.params);
                self.before_update = Some(hook);
            }
            let recorded = self.update(
                step,
                &batch,
                &partition,
                first.clone(),
                old.as_ref(),
                reference.as_ref(),
                &advantages,
                &response_mask,
                is_weights.as_ref(),
                lr,
                &mut m,
            )?;
            if old.is_none() {
                old = recorded;
            }
        }
        m.insert("timing_s/update".into(), t_upd.elapsed().as_secs_f64());
        if m.get("batch/skipped_update") == Some(&0.0) {
            self.state.policy_version += 1;
            let t_sync = Instant::now();
            if self.maybe_sync_rollout_weights()? {
                m.insert(
                    "timing_s/weight_sync".into(),
                    t_sync.elapsed().as_secs_f64(),
                );
            }
        }
        let old = match old {
            Some(o) => o,
            None => logprobs_of(&self.model, &self.dist)?, // update skipped: the weights are unchanged
        };
        if reuse_first {
            let rc = temper_algo::rollout_correction(
                &old,
                &batch.rollout_logprobs,
                &batch.response_mask,
                &temper_algo::RolloutCorrection::default(),
            )?;
            m.extend(rc.metrics.into_iter().map(|(k, v)| (k.to_string(), v)));
        }
        if self.cfg.trainer.rollout_log_freq > 0
            && step.is_multiple_of(self.cfg.trainer.rollout_log_freq as usize)
        {
            self.write_rollouts(step, &groups, &adv_rows, &to_rows(&old), &seq_rewards)?;
        }
        let total_tokens: f64 = resp_len.iter().sum::<f64>() + prompt_len.iter().sum::<f64>();
        let secs = t_step.elapsed().as_secs_f64();
        m.insert("timing_s/step".into(), secs);
        m.insert("perf/tokens_per_s".into(), total_tokens / secs);
        m.insert(
            "perf/gen_tokens_per_s".into(),
            resp_len.iter().sum::<f64>() / m["timing_s/gen"].max(1e-9),
        );
        m.insert(
            "training/epoch".into(),
            self.order
                .batch(self.state.batches_drawn.saturating_sub(1))
                .0 as f64,
        );
        Ok(m)
    }

    fn write_rollouts(
        &self,
        step: usize,
        groups: &[Group],
        adv: &[Vec<f64>],
        old: &[Vec<f64>],
        seq_rewards: &[f64],
    ) -> Result<()> {
        let mut out = String::new();
        let mut row = 0;
        for (gi, g) in groups.iter().enumerate() {
            let ex = &self.train.examples[g.example];
            for (k, s) in g.samples.iter().enumerate() {
                let len = s.completion_ids.len();
                let line = json!({
                    "group": gi,
                    "example": g.example,
                    "sample": k,
                    "prompt": ex.prompt.text(),
                    "answer": ex.answer,
                    "completion": g.texts[k],
                    "score": g.scores[k],
                    "reward": seq_rewards[row],
                    "reward_metrics": g.reward_metrics[k],
                    "reward_error": g.reward_error_reasons[k],
                    "advantage": adv[row].first().copied().unwrap_or(0.0),
                    "policy_version": g.policy_version,
                    "finish": s.finish,
                    "prompt_ids": s.prompt_ids,
                    "completion_ids": s.completion_ids,
                    "rollout_logprobs": s.completion_logprobs,
                    "old_logprobs": old[row][..len],
                });
                out.push_str(&serde_json::to_string(&line)?);
                out.push('\n');
                row += 1;
            }
        }
        crate::rundir::write_atomic(&self.run.rollouts(step), out.as_bytes())
    }
}

/// Salt of the training sampling seeds (evaluation uses another).
pub(crate) const TRAIN_SEED_SALT: u64 = 0x0074_7261_696e;
