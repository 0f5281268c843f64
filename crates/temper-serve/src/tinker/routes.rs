//! The `/api/v1/*` handlers. Calls the SDK treats as futures answer `{"request_id"}` at once, also
//! when the request is refused: the refusal is the future's result, `{"error", "category":
//! "user"}`, which the SDK raises as `RequestFailedError` with the message (naming the datum
//! index and field). Direct calls answer such an error body with HTTP 400 (404 for unknown ids).

use std::sync::{mpsc, Arc};

use anyhow::{anyhow, bail, Context, Result};
use axum::body::Bytes;
use axum::extract::{Path as UrlPath, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use prost::Message;
use serde_json::{json, Value};
use temper_model::LoraConfig;
use temper_tinker::AdamParams;

use super::create_model::{start_model, Spec};
use super::futures::{Outcome, POLL_HOLD};
use super::training::{self, Job, Queued};
use super::{convert, proto, Tinker};
use crate::reply::{authorized, off_runtime};
use crate::AppState;

type S = State<Arc<AppState>>;

/// Every Tinker route but the SDK's telemetry and dynamic config needs the API key: one check,
/// before the handler (so before any body is parsed or anything allocated).
pub fn routes(state: Arc<AppState>) -> Router<Arc<AppState>> {
    let keyed = Router::new()
        .route("/api/v1/client/config", post(client_config))
        .route("/api/v1/create_session", post(create_session))
        .route("/api/v1/session_heartbeat", post(session_heartbeat))
        .route("/api/v1/sessions/{id}/finish", post(finish_session))
        .route(
            "/api/v1/create_model",
            post(super::create_model::create_model),
        )
        .route("/api/v1/get_info", post(get_info))
        .route("/api/v1/forward_backward", post(forward_backward))
        .route("/api/v1/optim_step", post(optim_step))
        .route("/api/v1/save_weights", post(save_weights))
        .route(
            "/api/v1/save_weights_for_sampler",
            post(save_weights_for_sampler),
        )
        .route("/api/v1/load_weights", post(load_weights))
        .route(
            "/api/v1/create_sampling_session",
            post(create_sampling_session),
        )
        .route("/api/v1/samplers/{id}", get(get_sampler))
        .route("/api/v1/asample", post(super::sample_route::asample))
        .route("/api/v1/retrieve_future", post(retrieve_future))
        .route("/api/v1/get_server_capabilities", get(server_capabilities))
        .route("/api/v1/create_custom_loss", post(create_custom_loss))
        .route_layer(middleware::from_fn_with_state(state, require_key));
    Router::new()
        .route(
            "/api/v1/client/dynamic_config",
            post(|| async { Json(json!({})) }),
        )
        .route(
            "/api/v1/telemetry",
            post(|| async { Json(json!({"status": "accepted"})) }),
        )
        .merge(keyed)
}

/// The API key (`reply::authorized`: Bearer or X-API-Key), or a Tinker user error.
async fn require_key(State(state): S, request: Request, next: Next) -> Response {
    if !authorized(&state, request.headers()) {
        return refuse(StatusCode::UNAUTHORIZED, "missing or wrong X-API-Key");
    }
    next.run(request).await
}

/// `{"error", "category": "user"}` with `status`.
pub(super) fn refuse(status: StatusCode, message: impl std::fmt::Display) -> Response {
    (
        status,
        Json(json!({"error": message.to_string(), "category": "user"})),
    )
        .into_response()
}

pub(super) fn parse_json(body: &[u8]) -> Result<Value> {
    serde_json::from_slice(body).map_err(|e| anyhow!("request body: {e}"))
}

/// The string `field` of a JSON body, or the 400 that says why there is none.
fn id_field(body: &[u8], field: &str) -> Result<String, Box<Response>> {
    let v = parse_json(body).map_err(|e| Box::new(refuse(StatusCode::BAD_REQUEST, e)))?;
    match v[field].as_str() {
        Some(id) => Ok(id.to_string()),
        None => Err(Box::new(refuse(
            StatusCode::BAD_REQUEST,
            format!("{field}: missing"),
        ))),
    }
}

/// Run `f` for a direct call: its JSON, or a 400 naming the problem.
fn direct(f: impl FnOnce() -> Result<Value>) -> Response {
    match f() {
        Ok(v) => Json(v).into_response(),
        Err(e) => refuse(StatusCode::BAD_REQUEST, format!("{e:#}")),
    }
}

/// [`direct`] on a blocking thread (for calls that read model or checkpoint folders).
async fn direct_blocking(f: impl FnOnce() -> Result<Value> + Send + 'static) -> Response {
    match off_runtime(f).await {
        Ok(r) => direct(|| r),
        Err((status, message)) => (
            status,
            Json(json!({"error": message, "category": "server"})),
        )
            .into_response(),
    }
}

/// How a future-style call hands its promise to the job that completes it.
pub(super) type Dispatch = Box<dyn FnOnce(super::futures::Promise) + Send>;

/// A future-style call: `prepare` checks the request and returns how to queue its job; a
/// refusal becomes the future's result. `extra` joins the `{"request_id"}` answer.
pub(super) fn future(
    state: &AppState,
    extra: Value,
    prepare: impl FnOnce() -> Result<Dispatch>,
) -> Response {
    let (id, promise) = state.tinker.futures.create();
    match prepare() {
        Ok(dispatch) => dispatch(promise),
        Err(e) => promise.complete(Outcome::user_error(format!("{e:#}"))),
    }
    request_id_answer(id, extra)
}

/// `{"request_id": id}` with the fields of `extra`.
fn request_id_answer(id: String, extra: Value) -> Response {
    let mut body = json!({"request_id": id});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    Json(body).into_response()
}

/// [`future`] with `prepare` on a blocking thread: decoding a forward_backward body (up to
/// `--max-request-bytes` of protobuf), reading checkpoint folders and building sampling requests
/// stay off the async runtime's threads, which keep answering every other client. A panic in
/// `prepare` fails this request as a server error.
pub(super) async fn future_blocking(
    state: &AppState,
    extra: Value,
    prepare: impl FnOnce() -> Result<Dispatch> + Send + 'static,
) -> Response {
    let (id, promise) = state.tinker.futures.create();
    match off_runtime(prepare).await {
        Ok(Ok(dispatch)) => dispatch(promise),
        Ok(Err(e)) => promise.complete(Outcome::user_error(format!("{e:#}"))),
        Err((_, message)) => promise.complete(Outcome::server_error(message)),
    }
    request_id_answer(id, extra)
}

/// A dispatch that queues `job` on model `model_id` in `seq` order.
fn to_model(t: &Tinker, model_id: &str, seq: i64, job: Job) -> Result<Dispatch> {
    let tx = t
        .models
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(model_id)
        .map(|m| m.tx.clone())
        .with_context(|| t.unknown("model_id", "model", model_id))?;
    Ok(Box::new(move |promise| {
        if let Err(mpsc::SendError(q)) = tx.send(Queued { seq, job, promise }) {
            q.promise.complete(Outcome::Error {
                message: "the model's thread has stopped (did its creation fail?)".into(),
                user: false,
            });
        }
    }))
}

async fn client_config(State(state): S) -> Response {
    // The SDK cuts forward_backward data into requests of at most this estimated size (its
    // default, 5,000,000 bytes, or half of --max-request-bytes when that is smaller: the estimate
    // leaves out the protobuf framing).
    let chunk_bytes = 5_000_000.min(state.worker.limits.max_request_bytes / 2);
    direct(|| {
        // Plain HTTP/1.1 + JSON, no JWT, forward_backward chunks sent in order.
        Ok(
            json!({"pjwt_auth_enabled": false, "use_pyqwest_transport": false,
                  "proto_compress_fwdbwd": false, "parallel_fwdbwd_chunks": false,
                  "sample_use_retrieve_futures": false, "custom_loss_server_side": false,
                  "sample_join_sampling_session": false,
                  "fwdbwd_max_chunk_bytes_count": chunk_bytes, "fwdbwd_max_chunk_len": 1024}),
        )
    })
}

async fn create_session(State(state): S) -> Response {
    direct(|| {
        let id = state.tinker.sessions.open();
        Ok(json!({"session_id": id, "type": "create_session"}))
    })
}

/// A heartbeat keeps a session alive; for an ended one it is HTTP 410, which the SDK reads as
/// "this session has finished" and stops heartbeating.
async fn session_heartbeat(State(state): S, body: Bytes) -> Response {
    let id = match id_field(&body, "session_id") {
        Ok(id) => id,
        Err(refused) => return *refused,
    };
    let id = id.as_str();
    match state.tinker.sessions.touch(id) {
        Ok(()) => Json(json!({"type": "session_heartbeat"})).into_response(),
        Err(e) => refuse(StatusCode::GONE, e),
    }
}

async fn finish_session(State(state): S, UrlPath(id): UrlPath<String>) -> Response {
    state.tinker.end_session(&id, "finished by the client");
    Json(json!({})).into_response()
}

/// A sign of life from the session a request names; refused when it has ended.
pub(super) fn live_session<'a>(t: &Tinker, v: &'a Value) -> Result<&'a str> {
    let id = v["session_id"].as_str().context("session_id: missing")?;
    t.sessions
        .touch(id)
        .map_err(|e| anyhow!("session_id: {e}"))?;
    Ok(id)
}

