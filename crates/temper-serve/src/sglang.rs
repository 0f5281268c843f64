//! SGLang's native `POST /generate`, as slime and grail call it: `input_ids` (one prompt or a
//! list), `sampling_params` (`max_new_tokens`, `temperature`, `top_p`, `top_k`, `min_new_tokens`,
//! `repetition_penalty`, `stop`, `stop_token_ids`, `n`, `sampling_seed`, `ignore_eos`), and
//! `return_logprob`. Each sample answers `{"text", "output_ids", "meta_info": {"finish_reason":
//! {"type": "stop" | "length"}, "output_token_logprobs": [[logprob, token_id, null], ...],
//! "prompt_tokens", "completion_tokens"}}`; a list when several prompts or `n > 1`.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use serde_json::{json, Value};
use temper_rollout::SamplingParams;

use crate::limits::SGLANG_FIELDS;
use crate::reply::{bad, check_prompts, handle, Failure};
use crate::AppState;

pub fn routes() -> Router<Arc<AppState>> {
    Router::new().route("/generate", post(generate))
}

async fn generate(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let state = &state;
    handle(state, &headers, &body, |v: Value| async move {
        run(state, &v).await
    })
    .await
}

async fn run(state: &AppState, v: &Value) -> Result<Value, Failure> {
    let (prompts, batched): (Vec<Vec<i64>>, bool) =
        if let Ok(one) = serde_json::from_value::<Vec<i64>>(v["input_ids"].clone()) {
            (vec![one], false)
        } else if let Ok(many) = serde_json::from_value::<Vec<Vec<i64>>>(v["input_ids"].clone()) {
            (many, true)
        } else {
            return Err(bad(
                "input_ids: expected token ids or a list of token id lists",
            ));
        };
    let vocab = state.worker.vocab_size;
    check_prompts(&prompts, vocab, "input_ids")?;
    let sp = &v["sampling_params"];
    let num = |k: &str, d: f64| -> Result<f64, Failure> {
        match &sp[k] {
            Value::Null => Ok(d),
            x => x
                .as_f64()
                .ok_or_else(|| bad(format!("sampling_params.{k}: not a number"))),
        }
    };
    let stop: Vec<String> = match &sp["stop"] {
        Value::Null => vec![],
        Value::String(s) => vec![s.clone()],
        x => serde_json::from_value(x.clone())
            .map_err(|_| bad("sampling_params.stop: strings expected"))?,
    };
    let params = SamplingParams {
        n: num("n", 1.0)? as usize,
        temperature: num("temperature", 1.0)?,
        top_p: num("top_p", 1.0)?,
        top_k: num("top_k", -1.0)? as i64,
        min_tokens: num("min_new_tokens", 0.0)? as usize,
        max_tokens: num("max_new_tokens", 128.0)? as usize,
        repetition_penalty: num("repetition_penalty", 1.0)?,
        stop,
        stop_token_ids: serde_json::from_value(sp["stop_token_ids"].clone()).unwrap_or_default(),
        ignore_eos: sp["ignore_eos"].as_bool().unwrap_or(false),
        // A signed 64-bit seed (what temper's remote sampler sends) is read back to its u64.
        seed: sp["sampling_seed"]
            .as_i64()
            .map(|s| s as u64)
            .or(sp["sampling_seed"].as_u64()),
        ..SamplingParams::default()
    };
    params
        .validate(Some(vocab as usize))
        .map_err(|e| bad(format!("sampling_params: {e:#}")))?;
    let results = state
        .worker
        .generate_all(&prompts, &params, &SGLANG_FIELDS)
        .await?;
    let with_logprobs = v["return_logprob"].as_bool().unwrap_or(false);
    let top = match &v["top_logprobs_num"] {
        Value::Null => 0,
        x => x.as_u64().map(|k| k as usize).ok_or_else(|| {
            bad(format!(
                "top_logprobs_num: {x} is not a non-negative integer"
            ))
        })?,
    };
    crate::top_logprobs::check_k("top_logprobs_num", top)?;
    let mut out = vec![];
    for (p, result) in prompts.iter().zip(results) {
        let samples = result.map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, e))?;
        for s in samples {
            let text = state
                .tokenizer
                .as_ref()
                .and_then(|t| t.decode(&s.completion_ids, false).ok())
                .unwrap_or_default();
            let kind = s.finish.as_str();
            let mut meta = json!({"finish_reason": {"type": kind, "matched": null},
                                  "prompt_tokens": p.len(), "completion_tokens": s.completion_ids.len()});
            if with_logprobs {
                meta["output_token_logprobs"] = s
                    .completion_logprobs
                    .iter()
                    .zip(&s.completion_ids)
                    .map(|(lp, id)| json!([lp, id, null]))
                    .collect();
                if top > 0 {
                    // SGLang's `output_top_logprobs`: per generated token, [logprob, id, null]
                    // for the `top_logprobs_num` most likely.
                    let all = crate::top_logprobs::score(
                        &state.worker,
                        crate::worker::Weights::Served,
                        p,
                        &s.completion_ids,
                        top,
                    )
                    .await?;
                    meta["output_top_logprobs"] =
                        crate::top_logprobs::completion_part(&all, p.len())
                            .iter()
                            .map(|pos| match pos {
                                Some(pos) => pos
                                    .top
                                    .iter()
                                    .map(|(id, lp)| json!([lp, id, null]))
                                    .collect(),
                                None => Value::Null,
                            })
                            .collect();
                }
            }
            out.push(json!({"text": text, "output_ids": s.completion_ids, "meta_info": meta}));
        }
    }
    Ok(if batched || params.n > 1 {
        Value::Array(out)
    } else {
        out.remove(0)
    })
}
