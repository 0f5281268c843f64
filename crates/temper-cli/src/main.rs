//! `temper`: reinforcement-learning post-training for language models.
mod cmd;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "temper",
    version,
    about = "RL post-training for LLMs on libtorch"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print per-token logprobs of a text under a model, and the top-5 next tokens.
    Score(cmd::score::Args),
    /// Convert a GGUF file into a Hugging Face folder (safetensors + config + tokenizer).
    Convert(cmd::convert::Args),
    /// Run the algorithm test vectors in a folder (see VECTORS.md).
    CheckVectors(cmd::check_vectors::Args),
    /// Grade predictions against gold answers with the math grader.
    Grade(cmd::grade::Args),
    /// Sample completions with the rollout engine (n per prompt, logprob of every token).
    Sample(cmd::sample::Args),
    /// Sample, recompute the logprobs teacher-forced like the trainer, and compare.
    CheckLogprobs(cmd::check_logprobs::Args),
    /// Join a process group (one rank, or torchrun's) and check all_reduce, broadcast, all_gather.
    CheckDist(cmd::check_dist::Args),
    /// Train a policy with GRPO & co. from a TOML config (`--resume RUN_DIR` continues a run).
    Train(cmd::train::Args),
    /// Draw a run's curves (reward, accuracy, KL, entropy, length, loss) to PNG + one HTML page.
    Report(cmd::report::Args),
    /// Benchmarks (not tests): `temper bench train`.
    Bench(cmd::bench::Args),
    /// Serve a model over HTTP: OpenAI-compatible /v1/*, SGLang's /generate and Tinker's API.
    Serve(cmd::serve::Args),
}

/// The libraries' `tracing` warnings print on stderr, one line each; `RUST_LOG` (e.g.
/// `RUST_LOG=debug`, `RUST_LOG=temper_reward=info`) chooses more or less.
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .without_time()
        .try_init();
}

fn main() {
    // Before anything can reach libtorch's oneDNN (see the function).
    temper_kernels::memory::bound_onednn_caches();
    init_logging();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Score(a) => cmd::score::run(a),
        Command::Convert(a) => cmd::convert::run(a),
        Command::CheckVectors(a) => cmd::check_vectors::run(a),
        Command::Grade(a) => cmd::grade::run(a),
        Command::Sample(a) => cmd::sample::run(a),
        Command::CheckLogprobs(a) => cmd::check_logprobs::run(a),
        Command::CheckDist(a) => cmd::check_dist::run(a),
        Command::Train(a) => cmd::train::run(a),
        Command::Report(a) => cmd::report::run(a),
        Command::Bench(a) => cmd::bench::run(a),
        Command::Serve(a) => cmd::serve::run(a),
    };
    if let Err(e) = result {
        // One line: the chain of contexts, outermost first.
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
