//! The run configuration: verl-style sections, typed, with verl's defaults where verl has one.
//!
//! A config is assembled from a TOML file plus dotted overrides (see [`load`]); every key is checked
//! against the schema below (the serialized [`Config::default`]), so a typo is an error with a
//! did-you-mean, never a silently ignored setting.
mod checks;
pub mod choices;
mod env;
mod load;
mod rollout;
mod sweep;
pub mod verl_keys;

pub use choices::{
    AnswerExtract, GroupMetric, Logger, ModelDtype, OnError, RolloutBackend, Strategy,
    TrainerDevice, Truncation, WeightGroupBackend, WeightSync,
};
pub use env::EnvConfig;
pub use load::{
    classify_key, load_config, load_config_str, parse_hydra_override, parse_override, ConfigSource,
    HydraOp, HydraOverride, KeyClass, Loaded,
};
pub use rollout::{parse_device, RolloutConfig};
pub use sweep::{expand_sweeps, SweepRun};

use serde::{Deserialize, Serialize};
use temper_algo::{AdvEstimator, AggMode, CorrectionLevel, KlType, PolicyLossMode};

/// The whole run: one struct per verl section.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub model: ModelConfig,
    pub data: DataConfig,
    pub actor: ActorConfig,
    pub rollout: RolloutConfig,
    pub algorithm: AlgorithmConfig,
    pub reward: RewardConfig,
    pub trainer: TrainerConfig,
    pub eval: EvalConfig,
    pub env: EnvConfig,
}

/// `model`: what to train (verl's `actor_rollout_ref.model`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ModelConfig {
    /// A Hugging Face folder, a name known to `temper_model::resolve` (e.g. `smollm2`), or
    /// `random:<config.json>` for a randomly initialised model of that shape (tests).
    pub path: String,
    /// Tokenizer folder when it differs from `path`.
    pub tokenizer_path: Option<String>,
    /// Compute dtype of the forward passes: `float32`, `bfloat16` (master weights stay f32), or
    /// `auto` (bf16 where its matmuls are native: CUDA, CPUs with AVX-512; else f32).
    pub dtype: ModelDtype,
    /// Seed of the random initialisation for `random:` models.
    pub init_seed: u64,
    /// LoRA rank (verl's `actor_rollout_ref.model.lora_rank`); 0 trains every weight.
    pub lora_rank: usize,
    /// LoRA alpha: the adapter's output is scaled by `lora_alpha / lora_rank`.
    pub lora_alpha: f64,
    /// Linears that get adapters: `q_proj`, ..., `down_proj`, or `all-linear` (verl's default).
    pub target_modules: Vec<String>,
    /// The update's and the log-prob passes' forwards run packed rows (verl's
    /// `use_remove_padding`): a micro-batch's sequences side by side instead of each padded to the
    /// batch's longest prompt and response. The same numbers to float rounding, less time.
    pub use_remove_padding: bool,
}

impl Default for ModelConfig {
    fn default() -> Self {
        Self {
            path: String::new(),
            tokenizer_path: None,
            dtype: ModelDtype::Float32,
            init_seed: 0,
            lora_rank: 0,
            lora_alpha: 16.0,
            target_modules: vec!["all-linear".into()],
            use_remove_padding: true,
        }
    }
}

impl ModelConfig {
    /// The LoRA adapters this config asks for (`lora_rank` > 0), unchecked (see
    /// [`temper_model::LoraConfig::targets`]).
    pub fn lora(&self) -> Option<temper_model::LoraConfig> {
        (self.lora_rank > 0).then(|| temper_model::LoraConfig {
            rank: self.lora_rank as i64,
            alpha: self.lora_alpha,
            target_modules: self.target_modules.clone(),
        })
    }
}

