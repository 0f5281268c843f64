//! `rollout`: sampling of training responses (verl's `actor_rollout_ref.rollout`), in-process or
//! on inference servers.
use serde::{Deserialize, Serialize};

use super::choices::{RolloutBackend, WeightGroupBackend, WeightSync};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct RolloutConfig {
    /// Responses per prompt (the GRPO group size).
    pub n: usize,
    pub temperature: f64,
    pub top_p: f64,
    /// -1 = off.
    pub top_k: i64,
    /// Stop strings; the stop string is kept in the response.
    pub stop: Vec<String>,
    /// EOS and stop strings are ignored until a response has this many tokens.
    pub min_tokens: usize,
    /// Sequences decoded together by the engine.
    pub max_num_seqs: usize,
    /// Where rollouts are sampled: `local` (the in-process engine), `vllm` (vLLM's
    /// `/v1/completions`), `sglang` (SGLang's `/generate`) or `openai` (any OpenAI-compatible
    /// server returning token ids). `temper serve` speaks all three. grail's `vllm_server` and
    /// `sglang_server` are accepted as names for `vllm` and `sglang`.
    pub backend: RolloutBackend,
    /// The servers of a remote backend, e.g. `["http://127.0.0.1:30000"]` (grail's
    /// `generation.base_url` is one of them).
    pub base_urls: Vec<String>,
    /// `disk`: after an optimizer step the weights are written atomically to
    /// `<run>/rollout_weights` and every server reloads them; `distributed`: they are broadcast
    /// over a c10d group the servers join (SGLang's protocol); `none`: the servers keep their own
    /// weights (off-policy, corrected by `algorithm.rollout_correction`).
    pub weight_sync: WeightSync,
    /// With `weight_sync = "disk"` or `"distributed"`: sync after every this many optimizer
    /// steps.
    pub sync_every: usize,
    /// With `weight_sync = "distributed"`: the address of this machine the servers reach the
    /// weight update group's store at (rank 0, the trainer's first rank).
    pub weight_group_address: String,
    /// With `weight_sync = "distributed"`: `auto` (NCCL from a GPU trainer, else Gloo), `gloo` or
    /// `nccl`.
    pub weight_group_backend: WeightGroupBackend,
    /// The `collective_rpc` method vLLM reloads with: `reload_weights`, or the name a worker
    /// extension registers.
    pub vllm_reload_method: String,
    /// Overlap: the next steps' rollouts are generated while this step trains (on the servers,
    /// or in process by a sampler thread with its own copy of the policy), at most this many
    /// policy versions stale. 0 = strictly on-policy.
    pub async_steps: usize,
    /// With `async_steps > 0` in process: new weights reach the sampler between two decode steps
    /// of the batch it is sampling (the answers in flight go on under them, each token
    /// recording the version that drew it), not after the batch (AReaL's partial rollouts).
    pub partial_rollouts: bool,
    /// With `partial_rollouts`: when new weights arrive, the answers in flight recompute their
    /// keys and values under them (prompt and tokens so far, one prefill) before their next
    /// token, instead of going on with the cache the old weights computed.
    pub recompute_kv_after_update: bool,
    /// Intra-op threads of the in-process sampler thread of `async_steps > 0` (unset: libtorch's
    /// default, every core).
    pub threads: Option<usize>,
    /// Seconds a remote rollout request may take before it is retried on another server.
    pub request_timeout_s: u64,
    /// Where the in-process engine samples: `""` (the trainer's model, on `trainer.device`) or a
    /// device of its own (`cpu`, `cuda`, `cuda:N`): a copy of the policy lives there and is
    /// refreshed after every optimizer step (sample on one GPU, train on another, as the CS336
    /// and grail guides do).
    pub device: String,
}

/// The largest `rollout.async_steps`: each step ahead holds a batch in flight.
pub const MAX_ASYNC_STEPS: usize = 8;

