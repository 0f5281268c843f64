//! Tinker's REST protocol (tinker 0.38.0) under `/api/v1/`, so the unmodified `tinker` SDK and
//! tinker-cookbook recipes train on temper (`TINKER_BASE_URL=http://127.0.0.1:PORT
//! TINKER_API_KEY=tml-local`). JSON everywhere except the forward_backward request and the
//! forward_backward and sample results, which are protobuf ([`proto`]). Training, creation and
//! sampling calls answer a `request_id` at once; the result comes from `retrieve_future`
//! ([`futures`]). Each training model runs on its own thread in `seq_id` order ([`training`]);
//! sampling sessions ([`samplers`]) sample on the serving worker, with the other APIs. Checkpoints live under `--root`:
//! `tinker://{model_id}/weights/{name}` is `<root>/{model_id}/weights/{name}`.

pub(crate) mod admission;
mod convert;
mod create_model;
pub mod futures;
pub mod proto;
mod routes;
mod sample_route;
mod samplers;
pub mod sessions;
mod targets;
mod training;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

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
    sessions: sessions::Sessions,
    /// Numbers the sampled sequences' ids.
    samples: AtomicU64,
    /// What samplers with `record_stability_info` recorded (StableReinforce), bounded.
    records: temper_tinker::SequenceRecords,
    models: Mutex<HashMap<String, ModelHandle>>,
    samplers: samplers::Samplers,
    /// The base weights the LoRA training models share: one copy per base model, not per client.
    bases: Arc<temper_model::SharedBases>,
    /// Where and in what the training models compute.
    device: tch::Device,
    compute: temper_model::ComputeKind,
}

impl Tinker {
    /// Checkpoints go under `root` (created when needed); models compute in `compute` (f32 for
    /// numbers that match PyTorch's f32 closely; bf16 where it is native and speed matters); a
    /// session without a heartbeat for `session_timeout` ends (a thread checks every few
    /// seconds, for as long as the returned value lives). Sampling runs on the serving worker,
    /// which `pruner` tells when an ended session's sampler weights can be unloaded.
    pub fn new(
        root: PathBuf,
        device: tch::Device,
        compute: temper_model::ComputeKind,
        session_timeout: Duration,
        pruner: crate::worker::Pruner,
    ) -> Arc<Tinker> {
        let t = Arc::new(Tinker {
            root,
            futures: Arc::new(futures::Futures::default()),
            sessions: sessions::Sessions::new(session_timeout),
            samples: AtomicU64::new(0),
            records: temper_tinker::SequenceRecords::new(
                temper_tinker::provenance::DEFAULT_RECORD_CAP_TOKENS,
                temper_tinker::provenance::DEFAULT_RECORD_TTL,
            ),
            models: Mutex::new(HashMap::new()),
            samplers: samplers::Samplers::new(pruner),
            bases: Arc::default(),
            device,
            compute,
        });
        let weak = Arc::downgrade(&t);
        let every = (session_timeout / 4).clamp(Duration::from_millis(100), Duration::from_secs(5));
        let _ = std::thread::Builder::new()
            .name("session-reaper".into())
            .spawn(move || loop {
                std::thread::sleep(every);
                let Some(t) = weak.upgrade() else { return };
                for id in t.sessions.expired() {
                    let why = format!(
                        "no heartbeat for {} s (--session-timeout-s)",
                        t.sessions.timeout.as_secs_f64()
                    );
                    t.end_session(&id, &why);
                }
            });
        t
    }

    /// Ends session `id`: its training models (each model's thread exits once its queue is
    /// empty, freeing the model), its sampling sessions and the sampler weights no live session
    /// uses.
    pub fn end_session(&self, id: &str, why: &str) {
        if !self.sessions.end(id, why) {
            return;
        }
        let prefix = format!("{id}:");
        let dropped: Vec<String> = {
            let mut models = self.models.lock().unwrap_or_else(|e| e.into_inner());
            let ids: Vec<String> = models
                .keys()
                .filter(|k| k.starts_with(&prefix))
                .cloned()
                .collect();
            for k in &ids {
                models.remove(k);
            }
            ids
        };
        self.samplers.forget(&prefix);
        self.records.forget_session(id);
        eprintln!(
            "temper serve: Tinker session {id} ended ({why}); freed {} training model(s)",
            dropped.len()
        );
    }

    /// Why the `noun` (a model, a sampling session) named by request field `field` is unknown:
    /// its session ended, or it never existed.
    fn unknown(&self, field: &str, noun: &str, id: &str) -> String {
        match self.sessions.ended(sessions::session_of(id)) {
            Some(why) => format!(
                "{field}: {noun} {id:?} was freed when its session ended ({why}); create a new \
                 client"
            ),
            None => format!("{field}: no {noun} {id:?} on this server"),
        }
    }
}
