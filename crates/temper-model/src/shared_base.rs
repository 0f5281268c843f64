//! Base weights loaded once and shared by every LoRA model built on them.
//!
//! Tinker's training clients are LoRA adapters on a base model, and each used to load its own f32
//! copy of the base: the tinker SDK's checks open 13 clients of SmolLM2-135M, 7 GB of identical
//! weights. A [`SharedBase`] holds the base once, frozen; [`SharedBase::lora_model`] builds a
//! model whose base parameters are those tensors (the same storage) and whose trainable
//! parameters are its own adapters. Nothing writes a shared tensor: the optimizer steps the
//! adapters ([`CausalLm::trainable_parameters`]), a LoRA model's state is its adapters, and
//! [`CausalLm::remove_lora`], [`CausalLm::var_store_mut`] and [`crate::load::load_weights`]
//! refuse such a model. Concurrent forwards on several threads only
//! read the base, which libtorch allows.
//!
//! [`SharedBases`] finds a base already loaded (by folder, device and compute dtype) while any
//! model on it lives,
//! and loads it otherwise; the last model dropped frees it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};

use anyhow::Result;
use tch::{Device, Kind, Tensor};

use crate::config::ModelConfig;
use crate::dtype::ComputeKind;
use crate::lora::LoraConfig;
use crate::model::{CausalLm, Params};

/// A base model's weights, frozen, shared by the LoRA models built on it.
#[derive(Debug, Clone)]
pub struct SharedBase(Arc<Mutex<Frozen>>);

#[derive(Debug)]
struct Frozen {
    config: ModelConfig,
    dir: PathBuf,
    device: Device,
    tensors: HashMap<String, Tensor>,
}

impl SharedBase {
    /// Load the Hugging Face folder `dir` (as [`CausalLm::load`]) and freeze it, for models
    /// computing in `compute`. In bf16, a weight matrix whose values bf16 holds exactly (every
    /// weight of a bf16 checkpoint) is kept in bf16: the same numbers the models' forwards cast it
    /// to, in half the memory, and no cast per forward.
    pub fn load(dir: &Path, device: Device, compute: ComputeKind) -> Result<SharedBase> {
        let mut model = CausalLm::load(dir, device, ComputeKind::F32)?;
        model.freeze_base();
        let mut tensors = model.var_store().variables();
        let kind = compute.kind();
        if kind != Kind::Float {
            for t in tensors.values_mut() {
                // Matrices only: norm weights and biases stay f32, as the forward reads them.
                if t.dim() == 2 {
                    let narrow = t.to_kind(kind);
                    if narrow.to_kind(Kind::Float).equal(t) {
                        *t = narrow;
                    }
                }
            }
        }
        Ok(SharedBase(Arc::new(Mutex::new(Frozen {
            config: model.config().clone(),
            dir: dir.to_path_buf(),
            device,
            tensors,
        }))))
    }

    /// A model computing in `compute` on these base weights, with fresh LoRA adapters `cfg`
    /// (their `A` drawn right after seeding with `seed` when given, as
    /// [`CausalLm::add_lora_seeded`]).
    pub fn lora_model(
        &self,
        cfg: &LoraConfig,
        seed: Option<u64>,
        compute: ComputeKind,
    ) -> Result<CausalLm> {
        let mut model = {
            let base = self.0.lock().unwrap_or_else(|e| e.into_inner());
            let mut m = CausalLm::build(
                base.config.clone(),
                base.device,
                compute,
                &Params::Shared(&base.tensors),
            );
            m.set_source_dir(base.dir.clone());
            m
        };
        match seed {
            Some(seed) => model.add_lora_seeded(cfg, seed)?,
            None => model.add_lora(cfg)?,
        }
        model.set_shared_base(self.clone());
        Ok(model)
    }

    fn downgrade(&self) -> Weak<Mutex<Frozen>> {
        Arc::downgrade(&self.0)
    }
}

/// A loaded base, while any model on it lives.
type Registered = Weak<Mutex<Frozen>>;

/// What a base is registered under: its folder however it is named (a link, a relative path),
/// the device, and the compute dtype (which decides the dtype it keeps).
type Key = (PathBuf, Device, ComputeKind);

fn key(dir: &Path, device: Device, compute: ComputeKind) -> Key {
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    (dir, device, compute)
}

/// The bases in use, by folder, device and compute dtype: each loaded once while any model on
/// it lives.
#[derive(Debug, Default)]
pub struct SharedBases(Mutex<HashMap<Key, Registered>>);

impl SharedBases {
    /// The base of folder `dir` on `device` for models computing in `compute`: the one models
    /// already use, or loaded now. Holds
    /// the registry while loading, so two clients asking at once load it once (and a client of
    /// another base waits for that load: creating a model is rare next to training it). A base
    /// is read from disk once while models use it: a folder rewritten meanwhile reaches new
    /// clients after the last model on the old one is gone.
    pub fn get(&self, dir: &Path, device: Device, compute: ComputeKind) -> Result<SharedBase> {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.retain(|_, w| w.strong_count() > 0);
        let key = key(dir, device, compute);
        if let Some(base) = map.get(&key).and_then(Weak::upgrade) {
            return Ok(SharedBase(base));
        }
        let base = SharedBase::load(&key.0, device, compute)?;
        map.insert(key, base.downgrade());
        Ok(base)
    }

    /// Whether the base of folder `dir` on `device` is loaded now (a new model on it costs its
    /// adapters only).
    pub fn is_loaded(&self, dir: &Path, device: Device, compute: ComputeKind) -> bool {
        let map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.get(&key(dir, device, compute))
            .is_some_and(|w| w.strong_count() > 0)
    }

    /// How many bases are loaded now.
    pub fn loaded(&self) -> usize {
        let map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.values().filter(|w| w.strong_count() > 0).count()
    }
}
