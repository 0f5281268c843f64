//! `temper bench train --nproc N [--strategy fsdp|dp]`: the bench's model trained by N rank
//! processes on this machine (as `temper train --nproc` starts them, the cores split between
//! them), every rank a share of the batch, with the trainer's own optimizer (`actor.strategy`:
//! sharded per decoder layer, each layer gathered while it runs, or replicated), activation
//! checkpointing on, side by side with PyTorch FSDP2 (`tools/bench_train_fsdp.py`: `fully_shard`
//! per layer, the same model shape, loss, batch split and fused AdamW). Runs alternate (temper,
//! PyTorch, temper, ...); each reports seconds per step and the largest rank's peak resident
//! memory. Not a test: see BENCHMARKS.md.
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tch::{Device, Kind, Tensor};
use temper_model::{CausalLm, ComputeKind};
use temper_train::config::{ActorConfig, Strategy};
use temper_train::dist::Dist;
use temper_train::trainer::Optimizer;

use super::bench_train::Args;

/// How long the PyTorch side may run.
const PYTHON_TIMEOUT: Duration = Duration::from_secs(3600);

/// Where rank 0 writes its result for the launching process.
const OUT_VAR: &str = "TEMPER_BENCH_TRAIN_OUT";

/// What one side's run measured.
#[derive(serde::Serialize, serde::Deserialize, Clone, Copy)]
struct Measured {
    secs_per_step: f64,
    /// The largest rank's peak resident set, bytes.
    peak_rss_bytes: u64,
}

fn strategy(args: &Args) -> Result<Strategy> {
    args.strategy
        .parse()
        .map_err(|e| anyhow::anyhow!("--strategy: {e}"))
}

/// The launching process: alternates N temper ranks and N PyTorch FSDP2 processes.
pub fn run(args: &Args, command_line: &[String]) -> Result<()> {
    let strategy = strategy(args)?;
    if args.device != "cpu" {
        bail!(
            "--nproc runs CPU ranks on Gloo; --device {} is for one process",
            args.device
        );
    }
    if args.batch % args.nproc as i64 != 0 {
        bail!(
            "--batch {} is not divisible by --nproc {}",
            args.batch,
            args.nproc
        );
    }
    let out = std::env::temp_dir().join(format!("temper-bench-train-{}.json", std::process::id()));
    println!(
        "bench train: {} ranks, actor.strategy = {}, activation checkpointing, batch {} x {} ({} rows a \
         rank), {} timed steps x {} rounds; PyTorch: FSDP2 fully_shard per layer",
        args.nproc,
        strategy.name(),
        args.batch,
        args.seq,
        args.batch / args.nproc as i64,
        args.steps,
        args.rounds
    );
    let mut temper_runs = vec![];
    let mut torch_runs = vec![];
    for round in 0..args.rounds {
        eprintln!("round {}/{}", round + 1, args.rounds);
        let _ = std::fs::remove_file(&out);
        std::env::set_var(OUT_VAR, &out);
        super::launch::spawn_local_ranks(args.nproc, command_line)?;
        let t: Measured = serde_json::from_str(
            &std::fs::read_to_string(&out).context("rank 0 wrote no result")?,
        )?;
        eprintln!(
            "  temper  {:>7.3} s/step  peak {:>6.0} MiB a rank",
            t.secs_per_step,
            t.peak_rss_bytes as f64 / (1 << 20) as f64
        );
        temper_runs.push(t);
        if args.no_python {
            continue;
        }
        let p = torch_side(args)?;
        eprintln!(
            "  PyTorch {:>7.3} s/step  peak {:>6.0} MiB a rank",
            p.secs_per_step,
            p.peak_rss_bytes as f64 / (1 << 20) as f64
        );
        torch_runs.push(p);
    }
    let _ = std::fs::remove_file(&out);
    let median = |runs: &[Measured], f: fn(&Measured) -> f64| {
        let mut v: Vec<f64> = runs.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let row = |name: &str, runs: &[Measured]| {
        println!(
            "{name:<16} {:>8.3} s/step  {:>7.0} MiB peak a rank",
            median(runs, |m| m.secs_per_step),
            median(runs, |m| m.peak_rss_bytes as f64) / (1 << 20) as f64
        );
    };
    row("temper", &temper_runs);
    if !torch_runs.is_empty() {
        row("PyTorch FSDP2", &torch_runs);
        println!(
            "temper / PyTorch: {:.2}x speed, {:.2}x memory (medians)",
            median(&torch_runs, |m| m.secs_per_step) / median(&temper_runs, |m| m.secs_per_step),
            median(&temper_runs, |m| m.peak_rss_bytes as f64)
                / median(&torch_runs, |m| m.peak_rss_bytes as f64)
        );
    }
    Ok(())
}

fn torch_side(args: &Args) -> Result<Measured> {
    let python = temper_base::python::python(args.python.as_deref());
    let script = temper_base::python::repo_root().join("tools/bench_train_fsdp.py");
    let mut flags = args.shape_flags();
    flags.extend([
        ("--nproc", args.nproc as i64),
        ("--steps", args.steps as i64),
        ("--warmup", args.warmup as i64),
        ("--threads", threads_per_rank(args) as i64),
    ]);
    let mut cmd = std::process::Command::new(&python);
    cmd.arg(&script);
    for (flag, v) in flags {
        cmd.args([flag.to_string(), v.to_string()]);
    }
    // Its log goes to the console; its one result line comes back.
    cmd.stdout(std::process::Stdio::piped());
    let mut child = cmd
        .spawn()
        .with_context(|| format!("running {}", script.display()))?;
    let deadline = Instant::now() + PYTHON_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("{} ran past {:?}", script.display(), PYTHON_TIMEOUT);
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    if !status.success() {
        bail!("{} failed ({status})", script.display());
    }
    let mut text = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().context("its stdout")?, &mut text)?;
    let line = text
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .context("bench_train_fsdp.py printed no result")?;
    Ok(serde_json::from_str(line)?)
}

