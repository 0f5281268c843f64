//! `temper serve --model M [--host 127.0.0.1] [--port 30000] [--api-key K]`.
use std::net::{IpAddr, SocketAddr};

use anyhow::{Context, Result};
use temper_model::{resolve_compute_kind, Tokenizer};
use temper_serve::{serve_blocking, worker::Worker, AppState};

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
    /// Require `Authorization: Bearer KEY`.
    #[arg(long)]
    api_key: Option<String>,
    /// The name clients use (`/v1/models`, the `model` field); default: the --model argument.
    #[arg(long)]
    served_model_name: Option<String>,
    /// Compute dtype: `auto` (bf16 where bf16 matmuls are native and measured faster, else f32,
    /// as `model.dtype`),
    /// `float32` or `bfloat16`.
    #[arg(long, default_value = "auto")]
    dtype: String,
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
}

pub fn run(args: Args) -> Result<()> {
    let dir = temper_model::resolve::resolve_model(&args.model).context("--model")?;
    if let Some(n) = args.threads {
        tch::set_num_threads(n.max(1) as i32);
    }
    let dtype = resolve_compute_kind(&args.dtype, tch::Device::Cpu).context("--dtype")?;
    if let Some(note) = &dtype.note {
        eprintln!("temper serve: {note}");
    }
    if let Some(w) = &dtype.warning {
        eprintln!("warning: {w}");
    }
    let compute = dtype.compute;
    let worker = Worker::start(&dir, compute, args.max_num_seqs)?;
    let state = AppState {
        worker,
        model_name: args.served_model_name.unwrap_or(args.model),
        api_key: args.api_key,
        tokenizer: Tokenizer::from_dir(&dir).ok(),
        tinker: std::sync::Arc::new(temper_serve::tinker::Tinker::new(args.root, compute)),
    };
    serve_blocking(SocketAddr::new(args.host, args.port), state)
}
