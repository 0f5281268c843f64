//! `temper bench tinker`: the server overhead of the Tinker API. The same GRPO steps (SmolLM2,
//! 8 prompts x 8 samples of 1-digit additions, LoRA rank 16 on every linear and the unembedding,
//! one forward+backward over all 64 samples and one AdamW step per step) run through
//! `examples/tinker_rl_loop.py --keep-all` (the tinker SDK against a `temper serve` child) and
//! through temper's in-process trainer (shared-prefix updates off, as the Tinker path runs each
//! datum in full). The sides alternate `--rounds` times; warm-up steps are untimed; the overhead
//! is 1 - in-process / Tinker on the median step times. Not a test: see BENCHMARKS.md.
use super::bench::{load_average, median, ServeChild};
use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use std::process::Command;
use temper_train::config::load_config;
use temper_train::trainer::Trainer;

#[derive(clap::Args)]
pub struct Args {
    /// Timed steps per side and round.
    #[arg(long, default_value_t = 3)]
    pub steps: usize,
    /// Untimed steps first.
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    #[arg(long, default_value_t = 1)]
    pub rounds: usize,
    #[arg(long, default_value = "smollm2")]
    pub model: String,
    /// The Python with the tinker SDK (default: .venv/bin/python of the repository).
    #[arg(long)]
    pub python: Option<PathBuf>,
}

const PROMPTS: usize = 8;
const GROUP: usize = 8;
const MAX_TOKENS: usize = 16;
const RANK: usize = 16;
const LR: f64 = 4e-4;

/// Seconds per timed step through the SDK.
fn tinker_side(args: &Args, url: &str, python: &PathBuf) -> Result<Vec<f64>> {
    let total = args.steps + args.warmup;
    let out = temper_kernels::memory::without_temper_onednn_bounds(&mut Command::new(python))
        .arg("examples/tinker_rl_loop.py")
        .args([
            "--base-model",
            &args.model,
            "--steps",
            &total.to_string(),
            "--keep-all",
        ])
        .args([
            "--prompts",
            &PROMPTS.to_string(),
            "--group-size",
            &GROUP.to_string(),
        ])
        .args([
            "--max-tokens",
            &MAX_TOKENS.to_string(),
            "--rank",
            &RANK.to_string(),
        ])
        .args(["--lr", &LR.to_string()])
        .env("TINKER_BASE_URL", url)
        .env("TINKER_API_KEY", "tml-local")
        .env("TINKER_TELEMETRY", "0")
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .context("running examples/tinker_rl_loop.py")?;
    if !out.status.success() {
        bail!(
            "examples/tinker_rl_loop.py failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut steps = vec![];
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let v: serde_json::Value = serde_json::from_str(line).context("a step line")?;
        if v["step"].as_u64().unwrap_or(0) as usize > args.warmup {
            steps.push(v["s_step"].as_f64().unwrap_or(f64::NAN));
        }
    }
    Ok(steps)
}

/// Seconds per timed step in process, on the same work.
fn local_side(args: &Args, model_dir: &str, tmp: &std::path::Path, name: &str) -> Result<Vec<f64>> {
    let total = args.steps + args.warmup;
    let ov: Vec<String> = vec![
        format!("model.path={model_dir:?}"),
        "model.dtype=\"auto\"".into(),
        format!("model.lora_rank={RANK}"),
        format!("model.lora_alpha={RANK}"),
        "model.target_modules=[\"all-linear\", \"lm_head\"]".into(),
        "data.task=\"arith\"".into(),
        "data.task_args={ digits = 1, operands = 2, ops = \"+\", template = \"What is {expr}?\", answer_mode = \"last_number\" }".into(),
        format!("data.task_train_size={}", PROMPTS * total),
        "data.task_val_size=0".into(),
        "data.prompt_template=\"chat\"".into(),
        format!("data.max_response_length={MAX_TOKENS}"),
        format!("data.train_batch_size={PROMPTS}"),
        format!("actor.ppo_mini_batch_size={PROMPTS}"),
        format!("actor.ppo_micro_batch_size_per_gpu={}", PROMPTS * GROUP),
        "actor.shared_prefix=false".into(),
        format!("actor.optim.lr={LR}"),
        "actor.optim.weight_decay=0.0".into(),
        format!("rollout.n={GROUP}"),
        "reward.name=\"arith\"".into(),
        format!("trainer.total_training_steps={total}"),
        "trainer.test_freq=-1".into(),
        "trainer.rollout_log_freq=-1".into(),
        "trainer.check_on_policy=false".into(),
        "trainer.progress=false".into(),
        format!("trainer.default_local_dir={:?}", tmp.display().to_string()),
        format!("trainer.experiment_name={name:?}"),
    ];
    let cfg = load_config(None, &ov)?.config;
    let mut t = Trainer::create(cfg, "bench", &[])?;
    t.fit()?;
    Ok(t.run()
        .read_metrics()?
        .iter()
        .filter(|m| m.get("step").and_then(|s| s.as_u64()).unwrap_or(0) as usize > args.warmup)
        .map(|m| {
            m.get("timing_s/step")
                .and_then(|x| x.as_f64())
                .unwrap_or(f64::NAN)
        })
        .collect())
}

pub fn run(args: Args) -> Result<()> {
    let python = temper_base::python::python(args.python.as_deref());
    let model_dir = temper_model::resolve::resolve_model(&args.model)?;
    let model_dir = model_dir.display().to_string();
    let scratch = super::bench::ScratchDir::new("tinker")?;
    let tmp = scratch.0.clone();
    let server = ServeChild::start(&[
        "--model".into(),
        model_dir.clone(),
        "--dtype".into(),
        "auto".into(),
        "--root".into(),
        tmp.join("tinker").display().to_string(),
    ])?;
    let url = server.url.clone();
    println!("load average before: {}", load_average());
    let (mut tinker, mut local) = (vec![], vec![]);
    let result = (|| -> Result<()> {
        for round in 0..args.rounds {
            tinker.extend(tinker_side(&args, &url, &python)?);
            eprintln!(
                "round {round}: tinker side done (load average {})",
                load_average()
            );
            local.extend(local_side(
                &args,
                &model_dir,
                &tmp,
                &format!("local-{round}"),
            )?);
            eprintln!(
                "round {round}: in-process side done (load average {})",
                load_average()
            );
        }
        Ok(())
    })();
    drop(server);
    result?;
    let (t, l) = (median(&tinker), median(&local));
    println!("| side | median s/step | steps |");
    println!("| --- | ---: | --- |");
    println!("| tinker SDK -> temper serve | {t:.2} | {tinker:.2?} |");
    println!("| in-process trainer | {l:.2} | {local:.2?} |");
    println!(
        "server overhead: {:.1}% of the Tinker step (1 - in-process / Tinker); load average after: {}",
        100.0 * (1.0 - l / t),
        load_average()
    );
    Ok(())
}
