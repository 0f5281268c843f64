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

/// The streaming reader gives what libtorch's whole-file reader gives (names, dtypes, shapes,
/// values) for every dtype a checkpoint carries, and refuses a header whose offsets do not match
/// a tensor's bytes or run past the file, naming the file and the tensor.
#[test]
fn the_streaming_safetensors_reader_equals_libtorchs() {
    use tch::{Kind, Tensor};
    use temper_model::safetensors_io::for_each_tensor;
    let dir = scratch("streaming-reader");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("t.safetensors");
    let tensors = vec![
        (
            "b.f32".to_string(),
            Tensor::randn([3, 5], (Kind::Float, Device::Cpu)),
        ),
        (
            "a.bf16".into(),
            Tensor::randn([7], (Kind::Float, Device::Cpu)).to_kind(Kind::BFloat16),
        ),
        (
            "c.f16".into(),
            Tensor::randn([2, 2, 2], (Kind::Float, Device::Cpu)).to_kind(Kind::Half),
        ),
        ("d.i64".into(), Tensor::from_slice(&[3i64, -1, 9])),
        (
            "e.scalar".into(),
            Tensor::from_slice(&[2.5f64]).reshape([] as [i64; 0]),
        ),
        (
            "f.empty".into(),
            Tensor::zeros([0, 4], (Kind::Float, Device::Cpu)),
        ),
    ];
    write_safetensors(&path, &tensors).unwrap();
    let mut want = Tensor::read_safetensors(&path).unwrap();
    want.sort_by(|a, b| a.0.cmp(&b.0));
    let mut got = vec![];
    for_each_tensor(&path, |n, t| {
        got.push((n, t));
        Ok(())
    })
    .unwrap();
    assert_eq!(got.len(), want.len());
    for ((gn, g), (wn, w)) in got.iter().zip(&want) {
        assert_eq!(gn, wn);
        assert_eq!((g.kind(), g.size()), (w.kind(), w.size()), "{gn}");
        assert!(g.equal(w), "{gn}");
    }

    // A tensor whose offsets say fewer bytes than its shape needs, and one past the file's end.
    let bytes = std::fs::read(&path).unwrap();
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = String::from_utf8(bytes[8..8 + header_len].to_vec()).unwrap();
    let rewrite = |from: &str, to: &str| {
        let h = header.replacen(from, to, 1);
        let mut h = h.into_bytes();
        h.resize(header_len, b' ');
        let mut b = bytes.clone();
        b[8..8 + header_len].copy_from_slice(&h);
        std::fs::write(&path, b).unwrap();
        let e = for_each_tensor(&path, |_, _| Ok(())).unwrap_err();
        format!("{e:#}")
    };
    let msg = rewrite("\"shape\":[3,5]", "\"shape\":[3,6]");
    assert!(
        msg.contains("t.safetensors") && msg.contains("b.f32"),
        "{msg}"
    );
    let msg = rewrite("\"dtype\":\"I64\"", "\"dtype\":\"Q4\"");
    assert!(
        msg.contains("unsupported dtype") && msg.contains("d.i64"),
        "{msg}"
    );
    // A negative size with reversed offsets, and offsets that overflow: errors, not panics.
    let msg = rewrite("\"shape\":[3]", "\"shape\":[-3]");
    assert!(msg.contains("d.i64"), "{msg}");
    let huge = format!("[{},{}]", u64::MAX - 1, u64::MAX);
    let (from, to) = {
        let i = header.find("\"d.i64\"").unwrap();
        let j = i + header[i..].find("data_offsets\":").unwrap() + "data_offsets\":".len();
        let k = j + header[j..].find(']').unwrap() + 1;
        (header[j..k].to_string(), huge)
    };
    let h = header.replacen(&from, &to, 1);
    assert!(h.len() <= header_len + 40);
    let mut b = (h.len() as u64).to_le_bytes().to_vec();
    b.extend(h.as_bytes());
    b.extend(&bytes[8 + header_len..]);
    std::fs::write(&path, b).unwrap();
    let e = for_each_tensor(&path, |_, _| Ok(())).unwrap_err();
    assert!(format!("{e:#}").contains("d.i64"), "{e:#}");
    std::fs::write(&path, &bytes[..bytes.len() - 4]).unwrap();
    let e = for_each_tensor(&path, |_, _| Ok(())).unwrap_err();
    assert!(format!("{e:#}").contains("data section"), "{e:#}");
}
