//! Data-parallel training over c10d/Gloo: two ranks (threads of this process, each with its own
//! Trainer, on 127.0.0.1) against one rank with the same global batch, on the tiny model, 3 steps:
//! the same rollouts, the same per-step metrics and the same weights. Then the 2-rank run is
//! resumed by one rank, and a rank that goes away makes the other fail with a message naming it.
use temper_testkit as common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::{tiny_config, weights, OfResponse, ASCII_FRACTION};
use temper_train::dist::Dist;
use temper_train::trainer::Trainer;

type Weights = Vec<(String, tch::Tensor)>;

fn connect(port: u16, rank: usize, world: usize) -> Dist {
    Dist::from_comm(common::gloo_comm(port, rank, world))
}

const EXTRA: [&str; 2] = ["trainer.total_training_steps=3", "trainer.save_freq=3"];

/// (run folder of rank 0, final weights of every rank).
fn run(world: usize, root: &Path) -> (PathBuf, Vec<Weights>) {
    run_with(world, root, &[], false)
}

/// A reward that is 1 when the completion starts with an ASCII character: often equal across a
/// group, so DAPO's filter has groups to drop.
const FIRST_CHAR_ASCII: OfResponse = OfResponse {
    name: "first_char_ascii",
    score: |c| {
        temper_reward::RewardOutput::new(c.chars().next().is_some_and(|x| x.is_ascii()) as u8 as f64)
    },
};

fn run_with(world: usize, root: &Path, extra: &[&str], binary: bool) -> (PathBuf, Vec<Weights>) {
    let sharded =
        extra.contains(&FSDP) && (world > 1 || extra.iter().any(|e| e.contains("offload=true")));
    let extra: Vec<String> = EXTRA.iter().chain(extra).map(|s| s.to_string()).collect();
    let port = common::free_port();
    let handles: Vec<_> = (0..world)
        .map(|rank| {
            let root = root.to_path_buf();
            let extra = extra.clone();
            std::thread::spawn(move || {
                let dist = if world == 1 {
                    Dist::single()
                } else {
                    connect(port, rank, world)
                };
                let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
                let mut t =
                    Trainer::create_with(tiny_config(&root, &extra), "dp", &[], dist).unwrap();
                t.set_reward(if binary {
                    Box::new(FIRST_CHAR_ASCII)
                } else {
                    Box::new(ASCII_FRACTION)
                });
                t.fit().unwrap();
                if sharded {
                    // A fit ends with the layers let go: no rank holds the whole model after it.
                    let held = t.model().trainable_parameters();
                    let (name, p) = held
                        .iter()
                        .find(|(n, _)| {
                            n.contains("layers.0.self_attn.q_proj") && n.ends_with("weight")
                        })
                        .unwrap();
                    assert_eq!(p.numel(), 0, "{name} is whole after a sharded fit");
                }
                (t.run().root.clone(), weights(&t))
            })
        })
        .collect();
    let results: Vec<(PathBuf, Weights)> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let folder = results[0].0.clone();
    (folder, results.into_iter().map(|r| r.1).collect())
}

fn metrics(folder: &Path) -> Vec<BTreeMap<String, serde_json::Value>> {
    temper_train::rundir::RunDir::new(folder)
        .read_metrics()
        .unwrap()
}

/// Each step's `rollout/policy_lag_max`.
fn lags(folder: &Path) -> Vec<f64> {
    metrics(folder)
        .iter()
        .map(|m| m["rollout/policy_lag_max"].as_f64().unwrap())
        .collect()
}

fn rel_diff(a: &Weights, b: &Weights) -> f64 {
    let (mut d, mut n) = (0.0, 0.0);
    for ((na, x), (nb, y)) in a.iter().zip(b) {
        assert_eq!(na, nb);
        d += f64::try_from((x - y).square().sum(tch::Kind::Double)).unwrap();
        n += f64::try_from(x.square().sum(tch::Kind::Double)).unwrap();
    }
    (d / n).sqrt()
}

