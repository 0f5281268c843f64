//! Saving a Hugging Face folder that transformers loads: `model.safetensors` (HF names; a tied head is
//! omitted, as transformers does), `config.json` (the loaded one with its dtype updated), and the
//! tokenizer / generation files copied from the source folder. The folder appears atomically
//! ([`temper_base::atomic_dir`]): a replaced folder's old version stays until the new one is in place.

use std::path::Path;

use anyhow::{bail, Context, Result};
use tch::Kind;

use crate::model::CausalLm;
use crate::safetensors_io::write_safetensors_as;

/// Files copied verbatim from the source folder when present.
pub const TOKENIZER_FILES: &[&str] = &[
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
];

impl CausalLm {
    /// Save f32 weights + config + the source folder's tokenizer files into `dir` (replacing it).
    pub fn save(&self, dir: &Path) -> Result<()> {
        self.save_as(dir, Kind::Float, self.source_dir())
    }

    /// [`CausalLm::save`] of a model whose decoder layers are elsewhere between uses (a sharded
    /// run's, [`CausalLm::set_layer_residency`]): each layer is fetched, written and let go in
    /// turn, so one layer's weights are whole at a time, never the model. Each fetch may be a
    /// collective: the other ranks call [`CausalLm::sweep_layers`] meanwhile.
    pub fn save_by_layer(&self, dir: &Path) -> Result<()> {
        self.save_with(dir, Kind::Float, self.source_dir(), true)
    }

    /// What a rank does while another writes [`CausalLm::save_by_layer`]: the same fetch and
    /// let-go of every decoder layer, in the same order.
    pub fn sweep_layers(&self) {
        self.sweep_layers_without_compute();
    }

    /// The weights of [`CausalLm::save_by_layer`] to `path`: the parameters outside the layers,
    /// then each layer's, fetched, copied in `dtype` and let go before they are written.
    fn write_weights_by_layer(&self, path: &Path, dtype: Kind) -> Result<()> {
        let parts = self.parts();
        let names: Vec<Vec<String>> = parts.iter().map(|&p| self.merged_names(p)).collect();
        crate::safetensors_io::write_safetensors_by_group(path, &names, Some(dtype), &mut |g| {
            Ok(self.with_part(parts[g], |params| {
                tch::no_grad(|| {
                    params
                        .into_iter()
                        .map(|(_, t)| t.to_device(tch::Device::Cpu).to_kind(dtype).copy())
                        .collect()
                })
            }))
        })
    }

    /// Save with weights in `dtype` (f32, bf16 or f16) and tokenizer files from `files_from`.
    pub fn save_as(&self, dir: &Path, dtype: Kind, files_from: Option<&Path>) -> Result<()> {
        self.save_with(dir, dtype, files_from, false)
    }

    /// The folder of [`CausalLm::save_as`], its weights written whole or `by_layer`.
    fn save_with(
        &self,
        dir: &Path,
        dtype: Kind,
        files_from: Option<&Path>,
        by_layer: bool,
    ) -> Result<()> {
        let dtype_name = match crate::dtype::torch_dtype_name(dtype) {
            Some(name) if dtype != Kind::Double => name,
            _ => bail!("cannot save weights as {dtype:?} (f32, bf16 or f16)"),
        };
        temper_base::atomic_dir::write_dir_atomically(dir, |tmp| {
            self.write_files(tmp, dtype, dtype_name, files_from, by_layer)
        })
    }

    fn write_files(
        &self,
        tmp: &Path,
        dtype: Kind,
        dtype_name: &str,
        files_from: Option<&Path>,
        by_layer: bool,
    ) -> Result<()> {
        let weights = tmp.join("model.safetensors");
        match by_layer {
            true => self.write_weights_by_layer(&weights, dtype)?,
            false => write_safetensors_as(&weights, &self.merged_parameters(), Some(dtype))?,
        }
        let mut config = self.config().raw.clone();
        if let Some(obj) = config.as_object_mut() {
            if self.unties_head() {
                obj.insert("tie_word_embeddings".into(), false.into());
            }
            // transformers 5 reads `dtype`, older versions `torch_dtype`.
            obj.insert("dtype".into(), dtype_name.into());
            if obj.contains_key("torch_dtype") {
                obj.insert("torch_dtype".into(), dtype_name.into());
            }
        }
        let text = serde_json::to_string_pretty(&config)?;
        let cfg = tmp.join("config.json");
        std::fs::write(&cfg, text + "\n").with_context(|| format!("writing {}", cfg.display()))?;
        if let Some(src) = files_from {
            for f in TOKENIZER_FILES {
                let from = src.join(f);
                if from.is_file() {
                    std::fs::copy(&from, tmp.join(f)).with_context(|| {
                        format!("copying {} into {}", from.display(), tmp.display())
                    })?;
                }
            }
        }
        Ok(())
    }
}
