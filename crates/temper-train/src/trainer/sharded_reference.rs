//! temper's sharded training step against PyTorch's own FSDP2 (`fully_shard` per decoder layer,
//! `tools/fsdp_reference.py`): the tiny model, a fixed batch, 3 steps of clip + AdamW over 2
//! ranks on Gloo, the per-layer (ZeRO-3, checkpointed) and the whole-weights (ZeRO-2) update, and
//! the per-layer update with one rank a micro-batch short (swept idle).
use std::sync::Arc;

use tch::{Device, Kind, Tensor};
use temper_model::{CausalLm, ComputeKind};

use super::optimizer::Optimizer;
use crate::config::{ActorConfig, Strategy};
use crate::dist::Dist;

const LR: f64 = 1e-3;
const STEPS: usize = 3;

/// A fixed batch of 4 rows of 24 tokens over the tiny model's vocabulary.
fn batch() -> Vec<Vec<i64>> {
    (0..4)
        .map(|r| {
            (0..24)
                .map(|t| (r * 37 + t * 11 + t * t) % 256 + 3)
                .collect()
        })
        .collect()
}

/// (loss summed over ranks, grad norm) per step, and rank 0's final weights.
type Run = (Vec<(f64, f64)>, Vec<(String, Tensor)>);

/// Rows each rank trains, in micro-batches: an even split, or rank 0 three rows in two
/// micro-batches and rank 1 one row (and a micro-batch it sweeps the layers for idle).
fn micro_batches(rank: usize, uneven: bool) -> Vec<Vec<usize>> {
    match (uneven, rank) {
        (false, r) => vec![vec![2 * r, 2 * r + 1]],
        (true, 0) => vec![vec![0, 1], vec![2]],
        (true, _) => vec![vec![3]],
    }
}

fn temper_run(world: usize, per_layer: bool, uneven: bool) -> Run {
    let port = temper_testkit::free_port();
    let handles: Vec<_> = (0..world)
        .map(|rank| {
            std::thread::spawn(move || {
                let comm = temper_testkit::gloo_comm(port, rank, world);
                let dist = Arc::new(Dist::from_comm(comm));
                rank_run(&dist, per_layer, uneven)
            })
        })
        .collect();
    let mut runs: Vec<Run> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    runs.swap_remove(0)
}

fn rank_run(dist: &Arc<Dist>, per_layer: bool, uneven: bool) -> Run {
    let model = CausalLm::load(
        &temper_testkit::tiny_model_dir(),
        Device::Cpu,
        ComputeKind::F32,
    )
    .unwrap();
    let params = model.trainable_parameters();
    let mut actor = ActorConfig {
        strategy: Strategy::Fsdp,
        gradient_checkpointing: per_layer,
        grad_clip: 1.0,
        ..Default::default()
    };
    actor.optim.lr = LR;
    actor.optim.fused = false;
    let mut opt = Optimizer::new(&params, &actor, dist, &mut vec![]).unwrap();
    model.set_layer_residency(opt.layer_residency());
    let rows = batch();
    let len = rows[0].len() as i64;
    let total_tokens = (rows.len() as i64 * (len - 1)) as f64;
    let mine = micro_batches(dist.rank, uneven);
    let idle = super::batch::idle_micro_batches(dist, mine.len(), per_layer).unwrap();
    let mut steps = vec![];
    for _ in 0..STEPS {
        opt.begin_update(per_layer).unwrap();
        let mut loss_sum = 0.0;
        for micro in &mine {
            let flat: Vec<i64> = micro.iter().flat_map(|&r| rows[r].clone()).collect();
            let b = micro.len() as i64;
            let ids = Tensor::from_slice(&flat).view([b, len]);
            let positions = Tensor::arange(len, (Kind::Int64, Device::Cpu))
                .unsqueeze(0)
                .expand([b, len], false);
            let mask = ids.ones_like();
            let targets = ids.narrow(1, 1, len - 1);
            let (hidden, checkpoints) = if per_layer {
                let (h, c) = model.forward_hidden_checkpointed(&ids, &positions, &mask);
                (h, Some(c))
            } else {
                (model.forward_hidden(&ids, &positions, &mask, None), None)
            };
            let mut scores = model.score_tokens(&hidden.narrow(1, 0, len - 1), &targets, 1.0, 1024);
            if let Some(c) = checkpoints {
                scores = scores.with_checkpoints(c);
            }
            let loss = -scores.logp.sum(Kind::Float) / total_tokens;
            loss.backward();
            scores.backward();
            opt.check().unwrap();
            loss_sum += loss.double_value(&[]);
        }
        for _ in 0..idle {
            model.sweep_idle_micro_batch(1, true);
        }
        assert!(opt.reduce_grads(dist, &params).unwrap());
        let norm = opt.clip_grad_norm(&params, actor.grad_clip).unwrap();
        opt.step(&params, LR).unwrap();
        opt.end_update().unwrap();
        let mut summed = [loss_sum];
        dist.sum_f64(&mut summed).unwrap();
        steps.push((summed[0], norm));
    }
    opt.hold_whole().unwrap();
    let weights = model
        .named_parameters()
        .into_iter()
        .map(|(n, p)| (n, p.detach().copy()))
        .collect();
    (steps, weights)
}

