//! `trainer.logger = wandb`: an offline W&B run written by the `wandb` package itself, through
//! `tools/wandb_sidecar.py` running in the project's venv (`TEMPER_PYTHON` names another
//! Python). The trainer sends each step's metrics as one JSON line and waits for the answer, so
//! a failing sidecar stops the run at that step instead of losing metrics silently.
use anyhow::{Context, Result};
use serde_json::json;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use crate::pyworker::PyWorker;
use crate::rundir::RunDir;

/// Starting wandb (its service process included) and closing the run may take this long.
const REPLY_TIMEOUT: Duration = Duration::from_secs(120);

pub struct WandbLogger {
    worker: Option<PyWorker>,
}

impl WandbLogger {
    /// A W&B run in `project` for `run`, its config the run's saved one (`config.toml`).
    pub fn start(project: &str, run: &RunDir) -> Result<Self> {
        let run_dir = &run.root;
        let saved = std::fs::read_to_string(run.config())
            .with_context(|| format!("reading {}", run.config().display()))?;
        let config: toml::Value = toml::from_str(&saved)
            .with_context(|| format!("reading {}", run.config().display()))?;
        let config_json = run_dir.join(".wandb_config.json");
        crate::rundir::write_json(&config_json, &serde_json::to_value(config)?)?;
        let name = run_dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "temper".into());
        let args = [
            "--dir".to_string(),
            run_dir.display().to_string(),
            "--project".into(),
            project.to_string(),
            "--name".into(),
            name,
            "--config".into(),
            config_json.display().to_string(),
        ];
        let (worker, _ready) = PyWorker::start(None, "wandb_sidecar.py", &args, REPLY_TIMEOUT)
            .context("trainer.logger = wandb could not start")?;
        Ok(WandbLogger {
            worker: Some(worker),
        })
    }

    fn send(&mut self, request: serde_json::Value) -> Result<()> {
        let w = self.worker.as_mut().context("the W&B run is closed")?;
        w.request(&request.to_string())
            .context("trainer.logger = wandb")?;
        Ok(())
    }

    pub fn log(&mut self, step: usize, metrics: &BTreeMap<String, f64>) -> Result<()> {
        // JSON has no NaN or infinity: those go as strings, which the sidecar turns back into floats.
        let metrics: serde_json::Map<String, serde_json::Value> = metrics
            .iter()
            .map(|(k, v)| {
                let v = if v.is_finite() {
                    json!(v)
                } else {
                    json!(v.to_string())
                };
                (k.clone(), v)
            })
            .collect();
        self.send(json!({"step": step, "metrics": metrics}))
    }

    /// Logs every `<dir>/*.png` as an image named `report/<file stem>`.
    pub fn images(&mut self, step: usize, dir: &Path) -> Result<()> {
        let mut images = serde_json::Map::new();
        for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
            let path = entry?.path();
            if path.extension().is_some_and(|e| e == "png") {
                let stem = path.file_stem().unwrap_or_default().to_string_lossy();
                images.insert(format!("report/{stem}"), json!(path.display().to_string()));
            }
        }
        if images.is_empty() {
            return Ok(());
        }
        self.send(json!({"step": step, "images": images}))
    }

    /// Closes the W&B run and waits for wandb to write it out.
    pub fn finish(mut self) -> Result<()> {
        match self.worker.take() {
            Some(w) => w.finish().context("closing the W&B run"),
            None => Ok(()),
        }
    }
}

impl Drop for WandbLogger {
    /// A run that stops on an error still closes its W&B run, so what was logged is kept.
    fn drop(&mut self) {
        if let Some(w) = self.worker.take() {
            let _ = w.finish();
        }
    }
}