#[test]
fn two_ranks_train_like_one() {
    let (one_dir, one) = run(1, &common::temp_dir("dp-one"));
    let (two_dir, two) = run(2, &common::temp_dir("dp-two"));
    // Both ranks end with the same weights, equal to the 1-rank run's.
    assert_eq!(rel_diff(&two[0], &two[1]), 0.0);
    let rel = rel_diff(&one[0], &two[0]);
    assert!(rel <= 1e-5, "weights differ by {rel:e} (relative)");
    // The same rollouts, token for token, at every step.
    for step in 1..=3 {
        let read = |d: &Path| -> Vec<serde_json::Value> {
            std::fs::read_to_string(d.join(format!("rollouts/step_{step}.jsonl")))
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect()
        };
        let (a, b) = (read(&one_dir), read(&two_dir));
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(x["completion_ids"], y["completion_ids"], "step {step}");
            assert_eq!(x["prompt_ids"], y["prompt_ids"], "step {step}");
        }
    }
    same_metrics(&one_dir, &two_dir);
    // One checkpoint, written by rank 0; a 2-rank run resumes with one rank.
    let ckpts: Vec<_> = std::fs::read_dir(two_dir.join("checkpoints"))
        .unwrap()
        .collect();
    assert_eq!(ckpts.len(), 1);
    let mut t = Trainer::resume_with(
        &two_dir,
        &["trainer.total_training_steps=4".into()],
        Dist::single(),
    )
    .unwrap();
    t.set_reward(Box::new(ASCII_FRACTION));
    t.fit().unwrap();
    assert_eq!(metrics(&two_dir).len(), 4);
}

/// The metrics of two runs agree (timings aside).
fn same_metrics(one: &Path, two: &Path) {
    let (ma, mb) = (metrics(one), metrics(two));
    assert_eq!(ma.len(), mb.len());
    for (a, b) in ma.iter().zip(&mb) {
        for (k, va) in a {
            if k.starts_with("timing_s/") || k.starts_with("perf/") {
                continue;
            }
            let vb = b
                .get(k)
                .unwrap_or_else(|| panic!("{k} missing in the 2-rank run"));
            match (va.as_f64(), vb.as_f64()) {
                (Some(x), Some(y)) => assert!(
                    (x - y).abs() <= 1e-6 * x.abs().max(1.0),
                    "{k}: {x} (1 rank) vs {y} (2 ranks)"
                ),
                _ => assert_eq!(va, vb, "{k}"),
            }
        }
    }
}

#[test]
fn dapo_filtering_and_sharded_evaluation_run_data_parallel_like_one_rank() {
    let extra = [
        "algorithm.filter_groups.enable=true",
        "algorithm.filter_groups.max_num_gen_batches=3",
        "trainer.test_freq=1",
        "eval.n=2",
    ];
    let (one_dir, one) = run_with(1, &common::temp_dir("dp-dapo-one"), &extra, true);
    let (two_dir, two) = run_with(2, &common::temp_dir("dp-dapo-two"), &extra, true);
    assert_eq!(rel_diff(&two[0], &two[1]), 0.0);
    let rel = rel_diff(&one[0], &two[0]);
    assert!(rel <= 1e-5, "weights differ by {rel:e} (relative)");
    same_metrics(&one_dir, &two_dir);
    let m = metrics(&one_dir);
    assert!(
        m.iter()
            .any(|s| s.get("batch/zero_adv_groups").and_then(|v| v.as_f64()) > Some(0.0)),
        "the filter dropped groups"
    );
    // Sharded, with the layers gathered per use (several sampling rounds a step, evaluation
    // shards): the same run.
    let sharded: Vec<&str> = extra.iter().copied().chain([FSDP, CHECKPOINTED]).collect();
    let (fsdp_dir, fsdp) = run_with(2, &common::temp_dir("dp-dapo-fsdp"), &sharded, true);
    let rel = rel_diff(&two[0], &fsdp[0]);
    assert!(rel <= 1e-5, "fsdp weights differ by {rel:e} (relative)");
    same_metrics(&two_dir, &fsdp_dir);
    assert!(m.iter().any(|s| s.contains_key("val/accuracy")));
    // One evaluation file per evaluation, written by rank 0, equal to the 1-rank one.
    let eval = |d: &Path| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(d.join("eval/step_3.json")).unwrap()).unwrap()
    };
    assert_eq!(eval(&one_dir)["records"], eval(&two_dir)["records"]);
}

