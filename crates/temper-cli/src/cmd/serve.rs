//! `temper serve --model M [--host 127.0.0.1] [--port 30000] [--api-key K]`.
use std::net::{IpAddr, SocketAddr};

use anyhow::{Context, Result};
use temper_model::{ComputeKind, Tokenizer};
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
    /// Compute dtype: f32 or bf16.
    #[arg(long, default_value = "f32")]
    dtype: ComputeKind,
    /// Most sequences decoded together.
    #[arg(long, default_value_t = 64)]
    max_num_seqs: usize,
}

pub fn run(args: Args) -> Result<()> {
    let dir = temper_model::resolve::resolve_model(&args.model).context("--model")?;
    let worker = Worker::start(&dir, args.dtype, args.max_num_seqs)?;
    let state = AppState {
        worker,
        model_name: args.served_model_name.unwrap_or(args.model),
        api_key: args.api_key,
        tokenizer: Tokenizer::from_dir(&dir).ok(),
    };
    serve_blocking(SocketAddr::new(args.host, args.port), state)
}
