//! Before a run starts: the peak memory of its first step, estimated from the config and the
//! model's shape (no weights loaded yet), printed, and a config that cannot fit this machine
//! refused with the numbers, rather than killed by the kernel at its first update.
//!
//! The peak is what stays (f32 master weights and AdamW's two moments of what trains, the
//! reference policy, a sampling copy on `rollout.device`; on CUDA also the engine's compute copy
//! and its fixed-shape KV cache, kept between rollouts) plus the larger of the two phases: the
//! rollout (the in-process engine's frozen compute copy of the weights, its KV cache for the rows
//! in flight) and the update (the gradients, one micro-batch's activations, about
//! [`ModelConfig::activation_bytes_per_token`] per token, and one chunk of the unembedding's
//! logits, and attention's length-squared matrices). The per-token figure is measured on SmolLM2
//! in f32 and taken for bf16 too, so the estimate leans high there; BENCHMARKS.md compares it
//! with measured peaks.

use anyhow::{bail, Result};
use temper_model::{ComputeKind, ModelConfig};

use crate::config::Config;

/// What the process holds besides tensors (libtorch, the tokenizer, the data, allocator slack).
const PROCESS_BYTES: u64 = 512 << 20;

/// The estimate, part by part.
pub(crate) struct MemoryEstimate {
    /// Held for the whole run.
    pub resident: Vec<(&'static str, u64)>,
    /// Held while sampling.
    pub rollout: Vec<(&'static str, u64)>,
    /// Held while one micro-batch trains.
    pub update: Vec<(&'static str, u64)>,
    /// In host memory rather than the device's (offloaded optimizer state of a CUDA run).
    pub host: Vec<(&'static str, u64)>,
}

fn sum(parts: &[(&'static str, u64)]) -> u64 {
    parts.iter().map(|(_, b)| b).sum()
}

fn gib(b: u64) -> String {
    format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
}

impl MemoryEstimate {
    pub fn peak(&self) -> u64 {
        PROCESS_BYTES + sum(&self.resident) + sum(&self.rollout).max(sum(&self.update))
    }

    /// One line: the peak and its parts.
    pub fn describe(&self) -> String {
        let list = |parts: &[(&'static str, u64)]| {
            parts
                .iter()
                .filter(|(_, b)| *b > 0)
                .map(|(n, b)| format!("{n} {}", gib(*b)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let host = match sum(&self.host) {
            0 => String::new(),
            _ => format!("; in host memory: {}", list(&self.host)),
        };
        format!(
            "{} = {} process + held ({}) + the larger of rollout ({}) and update ({}){host}",
            gib(self.peak()),
            gib(PROCESS_BYTES),
            list(&self.resident),
            list(&self.rollout),
            list(&self.update),
        )
    }
}

/// The trainable parameters: LoRA's adapters, or all.
fn trainable_params(cfg: &Config, m: &ModelConfig) -> i64 {
    match cfg.model.lora() {
        // The config's checks refuse bad targets before the estimate is made.
        Some(lora) => lora.num_params(m).unwrap_or(0),
        None => m.num_params(),
    }
}

/// How the trainable weights' state is placed (`actor.strategy`, `actor.fsdp_config`), as the
/// trainer's optimizer decides it: sharded for `fsdp` over several ranks or with offload.
struct Placement {
    sharded: bool,
    /// The slices and moments in host memory (not the device's) on a CUDA run.
    offload: bool,
    /// Each decoder layer gathered only while it runs (a checkpointed sharded update).
    per_layer: bool,
}

impl Placement {
    fn of(cfg: &Config, world: usize) -> Placement {
        let f = &cfg.actor.fsdp_config;
        let offload = f.optimizer_offload || f.param_offload;
        let sharded = cfg.actor.strategy == crate::config::Strategy::Fsdp && (world > 1 || offload);
        Placement {
            sharded,
            offload: sharded && offload,
            per_layer: sharded && cfg.actor.gradient_checkpointing,
        }
    }
}

/// The trainable parameters outside the decoder layers (embeddings, final norm, head) and in
/// the largest layer: what a per-layer sharded update holds whole at its peak.
fn trainable_outside_and_per_layer(cfg: &Config, m: &ModelConfig) -> (u64, u64) {
    let trainable = trainable_params(cfg, m).max(0) as u64;
    let layers = m.num_hidden_layers.max(1) as u64;
    if cfg.model.lora().is_some() {
        // Adapters live in the layers (a head adapter aside, counted as one more layer's).
        return (0, trainable.div_ceil(layers));
    }
    let emb = (m.vocab_size * m.hidden_size).max(0) as u64;
    let head = if m.tie_word_embeddings { 0 } else { emb };
    let outside = emb + head + m.hidden_size.max(0) as u64;
    (outside, trainable.saturating_sub(outside).div_ceil(layers))
}

/// The first step's peak on one rank of `world`, computing in `compute`.
pub(crate) fn estimate(
    cfg: &Config,
    m: &ModelConfig,
    compute: ComputeKind,
    world: usize,
) -> MemoryEstimate {
    let f32 = 4u64;
    let place = Placement::of(cfg, world);
    let compute_bytes = compute.kind().elt_size_in_bytes() as u64;
    let params = m.num_params().max(0) as u64;
    let trainable = trainable_params(cfg, m).max(0) as u64;
    let needs_reference = cfg.actor.use_kl_loss || cfg.algorithm.use_kl_in_reward;
    let (prompt, response) = (
        cfg.data.max_prompt_length as u64,
        cfg.data.max_response_length as u64,
    );
    let n = cfg.rollout.n.max(1) as u64;
    let lora = cfg.model.lora().is_some();
    // A LoRA run holds its frozen projections in the compute dtype
    // (`CausalLm::hold_frozen_in_compute_dtype`); everything else in f32.
    let frozen_matrices = if lora {
        let head = if m.tie_word_embeddings {
            0
        } else {
            m.head_matmul_params()
        };
        (m.layer_matmul_params() + head).max(0) as u64
    } else {
        0
    };
    let weights = (params - frozen_matrices.min(params)) * f32 + frozen_matrices * compute_bytes;
    // Sharded, each rank keeps its slices (f32 master, gradient, two moments: 16 bytes per
    // parameter over the world size) and the weights outside the decoder layers whole; a layer
    // is whole while it runs (and, in a ZeRO-2 update, all of them).
    let world64 = world.max(1) as u64;
    let (outside, layer) = trainable_outside_and_per_layer(cfg, m);
    let (weights, slices) = if place.sharded {
        (
            weights - trainable * f32 + outside * f32,
            16 * trainable.div_ceil(world64),
        )
    } else {
        (weights, 0)
    };
    let on_device_slices = if place.offload && on_cuda(cfg) {
        0
    } else {
        slices
    };
    let mut resident = vec![
        ("weights", weights),
        (
            "AdamW moments",
            if place.sharded {
                0
            } else {
                2 * trainable * f32
            },
        ),
        ("sharded state", on_device_slices),
        // A LoRA run's reference is its own frozen base with the adapters off: no copy.
        (
            "reference",
            if needs_reference && !lora {
                params * f32
            } else {
                0
            },
        ),
        (
            "rollout.device copy",
            if cfg.rollout.device.is_empty() {
                0
            } else {
                params * f32
            },
        ),
    ];
    // In-process overlap: the sampler thread's own copy of the policy (counted here unless it
    // lives on rollout.device), and a snapshot of the weights queued for it after each update.
    if cfg.rollout.async_steps > 0 && !cfg.rollout.is_remote() {
        if cfg.rollout.device.is_empty() {
            resident.push(("async sampler copy", params * f32));
        }
        resident.push(("weight snapshot", params * f32));
    }
    // The in-process engine: its copy of the weights and a KV cache for the rows in flight, both
    // in the compute dtype.
    // On CUDA the engine keeps both between rollouts, through the updates: its decode steps,
    // captured as CUDA graphs, read them where they are. Its cache there has a bucket of rows (a
    // power of two) of whole 256-position blocks (`temper_model::static_decode`).
    let rollout = if cfg.rollout.is_remote() {
        vec![]
    } else {
        // Each rank samples its share of the prompts.
        let prompts = (cfg.data.train_batch_size as u64).div_ceil(world.max(1) as u64);
        let rows = (cfg.rollout.max_num_seqs as u64).min(prompts * n);
        let kv_per_token = 2
            * (m.num_hidden_layers * m.num_key_value_heads * m.head_dim).max(0) as u64
            * compute_bytes;
        let logits = ("logits", rows * m.vocab_size.max(0) as u64 * f32);
        if samples_on_cuda(cfg) {
            let slots = temper_model::static_decode::bucket_for(rows as usize) as u64;
            let step = temper_model::static_decode::CAPACITY_STEP as u64;
            let positions = (prompt + response).div_ceil(step) * step;
            resident.push(("sampling copy", params * compute_bytes));
            resident.push(("KV cache", slots * positions * kv_per_token));
            vec![logits]
        } else {
            vec![
                ("sampling copy", params * compute_bytes),
                ("KV cache", rows * (prompt + response) * kv_per_token),
                logits,
            ]
        }
    };
    // One micro-batch with autograd: with shared prefixes each group's prompt runs once.
    let mini_rows = (cfg.actor.ppo_mini_batch_size * cfg.rollout.n).div_ceil(world.max(1));
    let micro = cfg
        .actor
        .ppo_micro_batch_size_per_gpu
        .unwrap_or(mini_rows)
        .min(mini_rows)
        .max(1) as u64;
    // An environment's datum may be a whole transcript (a debater's: five answers and two round
    // instructions after the question, its prompt naming its side): the registry says.
    let shape = if cfg.env.enabled() {
        temper_env::datum_shape(&cfg.env.name)
    } else {
        temper_env::DatumShape::ONE_TURN
    };
    let response = shape.answers * response + shape.extra_tokens;
    let prompt_rows = if shape.shared_prompt && cfg.actor.shared_prefix {
        micro.div_ceil(n)
    } else {
        micro
    };
    let tokens = micro * response + prompt_rows * prompt;
    let columns = head_columns(cfg, m);
    let default_chunk = temper_model::default_unembed_chunk(columns as i64);
    let chunk = (cfg.actor.unembed_chunk_or(default_chunk) as u64)
        .min(micro * response)
        .max(1);
    // Attention keeps (query x key) matrices per layer and head for the backward, which grow
    // with the square of the length: the prompts against themselves, the responses against
    // prompt and response. 6 bytes per entry fits the measured peaks (BENCHMARKS.md, "Memory
    // estimate").
    let per_entry = 6 * (m.num_hidden_layers * m.num_attention_heads).max(0) as u64;
    let attention =
        per_entry * (prompt_rows * prompt * prompt + micro * response * (prompt + response));
    // Checkpointing keeps each layer's input (one f32 hidden vector per layer and token) and one
    // layer's activations and attention at a time.
    let layers = m.num_hidden_layers.max(1) as u64;
    let (activations, attention) = if cfg.actor.gradient_checkpointing {
        let kept = layers * m.hidden_size.max(0) as u64 * f32;
        let per_token = m.activation_bytes_per_token() / layers + kept;
        (tokens * per_token, attention / layers)
    } else {
        (tokens * m.activation_bytes_per_token(), attention)
    };
    // Gradients exist from a mini-batch's first backward to its optimizer step; they are
    // dropped after it (`clear_grads`), so the rollouts never hold them. A per-layer sharded
    // update holds whole (with gradients) what is outside the layers and one layer at a time.
    let (update_weights, gradients) = match (place.sharded, place.per_layer) {
        (false, _) => (0, trainable * f32),
        (true, false) => (trainable * f32, trainable * f32),
        (true, true) => (layer * f32, (outside + layer) * f32),
    };
    // Sharded, outside the update the layers are gathered one at a time (the sampler's copies
    // are built layer by layer, the old and reference passes run layer by layer).
    let mut rollout = rollout;
    if place.sharded {
        rollout.push(("gathered layer", layer * f32));
    }
    let update = vec![
        ("gathered weights", update_weights),
        ("gradients", gradients),
        ("activations", activations),
        ("attention", attention),
        // A chunk's logits, their softmax and their gradient: a block of the vocabulary wide
        // (`temper_model::vocab_blocks`) unless LoRA adapts the head.
        ("logits chunk", 3 * chunk * columns * f32),
    ];
    let host = vec![(
        "offloaded state",
        if place.offload && on_cuda(cfg) {
            slices
        } else {
            0
        },
    )];
    MemoryEstimate {
        resident,
        rollout,
        update,
        host,
    }
}

/// Whether the trainer computes on CUDA.
fn on_cuda(cfg: &Config) -> bool {
    cfg.trainer.device == crate::config::TrainerDevice::Cuda
}

/// Whether the in-process engine samples on CUDA (`rollout.device`, else `trainer.device`).
fn samples_on_cuda(cfg: &Config) -> bool {
    match cfg.rollout.device.is_empty() {
        true => cfg.trainer.device == crate::config::TrainerDevice::Cuda,
        false => cfg.rollout.device.starts_with("cuda"),
    }
}

/// The vocabulary columns of logits the update's head holds per token at a time.
fn head_columns(cfg: &Config, m: &ModelConfig) -> u64 {
    let lora_on_head = cfg.model.lora().is_some_and(|l| {
        l.target_modules
            .iter()
            .any(|t| t == temper_model::LORA_HEAD)
    });
    temper_model::vocab_blocks::logit_columns(m.vocab_size, lora_on_head).max(0) as u64
}

/// Prints the estimate (rank 0) and refuses a config whose estimate exceeds the memory there is
/// for each rank: on the CPU this machine's available memory over its `local_ranks` processes,
/// on CUDA the device's. Printed only for environment runs, whose transcripts the config does
/// not bound (a debate's question is as long as its article), so their estimate is a guide.
pub(crate) fn check(
    cfg: &Config,
    m: &ModelConfig,
    compute: ComputeKind,
    world: usize,
    local_ranks: usize,
    device: tch::Device,
    root: bool,
) -> Result<()> {
    let est = estimate(cfg, m, compute, world);
    if root {
        eprintln!("temper: estimated peak memory per rank: {}", est.describe());
    }
    if !cfg.trainer.check_memory || cfg.env.enabled() {
        return Ok(());
    }
    let room = match device {
        tch::Device::Cuda(i) => {
            temper_kernels::memory::cuda_memory_bytes(i).map(|(_, total)| Room {
                bytes: total,
                ranks: 1,
                place: format!("cuda:{i} has"),
            })
        }
        _ => temper_kernels::memory::available_bytes().map(|bytes| Room {
            bytes,
            ranks: local_ranks,
            place: "this machine has".into(),
        }),
    };
    match room {
        Some(room) => fits(&est, &room, &remedies(cfg, m, compute, world, &room)),
        None => Ok(()),
    }
}

/// The memory a rank may use: `bytes` shared by `ranks` processes, where `place` says.
struct Room {
    bytes: u64,
    ranks: usize,
    place: String,
}

impl Room {
    fn share(&self) -> u64 {
        self.bytes / self.ranks.max(1) as u64
    }
}

/// The settings that would make the run fit `room`, by the same estimate: sharding over more
/// ranks, offloading the optimizer, checkpointing the layers.
fn remedies(
    cfg: &Config,
    m: &ModelConfig,
    compute: ComputeKind,
    world: usize,
    room: &Room,
) -> Vec<String> {
    let fits_with = |c: &Config, w: usize| estimate(c, m, compute, w).peak() <= room.share();
    let mut out = vec![];
    let mut sharded = cfg.clone();
    sharded.actor.strategy = crate::config::Strategy::Fsdp;
    if let Some(w) = [2usize, 4, 8, 16, 32, 64]
        .into_iter()
        .filter(|&w| w >= world)
        .find(|&w| fits_with(&sharded, w))
    {
        if cfg.actor.strategy != crate::config::Strategy::Fsdp || w > world {
            out.push(format!("actor.strategy=fsdp over >= {w} ranks"));
        }
    }
    let mut offload = sharded.clone();
    offload.actor.fsdp_config.optimizer_offload = true;
    if on_cuda(cfg) && !cfg.actor.fsdp_config.optimizer_offload && fits_with(&offload, world) {
        out.push(match cfg.actor.strategy {
            crate::config::Strategy::Fsdp => "actor.fsdp_config.optimizer_offload=true".into(),
            _ => "actor.strategy=fsdp with actor.fsdp_config.optimizer_offload=true".into(),
        });
    }
    let mut checkpointed = cfg.clone();
    checkpointed.actor.gradient_checkpointing = true;
    if !cfg.actor.gradient_checkpointing && fits_with(&checkpointed, world) {
        out.push("actor.gradient_checkpointing=true".into());
    }
    out.push(
        "lower actor.ppo_micro_batch_size_per_gpu, rollout.max_num_seqs or the lengths".into(),
    );
    out
}

/// Whether `est` fits each rank's share of `room`; else the error, with `remedies`.
fn fits(est: &MemoryEstimate, room: &Room, remedies: &[String]) -> Result<()> {
    let share = room.share();
    if est.peak() > share {
        bail!(
            "this config needs about {} per rank, and {} {}{}: {}; or set trainer.check_memory = false to \
             run anyway (estimate: {})",
            gib(est.peak()),
            room.place,
            gib(room.bytes),
            if room.ranks > 1 {
                format!(" for {} ranks ({} each)", room.ranks, gib(share))
            } else {
                String::new()
            },
            remedies.join(", or "),
            est.describe()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SmolLM2-135M's shape.
    fn smollm2() -> ModelConfig {
        ModelConfig::from_json_str(
            r#"{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 49152,
                "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
                "num_attention_heads": 9, "num_key_value_heads": 3, "rms_norm_eps": 1e-5,
                "rope_theta": 100000, "tie_word_embeddings": true}"#,
        )
        .unwrap()
    }

    fn config(overrides: &[&str]) -> Config {
        let ov: Vec<String> = ["model.path=\"smollm2\"", "data.task=arith"]
            .iter()
            .chain(overrides)
            .map(|s| s.to_string())
            .collect();
        crate::config::load_config(None, &ov).unwrap().config
    }

    /// The main job's shape (examples/arith-smollm2.toml): 3.38 GiB measured (peak RSS of 3
    /// steps, f32, a 2-core AMD EPYC, 2026-11-27: 3.36 and 3.40 with the head a vocabulary block
    /// at a time and freed memory kept for the next step; 3.64 before the MLP's saved activations
    /// halved); the estimate is within 10% above it.
    #[test]
    fn the_main_job_is_estimated_within_ten_percent_above_its_measured_peak() {
        let cfg = config(&[
            "data.max_prompt_length=96",
            "data.max_response_length=12",
            "data.train_batch_size=8",
            "actor.ppo_mini_batch_size=8",
            "actor.ppo_micro_batch_size_per_gpu=32",
            "rollout.n=8",
        ]);
        let est = estimate(&cfg, &smollm2(), ComputeKind::F32, 1);
        let measured = 3.38 * (1u64 << 30) as f64;
        let ratio = est.peak() as f64 / measured;
        assert!((1.0..1.1).contains(&ratio), "{ratio}: {}", est.describe());
    }

    /// LoRA trains its adapters only: gradients and moments shrink to them.
    #[test]
    fn lora_holds_the_adapters_gradients_only() {
        let full = estimate(&config(&[]), &smollm2(), ComputeKind::F32, 1);
        let lora = estimate(
            &config(&["model.lora_rank=32", "model.target_modules=all-linear"]),
            &smollm2(),
            ComputeKind::F32,
            1,
        );
        let grads = |e: &MemoryEstimate| e.update.iter().find(|p| p.0 == "gradients").unwrap().1;
        // all-linear at rank 32 on SmolLM2: 32 x (in + out) per linear, 30 layers.
        let adapters = 30 * 32 * (2 * (576 + 576) + 2 * (576 + 192) + 3 * (576 + 1536)) as u64;
        assert_eq!(grads(&lora), 4 * adapters);
        assert!(grads(&full) > 10 * grads(&lora));
    }

    /// An environment's datum shape comes from temper-env's registry: a debater's datum is its
    /// transcript (five answers and two instructions, no shared prompt), a one-turn task's a
    /// prompt and one answer.
    #[test]
    fn a_debates_datums_are_estimated_as_its_transcripts() {
        let tokens = |name: &str| {
            let cfg = config(&[
                &format!("env.name={name}"),
                "data.max_prompt_length=100",
                "data.max_response_length=10",
                "rollout.n=4",
                "actor.ppo_micro_batch_size_per_gpu=4",
            ]);
            let e = estimate(&cfg, &smollm2(), ComputeKind::F32, 1);
            e.update.iter().find(|p| p.0 == "activations").unwrap().1
                / smollm2().activation_bytes_per_token()
        };
        // qa: 4 answers of 10 tokens after one shared 100-token prompt; debate: 4 transcripts of
        // 5 x 10 + 128 tokens after 4 prompts.
        assert_eq!(tokens("qa"), 4 * 10 + 100);
        assert_eq!(tokens("debate"), 4 * (5 * 10 + 128) + 4 * 100);
    }

    /// The sampling copy and the KV cache are in the compute dtype (bf16: half of f32); what
    /// stays f32 (weights, AdamW moments, gradients) does not change with it.
    /// Sampling on CUDA keeps the engine's copy and its fixed-shape cache through the update.
    #[test]
    fn on_cuda_the_sampling_copy_and_cache_stay() {
        let cpu = estimate(&config(&[]), &smollm2(), ComputeKind::Bf16, 1);
        let cuda = estimate(
            &config(&["trainer.device=\"cuda\""]),
            &smollm2(),
            ComputeKind::Bf16,
            1,
        );
        let names = |parts: &[(&'static str, u64)]| parts.iter().map(|p| p.0).collect::<Vec<_>>();
        assert!(names(&cpu.rollout).contains(&"KV cache"));
        assert!(!names(&cpu.resident).contains(&"KV cache"));
        assert!(names(&cuda.resident).contains(&"sampling copy"));
        assert!(names(&cuda.resident).contains(&"KV cache"));
        assert_eq!(names(&cuda.rollout), ["logits"]);
        assert!(cuda.peak() > cpu.peak());
    }

    #[test]
    fn the_sampling_copy_and_kv_cache_follow_the_compute_dtype() {
        let cfg = config(&[]);
        let f32 = estimate(&cfg, &smollm2(), ComputeKind::F32, 1);
        let bf16 = estimate(&cfg, &smollm2(), ComputeKind::Bf16, 1);
        let part = |e: &MemoryEstimate, name: &str| {
            let all = e.resident.iter().chain(&e.rollout).chain(&e.update);
            all.filter(|p| p.0 == name).map(|p| p.1).sum::<u64>()
        };
        for name in ["sampling copy", "KV cache"] {
            assert!(part(&f32, name) > 0, "{name}");
            assert_eq!(part(&bf16, name) * 2, part(&f32, name), "{name}");
        }
        for name in ["weights", "AdamW moments", "gradients"] {
            assert_eq!(part(&bf16, name), part(&f32, name), "{name}");
        }
        assert_eq!(
            part(&f32, "sampling copy"),
            4 * smollm2().num_params() as u64
        );
    }

    #[test]
    fn a_peak_over_the_share_of_each_local_rank_is_refused_with_the_numbers() {
        let est = estimate(&config(&[]), &smollm2(), ComputeKind::F32, 1);
        let gib = 1u64 << 30;
        let room = |ranks| Room {
            bytes: est.peak() + gib,
            ranks,
            place: "this machine has".into(),
        };
        assert!(fits(&est, &room(1), &[]).is_ok());
        let e = fits(&est, &room(2), &["lower it".into()])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("this config needs about")
                && e.contains("for 2 ranks")
                && e.contains(": lower it; or set trainer.check_memory = false")
                && e.contains("weights"),
            "{e}"
        );
    }

    /// A published config.json (tests/fixtures/shapes).
    fn shape(name: &str) -> ModelConfig {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/shapes");
        ModelConfig::from_file(&dir.join(format!("{name}.json"))).unwrap()
    }

    /// The workload of docs/scaling.md's table: GRPO on CUDA in bf16, 64 prompts of up to 512
    /// tokens per step, 8 responses of up to 1,024 tokens each, at most 64 sampled at once per
    /// rank, 4 responses per micro-batch, checkpointed layers.
    const WORKLOAD: [&str; 10] = [
        "trainer.device=\"cuda\"",
        "model.dtype=\"bfloat16\"",
        "data.max_prompt_length=512",
        "data.max_response_length=1024",
        "rollout.n=8",
        "data.train_batch_size=64",
        "actor.ppo_mini_batch_size=64",
        "actor.ppo_micro_batch_size_per_gpu=4",
        "rollout.max_num_seqs=64",
        "actor.gradient_checkpointing=true",
    ];

    const GIB80: u64 = 80 << 30;

    /// The table docs/scaling.md shows: the plan's peak per rank (GiB) for each model, full and
    /// LoRA, strategy and world size; `*` where it exceeds an 80 GB GPU.
    fn scaling_table() -> String {
        let mut out = String::from(
            "| model | training | strategy | 1 GPU | 2 GPUs | 4 GPUs | 8 GPUs |\n|---|---|---|---|---|---|---|\n",
        );
        for name in [
            "Qwen2.5-0.5B-Instruct",
            "Qwen2.5-1.5B-Instruct",
            "Qwen2.5-3B-Instruct",
            "Qwen2.5-7B-Instruct",
            "Qwen3-8B",
        ] {
            let m = shape(name);
            for (mode, lora) in [
                ("full", &[][..]),
                (
                    "LoRA r32",
                    &["model.lora_rank=32", "model.target_modules=all-linear"][..],
                ),
            ] {
                for (strategy, keys) in [
                    ("dp", &["actor.strategy=dp"][..]),
                    ("fsdp", &["actor.strategy=fsdp"][..]),
                    (
                        "fsdp + offload",
                        &[
                            "actor.strategy=fsdp",
                            "actor.fsdp_config.optimizer_offload=true",
                        ][..],
                    ),
                ] {
                    let overrides: Vec<&str> = WORKLOAD
                        .iter()
                        .copied()
                        .chain(lora.iter().copied())
                        .chain(keys.iter().copied())
                        .collect();
                    let cfg = config(&overrides);
                    let cells: Vec<String> = [1, 2, 4, 8]
                        .iter()
                        .map(|&w| {
                            let peak = estimate(&cfg, &m, ComputeKind::Bf16, w).peak();
                            let mark = if peak > GIB80 { " *" } else { "" };
                            format!("{:.1}{mark}", peak as f64 / (1u64 << 30) as f64)
                        })
                        .collect();
                    out.push_str(&format!(
                        "| {name} | {mode} | {strategy} | {} |\n",
                        cells.join(" | ")
                    ));
                }
            }
        }
        out
    }

    /// docs/scaling.md shows the table this plan computes (regenerate it with
    /// `cargo test -p temper-train --lib scaling_table -- --nocapture` and paste).
    #[test]
    fn docs_scaling_table_is_the_plans() {
        let table = scaling_table();
        println!("{table}");
        let docs = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/scaling.md"),
        )
        .unwrap();
        assert!(
            docs.contains(&table),
            "docs/scaling.md lacks the table:\n{table}"
        );
    }

    /// Sharded, a rank holds 16 bytes per trainable parameter over the world size, plus (per
    /// layer) what is outside the layers and one layer whole with its gradients; offload moves
    /// the slices to host memory. Qwen2.5-7B in full fits no 80 GB GPU replicated and fits 8 of
    /// them sharded.
    #[test]
    fn sharding_divides_the_trainable_state_by_the_world_size() {
        let m = shape("Qwen2.5-7B-Instruct");
        let part = |e: &MemoryEstimate, name: &str| {
            let all = e
                .resident
                .iter()
                .chain(&e.rollout)
                .chain(&e.update)
                .chain(&e.host);
            all.filter(|p| p.0 == name).map(|p| p.1).sum::<u64>()
        };
        let p = m.num_params() as u64;
        let fsdp = config(&[&WORKLOAD[..], &["actor.strategy=fsdp"]].concat());
        for w in [2u64, 4, 8] {
            let e = estimate(&fsdp, &m, ComputeKind::Bf16, w as usize);
            assert_eq!(part(&e, "sharded state"), 16 * p.div_ceil(w));
            assert_eq!(part(&e, "AdamW moments"), 0);
        }
        let e8 = estimate(&fsdp, &m, ComputeKind::Bf16, 8);
        let emb = (m.vocab_size * m.hidden_size) as u64;
        let layer = (p - 2 * emb - m.hidden_size as u64).div_ceil(28);
        let outside = 2 * emb + m.hidden_size as u64;
        assert_eq!(part(&e8, "gathered weights"), 4 * layer);
        assert_eq!(part(&e8, "gradients"), 4 * (outside + layer));
        assert_eq!(part(&e8, "gathered layer"), 4 * layer);
        assert!(e8.peak() < GIB80, "{}", e8.describe());
        let dp = config(&[&WORKLOAD[..], &["actor.strategy=dp"]].concat());
        assert!(estimate(&dp, &m, ComputeKind::Bf16, 8).peak() > GIB80);
        let offload = config(
            &[
                &WORKLOAD[..],
                &[
                    "actor.strategy=fsdp",
                    "actor.fsdp_config.optimizer_offload=true",
                ],
            ]
            .concat(),
        );
        let e = estimate(&offload, &m, ComputeKind::Bf16, 1);
        assert_eq!(part(&e, "sharded state"), 0);
        assert_eq!(part(&e, "offloaded state"), 16 * p);
    }

    /// A run that cannot fit says what would: Qwen2.5-7B replicated on 80 GB GPUs.
    #[test]
    fn a_run_that_does_not_fit_names_the_settings_that_would() {
        let m = shape("Qwen2.5-7B-Instruct");
        let cfg = config(&WORKLOAD);
        let room = Room {
            bytes: GIB80,
            ranks: 1,
            place: "cuda:0 has".into(),
        };
        let est = estimate(&cfg, &m, ComputeKind::Bf16, 1);
        let e = fits(
            &est,
            &room,
            &remedies(&cfg, &m, ComputeKind::Bf16, 1, &room),
        )
        .unwrap_err()
        .to_string();
        println!("{e}");
        assert!(
            e.contains(": actor.strategy=fsdp over >= 4 ranks, or "),
            "{e}"
        );
        assert!(e.starts_with("this config needs about "), "{e}");
        assert!(
            e.contains("per rank, and cuda:0 has 80.00 GiB: actor.strategy=fsdp over >= "),
            "{e}"
        );
        assert!(
            e.contains("or actor.strategy=fsdp with actor.fsdp_config.optimizer_offload=true"),
            "{e}"
        );
    }
}
