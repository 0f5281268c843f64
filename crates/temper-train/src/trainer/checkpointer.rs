//! The run's checkpointer: which steps are saved (every `trainer.save_freq` steps, and the last
//! step of a run or of `--stop-after`), what a checkpoint holds of the learner (the weights, the
//! adapters with LoRA, AdamW's state) and how many are kept (`trainer.max_ckpt_to_keep`). The
//! folder layout and the atomic write are `crate::checkpoint`'s.
use super::Learner;
use crate::checkpoint::{self, TrainerState};
use crate::config::TrainerConfig;
use crate::dist::Dist;
use anyhow::Result;
use std::path::{Path, PathBuf};

pub(crate) struct Checkpointer {
    /// `<run>/checkpoints`.
    dir: PathBuf,
    save_freq: i64,
    max_to_keep: Option<usize>,
}

impl Checkpointer {
    /// Checkpoints under `dir` as the `trainer` section says.
    pub fn new(dir: PathBuf, trainer: &TrainerConfig) -> Self {
        Checkpointer {
            dir,
            save_freq: trainer.save_freq,
            max_to_keep: trainer.max_ckpt_to_keep,
        }
    }

    /// Whether `step` is saved in a fit that ends at `end`.
    pub fn due(&self, step: usize, end: usize) -> bool {
        let sf = self.save_freq;
        (sf > 0 && step.is_multiple_of(sf as usize)) || step == end
    }

    /// Saves the learner and `state` as `global_step_<state.step>`, then prunes the oldest.
    /// Every rank calls it: rank 0 writes the folder; with a sharded optimizer every rank first
    /// writes its slices where rank 0 moves them in, and all wait until the folder is whole.
    pub fn save(&self, learner: &Learner, state: &TrainerState, dist: &Dist) -> Result<PathBuf> {
        let sharded = learner.optimizer().is_sharded();
        let staging = super::optimizer::staging_dir(&self.dir, state.step);
        let dst = checkpoint::checkpoint_dir(&self.dir, state.step);
        let model = learner.model();
        // Sharded, rank 0 writes the model a decoder layer at a time while every rank gathers
        // that layer (never the whole f32 model on one rank); a LoRA run's sharded weights are
        // its adapters, gathered whole for the adapter files as well.
        let by_layer = sharded && model.lora_config().is_none();
        if sharded {
            learner.optimizer().stage(&staging)?;
            if !by_layer {
                learner.optimizer().hold_whole()?;
            }
            dist.barrier()?;
        }
        if dist.is_root() {
            // With LoRA the model folder holds the merged weights (what vLLM or transformers
            // load) and, in `adapter/`, the adapters in PEFT's format (what a resume continues
            // from).
            let save_model = |d: &Path| -> Result<()> {
                match by_layer {
                    // A gather that failed wrote zeros: no checkpoint is made of them.
                    true => model
                        .save_by_layer(d)
                        .and_then(|()| learner.optimizer().check())?,
                    false => model.save(d)?,
                }
                if model.lora_config().is_some() {
                    model.save_lora_adapter(&d.join("adapter"))?;
                }
                Ok(())
            };
            let save_optimizer =
                |d: &Path| learner.optimizer().write(d, &staging, learner.params());
            checkpoint::save_checkpoint(&self.dir, state, &save_model, &save_optimizer)?;
            checkpoint::prune(&self.dir, self.max_to_keep)?;
        } else if by_layer {
            model.sweep_layers();
            learner.optimizer().check()?;
        }
        if sharded {
            learner.optimizer().let_go();
            dist.barrier()?;
        }
        Ok(dst)
    }
}
