//! The GRPO loop: rollout -> reward -> advantages -> old/ref logprobs -> PPO epochs over
//! mini-batches with gradient accumulation -> AdamW; plus evaluation, checkpoints and resume.
mod accessors;
mod algo_setup;
mod batch;
mod checkpointer;
mod compute_dtype;
mod env_logs;
mod eval;
mod learner;
mod memory_plan;
mod optimizer;
pub use optimizer::Optimizer;
mod producer;
mod sharded;
#[cfg(test)]
mod sharded_reference;
mod stats;
mod step_batch;
mod train_step;

pub use batch::Batch;
pub(crate) use learner::Learner;
pub use stats::StepMetrics;

use crate::checkpoint::{self, TrainerState};
use crate::config::{Config, TrainerDevice};
use crate::dist::Dist;
use crate::rundir::{run_metadata, write_atomic, write_json, RunDir};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use tch::Device;
use temper_model::{ComputeKind, Policy};

/// A test seam's callback on the trainable parameters ([`Trainer::set_before_update`]).
/// `Send`: an environment run sampling ahead updates on a thread of its own.
pub type ParamsHook = Box<dyn FnMut(&[(String, tch::Tensor)]) + Send>;

/// Everything a run holds between steps.
pub struct Trainer {
    /// The `trainer` section: seeds, logging and evaluation frequencies, progress.
    trainer_cfg: crate::config::TrainerConfig,
    /// The `eval` section: how the validation set is sampled.
    eval_cfg: crate::config::EvalConfig,
    /// This process's rank in a data-parallel job (world size 1 alone).
    /// Shared with a sharded optimizer's layers, which gather and reduce while the model runs.
    dist: std::sync::Arc<Dist>,
    run: RunDir,
    /// The consumer: the policy and how it learns.
    learner: Learner,
    /// The producer: the questions and their reward, the samplers, an environment run's
    /// environment; it hands each step's scored groups to the learner.
    producer: producer::Producer,
    /// The padding token of the learner's batches.
    pad_id: i64,
    state: TrainerState,
    total_steps: usize,
    /// Set by `--stop-after`: end (with a checkpoint) after this many steps in this process.
    stop_after: Option<usize>,
    /// The last step of the fit under way (`total_steps`, or sooner with `stop_after`): no step
    /// after it has its episodes played or its batch queued ahead (this process would drop them).
    fit_end: usize,
    /// `temper train --profile STEP`: the step whose Chrome trace is written.
    profile_step: Option<usize>,
    /// Which steps are saved, and how.
    checkpointer: checkpointer::Checkpointer,
    /// `trainer.logger`'s sinks (rank 0, from the start of [`Trainer::fit`]).
    loggers: Option<crate::loggers::Loggers>,
    /// A test seam: called with the parameters between a step's old-logprob pass and its update
    /// (to show that `trainer.check_on_policy` fires when the two passes see different weights).
    #[doc(hidden)]
    before_update: Option<ParamsHook>,
}

/// The training device; with several ranks on a machine each takes the GPU of its `LOCAL_RANK`
/// (torchrun's and `--nproc`'s), as DDP does.
fn device_of(cfg: &Config) -> Result<Device> {
    let local = std::env::var("LOCAL_RANK")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    Ok(match cfg.trainer.device {
        TrainerDevice::Cuda => {
            temper_base::device::parse_device_for("trainer.device", &format!("cuda:{local}"))?
        }
        TrainerDevice::Auto if tch::Cuda::is_available() => Device::Cuda(local),
        TrainerDevice::Auto | TrainerDevice::Cpu => Device::Cpu,
    })
}

impl Trainer {
    /// A new run in a fresh folder under `trainer.default_local_dir`, as one rank of the job the
    /// launch environment describes (one process when none: [`Dist::from_env`]).
    pub fn create(cfg: Config, name_hint: &str, command_line: &[String]) -> Result<Self> {
        Self::create_with(cfg, name_hint, command_line, Dist::from_env()?)
    }

