//! `temper report RUN_DIR`: curves of a run as PNG files and a self-contained HTML page.
use anyhow::Result;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// A run folder (holds metrics.jsonl).
    run_dir: PathBuf,
    /// Output folder (default: RUN_DIR/report).
    #[arg(long)]
    out: Option<PathBuf>,
}

pub fn run(args: Args) -> Result<()> {
    let index = temper_train::report::render_report(&args.run_dir, args.out.as_deref())?;
    println!("{}", index.display());
    Ok(())
}
