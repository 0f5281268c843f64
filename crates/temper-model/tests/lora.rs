//! LoRA adapters against PEFT (tools/peft_reference.py: transformers + peft 0.21 load the adapter
//! temper saved onto the base folder, and transformers loads the merged folder), on a tiny Qwen2
//! with every linear adapted: a fresh adapter (B = 0) scores exactly as the base model; only
//! adapter weights get gradients; with B != 0 temper's logprobs equal PEFT's and the merged
//! folder's, and the sampler's merged weights give the training forward's numbers.
mod common;

use common::{max_abs_diff, run_tool, scratch};
use tch::{Device, Kind, Tensor};
use temper_model::{
    position_ids_from_mask, CausalLm, ComputeKind, LoraConfig, ModelConfig, TokenScores,
};

const ROWS: [&[i64]; 2] = [&[5, 17, 3, 44, 9, 2, 31], &[60, 1, 8, 8]];

/// Per row, log p(ids[t+1] | ids[..=t]) under `model` (training forward, or the sampler's
/// merged weights).
fn logprobs(model: &CausalLm, sampler: bool) -> Vec<Vec<f64>> {
    ROWS.iter()
        .map(|ids| {
            let x = Tensor::from_slice(ids).unsqueeze(0);
            let mask = x.ones_like();
            let pos = position_ids_from_mask(&mask);
            let targets = x.roll([-1], [1]);
            let run = || model.token_logprobs(&x, &mask, &pos, &targets, 1.0).logp;
            let lp = if sampler {
                tch::no_grad(|| model.with_sampling_weights(run))
            } else {
                run()
            };
            let n = ids.len() as i64 - 1;
            Vec::<f64>::try_from(lp.narrow(1, 0, n).reshape([-1]).to_kind(Kind::Double)).unwrap()
        })
        .collect()
}

#[test]
fn lora_matches_peft_and_the_merged_folder() {
    check_against_peft("lora", false, &["all-linear"], 7);
}

/// The unembedding (`lm_head`, Tinker's `train_unembed`) of a model with tied embeddings: the
/// adapter changes the output projection only, PEFT agrees, and the merged folder unties the head.
#[test]
fn lora_on_the_unembedding_matches_peft() {
    check_against_peft("lora-head", true, &["q_proj", "lm_head"], 2);
}

