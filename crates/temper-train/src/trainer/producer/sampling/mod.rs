//! Where a run's rollouts are sampled, as a part that owns it ([`Rollouts`]): the in-process
//! engine over the policy or its `rollout.device` copy; the sampler thread of
//! `rollout.async_steps` with its own copy (`local_ahead.rs`); or rollout servers
//! (`servers.rs`), their weights pushed over a c10d group (`weight_push.rs`) or a folder. The
//! producer side of a step asks it for samples and sends batches ahead through it; the learner's
//! new weights reach every sampler through [`Rollouts::sync`].
mod local_ahead;
mod servers;
mod weight_push;

use local_ahead::{AheadSpec, LocalAhead};
use servers::RolloutServers;
use servers::SentAhead;
pub(crate) use servers::{ServersSync, Synced};

use crate::config::RolloutConfig;
use crate::trainer::stats::StepMetrics;
use anyhow::{Context, Result};
use temper_model::{CausalLm, Tokenizer};
use temper_rollout::{Engine, EngineConfig, Request, Sample, Sampler};

/// Where a run's rollouts are sampled: on the rollout servers (`rollout.backend` remote), else by
/// the in-process engine with the policy, or with its copy on `rollout.device`.
pub(crate) struct Rollouts {
    /// The rollout servers when `rollout.backend` is remote.
    servers: Option<RolloutServers>,
    /// `rollout.async_steps > 0` in process: the sampler thread generating ahead.
    ahead: Option<LocalAhead>,
    /// `rollout.device`: the policy's copy the in-process engine samples with, refreshed after
    /// every optimizer step (None: the engine uses the policy).
    sampler_model: Option<CausalLm>,
    /// The `rollout` section (engine batch size, weight sync, prefetch, sampling).
    cfg: RolloutConfig,
    /// What the in-process engine's decode steps did since [`Rollouts::take_decode_work`].
    decode_work: std::sync::Mutex<temper_model::DecodeWork>,
}

/// What starting a run's samplers reads besides the `rollout` section.
pub(crate) struct RolloutsSpec<'a> {
    /// The policy's folder (the sampler thread and a `rollout.device` copy load from it).
    pub weights_dir: &'a std::path::Path,
    pub tokenizer_dir: &'a std::path::Path,
    /// The trainer's device and compute dtype.
    pub device: tch::Device,
    pub compute: temper_model::ComputeKind,
    pub eos_ids: &'a [i64],
    /// The policy as loaded, whole (a `rollout.device` copy takes its weights).
    pub policy: &'a CausalLm,
    /// `model.lora_rank > 0`.
    pub lora: bool,
    /// Rank 0 (which writes the servers' weights).
    pub is_root: bool,
}

impl Rollouts {
    /// Starts what `cfg` asks for: the servers of a remote backend, the sampler thread of
    /// `async_steps` in process (with its own copy, on `rollout.device` when set), or the copy
    /// on `rollout.device` the in-process engine samples with.
    pub(super) fn build(cfg: &RolloutConfig, spec: RolloutsSpec<'_>) -> Result<Self> {
        let in_process_async = cfg.async_steps > 0 && !cfg.is_remote();
        if in_process_async && spec.lora {
            anyhow::bail!("rollout.async_steps > 0 with the in-process engine and LoRA (model.lora_rank > 0) is not supported yet");
        }
        // `rollout.device`: where the sampler thread's or the in-process engine's copy lives.
        let own_device = match cfg.device.is_empty() {
            true => None,
            false => Some(crate::config::parse_device(&cfg.device)?),
        };
        let ahead = if in_process_async {
            Some(LocalAhead::start(AheadSpec {
                weights_dir: spec.weights_dir,
                tokenizer_dir: spec.tokenizer_dir,
                device: own_device.unwrap_or(spec.device),
                compute: spec.compute,
                eos_ids: spec.eos_ids.to_vec(),
                max_num_seqs: cfg.max_num_seqs,
                threads: cfg.threads,
                partial_rollouts: cfg.partial_rollouts,
                recompute_kv: cfg.recompute_kv_after_update,
            })?)
        } else {
            None
        };
        let sampler_model = match own_device {
            Some(_) if in_process_async => None,
            None => None,
            Some(d) => {
                if spec.lora {
                    anyhow::bail!(
                        "rollout.device with LoRA (model.lora_rank > 0) is not supported yet"
                    );
                }
                let copy =
                    CausalLm::load(spec.weights_dir, d, spec.compute).with_context(|| {
                        format!(
                            "loading the sampling copy on rollout.device = {:?}",
                            cfg.device
                        )
                    })?;
                copy_weights(spec.policy, &copy)?;
                Some(copy)
            }
        };
        let servers = match cfg.is_remote() {
            true => Some(RolloutServers::connect(
                cfg,
                spec.policy.config().vocab_size,
                spec.is_root.then_some(spec.device),
            )?),
            false => None,
        };
        Ok(Rollouts {
            servers,
            ahead,
            sampler_model,
            cfg: cfg.clone(),
            decode_work: Default::default(),
        })
    }

