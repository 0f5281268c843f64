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
//! (`rollout/policy_lag_max`). With `rollout.partial_rollouts` the thread also takes weights
//! queued while it samples a batch, between two decode steps ([`InFlightUpdates`]): later tokens
//! of that batch are drawn by newer weights, and the batch counts as sampled by its oldest
//! token's version, so the bound holds all the same. The thread's intra-op threads are its own
//! (`rollout.threads`; OpenMP's thread count is per calling thread).

use std::cell::Cell;
use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

use anyhow::{anyhow, Context, Result};
use tch::{Device, Tensor};
use temper_model::{CausalLm, ComputeKind, Tokenizer};
use temper_rollout::{Engine, EngineConfig, Incoming, Request, Sample, Sampler};

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

/// A finished batch: (its epoch, data batch, the policy version that sampled it (the first, with
/// partial rollouts), seconds the thread spent sampling it, its samples).
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
    /// Seconds the last weight snapshot took to copy and queue (`timing_s/weight_push`).
    pub(crate) last_push_s: Option<f64>,
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
    /// `rollout.partial_rollouts`: new weights are taken between two decode steps of a batch,
    /// not after it.
    pub partial_rollouts: bool,
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
        let partial = spec.partial_rollouts;
        let epoch = Arc::new(AtomicU64::new(0));
        let current = Arc::clone(&epoch);
        let thread = std::thread::Builder::new()
            .name("async-sampler".into())
            .spawn(move || {
                if let Some(n) = threads {
                    tch::set_num_threads(n as i32);
                }
                // The version of the weights the copy holds (read by the engine at every token
                // with partial rollouts).
                let version = AtomicU64::new(0);
                // Jobs taken off the queue while a batch was sampled with partial rollouts.
                let mut pending: VecDeque<Job> = VecDeque::new();
                while let Some(job) = pending.pop_front().or_else(|| inbox.recv().ok()) {
                    match job {
                        Job::Load {
                            version: v,
                            weights,
                        } => {
                            copy_into(&model, &weights);
                            version.store(v, Ordering::SeqCst);
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
                            let first_version = version.load(Ordering::SeqCst);
                            let samples = match partial {
                                false => model.with_sampling_weights(|| engine.sample(&requests)),
                                true => {
                                    let engine = engine.with_policy_version(&version);
                                    let mut updates = InFlightUpdates {
                                        model: &model,
                                        jobs: &inbox,
                                        pending: &mut pending,
                                        version: &version,
                                    };
                                    model.with_sampling_weights(|| {
                                        updates.sample(&engine, &requests)
                                    })
                                }
                            };
                            let secs = started.elapsed().as_secs_f64();
                            // With partial rollouts the batch's version is its oldest token's
                            // (new weights may have come before its first step).
                            let oldest = samples.as_ref().ok().and_then(|s| {
                                s.iter().filter_map(|s| s.completion_versions.first()).min()
                            });
                            let first_version = oldest.copied().unwrap_or(first_version);
                            let done = (epoch, batch, first_version, secs, samples);
                            if outbox.send(done).is_err() {
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
            last_push_s: None,
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
    pub fn load(&mut self, policy: &CausalLm, version: u64) -> Result<()> {
        let started = std::time::Instant::now();
        let weights = tch::no_grad(|| {
            policy
                .named_parameters()
                .into_iter()
                .map(|(n, p)| (n, p.detach().copy()))
                .collect()
        });
        self.send(Job::Load { version, weights })?;
        self.last_push_s = Some(started.elapsed().as_secs_f64());
        Ok(())
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

/// A batch sampled with partial rollouts: before every decode step, weights queued meanwhile are
/// copied in (the rows in flight go on under them, their cache kept, as AReaL's and PipelineRL's
/// in-flight updates do) and the version the engine records with each token moves on; other
/// jobs wait in `pending`, in order.
struct InFlightUpdates<'a> {
    model: &'a CausalLm,
    jobs: &'a Receiver<Job>,
    pending: &'a mut VecDeque<Job>,
    version: &'a AtomicU64,
}

impl InFlightUpdates<'_> {
    fn sample(&mut self, engine: &Engine, requests: &[Request]) -> Result<Vec<Sample>> {
        engine.validate(requests)?;
        let left = Cell::new(requests.len());
        let mut answers: Vec<Option<Result<Vec<Sample>, String>>> =
            (0..requests.len()).map(|_| None).collect();
        let mut first = Some(requests.to_vec());
        let mut inbox = |_idle: bool| {
            self.take_new_weights();
            match first.take() {
                Some(all) => Incoming::Requests(all),
                None if left.get() == 0 => Incoming::Close,
                None => Incoming::Requests(vec![]),
            }
        };
        let mut done = |index: usize, result: Result<Vec<Sample>, String>| {
            answers[index] = Some(result);
            left.set(left.get() - 1);
        };
        engine.generate_continuous(&mut inbox, &mut done, &mut |_| false)?;
        let mut samples = Vec::new();
        for (i, answer) in answers.into_iter().enumerate() {
            match answer {
                Some(Ok(s)) => samples.extend(s),
                Some(Err(e)) => return Err(anyhow!("request {i}: {e}")),
                None => return Err(anyhow!("request {i} was not answered")),
            }
        }
        Ok(samples)
    }

    /// Copies in the newest weights queued so far (the sampling copies rebuilt from them).
    fn take_new_weights(&mut self) {
        let mut newest = None;
        while let Ok(job) = self.jobs.try_recv() {
            match job {
                Job::Load { version, weights } => newest = Some((version, weights)),
                other => self.pending.push_back(other),
            }
        }
        if let Some((version, weights)) = newest {
            copy_into(self.model, &weights);
            self.model.thaw_after_sampling();
            self.model.freeze_for_sampling();
            self.version.store(version, Ordering::SeqCst);
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use temper_model::ModelConfig;
    use temper_rollout::SamplingParams;

    /// Weights sent while a batch is sampled reach it between two tokens: every token records
    /// the version that drew it (never decreasing along an answer, answers spanning several),
    /// and the copy ends with the newest weights sent, bit for bit.
    #[test]
    fn weights_sent_while_a_batch_is_sampled_reach_it_between_two_tokens() {
        let cfg = ModelConfig::qwen2_like(260, 32, 64, 2, 4, 2, true);
        let model = CausalLm::random(cfg, 3, Device::Cpu, ComputeKind::F32);
        let base: Vec<(String, Tensor)> = tch::no_grad(|| {
            model
                .named_parameters()
                .into_iter()
                .map(|(n, p)| (n, p.detach().copy()))
                .collect()
        });
        let scaled = |v: u64| -> Vec<(String, Tensor)> {
            base.iter()
                .map(|(n, w)| (n.clone(), w * (1.0 + 0.01 * v as f64)))
                .collect()
        };
        let (jobs, queue) = channel::<Job>();
        let stop = Arc::new(AtomicBool::new(false));
        let sender = {
            let stop = Arc::clone(&stop);
            let base: Vec<(String, Tensor)> =
                base.iter().map(|(n, w)| (n.clone(), w.copy())).collect();
            std::thread::spawn(move || {
                for version in 1u64.. {
                    std::thread::sleep(std::time::Duration::from_millis(2));
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    let weights = base
                        .iter()
                        .map(|(n, w)| (n.clone(), w * (1.0 + 0.01 * version as f64)))
                        .collect();
                    if jobs.send(Job::Load { version, weights }).is_err() {
                        return;
                    }
                }
            })
        };
        let version = AtomicU64::new(0);
        let mut pending = VecDeque::new();
        let engine = Engine::new(&model, vec![]).with_policy_version(&version);
        let requests: Vec<Request> = (0..3)
            .map(|i| Request {
                prompt_ids: vec![1, 2, 3 + i],
                params: SamplingParams {
                    max_tokens: 300,
                    min_tokens: 300,
                    seed: Some(i as u64),
                    ..SamplingParams::default()
                },
            })
            .collect();
        let samples = {
            let mut updates = InFlightUpdates {
                model: &model,
                jobs: &queue,
                pending: &mut pending,
                version: &version,
            };
            model.with_sampling_weights(|| updates.sample(&engine, &requests))
        }
        .unwrap();
        stop.store(true, Ordering::SeqCst);
        sender.join().unwrap();
        assert!(pending.is_empty());
        assert_eq!(samples.len(), 3);
        let mut spanning = 0;
        for s in &samples {
            let v = &s.completion_versions;
            assert_eq!(v.len(), s.completion_ids.len());
            assert!(v.windows(2).all(|w| w[0] <= w[1]), "{v:?}");
            spanning += usize::from(v.first() != v.last());
        }
        assert!(spanning > 0, "no answer was sampled across an update");
        let last = version.load(Ordering::SeqCst);
        assert!(last > 0);
        let want = scaled(last);
        let have: HashMap<String, Tensor> = model.named_parameters().into_iter().collect();
        for (name, w) in &want {
            assert!(have[name].equal(w), "{name}");
        }
    }
}
