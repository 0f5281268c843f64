//! One training step of an environment run (`env.name`): the step's questions become episode
//! groups (the `n` answers to a question, or its `n / 2` debates), all advanced together by the
//! batched engine; the finished episodes become datums with per-token advantages and masks
//! (GRPO over a question's answers for one-turn tasks, the debate training mode for debates);
//! the policy loss trains on them; the step's files go to the run folder.
use super::batch::{to_rows, Batch};
use super::env_logs;
use super::episodes::TrainerSampler;
use super::partition::Partition;
use super::rollout::mix;
use super::stats::{put_mmm, StepMetrics};
use super::update::UpdateInputs;
use super::Trainer;
use anyhow::{bail, Result};
use std::time::Instant;
use tch::{Kind, Tensor};
use temper_env::debate::DebateGroup;
use temper_env::single_turn::SingleTurn;
use temper_env::train_data::{debate_datums, episode_datums};
use temper_env::{advantage_stats, run_groups, Datum, EnvGroup};
use temper_rollout::SamplingParams;

/// What one rank's episodes give the step: per question group its datums, and the numbers
/// and records the step logs. Data-parallel, every rank gathers every rank's (in rank order,
/// which is question order).
#[derive(serde::Serialize, serde::Deserialize, Default)]
struct Episodes {
    groups: Vec<Vec<Datum>>,
    rewards: Vec<f64>,
    parse_failures: usize,
    debates: usize,
    invalid_verdicts: usize,
    records: Vec<(String, serde_json::Value)>,
}

impl Episodes {
    fn merge(all: Vec<Episodes>) -> Episodes {
        let mut out = Episodes::default();
        for e in all {
            out.groups.extend(e.groups);
            out.rewards.extend(e.rewards);
            out.parse_failures += e.parse_failures;
            out.debates += e.debates;
            out.invalid_verdicts += e.invalid_verdicts;
            out.records.extend(e.records);
        }
        out
    }
}

impl Trainer {
    pub(crate) fn env_step(&mut self, step: usize) -> Result<StepMetrics> {
        let t_step = Instant::now();
        let mut m = StepMetrics::new();
        let batch_index = self.state.batches_drawn;
        self.state.batches_drawn += 1;
        let (_, questions) = self.order.batch(batch_index);
        let seed = mix(self.cfg.trainer.seed, batch_index as u64, 0x656e_7673);

        // 1. Episodes: this rank's share of the questions (seeded by their position in the
        // whole batch, so episodes do not depend on the world size), then every rank's.
        let t_gen = Instant::now();
        let mine = self.dist.shard(&questions, "data.train_batch_size")?;
        let first_position = self.dist.rank * mine.len();
        let local = self.run_episodes(step, mine, first_position, seed)?;
        let mut all = Episodes::merge(self.dist.all_gather_json(&local)?);
        m.insert("timing_s/gen".into(), t_gen.elapsed().as_secs_f64());

        // 2. Datums. One-turn groups: the configured advantage estimator over each question's
        // answers, computed on the whole batch (an estimator may normalise over it).
        let t_adv = Instant::now();
        let is_debate = self.env.as_ref().is_some_and(|e| e.debate.is_some());
        if !is_debate {
            self.one_turn_advantages(&mut all.groups)?;
        }
        let datums: Vec<Datum> = all.groups.into_iter().flatten().collect();
        put_mmm(&mut m, "critic/score", &all.rewards);
        m.insert("env/parse_failures".into(), all.parse_failures as f64);
        if is_debate {
            m.insert("env/debates".into(), all.debates as f64);
            m.insert("env/invalid_verdicts".into(), all.invalid_verdicts as f64);
        }
        m.insert("env/datums".into(), datums.len() as f64);
        m.insert("timing_s/adv".into(), t_adv.elapsed().as_secs_f64());

        // 3. Logs of the episodes (debate_<k>.json, summary_<k>.json / baseline_<k>.json).
        if self.dist.is_root() {
            env_logs::write_records(&self.run.root, step, &all.records)?;
        }

        // 4. The update.
        let stats = advantage_stats(&datums);
        let (loss, trained_tokens) = match &stats {
            None if self.cfg.env.skip_zero_advantage || datums.is_empty() => {
                if self.dist.is_root() {
                    eprintln!("warning: step {step}: All token advantages are 0.0 (no learning signal); skipping the update");
                }
                m.insert("batch/skipped_update".into(), 1.0);
                (0.0, 0.0)
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
                m.insert("batch/skipped_update".into(), 0.0);
                self.train_on_datums(step, &datums, &mut m)?
            }
        };
        let resp: Vec<f64> = datums
            .iter()
            .map(|d| d.completion_tokens.len() as f64)
            .collect();
        put_mmm(&mut m, "response_length", &resp);
        if self.dist.is_root() {
            env_logs::write_training_step(&self.run.root, step, loss, trained_tokens, &datums)?;
        }
        if m.get("batch/skipped_update") == Some(&0.0) {
            self.state.policy_version += 1;
            self.maybe_sync_rollout_weights()?;
        }
        m.insert("timing_s/step".into(), t_step.elapsed().as_secs_f64());
        m.insert(
            "training/epoch".into(),
            self.order.batch(batch_index).0 as f64,
        );
        Ok(m)
    }

