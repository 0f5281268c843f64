//! `temper bench train`: forward + backward + AdamW tok/s of a random Qwen2-shaped model (25M-class:
//! hidden 384, 6 layers, 6 heads / 2 KV heads, intermediate 1024, vocab 32000, tied head), batch
//! 8 x 256, in f32 and in bf16 (f32 master weights, bf16 matmuls), side by side with the same model
//! in PyTorch/transformers (`tools/bench_train.py`, a worker process driven over stdin). Runs
//! alternate (temper f32, PyTorch f32, temper bf16, ...) so that background load hits both sides;
//! the ratios are the result. Not a test: see BENCHMARKS.md.
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use tch::{Device, Kind, Tensor};
use temper_algo::optim::AdamW;
use temper_model::{logprobs_of, CausalLm, ComputeKind, ModelConfig};

use temper_train::pyworker::{PyWorker, BENCH_REPLY_TIMEOUT};

#[derive(clap::Args)]
pub struct Args {
    /// Timed steps per run.
    #[arg(long, default_value_t = 3)]
    pub steps: usize,
    /// Untimed steps before the first run of each configuration.
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    /// How many times the runs alternate.
    #[arg(long, default_value_t = 2)]
    pub rounds: usize,
    #[arg(long, default_value_t = 8)]
    pub batch: i64,
    #[arg(long, default_value_t = 256)]
    pub seq: i64,
    #[arg(long, default_value_t = 32000)]
    pub vocab: i64,
    #[arg(long, default_value_t = 384)]
    pub hidden: i64,
    #[arg(long, default_value_t = 6)]
    pub layers: i64,
    #[arg(long, default_value_t = 6)]
    pub heads: i64,
    #[arg(long, default_value_t = 2)]
    pub kv_heads: i64,
    #[arg(long, default_value_t = 1024)]
    pub intermediate: i64,
    /// Also time PyTorch with autocast to bf16 (the bf16 rows are then compared with it).
    #[arg(long)]
    pub torch_bf16: bool,
    /// Also time PyTorch with `torch.compile` (f32, and bf16 with --torch-bf16).
    #[arg(long)]
    pub torch_compile: bool,
    /// Intra-op threads for both sides (0: each library's default, all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: i32,
    /// Only time temper.
    #[arg(long)]
    pub no_python: bool,
    /// Where both sides train: cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Rank processes training together on this machine (CPU, Gloo), each a share of the
    /// batch, against PyTorch FSDP2 over as many processes (`bench_train_sharded`).
    #[arg(long, default_value_t = 1)]
    pub nproc: usize,
    /// With --nproc: the trainer's `actor.strategy` (fsdp or dp).
    #[arg(long, default_value = "fsdp")]
    pub strategy: String,
    /// The Python with torch + transformers (default: .venv/bin/python of the repository).
    #[arg(long)]
    pub python: Option<PathBuf>,
}

impl Args {
    /// The benchmark's model: Qwen2-shaped, of the sizes given, tied head.
    pub fn model_config(&self) -> ModelConfig {
        ModelConfig::qwen2_like(
            self.vocab,
            self.hidden,
            self.intermediate,
            self.layers,
            self.heads,
            self.kv_heads,
            true,
        )
    }

    /// The batch and model sizes as the Python sides' flags (`tools/bench_train*.py`).
    pub fn shape_flags(&self) -> Vec<(&'static str, i64)> {
        vec![
            ("--batch", self.batch),
            ("--seq", self.seq),
            ("--vocab", self.vocab),
            ("--hidden", self.hidden),
            ("--layers", self.layers),
            ("--heads", self.heads),
            ("--kv-heads", self.kv_heads),
            ("--intermediate", self.intermediate),
        ]
    }
}

/// transformers + torch.optim in `tools/bench_train.py`.
struct TorchWorker(PyWorker);

