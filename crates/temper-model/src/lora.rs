//! LoRA adapters in the model's own forward: a targeted linear computes
//! `x W^T + b + (alpha / r) * (x A^T) B^T` with `A` (r, in) and `B` (out, r). Initialised as PEFT
//! does (`A` Kaiming-uniform with a = sqrt(5), i.e. U(-1/sqrt(in), 1/sqrt(in)); `B` zero), so a
//! fresh adapter leaves the model exactly as it was. With adapters on, the base weights are frozen
//! and [`CausalLm::trainable_parameters`] are the adapters alone. The sampler sees the adapted
//! weights merged (`W + (alpha / r) B A`) once per sampling call, not per token.
//!
//! Saved in PEFT's format (`adapter_config.json` + `adapter_model.safetensors`, names
//! `base_model.model.<HF name without .weight>.lora_A.weight`), which `peft` loads unchanged, or
//! merged into a plain HF folder.

use std::path::Path;

use anyhow::{bail, Context, Result};
use serde_json::json;
use tch::{nn, Kind, Tensor};

use crate::model::CausalLm;

thread_local! {
    /// Set while [`without_adapters`] runs on this thread.
    static ADAPTERS_OFF: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with every LoRA adapter off on this thread: a LoRA model's forwards compute as its
/// frozen base does (PEFT's `with model.disable_adapter():`, how TRL scores a LoRA run's
/// reference policy). The base weights are the reference's, so a LoRA run holds no second copy.
pub fn without_adapters<T>(f: impl FnOnce() -> T) -> T {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            ADAPTERS_OFF.with(|off| off.set(self.0));
        }
    }
    let _restore = Restore(ADAPTERS_OFF.with(|off| off.replace(true)));
    f()
}

/// `adapter` unless [`without_adapters`] turned adapters off on this thread.
pub(crate) fn active(adapter: &Option<LoraAdapter>) -> Option<&LoraAdapter> {
    adapter
        .as_ref()
        .filter(|_| !ADAPTERS_OFF.with(|off| off.get()))
}

/// Which linears get adapters, and their rank and scale.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraConfig {
    pub rank: i64,
    pub alpha: f64,
    /// Module names as PEFT and verl write them: `q_proj`, `k_proj`, `v_proj`, `o_proj`,
    /// `gate_proj`, `up_proj`, `down_proj`; `all-linear` for all seven (not the unembedding, as
    /// in PEFT); `lm_head` for the unembedding.
    pub target_modules: Vec<String>,
}

/// The seven decoder linears LoRA can target.
pub const LORA_TARGETS: [&str; 7] = [
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
];

/// The unembedding as a LoRA target (PEFT's name; Tinker's `train_unembed`).
pub const LORA_HEAD: &str = "lm_head";

impl LoraConfig {
    /// The targeted module names, checked (`all-linear` expanded).
    pub fn targets(&self) -> Result<Vec<&'static str>> {
        if self.rank <= 0 {
            bail!("lora rank must be positive, got {}", self.rank);
        }
        if !(self.alpha.is_finite() && self.alpha > 0.0) {
            bail!("lora alpha must be positive, got {}", self.alpha);
        }
        let mut out = vec![];
        for m in &self.target_modules {
            if m == "all-linear" {
                for t in LORA_TARGETS {
                    if !out.contains(&t) {
                        out.push(t);
                    }
                }
                continue;
            }
            match LORA_TARGETS
                .iter()
                .chain([&LORA_HEAD])
                .find(|t| **t == m.as_str())
            {
                Some(t) if !out.contains(t) => out.push(*t),
                Some(_) => {}
                None => bail!(
                    "lora target module `{m}`: not one of {}, {LORA_HEAD} (or all-linear)",
                    LORA_TARGETS.join(", ")
                ),
            }
        }
        if out.is_empty() {
            bail!("lora target_modules is empty");
        }
        Ok(out)
    }

    pub fn scale(&self) -> f64 {
        self.alpha / self.rank as f64
    }

    /// How many parameters these adapters have on a model of shape `m`: rank x (in + out) per
    /// adapted linear, per layer, and once for the unembedding.
    pub fn num_params(&self, m: &crate::ModelConfig) -> Result<i64> {
        let targets = self.targets()?;
        let (h, i) = (m.hidden_size, m.intermediate_size);
        let (q, kv) = (
            m.num_attention_heads * m.head_dim,
            m.num_key_value_heads * m.head_dim,
        );
        let in_out = |name: &str| match name {
            "q_proj" => (h, q),
            "k_proj" | "v_proj" => (h, kv),
            "o_proj" => (q, h),
            "gate_proj" | "up_proj" => (h, i),
            "down_proj" => (i, h),
            _ => (h, m.vocab_size), // LORA_HEAD
        };
        // The decoder linears' adapters come once per layer, the unembedding's once.
        let count = |t: &&str| {
            let (a, b) = in_out(t);
            let copies = if *t == LORA_HEAD {
                1
            } else {
                m.num_hidden_layers
            };
            self.rank * (a + b) * copies
        };
        Ok(targets.iter().map(count).sum())
    }
}

/// One linear's adapter.
#[derive(Debug)]
pub(crate) struct LoraAdapter {
    /// (r, in)
    pub a: Tensor,
    /// (out, r)
    pub b: Tensor,
    pub scale: f64,
}

