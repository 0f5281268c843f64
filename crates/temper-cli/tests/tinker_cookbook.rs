//! tinker-cookbook 0.6.1, the real package from PyPI (installed by scripts/setup-env.sh without
//! its unpublished `tml-renderers` dependency), runs unchanged against `temper serve`: the recipes
//! are started as a user starts them, with only the model, renderer and sizes changed, and must
//! finish with their own success message and finite metrics. The model and data sets they name
//! come from an offline Hugging Face cache (tools/cookbook_offline_cache.py): the tiny model under
//! a name the cookbook knows, GSM8K, and stand-ins with the fields of the other data sets.
//! docs/tinker.md has the table of every recipe; these are its CI-sized subset.
use temper_testkit as common;
mod serve_util;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use serve_util::{Client, Server};

/// The hub name the recipes are given: one the cookbook's model table knows (its renderer is
/// `qwen3_instruct`), linked to the tiny model in the offline cache.
const MODEL: &str = "Qwen/Qwen3-4B-Instruct-2507";

/// HF_HOME of the offline cache, made once per test process.
fn hf_home() -> &'static Path {
    static HOME: OnceLock<PathBuf> = OnceLock::new();
    HOME.get_or_init(|| {
        let home = common::temp_dir("cookbook-hf-home");
        let tool = temper_base::python::tool_script("cookbook_offline_cache.py").unwrap();
        common::output_ok(
            Command::new(common::python())
                .arg(tool)
                .arg(&home)
                .arg(common::tiny_model_dir())
                .args(["--name", MODEL]),
        );
        home
    })
}

/// `temper serve` of [`MODEL`], resolved through the offline cache as the recipes resolve it.
fn server(root: &Path) -> Server {
    serve_util::start_with_env(
        Path::new(MODEL),
        &["--root", &root.join("server").display().to_string()],
        &[("HF_HOME", hf_home())],
    )
}

/// Runs `python ARGS...` against the server at `url`, offline, and returns its combined output,
/// failing the test when it does not exit 0.
fn python(url: &str, args: &[String]) -> String {
    let client = Client::new(
        Command::new(common::python())
            .args(args)
            .env("TINKER_BASE_URL", url)
            .env("TINKER_API_KEY", "tml-local")
            .env("TINKER_TELEMETRY", "0")
            .env("HF_HOME", hf_home())
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
    assert!(out.status.success(), "{args:?} failed:\n{text}");
    text
}

/// `python -m module ARGS... log_path=LOG` against a fresh server; its output.
fn recipe(module: &str, args: &[&str], log: &Path) -> String {
    let root = log.parent().unwrap();
    let server = server(root);
    let mut argv: Vec<String> = vec!["-m".into(), module.into(), format!("model_name={MODEL}")];
    argv.extend(args.iter().map(|a| a.to_string()));
    argv.push(format!("log_path={}", log.display()));
    python(&server.url, &argv)
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

/// How many metric lines carry `key` (one per training step for a per-step metric).
fn lines_with(metrics: &[serde_json::Value], key: &str) -> usize {
    metrics.iter().filter(|m| m[key].as_f64().is_some()).count()
}

/// `math_rl` with its default `loss_fn` (`stable_reinforce`): the recipe samples with
/// `record_stability_info`, attaches provenance to every datum and trains; three steps.
#[test]
fn math_rl_runs_with_its_default_loss() {
    let log = common::temp_dir("cookbook-math-rl").join("run");
    let out = recipe(
        "tinker_cookbook.recipes.math_rl.train",
        &[
            "env=arithmetic",
            "group_size=4",
            "groups_per_batch=4",
            "max_tokens=8",
            "lora_rank=4",
            "max_steps=3",
            "eval_every=0",
            "save_every=0",
            "behavior_if_log_dir_exists=delete",
        ],
        &log,
    );
    assert!(out.contains("stable_reinforce"), "{out}");
    assert!(out.contains("Training completed successfully"), "{out}");
    // One line per training step (each with the optimizer's metrics), and a closing line.
    assert_eq!(lines_with(&finite_metrics(&log), "optim/grad_norm"), 3);
}

/// `sl_loop`, the cookbook's flat supervised loop, on its data set (`HuggingFaceH4/no_robots`'s
/// fields).
#[test]
fn sl_loop_runs() {
    let log = common::temp_dir("cookbook-sl-loop").join("run");
    let out = recipe(
        "tinker_cookbook.recipes.sl_loop",
        &[
            "batch_size=4",
            "max_length=256",
            "lora_rank=4",
            "max_steps=2",
            "save_every=0",
        ],
        &log,
    );
    assert!(out.contains("Training completed"), "{out}");
    assert_eq!(lines_with(&finite_metrics(&log), "train_mean_nll"), 2);
}

/// The DPO recipe (`preference.dpo.train`, `Anthropic/hh-rlhf`'s fields): its loss runs client-side
/// through `forward_backward_custom`, with a reference model's logprobs.
#[test]
fn dpo_runs() {
    let log = common::temp_dir("cookbook-dpo").join("run");
    let out = recipe(
        "tinker_cookbook.recipes.preference.dpo.train",
        &[
            "batch_size=4",
            "max_length=256",
            "max_steps=2",
            "behavior_if_log_dir_exists=delete",
        ],
        &log,
    );
    assert!(out.contains("DPO training completed successfully"), "{out}");
    assert_eq!(lines_with(&finite_metrics(&log), "dpo_loss"), 2);
}

/// Off-policy distillation (`distillation.train_off_policy`): the teacher's top-k prompt logprobs
/// become (N, K) soft targets for `cross_entropy`.
#[test]
fn off_policy_distillation_runs() {
    let log = common::temp_dir("cookbook-off-policy").join("run");
    let server = server(log.parent().unwrap());
    // The cookbook's own example conversations (.venv/site: the venv's site-packages).
    let conversations = temper_base::python::repo_root()
        .join(".venv/site/tinker_cookbook/example_data/conversations.jsonl");
    let script = temper_base::python::tool_script("cookbook_off_policy_distill.py").unwrap();
    let out = python(
        &server.url,
        &[
            script.display().to_string(),
            MODEL.into(),
            conversations.display().to_string(),
            log.display().to_string(),
        ],
    );
    assert!(
        out.contains("Off-policy distillation completed successfully"),
        "{out}"
    );
    assert_eq!(lines_with(&finite_metrics(&log), "train/loss:sum"), 2);
}

/// On-policy distillation (`distillation.on_policy_distillation`, `importance_sampling` with a
/// teacher's KL): its datums carry provenance from samplers that did not record, which a loss
/// other than `stable_reinforce` must accept.
#[test]
fn on_policy_distillation_runs() {
    let log = common::temp_dir("cookbook-on-policy").join("run");
    let out = recipe(
        "tinker_cookbook.recipes.distillation.on_policy_distillation",
        &[
            &format!("teacher_model={MODEL}"),
            "dataset=tulu3",
            "group_size=2",
            "groups_per_batch=2",
            "max_tokens=8",
            "lora_rank=4",
            "max_steps=2",
            "eval_every=0",
            "save_every=0",
            "behavior_if_log_dir_exists=delete",
        ],
        &log,
    );
    assert!(out.contains("Training completed successfully"), "{out}");
    assert!(lines_with(&finite_metrics(&log), "optim/grad_norm") >= 1);
}
