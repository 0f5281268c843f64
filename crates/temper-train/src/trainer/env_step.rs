//! The phases of a step of an environment run (`env.name`) for [`Trainer::train_step`]: the
//! step's questions become episode groups (the `n` answers to a question, or its `n / 2`
//! debates), all advanced together by the batched engine; the finished episodes become datums
//! with per-token advantages and masks (for one-turn tasks the learner's estimate over a
//! question's answers, `advantages.rs`, as a prompt run's; the debate training mode for debates); the step's files in the run folder. The batch and the
//! learning are the same as a prompt run's (`step_batch.rs`, `learn.rs`).
//!
//! With `rollout.async_steps >= 1` the episodes of the next step are played while this step's
//! learner updates on a thread of its own ([`Trainer::learn_while_playing`]), by the weights
//! before the update (the sampler thread's copy in process, or the servers, which get the new
//! weights only once the play is over): each step trains on episodes exactly one policy version
//! old, within any bound >= 1 (verl's one-step-off policy, for multi-turn episodes). Nothing is
//! lost on a kill: episodes played ahead are played again by the resumed run.
use super::batch::Batch;
use super::env_logs;
use super::env_runtime::EnvRuntime;
use super::episodes::TrainerSampler;
use super::learn::Learned;
use super::questions::Questions;
use super::stats::{put_mmm, StepMetrics};
use super::step_batch::{AdvantageKind, Learning, StepBatch};
use super::train_step::{Played, StepEpisodes};
use super::Trainer;
use crate::dist::Dist;
use anyhow::{anyhow, bail, Result};
use std::collections::BTreeMap;
use std::time::Instant;
use tch::Kind;
use temper_base::seed::mix;
use temper_env::{run_groups, Datum, EnvGroup, EnvRun, GroupContext, GroupOutcome};
use temper_rollout::SamplingParams;

/// One data batch's episodes as this rank played them, before every rank's are gathered.
pub(crate) struct PlayedEpisodes {
    /// The data batch (`TrainerState::batches_drawn` order).
    batch: usize,
    outcomes: Vec<GroupOutcome>,
    /// The policy version that played them.
    version: u64,
    /// Seconds playing them.
    play_s: f64,
    /// Played ahead: the seconds the learner sat idle waiting for the play to end.
    learner_wait_s: f64,
}

/// An [`EpisodePlayer`] over the trainer `$t`'s fields, the policy's requests sampled with
/// `$policy` (see [`TrainerSampler::policy`]). A macro, not a method, so that the learner stays
/// free to be borrowed mutably beside it.
macro_rules! episode_player {
    ($t:expr, $policy:expr, $params:expr) => {
        EpisodePlayer {
            runtime: $t.env.as_ref().expect("env_step runs with an environment"),
            questions: &$t.questions,
            dist: &$t.dist,
            sampler: TrainerSampler {
                rollouts: &$t.rollouts,
                policy: $policy,
                judge: $t.env.as_ref().and_then(|e| e.env.judge_model()),
                eos_ids: &$t.eos_ids,
                tokenizer: &$t.tokenizer,
                seed: 0,
                on_servers: true,
            },
            params: $params,
            n: $t.rollouts.cfg().n,
            train_seed: $t.trainer_cfg.seed,
            version: $t.rollouts.sampling_version($t.state.policy_version),
        }
    };
}

/// What playing a data batch's episodes reads, borrowed from the trainer part by part (so that
/// the learner can update on another thread meanwhile).
struct EpisodePlayer<'a> {
    runtime: &'a EnvRuntime,
    questions: &'a Questions,
    dist: &'a Dist,
    sampler: TrainerSampler<'a>,
    params: SamplingParams,
    /// `rollout.n`: episodes per question.
    n: usize,
    /// `trainer.seed`.
    train_seed: u64,
    /// The policy version the sampler holds.
    version: u64,
}