/// `data`: prompts and answers (verl's `data`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct DataConfig {
    /// JSONL or Parquet files (a string or a list). Empty when `task` is set.
    #[serde(deserialize_with = "one_or_many")]
    pub train_files: Vec<String>,
    #[serde(deserialize_with = "one_or_many")]
    pub val_files: Vec<String>,
    /// Field holding the prompt: a string, or a list of chat messages `{role, content}` (verl).
    /// Dots address nested fields (`extra_info.question`).
    pub prompt_key: String,
    /// Field holding the ground truth (dots address nested fields, e.g. `reward_model.ground_truth`).
    pub answer_key: String,
    /// How the ground truth is read from the answer field: `none` or `gsm8k` (text after `####`).
    pub answer_extract: AnswerExtract,
    /// How prompt text becomes model input: `chat` (the tokenizer's chat template), `r1_zero`
    /// (the R1-Zero text template), `raw`, or a custom template containing `{prompt}`.
    pub prompt_template: String,
    /// System message for `chat` templates.
    pub system_prompt: Option<String>,
    /// A procedural task from temper-reward instead of files (e.g. `arithmetic`).
    pub task: Option<String>,
    /// Task parameters, passed through to the task generator.
    pub task_args: toml::Table,
    /// Number of generated examples for `task` datasets.
    pub task_train_size: usize,
    pub task_val_size: usize,
    pub max_prompt_length: usize,
    pub max_response_length: usize,
    /// Prompts per rollout step (each sampled `rollout.n` times).
    pub train_batch_size: usize,
    pub shuffle: bool,
    /// Seed of the data order; defaults to `trainer.seed`.
    pub seed: Option<u64>,
    /// Drop prompts longer than `max_prompt_length` instead of applying `truncation`.
    pub filter_overlong_prompts: bool,
    /// `error`, `left` or `right`: what to do with a prompt longer than `max_prompt_length`.
    pub truncation: Truncation,
}

impl Default for DataConfig {
    fn default() -> Self {
        Self {
            train_files: vec![],
            val_files: vec![],
            prompt_key: "prompt".into(),
            answer_key: "answer".into(),
            answer_extract: AnswerExtract::None,
            prompt_template: "chat".into(),
            system_prompt: None,
            task: None,
            task_args: toml::Table::new(),
            task_train_size: 10_000,
            task_val_size: 200,
            max_prompt_length: 512,
            max_response_length: 512,
            train_batch_size: 1024,
            shuffle: true,
            seed: None,
            filter_overlong_prompts: false,
            truncation: Truncation::Error,
        }
    }
}