async fn get_info(State(state): S, body: Bytes) -> Response {
    let v = match parse_json(&body) {
        Ok(v) => v,
        Err(e) => return refuse(StatusCode::BAD_REQUEST, e),
    };
    let id = v["model_id"].as_str().unwrap_or_default();
    match state
        .tinker
        .models
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(id)
    {
        Some(m) => Json(m.info.clone()).into_response(),
        None => refuse(
            StatusCode::NOT_FOUND,
            state.tinker.unknown("model_id", "model", id),
        ),
    }
}

async fn forward_backward(State(state): S, body: Bytes) -> Response {
    let t = state.tinker.clone();
    let max_model_len = state.worker.limits.max_model_len;
    future_blocking(&state, json!({}), move || {
        let r = proto::ForwardBackwardRequest::decode(body.as_ref())
            .map_err(|e| anyhow!("request body: not a ForwardBackwardRequest protobuf: {e}"))?;
        let mut data = convert::datums(&r.data)?;
        check_datum_lengths(&data, max_model_len)?;
        resolve_provenance(&t, &r.model_id, &r.loss_fn, &mut data)?;
        let job = Job::ForwardBackward {
            data,
            config: convert::loss_config(&r)?,
            loss_fn: r.loss_fn.clone(),
            forward_only: r.forward_only,
        };
        to_model(&t, &r.model_id, r.seq_id as i64, job)
    })
    .await
}

