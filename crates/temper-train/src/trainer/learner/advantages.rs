//! The Learner's log-probs before the update (old policy, reference), then the
//! rewards turned into per-token advantages (`algorithm.adv_estimator`, with the KL penalty in
//! the reward when `algorithm.use_kl_in_reward`) and the rollout-vs-trainer correction
//! (`algorithm.rollout_correction`: importance weights, rejection masks, mismatch metrics). The
//! one home of the estimate: an environment's one-turn answers get theirs here too.
use super::partition::MiniBatch;
use super::{Learner, Reference};
use crate::dist::Dist;
use crate::trainer::batch::{to_rows, Batch};
use crate::trainer::stats::{put_mmm, StepMetrics};
use crate::trainer::step_batch::StepBatch;
use anyhow::Result;
use std::time::Instant;
use tch::{Kind, Tensor};
use temper_env::Datum;

/// The log-probs a step has before its update.
pub(crate) struct BeforeUpdate {
    /// (N, R) f32, the policy that sampled (or the rollout's own in bypass mode). `None` when
    /// the first update's own detached log-probs serve (one mini-batch, one epoch, nothing needs
    /// them earlier): they are the same numbers, bitwise, without a second forward.
    pub old: Option<Tensor>,
    /// (N, R) f32 under the frozen reference model, when there is one.
    pub reference: Option<Tensor>,
    /// `timing_s/old_log_prob`, `timing_s/ref`.
    pub metrics: StepMetrics,
}

impl BeforeUpdate {
    pub fn reuses_first_update(&self) -> bool {
        self.old.is_none()
    }
}

/// A step's per-token advantages and what goes with them into the loss.
pub(crate) struct StepAdvantages {
    /// (N, R) f32, 0 on padding.
    pub advantages: Tensor,
    /// (N, R) f32: the loss mask (the response mask, less the tokens rollout rejection sampling
    /// drops).
    pub response_mask: Tensor,
    /// (N, R) f32 rollout importance weights (`rollout_is`), if any.
    pub is_weights: Option<Tensor>,
    /// Per row: the sequence reward (the score, less the KL penalty when it is in the reward);
    /// empty for advantages an environment gave.
    pub seq_rewards: Vec<f64>,
    /// The advantages at response tokens (all zero: nothing to learn from).
    pub valid: Vec<f64>,
    /// `critic/rewards/*`, `critic/advantages/*`, the KL controller's and rollout correction's
    /// metrics, `timing_s/adv`.
    pub metrics: StepMetrics,
}

impl Learner {
    /// Phase 3, first: old log-probs (unless the first update's own serve) and reference log-probs,
    /// computed on `first`, the first update's micro-batches, so that with `check_on_policy` the
    /// update can be asked to reproduce them bitwise.
    pub(super) fn logprobs_before_update(
        &self,
        dist: &Dist,
        batch: &Batch,
        first: &[MiniBatch],
    ) -> Result<BeforeUpdate> {
        let rc = self.rollout_corr;
        let reuse_first = !self.settings.check_on_policy
            && !rc.bypass_mode
            && rc.rollout_is.is_none()
            && rc.rollout_rs.is_none()
            && self.kl_ctrl.is_none()
            && self.settings.actor.ppo_epochs == 1
            && first.len() == 1;
        let temperature = self.settings.temperature;
        let mut metrics = StepMetrics::new();
        let t_old = Instant::now();
        let old = if rc.bypass_mode {
            Some(batch.rollout_logprobs.shallow_clone())
        } else if reuse_first {
            None
        } else {
            Some(batch.logprobs_by_parts(
                &self.model,
                first,
                temperature,
                self.unembed_chunk(),
                dist,
                self.optimizer.is_sharded(),
            )?)
        };
        metrics.insert(
            "timing_s/old_log_prob".into(),
            t_old.elapsed().as_secs_f64(),
        );
        let t_ref = Instant::now();
        let chunk = self.unembed_chunk();
        let reference = match &self.reference {
            Some(Reference::Model(r)) => {
                Some(batch.logprobs_by_parts(r, first, temperature, chunk, dist, false)?)
            }
            Some(Reference::PolicyBase) => Some(temper_model::without_adapters(|| {
                let sharded = self.optimizer.is_sharded();
                batch.logprobs_by_parts(&self.model, first, temperature, chunk, dist, sharded)
            })?),
            None => None,
        };
        metrics.insert("timing_s/ref".into(), t_ref.elapsed().as_secs_f64());
        Ok(BeforeUpdate {
            old,
            reference,
            metrics,
        })
    }