#[test]
fn a_rank_that_goes_away_stops_the_other_with_a_message() {
    let port = common::free_port();
    let root = common::temp_dir("dp-gone");
    let gone = std::thread::spawn(move || {
        // Joins, then leaves before the first step's collective.
        drop(connect(port, 1, 2));
    });
    let dist = connect(port, 0, 2);
    gone.join().unwrap();
    // Found missing at the config check or at the first step's gather, whichever comes first.
    let e = Trainer::create_with(tiny_config(&root, &EXTRA), "dp", &[], dist)
        .and_then(|mut t| {
            t.set_reward(Box::new(ASCII_FRACTION));
            t.fit()
        })
        .map(|_| ())
        .unwrap_err();
    let e = format!("{e:#}");
    assert!(e.starts_with("rank 0: all_gather failed: "), "{e}");
    assert!(e.contains("Connection closed by peer"), "{e}");
}

#[test]
fn ranks_with_different_configs_are_refused_on_every_rank() {
    let port = common::free_port();
    let handles: Vec<_> = (0..2)
        .map(|rank| {
            std::thread::spawn(move || {
                let root = common::temp_dir("dp-mismatch");
                let lr = format!("actor.optim.lr={}", if rank == 0 { 1e-2 } else { 1e-3 });
                let cfg = tiny_config(&root, &[lr.as_str()]);
                match Trainer::create_with(cfg, "dp", &[], connect(port, rank, 2)) {
                    Ok(_) => panic!("rank {rank} started with a different config"),
                    Err(e) => format!("{e:#}"),
                }
            })
        })
        .collect();
    for (rank, h) in handles.into_iter().enumerate() {
        let e = h.join().unwrap();
        assert!(
            e.starts_with(&format!("rank {rank}: the ranks' configs differ (rank 1's")),
            "{e}"
        );
    }
}

#[test]
fn a_world_size_that_does_not_divide_the_batch_is_refused() {
    let cfg = tiny_config(
        &common::temp_dir("dp-div"),
        &["data.train_batch_size=3", "actor.ppo_mini_batch_size=3"],
    );
    let e = format!("{:#}", cfg.check_world_size(2).unwrap_err());
    assert_eq!(
        e,
        "data.train_batch_size = 3 is not divisible by the world size 2"
    );
}

/// Environment runs data-parallel: each rank runs the episodes of its share of the questions and
/// trains its share of the datums. A debate (mock judge, rejection sampling) and the one-turn
/// summary task (GRPO over each article's answers), 1 rank vs 2: the same datums and episode
/// files, the same metrics and the same weights.
#[test]
fn environment_runs_train_data_parallel_like_one_rank() {
    let articles = |root: &Path| -> String {
        let data = root.join("articles.jsonl");
        let lines: String = (0..4)
            .map(|i| {
                let article = format!("Article {i}. ").repeat(20 + 10 * i);
                serde_json::json!({ "article": article }).to_string() + "\n"
            })
            .collect();
        std::fs::create_dir_all(root).unwrap();
        std::fs::write(&data, lines).unwrap();
        format!("data.train_files=[{:?}]", data.display().to_string())
    };
    let read = |p: PathBuf| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap()
    };
    for (name, env, files) in [
        (
            "debate",
            &[
                "env.name=debate",
                "env.task=qa",
                "env.debate_train=rejection",
            ][..],
            &["debate_0.json", "debate_5.json"][..],
        ),
        (
            "summary",
            &["env.name=summary", "env.skip_zero_advantage=true"],
            &["summary_0.json", "summary_11.json"],
        ),
    ] {
        let dirs = [
            common::temp_dir(&format!("dp-env-{name}-one")),
            common::temp_dir(&format!("dp-env-{name}-two")),
        ];
        let data = articles(&dirs[0]);
        let mut extra = vec![
            "data.max_prompt_length=1024",
            "data.train_batch_size=2",
            "actor.ppo_mini_batch_size=1",
            "actor.ppo_micro_batch_size_per_gpu=2",
            "rollout.n=4",
        ];
        if name == "summary" {
            extra.push(data.as_str());
        }
        extra.extend_from_slice(env);
        let (one_dir, one) = run_with(1, &dirs[0], &extra, false);
        let (two_dir, two) = run_with(2, &dirs[1], &extra, false);
        assert_eq!(rel_diff(&two[0], &two[1]), 0.0, "{name}");
        let rel = rel_diff(&one[0], &two[0]);
        assert!(rel <= 1e-5, "{name}: weights differ by {rel:e} (relative)");
        assert!(
            rel_diff(&one[0], &weights_of_fresh()) > 0.0,
            "{name}: trained"
        );
        for step in 1..=3 {
            let f = format!("training_step_{step}.json");
            let (a, b) = (read(one_dir.join(&f)), read(two_dir.join(&f)));
            assert!(!a["datums"].as_array().unwrap().is_empty(), "{name}");
            close(&a["datums"], &b["datums"], &format!("{name} step {step}"));
        }
        for f in files {
            close(
                &read(one_dir.join(f)),
                &read(two_dir.join(f)),
                &format!("{name} {f}"),
            );
        }
        same_metrics(&one_dir, &two_dir);
        // Sharded with layers gathered per use: the datums' shares may differ by one between
        // the ranks, and the rank with fewer micro-batches sweeps the layers for the missing
        // one, so the gathers still pair up.
        let mut sharded = extra.clone();
        // One datum per micro-batch, so that uneven shares are uneven micro-batch counts.
        sharded.extend([FSDP, CHECKPOINTED, "actor.ppo_micro_batch_size_per_gpu=1"]);
        let dir = common::temp_dir(&format!("dp-env-{name}-fsdp"));
        let (fsdp_dir, fsdp) = run_with(2, &dir, &sharded, false);
        let rel = rel_diff(&two[0], &fsdp[0]);
        assert!(
            rel <= 1e-5,
            "{name}: fsdp weights differ by {rel:e} (relative)"
        );
        for step in 1..=3 {
            let f = format!("training_step_{step}.json");
            let (a, b) = (read(two_dir.join(&f)), read(fsdp_dir.join(&f)));
            close(
                &a["datums"],
                &b["datums"],
                &format!("{name} fsdp step {step}"),
            );
        }
    }
}

