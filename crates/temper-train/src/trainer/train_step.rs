//! One training step: episodes from the run's source (a prompt + reward run's groups, drawn and
//! scored here; an environment's episodes, `env_step.rs`), then the learning both share
//! (`learn.rs`: the log-probs before the update and the advantages, `advantages.rs`; the update,
//! `update.rs`), then the source's logs.
use super::batch::to_rows;
use super::learn::AdvantageSource;
use super::rollout::Group;
use super::stats::StepMetrics;
use super::step_batch::StepBatch;
use super::Trainer;
use anyhow::Result;
use serde_json::json;
use std::time::Instant;
use temper_rollout::SamplingParams;

impl Trainer {
    pub(crate) fn rollout_params(&self) -> SamplingParams {
        self.cfg
            .rollout
            .sampling_params(self.cfg.data.max_response_length)
    }

    /// One step (1-based `step`); returns its metrics. The episodes come from the run's source
    /// (prompt groups drawn and scored, or an environment's episodes, `env_step.rs`); learning
    /// from them is the same for both (`learn.rs`); each source writes its own logs.
    pub(crate) fn train_step(&mut self, step: usize) -> Result<StepMetrics> {
        let t_step = Instant::now();
        let mut m = StepMetrics::new();
        let tokens = if self.env.is_some() {
            self.env_step(step, &mut m)?
        } else {
            self.prompt_step(step, &mut m)?
        };
        let secs = t_step.elapsed().as_secs_f64();
        m.insert("timing_s/step".into(), secs);
        if let Some(tokens) = tokens {
            m.insert("perf/tokens_per_s".into(), tokens / secs);
        }
        m.insert(
            "training/epoch".into(),
            self.order
                .batch(self.state.batches_drawn.saturating_sub(1))
                .0 as f64,
        );
        Ok(m)
    }

    /// A step of a prompt + reward run: draw and score the groups (`draw_groups.rs`), build the batch
    /// (`step_batch.rs`), learn (advantages from the scores), write the rollouts. Returns the
    /// batch's prompt and response tokens (`None` when no group was usable).
    fn prompt_step(&mut self, step: usize, m: &mut StepMetrics) -> Result<Option<f64>> {
        // 1. Rollout and rewards. Overlap: the next steps' batches then go to the servers,
        // sampled while this one trains.
        let params = self.rollout_params();
        let t_gen = Instant::now();
        let drawn = self.draw_groups(step, &params)?;
        let gen_s = t_gen.elapsed().as_secs_f64();
        m.insert("timing_s/gen".into(), gen_s);
        self.generate_ahead(self.state.batches_drawn, &params)?;
        m.extend(drawn.metrics(self.state.policy_version));
        let groups = drawn.groups;
        if groups.is_empty() {
            eprintln!("warning: step {step}: no usable prompt groups; skipping the update");
            m.insert("batch/skipped_update".into(), 1.0);
            return Ok(None);
        }

        // 2. The batch.
        let device = self.learner.model.device();
        let sb = StepBatch::new(
            &groups,
            self.pad_id,
            device,
            self.cfg.actor.shared_prefix,
            self.cfg.model.use_remove_padding,
        );
        m.extend(sb.metrics(&groups));
        self.warn_if_no_eos(step, sb.clip_ratio);

        // 3. Learn: `actor.ppo_mini_batch_size` groups per optimizer step.
        let mini = self.cfg.actor.ppo_mini_batch_size * self.cfg.rollout.n;
        let learned = self.learn(step, &sb.batch, mini, AdvantageSource::Scores(&sb), true, m)?;

        // 4. The rollouts with their old log-probs.
        if self.cfg.trainer.rollout_log_freq > 0
            && step.is_multiple_of(self.cfg.trainer.rollout_log_freq as usize)
        {
            let old = learned
                .old
                .as_ref()
                .expect("learn computes the old log-probs");
            let adv_rows = to_rows(&learned.adv.advantages);
            self.write_rollouts(
                step,
                &groups,
                &adv_rows,
                &to_rows(old),
                &learned.adv.seq_rewards,
            )?;
        }
        m.insert(
            "perf/gen_tokens_per_s".into(),
            sb.response_len.iter().sum::<f64>() / gen_s.max(1e-9),
        );
        Ok(Some(sb.tokens()))
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
