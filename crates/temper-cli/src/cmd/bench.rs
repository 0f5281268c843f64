//! `temper bench <what>`: benchmarks, each side by side with the Python reference in the same run.
//! Not tests: results go to BENCHMARKS.md.

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: What,
}

#[derive(clap::Subcommand)]
enum What {
    /// forward+backward+AdamW tok/s vs PyTorch/transformers (f32 and bf16).
    Train(super::bench_train::Args),
    /// Decode tok/s vs transformers `generate`.
    Sample(super::bench_sample::Args),
    /// Graded pairs per second on GSM8K.
    Grade(super::bench_grade::Args),
    /// Wall time per GRPO step vs TRL's GRPOTrainer.
    Grpo(super::bench_grpo::Args),
    /// The main job's steps with rollouts in process vs on `temper serve` (with and without overlap).
    Rollouts(super::bench_rollouts::Args),
    /// The Tinker API's server overhead: the same GRPO steps through the SDK vs in process.
    Tinker(super::bench_tinker::Args),
}

pub fn run(args: Args) -> anyhow::Result<()> {
    match args.what {
        What::Train(a) => super::bench_train::run(a),
        What::Sample(a) => super::bench_sample::run(a),
        What::Grade(a) => super::bench_grade::run(a),
        What::Grpo(a) => super::bench_grpo::run(a),
        What::Rollouts(a) => super::bench_rollouts::run(a),
        What::Tinker(a) => super::bench_tinker::run(a),
    }
}
