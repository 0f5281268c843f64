//! A long datum at bounded memory: a forward_backward pass over one datum longer than a pass may
//! be keeps only each layer's input and runs the layers again in the backward. Its gradients are
//! the plain backward's (to float rounding), and its peak memory is a fraction of the plain
//! pass's: one 8,192-token datum on a small 8-layer model, the process's peak resident memory
//! measured around each call (Linux: `/proc/self/clear_refs` resets the peak).
use std::collections::BTreeMap;

use tch::{Device, Tensor};
use temper_model::{CausalLm, ComputeKind, ModelConfig};
use temper_tinker::{Datum, TensorData, TrainingModel};

const TOKENS: usize = 8192;

fn model() -> TrainingModel {
    let cfg = ModelConfig::qwen2_like(260, 128, 512, 8, 4, 2, false);
    TrainingModel::new(CausalLm::random(cfg, 5, Device::Cpu, ComputeKind::F32))
}

fn datum() -> Datum {
    let ids: Vec<i64> = (0..=TOKENS as i64).map(|i| (i * 7919 + 13) % 260).collect();
    let mut inputs = BTreeMap::new();
    inputs.insert("target_tokens".into(), TensorData::I64(ids[1..].to_vec()));
    inputs.insert("weights".into(), TensorData::F32(vec![1.0; TOKENS]));
    Datum::new(ids[..TOKENS].to_vec(), inputs)
}

fn status_kib(field: &str) -> u64 {
    let text = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = text.lines().find(|l| l.starts_with(field)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// The gradients of one forward_backward and how far the process's peak resident memory rose
/// above its resident memory before the call (MiB).
fn forward_backward(checkpoint_above: usize) -> (Vec<Tensor>, f64) {
    let mut tm = model();
    tm.set_checkpoint_above(checkpoint_above);
    let d = datum();
    let before = status_kib("VmRSS:");
    std::fs::write("/proc/self/clear_refs", "5").unwrap();
    tm.forward_backward(&[d], "cross_entropy", &BTreeMap::new())
        .unwrap();
    let peak = status_kib("VmHWM:");
    let grads = tm
        .model
        .trainable_parameters()
        .iter()
        .map(|(_, p)| p.grad().copy())
        .collect();
    (grads, (peak.saturating_sub(before)) as f64 / 1024.0)
}

#[test]
fn a_long_datum_is_checkpointed_same_gradients_a_fraction_of_the_memory() {
    // Each in its own model; the plain pass first, so that whatever the allocator keeps from it
    // can only lower the second call's rise.
    let (plain, plain_mib) = forward_backward(usize::MAX);
    let (checkpointed, checkpointed_mib) = forward_backward(0);
    println!(
        "peak rise over RSS: plain {plain_mib:.0} MiB, checkpointed {checkpointed_mib:.0} MiB"
    );
    for (a, b) in plain.iter().zip(&checkpointed) {
        let scale = a.abs().max().double_value(&[]).max(1e-6);
        let diff = (a - b).abs().max().double_value(&[]);
        assert!(
            diff <= 1e-4 * scale,
            "gradient differs by {diff} (scale {scale})"
        );
    }
    assert!(
        checkpointed_mib < plain_mib / 2.0,
        "checkpointed {checkpointed_mib:.0} MiB vs plain {plain_mib:.0} MiB"
    );
}
