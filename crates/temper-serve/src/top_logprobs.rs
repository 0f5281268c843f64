//! Top-k logprobs for the OpenAI and SGLang routes, from one implementation: vLLM's
//! `logprobs: k` and `prompt_logprobs: k` (completions), OpenAI chat's `top_logprobs`, SGLang's
//! `top_logprobs_num`. The prompt and the generated tokens are scored together in one forward on
//! the serving worker, with the weights that generated them: at each position the `k` most
//! likely tokens, and the position's own token's logprob and rank, all from the model's raw
//! distribution (log_softmax of the logits, T = 1), which is what vLLM reports by default
//! (`logprobs_mode = raw_logprobs`).

use axum::http::StatusCode;
use serde_json::{json, Map, Value};
use temper_tinker::PositionTop;

use crate::models::Weights;
use crate::reply::Failure;
use crate::worker::Worker;

/// vLLM's default `max_logprobs`: the largest `k` a request may ask for.
pub const MAX_LOGPROBS: usize = 20;

/// A request's `k` checked against [`MAX_LOGPROBS`], as vLLM refuses a larger one.
pub fn check_k(field: &str, k: usize) -> Result<(), Failure> {
    if k > MAX_LOGPROBS {
        return Err((
            StatusCode::BAD_REQUEST,
            format!("{field}: {k} is more than the {MAX_LOGPROBS} logprobs per token this server returns (max_logprobs)"),
        ));
    }
    Ok(())
}

/// Per position of `prompt` + `completion` under `weights`, the top `k` (`None` at position 0).
pub async fn score(
    worker: &Worker,
    weights: Weights,
    prompt: &[i64],
    completion: &[i64],
    k: usize,
) -> Result<Vec<Option<PositionTop>>, Failure> {
    let tokens: Vec<i64> = prompt.iter().chain(completion).copied().collect();
    let scores = worker
        .prompt_scores(
            weights,
            tokens,
            crate::worker::PromptAsk {
                topk: k.max(1),
                ..Default::default()
            },
        )
        .await?
        .map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, e))?;
    Ok(scores.topk.unwrap_or_default())
}

/// The positions of the completion within `scored` (prompt + completion).
pub fn completion_part(
    scored: &[Option<PositionTop>],
    prompt_len: usize,
) -> &[Option<PositionTop>] {
    &scored[prompt_len.min(scored.len())..]
}

/// vLLM's completions `top_logprobs` entry: `{token: logprob}` for the top `k` and the sampled
/// token (tokens named `token_id:ID`, as the `tokens` list of this server names them).
pub fn completion_entry(p: &PositionTop, token: i64, k: usize) -> Value {
    let mut m = Map::new();
    for (id, lp) in p.top.iter().take(k) {
        m.insert(format!("token_id:{id}"), json!(lp));
    }
    m.insert(format!("token_id:{token}"), json!(p.logprob));
    Value::Object(m)
}

/// vLLM's `prompt_logprobs` entry: `{id: {"logprob", "rank", "decoded_token"}}` for the prompt
/// token and the top `k`.
pub fn prompt_entry(
    p: &PositionTop,
    token: i64,
    k: usize,
    decode: &dyn Fn(i64) -> String,
) -> Value {
    let mut m = Map::new();
    for (rank, (id, lp)) in p.top.iter().take(k).enumerate() {
        m.insert(
            id.to_string(),
            json!({"logprob": lp, "rank": rank + 1, "decoded_token": decode(*id)}),
        );
    }
    m.insert(
        token.to_string(),
        json!({"logprob": p.logprob, "rank": p.rank, "decoded_token": decode(token)}),
    );
    Value::Object(m)
}
