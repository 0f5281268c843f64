//! The OpenAI-compatible surface, as vLLM serves it for RL rollouts: `/v1/models`,
//! `/v1/completions` (prompts as token ids or text; completions returned as token ids with one
//! logprob per sampled token and a finish reason, never as re-tokenized text only) and `/health`.
//! Errors are vLLM's `{"object": "error", "message", "type", "code"}` naming the request field.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use temper_rollout::SamplingParams;

use crate::limits::OPENAI_FIELDS;
use crate::reply::{authorized, bad, check_prompts, error, handle, Failure};
use crate::AppState;

pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/health", get(|| async { "ok" }))
        .route("/v1/models", get(models))
        .route("/v1/completions", post(completions))
}

pub(crate) async fn models(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if !authorized(&state, &headers) {
        return error(StatusCode::UNAUTHORIZED, "missing or wrong API key");
    }
    Json(json!({"object": "list", "data": [{
        "id": state.model_name, "object": "model", "owned_by": "temper", "root": state.worker.dir,
        "max_model_len": state.worker.max_model_len,
    }]}))
    .into_response()
}

/// One of OpenAI's prompt shapes.
#[derive(Deserialize)]
#[serde(untagged)]
enum Prompt {
    Text(String),
    Ids(Vec<i64>),
    ManyIds(Vec<Vec<i64>>),
    ManyTexts(Vec<String>),
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Stop {
    One(String),
    Many(Vec<String>),
}

/// The sampling fields `/v1/completions` and `/v1/chat/completions` share (vLLM's extensions
/// included); fields temper does not read are ignored, as vLLM's extensions of no meaning here.
#[derive(Deserialize)]
pub(crate) struct Sampling {
    /// `None`: the endpoint's default (16 for completions, the rest of the context for chat).
    #[serde(alias = "max_completion_tokens")]
    pub max_tokens: Option<usize>,
    #[serde(default)]
    min_tokens: usize,
    #[serde(default = "one")]
    n: usize,
    temperature: Option<f64>,
    top_p: Option<f64>,
    top_k: Option<i64>,
    repetition_penalty: Option<f64>,
    /// vLLM's range, a signed 64-bit integer; read as the u64 with the same bits (what temper's
    /// remote sampler sends for its u64 seeds).
    seed: Option<i64>,
    stop: Option<Stop>,
    #[serde(default)]
    stop_token_ids: Vec<i64>,
    #[serde(default)]
    ignore_eos: bool,
}

fn one() -> usize {
    1
}

impl Sampling {
    /// The engine's parameters, checked against the vocabulary.
    pub(crate) fn params(&self, max_tokens: usize, vocab: i64) -> Result<SamplingParams, Failure> {
        let stop = match &self.stop {
            None => vec![],
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) => v.clone(),
        };
        let params = SamplingParams {
            n: self.n,
            temperature: self.temperature.unwrap_or(1.0),
            top_p: self.top_p.unwrap_or(1.0),
            top_k: self.top_k.unwrap_or(-1),
            min_tokens: self.min_tokens,
            max_tokens,
            repetition_penalty: self.repetition_penalty.unwrap_or(1.0),
            stop,
            stop_token_ids: self.stop_token_ids.clone(),
            ignore_eos: self.ignore_eos,
            seed: self.seed.map(|s| s as u64),
            ..SamplingParams::default()
        };
        params
            .validate(Some(vocab as usize))
            .map_err(|e| bad(format!("{e:#}")))?;
        Ok(params)
    }
}

/// The request fields temper reads.
#[derive(Deserialize)]
struct CompletionRequest {
    model: Option<String>,
    prompt: Prompt,
    #[serde(flatten)]
    sampling: Sampling,
    logprobs: Option<usize>,
    /// vLLM's: the top `k` logprobs (and the prompt token's) at every prompt position.
    prompt_logprobs: Option<usize>,
    #[serde(default)]
    echo: bool,
    #[serde(default)]
    skip_special_tokens: Option<bool>,
    /// vLLM's: text prompts get the tokenizer's special tokens (a BOS where it adds one), as
    /// `tokenizer(text)` does; default true.
    #[serde(default)]
    add_special_tokens: Option<bool>,
}

/// A `model` field naming another model is a 404, as vLLM answers.
pub(crate) fn check_model(state: &AppState, model: Option<&str>) -> Result<(), Failure> {
    match model {
        Some(m) if m != state.model_name => Err((
            StatusCode::NOT_FOUND,
            format!(
                "model `{m}` is not served here (this server serves `{}`)",
                state.model_name
            ),
        )),
        _ => Ok(()),
    }
}

pub(crate) fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

async fn completions(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    handle(&state, &headers, &body, |req| complete(&state, req)).await
}

