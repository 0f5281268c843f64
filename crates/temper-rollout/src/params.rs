//! What a caller asks for (`SamplingParams`, `Request`) and what it gets back (`Sample`).

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

/// Which distribution `Sample::completion_logprobs` is taken from.
///
/// Whatever is chosen, the token itself is always drawn from the fully processed distribution
/// (repetition penalty, `min_tokens` masking, temperature, top-k, top-p).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogprobKind {
    /// `log_softmax(logits / temperature)` of the model's raw logits: before repetition penalty,
    /// `min_tokens` masking and top-k/top-p truncation. This is what a trainer recomputes with
    /// `CausalLm::token_logprobs(.., temperature)` (verl's convention). With `temperature == 0`
    /// (greedy) the temperature is taken as 1, i.e. the same as `Raw`.
    #[default]
    Scaled,
    /// `log_softmax(logits)`: the model's own distribution, temperature 1, nothing applied.
    Raw,
    /// The log-probability under the distribution the token was actually drawn from (after every
    /// processor, renormalised). Greedy rows report 0 (the argmax has probability 1).
    Processed,
}

/// Sampling settings for one request. Names and meanings follow vLLM's `SamplingParams`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SamplingParams {
    /// Samples per prompt; they share one prefill of the prompt.
    pub n: usize,
    /// 0 = greedy (argmax); otherwise logits are divided by it before top-k/top-p.
    pub temperature: f64,
    /// Nucleus sampling: keep the smallest set of most likely tokens whose mass reaches `top_p`
    /// (a token is kept iff the mass of the tokens ranked above it is < `top_p`). In (0, 1]; 1 = off.
    pub top_p: f64,
    /// Keep the `top_k` most likely tokens; -1 (or 0) = off.
    pub top_k: i64,
    /// EOS ids and `stop_token_ids` are masked, and stop strings ignored, until this many tokens exist.
    pub min_tokens: usize,
    /// Hard cap on completion tokens (also capped by the model's context).
    pub max_tokens: usize,
    /// HF/vLLM repetition penalty over prompt and completion tokens: a seen token's logit `l`
    /// becomes `l / p` if `l > 0` else `l * p`. 1 = off; must be > 0.
    pub repetition_penalty: f64,
    /// Stop strings, matched on the decoded completion text (see `docs/rollout.md`).
    pub stop: Vec<String>,
    /// Extra token ids that end a sample (in addition to the model's EOS ids).
    pub stop_token_ids: Vec<i64>,
    /// Do not stop on the model's EOS ids (stop tokens and strings still apply).
    pub ignore_eos: bool,
    /// Makes the request reproducible regardless of batch composition; `None` draws a seed from
    /// the engine's own seeded generator (reproducible for a whole run, different per call).
    pub seed: Option<u64>,
    /// Which distribution `completion_logprobs` are taken from.
    pub logprobs: LogprobKind,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            n: 1,
            temperature: 1.0,
            top_p: 1.0,
            top_k: -1,
            min_tokens: 0,
            max_tokens: 256,
            repetition_penalty: 1.0,
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            seed: None,
            logprobs: LogprobKind::Scaled,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding with the given token budget.
    pub fn greedy(max_tokens: usize) -> Self {
        Self {
            temperature: 0.0,
            max_tokens,
            ..Self::default()
        }
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// top-k as a count of tokens to keep, `None` when off.
    pub fn top_k_count(&self) -> Option<usize> {
        (self.top_k > 0).then_some(self.top_k as usize)
    }

    /// Checks every field; `vocab_size`, when known, bounds `stop_token_ids`.
    /// Errors name the field, e.g. `top_p = 1.5: must be in (0, 1]`.
    pub fn validate(&self, vocab_size: Option<usize>) -> Result<()> {
        if self.n == 0 {
            bail!("n = 0: must be at least 1");
        }
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            bail!(
                "temperature = {}: must be a finite number >= 0 (0 = greedy)",
                self.temperature
            );
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            bail!("top_p = {}: must be in (0, 1]", self.top_p);
        }
        if self.top_k < -1 {
            bail!(
                "top_k = {}: must be -1 or 0 (off) or a positive count",
                self.top_k
            );
        }
        if self.max_tokens == 0 {
            bail!("max_tokens = 0: must be at least 1");
        }
        if self.min_tokens > self.max_tokens {
            bail!(
                "min_tokens = {} exceeds max_tokens = {}",
                self.min_tokens,
                self.max_tokens
            );
        }
        if !self.repetition_penalty.is_finite() || self.repetition_penalty <= 0.0 {
            bail!(
                "repetition_penalty = {}: must be a finite number > 0 (1 = off)",
                self.repetition_penalty
            );
        }
        if let Some(i) = self.stop.iter().position(|s| s.is_empty()) {
            bail!("stop[{i}] is an empty string");
        }
        for (i, &t) in self.stop_token_ids.iter().enumerate() {
            let out_of_vocab = vocab_size.is_some_and(|v| t >= v as i64);
            if t < 0 || out_of_vocab {
                let v = vocab_size
                    .map(|v| format!(" (vocabulary size {v})"))
                    .unwrap_or_default();
                bail!("stop_token_ids[{i}] = {t}: unknown token id{v}");
            }
        }
        Ok(())
    }
}

