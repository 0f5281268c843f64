//! `temper sample --model M (--prompt P | --prompt-ids 1,2,3 | --dataset FILE.jsonl --field question) [--chat] -n 4
//! --max-tokens 64 --temperature 1.0 --top-p 1 --top-k -1 --seed 0 [--json]`: sample completions
//! with temper's rollout engine and print them (text, or one JSON object per sample).
use std::io::{BufRead, Write};
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use tch::Device;
use temper_model::{ComputeKind, Policy, Tokenizer};
use temper_rollout::draw::request_seed;
use temper_rollout::{
    Engine, EngineConfig, LogprobKind, Progress, Request, Sample, SamplingParams,
};

#[derive(clap::Args)]
pub struct Args {
    /// A model folder, a hub id (ORG/NAME, from the local HF cache) or an alias (smollm2).
    #[arg(long)]
    pub model: String,
    #[command(flatten)]
    pub prompts: PromptArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Print one JSON object per sample (ids, logprobs, text, finish reason).
    #[arg(long)]
    pub json: bool,
    /// Where to sample: cpu, cuda or cuda:N (on CUDA decode steps replay as CUDA graphs;
    /// `TEMPER_CUDA_GRAPHS=0` runs them eagerly).
    #[arg(long, default_value = "cpu")]
    pub device: String,
}

/// Where prompts come from.
#[derive(clap::Args)]
pub struct PromptArgs {
    /// A prompt (repeat the flag for several).
    #[arg(long, conflicts_with = "dataset")]
    pub prompt: Vec<String>,
    /// A prompt as comma-separated token ids, used as given (repeat for several; works for models
    /// without a tokenizer).
    #[arg(long, conflicts_with = "dataset")]
    pub prompt_ids: Vec<String>,
    /// A JSONL file with one prompt per line, in the field named by --field.
    #[arg(long)]
    pub dataset: Option<PathBuf>,
    /// The JSONL field holding the prompt text.
    #[arg(long, default_value = "question")]
    pub field: String,
    /// Use only the first N records of --dataset.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Wrap each prompt as one user message in the model's chat template (with the generation prompt).
    #[arg(long)]
    pub chat: bool,
}

/// Sampling settings (vLLM names) and engine shape.
#[derive(clap::Args)]
pub struct SamplingArgs {
    /// Samples per prompt (they share one prefill).
    #[arg(short = 'n', long = "n", default_value_t = 1)]
    pub n: usize,
    #[arg(long, default_value_t = 64)]
    pub max_tokens: usize,
    #[arg(long, default_value_t = 0)]
    pub min_tokens: usize,
    /// 0 = greedy.
    #[arg(long, default_value_t = 1.0)]
    pub temperature: f64,
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f64,
    /// -1 = off.
    #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
    pub top_k: i64,
    #[arg(long, default_value_t = 1.0)]
    pub repetition_penalty: f64,
    /// A stop string (repeat for several); the completion keeps the tokens that produced it.
    #[arg(long)]
    pub stop: Vec<String>,
    /// Extra stop token ids, comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub stop_token_ids: Vec<i64>,
    /// Keep generating through the model's EOS ids.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Run seed; request i gets its own seed derived from (seed, i).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Which distribution the reported logprobs come from: scaled (log softmax(logits / T), the
    /// trainer's), raw (T = 1) or processed (what the token was drawn from).
    #[arg(long, default_value = "scaled", value_parser = parse_logprob_kind)]
    pub logprobs: LogprobKind,
    /// Most rows decoded together.
    #[arg(long, default_value_t = 64)]
    pub batch_rows: usize,
    /// With rows still decoding, refill freed slots from the queue only once at least this many
    /// are free (default: a quarter of --batch-rows).
    #[arg(long)]
    pub refill_min_free: Option<usize>,
    /// Compute dtype: f32 or bf16.
    #[arg(long, default_value = "f32")]
    pub dtype: ComputeKind,
}

fn parse_logprob_kind(s: &str) -> Result<LogprobKind, String> {
    serde_json::from_value(serde_json::Value::String(s.to_string()))
        .map_err(|_| format!("unknown logprobs kind `{s}` (scaled, raw or processed)"))
}

