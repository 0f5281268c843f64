//! Sampling sessions and the thread that samples for all of them. A session names a weights
//! folder (a snapshot written by save_weights_for_sampler, or a base model): it keeps sampling
//! those weights while training goes on. The sampling thread keeps the few most recently used
//! snapshots loaded, and answers every request queued for the same snapshot in one batched
//! engine call.

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex};

use anyhow::{anyhow, Result};
use prost::Message;
use temper_tinker::{SamplingModel, TinkerSamplingParams};

use super::futures::{Outcome, Promise};
use super::proto;

/// Snapshots kept loaded (each is a whole model in memory).
const LOADED: usize = 2;

/// A sampling session: what it samples.
#[derive(Clone, Debug)]
pub struct Session {
    pub dir: PathBuf,
    pub base_model: String,
    /// `tinker://...` when made from saved sampler weights.
    pub model_path: Option<String>,
}

/// One sample (or compute_logprobs) request.
pub struct SampleJob {
    pub dir: PathBuf,
    pub prompt: Vec<i64>,
    pub num_samples: usize,
    pub params: TinkerSamplingParams,
    pub prompt_logprobs: bool,
    pub promise: Promise,
}

/// The sessions and the sampling thread's queue; cheap to clone.
#[derive(Clone)]
pub struct Samplers {
    sessions: Arc<Mutex<HashMap<String, Session>>>,
    tx: mpsc::Sender<SampleJob>,
}

impl Samplers {
    pub fn start() -> Samplers {
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("tinker-sampler".into())
            .spawn(move || run(rx))
            .expect("spawning the sampling thread");
        Samplers {
            sessions: Default::default(),
            tx,
        }
    }

    pub fn register(&self, id: &str, dir: &Path, base_model: &str, model_path: Option<&str>) {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner()).insert(
            id.to_string(),
            Session {
                dir: dir.to_path_buf(),
                base_model: base_model.to_string(),
                model_path: model_path.map(str::to_string),
            },
        );
    }

    pub fn session(&self, id: &str) -> Option<Session> {
        self.sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .cloned()
    }

    pub fn submit(&self, job: SampleJob) {
        if let Err(mpsc::SendError(job)) = self.tx.send(job) {
            job.promise.complete(Outcome::Error {
                message: "the sampling thread has stopped".into(),
                user: false,
            });
        }
    }
}

fn run(rx: mpsc::Receiver<SampleJob>) {
    let mut loaded: VecDeque<(PathBuf, SamplingModel)> = VecDeque::new();
    let mut engine_seed = 0u64;
    while let Ok(first) = rx.recv() {
        let mut jobs = vec![first];
        while let Ok(j) = rx.try_recv() {
            jobs.push(j);
        }
        // Group by snapshot, in arrival order of each group's first request.
        let mut groups: Vec<(PathBuf, Vec<SampleJob>)> = vec![];
        for j in jobs {
            match groups.iter_mut().find(|(d, _)| *d == j.dir) {
                Some((_, g)) => g.push(j),
                None => groups.push((j.dir.clone(), vec![j])),
            }
        }
        for (dir, group) in groups {
            let model = match model_for(&mut loaded, &dir) {
                Ok(m) => m,
                Err(e) => {
                    for j in group {
                        j.promise.complete(Outcome::user_error(format!("{e:#}")));
                    }
                    continue;
                }
            };
            engine_seed = engine_seed.wrapping_add(1);
            answer(model, group, engine_seed);
        }
    }
}

/// The loaded snapshot for `dir`, loading it (and dropping the least recently used) if needed.
fn model_for<'a>(
    loaded: &'a mut VecDeque<(PathBuf, SamplingModel)>,
    dir: &Path,
) -> Result<&'a SamplingModel> {
    if let Some(i) = loaded.iter().position(|(d, _)| d == dir) {
        let entry = loaded.remove(i).expect("found");
        loaded.push_front(entry);
    } else {
        let m = SamplingModel::load(dir, tch::Device::Cpu)?;
        loaded.push_front((dir.to_path_buf(), m));
        loaded.truncate(LOADED);
    }
    loaded.front().map(|(_, m)| m).ok_or_else(|| anyhow!("no model"))
}

fn answer(model: &SamplingModel, group: Vec<SampleJob>, engine_seed: u64) {
    let requests: Vec<_> = group
        .iter()
        .map(|j| (j.prompt.clone(), j.num_samples, j.params.clone()))
        .collect();
    let results = model.sample_many(&requests, engine_seed);
    for (job, result) in group.into_iter().zip(results) {
        let outcome = result.and_then(|seqs| {
            let prompt_logprobs = if job.prompt_logprobs {
                let lps = model.compute_logprobs(&job.prompt)?;
                Some(proto::f32_bytes(lps.into_iter().map(|l| l.unwrap_or(f32::NAN))))
            } else {
                None
            };
            let response = proto::SampleResponse {
                sequences: seqs
                    .into_iter()
                    .map(|s| proto::SampledSequence {
                        stop_reason: match s.stop_reason {
                            "length" => proto::StopReason::Length as i32,
                            _ => proto::StopReason::Stop as i32,
                        },
                        tokens: proto::i32_bytes(s.tokens.iter().copied()),
                        logprobs: Some(proto::f32_bytes(s.logprobs.iter().copied())),
                    })
                    .collect(),
                prompt_logprobs,
                prompt_cache_hit_tokens: 0,
            };
            Ok(Outcome::Proto(response.encode_to_vec()))
        });
        job.promise.complete(Outcome::from_result(outcome));
    }
}
