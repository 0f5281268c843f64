//! Phase 3 of a step, whichever source played its episodes: the mini/micro-batch split, the log-probs
//! before the update (old policy, reference), the advantages, the update (skipped when every
//! advantage is zero), and the new weights to the rollout servers.
use super::advantages::StepAdvantages;
use super::partition::Partition;
use super::stats::StepMetrics;
use super::step_batch::StepBatch;
use super::update::UpdateInputs;
use super::Trainer;
use anyhow::Result;
use std::time::Instant;
use tch::Tensor;
use temper_base::seed::mix;

/// What a step's learning phase leaves for its logs.
pub(super) struct Learned {
    /// (N, R) log-probs of the policy that sampled, computed before the update or recorded by its
    /// first pass; `None` when neither happened (the update was skipped and `need_old` was not
    /// set).
    pub old: Option<Tensor>,
    pub adv: StepAdvantages,
}

impl Trainer {
    /// Trains on the step's batch (`mini` responses per optimizer step, all ranks together)
    /// with the advantages its environment set, or else from its rewards; adds the phases'
    /// metrics to `m`. With `need_old`, the old log-probs are computed after a skipped update if
    /// nothing computed them before.
    pub(super) fn learn(
        &mut self,
        step: usize,
        sb: &StepBatch,
        mini: usize,
        need_old: bool,
        m: &mut StepMetrics,
    ) -> Result<Learned> {
        let batch = &sb.batch;
        let partition = self.partition(step, batch.rows, mini);
        let first = partition.parts(0);

        // Log-probs before the update, on the first update's micro-batches.
        let before = self
            .learner
            .logprobs_before_update(&self.dist, batch, &first)?;
        m.extend(before.metrics.clone());

        let adv = match &sb.given_advantages {
            None => self.learner.advantages(sb, &before)?,
            Some(advantages) => {
                self.learner
                    .given_advantages(batch, &before, advantages.shallow_clone())?
            }
        };
        m.extend(adv.metrics.clone());

        // The update (skipped when every advantage is zero), then the weights to the servers.
        let t_upd = Instant::now();
        let lr = self.learner.schedule.lr(step - 1);
        m.insert("actor/lr".into(), lr);
        let updated = !adv.valid.iter().all(|a| *a == 0.0);
        let mut recorded = None;
        if updated {
            if let Some(mut hook) = self.before_update.take() {
                hook(&self.learner.params);
                self.before_update = Some(hook);
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
            recorded = self.learner.update(&self.dist, step, input, m)?;
        } else {
            eprintln!(
                "warning: step {step}: every advantage is zero (all {} groups have equal rewards); skipping the update",
                batch.rows / self.rollouts.cfg.n.max(1)
            );
        }
        m.insert(
            "batch/skipped_update".into(),
            if updated { 0.0 } else { 1.0 },
        );
        m.insert("timing_s/update".into(), t_upd.elapsed().as_secs_f64());
        if updated {
            self.state.policy_version += 1;
            let t_sync = Instant::now();
            if self.maybe_sync_rollout_weights()? {
                m.insert(
                    "timing_s/weight_sync".into(),
                    t_sync.elapsed().as_secs_f64(),
                );
            }
        }
        let reused_first = before.reuses_first_update();
        let mut old = before.old.or(recorded);
        if old.is_none() && need_old {
            // The update was skipped: the weights did not change, so these are the old ones.
            old = Some(batch.logprobs_by_parts(
                &self.learner.model,
                &first,
                self.learner.settings.temperature,
                self.unembed_chunk(),
                &self.dist,
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
        Ok(Learned { old, adv })
    }

    /// The mini/micro-batch split of a step's `rows`: `mini` responses per optimizer step (all
    /// ranks), `actor.ppo_micro_batch_size_per_gpu` rows per forward on each rank (at most a
    /// rank's share of a mini-batch).
    fn partition(&self, step: usize, rows: usize, mini: usize) -> Partition {
        let world = self.dist.world;
        let share = mini.div_ceil(world).max(1);
        let micro = self
            .learner
            .settings
            .actor
            .ppo_micro_batch_size_per_gpu
            .unwrap_or(share)
            .min(share);
        Partition {
            rows,
            mini,
            micro,
            shuffle: self.learner.settings.actor.shuffle,
            seed: mix(self.trainer_cfg.seed, step as u64, 0x7368_7566),
            rank: self.dist.rank,
            world,
        }
    }
}
