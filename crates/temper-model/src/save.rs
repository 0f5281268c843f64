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

    /// Save with weights in `dtype` (f32, bf16 or f16) and tokenizer files from `files_from`.
    pub fn save_as(&self, dir: &Path, dtype: Kind, files_from: Option<&Path>) -> Result<()> {
        let dtype_name = match crate::dtype::torch_dtype_name(dtype) {
            Some(name) if dtype != Kind::Double => name,
            _ => bail!("cannot save weights as {dtype:?} (f32, bf16 or f16)"),
        };
        temper_base::atomic_dir::write_dir_atomically(dir, |tmp| {
            self.write_files(tmp, dtype, dtype_name, files_from)
        })
    }

    fn write_files(
        &self,
        tmp: &Path,
        dtype: Kind,
        dtype_name: &str,
        files_from: Option<&Path>,
    ) -> Result<()> {
        write_safetensors_as(
            &tmp.join("model.safetensors"),
            &self.merged_parameters(),
            Some(dtype),
        )?;
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