/// `a` and `b` are equal, numbers within 1e-5 relative (the weights after an update differ in
/// the last bits with the order of the all-reduce, and so do later logprobs): tokens, texts,
/// verdicts and masks exactly.
fn close(a: &serde_json::Value, b: &serde_json::Value, at: &str) {
    use serde_json::Value;
    match (a, b) {
        (Value::Array(x), Value::Array(y)) => {
            assert_eq!(x.len(), y.len(), "{at}: lengths");
            for (i, (p, q)) in x.iter().zip(y).enumerate() {
                close(p, q, &format!("{at}[{i}]"));
            }
        }
        (Value::Object(x), Value::Object(y)) => {
            assert_eq!(
                x.keys().collect::<Vec<_>>(),
                y.keys().collect::<Vec<_>>(),
                "{at}"
            );
            for (k, p) in x {
                close(p, &y[k], &format!("{at}.{k}"));
            }
        }
        (Value::Number(p), Value::Number(q)) if p.is_f64() || q.is_f64() => {
            let (p, q) = (p.as_f64().unwrap(), q.as_f64().unwrap());
            assert!((p - q).abs() <= 1e-5 * p.abs().max(1.0), "{at}: {p} vs {q}");
        }
        _ => assert_eq!(a, b, "{at}"),
    }
}

/// The tiny model's weights before any training.
fn weights_of_fresh() -> Weights {
    let root = common::temp_dir("dp-env-fresh");
    let t = Trainer::create_with(tiny_config(&root, &[]), "fresh", &[], Dist::single()).unwrap();
    weights(&t)
}

/// The largest elementwise difference between two runs' weights.
fn max_abs_diff(a: &Weights, b: &Weights) -> f64 {
    a.iter()
        .zip(b)
        .map(|((na, x), (nb, y))| {
            assert_eq!(na, nb);
            f64::try_from((x - y).abs().max()).unwrap()
        })
        .fold(0.0, f64::max)
}

const FSDP: &str = "actor.strategy=fsdp";

