//! One thread per training model: it owns the [`TrainingModel`] and runs the model's requests in
//! `seq_id` order (forward_backward accumulates gradients, optim_step applies and zeroes them, so
//! order matters). The SDK submits a client's requests one after the other; a request that
//! arrives ahead of a missing one waits for it briefly, then runs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use temper_tinker::{AdamParams, Datum, TrainingModel};

use super::futures::{Outcome, Promise};
use super::proto;
use super::samplers::Samplers;

/// What a training model is asked to do.
pub enum Job {
    ForwardBackward {
        data: Vec<Datum>,
        loss_fn: String,
        config: BTreeMap<String, f64>,
        forward_only: bool,
    },
    OptimStep(AdamParams),
    /// save_state: weights (adapters with LoRA) and optimizer state, under `name`.
    SaveState {
        name: String,
    },
    /// save_weights_for_sampler: a named snapshot, or one for sampling session `session`.
    SaveForSampler {
        name: Option<String>,
        session: Option<String>,
        /// `kind="inflight"`: the session follows this model's later inflight saves.
        inflight: bool,
    },
    LoadState {
        dir: PathBuf,
        path: String,
        optimizer: bool,
    },
    /// A job whose work panics: the test that the model's thread outlives one.
    #[cfg(test)]
    Panic,
}

/// A job, its `seq_id` (0 = unordered) and where its result goes.
pub struct Queued {
    pub seq: i64,
    pub job: Job,
    pub promise: Promise,
}

/// How long a request that arrived ahead of its turn waits for the missing ones.
const GAP_WAIT: Duration = Duration::from_secs(2);
/// Results of this many latest requests are kept, so that a retried request (a `seq_id` already
/// run) gets its first result instead of being applied twice.
const KEPT_RESULTS: usize = 64;

/// Where the model's files go, and what it is.
pub struct ModelInfo {
    pub model_id: String,
    pub base_model: String,
    /// The base model's folder (LoRA snapshots are adapters over it).
    pub base_dir: PathBuf,
    /// `<root>/<model_id>`.
    pub dir: PathBuf,
}

/// Blocks of this size or more are mapped fresh during a forward(_backward) pass (SmolLM2 f32,
/// one 4,096-token datum from a fresh client: 5.5 GB resident at glibc's dynamic threshold, 2.3 GB
/// at 4 MiB, 2.0 GB at 128 KiB but slower).
const PASS_MMAP_THRESHOLD: usize = 4 << 20;

/// How long a model's queue stays empty before its thread gives freed memory back.
const QUIET: Duration = Duration::from_millis(500);

/// Runs `model`'s jobs until every sender is gone.
pub fn run(
    mut model: TrainingModel,
    info: ModelInfo,
    samplers: Samplers,
    rx: mpsc::Receiver<Queued>,
) {
    let mut next = 1i64;
    let mut held: BTreeMap<i64, Queued> = BTreeMap::new();
    let mut done: BTreeMap<i64, Outcome> = BTreeMap::new();
    loop {
        let q = if let Some(q) = held.remove(&next) {
            q
        } else {
            let received = if held.is_empty() {
                rx.recv_timeout(QUIET).or_else(|_| {
                    // Quiet for a while: hand back what the passes freed. malloc keeps freed
                    // memory in per-thread arenas, so each client's thread held the peak of its
                    // own passes (in bf16, 13 clients of SmolLM2 held 2.7 GB more). After a
                    // quiet spell, not after every request: the trim locks every arena.
                    temper_kernels::memory::release_free_memory();
                    rx.recv().map_err(|_| mpsc::RecvTimeoutError::Disconnected)
                })
            } else {
                rx.recv_timeout(GAP_WAIT)
            };
            match received {
                Ok(q) if q.seq > next => {
                    held.insert(q.seq, q);
                    continue;
                }
                Ok(q) => q,
                // The missing request never came: go on with the earliest one held.
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    held.pop_first().expect("held is not empty").1
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => match held.pop_first() {
                    Some((_, q)) => q,
                    None => return,
                },
            }
        };
        if q.seq > 0 && q.seq < next {
            // A retry of a request already run: its first result, never a second application.
            let again = done.get(&q.seq).cloned().unwrap_or_else(|| {
                Outcome::user_error(format!(
                    "seq_id {}: already run, and its result is no longer kept",
                    q.seq
                ))
            });
            q.promise.complete(again);
            continue;
        }
        if q.seq > 0 {
            next = q.seq + 1;
        }
        // A panic in one request's work fails that request (as a server error, which the SDK
        // retries) and the thread goes on serving the model.
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            execute(&mut model, &info, &samplers, q.job)
        }));
        let outcome = match ran {
            Ok(r) => Outcome::from_result(r),
            Err(panic) => Outcome::server_error(format!(
                "the request failed inside the server: {}",
                crate::worker::panic_message(&panic)
            )),
        };
        if q.seq > 0 {
            done.insert(q.seq, outcome.clone());
            while done.len() > KEPT_RESULTS {
                done.pop_first();
            }
        }
        q.promise.complete(outcome);
    }
}