/// For `stable_reinforce`, each datum's provenance checked against what the samplers of the
/// model's session recorded, and the recorded logprobs attached to it (what it trains with). The
/// other losses do not read the records: their datums' provenance is checked for tiling only
/// (the cookbook attaches it whether or not the sampler recorded).
fn resolve_provenance(
    t: &Tinker,
    model_id: &str,
    loss_fn: &str,
    data: &mut [temper_tinker::Datum],
) -> Result<()> {
    let session = super::sessions::session_of(model_id);
    for (i, d) in data.iter_mut().enumerate() {
        let Some(provenance) = &d.provenance else {
            continue;
        };
        let Some(temper_tinker::TensorData::I64(targets)) = d.loss_fn_inputs.get("target_tokens")
        else {
            bail!("datum {i}: loss_fn_inputs.target_tokens: missing or not int64 token ids");
        };
        if loss_fn != "stable_reinforce" {
            // Spans tile target_tokens' rows: N of an (N, K) field.
            let rows = targets.len() / d.width("target_tokens").max(1);
            provenance.check_tiling(i, d.model_input.len(), rows)?;
            continue;
        }
        let recorded = t
            .records
            .resolve(i, session, provenance, &d.model_input, targets)?;
        d.recorded = Some(recorded);
    }
    Ok(())
}

