//! One training step, as phases read top to bottom in [`Trainer::train_step`]: the producer
//! (`producer/`) draws the questions, rolls them out and scores them, as per-question datums (a
//! prompt + reward run's groups, each answer a one-turn episode; an environment's episodes);
//! from there the consumer, one path for both: the batch (`step_batch.rs`), the advantages and
//! the update on the learner (`learner/`: `learn.rs`, `advantages.rs`, `update.rs`), the new weights
//! published to the producer's samplers; then the step's logs.
use super::batch::{to_rows, Batch};
use super::env_logs;
use super::learner::Learned;
use super::producer::{Played, PromptGroups, ServersSync, StepEpisodes};
use super::stats::{put_mmm, StepMetrics};
use super::step_batch::{AdvantageKind, Learning, StepBatch};
use super::Trainer;
use anyhow::{anyhow, bail, Result};
use std::time::Instant;
use tch::Kind;
use temper_env::{advantage_stats, Datum};

impl Trainer {
    /// [`Trainer::train_step`], under the profiler when it is the `--profile` step.
    pub(super) fn profiled_step(&mut self, step: usize) -> Result<StepMetrics> {
        if self.profile_step != Some(step) {
            return self.train_step(step);
        }
        let cuda = matches!(self.learner.model().device(), tch::Device::Cuda(_));
        let profile = temper_kernels::profiler::Profile::start(cuda)?;
        let m = self.train_step(step)?;
        let rank = match self.dist.rank {
            0 => String::new(),
            r => format!(".rank{r}"),
        };
        let path = self
            .run
            .root
            .join(format!("profile_step_{step}{rank}.json"));
        profile.save(&path)?;
        eprintln!("temper: step {step}'s profile is {}", path.display());
        Ok(m)
    }

