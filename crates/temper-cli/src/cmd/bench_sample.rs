//! `temper bench sample`: decode tokens/s of temper's rollout engine vs transformers `generate`
//! (`tools/bench_sample.py`, a worker process driven over stdin) on the same model, dtype and
//! sampling (temperature 1, top-p 1, top-k off, EOS banned so every row makes exactly
//! `--new-tokens`), at each batch size, in the same run. Runs alternate (temper, transformers,
//! temper, ...) so background load hits both; the ratios are the result. Not a test: see
//! BENCHMARKS.md.
//!
//! On CUDA a second transformers peer runs beside eager `generate`: a worker with
//! `--impl static-compile`, i.e. `generate` with a static cache and `torch.compile`
//! `reduce-overhead` (CUDA graphs), transformers' documented fast path. It is timed exactly like
//! the eager one (same prompts, rounds and median); the worker compiles and captures each shape in
//! an untimed warm-up before its first timed run. If it fails to start or errors, a one-line
//! notice says so and the bench goes on without it. temper also runs an untimed generate at each
//! batch size first (on CUDA it captures that bucket's decode step as a CUDA graph there).
//!
//! Each configuration is timed twice: with `--new-tokens` and with 1 new token (prefill + one
//! step), so decode tok/s = rows * (new_tokens - 1) / (t_full - t_one); end-to-end tok/s counts
//! every new token over the whole `generate` call. The decode rate is also read as bytes: every
//! matmul weight once a step and every attended key and value once a token
//! (`temper_model::DecodeWork`), beside the copy roof measured at the start.
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use temper_model::{CausalLm, ComputeKind, DecodeWork, Roof};
use temper_rollout::draw::request_seed;
use temper_rollout::{Engine, EngineConfig, Request, SamplingParams};

use temper_train::pyworker::{PyWorker, BENCH_REPLY_TIMEOUT};

#[derive(clap::Args)]
pub struct Args {
    /// A model folder, a hub id or an alias.
    #[arg(long, default_value = "smollm2")]
    pub model: String,
    /// Batch sizes (rows = prompts, one sample each), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,16")]
    pub batch: Vec<usize>,
    /// Prompt length in tokens.
    #[arg(long, default_value_t = 64)]
    pub prompt_len: usize,
    /// New tokens per row.
    #[arg(long, default_value_t = 128)]
    pub new_tokens: usize,
    /// How many times the runs alternate; the median is reported.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Compute dtype (both sides): f32 or bf16.
    #[arg(long, default_value = "f32")]
    pub dtype: ComputeKind,
    /// Intra-op threads on both sides (default: libtorch's default, one per core).
    #[arg(long)]
    pub threads: Option<i32>,
    /// Where both sides run: cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Only time temper.
    #[arg(long)]
    pub no_python: bool,
    /// The Python with torch + transformers (default: .venv/bin/python of the repository).
    #[arg(long)]
    pub python: Option<PathBuf>,
}

/// Deterministic prompt ids (the same on both sides), spread over the vocabulary.
fn prompts(rows: usize, len: usize, vocab: i64) -> Vec<Vec<i64>> {
    (0..rows)
        .map(|r| {
            (0..len)
                .map(|j| 100 + ((r as i64 * 7919 + j as i64 * 104_729) % (vocab - 100)))
                .collect()
        })
        .collect()
}

/// Which transformers path a worker times (`--impl` of `tools/bench_sample.py`).
#[derive(Clone, Copy)]
enum HfImpl {
    /// Eager `generate` with its default dynamic cache.
    Eager,
    /// `generate` with a static cache and `torch.compile(mode="reduce-overhead")` (CUDA only).
    StaticCompile,
}

impl HfImpl {
    /// The worker's `--impl` value.
    fn flag(self) -> &'static str {
        match self {
            HfImpl::Eager => "generate",
            HfImpl::StaticCompile => "static-compile",
        }
    }

    /// Its name in the output.
    fn label(self) -> &'static str {
        match self {
            HfImpl::Eager => "transformers generate (eager)",
            HfImpl::StaticCompile => "transformers static cache + torch.compile reduce-overhead",
        }
    }

    /// The label of temper's ratio to it.
    fn ratio_label(self) -> &'static str {
        match self {
            HfImpl::Eager => "ratio vs eager",
            HfImpl::StaticCompile => "ratio vs static + compile",
        }
    }
}

/// transformers `generate` in `tools/bench_sample.py`.
struct HfWorker(PyWorker);

