//! `/api/v1/asample`: a sampling session's sample request, on the serving worker's engine
//! (batched with the OpenAI and SGLang requests for the same weights), with what it may ask
//! beyond the samples: the prompt's logprobs and top-k (`prompt_logprobs`,
//! `topk_prompt_logprobs`, `prompt_logprobs_last_n`), the logprobs of given ids at given prompt
//! positions (`target_prompt_logprobs`), draws from the prompt's next-token distributions
//! (`prompt_alt_tokens_k`), the top-k at each sampled position (`topk_sample_logprobs`), and
//! StableReinforce's records (`record_stability_info`).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use anyhow::{anyhow, bail, Context};
use axum::body::Bytes;
use axum::extract::State;
use axum::response::Response;
use serde_json::{json, Value};

use super::futures::Outcome;
use super::routes::{future_blocking, parse_json, Dispatch};
use super::samplers::PromptAnswers;
use super::{convert, proto};
use crate::limits::TINKER_FIELDS;
use crate::worker::{PromptAsk, Weights};
use crate::AppState;

type S = State<Arc<AppState>>;

pub(super) async fn asample(State(state): S, body: Bytes) -> Response {
    let t = state.tinker.clone();
    let limits = state.worker.limits.clone();
    let v = parse_json(&body).unwrap_or(Value::Null);
    let n = match &v["num_samples"] {
        Value::Null => Some(1),
        x => x.as_u64().map(|n| n.min(usize::MAX as u64) as usize),
    };
    // Sequence ids only for a count within the limit (a refused count gets none).
    let admissible = n.filter(|&n| n >= 1 && n <= limits.max_n);
    let rid = state.tinker.samples.fetch_add(1, Ordering::Relaxed);
    // Sequence ids are session-scoped (the sampling session's session) and unique across
    // server runs (session ids are).
    let session = v["sampling_session_id"]
        .as_str()
        .map(|s| super::sessions::session_of(s).to_string())
        .unwrap_or_default();
    let ids: Vec<String> = (0..admissible.unwrap_or(0))
        .map(|k| format!("{session}:seq:{rid}-{k}"))
        .collect();
    let record = v["record_stability_info"].as_bool().unwrap_or(false);
    let recording = record.then(|| Recording {
        session: session.clone(),
        ids: ids.clone(),
    });
    let st = state.clone();
    future_blocking(&state, json!({"sample_sequence_ids": ids}), move || {
        if v.is_null() {
            bail!("request body: not JSON");
        }
        let n = n.context("num_samples: not a non-negative integer")?;
        if n == 0 {
            bail!("num_samples: must be at least 1");
        }
        limits
            .check_sampling(&[], n, 0, &TINKER_FIELDS)
            .map_err(|e| anyhow!(e))?;
        let topk = small_count(&v, "topk_prompt_logprobs")?;
        let topk_sample = small_count(&v, "topk_sample_logprobs")?;
        let alt_k = small_count(&v, "prompt_alt_tokens_k")?;
        let id = v["sampling_session_id"]
            .as_str()
            .context("sampling_session_id: missing")?;
        let session = t
            .samplers
            .session(id)
            .with_context(|| t.unknown("sampling_session_id", "sampling session", id))?;
        let prompt = convert::json_tokens(&v["prompt"], "prompt")?;
        let context_left = limits.max_model_len.saturating_sub(prompt.len());
        let params = convert::sampling_params(&v["sampling_params"], context_left)?;
        limits
            .check_sampling(&[prompt.len()], n, params.max_tokens, &TINKER_FIELDS)
            .map_err(|e| anyhow!(e))?;
        let prompt_logprobs = v["prompt_logprobs"].as_bool().unwrap_or(false);
        // `prompt_logprobs_last_n`: only the last N positions are scored (the SDK's range rules).
        let last_n = match &v["prompt_logprobs_last_n"] {
            Value::Null => None,
            x => match x.as_u64() {
                Some(n) if n >= 1 && (n as usize) < prompt.len() && prompt_logprobs => {
                    Some(n as usize)
                }
                _ => bail!(
                    "prompt_logprobs_last_n: {x} must be from 1 to len(prompt) - 1 = {}, with \
                     prompt_logprobs set",
                    prompt.len().saturating_sub(1)
                ),
            },
        };
        let (weights, vocab, tokenizer) = if st.serves(&session.dir) {
            let w = &st.worker;
            (Weights::Served, w.vocab_size, st.tokenizer.is_some())
        } else {
            let (vocab, tokenizer) = crate::models::folder_vocab(&session.dir)
                .with_context(|| format!("sampling_session_id {id:?}"))?;
            (Weights::Folder(session.dir.clone()), vocab, tokenizer)
        };
        if !params.stop_strings.is_empty() && !tokenizer {
            bail!("sampling_params.stop: stop strings need a tokenizer, and the model has none");
        }
        let targets = match &v["target_prompt_logprobs"] {
            Value::Null => None,
            x => Some(super::targets::parse(x, prompt.len(), vocab)?),
        };
        // The draws' seed: the request's, else a fresh one.
        let alt_seed = params.seed.unwrap_or_else(|| {
            use std::hash::{BuildHasher, Hasher};
            let mut h = std::hash::RandomState::new().build_hasher();
            h.write_u64(rid);
            h.finish()
        });
        let alt = (alt_k > 0).then_some((alt_k, params.temperature, alt_seed));
        let request = temper_tinker::engine_request(&prompt, n, &params, vocab)?;
        Ok(on_the_serving_worker(
            st.clone(),
            weights,
            request,
            PromptWanted {
                ask: PromptAsk {
                    logprobs: prompt_logprobs,
                    topk,
                    targets: targets.as_ref().map(|t| t.cells.clone()),
                    alt,
                },
                targets,
                last_n,
                topk_sample,
            },
            recording,
        ))
    })
    .await
}

