//! `temper check-vectors DIR`: run the algorithm test vectors of a folder (VECTORS.md) against
//! temper's implementation, e.g. numbers dumped from a verl, TRL or CS336 setup.

use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// Folder of JSON cases (searched recursively for *.json).
    pub dir: PathBuf,
}

/// Prints one line per case and `N passed, M failed`; an error (exit code 1) when any case fails
/// or the folder holds no case.
pub fn run(args: Args) -> anyhow::Result<()> {
    let report = temper_algo::run_vectors(&args.dir)?;
    println!("{report}");
    if report.cases.is_empty() {
        anyhow::bail!("no *.json case in {}", args.dir.display());
    }
    if report.failed() > 0 {
        anyhow::bail!(
            "{} of {} vector cases failed",
            report.failed(),
            report.cases.len()
        );
    }
    Ok(())
}
