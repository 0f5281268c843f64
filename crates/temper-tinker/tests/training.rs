//! temper-tinker against an independent Tinker step (tools/tinker_train_reference.py:
//! transformers runs the same folder, the loss is the Tinker docs' snippet, torch.optim.AdamW with
//! Tinker's AdamParams steps): for each of the five losses, the per-datum logprobs, `loss:sum`, the
//! gradient of every parameter, and the logprobs after one optim_step. Then Tinker's semantics:
//! gradients accumulate across forward_backward calls, forward leaves them alone, optim_step zeroes
//! them, and bad datums are errors naming the datum and field.
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{json, Value};
use tch::{Device, Kind, Tensor};
use temper_model::{CausalLm, ComputeKind, ModelConfig};
use temper_tinker::{AdamParams, Datum, TensorData, TrainingModel};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A tiny random Qwen2 saved once per test binary (the tests run in parallel).
fn tiny_model_dir() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("temper-tinker-tiny-{}", std::process::id()));
        let cfg = ModelConfig::qwen2_like(97, 32, 48, 2, 4, 2, false);
        CausalLm::random(cfg, 11, Device::Cpu, ComputeKind::F32)
            .save(&dir)
            .unwrap();
        dir
    })
    .clone()
}

fn data() -> Vec<Datum> {
    let mut x: u64 = 12345;
    let mut next = move || {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (x >> 33) as f64 / (1u64 << 31) as f64
    };
    [5usize, 8, 3]
        .iter()
        .map(|&n| {
            let tokens: Vec<i64> = (0..n + 1).map(|_| (next() * 96.0) as i64).collect();
            let f =
                |g: &mut dyn FnMut() -> f64| -> Vec<f32> { (0..n).map(|_| g() as f32).collect() };
            // The first two positions carry no weight or advantage, as a prompt's: the server
            // runs them without autograd, and the numbers must not change.
            let prompt_like = |mut v: Vec<f32>| -> Vec<f32> {
                v.iter_mut().take(2).for_each(|x| *x = 0.0);
                v
            };
            let mut inputs = BTreeMap::new();
            inputs.insert(
                "target_tokens".into(),
                TensorData::I64(tokens[1..].to_vec()),
            );
            inputs.insert(
                "weights".into(),
                TensorData::F32(prompt_like(f(&mut || next() * 2.0 - 0.5))),
            );
            // Sampler logprobs near the model's (~ -4.6 for a random 97-token model).
            inputs.insert(
                "logprobs".into(),
                TensorData::F32(f(&mut || -4.6 + (next() - 0.5) * 0.8)),
            );
            inputs.insert(
                "advantages".into(),
                TensorData::F32(prompt_like(f(&mut || next() * 2.0 - 1.0))),
            );
            Datum::new(tokens[..n].to_vec(), inputs)
        })
        .collect()
}

fn to_json(d: &Datum) -> Value {
    let mut o = json!({"model_input": d.model_input});
    for (k, v) in &d.loss_fn_inputs {
        o[k] = match v {
            TensorData::I64(x) => json!(x),
            TensorData::F32(x) => json!(x),
        };
    }
    o
}

const LOSSES: [(&str, &[(&str, f64)]); 5] = [
    ("cross_entropy", &[]),
    ("importance_sampling", &[]),
    ("ppo", &[]),
    (
        "cispo",
        &[("clip_low_threshold", 0.9), ("clip_high_threshold", 1.1)],
    ),
    ("dro", &[("beta", 0.1)]),
];

