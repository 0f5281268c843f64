//! The model worker: one thread owns the model; handlers queue jobs, and the engine batches them
//! continuously: a request that arrives while others are decoding joins the running batch as soon
//! as rows free up, and is answered as soon as its own samples are done. A weight reload waits
//! for the requests already admitted, then swaps the weights; requests queued after it are served
//! with the new ones. Every request carries its own seed (or the worker gives it one), and the
//! engine's draws depend only on a row's seed, so a request's tokens do not depend on what else is
//! being served.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};

use axum::http::StatusCode;

use std::cell::RefCell;
use std::collections::HashMap;

use anyhow::{Context, Result};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use temper_model::{CausalLm, ComputeKind, GenerationConfig, Tokenizer};
use temper_rollout::{Engine, EngineConfig, Incoming, Request, Sample, SamplingParams};

use crate::limits::{FieldNames, Limits};
use crate::reply::{bad, Failure};

/// One queued request and where its samples go, or a weight reload.
enum Job {
    Sample {
        request: Request,
        reply: tokio::sync::oneshot::Sender<Result<Vec<Sample>, String>>,
    },
    /// Load the weights of the HF folder `dir` (same architecture) in place of the current ones.
    Reload {
        dir: PathBuf,
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
        std::thread::Builder::new()
            .name("temper-model-worker".into())
            .spawn(move || {
                let loaded = (|| -> Result<_> {
                    let model = CausalLm::load(&d, device, compute)
                        .with_context(|| format!("loading {}", d.display()))?;
                    let tok = Tokenizer::from_dir(&d).ok();
                    let gen = GenerationConfig::from_dir(&d, Some(model.config()), tok.as_ref())?;
                    Ok((model, tok, gen.eos_token_ids))
                })();
                let (model, tok, eos) = match loaded {
                    Ok(x) => x,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let c = model.config();
                let _ = ready_tx.send(Ok((c.vocab_size, c.max_position_embeddings, eos.clone())));
                run(model, tok.as_ref(), &eos, max_batch_rows, rx);
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
        })
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

    /// Queue a (validated) request now; the returned future gives its samples, ordered by
    /// sample index. It joins the running batch as soon as rows are free.
    pub fn submit(
        &self,
        request: Request,
    ) -> impl std::future::Future<Output = Result<Vec<Sample>, String>> {
        let (reply, rx) = tokio::sync::oneshot::channel();
        let sent = self.tx.send(Job::Sample { request, reply });
        async move {
            sent.map_err(|_| "the model worker has stopped".to_string())?;
            rx.await
                .map_err(|_| "the model worker dropped the request".to_string())?
        }
    }
}

impl Worker {
    /// One engine request per prompt, all queued before any is awaited (so they share the
    /// worker's batches); the samples per prompt, in prompt order. With a seed, prompt i uses
    /// seed + i: given one seed for a batch of prompts, they would otherwise repeat each other.
    /// Refused before anything is queued when out of [`Limits`] (400, naming `fields`) or when
    /// the queue is full (503).
    pub async fn generate_all(
        &self,
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
                self.submit(Request {
                    prompt_ids: p.clone(),
                    params,
                })
            })
            .collect();
        let mut results = Vec::with_capacity(pending.len());
        for p in pending {
            results.push(p.await);
        }
        Ok(results)
    }

    /// Replace the weights by those of the HF folder `dir` once the requests queued before it are
    /// done (they are served with the old weights, every one queued after with the new).
    /// The folder is read whole before anything changes: a missing or half-written file, or
    /// weights of another shape, leave the served weights as they were.
    pub async fn reload(&self, dir: PathBuf) -> Result<(), String> {
        let (reply, rx) = tokio::sync::oneshot::channel();
        self.tx
            .send(Job::Reload { dir, reply })
            .map_err(|_| "the model worker has stopped".to_string())?;
        rx.await
            .map_err(|_| "the model worker dropped the request".to_string())?
    }
}

fn reload(model: &mut CausalLm, dir: &Path) -> Result<()> {
    let new = CausalLm::load(dir, model.device(), model.compute())
        .with_context(|| format!("loading {}", dir.display()))?;
    model
        .var_store_mut()
        .copy(new.var_store())
        .with_context(|| format!("{}: weights of another shape", dir.display()))
}

