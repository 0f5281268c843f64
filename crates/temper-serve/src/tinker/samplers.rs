//! Sampling sessions and the thread that samples for all of them. A session names a weights
//! folder (a snapshot written by save_weights_for_sampler, or a base model): it keeps sampling
//! those weights while training goes on. The sampling thread keeps the few most recently used
//! snapshots loaded, and answers every request queued for the same snapshot in one batched
//! engine call.

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex};

use anyhow::{anyhow, Context, Result};
use prost::Message;
use temper_model::{ComputeKind, LoraConfig};
use temper_tinker::{SampledSequence, SamplingModel, TinkerSamplingParams};

use super::futures::{Outcome, Promise};
use super::proto;

/// How long the sampling thread waits for more requests before it samples what it has.
const LINGER: std::time::Duration = std::time::Duration::from_millis(20);
const MAX_LINGER: std::time::Duration = std::time::Duration::from_millis(200);

/// Models kept loaded (each is a whole model in memory); LoRA snapshots of one base share one.
const LOADED: usize = 2;

/// The file that makes a sampler folder a LoRA snapshot: `{"base_dir", "lora_rank",
/// "lora_alpha", "target_modules"}`, with the adapters in `adapter/`.
pub const LORA_SNAPSHOT: &str = "tinker_sampler.json";

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

/// What the sampling thread is sent.
enum Msg {
    Sample(SampleJob),
    /// Drop the loaded weights no registered session samples.
    Prune,
}

type SessionMap = Arc<Mutex<HashMap<String, Session>>>;

/// The sessions and the sampling thread's queue; cheap to clone.
#[derive(Clone)]
pub struct Samplers {
    sessions: SessionMap,
    tx: mpsc::Sender<Msg>,
}

/// A loaded model: which base and LoRA shape it is (None: a full model), and whose weights it
/// holds now.
struct Slot {
    lora: Option<(PathBuf, LoraConfig)>,
    dir: PathBuf,
    model: SamplingModel,
}

impl Samplers {
    pub fn start(device: tch::Device, compute: ComputeKind) -> Samplers {
        let (tx, rx) = mpsc::channel();
        let sessions = SessionMap::default();
        let shared = sessions.clone();
        std::thread::Builder::new()
            .name("tinker-sampler".into())
            .spawn(move || run(rx, &shared, device, compute))
            .expect("spawning the sampling thread");
        Samplers { sessions, tx }
    }

    /// Forgets the sampling sessions whose ids start with `prefix` (an ended client session's),
    /// and unloads the weights that no remaining session samples.
    pub fn forget(&self, prefix: &str) {
        self.sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|id, _| !id.starts_with(prefix));
        let _ = self.tx.send(Msg::Prune);
    }

    pub fn register(&self, id: &str, dir: &Path, base_model: &str, model_path: Option<&str>) {
        self.sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
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
        if let Err(mpsc::SendError(Msg::Sample(job))) = self.tx.send(Msg::Sample(job)) {
            job.promise.complete(Outcome::Error {
                message: "the sampling thread has stopped".into(),
                user: false,
            });
        }
    }
}

/// Unloads the slots whose weights no registered session samples.
fn prune(loaded: &mut VecDeque<Slot>, sessions: &SessionMap) {
    let sessions = sessions.lock().unwrap_or_else(|e| e.into_inner());
    loaded.retain(|slot| sessions.values().any(|s| s.dir == slot.dir));
}

fn run(rx: mpsc::Receiver<Msg>, sessions: &SessionMap, device: tch::Device, compute: ComputeKind) {
    let mut loaded: VecDeque<Slot> = VecDeque::new();
    let mut engine_seed = 0u64;
    while let Ok(first) = rx.recv() {
        let Msg::Sample(first) = first else {
            prune(&mut loaded, sessions);
            continue;
        };
        // Clients send a batch of prompts as one request each, a few milliseconds apart: wait
        // until none has come for LINGER (at most MAX_LINGER) so they are sampled together.
        let mut jobs = vec![first];
        let mut prune_after = false;
        let start = std::time::Instant::now();
        while let Ok(m) = rx.recv_timeout(LINGER) {
            match m {
                Msg::Sample(j) => jobs.push(j),
                Msg::Prune => prune_after = true,
            }
            if start.elapsed() > MAX_LINGER {
                break;
            }
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
            let model = match model_for(&mut loaded, &dir, device, compute) {
                Ok(m) => m,
                Err(e) => {
                    for j in group {
                        j.promise.complete(Outcome::user_error(format!("{e:#}")));
                    }
                    continue;
                }
            };
            engine_seed = engine_seed.wrapping_add(1);
            // A panic while sampling fails this group's requests (a server error, which the SDK
            // retries); the thread keeps serving.
            let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                outcomes(model, &group, engine_seed)
            }));
            match ran {
                Ok(outs) => {
                    for (j, o) in group.into_iter().zip(outs) {
                        j.promise.complete(o);
                    }
                }
                Err(panic) => {
                    let msg = crate::worker::panic_message(&panic);
                    for j in group {
                        j.promise.complete(Outcome::server_error(format!(
                            "sampling failed inside the server: {msg}"
                        )));
                    }
                }
            }
        }
        if prune_after {
            prune(&mut loaded, sessions);
            temper_kernels::memory::release_free_memory();
        }
    }
}

