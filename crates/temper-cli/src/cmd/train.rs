//! `temper train CONFIG.toml [KEY=VALUE ...] [-m KEY=V1,V2 ...]`, or `temper train --resume RUN_DIR`.
use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use temper_train::config::{expand_sweeps, load_config};
use temper_train::trainer::Trainer;

#[derive(clap::Args)]
pub struct Args {
    /// The run config (TOML with verl-style sections; see docs/training.md).
    config: Option<PathBuf>,
    /// Overrides `section.key=value` (value parsed as TOML; verl key paths accepted).
    overrides: Vec<String>,
    /// Sweep: `-m actor.optim.lr=1e-6,1e-5` runs once per value (combinations of several -m).
    #[arg(short = 'm', long = "multirun")]
    sweeps: Vec<String>,
    /// Continue the run in this folder from its newest checkpoint (overrides apply on top).
    #[arg(long)]
    resume: Option<PathBuf>,
    /// Stop (with a checkpoint) after this many steps in this process.
    #[arg(long)]
    stop_after: Option<usize>,
    /// Write a Chrome trace of this step (default 2, the first after warm-up) with libtorch's
    /// profiler to the run folder (`profile_step_<N>.json`; open in Perfetto or chrome://tracing).
    #[arg(long, num_args = 0..=1, default_missing_value = "2", value_name = "STEP")]
    profile: Option<usize>,
    /// Data parallel on this machine: start N ranks of this command (torchrun's environment,
    /// Gloo on CPU). Under torchrun or Slurm leave it out: the ranks read RANK, WORLD_SIZE, ...
    #[arg(long, default_value_t = 1)]
    nproc: usize,
}

pub fn run(args: Args) -> Result<()> {
    let command_line: Vec<String> = std::env::args().collect();
    if args.nproc > 1 && std::env::var_os("RANK").is_none() {
        return super::launch::spawn_local_ranks(args.nproc, &command_line);
    }
    if args.nproc == 0 {
        bail!("--nproc must be at least 1");
    }
    if let Some(run_dir) = &args.resume {
        if args.config.is_some()
            && !args
                .config
                .as_ref()
                .is_some_and(|c| c.to_string_lossy().contains('='))
        {
            bail!("--resume takes the run folder; the config is the run's own config.toml (give overrides only)");
        }
        let mut overrides = args.overrides.clone();
        if let Some(c) = &args.config {
            overrides.insert(0, c.to_string_lossy().to_string());
        }
        let mut t = Trainer::resume(run_dir, &overrides)?;
        t.set_stop_after(args.stop_after);
        t.set_profile_step(args.profile);
        let root = t.dist().is_root();
        if root {
            eprintln!(
                "temper: resuming {} at step {}",
                run_dir.display(),
                t.state().step + 1
            );
        }
        t.fit()?;
        if root {
            eprintln!("temper: run folder {}", t.run().root.display());
        }
        return Ok(());
    }
    let Some(config) = &args.config else {
        bail!("usage: temper train CONFIG.toml [KEY=VALUE ...] (or --resume RUN_DIR)");
    };
    let stem = config
        .file_stem()
        .map(|s| s.to_string_lossy().to_string())
        .unwrap_or_else(|| "run".into());
    let runs = expand_sweeps(&args.sweeps)?;
    if runs.len() > 1 && std::env::var_os("RANK").is_some() {
        bail!("sweeps (-m) run one process each; they do not combine with data parallel yet");
    }
    for sweep in &runs {
        let mut overrides = args.overrides.clone();
        overrides.extend(sweep.overrides.iter().cloned());
        let loaded = load_config(Some(config), &overrides)?;
        for w in &loaded.warnings {
            eprintln!("warning: {w}");
        }
        let mut cfg = loaded.config;
        if !sweep.tag.is_empty() {
            let base = if cfg.trainer.experiment_name.is_empty() {
                format!("{stem}-{}", temper_train::rundir::compact_timestamp())
            } else {
                cfg.trainer.experiment_name.clone()
            };
            cfg.trainer.experiment_name = format!("{base}/{}", sweep.tag);
            eprintln!("temper: sweep run {}", sweep.tag);
        }
        let mut t = Trainer::create(cfg, &stem, &command_line)
            .with_context(|| format!("config {}", config.display()))?;
        t.set_stop_after(args.stop_after);
        t.set_profile_step(args.profile);
        let root = t.dist().is_root();
        if root {
            eprintln!(
                "temper: run folder {} ({} steps, {} training examples, {} rank(s))",
                t.run().root.display(),
                t.total_steps(),
                t.train_data().len(),
                t.dist().world
            );
        }
        t.fit()?;
        if root {
            eprintln!(
                "temper: done; `temper report {}` draws the curves",
                t.run().root.display()
            );
        }
    }
    Ok(())
}
