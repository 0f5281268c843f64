//! Scoring a prompt run's samples into groups: the reward on every response (in parallel), what
//! `reward.on_error` does with a failing reward, and DAPO's overlong penalty.
use super::rollout::Group;
use super::Trainer;
use crate::config::OnError;
use anyhow::{bail, Result};
use std::collections::BTreeMap;
use temper_rollout::Sample;

impl Trainer {
    /// Scores `samples`, the answers to the requests for the examples `kept`; `texts` are their
    /// decoded completions (decoded here when `None`).
    pub(crate) fn groups_from(
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
        let per_token = self.rollouts.cfg.partial_rollouts;
        for (mut s, text) in samples.into_iter().zip(texts) {
            if per_token && s.completion_versions.is_empty() {
                s.completion_versions = vec![policy_version; s.completion_ids.len()];
            }
            let g = &mut groups[s.request_index];
            g.samples.push(s);
            g.texts.push(text);
        }
        self.score_groups(dataset, &mut groups)?;
        Ok(groups)
    }

    /// Scores every response (in parallel); a panicking or non-finite reward stops the run or
    /// scores 0, as `reward.on_error` says.
    fn score_groups(&self, dataset: &crate::data::Dataset, groups: &mut [Group]) -> Result<()> {
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
        let outputs = temper_reward::score_all(&*self.questions.reward, &inputs);
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
                    if self.questions.reward_cfg.on_error == OnError::Fail {
                        bail!(
                            "reward `{}` failed on {} example {ex} sample {k}: {e} (set reward.on_error = \"zero\" to \
                             score such responses 0 and continue)",
                            self.questions.reward.name(),
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
        let ob = &self.questions.reward_cfg.overlong_buffer;
        let max_len = self.questions.data.max_response_length;
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