/// Each datum's tokens within `--max-model-len`: a pass holds at least one whole datum, so one
/// longer than any context the server admits is refused (naming it) before it is run.
fn check_datum_lengths(data: &[temper_tinker::Datum], max_model_len: usize) -> Result<()> {
    for (i, d) in data.iter().enumerate() {
        let len = d.model_input.len();
        if len > max_model_len {
            bail!(
                "datum {i}: model_input has {len} tokens, more than the model's maximum context \
                 length of {max_model_len} tokens (--max-model-len)"
            );
        }
    }
    Ok(())
}

/// `model_id` and `seq_id` of a JSON training request.
fn model_and_seq(v: &Value) -> Result<(String, i64)> {
    let id = v["model_id"]
        .as_str()
        .context("model_id: missing")?
        .to_string();
    Ok((id, v["seq_id"].as_i64().unwrap_or(0)))
}

async fn optim_step(State(state): S, body: Bytes) -> Response {
    let t = state.tinker.clone();
    future(&state, json!({}), || {
        let v = parse_json(&body)?;
        let (id, seq) = model_and_seq(&v)?;
        let a = &v["adam_params"];
        if a.is_null() {
            bail!("adam_params: missing (temper trains with AdamW only)");
        }
        let d = AdamParams::default();
        let num = |k: &str, dflt: f64| -> Result<f64> {
            match &a[k] {
                Value::Null => Ok(dflt),
                x => x
                    .as_f64()
                    .with_context(|| format!("adam_params.{k}: not a number")),
            }
        };
        let p = AdamParams {
            learning_rate: num("learning_rate", d.learning_rate)?,
            beta1: num("beta1", d.beta1)?,
            beta2: num("beta2", d.beta2)?,
            eps: num("eps", d.eps)?,
            weight_decay: num("weight_decay", d.weight_decay)?,
            grad_clip_norm: num("grad_clip_norm", d.grad_clip_norm)?,
        };
        to_model(&t, &id, seq, Job::OptimStep(p))
    })
}

async fn save_weights(State(state): S, body: Bytes) -> Response {
    let t = state.tinker.clone();
    future(&state, json!({}), || {
        let v = parse_json(&body)?;
        let (id, seq) = model_and_seq(&v)?;
        let name = v["path"].as_str().context("path: missing")?.to_string();
        to_model(&t, &id, seq, Job::SaveState { name })
    })
}

async fn save_weights_for_sampler(State(state): S, body: Bytes) -> Response {
    let t = state.tinker.clone();
    future(&state, json!({}), || {
        let v = parse_json(&body)?;
        let (id, seq) = model_and_seq(&v)?;
        let name = v["path"].as_str().map(str::to_string);
        // The SDK numbers sampling sessions per session; the id joins them.
        let session = v["sampling_session_seq_id"].as_i64().map(|k| {
            let sess = id.split(":train:").next().unwrap_or(&id);
            format!("{sess}:sample:{k}")
        });
        let inflight = match v["kind"].as_str() {
            None | Some("snapshot") => false,
            Some("inflight") => true,
            Some(k) => bail!("kind: {k:?} is neither \"snapshot\" nor \"inflight\""),
        };
        to_model(
            &t,
            &id,
            seq,
            Job::SaveForSampler {
                name,
                session,
                inflight,
            },
        )
    })
}

async fn load_weights(State(state): S, body: Bytes) -> Response {
    let t = state.tinker.clone();
    future_blocking(&state, json!({}), move || {
        let v = parse_json(&body)?;
        let path = v["path"].as_str().context("path: missing")?.to_string();
        let dir = convert::checkpoint_dir(&t.root, &path)?;
        let optimizer = v["optimizer"].as_bool().unwrap_or(false);
        if let Some(id) = v["model_id"].as_str() {
            let seq = v["seq_id"].as_i64().unwrap_or(0);
            return to_model(
                &t,
                id,
                seq,
                Job::LoadState {
                    dir,
                    path,
                    optimizer,
                },
            );
        }
        // create_training_client_from_state: a new model, made as the saved one was.
        let session = live_session(&t, &v)?;
        let seq = v["model_seq_id"]
            .as_i64()
            .context("model_seq_id: missing")?;
        let meta = training::state_meta(&dir)?;
        let base_model = meta["base_model"]
            .as_str()
            .context("the saved state names no base model")?;
        let base_dir = temper_model::resolve::resolve_model(base_model)?;
        let lora = match meta["lora_rank"].as_i64() {
            Some(rank) => Some(LoraConfig {
                rank,
                alpha: meta["lora_alpha"].as_f64().unwrap_or(rank as f64),
                target_modules: serde_json::from_value(meta["target_modules"].clone())
                    .context("the saved state's target_modules")?,
            }),
            None => None,
        };
        let spec = Spec {
            model_id: format!("{session}:train:{seq}"),
            base_model: base_model.to_string(),
            base_dir,
            lora,
            seed: None,
            state: Some((dir, optimizer)),
            answer_type: "load_weights",
        };
        Ok(Box::new(move |promise| start_model(&t, spec, promise)))
    })
    .await
}