    /// One step (1-based `step`); returns its metrics. The phases, in order: the producer draws
    /// the step's questions, rolls them out and scores them, as per-question datums (a prompt
    /// run's groups of one-turn episodes, `producer/draw_groups.rs`; an environment's episodes,
    /// `producer/env_step.rs`); then the consumer: their batch (`step_batch.rs`); the advantages
    /// and the update, on the learner (`learner/learn.rs`); the new weights published to the
    /// producer's samplers (`Producer::publish`); the step's logs.
    pub(crate) fn train_step(&mut self, step: usize) -> Result<StepMetrics> {
        let t_step = Instant::now();
        let mut m = StepMetrics::new();
        let decode_before = self.producer.decode_counts(self.learner.model());
        // Decoding done outside the step (evaluation) is not this step's.
        self.producer.forget_decode_work();
        // 1. The producer: draw, roll out, score.
        let mut episodes = self
            .producer
            .episodes(step, &self.learner, &mut self.state, &mut m)?;
        if let (Some(before), Some(after)) = (
            decode_before,
            self.producer.decode_counts(self.learner.model()),
        ) {
            let mut put = |k: &str, a: u64, b: u64| m.insert(k.into(), (a - b) as f64);
            put(
                "rollout/graph_replays",
                after.graph_replays,
                before.graph_replays,
            );
            put("rollout/eager_steps", after.eager_steps, before.eager_steps);
            put(
                "rollout/failed_graph_captures",
                after.failed_captures,
                before.failed_captures,
            );
        }
        self.producer.decode_metrics(&self.learner, &mut m);
        if let Played::Env {
            records,
            estimate_advantages,
        } = &mut episodes.source
        {
            // The episode records (debate_<k>.json, summary_<k>.json / baseline_<k>.json),
            // written before anything can stop the step, and let go.
            if self.dist.is_root() {
                env_logs::write_records(&self.run.root, step, records)?;
            }
            *records = Vec::new();
            // From here the consumer. A one-turn environment's advantages: the configured
            // estimator over each question's answers, on the whole batch (an estimator may
            // normalise over it); a debate's were set by the environment.
            let t_adv = Instant::now();
            if *estimate_advantages {
                self.learner.one_turn_advantages(&mut episodes.groups)?;
            }
            m.insert("timing_s/adv".into(), t_adv.elapsed().as_secs_f64());
        }
        // 2. The batch (none: nothing to learn from this step).
        let mut batch = self.step_batch(step, &episodes, &mut m)?;
        // 3. Advantages and the update (an environment run sampling ahead plays the next step's
        // episodes meanwhile).
        let plays_ahead = self.producer.plays_episodes()
            && self.producer.async_steps() > 0
            && step < self.fit_end;
        let learned = match batch.take() {
            Some(sb) if plays_ahead => {
                let (learned, sb) = self.learn_while_playing(step, sb, &mut m)?;
                batch = Some(sb);
                Some(learned)
            }
            Some(sb) => {
                let learned = self.learner.learn(
                    &self.dist,
                    step,
                    &sb,
                    self.before_update.as_mut(),
                    &mut m,
                )?;
                batch = Some(sb);
                Some(learned)
            }
            None => None,
        };
        // 4. After an update, the new weights published to the producer's samplers.
        if learned.as_ref().is_some_and(|l| l.updated) {
            self.state.policy_version += 1;
            let t_sync = Instant::now();
            let synced = self.producer.publish(
                &self.learner,
                &self.run.root,
                self.state.policy_version,
                ServersSync::Every,
            )?;
            if synced.servers {
                m.insert(
                    "timing_s/weight_sync".into(),
                    t_sync.elapsed().as_secs_f64(),
                );
            }
            if let Some(push) = synced.push_s {
                m.insert("timing_s/weight_push".into(), push);
            }
            if step < self.fit_end {
                self.producer.stream_ahead(self.state.batches_drawn + 1)?;
            }
        }
        // 5. Logs.
        match &episodes.source {
            Played::Prompts(groups) => {
                if let (Some(sb), Some(learned)) = (&batch, &learned) {
                    self.prompt_logs(step, groups, sb, learned, &mut m)?;
                }
            }
            Played::Env { .. } => {
                self.env_logs(step, &episodes, batch.as_ref().map(|sb| &sb.batch), &mut m)?
            }
        }
        let secs = t_step.elapsed().as_secs_f64();
        m.insert("timing_s/step".into(), secs);
        // Overlap in process: the share of this step each side spent idle (the learner waiting
        // for its batch; the sampler thread without a batch to sample, counting the seconds it
        // sampled the batch this step trained).
        if let (Some(&wait), Some(&busy)) =
            (m.get("async/learner_wait_s"), m.get("async/sampler_busy_s"))
        {
            m.insert("async/learner_idle_fraction".into(), (wait / secs).min(1.0));
            m.insert(
                "async/sampler_idle_fraction".into(),
                (1.0 - busy / secs).clamp(0.0, 1.0),
            );
        }
        if let Some(sb) = &batch {
            m.insert("perf/tokens_per_s".into(), sb.tokens() / secs);
        }
        m.insert(
            "training/epoch".into(),
            self.producer
                .epoch_of(self.state.batches_drawn.saturating_sub(1)) as f64,
        );
        Ok(m)
    }

    /// Phase 2: the step's datums as one batch (`step_batch.rs`), with `response_length/*` and
    /// `prompt_length/*`; none when there is nothing to learn from (no usable group, or every
    /// advantage an environment set is zero).
    fn step_batch(
        &mut self,
        step: usize,
        episodes: &StepEpisodes,
        m: &mut StepMetrics,
    ) -> Result<Option<StepBatch>> {
        let resp: Vec<f64> = episodes
            .datums()
            .map(|d| d.completion_tokens.len() as f64)
            .collect();
        put_mmm(m, "response_length", &resp);
        if resp.is_empty() {
            eprintln!("warning: step {step}: no usable groups; skipping the update");
            m.insert("batch/skipped_update".into(), 1.0);
            return Ok(None);
        }
        if let AdvantageKind::Given { skip_zero } = episodes.advantages {
            match advantage_stats(episodes.datums()) {
                None if skip_zero => {
                    if self.dist.is_root() {
                        eprintln!("warning: step {step}: All token advantages are 0.0 (no learning signal); skipping the update");
                    }
                    m.insert("batch/skipped_update".into(), 1.0);
                    return Ok(None);
                }
                None => bail!(
                    "step {step}: All token advantages are 0.0 (no learning signal): every group's rewards were equal \
                     (more rollouts per question, another reward or temperature help; env.skip_zero_advantage = true \
                     skips such steps)"
                ),
                Some(line) => {
                    if self.dist.is_root() {
                        eprintln!("{line}");
                    }
                }
            }
        }
        // A prompt run's mini-batches are `actor.ppo_mini_batch_size` groups of `rollout.n`,
        // trained against its old log-probs; an environment step is one mini-batch of every
        // datum (data-parallel, each rank takes its share: the datum count varies with the
        // verdicts, so shares may differ by one row), the sampler's log-probs its old ones.
        let learning = match &episodes.source {
            Played::Prompts(_) => Learning {
                advantages: episodes.advantages,
                mini: self.learner.settings().actor.ppo_mini_batch_size * self.producer.n(),
                need_old: true,
            },
            Played::Env { .. } => Learning {
                advantages: episodes.advantages,
                mini: episodes.groups.iter().map(Vec::len).sum(),
                need_old: false,
            },
        };
        let sb = StepBatch::new(
            &episodes.groups,
            learning,
            self.pad_id,
            self.learner.model().device(),
            self.learner.settings().actor.shared_prefix,
            self.learner.settings().remove_padding,
        );
        sb.metrics(m);
        Ok(Some(sb))
    }

