//! The model worker: one thread owns the models; handlers queue jobs, and the engine batches
//! them continuously: a request that arrives while others are decoding joins the running batch as
//! soon as rows free up, and is answered as soon as its own samples are done. Every API samples
//! here: OpenAI, SGLang and Tinker's sampling sessions, one copy of the served model for all.
//!
//! A batch samples one set of weights ([`Weights`]): the served model, or a folder a Tinker
//! sampling session names (a LoRA snapshot of the served model is its adapters attached to that
//! one copy; see [`crate::models`]). When a request for other weights (or a weight reload, a
//! prompt-logprobs job) is queued, the running batch admits nothing more, finishes what it has,
//! and the queued jobs run in arrival order, each set of weights batched with every request
//! queued for it. A weight reload waits for the requests admitted before it; those queued after
//! it are served with the new weights. Every request carries its own seed (or the worker gives it
//! one), and the engine's draws depend only on a row's seed, so a request's tokens do not depend
//! on what else is being served.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};

use axum::http::StatusCode;

use std::cell::RefCell;
use std::collections::HashMap;

use anyhow::{Context, Result};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use temper_model::{CausalLm, ComputeKind, Policy};
use temper_rollout::{Engine, EngineConfig, Incoming, Request, Sample, SamplingParams};

use crate::limits::{FieldNames, Limits};
use crate::models::Models;
pub use crate::models::Weights;
use crate::reply::{bad, Failure};
use crate::weight_push::{Received, WeightGroups};

mod batch;
use batch::Batch;

type SampleReply = tokio::sync::oneshot::Sender<Result<Vec<Sample>, String>>;
type LogprobsReply = tokio::sync::oneshot::Sender<Result<PromptScores, String>>;

pub use temper_tinker::{PromptAsk, PromptScores};

/// One queued job.
enum Job {
    Sample {
        weights: Weights,
        request: Request,
        reply: SampleReply,
    },
    /// Per position of `tokens`, its logprob given the ones before (Tinker's compute_logprobs).
    Logprobs {
        weights: Weights,
        tokens: Vec<i64>,
        ask: PromptAsk,
        reply: LogprobsReply,
    },
    /// Load the weights of the HF folder `dir` (same architecture) in place of the served ones.
    Reload {
        dir: PathBuf,
        reply: tokio::sync::oneshot::Sender<Result<(), String>>,
    },
    /// Unload the other models that none of these folders needs.
    Prune { keep: Vec<PathBuf> },
    /// Receive the served model's weights from a weight update group's rank 0.
    ReceiveWeights {
        incoming: crate::weight_push::Incoming,
        reply: tokio::sync::oneshot::Sender<Result<(), String>>,
    },
}

/// How long an idle worker waits, after a request arrives, for the others sent with it.
const LINGER: std::time::Duration = std::time::Duration::from_millis(3);

/// A handle on the worker thread.
pub struct Worker {
    tx: mpsc::Sender<Job>,
    pub vocab_size: i64,
    pub max_model_len: Option<i64>,
    pub eos_ids: Vec<i64>,
    pub dir: PathBuf,
    /// What a request must fit in ([`Limits::max_model_len`] resolved against the model).
    pub limits: Limits,
    /// Requests queued or running.
    in_flight: Arc<AtomicUsize>,
    /// The weight update groups joined (weights pushed over c10d).
    weight_groups: Arc<WeightGroups>,
}

/// Tells the worker which sampler folders are still in use, so it unloads the others; cheap to
/// clone (the Tinker sessions' reaper holds one).
#[derive(Clone)]
pub struct Pruner(mpsc::Sender<Job>);

impl Pruner {
    /// A pruner with no worker behind it (tests of the Tinker model threads).
    #[cfg(test)]
    pub fn detached() -> Pruner {
        Pruner(mpsc::channel().0)
    }

    /// Unload the models that none of the folders in `keep` needs (they stay loaded while the
    /// worker samples them, and are loaded again if asked for).
    pub fn prune(&self, keep: Vec<PathBuf>) {
        let _ = self.0.send(Job::Prune { keep });
    }
}

