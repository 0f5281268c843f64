//! Tinker's futures: every training, creation and sampling call answers at once with a
//! `request_id`; the result is fetched with `retrieve_future`, which the SDK calls in a tight
//! loop. So the server holds each poll until the result is there or [`POLL_HOLD`] passes, then
//! answers `try_again`. A result stays until the server stops (a client may fetch it again after
//! a retry).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::watch;

/// How long one `retrieve_future` waits before `try_again` (the SDK's own poll timeout is 45 s).
pub const POLL_HOLD: Duration = Duration::from_secs(30);

/// A finished request.
#[derive(Clone, Debug)]
pub enum Outcome {
    Json(Value),
    /// A protobuf body (forward_backward and sample results).
    Proto(Vec<u8>),
    /// `{"error": message, "category": "user" | "server"}`.
    Error {
        message: String,
        user: bool,
    },
}

impl Outcome {
    pub fn user_error(message: impl Into<String>) -> Outcome {
        Outcome::Error {
            message: message.into(),
            user: true,
        }
    }

    /// A job's result: a failure is the user's (bad input is what the checks catch).
    pub fn from_result(r: anyhow::Result<Outcome>) -> Outcome {
        r.unwrap_or_else(|e| Outcome::user_error(format!("{e:#}")))
    }
}

/// Pending and finished requests by id.
#[derive(Default)]
pub struct Futures {
    next: AtomicU64,
    slots: Mutex<HashMap<String, watch::Receiver<Option<Outcome>>>>,
}

/// Where a job puts its result.
pub struct Promise(watch::Sender<Option<Outcome>>);

impl Promise {
    pub fn complete(self, outcome: Outcome) {
        let _ = self.0.send(Some(outcome));
    }
}

impl Futures {
    /// A new request id and the promise its job completes.
    pub fn create(&self) -> (String, Promise) {
        let id = format!("req-{}", self.next.fetch_add(1, Ordering::Relaxed));
        let (tx, rx) = watch::channel(None);
        self.slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.clone(), rx);
        (id, Promise(tx))
    }

    /// The outcome of `id`, waiting up to `hold`; `None` on timeout; an error outcome for an
    /// unknown id or a job that died without answering.
    pub async fn wait(self: &Arc<Self>, id: &str, hold: Duration) -> Option<Outcome> {
        let rx = self
            .slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .cloned();
        let Some(mut rx) = rx else {
            return Some(Outcome::user_error(format!(
                "request_id: no request {id:?}"
            )));
        };
        let waited = tokio::time::timeout(hold, rx.wait_for(|v| v.is_some())).await;
        match waited {
            Err(_) => None,
            Ok(Ok(v)) => v.clone(),
            Ok(Err(_)) => Some(Outcome::Error {
                message: format!("request {id} was dropped by the server"),
                user: false,
            }),
        }
    }
}
