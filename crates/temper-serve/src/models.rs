//! The weights the serving worker samples: the served model (`--model`, reloaded in place by the
//! weight-sync routes), LoRA snapshots of it (their adapters attached to that one copy between
//! batches, a few megabytes read, not a model load), and a few other folders that Tinker
//! sampling sessions name (full-weight snapshots, other base models and LoRA snapshots of
//! those), kept loaded most recently used first.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use temper_model::{CausalLm, ComputeKind, LoraConfig, ModelConfig, Policy};

/// The file that makes a sampler folder a LoRA snapshot: `{"base_dir", "lora_rank",
/// "lora_alpha", "target_modules"}`, with the adapters (PEFT's format) in `adapter/`.
pub const LORA_SNAPSHOT: &str = "tinker_sampler.json";

/// Models other than the served one kept loaded (each a whole model in memory).
const OTHERS_LOADED: usize = 2;

/// Which weights a request samples.
#[derive(Clone, Debug, PartialEq)]
pub enum Weights {
    /// The served model, as last reloaded.
    Served,
    /// A folder a Tinker sampling session names: a LoRA snapshot ([`LORA_SNAPSHOT`]) or an HF
    /// folder.
    Folder(PathBuf),
}

/// A policy loaded for sampling, and the LoRA snapshot attached to it now.
pub struct Loaded {
    pub policy: Policy,
    adapter: Option<PathBuf>,
}

impl Loaded {
    pub fn load(dir: &Path, device: tch::Device, compute: ComputeKind) -> Result<Loaded> {
        Ok(Loaded {
            policy: Policy::load(dir, device, compute)?,
            adapter: None,
        })
    }

    /// The model as loaded, no adapters.
    fn plain(&mut self) -> Result<&Loaded> {
        self.adapter = None;
        if self.policy.model.lora_config().is_some() {
            self.policy.model.remove_lora()?;
        }
        Ok(self)
    }

    /// The model with the adapters of the LoRA snapshot `snapshot` (shape `cfg`) attached.
    fn adapted(&mut self, snapshot: &Path, cfg: &LoraConfig) -> Result<&Loaded> {
        if self.adapter.as_deref() == Some(snapshot) {
            return Ok(self);
        }
        self.adapter = None;
        if self.policy.model.lora_config() != Some(cfg) {
            self.policy.model.remove_lora()?;
            // Seeded: the draws (overwritten at once) must not disturb a training model's seeded
            // initialisation on another thread.
            self.policy.model.add_lora_seeded(cfg, 0)?;
        }
        if let Err(e) = self
            .policy
            .model
            .load_lora_adapter(&snapshot.join("adapter"))
        {
            // Half-loaded adapters are no one's.
            self.policy.model.remove_lora()?;
            return Err(e);
        }
        self.adapter = Some(snapshot.to_path_buf());
        Ok(self)
    }
}

/// Everything the worker can sample.
pub struct Models {
    served: Loaded,
    served_dir: PathBuf,
    others: VecDeque<(PathBuf, Loaded)>,
    device: tch::Device,
    compute: ComputeKind,
    /// Why the served weights are not to be sampled: a weight push failed after some weights
    /// changed (cleared when weights arrive whole, pushed or reloaded).
    served_broken: Option<String>,
}

impl Models {
    pub fn load(dir: &Path, device: tch::Device, compute: ComputeKind) -> Result<Models> {
        Ok(Models {
            served: Loaded::load(dir, device, compute)?,
            served_dir: dir.to_path_buf(),
            others: VecDeque::new(),
            device,
            compute,
            served_broken: None,
        })
    }

    /// Marks the served weights as not to be sampled (`why`), or whole again (`None`).
    pub fn set_served_broken(&mut self, why: Option<String>) {
        self.served_broken = why;
    }

    fn served_ok(&self) -> Result<()> {
        match &self.served_broken {
            Some(why) => anyhow::bail!(
                "the served weights are incomplete ({why}); they serve again once weights arrive whole \
                 (a push or a reload)"
            ),
            None => Ok(()),
        }
    }

