//! One agent's token transcript across the turns of an episode. The first prompt is followed by,
//! turn after turn, the tokens the policy sampled (trained) and the tokens the environment
//! injected (observations: chat-template continuations, an opponent's words; never trained).
//! Every turn's prompt is the whole transcript so far, so each prompt is a strict token extension
//! of the previous prompt plus its completion, and sampled tokens are never decoded and
//! re-encoded on the way to training.
use anyhow::{bail, Result};
use serde::Serialize;
use temper_rollout::Sample;

/// One turn: where its prompt ended and its completion's span in the transcript.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct TurnSpan {
    /// Length of the transcript when this turn's prompt was sent.
    pub prompt_len: usize,
    /// Number of sampled tokens the turn added after that prompt.
    pub completion_len: usize,
    /// The sampled tokens decoded (for rewards and logs).
    pub text: String,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Transcript {
    /// Every token: the first prompt, then completions and observations.
    pub tokens: Vec<i64>,
    /// Length of the first prompt.
    pub first_prompt_len: usize,
    /// Per token after the first prompt: 1 where the policy sampled it, 0 where it was injected.
    pub mask: Vec<u8>,
    /// Per token after the first prompt: the sampler's logprob (0 for injected tokens).
    pub logprobs: Vec<f32>,
    pub turns: Vec<TurnSpan>,
}

impl Transcript {
    pub fn new(first_prompt: Vec<i64>) -> Self {
        Transcript {
            first_prompt_len: first_prompt.len(),
            tokens: first_prompt,
            mask: vec![],
            logprobs: vec![],
            turns: vec![],
        }
    }

    /// Append tokens the environment injects (masked out of training).
    pub fn observe(&mut self, tokens: &[i64]) {
        self.tokens.extend_from_slice(tokens);
        self.mask.extend(std::iter::repeat_n(0, tokens.len()));
        self.logprobs.extend(std::iter::repeat_n(0.0, tokens.len()));
    }

    /// The prompt of the next turn: the transcript so far.
    pub fn prompt(&self) -> &[i64] {
        &self.tokens
    }

    /// Append the policy's completion to the prompt it was sampled from. The sample's prompt
    /// must be exactly this transcript (the token-extension invariant).
    pub fn act(&mut self, sample: &Sample, text: String) -> Result<()> {
        if sample.prompt_ids != self.tokens {
            let same = sample
                .prompt_ids
                .iter()
                .zip(&self.tokens)
                .take_while(|(a, b)| a == b)
                .count();
            bail!(
                "turn {}: the sampled prompt ({} tokens) is not the transcript so far ({} tokens); they differ from \
                 token {same}",
                self.turns.len() + 1,
                sample.prompt_ids.len(),
                self.tokens.len()
            );
        }
        if sample.completion_logprobs.len() != sample.completion_ids.len() {
            bail!(
                "turn {}: {} logprobs for {} completion tokens",
                self.turns.len() + 1,
                sample.completion_logprobs.len(),
                sample.completion_ids.len()
            );
        }
        self.turns.push(TurnSpan {
            prompt_len: self.tokens.len(),
            completion_len: sample.completion_ids.len(),
            text,
        });
        self.tokens.extend_from_slice(&sample.completion_ids);
        self.mask
            .extend(std::iter::repeat_n(1, sample.completion_ids.len()));
        self.logprobs.extend_from_slice(&sample.completion_logprobs);
        Ok(())
    }

    /// The first prompt.
    pub fn first_prompt(&self) -> &[i64] {
        &self.tokens[..self.first_prompt_len]
    }

    /// Everything after the first prompt (what a training datum calls the completion).
    pub fn completion(&self) -> &[i64] {
        &self.tokens[self.first_prompt_len..]
    }

    /// Tokens the policy sampled, over all turns.
    pub fn sampled_tokens(&self) -> usize {
        self.mask.iter().map(|&m| m as usize).sum()
    }

    /// The prompt tokens of turn `k` (0-based).
    /// Every turn as its log records it: prompt and completion tokens, logprobs, text.
    pub fn rounds_json(&self) -> serde_json::Value {
        (0..self.turns.len())
            .map(|k| {
                let (ids, lps) = self.turn_completion(k);
                serde_json::json!({
                    "prompt_tokens": self.turn_prompt(k),
                    "completion_tokens": ids,
                    "completion_logprobs": lps,
                    "text": self.turns[k].text,
                })
            })
            .collect()
    }

    pub fn turn_prompt(&self, k: usize) -> &[i64] {
        &self.tokens[..self.turns[k].prompt_len]
    }

    /// The completion tokens of turn `k` and their logprobs.
    pub fn turn_completion(&self, k: usize) -> (&[i64], &[f32]) {
        let t = &self.turns[k];
        let (a, b) = (t.prompt_len, t.prompt_len + t.completion_len);
        let off = self.first_prompt_len;
        (&self.tokens[a..b], &self.logprobs[a - off..b - off])
    }

    /// Completion positions (indices into [`Transcript::completion`]) of turn `k`'s sampled
    /// tokens.
    pub fn turn_positions(&self, k: usize) -> std::ops::Range<usize> {
        let t = &self.turns[k];
        let a = t.prompt_len - self.first_prompt_len;
        a..a + t.completion_len
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use temper_rollout::Finish;

    fn sample(prompt: &[i64], completion: &[i64]) -> Sample {
        Sample {
            request_index: 0,
            sample_index: 0,
            prompt_ids: prompt.to_vec(),
            completion_ids: completion.to_vec(),
            completion_logprobs: completion.iter().map(|&t| -(t as f32) / 10.0).collect(),
            finish: Finish::Stop,
            stop_reason: None,
            completion_versions: vec![],
        }
    }

    #[test]
    fn turns_extend_the_transcript_and_masks_follow_who_wrote_what() {
        let mut t = Transcript::new(vec![1, 2, 3]);
        t.act(&sample(&[1, 2, 3], &[4, 5]), "a".into()).unwrap();
        t.observe(&[6, 7]);
        let p2 = t.prompt().to_vec();
        assert_eq!(p2, vec![1, 2, 3, 4, 5, 6, 7]);
        t.act(&sample(&p2, &[8]), "b".into()).unwrap();
        assert_eq!(t.completion(), &[4, 5, 6, 7, 8]);
        assert_eq!(t.mask, vec![1, 1, 0, 0, 1]);
        assert_eq!(t.logprobs, vec![-0.4, -0.5, 0.0, 0.0, -0.8]);
        assert_eq!(t.sampled_tokens(), 3);
        assert_eq!(t.turn_positions(1), 4..5);
        assert_eq!(t.turn_completion(1), (&[8i64][..], &[-0.8f32][..]));
        assert_eq!(t.turn_prompt(1), &p2[..]);
    }

    #[test]
    fn a_prompt_that_is_not_the_transcript_is_refused() {
        let mut t = Transcript::new(vec![1, 2, 3]);
        t.act(&sample(&[1, 2, 3], &[4]), "a".into()).unwrap();
        // Re-encoding the text could give other tokens for the same characters.
        let e = t
            .act(&sample(&[1, 2, 3, 9], &[5]), "b".into())
            .unwrap_err()
            .to_string();
        assert!(e.contains("differ from token 3"), "{e}");
    }
}
