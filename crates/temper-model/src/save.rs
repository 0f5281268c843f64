//! Saving a Hugging Face folder that transformers loads: `model.safetensors` (HF names; a tied head is
//! omitted, as transformers does), `config.json` (the loaded one with its dtype updated), and the
//! tokenizer / generation files copied from the source folder. The folder appears atomically: it is
//! written under a temporary name beside the target and renamed into place.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use tch::Kind;

use crate::model::CausalLm;
use crate::safetensors_io::write_safetensors;

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
        let dtype_name = match dtype {
            Kind::Float => "float32",
            Kind::BFloat16 => "bfloat16",
            Kind::Half => "float16",
            other => bail!("cannot save weights as {other:?} (f32, bf16 or f16)"),
        };
        let name = dir
            .file_name()
            .with_context(|| format!("{}: not a folder name", dir.display()))?;
        let parent = match dir.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        std::fs::create_dir_all(&parent)
            .with_context(|| format!("creating {}", parent.display()))?;
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let tmp = parent.join(format!(
            ".{}.tmp-{}-{stamp}",
            name.to_string_lossy(),
            std::process::id()
        ));
        std::fs::create_dir(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        let result = self.write_files(&tmp, dtype, dtype_name, files_from);
        if let Err(e) = result {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(e);
        }
        replace_dir(&tmp, dir)
    }

    fn write_files(
        &self,
        tmp: &Path,
        dtype: Kind,
        dtype_name: &str,
        files_from: Option<&Path>,
    ) -> Result<()> {
        let tensors: Vec<(String, tch::Tensor)> = self
            .merged_parameters()
            .into_iter()
            .map(|(n, t)| (n, t.detach().to_kind(dtype)))
            .collect();
        write_safetensors(&tmp.join("model.safetensors"), &tensors)?;
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

/// Rename `tmp` to `dir`; an existing `dir` is moved aside first and removed afterwards.
fn replace_dir(tmp: &Path, dir: &Path) -> Result<()> {
    if dir.exists() {
        let mut old_name = tmp.file_name().unwrap_or_default().to_os_string();
        old_name.push(".old");
        let old = tmp.with_file_name(old_name);
        std::fs::rename(dir, &old)
            .with_context(|| format!("moving old {} aside", dir.display()))?;
        std::fs::rename(tmp, dir)
            .with_context(|| format!("renaming {} to {}", tmp.display(), dir.display()))?;
        std::fs::remove_dir_all(&old).with_context(|| format!("removing {}", old.display()))?;
    } else {
        std::fs::rename(tmp, dir)
            .with_context(|| format!("renaming {} to {}", tmp.display(), dir.display()))?;
    }
    Ok(())
}
