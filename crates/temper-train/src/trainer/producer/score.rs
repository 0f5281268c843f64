//! A prompt run's samples into groups, scored by the run's [`Questions`](super::questions::Questions)
//! (the reward on every response, `reward.on_error`, DAPO's overlong penalty).
use super::rollout::Group;
use super::Producer;
use anyhow::Result;
use temper_rollout::Sample;

impl Producer {
    /// Scores `samples`, the answers to the requests for the examples `kept`; `texts` are their
    /// decoded completions (decoded here when `None`).
    pub(super) fn groups_from(
        &self,
        dataset: &crate::data::Dataset,
        kept: &[usize],
        samples: Vec<Sample>,
        texts: Option<Vec<String>>,
        policy_version: u64,
    ) -> Result<Vec<Group>> {
        let texts = match texts {
            Some(t) => t,
            None => samples
                .iter()
                .map(|s| self.tokenizer.decode(&s.completion_ids, true))
                .collect::<Result<_>>()?,
        };
        let mut groups: Vec<Group> = kept
            .iter()
            .map(|&e| Group {
                example: e,
                policy_version,
                samples: vec![],
                texts: vec![],
                scores: vec![],
                raw_scores: vec![],
                reward_metrics: vec![],
                reward_error_reasons: vec![],
                reward_errors: 0,
            })
            .collect();
        // With partial rollouts every answer records its tokens' versions; those sampled in
        // process by the trainer's own weights (the first step's) were all drawn by one.
        let per_token = self.rollouts.cfg().partial_rollouts;
        for (mut s, text) in samples.into_iter().zip(texts) {
            if per_token && s.completion_versions.is_empty() {
                s.completion_versions = vec![policy_version; s.completion_ids.len()];
            }
            let g = &mut groups[s.request_index];
            g.samples.push(s);
            g.texts.push(text);
        }
        self.questions.score(dataset, &mut groups)?;
        Ok(groups)
    }
}
