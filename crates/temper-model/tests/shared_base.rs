//! LoRA models on one shared base (what `temper serve` gives Tinker's training clients of a base
//! model): they hold one copy of the base weights, and each trains exactly as a LoRA model on a
//! base of its own does (the reference: `CausalLm::load` + `add_lora_seeded`, the path the
//! adapters are tested against PEFT with in `lora.rs`), also while another trains on another
//! thread; the base never changes, and the last model dropped frees it.
mod common;

use common::scratch;
use tch::{Device, Kind, Tensor};
use temper_model::{
    position_ids_from_mask, CausalLm, ComputeKind, LoraConfig, ModelConfig, SharedBases,
};

const ROWS: [&[i64]; 2] = [&[5, 17, 3, 44, 9, 2, 31], &[60, 1, 8, 8, 70, 12]];

fn lora() -> LoraConfig {
    LoraConfig {
        rank: 4,
        alpha: 8.0,
        target_modules: vec!["all-linear".into(), "lm_head".into()],
    }
}

/// Three SGD steps raising the likelihood of `row`'s next tokens; returns each step's summed
/// log-probability.
fn train(model: &CausalLm, row: &[i64]) -> Vec<f32> {
    let params = model.trainable_parameters();
    let x = Tensor::from_slice(row).unsqueeze(0);
    let mask = x.ones_like();
    let pos = position_ids_from_mask(&mask);
    let targets = x.roll([-1], [1]);
    let n = row.len() as i64 - 1;
    (0..3)
        .map(|_| {
            let scores = model.token_logprobs(&x, &mask, &pos, &targets, 1.0);
            let s = scores.logp.narrow(1, 0, n).sum(Kind::Float);
            (-&s).backward();
            scores.backward();
            tch::no_grad(|| {
                for (_, p) in &params {
                    let g = p.grad();
                    let _ = p.shallow_clone().g_sub_(&(g.shallow_clone() * 0.02));
                    let _ = g.shallow_clone().zero_();
                }
            });
            f32::try_from(s).unwrap()
        })
        .collect()
}

fn snapshot(model: &CausalLm) -> Vec<(String, Tensor)> {
    model
        .named_parameters()
        .into_iter()
        .map(|(n, t)| (n, t.detach().copy()))
        .collect()
}

fn same(a: &[(String, Tensor)], b: &[(String, Tensor)]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.0 == y.0 && x.1.equal(&y.1))
}

#[test]
fn lora_models_on_a_shared_base_hold_it_once_and_each_trains_as_on_its_own_copy() {
    let dir = scratch("shared-base").join("base");
    let cfg = ModelConfig::qwen2_like(97, 32, 48, 2, 4, 2, true);
    CausalLm::random(cfg, 7, Device::Cpu, ComputeKind::F32)
        .save(&dir)
        .unwrap();
    let base_weights = snapshot(&CausalLm::load(&dir, Device::Cpu, ComputeKind::F32).unwrap());

    let bases = SharedBases::default();
    let on_shared = |seed| {
        bases
            .get(&dir, Device::Cpu, ComputeKind::F32)
            .unwrap()
            .lora_model(&lora(), Some(seed), ComputeKind::F32)
            .unwrap()
    };
    let (a, b) = (on_shared(1), on_shared(2));
    assert_eq!(bases.loaded(), 1, "two clients of one base load it once");
    assert!(a.shares_base() && b.shares_base());
    for ((name, x), (_, y)) in a.named_parameters().iter().zip(b.named_parameters()) {
        assert_eq!(x.data_ptr(), y.data_ptr(), "{name} is not shared");
    }

    let on_own = |seed| {
        let mut m = CausalLm::load(&dir, Device::Cpu, ComputeKind::F32).unwrap();
        m.add_lora_seeded(&lora(), seed).unwrap();
        m
    };
    let (own_a, own_b) = (on_own(1), on_own(2));
    let alone = (train(&own_a, ROWS[0]), train(&own_b, ROWS[1]));

    // The two shared-base models train at the same time on two threads.
    let run = |m: CausalLm, row: &'static [i64]| {
        std::thread::spawn(move || {
            let scores = train(&m, row);
            (m, scores)
        })
    };
    let (ta, tb) = (run(a, ROWS[0]), run(b, ROWS[1]));
    let ((a, sa), (b, sb)) = (ta.join().unwrap(), tb.join().unwrap());
    let together = (sa, sb);
    assert_eq!(together, alone);
    assert!(alone.0[2] > alone.0[0], "training moved nothing: {alone:?}");
    let adapters = |m: &CausalLm| -> Vec<(String, Tensor)> { m.trainable_parameters() };
    assert!(same(&adapters(&a), &adapters(&own_a)));
    assert!(same(&adapters(&b), &adapters(&own_b)));
    assert!(
        same(&snapshot(&a), &snapshot(&own_a)),
        "merged weights differ"
    );

    // The base is as loaded, whatever its models did; only the adapters are trainable.
    let base = snapshot(&on_shared(3));
    let base: Vec<_> = base
        .into_iter()
        .filter(|(n, _)| !n.contains("lora"))
        .collect();
    assert!(same(&base, &base_weights), "a shared base weight changed");
    for (name, p) in a.named_parameters() {
        assert!(!p.requires_grad(), "{name} is trainable");
        assert!(!p.grad().defined(), "{name} got a gradient");
    }

    // Its adapters cannot be removed (that would make the shared weights trainable), nor its
    // base weights written.
    let mut a = a;
    let err = a.remove_lora().unwrap_err().to_string();
    assert!(err.contains("shared"), "{err}");
    assert!(a.var_store_mut().is_err());
    let files = temper_model::load::weight_files(&dir).unwrap();
    let err = temper_model::load::load_weights(&a, &files).unwrap_err();
    assert!(err.to_string().contains("shared"), "{err}");

    // The last model dropped frees the base; the next client loads it again.
    drop((a, b));
    assert_eq!(bases.loaded(), 0);
    let c = on_shared(4);
    assert_eq!(bases.loaded(), 1);
    assert!(c.shares_base());
}

