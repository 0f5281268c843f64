//! The producer's side of an environment run (`env.name`): the step's questions become episode
//! groups (the `n` answers to a question, or its `n / 2` debates), all advanced together by the
//! batched engine; the finished episodes become datums with per-token advantages and masks (the
//! debate training mode's, or for one-turn tasks none yet: the learner's estimator sets them over
//! each question's answers, as a prompt run's) and the episodes' records. The batch and the
//! learning are the same as a prompt run's (`step_batch.rs`, `learner/learn.rs`).
//!
//! With `rollout.async_steps >= 1` the episodes of the next step are played while this step's
//! learner updates on a thread of its own (`Trainer::learn_while_playing`), by the weights
//! before the update (the sampler thread's copy in process, or the servers, which get the new
//! weights only once the play is over): each step trains on episodes exactly one policy version
//! old, within any bound >= 1 (verl's one-step-off policy, for multi-turn episodes). Nothing is
//! lost on a kill: episodes played ahead are played again by the resumed run.
use super::env_runtime::EnvRuntime;
use super::episodes::TrainerSampler;
use super::questions::Questions;
use super::{Played, Producer, StepEpisodes};
use crate::checkpoint::TrainerState;
use crate::dist::Dist;
use crate::trainer::stats::{put_mmm, StepMetrics};
use crate::trainer::step_batch::AdvantageKind;
use crate::trainer::Learner;
use anyhow::{bail, Result};
use std::collections::BTreeMap;
use std::time::Instant;
use temper_base::seed::mix;
use temper_env::{run_groups, Datum, EnvGroup, EnvRun, GroupContext, GroupOutcome};
use temper_model::CausalLm;
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

/// What playing a data batch's episodes reads, borrowed from the producer (so that the learner
/// can update on another thread meanwhile).
pub(crate) struct EpisodePlayer<'a> {
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

impl PlayedEpisodes {
    /// Played beside an update that took `learn_s` seconds: the learner waited for what the
    /// play took beyond it.
    pub fn beside_update(self, learn_s: f64) -> Self {
        PlayedEpisodes {
            learner_wait_s: (self.play_s - learn_s).max(0.0),
            ..self
        }
    }
}

impl Producer {
    /// A player of the episodes of the next data batch, the policy's requests sampled with
    /// `policy` (see [`TrainerSampler::policy`]); `policy_version` is the consumer's.
    pub(crate) fn episode_player<'a>(
        &'a self,
        policy: Option<&'a CausalLm>,
        policy_version: u64,
    ) -> EpisodePlayer<'a> {
        let runtime = self
            .env
            .as_ref()
            .expect("env_step runs with an environment");
        EpisodePlayer {
            runtime,
            questions: &self.questions,
            dist: &self.dist,
            sampler: TrainerSampler {
                rollouts: &self.rollouts,
                policy,
                judge: runtime.env.judge_model(),
                eos_ids: &self.eos_ids,
                tokenizer: &self.tokenizer,
                seed: 0,
                on_servers: true,
            },
            params: self.rollout_params(),
            n: self.rollouts.cfg().n,
            train_seed: self.seed,
            version: self.rollouts.sampling_version(policy_version),
        }
    }

    /// Episodes played ahead are waiting for their step.
    #[cfg(test)]
    pub(crate) fn holds_played_ahead(&self) -> bool {
        self.env.as_ref().is_some_and(|e| e.ahead.is_some())
    }

    /// Keeps the episodes played ahead (during an update) for the step that trains on them.
    pub(crate) fn keep_played_ahead(&mut self, played: PlayedEpisodes) {
        self.env
            .as_mut()
            .expect("env_step runs with an environment")
            .ahead = Some(played);
    }

    /// Phase 1 of an environment run: this rank's share of the step's questions played (one
    /// group per question, all advanced together by the batched engine), or taken as played
    /// ahead, and every rank's outcomes gathered, as datums with the environment's advantages
    /// (or none yet: a one-turn task leaves them to the learner's estimator) and the episodes'
    /// records.
    pub(super) fn env_episodes(
        &mut self,
        step: usize,
        learner: &Learner,
        state: &mut TrainerState,
        m: &mut StepMetrics,
    ) -> Result<StepEpisodes> {
        let batch_index = state.batches_drawn;
        state.batches_drawn += 1;

        // Episodes: this rank's share of the questions, played ahead during the last update or
        // now, then every rank's.
        let t_gen = Instant::now();
        let ahead = self.env.as_mut().and_then(|e| e.ahead.take());
        let played = match ahead {
            Some(p) if p.batch == batch_index => p,
            _ => {
                let policy = match self.rollouts.samples_on_thread() {
                    true => None,
                    false => Some(learner.model()),
                };
                let p = self
                    .episode_player(policy, state.policy_version)
                    .play(step, batch_index)?;
                // Played now: the learner waited for all of it.
                PlayedEpisodes {
                    learner_wait_s: p.play_s,
                    ..p
                }
            }
        };
        if self.rollouts.cfg().async_steps > 0 {
            let lag = state.policy_version.saturating_sub(played.version) as f64;
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
        let datum_count: usize = groups.iter().map(Vec::len).sum();
        put_mmm(m, "critic/score", &rewards);
        m.insert("env/parse_failures".into(), parse_failures as f64);
        m.extend(counts);
        m.insert("env/datums".into(), datum_count as f64);
        Ok(StepEpisodes {
            advantages: AdvantageKind::Given {
                skip_zero: runtime.skip_zero_advantage,
            },
            groups,
            source: Played::Env {
                records,
                estimate_advantages: !runtime.env.sets_advantages(),
            },
        })
    }
}

impl EpisodePlayer<'_> {
    /// Plays data batch `batch`'s episodes for step `step`: this rank's share of its questions
    /// (each seeded by its position in the whole batch, so episodes do not depend on the world
    /// size), one group per question from the environment, all advanced together. One-turn
    /// datums come with advantage 0, set by
    /// [`Learner::one_turn_advantages`](super::Learner::one_turn_advantages) once every rank's
    /// are in.
    pub(crate) fn play(mut self, step: usize, batch: usize) -> Result<PlayedEpisodes> {
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
