//! Rollouts: prompts through the template, requests seeded by global position, sampled in
//! process or on the servers as one-turn episode groups (`episodes.rs`); the groups they make
//! are scored in `score.rs`.
use super::Trainer;
use crate::config::{GroupMetric, WeightSync};
use anyhow::Result;
use std::collections::BTreeMap;
use temper_model::{CausalLm, Tokenizer};
use temper_rollout::{Engine, EngineConfig, Request, Sample, Sampler, SamplingParams};

/// Where a run's rollouts are sampled: on the rollout servers (`rollout.backend` remote), else by
/// the in-process engine with the policy, or with its copy on `rollout.device`.
pub(crate) struct Rollouts {
    /// The rollout servers when `rollout.backend` is remote.
    pub(super) servers: Option<super::servers::RolloutServers>,
    /// `rollout.async_steps > 0` in process: the sampler thread generating ahead.
    pub(super) ahead: Option<super::local_ahead::LocalAhead>,
    /// `rollout.device`: the policy's copy the in-process engine samples with, refreshed after
    /// every optimizer step (None: the engine uses the policy).
    pub(super) sampler_model: Option<CausalLm>,
    /// The `rollout` section (engine batch size, weight sync, prefetch, sampling).
    pub(super) cfg: crate::config::RolloutConfig,
    /// What the in-process engine's decode steps did since [`Rollouts::take_decode_work`].
    pub(super) decode_work: std::sync::Mutex<temper_model::DecodeWork>,
}

impl Rollouts {
    /// The weights the in-process engine samples with: the copy on `rollout.device`, else the
    /// policy itself.
    pub(super) fn engine_model<'a>(&'a self, policy: &'a CausalLm) -> &'a CausalLm {
        self.sampler_model.as_ref().unwrap_or(policy)
    }

    /// Runs `f` with the in-process sampler's frozen weights built once
    /// ([`temper_model::CausalLm::with_sampling_weights`]): every engine call inside reuses them
    /// (one policy version, several sampling rounds). With rollout servers there is nothing to
    /// freeze.
    pub(super) fn with_sampling_weights<T>(&self, policy: &CausalLm, f: impl FnOnce() -> T) -> T {
        match &self.servers {
            Some(_) => f(),
            None => self.engine_model(policy).with_sampling_weights(f),
        }
    }

    /// Samples `requests` on the servers (`on_servers`, with a remote backend), else in process
    /// with `policy` (or its `rollout.device` copy), `rollout.max_num_seqs` rows at a time, or,
    /// without `policy`, on the sampler thread with its copy. Every request carries its own
    /// seed, so a server's engine or the thread draws what this one would.
    pub(super) fn sample(
        &self,
        policy: Option<&CausalLm>,
        eos_ids: &[i64],
        tokenizer: &Tokenizer,
        requests: &[Request],
        seed: u64,
        on_servers: bool,
    ) -> Result<Vec<Sample>> {
        if requests.is_empty() {
            return Ok(vec![]);
        }
        let mut engine = None;
        let sampler: &dyn Sampler = match (&self.servers, policy) {
            (Some(r), _) if on_servers => r.sampler.as_ref(),
            (_, Some(policy)) => {
                engine.insert(self.engine(self.engine_model(policy), eos_ids, tokenizer, seed))
            }
            (_, None) => {
                let ahead = self.ahead.as_ref().ok_or_else(|| {
                    anyhow::anyhow!("policy requests without weights or a sampler thread")
                })?;
                return ahead.answer(requests.to_vec(), seed);
            }
        };
        let samples = sampler.sample(requests);
        if let Some(engine) = engine {
            let mut work = self.decode_work.lock().unwrap_or_else(|e| e.into_inner());
            *work = work.plus(engine.decode_work());
        }
        samples
    }

    /// What the in-process engine's decode steps did since the last call (nothing with
    /// servers or the sampler thread).
    pub(super) fn take_decode_work(&self) -> temper_model::DecodeWork {
        std::mem::take(&mut *self.decode_work.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The in-process engine over `model` (the policy, its copy, or a debate's judge),
    /// `rollout.max_num_seqs` rows per batch, drawing with `seed`.
    pub(super) fn engine<'a>(
        &self,
        model: &'a CausalLm,
        eos_ids: &[i64],
        tokenizer: &'a Tokenizer,
        seed: u64,
    ) -> Engine<'a> {
        Engine::new(model, eos_ids.to_vec())
            .with_decoder(tokenizer)
            .with_config(EngineConfig {
                max_batch_rows: self.cfg.max_num_seqs,
                seed,
                ..EngineConfig::default()
            })
    }

    /// The policy version that samples now: the servers' for a remote backend, else the
    /// trainer's own (`trainer_version`).
    pub(super) fn sampling_version(&self, trainer_version: u64) -> u64 {
        match &self.servers {
            Some(r) => r.served_version,
            None => trainer_version,
        }
    }
}

/// The `n` responses to one prompt and their scores.
#[derive(serde::Serialize, serde::Deserialize)]
pub(crate) struct Group {
    pub example: usize,
    /// The trainer's optimizer steps behind the weights that sampled it.
    #[serde(default)]
    pub policy_version: u64,
    pub samples: Vec<Sample>,
    pub texts: Vec<String>,
    /// The rewards trained on (with `reward.overlong_buffer`'s penalty when it is on).
    pub scores: Vec<f64>,
    /// The rewards before that penalty (verl's `acc` for `algorithm.filter_groups.metric`).
    #[serde(default)]
    pub raw_scores: Vec<f64>,
    pub reward_metrics: Vec<BTreeMap<String, f64>>,
    /// Per sample, why the reward could not score it (None when it could).
    pub reward_error_reasons: Vec<Option<String>>,
    pub reward_errors: usize,
}

impl Group {
    /// All `n` rewards equal, so every advantage is 0.
    pub(crate) fn zero_variance(&self) -> bool {
        all_equal(&self.scores)
    }

