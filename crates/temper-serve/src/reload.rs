//! Weight reload, in both styles RL trainers use, so either backend name works against temper:
//! SGLang's `POST /update_weights_from_disk {"model_path": DIR}` and vLLM's dev-mode
//! `POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": DIR}}` followed
//! by `POST /reset_prefix_cache` (a no-op here: temper keeps no cache between requests).

use std::path::PathBuf;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};

use crate::reply::{authorized, error};
use crate::AppState;

pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/update_weights_from_disk", post(sglang))
        .route("/collective_rpc", post(vllm))
        .route("/reset_prefix_cache", post(|| async { StatusCode::OK }))
        .route("/flush_cache", post(|| async { StatusCode::OK }))
}

async fn reload(state: &AppState, dir: Option<&str>, field: &str) -> Result<(), Response> {
    let Some(dir) = dir else {
        return Err(error(StatusCode::BAD_REQUEST, format!("{field}: missing")));
    };
    let dir = PathBuf::from(dir);
    if !dir.is_dir() {
        return Err(error(
            StatusCode::BAD_REQUEST,
            format!("{field}: {} is not a folder", dir.display()),
        ));
    }
    state
        .worker
        .reload(dir)
        .await
        .map_err(|e| error(StatusCode::BAD_REQUEST, format!("{field}: {e}")))
}

async fn sglang(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Json<Value>,
) -> Response {
    if !authorized(&state, &headers) {
        return error(StatusCode::UNAUTHORIZED, "missing or wrong API key");
    }
    match reload(&state, body["model_path"].as_str(), "model_path").await {
        Ok(()) => Json(json!({"success": true, "message": "weights reloaded"})).into_response(),
        Err(r) => r,
    }
}

async fn vllm(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Json<Value>,
) -> Response {
    if !authorized(&state, &headers) {
        return error(StatusCode::UNAUTHORIZED, "missing or wrong API key");
    }
    match body["method"].as_str() {
        Some("reload_weights") => {}
        other => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("method: {other:?} is not supported (reload_weights is)"),
            )
        }
    }
    match reload(
        &state,
        body["kwargs"]["weights_path"].as_str(),
        "kwargs.weights_path",
    )
    .await
    {
        Ok(()) => Json(json!({"results": [null]})).into_response(),
        Err(r) => r,
    }
}
