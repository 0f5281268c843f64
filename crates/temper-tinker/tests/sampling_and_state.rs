//! Tinker's sampling and state semantics on temper-tinker: a sampler snapshot keeps its weights
//! while training goes on; `compute_logprobs` equals `forward`'s logprobs for the same tokens, and
//! the sampled tokens' logprobs; seeded sampling reproduces; a stop token ends a sample and is
//! kept; save_state / load_state with and without the optimizer.
use std::collections::BTreeMap;
use std::path::PathBuf;

use tch::Device;
use temper_model::{CausalLm, ComputeKind, ModelConfig};
use temper_tinker::{AdamParams, Datum, TensorData, TinkerSamplingParams, TrainingModel};

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("temper-tinker-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn training_model(tag: &str) -> TrainingModel {
    let dir = scratch(&format!("base-{tag}"));
    let cfg = ModelConfig::qwen2_like(97, 32, 48, 2, 4, 2, false);
    CausalLm::random(cfg, 5, Device::Cpu, ComputeKind::F32)
        .save(&dir)
        .unwrap();
    TrainingModel::new(CausalLm::load(&dir, Device::Cpu, ComputeKind::F32).unwrap())
}

const TOKENS: [i64; 7] = [3, 14, 15, 92, 65, 35, 89];

fn ce_datum() -> Datum {
    let n = TOKENS.len() - 1;
    let mut inputs = BTreeMap::new();
    inputs.insert(
        "target_tokens".into(),
        TensorData::I64(TOKENS[1..].to_vec()),
    );
    inputs.insert("weights".into(), TensorData::F32(vec![1.0; n]));
    Datum::new(TOKENS[..n].to_vec(), inputs)
}

#[test]
fn a_sampler_snapshot_keeps_its_weights_and_agrees_with_forward() {
    let mut tm = training_model("snap");
    let s1 = tm.save_weights_for_sampler(&scratch("snap-1")).unwrap();
    let lp1 = s1.compute_logprobs(&TOKENS).unwrap();
    assert_eq!(lp1[0], None);
    let none = BTreeMap::new();
    let fwd = tm.forward(&[ce_datum()], "cross_entropy", &none).unwrap();
    for (a, b) in lp1[1..].iter().zip(&fwd.logprobs[0]) {
        assert!(
            (a.unwrap() - b).abs() < 1e-6,
            "compute_logprobs {a:?} vs forward {b}"
        );
    }
    tm.forward_backward(&[ce_datum()], "cross_entropy", &none)
        .unwrap();
    tm.optim_step(&AdamParams {
        learning_rate: 1e-2,
        ..AdamParams::default()
    })
    .unwrap();
    assert_eq!(
        s1.compute_logprobs(&TOKENS).unwrap(),
        lp1,
        "the snapshot changed"
    );
    let s2 = tm.save_weights_for_sampler(&scratch("snap-2")).unwrap();
    let lp2 = s2.compute_logprobs(&TOKENS).unwrap();
    assert_ne!(lp2, lp1);
    // Cross-entropy went down on the trained tokens.
    let sum = |v: &[Option<f32>]| v.iter().flatten().sum::<f32>();
    assert!(sum(&lp2) > sum(&lp1));
}

#[test]
fn sampling_is_seeded_keeps_stop_tokens_and_reports_logprobs() {
    let tm = training_model("sample");
    let s = tm.save_weights_for_sampler(&scratch("sample-w")).unwrap();
    let prompt = [7i64, 8, 9];
    let p = TinkerSamplingParams {
        max_tokens: 12,
        seed: Some(42),
        ..TinkerSamplingParams::default()
    };
    let a = s.sample(&prompt, 3, &p).unwrap();
    assert_eq!(a.len(), 3);
    assert_eq!(
        a,
        s.sample(&prompt, 3, &p).unwrap(),
        "same seed, other tokens"
    );
    assert_ne!(
        a[0].tokens, a[1].tokens,
        "the samples of one request are alike"
    );
    for seq in &a {
        assert_eq!((seq.tokens.len(), seq.stop_reason), (12, "length"));
        assert_eq!(seq.logprobs.len(), seq.tokens.len());
        // The sampler's logprobs are the model's (temperature 1).
        let all: Vec<i64> = prompt.iter().chain(&seq.tokens).copied().collect();
        let lp = s.compute_logprobs(&all).unwrap();
        for (x, y) in seq.logprobs.iter().zip(&lp[prompt.len()..]) {
            assert!((x - y.unwrap()).abs() < 1e-4, "sampled {x} vs scored {y:?}");
        }
    }
    // Half the vocabulary stops: samples end at a stop token, which is kept.
    let stops: Vec<i64> = (0..48).collect();
    let p = TinkerSamplingParams {
        stop_tokens: stops.clone(),
        ..p
    };
    let stopped = s.sample(&prompt, 4, &p).unwrap();
    assert!(stopped.iter().any(|q| q.stop_reason == "stop"));
    for seq in stopped {
        let last = *seq.tokens.last().unwrap();
        if seq.stop_reason == "stop" {
            assert!(stops.contains(&last));
        } else {
            assert_eq!(seq.tokens.len(), 12);
        }
        assert!(seq.tokens[..seq.tokens.len() - 1]
            .iter()
            .all(|t| !stops.contains(t)));
    }
    let e = s.sample(&[7, 500], 1, &p).unwrap_err().to_string();
    assert!(e.contains("prompt[1] = 500"), "{e}");
}

#[test]
fn save_and_load_state_with_and_without_the_optimizer() {
    let none = BTreeMap::new();
    let adam = AdamParams {
        learning_rate: 1e-2,
        ..AdamParams::default()
    };
    let step = |tm: &mut TrainingModel| {
        tm.forward_backward(&[ce_datum()], "cross_entropy", &none)
            .unwrap();
        tm.optim_step(&adam).unwrap();
    };
    let logprobs = |tm: &TrainingModel| {
        tm.forward(&[ce_datum()], "cross_entropy", &none)
            .unwrap()
            .logprobs
    };
    let mut a = training_model("state-a");
    step(&mut a);
    let dir = scratch("state");
    a.save_state(&dir).unwrap();
    step(&mut a);

    let mut b = training_model("state-b");
    b.load_state(&dir, true).unwrap();
    step(&mut b);
    assert_eq!(
        logprobs(&a),
        logprobs(&b),
        "with the optimizer: the same next step"
    );

    let mut c = training_model("state-c");
    c.load_state(&dir, false).unwrap();
    step(&mut c);
    assert_ne!(
        logprobs(&a),
        logprobs(&c),
        "without the optimizer state, Adam's step differs"
    );
    let e = c
        .load_state(&scratch("nothing"), true)
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("no saved state at"), "{e}");
}