/// One prompt to complete `params.n` times.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Request {
    /// Token ids of the prompt (chat template already applied, BOS included if the model wants one).
    pub prompt_ids: Vec<i64>,
    pub params: SamplingParams,
}

/// Why a sample ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Finish {
    /// An EOS id, a stop token id or a stop string.
    Stop,
    /// `max_tokens` or the model's context was reached.
    Length,
}

impl Finish {
    /// The OpenAI / vLLM / Tinker name: `stop` or `length` (also its serde name).
    pub fn as_str(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
        }
    }
}

/// The exact condition that ended a `Finish::Stop` sample.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// One of the model's EOS ids (kept as the last completion token).
    Eos(i64),
    /// One of `stop_token_ids` (kept as the last completion token).
    StopToken(i64),
    /// `stop[index]` appeared in the decoded completion; the token that completed it is the last one.
    StopString(usize),
}

/// One completion. `completion_logprobs[i]` is the logprob of `completion_ids[i]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    pub request_index: usize,
    pub sample_index: usize,
    pub prompt_ids: Vec<i64>,
    pub completion_ids: Vec<i64>,
    /// Per completion token, from the distribution named by `SamplingParams::logprobs`.
    pub completion_logprobs: Vec<f32>,
    pub finish: Finish,
    pub stop_reason: Option<StopReason>,
    /// Per completion token, the policy version that sampled it, when the engine counted
    /// versions (an in-process sampler whose weights change while it samples: partial
    /// rollouts); empty otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub completion_versions: Vec<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(p: SamplingParams) -> String {
        format!("{:#}", p.validate(Some(100)).unwrap_err())
    }

    #[test]
    fn defaults_are_valid_and_off() {
        let p = SamplingParams::default();
        p.validate(Some(10)).unwrap();
        assert_eq!(p.top_k_count(), None);
        assert!(!p.is_greedy());
        assert!(SamplingParams::greedy(4).is_greedy());
    }

    #[test]
    fn bad_values_name_the_field() {
        let d = SamplingParams::default;
        assert!(err(SamplingParams { top_p: 1.5, ..d() }).starts_with("top_p = 1.5"));
        assert!(err(SamplingParams { top_p: 0.0, ..d() }).starts_with("top_p = 0"));
        assert!(err(SamplingParams {
            top_p: f64::NAN,
            ..d()
        })
        .starts_with("top_p = NaN"));
        assert!(err(SamplingParams {
            temperature: -0.5,
            ..d()
        })
        .starts_with("temperature = -0.5"));
        assert!(err(SamplingParams {
            temperature: f64::INFINITY,
            ..d()
        })
        .starts_with("temperature"));
        assert!(err(SamplingParams { top_k: -2, ..d() }).starts_with("top_k = -2"));
        assert!(err(SamplingParams { n: 0, ..d() }).starts_with("n = 0"));
        assert!(err(SamplingParams {
            max_tokens: 0,
            ..d()
        })
        .starts_with("max_tokens = 0"));
        assert!(err(SamplingParams {
            min_tokens: 9,
            max_tokens: 8,
            ..d()
        })
        .starts_with("min_tokens = 9"));
        assert!(err(SamplingParams {
            repetition_penalty: 0.0,
            ..d()
        })
        .starts_with("repetition_penalty"));
        assert!(err(SamplingParams {
            stop: vec!["a".into(), "".into()],
            ..d()
        })
        .starts_with("stop[1]"));
        let e = err(SamplingParams {
            stop_token_ids: vec![3, 100],
            ..d()
        });
        assert_eq!(
            e,
            "stop_token_ids[1] = 100: unknown token id (vocabulary size 100)"
        );
        assert!(err(SamplingParams {
            stop_token_ids: vec![-1],
            ..d()
        })
        .starts_with("stop_token_ids[0] = -1"));
    }

    #[test]
    fn json_round_trip_and_unknown_fields() {
        let p: SamplingParams =
            serde_json::from_str(r#"{"n": 4, "top_p": 0.9, "logprobs": "raw"}"#).unwrap();
        assert_eq!(
            (p.n, p.top_p, p.logprobs, p.max_tokens),
            (4, 0.9, LogprobKind::Raw, 256)
        );
        let e = serde_json::from_str::<SamplingParams>(r#"{"top_q": 1}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("top_q"), "{e}");
        let s = Sample {
            request_index: 0,
            sample_index: 1,
            prompt_ids: vec![1],
            completion_ids: vec![2],
            completion_logprobs: vec![-0.5],
            finish: Finish::Stop,
            stop_reason: Some(StopReason::Eos(2)),
            completion_versions: vec![],
        };
        let j = serde_json::to_string(&s).unwrap();
        // Written only when recorded, so files from before read the same.
        assert!(!j.contains("completion_versions"), "{j}");
        assert!(
            j.contains(r#""finish":"stop""#) && j.contains(r#""stop_reason":{"eos":2}"#),
            "{j}"
        );
    }
}
