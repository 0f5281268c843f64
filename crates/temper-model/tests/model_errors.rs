//! Bad input gives a one-line error naming the file and tensor, never a panic.
mod common;

use std::path::{Path, PathBuf};

use common::scratch;
use tch::Device;
use temper_model::safetensors_io::write_safetensors;
use temper_model::{CausalLm, ComputeKind, ModelConfig};

fn good_folder(name: &str) -> PathBuf {
    let cfg = ModelConfig::qwen2_like(40, 16, 24, 2, 2, 1, false);
    let model = CausalLm::random(cfg, 1, Device::Cpu, ComputeKind::F32);
    let dir = scratch(name).join("m");
    model.save(&dir).unwrap();
    dir
}

fn load_err(dir: &Path) -> String {
    let e = CausalLm::load(dir, Device::Cpu, ComputeKind::F32).expect_err("load should fail");
    let msg = format!("{e:#}");
    assert!(!msg.contains('\n'), "error is not one line: {msg}");
    msg
}

fn edit_config(dir: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let p = dir.join("config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(&p, v.to_string()).unwrap();
}

#[test]
fn good_folder_loads() {
    let dir = good_folder("ok");
    CausalLm::load(&dir, Device::Cpu, ComputeKind::F32).unwrap();
}

#[test]
fn missing_folder_and_files() {
    let msg = load_err(Path::new("/nonexistent/model"));
    assert!(msg.contains("/nonexistent/model"), "{msg}");
    let dir = good_folder("nocfg");
    std::fs::remove_file(dir.join("config.json")).unwrap();
    let msg = load_err(&dir);
    assert!(msg.contains("config.json"), "{msg}");
    let dir = good_folder("noweights");
    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    let msg = load_err(&dir);
    assert!(msg.contains("model.safetensors"), "{msg}");
}

#[test]
fn corrupt_files() {
    let dir = good_folder("corrupt");
    std::fs::write(
        dir.join("model.safetensors"),
        b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}",
    )
    .unwrap();
    let msg = load_err(&dir);
    assert!(msg.contains("model.safetensors"), "{msg}");
    let dir = good_folder("truncated");
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    std::fs::write(dir.join("model.safetensors"), &bytes[..bytes.len() / 2]).unwrap();
    let msg = load_err(&dir);
    assert!(msg.contains("model.safetensors"), "{msg}");
    let dir = good_folder("badjson");
    std::fs::write(dir.join("config.json"), "{\"vocab_size\": ").unwrap();
    let msg = load_err(&dir);
    assert!(msg.contains("config.json"), "{msg}");
}

#[test]
fn unknown_architecture() {
    let dir = good_folder("arch");
    edit_config(&dir, |v| {
        v["architectures"] = serde_json::json!(["GPT2LMHeadModel"]);
        v["model_type"] = "gpt2".into();
    });
    let msg = load_err(&dir);
    assert!(
        msg.contains("GPT2LMHeadModel") && msg.contains("config.json"),
        "{msg}"
    );
}

#[test]
fn shape_mismatch_names_tensor_and_file() {
    let dir = good_folder("shape");
    edit_config(&dir, |v| v["intermediate_size"] = 30.into());
    let msg = load_err(&dir);
    assert!(
        msg.contains("model.safetensors")
            && msg.contains("tensor `model.layers.0.mlp.down_proj.weight` has shape [16, 24]"),
        "{msg}"
    );
    assert!(msg.contains("[16, 30]"), "{msg}");
}

#[test]
fn missing_and_unexpected_tensors() {
    let dir = good_folder("layers");
    edit_config(&dir, |v| v["num_hidden_layers"] = 3.into());
    let msg = load_err(&dir);
    assert!(
        msg.contains("model.layers.2.") && msg.contains("missing"),
        "{msg}"
    );
    let dir = good_folder("fewer");
    edit_config(&dir, |v| v["num_hidden_layers"] = 1.into());
    let msg = load_err(&dir);
    assert!(msg.contains("unexpected tensor `model.layers.1."), "{msg}");
}

#[test]
fn sharded_index_loads_and_a_missing_shard_is_named() {
    let dir = good_folder("shard");
    let model = CausalLm::load(&dir, Device::Cpu, ComputeKind::F32).unwrap();
    let params = model.named_parameters();
    let mut map = serde_json::Map::new();
    let mut shards: [Vec<(String, tch::Tensor)>; 2] = [vec![], vec![]];
    for (i, (n, t)) in params.iter().enumerate() {
        let f = format!("model-0000{}-of-00002.safetensors", 1 + i % 2);
        map.insert(n.clone(), f.into());
        shards[i % 2].push((n.clone(), t.shallow_clone()));
    }
    for (i, s) in shards.iter().enumerate() {
        write_safetensors(
            &dir.join(format!("model-0000{}-of-00002.safetensors", i + 1)),
            s,
        )
        .unwrap();
    }
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        serde_json::json!({"weight_map": map}).to_string(),
    )
    .unwrap();
    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    let sharded = CausalLm::load(&dir, Device::Cpu, ComputeKind::F32).unwrap();
    for ((n, a), (_, b)) in params.iter().zip(sharded.named_parameters().iter()) {
        assert!(a.equal(b), "{n} differs after sharded load");
    }
    std::fs::remove_file(dir.join("model-00002-of-00002.safetensors")).unwrap();
    let msg = load_err(&dir);
    assert!(
        msg.contains("model-00002-of-00002.safetensors") && msg.contains("missing"),
        "{msg}"
    );
}
