//! Weight reload, in both styles RL trainers use, so either backend name works against temper:
//! SGLang's `POST /update_weights_from_disk {"model_path": DIR}` and vLLM's dev-mode
//! `POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": DIR}}` followed
//! by `POST /reset_prefix_cache` (a no-op here: temper keeps no cache between requests); and
//! temper's own `POST /reload_weights {"weights_path": DIR}` (what `rollout.backend = "openai"`
//! calls). Requests queued before a reload are sampled with the old weights, those after with the
//! new: the worker swaps weights once the admitted requests are done, never during one.

use std::path::PathBuf;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use serde_json::{json, Value};

use crate::reply::{bad, handle, Failure};
use crate::AppState;

pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/update_weights_from_disk", post(sglang))
        .route("/collective_rpc", post(vllm))
        .route("/reload_weights", post(temper))
        .route("/reset_prefix_cache", post(|| async { StatusCode::OK }))
        .route("/flush_cache", post(|| async { StatusCode::OK }))
}

async fn reload(state: &AppState, dir: Option<&str>, field: &str) -> Result<(), Failure> {
    let Some(dir) = dir else {
        return Err(bad(format!("{field}: missing")));
    };
    let dir = PathBuf::from(dir);
    if !dir.is_dir() {
        return Err(bad(format!("{field}: {} is not a folder", dir.display())));
    }
    state
        .worker
        .reload(dir)
        .await
        .map_err(|e| bad(format!("{field}: {e}")))
}

async fn sglang(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Bytes) -> Response {
    let state = &state;
    handle(state, &headers, &body, |v: Value| async move {
        reload(state, v["model_path"].as_str(), "model_path").await?;
        Ok(json!({"success": true, "message": "weights reloaded"}))
    })
    .await
}

async fn vllm(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Bytes) -> Response {
    let state = &state;
    handle(state, &headers, &body, |v: Value| async move {
        if v["method"].as_str() != Some("reload_weights") {
            return Err(bad(format!(
                "method: {:?} is not supported (reload_weights is)",
                v["method"].as_str()
            )));
        }
        reload(
            state,
            v["kwargs"]["weights_path"].as_str(),
            "kwargs.weights_path",
        )
        .await?;
        Ok(json!({"results": [null]}))
    })
    .await
}

async fn temper(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Bytes) -> Response {
    let state = &state;
    handle(state, &headers, &body, |v: Value| async move {
        reload(state, v["weights_path"].as_str(), "weights_path").await?;
        Ok(json!({"success": true}))
    })
    .await
}
