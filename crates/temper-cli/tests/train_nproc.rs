//! `temper train --nproc 2` (two processes, torchrun's environment, Gloo on loopback) against
//! `temper train` alone with the same config on the tiny model: the same per-step metrics, one
//! run folder, one checkpoint. Then the 2-process run is resumed by one process.
use temper_testkit as common;
mod serve_util;

use std::path::{Path, PathBuf};
use std::process::Command;

fn train(root: &Path, nproc: usize, extra: &[&str]) -> PathBuf {
    // The overrides describe the whole run; the config file is empty.
    let config = root.join("blank.toml");
    std::fs::write(&config, "").unwrap();
    let mut args: Vec<String> = vec![
        "train".into(),
        "--nproc".into(),
        nproc.to_string(),
        config.display().to_string(),
    ];
    args.extend(common::tiny_overrides(root));
    args.extend(
        [
            "trainer.total_training_steps=2",
            "trainer.save_freq=2",
            "trainer.test_freq=-1",
        ]
        .iter()
        .chain(extra)
        .map(|s| s.to_string()),
    );
    common::output_ok(
        Command::new(env!("CARGO_BIN_EXE_temper"))
            .args(&args)
            .env_remove("RANK"),
    );
    root.join("run")
}

fn metrics(run: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn two_processes_train_like_one() {
    let one = train(&common::temp_dir("nproc1"), 1, &[]);
    let two = train(&common::temp_dir("nproc2"), 2, &[]);
    let (a, b) = (metrics(&one), metrics(&two));
    assert_eq!(a.len(), 2);
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        for (k, vx) in x.as_object().unwrap() {
            if k.starts_with("timing_s/") || k.starts_with("perf/") {
                continue;
            }
            let (p, q) = (vx.as_f64().unwrap(), y[k].as_f64().unwrap());
            assert!((p - q).abs() <= 1e-6 * p.abs().max(1.0), "{k}: {p} vs {q}");
        }
    }
    let ckpts = std::fs::read_dir(two.join("checkpoints")).unwrap().count();
    assert_eq!(ckpts, 1);
    // Resume the 2-process run with one process.
    common::output_ok(
        Command::new(env!("CARGO_BIN_EXE_temper"))
            .args(["train", "--resume"])
            .arg(&two)
            .arg("trainer.total_training_steps=3"),
    );
    assert_eq!(metrics(&two).len(), 3);
}

/// Sharded (`actor.strategy=fsdp`, layers gathered per use) over 2 processes: the 1-process
/// run's metrics, a checkpoint of one slice file per rank, resumed by one process (the slices
/// joined) and by two (as saved).
#[test]
fn two_sharded_processes_train_like_one_and_resume() {
    let sharded = ["actor.strategy=fsdp", "actor.gradient_checkpointing=true"];
    let one = train(&common::temp_dir("nproc1-fsdp"), 1, &[]);
    let two = train(&common::temp_dir("nproc2-fsdp"), 2, &sharded);
    let (a, b) = (metrics(&one), metrics(&two));
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        close_metrics(x, y);
    }
    let opt = two.join("checkpoints/global_step_2/optimizer");
    for f in ["layout.json", "rank-0.safetensors", "rank-1.safetensors"] {
        assert!(opt.join(f).is_file(), "{}", opt.join(f).display());
    }
    let copy = common::temp_dir("nproc2-fsdp-copy").join("run");
    common::copy_tree(&two, &copy);
    common::output_ok(
        Command::new(env!("CARGO_BIN_EXE_temper"))
            .args(["train", "--resume"])
            .arg(&two)
            .arg("trainer.total_training_steps=3"),
    );
    common::output_ok(
        Command::new(env!("CARGO_BIN_EXE_temper"))
            .args(["train", "--nproc", "2", "--resume"])
            .arg(&copy)
            .arg("trainer.total_training_steps=3")
            .env_remove("RANK"),
    );
    close_metrics(&metrics(&two)[2], &metrics(&copy)[2]);
}

/// Every metric of two steps within 1e-5 relative (timings and memory aside): checkpointed
/// layers and the sharded norm add up in another order.
fn close_metrics(x: &serde_json::Value, y: &serde_json::Value) {
    for (k, vx) in x.as_object().unwrap() {
        if k.starts_with("timing_s/") || k.starts_with("perf/") {
            continue;
        }
        if let (Some(p), Some(q)) = (vx.as_f64(), y[k].as_f64()) {
            assert!((p - q).abs() <= 1e-5 * p.abs().max(1.0), "{k}: {p} vs {q}");
        }
    }
}

#[test]
fn a_world_size_that_does_not_divide_the_batch_fails_on_every_rank() {
    let root = common::temp_dir("nproc3");
    let config = root.join("blank.toml");
    std::fs::write(&config, "").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_temper"))
        .args(["train", "--nproc", "3"])
        .arg(&config)
        .arg(format!(
            "model.path={:?}",
            common::tiny_model_dir().display().to_string()
        ))
        .args([
            "data.task=arith",
            "data.train_batch_size=4",
            "actor.ppo_mini_batch_size=4",
        ])
        .arg(format!(
            "trainer.default_local_dir={:?}",
            root.display().to_string()
        ))
        .env_remove("RANK")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("data.train_batch_size = 4 is not divisible by the world size 3"),
        "{err}"
    );
    assert!(err.contains("failed"), "{err}");
}

/// Two processes sampling on a `temper serve` process, with weight sync (rank 0 writes and
/// reloads, both wait) and overlap: the same metrics as one process on the same server.
#[test]
fn two_processes_share_rollout_servers() {
    let server = serve_util::start(&common::tiny_model_dir(), &[]);
    let urls = format!("rollout.base_urls=[{:?}]", server.url);
    // A reward with a spread on the tiny model (the share of letters in the completion), so
    // every step updates and the servers reload.
    let script = "import json,sys\nfor l in sys.stdin:\n c=json.loads(l)['completion']\n \
                  print(json.dumps({'reward': sum(ch.isalpha() for ch in c)/max(len(c),1)}), flush=True)";
    let reward = format!("reward.kwargs={{ cmd = [\"python3\", \"-c\", {script:?}] }}");
    let extra = [
        "reward.name=\"command\"",
        reward.as_str(),
        "rollout.backend=\"sglang\"",
        urls.as_str(),
        "rollout.async_steps=1",
        "trainer.check_on_policy=false",
    ];
    let one = train(&common::temp_dir("nproc1-remote"), 1, &extra);
    // The two processes sharded: every rank gathers the layers for rank 0 to write the servers'
    // weights.
    let mut sharded = extra.to_vec();
    sharded.extend(["actor.strategy=fsdp", "actor.gradient_checkpointing=true"]);
    let two = train(&common::temp_dir("nproc2-remote"), 2, &sharded);
    let (a, b) = (metrics(&one), metrics(&two));
    assert_eq!(a.len(), 2);
    for (x, y) in a.iter().zip(&b) {
        for k in [
            "critic/score/mean",
            "actor/pg_loss",
            "rollout/policy_lag_max",
            "actor/grad_norm",
        ] {
            let (p, q) = (x[k].as_f64().unwrap(), y[k].as_f64().unwrap());
            assert!((p - q).abs() <= 1e-6 * p.abs().max(1.0), "{k}: {p} vs {q}");
        }
    }
    assert_eq!(b[1]["rollout/policy_lag_max"], 1.0);
}
