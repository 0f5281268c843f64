//! Tokenizer and chat templates against transformers (tools/model_chat_reference.py): the SmolLM2,
//! Qwen2.5 and Qwen3 templates plus a template exercising tojson / namespace / loop controls / string
//! methods, each with and without `add_generation_prompt`; encode/decode and special-token ids.
mod common;

use std::path::PathBuf;
use std::sync::OnceLock;

use common::{run_tool, scratch};
use serde_json::Value;
use temper_model::{ChatMessage, Tokenizer};

fn refs() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let templates =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat_templates");
        let out = scratch("chat");
        run_tool(
            "model_chat_reference.py",
            &[
                "--templates",
                templates.to_str().unwrap(),
                "--out",
                out.to_str().unwrap(),
            ],
        );
        out
    })
}

fn load(name: &str) -> (Tokenizer, Value) {
    let dir = refs().join(name);
    let v: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    (Tokenizer::from_dir(&dir).unwrap(), v)
}

fn check_templates(name: &str) {
    let (tok, r) = load(name);
    let convs: Vec<Vec<ChatMessage>> = serde_json::from_value(r["conversations"].clone()).unwrap();
    let rendered: Vec<String> = serde_json::from_value(r["rendered"].clone()).unwrap();
    let mut k = 0;
    for conv in &convs {
        for g in [false, true] {
            let got = tok.apply_chat_template(conv, g).unwrap();
            assert_eq!(
                got,
                rendered[k],
                "{name}: conversation {} add_generation_prompt={g}",
                k / 2
            );
            k += 1;
        }
    }
}

#[test]
fn smollm2_template_matches_transformers() {
    check_templates("smollm2");
}

#[test]
fn qwen2_5_template_matches_transformers() {
    check_templates("qwen2_5");
}

#[test]
fn qwen3_template_matches_transformers() {
    check_templates("qwen3");
    let (tok, r) = load("qwen3");
    let convs: Vec<Vec<ChatMessage>> = serde_json::from_value(r["conversations"].clone()).unwrap();
    let got = tok
        .apply_chat_template_with(&convs[1], true, &[("enable_thinking", false.into())])
        .unwrap();
    assert_eq!(got, r["rendered_no_thinking"].as_str().unwrap());
}

#[test]
fn template_features_match_jinja2() {
    check_templates("features");
}

#[test]
fn raise_exception_is_an_error() {
    let (tok, _) = load("features");
    let e = tok
        .apply_chat_template(&[ChatMessage::new("robot", "hi")], false)
        .unwrap_err();
    assert!(format!("{e:#}").contains("Unknown role: robot"), "{e:#}");
}

#[test]
fn encode_decode_and_special_ids_match_transformers() {
    for name in ["smollm2", "qwen3"] {
        let (tok, r) = load(name);
        let texts: Vec<String> = serde_json::from_value(r["texts"].clone()).unwrap();
        for (i, text) in texts.iter().enumerate() {
            let with: Vec<i64> = serde_json::from_value(r["encoded"][i].clone()).unwrap();
            let plain: Vec<i64> = serde_json::from_value(r["encoded_plain"][i].clone()).unwrap();
            assert_eq!(
                tok.encode(text, true).unwrap(),
                with,
                "{name}: encode({text:?}, add_special_tokens=true)"
            );
            assert_eq!(
                tok.encode(text, false).unwrap(),
                plain,
                "{name}: encode({text:?}, false)"
            );
            assert_eq!(
                tok.decode(&with, false).unwrap(),
                r["decoded"][i].as_str().unwrap(),
                "{name}: decode"
            );
            assert_eq!(
                tok.decode(&with, true).unwrap(),
                r["decoded_skip"][i].as_str().unwrap(),
                "{name}: decode skip"
            );
        }
        assert_eq!(tok.bos_id(), r["bos_id"].as_i64(), "{name}: bos");
        assert_eq!(tok.eos_id(), r["eos_id"].as_i64(), "{name}: eos");
        assert_eq!(tok.pad_id(), r["pad_id"].as_i64(), "{name}: pad");
    }
}

#[test]
fn missing_tokenizer_file_is_an_error() {
    let e = Tokenizer::from_dir(std::path::Path::new("/nonexistent/tok")).unwrap_err();
    assert!(
        format!("{e:#}").contains("/nonexistent/tok/tokenizer.json"),
        "{e:#}"
    );
}
