//! Runs that must end as another does: resume, LoRA, shared prefix, rollout device, checkpointing.
use super::metrics;
use std::collections::BTreeMap;
use temper_testkit::{self as common, same_weights, tiny_config, weights, ASCII_FRACTION};
use temper_train::trainer::Trainer;

/// 2 steps, stop, resume for 2 more == 4 steps straight: same weights bitwise, same metrics.
#[test]
fn resume_continues_bitwise() {
    let extra = [
        "trainer.total_training_steps=4",
        "actor.ppo_epochs=2",
        "actor.shuffle=true",
        "actor.optim.lr_scheduler_type=cosine",
        "actor.optim.lr_warmup_steps=1",
    ];
    let root_a = common::temp_dir("resume-a");
    let mut a = Trainer::create(tiny_config(&root_a, &extra), "a", &[]).unwrap();
    a.set_reward(Box::new(ASCII_FRACTION));
    a.set_stop_after(Some(2));
    a.fit().unwrap();
    assert_eq!(a.state().step, 2);
    let run_a = a.run().root.clone();
    drop(a);
    let mut a = Trainer::resume(&run_a, &[]).unwrap();
    a.set_reward(Box::new(ASCII_FRACTION));
    assert_eq!(a.state().step, 2);
    a.fit().unwrap();

    let root_b = common::temp_dir("resume-b");
    let mut b = Trainer::create(tiny_config(&root_b, &extra), "b", &[]).unwrap();
    b.set_reward(Box::new(ASCII_FRACTION));
    b.fit().unwrap();
    assert!(
        same_weights(&weights(&a), &weights(&b)),
        "resumed weights differ from the straight run"
    );
    let strip =
        |m: Vec<BTreeMap<String, serde_json::Value>>| -> Vec<BTreeMap<String, serde_json::Value>> {
            m.into_iter()
                .map(|l| {
                    l.into_iter()
                        .filter(|(k, _)| !k.starts_with("timing_s/") && !k.starts_with("perf/"))
                        .collect()
                })
                .collect()
        };
    let (ma, mb) = (strip(metrics(&a)), strip(metrics(&b)));
    assert_eq!(ma.len(), 4);
    assert_eq!(ma, mb);
}

/// `actor.shared_prefix` and `model.use_remove_padding` (both on by default) change the work, not
/// the result: one step with each on and off trains on the same rollouts to the same loss, grad
/// norm and weights as padded full rows (float rounding).
#[test]
fn shared_prefix_and_packed_updates_match_padded_full_rows() {
    let run = |shared: bool, packed: bool| {
        let root = common::temp_dir(&format!("shared-{shared}-{packed}"));
        let shared = format!("actor.shared_prefix={shared}");
        let packed = format!("model.use_remove_padding={packed}");
        // Shuffled 8-row micro-batches mix the rows of two groups of 4.
        let extra = [
            "trainer.total_training_steps=1",
            "actor.ppo_micro_batch_size_per_gpu=8",
            "actor.shuffle=true",
            shared.as_str(),
            packed.as_str(),
        ];
        let cfg = tiny_config(&root, &extra);
        let mut t = Trainer::create(cfg, "s", &[]).unwrap();
        t.set_reward(Box::new(ASCII_FRACTION));
        let before = weights(&t);
        t.fit().unwrap();
        (metrics(&t).remove(0), before, weights(&t))
    };
    let (m_off, w0, w_off) = run(false, false);
    for (shared, packed) in [(true, false), (false, true), (true, true)] {
        let (m_on, _, w_on) = run(shared, packed);
        for key in [
            "actor/pg_loss",
            "actor/grad_norm",
            "actor/entropy",
            "critic/score/mean",
        ] {
            let (a, b) = (m_on[key].as_f64().unwrap(), m_off[key].as_f64().unwrap());
            assert!(
                (a - b).abs() <= 1e-5 * b.abs().max(1.0),
                "shared {shared}, packed {packed}: {key}: {a} vs {b}"
            );
        }
        assert_eq!(
            m_on["actor/optimizer_steps"],
            m_off["actor/optimizer_steps"]
        );
        // Adam's first step is about lr * sign(grad), so a weight whose gradient is rounding noise
        // (k_proj's bias: exactly 0 in exact arithmetic) may move either way: compare the whole
        // update.
        let (mut diff, mut step) = (0.0, 0.0);
        for (((_, a), (_, b)), (_, w)) in w_on.iter().zip(&w_off).zip(&w0) {
            diff += f64::try_from((a - b).square().sum(tch::Kind::Double)).unwrap();
            step += f64::try_from((a - w).square().sum(tch::Kind::Double)).unwrap();
        }
        let rel = (diff / step).sqrt();
        assert!(
            step > 0.0 && rel <= 1e-3,
            "shared {shared}, packed {packed}: weights after one step differ by {rel:e} of the update"
        );
    }
}

