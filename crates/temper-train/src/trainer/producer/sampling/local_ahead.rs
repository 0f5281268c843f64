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
//! (`rollout/policy_lag_max`). With `rollout.partial_rollouts` the thread is a stream
//! ([`ThreadSampler::stream`]): one continuous engine takes the queued jobs between two decode
//! steps, so new weights reach the answers in flight (later tokens drawn by newer weights; a
//! batch counts as sampled by its oldest token's version, so the bound holds all the same) and a
//! batch's requests join the rows of the batches still sampling; the trainer queues the batch
//! the new weights allow right after them. The thread's intra-op threads are its own
//! (`rollout.threads`; OpenMP's thread count is per calling thread).

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender, TryRecvError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

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
    /// Sample `requests` now, with the weights loaded before this job, and answer on `reply`
    /// (an environment's rounds, each waited for by the episodes that asked it).
    Answer {
        requests: Vec<Request>,
        seed: u64,
        reply: Sender<Result<Vec<Sample>>>,
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
    sent: HashMap<usize, Vec<usize>>,
    /// Batches finished and not yet taken: (version, seconds sampling, samples).
    finished: HashMap<usize, (u64, f64, Result<Vec<Sample>>)>,
    stats: AheadStats,
    /// Bumped when what was sent is dropped: the thread skips older jobs, and their results
    /// (of one already running) are ignored.
    epoch: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
    /// The thread samples on a CUDA stream of its own (a GPU, in a build with the CUDA shim):
    /// the weight snapshots handed to it must be complete first.
    own_stream: bool,
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
    /// `rollout.recompute_kv_after_update`: with partial rollouts, the answers in flight
    /// recompute their cache under new weights.
    pub recompute_kv: bool,
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
        let (partial, recompute_kv) = (spec.partial_rollouts, spec.recompute_kv);
        let epoch = Arc::new(AtomicU64::new(0));
        let current = Arc::clone(&epoch);
        // On a GPU the sampler's kernels go to a stream of their own, beside the learner's on
        // the default stream (a build without the CUDA shim has one stream for both).
        let own_stream = match model.device() {
            Device::Cuda(i) if temper_kernels::graph::graphs_available() => Some(i),
            _ => None,
        };
        let thread = std::thread::Builder::new()
            .name("async-sampler".into())
            .spawn(move || {
                if let Some(n) = threads {
                    tch::set_num_threads(n as i32);
                }
                if let Some(i) = own_stream {
                    // The copy loaded on the default stream (of rollout.device's GPU) is
                    // complete before this thread reads it on another. Should the stream not
                    // be had, the waits below are on the shared one: slower, still right.
                    tch::Cuda::synchronize(i as i64);
                    if let Err(e) = temper_kernels::graph::use_own_stream(i) {
                        eprintln!(
                            "warning: the async sampler shares the learner's CUDA stream: {e:#}"
                        );
                    }
                }
                // The version of the weights the copy holds (read by the engine at every token
                // with partial rollouts).
                let version = AtomicU64::new(0);
                let sampler = ThreadSampler {
                    model: &model,
                    tokenizer: &tokenizer,
                    eos_ids,
                    rows,
                    jobs: &inbox,
                    outbox: &outbox,
                    epoch: &current,
                    version: &version,
                    recompute_kv,
                    own_stream,
                };
                match partial {
                    true => sampler.stream(),
                    false => sampler.batch_by_batch(),
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
            own_stream: own_stream.is_some(),
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

    /// Whether data batch `batch` was sent and not yet taken.
    pub fn has_sent(&self, batch: usize) -> bool {
        self.sent.contains_key(&batch)
    }

    /// Queues new weights (`policy`'s now, copied: the trainer goes on changing its own; a
    /// decoder layer at a time, [`CausalLm::for_each_part`], so a sharded run gathers one layer
    /// at a time on every rank); returns the seconds the copy took (`timing_s/weight_push`).
    pub fn load(&mut self, policy: &CausalLm, version: u64) -> Result<f64> {
        let started = std::time::Instant::now();
        let mut weights = Vec::new();
        policy.for_each_part(&mut |params| {
            tch::no_grad(|| {
                weights.extend(params.into_iter().map(|(n, p)| (n, p.detach().copy())))
            });
            Ok(())
        })?;
        // The sampler thread reads the snapshot on a CUDA stream of its own: the copies (on
        // this thread's stream) are done before it is handed over. Not the whole device: that
        // would wait for the sampler's own work, and break a graph capture it may be in.
        if let (true, Device::Cuda(i)) = (self.own_stream, policy.device()) {
            temper_kernels::graph::sync_current_stream(i)
                .context("the weight snapshot for the async sampler")?;
        }
        self.send(Job::Load { version, weights })?;
        Ok(started.elapsed().as_secs_f64())
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

    /// Samples `requests` on the thread now (after the jobs queued before them) with `seed` as
    /// the engine's seed, and waits for their samples. Only without partial rollouts (a
    /// streaming sampler answers with an error).
    pub fn answer(&self, requests: Vec<Request>, seed: u64) -> Result<Vec<Sample>> {
        let (reply, answered) = channel();
        self.send(Job::Answer {
            requests,
            seed,
            reply,
        })?;
        answered
            .recv()
            .map_err(|_| anyhow!("the async sampler thread has stopped"))?
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

/// The sampler thread's side: its copy of the policy, the job queue and where finished batches
/// go.
struct ThreadSampler<'a> {
    model: &'a CausalLm,
    tokenizer: &'a Tokenizer,
    eos_ids: Vec<i64>,
    rows: usize,
    jobs: &'a Receiver<Job>,
    outbox: &'a Sender<Done>,
    /// The trainer's current epoch: jobs of an older one are skipped, their rows abandoned.
    epoch: &'a AtomicU64,
    /// The version of the weights the copy holds.
    version: &'a AtomicU64,
    /// `rollout.recompute_kv_after_update`: the streaming engine recomputes the cache of the
    /// rows in flight when new weights come.
    recompute_kv: bool,
    /// The CUDA device whose stream of its own this thread runs on (None: the CPU, or the
    /// default stream).
    own_stream: Option<usize>,
}

impl ThreadSampler<'_> {
    fn engine(&self, seed: u64) -> Engine<'_> {
        Engine::new(self.model, self.eos_ids.clone())
            .with_decoder(self.tokenizer)
            .with_config(EngineConfig {
                max_batch_rows: self.rows,
                seed,
                ..EngineConfig::default()
            })
    }

    /// New weights copied into the sampler's model. On a stream of its own the copy is waited
    /// for: the snapshot is freed after, and its memory belongs to the trainer's stream. A
    /// device that fails that wait has failed for good: the thread stops with the reason (the
    /// trainer's next call says the sampler thread has stopped).
    fn take_weights(&self, weights: &[(String, Tensor)]) {
        copy_into(self.model, weights);
        if let Some(i) = self.own_stream {
            if let Err(e) = temper_kernels::graph::sync_current_stream(i) {
                panic!("the async sampler's weight copy on cuda:{i}: {e:#}");
            }
        }
    }

    /// Whether a job of `epoch` is still wanted (the trainer has not dropped it since).
    fn is_current(&self, epoch: u64) -> bool {
        epoch == self.epoch.load(Ordering::SeqCst)
    }

    /// Without partial rollouts: the jobs one after the other, each batch sampled whole by the
    /// weights loaded before it.
    fn batch_by_batch(&self) {
        while let Ok(job) = self.jobs.recv() {
            match job {
                Job::Load { version, weights } => {
                    self.take_weights(&weights);
                    self.version.store(version, Ordering::SeqCst);
                }
                Job::Generate {
                    epoch,
                    batch,
                    requests,
                    seed,
                } => {
                    if !self.is_current(epoch) {
                        continue;
                    }
                    let (version, secs, samples) = self.sample_now(&requests, seed);
                    if self
                        .outbox
                        .send((epoch, batch, version, secs, samples))
                        .is_err()
                    {
                        return;
                    }
                }
                Job::Answer {
                    requests,
                    seed,
                    reply,
                } => {
                    // The asker may have given up (its step failed); the thread goes on.
                    let (_, _, samples) = self.sample_now(&requests, seed);
                    let _ = reply.send(samples);
                }
            }
        }
    }

    /// `requests` sampled whole by the weights the copy holds: their version, the seconds it
    /// took, the samples.
    fn sample_now(&self, requests: &[Request], seed: u64) -> (u64, f64, Result<Vec<Sample>>) {
        let started = Instant::now();
        let version = self.version.load(Ordering::SeqCst);
        let engine = self.engine(seed);
        let samples = self.model.with_sampling_weights(|| engine.sample(requests));
        (version, started.elapsed().as_secs_f64(), samples)
    }

    /// With partial rollouts: one continuous engine for the thread's life, the producer of a
    /// stream. Before every decode step the jobs queued meanwhile are taken in order: new
    /// weights are copied in (the rows in flight go on under them, their cache kept, as AReaL's
    /// and PipelineRL's in-flight updates do, or recomputed under the new weights with
    /// `rollout.recompute_kv_after_update`; the version the engine records with each token
    /// moves on), and a batch's requests join the rows in flight at once, so the rows a batch's
    /// longest answers leave free are filled by the next batch instead of waiting for them. A
    /// batch is sent back when its last answer ends. The trainer queues a batch only after the
    /// weights that keep it within the bound, so every token of it is drawn by those or newer.
    fn stream(&self) {
        let state = RefCell::new(Stream::default());
        let engine = self
            .engine(0)
            .with_policy_version(self.version)
            .with_kv_recompute(self.recompute_kv);
        loop {
            let mut inbox = |idle: bool| self.incoming(idle, &mut state.borrow_mut());
            let mut done = |index: usize, result: Result<Vec<Sample>, String>| {
                self.answered(index, result, &mut state.borrow_mut())
            };
            let mut gone = |index: usize| {
                state
                    .borrow()
                    .forgotten(index, self.epoch.load(Ordering::SeqCst))
            };
            let ran = engine.generate_continuous(&mut inbox, &mut done, &mut gone);
            let mut s = state.borrow_mut();
            match ran {
                // Closed: the trainer is gone.
                Ok(()) => return,
                // The engine failed: every batch in flight fails with it; a new engine takes
                // the next jobs.
                Err(e) => {
                    for (_, b) in s.batches.drain() {
                        let error = Err(anyhow!("{e:#}"));
                        if self.outbox.send((b.epoch, b.batch, 0, 0.0, error)).is_err() {
                            return;
                        }
                    }
                    s.requests.clear();
                    s.next_index = 0;
                    if s.closed {
                        return;
                    }
                }
            }
        }
    }

    /// The engine's inbox: the jobs queued since its last call, in order (blocking for one when
    /// the engine has nothing to do).
    fn incoming(&self, idle: bool, s: &mut Stream) -> Incoming {
        s.tick();
        let current = self.epoch.load(Ordering::SeqCst);
        s.forget_older_than(current);
        let mut admitted = Vec::new();
        let mut newest_weights = None;
        loop {
            let job = match idle && admitted.is_empty() {
                true => match self.jobs.recv() {
                    Ok(job) => job,
                    Err(_) => {
                        s.closed = true;
                        break;
                    }
                },
                false => match self.jobs.try_recv() {
                    Ok(job) => job,
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        s.closed = true;
                        break;
                    }
                },
            };
            match job {
                Job::Load { version, weights } => newest_weights = Some((version, weights)),
                Job::Answer { reply, .. } => {
                    let no = anyhow!("a streaming sampler (rollout.partial_rollouts) answers batches, not requests one by one");
                    let _ = reply.send(Err(no));
                }
                Job::Generate {
                    epoch,
                    batch,
                    requests,
                    ..
                } => {
                    if !self.is_current(epoch) {
                        continue;
                    }
                    if requests.is_empty() {
                        let version = self.version.load(Ordering::SeqCst);
                        let _ = self.outbox.send((epoch, batch, version, 0.0, Ok(vec![])));
                        continue;
                    }
                    // The weights queued before this batch, before its first token.
                    if let Some(w) = newest_weights.take() {
                        self.load(w);
                    }
                    s.admit(
                        epoch,
                        batch,
                        requests.len(),
                        self.version.load(Ordering::SeqCst),
                    );
                    admitted.extend(requests);
                }
            }
        }
        if let Some(w) = newest_weights {
            self.load(w);
        }
        // Time spent waiting here for a job is no batch's.
        s.last_tick = Some(Instant::now());
        match (s.closed, admitted.is_empty()) {
            (true, true) => Incoming::Close,
            // Closed with requests in hand: they are sampled, and the next call closes.
            _ => Incoming::Requests(admitted),
        }
    }

    /// Copies in new weights (the sampling copies rebuilt from them).
    fn load(&self, (version, weights): (u64, Vec<(String, Tensor)>)) {
        self.take_weights(&weights);
        self.model.thaw_after_sampling();
        self.model.freeze_for_sampling();
        self.version.store(version, Ordering::SeqCst);
    }

    /// Request `index`'s answers; the batch goes back once its last request is answered.
    fn answered(&self, index: usize, result: Result<Vec<Sample>, String>, s: &mut Stream) {
        s.tick();
        let Some((key, at)) = s.requests.remove(&index) else {
            return;
        };
        let Some(b) = s.batches.get_mut(&key) else {
            return;
        };
        b.answers[at] = Some(result);
        b.left -= 1;
        if b.left > 0 {
            return;
        }
        let b = s.batches.remove(&key).expect("looked up above");
        let mut samples = Vec::new();
        let mut failed = None;
        for (i, answer) in b.answers.into_iter().enumerate() {
            match answer {
                // Numbered within the batch, as a batch's own engine numbers them.
                Some(Ok(x)) => samples.extend(x.into_iter().map(|x| Sample {
                    request_index: i,
                    ..x
                })),
                Some(Err(e)) => {
                    failed.get_or_insert_with(|| anyhow!("request {i}: {e}"));
                }
                None => {
                    failed.get_or_insert_with(|| anyhow!("request {i} was not answered"));
                }
            }
        }
        // The batch's version is its oldest token's (the one it was admitted under when no
        // token was drawn).
        let oldest = samples
            .iter()
            .filter_map(|x| x.completion_versions.first())
            .min()
            .copied()
            .unwrap_or(b.version);
        let result = match failed {
            Some(e) => Err(e),
            None => Ok(samples),
        };
        let _ = self
            .outbox
            .send((b.epoch, b.batch, oldest, b.busy_s, result));
    }
}

/// The batches a streaming sampler has in flight, and which batch each engine request is of.
#[derive(Default)]
struct Stream {
    /// By admission number.
    batches: HashMap<usize, InFlight>,
    admissions: usize,
    /// Engine request index (admission order) -> (its batch's admission number, its place in
    /// the batch).
    requests: HashMap<usize, (usize, usize)>,
    next_index: usize,
    /// When the sampler's time was last shared out among the batches in flight.
    last_tick: Option<Instant>,
    /// The trainer dropped its end of the queue.
    closed: bool,
}

/// A batch being sampled by the stream.
struct InFlight {
    epoch: u64,
    batch: usize,
    answers: Vec<Option<Result<Vec<Sample>, String>>>,
    left: usize,
    /// Its share of the sampler's seconds while it was in flight (each interval split by the
    /// batches' open requests), so batches sampled together do not count the same seconds twice.
    busy_s: f64,
    /// The version of the weights when it was admitted.
    version: u64,
}

impl Stream {
    /// Records a batch of `n` requests admitted now, as the engine's next `n` request indices.
    fn admit(&mut self, epoch: u64, batch: usize, n: usize, version: u64) {
        let key = self.admissions;
        self.admissions += 1;
        for at in 0..n {
            self.requests.insert(self.next_index + at, (key, at));
        }
        self.next_index += n;
        self.batches.insert(
            key,
            InFlight {
                epoch,
                batch,
                answers: (0..n).map(|_| None).collect(),
                left: n,
                busy_s: 0.0,
                version,
            },
        );
    }

    /// Shares the seconds since the last tick among the batches in flight, by their open
    /// requests.
    fn tick(&mut self) {
        let now = Instant::now();
        let since = self.last_tick.replace(now).map(|t| (now - t).as_secs_f64());
        let open: usize = self.batches.values().map(|b| b.left).sum();
        if let (Some(secs), true) = (since, open > 0) {
            for b in self.batches.values_mut() {
                b.busy_s += secs * b.left as f64 / open as f64;
            }
        }
    }

    /// Whether engine request `index` belongs to a batch the trainer has dropped.
    fn forgotten(&self, index: usize, current: u64) -> bool {
        self.requests
            .get(&index)
            .and_then(|(key, _)| self.batches.get(key))
            .is_none_or(|b| b.epoch != current)
    }

    /// Drops the batches of epochs before `current` (their rows are abandoned by the engine).
    fn forget_older_than(&mut self, current: u64) {
        self.batches.retain(|_, b| b.epoch == current);
        let batches = &self.batches;
        self.requests
            .retain(|_, (key, _)| batches.contains_key(key));
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
    use temper_rollout::SamplingParams;

    fn tiny() -> (CausalLm, Tokenizer) {
        let dir = temper_testkit::tiny_model_dir();
        let model = CausalLm::load(&dir, Device::Cpu, ComputeKind::F32).unwrap();
        (model, Tokenizer::from_dir(&dir).unwrap())
    }

    fn copies(model: &CausalLm, scale: f64) -> Vec<(String, Tensor)> {
        tch::no_grad(|| {
            model
                .named_parameters()
                .into_iter()
                .map(|(n, p)| (n, p.detach() * scale))
                .collect()
        })
    }

    /// `count` requests of exactly `tokens` tokens each, seeded by `first`.
    fn requests(count: usize, tokens: usize, first: u64) -> Vec<Request> {
        (0..count as u64)
            .map(|i| Request {
                prompt_ids: vec![1, 2, 3 + i as i64],
                params: SamplingParams {
                    max_tokens: tokens,
                    min_tokens: tokens,
                    seed: Some(first + i),
                    ..SamplingParams::default()
                },
            })
            .collect()
    }

    /// Runs a streaming sampler over `model` on this thread while `feed` sends it jobs and reads
    /// what it sends back on another; returns what `feed` returns (the sampler ends when `feed`
    /// drops the queue).
    fn streaming<T: Send>(
        model: &CausalLm,
        tokenizer: &Tokenizer,
        feed: impl FnOnce(Sender<Job>, Receiver<Done>) -> T + Send,
    ) -> (T, u64) {
        let (jobs, queue) = channel::<Job>();
        let (outbox, done) = channel::<Done>();
        let (epoch, version) = (AtomicU64::new(0), AtomicU64::new(0));
        let fed = std::thread::scope(|scope| {
            let feeding = scope.spawn(|| feed(jobs, done));
            let sampler = ThreadSampler {
                model,
                tokenizer,
                eos_ids: vec![],
                rows: 8,
                jobs: &queue,
                outbox: &outbox,
                epoch: &epoch,
                version: &version,
                recompute_kv: false,
                own_stream: None,
            };
            sampler.stream();
            // What the sampler sent is all there will be.
            drop(outbox);
            feeding.join().unwrap()
        });
        (fed, version.load(Ordering::SeqCst))
    }

    /// Weights sent while a batch is sampled reach it between two tokens: every token records
    /// the version that drew it (never decreasing along an answer, answers spanning several),
    /// and the copy ends with the newest weights sent, bit for bit.
    #[test]
    fn weights_sent_while_a_batch_is_sampled_reach_it_between_two_tokens() {
        let (model, tokenizer) = tiny();
        let scaled = |base: &[(String, Tensor)], v: u64| -> Vec<(String, Tensor)> {
            base.iter()
                .map(|(n, w)| (n.clone(), w * (1.0 + 0.01 * v as f64)))
                .collect()
        };
        let (base, sent_from) = (copies(&model, 1.0), copies(&model, 1.0));
        let ((samples, sent), last) = streaming(&model, &tokenizer, move |jobs, done| {
            let generate = Job::Generate {
                epoch: 0,
                batch: 0,
                requests: requests(3, 300, 0),
                seed: 0,
            };
            jobs.send(generate).unwrap();
            // New weights every 2 ms until the batch is back.
            let mut sent = 0;
            loop {
                match done.recv_timeout(std::time::Duration::from_millis(2)) {
                    Ok((_, batch, _, _, samples)) => {
                        assert_eq!(batch, 0);
                        return (samples.unwrap(), sent);
                    }
                    Err(_) => {
                        sent += 1;
                        let load = Job::Load {
                            version: sent,
                            weights: scaled(&sent_from, sent),
                        };
                        jobs.send(load).unwrap();
                    }
                }
            }
        });
        assert_eq!(samples.len(), 3);
        let mut spanning = 0;
        for s in &samples {
            let v = &s.completion_versions;
            assert_eq!(v.len(), s.completion_ids.len());
            assert!(v.windows(2).all(|w| w[0] <= w[1]), "{v:?}");
            spanning += usize::from(v.first() != v.last());
        }
        assert!(spanning > 0, "no answer was sampled across an update");
        // Every load sent was taken (the last ones after the batch, before the queue closed).
        assert_eq!(last, sent);
        let want = scaled(&base, last);
        let have: HashMap<String, Tensor> = model.named_parameters().into_iter().collect();
        for (name, w) in &want {
            assert!(have[name].equal(w), "{name}");
        }
    }

    /// The stream does not wait for a batch's longest answer: a batch queued behind it (after
    /// the weights that allow it) joins the rows in flight, is drawn wholly by those weights,
    /// and comes back first when its answers are shorter; a batch of a dropped epoch is never
    /// sent back.
    #[test]
    fn the_next_batch_joins_the_rows_of_a_batch_still_sampling() {
        let (model, tokenizer) = tiny();
        let newer = copies(&model, 1.01);
        let (order, _) = streaming(&model, &tokenizer, |jobs, done| {
            let send = |job| jobs.send(job).unwrap();
            send(Job::Generate {
                epoch: 0,
                batch: 0,
                requests: requests(1, 200, 0),
                seed: 0,
            });
            send(Job::Load {
                version: 1,
                weights: newer,
            });
            send(Job::Generate {
                epoch: 0,
                batch: 1,
                requests: requests(3, 5, 10),
                seed: 0,
            });
            // An older epoch's batch (sent before a drop) is skipped.
            send(Job::Generate {
                epoch: 7,
                batch: 9,
                requests: requests(1, 5, 20),
                seed: 0,
            });
            let mut order = vec![];
            for _ in 0..2 {
                let (_, batch, version, secs, samples) = done.recv().unwrap();
                let samples = samples.unwrap();
                if batch == 1 {
                    assert_eq!(version, 1);
                    assert!(samples
                        .iter()
                        .all(|s| s.completion_versions.iter().all(|&v| v == 1)));
                    // Numbered within their batch, as the groups are built from them.
                    let index: Vec<usize> = samples.iter().map(|s| s.request_index).collect();
                    assert_eq!(index, vec![0, 1, 2]);
                } else {
                    assert_eq!(samples[0].completion_ids.len(), 200);
                }
                // Each batch's share of the seconds they were sampled together.
                assert!(secs > 0.0, "batch {batch}: {secs}");
                order.push(batch);
            }
            drop(jobs);
            assert!(done.recv().is_err(), "the dropped epoch's batch came back");
            order
        });
        assert_eq!(order, vec![1, 0]);
    }
}