    /// Runs the episodes of `questions` (at `first_position` of the step's batch) and turns
    /// them into datums (one-turn datums with advantage 0, set by [`Self::one_turn_advantages`]
    /// once every rank's are in) and records.
    fn run_episodes(
        &self,
        step: usize,
        questions: &[usize],
        first_position: usize,
        seed: u64,
    ) -> Result<Episodes> {
        let env = self
            .env
            .as_ref()
            .expect("env_step runs with an environment");
        let task = env.task.as_ref();
        let n = self.cfg.rollout.n;
        let mut singles: Vec<SingleTurn> = vec![];
        let mut debates: Vec<DebateGroup> = vec![];
        for (k, &qi) in questions.iter().enumerate() {
            let pos = first_position + k;
            let q = task.question(qi);
            let qseed = mix(seed, qi as u64, pos as u64);
            match &env.debate {
                Some(d) => {
                    let seeds: Vec<u64> = (0..n / 2).map(|k| mix(qseed, k as u64, 1)).collect();
                    debates.push(DebateGroup::new(
                        q,
                        task,
                        &self.tokenizer,
                        &d.turns,
                        &d.cfg,
                        &seeds,
                    )?);
                }
                None => {
                    let where_ = format!("env question {qi}");
                    let example = &self.train.examples[qi];
                    let Some(prompt) = self.prompt_ids(example, &where_)? else {
                        bail!("{where_}: the prompt is longer than data.max_prompt_length");
                    };
                    let params = SamplingParams {
                        seed: Some(qseed),
                        ..self.train_params()
                    };
                    singles.push(SingleTurn::new(q, task, prompt, params));
                }
            }
        }
        {
            let is_debate = !debates.is_empty();
            let mut groups: Vec<Box<dyn EnvGroup + '_>> = vec![];
            groups.extend(singles.iter_mut().map(|g| Box::new(g) as Box<dyn EnvGroup>));
            groups.extend(debates.iter_mut().map(|g| Box::new(g) as Box<dyn EnvGroup>));
            let mut sampler = TrainerSampler {
                t: self,
                seed,
                on_servers: true,
            };
            run_groups(&mut sampler, &mut groups, &mut |round, asks| {
                if is_debate && self.dist.is_root() {
                    match round {
                        1..=3 => eprintln!("[debate] Round {round}/3: {asks} turns"),
                        _ => eprintln!("[debate] Judge: {asks} verdicts"),
                    }
                }
            })?;
        }
        let mut out = Episodes {
            records: env_logs::episode_records(step, task, &singles, &debates),
            ..Episodes::default()
        };
        if let Some(d) = &env.debate {
            for g in &debates {
                out.debates += g.debates.len();
                out.invalid_verdicts += g.invalid();
                for deb in &g.debates {
                    out.rewards.extend(deb.r1_scores.iter().map(|s| s.reward));
                    out.parse_failures += deb.r1_scores.iter().filter(|s| s.parse_failed).count();
                }
                out.groups.push(debate_datums(g, d.train));
            }
        } else {
            for g in &singles {
                let rs: Vec<f64> = g.scores.iter().map(|s| s.reward).collect();
                out.parse_failures += g.scores.iter().filter(|s| s.parse_failed).count();
                let zero = vec![0.0; rs.len()];
                out.groups
                    .push(episode_datums(&g.episodes, &g.question.id, &rs, &zero));
                out.rewards.extend(rs);
            }
        }
        Ok(out)
    }