/// Counts a request in flight until dropped (answered, failed, or its client gone).
struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Worker {
    /// Load the model folder `dir` on a new thread and wait until it is ready. A
    /// `limits.max_model_len` of 0 takes the model's `max_position_embeddings` (32768 when the
    /// config states none).
    pub fn start(
        dir: &Path,
        device: tch::Device,
        compute: ComputeKind,
        max_batch_rows: usize,
        mut limits: Limits,
    ) -> Result<Worker> {
        let (tx, rx) = mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(i64, Option<i64>, Vec<i64>)>>();
        let d = dir.to_path_buf();
        let weight_groups = Arc::new(WeightGroups::new(device));
        let groups = Arc::clone(&weight_groups);
        std::thread::Builder::new()
            .name("temper-model-worker".into())
            .spawn(move || {
                let models = match Models::load(&d, device, compute) {
                    Ok(m) => m,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let served = &models.served().policy;
                let c = served.model.config();
                let ready = (
                    c.vocab_size,
                    c.max_position_embeddings,
                    served.eos_ids.clone(),
                );
                let _ = ready_tx.send(Ok(ready));
                run(models, max_batch_rows, rx, &groups);
            })?;
        let (vocab_size, max_model_len, eos_ids) = ready_rx
            .recv()
            .context("the model worker stopped while loading")??;
        if limits.max_model_len == 0 {
            limits.max_model_len = max_model_len.map_or(32768, |n| n.max(1) as usize);
        }
        Ok(Worker {
            tx,
            vocab_size,
            max_model_len: Some(limits.max_model_len as i64),
            eos_ids,
            dir: dir.to_path_buf(),
            limits,
            in_flight: Arc::new(AtomicUsize::new(0)),
            weight_groups,
        })
    }

    pub fn pruner(&self) -> Pruner {
        Pruner(self.tx.clone())
    }

    /// Takes `count` places in the queue, or refuses (503) when it is full.
    fn reserve(&self, count: usize) -> Result<Vec<InFlight>, Failure> {
        let now = self.in_flight.fetch_add(count, Ordering::Relaxed);
        let guards = (0..count)
            .map(|_| InFlight(self.in_flight.clone()))
            .collect();
        if now + count > self.limits.max_queued {
            return Err((
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "the server is busy: {now} requests queued or running, at most {} \
                     (--max-queued-requests); retry later",
                    self.limits.max_queued
                ),
            ));
        }
        Ok(guards)
    }

    /// Queue a (validated) request for `weights` now; the returned future gives its samples,
    /// ordered by sample index. It joins the running batch as soon as rows are free.
    fn submit(
        &self,
        weights: Weights,
        request: Request,
    ) -> impl std::future::Future<Output = Result<Vec<Sample>, String>> {
        let queued = self.queue_sample(weights, request);
        async move {
            queued?
                .await
                .map_err(|_| "the model worker dropped the request".to_string())?
        }
    }

    /// Queue one sampling job; the receiver gets its samples (awaited by [`Worker::submit`],
    /// blocked on by the [`temper_rollout::Sampler`] implementation).
    fn queue_sample(
        &self,
        weights: Weights,
        request: Request,
    ) -> Result<tokio::sync::oneshot::Receiver<Result<Vec<Sample>, String>>, String> {
        let (reply, rx) = tokio::sync::oneshot::channel();
        self.tx
            .send(Job::Sample {
                weights,
                request,
                reply,
            })
            .map_err(|_| "the model worker has stopped".to_string())?;
        Ok(rx)
    }

    /// [`Worker::generate_on`] the served model.
    pub async fn generate_all(
        &self,
        prompts: &[Vec<i64>],
        params: &SamplingParams,
        fields: &FieldNames,
    ) -> Result<Vec<Result<Vec<Sample>, String>>, Failure> {
        self.generate_on(&Weights::Served, prompts, params, fields)
            .await
    }

    /// One engine request per prompt, all queued before any is awaited (so they share the
    /// worker's batches); the samples per prompt, in prompt order. With a seed, prompt i uses
    /// seed + i: given one seed for a batch of prompts, they would otherwise repeat each other.
    /// Refused before anything is queued when out of [`Limits`] (400, naming `fields`) or when
    /// the queue is full (503).
    pub async fn generate_on(
        &self,
        weights: &Weights,
        prompts: &[Vec<i64>],
        params: &SamplingParams,
        fields: &FieldNames,
    ) -> Result<Vec<Result<Vec<Sample>, String>>, Failure> {
        let lens: Vec<usize> = prompts.iter().map(Vec::len).collect();
        self.limits
            .check_sampling(&lens, params.n, params.max_tokens, fields)
            .map_err(bad)?;
        let _queued = self.reserve(prompts.len())?;
        let pending: Vec<_> = prompts
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let params = SamplingParams {
                    seed: params.seed.map(|s| s.wrapping_add(i as u64)),
                    ..params.clone()
                };
                self.submit(
                    weights.clone(),
                    Request {
                        prompt_ids: p.clone(),
                        params,
                    },
                )
            })
            .collect();
        let mut results = Vec::with_capacity(pending.len());
        for p in pending {
            results.push(p.await);
        }
        Ok(results)
    }

    /// What `ask` wants of `tokens` under `weights` ([`temper_tinker::score_prompt`]: the
    /// tokens' logprobs, the top-k next tokens, target cells, draws). Counts as one request in
    /// the queue.
    pub async fn prompt_scores(
        &self,
        weights: Weights,
        tokens: Vec<i64>,
        ask: PromptAsk,
    ) -> Result<Result<PromptScores, String>, Failure> {
        let _queued = self.reserve(1)?;
        let (reply, rx) = tokio::sync::oneshot::channel();
        if self
            .tx
            .send(Job::Logprobs {
                weights,
                tokens,
                ask,
                reply,
            })
            .is_err()
        {
            return Ok(Err("the model worker has stopped".into()));
        }
        Ok(rx
            .await
            .unwrap_or_else(|_| Err("the model worker dropped the request".into())))
    }

    /// Replace the weights by those of the HF folder `dir` once the requests queued before it are
    /// done (they are served with the old weights, every one queued after with the new).
    /// The folder is read whole before anything changes: a missing or half-written file, or
    /// weights of another shape, leave the served weights as they were.
    pub async fn reload(&self, dir: PathBuf) -> Result<(), String> {
        self.ask(|reply| Job::Reload { dir, reply }).await
    }

    /// The weight update groups the served model receives from.
    pub(crate) fn weight_groups(&self) -> Arc<WeightGroups> {
        Arc::clone(&self.weight_groups)
    }

    /// Replace the served weights by those broadcast in a weight update group, once the requests
    /// queued before are done (as [`Worker::reload`]).
    pub(crate) async fn receive_weights(
        &self,
        incoming: crate::weight_push::Incoming,
    ) -> Result<(), String> {
        self.ask(|reply| Job::ReceiveWeights { incoming, reply })
            .await
    }

    /// Queues the job `make` builds around a reply channel, and waits for the reply.
    async fn ask(
        &self,
        make: impl FnOnce(tokio::sync::oneshot::Sender<Result<(), String>>) -> Job,
    ) -> Result<(), String> {
        let (reply, rx) = tokio::sync::oneshot::channel();
        self.tx
            .send(make(reply))
            .map_err(|_| "the model worker has stopped".to_string())?;
        rx.await
            .map_err(|_| "the model worker dropped the request".to_string())?
    }
}