impl Default for RolloutConfig {
    fn default() -> Self {
        // The sampling keys default as the sampler's parameters do (vLLM's).
        let sampling = temper_rollout::SamplingParams::default();
        Self {
            n: sampling.n,
            temperature: sampling.temperature,
            top_p: sampling.top_p,
            top_k: sampling.top_k,
            stop: sampling.stop,
            min_tokens: sampling.min_tokens,
            max_num_seqs: 256,
            backend: RolloutBackend::Local,
            base_urls: vec![],
            weight_sync: WeightSync::Disk,
            sync_every: 1,
            weight_group_address: "127.0.0.1".into(),
            weight_group_backend: WeightGroupBackend::Auto,
            vllm_reload_method: "reload_weights".into(),
            async_steps: 0,
            partial_rollouts: false,
            recompute_kv_after_update: false,
            threads: None,
            request_timeout_s: 600,
            device: String::new(),
        }
    }
}

impl RolloutConfig {
    /// The one conversion of the section's sampling settings (verl's names) into the sampler's
    /// parameters, with `max_tokens` (`data.max_response_length`).
    pub fn sampling_params(&self, max_tokens: usize) -> temper_rollout::SamplingParams {
        temper_rollout::SamplingParams {
            n: self.n,
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            max_tokens,
            stop: self.stop.clone(),
            min_tokens: self.min_tokens,
            ..temper_rollout::SamplingParams::default()
        }
    }

    pub fn is_remote(&self) -> bool {
        self.backend != RolloutBackend::Local
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        use anyhow::bail;
        if self.is_remote() && self.base_urls.is_empty() {
            bail!(
                "rollout.backend = {:?} needs rollout.base_urls (e.g. [\"http://127.0.0.1:30000\"])",
                self.backend
            );
        }
        if self.weight_sync == WeightSync::Distributed
            && !matches!(
                self.backend,
                RolloutBackend::Sglang | RolloutBackend::OpenAi
            )
        {
            bail!(
                "rollout.weight_sync = \"distributed\" needs rollout.backend = \"sglang\" or \"openai\" (temper \
                 serve); got {:?} (vLLM servers reload from disk: weight_sync = \"disk\")",
                self.backend.name()
            );
        }
        if self.weight_sync == WeightSync::Distributed
            && self.weight_group_address.trim().is_empty()
        {
            bail!("rollout.weight_group_address is empty (the address the servers reach this machine at)");
        }
        if self.sync_every == 0 {
            bail!("rollout.sync_every = 0: must be at least 1");
        }
        if self.async_steps > MAX_ASYNC_STEPS {
            bail!(
                "rollout.async_steps = {}: expected 0 to {MAX_ASYNC_STEPS} (policy versions a batch may lag)",
                self.async_steps
            );
        }
        if self.partial_rollouts && self.async_steps == 0 {
            bail!(
                "rollout.partial_rollouts = true needs rollout.async_steps >= 1 (without overlap no weights \
                 change while a batch is sampled)"
            );
        }
        if self.recompute_kv_after_update && !self.partial_rollouts {
            bail!(
                "rollout.recompute_kv_after_update = true needs rollout.partial_rollouts = true (only answers \
                 sampled across an update have a cache from older weights)"
            );
        }
        if self.partial_rollouts && self.is_remote() {
            bail!(
                "rollout.partial_rollouts = true with rollout.backend = {:?}: the servers reload their weights \
                 from disk between batches; partial rollouts need the in-process sampler (rollout.backend = \
                 \"local\")",
                self.backend
            );
        }
        if self.threads == Some(0) {
            bail!("rollout.threads = 0: must be at least 1 (or unset)");
        }
        if !self.device.is_empty() {
            parse_device(&self.device)?;
            if self.is_remote() {
                bail!(
                    "rollout.device = {:?} is for the in-process engine; with rollout.backend = {:?} the servers \
                     choose their own devices",
                    self.device,
                    self.backend
                );
            }
        }
        if self.vllm_reload_method.trim().is_empty() {
            bail!("rollout.vllm_reload_method is empty");
        }
        // What the servers would refuse at the first rollout, refused now.
        if let Some(protocol) = self.backend.protocol() {
            temper_rollout::remote::check_for_server(protocol, &self.sampling_params(1)).map_err(
                |e| anyhow::anyhow!("rollout.{e:#} (rollout.backend = {})", self.backend),
            )?;
        }
        Ok(())
    }
}

/// [`temper_base::device::parse_device_for`] of `rollout.device`.
pub fn parse_device(s: &str) -> anyhow::Result<tch::Device> {
    temper_base::device::parse_device_for("rollout.device", s)
}