    /// What DAPO's dynamic sampling drops: `metric` (verl's names) equal across the group.
    pub(crate) fn no_spread_in(&self, metric: GroupMetric) -> bool {
        match metric {
            GroupMetric::Acc => all_equal(&self.raw_scores),
            GroupMetric::Score | GroupMetric::SeqReward | GroupMetric::SeqFinalReward => {
                all_equal(&self.scores)
            }
        }
    }
}

fn all_equal(v: &[f64]) -> bool {
    v.len() > 1 && v.iter().all(|s| *s == v[0])
}

impl Group {
    /// The group's answers as one-turn episodes' datums: every completion token sampled (mask
    /// 1), rewarded with its score; the advantages come from the scores once the step knows its
    /// old and reference log-probs.
    pub(crate) fn datums(&self) -> Vec<temper_env::Datum> {
        self.samples
            .iter()
            .zip(&self.scores)
            .map(|(s, &reward)| temper_env::Datum {
                prompt_tokens: s.prompt_ids.clone(),
                completion_tokens: s.completion_ids.clone(),
                completion_logprobs: s.completion_logprobs.clone(),
                completion_advantages: vec![0.0; s.completion_ids.len()],
                completion_mask: vec![1; s.completion_ids.len()],
                group: self.example.to_string(),
                reward,
            })
            .collect()
    }
}

impl Trainer {
    /// Samples `params.n` responses for each example and scores them. `idx` starts at position
    /// `first_position` of the step's whole batch: a request's seed depends on its example and
    /// its position in the whole batch, so rollouts do not depend on how the batch is sharded.
    pub(crate) fn rollout_groups(
        &self,
        dataset: &crate::data::Dataset,
        idx: &[usize],
        params: &SamplingParams,
        seed: u64,
        first_position: usize,
    ) -> Result<Vec<Group>> {
        let (kept, requests) = self.rollout_requests(dataset, idx, params, seed, first_position)?;
        // The servers only when they hold the trainer's weights (evaluation must score this
        // policy, not one a few versions back or a server's own with `weight_sync = "none"`).
        let on_servers = self.rollouts.servers.as_ref().is_some_and(|r| {
            self.rollouts.cfg.weight_sync != WeightSync::None
                && r.served_version == self.state.policy_version
        });
        let (samples, texts) = self.one_turn_rollouts(requests, seed, on_servers)?;
        self.groups_from(
            dataset,
            &kept,
            samples,
            Some(texts),
            self.state.policy_version,
        )
    }

    /// The requests of [`Trainer::rollout_groups`] and the examples they are for (prompts that
    /// `data.filter_overlong_prompts` drops are left out).
    pub(crate) fn rollout_requests(
        &self,
        dataset: &crate::data::Dataset,
        idx: &[usize],
        params: &SamplingParams,
        seed: u64,
        first_position: usize,
    ) -> Result<(Vec<usize>, Vec<Request>)> {
        let mut kept = Vec::new();
        let mut requests = Vec::new();
        for (pos, &i) in idx.iter().enumerate() {
            let where_ = format!("{} example {i}", dataset.name);
            if let Some(ids) =
                self.questions
                    .prompt_ids(&self.tokenizer, &dataset.examples[i], &where_)?
            {
                let params = SamplingParams {
                    seed: Some(temper_base::seed::mix(
                        seed,
                        i as u64,
                        (first_position + pos) as u64,
                    )),
                    ..params.clone()
                };
                requests.push(Request {
                    prompt_ids: ids,
                    params,
                });
                kept.push(i);
            }
        }
        Ok((kept, requests))
    }
}

/// Copies every parameter of `from` into `to` (any devices; the same architecture), a part of
/// the model at a time ([`CausalLm::for_each_part`]): with a sharded run's layers one decoder
/// layer is whole at a time, gathered by every rank alike.
pub(super) fn copy_weights(from: &CausalLm, to: &CausalLm) -> Result<()> {
    let mut dst: std::collections::HashMap<String, tch::Tensor> =
        to.named_parameters().into_iter().collect();
    let expected = dst.len();
    let mut copied = 0;
    from.for_each_part(&mut |params| {
        for (name, value) in params {
            let Some(d) = dst.remove(&name) else {
                anyhow::bail!("the sampling copy has no parameter {name}");
            };
            tch::no_grad(|| d.shallow_clone().copy_(&value));
            copied += 1;
        }
        Ok(())
    })?;
    anyhow::ensure!(
        copied == expected,
        "the sampling copy has {expected} parameters, the policy {copied}"
    );
    Ok(())
}

impl Trainer {
    /// A sampling phase (a step's draws, an evaluation) begins, on every rank alike: the
    /// in-process sampler's copies are built once for all its calls. With a sharded optimizer
    /// they are built layer by layer from the gathered slices (the whole f32 weights never
    /// exist), on every rank whether or not it has prompts, as the gathers are collectives.
    pub(super) fn freeze_sampler(&self) {
        if self.rollouts.servers.is_none() || self.learner.optimizer.is_sharded() {
            self.rollouts
                .engine_model(&self.learner.model)
                .freeze_for_sampling();
        }
    }

    /// The sampling phase is over: the copies go (see [`Trainer::freeze_sampler`]; nothing
    /// when none were built).
    pub(super) fn thaw_sampler(&self) -> Result<()> {
        self.rollouts
            .engine_model(&self.learner.model)
            .thaw_after_sampling();
        self.learner.optimizer.check()
    }
}