fn reload(model: &mut CausalLm, dir: &Path) -> Result<()> {
    let new = CausalLm::load(dir, model.device(), model.compute())
        .with_context(|| format!("loading {}", dir.display()))?;
    model
        .var_store_mut()?
        .copy(new.var_store())
        .with_context(|| format!("{}: weights of another shape", dir.display()))
}

/// The worker's loop: jobs in arrival order, samples for the same weights batched together.
fn run(mut models: Models, max_batch_rows: usize, rx: mpsc::Receiver<Job>, groups: &WeightGroups) {
    // Seeds for requests without one: different for every engine call (and every server run).
    let mut seeds = ChaCha20Rng::seed_from_u64(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
    );
    // Jobs taken from the channel while a batch of other weights ran, in arrival order.
    let mut pending: VecDeque<Job> = VecDeque::new();
    loop {
        // A job straight from the channel found the worker idle: wait a moment for the requests
        // sent with it (clients of one batch arrive within a few milliseconds), so that they are
        // prefilled together rather than joining the running batch one by one.
        let (job, linger) = match pending.pop_front() {
            Some(job) => (job, false),
            None => match rx.recv() {
                Ok(job) => (job, true),
                Err(_) => return,
            },
        };
        // The backstop: a panic anywhere in a job (loading weights, attaching adapters) drops
        // that job's reply channels, which its clients see as a failed request (500 / a Tinker
        // server error), and the worker goes on with the next job.
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match job {
            // Weights broadcast in a weight update group, between two batches.
            Job::ReceiveWeights { incoming, reply } => {
                let result = match groups.receive(incoming, models.served_model_mut()) {
                    Ok(()) => {
                        models.set_served_broken(None);
                        Ok(())
                    }
                    Err((Received::Partly, e)) => {
                        models.set_served_broken(Some(format!("a weight push failed: {e}")));
                        Err(e)
                    }
                    Err((Received::Nothing, e)) => Err(e),
                };
                let _ = reply.send(result);
            }
            job => run_job(
                job,
                linger,
                &mut models,
                max_batch_rows,
                &mut seeds,
                &mut pending,
                &rx,
            ),
        }));
        if let Err(panic) = ran {
            tracing::error!(
                "serving worker: a job failed inside the server: {}",
                panic_message(&panic)
            );
        }
    }
}

