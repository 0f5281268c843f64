//! The config's choices of a fixed list, as enums parsed when the config loads (an unknown name
//! is an error naming the key and every known name; aliases are accepted and written back under
//! their canonical name). The algorithm's own choices (`loss_mode`, `loss_agg_mode`,
//! `adv_estimator`, the KL types and controller, the rollout-correction levels) are temper-algo's
//! enums, used as they are.

use temper_algo::named_enum;
use temper_rollout::remote::Protocol;

named_enum! {
    /// `model.dtype`: what the model computes in (`auto` decides when the run starts).
    #[derive(Default)]
    pub enum ModelDtype ("model dtype") {
        #[default]
        Float32 => "float32",
        Bfloat16 => "bfloat16",
        Auto => "auto",
    }
}

/// The one conversion of `model.dtype` into what temper-model resolves on a device.
impl From<ModelDtype> for temper_model::DtypeRequest {
    fn from(d: ModelDtype) -> Self {
        match d {
            ModelDtype::Float32 => temper_model::DtypeRequest::Float32,
            ModelDtype::Bfloat16 => temper_model::DtypeRequest::Bfloat16,
            ModelDtype::Auto => temper_model::DtypeRequest::Auto,
        }
    }
}

named_enum! {
    /// `data.truncation`: what a prompt longer than `data.max_prompt_length` gets.
    #[derive(Default)]
    pub enum Truncation ("truncation") {
        #[default]
        Error => "error",
        Left => "left",
        Right => "right",
    }
}

named_enum! {
    /// `data.answer_extract`: how a file's answer column becomes the gold answer.
    #[derive(Default)]
    pub enum AnswerExtract ("answer_extract") {
        #[default]
        None => "none",
        /// The text after GSM8K's `#### `.
        Gsm8k => "gsm8k",
    }
}

named_enum! {
    /// `algorithm.filter_groups.metric`: the score whose spread keeps a group (DAPO).
    #[derive(Default)]
    pub enum GroupMetric ("filter_groups metric") {
        #[default]
        Acc => "acc",
        Score => "score",
        SeqReward => "seq_reward",
        SeqFinalReward => "seq_final_reward",
    }
}

named_enum! {
    /// `reward.on_error`: what a crashing reward does.
    #[derive(Default)]
    pub enum OnError ("on_error") {
        #[default]
        Fail => "fail",
        Zero => "zero",
    }
}

named_enum! {
    /// `trainer.device`.
    #[derive(Default)]
    pub enum TrainerDevice ("trainer device") {
        #[default]
        Cpu => "cpu",
        Cuda => "cuda",
        /// CUDA when libtorch sees a GPU, else the CPU.
        Auto => "auto",
    }
}

named_enum! {
    /// `rollout.backend`: where rollouts are sampled (grail's `vllm_server` and `sglang_server`
    /// name vLLM and SGLang).
    #[derive(Default)]
    pub enum RolloutBackend ("rollout backend") {
        #[default]
        Local => "local",
        Vllm => "vllm" | "vllm_server",
        Sglang => "sglang" | "sglang_server",
        OpenAi => "openai",
    }
}

impl RolloutBackend {
    /// The servers' protocol; `None` for the in-process engine.
    pub fn protocol(self) -> Option<Protocol> {
        match self {
            RolloutBackend::Local => None,
            RolloutBackend::Vllm => Some(Protocol::Vllm),
            RolloutBackend::Sglang => Some(Protocol::Sglang),
            RolloutBackend::OpenAi => Some(Protocol::OpenAi),
        }
    }
}

named_enum! {
    /// `actor.strategy` (verl's key): how data-parallel ranks hold the trainable weights' state.
    #[derive(Default)]
    pub enum Strategy ("strategy") {
        /// Every rank holds every trainable parameter's optimizer state (DDP).
        #[default]
        Dp => "dp",
        /// Each rank holds 1/N of the f32 masters, gradients and AdamW moments, per unit
        /// (verl's FSDP workers, ZeRO); `fsdp2` is verl's name for the same.
        Fsdp => "fsdp" | "fsdp2",
    }
}

named_enum! {
    /// `rollout.weight_sync`: how remote servers get the trained weights.
    #[derive(Default)]
    pub enum WeightSync ("weight_sync") {
        /// Written atomically to `<run>/rollout_weights` and reloaded by every server.
        #[default]
        Disk => "disk",
        /// The servers keep their own weights (off-policy).
        None => "none",
        /// Broadcast over a c10d group the servers join (SGLang's
        /// `update_weights_from_distributed`; `temper serve` and SGLang servers).
        Distributed => "distributed",
    }
}

named_enum! {
    /// `rollout.weight_group_backend`: what the weight update group of `weight_sync =
    /// "distributed"` runs on.
    #[derive(Default)]
    pub enum WeightGroupBackend ("weight_group_backend") {
        /// NCCL from a trainer on a GPU, else Gloo.
        #[default]
        Auto => "auto",
        /// Host memory over TCP (also from a GPU trainer: for a server on the trainer's own GPU,
        /// which NCCL cannot pair with it).
        Gloo => "gloo",
        Nccl => "nccl",
    }
}

named_enum! {
    /// `trainer.logger` (verl's key and names): where each step's metrics go besides
    /// metrics.jsonl.
    pub enum Logger ("logger") {
        /// The progress line.
        Console => "console",
        /// Event files in `<run>/tensorboard/`.
        Tensorboard => "tensorboard",
        /// An offline W&B run in `<run>/wandb/`.
        Wandb => "wandb",
    }
}
