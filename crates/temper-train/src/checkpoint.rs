//! Checkpoints: `checkpoints/global_step_<k>/` with the model as a Hugging Face folder (`model/`),
//! the optimizer state (`optimizer.safetensors`, or `optimizer/` when sharded) and the loop state (`trainer_state.json`: step,
//! data position, generation counter, KL coefficient). A checkpoint is written into a hidden
//! temporary folder and renamed when complete (`temper_base::atomic_dir`), so a
//! `global_step_<k>` folder is always whole, and one being replaced stays until the new one is in
//! place.
use crate::rundir::write_json;
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Everything besides weights and optimizer moments that the next step depends on.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct TrainerState {
    /// Optimizer-batch steps completed (the next step is `step + 1`, 1-based like verl).
    pub step: usize,
    /// Prompt batches drawn from the data order so far (more than `step` with DAPO filtering).
    pub batches_drawn: usize,
    /// Current KL-in-reward coefficient (adaptive controller).
    pub kl_coef: Option<f64>,
    /// Optimizer steps applied to the weights (skipped updates do not count): the version of
    /// the policy, which rollouts record.
    #[serde(default)]
    pub policy_version: u64,
}

pub fn checkpoint_dir(run_checkpoints: &Path, step: usize) -> PathBuf {
    run_checkpoints.join(format!("global_step_{step}"))
}

/// Writes a checkpoint atomically; `save_model` writes the HF folder into the given path,
/// `save_optimizer` the optimizer's state into the checkpoint folder being filled.
pub fn save_checkpoint(
    run_checkpoints: &Path,
    state: &TrainerState,
    save_model: &dyn Fn(&Path) -> Result<()>,
    save_optimizer: &dyn Fn(&Path) -> Result<()>,
) -> Result<PathBuf> {
    let dst = checkpoint_dir(run_checkpoints, state.step);
    temper_base::atomic_dir::write_dir_atomically(&dst, |tmp| {
        save_model(&tmp.join("model"))?;
        save_optimizer(tmp)?;
        write_json(
            &tmp.join("trainer_state.json"),
            &serde_json::to_value(state)?,
        )
    })
    .with_context(|| format!("saving checkpoint {}", dst.display()))?;
    Ok(dst)
}

/// Complete checkpoints (step, folder), oldest first. Leftover `.tmp` folders are ignored.
pub fn list_checkpoints(run_checkpoints: &Path) -> Result<Vec<(usize, PathBuf)>> {
    let Ok(rd) = std::fs::read_dir(run_checkpoints) else {
        return Ok(vec![]);
    };
    let mut out = Vec::new();
    for e in rd {
        let e = e?;
        let name = e.file_name().to_string_lossy().to_string();
        if let Some(k) = name
            .strip_prefix("global_step_")
            .and_then(|k| k.parse::<usize>().ok())
        {
            if e.path().join("trainer_state.json").is_file() {
                out.push((k, e.path()));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Cleans up after a crash mid-save: deletes half-written checkpoint folders (hidden
/// `.NAME.tmp-*`, and `NAME.tmp` from earlier versions) and puts back a checkpoint whose
/// replacement was interrupted.
pub fn remove_partial(run_checkpoints: &Path) -> Result<()> {
    let Ok(rd) = std::fs::read_dir(run_checkpoints) else {
        return Ok(());
    };
    for e in rd {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        if name.ends_with(".tmp") || (name.starts_with('.') && name.contains(".tmp-")) {
            std::fs::remove_dir_all(e.path())
                .with_context(|| format!("removing {}", e.path().display()))?;
        } else if let Some(target) = name.strip_prefix('.').and_then(|n| n.strip_suffix(".old")) {
            temper_base::atomic_dir::restore_interrupted(&run_checkpoints.join(target))?;
        }
    }
    Ok(())
}

/// Keeps the newest `keep` checkpoints.
pub fn prune(run_checkpoints: &Path, keep: Option<usize>) -> Result<()> {
    let Some(keep) = keep else { return Ok(()) };
    let all = list_checkpoints(run_checkpoints)?;
    for (_, dir) in all.iter().take(all.len().saturating_sub(keep)) {
        std::fs::remove_dir_all(dir)
            .with_context(|| format!("removing old checkpoint {}", dir.display()))?;
    }
    Ok(())
}

pub fn read_state(ckpt: &Path) -> Result<TrainerState> {
    let p = ckpt.join("trainer_state.json");
    let text = std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{}: bad trainer state", p.display()))
}

/// The newest complete checkpoint of a run, or an error naming the folder.
pub fn latest(run_checkpoints: &Path) -> Result<(usize, PathBuf)> {
    match list_checkpoints(run_checkpoints)?.pop() {
        Some(c) => Ok(c),
        None => bail!(
            "{}: no complete checkpoint to resume from",
            run_checkpoints.display()
        ),
    }
}
