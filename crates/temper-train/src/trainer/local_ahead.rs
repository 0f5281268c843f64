//! `rollout.async_steps` with the in-process engine: a sampler thread with its own copy of the
//! policy generates the next steps' batches while this step trains (verl's one-step-off policy,
//! and its k-step generalisation), the way remote servers do (`servers.rs`).
//!
//! The thread takes jobs in order: generate data batch b (this rank's share, seeded as it would be
//! without overlap), or load new weights (a snapshot taken after an optimizer step). After a
//! step's rollouts the trainer sends the batches of the next `async_steps` steps not yet sent,
//! and after its update the new weights; so a batch sent at step k is sampled by the weights
//! before update k (or older: with k steps ahead, the weights before update k - k + 1) and
//! trained at step k + j <= k + async_steps, a policy at most `async_steps` versions newer
//! (`rollout/policy_lag_max`). The thread's intra-op threads are its own
//! (`rollout.threads`; OpenMP's thread count is per calling thread).

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

use anyhow::{anyhow, Context, Result};
use tch::{Device, Tensor};
use temper_model::{CausalLm, ComputeKind, Tokenizer};
use temper_rollout::{Engine, EngineConfig, Request, Sample, Sampler};

use super::servers::SentAhead;

/// A job for the sampler thread.
enum Job {
    /// Sample data batch `batch` (this rank's requests) with `seed` as the engine's seed, unless
    /// the queue was dropped since it was sent (`epoch` older than the current one).
    Generate {
        epoch: u64,
        batch: usize,
        requests: Vec<Request>,
        seed: u64,
    },
    /// From now on sample with these weights (the policy's after optimizer step `version`).
    Load {
        version: u64,
        weights: Vec<(String, Tensor)>,
    },
}

/// A finished batch: (its epoch, data batch, the policy version that sampled it, seconds the
/// thread spent sampling it, its samples).
type Done = (u64, usize, u64, f64, Result<Vec<Sample>>);

/// What the batches taken since the last [`LocalAhead::take_stats`] cost: seconds the thread
/// sampled them, seconds the trainer waited for them, completion tokens.
#[derive(Default, Clone, Copy)]
pub(crate) struct AheadStats {
    pub sampled_s: f64,
    pub waited_s: f64,
    pub tokens: usize,
}

/// The sampler thread and the batches sent to it.
pub(crate) struct LocalAhead {
    jobs: Option<Sender<Job>>,
    done: Receiver<Done>,
    /// Batches sent and not yet taken: their kept example indices.
    pub(crate) sent: HashMap<usize, Vec<usize>>,
    /// Batches finished and not yet taken: (version, seconds sampling, samples).
    finished: HashMap<usize, (u64, f64, Result<Vec<Sample>>)>,
    stats: AheadStats,
    /// Bumped when what was sent is dropped: the thread skips older jobs, and their results
    /// (of one already running) are ignored.
    epoch: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

/// What the sampler thread is built from.
pub(crate) struct AheadSpec<'a> {
    pub weights_dir: &'a Path,
    pub tokenizer_dir: &'a Path,
    pub device: Device,
    pub compute: ComputeKind,
    pub eos_ids: Vec<i64>,
    pub max_num_seqs: usize,
    /// Intra-op threads of the sampler thread (None: libtorch's default).
    pub threads: Option<usize>,
}

