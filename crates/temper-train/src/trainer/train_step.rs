//! One training step, as phases read top to bottom in [`Trainer::train_step`]: draw the
//! questions, roll them out and score them, as per-question datums (a prompt + reward run's
//! groups, each answer a one-turn episode, drawn and scored in `draw_groups.rs`; an environment's
//! episodes, `env_step.rs`); from there one path for both: the batch (`step_batch.rs`), the
//! advantages and the update on the learner (`learn.rs`, `advantages.rs`, `update.rs`), the weight
//! sync (`Rollouts::sync`, `sampling/servers.rs`); then the source's logs.
use super::batch::to_rows;
use super::learn::Learned;
use super::rollout::Group;
use super::sampling::ServersSync;
use super::stats::{put_mmm, MetricAcc, StepMetrics};
use super::step_batch::{AdvantageKind, Learning, StepBatch};
use super::Trainer;
use anyhow::{bail, Result};
use serde_json::json;
use std::time::Instant;
use temper_env::{advantage_stats, Datum};
use temper_rollout::{Finish, SamplingParams};

impl Trainer {
    /// How the in-process engine's fixed-shape decode steps ran so far, when it samples on a GPU
    /// (the CPU engine runs no fixed-shape steps).
    fn decode_counts(&self) -> Option<temper_model::DecodeCounts> {
        let model = self.rollouts.engine_model(&self.learner.model);
        (!self.rollouts.is_remote() && model.device() != tch::Device::Cpu)
            .then(|| model.static_decode_counts())
    }

    /// `perf/decode_tflops`, `perf/decode_gb_per_s` and `perf/decode_bandwidth_fraction` of the
    /// in-process engine's decode steps this step, read against the roof measured at start
    /// (when the engine samples on the trainer's device, where the roof was measured).
    fn decode_metrics(&self, m: &mut StepMetrics) {
        let work = self.rollouts.take_decode_work();
        let model = self.rollouts.engine_model(&self.learner.model);
        if work.steps == 0 || model.device() != self.learner.model.device() {
            return;
        }
        for (k, v) in work.metrics(model.config(), model.compute(), &self.learner.roof) {
            m.insert(k.into(), v);
        }
    }

    pub(crate) fn rollout_params(&self) -> SamplingParams {
        self.rollouts
            .cfg()
            .sampling_params(self.questions.max_response_length())
    }