async fn create_sampling_session(State(state): S, body: Bytes) -> Response {
    let t = state.tinker.clone();
    direct_blocking(move || {
        let v = parse_json(&body)?;
        let session = live_session(&t, &v)?;
        let k = v["sampling_session_seq_id"]
            .as_i64()
            .context("sampling_session_seq_id: missing")?;
        let id = format!("{session}:sample:{k}");
        if let Some(path) = v["model_path"].as_str() {
            let (model_id, kind, _) = convert::parse_tinker_path(path)?;
            if kind != "sampler_weights" {
                bail!("model_path {path:?}: sampling needs weights saved with save_weights_for_sampler");
            }
            let dir = convert::checkpoint_dir(&t.root, path)?;
            let base = match t
                .models
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&model_id)
            {
                Some(m) => m.base_model.clone(),
                None => dir.display().to_string(),
            };
            t.samplers.register(&id, &dir, &base, Some(path));
        } else {
            let base = v["base_model"]
                .as_str()
                .context("model_path or base_model: one is needed")?;
            let dir = temper_model::resolve::resolve_model(base)
                .with_context(|| format!("base_model {base:?}"))?;
            t.samplers.register(&id, &dir, base, None);
        }
        Ok(json!({"sampling_session_id": id, "type": "create_sampling_session"}))
    })
    .await
}

/// The one model this server serves, trainable (LoRA or full) and sampleable, with its context.
async fn server_capabilities(State(state): S) -> Response {
    Json(json!({"supported_models": [{
        "model_name": state.model_name,
        "max_context_length": state.worker.limits.max_model_len,
        "trainable": true,
        "sampleable": true,
    }]}))
    .into_response()
}

/// Server-side custom losses would run code a client uploads inside the server: temper does not,
/// and says what to use instead.
async fn create_custom_loss(State(state): S) -> Response {
    future(&state, json!({}), || {
        bail!(
            "create_custom_loss: temper does not run client-defined losses on the server; \
             compute the loss client-side with forward_backward_custom, or use a built-in loss_fn"
        )
    })
}

async fn get_sampler(State(state): S, UrlPath(id): UrlPath<String>) -> Response {
    match state.tinker.samplers.session(&id) {
        Some(s) => {
            Json(json!({"sampler_id": id, "base_model": s.base_model, "model_path": s.model_path}))
                .into_response()
        }
        None => refuse(
            StatusCode::NOT_FOUND,
            state.tinker.unknown("sampler_id", "sampling session", &id),
        ),
    }
}

async fn retrieve_future(State(state): S, body: Bytes) -> Response {
    let id = match id_field(&body, "request_id") {
        Ok(id) => id,
        Err(refused) => return *refused,
    };
    let id = id.as_str();
    match state.tinker.futures.wait(id, POLL_HOLD).await {
        None => Json(json!({"type": "try_again", "request_id": id, "queue_state": "active"}))
            .into_response(),
        Some(Outcome::Json(v)) => Json(v).into_response(),
        Some(Outcome::Proto(bytes)) => {
            ([(header::CONTENT_TYPE, "application/x-protobuf")], bytes).into_response()
        }
        Some(Outcome::Error { message, user }) => {
            Json(json!({"error": message, "category": if user { "user" } else { "server" }}))
                .into_response()
        }
    }
}