/// LoRA through `temper train`'s keys (verl's `actor_rollout_ref.model.lora_rank`, ...): the base
/// weights never move, the adapters do; the checkpoint holds the merged weights and the adapter;
/// 2 + 2 resumed steps equal 4 straight ones.
#[test]
fn lora_trains_only_adapters_and_resumes_bitwise() {
    let extra = [
        "trainer.total_training_steps=4",
        "actor_rollout_ref.model.lora_rank=4",
        "actor_rollout_ref.model.lora_alpha=8",
        "actor_rollout_ref.model.target_modules=[\"q_proj\", \"v_proj\", \"down_proj\"]",
    ];
    let root_a = common::temp_dir("lora-a");
    let mut a = Trainer::create(tiny_config(&root_a, &extra), "a", &[]).unwrap();
    a.set_reward(Box::new(ASCII_FRACTION));
    assert_eq!(
        a.model().trainable_parameters().len(),
        2 * 3 * 2,
        "adapters only"
    );
    let base = weights(&a);
    a.set_stop_after(Some(2));
    a.fit().unwrap();
    assert!(same_weights(&base, &weights(&a)), "a base weight moved");
    let lora = |t: &Trainer| -> Vec<(String, tch::Tensor)> {
        t.model()
            .trainable_parameters()
            .into_iter()
            .map(|(n, p)| (n, p.detach().copy()))
            .collect()
    };
    let ckpt = a.run().root.join("checkpoints/global_step_2/model");
    assert!(ckpt.join("adapter/adapter_model.safetensors").is_file());
    let merged =
        temper_model::CausalLm::load(&ckpt, tch::Device::Cpu, temper_model::ComputeKind::F32)
            .unwrap();
    let merged_w: Vec<_> = merged.named_parameters();
    assert!(
        !same_weights(&base, &merged_w),
        "the merged checkpoint equals the base"
    );
    let run_a = a.run().root.clone();
    drop(a);
    let mut a = Trainer::resume(&run_a, &[]).unwrap();
    a.set_reward(Box::new(ASCII_FRACTION));
    a.fit().unwrap();

    let root_b = common::temp_dir("lora-b");
    let mut b = Trainer::create(tiny_config(&root_b, &extra), "b", &[]).unwrap();
    b.set_reward(Box::new(ASCII_FRACTION));
    b.fit().unwrap();
    assert!(
        same_weights(&lora(&a), &lora(&b)),
        "resumed adapters differ"
    );
    assert!(same_weights(&weights(&a), &base));
}