/// Text prompts as token ids, on a blocking thread (a body of long texts keeps the tokenizer busy
/// a while, and the runtime's threads answer every other client meanwhile).
async fn encode_texts(
    state: &AppState,
    texts: Vec<String>,
    add_special_tokens: bool,
) -> Result<Vec<Vec<i64>>, Failure> {
    let t = state.tokenizer.clone().ok_or_else(|| {
        bad("prompt: a text prompt needs the model's tokenizer, and it has none; send token ids")
    })?;
    crate::reply::off_runtime(move || {
        texts
            .iter()
            .map(|text| {
                t.encode(text, add_special_tokens)
                    .map_err(|e| bad(format!("prompt: {e}")))
            })
            .collect()
    })
    .await?
}

async fn complete(state: &AppState, req: CompletionRequest) -> Result<Value, Failure> {
    check_model(state, req.model.as_deref())?;
    if req.echo {
        return Err(bad("echo: not supported (prompt logprobs come from prompt_logprobs in vLLM; temper does not echo)"));
    }
    let top_k = req.logprobs.unwrap_or(0);
    crate::top_logprobs::check_k("logprobs", top_k)?;
    if let Some(k) = req.prompt_logprobs {
        crate::top_logprobs::check_k("prompt_logprobs", k)?;
    }
    let tok = state.tokenizer.as_ref();
    let add_special = req.add_special_tokens.unwrap_or(true);
    let prompts: Vec<Vec<i64>> = match req.prompt {
        Prompt::Ids(ids) => vec![ids],
        Prompt::ManyIds(rows) => rows,
        Prompt::Text(t) => encode_texts(state, vec![t], add_special).await?,
        Prompt::ManyTexts(ts) => encode_texts(state, ts, add_special).await?,
    };
    check_prompts(&prompts, state.worker.vocab_size, "prompt")?;
    let params = req.sampling.params(
        req.sampling.max_tokens.unwrap_or(16),
        state.worker.vocab_size,
    )?;
    let skip_special = req.skip_special_tokens.unwrap_or(true);
    let mut choices = vec![];
    let (mut prompt_tokens, mut completion_tokens) = (0, 0);
    let results = state
        .worker
        .generate_all(&prompts, &params, &OPENAI_FIELDS)
        .await?;
    for (i, (prompt, result)) in prompts.iter().zip(results).enumerate() {
        let samples = result.map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, e))?;
        prompt_tokens += prompt.len();
        for s in samples {
            completion_tokens += s.completion_ids.len();
            let text = match tok {
                Some(t) => t
                    .decode(&s.completion_ids, skip_special)
                    .unwrap_or_default(),
                None => String::new(),
            };
            let finish = s.finish.as_str();
            // Top alternatives and prompt logprobs: one scoring forward over prompt + completion.
            let pk = req.prompt_logprobs;
            let scored = if top_k > 0 || pk.is_some() {
                let k = top_k.max(pk.unwrap_or(0));
                crate::top_logprobs::score(
                    &state.worker,
                    crate::worker::Weights::Served,
                    prompt,
                    &s.completion_ids,
                    k,
                )
                .await?
            } else {
                vec![]
            };
            let top_logprobs = (top_k > 0).then(|| {
                let part = crate::top_logprobs::completion_part(&scored, prompt.len());
                part.iter()
                    .zip(&s.completion_ids)
                    .map(|(p, &t)| match p {
                        Some(p) => crate::top_logprobs::completion_entry(p, t, top_k),
                        None => Value::Null,
                    })
                    .collect::<Vec<_>>()
            });
            let logprobs = req.logprobs.map(|_| {
                let tokens: Vec<String> = s.completion_ids.iter().map(|t| format!("token_id:{t}")).collect();
                json!({"token_logprobs": s.completion_logprobs, "tokens": tokens, "top_logprobs": top_logprobs, "text_offset": null})
            });
            let decode = |id: i64| -> String {
                tok.and_then(|t| t.decode(&[id], false).ok())
                    .unwrap_or_default()
            };
            let prompt_logprobs = pk.map(|k| {
                scored
                    .iter()
                    .take(prompt.len())
                    .zip(prompt)
                    .map(|(p, &t)| match p {
                        Some(p) => crate::top_logprobs::prompt_entry(p, t, k, &decode),
                        None => Value::Null,
                    })
                    .collect::<Vec<_>>()
            });
            choices.push(json!({
                "index": choices.len(), "text": text, "logprobs": logprobs, "finish_reason": finish,
                "stop_reason": null, "token_ids": s.completion_ids, "prompt_token_ids": prompt,
                "prompt_index": i, "prompt_logprobs": prompt_logprobs,
            }));
        }
    }
    let created = now_secs();
    Ok(json!({
        "id": format!("cmpl-{created}-{}", choices.len()), "object": "text_completion", "created": created,
        "model": state.model_name, "choices": choices,
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    }))
}