    /// [`Trainer::train_step`], under the profiler when it is the `--profile` step.
    pub(super) fn profiled_step(&mut self, step: usize) -> Result<StepMetrics> {
        if self.profile_step != Some(step) {
            return self.train_step(step);
        }
        let cuda = matches!(self.learner.model.device(), tch::Device::Cuda(_));
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

    /// One step (1-based `step`); returns its metrics. The phases, in order: draw the step's
    /// questions, roll them out and score them, as per-question datums (a prompt run's groups of
    /// one-turn episodes, `draw_groups.rs`; an environment's episodes, `env_step.rs`); their
    /// batch (`step_batch.rs`); the advantages and the update, on the learner (`learn.rs`); the
    /// weight sync (`Rollouts::sync`); the step's logs.
    pub(crate) fn train_step(&mut self, step: usize) -> Result<StepMetrics> {
        let t_step = Instant::now();
        let mut m = StepMetrics::new();
        let decode_before = self.decode_counts();
        // Decoding done outside the step (evaluation) is not this step's.
        self.rollouts.take_decode_work();
        // 1. Draw, roll out, score.
        let episodes = match self.env.is_some() {
            true => self.env_episodes(step, &mut m)?,
            false => self.prompt_episodes(step, &mut m)?,
        };
        if let (Some(before), Some(after)) = (decode_before, self.decode_counts()) {
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
        self.decode_metrics(&mut m);
        // 2. The batch (none: nothing to learn from this step).
        let mut batch = self.step_batch(step, &episodes, &mut m)?;
        // 3. Advantages and the update (an environment run sampling ahead plays the next step's
        // episodes meanwhile).
        let plays_ahead =
            self.env.is_some() && self.rollouts.cfg().async_steps > 0 && step < self.fit_end;
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
        // 4. After an update, the new weights to the samplers.
        if learned.as_ref().is_some_and(|l| l.updated) {
            self.state.policy_version += 1;
            let t_sync = Instant::now();
            let synced = self.rollouts.sync(
                &self.learner,
                &self.dist,
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
            // A streaming sampler thread (partial rollouts) gets the batch these weights allow
            // now, queued behind them, so its rows join those still sampling instead of
            // waiting for the next step's draw (the same batch that draw would send).
            if self.rollouts.cfg().partial_rollouts && self.env.is_none() && step < self.fit_end {
                let params = self.rollout_params();
                self.generate_ahead(self.state.batches_drawn + 1, &params)?;
            }
        }
        // 5. Logs.
        match &episodes.source {
            Played::Prompts(groups) => {
                if let (Some(sb), Some(learned)) = (&batch, &learned) {
                    self.prompt_logs(step, groups, sb, learned, &mut m)?;
                }
            }
            Played::Env => {
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
            self.questions
                .epoch_of(self.state.batches_drawn.saturating_sub(1)) as f64,
        );
        Ok(m)
    }

    /// Phase 1 of a prompt + reward run: the step's groups drawn, sampled and scored
    /// (`draw_groups.rs`), each prompt's `n` answers one-turn episodes, as datums; overlap sends
    /// the next steps' batches to the servers, sampled while this one trains.
    fn prompt_episodes(&mut self, step: usize, m: &mut StepMetrics) -> Result<StepEpisodes> {
        let params = self.rollout_params();
        let t_gen = Instant::now();
        let drawn = self.draw_groups(step, &params)?;
        let gen_s = t_gen.elapsed().as_secs_f64();
        m.insert("timing_s/gen".into(), gen_s);
        m.extend(self.rollouts.ahead_metrics());
        self.generate_ahead(self.state.batches_drawn, &params)?;
        m.extend(drawn.metrics(self.state.policy_version));
        let groups = drawn.groups;
        if self.rollouts.cfg().partial_rollouts {
            m.insert("async/partial_fraction".into(), partial_fraction(&groups));
        }
        if !groups.is_empty() {
            let clip_ratio = prompt_metrics(&groups, m);
            self.warn_if_no_eos(step, clip_ratio);
        }
        Ok(StepEpisodes {
            groups: groups.iter().map(Group::datums).collect(),
            learning: Learning {
                advantages: AdvantageKind::FromRewards,
                mini: self.learner.settings.actor.ppo_mini_batch_size * self.rollouts.cfg().n,
                need_old: true,
            },
            source: Played::Prompts(PromptGroups { groups, gen_s }),
        })
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
        if let AdvantageKind::Given { skip_zero } = episodes.learning.advantages {
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
        let sb = StepBatch::new(
            &episodes.groups,
            episodes.learning,
            self.pad_id,
            self.learner.model.device(),
            self.learner.settings.actor.shared_prefix,
            self.learner.settings.remove_padding,
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
        Ok(())
    }

    /// Once per run: a warning when no response of a step ended before the length limit.
    fn warn_if_no_eos(&mut self, step: usize, clip_ratio: f64) {
        if clip_ratio == 1.0 && self.warned.insert("no_eos") {
            eprintln!(
                "warning: step {step}: no response ended within data.max_response_length = {} tokens (does the model \
                 emit EOS? are rollout.stop strings reachable?)",
                self.questions.max_response_length()
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
            let ex = &self.questions.train().examples[g.example];
            for (k, s) in g.samples.iter().enumerate() {
                let len = s.completion_ids.len();
                let mut line = json!({
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
                // With partial rollouts: the policy version that drew each token.
                if !s.completion_versions.is_empty() {
                    line["completion_versions"] = json!(s.completion_versions);
                }
                out.push_str(&serde_json::to_string(&line)?);
                out.push('\n');
                row += 1;
            }
        }
        crate::rundir::write_atomic(&self.run.rollouts(step), out.as_bytes())
    }
}

/// A step's episodes, whichever source played them: what the batch, the advantages and the
/// update need, and the source's own part for its logs.
pub(super) struct StepEpisodes {
    /// Per question, its datums (their advantages set when they are `Given`).
    pub groups: Vec<Vec<Datum>>,
    pub learning: Learning,
    pub source: Played,
}

impl StepEpisodes {
    pub fn datums(&self) -> impl Iterator<Item = &Datum> {
        self.groups.iter().flatten()
    }
}

/// Which source played a step, and what it keeps for the step's logs.
pub(super) enum Played {
    /// A prompt + reward run's groups.
    Prompts(PromptGroups),
    /// An environment's episodes (its logs read the datums).
    Env,
}

/// A prompt run's groups.
pub(super) struct PromptGroups {
    groups: Vec<Group>,
    /// Seconds the rollouts took (for `perf/gen_tokens_per_s`).
    gen_s: f64,
}

/// The share of the answers of `groups` whose tokens were drawn by more than one policy
/// version (weights that changed while they were sampled: partial rollouts).
fn partial_fraction(groups: &[Group]) -> f64 {
    let samples: Vec<_> = groups.iter().flat_map(|g| &g.samples).collect();
    let partial = samples
        .iter()
        .filter(|s| s.completion_versions.windows(2).any(|w| w[0] != w[1]))
        .count();
    partial as f64 / samples.len().max(1) as f64
}

/// A prompt run's `response_length/clip_ratio`, `critic/score/*` and the reward's own `reward/*`
/// metrics (means over the samples of `groups`) into `m`; returns the clip ratio.
fn prompt_metrics(groups: &[Group], m: &mut StepMetrics) -> f64 {
    let samples: Vec<_> = groups.iter().flat_map(|g| g.samples.iter()).collect();
    let clipped = samples
        .iter()
        .filter(|s| s.finish == Finish::Length)
        .count();
    let clip_ratio = clipped as f64 / samples.len() as f64;
    m.insert("response_length/clip_ratio".into(), clip_ratio);
    let scores: Vec<f64> = groups
        .iter()
        .flat_map(|g| g.scores.iter().copied())
        .collect();
    put_mmm(m, "critic/score", &scores);
    let mut reward_acc = MetricAcc::default();
    for rm in groups.iter().flat_map(|g| &g.reward_metrics) {
        for (k, v) in rm {
            reward_acc.add(&format!("reward/{k}"), *v, 1.0);
        }
    }
    reward_acc.finish(m);
    clip_ratio
}

/// Salt of the training sampling seeds (evaluation uses another).
pub(crate) const TRAIN_SEED_SALT: u64 = 0x0074_7261_696e;