fn run(
    mut model: CausalLm,
    tok: Option<&Tokenizer>,
    eos: &[i64],
    max_batch_rows: usize,
    rx: mpsc::Receiver<Job>,
) {
    type Reply = tokio::sync::oneshot::Sender<Result<Vec<Sample>, String>>;
    // Seeds for requests without one: different for every engine call (and every server run).
    let mut seeds = ChaCha20Rng::seed_from_u64(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
    );
    let mut reload_next: Option<Job> = None;
    loop {
        if let Some(Job::Reload { dir, reply }) = reload_next.take() {
            let _ = reply.send(reload(&mut model, &dir).map_err(|e| format!("{e:#}")));
        }
        let mut engine = Engine::new(&model, eos.to_vec()).with_config(EngineConfig {
            max_batch_rows,
            seed: seeds.random(),
            ..EngineConfig::default()
        });
        if let Some(t) = tok {
            engine = engine.with_decoder(t);
        }
        // Replies by engine request index (the engine numbers requests in admission order from
        // 0), each removed once sent or its client is gone.
        let replies: RefCell<HashMap<usize, Reply>> = RefCell::new(HashMap::new());
        let mut admitted = 0;
        let mut stopped = false;
        let mut inbox = |idle: bool| -> Incoming {
            if reload_next.is_some() || stopped {
                return Incoming::Close;
            }
            let mut requests = vec![];
            let mut linger_until: Option<std::time::Instant> = None;
            loop {
                // Block only when nothing is in flight and nothing was taken yet; then, starting
                // from idle, wait a moment for the requests sent with it (clients of one batch
                // arrive within a few milliseconds), so they are prefilled together rather than
                // joining the running batch one by one.
                let job = if idle && requests.is_empty() {
                    let j = rx.recv().map_err(|_| mpsc::TryRecvError::Disconnected);
                    linger_until = Some(std::time::Instant::now() + LINGER);
                    j
                } else if let Some(until) = linger_until {
                    match rx
                        .recv_timeout(until.saturating_duration_since(std::time::Instant::now()))
                    {
                        Ok(j) => Ok(j),
                        Err(mpsc::RecvTimeoutError::Timeout) => Err(mpsc::TryRecvError::Empty),
                        Err(mpsc::RecvTimeoutError::Disconnected) => {
                            Err(mpsc::TryRecvError::Disconnected)
                        }
                    }
                } else {
                    rx.try_recv()
                };
                match job {
                    Ok(Job::Sample { request, reply }) => {
                        // A client that went away no longer needs its samples.
                        if !reply.is_closed() {
                            replies.borrow_mut().insert(admitted, reply);
                            admitted += 1;
                            requests.push(request);
                        }
                    }
                    Ok(reload @ Job::Reload { .. }) => {
                        reload_next = Some(reload);
                        break;
                    }
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => {
                        stopped = true;
                        break;
                    }
                }
            }
            if requests.is_empty() && (reload_next.is_some() || stopped) {
                Incoming::Close
            } else {
                Incoming::Requests(requests)
            }
        };
        let mut done = |index: usize, result: Result<Vec<Sample>, String>| {
            if let Some(reply) = replies.borrow_mut().remove(&index) {
                let _ = reply.send(result);
            }
        };
        // A client that hung up mid-request: its request stops at the next step, so a client
        // that times out and retries does not leave the server decoding for nobody.
        let mut gone = |index: usize| {
            let mut replies = replies.borrow_mut();
            match replies.get(&index) {
                Some(reply) if reply.is_closed() => {
                    replies.remove(&index);
                    eprintln!("temper serve: a client went away mid-request; its request stopped");
                    true
                }
                Some(_) => false,
                None => true,
            }
        };
        // A panic inside the engine fails the requests in flight, not the server: the loop
        // builds a fresh engine and goes on.
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            engine.generate_continuous(&mut inbox, &mut done, &mut gone)
        }));
        drop(engine);
        let failure = match result {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(format!("{e:#}")),
            Err(panic) => Some(format!(
                "the request failed inside the server: {}",
                panic_message(&panic)
            )),
        };
        if let Some(msg) = failure {
            // The engine failed as a whole (not one request): every open request gets the error.
            for reply in replies.into_inner().into_values() {
                let _ = reply.send(Err(msg.clone()));
            }
        }
        if stopped && reload_next.is_none() {
            return;
        }
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
