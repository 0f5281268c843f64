//! The `Learner` part of a run: the policy being trained, its reference, the optimizer and the
//! loss settings, with the config it reads (`LearnerSettings`). What it computes lives beside the
//! phases that call it (`advantages.rs`, `update.rs`).
use super::optimizer::Optimizer;
use crate::optim::LrSchedule;
use temper_algo::{ActorLossConfig, AdvConfig, KlController};
use temper_model::CausalLm;

/// The policy being trained and how it learns: its weights and the frozen reference, the
/// trainable parameters, AdamW and its schedule, the loss and advantage settings, the KL
/// controller of a KL penalty in the reward.
pub(crate) struct Learner {
    pub(crate) model: CausalLm,
    /// The frozen reference policy, when a KL term needs one.
    pub(crate) reference: Option<Reference>,
    pub(crate) params: Vec<(String, tch::Tensor)>,
    /// AdamW, replicated or sharded over the ranks (`actor.strategy`).
    pub(crate) optimizer: Optimizer,
    pub(crate) schedule: LrSchedule,
    pub(crate) loss_cfg: ActorLossConfig,
    pub(crate) adv_cfg: AdvConfig,
    pub(crate) rollout_corr: temper_algo::RolloutCorrection,
    pub(crate) kl_ctrl: Option<KlController>,
    /// The config sections the learner reads.
    pub(crate) settings: LearnerSettings,
    /// This device's matmul roof in the compute dtype, measured when the run starts: the update's
    /// FLOP/s is also reported as a fraction of it (`perf/update_roof_fraction`).
    pub(crate) roof: temper_model::Roof,
}

/// Where a KL term's reference log-probs come from.
pub(crate) enum Reference {
    /// A model of its own (a full fine-tune's starting weights).
    Model(Box<CausalLm>),
    /// The policy with its LoRA adapters off: a LoRA run's frozen base is its reference, so no
    /// second copy is loaded (PEFT's `disable_adapter()`, as TRL scores it).
    PolicyBase,
}

/// What the learner reads of the config: `actor` (epochs, clipping, checkpointing, chunks), the
/// sampling temperature its log-probs are taken at, `trainer.check_on_policy` and the KL
/// penalty's estimator.
pub(crate) struct LearnerSettings {
    pub(crate) actor: crate::config::ActorConfig,
    pub(crate) temperature: f64,
    pub(crate) check_on_policy: bool,
    /// `algorithm.kl_penalty`: the KL estimator of a KL penalty in the reward.
    pub(crate) kl_penalty: temper_algo::KlType,
    /// `model.use_remove_padding`: the passes over the batch run packed rows.
    pub(crate) remove_padding: bool,
    /// `trainer.seed`: the mini-batch shuffle's seed.
    pub(crate) seed: u64,
}

impl Learner {
    /// Tokens per chunk of logits in every pass over the batch (`actor.unembed_chunk`).
    pub(crate) fn unembed_chunk(&self) -> i64 {
        self.settings
            .actor
            .unembed_chunk_or(self.model.default_unembed_chunk())
    }
}
