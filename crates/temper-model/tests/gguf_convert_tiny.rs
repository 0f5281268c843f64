//! Conversion of tiny random llama/qwen2/qwen3 GGUF files (tools/gguf_make_tiny.py, written with the
//! reference `gguf` package) against transformers' own GGUF import: identical parameters, logits,
//! tokenization and chat template; the llama Q/K un-permutation against the pre-permutation weights;
//! and broken inputs as one-line errors that name the file and tensor and write nothing.

mod gguf_util;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde_json::Value;
use temper_model::gguf::convert_gguf;

/// The tiny GGUF files, generated once per test process.
fn tiny_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = gguf_util::scratch("tiny");
        gguf_util::run_tool("gguf_make_tiny.py", &[&d]);
        d
    })
}

#[test]
fn tiny_models_match_transformers_gguf_import() {
    let dir = tiny_dir();
    let out = gguf_util::scratch("tiny-out");
    let mut args: Vec<PathBuf> = Vec::new();
    for arch in ["llama", "qwen2", "qwen3"] {
        let gguf = dir.join(format!("tiny-{arch}.gguf"));
        let hf = out.join(arch);
        let report = convert_gguf(&gguf, &hf).unwrap();
        assert!(report.warnings.is_empty(), "{arch}: {:?}", report.warnings);
        let truth = dir.join(format!("tiny-{arch}.truth.npz"));
        args.extend([
            gguf,
            hf,
            if truth.exists() {
                truth
            } else {
                PathBuf::from("-")
            },
        ]);
    }
    let refs: Vec<&Path> = args.iter().map(|p| p.as_path()).collect();
    let stdout = gguf_util::run_tool("gguf_check_hf.py", &refs);
    let results: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(results.len(), 3, "{stdout}");
    for (arch, r) in ["llama", "qwen2", "qwen3"].iter().zip(&results) {
        assert_eq!(r["state_keys_equal"], true, "{arch}: {r}");
        // Same dequantized values, same names, same (un)permutation: bit-identical parameters.
        assert_eq!(r["state_max_diff"].as_f64().unwrap(), 0.0, "{arch}: {r}");
        assert!(
            r["logits_max_diff"].as_f64().unwrap() <= 1e-5,
            "{arch}: {r}"
        );
        assert_eq!(
            r["tokens_mismatch"].as_array().unwrap().len(),
            0,
            "{arch}: {r}"
        );
        assert_eq!(r["chat_equal"], true, "{arch}: {r}");
    }
    // The llama file's Q/K rows were permuted by llama.cpp's own `permute`; un-permuted they must
    // be the original weights exactly (stored as F32/F16, so no quantization error).
    assert_eq!(results[0]["truth_count"], 4, "{}", results[0]);
    assert_eq!(
        results[0]["truth_max_diff"].as_f64().unwrap(),
        0.0,
        "{}",
        results[0]
    );
    std::fs::remove_dir_all(&out).unwrap();
}

#[test]
fn converted_config_has_what_transformers_needs() {
    let out = gguf_util::scratch("tiny-config");
    convert_gguf(&tiny_dir().join("tiny-qwen3.gguf"), &out).unwrap();
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
    // Values written by gguf_make_tiny.py; head_dim (128) differs from hidden / heads (16).
    for (k, v) in [
        ("model_type", Value::from("qwen3")),
        ("hidden_size", 64.into()),
        ("intermediate_size", 256.into()),
        ("num_hidden_layers", 2.into()),
        ("num_attention_heads", 4.into()),
        ("num_key_value_heads", 2.into()),
        ("head_dim", 128.into()),
        ("vocab_size", 300.into()),
        ("max_position_embeddings", 256.into()),
        ("tie_word_embeddings", true.into()),
        ("rope_theta", 1000000.0.into()),
        ("rms_norm_eps", 1e-6.into()),
        ("eos_token_id", 298.into()),
        ("torch_dtype", "float32".into()),
    ] {
        assert_eq!(config[k], v, "{k}");
    }
    let tc: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("tokenizer_config.json")).unwrap())
            .unwrap();
    assert_eq!(tc["eos_token"], "<|im_end|>");
    assert!(tc["chat_template"]
        .as_str()
        .unwrap()
        .contains("<|im_start|>"));
    let gc: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("generation_config.json")).unwrap())
            .unwrap();
    assert_eq!(gc["eos_token_id"], 298);
    // No temporary files are left behind.
    for e in std::fs::read_dir(&out).unwrap() {
        let name = e.unwrap().file_name().into_string().unwrap();
        assert!(!name.starts_with('.'), "leftover {name}");
    }
}

/// Converts `file` expecting failure; returns the one-line error and checks nothing was written.
fn conversion_error(file: &Path) -> String {
    let out = gguf_util::scratch("bad-out").join(file.file_stem().unwrap());
    let err = convert_gguf(file, &out)
        .err()
        .unwrap_or_else(|| panic!("{} converted", file.display()));
    let msg = format!("{err:#}");
    assert!(!msg.contains('\n'), "multi-line error: {msg}");
    assert!(
        msg.contains(&file.display().to_string()),
        "error does not name the file: {msg}"
    );
    assert!(
        !out.join("model.safetensors").exists(),
        "{msg}: output written anyway"
    );
    msg
}

#[test]
fn bad_inputs_are_one_line_errors() {
    let dir = tiny_dir();
    let cases = [
        ("bad-arch.gguf", vec!["unsupported architecture 'falcon'"]),
        ("bad-quant.gguf", vec!["blk.0.ffn_gate.weight", "IQ4_NL"]),
        (
            "missing-tensor.gguf",
            vec!["missing", "model.layers.1.self_attn.q_proj.bias"],
        ),
        (
            "bad-shape.gguf",
            vec!["blk.0.attn_k.weight", "[384, 64]", "expected [256, 64]"],
        ),
        (
            "spm-tokenizer.gguf",
            vec!["tokenizer model 'llama' is not supported"],
        ),
    ];
    for (name, needles) in cases {
        let msg = conversion_error(&dir.join(name));
        for n in needles {
            assert!(msg.contains(n), "{name}: '{n}' not in: {msg}");
        }
    }
    let missing = conversion_error(&dir.join("no-such-file.gguf"));
    assert!(missing.contains("cannot open"), "{missing}");

    // A folder already holding another checkpoint's shards is refused (loaders would mix them up).
    let taken = gguf_util::scratch("taken-out");
    std::fs::write(taken.join("model-00001-of-00002.safetensors"), b"x").unwrap();
    let err = format!(
        "{:#}",
        convert_gguf(&dir.join("tiny-qwen2.gguf"), &taken).unwrap_err()
    );
    assert!(
        err.contains("model-00001-of-00002.safetensors") && err.contains("already holds"),
        "{err}"
    );
    assert!(!taken.join("model.safetensors").exists());

    // A download cut short inside the tensor data names the first tensor that does not fit.
    let full = std::fs::read(dir.join("tiny-qwen2.gguf")).unwrap();
    let cut = dir.join("cut-qwen2.gguf");
    std::fs::write(&cut, &full[..full.len() - 5000]).unwrap();
    let msg = conversion_error(&cut);
    assert!(
        msg.contains("data truncated") && msg.contains("tensor '"),
        "{msg}"
    );
}
