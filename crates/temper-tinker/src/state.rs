//! save_state / load_state (weights, with or without the optimizer) and save_weights_for_sampler.

use std::path::Path;

use anyhow::{bail, Context, Result};
use temper_model::CausalLm;

use crate::{SamplingModel, TrainingModel};

impl TrainingModel {
    /// Tinker's `save_weights_for_sampler`: the current weights (LoRA merged) as an HF folder in
    /// `dir`, loaded as a [`SamplingModel`] that later optimizer steps do not change.
    pub fn save_weights_for_sampler(&self, dir: &Path) -> Result<SamplingModel> {
        self.model
            .save(dir)
            .with_context(|| format!("saving sampler weights to {}", dir.display()))?;
        SamplingModel::load(dir, self.model.device())
    }

    /// Tinker's `save_state`: the trained weights (the adapters in PEFT's format with LoRA, else
    /// the HF folder) and the optimizer state, in `dir`. Each file is written atomically.
    pub fn save_state(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        if self.model.lora_config().is_some() {
            self.model.save_lora_adapter(&dir.join("adapter"))?;
        } else {
            self.model.save(&dir.join("model"))?;
        }
        self.optimizer().save(&dir.join("optimizer.safetensors"))
    }

    /// Tinker's `load_state` (`optimizer = false`: weights only, the optimizer state kept) and
    /// `load_state_with_optimizer` (`true`). The state must come from a model of the same shape
    /// (and the same LoRA targets and rank).
    pub fn load_state(&mut self, dir: &Path, optimizer: bool) -> Result<()> {
        if !dir.is_dir() {
            bail!("no saved state at {}", dir.display());
        }
        if self.model.lora_config().is_some() {
            self.model.load_lora_adapter(&dir.join("adapter"))?;
        } else {
            let saved = CausalLm::load(
                &dir.join("model"),
                self.model.device(),
                self.model.compute(),
            )
            .with_context(|| format!("loading state {}", dir.display()))?;
            self.model
                .var_store_mut()?
                .copy(saved.var_store())
                .with_context(|| format!("{}: weights of another shape", dir.display()))?;
        }
        if optimizer {
            self.optimizer_mut()
                .load(&dir.join("optimizer.safetensors"))?;
        }
        Ok(())
    }
}
