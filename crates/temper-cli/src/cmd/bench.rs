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
    /// `temper serve` throughput and latency at 1/8/32 clients vs real vLLM on CPU.
    Serve(super::bench_serve::Args),
}

pub fn run(args: Args) -> anyhow::Result<()> {
    match args.what {
        What::Train(a) => super::bench_train::run(a),
        What::Sample(a) => super::bench_sample::run(a),
        What::Grade(a) => super::bench_grade::run(a),
        What::Grpo(a) => super::bench_grpo::run(a),
        What::Rollouts(a) => super::bench_rollouts::run(a),
        What::Tinker(a) => super::bench_tinker::run(a),
        What::Serve(a) => super::bench_serve::run(a),
    }
}

/// The median (NaN for none).
pub(crate) fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The 1, 5 and 15 minute load averages, to say how quiet the machine was.
pub(crate) fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

/// A `temper serve` child process on a free loopback port, killed on drop.
pub(crate) struct ServeChild {
    child: std::process::Child,
    pub url: String,
}

impl ServeChild {
    /// `temper serve --port 0 ARGS...`, once it listens.
    pub(crate) fn start(args: &[String]) -> anyhow::Result<ServeChild> {
        use anyhow::Context;
        use std::io::{BufRead, BufReader};
        let mut child = std::process::Command::new(std::env::current_exe()?)
            .args(["serve", "--port", "0"])
            .args(args)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .context("starting temper serve")?;
        let stderr = child.stderr.take().context("server stderr")?;
        let mut lines = BufReader::new(stderr).lines();
        let url = loop {
            match lines.next() {
                Some(Ok(line)) => {
                    if let Some(addr) = line
                        .strip_prefix("temper serve: ")
                        .and_then(|l| l.split(" on ").nth(1))
                    {
                        break addr.trim().to_string();
                    }
                }
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    anyhow::bail!("temper serve exited before listening");
                }
            }
        };
        // Keep draining stderr so the server never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Ok(ServeChild { child, url })
    }
}

impl ServeChild {
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for ServeChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A bench's scratch folder (`<tmp>/temper-bench-<name>-<pid>`, emptied first), removed when
/// dropped: also when the bench fails half-way, so that its runs' checkpoints do not stay on disk.
pub(crate) struct ScratchDir(pub std::path::PathBuf);

impl ScratchDir {
    pub(crate) fn new(name: &str) -> std::io::Result<Self> {
        let dir = std::env::temp_dir().join(format!("temper-bench-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        Ok(ScratchDir(dir))
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
