//! Tinker's futures: every training, creation and sampling call answers at once with a
//! `request_id`; the result is fetched with `retrieve_future`, which the SDK calls in a tight
//! loop. So the server holds each poll until the result is there or [`POLL_HOLD`] passes, then
//! answers `try_again`. Memory stays bounded: a retrieved result is kept [`KEEP_RETRIEVED`] more
//! (a client whose answer was lost in transit may fetch it again), one never retrieved
//! [`KEEP_UNRETRIEVED`]; then both are dropped.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::watch;

/// How long one `retrieve_future` waits before `try_again` (the SDK's own poll timeout is 45 s).
pub const POLL_HOLD: Duration = Duration::from_secs(30);
/// How long a result stays after it was first retrieved.
pub const KEEP_RETRIEVED: Duration = Duration::from_secs(120);
/// How long a finished result nobody asked for stays.
pub const KEEP_UNRETRIEVED: Duration = Duration::from_secs(3600);
/// Expired results are swept at most this often.
const SWEEP_EVERY: Duration = Duration::from_secs(5);

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

    /// A failure on the server's side (tinker 0.38 raises it as RequestFailedError; the category
    /// only marks whose fault it was).
    pub fn server_error(message: impl Into<String>) -> Outcome {
        Outcome::Error {
            message: message.into(),
            user: false,
        }
    }

    /// A job's result. A failure is the user's (bad input is what the checks catch) unless it
    /// came from the server's own resources: a file system error other than a missing or
    /// invalid path (a full disk, a permission), or libtorch (an allocation that failed). Those
    /// are server errors, which the SDK retries.
    pub fn from_result(r: anyhow::Result<Outcome>) -> Outcome {
        r.unwrap_or_else(|e| {
            let message = format!("{e:#}");
            if is_server_fault(&e) {
                Outcome::server_error(message)
            } else {
                Outcome::user_error(message)
            }
        })
    }
}

/// Whether `e` was caused by the server's resources rather than by the request.
fn is_server_fault(e: &anyhow::Error) -> bool {
    use std::io::ErrorKind;
    e.chain().any(|cause| {
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            return !matches!(
                io.kind(),
                ErrorKind::NotFound | ErrorKind::InvalidInput | ErrorKind::InvalidFilename
            );
        }
        cause.is::<tch::TchError>()
    })
}

/// One request's result, once there, and when it was first retrieved.
struct Slot {
    rx: watch::Receiver<Option<Outcome>>,
    /// When the result arrived (checked lazily, at sweeps).
    finished: Option<Instant>,
    retrieved: Option<Instant>,
}

/// Pending and finished requests by id.
pub struct Futures {
    next: AtomicU64,
    slots: Mutex<HashMap<String, Slot>>,
    last_sweep: Mutex<Instant>,
}

