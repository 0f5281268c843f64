//! Tinker's REST protocol (tinker 0.38.0) under `/api/v1/`, so the unmodified `tinker` SDK and
//! tinker-cookbook recipes train on temper (`TINKER_BASE_URL=http://127.0.0.1:PORT
//! TINKER_API_KEY=tml-local`). JSON everywhere except the forward_backward request and the
//! forward_backward and sample results, which are protobuf ([`proto`]). Training, creation and
//! sampling calls answer a `request_id` at once; the result comes from `retrieve_future`
//! ([`futures`]). Each training model runs on its own thread in `seq_id` order ([`training`]);
//! sampling sessions share one sampling thread ([`samplers`]). Checkpoints live under `--root`:
//! `tinker://{model_id}/weights/{name}` is `<root>/{model_id}/weights/{name}`.

mod convert;
pub mod futures;
pub mod proto;
mod routes;
mod samplers;
mod training;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{mpsc, Arc, Mutex};

pub use routes::routes;

/// A training model's queue and what get_info reports.
struct ModelHandle {
    tx: mpsc::Sender<training::Queued>,
    info: serde_json::Value,
    base_model: String,
}

/// Everything the Tinker routes share.
pub struct Tinker {
    root: PathBuf,
    futures: Arc<futures::Futures>,
    sessions: AtomicU64,
    /// Numbers the sampled sequences' ids.
    samples: AtomicU64,
    models: Mutex<HashMap<String, ModelHandle>>,
    samplers: samplers::Samplers,
    /// What the training models and samplers compute in.
    compute: temper_model::ComputeKind,
}

impl Tinker {
    /// Checkpoints go under `root` (created when needed); models compute in `compute` (f32 for
    /// numbers that match PyTorch's f32 closely; bf16 where it is native and speed matters).
    pub fn new(root: PathBuf, compute: temper_model::ComputeKind) -> Tinker {
        Tinker {
            root,
            futures: Arc::new(futures::Futures::default()),
            sessions: AtomicU64::new(0),
            samples: AtomicU64::new(0),
            models: Mutex::new(HashMap::new()),
            samplers: samplers::Samplers::start(compute),
            compute,
        }
    }
}