#[test]
fn sampling_from_a_copy_on_rollout_device_matches_sampling_from_the_policy() {
    // `rollout.device = "cpu"` keeps a separate sampling copy (what sampling on another GPU does),
    // refreshed after every optimizer step: the rollouts and weights equal the shared-model run.
    let runs: Vec<_> = [None, Some("rollout.device=cpu")]
        .iter()
        .map(|extra| {
            let root = common::temp_dir("rollout-device");
            let mut ov = vec!["trainer.total_training_steps=3"];
            ov.extend(extra.iter());
            let mut t = Trainer::create(tiny_config(&root, &ov), "rd", &[]).unwrap();
            t.set_reward(Box::new(ASCII_FRACTION));
            t.fit().unwrap();
            let rollouts: Vec<String> = (1..=3)
                .map(|s| {
                    std::fs::read_to_string(t.run().root.join(format!("rollouts/step_{s}.jsonl")))
                        .unwrap()
                })
                .collect();
            (weights(&t), rollouts)
        })
        .collect();
    assert!(same_weights(&runs[0].0, &runs[1].0));
    for (a, b) in runs[0].1.iter().zip(&runs[1].1) {
        let ids = |t: &str| -> Vec<serde_json::Value> {
            t.lines()
                .map(|l| {
                    serde_json::from_str::<serde_json::Value>(l).unwrap()["completion_ids"].clone()
                })
                .collect()
        };
        assert_eq!(ids(a), ids(b));
    }
    // A device this build does not have is refused before anything runs.
    let e = temper_train::config::load_config(
        None,
        &[
            common::tiny_overrides(&common::temp_dir("rd-bad")),
            vec!["rollout.device=cuda:3".into()],
        ]
        .concat(),
    )
    .err()
    .map(|e| format!("{e:#}"))
    .unwrap_or_default();
    assert!(e.contains("rollout.device = \"cuda:3\""), "{e}");
}

/// `actor.gradient_checkpointing` (verl's `model.enable_gradient_checkpointing`): one step trains
/// as without it, with shared prefixes and without: the same rollouts, the same loss (the forward
/// is the same computation, bitwise, so `check_on_policy` holds), the gradient norm and every
/// weight after the update to float rounding. One optimizer step (one mini-batch): the
/// checkpointed backward adds the embedding's rows in another order than autograd's dense
/// embedding gradient, and a second step from weights that differ in the last bits would let
/// AdamW blow up the pure rounding noise of gradients that are zero in exact arithmetic (the
/// key projection's bias) to a visible fraction of the learning rate.
#[test]
fn gradient_checkpointing_trains_like_the_plain_backward() {
    for shared in ["actor.shared_prefix=true", "actor.shared_prefix=false"] {
        let run = |checkpointing: &str| {
            let root = common::temp_dir("ckpt");
            let cfg = tiny_config(
                &root,
                &[
                    "trainer.total_training_steps=1",
                    "actor.ppo_mini_batch_size=4",
                    shared,
                    checkpointing,
                ],
            );
            let mut t = Trainer::create(cfg, "c", &[]).unwrap();
            t.set_reward(Box::new(ASCII_FRACTION));
            t.fit().unwrap();
            (metrics(&t).remove(0), weights(&t))
        };
        let (plain_m, plain_w) = run("actor.gradient_checkpointing=false");
        let (ck_m, ck_w) = run("model.enable_gradient_checkpointing=true");
        let num = |m: &BTreeMap<String, serde_json::Value>, k: &str| m[k].as_f64().unwrap();
        assert_eq!(num(&ck_m, "actor/optimizer_steps"), 1.0);
        assert_eq!(
            num(&plain_m, "actor/pg_loss"),
            num(&ck_m, "actor/pg_loss"),
            "{shared}"
        );
        assert_eq!(
            num(&plain_m, "critic/score/mean"),
            num(&ck_m, "critic/score/mean")
        );
        let (a, b) = (
            num(&plain_m, "actor/grad_norm"),
            num(&ck_m, "actor/grad_norm"),
        );
        assert!(
            a > 0.0 && ((a - b) / a).abs() < 1e-5,
            "{shared}: grad norm {a} vs {b}"
        );
        for ((name, x), (_, y)) in plain_w.iter().zip(&ck_w) {
            let d = f64::try_from((x - y).abs().max()).unwrap();
            assert!(
                d < 1e-5,
                "{shared}: {name} differs by {d:e} after one update"
            );
        }
    }
}