impl SamplingArgs {
    /// Check the settings before loading anything (stop token ids are checked against the
    /// vocabulary later, by the engine).
    pub fn validate(&self) -> Result<()> {
        self.params(0)
            .validate(None)
            .context("invalid sampling settings")
    }

    pub fn params(&self, request_index: usize) -> SamplingParams {
        SamplingParams {
            n: self.n,
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            min_tokens: self.min_tokens,
            max_tokens: self.max_tokens,
            repetition_penalty: self.repetition_penalty,
            stop: self.stop.clone(),
            stop_token_ids: self.stop_token_ids.clone(),
            ignore_eos: self.ignore_eos,
            seed: Some(request_seed(self.seed, request_index)),
            logprobs: self.logprobs,
        }
    }
}

/// A policy (model, tokenizer, EOS ids) from a model spec, onto `device`.
pub fn load_on(spec: &str, dtype: ComputeKind, device: Device) -> Result<Policy> {
    let dir = temper_model::resolve::resolve_model(spec)?;
    Policy::load(&dir, device, dtype)
}

/// An engine over `policy`'s model, decoding stop strings with its tokenizer when it has one.
pub fn engine<'a>(policy: &'a Policy, s: &SamplingArgs) -> Engine<'a> {
    let config = EngineConfig {
        max_batch_rows: s.batch_rows,
        refill_min_free: s.refill_min_free,
        seed: s.seed,
        ..Default::default()
    };
    let engine = Engine::new(&policy.model, policy.eos_ids.clone()).with_config(config);
    match &policy.tokenizer {
        Some(t) => engine.with_decoder(t),
        None => engine,
    }
}

/// One prompt and where it came from (for error messages).
pub struct Prompt {
    pub origin: String,
    pub text: Option<String>,
    pub ids: Option<Vec<i64>>,
}

/// Prompts from --prompt / --prompt-ids or --dataset.
pub fn read_prompts(args: &PromptArgs) -> Result<Vec<Prompt>> {
    let Some(path) = &args.dataset else {
        let mut out: Vec<Prompt> = args
            .prompt
            .iter()
            .enumerate()
            .map(|(i, p)| Prompt {
                origin: format!("--prompt #{}", i + 1),
                text: Some(p.clone()),
                ids: None,
            })
            .collect();
        for (i, list) in args.prompt_ids.iter().enumerate() {
            let origin = format!("--prompt-ids #{}", i + 1);
            let ids = list
                .split(',')
                .filter(|t| !t.trim().is_empty())
                .map(|t| {
                    t.trim()
                        .parse::<i64>()
                        .with_context(|| format!("{origin}: `{t}` is not a token id"))
                })
                .collect::<Result<Vec<i64>>>()?;
            out.push(Prompt {
                origin,
                text: None,
                ids: Some(ids),
            });
        }
        if out.is_empty() {
            bail!("give --prompt, --prompt-ids or --dataset");
        }
        return Ok(out);
    };
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        if args.limit.is_some_and(|l| out.len() >= l) {
            break;
        }
        let origin = format!("{} line {}", path.display(), i + 1);
        let line = line.with_context(|| format!("reading {origin}"))?;
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value =
            serde_json::from_str(&line).with_context(|| format!("{origin}: not valid JSON"))?;
        let text = match v.get(&args.field) {
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(other) => bail!("{origin}: field `{}` is not a string ({other})", args.field),
            None => bail!("{origin}: no field `{}`", args.field),
        };
        out.push(Prompt {
            origin,
            text: Some(text),
            ids: None,
        });
    }
    if out.is_empty() {
        bail!("{}: no prompts", path.display());
    }
    Ok(out)
}

