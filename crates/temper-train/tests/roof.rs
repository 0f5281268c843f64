//! The model FLOP count behind `perf/update_tflops` and `bench train`'s TFLOP/s, against the count
//! of PyTorch's own FLOP counter (tests/py/flop_count.py), and the roof measured on the spot.
use temper_model::{Arch, ComputeKind, ModelConfig, Roof};
use temper_testkit as common;

#[test]
fn training_flops_match_pytorchs_flop_counter() {
    let (vocab, hidden, intermediate, layers, heads, kv_heads) = (512, 64, 176, 3, 4, 2);
    let dir = common::temp_dir("flops");
    let config = dir.join("config.json");
    let spec = serde_json::json!({
        "vocab": vocab, "hidden": hidden, "intermediate": intermediate,
        "layers": layers, "heads": heads, "kv_heads": kv_heads,
    });
    std::fs::write(&config, spec.to_string()).unwrap();
    let tokens = 37;
    let out = dir.join("flops.json");
    common::run_py(
        "flop_count.py",
        &[&config, std::path::Path::new(&tokens.to_string()), &out],
    );
    let want: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let want = want["matmul_flops"].as_f64().unwrap();
    let cfg = ModelConfig::qwen2_like(vocab, hidden, intermediate, layers, heads, kv_heads, true);
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