/// Intra-op threads a rank gets: --threads, else the cores split between the ranks (as the
/// launcher sets OMP_NUM_THREADS).
fn threads_per_rank(args: &Args) -> usize {
    if args.threads > 0 {
        return args.threads as usize;
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores / args.nproc).max(1)
}

/// One rank (started by [`run`] through the launcher, RANK and WORLD_SIZE set).
pub fn rank(args: &Args) -> Result<()> {
    let strategy = strategy(args)?;
    let dist = Arc::new(Dist::from_env()?);
    if args.threads > 0 {
        tch::set_num_threads(args.threads);
    }
    let model = CausalLm::random(args.model_config(), 0, Device::Cpu, ComputeKind::F32);
    let params = model.trainable_parameters();
    let mut actor = ActorConfig {
        strategy,
        gradient_checkpointing: true,
        grad_clip: 1.0,
        ..Default::default()
    };
    actor.optim.lr = 1e-5;
    let mut opt = Optimizer::new(&params, &actor, &dist, &mut vec![])?;
    model.set_layer_residency(opt.layer_residency());
    let share = args.batch / dist.world as i64;
    tch::manual_seed(1);
    let ids = Tensor::randint(
        args.vocab,
        [args.batch, args.seq],
        (Kind::Int64, Device::Cpu),
    )
    .narrow(0, dist.rank as i64 * share, share);
    let positions = Tensor::arange(args.seq, (Kind::Int64, Device::Cpu))
        .unsqueeze(0)
        .repeat([share, 1]);
    let mask = ids.ones_like();
    let targets = ids.narrow(1, 1, args.seq - 1);
    let total = (args.batch * (args.seq - 1)) as f64;
    let mut step = || -> Result<()> {
        opt.begin_update(true)?;
        let (hidden, checkpoints) = model.forward_hidden_checkpointed(&ids, &positions, &mask);
        let scores = model
            .score_tokens(&hidden.narrow(1, 0, args.seq - 1), &targets, 1.0, 1024)
            .with_checkpoints(checkpoints);
        let loss = -scores.logp.sum(Kind::Float) / total;
        loss.backward();
        scores.backward();
        opt.check()?;
        if opt.reduce_grads(&dist, &params)? {
            opt.clip_grad_norm(&params, 1.0)?;
            opt.step(&params, 1e-5)?;
        }
        opt.end_update()
    };
    for _ in 0..args.warmup {
        step()?;
    }
    dist.barrier()?;
    let start = Instant::now();
    for _ in 0..args.steps {
        step()?;
    }
    dist.barrier()?;
    let secs_per_step = start.elapsed().as_secs_f64() / args.steps as f64;
    let peak = temper_kernels::memory::peak_rss_bytes().unwrap_or(0) as f64;
    let peaks = dist.gather_f64(&[peak])?;
    if dist.is_root() {
        let m = Measured {
            secs_per_step,
            peak_rss_bytes: peaks.iter().map(|p| p[0]).fold(0.0, f64::max) as u64,
        };
        let out = PathBuf::from(std::env::var(OUT_VAR).context("launched without a result file")?);
        std::fs::write(&out, serde_json::to_string(&m)?)
            .with_context(|| format!("writing {}", out.display()))?;
    }
    Ok(())
}
