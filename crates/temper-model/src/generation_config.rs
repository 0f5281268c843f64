//! `generation_config.json`: the stop tokens and default sampling settings of a model.

use std::path::Path;

use anyhow::{Context, Result};
use serde_json::Value;

use crate::config::{token_id_list, ModelConfig};
use crate::tokenizer::Tokenizer;

/// What the sampler needs from `generation_config.json`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenerationConfig {
    /// Every token id that ends a completion (never empty when a tokenizer with an EOS is given).
    pub eos_token_ids: Vec<i64>,
    pub bos_token_id: Option<i64>,
    pub pad_token_id: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
}

impl GenerationConfig {
    /// Read `dir/generation_config.json` if present. EOS ids come from its `eos_token_id` (an int or a
    /// list); if absent, from config.json's; if still absent, from the tokenizer's EOS token.
    pub fn from_dir(
        dir: &Path,
        config: Option<&ModelConfig>,
        tokenizer: Option<&Tokenizer>,
    ) -> Result<Self> {
        let path = dir.join("generation_config.json");
        let v: Value = if path.is_file() {
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            serde_json::from_str(&text)
                .with_context(|| format!("{}: not valid JSON", path.display()))?
        } else {
            Value::Null
        };
        let ctx = || format!("in {}", path.display());
        let mut eos = token_id_list(v.get("eos_token_id"), "eos_token_id").with_context(ctx)?;
        if eos.is_empty() {
            eos = config.map(|c| c.eos_token_ids.clone()).unwrap_or_default();
        }
        if eos.is_empty() {
            eos.extend(tokenizer.and_then(Tokenizer::eos_id));
        }
        let first = |key: &str| -> Result<Option<i64>> {
            Ok(token_id_list(v.get(key), key)
                .with_context(ctx)?
                .first()
                .copied())
        };
        Ok(GenerationConfig {
            eos_token_ids: eos,
            bos_token_id: first("bos_token_id")?.or(config.and_then(|c| c.bos_token_id)),
            pad_token_id: first("pad_token_id")?.or(config.and_then(|c| c.pad_token_id)),
            temperature: v.get("temperature").and_then(Value::as_f64),
            top_p: v.get("top_p").and_then(Value::as_f64),
            top_k: v.get("top_k").and_then(Value::as_i64),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir_with(name: &str, gen: Option<&str>) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("temper-genconf-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        if let Some(g) = gen {
            std::fs::write(d.join("generation_config.json"), g).unwrap();
        }
        d
    }

    fn config(eos: serde_json::Value) -> ModelConfig {
        let mut v = serde_json::json!({"architectures": ["LlamaForCausalLM"], "vocab_size": 10,
            "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2});
        v["eos_token_id"] = eos;
        ModelConfig::from_value(v).unwrap()
    }

    #[test]
    fn eos_list_int_and_fallbacks() {
        let d = dir_with(
            "list",
            Some(r#"{"eos_token_id": [2, 7], "temperature": 0.6, "top_p": 0.9, "top_k": 20}"#),
        );
        let g = GenerationConfig::from_dir(&d, Some(&config(9.into())), None).unwrap();
        assert_eq!(g.eos_token_ids, vec![2, 7]);
        assert_eq!(
            (g.temperature, g.top_p, g.top_k),
            (Some(0.6), Some(0.9), Some(20))
        );
        let d = dir_with("int", Some(r#"{"eos_token_id": 4, "pad_token_id": 0}"#));
        let g = GenerationConfig::from_dir(&d, None, None).unwrap();
        assert_eq!((g.eos_token_ids, g.pad_token_id), (vec![4], Some(0)));
        let d = dir_with("none", None);
        let g =
            GenerationConfig::from_dir(&d, Some(&config(serde_json::json!([3, 5]))), None).unwrap();
        assert_eq!(g.eos_token_ids, vec![3, 5]);
    }

    #[test]
    fn bad_file_is_an_error_naming_it() {
        let d = dir_with("bad", Some(r#"{"eos_token_id": "x"}"#));
        let e = format!(
            "{:#}",
            GenerationConfig::from_dir(&d, None, None).unwrap_err()
        );
        assert!(
            e.contains("generation_config.json") && e.contains("eos_token_id"),
            "{e}"
        );
    }
}