fn execute(
    model: &mut TrainingModel,
    info: &ModelInfo,
    samplers: &Samplers,
    job: Job,
) -> Result<Outcome> {
    match job {
        Job::ForwardBackward {
            data,
            loss_fn,
            config,
            forward_only,
        } => {
            // Large activations mapped and unmapped: with glibc's dynamic threshold a client's
            // first long pass left them resident in the arenas (temper_kernels::memory).
            let _mapped = temper_kernels::memory::LargeBlocksMapped::at(PASS_MMAP_THRESHOLD);
            let out = if forward_only {
                model.forward(&data, &loss_fn, &config)?
            } else {
                model.forward_backward(&data, &loss_fn, &config)?
            };
            Ok(Outcome::Proto(forward_output(
                &out.logprobs,
                out.width,
                out.loss_sum,
            )))
        }
        Job::OptimStep(p) => {
            let norm = model.optim_step(&p)?;
            Ok(Outcome::Json(json!({"metrics": {"optim/grad_norm": norm}})))
        }
        Job::SaveState { name } => {
            check_name(&name)?;
            let dir = info.dir.join("weights").join(&name);
            save_state_atomically(model, info, &dir)?;
            Ok(Outcome::Json(json!({
                "path": format!("tinker://{}/weights/{name}", info.model_id), "type": "save_weights",
            })))
        }
        Job::SaveForSampler {
            name,
            session,
            inflight,
        } => {
            let leaf = match (&name, &session) {
                (Some(n), _) => {
                    check_name(n)?;
                    n.clone()
                }
                (None, Some(s)) => format!("session-{}", s.replace(':', "-")),
                (None, None) => {
                    bail!("save_weights_for_sampler: neither path nor sampling_session_seq_id")
                }
            };
            let dir = info.dir.join("sampler_weights").join(&leaf);
            save_for_sampler(model, info, &dir, name.is_some())?;
            let path = format!("tinker://{}/sampler_weights/{leaf}", info.model_id);
            match session {
                Some(s) if name.is_none() => {
                    if inflight {
                        samplers.register_inflight(
                            &s,
                            &dir,
                            &info.base_model,
                            &path,
                            &info.model_id,
                        );
                    } else {
                        samplers.register(&s, &dir, &info.base_model, Some(&path));
                    }
                    Ok(Outcome::Json(
                        json!({"sampling_session_id": s, "path": path}),
                    ))
                }
                _ => Ok(Outcome::Json(
                    json!({"path": path, "type": "save_weights_for_sampler"}),
                )),
            }
        }
        Job::LoadState {
            dir,
            path,
            optimizer,
        } => {
            model.load_state(&dir, optimizer)?;
            Ok(Outcome::Json(
                json!({"path": path, "model_id": info.model_id, "type": "load_weights"}),
            ))
        }
        #[cfg(test)]
        Job::Panic => panic!("a bug in one request's work"),
    }
}

