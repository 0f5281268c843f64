//! AdamW, clip_grad_norm_ and the LR schedules against PyTorch / verl's formulas.
use tch::{Kind, Tensor};
use temper_algo::optim::{clip_grad_norm, AdamW};
use temper_testkit as common;
use temper_train::config::OptimConfig;
use temper_train::optim::LrSchedule;

#[test]
fn adamw_and_clipping_are_bitwise_torch() {
    adamw_against_torch(false);
}

/// The fused kernel (the trainer's default, `actor.optim.fused`) against
/// `torch.optim.AdamW(fused=True)`.
#[test]
fn fused_adamw_is_bitwise_torch_fused() {
    adamw_against_torch(true);
}

fn adamw_against_torch(fused: bool) {
    tch::manual_seed(7);
    // The last is larger than one of AdamW's slices (4 Mi elements): it is stepped in two.
    let shapes: [&[i64]; 4] = [&[17, 9], &[9], &[3, 4, 5], &[1100, 3900]];
    let params: Vec<(String, Tensor)> = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| {
            (
                format!("w{i}"),
                Tensor::randn(*s, (Kind::Float, tch::Device::Cpu)).set_requires_grad(true),
            )
        })
        .collect();
    let (lr0, b1, b2, eps, wd, max_norm) = (1e-3, 0.9, 0.95, 1e-8, 0.01, 1.0);
    // Steps with big gradients (clipped) and small ones (not clipped), and a changing lr.
    let lrs = [1e-3, 5e-4, 2e-3, 1e-3, 3e-4, 1e-3];
    let scales = [0.1, 3.0, 0.01, 1.0, 0.05, 10.0];
    let mut inputs: Vec<(String, Tensor)> = Vec::new();
    for (i, (_, p)) in params.iter().enumerate() {
        inputs.push((format!("p{i}"), p.detach().copy()));
    }
    let mut grads = vec![];
    for (s, scale) in scales.iter().enumerate() {
        let mut gs = vec![];
        for (i, (_, p)) in params.iter().enumerate() {
            let g = Tensor::randn(p.size(), (Kind::Float, tch::Device::Cpu)) * *scale;
            inputs.push((format!("g{s}_{i}"), g.copy()));
            gs.push(g);
        }
        grads.push(gs);
    }
    inputs.push(("lr".into(), Tensor::from_slice(&lrs)));
    inputs.push((
        "hyper".into(),
        Tensor::from_slice(&[lr0, b1, b2, eps, wd, max_norm]),
    ));
    let dir = common::temp_dir(if fused { "adamw-fused" } else { "adamw" });
    let (inp, out) = (dir.join("in.safetensors"), dir.join("out.safetensors"));
    Tensor::write_safetensors(&inputs, &inp).unwrap();
    let form = std::path::Path::new(if fused { "fused" } else { "loop" });
    common::run_py("adamw_ref.py", &[&inp, &out, form]);

    let mut opt = AdamW::new(&params, lr0, (b1, b2), eps, wd).with_fused(fused);
    let mut norms = vec![];
    for (s, gs) in grads.iter().enumerate() {
        for ((_, p), g) in params.iter().zip(gs) {
            let mut gp = p.grad();
            if gp.defined() {
                let _ = gp.zero_();
            }
            // d/dp sum(p * g) = g exactly: the gradient arrives through backward, as in training.
            (p * g).sum(Kind::Float).backward();
        }
        opt.lr = lrs[s];
        norms.push(clip_grad_norm(&params, max_norm).unwrap());
        opt.step(&params).unwrap();
    }
    let want: std::collections::HashMap<String, Tensor> = Tensor::read_safetensors(&out)
        .unwrap()
        .into_iter()
        .collect();
    let want_norms: Vec<f64> = Vec::try_from(want["norm"].shallow_clone()).unwrap();
    for (s, (a, b)) in norms.iter().zip(&want_norms).enumerate() {
        assert_eq!(
            a.to_bits(),
            (*b as f32 as f64).to_bits(),
            "grad norm at step {s}: {a} vs {b}"
        );
    }
    for (i, (_, p)) in params.iter().enumerate() {
        let w = &want[&format!("p{i}")];
        let diff = (p.detach() - w).abs().max().double_value(&[]);
        assert_eq!(diff, 0.0, "param {i} differs from torch by {diff}");
    }
}