fn check_against_peft(tag: &str, tied: bool, targets: &[&str], adapted: usize) {
    let dir = scratch(tag);
    let base_dir = dir.join("base");
    let cfg = ModelConfig::qwen2_like(97, 32, 48, 2, 4, 2, tied);
    CausalLm::random(cfg, 7, Device::Cpu, ComputeKind::F32)
        .save(&base_dir)
        .unwrap();
    let base = CausalLm::load(&base_dir, Device::Cpu, ComputeKind::F32).unwrap();
    let before = logprobs(&base, false);

    let mut model = CausalLm::load(&base_dir, Device::Cpu, ComputeKind::F32).unwrap();
    let lora = LoraConfig {
        rank: 4,
        alpha: 8.0,
        target_modules: targets.iter().map(|t| t.to_string()).collect(),
    };
    // Seeded: an unseeded draw could land between another test's seed and its draws.
    model.add_lora_seeded(&lora, 11).unwrap();
    // Per layer for the decoder linears, once for the head.
    let layers_and_head = |per_layer: usize, head: usize| 2 * (2 * per_layer + head);
    // B = 0: exactly the base model.
    assert_eq!(logprobs(&model, false), before);

    // Only the adapters are trainable, and only they get gradients.
    let trainable = model.trainable_parameters();
    let head = usize::from(targets.contains(&"lm_head"));
    assert_eq!(
        trainable.len(),
        layers_and_head(adapted - head, 0) + 2 * head
    );
    assert!(trainable
        .iter()
        .all(|(n, _)| n.contains(".lora_A.") || n.contains(".lora_B.")));
    let scores = logprobs_scores(&model);
    scores.logp.sum(Kind::Float).backward();
    scores.backward();
    for (name, p) in model.named_parameters() {
        assert!(!p.grad().defined(), "base weight {name} got a gradient");
    }
    let b_grads = trainable
        .iter()
        .filter(|(n, _)| n.contains("lora_B"))
        .filter(|(_, p)| f64::try_from(p.grad().abs().sum(Kind::Float)).unwrap() > 0.0)
        .count();
    assert_eq!(
        b_grads,
        trainable.len() / 2,
        "every B gets a gradient at B = 0"
    );

    // B != 0: compare with PEFT and with transformers on the merged folder. Seeded draws (under
    // the global generator's lock: an unlocked draw here ran between another test's seed and its
    // draws, `seeded_adapters_do_not_depend_on_other_threads`).
    tch::no_grad(|| {
        for (i, (name, p)) in trainable.iter().enumerate() {
            if name.contains("lora_B") {
                let r = temper_model::seeded::with_seed(100 + i as u64, || {
                    Tensor::randn(p.size(), (Kind::Float, Device::Cpu))
                }) * 0.05
                    * (1.0 + i as f64 / 10.0);
                p.shallow_clone().copy_(&r);
            }
        }
    });
    let ours = logprobs(&model, false);
    assert!(
        max_abs_diff(&ours, &before) > 1e-3,
        "the adapter changed nothing"
    );
    let adapter_dir = dir.join("adapter");
    let merged_dir = dir.join("merged");
    model.save_lora_adapter(&adapter_dir).unwrap();
    model.save(&merged_dir).unwrap();
    let ids = serde_json::to_string(&ROWS).unwrap();
    let out = run_tool(
        "peft_reference.py",
        &[
            base_dir.to_str().unwrap(),
            adapter_dir.to_str().unwrap(),
            merged_dir.to_str().unwrap(),
            &ids,
        ],
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let read = |k: &str| -> Vec<Vec<f64>> { serde_json::from_value(v[k].clone()).unwrap() };
    let (peft, merged) = (read("peft"), read("merged"));
    let (dp, dm) = (max_abs_diff(&ours, &peft), max_abs_diff(&ours, &merged));
    assert!(dp < 1e-5, "temper vs peft: max |logprob diff| {dp:e}");
    assert!(dm < 1e-5, "temper vs merged folder in transformers: {dm:e}");
    // With the adapters off (a LoRA run's reference policy): the base model's numbers exactly,
    // and PEFT's inside `disable_adapter()`; the adapters are back after.
    let off = temper_model::without_adapters(|| logprobs(&model, false));
    assert_eq!(
        off, before,
        "adapters off must be the base model bit for bit"
    );
    let dd = max_abs_diff(&off, &read("peft_disabled"));
    assert!(
        dd < 1e-5,
        "temper adapters off vs peft disable_adapter(): {dd:e}"
    );
    assert_eq!(logprobs(&model, false), ours);
    // The sampler runs the merged weights.
    let ds = max_abs_diff(&ours, &logprobs(&model, true));
    assert!(ds < 1e-5, "sampler vs training forward: {ds:e}");
    // The merged folder loads back into temper as a plain model with the same numbers.
    let reloaded = CausalLm::load(&merged_dir, Device::Cpu, ComputeKind::F32).unwrap();
    assert!(max_abs_diff(&ours, &logprobs(&reloaded, false)) < 1e-5);
    // Removing the adapters gives the base model back exactly (trainable again), and loading the
    // saved adapter onto it again gives the adapted numbers: what a server serving one base and
    // many snapshots does between batches.
    model.remove_lora().unwrap();
    assert!(model.lora_config().is_none());
    assert_eq!(logprobs(&model, false), before);
    assert_eq!(logprobs(&model, true), logprobs(&base, true));
    assert_eq!(
        model.trainable_parameters().len(),
        base.named_parameters().len()
    );
    model.add_lora_seeded(&lora, 0).unwrap();
    model.load_lora_adapter(&adapter_dir).unwrap();
    assert_eq!(logprobs(&model, false), ours);
    if tied && head == 1 {
        let config = std::fs::read_to_string(merged_dir.join("config.json")).unwrap();
        assert!(
            config.contains("\"tie_word_embeddings\": false"),
            "{config}"
        );
    }
}

fn logprobs_scores(model: &CausalLm) -> TokenScores<'_> {
    let ids = ROWS[0];
    let x = Tensor::from_slice(ids).unsqueeze(0);
    let mask = x.ones_like();
    let pos = position_ids_from_mask(&mask);
    model.token_logprobs(&x, &mask, &pos, &x.roll([-1], [1]), 1.0)
}

#[test]
fn bad_lora_configs_are_errors() {
    let cfg = ModelConfig::qwen2_like(50, 16, 24, 1, 2, 1, true);
    let mut m = CausalLm::random(cfg, 1, Device::Cpu, ComputeKind::F32);
    let bad = |rank: i64, targets: &[&str]| LoraConfig {
        rank,
        alpha: 16.0,
        target_modules: targets.iter().map(|s| s.to_string()).collect(),
    };
    let e = m.add_lora(&bad(0, &["q_proj"])).unwrap_err().to_string();
    assert!(e.contains("rank must be positive"), "{e}");
    let e = m.add_lora(&bad(4, &["qproj"])).unwrap_err().to_string();
    assert!(e.contains("`qproj`") && e.contains("q_proj"), "{e}");
    m.add_lora_seeded(&bad(4, &["q_proj", "v_proj"]), 1)
        .unwrap();
    assert_eq!(m.trainable_parameters().len(), 4);
    let e = m.add_lora(&bad(4, &["q_proj"])).unwrap_err().to_string();
    assert!(e.contains("already"), "{e}");
}