    /// [`Trainer::create`] as rank `dist.rank` of `dist.world`. Rank 0 owns the run folder; the
    /// other ranks write their (unused) files to a scratch folder that is removed when they end.
    pub fn create_with(
        cfg: Config,
        name_hint: &str,
        command_line: &[String],
        dist: Dist,
    ) -> Result<Self> {
        if !dist.is_root() {
            let run = RunDir::scratch_for_rank(dist.rank)?;
            let scratch = run.root.clone();
            let model_dir = resolve_model_dir(&cfg)?;
            return Self::build(cfg, run, &model_dir, None, dist, None, None)
                .inspect_err(|_| drop(std::fs::remove_dir_all(&scratch)));
        }
        let name = if cfg.trainer.experiment_name.is_empty() {
            format!("{name_hint}-{}", crate::rundir::compact_timestamp())
        } else {
            cfg.trainer.experiment_name.clone()
        };
        let root = Path::new(&cfg.trainer.default_local_dir).join(&name);
        if root.join("metrics.jsonl").exists() || root.join("checkpoints").exists() {
            bail!(
                "run folder {} already holds a run: resume it with `temper train --resume {}` or pick another \
                 trainer.experiment_name",
                root.display(),
                root.display()
            );
        }
        std::fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
        let run = RunDir::new(root.clone());
        let model_dir = resolve_model_dir(&cfg)?;
        // A run that cannot start leaves no empty folder behind (a folder holding anything stays).
        let saved = toml::to_string_pretty(&cfg)?;
        let t = Self::build(cfg, run, &model_dir, None, dist, None, None)
            .inspect_err(|_| drop(std::fs::remove_dir(&root)))?;
        write_atomic(&t.run.config(), saved.as_bytes())?;
        let mut metadata = run_metadata(t.trainer_cfg.seed, command_line);
        // What `model.dtype = "auto"` became on this machine; a resumed run keeps it.
        metadata["compute_dtype"] = t.learner.model().compute().to_string().into();
        metadata["kernels"] = t.learner.model().kernel_report().into();
        if let Some(backend) = t.producer.metadata() {
            metadata["rollout_backend"] = backend;
        }
        write_json(&t.run.metadata(), &metadata)?;
        Ok(t)
    }

    /// Continues the run in `run_root` from its newest complete checkpoint. `overrides` apply on
    /// top of the run's saved config (e.g. `trainer.total_training_steps=20` to extend it).
    pub fn resume(run_root: &Path, overrides: &[String]) -> Result<Self> {
        Self::resume_with(run_root, overrides, Dist::from_env()?)
    }

    /// [`Trainer::resume`] as rank `dist.rank` (any world size: the checkpoint does not depend
    /// on it). Every rank reads the checkpoint; only rank 0 writes to the run folder.
    pub fn resume_with(run_root: &Path, overrides: &[String], dist: Dist) -> Result<Self> {
        let run = RunDir::new(run_root);
        let root = dist.is_root();
        let loaded = crate::config::load_config(Some(&run.config()), overrides)
            .with_context(|| format!("resuming {}", run_root.display()))?;
        for w in &loaded.warnings {
            eprintln!("warning: {w}");
        }
        if root {
            checkpoint::remove_partial(&run.checkpoints())?;
        }
        let (_, ckpt) = checkpoint::latest(&run.checkpoints())?;
        let state = checkpoint::read_state(&ckpt)?;
        let cfg = loaded.config;
        if root && !overrides.is_empty() {
            write_atomic(&run.config(), toml::to_string_pretty(&cfg)?.as_bytes())?;
        }
        let reference_dir = original_model_dir(&cfg, &ckpt);
        let recorded = compute_dtype::recorded_compute(&run.metadata())?;
        let run = if root {
            run
        } else {
            RunDir::scratch_for_rank(dist.rank)?
        };
        let scratch = (!root).then(|| run.root.clone());
        // With LoRA the checkpoint holds merged weights and the adapters: start from the base
        // model again and load the adapters, so training continues on the same parameters.
        let (weights, adapter) = if cfg.model.lora_rank > 0 {
            (
                reference_dir.clone(),
                Some(ckpt.join("model").join("adapter")),
            )
        } else {
            (ckpt.join("model"), None)
        };
        let mut t = Self::build(
            cfg,
            run,
            &weights,
            Some(&reference_dir),
            dist,
            adapter.as_deref(),
            recorded,
        )
        .inspect_err(|_| {
            if let Some(s) = &scratch {
                let _ = std::fs::remove_dir_all(s);
            }
        })?;
        t.learner.resume_from(&ckpt, state.kl_coef)?;
        if root {
            t.run.truncate_metrics(state.step + 1)?;
        }
        t.state = state;
        Ok(t)
    }