/// One job of the worker's loop.
fn run_job(
    job: Job,
    linger: bool,
    models: &mut Models,
    max_batch_rows: usize,
    seeds: &mut ChaCha20Rng,
    pending: &mut VecDeque<Job>,
    rx: &mpsc::Receiver<Job>,
) {
    match job {
        Job::Sample {
            weights,
            request,
            reply,
        } => {
            let batch = Batch {
                weights,
                first: (request, reply),
                linger,
                max_batch_rows,
                seed: seeds.random(),
            };
            batch.run(models, pending, rx);
        }
        Job::Logprobs {
            weights,
            tokens,
            ask,
            reply,
        } => {
            if reply.is_closed() {
                return;
            }
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let m = models.select(&weights)?;
                let model = &m.policy.model;
                temper_tinker::score_prompt(model, &tokens, &ask)
            }))
            .map(|r: anyhow::Result<PromptScores>| r.map_err(|e| format!("{e:#}")))
            .unwrap_or_else(|panic| {
                Err(format!(
                    "the request failed inside the server: {}",
                    panic_message(&panic)
                ))
            });
            let _ = reply.send(result);
        }
        Job::Reload { dir, reply } => {
            let result = reload(models.served_model_mut(), &dir);
            if result.is_ok() {
                models.set_served_broken(None);
            }
            let _ = reply.send(result.map_err(|e| format!("{e:#}")));
        }
        Job::Prune { keep } => {
            if models.prune(&keep) {
                temper_kernels::memory::release_free_memory();
            }
        }
        Job::ReceiveWeights { .. } => unreachable!("taken by the worker's loop"),
    }
}

/// The serving worker behind the one sampling seam: the requests join the worker's continuous
/// batch on the served model, as any API's do, within the same [`Limits`] and queue, and the call
/// blocks until every sample is done. For callers outside the async runtime (a trainer's thread,
/// a test); request handlers await [`Worker::generate_on`] instead.
impl temper_rollout::Sampler for Worker {
    fn sample(&self, requests: &[Request]) -> Result<Vec<Sample>> {
        const FIELDS: FieldNames = FieldNames {
            prompt: "prompt_ids",
            n: "params.n",
            max_tokens: "params.max_tokens",
        };
        for (i, r) in requests.iter().enumerate() {
            self.limits
                .check_sampling(
                    &[r.prompt_ids.len()],
                    r.params.n,
                    r.params.max_tokens,
                    &FIELDS,
                )
                .map_err(|e| anyhow::anyhow!("request {i}: {e}"))?;
        }
        let _queued = self
            .reserve(requests.len())
            .map_err(|(_, message)| anyhow::anyhow!(message))?;
        let pending = requests
            .iter()
            .map(|r| self.queue_sample(Weights::Served, r.clone()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(anyhow::Error::msg)?;
        let mut samples = Vec::new();
        for (i, rx) in pending.into_iter().enumerate() {
            let answered = rx.blocking_recv().map_err(|_| {
                anyhow::anyhow!("request {i}: the model worker dropped the request")
            })?;
            let mut mine = answered.map_err(|e| anyhow::anyhow!("request {i}: {e}"))?;
            // The worker numbers requests in its own admission order; the seam numbers them in
            // the caller's.
            for s in &mut mine {
                s.request_index = i;
            }
            samples.extend(mine);
        }
        Ok(samples)
    }
}

/// The message of a caught panic.
pub fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "a panic without a message".into())
}
