//! The sampling engine: batched prefill + KV-cache decode on a [`CausalLm`], under no-grad.
//!
//! One loop step runs one forward that yields next-token logits `(rows, V)` for every active row,
//! then samples a token per row (see [`crate::step`]), checks the stop conditions and drops
//! finished rows from the batch (`KvCache::select_rows`). A step is either
//! - a decode step: each row's newest token, `(rows, 1)`, against the cache; or
//! - an admission step, when the scheduler admits queued work: one row per admitted prompt is
//!   prefilled (left-padded) into a fresh cache and then repeated for its samples, so `n` samples
//!   share one prefill. Rows still running take their due decode step first, and the two caches
//!   are merged right-aligned (`KvCache::merge_rows`), so a freed slot is refilled without
//!   re-prefilling the running rows; the scheduler refills once enough slots are free.
//!
//! That is the growing cache (`running_batch.rs`), the CPU's. On CUDA ([`DecodeMode`]) the rows
//! live in fixed-shape slots of the model's static cache instead (`slot_batch.rs`): admitted rows
//! are copied into free slots, finished ones free theirs, and each step is a power-of-two bucket
//! of slots replayed as a CUDA graph ([`temper_model::static_decode`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use temper_model::{CausalLm, DecodeWork};

use crate::draw::next_key;
use crate::params::{Finish, Request, Sample, StopReason};
use crate::running_batch::{Batch, Row, RunningBatch};
use crate::sample_step::{sample_step, RowView};
use crate::scheduler::{Scheduler, SchedulerConfig};
use crate::slot_batch::SlotBatch;
use crate::stop::{Decode, StopStrings};

/// Batch shape and the seed for requests without one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineConfig {
    /// Most rows decoded together.
    pub max_batch_rows: usize,
    /// Most padded tokens in one prefill forward (bounds activation memory).
    pub max_prefill_tokens: usize,
    /// Refill freed slots (one prefill of the admitted prompts, merged into the running cache) only
    /// when at least this many are free; `None` = a quarter of `max_batch_rows`.
    pub refill_min_free: Option<usize>,
    /// Seeds the generator that gives seeds to requests with `seed: None`.
    pub seed: u64,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            max_batch_rows: 64,
            max_prefill_tokens: 8192,
            refill_min_free: None,
            seed: 0,
        }
    }
}

/// Progress after each step, for progress bars.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Progress {
    pub finished_samples: usize,
    pub total_samples: usize,
    pub generated_tokens: usize,
}

/// What the caller of [`Engine::generate_continuous`] hands the engine between steps.
pub enum Incoming {
    /// New requests (maybe none).
    Requests(Vec<Request>),
    /// Admit nothing more: finish the requests in flight and return.
    Close,
}

/// Samples completions from a model. Holds only references; cheap to build per call.
pub struct Engine<'a> {
    model: &'a CausalLm,
    eos_ids: Vec<i64>,
    decoder: Option<&'a dyn Decode>,
    config: EngineConfig,
    decode: DecodeMode,
    /// Seeds for requests without one: reproducible per engine, different on every call.
    seeder: Mutex<ChaCha20Rng>,
    /// What this engine's decode steps did, over all its calls.
    work: Mutex<DecodeWork>,
    /// The version of the weights sampling now, read at every token (None: not recorded).
    policy_version: Option<&'a AtomicU64>,
    /// When that version changes between two steps, the rows in flight recompute their cache
    /// under the new weights ([`Engine::with_kv_recompute`]).
    recompute_kv: bool,
}

/// How decode steps run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DecodeMode {
    /// Static on CUDA, growing on the CPU (where it is the faster: attention reads only the
    /// filled positions, and there are no launches to save).
    #[default]
    Auto,
    /// Fixed-shape slots and buckets ([`temper_model::static_decode`]), captured as CUDA graphs
    /// on CUDA and run uncaptured elsewhere.
    Static,
    /// A cache that grows with the longest row and shrinks as rows leave.
    Growing,
}