/// `actor`: the policy update (verl's `actor_rollout_ref.actor`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ActorConfig {
    /// Prompts per optimizer step, as verl counts it (the step sees `ppo_mini_batch_size * n` responses).
    pub ppo_mini_batch_size: usize,
    /// Responses per forward/backward (gradient accumulation); `None` = the whole mini-batch.
    pub ppo_micro_batch_size_per_gpu: Option<usize>,
    /// Passes over each rollout batch (CS336 `epochs_per_rollout_batch`).
    pub ppo_epochs: usize,
    /// Shuffle responses between mini-batches on every epoch.
    pub shuffle: bool,
    /// Run each distinct prompt of a micro-batch once and let its responses attend to its keys and
    /// values (same numbers and gradients as full rows, to float rounding; much less work when
    /// `rollout.n` samples share a prompt). Also for the old and reference log-prob passes.
    pub shared_prefix: bool,
    /// Tokens whose logits are computed at a time (the unembedding runs chunk by chunk in the
    /// update and the old / reference passes, so at most one chunk of (tokens, vocabulary)
    /// logits exists at once; the gradients are exact). Unset: the model's
    /// (`CausalLm::default_unembed_chunk`: 1,024 tokens where the head runs a block of the
    /// vocabulary at a time; with LoRA on the head, by the vocabulary: 256 for SmolLM2's, 82 for
    /// Qwen2.5's).
    pub unembed_chunk: Option<usize>,
    /// Activation checkpointing per decoder layer: the update keeps each layer's input only and
    /// runs the layer again in the backward (less memory, about one more forward of time; the
    /// same gradients to float rounding). verl's `model.enable_gradient_checkpointing`.
    pub gradient_checkpointing: bool,
    /// Whether the backward hands freed activation memory back to the kernel as it leaves each
    /// layer, once 256 MiB have gathered (CPU, glibc): less peak memory, some time for the page
    /// faults. Unset: on for models of 300M parameters or more, where it costs nothing measurable
    /// (`temper_model::TRIM_HEAP_MIN_PARAMS`). Off, the trainer keeps what each step frees in
    /// the heap for the next one instead (`temper_kernels::memory::keep_freed_memory_for_reuse`):
    /// fewer page faults, a resident size that stays near the peak. The numbers computed do not
    /// change.
    pub trim_heap: Option<bool>,
    /// Max global grad norm (clip_grad_norm_); <= 0 disables clipping.
    pub grad_clip: f64,
    pub clip_ratio: f64,
    pub clip_ratio_low: Option<f64>,
    pub clip_ratio_high: Option<f64>,
    /// Dual-clip bound; `None` disables dual clip.
    pub clip_ratio_c: Option<f64>,
    /// SAPO's gate temperatures for positive and negative advantages (verl's names, defaults).
    pub tau_pos: f64,
    pub tau_neg: f64,
    /// `beta` of `loss_mode = "tinker_dro"`.
    pub dro_beta: f64,
    pub loss_agg_mode: AggMode,
    /// `S` of `seq-mean-token-sum-norm`; `None` = `data.max_response_length`.
    pub loss_scale_factor: Option<f64>,
    pub entropy_coeff: f64,
    pub use_kl_loss: bool,
    pub kl_loss_coef: f64,
    pub kl_loss_type: KlType,
    pub policy_loss: PolicyLossConfig,
    pub optim: OptimConfig,
    /// `dp` (every rank holds the whole optimizer state) or `fsdp` (sharded over the ranks;
    /// docs/scaling.md). With one rank both are the same run.
    pub strategy: Strategy,
    /// How `strategy = "fsdp"` holds what it shards (verl's `fsdp_config` keys).
    pub fsdp_config: FsdpConfig,
}

/// `actor.fsdp_config`: verl's keys that temper's sharded strategy honours (the others are
/// accepted and ignored, each with its reason).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct FsdpConfig {
    /// The AdamW moments and the f32 master shards live in host memory and the optimizer step
    /// runs on the host's threads (on a CPU run they are there already).
    pub optimizer_offload: bool,
    /// verl's switch for the parameters' shards; temper keeps the f32 master shards with the
    /// optimizer, so this offloads them with it.
    pub param_offload: bool,
    /// verl's ZeRO-3 switch (free a unit's gathered weights after its forward).
    pub reshard_after_forward: bool,
}

impl Default for FsdpConfig {
    fn default() -> Self {
        Self {
            optimizer_offload: false,
            param_offload: false,
            reshard_after_forward: true,
        }
    }
}

impl ActorConfig {
    /// Tokens per chunk of logits: `actor.unembed_chunk`, or when unset `default` (the model's,
    /// `CausalLm::default_unembed_chunk`).
    pub fn unembed_chunk_or(&self, default: i64) -> i64 {
        self.unembed_chunk.map_or(default, |c| c as i64)
    }
}

impl Default for ActorConfig {
    fn default() -> Self {
        Self {
            ppo_mini_batch_size: 256,
            ppo_micro_batch_size_per_gpu: None,
            ppo_epochs: 1,
            shuffle: false,
            shared_prefix: true,
            unembed_chunk: None,
            gradient_checkpointing: false,
            trim_heap: None,
            grad_clip: 1.0,
            clip_ratio: 0.2,
            clip_ratio_low: None,
            clip_ratio_high: None,
            clip_ratio_c: Some(3.0),
            tau_pos: 1.0,
            tau_neg: 1.05,
            dro_beta: temper_algo::policy_loss::DRO_DEFAULT_BETA,
            loss_agg_mode: AggMode::TokenMean,
            loss_scale_factor: None,
            entropy_coeff: 0.0,
            use_kl_loss: false,
            kl_loss_coef: 0.001,
            kl_loss_type: "low_var_kl".parse().expect("a known KL name"),
            policy_loss: PolicyLossConfig::default(),
            optim: OptimConfig::default(),
            strategy: Strategy::Dp,
            fsdp_config: FsdpConfig::default(),
        }
    }
}

