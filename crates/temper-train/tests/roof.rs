//! The model FLOP count behind `perf/update_tflops` and `bench train`'s TFLOP/s, against the count
//! of PyTorch's own FLOP counter (tests/py/flop_count.py), and the roof measured on the spot.
use std::path::PathBuf;
use temper_model::{Arch, ComputeKind, ModelConfig, Roof};
use temper_testkit as common;

/// The small Qwen2 shape both references build, written for them as `<tag>/config.json`: the
/// folder, that file, and temper's config of the same shape.
fn qwen2_shape(tag: &str) -> (PathBuf, PathBuf, ModelConfig) {
    let (vocab, hidden, intermediate, layers, heads, kv_heads) = (512, 64, 176, 3, 4, 2);
    let dir = common::temp_dir(tag);
    let config = dir.join("config.json");
    let spec = serde_json::json!({
        "vocab": vocab, "hidden": hidden, "intermediate": intermediate,
        "layers": layers, "heads": heads, "kv_heads": kv_heads,
    });
    std::fs::write(&config, spec.to_string()).unwrap();
    let cfg = ModelConfig::qwen2_like(vocab, hidden, intermediate, layers, heads, kv_heads, true);
    (dir, config, cfg)
}

#[test]
fn training_flops_match_pytorchs_flop_counter() {
    let (dir, config, cfg) = qwen2_shape("flops");
    let tokens = 37;
    let out = dir.join("flops.json");
    common::run_py(
        "flop_count.py",
        &[&config, std::path::Path::new(&tokens.to_string()), &out],
    );
    let want: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let want = want["matmul_flops"].as_f64().unwrap();
    assert_eq!(cfg.arch, Arch::Qwen2);
    let ours = cfg.training_flops(tokens as f64, tokens as f64, true);
    assert_eq!(
        ours, want,
        "temper counts {ours} FLOPs, PyTorch's counter {want}"
    );
}

#[test]
fn the_roof_is_measured_and_positive() {
    let roof = Roof::measure(ComputeKind::F32, tch::Device::Cpu);
    assert!(
        roof.matmul_flops.is_finite() && roof.matmul_flops > 1e8,
        "{roof:?}"
    );
    assert!(
        roof.copy_bytes.is_finite() && roof.copy_bytes > 1e8,
        "{roof:?}"
    );
    let line = roof.describe(ComputeKind::F32);
    assert!(line.contains("2048^3 f32 matmul"), "{line}");
}

/// `perf/decode_*`'s inputs: the decode steps the engine counts (rows, steps, attended
/// positions), read as bytes and FLOPs, against transformers' own model and cache on the same
/// shape (tests/py/decode_work.py: its Linear weights, its DynamicCache's tensors after each
/// step, PyTorch's FLOP counter over the decode forwards).
#[test]
fn decode_work_matches_transformers_cache_and_flop_counter() {
    let (rows, prompt, new) = (3usize, 7usize, 5usize);
    let (dir, config, cfg) = qwen2_shape("decode_work");
    let vocab = cfg.vocab_size;
    let out = dir.join("decode_work.json");
    let arg = |n: usize| std::path::PathBuf::from(n.to_string());
    common::run_py(
        "decode_work.py",
        &[&config, &arg(rows), &arg(prompt), &arg(new), &out],
    );
    let want: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let num = |k: &str| want[k].as_f64().unwrap();

    let model = temper_model::CausalLm::random(cfg.clone(), 7, tch::Device::Cpu, ComputeKind::F32);
    let requests: Vec<temper_rollout::Request> = (0..rows)
        .map(|i| temper_rollout::Request {
            prompt_ids: (0..prompt as i64)
                .map(|t| (t * 31 + i as i64) % vocab)
                .collect(),
            params: temper_rollout::SamplingParams {
                max_tokens: new,
                min_tokens: new,
                seed: Some(i as u64),
                ..Default::default()
            },
        })
        .collect();
    let engine =
        temper_rollout::Engine::new(&model, vec![]).with_config(temper_rollout::EngineConfig {
            max_batch_rows: rows,
            ..Default::default()
        });
    let samples = engine.generate(&requests, &mut |_| {}).unwrap();
    assert!(samples.iter().all(|s| s.completion_ids.len() == new));
    let work = engine.decode_work();
    let steps = (new - 1) as f64;
    assert_eq!(work.steps as f64, steps, "{work:?}");
    assert_eq!(
        work.bytes(&cfg, ComputeKind::F32),
        num("weight_bytes") * steps + num("kv_bytes"),
        "{work:?}"
    );
    assert_eq!(work.flops(&cfg), num("flops"), "{work:?}");
    assert!(work.seconds > 0.0);
}