    /// One-turn groups: every sampled token of an answer gets the answer's advantage under
    /// `algorithm.adv_estimator`, computed from the datums' rewards with one group per question.
    fn one_turn_advantages(&self, groups: &mut [Vec<Datum>]) -> Result<()> {
        let datums: Vec<&Datum> = groups.iter().flatten().collect();
        if datums.is_empty() {
            return Ok(());
        }
        let scores: Vec<f64> = datums.iter().map(|d| d.reward).collect();
        let index: Vec<i64> = groups
            .iter()
            .enumerate()
            .flat_map(|(gi, g)| std::iter::repeat_n(gi as i64, g.len()))
            .collect();
        let lens: Vec<usize> = datums.iter().map(|d| d.completion_tokens.len()).collect();
        let r = lens.iter().copied().max().unwrap_or(1).max(1);
        let mask_rows: Vec<f32> = lens
            .iter()
            .flat_map(|&l| (0..r).map(move |j| if j < l { 1.0 } else { 0.0 }))
            .collect();
        let mask = Tensor::from_slice(&mask_rows).view([lens.len() as i64, r as i64]);
        let score_t = Tensor::from_slice(&scores).to_kind(Kind::Float);
        let token_rewards = temper_algo::advantage::outcome_to_token_rewards(&score_t, &mask)?;
        let adv = temper_algo::compute_advantages(&self.adv_cfg, &token_rewards, &mask, &index)?;
        let adv_rows = to_rows(&adv.to_kind(Kind::Float));
        for (d, row) in groups.iter_mut().flatten().zip(adv_rows) {
            let a = row[0] as f32;
            for (x, &m) in d.completion_advantages.iter_mut().zip(&d.completion_mask) {
                *x = if m == 1 { a } else { 0.0 };
            }
        }
        Ok(())
    }

    /// The policy loss on `datums` (one mini-batch, `actor.ppo_epochs` passes): returns the
    /// loss and the number of trained (sampled) tokens.
    fn train_on_datums(
        &mut self,
        step: usize,
        datums: &[Datum],
        m: &mut StepMetrics,
    ) -> Result<(f64, f64)> {
        let device = self.model.device();
        let rows: Vec<(&[i64], &[i64], &[f32])> = datums
            .iter()
            .map(|d| {
                (
                    d.prompt_tokens.as_slice(),
                    d.completion_tokens.as_slice(),
                    d.completion_logprobs.as_slice(),
                )
            })
            .collect();
        let mut batch = Batch::new(&rows, self.pad_id, device);
        // Injected tokens are context, not actions: out of the loss.
        batch.response_mask = batch.response_values(
            datums
                .iter()
                .map(|d| d.completion_mask.iter().map(|&x| x as f32).collect()),
        );
        let advantages =
            batch.response_values(datums.iter().map(|d| d.completion_advantages.clone()));
        let trained = batch.response_mask.sum(Kind::Double).double_value(&[]);
        let nrows = batch.rows;
        // One mini-batch of every datum; data-parallel, each rank takes its share (the datum
        // count varies with the verdicts, so shares may differ by one row).
        let share = nrows.div_ceil(self.dist.world).max(1);
        let micro = self
            .cfg
            .actor
            .ppo_micro_batch_size_per_gpu
            .unwrap_or(share)
            .min(share);
        let partition = Partition {
            rows: nrows,
            mini: nrows,
            micro,
            shuffle: self.cfg.actor.shuffle,
            seed: mix(self.cfg.trainer.seed, step as u64, 0x7368_7566),
            rank: self.dist.rank,
            world: self.dist.world,
        };
        let first = partition.parts(0);
        let temperature = self.cfg.rollout.temperature;
        // Several epochs need the old log-probs before the first update changes the weights.
        let old = if self.cfg.actor.ppo_epochs > 1 || self.cfg.trainer.check_on_policy {
            Some(batch.logprobs_by_parts(
                &self.model,
                &first,
                temperature,
                self.unembed_chunk(),
                &self.dist,
            )?)
        } else {
            None
        };
        let lr = self.schedule.lr(step - 1);
        m.insert("actor/lr".into(), lr);
        let t_upd = Instant::now();
        let mask = batch.response_mask.shallow_clone();
        let input = UpdateInputs {
            batch: &batch,
            partition: &partition,
            first,
            old: old.as_ref(),
            reference: None,
            advantages: &advantages,
            response_mask: &mask,
            is_weights: None,
            lr,
        };
        self.update(step, input, m)?;
        m.insert("timing_s/update".into(), t_upd.elapsed().as_secs_f64());
        let loss = m.get("actor/pg_loss").copied().unwrap_or(0.0);
        Ok((loss, trained))
    }
}