impl DecodeMode {
    /// What `Auto` means on `device`.
    pub fn resolve(self, device: tch::Device) -> DecodeMode {
        match self {
            DecodeMode::Auto if device.is_cuda() => DecodeMode::Static,
            DecodeMode::Auto => DecodeMode::Growing,
            other => other,
        }
    }
}

/// What every sample of one request shares.
/// The requests an engine call has admitted and not yet answered, by index.
pub(crate) type Requests = HashMap<usize, Prepared>;

pub(crate) struct Prepared {
    pub(crate) request: Request,
    pub(crate) stops: StopStrings,
    /// Ids that end a sample: EOS (unless `ignore_eos`), then `stop_token_ids`.
    pub(crate) eos: Vec<i64>,
    /// Banned while the completion is shorter than `min_tokens`.
    pub(crate) banned: Vec<i64>,
    /// Completion budget: `max_tokens`, capped by the context.
    pub(crate) max_new: usize,
    pub(crate) seed: u64,
}

impl<'a> Engine<'a> {
    /// `eos_ids`: the model's end-of-sequence ids (`GenerationConfig::eos_token_ids`).
    pub fn new(model: &'a CausalLm, eos_ids: Vec<i64>) -> Self {
        let config = EngineConfig::default();
        Self {
            model,
            eos_ids,
            decoder: None,
            config,
            decode: DecodeMode::Auto,
            seeder: Mutex::new(ChaCha20Rng::seed_from_u64(config.seed)),
            work: Mutex::new(DecodeWork::default()),
            policy_version: None,
            recompute_kv: false,
        }
    }

    /// The decoder for stop strings (usually the model's `Tokenizer`); requests with `stop`
    /// strings are rejected without one.
    pub fn with_decoder(mut self, decoder: &'a dyn Decode) -> Self {
        self.decoder = Some(decoder);
        self
    }

    pub fn with_config(mut self, config: EngineConfig) -> Self {
        self.config = config;
        self.seeder = Mutex::new(ChaCha20Rng::seed_from_u64(config.seed));
        self
    }

    /// Records with every token the value of `version` when it was drawn
    /// ([`Sample::completion_versions`]): the caller bumps it when it changes the weights
    /// between two steps (from the `inbox` of [`Engine::generate_continuous`]).
    pub fn with_policy_version(mut self, version: &'a AtomicU64) -> Self {
        self.policy_version = Some(version);
        self
    }

    /// With [`Engine::with_policy_version`]: when the version changes between two steps (new
    /// weights copied in from the `inbox`), every row in flight recomputes its keys and values
    /// under the new weights (its prompt and completion so far, one prefill) before its next
    /// token, so the rest of the answer is drawn by the new policy alone; without it the rows
    /// keep the cache the old weights computed (AReaL's and PipelineRL's default). Decoding
    /// then runs with the growing cache ([`DecodeMode::Growing`]).
    pub fn with_kv_recompute(mut self, recompute: bool) -> Self {
        self.recompute_kv = recompute;
        self
    }

    /// How decode steps run ([`DecodeMode::Auto`] unless set).
    pub fn with_decode_mode(mut self, mode: DecodeMode) -> Self {
        self.decode = mode;
        self
    }

    pub fn model(&self) -> &CausalLm {
        self.model
    }

