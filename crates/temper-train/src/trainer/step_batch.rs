//! Phase 2 of a step: the drawn groups flattened into one padded batch (row i = group i / n,
//! sample i % n), with the per-row scores and group ids the advantages need.
use super::batch::Batch;
use super::rollout::Group;
use super::stats::{put_mmm, MetricAcc, StepMetrics};
use tch::Device;
use temper_rollout::Finish;

pub(crate) struct StepBatch {
    pub batch: Batch,
    /// Per row: the reward's score.
    pub scores: Vec<f64>,
    /// Per row: its group's index (the GRPO baseline is per group).
    pub index: Vec<i64>,
    /// Per row: completion and prompt lengths in tokens.
    pub response_len: Vec<f64>,
    pub prompt_len: Vec<f64>,
    /// The fraction of rows that stopped at `data.max_response_length`.
    pub clip_ratio: f64,
}

impl StepBatch {
    /// With `shared_prefix` (`actor.shared_prefix`), rows with equal prompts run their prompt
    /// once in every log-prob pass; with `remove_padding` (`model.use_remove_padding`), the passes
    /// run packed rows.
    pub fn new(
        groups: &[Group],
        pad_id: i64,
        device: Device,
        shared_prefix: bool,
        remove_padding: bool,
    ) -> Self {
        let samples: Vec<_> = groups.iter().flat_map(|g| g.samples.iter()).collect();
        let rows: Vec<(&[i64], &[i64], &[f32])> = samples
            .iter()
            .map(|s| {
                (
                    s.prompt_ids.as_slice(),
                    s.completion_ids.as_slice(),
                    s.completion_logprobs.as_slice(),
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
        let clipped = samples
            .iter()
            .filter(|s| s.finish == Finish::Length)
            .count();
        StepBatch {
            clip_ratio: clipped as f64 / batch.rows as f64,
            batch,
            scores: groups
                .iter()
                .flat_map(|g| g.scores.iter().copied())
                .collect(),
            index: groups
                .iter()
                .enumerate()
                .flat_map(|(gi, g)| std::iter::repeat_n(gi as i64, g.samples.len()))
                .collect(),
            response_len: samples
                .iter()
                .map(|s| s.completion_ids.len() as f64)
                .collect(),
            prompt_len: samples.iter().map(|s| s.prompt_ids.len() as f64).collect(),
        }
    }

    /// Prompt and response tokens of the whole batch (for `perf/tokens_per_s`).
    pub fn tokens(&self) -> f64 {
        self.response_len.iter().sum::<f64>() + self.prompt_len.iter().sum::<f64>()
    }

    /// `response_length/*`, `prompt_length/*`, `critic/score/*` and the reward's own
    /// `reward/*` metrics (means over the samples of `groups`, the groups it was built from).
    pub fn metrics(&self, groups: &[Group]) -> StepMetrics {
        let mut m = StepMetrics::new();
        put_mmm(&mut m, "response_length", &self.response_len);
        put_mmm(&mut m, "prompt_length", &self.prompt_len);
        m.insert("response_length/clip_ratio".into(), self.clip_ratio);
        put_mmm(&mut m, "critic/score", &self.scores);
        let mut reward_acc = MetricAcc::default();
        for rm in groups.iter().flat_map(|g| &g.reward_metrics) {
            for (k, v) in rm {
                reward_acc.add(&format!("reward/{k}"), *v, 1.0);
            }
        }
        reward_acc.finish(&mut m);
        m
    }
}