/// `actor.strategy = fsdp` (optimizer state, masters and gradients sharded per decoder layer)
/// trains as `dp` does. Without clipping, bitwise: AdamW is elementwise and a sum over 2 ranks
/// is the same sum. With clipping the global norm adds the ranks' squared slice norms, not
/// PyTorch's per-parameter norms, so it differs in the last bit, and a last-bit difference in
/// the clip coefficient grows at this test's learning rate (1e-2, AdamW's sign-like first steps)
/// to ~1e-6 of the weights in 3 steps: the losses and norms are held to 1e-6, the weights to
/// 1e-5 as 1 against 2 dp ranks are. Then over 4 ranks with the optimizer offloaded against one
/// rank, and LoRA. The checkpoint holds one file of slices per rank and their layout.
#[test]
fn sharded_ranks_train_like_replicated_ones() {
    let no_clip = "actor.grad_clip=0";
    let (_, dp2) = run_with(2, &common::temp_dir("fsdp-dp2-noclip"), &[no_clip], false);
    let (_, f2) = run_with(2, &common::temp_dir("fsdp-noclip"), &[no_clip, FSDP], false);
    assert_eq!(
        max_abs_diff(&dp2[0], &f2[0]),
        0.0,
        "fsdp without clipping is not dp's bits"
    );

    let (dp2_dir, dp2) = run_with(2, &common::temp_dir("fsdp-dp2"), &[], false);
    let (f2_dir, f2) = run_with(2, &common::temp_dir("fsdp-two"), &[FSDP], false);
    assert_eq!(
        max_abs_diff(&f2[0], &f2[1]),
        0.0,
        "the ranks' weights differ"
    );
    let d = rel_diff(&dp2[0], &f2[0]);
    assert!(
        d <= 1e-5,
        "fsdp and dp over 2 ranks differ by {d:e} (relative)"
    );
    same_metrics(&dp2_dir, &f2_dir);
    let opt = f2_dir.join("checkpoints/global_step_3/optimizer");
    for f in ["layout.json", "rank-0.safetensors", "rank-1.safetensors"] {
        assert!(opt.join(f).is_file(), "{} missing", opt.join(f).display());
    }
    assert!(!f2_dir
        .join("checkpoints/global_step_3/optimizer.safetensors")
        .exists());

    let (one_dir, one) = run(1, &common::temp_dir("fsdp-one"));
    let offload = "actor.fsdp_config.optimizer_offload=true";
    let (f4_dir, f4) = run_with(4, &common::temp_dir("fsdp-four"), &[FSDP, offload], false);
    for r in 1..4 {
        assert_eq!(
            max_abs_diff(&f4[0], &f4[r]),
            0.0,
            "rank {r}'s weights differ"
        );
    }
    let rel = rel_diff(&one[0], &f4[0]);
    assert!(
        rel <= 1e-5,
        "fsdp over 4 ranks and one rank differ by {rel:e}"
    );
    same_metrics(&one_dir, &f4_dir);

    let lora = ["model.lora_rank=4", "model.lora_alpha=8"];
    let (dl_dir, dl) = run_with(2, &common::temp_dir("fsdp-lora-dp"), &lora, false);
    let with_fsdp = [lora[0], lora[1], FSDP];
    let (fl_dir, fl) = run_with(2, &common::temp_dir("fsdp-lora"), &with_fsdp, false);
    let d = rel_diff(&dl[0], &fl[0]);
    assert!(
        d <= 1e-5,
        "LoRA: fsdp and dp over 2 ranks differ by {d:e} (relative)"
    );
    same_metrics(&dl_dir, &fl_dir);
}

