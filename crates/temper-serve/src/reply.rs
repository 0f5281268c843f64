//! What every API module shares: the API-key check, vLLM-style error replies, and the
//! handler shape "authorize, parse the JSON body, run, answer JSON or an error naming the field".

use std::future::Future;

use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

use crate::AppState;

/// A refused request: the status and a message naming the field.
pub type Failure = (StatusCode, String);

pub fn bad(msg: impl Into<String>) -> Failure {
    (StatusCode::BAD_REQUEST, msg.into())
}

/// vLLM's error body: `{"object": "error", "message", "type", "param", "code"}`.
pub fn error(code: StatusCode, message: impl Into<String>) -> Response {
    let kind = if code == StatusCode::UNAUTHORIZED {
        "AuthenticationError"
    } else if code.is_client_error() {
        "BadRequestError"
    } else {
        "InternalServerError"
    };
    let body = json!({"object": "error", "message": message.into(), "type": kind, "param": null,
                      "code": code.as_u16()});
    (code, Json(body)).into_response()
}

/// The one API-key check (only with `--api-key`), for every API: `Authorization: Bearer KEY`
/// (OpenAI, SGLang) or `X-API-Key: KEY` (what the Tinker SDK sends).
pub fn authorized(state: &AppState, headers: &HeaderMap) -> bool {
    let Some(key) = &state.api_key else {
        return true;
    };
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    header("authorization").and_then(|v| v.strip_prefix("Bearer ")) == Some(key.as_str())
        || header("x-api-key") == Some(key.as_str())
}

/// Runs `f` on a blocking thread, off the async runtime's threads (which keep answering every
/// other client): parsing a body of up to `--max-request-bytes`, tokenizing, reading folders. A
/// panic in `f` fails this request only, as a 500 saying so.
pub async fn off_runtime<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, Failure> {
    tokio::task::spawn_blocking(f).await.map_err(|e| {
        let why = if e.is_panic() {
            crate::worker::panic_message(&e.into_panic())
        } else {
            e.to_string()
        };
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the request failed inside the server: {why}"),
        )
    })
}

/// Authorize, parse `body` as `T`, run `f`, and answer its JSON or its failure.
pub async fn handle<T, F, Fut>(
    state: &AppState,
    headers: &HeaderMap,
    body: &axum::body::Bytes,
    f: F,
) -> Response
where
    T: DeserializeOwned + Send + 'static,
    F: FnOnce(T) -> Fut,
    Fut: Future<Output = Result<Value, Failure>>,
{
    if !authorized(state, headers) {
        return error(StatusCode::UNAUTHORIZED, "missing or wrong API key");
    }
    let body = body.clone();
    let req: T = match off_runtime(move || serde_json::from_slice::<T>(&body)).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => return error(StatusCode::BAD_REQUEST, format!("request body: {e}")),
        Err((code, msg)) => return error(code, msg),
    };
    match f(req).await {
        Ok(v) => Json(v).into_response(),
        Err((code, msg)) => error(code, msg),
    }
}

/// Every prompt non-empty and every token id in the vocabulary; `field` names them
/// (`prompt`, `input_ids`).
pub fn check_prompts(prompts: &[Vec<i64>], vocab: i64, field: &str) -> Result<(), Failure> {
    if prompts.is_empty() {
        return Err(bad(format!("{field}: empty")));
    }
    for (i, p) in prompts.iter().enumerate() {
        if p.is_empty() {
            return Err(bad(format!("{field}[{i}]: no tokens")));
        }
        if let Some((j, t)) = p.iter().enumerate().find(|(_, t)| **t < 0 || **t >= vocab) {
            return Err(bad(format!(
                "{field}[{i}][{j}] = {t}: outside the vocabulary (0..{vocab})"
            )));
        }
    }
    Ok(())
}