/// The same seed gives the same adapters even when other threads create seeded models at the same
/// time (a server creating two clients' LoRA models at once draws from one global generator).
#[test]
fn seeded_adapters_do_not_depend_on_other_threads() {
    let cfg = ModelConfig::qwen2_like(97, 32, 48, 2, 4, 2, false);
    let lora = LoraConfig {
        rank: 4,
        alpha: 8.0,
        target_modules: vec!["all-linear".into()],
    };
    let adapters = |seed: u64| {
        let mut m = CausalLm::random(cfg.clone(), 3, Device::Cpu, ComputeKind::F32);
        m.add_lora_seeded(&lora, seed).unwrap();
        let mut params = m.trainable_parameters();
        params.sort_by(|a, b| a.0.cmp(&b.0));
        Tensor::cat(
            &params
                .iter()
                .map(|(_, t)| t.reshape([-1]))
                .collect::<Vec<_>>(),
            0,
        )
    };
    let alone = adapters(5);
    let racing: Vec<Tensor> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4u64)
            .map(|k| s.spawn(move || (0..10).map(|_| adapters(5 + k % 2)).collect::<Vec<_>>()))
            .collect();
        handles
            .into_iter()
            .enumerate()
            .filter(|(k, _)| k % 2 == 0)
            .flat_map(|(_, h)| h.join().unwrap())
            .collect()
    });
    for t in &racing {
        assert!(
            t.equal(&alone),
            "seed 5 gave different adapters while other threads drew"
        );
    }
}

/// `LoraConfig::num_params` (what memory estimates count) equals the adapters a model gets.
#[test]
fn the_adapter_count_is_the_adapters_a_model_gets() {
    for (tied, targets) in [
        (true, vec!["all-linear"]),
        (false, vec!["q_proj", "down_proj", "lm_head"]),
        (true, vec!["v_proj", "lm_head"]),
    ] {
        let cfg = ModelConfig::qwen2_like(97, 32, 48, 3, 4, 2, tied);
        let lora = LoraConfig {
            rank: 5,
            alpha: 5.0,
            target_modules: targets.iter().map(|t| t.to_string()).collect(),
        };
        let mut m = CausalLm::random(cfg.clone(), 1, Device::Cpu, ComputeKind::F32);
        m.add_lora_seeded(&lora, 1).unwrap();
        let real: i64 = m
            .trainable_parameters()
            .iter()
            .map(|(_, p)| p.numel() as i64)
            .sum();
        assert_eq!(lora.num_params(&cfg).unwrap(), real, "{targets:?}");
    }
}

/// A bf16 LoRA model's frozen base held in bf16 (`hold_frozen_in_compute_dtype`, what `temper
/// train` does for a LoRA run): log-probs and every adapter gradient bit for bit those of the
/// same model with f32 masters (which the test above holds to PEFT), in fewer bytes; the input
/// embedding and norms stay f32; an f32 model is left alone.
#[test]
fn a_frozen_base_in_bf16_computes_the_same_bits() {
    let lora = LoraConfig {
        rank: 4,
        alpha: 8.0,
        target_modules: vec!["all-linear".into()],
    };
    let make = |tied: bool| {
        let cfg = ModelConfig::qwen2_like(97, 32, 48, 2, 4, 2, tied);
        let mut m = CausalLm::random(cfg, 7, Device::Cpu, ComputeKind::Bf16);
        m.add_lora_seeded(&lora, 3).unwrap();
        tch::no_grad(|| {
            for (i, (name, p)) in m.trainable_parameters().iter().enumerate() {
                if name.contains("lora_B") {
                    let r = temper_model::seeded::with_seed(200 + i as u64, || {
                        Tensor::randn(p.size(), (Kind::Float, Device::Cpu))
                    }) * 0.05;
                    p.shallow_clone().copy_(&r);
                }
            }
        });
        m
    };
    let run = |m: &CausalLm| {
        let scores = logprobs_scores(m);
        let lp = Vec::<f32>::try_from(scores.logp.reshape([-1])).unwrap();
        scores.logp.sum(Kind::Float).backward();
        scores.backward();
        let grads: Vec<Vec<f32>> = m
            .trainable_parameters()
            .iter()
            .map(|(_, p)| Vec::<f32>::try_from(p.grad().reshape([-1])).unwrap())
            .collect();
        (lp, grads)
    };
    let bytes = |m: &CausalLm| -> i64 {
        m.named_parameters()
            .iter()
            .map(|(_, t)| (t.numel() * t.kind().elt_size_in_bytes()) as i64)
            .sum()
    };
    for tied in [true, false] {
        let masters = make(tied);
        let mut held = make(tied);
        let before = bytes(&held);
        let freed = held.hold_frozen_in_compute_dtype();
        assert!(freed > 0);
        assert_eq!(bytes(&held), before - freed as i64);
        for (name, t) in held.named_parameters() {
            let want = if t.dim() == 2 && !name.contains("embed_tokens") {
                Kind::BFloat16
            } else {
                Kind::Float
            };
            assert_eq!(t.kind(), want, "{name}");
        }
        assert_eq!(run(&held), run(&masters), "tied {tied}");
    }
    let cfg = ModelConfig::qwen2_like(97, 32, 48, 2, 4, 2, true);
    let mut f32_model = CausalLm::random(cfg, 7, Device::Cpu, ComputeKind::F32);
    f32_model.add_lora_seeded(&lora, 3).unwrap();
    assert_eq!(f32_model.hold_frozen_in_compute_dtype(), 0);
}