impl Trainer {
    /// Phase 1 of an environment run: this rank's share of the step's questions played (one
    /// group per question, all advanced together by the batched engine), every rank's outcomes
    /// gathered, their datums with advantages (as the environment set them, or the configured
    /// estimator over each question's answers), and the episodes' records written.
    pub(super) fn env_episodes(
        &mut self,
        step: usize,
        m: &mut StepMetrics,
    ) -> Result<StepEpisodes> {
        let batch_index = self.state.batches_drawn;
        self.state.batches_drawn += 1;

        // Episodes: this rank's share of the questions, played ahead during the last update or
        // now, then every rank's.
        let t_gen = Instant::now();
        let ahead = self.env.as_mut().and_then(|e| e.ahead.take());
        let played = match ahead {
            Some(p) if p.batch == batch_index => p,
            _ => {
                let policy = match self.rollouts.samples_on_thread() {
                    true => None,
                    false => Some(&self.learner.model),
                };
                let p =
                    episode_player!(self, policy, self.rollout_params()).play(step, batch_index)?;
                // Played now: the learner waited for all of it.
                PlayedEpisodes {
                    learner_wait_s: p.play_s,
                    ..p
                }
            }
        };
        if self.rollouts.cfg().async_steps > 0 {
            let lag = self.state.policy_version.saturating_sub(played.version) as f64;
            m.insert("rollout/policy_version".into(), played.version as f64);
            m.insert("rollout/policy_lag_mean".into(), lag);
            m.insert("rollout/policy_lag_max".into(), lag);
            m.insert("async/sampler_busy_s".into(), played.play_s);
            m.insert("async/learner_wait_s".into(), played.learner_wait_s);
        }
        // Data-parallel, every rank gathers every rank's outcomes (in rank order, which is
        // question order).
        let all: Vec<GroupOutcome> = self
            .dist
            .all_gather_json(&played.outcomes)?
            .into_iter()
            .flatten()
            .collect();
        m.insert("timing_s/gen".into(), t_gen.elapsed().as_secs_f64());

        // Datums. Groups whose environment leaves the advantages to the trainer: the
        // configured estimator over each question's answers, computed on the whole batch (an
        // estimator may normalise over it).
        let t_adv = Instant::now();
        let runtime = self
            .env
            .as_ref()
            .expect("env_step runs with an environment");
        let mut groups: Vec<Vec<Datum>> = vec![];
        let (mut rewards, mut parse_failures) = (vec![], 0);
        let mut counts: BTreeMap<String, f64> = BTreeMap::new();
        let mut records = vec![];
        for g in all {
            groups.push(g.datums);
            rewards.extend(g.rewards);
            parse_failures += g.parse_failures;
            for (k, v) in g.counts {
                *counts.entry(k).or_insert(0.0) += v;
            }
            records.extend(g.records);
        }
        if !runtime.env.sets_advantages() {
            self.learner.one_turn_advantages(&mut groups)?;
        }
        let datum_count: usize = groups.iter().map(Vec::len).sum();
        put_mmm(m, "critic/score", &rewards);
        m.insert("env/parse_failures".into(), parse_failures as f64);
        m.extend(counts);
        m.insert("env/datums".into(), datum_count as f64);
        m.insert("timing_s/adv".into(), t_adv.elapsed().as_secs_f64());

        // The episodes' records (debate_<k>.json, summary_<k>.json / baseline_<k>.json).
        if self.dist.is_root() {
            env_logs::write_records(&self.run.root, step, &records)?;
        }
        // One mini-batch of every datum; data-parallel, each rank takes its share (the datum
        // count varies with the verdicts, so shares may differ by one row).
        Ok(StepEpisodes {
            learning: Learning {
                mini: datum_count,
                advantages: AdvantageKind::Given {
                    skip_zero: runtime.skip_zero_advantage,
                },
                need_old: false,
            },
            groups,
            source: Played::Env,
        })
    }