    /// Builds the trainer with weights from `weights_dir`; the reference policy (when needed)
    /// comes from `reference_dir` (default: the same folder).
    fn build(
        cfg: Config,
        run: RunDir,
        weights_dir: &Path,
        reference_dir: Option<&Path>,
        dist: Dist,
        lora_adapter: Option<&Path>,
        recorded_compute: Option<ComputeKind>,
    ) -> Result<Self> {
        cfg.check_world_size(dist.world)
            .with_context(|| format!("rank {}", dist.rank))?;
        dist.check_same(&toml::to_string(&cfg)?, "config")?;
        if let Some(n) = cfg.trainer.threads {
            tch::set_num_threads(n as i32);
        }
        let device = device_of(&cfg)?;
        let model_config = temper_model::ModelConfig::from_file(&weights_dir.join("config.json"))?;
        let local_ranks = std::env::var("LOCAL_WORLD_SIZE")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .unwrap_or(1);
        let compute =
            compute_dtype::run_compute(cfg.model.dtype.into(), device, &dist, recorded_compute)?;
        memory_plan::check(
            &cfg,
            &model_config,
            compute,
            dist.world,
            local_ranks,
            device,
            dist.is_root(),
        )?;
        let roof = temper_model::Roof::measure(compute, device);
        if dist.is_root() {
            eprintln!("temper: {} on {device:?}", roof.describe(compute));
        }
        let tok_dir = cfg
            .model
            .tokenizer_path
            .as_ref()
            .map(PathBuf::from)
            .unwrap_or_else(|| weights_dir.to_path_buf());
        let policy = Policy::load_with_tokenizer(weights_dir, &tok_dir, true, device, compute)?;
        let eos_ids = policy.require_eos()?.to_vec();
        let pad_id = policy.pad_id.unwrap_or(eos_ids[0]);
        let Policy {
            mut model,
            tokenizer,
            ..
        } = policy;
        let tokenizer = tokenizer.expect("load_with_tokenizer(.., true, ..) loads one");
        if let Some(on) = cfg.actor.trim_heap {
            model.set_trim_heap_in_backward(on);
        }
        // Either the backward trims the heap (large models) or every step reuses what the last
        // one freed, without mapping it again (see docs/training.md, "Memory").
        if device == tch::Device::Cpu && !model.trims_heap_in_backward() {
            temper_kernels::memory::keep_freed_memory_for_reuse();
        }
        if let Some(lora) = cfg.model.lora() {
            // The adapters' initial A comes from libtorch's generator, seeded with the run.
            model
                .add_lora_seeded(&lora, cfg.trainer.seed)
                .context("model.lora_rank / lora_alpha / target_modules")?;
            if let Some(dir) = lora_adapter {
                model.load_lora_adapter(dir)?;
            }
            // The frozen base in the compute dtype: the numbers the forwards use, half the bytes.
            let freed = model.hold_frozen_in_compute_dtype();
            if freed > 0 && dist.is_root() {
                eprintln!(
                    "temper: LoRA: the frozen base's projections held in {compute} ({:.2} GiB less)",
                    freed as f64 / (1u64 << 30) as f64
                );
            }
        }

        // The producer's samplers start from the policy as loaded (whole, before a sharded
        // optimizer lets its layers go).
        let dist = std::sync::Arc::new(dist);
        let (producer, total_steps) = producer::Producer::new(
            &cfg,
            producer::ProducerParts {
                tokenizer,
                eos_ids,
                dist: dist.clone(),
                weights_dir,
                tokenizer_dir: &tok_dir,
                device,
                compute,
                policy: &model,
            },
        )?;
        let mut notes = vec![];
        let learner = Learner::build(
            &cfg,
            learner::LearnerStart {
                model,
                reference_dir: reference_dir.unwrap_or(weights_dir),
                device,
                compute,
                total_steps,
                roof,
            },
            &dist,
            &mut notes,
        )?;
        if dist.is_root() {
            for n in notes {
                eprintln!("note: {n}");
            }
        }
        // Rank 0's folder on every rank: a sharded optimizer's ranks write their slices there
        // (a filesystem all ranks share, as verl's and torch.distributed.checkpoint's need).
        let checkpoints = dist.from_root(run.checkpoints())?;
        let checkpointer = checkpointer::Checkpointer::new(checkpoints, &cfg.trainer);
        Ok(Trainer {
            checkpointer,
            dist,
            trainer_cfg: cfg.trainer,
            eval_cfg: cfg.eval,
            run,
            learner,
            producer,
            pad_id,
            state: TrainerState::default(),
            total_steps,
            stop_after: None,
            fit_end: total_steps,
            profile_step: None,
            loggers: None,
            before_update: None,
        })
    }

