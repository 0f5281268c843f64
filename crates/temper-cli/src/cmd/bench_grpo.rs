//! `temper bench grpo`: wall time per GRPO step and peak memory, temper vs TRL's GRPOTrainer
//! (`tools/trl_grpo_bench.py`), on the same model (SmolLM2-135M-Instruct by default), prompts
//! (1-digit addition in the chat template), group size, completion length, temperature, loss
//! (token-mean / TRL "dapo", clip 0.2, no KL), learning rate, one optimizer step per GRPO step,
//! f32, on the CPU or one GPU (`--device`). The sides alternate (temper in this process, then TRL in a child process, `--rounds`
//! times) so that background load hits both; each run's warm-up steps are untimed, and the
//! result is the ratio of the median step times. Peak memory is each process's VmHWM. Not a
//! test: see BENCHMARKS.md.
use super::bench::median;
use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use std::process::Command;
use temper_model::DtypeRequest;
use temper_train::config::load_config;
use temper_train::trainer::Trainer;

#[derive(clap::Args)]
pub struct Args {
    /// Timed steps per side.
    #[arg(long, default_value_t = 3)]
    pub steps: usize,
    /// Untimed steps first.
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    /// How many times the two sides alternate.
    #[arg(long, default_value_t = 2)]
    pub rounds: usize,
    /// Prompts per step.
    #[arg(long, default_value_t = 8)]
    pub prompts: usize,
    /// Responses per prompt (group size).
    #[arg(long, default_value_t = 8)]
    pub n: usize,
    /// Completion length limit (tokens).
    #[arg(long, default_value_t = 12)]
    pub max_tokens: usize,
    /// Completions are at least this long on both sides (EOS masked until then: vLLM's
    /// `min_tokens`, transformers' `min_new_tokens`); `--min-tokens` = `--max-tokens` gives every
    /// completion the same length.
    #[arg(long, default_value_t = 0)]
    pub min_tokens: usize,
    /// Lengthens every prompt by about this many tokens: a filler paragraph in the system message
    /// (the long shape: `--prompt-filler 450 --max-tokens 512 --min-tokens 512`).
    #[arg(long, default_value_t = 0)]
    pub prompt_filler: usize,
    /// The reward: `arith` (the answer's correctness), `digits` (the fraction of digit
    /// characters in the completion, never equal over a group of long completions, so that every
    /// step updates on both sides) or `letters` (the fraction of ASCII letters: spread over the
    /// answers of a model with random weights, which hold no digits).
    #[arg(long, default_value = "arith")]
    pub reward: String,
    /// Responses per forward/backward on both sides (temper's `actor.ppo_micro_batch_size_per_gpu`,
    /// TRL's `per_device_train_batch_size` with gradient accumulation up to the step's
    /// responses); default: all of them in one.
    #[arg(long)]
    pub micro: Option<usize>,
    /// Activation checkpointing on both sides (temper's `actor.gradient_checkpointing`,
    /// TRL's `gradient_checkpointing`).
    #[arg(long)]
    pub gradient_checkpointing: bool,
    /// Model folder or name (`smollm2`).
    #[arg(long, default_value = "smollm2")]
    pub model: String,
    /// The compute dtype of both sides: `float32`, or `bfloat16` (temper's bf16 matmuls with f32
    /// master weights; TRL's `bf16=True`, autocast with f32 master weights).
    #[arg(long, default_value = "float32")]
    pub dtype: DtypeRequest,
    /// Where both sides train and sample: cpu, cuda or cuda:N (temper's `trainer.device`, TRL on
    /// that GPU). On CUDA the peak is each side's CUDA allocator peak, not its resident size.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Only time temper.
    #[arg(long)]
    pub no_python: bool,
    /// The Python with trl (default: .venv/bin/python of the repository).
    #[arg(long)]
    pub python: Option<PathBuf>,
}

const SYSTEM: &str = "You are a calculator. Reply with only the final number.";

/// The system message: [`SYSTEM`], then about `filler_tokens` tokens of filler text.
fn system_prompt(filler_tokens: usize) -> String {
    const FILLER: &str = " Numbers are written in base ten, with digits from zero to nine.";
    // About 13 tokens per sentence in SmolLM2's and Qwen's tokenizers.
    let sentences = filler_tokens.div_ceil(13);
    format!("{SYSTEM}{}", FILLER.repeat(sentences))
}

/// `--reward digits` and `--reward letters`: the fraction of the completion's characters
/// (Unicode scalar values, Python's `len(str)`) that are ASCII digits, or ASCII letters.
struct CharFraction {
    name: &'static str,
    counts: fn(&char) -> bool,
}

impl CharFraction {
    fn named(reward: &str) -> Option<CharFraction> {
        match reward {
            "digits" => Some(CharFraction {
                name: "digits",
                counts: char::is_ascii_digit,
            }),
            "letters" => Some(CharFraction {
                name: "letters",
                counts: char::is_ascii_alphabetic,
            }),
            _ => None,
        }
    }
}