impl LocalAhead {
    /// Loads the sampler's copy of the policy (from the folder the policy came from; its weights
    /// are replaced by the first [`LocalAhead::load`]) and starts its thread.
    pub fn start(spec: AheadSpec) -> Result<Self> {
        let model = CausalLm::load(spec.weights_dir, spec.device, spec.compute)
            .context("loading the async sampler's copy of the policy")?;
        let tokenizer = Tokenizer::from_dir(spec.tokenizer_dir)
            .context("loading the async sampler's tokenizer")?;
        let (jobs, inbox) = channel::<Job>();
        let (outbox, done) = channel::<Done>();
        let (eos_ids, rows, threads) = (spec.eos_ids, spec.max_num_seqs, spec.threads);
        let epoch = Arc::new(AtomicU64::new(0));
        let current = Arc::clone(&epoch);
        let thread = std::thread::Builder::new()
            .name("async-sampler".into())
            .spawn(move || {
                if let Some(n) = threads {
                    tch::set_num_threads(n as i32);
                }
                let mut version = 0;
                for job in inbox {
                    match job {
                        Job::Load {
                            version: v,
                            weights,
                        } => {
                            copy_into(&model, &weights);
                            version = v;
                        }
                        Job::Generate {
                            epoch,
                            batch,
                            requests,
                            seed,
                        } => {
                            if epoch != current.load(Ordering::SeqCst) {
                                continue;
                            }
                            let engine = Engine::new(&model, eos_ids.clone())
                                .with_decoder(&tokenizer)
                                .with_config(EngineConfig {
                                    max_batch_rows: rows,
                                    seed,
                                    ..EngineConfig::default()
                                });
                            let started = std::time::Instant::now();
                            let samples = model.with_sampling_weights(|| engine.sample(&requests));
                            let secs = started.elapsed().as_secs_f64();
                            if outbox.send((epoch, batch, version, secs, samples)).is_err() {
                                return;
                            }
                        }
                    }
                }
            })?;
        Ok(Self {
            jobs: Some(jobs),
            done,
            sent: HashMap::new(),
            finished: HashMap::new(),
            stats: AheadStats::default(),
            epoch,
            thread: Some(thread),
        })
    }

    fn send(&self, job: Job) -> Result<()> {
        self.jobs
            .as_ref()
            .and_then(|j| j.send(job).ok())
            .ok_or_else(|| anyhow!("the async sampler thread has stopped"))
    }

    /// Queues data batch `batch` (its kept example indices and requests).
    pub fn generate(
        &mut self,
        batch: usize,
        kept: Vec<usize>,
        requests: Vec<Request>,
        seed: u64,
    ) -> Result<()> {
        self.send(Job::Generate {
            epoch: self.epoch.load(Ordering::SeqCst),
            batch,
            requests,
            seed,
        })?;
        self.sent.insert(batch, kept);
        Ok(())
    }

    /// Queues new weights (`policy`'s now, copied: the trainer goes on changing its own).
    pub fn load(&self, policy: &CausalLm, version: u64) -> Result<()> {
        let weights = tch::no_grad(|| {
            policy
                .named_parameters()
                .into_iter()
                .map(|(n, p)| (n, p.detach().copy()))
                .collect()
        });
        self.send(Job::Load { version, weights })
    }

    /// Data batch `batch` if it was sent, with its samples (waited for).
    pub fn take(&mut self, batch: usize) -> Option<Result<SentAhead>> {
        let kept = self.sent.remove(&batch)?;
        let waiting = std::time::Instant::now();
        while !self.finished.contains_key(&batch) {
            match self.done.recv() {
                Ok((e, b, v, secs, s)) => {
                    if e == self.epoch.load(Ordering::SeqCst) {
                        self.finished.insert(b, (v, secs, s));
                    }
                }
                Err(_) => return Some(Err(anyhow!("the async sampler thread has stopped"))),
            }
        }
        let (version, secs, samples) = self.finished.remove(&batch).expect("just received");
        self.stats.sampled_s += secs;
        self.stats.waited_s += waiting.elapsed().as_secs_f64();
        if let Ok(s) = &samples {
            self.stats.tokens += s.iter().map(|s| s.completion_ids.len()).sum::<usize>();
        }
        Some(
            samples
                .map(|samples| SentAhead {
                    kept,
                    version,
                    samples,
                })
                .with_context(|| format!("rollouts of data batch {batch} (sampled ahead)")),
        )
    }

    /// What the batches taken since the last call cost (and starts counting again).
    pub fn take_stats(&mut self) -> AheadStats {
        std::mem::take(&mut self.stats)
    }

    /// Drops what was sent ahead (at the end of a fit): the thread skips what it has not
    /// started.
    pub fn forget(&mut self) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
        self.sent.clear();
        self.finished.clear();
    }
}

impl Drop for LocalAhead {
    fn drop(&mut self) {
        // Closing the queue ends the thread after the job it is on.
        self.forget();
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// `weights` (by name) into `model`'s parameters.
fn copy_into(model: &CausalLm, weights: &[(String, Tensor)]) {
    let params: HashMap<String, Tensor> = model.named_parameters().into_iter().collect();
    tch::no_grad(|| {
        for (name, w) in weights {
            if let Some(p) = params.get(name) {
                p.shallow_clone().copy_(w);
            }
        }
    });
}
