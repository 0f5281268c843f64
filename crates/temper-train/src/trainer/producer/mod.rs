//! The producer half of a step: it draws the step's questions, samples their answers (a prompt
//! run's groups, `draw_groups.rs`) or plays their episodes (an environment's, `env_step.rs`),
//! scores them, and hands the finished per-question datums to the consumer (the trainer's
//! [`Learner`]), which forms the batch, computes the old and reference log-probs and the
//! advantages, updates and publishes the new weights back through [`Producer::publish`]. With
//! `rollout.async_steps` it runs ahead of the consumer: batches sent to the sampler thread or the
//! servers (`sampling/`), an environment's next episodes played during the update.
//!
//! Its state is its own (the data and the reward, the samplers, the environment, the tokenizer);
//! what it reads of the consumer (the policy it samples with, and the optimizer that gathers a
//! sharded policy's layers for it) and the run's counters (`TrainerState`) are handed to each
//! call.
mod draw_groups;
mod env_runtime;
mod env_step;
mod episodes;
mod questions;
mod rollout;
mod sampling;
mod score;

pub(crate) use rollout::Group;
pub(crate) use sampling::{ServersSync, Synced};

use super::learner::Learner;
use super::stats::{put_mmm, MetricAcc, StepMetrics};
use super::step_batch::AdvantageKind;
use crate::checkpoint::TrainerState;
use crate::config::{Config, EvalConfig};
use crate::data::{DataOrder, Dataset, PromptTemplate};
use crate::dist::Dist;
use crate::rundir::RunDir;
use anyhow::Result;
use serde_json::json;
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;
use temper_env::Datum;
use temper_model::{CausalLm, ComputeKind, Tokenizer};
use temper_reward::Reward;
use temper_rollout::{Finish, SamplingParams};

/// Salt of the training sampling seeds (evaluation uses another).
pub(crate) const TRAIN_SEED_SALT: u64 = 0x0074_7261_696e;

/// The producer: the questions and their reward, the samplers (in process, a sampler thread or
/// servers), an environment run's environment, and the tokenizer that renders and decodes.
pub(crate) struct Producer {
    questions: questions::Questions,
    rollouts: sampling::Rollouts,
    /// The environment of an `env.name` run (None: prompts + reward).
    env: Option<env_runtime::EnvRuntime>,
    tokenizer: Tokenizer,
    eos_ids: Vec<i64>,
    dist: Arc<Dist>,
    /// `trainer.seed`: every sampling seed derives from it.
    seed: u64,
    /// Warnings already shown once (e.g. no response ever ended).
    warned: BTreeSet<&'static str>,
}

/// What [`Producer::new`] is made of, besides the config.
pub(crate) struct ProducerParts<'a> {
    pub tokenizer: Tokenizer,
    pub eos_ids: Vec<i64>,
    pub dist: Arc<Dist>,
    /// Where the policy's weights were loaded from (a sampler thread loads its own copy).
    pub weights_dir: &'a Path,
    pub tokenizer_dir: &'a Path,
    /// The trainer's device and compute dtype.
    pub device: tch::Device,
    pub compute: ComputeKind,
    /// The policy as loaded (a `rollout.device` copy starts from its weights).
    pub policy: &'a CausalLm,
}

/// A step's episodes, whichever source played them: what the batch, the advantages and the
/// update need, and the source's own part for its logs.
pub(crate) struct StepEpisodes {
    /// Per question, its datums (their advantages set when they are `Given`).
    pub groups: Vec<Vec<Datum>>,
    pub advantages: AdvantageKind,
    pub source: Played,
}

impl StepEpisodes {
    pub fn datums(&self) -> impl Iterator<Item = &Datum> {
        self.groups.iter().flatten()
    }
}

/// Which source played a step, and what it keeps for the step's logs.
pub(crate) enum Played {
    /// A prompt + reward run's groups.
    Prompts(PromptGroups),
    /// An environment's episodes: their records (written by rank 0), and whether the learner's
    /// estimator sets the advantages over each question's answers (a one-turn task leaves them
    /// to the trainer) before the batch is formed.
    Env {
        records: Vec<(String, serde_json::Value)>,
        estimate_advantages: bool,
    },
}

/// A prompt run's groups.
pub(crate) struct PromptGroups {
    pub groups: Vec<Group>,
    /// Seconds the rollouts took (for `perf/gen_tokens_per_s`).
    pub gen_s: f64,
}