impl ActorConfig {
    pub fn clip_low(&self) -> f64 {
        self.clip_ratio_low.unwrap_or(self.clip_ratio)
    }
    pub fn clip_high(&self) -> f64 {
        self.clip_ratio_high.unwrap_or(self.clip_ratio)
    }
}

/// `actor.policy_loss`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyLossConfig {
    /// verl name: `vanilla`, `cispo`, `gspo`, `geo_mean`, `sapo`, `gpg`, `no_baseline`, ...
    pub loss_mode: PolicyLossMode,
}

impl Default for PolicyLossConfig {
    fn default() -> Self {
        Self {
            loss_mode: PolicyLossMode::Vanilla,
        }
    }
}

/// `actor.optim`: AdamW and its learning-rate schedule (verl's names and defaults).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct OptimConfig {
    pub lr: f64,
    pub betas: [f64; 2],
    pub eps: f64,
    pub weight_decay: f64,
    /// Warmup steps; negative = use `lr_warmup_steps_ratio`.
    pub lr_warmup_steps: i64,
    pub lr_warmup_steps_ratio: f64,
    /// `constant` or `cosine` (verl's `warmup_style` is an alias).
    pub lr_scheduler_type: crate::optim::ScheduleKind,
    pub min_lr_ratio: f64,
    pub num_cycles: f64,
    /// PyTorch's fused AdamW kernel (`torch.optim.AdamW(fused=True)`, TRL's default
    /// `adamw_torch_fused`): one call per step for every parameter. `false`: the single-tensor
    /// loop (`foreach=False`, PyTorch's default on the CPU), bitwise equal to that instead.
    pub fused: bool,
}

impl Default for OptimConfig {
    fn default() -> Self {
        Self {
            lr: 1e-6,
            betas: [0.9, 0.999],
            eps: 1e-8,
            weight_decay: 0.01,
            lr_warmup_steps: -1,
            lr_warmup_steps_ratio: 0.0,
            lr_scheduler_type: crate::optim::ScheduleKind::Constant,
            min_lr_ratio: 0.0,
            num_cycles: 0.5,
            fused: true,
        }
    }
}

/// `algorithm`: advantages, KL in reward, DAPO filtering, rollout correction (verl's `algorithm`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct AlgorithmConfig {
    pub adv_estimator: AdvEstimator,
    pub norm_adv_by_std_in_grpo: bool,
    /// eps of the grpo std normalisation (CS336 `advantage_eps`).
    pub advantage_eps: f64,
    pub gamma: f64,
    pub lam: f64,
    pub use_kl_in_reward: bool,
    pub kl_penalty: KlType,
    pub kl_ctrl: temper_algo::KlCtrlConfig,
    pub filter_groups: FilterGroupsConfig,
    pub rollout_correction: RolloutCorrectionConfig,
}

impl Default for AlgorithmConfig {
    fn default() -> Self {
        Self {
            adv_estimator: AdvEstimator::Grpo,
            norm_adv_by_std_in_grpo: true,
            advantage_eps: 1e-6,
            gamma: 1.0,
            lam: 1.0,
            use_kl_in_reward: false,
            kl_penalty: "kl".parse().expect("a known KL name"),
            kl_ctrl: temper_algo::KlCtrlConfig::default(),
            filter_groups: FilterGroupsConfig::default(),
            rollout_correction: RolloutCorrectionConfig::default(),
        }
    }
}

