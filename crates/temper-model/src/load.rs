//! Loading weights from a Hugging Face folder: `model.safetensors`, or the shards listed by
//! `model.safetensors.index.json`. Weights of any float dtype are copied into the f32 master
//! variables; every variable must be found exactly once with the right shape.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use tch::{nn, Device, Tensor};

use crate::config::ModelConfig;
use crate::dtype::ComputeKind;
use crate::model::{CausalLm, Params};

pub(crate) fn load_folder(dir: &Path, device: Device, compute: ComputeKind) -> Result<CausalLm> {
    if !dir.is_dir() {
        bail!(
            "model folder {} does not exist or is not a folder",
            dir.display()
        );
    }
    let config = ModelConfig::from_file(&dir.join("config.json"))?;
    let files = weight_files(dir)?;
    let mut model = CausalLm::build(
        config,
        device,
        compute,
        &Params::Fresh(nn::Init::Const(0.0)),
    );
    load_weights(&model, &files)?;
    model.set_source_dir(dir.to_path_buf());
    Ok(model)
}

/// The safetensors files of a folder: the single file, or every shard named in the index.
pub fn weight_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let single = dir.join("model.safetensors");
    if single.is_file() {
        return Ok(vec![single]);
    }
    let index = dir.join("model.safetensors.index.json");
    if !index.is_file() {
        bail!(
            "no model.safetensors or model.safetensors.index.json in {}",
            dir.display()
        );
    }
    let text =
        std::fs::read_to_string(&index).with_context(|| format!("reading {}", index.display()))?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("{}: not valid JSON", index.display()))?;
    let map = v
        .get("weight_map")
        .and_then(|m| m.as_object())
        .with_context(|| format!("{}: no `weight_map` object", index.display()))?;
    let mut shards = BTreeSet::new();
    for (name, file) in map {
        let file = file.as_str().with_context(|| {
            format!("{}: weight_map[{name}] is not a file name", index.display())
        })?;
        shards.insert(file.to_string());
    }
    shards
        .into_iter()
        .map(|f| {
            let p = dir.join(&f);
            if p.is_file() {
                Ok(p)
            } else {
                bail!(
                    "{}: shard {f} listed in the index is missing",
                    index.display()
                )
            }
        })
        .collect()
}

/// Tensors some checkpoints carry that the model does not need.
fn ignorable(name: &str, tied: bool) -> bool {
    (tied && name == "lm_head.weight") || name.ends_with("rotary_emb.inv_freq")
}

/// Copy every tensor of `files` into the model's variables (under no_grad), checking names and shapes.
pub fn load_weights(model: &CausalLm, files: &[PathBuf]) -> Result<()> {
    if model.shares_base() {
        bail!("this model's base weights are shared with other LoRA models: they cannot be loaded into");
    }
    let vars: HashMap<String, Tensor> = model.var_store().variables();
    let tied = model.config().tie_word_embeddings;
    let mut loaded: HashMap<String, PathBuf> = HashMap::new();
    for file in files {
        // One tensor in memory at a time: the model's variables plus the largest tensor.
        crate::safetensors_io::for_each_tensor(file, |name, t| {
            let Some(var) = vars.get(&name) else {
                if ignorable(&name, tied) {
                    return Ok(());
                }
                bail!(
                    "{}: unexpected tensor `{name}` {:?} (not a parameter of a {:?} model with this config.json)",
                    file.display(),
                    t.size(),
                    model.config().arch
                );
            };
            if t.size() != var.size() {
                bail!(
                    "{}: tensor `{name}` has shape {:?} but config.json implies {:?}",
                    file.display(),
                    t.size(),
                    var.size()
                );
            }
            if !t.is_floating_point() {
                bail!(
                    "{}: tensor `{name}` has non-float dtype {:?}",
                    file.display(),
                    t.kind()
                );
            }
            if let Some(prev) = loaded.insert(name.clone(), file.clone()) {
                bail!(
                    "tensor `{name}` appears in both {} and {}",
                    prev.display(),
                    file.display()
                );
            }
            tch::no_grad(|| {
                let mut var = var.shallow_clone();
                var.copy_(&t.to_device(var.device()));
            });
            Ok(())
        })?;
    }
    let mut missing: Vec<&String> = vars.keys().filter(|k| !loaded.contains_key(*k)).collect();
    missing.sort();
    if let Some(first) = missing.first() {
        let where_ = files
            .iter()
            .map(|f| f.display().to_string())
            .collect::<Vec<_>>()
            .join(", ");
        bail!(
            "tensor `{first}` (shape {:?}) missing from {where_}{}",
            vars[*first].size(),
            if missing.len() > 1 {
                format!(" (and {} more)", missing.len() - 1)
            } else {
                String::new()
            }
        );
    }
    Ok(())
}
