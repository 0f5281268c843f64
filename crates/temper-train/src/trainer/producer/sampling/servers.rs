//! Rollouts on inference servers (`rollout.backend` = vllm | sglang | openai; a prompt run's
//! batches are drawn in `draw_groups.rs`, on the servers or in process): weight sync every
//! `rollout.sync_every` optimizer steps, the policy version each batch was sampled from, and
//! overlap (`rollout.async_steps`): the next batches are generated on the servers while this step
//! trains.
//!
//! Overlap, exactly: right after a step's rollouts, the batches of the next `async_steps` steps
//! are sent to the servers (in a background thread each), so they are sampled by the weights the
//! servers hold now. Before the servers reload, every batch in flight is waited for, so a batch
//! is never sampled by two policies. A batch used at step `k` was thus sampled by a policy at
//! most `async_steps` versions older than the one it trains (`rollout/policy_lag_max`), and its
//! seeds are the ones it would have had without overlap.

use std::collections::VecDeque;
use std::sync::Arc;
use std::thread::JoinHandle;

use anyhow::{anyhow, Context, Result};
use temper_rollout::remote::{RemoteConfig, RemoteSampler};
use temper_rollout::{Request, Sample};

use super::weight_push::WeightGroup;
use super::Rollouts;
use crate::config::{RolloutBackend, RolloutConfig, WeightSync};
use crate::dist::Dist;
use crate::trainer::learner::Learner;
use std::path::Path;
use tch::Device;

/// The servers, the policy version they hold, and the batches being generated ahead.
pub(crate) struct RolloutServers {
    pub sampler: Arc<RemoteSampler>,
    /// The trainer's `policy_version` at the servers' last reload (0 = the weights they
    /// started with, for `weight_sync = "none"`).
    pub served_version: u64,
    pending: VecDeque<Prefetch>,
    /// `weight_sync = "distributed"`, on the first rank: the group the weights are broadcast in.
    weight_group: Option<WeightGroup>,
}

/// A data batch that was sampled ahead: the example indices kept, the policy version that
/// sampled it, its samples.
pub(crate) struct SentAhead {
    pub kept: Vec<usize>,
    pub version: u64,
    pub samples: Vec<Sample>,
}

/// One data batch (this rank's share) sent ahead.
struct Prefetch {
    batch: usize,
    version: u64,
    kept: Vec<usize>,
    samples: Generation,
}

enum Generation {
    Running(JoinHandle<Result<Vec<Sample>>>),
    Done(Result<Vec<Sample>>),
}

impl Generation {
    fn wait(self) -> Result<Vec<Sample>> {
        match self {
            Generation::Running(h) => h
                .join()
                .map_err(|_| anyhow!("a rollout prefetch thread panicked"))?,
            Generation::Done(r) => r,
        }
    }
}

impl RolloutServers {
    /// Connects to `rollout.base_urls` with the configured protocol; with `weight_sync =
    /// "distributed"` and `weights_on` (the first rank's device) forms the weight update group.
    pub fn connect(r: &RolloutConfig, vocab_size: i64, weights_on: Option<Device>) -> Result<Self> {
        let sampler = RemoteSampler::connect(RemoteConfig {
            protocol: r
                .backend
                .protocol()
                .context("rollout.backend = \"local\" has no servers")?,
            base_urls: r.base_urls.clone(),
            timeout: std::time::Duration::from_secs(r.request_timeout_s.max(1)),
            vllm_reload_method: r.vllm_reload_method.clone(),
            vocab_size: Some(vocab_size),
        })
        .context("rollout.base_urls")?;
        let weight_group = match (r.weight_sync, weights_on) {
            (WeightSync::Distributed, Some(device)) => Some(WeightGroup::create(
                &sampler,
                &r.weight_group_address,
                device,
                r.weight_group_backend,
            )?),
            _ => None,
        };
        Ok(Self {
            sampler: Arc::new(sampler),
            served_version: 0,
            pending: VecDeque::new(),
            weight_group,
        })
    }

    /// Waits for every batch in flight (before the servers change weights).
    pub fn drain(&mut self) {
        for p in &mut self.pending {
            if let Generation::Running(_) = p.samples {
                let running = std::mem::replace(&mut p.samples, Generation::Done(Ok(vec![])));
                p.samples = Generation::Done(running.wait());
            }
        }
    }

    /// Data batch `batch` if it was sent ahead, with its samples (waited for).
    pub fn take_ahead(&mut self, batch: usize) -> Option<Result<SentAhead>> {
        let at = self.pending.iter().position(|p| p.batch == batch)?;
        let p = self.pending.remove(at)?;
        let samples = p
            .samples
            .wait()
            .with_context(|| format!("rollouts of data batch {batch} (generated ahead)"));
        Some(samples.map(|samples| SentAhead {
            kept: p.kept,
            version: p.version,
            samples,
        }))
    }

    /// Whether data batch `batch` was sent ahead and not yet taken.
    pub fn has_pending(&self, batch: usize) -> bool {
        self.pending.iter().any(|p| p.batch == batch)
    }