    /// Phase 5 of an environment run: the step's training record (`training_step_<k>.json`:
    /// the loss, the trained tokens, the datums).
    pub(super) fn env_logs(
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

    /// Phase 3 of an environment run that samples ahead: the update of `sb` on a thread of its
    /// own while this one plays the next data batch's episodes with the weights before it (kept
    /// for the next step). Returns the update and the batch (for the step's logs).
    pub(super) fn learn_while_playing(
        &mut self,
        step: usize,
        sb: StepBatch,
        m: &mut StepMetrics,
    ) -> Result<(Learned, StepBatch)> {
        let next = self.state.batches_drawn;
        let threads = tch::get_num_threads();
        let player = episode_player!(self, None, self.rollout_params());
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
            let played = played.map(|p| PlayedEpisodes {
                learner_wait_s: (p.play_s - learn_s).max(0.0),
                ..p
            });
            Ok::<_, anyhow::Error>((learned.map(|l| (l, sb)), played))
        })?;
        let learned = learned?;
        self.env
            .as_mut()
            .expect("env_step runs with an environment")
            .ahead = Some(played?);
        Ok(learned)
    }
}

impl EpisodePlayer<'_> {
    /// Plays data batch `batch`'s episodes for step `step`: this rank's share of its questions
    /// (each seeded by its position in the whole batch, so episodes do not depend on the world
    /// size), one group per question from the environment, all advanced together. One-turn
    /// datums come with advantage 0, set by
    /// [`Learner::one_turn_advantages`](super::Learner::one_turn_advantages) once every rank's
    /// are in.
    fn play(mut self, step: usize, batch: usize) -> Result<PlayedEpisodes> {
        let started = Instant::now();
        let (_, questions) = self.questions.draw(batch);
        let seed = mix(self.train_seed, batch as u64, 0x656e_7673);
        self.sampler.seed = seed;
        let mine = self.dist.shard(&questions, "data.train_batch_size")?;
        let first_position = self.dist.rank * mine.len();
        let env = &self.runtime.env;
        let mut runs: Vec<Box<dyn EnvRun + '_>> = vec![];
        for (k, &qi) in mine.iter().enumerate() {
            let pos = first_position + k;
            let qseed = mix(seed, qi as u64, pos as u64);
            let where_ = format!("env question {qi}");
            let prompt = if env.needs_prompt() {
                let Some(prompt) = self.questions.prompt_ids(
                    self.sampler.tokenizer,
                    &self.questions.train().examples[qi],
                    &where_,
                )?
                else {
                    bail!("{where_}: the prompt is longer than data.max_prompt_length");
                };
                Some(prompt)
            } else {
                None
            };
            let ctx = GroupContext {
                codec: self.sampler.tokenizer,
                prompt,
                params: SamplingParams {
                    seed: Some(qseed),
                    ..self.params.clone()
                },
                seed: qseed,
                n: self.n,
            };
            runs.push(env.group(env.task().question(0, qi as u64), ctx)?);
        }
        {
            let mut groups: Vec<Box<dyn EnvGroup + '_>> = runs
                .iter_mut()
                .map(|r| Box::new(&mut **r) as Box<dyn EnvGroup>)
                .collect();
            let is_root = self.dist.is_root();
            let mut announce = |round, asks| {
                if let Some(line) = env.round_line(round, asks) {
                    if is_root {
                        eprintln!("{line}");
                    }
                }
            };
            // The policy's frozen sampling weights are built once for every round of the
            // step (its engine calls reuse them), not once per round.
            match self.sampler.policy {
                Some(policy) => self.sampler.rollouts.with_sampling_weights(policy, || {
                    run_groups(&mut self.sampler, &mut groups, &mut announce)
                })?,
                None => run_groups(&mut self.sampler, &mut groups, &mut announce)?,
            }
        }
        Ok(PlayedEpisodes {
            batch,
            outcomes: runs.iter().map(|r| r.outcome(step)).collect(),
            version: self.version,
            play_s: started.elapsed().as_secs_f64(),
            learner_wait_s: 0.0,
        })
    }
}