/// Resumes the run in `dir` for one more step over `world` ranks; the ranks' final weights.
fn resume(dir: &Path, world: usize) -> Vec<Weights> {
    let port = common::free_port();
    let handles: Vec<_> = (0..world)
        .map(|rank| {
            let dir = dir.to_path_buf();
            std::thread::spawn(move || {
                let dist = match world {
                    1 => Dist::single(),
                    _ => connect(port, rank, world),
                };
                let more = ["trainer.total_training_steps=4".to_string()];
                let mut t = Trainer::resume_with(&dir, &more, dist).unwrap();
                t.set_reward(Box::new(ASCII_FRACTION));
                t.fit().unwrap();
                weights(&t)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

/// A checkpoint of 2 sharded ranks resumes on one rank (its slices joined into whole moments)
/// and on 4 (cut again): the same next step, and the same next step as the 2 ranks that wrote it
/// would take.
#[test]
fn a_sharded_checkpoint_resumes_at_another_world_size() {
    let (dir, _) = run_with(2, &common::temp_dir("fsdp-resume"), &[FSDP], false);
    let runs: Vec<PathBuf> = ["on-1", "on-2", "on-4"]
        .iter()
        .map(|n| {
            let to = common::temp_dir(&format!("fsdp-resume-{n}"));
            common::copy_tree(&dir, &to);
            to
        })
        .collect();
    let on1 = resume(&runs[0], 1);
    let on2 = resume(&runs[1], 2);
    let on4 = resume(&runs[2], 4);
    for (name, other, folder) in [("1", &on1[0], &runs[0]), ("4", &on4[0], &runs[2])] {
        let d = rel_diff(&on2[0], other);
        assert!(
            d <= 1e-5,
            "resumed on {name} rank(s): weights differ by {d:e} (relative)"
        );
        assert_eq!(metrics(folder).len(), 4);
    }
    let step4 = |d: &Path| metrics(d).pop().unwrap();
    for folder in [&runs[0], &runs[2]] {
        let (a, b) = (step4(&runs[1]), step4(folder));
        for k in ["actor/grad_norm", "actor/pg_loss"] {
            let (x, y) = (a[k].as_f64().unwrap(), b[k].as_f64().unwrap());
            assert!((x - y).abs() <= 1e-6 * x.abs().max(1.0), "{k}: {x} vs {y}");
        }
    }
}

const CHECKPOINTED: &str = "actor.gradient_checkpointing=true";

/// With activation checkpointing a sharded update holds no decoder layer whole: the model
/// gathers each layer from the ranks' slices while it runs it (forward, then again in the
/// backward, which reduce-scatters the layer's gradient as it leaves it). Without clipping it
/// is dp's run bit for bit (one micro-batch per rank per mini-batch here, so the sums are the
/// same sums): padded rows with shared prompts (two sweeps over the layers per forward), packed
/// rows, whole rows, and the forward's layers kept to the backward.
#[test]
fn sharded_layers_gathered_per_use_train_like_dp() {
    let base = [CHECKPOINTED, "actor.grad_clip=0"];
    for (name, variant) in [
        ("shared", None),
        (
            "kept",
            Some("actor.fsdp_config.reshard_after_forward=false"),
        ),
        ("packed", Some("model.use_remove_padding=true")),
        ("whole", Some("actor.shared_prefix=false")),
    ] {
        let mut extra: Vec<&str> = base.to_vec();
        if let Some(v) = variant {
            if name != "kept" {
                extra.push(v);
            }
        }
        let (_, dp) = run_with(
            2,
            &common::temp_dir(&format!("z3-dp-{name}")),
            &extra,
            false,
        );
        extra.push(FSDP);
        if let Some(v) = variant {
            if name == "kept" {
                extra.push(v);
            }
        }
        let (dir, f) = run_with(2, &common::temp_dir(&format!("z3-{name}")), &extra, false);
        assert_eq!(
            max_abs_diff(&f[0], &f[1]),
            0.0,
            "{name}: the ranks' weights differ"
        );
        assert_eq!(max_abs_diff(&dp[0], &f[0]), 0.0, "{name}: not dp's weights");
        assert_eq!(metrics(&dir).len(), 3);
    }
}

/// What a rank holds for the trainable weights (summed from its tensors during the update,
/// `perf/trainable_state_gb`): one dp rank 16 bytes per parameter (weights, gradients, two
/// moments); a sharded rank with per-layer gathering 1/N of that, plus what is whole at the
/// peak: the weights outside the layers (embeddings, final norm, head) and one layer, with their
/// gradients, within 10%.
#[test]
fn a_sharded_rank_holds_its_share_of_the_trainable_state() {
    let gb = |d: &Path| -> f64 {
        metrics(d)
            .iter()
            .map(|m| m["perf/trainable_state_gb"].as_f64().unwrap())
            .fold(0.0, f64::max)
            * (1u64 << 30) as f64
    };
    let (one_dir, w) = run_with(1, &common::temp_dir("z3-mem-1"), &[CHECKPOINTED], false);
    let sizes: Vec<(&str, f64)> = w[0]
        .iter()
        .map(|(n, t)| (n.as_str(), t.numel() as f64))
        .collect();
    let total: f64 = sizes.iter().map(|s| s.1).sum();
    let rest: f64 = sizes
        .iter()
        .filter(|(n, _)| !n.contains(".layers."))
        .map(|s| s.1)
        .sum();
    let layer = |i: usize| -> f64 {
        let prefix = format!("model.layers.{i}.");
        sizes
            .iter()
            .filter(|(n, _)| n.starts_with(&prefix))
            .map(|s| s.1)
            .sum()
    };
    let largest_layer = (0..8).map(layer).fold(0.0, f64::max);
    assert_eq!(gb(&one_dir), 16.0 * total, "one dp rank");
    for world in [2, 4] {
        let dir = common::temp_dir(&format!("z3-mem-{world}"));
        let (d, _) = run_with(world, &dir, &[CHECKPOINTED, FSDP], false);
        let held = gb(&d);
        let expected = 16.0 * total / world as f64 + 8.0 * (rest + largest_layer);
        eprintln!(
            "{world} ranks: {held} bytes held, expected {expected}; one rank {}, whole weights and \
             gradients {}",
            16.0 * total,
            8.0 * total
        );
        assert!(
            held >= 16.0 * total / world as f64 && held <= 1.10 * expected,
            "{world} ranks: {held} bytes held, expected about {expected}"
        );
    }
}

/// In-process overlap (`rollout.async_steps`) on sharded ranks: each rank's sampler thread gets
/// the gathered weights after every update; the lag stays within the bound.
#[test]
fn sharded_ranks_sample_ahead_in_process() {
    let extra = [
        FSDP,
        CHECKPOINTED,
        "rollout.async_steps=1",
        "trainer.check_on_policy=false",
    ];
    let (dir, w) = run_with(2, &common::temp_dir("fsdp-async"), &extra, false);
    assert_eq!(max_abs_diff(&w[0], &w[1]), 0.0);
    assert_eq!(lags(&dir), vec![0.0, 1.0, 1.0]);
}

/// Every rollout's completion tokens and log-probs of a run folder, step by step.
fn draws(folder: &Path) -> Vec<Vec<(serde_json::Value, serde_json::Value)>> {
    (1..=3)
        .map(|s| {
            common::rollouts(folder, s)
                .into_iter()
                .map(|r| (r["completion_ids"].clone(), r["rollout_logprobs"].clone()))
                .collect()
        })
        .collect()
}

/// Sharded, the samplers' copies are made a decoder layer at a time as both ranks gather it
/// (never the whole model at once): a copy on `rollout.device` samples what the policy does (the
/// run is the one without it, draw for draw, weights bitwise), and with the weights held still
/// (lr = 0) the sampler thread of `rollout.async_steps` draws what the lock-step run draws.
#[test]
fn sharded_samplers_copies_are_made_layer_by_layer() {
    let base = [FSDP, CHECKPOINTED, "trainer.check_on_policy=false"];
    let with = |extra: &[&'static str]| -> Vec<&'static str> {
        base.iter().chain(extra).copied().collect()
    };
    let (plain, w_plain) = run_with(2, &common::temp_dir("fsdp-policy"), &base, false);
    let (copy, w_copy) = run_with(
        2,
        &common::temp_dir("fsdp-rollout-device"),
        &with(&["rollout.device=cpu"]),
        false,
    );
    assert_eq!(max_abs_diff(&w_plain[0], &w_copy[0]), 0.0);
    assert!(!draws(&plain)[2].is_empty());
    assert_eq!(draws(&plain), draws(&copy));

    let still = "actor.optim.lr=0";
    let (sync, _) = run_with(2, &common::temp_dir("fsdp-still"), &with(&[still]), false);
    let (ahead, _) = run_with(
        2,
        &common::temp_dir("fsdp-still-ahead"),
        &with(&[still, "rollout.async_steps=1"]),
        false,
    );
    assert_eq!(draws(&sync), draws(&ahead));
}

/// An environment run sampling ahead on 2 sharded ranks (layers gathered per use): each rank's
/// learner updates on a thread of its own while the rank plays its share of the next step's
/// debates; the update's gathers and the sampler thread's snapshot pair up across the ranks, and
/// every step after the first trains on debates one version old.
#[test]
fn environment_runs_play_ahead_on_sharded_ranks() {
    let extra = [
        "data.max_prompt_length=1024",
        "data.train_batch_size=2",
        "actor.ppo_mini_batch_size=1",
        "actor.ppo_micro_batch_size_per_gpu=1",
        "rollout.n=4",
        "env.name=debate",
        "env.task=qa",
        "env.debate_train=rejection",
        FSDP,
        CHECKPOINTED,
        "rollout.async_steps=1",
        "trainer.check_on_policy=false",
    ];
    let (dir, w) = run_with(2, &common::temp_dir("dp-env-ahead"), &extra, false);
    assert_eq!(rel_diff(&w[0], &w[1]), 0.0);
    assert!(rel_diff(&w[0], &weights_of_fresh()) > 0.0, "trained");
    assert_eq!(lags(&dir), vec![0.0, 1.0, 1.0]);
}
