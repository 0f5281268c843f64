//! The consumer half of a step, the `Learner`: the policy being trained, its reference, the
//! optimizer and the loss settings, with the config it reads (`LearnerSettings`). Given a step's
//! batch it computes the log-probs before the update and the advantages (`advantages.rs`) and
//! updates (`update.rs`, over the mini- and micro-batches of `partition.rs`), all in `learn.rs`.
//! Its fields are its own: the rest of the trainer reads the policy, the optimizer and the
//! settings through its methods.
mod advantages;
mod learn;
pub(crate) mod partition;
mod update;

pub(crate) use learn::Learned;

use super::optimizer::Optimizer;
use crate::config::Config;
use crate::dist::Dist;
use crate::optim::LrSchedule;
use anyhow::{Context, Result};
use std::path::Path;
use temper_algo::{ActorLossConfig, AdvConfig, KlController};
use temper_model::{CausalLm, ComputeKind};

/// The policy being trained and how it learns: its weights and the frozen reference, the
/// trainable parameters, AdamW and its schedule, the loss and advantage settings, the KL
/// controller of a KL penalty in the reward.
pub(crate) struct Learner {
    model: CausalLm,
    /// The frozen reference policy, when a KL term needs one.
    reference: Option<Reference>,
    params: Vec<(String, tch::Tensor)>,
    /// AdamW, replicated or sharded over the ranks (`actor.strategy`).
    optimizer: Optimizer,
    schedule: LrSchedule,
    loss_cfg: ActorLossConfig,
    adv_cfg: AdvConfig,
    rollout_corr: temper_algo::RolloutCorrection,
    kl_ctrl: Option<KlController>,
    /// The config sections the learner reads.
    settings: LearnerSettings,
    /// This device's matmul roof in the compute dtype, measured when the run starts: the update's
    /// FLOP/s is also reported as a fraction of it (`perf/update_roof_fraction`).
    roof: temper_model::Roof,
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

/// What [`Learner::build`] starts from besides the config.
pub(crate) struct LearnerStart<'a> {
    /// The policy as loaded (its LoRA adapters added).
    pub model: CausalLm,
    /// Where a reference model is loaded from when a KL term needs one.
    pub reference_dir: &'a Path,
    pub device: tch::Device,
    pub compute: ComputeKind,
    /// The run's length, for the learning-rate schedule.
    pub total_steps: usize,
    /// This device's matmul roof, measured when the run starts.
    pub roof: temper_model::Roof,
}

impl Learner {
    /// The learner of `cfg`: the loss, advantage and rollout-correction settings, the reference
    /// (a model of its own, or a LoRA run's base), the KL controller of a KL penalty in the
    /// reward, the schedule, and AdamW (replicated or sharded over `dist`'s ranks; sharded, the
    /// decoder layers let go of their weights from here on). `notes` gets what the optimizer's
    /// settings did.
    pub fn build(
        cfg: &Config,
        start: LearnerStart<'_>,
        dist: &std::sync::Arc<Dist>,
        notes: &mut Vec<String>,
    ) -> Result<Self> {
        let LearnerStart {
            model,
            reference_dir,
            device,
            compute,
            total_steps,
            roof,
        } = start;
        let (loss_cfg, adv_cfg, rollout_corr) = super::algo_setup::algo_configs(cfg)?;
        let needs_ref = loss_cfg.use_kl_loss || cfg.algorithm.use_kl_in_reward;
        let reference = if needs_ref && model.lora_config().is_some() {
            // The adapters train, the base stays as loaded: the base is the reference.
            Some(Reference::PolicyBase)
        } else if needs_ref {
            let r = CausalLm::load(reference_dir, device, compute)
                .with_context(|| format!("loading reference {}", reference_dir.display()))?;
            for (_, mut p) in r.named_parameters() {
                let _ = p.detach_().set_requires_grad(false);
            }
            Some(Reference::Model(Box::new(r)))
        } else {
            None
        };
        let kl_ctrl = if cfg.algorithm.use_kl_in_reward {
            Some(KlController::new(&cfg.algorithm.kl_ctrl)?)
        } else {
            None
        };
        let schedule = LrSchedule::from_optim(&cfg.actor.optim, total_steps)?;
        let params: Vec<(String, tch::Tensor)> = model.trainable_parameters();
        let optimizer = Optimizer::new(&params, &cfg.actor, dist, notes)?;
        model.set_layer_residency(optimizer.layer_residency());
        // Sharded, the layers' weights are gathered when used from now on.
        optimizer.let_go();
        let settings = LearnerSettings {
            actor: cfg.actor.clone(),
            temperature: cfg.rollout.temperature,
            check_on_policy: cfg.trainer.check_on_policy,
            kl_penalty: cfg.algorithm.kl_penalty,
            remove_padding: cfg.model.use_remove_padding,
            seed: cfg.trainer.seed,
        };
        Ok(Learner {
            model,
            reference,
            params,
            optimizer,
            schedule,
            loss_cfg,
            adv_cfg,
            rollout_corr,
            kl_ctrl,
            settings,
            roof,
        })
    }

    /// The policy being trained.
    pub fn model(&self) -> &CausalLm {
        &self.model
    }

    /// AdamW, replicated or sharded: the weights' handovers (checkpoints, the samplers' copies)
    /// go through it when the layers are sharded.
    pub fn optimizer(&self) -> &Optimizer {
        &self.optimizer
    }

    /// The trainable parameters (the optimizer's, in its order).
    pub fn params(&self) -> &[(String, tch::Tensor)] {
        &self.params
    }

    /// The config the learner reads.
    pub fn settings(&self) -> &LearnerSettings {
        &self.settings
    }

    /// This device's matmul roof in the compute dtype, measured when the run started.
    pub fn roof(&self) -> &temper_model::Roof {
        &self.roof
    }

    /// A KL penalty in the reward: its coefficient now (the adaptive controller's moves).
    pub fn kl_coef(&self) -> Option<f64> {
        self.kl_ctrl.as_ref().map(|c| c.value())
    }

    /// A resumed run: the optimizer's state from checkpoint `ckpt` (resharded when the world
    /// size differs), and the KL coefficient it recorded.
    pub fn resume_from(&mut self, ckpt: &Path, kl_coef: Option<f64>) -> Result<()> {
        self.optimizer.load(ckpt, &self.params)?;
        if let (
            Some(KlController::Fixed { value } | KlController::Adaptive { value, .. }),
            Some(v),
        ) = (&mut self.kl_ctrl, kl_coef)
        {
            *value = v;
        }
        Ok(())
    }

    /// Tokens per chunk of logits in every pass over the batch (`actor.unembed_chunk`).
    pub(crate) fn unembed_chunk(&self) -> i64 {
        self.settings
            .actor
            .unembed_chunk_or(self.model.default_unembed_chunk())
    }
}
