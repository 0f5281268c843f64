//! The questions part of a run: the training and validation sets, the order batches are drawn in,
//! the prompt template and length policy, and the reward that scores answers (with
//! `reward.on_error` and DAPO's overlong penalty), with the config sections these read (`data`,
//! `reward`, `algorithm.filter_groups`). Its state is its own: the rest of the trainer draws
//! batches, renders prompts and scores answers through its methods.
use super::rollout::Group;
use crate::config::{Config, DataConfig, FilterGroupsConfig, OnError, RewardConfig, Truncation};
use crate::data::{DataOrder, Dataset, Example, PromptTemplate};
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use temper_model::Tokenizer;
use temper_reward::Reward;

pub(crate) struct Questions {
    train: Dataset,
    /// `data.val_files` (none for an environment run).
    val: Option<Dataset>,
    order: DataOrder,
    template: PromptTemplate,
    reward: Box<dyn Reward>,
    /// The `data` section: prompt and response lengths, the batch size.
    data: DataConfig,
    /// The `reward` section: errors, the overlong penalty.
    reward_cfg: RewardConfig,
    /// `algorithm.filter_groups`: DAPO's dynamic sampling while drawing a step's groups.
    filter_groups: FilterGroupsConfig,
}

impl Questions {
    /// A run's questions: its data sets in `order`, rendered by `template`, scored by `reward`,
    /// under `cfg`'s `data`, `reward` and `algorithm.filter_groups` sections.
    pub(super) fn new(
        (train, val): (Dataset, Option<Dataset>),
        order: DataOrder,
        template: PromptTemplate,
        reward: Box<dyn Reward>,
        cfg: &Config,
    ) -> Self {
        Self {
            train,
            val,
            order,
            template,
            reward,
            data: cfg.data.clone(),
            reward_cfg: cfg.reward.clone(),
            filter_groups: cfg.algorithm.filter_groups.clone(),
        }
    }

    /// The example indices of data batch `batch` (0-based, over every epoch) and its epoch.
    pub(super) fn draw(&self, batch: usize) -> (usize, Vec<usize>) {
        self.order.batch(batch)
    }

    /// The epoch data batch `batch` belongs to (no permutation drawn).
    pub(super) fn epoch_of(&self, batch: usize) -> usize {
        self.order.epoch_of(batch)
    }

    /// The training set.
    pub(super) fn train(&self) -> &Dataset {
        &self.train
    }

    /// The validation set (`data.val_files`; none for an environment run).
    pub(super) fn val(&self) -> Option<&Dataset> {
        self.val.as_ref()
    }

    /// `data.max_response_length`.
    pub(super) fn max_response_length(&self) -> usize {
        self.data.max_response_length
    }

    /// `data.train_batch_size`: questions (groups) a step trains on.
    pub(super) fn batch_size(&self) -> usize {
        self.data.train_batch_size
    }

    /// `algorithm.filter_groups`: DAPO's dynamic sampling.
    pub(super) fn filter_groups(&self) -> &FilterGroupsConfig {
        &self.filter_groups
    }

    /// Replaces the configured reward.
    pub(super) fn set_reward(&mut self, reward: Box<dyn Reward>) {
        self.reward = reward;
    }

    /// The prompt token ids of an example, after the template and the length policy; `None` when
    /// `data.filter_overlong_prompts` drops it.
    pub(super) fn prompt_ids(
        &self,
        tokenizer: &Tokenizer,
        ex: &Example,
        where_: &str,
    ) -> Result<Option<Vec<i64>>> {
        let text = self
            .template
            .render(&ex.prompt, tokenizer)
            .with_context(|| where_.to_string())?;
        let mut ids = tokenizer
            .encode(&text, false)
            .with_context(|| where_.to_string())?;
        let max = self.data.max_prompt_length;
        if ids.len() > max {
            if self.data.filter_overlong_prompts {
                return Ok(None);
            }
            match self.data.truncation {
                Truncation::Left => ids.drain(..ids.len() - max).for_each(drop),
                Truncation::Right => ids.truncate(max),
                Truncation::Error => bail!(
                    "{where_}: prompt has {} tokens > data.max_prompt_length = {max} (set data.truncation = left|right \
                     or data.filter_overlong_prompts = true)",
                    ids.len()
                ),
            }
        }
        if ids.is_empty() {
            bail!("{where_}: the prompt is empty after tokenization");
        }
        Ok(Some(ids))
    }

    /// Scores every response (in parallel); a panicking or non-finite reward stops the run or
    /// scores 0, as `reward.on_error` says.
    pub(super) fn score(&self, dataset: &Dataset, groups: &mut [Group]) -> Result<()> {
        let jobs: Vec<(usize, usize)> = groups
            .iter()
            .enumerate()
            .flat_map(|(g, gr)| (0..gr.samples.len()).map(move |k| (g, k)))
            .collect();
        let inputs: Vec<temper_reward::ScoreInput<'_>> = jobs
            .iter()
            .map(|&(g, k)| {
                let ex = &dataset.examples[groups[g].example];
                temper_reward::ScoreInput {
                    prompt: ex.prompt.text(),
                    completion: &groups[g].texts[k],
                    ground_truth: &ex.answer,
                    metadata: &ex.metadata,
                }
            })
            .collect();
        let outputs = temper_reward::score_all(&*self.reward, &inputs);
        drop(inputs);
        let results = jobs
            .into_iter()
            .zip(outputs)
            .map(|((g, k), out)| (g, k, out));
        for g in groups.iter_mut() {
            g.scores = vec![0.0; g.samples.len()];
            g.reward_metrics = vec![BTreeMap::new(); g.samples.len()];
            g.reward_error_reasons = vec![None; g.samples.len()];
        }
        for (g, k, out) in results {
            match out {
                Ok(o) => {
                    // A response the reward could not score (a grader timeout, a failed
                    // command) scores 0 and is counted; it is the response's fault, not the
                    // reward's, so `on_error = "fail"` does not stop the run for it.
                    if o.error.is_some() {
                        groups[g].reward_errors += 1;
                    }
                    groups[g].scores[k] = if o.error.is_some() { 0.0 } else { o.reward };
                    groups[g].reward_metrics[k] = o.metrics;
                    groups[g].reward_error_reasons[k] = o.error;
                }
                Err(e) => {
                    let ex = groups[g].example;
                    if self.reward_cfg.on_error == OnError::Fail {
                        bail!(
                            "reward `{}` failed on {} example {ex} sample {k}: {e} (set reward.on_error = \"zero\" to \
                             score such responses 0 and continue)",
                            self.reward.name(),
                            dataset.name
                        );
                    }
                    groups[g].reward_errors += 1;
                }
            }
        }
        self.add_overlong_penalty(groups);
        Ok(())
    }

    /// `reward.overlong_buffer`: DAPO's length penalty on top of each reward (`raw_scores` keep
    /// the rewards without it).
    fn add_overlong_penalty(&self, groups: &mut [Group]) {
        let ob = &self.reward_cfg.overlong_buffer;
        let max_len = self.data.max_response_length;
        for g in groups.iter_mut() {
            g.raw_scores = g.scores.clone();
            if !ob.enable {
                continue;
            }
            for (k, s) in g.samples.iter().enumerate() {
                let penalty = ob.penalty(s.completion_ids.len(), max_len);
                g.scores[k] += penalty;
                if ob.log {
                    let m = &mut g.reward_metrics[k];
                    m.insert("overlong_reward".into(), penalty);
                    m.insert("overlong".into(), f64::from(u8::from(penalty < 0.0)));
                }
            }
        }
    }
}
