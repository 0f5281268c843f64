//! vLLM's OpenAI-compatible `POST /v1/completions` (also `temper serve`'s, and with
//! `--backend openai` any server that returns token ids): the request for one temper [`Request`]
//! and the checked parse of its answer.

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use crate::{Request, Sample};

/// The body of one request: a token-id prompt, the sampled token's logprob only (`logprobs: 0`),
/// token ids back, stop tokens kept, nothing re-tokenized.
pub fn completion_body(model: &str, r: &Request) -> Value {
    let p = &r.params;
    json!({
        "model": model, "prompt": r.prompt_ids, "n": p.n, "max_tokens": p.max_tokens,
        "min_tokens": p.min_tokens, "temperature": p.temperature, "top_p": p.top_p, "top_k": super::wire_top_k(p.top_k),
        "repetition_penalty": p.repetition_penalty, "seed": super::wire_seed(p.seed), "stop": p.stop,
        "stop_token_ids": p.stop_token_ids, "ignore_eos": p.ignore_eos, "logprobs": 0,
        "return_token_ids": true, "return_tokens_as_token_ids": true,
        "include_stop_str_in_output": true, "skip_special_tokens": false,
    })
}

/// The samples of one `/v1/completions` answer, checked: token ids present, one logprob per token,
/// a known finish reason. Token ids come from `token_ids` (vLLM's `return_token_ids`), else from
/// `logprobs.tokens` written as `token_id:N` (`return_tokens_as_token_ids`, older servers).
pub fn parse_completion(v: &Value, index: usize, r: &Request, url: &str) -> Result<Vec<Sample>> {
    let Some(choices) = v["choices"].as_array() else {
        bail!("{url}: the answer has no `choices`");
    };
    if choices.len() != r.params.n {
        bail!("{url}: {} choices for n = {}", choices.len(), r.params.n);
    }
    choices
        .iter()
        .enumerate()
        .map(|(k, c)| {
            let field = |name: &str| format!("{url}: choices[{k}].{name}");
            let ids = match serde_json::from_value::<Vec<i64>>(c["token_ids"].clone()) {
                Ok(ids) => ids,
                Err(_) => ids_from_token_strings(&c["logprobs"]["tokens"]).with_context(|| {
                    format!(
                        "{} is missing or not token ids (the server must support return_token_ids)",
                        field("token_ids")
                    )
                })?,
            };
            let lps: Vec<f32> = serde_json::from_value(c["logprobs"]["token_logprobs"].clone())
                .with_context(|| {
                    format!(
                        "{} is missing or not numbers",
                        field("logprobs.token_logprobs")
                    )
                })?;
            if lps.len() != ids.len() {
                bail!(
                    "{} has {} values for {} tokens",
                    field("logprobs.token_logprobs"),
                    lps.len(),
                    ids.len()
                );
            }
            super::finished_sample(
                (index, k),
                r,
                ids,
                lps,
                c["finish_reason"].as_str(),
                field("finish_reason"),
            )
        })
        .collect()
}

/// `["token_id:2068", ...]` -> `[2068, ...]`.
fn ids_from_token_strings(tokens: &Value) -> Result<Vec<i64>> {
    let Some(list) = tokens.as_array() else {
        bail!("no logprobs.tokens either");
    };
    list.iter()
        .map(|t| {
            t.as_str()
                .and_then(|s| s.strip_prefix("token_id:"))
                .and_then(|s| s.parse().ok())
                .with_context(|| format!("logprobs.tokens holds {t}, not `token_id:N`"))
        })
        .collect()
}