    /// The `rollout` section.
    pub(super) fn cfg(&self) -> &RolloutConfig {
        &self.cfg
    }

    /// The policy's requests go to rollout servers.
    pub(super) fn is_remote(&self) -> bool {
        self.servers.is_some()
    }

    /// The servers hold policy `version` (they take the trainer's weights and have its
    /// current ones), so they may sample for it.
    pub(super) fn serves_version(&self, version: u64) -> bool {
        self.servers.as_ref().is_some_and(|r| {
            self.cfg.weight_sync != crate::config::WeightSync::None && r.served_version == version
        })
    }

    /// In process, the policy's requests are sampled by the sampler thread's copy
    /// (`rollout.async_steps`), not by the policy.
    pub(super) fn samples_on_thread(&self) -> bool {
        self.ahead.is_some()
    }

    /// Whether data batch `batch` was sent ahead (to the sampler thread or the servers) and not
    /// yet taken.
    pub(super) fn sent_ahead(&self, batch: usize) -> bool {
        match (&self.ahead, &self.servers) {
            (Some(a), _) => a.has_sent(batch),
            (None, Some(r)) => r.has_pending(batch),
            (None, None) => false,
        }
    }

    /// Sends data batch `batch` (this rank's kept example indices and requests, drawing with
    /// `seed`) to be sampled ahead: by the sampler thread, else by the servers; nothing to send
    /// to without either.
    pub(super) fn send_ahead(
        &mut self,
        batch: usize,
        kept: Vec<usize>,
        requests: Vec<Request>,
        seed: u64,
    ) -> Result<()> {
        match (&mut self.ahead, &mut self.servers) {
            (Some(a), _) => a.generate(batch, kept, requests, seed),
            (None, Some(r)) => r.send_ahead(batch, kept, requests),
            (None, None) => Ok(()),
        }
    }

    /// Data batch `batch` if it was sent ahead, with its samples (waited for).
    pub(super) fn take_ahead(&mut self, batch: usize) -> Option<Result<SentAhead>> {
        if let Some(taken) = self.servers.as_mut().and_then(|r| r.take_ahead(batch)) {
            return Some(taken);
        }
        self.ahead.as_mut().and_then(|a| a.take(batch))
    }

    /// What the batches the sampler thread sampled for this step cost (`async/*`; nothing
    /// without the thread, or when it sampled none of them).
    pub(super) fn ahead_metrics(&mut self) -> StepMetrics {
        let mut m = StepMetrics::new();
        let Some(s) = self.ahead.as_mut().map(LocalAhead::take_stats) else {
            return m;
        };
        if s.sampled_s > 0.0 {
            // How much of the sampling the update hid: 1 when the batch was ready.
            m.insert("async/sampler_busy_s".into(), s.sampled_s);
            m.insert("async/learner_wait_s".into(), s.waited_s);
            m.insert(
                "async/hidden_fraction".into(),
                (1.0 - s.waited_s / s.sampled_s).clamp(0.0, 1.0),
            );
            m.insert(
                "async/sampler_tokens_per_s".into(),
                s.tokens as f64 / s.sampled_s,
            );
        }
        m
    }

    /// The end of a fit: what is in flight on the servers is waited for and dropped, what the
    /// sampler thread has not started is skipped.
    pub(super) fn finish(&mut self) {
        if let Some(r) = &mut self.servers {
            r.finish();
        }
        if let Some(a) = &mut self.ahead {
            a.forget();
        }
    }

    /// `run_metadata.json`'s `rollout_backend` (None in process).
    pub(super) fn metadata(&self) -> Option<serde_json::Value> {
        self.servers
            .as_ref()
            .map(|r| servers::metadata(&self.cfg, r))
    }