fn optim(kind: &str, warmup: i64, ratio: f64, min_lr_ratio: f64) -> OptimConfig {
    OptimConfig {
        lr: 2.0,
        lr_scheduler_type: kind.parse().unwrap(),
        lr_warmup_steps: warmup,
        lr_warmup_steps_ratio: ratio,
        min_lr_ratio,
        ..OptimConfig::default()
    }
}

/// verl's lr_lambda for the same settings, evaluated by Python (the formulas are copied from
/// verl/utils/torch_functional.py into tests/py/lr_ref.py).
#[test]
fn schedules_match_verl() {
    let dir = common::temp_dir("lr");
    let cases = [
        ("constant", 3, 0.0, 0.0, 10),
        ("constant", -1, 0.25, 0.0, 12),
        ("constant", 0, 0.0, 0.0, 3),
        ("cosine", 2, 0.0, 0.1, 10),
        ("cosine", -1, 0.1, 0.0, 20),
        ("cosine", 0, 0.0, 0.0, 1),
    ];
    let out = dir.join("lr.json");
    let specs: Vec<std::path::PathBuf> = cases
        .iter()
        .map(|(k, w, r, m, t)| format!("{k}:{w}:{r}:{m}:{t}").into())
        .collect();
    let mut args: Vec<&std::path::Path> = vec![&out];
    args.extend(specs.iter().map(|p| p.as_path()));
    common::run_py("lr_ref.py", &args);
    let want: Vec<Vec<f64>> =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    for ((kind, warm, ratio, min_lr, total), want) in cases.into_iter().zip(want) {
        let s = LrSchedule::from_optim(&optim(kind, warm, ratio, min_lr), total).unwrap();
        let ours: Vec<f64> = (0..total + 2).map(|k| s.lr(k)).collect();
        assert_eq!(ours.len(), want.len());
        for (k, (a, b)) in ours.iter().zip(&want).enumerate() {
            assert!(
                (a - b).abs() <= 1e-15,
                "{kind} w={warm} r={ratio} step {k}: {a} vs {b}"
            );
        }
    }
}

#[test]
fn optimizer_state_round_trips() {
    tch::manual_seed(1);
    let params: Vec<(String, Tensor)> = vec![(
        "a".into(),
        Tensor::randn([4, 3], (Kind::Float, tch::Device::Cpu)).set_requires_grad(true),
    )];
    // Fused: its per-parameter step counts must come back from the one saved `step`.
    let mut opt = AdamW::new(&params, 1e-2, (0.9, 0.999), 1e-8, 0.0).with_fused(true);
    for _ in 0..3 {
        (&params[0].1 * &params[0].1).sum(Kind::Float).backward();
        opt.step(&params).unwrap();
        let _ = params[0].1.grad().zero_();
    }
    let dir = common::temp_dir("optstate");
    let path = dir.join("optim.safetensors");
    opt.save(&path).unwrap();
    let mut fresh = AdamW::new(&params, 1e-2, (0.9, 0.999), 1e-8, 0.0).with_fused(true);
    fresh.load(&path).unwrap();
    assert_eq!(fresh.steps_taken(), 3);
    // Same next step from both.
    let p2: Vec<(String, Tensor)> = vec![(
        "a".into(),
        params[0].1.detach().copy().set_requires_grad(true),
    )];
    (&params[0].1 * &params[0].1).sum(Kind::Float).backward();
    (&p2[0].1 * &p2[0].1).sum(Kind::Float).backward();
    opt.step(&params).unwrap();
    fresh.step(&p2).unwrap();
    assert_eq!((&params[0].1 - &p2[0].1).abs().max().double_value(&[]), 0.0);
    // A state for other parameters is refused with the name.
    let other = vec![(
        "b".to_string(),
        Tensor::zeros([2], (Kind::Float, tch::Device::Cpu)),
    )];
    let e = AdamW::new(&other, 1e-2, (0.9, 0.999), 1e-8, 0.0)
        .load(&path)
        .unwrap_err();
    assert!(format!("{e:#}").contains("exp_avg/b"), "{e:#}");
}