impl HfWorker {
    fn start(args: &Args, dir: &std::path::Path, imp: HfImpl) -> Result<Self> {
        let worker_args = [
            "--model".to_string(),
            dir.display().to_string(),
            "--dtype".to_string(),
            args.dtype.to_string(),
            "--threads".to_string(),
            args.threads.unwrap_or(0).to_string(),
            "--device".to_string(),
            args.device.clone(),
            "--impl".to_string(),
            imp.flag().to_string(),
        ];
        let (worker, ready) = PyWorker::start(
            args.python.as_deref(),
            "bench_sample.py",
            &worker_args,
            BENCH_REPLY_TIMEOUT,
        )
        .with_context(|| format!("starting the {} worker", imp.label()))?;
        eprintln!("transformers worker ({}): {ready}", imp.flag());
        Ok(HfWorker(worker))
    }

    /// Seconds for one `generate`.
    fn generate(&mut self, prompts: &[Vec<i64>], new_tokens: usize) -> Result<f64> {
        let req = serde_json::json!({"prompts": prompts, "max_new_tokens": new_tokens});
        let out = self.0.request(&req.to_string())?;
        let want = prompts.len() * new_tokens;
        if out["new_tokens"].as_u64() != Some(want as u64) {
            bail!(
                "transformers made {} new tokens, expected {want}",
                out["new_tokens"]
            );
        }
        out["seconds"]
            .as_f64()
            .context("worker reply without seconds")
    }
}

/// One transformers side of the table: its worker and the current batch size's timings.
struct Peer {
    imp: HfImpl,
    /// `None` once an optional peer has failed.
    worker: Option<HfWorker>,
    /// Whether a failure only drops this peer (with a notice) instead of failing the bench.
    optional: bool,
    full: Vec<f64>,
    one: Vec<f64>,
}

impl Peer {
    fn new(imp: HfImpl, worker: Option<HfWorker>, optional: bool) -> Self {
        Peer {
            imp,
            worker,
            optional,
            full: vec![],
            one: vec![],
        }
    }

    /// Start an optional peer; a failure is a one-line notice and no worker.
    fn start_optional(args: &Args, dir: &std::path::Path, imp: HfImpl) -> Self {
        let worker = HfWorker::start(args, dir, imp)
            .map_err(|e| notice(imp, &e))
            .ok();
        Peer::new(imp, worker, true)
    }