/// The LoRA snapshot description in `dir`, if it is one.
fn lora_snapshot(dir: &Path) -> Result<Option<(PathBuf, LoraConfig)>> {
    let f = dir.join(LORA_SNAPSHOT);
    if !f.exists() {
        return Ok(None);
    }
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&f)?).with_context(|| format!("{}", f.display()))?;
    let base: PathBuf = serde_json::from_value(v["base_dir"].clone())
        .with_context(|| format!("{}: base_dir", f.display()))?;
    let cfg = LoraConfig {
        rank: v["lora_rank"]
            .as_i64()
            .with_context(|| format!("{}: lora_rank", f.display()))?,
        alpha: v["lora_alpha"]
            .as_f64()
            .with_context(|| format!("{}: lora_alpha", f.display()))?,
        target_modules: serde_json::from_value(v["target_modules"].clone())
            .with_context(|| format!("{}: target_modules", f.display()))?,
    };
    Ok(Some((base, cfg)))
}

/// The model for the weights in `dir`, loaded into the front slot: a slot that holds them
/// already; for a LoRA snapshot, a slot with the same base and LoRA shape, its adapters swapped;
/// else a new load (dropping the least recently used slot).
fn model_for<'a>(
    loaded: &'a mut VecDeque<Slot>,
    dir: &Path,
    device: tch::Device,
    compute: ComputeKind,
) -> Result<&'a SamplingModel> {
    let lora = lora_snapshot(dir)?;
    let hit = loaded.iter().position(|s| s.dir == dir).or_else(|| {
        lora.as_ref()
            .and_then(|l| loaded.iter().position(|s| s.lora.as_ref() == Some(l)))
    });
    match hit {
        Some(i) => {
            let mut slot = loaded.remove(i).expect("found");
            if slot.dir != dir {
                slot.model.swap_adapter(&dir.join("adapter"))?;
                slot.dir = dir.to_path_buf();
            }
            loaded.push_front(slot);
        }
        None => {
            let model = match &lora {
                Some((base, cfg)) => {
                    SamplingModel::with_adapter(base, cfg, &dir.join("adapter"), device, compute)?
                }
                None => SamplingModel::load_with(dir, device, compute)?,
            };
            loaded.push_front(Slot {
                lora,
                dir: dir.to_path_buf(),
                model,
            });
            loaded.truncate(LOADED);
        }
    }
    loaded
        .front()
        .map(|s| &s.model)
        .ok_or_else(|| anyhow!("no model"))
}

/// Each job's result, in order.
fn outcomes(model: &SamplingModel, group: &[SampleJob], engine_seed: u64) -> Vec<Outcome> {
    let requests: Vec<_> = group
        .iter()
        .map(|j| (j.prompt.clone(), j.num_samples, j.params.clone()))
        .collect();
    let results = model.sample_many(&requests, engine_seed);
    let mut out = Vec::with_capacity(group.len());
    for (job, result) in group.iter().zip(results) {
        let outcome = result.and_then(|seqs| {
            let prompt_logprobs = if job.prompt_logprobs {
                let lps = model.compute_logprobs(&job.prompt)?;
                Some(proto::f32_bytes(
                    lps.into_iter().map(|l| l.unwrap_or(f32::NAN)),
                ))
            } else {
                None
            };
            Ok(sample_response(seqs, prompt_logprobs))
        });
        out.push(Outcome::from_result(outcome));
    }
    out
}

/// The `asample` result: the sequences (and prompt logprobs, when asked) as Tinker's protobuf.
pub fn sample_response(seqs: Vec<SampledSequence>, prompt_logprobs: Option<Vec<u8>>) -> Outcome {
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
    Outcome::Proto(response.encode_to_vec())
}