impl Default for Futures {
    fn default() -> Self {
        Futures {
            next: AtomicU64::new(0),
            slots: Mutex::new(HashMap::new()),
            last_sweep: Mutex::new(Instant::now()),
        }
    }
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
        self.sweep();
        let slot = Slot {
            rx,
            finished: None,
            retrieved: None,
        };
        self.slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.clone(), slot);
        (id, Promise(tx))
    }

    /// Requests held (pending or finished and not yet dropped).
    pub fn len(&self) -> usize {
        self.slots.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops the results whose time is up (at most every [`SWEEP_EVERY`]).
    pub fn sweep(&self) {
        let now = Instant::now();
        {
            let mut last = self.last_sweep.lock().unwrap_or_else(|e| e.into_inner());
            if now.duration_since(*last) < SWEEP_EVERY {
                return;
            }
            *last = now;
        }
        self.sweep_at(now);
    }

    /// Drops the results expired at `now`.
    pub fn sweep_at(&self, now: Instant) {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        slots.retain(|_, slot| {
            if slot.finished.is_none() && slot.rx.borrow().is_some() {
                slot.finished = Some(now);
            }
            match (slot.retrieved, slot.finished) {
                (Some(r), _) => now.duration_since(r) < KEEP_RETRIEVED,
                (None, Some(f)) => now.duration_since(f) < KEEP_UNRETRIEVED,
                // Still running, or its job is gone without answering (then the sender is closed).
                (None, None) => slot.rx.has_changed().is_ok(),
            }
        });
    }

    /// The outcome of `id`, waiting up to `hold`; `None` on timeout; an error outcome for an
    /// unknown id or a job that died without answering.
    pub async fn wait(self: &Arc<Self>, id: &str, hold: Duration) -> Option<Outcome> {
        let rx = self
            .slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .map(|s| s.rx.clone());
        let Some(mut rx) = rx else {
            return Some(Outcome::user_error(format!(
                "request_id: no request {id:?} (a result is kept {} s after it is first retrieved)",
                KEEP_RETRIEVED.as_secs()
            )));
        };
        let waited = tokio::time::timeout(hold, rx.wait_for(|v| v.is_some())).await;
        let outcome = match waited {
            Err(_) => return None,
            Ok(Ok(v)) => v.clone(),
            Ok(Err(_)) => Some(Outcome::server_error(format!(
                "request {id} was dropped by the server"
            ))),
        };
        if let Some(slot) = self
            .slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(id)
        {
            slot.retrieved.get_or_insert_with(Instant::now);
        }
        outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    /// A bad request is the user's fault; a full disk or a failed libtorch call the server's.
    #[test]
    fn failures_are_the_users_unless_the_servers_resources_failed() {
        let category = |e: anyhow::Error| match Outcome::from_result(Err(e)) {
            Outcome::Error { user, .. } => user,
            _ => unreachable!(),
        };
        assert!(category(anyhow::anyhow!("path: not a checkpoint name")));
        let missing = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        assert!(category(
            anyhow::Error::new(missing).context("path: no saved state")
        ));
        let full = std::io::Error::other("No space left on device");
        assert!(!category(anyhow::Error::new(full).context("save_state")));
        let torch = tch::Tensor::zeros([2], (tch::Kind::Float, tch::Device::Cpu))
            .f_reshape([3])
            .unwrap_err();
        assert!(!category(anyhow::Error::new(torch)));
    }

    /// A result is dropped KEEP_RETRIEVED after it was first retrieved, one never retrieved
    /// KEEP_UNRETRIEVED after it finished, and a pending one stays.
    #[test]
    fn results_are_dropped_after_retrieval_or_ttl() {
        let f = Arc::new(Futures::default());
        let (retrieved, p1) = f.create();
        let (unretrieved, p2) = f.create();
        let (_pending, _p3) = f.create();
        p1.complete(Outcome::Json(serde_json::json!({"a": 1})));
        p2.complete(Outcome::Json(serde_json::json!({"b": 2})));
        let got = runtime().block_on(f.wait(&retrieved, Duration::from_millis(10)));
        assert!(matches!(got, Some(Outcome::Json(_))));
        let t0 = Instant::now();
        f.sweep_at(t0);
        assert_eq!(f.len(), 3);
        // Fetched again within the grace period: still there.
        let again = runtime().block_on(f.wait(&retrieved, Duration::from_millis(10)));
        assert!(matches!(again, Some(Outcome::Json(_))));
        f.sweep_at(t0 + KEEP_RETRIEVED + Duration::from_secs(1));
        assert_eq!(f.len(), 2, "the retrieved result is gone");
        let gone = runtime().block_on(f.wait(&retrieved, Duration::from_millis(10)));
        assert!(matches!(gone, Some(Outcome::Error { user: true, .. })));
        f.sweep_at(t0 + KEEP_UNRETRIEVED + Duration::from_secs(1));
        assert_eq!(
            f.len(),
            1,
            "the unretrieved result is gone, the pending one stays"
        );
        assert!(f.slots.lock().unwrap().get(&unretrieved).is_none());
    }
}
