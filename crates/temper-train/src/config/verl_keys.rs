//! verl keys that temper does not map to a setting of its own: the ones it ignores (each with the
//! reason a warning prints) and the ones it refuses (each with the reason the error gives).
//!
//! Keys are written in temper's spelling after the verl prefixes are rewritten
//! (`actor_rollout_ref.actor.` -> `actor.`, `actor_rollout_ref.rollout.` -> `rollout.`,
//! `actor_rollout_ref.model.` -> `model.`); an entry ending in `.` covers every key under it.
//! docs/training.md lists every entry with its reason (a test keeps the two in step).

/// What temper does with a verl key that is not one of its own settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VerlKeyUse {
    /// Accepted, with a warning giving the reason it has no effect.
    Ignored(&'static str),
    /// An error giving the reason it cannot apply.
    Refused(&'static str),
}

const FSDP: &str = "an FSDP tuning knob without a counterpart: temper's actor.strategy = fsdp \
                    shards per decoder layer and reads only optimizer_offload, param_offload and \
                    reshard_after_forward (docs/scaling.md)";
const MEGATRON: &str = "Megatron parallelism, fusions and offload: temper trains data-parallel on \
                        c10d, every rank holding the whole model";
const MICRO_BATCHING: &str = "micro-batching by token budget or global count changes memory, not \
                              the update: temper's micro-batch is actor.ppo_micro_batch_size_per_gpu";
const ENGINE: &str = "inference-engine memory, parallelism and batching (vLLM/SGLang): temper's \
                      sampler sizes its batches itself; a remote server takes these on its own \
                      command line";
const REF_WORKER: &str = "the reference model is the initial policy, run by the trainer: verl's \
                          reference-worker settings (offload, micro-batches, parallelism) have no \
                          counterpart";
const WORLD: &str =
    "the world size comes from the launcher (torchrun's WORLD_SIZE; docs/scaling.md)";
const DATA_WORKERS: &str = "temper loads data in process, without worker processes";
const RAW_FORMAT: &str = "switches of verl's dataset output format; temper's loader always keeps \
                          the prompt text and its tokens";
const CHUNKED_ENTROPY: &str = "temper always computes log-probs and entropies chunk by chunk \
                               (actor.unembed_chunk)";
const SHM: &str = "shared-memory checkpoint loading; temper reads the checkpoint files directly";
const TEXT_ONLY: &str = "vision-model setting; temper trains text-only models";
const NO_REWARD_MODEL: &str = "temper has no learned reward model: rewards are rule-based \
                               (reward.name) or an external command (reward.name = \"command\", \
                               docs/rewards.md)";
const FULLY_ASYNC: &str =
    "verl's fully-async trainer: temper's overlap is rollout.async_steps (how \
                           many policy versions a batch may lag, in process or on servers; \
                           docs/training.md) and its partial rollouts rollout.partial_rollouts \
                           (in process); staleness counted in samples and parameter-sync \
                           triggers are not implemented";
const NO_COV_LOSSES: &str = "verl's clip_cov and kl_cov losses are not implemented in temper \
                             (actor.policy_loss.loss_mode lists the losses it has)";

/// Keys accepted with a warning.
pub const IGNORED: &[(&str, &str)] = &[
    ("actor_rollout_ref.ref.", REF_WORKER),
    ("actor_rollout_ref.hybrid_engine", "temper's trainer and sampler share one process (or use rollout.backend servers)"),
    ("actor.fsdp_config.", FSDP),
    ("actor.megatron.", MEGATRON),
    ("actor.optim.override_optimizer_config.", MEGATRON),
    ("actor.checkpoint.", "temper's checkpoints always hold the weights, the optimizer and the run's state"),
    ("actor.use_dynamic_bsz", MICRO_BATCHING),
    ("actor.ppo_max_token_len_per_gpu", MICRO_BATCHING),
    ("actor.ppo_micro_batch_size", MICRO_BATCHING),
    ("actor.use_torch_compile", "temper runs no torch.compile graphs"),
    ("actor.ulysses_sequence_parallel_size", "sequence parallelism: temper trains data-parallel"),
    ("actor.entropy_checkpointing", CHUNKED_ENTROPY),
    ("actor.entropy_from_logits_with_chunking", CHUNKED_ENTROPY),
    ("actor.optim.total_training_steps", "verl fills it in from the trainer; temper reads trainer.total_training_steps"),
    ("actor.freeze_vision_tower", TEXT_ONLY),
    ("model.exclude_modules", TEXT_ONLY),
    ("model.use_shm", SHM),
    ("data.use_shm", SHM),
    ("model.trust_remote_code", "temper runs no code from checkpoints; the architectures it knows are built in"),
    ("model.use_fused_kernels", "temper's head is always fused and chunked (actor.unembed_chunk)"),
    ("model.override_config.", "temper reads the model's shape and context length from its config.json"),
    ("model.lora.lora_A_init_method", "temper initialises LoRA's A as PEFT does (Kaiming uniform) and B as zeros"),
    ("rollout.name", "the sampler is temper's own, or the servers named by rollout.backend"),
    ("rollout.mode", "the sampler is temper's own, or the servers named by rollout.backend"),
    ("rollout.gpu_memory_utilization", ENGINE),
    ("rollout.tensor_model_parallel_size", ENGINE),
    ("rollout.data_parallel_size", ENGINE),
    ("rollout.expert_parallel_size", ENGINE),
    ("rollout.max_model_len", ENGINE),
    ("rollout.max_num_batched_tokens", ENGINE),
    ("rollout.enable_chunked_prefill", ENGINE),
    ("rollout.enforce_eager", ENGINE),
    ("rollout.free_cache_engine", ENGINE),
    ("rollout.load_format", ENGINE),
    ("rollout.layered_summon", ENGINE),
    ("rollout.multi_stage_wake_up", ENGINE),
    ("rollout.engine_kwargs.", ENGINE),
    ("rollout.log_prob_micro_batch_size", MICRO_BATCHING),
    ("rollout.log_prob_micro_batch_size_per_gpu", MICRO_BATCHING),
    ("rollout.log_prob_max_token_len_per_gpu", MICRO_BATCHING),
    ("rollout.log_prob_use_dynamic_bsz", MICRO_BATCHING),
    ("rollout.calculate_log_probs", "temper's sampler always returns per-token log-probs"),
    ("data.dataloader_num_workers", DATA_WORKERS),
    ("data.filter_overlong_prompts_workers", DATA_WORKERS),
    ("data.return_raw_chat", RAW_FORMAT),
    ("data.return_raw_input_ids", RAW_FORMAT),
    ("data.return_full_prompt", RAW_FORMAT),
    ("data.tokenizer", "the tokenizer comes from model.path (or model.tokenizer_path)"),
    ("data.reward_fn_key", "the reward is chosen by reward.name, not by a data column"),
    ("data.val_batch_size", "evaluation batches are sized by the sampler"),
    ("data.validation_shuffle", "evaluation prompts are taken in file order"),
    ("data.gen_batch_size", "with algorithm.filter_groups temper generates data.train_batch_size prompts per round until the batch is full, so only the number of rounds differs"),
    ("trainer.nnodes", WORLD),
    ("trainer.n_gpus_per_node", WORLD),
    ("trainer.balance_batch", "balancing sequence lengths across ranks changes speed, not the update"),
    ("trainer.critic_warmup", "temper has no critic: its advantage estimators are the critic-free ones"),
    ("trainer.resume_mode", "a run resumes with `temper train --resume runs/<experiment>`"),
    ("trainer.log_val_generations", "every evaluation completion is written to eval/step_<k>.json"),
    ("trainer.default_hdfs_dir", "runs are written under trainer.default_local_dir only"),
    ("trainer.use_legacy_worker_impl", "a switch between verl's own worker implementations"),
    ("reward_model.use_reward_loop", "a switch of verl's reward workers; temper scores in its own thread pool"),
];

/// Keys refused with an error, unless their value is one of those given (the feature turned off,
/// or temper's behaviour), when they are ignored with the same reason.
pub const REFUSED: &[(&str, &[&str], &str)] = &[
    ("reward_model.enable", &["false"], NO_REWARD_MODEL),
    ("reward_model.model.", &[], NO_REWARD_MODEL),
    ("reward_model.rollout.", &[], NO_REWARD_MODEL),
    ("reward_model.num_workers", &[], NO_REWARD_MODEL),
    ("reward_model.reward_manager", &["naive", "dapo"], "temper scores each response on its own, as verl's naive and dapo managers do (dapo's overlong penalty is reward.overlong_buffer); the batch and prime managers are not implemented"),
    ("async_training.", &[], FULLY_ASYNC),
    ("custom_reward_function.", &[], "verl's Python reward functions do not run in temper: use a built-in reward (reward.name) or an external command (reward.name = \"command\", docs/rewards.md)"),
    ("data.custom_cls.", &[], "a Python dataset class cannot run in temper: give .jsonl, .json or .parquet files (data.prompt_key, data.answer_key)"),
    ("data.sampler.", &[], "a Python curriculum sampler cannot run in temper: prompts are drawn per epoch in (data.shuffle) order"),
    ("data.image_key", &[], "image inputs: temper trains text-only models"),
    ("data.apply_chat_template_kwargs.", &[], "temper's chat template takes no extra variables (such as reasoning_effort)"),
    ("rollout.multi_turn.enable", &["false"], "verl's tool-calling agent loop: temper's multi-turn runs are environments (env.name, docs/environments.md)"),
    ("rollout.multi_turn.", &[], "verl's tool-calling agent loop: temper's multi-turn runs are environments (env.name, docs/environments.md)"),
    ("actor.policy_loss.clip_cov_ratio", &[], NO_COV_LOSSES),
    ("actor.policy_loss.clip_cov_lb", &[], NO_COV_LOSSES),
    ("actor.policy_loss.clip_cov_ub", &[], NO_COV_LOSSES),
    ("actor.policy_loss.kl_cov_ratio", &[], NO_COV_LOSSES),
    ("actor.policy_loss.ppo_kl_coef", &[], NO_COV_LOSSES),
    ("model.lora_adapter_path", &[], "temper starts LoRA adapters from zero: merge a trained adapter into the base checkpoint and give that as model.path"),
    ("algorithm.rollout_correction.loss_type", &["ppo_clip"], "temper's bypass mode trains with the PPO-clip loss of actor.policy_loss; verl's `reinforce` loss type is not implemented"),
    ("algorithm.rollout_correction.rollout_is_batch_normalize", &["false"], "batch-normalised importance weights are not implemented in temper"),
];

/// A value temper refuses for one of its own keys (a verl feature it does not have).
pub struct RefusedValue {
    pub key: &'static str,
    /// How docs/training.md names it.
    pub shown: &'static str,
    pub refuses: fn(&toml::Value) -> bool,
    pub reason: &'static str,
}

fn is(v: &toml::Value, name: &str) -> bool {
    v.as_str() == Some(name)
}

const ONE_RS: &str = "several rejection-sampling criteria at once are not implemented in temper: \
                      give one rollout_rs and one rollout_rs_threshold";

pub const REFUSED_VALUES: &[RefusedValue] = &[
    RefusedValue {
        key: "algorithm.adv_estimator",
        shown: "algorithm.adv_estimator=remax",
        refuses: |v| is(v, "remax"),
        reason: "ReMax's baseline is the reward of one more greedy response per prompt, which \
                 temper does not generate",
    },
    RefusedValue {
        key: "algorithm.adv_estimator",
        shown: "algorithm.adv_estimator=gpg",
        refuses: |v| is(v, "gpg"),
        reason: "GPG's advantage estimator is not implemented in temper (its policy loss is: \
                 actor.policy_loss.loss_mode = \"gpg\")",
    },
    RefusedValue {
        key: "algorithm.rollout_correction.rollout_rs",
        shown: "algorithm.rollout_correction.rollout_rs=a,b",
        refuses: |v| v.as_str().is_some_and(|s| s.contains(',')),
        reason: ONE_RS,
    },
    RefusedValue {
        key: "algorithm.rollout_correction.rollout_rs_threshold",
        shown: "algorithm.rollout_correction.rollout_rs_threshold=a,b",
        refuses: |v| v.is_str(),
        reason: ONE_RS,
    },
];

fn covers(entry: &str, key: &str) -> bool {
    key == entry || (entry.ends_with('.') && key.starts_with(entry))
}

/// A value as its Hydra / TOML text, for comparing with a harmless value.
fn value_text(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => s.clone(),
        v => v.to_string(),
    }
}

/// What temper does with `key` (temper's spelling) set to `value`, if it is one of verl's
/// unmapped keys or a value it refuses; `None` for every other key.
pub fn verl_key_use(key: &str, value: Option<&toml::Value>) -> Option<VerlKeyUse> {
    if let Some(r) = REFUSED_VALUES
        .iter()
        .find(|r| r.key == key && value.is_some_and(|v| (r.refuses)(v)))
    {
        return Some(VerlKeyUse::Refused(r.reason));
    }
    if let Some((_, harmless, reason)) = REFUSED.iter().find(|(e, _, _)| covers(e, key)) {
        let off = match value {
            Some(v) => harmless
                .iter()
                .any(|h| value_text(v).eq_ignore_ascii_case(h)),
            // `null` / `~key`: back to the default, which is off.
            None => !harmless.is_empty(),
        };
        return Some(if off {
            VerlKeyUse::Ignored(reason)
        } else {
            VerlKeyUse::Refused(reason)
        });
    }
    IGNORED
        .iter()
        .find(|(e, _)| covers(e, key))
        .map(|(_, reason)| VerlKeyUse::Ignored(reason))
}