impl LoraAdapter {
    /// New variables `<path>.lora_A.weight` and `<path>.lora_B.weight` in `p`, initialised as PEFT
    /// does.
    pub(crate) fn new(p: &nn::Path, in_dim: i64, out_dim: i64, cfg: &LoraConfig) -> Self {
        let bound = 1.0 / (in_dim as f64).sqrt();
        let a = (p / "lora_A").var(
            "weight",
            &[cfg.rank, in_dim],
            nn::Init::Uniform {
                lo: -bound,
                up: bound,
            },
        );
        let b = (p / "lora_B").var("weight", &[out_dim, cfg.rank], nn::Init::Const(0.0));
        LoraAdapter {
            a,
            b,
            scale: cfg.scale(),
        }
    }

    /// The adapter's contribution for input `x` in compute dtype `kind`.
    pub(crate) fn forward(&self, x: &Tensor, kind: Kind) -> Tensor {
        let (a, b) = (self.a.to_kind(kind), self.b.to_kind(kind));
        x.linear(&a, None::<&Tensor>).linear(&b, None::<&Tensor>) * self.scale
    }

    /// `W + scale * B A` (detached), the merged weight.
    pub(crate) fn merged(&self, weight: &Tensor) -> Tensor {
        tch::no_grad(|| weight.detach() + self.b.detach().matmul(&self.a.detach()) * self.scale)
    }
}

impl CausalLm {
    /// Add LoRA adapters to the targeted linears of every layer and freeze the base weights.
    pub fn add_lora(&mut self, cfg: &LoraConfig) -> Result<()> {
        if self.lora_config().is_some() {
            bail!("this model already has LoRA adapters");
        }
        let targets = cfg.targets()?;
        self.attach_lora(cfg, &targets);
        self.freeze_base();
        Ok(())
    }

    /// [`Self::add_lora`] with the adapters' `A` drawn right after seeding with `seed`, so the
    /// same seed gives the same adapters whatever other threads draw meanwhile.
    pub fn add_lora_seeded(&mut self, cfg: &LoraConfig, seed: u64) -> Result<()> {
        crate::seeded::with_seed(seed, || self.add_lora(cfg))
    }

    /// The `(name, tensor)` the optimizer updates: the adapters with LoRA, else every parameter.
    pub fn trainable_parameters(&self) -> Vec<(String, Tensor)> {
        match self.lora_store() {
            Some(vs) => {
                let mut v: Vec<_> = vs.variables().into_iter().collect();
                v.sort_by(|a, b| a.0.cmp(&b.0));
                v
            }
            None => self.named_parameters(),
        }
    }

    /// Load adapter weights saved by [`CausalLm::save_lora_adapter`] (or by PEFT for the same
    /// targets) into this model's adapters.
    pub fn load_lora_adapter(&self, dir: &Path) -> Result<()> {
        let Some(vs) = self.lora_store() else {
            bail!(
                "the model has no LoRA adapters to load {} into",
                dir.display()
            );
        };
        let file = dir.join("adapter_model.safetensors");
        let loaded = Tensor::read_safetensors(&file)
            .with_context(|| format!("reading {}", file.display()))?;
        let mut vars = vs.variables();
        for (name, t) in loaded {
            let key = name.strip_prefix("base_model.model.").unwrap_or(&name);
            let Some(v) = vars.remove(key) else {
                bail!(
                    "{}: tensor `{name}` matches no adapter of this model",
                    file.display()
                );
            };
            if v.size() != t.size() {
                bail!(
                    "{}: tensor `{name}` has shape {:?}, the adapter {:?} (another lora rank?)",
                    file.display(),
                    t.size(),
                    v.size()
                );
            }
            tch::no_grad(|| v.shallow_clone().copy_(&t));
        }
        if let Some(missing) = vars.keys().next() {
            bail!("{}: no tensor for adapter `{missing}`", file.display());
        }
        Ok(())
    }

    /// Write the adapters in PEFT's format to `dir` (created; files replaced atomically).
    pub fn save_lora_adapter(&self, dir: &Path) -> Result<()> {
        let (Some(cfg), Some(vs)) = (self.lora_config(), self.lora_store()) else {
            bail!("the model has no LoRA adapters to save");
        };
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let tensors: Vec<(String, Tensor)> = vs
            .variables()
            .into_iter()
            .map(|(name, t)| (format!("base_model.model.{name}"), t.detach()))
            .collect();
        let weights = dir.join("adapter_model.safetensors");
        temper_base::atomic_file::write_atomic_with(&weights, |tmp| {
            crate::safetensors_io::write_safetensors(tmp, &tensors)
                .with_context(|| format!("writing {}", weights.display()))
        })?;
        let config = json!({
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "r": cfg.rank,
            "lora_alpha": cfg.alpha,
            "target_modules": cfg.targets()?,
            "lora_dropout": 0.0,
            "bias": "none",
            "fan_in_fan_out": false,
            "use_rslora": false,
            "init_lora_weights": true,
            "base_model_name_or_path": self.source_dir().map(|d| d.display().to_string()),
        });
        temper_base::atomic_file::write_json_atomic(&dir.join("adapter_config.json"), &config)
    }
}
