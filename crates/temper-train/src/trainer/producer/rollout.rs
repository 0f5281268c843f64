//! Rollouts: prompts through the template, requests seeded by global position, sampled in
//! process or on the servers as one-turn episode groups (`episodes.rs`); the groups they make
//! are scored in `score.rs`.
use super::Producer;
use crate::config::GroupMetric;
use crate::trainer::Learner;
use anyhow::Result;
use std::collections::BTreeMap;
use temper_rollout::{Request, Sample, SamplingParams};

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

impl Producer {
    /// Samples `params.n` responses for each of `dataset`'s examples at positions `range` (of
    /// the whole set being sampled) with `learner`'s policy (version `policy_version`) and scores
    /// them. A request's seed depends on its example and its position in the whole set, so the
    /// rollouts do not depend on how the set is sharded over the ranks.
    pub(crate) fn rollout_groups(
        &self,
        learner: &Learner,
        policy_version: u64,
        dataset: &crate::data::Dataset,
        range: std::ops::Range<usize>,
        params: &SamplingParams,
        seed: u64,
    ) -> Result<Vec<Group>> {
        let idx: Vec<usize> = range.clone().collect();
        let (kept, requests) = self.rollout_requests(dataset, &idx, params, seed, range.start)?;
        // The servers only when they hold the trainer's weights (evaluation must score this
        // policy, not one a few versions back or a server's own with `weight_sync = "none"`).
        let on_servers = self.rollouts.serves_version(policy_version);
        let (samples, texts) =
            self.one_turn_rollouts(learner.model(), requests, seed, on_servers)?;
        self.groups_from(dataset, &kept, samples, Some(texts), policy_version)
    }

    /// The requests of [`Producer::rollout_groups`] and the examples they are for (prompts that
    /// `data.filter_overlong_prompts` drops are left out).
    pub(super) fn rollout_requests(
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

impl Producer {
    /// A sampling phase (a step's draws, an evaluation) begins, on every rank alike: the
    /// in-process sampler's copies are built once for all its calls. With a sharded optimizer
    /// they are built layer by layer from the gathered slices (the whole f32 weights never
    /// exist), on every rank whether or not it has prompts, as the gathers are collectives.
    pub(crate) fn freeze_sampler(&self, learner: &Learner) {
        if !self.rollouts.is_remote() || learner.optimizer().is_sharded() {
            self.rollouts
                .engine_model(learner.model())
                .freeze_for_sampling();
        }
    }

    /// The sampling phase is over: the copies go (see [`Producer::freeze_sampler`]; nothing
    /// when none were built).
    pub(crate) fn thaw_sampler(&self, learner: &Learner) -> Result<()> {
        self.rollouts
            .engine_model(learner.model())
            .thaw_after_sampling();
        learner.optimizer().check()
    }
}