impl TorchWorker {
    fn start(args: &Args) -> Result<(Self, serde_json::Value)> {
        let mut flags = args.shape_flags();
        flags.push(("--threads", i64::from(args.threads)));
        let mut worker_args: Vec<String> = flags
            .iter()
            .flat_map(|(flag, v)| [flag.to_string(), v.to_string()])
            .collect();
        worker_args.extend(["--device".to_string(), args.device.clone()]);
        if args.torch_compile {
            worker_args.push("--compile".to_string());
        }
        let (worker, ready) = PyWorker::start(
            args.python.as_deref(),
            "bench_train.py",
            &worker_args,
            BENCH_REPLY_TIMEOUT,
        )?;
        Ok((TorchWorker(worker), ready))
    }

    /// Wall and CPU seconds for `steps` steps (and the CUDA allocator's peak on a GPU).
    fn run(&mut self, mode: &str, steps: usize) -> Result<Timing> {
        let v = self.0.request(&format!("run {mode} {steps}"))?;
        Ok(Timing {
            wall: v["secs"].as_f64().context("worker reply without secs")?,
            cpu: v["cpu_secs"]
                .as_f64()
                .context("worker reply without cpu_secs")?,
            peak_bytes: v["peak_bytes"].as_u64(),
        })
    }
}

/// Wall-clock and process CPU seconds of a run. On a loaded machine wall time mostly measures the
/// load; CPU time is steadier (though OpenMP spin-waiting inflates it under contention).
#[derive(Clone, Copy, Default)]
struct Timing {
    wall: f64,
    cpu: f64,
    /// The CUDA allocator's peak during the run (on a GPU).
    peak_bytes: Option<u64>,
}

/// User + system CPU time of this process (all threads), from /proc/self/stat.
fn process_cpu_secs() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0 // USER_HZ is 100 on Linux
}

/// The temper side: model, optimizer and one fixed random batch.
struct RustSide {
    model: CausalLm,
    params: Vec<(String, Tensor)>,
    opt: AdamW,
    input: Tensor,
    pos: Tensor,
    mask: Tensor,
    targets: Tensor,
}

impl RustSide {
    fn new(args: &Args) -> Self {
        let cfg = args.model_config();
        let device = device_of(&args.device).expect("checked in run");
        let model = CausalLm::random(cfg, 0, device, ComputeKind::F32);
        let params = model.named_parameters();
        let opt = AdamW::new(&params, 1e-5, (0.9, 0.999), 1e-8, 0.01).with_fused(true);
        let (b, t) = (args.batch, args.seq);
        let input = Tensor::randint(args.vocab, [b, t], (Kind::Int64, device));
        let pos = Tensor::arange(t, (Kind::Int64, device))
            .unsqueeze(0)
            .repeat([b, 1]);
        let mask = input.ones_like();
        let targets = input.narrow(1, 1, t - 1);
        RustSide {
            model,
            params,
            opt,
            input,
            pos,
            mask,
            targets,
        }
    }

    /// Wall and CPU seconds for `steps` steps in `compute`.
    fn run(&mut self, compute: ComputeKind, steps: usize) -> Result<Timing> {
        self.model.set_compute(compute);
        let t = self.input.size()[1];
        let cuda = match self.input.device() {
            Device::Cuda(i) => Some(i),
            _ => None,
        };
        if let Some(i) = cuda {
            tch::Cuda::synchronize(i as i64);
            temper_kernels::memory::reset_cuda_peak(i);
        }
        let (start, cpu0) = (Instant::now(), process_cpu_secs());
        for _ in 0..steps {
            let logits = self.model.forward(&self.input, &self.pos, &self.mask, None);
            let logp = logprobs_of(&logits.narrow(1, 0, t - 1), &self.targets, 1.0);
            let loss = -logp.mean(Kind::Float);
            loss.backward();
            self.opt.step(&self.params)?;
            for (_, p) in &self.params {
                let mut p = p.shallow_clone();
                p.zero_grad();
            }
        }
        if let Some(i) = cuda {
            tch::Cuda::synchronize(i as i64);
        }
        Ok(Timing {
            wall: start.elapsed().as_secs_f64(),
            cpu: process_cpu_secs() - cpu0,
            peak_bytes: cuda.and_then(temper_kernels::memory::cuda_peak_allocated_bytes),
        })
    }
}