fn torch_run(world: usize) -> Run {
    let dir = temper_testkit::temp_dir("fsdp-reference");
    let batch_file = dir.join("batch.json");
    let spec = serde_json::json!({
        "ids": batch(), "lr": LR, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01,
        "max_norm": 1.0,
    });
    std::fs::write(&batch_file, spec.to_string()).unwrap();
    let script = temper_base::python::repo_root().join("tools/fsdp_reference.py");
    let reference = || {
        std::process::Command::new(temper_testkit::python())
            .arg(&script)
            .arg("--model")
            .arg(temper_testkit::tiny_model_dir())
            .arg("--batch")
            .arg(&batch_file)
            .args(["--nproc", &world.to_string(), "--steps", &STEPS.to_string()])
            .arg("--out")
            .arg(&dir)
            .output()
            .unwrap()
    };
    let mut out = reference();
    // PyTorch's own processes have aborted once under a loaded CI machine (a Gloo teardown):
    // the reference gets a second try; temper's side is never retried.
    if !out.status.success() {
        eprintln!(
            "the FSDP2 reference failed once, trying again: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out = reference();
    }
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let steps: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(dir.join("steps.json")).unwrap()).unwrap();
    let steps = steps
        .iter()
        .map(|s| {
            (
                s["loss"].as_f64().unwrap(),
                s["grad_norm"].as_f64().unwrap(),
            )
        })
        .collect();
    let mut weights = Vec::new();
    temper_model::safetensors_io::for_each_tensor(&dir.join("weights.safetensors"), |n, t| {
        weights.push((n, t));
        Ok(())
    })
    .unwrap();
    weights.sort_by(|a, b| a.0.cmp(&b.0));
    (steps, weights)
}

fn relative(a: f64, b: f64) -> f64 {
    (a - b).abs() / b.abs().max(1e-12)
}

#[test]
fn two_sharded_ranks_step_as_pytorch_fsdp2_does() {
    let (torch_steps, torch_weights) = torch_run(2);
    // Per layer and whole; per layer with rank 1 a micro-batch short (it sweeps the layers for
    // it idle: the gathers and reductions pair up, and the sums are the same).
    for (per_layer, uneven) in [(true, false), (false, false), (true, true)] {
        let (steps, weights) = temper_run(2, per_layer, uneven);
        for (s, ((loss, norm), (t_loss, t_norm))) in steps.iter().zip(&torch_steps).enumerate() {
            assert!(
                relative(*loss, *t_loss) < 1e-6,
                "per_layer {per_layer}, step {s}: loss {loss} vs FSDP2's {t_loss}"
            );
            assert!(
                relative(*norm, *t_norm) < 1e-5,
                "per_layer {per_layer}, step {s}: grad norm {norm} vs FSDP2's {t_norm}"
            );
        }
        assert_eq!(weights.len(), torch_weights.len());
        let (mut diff, mut size) = (0.0, 0.0);
        for ((n, w), (tn, tw)) in weights.iter().zip(&torch_weights) {
            assert_eq!(n, tn);
            diff += f64::try_from((w - tw).square().sum(Kind::Double)).unwrap();
            size += f64::try_from(tw.square().sum(Kind::Double)).unwrap();
        }
        let rel = (diff / size).sqrt();
        println!(
            "per_layer {per_layer}, uneven {uneven}: weights within {rel:e} of FSDP2's (relative)"
        );
        assert!(
            rel < 1e-6,
            "per_layer {per_layer}: weights differ by {rel:e}"
        );
    }
}