impl Producer {
    /// The producer of a run: its data sets and environment from `cfg`, its samplers (servers,
    /// a sampler thread, a `rollout.device` copy) as `cfg.rollout` asks.
    pub fn new(cfg: &Config, parts: ProducerParts<'_>) -> Result<(Self, usize)> {
        let ProducerParts {
            tokenizer,
            eos_ids,
            dist,
            weights_dir,
            tokenizer_dir,
            device,
            compute,
            policy,
        } = parts;
        let seed = cfg.data.seed.unwrap_or(cfg.trainer.seed);
        let (env, train, val) = if cfg.env.enabled() {
            let (env, questions) =
                env_runtime::EnvRuntime::build(cfg, &tokenizer, &eos_ids, device, compute)?;
            (Some(env), questions, None)
        } else {
            let train = crate::data::load_dataset(&cfg.data, seed, true)?
                .ok_or_else(|| anyhow::anyhow!("no training data"))?;
            (
                None,
                train,
                crate::data::load_dataset(&cfg.data, seed, false)?,
            )
        };
        let reward = super::algo_setup::build_reward(cfg)?;
        let template = PromptTemplate::from_config(
            &cfg.data.prompt_template,
            cfg.data.system_prompt.as_deref(),
        )?;
        let order = DataOrder {
            len: train.len(),
            batch_size: cfg.data.train_batch_size,
            shuffle: cfg.data.shuffle,
            seed,
        };
        if order.batches_per_epoch() == 0 {
            anyhow::bail!(
                "data: {} examples in {} but data.train_batch_size = {}: not one full batch",
                train.len(),
                train.name,
                cfg.data.train_batch_size
            );
        }
        let total_steps = cfg.total_steps(train.len());
        let questions = questions::Questions::new((train, val), order, template, reward, cfg);
        // The samplers last: a config the data refuses stops before any server is contacted or
        // a sampler's copy loaded.
        let rollouts = sampling::Rollouts::build(
            &cfg.rollout,
            sampling::RolloutsSpec {
                weights_dir,
                tokenizer_dir,
                device,
                compute,
                eos_ids: &eos_ids,
                policy,
                lora: cfg.model.lora_rank > 0,
                is_root: dist.is_root(),
            },
        )?;
        Ok((
            Producer {
                questions,
                rollouts,
                env,
                tokenizer,
                eos_ids,
                dist,
                seed: cfg.trainer.seed,
                warned: BTreeSet::new(),
            },
            total_steps,
        ))
    }

    /// The training data set.
    pub fn train_data(&self) -> &Dataset {
        self.questions.train()
    }

    /// Replaces the configured reward (tests and benchmarks score with their own).
    pub fn set_reward(&mut self, reward: Box<dyn Reward>) {
        self.questions.set_reward(reward);
    }

    /// The epoch data batch `batch` belongs to.
    pub fn epoch_of(&self, batch: usize) -> usize {
        self.questions.epoch_of(batch)
    }

    /// `rollout.n`: answers (or episodes) per question.
    pub fn n(&self) -> usize {
        self.rollouts.cfg().n
    }

    /// `rollout.async_steps`: how many policy versions the producer may run ahead.
    pub fn async_steps(&self) -> usize {
        self.rollouts.cfg().async_steps
    }

    /// An environment run (`env.name`).
    pub fn plays_episodes(&self) -> bool {
        self.env.is_some()
    }

    /// The rollout backend, for the run's metadata (none in process).
    pub fn metadata(&self) -> Option<serde_json::Value> {
        self.rollouts.metadata()
    }

    /// The sampling parameters of a training step's answers.
    pub fn rollout_params(&self) -> SamplingParams {
        self.rollouts
            .cfg()
            .sampling_params(self.questions.max_response_length())
    }

    /// The sampling parameters of an evaluation under `eval`.
    pub fn eval_params(&self, eval: &EvalConfig) -> SamplingParams {
        eval.sampling_params(
            self.questions.max_response_length(),
            &self.rollouts.cfg().stop,
        )
    }

    /// The validation set (`data.val_files`; none for an environment run).
    pub fn val(&self) -> Option<&Dataset> {
        self.questions.val()
    }

