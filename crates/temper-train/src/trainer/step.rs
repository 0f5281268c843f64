//! One training step of a prompt + reward run, as six phases: draw and score the groups
//! (`draw.rs`), build the batch (`step_batch.rs`), the log-probs before the update and the
//! advantages (`advantages.rs`), the update (`update.rs`), then the step's logs. Environment
//! runs (`env.name`) take `env_step.rs` instead.
use super::batch::to_rows;
use super::partition::Partition;
use super::rollout::{mix, Group};
use super::stats::StepMetrics;
use super::step_batch::StepBatch;
use super::update::UpdateInputs;
use super::Trainer;
use anyhow::Result;
use serde_json::json;
use std::time::Instant;
use temper_rollout::SamplingParams;

impl Trainer {
    pub(crate) fn train_params(&self) -> SamplingParams {
        self.cfg
            .rollout
            .sampling_params(self.cfg.data.max_response_length)
    }

    /// One step (1-based `step`); returns its metrics. Each phase returns its values and its
    /// own metrics; this function only sequences them.
    pub(crate) fn train_step(&mut self, step: usize) -> Result<StepMetrics> {
        if self.env.is_some() {
            return self.env_step(step);
        }
        let t_step = Instant::now();
        let mut m = StepMetrics::new();

        // 1. Rollout and rewards. Overlap: the next steps' batches then go to the servers,
        // sampled while this one trains.
        let params = self.train_params();
        let t_gen = Instant::now();
        let drawn = self.draw_groups(step, &params)?;
        m.insert("timing_s/gen".into(), t_gen.elapsed().as_secs_f64());
        self.generate_ahead(self.state.batches_drawn, &params)?;
        m.extend(drawn.metrics(self.state.policy_version));
        let groups = drawn.groups;
        if groups.is_empty() {
            eprintln!("warning: step {step}: no usable prompt groups; skipping the update");
            m.insert("batch/skipped_update".into(), 1.0);
            m.insert("timing_s/step".into(), t_step.elapsed().as_secs_f64());
            return Ok(m);
        }

        // 2. The batch, and the micro-batches of the first update.
        let device = self.model.device();
        let sb = StepBatch::new(
            &groups,
            self.pad_id,
            device,
            self.cfg.actor.shared_prefix,
            self.cfg.model.use_remove_padding,
        );
        m.extend(sb.metrics(&groups));
        self.warn_if_no_eos(step, sb.clip_ratio);
        let partition = self.partition(step, sb.batch.rows);
        let first = partition.parts(0);

        // 3. Log-probs before the update, on the first update's micro-batches.
        let before = self.logprobs_before_update(&sb.batch, &first)?;
        m.extend(before.metrics.clone());

        // 4. Advantages.
        let adv = self.advantages(&sb, &before)?;
        m.extend(adv.metrics.clone());

        // 5. The update (skipped when every advantage is zero), then the weights to the servers.
        let t_upd = Instant::now();
        let lr = self.schedule.lr(step - 1);
        m.insert("actor/lr".into(), lr);
        let updated = !adv.valid.iter().all(|a| *a == 0.0);
        let mut recorded = None;
        if updated {
            if let Some(mut hook) = self.before_update.take() {
                hook(&self.params);
                self.before_update = Some(hook);
            }
            let input = UpdateInputs {
                batch: &sb.batch,
                partition: &partition,
                first: first.clone(),
                old: before.old.as_ref(),
                reference: before.reference.as_ref(),
                advantages: &adv.advantages,
                response_mask: &adv.response_mask,
                is_weights: adv.is_weights.as_ref(),
                lr,
            };
            recorded = self.update(step, input, &mut m)?;
        } else {
            eprintln!(
                "warning: step {step}: every advantage is zero (all {} groups have equal rewards); skipping the update",
                groups.len()
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

        // 6. The old log-probs for the logs: computed before, recorded by the first update, or,
        // with the update skipped, computed now (the weights did not change).
        let reused_first = before.reuses_first_update();
        let old = match before.old.or(recorded) {
            Some(o) => o,
            None => sb.batch.logprobs_by_parts(
                &self.model,
                &first,
                self.cfg.rollout.temperature,
                self.unembed_chunk(),
                &self.dist,
            )?,
        };
        if reused_first {
            // The rollout-vs-trainer mismatch metrics, which phase 4 could not compute yet.
            let rc = temper_algo::rollout_correction(
                &old,
                &sb.batch.rollout_logprobs,
                &sb.batch.response_mask,
                &temper_algo::RolloutCorrection::default(),
            )?;
            m.extend(rc.metrics.into_iter().map(|(k, v)| (k.to_string(), v)));
        }
        if self.cfg.trainer.rollout_log_freq > 0
            && step.is_multiple_of(self.cfg.trainer.rollout_log_freq as usize)
        {
            let adv_rows = to_rows(&adv.advantages);
            self.write_rollouts(step, &groups, &adv_rows, &to_rows(&old), &adv.seq_rewards)?;
        }
        let secs = t_step.elapsed().as_secs_f64();
        m.insert("timing_s/step".into(), secs);
        m.insert("perf/tokens_per_s".into(), sb.tokens() / secs);
        m.insert(
            "perf/gen_tokens_per_s".into(),
            sb.response_len.iter().sum::<f64>() / m["timing_s/gen"].max(1e-9),
        );
        m.insert(
            "training/epoch".into(),
            self.order
                .batch(self.state.batches_drawn.saturating_sub(1))
                .0 as f64,
        );
        Ok(m)
    }

    /// The mini/micro-batch split of a step's `rows` (`actor.ppo_mini_batch_size` groups per
    /// optimizer step, `actor.ppo_micro_batch_size_per_gpu` rows per forward on each rank).
    fn partition(&self, step: usize, rows: usize) -> Partition {
        let world = self.dist.world;
        let mini = self.cfg.actor.ppo_mini_batch_size * self.cfg.rollout.n;
        let micro = self
            .cfg
            .actor
            .ppo_micro_batch_size_per_gpu
            .unwrap_or(mini / world)
            .min(mini / world);
        Partition {
            rows,
            mini,
            micro,
            shuffle: self.cfg.actor.shuffle,
            seed: mix(self.cfg.trainer.seed, step as u64, 0x7368_7566),
            rank: self.dist.rank,
            world,
        }
    }

    /// Once per run: a warning when no response of a step ended before the length limit.
    fn warn_if_no_eos(&mut self, step: usize, clip_ratio: f64) {
        if clip_ratio == 1.0 && self.warned.insert("no_eos") {
            eprintln!(
                "warning: step {step}: no response ended within data.max_response_length = {} tokens (does the model \
                 emit EOS? are rollout.stop strings reachable?)",
                self.cfg.data.max_response_length
            );
        }
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