    /// The weights the in-process engine samples with: the copy on `rollout.device`, else the
    /// policy itself.
    pub(super) fn engine_model<'a>(&'a self, policy: &'a CausalLm) -> &'a CausalLm {
        self.sampler_model.as_ref().unwrap_or(policy)
    }

    /// Runs `f` with the in-process sampler's frozen weights built once
    /// ([`temper_model::CausalLm::with_sampling_weights`]): every engine call inside reuses them
    /// (one policy version, several sampling rounds). With rollout servers there is nothing to
    /// freeze.
    pub(super) fn with_sampling_weights<T>(&self, policy: &CausalLm, f: impl FnOnce() -> T) -> T {
        match &self.servers {
            Some(_) => f(),
            None => self.engine_model(policy).with_sampling_weights(f),
        }
    }

    /// Samples `requests` on the servers (`on_servers`, with a remote backend), else in process
    /// with `policy` (or its `rollout.device` copy), `rollout.max_num_seqs` rows at a time, or,
    /// without `policy`, on the sampler thread with its copy. Every request carries its own
    /// seed, so a server's engine or the thread draws what this one would.
    pub(super) fn sample(
        &self,
        policy: Option<&CausalLm>,
        eos_ids: &[i64],
        tokenizer: &Tokenizer,
        requests: &[Request],
        seed: u64,
        on_servers: bool,
    ) -> Result<Vec<Sample>> {
        if requests.is_empty() {
            return Ok(vec![]);
        }
        let mut engine = None;
        let sampler: &dyn Sampler = match (&self.servers, policy) {
            (Some(r), _) if on_servers => r.sampler.as_ref(),
            (_, Some(policy)) => {
                engine.insert(self.engine(self.engine_model(policy), eos_ids, tokenizer, seed))
            }
            (_, None) => {
                let ahead = self.ahead.as_ref().ok_or_else(|| {
                    anyhow::anyhow!("policy requests without weights or a sampler thread")
                })?;
                return ahead.answer(requests.to_vec(), seed);
            }
        };
        let samples = sampler.sample(requests);
        if let Some(engine) = engine {
            let mut work = self.decode_work.lock().unwrap_or_else(|e| e.into_inner());
            *work = work.plus(engine.decode_work());
        }
        samples
    }

    /// What the in-process engine's decode steps did since the last call (nothing with
    /// servers or the sampler thread).
    pub(super) fn take_decode_work(&self) -> temper_model::DecodeWork {
        std::mem::take(&mut *self.decode_work.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The in-process engine over `model` (the policy, its copy, or a debate's judge),
    /// `rollout.max_num_seqs` rows per batch, drawing with `seed`.
    pub(super) fn engine<'a>(
        &self,
        model: &'a CausalLm,
        eos_ids: &[i64],
        tokenizer: &'a Tokenizer,
        seed: u64,
    ) -> Engine<'a> {
        Engine::new(model, eos_ids.to_vec())
            .with_decoder(tokenizer)
            .with_config(EngineConfig {
                max_batch_rows: self.cfg.max_num_seqs,
                seed,
                ..EngineConfig::default()
            })
    }

    /// The policy version that samples now: the servers' for a remote backend, else the
    /// trainer's own (`trainer_version`).
    pub(super) fn sampling_version(&self, trainer_version: u64) -> u64 {
        match &self.servers {
            Some(r) => r.served_version,
            None => trainer_version,
        }
    }
}

/// Copies every parameter of `from` into `to` (any devices; the same architecture), a part of
/// the model at a time ([`CausalLm::for_each_part`]): with a sharded run's layers one decoder
/// layer is whole at a time, gathered by every rank alike.
fn copy_weights(from: &CausalLm, to: &CausalLm) -> Result<()> {
    let mut dst: std::collections::HashMap<String, tch::Tensor> =
        to.named_parameters().into_iter().collect();
    let expected = dst.len();
    let mut copied = 0;
    from.for_each_part(&mut |params| {
        for (name, value) in params {
            let Some(d) = dst.remove(&name) else {
                anyhow::bail!("the sampling copy has no parameter {name}");
            };
            tch::no_grad(|| d.shallow_clone().copy_(&value));
            copied += 1;
        }
        Ok(())
    })?;
    anyhow::ensure!(
        copied == expected,
        "the sampling copy has {expected} parameters, the policy {copied}"
    );
    Ok(())
}
