//! `temper check-logprobs --model M --prompt "What is 7 * 8?" --max-tokens 32 [-n 8]`: sample, then
//! recompute every sampled token's logprob with one teacher-forced forward over the same padded
//! (prompt + completion) rows, exactly as the trainer does (`CausalLm::token_logprobs`), and report
//! max and mean |sampler - trainer|. Prints `ok` and exits 0 within --tolerance, fails otherwise.
use anyhow::{bail, Result};
use temper_model::ComputeKind;
use temper_rollout::verify::{compare, trainer_logprobs};
use temper_rollout::{LogprobKind, Request};

use super::sample::{
    generate_with_progress, load, name_request, read_prompts, tokenize_prompts, PromptArgs,
    SamplingArgs,
};

/// Prompts of different lengths used when none is given, so the batch mixes prompt lengths.
const DEFAULT_PROMPTS: [&str; 3] = [
    "What is 7 * 8?",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. \
     How many clips did Natalia sell altogether in April and May?",
    "Hi",
];

#[derive(clap::Args)]
pub struct Args {
    /// A model folder, a hub id (ORG/NAME, from the local HF cache) or an alias (smollm2).
    #[arg(long)]
    pub model: String,
    #[command(flatten)]
    pub prompts: CheckPrompts,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Largest allowed |sampler - trainer| logprob difference (default 1e-4 in f32, 1e-1 in bf16).
    #[arg(long)]
    pub tolerance: Option<f64>,
}

#[derive(clap::Args)]
pub struct CheckPrompts {
    /// A prompt (repeat for several; default: three built-in prompts of different lengths).
    #[arg(long, conflicts_with = "dataset")]
    pub prompt: Vec<String>,
    /// A prompt as comma-separated token ids (repeat for several; for models without a tokenizer).
    #[arg(long, conflicts_with = "dataset")]
    pub prompt_ids: Vec<String>,
    /// A JSONL file with one prompt per line, in the field named by --field.
    #[arg(long)]
    pub dataset: Option<std::path::PathBuf>,
    #[arg(long, default_value = "question")]
    pub field: String,
    #[arg(long, default_value_t = 8)]
    pub limit: usize,
    /// Wrap each prompt in the model's chat template.
    #[arg(long)]
    pub chat: bool,
}

pub fn run(args: Args) -> Result<()> {
    let s = &args.sampling;
    s.validate()?;
    if s.logprobs != LogprobKind::Scaled {
        bail!(
            "--logprobs {:?}: check-logprobs compares the trainer's distribution, use scaled",
            s.logprobs
        );
    }
    let tolerance = args.tolerance.unwrap_or(match s.dtype {
        ComputeKind::F32 => 1e-4,
        ComputeKind::Bf16 => 1e-1,
    });
    let a = &args.prompts;
    let none_given = a.prompt.is_empty() && a.prompt_ids.is_empty() && a.dataset.is_none();
    let p = PromptArgs {
        prompt: if none_given {
            DEFAULT_PROMPTS.iter().map(|p| p.to_string()).collect()
        } else {
            a.prompt.clone()
        },
        prompt_ids: a.prompt_ids.clone(),
        dataset: a.dataset.clone(),
        field: a.field.clone(),
        limit: Some(a.limit),
        chat: a.chat,
    };
    let prompts = read_prompts(&p)?;
    let loaded = load(&args.model, s.dtype)?;
    let ids = tokenize_prompts(loaded.tokenizer.as_ref(), &prompts, p.chat)?;
    let requests: Vec<Request> = ids
        .into_iter()
        .enumerate()
        .map(|(i, prompt_ids)| Request {
            prompt_ids,
            params: s.params(i),
        })
        .collect();
    let engine = loaded.engine(s);
    let samples =
        generate_with_progress(&engine, &requests).map_err(|e| name_request(e, &prompts))?;
    // Greedy rows report logprobs at temperature 1 (see docs/rollout.md).
    let temperature = if s.temperature == 0.0 {
        1.0
    } else {
        s.temperature
    };
    let recomputed = trainer_logprobs(&loaded.model, &samples, temperature)?;
    let d = compare(&samples, &recomputed);
    let lens: Vec<usize> = requests.iter().map(|r| r.prompt_ids.len()).collect();
    println!(
        "{} samples ({} prompts of {:?} tokens, {}), {} completion tokens, temperature {temperature}",
        samples.len(),
        requests.len(),
        lens,
        s.dtype,
        d.tokens
    );
    println!("max |sampler - trainer| = {:.3e}", d.max_abs);
    println!("mean |sampler - trainer| = {:.3e}", d.mean_abs);
    println!(
        "bitwise equal: {}/{} ({:.1}%)",
        d.bitwise_equal,
        d.tokens,
        100.0 * d.bitwise_equal as f64 / d.tokens.max(1) as f64
    );
    // NaN fails too.
    if d.max_abs.is_nan() || d.max_abs > tolerance {
        bail!(
            "max |sampler - trainer| = {:.3e} exceeds the tolerance {tolerance:.1e}",
            d.max_abs
        );
    }
    println!("ok");
    Ok(())
}
