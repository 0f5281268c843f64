//! tinker-cookbook 0.6.1, the real package from PyPI (installed by scripts/setup-env.sh without
//! its unpublished `tml-renderers` dependency), runs unchanged against `temper serve`: the recipes
//! are started as a user starts them, with only the model, renderer and sizes changed, and must
//! finish with their own success message and finite metrics.
#[path = "../../temper-train/tests/common/mod.rs"]
mod common;
mod serve_util;

use std::path::Path;
use std::process::{Command, Stdio};

use serve_util::Client;

/// Runs `python -m module args...` against the server at `url` and returns its combined output,
/// failing the test when it does not exit 0.
fn recipe(url: &str, module: &str, args: &[String]) -> String {
    let client = Client::new(
        Command::new(common::python())
            .arg("-m")
            .arg(module)
            .args(args)
            .env("TINKER_BASE_URL", url)
            .env("TINKER_API_KEY", "tml-local")
            .env("TINKER_TELEMETRY", "0")
            .env("HF_HUB_OFFLINE", "1")
            .env("HF_DATASETS_OFFLINE", "1")
            .env("WANDB_MODE", "disabled")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let out = client.wait_with_output();
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{module} failed:\n{text}");
    text
}

/// Every line of `metrics.jsonl` under `log_path`, each value finite.
fn finite_metrics(log_path: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(log_path.join("metrics.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    for line in &lines {
        for (k, v) in line.as_object().unwrap() {
            if let Some(x) = v.as_f64() {
                assert!(x.is_finite(), "{k} = {x} in {line}");
            }
        }
    }
    lines
}

/// `math_rl` with its default `loss_fn` (`stable_reinforce`): the recipe samples with
/// `record_stability_info`, attaches provenance to every datum and trains; three steps.
#[test]
fn math_rl_runs_with_its_default_loss() {
    let root = common::temp_dir("cookbook-math-rl");
    let server = serve_util::start(
        &common::tiny_model_dir(),
        &["--root", &root.join("server").display().to_string()],
    );
    let log = root.join("run");
    let args: Vec<String> = [
        format!("model_name={}", common::tiny_model_dir().display()),
        "renderer_name=qwen3_instruct".into(),
        "env=arithmetic".into(),
        "group_size=4".into(),
        "groups_per_batch=4".into(),
        "max_tokens=8".into(),
        "lora_rank=4".into(),
        "max_steps=3".into(),
        "eval_every=0".into(),
        "save_every=0".into(),
        format!("log_path={}", log.display()),
        "behavior_if_log_dir_exists=delete".into(),
    ]
    .into();
    let out = recipe(&server.url, "tinker_cookbook.recipes.math_rl.train", &args);
    assert!(out.contains("stable_reinforce"), "{out}");
    assert!(out.contains("Training completed successfully"), "{out}");
    // One line per training step (each with the optimizer's metrics), and a closing line.
    let metrics = finite_metrics(&log);
    let steps = metrics
        .iter()
        .filter(|m| m["optim/grad_norm"].as_f64().is_some())
        .count();
    assert_eq!(steps, 3, "{metrics:?}");
}