/// Token ids of each prompt (chat template applied with --chat). Empty prompts are an error.
pub fn tokenize_prompts(
    tok: Option<&Tokenizer>,
    prompts: &[Prompt],
    chat: bool,
) -> Result<Vec<Vec<i64>>> {
    prompts
        .iter()
        .map(|p| {
            let ids = match (&p.ids, &p.text) {
                (Some(ids), _) => ids.clone(),
                (None, Some(text)) => {
                    if text.is_empty() {
                        bail!("{}: the prompt is empty", p.origin);
                    }
                    let tok = tok.with_context(|| {
                        format!(
                            "{}: the model folder has no tokenizer.json (give --prompt-ids)",
                            p.origin
                        )
                    })?;
                    tok.encode_prompt(text, chat)?
                }
                (None, None) => unreachable!("a prompt has text or ids"),
            };
            if ids.is_empty() {
                bail!("{}: the prompt is empty (no tokens)", p.origin);
            }
            Ok(ids)
        })
        .collect()
}

/// Run the engine with a progress bar (drawn only on a terminal).
pub fn generate_with_progress(engine: &Engine, requests: &[Request]) -> Result<Vec<Sample>> {
    let total: usize = requests.iter().map(|r| r.params.n).sum();
    let bar = indicatif::ProgressBar::new(total as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{elapsed_precise} [{bar:30}] {pos}/{len} samples {msg}",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    let start = std::time::Instant::now();
    let result = engine.generate(requests, &mut |p: Progress| {
        bar.set_position(p.finished_samples as u64);
        let rate = p.generated_tokens as f64 / start.elapsed().as_secs_f64().max(1e-9);
        bar.set_message(format!("{} tokens, {rate:.0} tok/s", p.generated_tokens));
    });
    bar.finish_and_clear();
    result
}

pub fn run(args: Args) -> Result<()> {
    args.sampling.validate()?;
    let prompts = read_prompts(&args.prompts)?;
    let device = temper_base::device::parse_device_for("--device", &args.device)?;
    let loaded = load_on(&args.model, args.sampling.dtype, device)?;
    let ids = tokenize_prompts(loaded.tokenizer.as_ref(), &prompts, args.prompts.chat)?;
    let requests: Vec<Request> = ids
        .into_iter()
        .enumerate()
        .map(|(i, prompt_ids)| Request {
            prompt_ids,
            params: args.sampling.params(i),
        })
        .collect();
    let engine = engine(&loaded, &args.sampling);
    let samples =
        generate_with_progress(&engine, &requests).map_err(|e| name_request(e, &prompts))?;
    print_samples(&samples, loaded.tokenizer.as_ref(), &prompts, args.json)
}

/// Engine errors say "request i: ..."; add where that prompt came from.
pub fn name_request(e: anyhow::Error, prompts: &[Prompt]) -> anyhow::Error {
    let msg = format!("{e:#}");
    let origin = msg
        .strip_prefix("request ")
        .and_then(|rest| rest.split(':').next())
        .and_then(|i| i.parse::<usize>().ok())
        .and_then(|i| prompts.get(i));
    match origin {
        Some(p) => e.context(p.origin.clone()),
        None => e,
    }
}

fn print_samples(
    samples: &[Sample],
    tok: Option<&Tokenizer>,
    prompts: &[Prompt],
    json: bool,
) -> Result<()> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    for s in samples {
        let text = match tok {
            Some(t) => Some(t.decode(&s.completion_ids, false)?),
            None => None,
        };
        if json {
            let line = serde_json::json!({
                "request_index": s.request_index,
                "sample_index": s.sample_index,
                "prompt": prompts[s.request_index].text,
                "completion": text,
                "prompt_ids": s.prompt_ids,
                "completion_ids": s.completion_ids,
                "completion_logprobs": s.completion_logprobs,
                "finish": s.finish,
                "stop_reason": s.stop_reason,
            });
            writeln!(out, "{line}")?;
        } else {
            let lp: f64 = s.completion_logprobs.iter().map(|&x| x as f64).sum();
            writeln!(
                out,
                "=== prompt {} sample {} ({:?}, {} tokens, sum logprob {lp:.3})",
                s.request_index,
                s.sample_index,
                s.finish,
                s.completion_ids.len()
            )?;
            match text {
                Some(t) => writeln!(out, "{t}")?,
                None => writeln!(out, "{:?}", s.completion_ids)?,
            }
        }
    }
    Ok(())
}