    /// The consumer's new weights (policy `version`) to the samplers: the sampler thread's copy,
    /// the `rollout.device` copy, the servers (see [`sampling::Rollouts::sync`]).
    pub fn publish(
        &mut self,
        learner: &Learner,
        run_root: &Path,
        version: u64,
        mode: ServersSync,
    ) -> Result<Synced> {
        self.rollouts
            .sync(learner, &self.dist, run_root, version, mode)
    }

    /// The end of a fit: what is in flight is waited for and dropped.
    pub fn finish(&mut self) {
        self.rollouts.finish();
    }

    /// Phase 1 of a step: the step's questions drawn, answered or played, scored, as
    /// per-question datums (a prompt run's groups, sent ahead for the next steps when the run
    /// overlaps; an environment's episodes), sampled by `learner`'s policy in process. The data
    /// batches drawn are counted in `state`, whose policy version is the consumer's.
    pub fn episodes(
        &mut self,
        step: usize,
        learner: &Learner,
        state: &mut TrainerState,
        m: &mut StepMetrics,
    ) -> Result<StepEpisodes> {
        match self.env.is_some() {
            true => self.env_episodes(step, learner, state, m),
            false => self.prompt_episodes(step, learner, state, m),
        }
    }

    /// A prompt + reward run's step: its groups drawn, sampled and scored (`draw_groups.rs`),
    /// each prompt's `n` answers one-turn episodes, as datums; overlap sends the next steps'
    /// batches to the sampler thread or the servers, sampled while this one trains.
    fn prompt_episodes(
        &mut self,
        step: usize,
        learner: &Learner,
        state: &mut TrainerState,
        m: &mut StepMetrics,
    ) -> Result<StepEpisodes> {
        let params = self.rollout_params();
        let t_gen = Instant::now();
        let drawn = self.draw_groups(step, learner, state, &params)?;
        let gen_s = t_gen.elapsed().as_secs_f64();
        m.insert("timing_s/gen".into(), gen_s);
        m.extend(self.rollouts.ahead_metrics());
        self.generate_ahead(state.batches_drawn, &params)?;
        m.extend(drawn.metrics(state.policy_version));
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
            advantages: AdvantageKind::FromRewards,
            source: Played::Prompts(PromptGroups { groups, gen_s }),
        })
    }

    /// After an update with partial rollouts, a streaming sampler thread gets the batch the new
    /// weights allow now (`next_batch`), queued behind them, so its rows join those still
    /// sampling instead of waiting for the next step's draw (the same batch that draw would
    /// send). Nothing otherwise.
    pub fn stream_ahead(&mut self, next_batch: usize) -> Result<()> {
        if self.rollouts.cfg().partial_rollouts && self.env.is_none() {
            let params = self.rollout_params();
            self.generate_ahead(next_batch, &params)?;
        }
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

    /// How the in-process engine's fixed-shape decode steps ran so far, when it samples on a GPU
    /// (the CPU engine runs no fixed-shape steps).
    pub fn decode_counts(&self, policy: &CausalLm) -> Option<temper_model::DecodeCounts> {
        let model = self.rollouts.engine_model(policy);
        (!self.rollouts.is_remote() && model.device() != tch::Device::Cpu)
            .then(|| model.static_decode_counts())
    }

    /// `perf/decode_tflops`, `perf/decode_gb_per_s` and `perf/decode_bandwidth_fraction` of the
    /// in-process engine's decode steps since the last call, read against the roof measured at
    /// start (when the engine samples on the trainer's device, where the roof was measured).
    pub fn decode_metrics(&self, learner: &Learner, m: &mut StepMetrics) {
        let work = self.rollouts.take_decode_work();
        let model = self.rollouts.engine_model(learner.model());
        if work.steps == 0 || model.device() != learner.model().device() {
            return;
        }
        for (k, v) in work.metrics(model.config(), model.compute(), learner.roof()) {
            m.insert(k.into(), v);
        }
    }

    /// Decoding done since the last call is forgotten (an evaluation's is no step's).
    pub fn forget_decode_work(&self) {
        self.rollouts.take_decode_work();
    }

    /// A prompt run's `rollouts/step_<step>.jsonl`: every answer with its score, reward,
    /// advantage (`adv`, per row), the old log-probs (`old`, per row) and the sampler's.
    pub fn write_rollouts(
        &self,
        run: &RunDir,
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
        crate::rundir::write_atomic(&run.rollouts(step), out.as_bytes())
    }
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