    /// Phase 3, then: scores -> token rewards (KL penalty in the reward, if configured) -> advantages
    /// (grouped by `sb.index`), and the rollout correction against the old log-probs.
    pub(super) fn advantages(
        &mut self,
        sb: &StepBatch,
        before: &BeforeUpdate,
    ) -> Result<StepAdvantages> {
        let t_adv = Instant::now();
        let mut m = StepMetrics::new();
        let batch = &sb.batch;
        let score_t = Tensor::from_slice(&sb.scores)
            .to_kind(Kind::Float)
            .to(batch.response_mask.device());
        let mut token_rewards =
            temper_algo::advantage::outcome_to_token_rewards(&score_t, &batch.response_mask)?;
        if let (Some(ctrl), Some(r)) = (&mut self.kl_ctrl, &before.reference) {
            let kl = self.settings.kl_penalty;
            let (tr, km) = temper_algo::apply_kl_in_reward(
                &token_rewards,
                before
                    .old
                    .as_ref()
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
        let advantages = self.estimate(&token_rewards, &batch.response_mask, &sb.index)?;
        let valid = valid_values(&advantages, &batch.response_mask);
        put_mmm(&mut m, "critic/advantages", &valid);
        let (response_mask, is_weights) = self.correct_rollout(batch, before, &mut m)?;
        m.insert("timing_s/adv".into(), t_adv.elapsed().as_secs_f64());
        Ok(StepAdvantages {
            advantages,
            response_mask,
            is_weights,
            seq_rewards,
            valid,
            metrics: m,
        })
    }

    /// `algorithm.adv_estimator` over per-token rewards (N, R), each row's baseline its
    /// question's rows (`index`): the one estimate of both sources' answers, (N, R) f32.
    fn estimate(&self, token_rewards: &Tensor, mask: &Tensor, index: &[i64]) -> Result<Tensor> {
        let advantages =
            temper_algo::compute_advantages(&self.adv_cfg, token_rewards, mask, index)?;
        Ok(advantages.to_kind(Kind::Float))
    }

    /// An environment's one-turn groups (per question, its answers' datums): every sampled
    /// token of an answer gets the answer's advantage, [`Learner::estimate`] over the datums'
    /// rewards with one group per question, as a prompt run's answers get theirs (the
    /// environment's datums carry the advantages into its logs and batch).
    pub(crate) fn one_turn_advantages(&self, groups: &mut [Vec<Datum>]) -> Result<()> {
        let datums: Vec<&Datum> = groups.iter().flatten().collect();
        if datums.is_empty() {
            return Ok(());
        }
        let scores: Vec<f64> = datums.iter().map(|d| d.reward).collect();
        let index: Vec<i64> = groups
            .iter()
            .enumerate()
            .flat_map(|(gi, g)| std::iter::repeat_n(gi as i64, g.len()))
            .collect();
        let lens: Vec<usize> = datums.iter().map(|d| d.completion_tokens.len()).collect();
        let r = lens.iter().copied().max().unwrap_or(1).max(1);
        let mask_rows: Vec<f32> = lens
            .iter()
            .flat_map(|&l| (0..r).map(move |j| if j < l { 1.0 } else { 0.0 }))
            .collect();
        let mask = Tensor::from_slice(&mask_rows).view([lens.len() as i64, r as i64]);
        let score_t = Tensor::from_slice(&scores).to_kind(Kind::Float);
        let token_rewards = temper_algo::advantage::outcome_to_token_rewards(&score_t, &mask)?;
        let adv_rows = to_rows(&self.estimate(&token_rewards, &mask, &index)?);
        for (d, row) in groups.iter_mut().flatten().zip(adv_rows) {
            let a = row[0] as f32;
            for (x, &m) in d.completion_advantages.iter_mut().zip(&d.completion_mask) {
                *x = if m == 1 { a } else { 0.0 };
            }
        }
        Ok(())
    }

    /// Advantages an environment gave (`advantages`, (N, R) f32; the batch's response mask is
    /// their loss mask), with the rollout correction against the old log-probs as for scores.
    pub(super) fn given_advantages(
        &self,
        batch: &Batch,
        before: &BeforeUpdate,
        advantages: Tensor,
    ) -> Result<StepAdvantages> {
        let mut m = StepMetrics::new();
        let valid = valid_values(&advantages, &batch.response_mask);
        put_mmm(&mut m, "critic/advantages", &valid);
        let (response_mask, is_weights) = self.correct_rollout(batch, before, &mut m)?;
        Ok(StepAdvantages {
            advantages,
            response_mask,
            is_weights,
            seq_rewards: vec![],
            valid,
            metrics: m,
        })
    }

    /// `algorithm.rollout_correction` against the old log-probs, when they were computed before
    /// the update (not in bypass mode): the loss mask less the rejected tokens, the importance
    /// weights, and the mismatch metrics (into `m`). Otherwise the response mask, no weights.
    fn correct_rollout(
        &self,
        batch: &Batch,
        before: &BeforeUpdate,
        m: &mut StepMetrics,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let (false, Some(old)) = (self.rollout_corr.bypass_mode, &before.old) else {
            return Ok((batch.response_mask.shallow_clone(), None));
        };
        let rc = temper_algo::rollout_correction(
            old,
            &batch.rollout_logprobs,
            &batch.response_mask,
            &self.rollout_corr,
        )?;
        m.extend(rc.metrics.into_iter().map(|(k, v)| (k.to_string(), v)));
        Ok((rc.response_mask, rc.rollout_is_weights))
    }
}

/// The advantages at response tokens (mask > 0), row by row.
fn valid_values(advantages: &Tensor, mask: &Tensor) -> Vec<f64> {
    to_rows(advantages)
        .iter()
        .zip(&to_rows(mask))
        .flat_map(|(a, mask)| {
            a.iter()
                .zip(mask)
                .filter(|(_, m)| **m > 0.0)
                .map(|(a, _)| *a)
                .collect::<Vec<_>>()
        })
        .collect()
}