pub fn run(args: Args) -> Result<()> {
    if args.steps == 0 || args.rounds == 0 || args.seq < 2 {
        bail!("--steps and --rounds must be positive and --seq at least 2");
    }
    // A rank the sharded bench started (the launcher drops --nproc and sets WORLD_SIZE).
    if std::env::var("WORLD_SIZE").is_ok_and(|w| w.trim() != "1") {
        return super::bench_train_sharded::rank(&args);
    }
    if args.nproc > 1 {
        let command_line: Vec<String> = std::env::args().collect();
        return super::bench_train_sharded::run(&args, &command_line);
    }
    device_of(&args.device)?;
    if args.threads > 0 {
        tch::set_num_threads(args.threads);
    }
    let tokens_per_step = (args.batch * args.seq) as f64;
    let mut rust = RustSide::new(&args);
    let n_params: i64 = rust.params.iter().map(|(_, p)| p.numel() as i64).sum();
    let mut py = if args.no_python {
        None
    } else {
        eprintln!("starting the PyTorch worker ...");
        let (w, ready) = TorchWorker::start(&args)?;
        let py_params = ready["params"].as_i64().unwrap_or(-1);
        if py_params != n_params {
            bail!("parameter counts differ: temper {n_params}, PyTorch {py_params}");
        }
        Some(w)
    };
    println!(
        "bench train: Qwen2-shaped, {:.1}M params (hidden {}, {} layers, {}/{} heads, vocab {}), \
         batch {} x {}, {} timed steps x {} rounds, {} threads",
        n_params as f64 / 1e6,
        args.hidden,
        args.layers,
        args.heads,
        args.kv_heads,
        args.vocab,
        args.batch,
        args.seq,
        args.steps,
        args.rounds,
        tch::get_num_threads()
    );
    for kind in [ComputeKind::F32, ComputeKind::Bf16] {
        let head_dim = rust.model.config().head_dim;
        println!(
            "kernels, temper {kind}: {}",
            temper_model::kernel_report(kind, device_of(&args.device)?, head_dim)
        );
    }
    // The roof of each dtype here, and the model FLOPs of one step (the head scores every
    // position): every row's tok/s is also a fraction of the roof.
    let device = device_of(&args.device)?;
    let roofs: Vec<(ComputeKind, temper_model::Roof)> = [ComputeKind::F32, ComputeKind::Bf16]
        .into_iter()
        .map(|kind| (kind, temper_model::Roof::measure(kind, device)))
        .collect();
    for (kind, roof) in &roofs {
        println!("roof, {kind}: {}", roof.describe(*kind));
    }
    let step_flops = rust
        .model
        .config()
        .training_flops(tokens_per_step, tokens_per_step, true);
    let auto = temper_model::resolve_compute_kind(
        temper_model::DtypeRequest::Auto,
        device_of(&args.device)?,
    )?;
    // What the trainer's `auto` takes here, with the measurement behind it where one decides.
    let auto_line = format!("model.dtype = \"auto\": {}", auto.compute);
    println!("{}", auto.note.unwrap_or(auto_line));
    // Per configuration: summed timings and steps, in first-run order.
    let mut totals: Vec<(&'static str, Timing, usize)> = vec![];
    let mut add = |label: &'static str, t: Timing| {
        let i = match totals.iter().position(|(l, _, _)| *l == label) {
            Some(i) => i,
            None => {
                totals.push((label, Timing::default(), 0));
                totals.len() - 1
            }
        };
        totals[i].1.wall += t.wall;
        totals[i].1.cpu += t.cpu;
        totals[i].1.peak_bytes = totals[i].1.peak_bytes.max(t.peak_bytes);
        totals[i].2 += args.steps;
        let tok = args.steps as f64 * tokens_per_step;
        eprintln!(
            "  {label:<22} {:>9.1} tok/s  {:>9.1} tok/cpu-s",
            tok / t.wall,
            tok / t.cpu.max(1e-9)
        );
    };
    if args.warmup > 0 {
        eprintln!("warming up ...");
        rust.run(ComputeKind::F32, args.warmup)?;
        rust.run(ComputeKind::Bf16, args.warmup)?;
        if let Some(py) = py.as_mut() {
            for mode in torch_modes(&args) {
                py.run(mode, args.warmup)?;
            }
        }
    }
    for round in 0..args.rounds {
        eprintln!("round {}/{}", round + 1, args.rounds);
        add("temper f32", rust.run(ComputeKind::F32, args.steps)?);
        if let Some(py) = py.as_mut() {
            for mode in torch_modes(&args).filter(|m| !m.contains("bf16")) {
                add(torch_label(mode), py.run(mode, args.steps)?);
            }
        }
        add("temper bf16", rust.run(ComputeKind::Bf16, args.steps)?);
        if let Some(py) = py.as_mut() {
            for mode in torch_modes(&args).filter(|m| m.contains("bf16")) {
                add(torch_label(mode), py.run(mode, args.steps)?);
            }
        }
    }
    let rate = |t: &Timing, steps: usize| {
        let tok = steps as f64 * tokens_per_step;
        (tok / t.wall, tok / t.cpu.max(1e-9))
    };
    let rate_of = |label: &str| {
        totals
            .iter()
            .find(|(l, _, _)| *l == label)
            .map(|(_, t, n)| rate(t, *n))
    };
    // Each row against PyTorch eager in the same dtype (f32 when PyTorch's bf16 was not run).
    let base_f32 = rate_of("PyTorch f32");
    let base_bf16 = rate_of("PyTorch autocast bf16").or(base_f32);
    println!(
        "{:<24} {:>10} {:>10} {:>10} {:>18} {:>14} {:>9} {:>8}",
        "implementation",
        "tok/s",
        "tok/cpu-s",
        "peak MiB",
        "vs PyTorch eager",
        "(by CPU time)",
        "TFLOP/s",
        "of roof"
    );
    for (label, t, n) in &totals {
        let (wall, cpu) = rate(t, *n);
        let base = if label.contains("bf16") {
            base_bf16
        } else {
            base_f32
        };
        let (r_wall, r_cpu) = match base {
            Some((bw, bc)) => (format!("{:.2}x", wall / bw), format!("{:.2}x", cpu / bc)),
            None => ("-".into(), "-".into()),
        };
        let peak = t
            .peak_bytes
            .map_or("-".to_string(), |b| format!("{:.0}", b as f64 / 1048576.0));
        let achieved = wall / tokens_per_step * step_flops;
        let roof = roofs[usize::from(label.contains("bf16"))].1.matmul_flops;
        println!(
            "{label:<24} {wall:>10.1} {cpu:>10.1} {peak:>10} {r_wall:>18} {r_cpu:>14} {:>9.3} {:>7.0}%",
            achieved / 1e12,
            100.0 * achieved / roof
        );
    }
    Ok(())
}

/// The PyTorch worker's modes this run times (tools/bench_train.py).
fn torch_modes(args: &Args) -> impl Iterator<Item = &'static str> + '_ {
    [
        ("f32", true),
        ("autocast_bf16", args.torch_bf16),
        ("compile_f32", args.torch_compile),
        ("compile_bf16", args.torch_compile && args.torch_bf16),
    ]
    .into_iter()
    .filter(|(_, on)| *on)
    .map(|(mode, _)| mode)
}

fn torch_label(mode: &str) -> &'static str {
    match mode {
        "f32" => "PyTorch f32",
        "autocast_bf16" => "PyTorch autocast bf16",
        "compile_f32" => "torch.compile f32",
        _ => "torch.compile bf16",
    }
}

/// `cpu`, `cuda` or `cuda:N`, present on this machine.
pub fn device_of(s: &str) -> Result<Device> {
    temper_base::device::parse_device_for("--device", s)
}