    /// Seconds for one `generate`, or `None` when this peer is gone. A required peer's error is
    /// returned; an optional one's is a notice, and the peer is dropped.
    fn generate(&mut self, prompts: &[Vec<i64>], new_tokens: usize) -> Result<Option<f64>> {
        let Some(worker) = self.worker.as_mut() else {
            return Ok(None);
        };
        match worker.generate(prompts, new_tokens) {
            Ok(seconds) => Ok(Some(seconds)),
            Err(e) if self.optional => {
                notice(self.imp, &e);
                self.worker = None;
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }
}

/// Say on one line that an optional peer failed and the bench goes on without it.
fn notice(imp: HfImpl, e: &anyhow::Error) {
    let why = format!("{e:#}").replace('\n', " ");
    eprintln!("notice: skipping {} ({why})", imp.label());
}

/// Seconds for one temper `generate`.
fn temper_generate(model: &CausalLm, prompts: &[Vec<i64>], new_tokens: usize) -> Result<f64> {
    let requests: Vec<Request> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| Request {
            prompt_ids: p.clone(),
            params: SamplingParams {
                max_tokens: new_tokens,
                min_tokens: new_tokens,
                seed: Some(request_seed(0, i)),
                ..SamplingParams::default()
            },
        })
        .collect();
    let config = EngineConfig {
        max_batch_rows: prompts.len().max(1),
        ..EngineConfig::default()
    };
    let engine = Engine::new(model, model.config().eos_token_ids.clone()).with_config(config);
    let start = Instant::now();
    let samples = engine.generate(&requests, &mut |_| {})?;
    let seconds = start.elapsed().as_secs_f64();
    let made: usize = samples.iter().map(|s| s.completion_ids.len()).sum();
    if made != prompts.len() * new_tokens {
        bail!(
            "temper made {made} new tokens, expected {}",
            prompts.len() * new_tokens
        );
    }
    Ok(seconds)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

pub fn run(args: Args) -> Result<()> {
    if args.new_tokens < 2 || args.rounds == 0 || args.batch.is_empty() {
        bail!("need --new-tokens >= 2, --rounds >= 1 and at least one --batch");
    }
    if let Some(t) = args.threads {
        tch::set_num_threads(t);
    }
    let device = temper_base::device::parse_device_for("--device", &args.device)?;
    let dir = temper_model::resolve::resolve_model(&args.model)?;
    let model = CausalLm::load(&dir, device, args.dtype)?;
    let vocab = model.config().vocab_size;
    let mut peers = vec![];
    if !args.no_python {
        let eager = HfWorker::start(&args, &dir, HfImpl::Eager)?;
        peers.push(Peer::new(HfImpl::Eager, Some(eager), false));
        if matches!(device, tch::Device::Cuda(_)) {
            peers.push(Peer::start_optional(&args, &dir, HfImpl::StaticCompile));
        }
    }
    eprintln!("libtorch threads: {}", tch::get_num_threads());
    let roof = Roof::measure(args.dtype, device);
    // Warm-up (allocator, oneDNN kernels) on every side.
    let warm = prompts(2, args.prompt_len, vocab);
    temper_generate(&model, &warm, 4)?;
    // The compiled peer warms each shape itself (a shape of its own here would cost a compile).
    for peer in peers.iter_mut().filter(|p| matches!(p.imp, HfImpl::Eager)) {
        peer.generate(&warm, 4)?;
    }
    println!(
        "model {} ({}, {}), prompts {} tokens, {} new tokens, sampling T=1, {} rounds (median)",
        args.model, args.dtype, args.device, args.prompt_len, args.new_tokens, args.rounds
    );
    println!("kernels: {}", model.kernel_report());
    println!("roof: {}", roof.describe(args.dtype));
    for peer in peers.iter().filter(|p| p.worker.is_some()) {
        println!("peer: {}", peer.imp.label());
    }
    println!("| batch | side | end-to-end tok/s | decode tok/s | decode GB/s (of copy roof) |");
    println!("| ---: | --- | ---: | ---: | ---: |");
    for &b in &args.batch {
        let ps = prompts(b, args.prompt_len, vocab);
        // Untimed, as the compiled peer's warm-up: on CUDA this captures the batch's decode step.
        temper_generate(&model, &ps, 3)?;
        let (mut ours_full, mut ours_one) = (vec![], vec![]);
        for peer in peers.iter_mut() {
            peer.full.clear();
            peer.one.clear();
        }
        for _ in 0..args.rounds {
            ours_full.push(temper_generate(&model, &ps, args.new_tokens)?);
            ours_one.push(temper_generate(&model, &ps, 1)?);
            for peer in peers.iter_mut() {
                if let Some(s) = peer.generate(&ps, args.new_tokens)? {
                    peer.full.push(s);
                }
                if let Some(s) = peer.generate(&ps, 1)? {
                    peer.one.push(s);
                }
            }
        }
        // The decode steps after the first token: step j attends to the prompt and j tokens.
        let steps = (args.new_tokens - 1) as u64;
        let decode_work = |seconds: f64| DecodeWork {
            steps,
            tokens: b as u64 * steps,
            attended: b as u64 * (1..=steps).map(|j| args.prompt_len as u64 + j).sum::<u64>(),
            seconds,
        };
        let rates = |full: &mut Vec<f64>, one: &mut Vec<f64>| {
            let (f, o) = (median(full), median(one));
            let e2e = (b * args.new_tokens) as f64 / f;
            let decode = (b * (args.new_tokens - 1)) as f64 / (f - o).max(1e-9);
            let [_, (_, gb_per_s), (_, of_roof)] =
                decode_work(f - o).metrics(model.config(), args.dtype, &roof);
            let bandwidth = format!("{gb_per_s:.1} ({:.0}%)", 100.0 * of_roof);
            (e2e, decode, bandwidth)
        };
        let (oe, od, ob) = rates(&mut ours_full, &mut ours_one);
        println!("| {b} | temper | {oe:.1} | {od:.1} | {ob} |");
        // A peer that failed during this batch size has no row for it.
        for peer in peers.iter_mut().filter(|p| p.worker.is_some()) {
            let (he, hd, hb) = rates(&mut peer.full, &mut peer.one);
            println!("| {b} | {} | {he:.1} | {hd:.1} | {hb} |", peer.imp.label());
            println!(
                "| {b} | {} | {:.2}x | {:.2}x | |",
                peer.imp.ratio_label(),
                oe / he,
                od / hd
            );
        }
    }
    Ok(())
}