    /// What this engine's decode steps did so far, over all its calls (`perf/decode_*`).
    pub fn decode_work(&self) -> DecodeWork {
        *self.work.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn eos_ids(&self) -> &[i64] {
        &self.eos_ids
    }

    /// Context length (positions), if the model config states it.
    pub fn context_len(&self) -> Option<usize> {
        self.model
            .config()
            .max_position_embeddings
            .map(|c| c as usize)
    }

    /// Check every request without running the model. Errors name the request and field.
    pub fn validate(&self, requests: &[Request]) -> Result<()> {
        for (i, r) in requests.iter().enumerate() {
            self.validate_one(r)
                .with_context(|| format!("request {i}"))?;
        }
        Ok(())
    }

    fn validate_one(&self, r: &Request) -> Result<()> {
        let vocab = self.model.config().vocab_size as usize;
        r.params.validate(Some(vocab))?;
        if r.prompt_ids.is_empty() {
            bail!("prompt_ids is empty (a prompt needs at least one token)");
        }
        if let Some((p, &t)) = r
            .prompt_ids
            .iter()
            .enumerate()
            .find(|(_, &t)| t < 0 || t as usize >= vocab)
        {
            bail!("prompt_ids[{p}] = {t} is not a token id (vocabulary size {vocab})");
        }
        if let Some(c) = self.context_len() {
            if r.prompt_ids.len() >= c {
                bail!(
                    "prompt has {} tokens, the model's context is {c} (max_position_embeddings): no room \
                     for a completion",
                    r.prompt_ids.len()
                );
            }
        }
        if !r.params.stop.is_empty() && self.decoder.is_none() {
            bail!("stop strings need a tokenizer to decode with (Engine::with_decoder)");
        }
        Ok(())
    }

    /// Generate `params.n` samples for every request. Samples come back ordered by
    /// `(request_index, sample_index)`. `progress` is called after every step.
    pub fn generate(
        &self,
        requests: &[Request],
        progress: &mut dyn FnMut(Progress),
    ) -> Result<Vec<Sample>> {
        self.validate(requests)?;
        let total: usize = requests.iter().map(|r| r.params.n).sum();
        let mut first = Some(requests.to_vec());
        let mut inbox = |_idle: bool| match first.take() {
            Some(all) => Incoming::Requests(all),
            None => Incoming::Close,
        };
        let mut done: Vec<Sample> = Vec::with_capacity(total);
        let mut failed = None;
        let mut collect = |_: usize, result: Result<Vec<Sample>, String>| match result {
            Ok(samples) => done.extend(samples),
            Err(e) => failed = Some(e),
        };
        // bf16: cast the weights once for the whole call instead of at every decode step
        // (bitwise the same numbers; a no-op in f32).
        self.model.with_sampling_weights(|| {
            self.run(&mut inbox, &mut collect, &mut |_| false, &mut |p| {
                progress(Progress {
                    total_samples: total,
                    ..p
                })
            })
        })?;
        if let Some(e) = failed {
            bail!(e);
        }
        done.sort_by_key(|s| (s.request_index, s.sample_index));
        Ok(done)
    }

    /// Continuous batching. Before every step, `inbox(idle)` is asked for new requests (`idle`:
    /// nothing is in flight, so the caller may block until something arrives); they join the
    /// running batch as rows free up, and get the next request indices in order (the first is 0).
    /// Each request's samples go to `done(index, ...)` as soon as its last sample finishes,
    /// ordered by sample index; a request that fails validation gets its own error. Once the
    /// inbox answers [`Incoming::Close`], the requests in flight are finished and the call
    /// returns. Before every step, `gone(index)` says whether a request's client went away: its
    /// rows leave the batch and its queued samples the queue, and `done` is not called for it.
    /// A request's tokens depend only on its own seed, not on what it is batched with (nor on
    /// which other requests were dropped).
    pub fn generate_continuous(
        &self,
        inbox: &mut dyn FnMut(bool) -> Incoming,
        done: &mut dyn FnMut(usize, Result<Vec<Sample>, String>),
        gone: &mut dyn FnMut(usize) -> bool,
    ) -> Result<()> {
        self.model
            .with_sampling_weights(|| self.run(inbox, done, gone, &mut |_| {}))
    }

    fn run(
        &self,
        inbox: &mut dyn FnMut(bool) -> Incoming,
        done: &mut dyn FnMut(usize, Result<Vec<Sample>, String>),
        gone: &mut dyn FnMut(usize) -> bool,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<()> {
        let _no_grad = tch::no_grad_guard();
        let mut sched_cfg =
            SchedulerConfig::new(self.config.max_batch_rows, self.config.max_prefill_tokens);
        if let Some(free) = self.config.refill_min_free {
            sched_cfg.refill_min_free = free.max(1);
        }
        let mut scheduler = Scheduler::new(&[], sched_cfg);
        // Requests by index (admission order), each forgotten once answered, so a server's
        // engine that runs for days holds only the requests in flight.
        let mut prepared: Requests = HashMap::new();
        let mut next_index = 0;
        // Per request: samples still running, and those finished.
        let mut open: HashMap<usize, (usize, Vec<Sample>)> = HashMap::new();
        let device = self.model.device();
        let mode = match self.recompute_kv {
            true => DecodeMode::Growing,
            false => self.decode.resolve(device),
        };
        // The weights' version at the last step, when the cache is recomputed on a change.
        let mut cached_version = None;
        let mut batch: Box<dyn RunningBatch> = match mode {
            DecodeMode::Static => Box::new(SlotBatch::new(device)),
            _ => Box::new(Batch::empty(device)),
        };
        let (mut accepting, mut finished, mut generated_tokens) = (true, 0, 0);
        loop {
            if accepting {
                let idle = batch.rows().is_empty() && scheduler.is_empty();
                match inbox(idle) {
                    Incoming::Requests(requests) => {
                        for r in requests {
                            let index = next_index;
                            next_index += 1;
                            let (n, len) = (r.params.n, r.prompt_ids.len());
                            match self.validate_one(&r) {
                                Ok(()) => {
                                    prepared.insert(index, self.prepare(r));
                                    open.insert(index, (n, Vec::with_capacity(n)));
                                    scheduler.push(index, n, len);
                                }
                                Err(e) => done(index, Err(format!("{e:#}"))),
                            }
                        }
                    }
                    Incoming::Close => accepting = false,
                }
            }
            // Requests nobody waits for any more: stop sampling them, and forget them.
            let abandoned: Vec<usize> = open.keys().copied().filter(|&r| gone(r)).collect();
            if !abandoned.is_empty() {
                for r in &abandoned {
                    open.remove(r);
                    prepared.remove(r);
                }
                scheduler.retain_requests(|r| open.contains_key(&r));
                let keep: Vec<i64> = (0..batch.rows().len())
                    .filter(|&i| open.contains_key(&batch.rows()[i].request))
                    .map(|i| i as i64)
                    .collect();
                batch.keep_rows(self.model, &keep);
            }
            if let (true, Some(v)) = (self.recompute_kv, self.policy_version) {
                let now = v.load(Ordering::SeqCst);
                if cached_version.is_some_and(|c| c != now) && !batch.rows().is_empty() {
                    batch.recompute(self.model, &prepared)?;
                }
                cached_version = Some(now);
            }
            let units = scheduler.admit(batch.rows().len());
            // A decode step (not a prefill): its work and time, to the end of this iteration
            // (sampling reads the tokens back, so the time is the device's too).
            let mut decoding = None;
            let logits = if !units.is_empty() {
                batch.rebuild(self.model, &prepared, &units)?
            } else if !batch.rows().is_empty() {
                let attended: usize = batch
                    .rows()
                    .iter()
                    .map(|r| prepared[&r.request].request.prompt_ids.len() + r.completion.len())
                    .sum();
                decoding = Some((Instant::now(), batch.rows().len(), attended));
                batch.decode(self.model)?
            } else if accepting {
                continue;
            } else {
                break;
            };
            // One key per row and step, greedy or not, so a row's stream never depends on others.
            let keys: Vec<u64> = batch
                .rows_mut()
                .iter_mut()
                .map(|r| next_key(&mut r.rng))
                .collect();
            let views: Vec<RowView> = batch
                .rows()
                .iter()
                .map(|row| {
                    let p = &prepared[&row.request];
                    let below_min = row.completion.len() < p.request.params.min_tokens;
                    RowView {
                        params: &p.request.params,
                        banned: if below_min { &p.banned } else { &[] },
                        seen: &row.seen,
                    }
                })
                .collect();
            let drawn = sample_step(&logits, &views, &keys)?;
            let mut keep = Vec::with_capacity(batch.rows().len());
            let mut answered = vec![];
            for (i, (token, logprob)) in drawn.into_iter().enumerate() {
                let row = &mut batch.rows_mut()[i];
                let p = &prepared[&row.request];
                row.completion.push(token);
                row.logprobs.push(logprob);
                if let Some(v) = self.policy_version {
                    row.versions.push(v.load(Ordering::SeqCst));
                }
                if p.request.params.repetition_penalty != 1.0 {
                    if let Err(at) = row.seen.binary_search(&token) {
                        row.seen.insert(at, token);
                    }
                }
                generated_tokens += 1;
                let Some((finish, reason)) = self.finish(p, row)? else {
                    keep.push(i as i64);
                    continue;
                };
                finished += 1;
                let (left, samples) = open.get_mut(&row.request).expect("open request");
                samples.push(Sample {
                    request_index: row.request,
                    sample_index: row.sample,
                    prompt_ids: p.request.prompt_ids.clone(),
                    completion_ids: std::mem::take(&mut row.completion),
                    completion_logprobs: std::mem::take(&mut row.logprobs),
                    finish,
                    stop_reason: reason,
                    completion_versions: std::mem::take(&mut row.versions),
                });
                *left -= 1;
                if *left == 0 {
                    let mut samples = std::mem::take(samples);
                    samples.sort_by_key(|s| s.sample_index);
                    done(row.request, Ok(samples));
                    answered.push(row.request);
                }
            }
            for r in answered {
                open.remove(&r);
                prepared.remove(&r);
            }
            batch.keep_rows(self.model, &keep);
            if let Some((started, rows, attended)) = decoding {
                let mut work = self.work.lock().unwrap_or_else(|e| e.into_inner());
                *work = work.plus(DecodeWork {
                    steps: 1,
                    tokens: rows as u64,
                    attended: attended as u64,
                    seconds: started.elapsed().as_secs_f64(),
                });
            }
            progress(Progress {
                finished_samples: finished,
                total_samples: 0,
                generated_tokens,
            });
        }
        Ok(())
    }

    fn prepare(&self, request: Request) -> Prepared {
        let context = self.context_len();
        let mut seeder = self.seeder.lock().unwrap_or_else(|e| e.into_inner());
        let params = &request.params;
        let mut eos = if params.ignore_eos {
            Vec::new()
        } else {
            self.eos_ids.clone()
        };
        for &t in &params.stop_token_ids {
            if !eos.contains(&t) {
                eos.push(t);
            }
        }
        let room = context.map_or(usize::MAX, |c| c.saturating_sub(request.prompt_ids.len()));
        // Drawn for every request, so that seeding one request does not shift the others.
        let fallback_seed: u64 = seeder.random();
        Prepared {
            stops: StopStrings::new(&params.stop),
            banned: if params.min_tokens > 0 {
                eos.clone()
            } else {
                Vec::new()
            },
            eos,
            max_new: params.max_tokens.min(room),
            seed: params.seed.unwrap_or(fallback_seed),
            request,
        }
    }

    /// Whether `row` (with its newest token appended) is finished, and why.
    fn finish(&self, p: &Prepared, row: &Row) -> Result<Option<(Finish, Option<StopReason>)>> {
        let last = *row.completion.last().expect("a token was just appended");
        let len = row.completion.len();
        let params = &p.request.params;
        if p.eos.contains(&last) {
            let reason = if !params.ignore_eos && self.eos_ids.contains(&last) {
                StopReason::Eos(last)
            } else {
                StopReason::StopToken(last)
            };
            return Ok(Some((Finish::Stop, Some(reason))));
        }
        if len >= params.min_tokens && !p.stops.is_empty() {
            let decoder = self
                .decoder
                .expect("validate() requires a decoder for stop strings");
            if let Some(i) = p.stops.completed_by_last(&row.completion, decoder)? {
                return Ok(Some((Finish::Stop, Some(StopReason::StopString(i)))));
            }
        }
        if len >= p.max_new {
            return Ok(Some((Finish::Length, None)));
        }
        Ok(None)
    }
}
