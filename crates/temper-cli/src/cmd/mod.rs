//! One file per subcommand; each exposes `Args` (clap) and `run(Args) -> anyhow::Result<()>`.
pub mod bench;
pub mod bench_grade;
pub mod bench_grpo;
pub mod bench_rollouts;
pub mod bench_sample;
pub mod bench_serve;
pub mod bench_tinker;
pub mod bench_train;
pub mod check_logprobs;
pub mod check_vectors;
pub mod convert;
pub mod grade;
mod launch;
pub mod report;
pub mod sample;
pub mod score;
pub mod serve;
pub mod train;