/// `algorithm.filter_groups`: DAPO dynamic sampling (drop groups whose rewards are all equal).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct FilterGroupsConfig {
    pub enable: bool,
    /// What must vary within a group for it to be kept (verl's names): `acc` is the reward
    /// before the overlong penalty; `score`, `seq_reward` and `seq_final_reward` the reward
    /// with it.
    pub metric: GroupMetric,
    /// Most generation rounds per step to fill the batch with useful groups; 0 = up to 100.
    pub max_num_gen_batches: usize,
}

impl Default for FilterGroupsConfig {
    fn default() -> Self {
        Self {
            enable: false,
            metric: GroupMetric::Acc,
            max_num_gen_batches: 0,
        }
    }
}

/// `algorithm.rollout_correction`: truncated importance sampling against the sampler's logprobs.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct RolloutCorrectionConfig {
    /// `token` or `sequence`; `None` = off.
    pub rollout_is: Option<CorrectionLevel>,
    pub rollout_is_threshold: f64,
    /// A weight above the threshold: `truncate` (verl) or `drop` (AReaL's
    /// `behav_imp_weight_cap`).
    pub rollout_is_cap: temper_algo::IsCap,
    /// `token` or `sequence` rejection sampling; `None` = off.
    pub rollout_rs: Option<CorrectionLevel>,
    pub rollout_rs_threshold: f64,
    /// Use the rollout engine's logprobs as `old` (no recompute).
    pub bypass_mode: bool,
}

impl Default for RolloutCorrectionConfig {
    fn default() -> Self {
        Self {
            rollout_is: None,
            rollout_is_threshold: 2.0,
            rollout_is_cap: temper_algo::IsCap::Truncate,
            rollout_rs: None,
            rollout_rs_threshold: 2.0,
            bypass_mode: false,
        }
    }
}

/// `reward`: which grader scores responses.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct RewardConfig {
    /// A name known to `temper_reward::reward_by_name` (e.g. `r1_zero`, `arithmetic`).
    pub name: String,
    /// Passed through to the reward.
    pub kwargs: toml::Table,
    /// What a crashing reward does: `fail` (stop the run) or `zero` (score 0, counted in
    /// `reward/errors`).
    pub on_error: OnError,
    /// DAPO's soft overlong punishment (verl's `reward_model.overlong_buffer`).
    pub overlong_buffer: OverlongBufferConfig,
}

/// `reward.overlong_buffer`: DAPO's length penalty, added to the reward of every response longer
/// than `max_resp_len - len` tokens: `min(-(length - (max_resp_len - len)) / len *
/// penalty_factor, 0)` (verl's DAPORewardManager; the length counts the end token).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct OverlongBufferConfig {
    pub enable: bool,
    /// Tokens before `max_resp_len` where the penalty grows from 0 to `penalty_factor`.
    pub len: usize,
    pub penalty_factor: f64,
    /// Also report `reward/overlong_reward` and `reward/overlong` (the share penalised).
    pub log: bool,
    /// verl's `reward_kwargs.max_resp_len`; `None` = `data.max_response_length`.
    pub max_resp_len: Option<usize>,
}

impl OverlongBufferConfig {
    /// The penalty of a response of `length` tokens (0 when off), given `data.max_response_length`.
    pub fn penalty(&self, length: usize, max_response_length: usize) -> f64 {
        if !self.enable {
            return 0.0;
        }
        let max = self.max_resp_len.unwrap_or(max_response_length) as f64;
        let expected = max - self.len as f64;
        let exceed = length as f64 - expected;
        (-exceed / self.len as f64 * self.penalty_factor).min(0.0)
    }
}

impl Default for RewardConfig {
    fn default() -> Self {
        Self {
            name: "r1_zero".into(),
            kwargs: toml::Table::new(),
            on_error: OnError::Fail,
            overlong_buffer: OverlongBufferConfig::default(),
        }
    }
}

