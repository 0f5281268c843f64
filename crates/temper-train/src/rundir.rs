//! The run directory: one folder per run holding everything needed to reproduce and inspect it.
//!
//! ```text
//! <run>/config.toml          resolved config (all keys)
//! <run>/run_metadata.json    temper version, git commit, host, seed, start time, command line
//! <run>/metrics.jsonl        one JSON object per step (verl metric names)
//! <run>/rollouts/step_<k>.jsonl
//! <run>/eval/step_<k>.json
//! <run>/checkpoints/global_step_<k>/
//! ```
//! Files are written atomically (temporary file + rename); metrics are appended a line at a time
//! and fsynced.
use anyhow::{Context, Result};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Writes `bytes` to `path` through a temporary sibling and a rename, so readers never see a
/// partial file (temper-model's one atomic file writer), creating the folder first.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    temper_base::atomic_file::write_atomic(path, bytes)
}

/// [`write_atomic`] of pretty JSON.
pub fn write_json(path: &Path, v: &Value) -> Result<()> {
    write_atomic(path, serde_json::to_string_pretty(v)?.as_bytes())
}

#[derive(Debug, Clone)]
pub struct RunDir {
    pub root: PathBuf,
}

impl RunDir {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// A fresh scratch folder for rank `rank` > 0 of a data-parallel job, which owns no run
    /// folder (rank 0 does); removed when the rank's `fit` ends.
    pub fn scratch_for_rank(rank: usize) -> anyhow::Result<Self> {
        static MADE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let k = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let root = std::env::temp_dir().join(format!(
            "temper-rank{rank}-{}-{k}-{}",
            std::process::id(),
            compact_timestamp()
        ));
        std::fs::create_dir_all(&root)
            .map_err(|e| anyhow::anyhow!("rank {rank}: creating {}: {e}", root.display()))?;
        Ok(Self::new(root))
    }
    pub fn config(&self) -> PathBuf {
        self.root.join("config.toml")
    }
    pub fn metadata(&self) -> PathBuf {
        self.root.join("run_metadata.json")
    }
    pub fn metrics(&self) -> PathBuf {
        self.root.join("metrics.jsonl")
    }
    pub fn rollouts(&self, step: usize) -> PathBuf {
        self.root
            .join("rollouts")
            .join(format!("step_{step}.jsonl"))
    }
    pub fn eval(&self, step: usize) -> PathBuf {
        self.root.join("eval").join(format!("step_{step}.json"))
    }
    pub fn checkpoints(&self) -> PathBuf {
        self.root.join("checkpoints")
    }

    /// Appends one metrics line (`step` first, then the metrics sorted by name) and fsyncs.
    pub fn append_metrics(&self, step: usize, metrics: &BTreeMap<String, f64>) -> Result<()> {
        let mut obj = serde_json::Map::new();
        obj.insert("step".into(), json!(step));
        for (k, v) in metrics {
            // JSON has no NaN/inf: write them as null rather than produce an unreadable line.
            obj.insert(
                k.clone(),
                if v.is_finite() { json!(v) } else { Value::Null },
            );
        }
        let line = serde_json::to_string(&Value::Object(obj))? + "\n";
        let path = self.metrics();
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        f.write_all(line.as_bytes())
            .and_then(|_| f.sync_data())
            .with_context(|| format!("appending to {}", path.display()))
    }

    /// Keeps only the metric lines of steps `< next_step` (a resumed run rewrites what follows the
    /// checkpoint, so the file never holds two lines for one step).
    pub fn truncate_metrics(&self, next_step: usize) -> Result<()> {
        let path = self.metrics();
        let Ok(text) = std::fs::read_to_string(&path) else {
            return Ok(());
        };
        let kept: String = text
            .lines()
            .filter(|l| {
                serde_json::from_str::<Value>(l)
                    .ok()
                    .and_then(|v| v.get("step").and_then(Value::as_u64))
                    .is_some_and(|s| (s as usize) < next_step)
            })
            .map(|l| format!("{l}\n"))
            .collect();
        write_atomic(&path, kept.as_bytes())
    }

    /// Reads every metrics line.
    pub fn read_metrics(&self) -> Result<Vec<BTreeMap<String, Value>>> {
        read_metrics(&self.metrics())
    }
}

pub fn read_metrics(path: &Path) -> Result<Vec<BTreeMap<String, Value>>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).with_context(|| format!("{} line {}", path.display(), i + 1))
        })
        .collect()
}

/// What `run_metadata.json` records.
pub fn run_metadata(seed: u64, command_line: &[String]) -> Value {
    let git = std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    json!({
        "temper_version": env!("CARGO_PKG_VERSION"),
        "git_commit": git,
        "host": host,
        "seed": seed,
        "start_time": utc_timestamp(now.as_secs()),
        "start_unix": now.as_secs(),
        "command_line": command_line,
        "torch_threads": tch::get_num_threads(),
    })
}

/// `YYYY-MM-DDTHH:MM:SSZ` for a Unix time (civil-from-days, proleptic Gregorian).
pub fn utc_timestamp(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (y, m, d) = temper_model::chat_template::civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// `20261122-013000` for folder names.
pub fn compact_timestamp() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    utc_timestamp(secs)
        .replace(['-', ':'], "")
        .replace('T', "-")
        .trim_end_matches('Z')
        .to_string()
}

#[cfg(test)]
mod tests {
    /// Against Python's `datetime.fromtimestamp(t, timezone.utc)`.
    #[test]
    fn utc_timestamps_match_python() {
        for (t, want) in [
            (0, "1970-01-01T00:00:00Z"),
            (1709210096, "2024-02-29T12:34:56Z"),
            (1795700000, "2026-11-26T13:33:20Z"),
            (4102444799, "2099-12-31T23:59:59Z"),
        ] {
            assert_eq!(super::utc_timestamp(t), want);
        }
    }
}
