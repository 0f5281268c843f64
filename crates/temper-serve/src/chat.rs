//! `POST /v1/chat/completions`: the conversation is rendered with the model's chat template (as
//! transformers' `apply_chat_template(..., add_generation_prompt=True)`), tokenized, and sampled
//! like a completion. The answer is OpenAI's `chat.completion`, plus vLLM's `token_ids` and
//! `prompt_token_ids` so RL clients get ids, not re-tokenized text; `logprobs: true` adds one
//! logprob per completion token.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use serde::Deserialize;
use serde_json::{json, Value};
use temper_model::ChatMessage;

use crate::openai::{check_model, now_secs, Sampling};
use crate::reply::{bad, check_prompts, handle, Failure};
use crate::AppState;

pub fn routes() -> Router<Arc<AppState>> {
    Router::new().route("/v1/chat/completions", post(chat))
}

#[derive(Deserialize)]
struct ChatRequest {
    model: Option<String>,
    messages: Vec<Value>,
    #[serde(flatten)]
    sampling: Sampling,
    #[serde(default)]
    logprobs: bool,
    /// With `logprobs`: the `k` most likely tokens at each generated position.
    top_logprobs: Option<usize>,
    #[serde(default)]
    stream: bool,
}

async fn chat(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    handle(&state, &headers, &body, |req| run(&state, req)).await
}

/// `messages[i]` as a chat message: a role and text content (a string, or a list of
/// `{"type": "text", "text"}` parts).
fn message(i: usize, m: &Value) -> Result<ChatMessage, Failure> {
    let role = m["role"]
        .as_str()
        .ok_or_else(|| bad(format!("messages[{i}].role: missing or not a string")))?;
    let content = match &m["content"] {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .enumerate()
            .map(|(k, p)| match (p["type"].as_str(), p["text"].as_str()) {
                (Some("text"), Some(t)) => Ok(t.to_string()),
                _ => Err(bad(format!(
                    "messages[{i}].content[{k}]: only text parts are supported"
                ))),
            })
            .collect::<Result<Vec<_>, _>>()?
            .concat(),
        Value::Null => String::new(),
        _ => return Err(bad(format!("messages[{i}].content: not text"))),
    };
    Ok(ChatMessage::new(role, content))
}

async fn run(state: &AppState, req: ChatRequest) -> Result<Value, Failure> {
    check_model(state, req.model.as_deref())?;
    if req.stream {
        return Err(bad("stream: not supported; send stream: false"));
    }
    if req.messages.is_empty() {
        return Err(bad("messages: empty"));
    }
    let top = req.top_logprobs.unwrap_or(0);
    crate::top_logprobs::check_k("top_logprobs", top)?;
    if top > 0 && !req.logprobs {
        return Err(bad("top_logprobs: needs logprobs: true"));
    }
    let tok = state.tokenizer.clone().ok_or_else(|| {
        bad("messages: the model has no tokenizer; use /v1/completions with token ids")
    })?;
    let messages = req
        .messages
        .iter()
        .enumerate()
        .map(|(i, m)| message(i, m))
        .collect::<Result<Vec<_>, _>>()?;
    let encoder = tok.clone();
    let prompt = crate::reply::off_runtime(move || {
        encoder
            .encode_chat(&messages)
            .map_err(|e| bad(format!("messages: {e:#}")))
    })
    .await??;
    let prompts = vec![prompt];
    check_prompts(&prompts, state.worker.vocab_size, "messages")?;
    // Without max_tokens, as vLLM: the rest of the context.
    let room = state
        .worker
        .limits
        .max_model_len
        .saturating_sub(prompts[0].len());
    if room == 0 {
        return Err(bad(format!(
            "messages: the prompt has {} tokens, the whole context of the model",
            prompts[0].len()
        )));
    }
    let max_tokens = req.sampling.max_tokens.unwrap_or(room);
    let params = req.sampling.params(max_tokens, state.worker.vocab_size)?;
    let result = state
        .worker
        .generate_all(&prompts, &params, &crate::limits::OPENAI_FIELDS)
        .await?
        .remove(0);
    let samples = result.map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, e))?;
    // The top alternatives: one scoring forward per sample over prompt + completion.
    let mut scored = vec![];
    if top > 0 {
        for s in &samples {
            let all = crate::top_logprobs::score(
                &state.worker,
                crate::worker::Weights::Served,
                &prompts[0],
                &s.completion_ids,
                top,
            )
            .await?;
            scored.push(crate::top_logprobs::completion_part(&all, prompts[0].len()).to_vec());
        }
    }
    let mut completion_tokens = 0;
    let choices: Vec<Value> = samples
        .iter()
        .enumerate()
        .map(|(k, s)| {
            completion_tokens += s.completion_ids.len();
            let content = tok.decode(&s.completion_ids, true).unwrap_or_default();
            let logprobs = req.logprobs.then(|| {
                let content: Vec<Value> = s
                    .completion_ids
                    .iter()
                    .zip(&s.completion_logprobs)
                    .enumerate()
                    .map(|(j, (id, lp))| {
                        let token = tok.decode(&[*id], false).unwrap_or_default();
                        let top: Vec<Value> = scored
                            .get(k)
                            .and_then(|sc| sc.get(j).cloned().flatten())
                            .map(|p| {
                                p.top
                                    .iter()
                                    .map(|(alt, alt_lp)| {
                                        let t = tok.decode(&[*alt], false).unwrap_or_default();
                                        json!({"token": t, "logprob": alt_lp, "bytes": t.as_bytes()})
                                    })
                                    .collect()
                            })
                            .unwrap_or_default();
                        json!({"token": token, "logprob": lp, "bytes": token.as_bytes(), "top_logprobs": top})
                    })
                    .collect();
                json!({ "content": content })
            });
            json!({
                "index": k, "message": {"role": "assistant", "content": content},
                "logprobs": logprobs, "finish_reason": s.finish.as_str(), "stop_reason": null,
                "token_ids": s.completion_ids,
            })
        })
        .collect();
    let prompt_tokens = prompts[0].len();
    let created = now_secs();
    Ok(json!({
        "id": format!("chatcmpl-{created}-{prompt_tokens}"), "object": "chat.completion",
        "created": created, "model": state.model_name, "choices": choices,
        "prompt_token_ids": prompts[0],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    }))
}