/// Sampler weights, written to a temporary folder renamed into place. With LoRA: the adapters
/// (PEFT's format) and `tinker_sampler.json` naming the base model, which the serving worker
/// attaches to its loaded copy of the base in milliseconds; a named save also holds the merged HF
/// folder (what vLLM or transformers load). Without LoRA: the HF folder.
fn save_for_sampler(
    model: &TrainingModel,
    info: &ModelInfo,
    dir: &Path,
    named: bool,
) -> Result<()> {
    temper_base::atomic_dir::write_dir_atomically(dir, |tmp| {
        match model.model.lora_config() {
            Some(cfg) => {
                model.model.save_lora_adapter(&tmp.join("adapter"))?;
                let meta = json!({
                    "base_dir": info.base_dir, "lora_rank": cfg.rank, "lora_alpha": cfg.alpha,
                    "target_modules": cfg.target_modules,
                });
                std::fs::write(
                    tmp.join(crate::models::LORA_SNAPSHOT),
                    serde_json::to_vec_pretty(&meta)?,
                )?;
                if named {
                    model.model.save(&tmp.join("merged"))?;
                }
            }
            None => model.model.save(tmp)?,
        }
        Ok(())
    })
}

/// A checkpoint name becomes one path component of a `tinker://` path (and a folder name).
fn check_name(name: &str) -> Result<()> {
    if name.is_empty()
        || name.len() > 200
        || name.contains('/')
        || name.contains("..")
        || name.starts_with('.')
        || name.chars().any(char::is_control)
    {
        bail!(
            "path: {:?} is not a checkpoint name (1 to 200 bytes, no `/`, no control characters, \
             not starting with `.`)",
            name.chars().take(80).collect::<String>()
        );
    }
    Ok(())
}

/// save_state into a temporary folder renamed into place, with `tinker_state.json` saying what
/// model it belongs to (so a restarted server can create a training client from it).
fn save_state_atomically(model: &TrainingModel, info: &ModelInfo, dir: &Path) -> Result<()> {
    temper_base::atomic_dir::write_dir_atomically(dir, |tmp| {
        model.save_state(tmp)?;
        let lora = model.model.lora_config();
        let meta = json!({
            "base_model": info.base_model, "model_id": info.model_id,
            "lora_rank": lora.map(|c| c.rank), "lora_alpha": lora.map(|c| c.alpha),
            "target_modules": lora.map(|c| c.target_modules.clone()),
        });
        std::fs::write(
            tmp.join("tinker_state.json"),
            serde_json::to_vec_pretty(&meta)?,
        )?;
        Ok(())
    })
}