/// A top-k count field of the request: 0 when absent, at most
/// [`temper_tinker::prompt_topk::MAX_TOPK`] (every answer row holds this many entries).
fn small_count(v: &Value, field: &str) -> anyhow::Result<usize> {
    let most = temper_tinker::prompt_topk::MAX_TOPK;
    match &v[field] {
        Value::Null => Ok(0),
        x => match x.as_u64() {
            Some(k) if k as usize <= most => Ok(k as usize),
            _ => bail!("{field}: {x} must be an integer from 0 to {most}"),
        },
    }
}

/// A sample on the serving worker's engine, batched with every other request for the same
/// weights (the OpenAI and SGLang requests too, for the served model), and the prompt's
/// logprobs when asked.
fn on_the_serving_worker(
    state: Arc<AppState>,
    weights: Weights,
    request: temper_rollout::Request,
    prompt_logprobs: PromptWanted,
    recording: Option<Recording>,
) -> Dispatch {
    Box::new(move |promise| {
        tokio::spawn(async move {
            let records = recording.map(|r| (r, &state.tinker.records));
            let outcome =
                sample_on_worker(&state.worker, weights, request, prompt_logprobs, records).await;
            promise.complete(outcome.unwrap_or_else(|failed| failed));
        });
    })
}

/// What a sample request asks beyond its samples.
struct PromptWanted {
    /// Of the prompt's pass: its tokens' logprobs, the top-k, target cells, draws.
    ask: PromptAsk,
    /// `target_prompt_logprobs` as asked (the answer's layout).
    targets: Option<super::targets::TargetRequest>,
    /// Score only the last N positions (the others come back as not scored).
    last_n: Option<usize>,
    /// `topk_sample_logprobs`: the top-k at each sampled position (0: none).
    topk_sample: usize,
}

/// A sample request's `record_stability_info`: where its sequences are recorded, under which ids.
struct Recording {
    session: String,
    ids: Vec<String>,
}