/// `trainer`: loop length, saving, evaluation, run directory (verl's `trainer` + temper's keys).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct TrainerConfig {
    pub total_epochs: usize,
    /// Overrides `total_epochs` when set.
    pub total_training_steps: Option<usize>,
    /// Checkpoint every this many steps (and at the end); <= 0 = only at the end.
    pub save_freq: i64,
    /// Evaluate every this many steps (and at the end); <= 0 = never.
    pub test_freq: i64,
    pub val_before_train: bool,
    pub project_name: String,
    /// Run folder name under `default_local_dir`; empty = `<config stem>-<UTC time>`.
    pub experiment_name: String,
    pub default_local_dir: String,
    /// Assert `actor/ppo_kl == 0` and `actor/pg_clipfrac == 0` exactly at the first update of
    /// every rollout batch (old logprobs are recomputed with the weights that sampled).
    pub check_on_policy: bool,
    /// Refuse to start (on CPU) when the first step's estimated peak memory exceeds what the
    /// machine has available (the estimate is printed either way).
    pub check_memory: bool,
    /// Keep only this many checkpoints (oldest deleted); `None` keeps all.
    pub max_ckpt_to_keep: Option<usize>,
    pub seed: u64,
    /// Torch intra-op threads; `None` = libtorch's default.
    pub threads: Option<usize>,
    /// `cpu`, `cuda` or `auto`.
    pub device: TrainerDevice,
    /// Rollouts written to `rollouts/step_<k>.jsonl` every this many steps; <= 0 = never.
    pub rollout_log_freq: i64,
    /// Show the progress bar (off when stderr is not a terminal).
    pub progress: bool,
    /// Where metrics go besides metrics.jsonl (verl's key and names): `console` (the progress
    /// line), `tensorboard` (event files in `<run>/tensorboard/`), `wandb` (an offline W&B run in
    /// `<run>/wandb/`).
    pub logger: Vec<Logger>,
}

impl Default for TrainerConfig {
    fn default() -> Self {
        Self {
            total_epochs: 30,
            total_training_steps: None,
            save_freq: -1,
            test_freq: -1,
            val_before_train: true,
            project_name: "temper".into(),
            experiment_name: String::new(),
            default_local_dir: "runs".into(),
            check_on_policy: false,
            check_memory: true,
            max_ckpt_to_keep: None,
            seed: 42,
            threads: None,
            device: TrainerDevice::Cpu,
            rollout_log_freq: 1,
            progress: true,
            logger: vec![Logger::Console],
        }
    }
}

/// `eval`: held-out evaluation (verl's `actor_rollout_ref.rollout.val_kwargs` + temper's keys).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct EvalConfig {
    /// Samples per prompt (pass@k and mean@k use them).
    pub n: usize,
    pub temperature: f64,
    pub top_p: f64,
    pub top_k: i64,
    pub do_sample: bool,
    /// Use at most this many held-out prompts; `None` = all.
    pub max_prompts: Option<usize>,
}

impl Default for EvalConfig {
    fn default() -> Self {
        Self {
            n: 1,
            temperature: 0.0,
            top_p: 1.0,
            top_k: -1,
            do_sample: false,
            max_prompts: None,
        }
    }
}

impl EvalConfig {
    /// The one conversion of the section into the sampler's parameters: greedy unless
    /// `do_sample`, with `max_tokens` and `stop` (`data.max_response_length`, `rollout.stop`).
    pub fn sampling_params(
        &self,
        max_tokens: usize,
        stop: &[String],
    ) -> temper_rollout::SamplingParams {
        temper_rollout::SamplingParams {
            n: self.n,
            temperature: if self.do_sample {
                self.temperature
            } else {
                0.0
            },
            top_p: self.top_p,
            top_k: self.top_k,
            max_tokens,
            stop: stop.to_vec(),
            ..temper_rollout::SamplingParams::default()
        }
    }
}

/// Accept `x = "a"` as `x = ["a"]` (verl allows both for `train_files`).
fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match OneOrMany::deserialize(d)? {
        OneOrMany::One(s) => vec![s],
        OneOrMany::Many(v) => v,
    })
}