/// The state folder's record of its model (see [`save_state_atomically`]).
pub fn state_meta(dir: &Path) -> Result<Value> {
    let f = dir.join("tinker_state.json");
    let text = std::fs::read_to_string(&f)
        .with_context(|| format!("path: no saved state at {}", dir.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{}", f.display()))
}

/// ForwardBackwardOutput: one ArrayRecord whose `logprobs` field holds every datum's target
/// logprobs (float32) with byte offsets, and `loss:sum`.
fn forward_output(logprobs: &[Vec<f32>], width: usize, loss_sum: f64) -> Vec<u8> {
    use prost::Message;
    let mut offsets = vec![0i64];
    let mut data = Vec::new();
    for lp in logprobs {
        data.extend(proto::f32_bytes(lp.iter().copied()));
        offsets.push(data.len() as i64);
    }
    let record = proto::ArrayRecord {
        type_tag: "ArrayRecord".into(),
        fields: [(
            "logprobs".to_string(),
            proto::BatchedTensor {
                data,
                offsets: proto::i64_bytes(offsets),
                dtype: proto::DType::Float32 as i32,
                // (N, K) logprobs for (N, K) targets.
                trailing_shape: if width > 1 {
                    vec![width as i64]
                } else {
                    vec![]
                },
            },
        )]
        .into_iter()
        .collect(),
        num_datums: logprobs.len() as i64,
    };
    proto::ForwardBackwardOutput {
        loss_fn_output_type: "ArrayRecord".into(),
        loss_fn_outputs: vec![record],
        metrics: [("loss:sum".to_string(), loss_sum)].into_iter().collect(),
    }
    .encode_to_vec()
}

#[cfg(test)]
mod tests {
    use super::super::futures::Futures;
    use super::*;
    use temper_model::{CausalLm, ComputeKind, ModelConfig};
    use temper_tinker::TensorData;

    fn tiny_model() -> TrainingModel {
        let cfg = ModelConfig::qwen2_like(61, 16, 24, 1, 2, 1, false);
        TrainingModel::new(CausalLm::random(cfg, 7, tch::Device::Cpu, ComputeKind::F32))
    }

    fn fb() -> Job {
        let datum = Datum::new(
            vec![1, 5, 9, 12],
            [
                ("target_tokens".into(), TensorData::I64(vec![5, 9, 12, 3])),
                ("weights".into(), TensorData::F32(vec![0.0, 1.0, 1.0, 1.0])),
            ]
            .into_iter()
            .collect(),
        );
        Job::ForwardBackward {
            data: vec![datum],
            loss_fn: "cross_entropy".into(),
            config: BTreeMap::new(),
            forward_only: false,
        }
    }

    /// Sends `(seq, job)`s to one model's thread in order; the outcome of each.
    fn serve(jobs: Vec<(i64, Job)>) -> Vec<Outcome> {
        let dir =
            std::env::temp_dir().join(format!("temper-serve-training-{}", std::process::id()));
        let info = ModelInfo {
            model_id: "s:train:0".into(),
            base_model: "tiny".into(),
            base_dir: dir.clone(),
            dir,
        };
        let (tx, rx) = mpsc::channel();
        let thread = std::thread::spawn(move || {
            run(
                tiny_model(),
                info,
                Samplers::new(crate::worker::Pruner::detached()),
                rx,
            )
        });
        let futures = std::sync::Arc::new(Futures::default());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let outcomes = jobs
            .into_iter()
            .map(|(seq, job)| {
                let (id, promise) = futures.create();
                tx.send(Queued { seq, job, promise }).unwrap();
                runtime
                    .block_on(futures.wait(&id, Duration::from_secs(60)))
                    .expect("an answer")
            })
            .collect();
        drop(tx);
        thread.join().unwrap();
        outcomes
    }

    fn grad_norm(o: &Outcome) -> f64 {
        match o {
            Outcome::Json(v) => v["metrics"]["optim/grad_norm"].as_f64().unwrap(),
            other => panic!("{other:?}"),
        }
    }

    /// A retried forward_backward (its seq_id already run) answers its first result and adds no
    /// gradient: the optimizer step sees the gradient norm of one application, not of two.
    #[test]
    fn a_retried_seq_id_returns_its_first_result_and_is_applied_once() {
        let once = serve(vec![(1, fb()), (2, Job::OptimStep(AdamParams::default()))]);
        let retried = serve(vec![
            (1, fb()),
            (1, fb()),
            (2, Job::OptimStep(AdamParams::default())),
        ]);
        let (Outcome::Proto(first), Outcome::Proto(again)) = (&retried[0], &retried[1]) else {
            panic!("{retried:?}");
        };
        assert_eq!(first, again);
        let (a, b) = (grad_norm(&once[1]), grad_norm(&retried[2]));
        assert!(a > 0.0 && a == b, "grad norm once {a}, with the retry {b}");
        let twice = serve(vec![
            (1, fb()),
            (2, fb()),
            (3, Job::OptimStep(AdamParams::default())),
        ]);
        assert!(
            (grad_norm(&twice[2]) - 2.0 * a).abs() < 1e-6 * a,
            "the check can fail"
        );
    }

    /// A panic inside one request's work fails that request as a server error; the model's
    /// thread keeps serving the requests after it.
    #[test]
    fn a_panicking_request_fails_alone_and_the_model_keeps_serving() {
        let out = serve(vec![(1, Job::Panic), (2, fb())]);
        match &out[0] {
            Outcome::Error { message, user } => {
                assert!(
                    !user && message.contains("a bug in one request's work"),
                    "{message}"
                )
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(out[1], Outcome::Proto(_)), "{:?}", out[1]);
    }
}
