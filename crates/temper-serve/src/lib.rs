//! `temper serve`: one HTTP server with one module per API surface over a shared model worker.
//!
//! - [`worker`]: the model, owned by one thread; requests are batched continuously (a request
//!   joins the running batch as rows free up and is answered when its own samples are done).
//! - [`openai`]: the OpenAI-compatible surface vLLM serves (`/v1/models`, `/v1/completions` with
//!   token-id or text prompts, returning token ids and per-token logprobs) and `/health`.
//!
//! - [`chat`]: `/v1/chat/completions`, through the model's chat template.
//! - [`reload`]: weight reload from a folder: SGLang's and vLLM's routes, and temper's own.
//! - [`weight_push`]: weights pushed over a c10d group (SGLang's `update_weights_from_distributed`).
//! - [`sglang`]: SGLang's native `/generate`.
//!
//! - [`tinker`]: Tinker's REST protocol under `/api/v1/*` (training models and sampling sessions of
//!   their own, created by clients).

pub mod chat;
pub mod limits;
pub mod models;
pub mod openai;
pub mod reload;
pub mod reply;
pub mod sglang;
pub mod tinker;
pub mod top_logprobs;
pub mod weight_push;
pub mod worker;

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, Result};

/// What every handler shares.
pub struct AppState {
    pub worker: worker::Worker,
    /// The served model's name (`/v1/models`, the `model` field of requests).
    pub model_name: String,
    /// When set, requests must send `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
    /// For text prompts and completion text.
    pub tokenizer: Option<std::sync::Arc<temper_model::Tokenizer>>,
    /// The Tinker API's models, sampling sessions and futures.
    pub tinker: Arc<tinker::Tinker>,
}

impl AppState {
    /// Whether `dir` is the model folder the serving worker holds.
    pub fn serves(&self, dir: &std::path::Path) -> bool {
        match (
            std::fs::canonicalize(dir),
            std::fs::canonicalize(&self.worker.dir),
        ) {
            (Ok(a), Ok(b)) => a == b,
            _ => false,
        }
    }
}

/// The router with every API module. Bodies larger than `--max-request-bytes` are refused
/// with 413 and the error shape of the API they were sent to, naming the limit.
pub fn router(state: Arc<AppState>) -> axum::Router {
    let limit = state.worker.limits.max_request_bytes;
    openai::routes()
        .merge(chat::routes())
        .merge(reload::routes())
        .merge(weight_push::routes())
        .merge(sglang::routes())
        .merge(tinker::routes(state.clone()))
        .layer(axum::middleware::from_fn(move |req, next| {
            explain_body_limit(limit, req, next)
        }))
        .layer(axum::extract::DefaultBodyLimit::max(limit))
        .with_state(state)
}

/// Reads every request's body whole before routing, so a route that ignores its body still
/// consumes it (answering before the client has sent it all resets the connection under the
/// client), and a body over `limit` gets a 413 in the error shape of the API it was sent to,
/// naming the limit (axum's own 413 is plain text; clients parse JSON errors).
async fn explain_body_limit(
    limit: usize,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::http::StatusCode;
    use axum::response::IntoResponse;
    // The error shape of the API the request was sent to.
    let tinker = req.uri().path().starts_with("/api/");
    let fail = |status: StatusCode, message: String| {
        if tinker {
            let body = serde_json::json!({"error": message, "category": "user"});
            (status, axum::Json(body)).into_response()
        } else {
            reply::error(status, message)
        }
    };
    let (parts, body) = req.into_parts();
    match axum::body::to_bytes(body, limit).await {
        Ok(bytes) => {
            let response = next
                .run(axum::extract::Request::from_parts(parts, bytes.into()))
                .await;
            if response.status() != StatusCode::PAYLOAD_TOO_LARGE {
                return response;
            }
        }
        // Not over the limit: the client went away or sent a broken body.
        Err(e) if !over_the_limit(&e) => {
            return fail(
                StatusCode::BAD_REQUEST,
                format!("request body: could not be read: {e}"),
            );
        }
        Err(_) => {}
    }
    fail(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!(
            "request body: larger than this server's limit of {limit} bytes (--max-request-bytes)"
        ),
    )
}

/// Serve until the process is stopped (Ctrl-C ends it cleanly). Binds `addr` (127.0.0.1 unless
/// told otherwise) and prints the bound address, so `--port 0` works.
pub fn serve_blocking(addr: SocketAddr, state: AppState) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding {addr}"))?;
        eprintln!(
            "temper serve: {} on http://{}",
            state.model_name,
            listener.local_addr()?
        );
        axum::serve(listener, router(Arc::new(state)))
            .with_graceful_shutdown(async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await
            .context("serving")
    })
}

/// Whether reading a body failed because it is larger than the limit (not because the client
/// went away or sent a broken body).
fn over_the_limit(e: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if err.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        source = err.source();
    }
    false
}