fn reference(dir: &Path, adam: &AdamParams) -> Vec<Value> {
    let reqs: Vec<Value> = LOSSES
        .iter()
        .map(|(name, cfg)| {
            json!({"model": dir, "loss_fn": name,
                   "config": cfg.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
                   "adam": {"learning_rate": adam.learning_rate, "beta1": adam.beta1, "beta2": adam.beta2,
                            "eps": adam.eps, "weight_decay": adam.weight_decay},
                   "data": data().iter().map(to_json).collect::<Vec<_>>()})
        })
        .collect();
    let mut child = Command::new(repo().join(".venv/bin/python"))
        .arg(repo().join("tools/tinker_train_reference.py"))
        .env("OMP_NUM_THREADS", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running tools/tinker_train_reference.py (scripts/setup-env.sh makes .venv)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(serde_json::to_string(&reqs).unwrap().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn max_diff(a: &[Vec<f32>], b: &Value) -> f64 {
    a.iter()
        .zip(b.as_array().unwrap())
        .flat_map(|(x, y)| {
            let y = y.as_array().unwrap();
            assert_eq!(x.len(), y.len());
            x.iter()
                .zip(y)
                .map(|(p, q)| (*p as f64 - q.as_f64().unwrap()).abs())
        })
        .fold(0.0, f64::max)
}

fn config(cfg: &[(&str, f64)]) -> BTreeMap<String, f64> {
    cfg.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

#[test]
fn five_losses_match_an_independent_tinker_step() {
    let dir = tiny_model_dir();
    let adam = AdamParams {
        learning_rate: 1e-2,
        ..AdamParams::default()
    };
    let refs = reference(&dir, &adam);
    for ((name, cfg), r) in LOSSES.iter().zip(&refs) {
        let model = CausalLm::load(&dir, Device::Cpu, ComputeKind::F32).unwrap();
        let mut tm = TrainingModel::new(model);
        let out = tm.forward_backward(&data(), name, &config(cfg)).unwrap();
        let d = max_diff(&out.logprobs, &r["logprobs"]);
        assert!(d < 1e-5, "{name}: logprobs differ by {d:e}");
        let want = r["loss"].as_f64().unwrap();
        assert!(
            (out.loss_sum - want).abs() <= 1e-4 * want.abs().max(1.0),
            "{name}: loss:sum {} vs {want}",
            out.loss_sum
        );
        for (pname, p) in tm.model.named_parameters() {
            let w: Vec<f64> = serde_json::from_value(r["grads"][&pname].clone())
                .unwrap_or_else(|_| panic!("{name}: no reference gradient for {pname}"));
            let w = Tensor::from_slice(&w).to_kind(Kind::Float);
            let g = p.grad().reshape([-1]);
            let rel = f64::try_from((&g - &w).norm()).unwrap()
                / f64::try_from(w.norm()).unwrap().max(1e-12);
            assert!(
                rel < 1e-4,
                "{name}: gradient of {pname} differs by {rel:e} (relative)"
            );
        }
        tm.optim_step(&adam).unwrap();
        let after = tm.forward(&data(), name, &config(cfg)).unwrap();
        let d = max_diff(&after.logprobs, &r["after"]);
        assert!(
            d < 1e-4,
            "{name}: logprobs after optim_step differ by {d:e}"
        );
    }
}

fn grads(tm: &TrainingModel) -> Vec<Tensor> {
    tm.model
        .named_parameters()
        .iter()
        .map(|(_, p)| {
            let g = p.grad();
            if g.defined() {
                g.copy()
            } else {
                p.zeros_like()
            }
        })
        .collect()
}

#[test]
fn gradients_accumulate_until_optim_step() {
    let dir = tiny_model_dir();
    let load = || TrainingModel::new(CausalLm::load(&dir, Device::Cpu, ComputeKind::F32).unwrap());
    let d = data();
    let none = BTreeMap::new();
    let mut one = load();
    one.forward_backward(&d, "importance_sampling", &none)
        .unwrap();
    let mut split = load();
    split
        .forward_backward(&d[..1], "importance_sampling", &none)
        .unwrap();
    split.forward(&d, "ppo", &none).unwrap(); // forward does not touch gradients
    split
        .forward_backward(&d[1..], "importance_sampling", &none)
        .unwrap();
    for (a, b) in grads(&one).iter().zip(grads(&split)) {
        let diff = f64::try_from((a - &b).abs().max()).unwrap();
        assert!(diff < 1e-6, "accumulated gradients differ by {diff:e}");
    }
    let before = one.forward(&d, "cross_entropy", &none).unwrap();
    one.optim_step(&AdamParams::default()).unwrap();
    assert!(grads(&one)
        .iter()
        .all(|g| f64::try_from(g.abs().max()).unwrap() == 0.0));
    let after = one.forward(&d, "cross_entropy", &none).unwrap();
    assert_ne!(
        before.logprobs, after.logprobs,
        "optim_step changed nothing"
    );
}

#[test]
fn bad_datums_name_the_datum_and_field() {
    let dir = tiny_model_dir();
    let mut tm = TrainingModel::new(CausalLm::load(&dir, Device::Cpu, ComputeKind::F32).unwrap());
    let none = BTreeMap::new();
    let err = |tm: &mut TrainingModel, d: Vec<Datum>, loss: &str| {
        format!("{:#}", tm.forward_backward(&d, loss, &none).unwrap_err())
    };
    let mut d = data();
    d[1].loss_fn_inputs
        .insert("advantages".into(), TensorData::F32(vec![1.0; 3]));
    assert_eq!(
        err(&mut tm, d, "importance_sampling"),
        "datum 1: loss_fn_inputs.advantages has 3 values, model_input has 8 tokens"
    );
    let mut d = data();
    d[2].model_input[1] = 500;
    assert!(err(&mut tm, d, "ppo")
        .starts_with("datum 2: model_input[1] = 500 is outside the vocabulary"));
    let mut d = data();
    d[0].loss_fn_inputs.remove("weights");
    assert_eq!(
        err(&mut tm, d, "cross_entropy"),
        "datum 0: loss_fn_inputs.weights is missing (the loss needs it)"
    );
    assert!(err(&mut tm, data(), "gspo")
        .starts_with("datum 0: loss_fn_inputs.sequence_ratio_mask is missing"));
    assert!(err(&mut tm, data(), "stable_reinforce")
        .starts_with("datum 0: loss_fn stable_reinforce needs provenance"));
    assert!(err(&mut tm, data(), "custom").contains("forward_backward_custom"));
    // Nothing was accumulated by the failed calls.
    assert!(grads(&tm)
        .iter()
        .all(|g| f64::try_from(g.abs().max()).unwrap() == 0.0));
}
