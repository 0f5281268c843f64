//! `temper serve --model M [--host 127.0.0.1] [--port 30000] [--api-key K]`.
use std::net::{IpAddr, SocketAddr};

use anyhow::{Context, Result};
use temper_model::{resolve_compute_kind, DtypeRequest, Tokenizer};
use temper_serve::{limits::Limits, serve_blocking, worker::Worker, AppState};

#[derive(clap::Args)]
pub struct Args {
    /// An HF folder, an ORG/NAME in the hub cache, or `smollm2`.
    #[arg(long)]
    model: String,
    /// The address to bind; loopback unless you mean to expose the server.
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    /// 0 picks a free port (printed on start).
    #[arg(long, default_value_t = 30000)]
    port: u16,
    /// Require the key on every API: `Authorization: Bearer KEY` or `X-API-Key: KEY`.
    #[arg(long)]
    api_key: Option<String>,
    /// The name clients use (`/v1/models`, the `model` field); default: the --model argument.
    #[arg(long)]
    served_model_name: Option<String>,
    /// Where the models compute: cpu, cuda or cuda:N (a CUDA build of temper on a machine with
    /// NVIDIA GPUs).
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Compute dtype: `auto` (bf16 where bf16 matmuls are native and measured faster, else f32,
    /// as `model.dtype`),
    /// `float32` or `bfloat16`.
    #[arg(long, default_value = "auto")]
    dtype: DtypeRequest,
    /// Torch intra-op threads (default: libtorch's, one per core). Give the server and a trainer
    /// on the same machine a share each.
    #[arg(long)]
    threads: Option<usize>,
    /// Where the Tinker API keeps checkpoints: `tinker://MODEL/weights/NAME` is
    /// `ROOT/MODEL/weights/NAME`.
    #[arg(long, default_value = "runs/tinker")]
    root: std::path::PathBuf,
    /// Most sequences decoded together.
    #[arg(long, default_value_t = 64)]
    max_num_seqs: usize,
    /// Largest request body in bytes (the Tinker SDK sends forward_backward data in chunks of
    /// up to 5,000,000 bytes).
    #[arg(long, default_value_t = Limits::default().max_request_bytes)]
    max_request_bytes: usize,
    /// Longest prompt + completion in tokens; default: the model's max_position_embeddings.
    #[arg(long)]
    max_model_len: Option<usize>,
    /// Largest `n` (OpenAI, SGLang) or `num_samples` (Tinker) of one request.
    #[arg(long, default_value_t = Limits::default().max_n)]
    max_n: usize,
    /// Most prompts in one request.
    #[arg(long, default_value_t = Limits::default().max_prompts)]
    max_prompts: usize,
    /// Most sampling requests queued or running; beyond it requests are refused as busy (503).
    #[arg(long, default_value_t = Limits::default().max_queued)]
    max_queued_requests: usize,
    /// A Tinker session whose client sent no heartbeat for this long ends, and its models are
    /// freed (the SDK heartbeats every 10 s).
    #[arg(long, default_value_t = 120.0)]
    session_timeout_s: f64,
}

pub fn run(args: Args) -> Result<()> {
    let dir = temper_model::resolve::resolve_model(&args.model).context("--model")?;
    if let Some(n) = args.threads {
        tch::set_num_threads(n.max(1) as i32);
    }
    let device = temper_base::device::parse_device_for("--device", &args.device)?;
    let dtype = resolve_compute_kind(args.dtype, device).context("--dtype")?;
    if let Some(note) = &dtype.note {
        eprintln!("temper serve: {note}");
    }
    if let Some(w) = &dtype.warning {
        eprintln!("warning: {w}");
    }
    let compute = dtype.compute;
    for (flag, v) in [
        ("--max-request-bytes", args.max_request_bytes),
        ("--max-n", args.max_n),
        ("--max-prompts", args.max_prompts),
        ("--max-queued-requests", args.max_queued_requests),
        ("--max-num-seqs", args.max_num_seqs),
        ("--max-model-len", args.max_model_len.unwrap_or(1)),
    ] {
        if v == 0 {
            anyhow::bail!("{flag} = 0: must be at least 1");
        }
    }
    let session_timeout = std::time::Duration::try_from_secs_f64(args.session_timeout_s)
        .ok()
        .filter(|d| !d.is_zero())
        .with_context(|| {
            format!(
                "--session-timeout-s = {}: must be a positive number of seconds",
                args.session_timeout_s
            )
        })?;
    let limits = Limits {
        max_request_bytes: args.max_request_bytes,
        max_n: args.max_n,
        max_prompts: args.max_prompts,
        max_model_len: args.max_model_len.unwrap_or(0),
        max_queued: args.max_queued_requests,
    };
    let worker = Worker::start(&dir, device, compute, args.max_num_seqs, limits)?;
    let pruner = worker.pruner();
    let state = AppState {
        worker,
        model_name: args.served_model_name.unwrap_or(args.model),
        api_key: args.api_key,
        tokenizer: Tokenizer::from_dir_if_present(&dir)?.map(std::sync::Arc::new),
        tinker: temper_serve::tinker::Tinker::new(
            args.root,
            device,
            compute,
            session_timeout,
            pruner,
        ),
    };
    serve_blocking(SocketAddr::new(args.host, args.port), state)
}
