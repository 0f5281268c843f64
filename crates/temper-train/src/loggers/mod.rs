//! `trainer.logger` (verl's key and names): where each step's metrics go besides
//! metrics.jsonl, which is always written.
//!
//! - `console`: the progress line (as without loggers; `trainer.progress` turns it off);
//! - `tensorboard`: event files in `<run>/tensorboard/` ([`tensorboard::EventWriter`]);
//! - `wandb`: an offline W&B run in `<run>/wandb/`, written by the `wandb` package through
//!   `tools/wandb_sidecar.py` ([`wandb::WandbLogger`]), with the config, every metric per step
//!   and, at the end, the report's images.
//!
//! Every logger starts before the first step; one that cannot start stops the run there.
pub mod tensorboard;
pub mod wandb;

use anyhow::{Context, Result};
use std::collections::BTreeMap;
use std::path::Path;

use crate::config::{Logger, TrainerConfig};
use crate::rundir::RunDir;

/// The sinks a run writes to besides metrics.jsonl.
#[derive(Default)]
pub struct Loggers {
    tensorboard: Option<tensorboard::EventWriter>,
    wandb: Option<wandb::WandbLogger>,
}

impl Loggers {
    /// Starts the loggers `trainer.logger` names for `run` (W&B gets the run's saved config).
    pub fn start(trainer: &TrainerConfig, run: &RunDir) -> Result<Self> {
        let run_dir = &run.root;
        let wants = |logger: Logger| trainer.logger.contains(&logger);
        let mut loggers = Loggers::default();
        if wants(Logger::Tensorboard) {
            let w = tensorboard::EventWriter::create(&run_dir.join("tensorboard"))
                .context("trainer.logger = tensorboard")?;
            loggers.tensorboard = Some(w);
        }
        if wants(Logger::Wandb) {
            loggers.wandb = Some(wandb::WandbLogger::start(&trainer.project_name, run)?);
        }
        Ok(loggers)
    }

    /// Sends one step's metrics to every logger.
    pub fn log(&mut self, step: usize, metrics: &BTreeMap<String, f64>) -> Result<()> {
        if let Some(tb) = &mut self.tensorboard {
            tb.scalars(step, metrics)?;
        }
        if let Some(w) = &mut self.wandb {
            w.log(step, metrics)?;
        }
        Ok(())
    }

    /// Ends the run: the W&B run gets the report's images (drawn from metrics.jsonl into
    /// `<run>/report/`) and is closed.
    pub fn finish(&mut self, run_dir: &Path, last_step: usize) -> Result<()> {
        if let Some(mut w) = self.wandb.take() {
            let page = crate::report::render_report(run_dir, None)?;
            let dir = page.parent().unwrap_or(run_dir);
            w.images(last_step, dir)?;
            w.finish()?;
        }
        self.tensorboard = None;
        Ok(())
    }
}
