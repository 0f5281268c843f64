//! Phases 1 -> 2 of a step, for either source: the step's episodes (per question, its datums: a
//! prompt's `n` answers, each a one-turn episode, or an environment group's datums) as one padded
//! batch (row i = the i-th datum in question order), with the per-row rewards and question ids
//! the advantages need, or the advantages the environment set.
use super::batch::Batch;
use super::stats::{put_mmm, StepMetrics};
use tch::{Device, Tensor};
use temper_env::Datum;

/// How a step's batch is learned from, as its source says.
#[derive(Clone, Copy)]
pub(crate) struct Learning {
    pub advantages: AdvantageKind,
    /// Responses per optimizer step, all ranks together.
    pub mini: usize,
    /// Whether the old log-probs are wanted even when the update is skipped (a prompt run's
    /// rollouts files record them).
    pub need_old: bool,
}

/// Where a step's advantages come from.
#[derive(Clone, Copy)]
pub(crate) enum AdvantageKind {
    /// `algorithm.adv_estimator` over each question's rewards, once the old and reference
    /// log-probs are known (the KL penalty in the reward needs them).
    FromRewards,
    /// Per token, as the environment set them in the datums; a step where all are zero is
    /// skipped with `skip_zero` (`env.skip_zero_advantage`), else an error.
    Given { skip_zero: bool },
}

pub(crate) struct StepBatch {
    pub batch: Batch,
    /// Per row: its datum's reward.
    pub scores: Vec<f64>,
    /// Per row: its question's index in the step (the GRPO baseline is per question).
    pub index: Vec<i64>,
    /// Per row: completion and prompt lengths in tokens.
    pub response_len: Vec<f64>,
    pub prompt_len: Vec<f64>,
    /// (N, R) f32: the advantages the environment set (`None`: from `scores`).
    pub given_advantages: Option<Tensor>,
    pub learning: Learning,
}

impl StepBatch {
    /// The datums of `groups` as one batch, its loss mask their sampled tokens (injected tokens
    /// are context, not actions). With `shared_prefix` (`actor.shared_prefix`), rows with equal
    /// prompts run their prompt once in every log-prob pass; with `remove_padding`
    /// (`model.use_remove_padding`), the passes run packed rows.
    pub fn new(
        groups: &[Vec<Datum>],
        learning: Learning,
        pad_id: i64,
        device: Device,
        shared_prefix: bool,
        remove_padding: bool,
    ) -> Self {
        let datums: Vec<&Datum> = groups.iter().flatten().collect();
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
        let mut batch = Batch::new(&rows, pad_id, device);
        if shared_prefix {
            batch.share_prompts(&rows.iter().map(|r| r.0).collect::<Vec<_>>());
        }
        if remove_padding {
            batch.remove_padding(&rows);
        }
        batch.response_mask = batch.response_values(
            datums
                .iter()
                .map(|d| d.completion_mask.iter().map(|&x| x as f32).collect()),
        );
        let given_advantages = match learning.advantages {
            AdvantageKind::FromRewards => None,
            AdvantageKind::Given { .. } => {
                Some(batch.response_values(datums.iter().map(|d| d.completion_advantages.clone())))
            }
        };
        StepBatch {
            batch,
            scores: datums.iter().map(|d| d.reward).collect(),
            index: groups
                .iter()
                .enumerate()
                .flat_map(|(gi, g)| std::iter::repeat_n(gi as i64, g.len()))
                .collect(),
            response_len: datums
                .iter()
                .map(|d| d.completion_tokens.len() as f64)
                .collect(),
            prompt_len: datums
                .iter()
                .map(|d| d.prompt_tokens.len() as f64)
                .collect(),
            given_advantages,
            learning,
        }
    }

    /// Prompt and response tokens of the whole batch (for `perf/tokens_per_s`).
    pub fn tokens(&self) -> f64 {
        self.response_len.iter().sum::<f64>() + self.prompt_len.iter().sum::<f64>()
    }

    /// `prompt_length/*`.
    pub fn metrics(&self, m: &mut StepMetrics) {
        put_mmm(m, "prompt_length", &self.prompt_len);
    }
}