    /// Sends data batch `batch` (this rank's kept example indices and requests) to the servers
    /// on a thread of its own, sampled by the weights they hold now.
    pub fn send_ahead(
        &mut self,
        batch: usize,
        kept: Vec<usize>,
        requests: Vec<Request>,
    ) -> Result<()> {
        let sampler = Arc::clone(&self.sampler);
        let handle = std::thread::Builder::new()
            .name(format!("rollout-batch-{batch}"))
            .spawn(move || sampler.generate(&requests))?;
        self.pending.push_back(Prefetch {
            batch,
            version: self.served_version,
            kept,
            samples: Generation::Running(handle),
        });
        Ok(())
    }

    /// Drops what is in flight (at the end of a fit), after waiting for it.
    pub fn finish(&mut self) {
        self.drain();
        self.pending.clear();
    }
}

/// When [`Rollouts::sync`] hands new weights to the rollout servers.
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum ServersSync {
    /// Every `rollout.sync_every` policy versions (after an optimizer step).
    Every,
    /// Now, whatever the version (the run's start: the servers take the trainer's weights).
    Now,
}

/// What a [`Rollouts::sync`] did.
pub(crate) struct Synced {
    /// The servers got the weights (the step's `timing_s/weight_sync`).
    pub servers: bool,
    /// Seconds the handover itself took (`timing_s/weight_push`): the broadcast of
    /// `weight_sync = "distributed"`, or the snapshot queued for the sampler thread.
    pub push_s: Option<f64>,
}

impl Rollouts {
    /// New weights (the learner's, policy `version`) to every sampler: the `rollout.device`
    /// copy, the in-process sampler thread (a snapshot queued behind what it was sent), and
    /// with `weight_sync = "disk"` or `"distributed"` the servers, when `when` says so: after
    /// the batches in flight are done, written atomically to `<run_root>/rollout_weights` and
    /// reloaded, or broadcast over the weight update group (LoRA merged). Data-parallel, every
    /// rank calls it (the gathers and barriers are collectives); rank 0 talks to the servers.
    pub(crate) fn sync(
        &mut self,
        learner: &Learner,
        dist: &Dist,
        run_root: &Path,
        version: u64,
        when: ServersSync,
    ) -> Result<Synced> {
        // Sharded, both copies are made a decoder layer at a time as every rank gathers it.
        if let Some(copy) = &self.sampler_model {
            super::copy_weights(learner.model(), copy)?;
            learner.optimizer().check()?;
        }
        let mut push_s = None;
        if let Some(a) = self.ahead.as_mut() {
            let loaded = a.load(learner.model(), version);
            learner.optimizer().check()?;
            push_s = Some(loaded?);
        }
        let due = match when {
            ServersSync::Every => version.is_multiple_of(self.cfg.sync_every as u64),
            ServersSync::Now => true,
        };
        let hands_over = self.cfg.weight_sync != WeightSync::None && due;
        let Some(r) = self.servers.as_mut().filter(|_| hands_over) else {
            return Ok(Synced {
                servers: false,
                push_s,
            });
        };
        // Data-parallel: every rank's batches in flight are done before rank 0 has the servers
        // reload, and every rank waits for the reload before it samples again.
        r.drain();
        dist.barrier()?;
        // Sharded, a folder is written, or the weights broadcast, a decoder layer at a time
        // while every rank gathers that layer (as checkpoints are); a LoRA run's adapters take
        // every layer gathered whole.
        let by_layer = learner.optimizer().is_sharded() && learner.model().lora_config().is_none();
        if !by_layer {
            learner.optimizer().hold_whole()?;
        }
        if dist.is_root() {
            match r.weight_group.as_mut() {
                Some(group) if by_layer => {
                    let pushed = group.push_by_part(&r.sampler, learner.model(), version)?;
                    learner.optimizer().check()?;
                    push_s = Some(pushed);
                }
                Some(group) => {
                    let weights = learner.model().merged_parameters();
                    push_s = Some(group.push(&r.sampler, &weights, version)?);
                }
                None => {
                    let dir = run_root.join("rollout_weights");
                    match by_layer {
                        // A gather that failed wrote zeros: the servers do not load them.
                        true => learner
                            .model()
                            .save_by_layer(&dir)
                            .and_then(|()| learner.optimizer().check())?,
                        false => learner.model().save(&dir)?,
                    }
                    r.sampler
                        .reload(&dir, version)
                        .context("rollout.weight_sync = \"disk\"")?;
                }
            }
        } else if by_layer {
            learner.model().sweep_layers();
            learner.optimizer().check()?;
        }
        learner.optimizer().let_go();
        dist.barrier()?;
        r.served_version = version;
        Ok(Synced {
            servers: true,
            push_s,
        })
    }
}

/// `run_metadata.json`'s `rollout_backend`: where rollouts come from and which distribution
/// their logprobs are from.
pub(crate) fn metadata(rollout: &RolloutConfig, r: &RolloutServers) -> serde_json::Value {
    let logprobs = match rollout.backend {
        RolloutBackend::Vllm => {
            "vLLM: after temperature only when the server runs with --logprobs-mode processed_logprobs \
             (its default raw_logprobs is before temperature)"
        }
        RolloutBackend::Sglang => "SGLang: after temperature, before top-k/top-p (its default)",
        _ => "as the server returns them (temper serve: after temperature, as the in-process engine)",
    };
    serde_json::json!({
        "backend": rollout.backend, "base_urls": rollout.base_urls,
        "served_model": r.sampler.model_name(), "weight_sync": rollout.weight_sync,
        "sync_every": rollout.sync_every, "async_steps": rollout.async_steps,
        "logprobs": logprobs,
    })
}