    /// Runs to `total_steps` (or `stop_after` more steps), evaluating and checkpointing as
    /// configured. Returns the last step's metrics.
    pub fn fit(&mut self) -> Result<StepMetrics> {
        let start_step = self.state.step;
        // Evaluation is sharded over the ranks; rank 0 writes it.
        let root = self.dist.is_root();
        if root && self.loggers.is_none() {
            self.loggers = Some(crate::loggers::Loggers::start(
                &self.trainer_cfg,
                &self.run,
            )?);
        }
        if start_step == 0 && self.trainer_cfg.val_before_train && self.trainer_cfg.test_freq > 0 {
            let m = self.evaluate(0)?;
            if root {
                self.record_metrics(0, &m)?;
            }
        }
        // The servers start from the trainer's weights (a resumed run's, too); that handover is
        // no step's.
        self.producer.publish(
            &self.learner,
            &self.run.root,
            self.state.policy_version,
            producer::ServersSync::Now,
        )?;
        let bar = self.progress_bar(start_step);
        let overlapped = self.producer.async_steps() > 0;
        let mut last = StepMetrics::new();
        let end = match self.stop_after {
            Some(n) => (start_step + n).min(self.total_steps),
            None => self.total_steps,
        };
        self.fit_end = end;
        while self.state.step < end {
            let step = self.state.step + 1;
            let mut m = self.profiled_step(step)?;
            // verl's name and unit (GiB, as verl divides by 1024^3): the CUDA allocator's peak so
            // far on a GPU, the resident peak on CPU.
            let cuda = match self.learner.model().device() {
                Device::Cuda(i) => Some(i),
                _ => None,
            };
            if let Some(peak) = temper_kernels::memory::step_peak_bytes(cuda) {
                m.insert(
                    "perf/max_memory_allocated_gb".into(),
                    peak as f64 / (1u64 << 30) as f64,
                );
            }
            let tf = self.trainer_cfg.test_freq;
            if tf > 0 && (step.is_multiple_of(tf as usize) || step == self.total_steps) {
                m.extend(self.evaluate(step)?);
            }
            self.state.step = step;
            self.state.kl_coef = self.learner.kl_coef();
            if self.dist.is_root() {
                self.record_metrics(step, &m)?;
            }
            if self.checkpointer.due(step, end) {
                self.save_checkpoint()?;
            }
            bar.set_position(step as u64);
            bar.set_message(summary(&m, overlapped));
            if root && bar.is_hidden() && self.trainer_cfg.progress {
                eprintln!(
                    "step {step}/{}: {}",
                    self.total_steps,
                    summary(&m, overlapped)
                );
            }
            last = m;
        }
        bar.finish();
        self.producer.finish();
        // Sharded, the layers stay let go: gathering the whole f32 model here, beside the
        // optimizer's slices, is more than a rank may hold at the sizes sharding is for (a
        // caller that reads every weight asks for it: `Trainer::whole_model`).
        if let Some(mut l) = self.loggers.take() {
            l.finish(&self.run.root, self.state.step)?;
        }
        Ok(last)
    }

    /// One step's metrics to metrics.jsonl, then to `trainer.logger`'s sinks.
    fn record_metrics(&mut self, step: usize, m: &StepMetrics) -> Result<()> {
        self.run.append_metrics(step, m)?;
        if let Some(l) = &mut self.loggers {
            l.log(step, m)?;
        }
        Ok(())
    }

    /// Saves a checkpoint of the current step (see [`checkpointer::Checkpointer`]).
    pub fn save_checkpoint(&self) -> Result<PathBuf> {
        self.checkpointer
            .save(&self.learner, &self.state, &self.dist)
    }

    fn progress_bar(&self, pos: usize) -> indicatif::ProgressBar {
        use std::io::IsTerminal;
        if !self.trainer_cfg.progress || !self.dist.is_root() || !std::io::stderr().is_terminal() {
            return indicatif::ProgressBar::hidden();
        }
        let bar = indicatif::ProgressBar::new(self.total_steps as u64);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} step {pos}/{len} [{elapsed_precise} ETA {eta_precise}] {msg}",
            )
            .expect("valid template"),
        );
        bar.set_position(pos as u64);
        bar
    }
}