    /// Phase 5 of a prompt run: the rollouts with their old log-probs (every
    /// `trainer.rollout_log_freq` steps) and `perf/gen_tokens_per_s`.
    fn prompt_logs(
        &mut self,
        step: usize,
        groups: &PromptGroups,
        sb: &StepBatch,
        learned: &Learned,
        m: &mut StepMetrics,
    ) -> Result<()> {
        if self.trainer_cfg.rollout_log_freq > 0
            && step.is_multiple_of(self.trainer_cfg.rollout_log_freq as usize)
        {
            let old = learned
                .old
                .as_ref()
                .expect("learn computes the old log-probs");
            let adv_rows = to_rows(&learned.adv.advantages);
            self.producer.write_rollouts(
                &self.run,
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
        Ok(())
    }

    /// Phase 5 of an environment run: the step's training record (`training_step_<k>.json`:
    /// the loss, the trained tokens, the datums).
    fn env_logs(
        &mut self,
        step: usize,
        episodes: &StepEpisodes,
        batch: Option<&Batch>,
        m: &mut StepMetrics,
    ) -> Result<()> {
        let datums: Vec<&Datum> = episodes.datums().collect();
        let (loss, trained_tokens) = match batch {
            Some(batch) => (
                m.get("actor/pg_loss").copied().unwrap_or(0.0),
                batch.response_mask.sum(Kind::Double).double_value(&[]),
            ),
            None => (0.0, 0.0),
        };
        if self.dist.is_root() {
            env_logs::write_training_step(&self.run.root, step, loss, trained_tokens, &datums)?;
        }
        Ok(())
    }

    /// Phase 3 of an environment run that plays ahead: the consumer updates on `sb` on a
    /// thread of its own while the producer plays the next data batch's episodes on this one
    /// with the weights before the update (kept for the next step). Returns the update and the
    /// batch (for the step's logs).
    fn learn_while_playing(
        &mut self,
        step: usize,
        sb: StepBatch,
        m: &mut StepMetrics,
    ) -> Result<(Learned, StepBatch)> {
        let next = self.state.batches_drawn;
        let threads = tch::get_num_threads();
        // The producer and the consumer are separate parts: one borrowed to play, the other to
        // update.
        let player = self
            .producer
            .episode_player(None, self.state.policy_version);
        let (learner, dist, hook) = (&mut self.learner, &*self.dist, self.before_update.as_mut());
        let (learned, played) = std::thread::scope(|s| {
            let update = std::thread::Builder::new()
                .name("learner".into())
                .spawn_scoped(s, move || {
                    // libtorch's intra-op threads are set per calling thread; the trainer's.
                    tch::set_num_threads(threads);
                    let started = Instant::now();
                    let mut lm = StepMetrics::new();
                    let learned = learner.learn(dist, step, &sb, hook, &mut lm);
                    (learned, sb, lm, started.elapsed().as_secs_f64())
                })
                .map_err(|e| anyhow!("starting the learner thread: {e}"))?;
            let played = player.play(step + 1, next);
            let (learned, sb, lm, learn_s) = match update.join() {
                Ok(r) => r,
                Err(panic) => std::panic::resume_unwind(panic),
            };
            m.extend(lm);
            let played = played.map(|p| p.beside_update(learn_s));
            Ok::<_, anyhow::Error>((learned.map(|l| (l, sb)), played))
        })?;
        let learned = learned?;
        self.producer.keep_played_ahead(played?);
        Ok(learned)
    }
}
