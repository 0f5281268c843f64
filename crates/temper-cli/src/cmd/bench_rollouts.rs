//! `temper bench rollouts`: the main job's steps with rollouts sampled in process, on a
//! `temper serve` process (`rollout.backend = "vllm"`, weights synced from disk after every
//! step), and on that server with overlap (`rollout.async_steps = 1`). The variants alternate
//! `--rounds` times so background load hits all of them; each run's warm-up steps are untimed;
//! the result is each variant's median step time. Not a test: see BENCHMARKS.md.
use super::bench::{load_average, median, ServeChild};
use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use temper_train::config::load_config;
use temper_train::trainer::Trainer;

#[derive(clap::Args)]
pub struct Args {
    /// The training config (default: the main job).
    #[arg(long, default_value = "examples/arith-smollm2.toml")]
    pub config: PathBuf,
    /// Timed steps per run.
    #[arg(long, default_value_t = 3)]
    pub steps: usize,
    /// Untimed steps first.
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    /// How many times the variants alternate.
    #[arg(long, default_value_t = 1)]
    pub rounds: usize,
}

pub fn run(args: Args) -> Result<()> {
    if args.steps == 0 {
        bail!("--steps must be at least 1");
    }
    let scratch = super::bench::ScratchDir::new("rollouts")?;
    let tmp = scratch.0.clone();
    let total = args.steps + args.warmup;
    let base: Vec<String> = vec![
        format!("trainer.total_training_steps={total}"),
        "trainer.test_freq=-1".into(),
        "trainer.val_before_train=false".into(),
        "trainer.rollout_log_freq=-1".into(),
        "trainer.save_freq=-1".into(),
        "trainer.check_on_policy=false".into(),
        "trainer.progress=false".into(),
        format!("trainer.default_local_dir={:?}", tmp.display().to_string()),
    ];
    let cfg = load_config(Some(&args.config), &base)?.config;
    let model_dir = temper_model::resolve::resolve_model(&cfg.model.path)?;
    let compute =
        temper_model::resolve_compute_kind(cfg.model.dtype.into(), tch::Device::Cpu)?.compute;
    let model = model_dir.display().to_string();
    let serve = |threads: Option<usize>| {
        let mut a = vec![
            "--model".to_string(),
            model.clone(),
            "--dtype".into(),
            compute.to_string(),
        ];
        a.extend(
            threads
                .map(|t| ["--threads".to_string(), t.to_string()])
                .into_iter()
                .flatten(),
        );
        ServeChild::start(&a)
    };
    let server = serve(None)?;
    // The machine split in two: half the cores for the server, half for the trainer.
    let half = (std::thread::available_parallelism().map_or(2, |n| n.get()) / 2).max(1);
    let split = serve(Some(half))?;
    let on = |s: &ServeChild, extra: &[&str]| -> Vec<String> {
        [
            "rollout.backend=\"vllm\"".to_string(),
            format!("rollout.base_urls=[{:?}]", s.url),
        ]
        .into_iter()
        .chain(extra.iter().map(|e| e.to_string()))
        .collect()
    };
    let split_trainer = format!("trainer.threads={half}");
    let variants: Vec<(String, Vec<String>)> = vec![
        ("in-process".into(), vec![]),
        ("temper serve, async_steps=0".into(), on(&server, &[])),
        (
            "temper serve, async_steps=1".into(),
            on(&server, &["rollout.async_steps=1"]),
        ),
        (
            format!("temper serve ({half} thread) + trainer ({half} thread), async_steps=1"),
            on(&split, &["rollout.async_steps=1", &split_trainer]),
        ),
    ];
    println!(
        "{} steps (+{} warm-up) of {}, {compute}, {} round(s); load average before: {}",
        args.steps,
        args.warmup,
        args.config.display(),
        args.rounds,
        load_average()
    );
    // Per variant: step, generation and weight-sync seconds of every timed step.
    let mut times: Vec<[Vec<f64>; 3]> = vec![Default::default(); variants.len()];
    for round in 0..args.rounds {
        for (v, (name, extra)) in variants.iter().enumerate() {
            let mut ov = base.clone();
            ov.extend(extra.iter().cloned());
            ov.push(format!("trainer.experiment_name=\"r{round}-v{v}\""));
            let cfg = load_config(Some(&args.config), &ov)?.config;
            let mut t = Trainer::create(cfg, "bench", &[])?;
            t.fit().with_context(|| name.to_string())?;
            for m in t.run().read_metrics()?.iter().filter(|m| {
                m.get("step").and_then(|s| s.as_u64()).unwrap_or(0) as usize > args.warmup
            }) {
                let get = |k: &str| m.get(k).and_then(|x| x.as_f64()).unwrap_or(f64::NAN);
                times[v][0].push(get("timing_s/step"));
                times[v][1].push(get("timing_s/gen"));
                times[v][2].push(
                    m.get("timing_s/weight_sync")
                        .and_then(|x| x.as_f64())
                        .unwrap_or(0.0),
                );
            }
            eprintln!(
                "round {round}: {name} done (load average {})",
                load_average()
            );
        }
    }
    let local = median(&times[0][0]);
    println!("| variant | median s/step | s generating | s weight sync | speed vs in-process |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    for ((name, _), [steps, gen, sync]) in variants.iter().zip(&times) {
        let s = median(steps);
        println!(
            "| {name} | {s:.2} | {:.2} | {:.2} | {:.2}x |",
            median(gen),
            median(sync),
            local / s
        );
    }
    println!("load average after: {}", load_average());
    Ok(())
}