impl temper_reward::Reward for CharFraction {
    fn name(&self) -> &str {
        self.name
    }
    fn score(
        &self,
        _prompt: &str,
        completion: &str,
        _ground_truth: &str,
        _metadata: &serde_json::Value,
    ) -> temper_reward::RewardOutput {
        let counted = completion.chars().filter(self.counts).count();
        temper_reward::RewardOutput::new(counted as f64 / completion.chars().count().max(1) as f64)
    }
}

/// Peak resident memory of this process in MiB (Linux VmHWM).
fn peak_rss_mb() -> f64 {
    temper_kernels::memory::peak_rss_bytes().map_or(f64::NAN, |b| b as f64 / (1 << 20) as f64)
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

/// Per-step seconds of one side over all rounds, and its phases.
#[derive(Default)]
struct Side {
    steps: Vec<f64>,
    gen: Vec<f64>,
    update: Vec<f64>,
    peak_mb: f64,
}

pub fn run(args: Args) -> Result<()> {
    if args.steps == 0 {
        bail!("--steps must be at least 1");
    }
    // Both sides must compute alike: `auto` could pick either on temper's side only.
    if args.dtype == DtypeRequest::Auto {
        bail!("--dtype auto: expected float32 or bfloat16 (both sides use it)");
    }
    let bf16 = args.dtype == DtypeRequest::Bfloat16;
    if args.reward != "arith" && CharFraction::named(&args.reward).is_none() {
        bail!(
            "--reward {:?}: expected arith, digits or letters",
            args.reward
        );
    }
    let system = system_prompt(args.prompt_filler);
    let responses = args.prompts * args.n;
    let micro = args.micro.unwrap_or(responses);
    if micro == 0 || !responses.is_multiple_of(micro) {
        bail!("--micro {micro} must divide the step's {responses} responses");
    }
    let device = temper_base::device::parse_device_for("--device", &args.device)?;
    let model_dir = temper_model::resolve::resolve_model(&args.model)?;
    let scratch = super::bench::ScratchDir::new("grpo")?;
    let tmp = scratch.0.clone();
    let total = args.steps + args.warmup;
    let overrides: Vec<String> = vec![
        format!("model.path={:?}", model_dir.display().to_string()),
        format!("model.dtype=\"{}\"", args.dtype),
        "data.task=arith".into(),
        "data.task_args={ digits = 1, template = \"What is {expr}?\", answer_mode = \"last_number\" }".into(),
        format!("data.task_train_size={}", args.prompts * total),
        "data.task_val_size=0".into(),
        "data.shuffle=false".into(),
        "data.prompt_template=chat".into(),
        format!("data.system_prompt={system:?}"),
        format!("data.max_prompt_length={}", 128 + 2 * args.prompt_filler),
        format!("data.max_response_length={}", args.max_tokens),
        format!("rollout.min_tokens={}", args.min_tokens),
        format!("data.train_batch_size={}", args.prompts),
        format!("actor.ppo_mini_batch_size={}", args.prompts),
        format!("actor.ppo_micro_batch_size_per_gpu={micro}"),
        format!("actor.gradient_checkpointing={}", args.gradient_checkpointing),
        "actor.optim.lr=1e-5".into(),
        "actor.optim.weight_decay=0.0".into(),
        "actor.loss_agg_mode=token-mean".into(),
        format!("rollout.n={}", args.n),
        "rollout.temperature=1.0".into(),
        "reward.name=arith".into(),
        format!("trainer.total_training_steps={total}"),
        "trainer.test_freq=-1".into(),
        "trainer.rollout_log_freq=-1".into(),
        "trainer.progress=false".into(),
        format!("trainer.default_local_dir={:?}", tmp.display().to_string()),
        "trainer.experiment_name=temper".into(),
        format!("trainer.device={:?}", args.device),
    ];
    let (python, script) =
        temper_train::pyworker::python_and_script(args.python.as_deref(), "trl_grpo_bench.py")?;
    let (mut ours, mut theirs) = (Side::default(), Side::default());
    let mut trl_version = String::new();
    for round in 0..args.rounds.max(1) {
        let mut ov = overrides.clone();
        ov.push(format!("trainer.experiment_name=\"temper-{round}\""));
        let cfg = load_config(None, &ov)?.config;
        if let tch::Device::Cuda(i) = device {
            temper_kernels::memory::reset_cuda_peak(i);
        }
        let mut t = Trainer::create(cfg, "bench", &[])?;
        if let Some(reward) = CharFraction::named(&args.reward) {
            t.set_reward(Box::new(reward));
        }
        eprintln!(
            "bench grpo: round {round}: temper, {total} steps ({} warm-up) ...",
            args.warmup
        );
        t.fit()?;
        let lines = t.run().read_metrics()?;
        let col = |k: &str| -> Vec<f64> {
            lines
                .iter()
                .filter_map(|l| l.get(k).and_then(|v| v.as_f64()))
                .skip(args.warmup)
                .collect()
        };
        ours.steps.extend(col("timing_s/step"));
        ours.gen.extend(col("timing_s/gen"));
        ours.update.extend(col("timing_s/update"));
        ours.peak_mb = match device {
            tch::Device::Cuda(i) => ours.peak_mb.max(
                temper_kernels::memory::cuda_peak_allocated_bytes(i).unwrap_or(0) as f64
                    / 1048576.0,
            ),
            _ => peak_rss_mb(),
        };
        eprintln!("  temper s/step: {:?}", col("timing_s/step"));
        // The same prompts, in order, as chat messages for TRL.
        let prompts: Vec<serde_json::Value> = t
            .train_data()
            .examples
            .iter()
            .map(|e| {
                serde_json::json!({
                    "prompt": [{"role": "system", "content": system}, {"role": "user", "content": e.prompt.text()}],
                    "answer": e.answer,
                })
            })
            .collect();
        drop(t);
        if args.no_python {
            continue;
        }
        let prompts_file = tmp.join("prompts.json");
        std::fs::write(&prompts_file, serde_json::to_string(&prompts)?)?;
        eprintln!(
            "bench grpo: round {round}: TRL GRPOTrainer, {total} steps ({} warm-up) ...",
            args.warmup
        );
        let out = temper_kernels::memory::without_temper_onednn_bounds(&mut Command::new(&python))
            .arg(&script)
            .args(["--model", &model_dir.display().to_string()])
            .args(["--prompts", &prompts_file.display().to_string()])
            .args([
                "--n",
                &args.n.to_string(),
                "--prompts-per-step",
                &args.prompts.to_string(),
            ])
            .args(["--max-tokens", &args.max_tokens.to_string()])
            .args(["--min-tokens", &args.min_tokens.to_string()])
            .args(["--reward", &args.reward])
            .args(["--micro", &micro.to_string()])
            .args(
                args.gradient_checkpointing
                    .then_some("--gradient-checkpointing"),
            )
            .args(bf16.then_some("--bf16"))
            .args(["--device", &args.device])
            .args([
                "--steps",
                &args.steps.to_string(),
                "--warmup",
                &args.warmup.to_string(),
            ])
            .args(["--out", &tmp.join("trl").display().to_string()])
            .output()
            .with_context(|| {
                format!(
                    "running {} (is trl installed? scripts/setup-env.sh)",
                    python.display()
                )
            })?;
        if !out.status.success() {
            bail!(
                "tools/trl_grpo_bench.py failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let stdout = String::from_utf8_lossy(&out.stdout);
        let last = stdout
            .lines()
            .rev()
            .find(|l| l.trim_start().starts_with('{'))
            .context("no JSON from trl_grpo_bench.py")?;
        let v: serde_json::Value = serde_json::from_str(last)?;
        let steps: Vec<f64> = serde_json::from_value(v["step_s"].clone())?;
        eprintln!("  TRL s/step: {steps:?}");
        theirs.steps.extend(steps);
        theirs.peak_mb = theirs
            .peak_mb
            .max(v["peak_rss_mb"].as_f64().unwrap_or(f64::NAN));
        trl_version = format!(
            "TRL {} (torch {})",
            v["trl"].as_str().unwrap_or("?"),
            v["torch"].as_str().unwrap_or("?")
        );
    }
    println!(
        "| side | s/step median | mean | min | max | gen s (median) | update s (median) | {} |",
        if device.is_cuda() {
            "peak CUDA allocated MiB"
        } else {
            "peak RSS MiB"
        }
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    let row = |name: &str, s: &Side| {
        let min = s.steps.iter().cloned().fold(f64::INFINITY, f64::min);
        let max = s.steps.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let opt = |v: &[f64]| {
            if v.is_empty() {
                "-".to_string()
            } else {
                format!("{:.1}", median(v))
            }
        };
        println!(
            "| {name} | {:.1} | {:.1} | {min:.1} | {max:.1} | {} | {} | {:.0} |",
            median(&s.steps),
            mean(&s.steps),
            opt(&s.gen),
            opt(&s.update),
            s.peak_mb
        );
    };
    row(&format!("temper ({})", args.dtype), &ours);
    if !args.no_python {
        let theirs_dtype = if bf16 { "bf16 autocast" } else { "f32" };
        row(&format!("{trl_version}, {theirs_dtype}"), &theirs);
        println!(
            "\ntemper is {:.2}x TRL's speed per step (median TRL s/step / median temper s/step; {} timed steps each)",
            median(&theirs.steps) / median(&ours.steps),
            ours.steps.len()
        );
    }
    Ok(())
}
