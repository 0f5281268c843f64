//! The phases of a step of an environment run (`env.name`) for [`Trainer::train_step`]: the
//! step's questions become episode groups (the `n` answers to a question, or its `n / 2`
//! debates), all advanced together by the batched engine; the finished episodes become datums
//! with per-token advantages and masks (for one-turn tasks the learner's estimate over a
//! question's answers, `advantages.rs`, as a prompt run's; the debate training mode for debates); the step's files in the run folder. The batch and the
//! learning are the same as a prompt run's (`step_batch.rs`, `learn.rs`).
use super::batch::Batch;
use super::env_logs;
use super::episodes::TrainerSampler;
use super::stats::{put_mmm, StepMetrics};
use super::step_batch::{AdvantageKind, Learning};
use super::train_step::{Played, StepEpisodes};
use super::Trainer;
use anyhow::{bail, Result};
use std::collections::BTreeMap;
use std::time::Instant;
use tch::Kind;
use temper_base::seed::mix;
use temper_env::{run_groups, Datum, EnvGroup, EnvRun, GroupContext, GroupOutcome};
use temper_rollout::SamplingParams;

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
        let (_, questions) = self.questions.draw(batch_index);
        let seed = mix(self.trainer_cfg.seed, batch_index as u64, 0x656e_7673);

        // Episodes: this rank's share of the questions (seeded by their position in the whole
        // batch, so episodes do not depend on the world size), then every rank's.
        let t_gen = Instant::now();
        let mine = self.dist.shard(&questions, "data.train_batch_size")?;
        let first_position = self.dist.rank * mine.len();
        let local = self.run_episodes(step, mine, first_position, seed)?;
        // Data-parallel, every rank gathers every rank's outcomes (in rank order, which is
        // question order).
        let all: Vec<GroupOutcome> = self
            .dist
            .all_gather_json(&local)?
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

    /// Runs the episodes of `questions` (at `first_position` of the step's batch): one group per
    /// question from the environment, all advanced together, and their outcomes (one-turn
    /// datums with advantage 0, set by [`Learner::one_turn_advantages`](super::Learner::one_turn_advantages) once every rank's are in).
    fn run_episodes(
        &self,
        step: usize,
        questions: &[usize],
        first_position: usize,
        seed: u64,
    ) -> Result<Vec<GroupOutcome>> {
        let env = &self
            .env
            .as_ref()
            .expect("env_step runs with an environment")
            .env;
        let n = self.rollouts.cfg.n;
        let mut runs: Vec<Box<dyn EnvRun + '_>> = vec![];
        for (k, &qi) in questions.iter().enumerate() {
            let pos = first_position + k;
            let qseed = mix(seed, qi as u64, pos as u64);
            let where_ = format!("env question {qi}");
            let prompt = if env.needs_prompt() {
                let Some(prompt) = self.questions.prompt_ids(
                    &self.tokenizer,
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
                codec: &self.tokenizer,
                prompt,
                params: SamplingParams {
                    seed: Some(qseed),
                    ..self.rollout_params()
                },
                seed: qseed,
                n,
            };
            runs.push(env.group(env.task().question(0, qi as u64), ctx)?);
        }
        {
            let mut groups: Vec<Box<dyn EnvGroup + '_>> = runs
                .iter_mut()
                .map(|r| Box::new(&mut **r) as Box<dyn EnvGroup>)
                .collect();
            let mut sampler = TrainerSampler {
                t: self,
                seed,
                on_servers: true,
            };
            // The policy's frozen sampling weights are built once for every round of the step
            // (its engine calls reuse them), not once per round.
            self.rollouts
                .with_sampling_weights(&self.learner.model, || {
                    run_groups(&mut sampler, &mut groups, &mut |round, asks| {
                        if let Some(line) = env.round_line(round, asks) {
                            if self.dist.is_root() {
                                eprintln!("{line}");
                            }
                        }
                    })
                })?;
        }
        Ok(runs.iter().map(|r| r.outcome(step)).collect())
    }
}