/// The `asample` result of `request` on the worker, or the failure as the future's result (a
/// refusal the client caused is a user error, anything else a server error).
async fn sample_on_worker(
    worker: &crate::worker::Worker,
    weights: Weights,
    request: temper_rollout::Request,
    wanted: PromptWanted,
    records: Option<(Recording, &temper_tinker::SequenceRecords)>,
) -> Result<Outcome, Outcome> {
    let refused = |(status, e): crate::reply::Failure| {
        if status.is_client_error() {
            Outcome::user_error(e)
        } else {
            Outcome::server_error(e)
        }
    };
    let prompt = request.prompt_ids;
    let recorded_prompt = records.as_ref().map(|_| Arc::new(prompt.clone()));
    let mut per_prompt = worker
        .generate_on(
            &weights,
            std::slice::from_ref(&prompt),
            &request.params,
            &TINKER_FIELDS,
        )
        .await
        .map_err(refused)?;
    let samples = per_prompt
        .pop()
        .ok_or_else(|| Outcome::server_error("no answer for the prompt"))?
        .map_err(Outcome::server_error)?;
    let ask = &wanted.ask;
    let mut answers = PromptAnswers::default();
    if ask.logprobs || ask.topk > 0 || ask.targets.is_some() || ask.alt.is_some() {
        let scores = worker
            .prompt_scores(weights.clone(), prompt.clone(), wanted.ask.clone())
            .await
            .map_err(refused)?
            .map_err(Outcome::server_error)?;
        // Positions before the last N are reported as not scored.
        let skip = |len: usize| wanted.last_n.map_or(0, |n| len.saturating_sub(n));
        answers.logprobs = scores.logprobs.map(|lps| {
            let skip = skip(lps.len());
            proto::f32_bytes(lps.into_iter().enumerate().map(|(i, l)| {
                if i < skip {
                    f32::NAN
                } else {
                    l.unwrap_or(f32::NAN)
                }
            }))
        });
        answers.topk = scores.topk.map(|rows| {
            let skip = skip(rows.len());
            let rows: Vec<_> = rows
                .into_iter()
                .enumerate()
                .map(|(i, r)| r.filter(|_| i >= skip).map(|r| r.top))
                .collect();
            proto::TopkLogprobs::of(&rows, ask.topk)
        });
        if let (Some(t), Some(values)) = (&wanted.targets, scores.targets) {
            answers.targets = Some(t.answer(&values));
        }
        answers.alt_tokens = scores.alt.map(|d| {
            let shape = vec![(d.tokens.len() / d.k.max(1)) as i64, d.k as i64];
            let tensor = |encoding, dtype: proto::DType| proto::Tensor {
                encoding: Some(proto::tensor::Encoding::Dense(encoding)),
                dtype: dtype as i32,
                shape: shape.clone(),
            };
            proto::PromptAltTokens {
                tokens: Some(tensor(proto::i64_bytes(d.tokens), proto::DType::Int64)),
                logprobs: Some(tensor(proto::f32_bytes(d.logprobs), proto::DType::Float32)),
            }
        });
    }
    // `topk_sample_logprobs`: each sequence's sampled positions rescored (prompt + completion,
    // one pass each), as the OpenAI route's `logprobs: k` is.
    let mut seqs = Vec::with_capacity(samples.len());
    for s in samples {
        let topk = match wanted.topk_sample {
            0 => None,
            k => {
                let scored = crate::top_logprobs::score(
                    worker,
                    weights.clone(),
                    &prompt,
                    &s.completion_ids,
                    k,
                )
                .await
                .map_err(refused)?;
                let rows: Vec<_> = crate::top_logprobs::completion_part(&scored, prompt.len())
                    .iter()
                    .map(|p| p.as_ref().map(|p| p.top.clone()))
                    .collect();
                Some(proto::TopkLogprobs::of(&rows, k))
            }
        };
        seqs.push((temper_tinker::sampled_sequence(s), topk));
    }
    if let (Some((recording, store)), Some(prompt)) = (records, recorded_prompt) {
        for (id, (seq, _)) in recording.ids.iter().zip(&seqs) {
            store.record(
                id,
                &recording.session,
                prompt.clone(),
                seq.tokens.clone(),
                seq.logprobs.clone(),
            );
        }
    }
    Ok(super::samplers::sample_response(seqs, answers))
}