/// One line of the headline numbers of a step.
/// `overlapped`: the run samples ahead (`rollout.async_steps`), so the lag is shown.
fn summary(m: &StepMetrics, overlapped: bool) -> String {
    let keys = [
        ("critic/score/mean", "score"),
        ("val/accuracy", "val_acc"),
        ("actor/pg_loss", "pg_loss"),
        ("actor/ppo_kl", "kl"),
        ("actor/entropy", "entropy"),
        ("response_length/mean", "len"),
        ("timing_s/step", "s/step"),
        ("perf/max_memory_allocated_gb", "mem_gb"),
    ];
    let mut parts: Vec<String> = keys
        .iter()
        .filter_map(|(k, short)| m.get(*k).map(|v| format!("{short}={v:.4}")))
        .collect();
    // An overlapped run's staleness: the most versions a trained answer lagged this step.
    if let Some(&lag) = m.get("rollout/policy_lag_max") {
        if overlapped || lag > 0.0 {
            parts.push(format!("lag={lag:.0}"));
        }
    }
    parts.join(" ")
}

/// `model.path` resolved to a folder (`smollm2` and hub ids via temper-model).
pub fn resolve_model_dir(cfg: &Config) -> Result<PathBuf> {
    temper_model::resolve::resolve_model(&cfg.model.path).with_context(|| "model.path".to_string())
}

/// The folder the run started from (the reference policy of a resumed run); the checkpoint's
/// own weights if it cannot be resolved any more.
fn original_model_dir(cfg: &Config, ckpt: &Path) -> PathBuf {
    resolve_model_dir(cfg).unwrap_or_else(|_| ckpt.join("model"))
}

impl Drop for Trainer {
    /// A rank > 0 removes its scratch folder (see [`Trainer::create_with`]), also on an error.
    fn drop(&mut self) {
        if !self.dist.is_root() {
            let _ = std::fs::remove_dir_all(&self.run.root);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_progress_line_shows_the_lag_of_an_overlapped_run() {
        let mut m = StepMetrics::new();
        m.insert("critic/score/mean".into(), 0.5);
        m.insert("rollout/policy_lag_max".into(), 0.0);
        assert_eq!(summary(&m, false), "score=0.5000");
        assert_eq!(summary(&m, true), "score=0.5000 lag=0");
        // Servers without weight sync lag too, overlap or not.
        m.insert("rollout/policy_lag_max".into(), 2.0);
        assert_eq!(summary(&m, false), "score=0.5000 lag=2");
    }

    /// An environment run sampling ahead stopped by `--stop-after` plays nothing ahead for the
    /// step after its last (the next process would play it again): the last step's update runs
    /// alone.
    #[test]
    fn a_fit_stopped_early_plays_nothing_ahead_for_the_step_after_it() {
        let root = temper_testkit::temp_dir("env-stop-after");
        let mut ov = temper_testkit::tiny_overrides(&root);
        ov.extend(
            [
                "env.name=debate",
                "env.task=qa",
                "env.judge=mock",
                "env.debate_train=rejection",
                "data.max_prompt_length=1024",
                "data.train_batch_size=2",
                "actor.ppo_mini_batch_size=1",
                "actor.ppo_micro_batch_size_per_gpu=2",
                "trainer.total_training_steps=3",
                "trainer.check_on_policy=false",
                "rollout.async_steps=1",
            ]
            .map(String::from),
        );
        let cfg = crate::config::load_config(None, &ov).unwrap().config;
        let mut t = Trainer::create(cfg, "s", &[]).unwrap();
        t.set_stop_after(Some(1));
        t.fit().unwrap();
        assert_eq!(t.state.step, 1);
        assert!(!t.producer.holds_played_ahead(), "step 2 played ahead");
        // Going on to the end: step 2 plays its own debates, step 3's are played during step
        // 2's update, one version old.
        t.set_stop_after(None);
        t.fit().unwrap();
        assert_eq!(t.state.step, 3);
        let lags: Vec<f64> = t
            .run
            .read_metrics()
            .unwrap()
            .iter()
            .map(|m| m["rollout/policy_lag_max"].as_f64().unwrap())
            .collect();
        assert_eq!(lags, vec![0.0, 0.0, 1.0]);
    }
}
