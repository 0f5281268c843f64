//! A policy as every caller loads it: the model, its tokenizer (when the folder has one), and the
//! token ids sampling and batching need (EOS from generation_config.json or the tokenizer; pad
//! from generation_config.json, the tokenizer, or the first EOS). The trainer, `temper sample`
//! and `score`, the serving worker and Tinker's samplers load through [`Policy::load`].

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use tch::Device;

use crate::{CausalLm, ComputeKind, GenerationConfig, Tokenizer};

pub struct Policy {
    pub model: CausalLm,
    /// None when the folder has no `tokenizer.json` (prompts must then be given as ids).
    pub tokenizer: Option<Tokenizer>,
    /// Ids that end a sample (may be empty for a folder that names none).
    pub eos_ids: Vec<i64>,
    /// The padding id of batches: generation_config.json's, the tokenizer's, or the first EOS
    /// (None when there is none of them).
    pub pad_id: Option<i64>,
    /// The folder the weights came from.
    pub dir: PathBuf,
}

impl Policy {
    /// The model folder `dir` with its own tokenizer, if it has one.
    pub fn load(dir: &Path, device: Device, compute: ComputeKind) -> Result<Policy> {
        Self::load_with_tokenizer(dir, dir, false, device, compute)
    }

    /// The weights of `dir` with the tokenizer of `tokenizer_dir` (required when `need_tokenizer`;
    /// otherwise used when that folder has a `tokenizer.json`). A `tokenizer.json` that exists but
    /// does not load is an error, never a model without a tokenizer.
    pub fn load_with_tokenizer(
        dir: &Path,
        tokenizer_dir: &Path,
        need_tokenizer: bool,
        device: Device,
        compute: ComputeKind,
    ) -> Result<Policy> {
        let model = CausalLm::load(dir, device, compute)
            .with_context(|| format!("loading model {}", dir.display()))?;
        let tokenizer = if need_tokenizer {
            Some(
                Tokenizer::from_dir(tokenizer_dir)
                    .with_context(|| format!("tokenizer of {}", tokenizer_dir.display()))?,
            )
        } else {
            Tokenizer::from_dir_if_present(tokenizer_dir)?
        };
        let gen = GenerationConfig::from_dir(dir, Some(model.config()), tokenizer.as_ref())?;
        let pad_id = gen
            .pad_token_id
            .or(tokenizer.as_ref().and_then(Tokenizer::pad_id))
            .or(gen.eos_token_ids.first().copied());
        Ok(Policy {
            model,
            tokenizer,
            eos_ids: gen.eos_token_ids,
            pad_id,
            dir: dir.to_path_buf(),
        })
    }

    /// The EOS ids, refused when the folder names none (sampling would never stop).
    pub fn require_eos(&self) -> Result<&[i64]> {
        if self.eos_ids.is_empty() {
            bail!(
                "{}: the model has no EOS token id (generation_config.json / tokenizer)",
                self.dir.display()
            );
        }
        Ok(&self.eos_ids)
    }
}