    pub fn served(&self) -> &Loaded {
        &self.served
    }

    /// The served model, to reload its weights in place.
    pub fn served_model_mut(&mut self) -> &mut CausalLm {
        &mut self.served.policy.model
    }

    /// The model for `weights`, ready to sample: adapters attached or removed, a folder loaded
    /// when it is not (dropping the least recently used other model).
    pub fn select(&mut self, weights: &Weights) -> Result<&Loaded> {
        let dir = match weights {
            Weights::Served => {
                self.served_ok()?;
                return self.served.plain();
            }
            Weights::Folder(dir) => dir,
        };
        match lora_snapshot(dir)? {
            Some((base, cfg)) if same_folder(&base, &self.served_dir) => {
                self.served_ok()?;
                self.served.adapted(dir, &cfg)
            }
            Some((base, cfg)) => self.other(&base)?.adapted(dir, &cfg),
            None if same_folder(dir, &self.served_dir) => {
                self.served_ok()?;
                self.served.plain()
            }
            None => self.other(dir)?.plain(),
        }
    }

    /// The other model loaded from `dir`, moved to the front.
    fn other(&mut self, dir: &Path) -> Result<&mut Loaded> {
        match self.others.iter().position(|(d, _)| same_folder(d, dir)) {
            Some(i) => {
                let hit = self.others.remove(i).expect("found");
                self.others.push_front(hit);
            }
            None => {
                // Make room first: two whole models at once is what this bound is for.
                self.others.truncate(OTHERS_LOADED - 1);
                let loaded = Loaded::load(dir, self.device, self.compute)?;
                self.others.push_front((dir.to_path_buf(), loaded));
            }
        }
        Ok(&mut self.others.front_mut().expect("just placed").1)
    }

    /// Unloads the other models that none of the folders in `keep` (the live sampling sessions')
    /// needs. Returns whether any was unloaded.
    pub fn prune(&mut self, keep: &[PathBuf]) -> bool {
        let needed: Vec<PathBuf> = keep
            .iter()
            .map(|d| match lora_snapshot(d) {
                Ok(Some((base, _))) => base,
                _ => d.clone(),
            })
            .collect();
        let before = self.others.len();
        self.others
            .retain(|(d, _)| needed.iter().any(|n| same_folder(n, d)));
        self.others.len() < before
    }
}

/// Whether two paths name the same folder.
fn same_folder(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// The LoRA snapshot description in `dir`, if it is one: its base folder and LoRA shape.
pub fn lora_snapshot(dir: &Path) -> Result<Option<(PathBuf, LoraConfig)>> {
    let f = dir.join(LORA_SNAPSHOT);
    if !f.exists() {
        return Ok(None);
    }
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&f)?).with_context(|| format!("{}", f.display()))?;
    let base: PathBuf = serde_json::from_value(v["base_dir"].clone())
        .with_context(|| format!("{}: base_dir", f.display()))?;
    let cfg = LoraConfig {
        rank: v["lora_rank"]
            .as_i64()
            .with_context(|| format!("{}: lora_rank", f.display()))?,
        alpha: v["lora_alpha"]
            .as_f64()
            .with_context(|| format!("{}: lora_alpha", f.display()))?,
        target_modules: serde_json::from_value(v["target_modules"].clone())
            .with_context(|| format!("{}: target_modules", f.display()))?,
    };
    Ok(Some((base, cfg)))
}

/// The vocabulary size of the model a sampler folder samples (a LoRA snapshot's base), read
/// from its `config.json`, and whether it has a tokenizer (for stop strings), so that a request
/// is checked before it is queued.
pub fn folder_vocab(dir: &Path) -> Result<(i64, bool)> {
    let model_dir = match lora_snapshot(dir)? {
        Some((base, _)) => base,
        None => dir.to_path_buf(),
    };
    let config = model_dir.join("config.json");
    if !config.exists() {
        bail!(
            "{}: not a model folder (no config.json)",
            model_dir.display()
        );
    }
    let vocab = ModelConfig::from_file(&config)?.vocab_size;
    Ok((vocab, model_dir.join("tokenizer.json").exists()))
}