/// In bf16, a shared base keeps the matrices a bf16 checkpoint holds in bf16 (half the memory, no
/// cast per forward) and its models compute exactly what LoRA models computing in bf16 on an f32
/// copy of their own do, training included; a base whose values bf16 cannot hold stays f32.
#[test]
fn a_bf16_shared_base_keeps_bf16_weights_and_the_same_numbers() {
    let root = scratch("shared-base-bf16");
    let cfg = ModelConfig::qwen2_like(97, 32, 48, 2, 4, 2, false);
    // A checkpoint of bf16 values (as published checkpoints are), written in f32.
    let model = CausalLm::random(cfg.clone(), 9, Device::Cpu, ComputeKind::F32);
    tch::no_grad(|| {
        for (_, p) in model.named_parameters() {
            p.shallow_clone().copy_(&p.to_kind(Kind::BFloat16));
        }
    });
    let bf16_dir = root.join("bf16-values");
    model.save(&bf16_dir).unwrap();
    let f32_dir = root.join("f32-values");
    CausalLm::random(cfg, 9, Device::Cpu, ComputeKind::F32)
        .save(&f32_dir)
        .unwrap();

    let bases = SharedBases::default();
    let kinds = |dir: &std::path::Path| -> Vec<(String, Kind)> {
        let m = bases
            .get(dir, Device::Cpu, ComputeKind::Bf16)
            .unwrap()
            .lora_model(&lora(), Some(1), ComputeKind::Bf16)
            .unwrap();
        m.named_parameters()
            .into_iter()
            .filter(|(n, _)| !n.contains("lora"))
            .map(|(n, t)| (n, t.kind()))
            .collect()
    };
    for (name, kind) in kinds(&bf16_dir) {
        let matrix =
            name.ends_with("proj.weight") || name.contains("embed") || name.contains("lm_head");
        let want = if matrix { Kind::BFloat16 } else { Kind::Float };
        assert_eq!(kind, want, "{name}");
    }
    assert!(kinds(&f32_dir).iter().all(|(_, k)| *k == Kind::Float));

    for seed in [1, 2] {
        let shared = bases
            .get(&bf16_dir, Device::Cpu, ComputeKind::Bf16)
            .unwrap()
            .lora_model(&lora(), Some(seed), ComputeKind::Bf16)
            .unwrap();
        let mut own = CausalLm::load(&bf16_dir, Device::Cpu, ComputeKind::Bf16).unwrap();
        own.add_lora_seeded(&lora(), seed).unwrap();
        let row = ROWS[seed as usize - 1];
        assert_eq!(train(&shared, row), train(&own, row));
        assert!(same(
            &shared.trainable_parameters(),
            &own.trainable_parameters()
        ));
        let merged = |m: &CausalLm| -> Vec<(String, Tensor)> {
            m.merged_parameters()
                .into_iter()
                .map(|(n, t)| (n, t.to_kind(Kind::Float)))
                .collect()
        };
        assert!(
            same(&merged(&shared), &merged(&own)),
            "merged weights differ"
        );
    }
}
