//! One training step, as phases read top to bottom in [`Trainer::train_step`]: draw the
//! questions, roll them out and score them (a prompt + reward run's groups, drawn and scored in
//! `draw_groups.rs`; an environment's episodes, `env_step.rs`); the batch; the advantages, the
//! update and the weight sync, which both sources share (`learn.rs`, `advantages.rs`,
//! `update.rs`); the step's logs.
use super::batch::{to_rows, Batch};
use super::env_step::EnvEpisodes;
use super::learn::{AdvantageSource, Learned};
use super::rollout::Group;
use super::stats::StepMetrics;
use super::step_batch::StepBatch;
use super::Trainer;
use anyhow::Result;
use serde_json::json;
use std::time::Instant;
use tch::Tensor;
use temper_rollout::SamplingParams;

impl Trainer {
    pub(crate) fn rollout_params(&self) -> SamplingParams {
        self.cfg
            .rollout
            .sampling_params(self.cfg.data.max_response_length)
    }

    /// One step (1-based `step`); returns its metrics. The phases, in order: draw the step's
    /// questions, roll them out and score them (a prompt run's groups, `draw_groups.rs`; an
    /// environment's episodes, `env_step.rs`); the batch; the advantages, the update and the
    /// weight sync (`learn.rs`); the step's logs.
    pub(crate) fn train_step(&mut self, step: usize) -> Result<StepMetrics> {
        let t_step = Instant::now();
        let mut m = StepMetrics::new();
        // 1. Draw, roll out, score.
        let episodes = match self.env.is_some() {
            true => Episodes::Env(self.env_episodes(step, &mut m)?),
            false => Episodes::Prompts(self.prompt_groups(step, &mut m)?),
        };
        // 2. The batch (none: nothing to learn from this step).
        let batch = match &episodes {
            Episodes::Prompts(groups) => self.prompt_batch(step, groups, &mut m).map(Built::Prompt),
            Episodes::Env(env) => self
                .env_batch(step, env, &mut m)?
                .map(|(b, a)| Built::Env(b, a)),
        };
        // 3. Advantages, the update, the new weights to the samplers.
        let learned = match &batch {
            Some(Built::Prompt(sb)) => {
                let mini = self.cfg.actor.ppo_mini_batch_size * self.cfg.rollout.n;
                let advantages = AdvantageSource::Scores(sb);
                Some(self.learn(step, &sb.batch, mini, advantages, true, &mut m)?)
            }
            // One mini-batch of every datum; data-parallel, each rank takes its share (the datum
            // count varies with the verdicts, so shares may differ by one row).
            Some(Built::Env(b, advantages)) => {
                let advantages = AdvantageSource::Given(advantages.shallow_clone());
                Some(self.learn(step, b, b.rows, advantages, false, &mut m)?)
            }
            None => None,
        };
        // 4. Logs.
        let tokens = match (&episodes, &batch) {
            (Episodes::Prompts(groups), Some(Built::Prompt(sb))) => {
                let learned = learned.as_ref().expect("learn ran on the batch");
                Some(self.prompt_logs(step, groups, sb, learned, &mut m)?)
            }
            (Episodes::Prompts(_), _) => None,
            (Episodes::Env(env), built) => {
                let batch = match built {
                    Some(Built::Env(b, _)) => Some(b),
                    _ => None,
                };
                self.env_logs(step, env, batch, &mut m)?;
                None
            }
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

    /// Phase 1 of a prompt + reward run: the step's groups drawn, sampled and scored
    /// (`draw_groups.rs`); overlap sends the next steps' batches to the servers, sampled while
    /// this one trains.
    fn prompt_groups(&mut self, step: usize, m: &mut StepMetrics) -> Result<PromptGroups> {
        let params = self.rollout_params();
        let t_gen = Instant::now();
        let drawn = self.draw_groups(step, &params)?;
        let gen_s = t_gen.elapsed().as_secs_f64();
        m.insert("timing_s/gen".into(), gen_s);
        self.generate_ahead(self.state.batches_drawn, &params)?;
        m.extend(drawn.metrics(self.state.policy_version));
        Ok(PromptGroups {
            groups: drawn.groups,
            gen_s,
        })
    }

    /// Phase 2 of a prompt run: the groups as one batch (`step_batch.rs`), whose advantages come
    /// from their scores; none when no group was usable.
    fn prompt_batch(
        &mut self,
        step: usize,
        groups: &PromptGroups,
        m: &mut StepMetrics,
    ) -> Option<StepBatch> {
        if groups.groups.is_empty() {
            eprintln!("warning: step {step}: no usable prompt groups; skipping the update");
            m.insert("batch/skipped_update".into(), 1.0);
            return None;
        }
        let sb = StepBatch::new(
            &groups.groups,
            self.pad_id,
            self.learner.model.device(),
            self.cfg.actor.shared_prefix,
            self.cfg.model.use_remove_padding,
        );
        m.extend(sb.metrics(&groups.groups));
        self.warn_if_no_eos(step, sb.clip_ratio);
        Some(sb)
    }

    /// Phase 4 of a prompt run: the rollouts with their old log-probs (every
    /// `trainer.rollout_log_freq` steps). Returns the batch's prompt and response tokens.
    fn prompt_logs(
        &mut self,
        step: usize,
        groups: &PromptGroups,
        sb: &StepBatch,
        learned: &Learned,
        m: &mut StepMetrics,
    ) -> Result<f64> {
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
                &groups.groups,
                &adv_rows,
                &to_rows(old),
                &learned.adv.seq_rewards,
            )?;
        }
        m.insert(
            "perf/gen_tokens_per_s".into(),
            sb.response_len.iter().sum::<f64>() / groups.gen_s.max(1e-9),
        );
        Ok(sb.tokens())
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

/// A step's episodes, by the run's source.
enum Episodes {
    /// A prompt + reward run's groups.
    Prompts(PromptGroups),
    /// An environment's episodes, as datums.
    Env(EnvEpisodes),
}

/// A prompt run's groups.
pub(super) struct PromptGroups {
    groups: Vec<Group>,
    /// Seconds the rollouts took (for `perf/gen_tokens_per_s`).
    gen_s: f64,
}

/// A step's batch, by source: a prompt run's (advantages from its scores), or an environment's
/// datums with the advantages the environment set, (N, R) f32 over the batch's rows.
enum Built {
    Prompt(StepBatch),
    Env(Batch, Tensor),
}

/// Salt of the training sampling seeds (evaluation uses another).
pub(crate) const TRAIN_SEED_SALT: u64 = 0x0074_7261_696e;
