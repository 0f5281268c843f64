//! Phase 3 of a step, whichever source played its episodes, on the [`Learner`]: the
//! mini/micro-batch split, the log-probs before the update (old policy, reference), the
//! advantages, and the update (skipped when every advantage is zero).
use super::advantages::StepAdvantages;
use super::partition::Partition;
use super::update::UpdateInputs;
use super::Learner;
use crate::dist::Dist;
use crate::trainer::stats::StepMetrics;
use crate::trainer::step_batch::StepBatch;
use crate::trainer::ParamsHook;
use anyhow::Result;
use std::time::Instant;
use tch::Tensor;
use temper_base::seed::mix;

/// What a step's learning phase leaves for its logs.
pub(crate) struct Learned {
    /// (N, R) log-probs of the policy that sampled, computed before the update or recorded by its
    /// first pass; `None` when neither happened (the update was skipped and `need_old` was not
    /// set).
    pub old: Option<Tensor>,
    pub adv: StepAdvantages,
    /// Whether the optimizer stepped (a new policy version for the samplers).
    pub updated: bool,
}

impl Learner {
    /// Trains on the step's batch (`sb.learning.mini` responses per optimizer step, all ranks
    /// together) with the advantages its environment set, or else from its rewards; adds the
    /// phases' metrics to `m`. With `sb.learning.need_old`, the old log-probs are computed after
    /// a skipped update if nothing computed them before. `before_update` (a test seam) sees the
    /// parameters between the log-probs before the update and the update.
    pub(crate) fn learn(
        &mut self,
        dist: &Dist,
        step: usize,
        sb: &StepBatch,
        before_update: Option<&mut ParamsHook>,
        m: &mut StepMetrics,
    ) -> Result<Learned> {
        let batch = &sb.batch;
        let partition = self.partition(dist, step, batch.rows, sb.learning.mini);
        let first = partition.parts(0);

        // Log-probs before the update, on the first update's micro-batches.
        let before = self.logprobs_before_update(dist, batch, &first)?;
        m.extend(before.metrics.clone());

        let adv = match &sb.given_advantages {
            None => self.advantages(sb, &before)?,
            Some(advantages) => {
                self.given_advantages(batch, &before, advantages.shallow_clone())?
            }
        };
        m.extend(adv.metrics.clone());

        // The update, skipped when every advantage is zero.
        let t_upd = Instant::now();
        let lr = self.schedule.lr(step - 1);
        m.insert("actor/lr".into(), lr);
        let updated = !adv.valid.iter().all(|a| *a == 0.0);
        let mut recorded = None;
        if updated {
            if let Some(hook) = before_update {
                hook(&self.params);
            }
            let input = UpdateInputs {
                batch,
                partition: &partition,
                first: first.clone(),
                old: before.old.as_ref(),
                reference: before.reference.as_ref(),
                advantages: &adv.advantages,
                response_mask: &adv.response_mask,
                is_weights: adv.is_weights.as_ref(),
                lr,
            };
            recorded = self.update(dist, step, input, m)?;
        } else {
            let groups = sb.index.last().map_or(0, |&g| g + 1);
            eprintln!(
                "warning: step {step}: every advantage is zero (all {groups} groups have equal rewards); skipping the update"
            );
        }
        m.insert(
            "batch/skipped_update".into(),
            if updated { 0.0 } else { 1.0 },
        );
        m.insert("timing_s/update".into(), t_upd.elapsed().as_secs_f64());
        let reused_first = before.reuses_first_update();
        let mut old = before.old.or(recorded);
        if old.is_none() && sb.learning.need_old {
            // The update was skipped: the weights did not change, so these are the old ones.
            old = Some(batch.logprobs_by_parts(
                &self.model,
                &first,
                self.settings.temperature,
                self.unembed_chunk(),
                dist,
                self.optimizer.is_sharded(),
            )?);
        }
        if let (true, Some(old)) = (reused_first, &old) {
            // The rollout-vs-trainer mismatch metrics, which the advantages could not compute
            // before the update recorded the old log-probs.
            let rc = temper_algo::rollout_correction(
                old,
                &batch.rollout_logprobs,
                &batch.response_mask,
                &temper_algo::RolloutCorrection::default(),
            )?;
            m.extend(rc.metrics.into_iter().map(|(k, v)| (k.to_string(), v)));
        }
        Ok(Learned { old, adv, updated })
    }

    /// The mini/micro-batch split of a step's `rows`: `mini` responses per optimizer step (all
    /// ranks), `actor.ppo_micro_batch_size_per_gpu` rows per forward on each rank (at most a
    /// rank's share of a mini-batch).
    fn partition(&self, dist: &Dist, step: usize, rows: usize, mini: usize) -> Partition {
        let world = dist.world;
        let share = mini.div_ceil(world).max(1);
        let actor = &self.settings.actor;
        let micro = actor
            .ppo_micro_batch_size_per_gpu
            .unwrap_or(share)
            .min(share);
        Partition {
            rows,
            mini,
            micro,
            shuffle: actor.shuffle,
            seed: mix(self.settings.seed, step as u64, 0x7368_7566),
            rank: dist.rank,
            world,
            device: self.model.device(),
        }
    }
}
