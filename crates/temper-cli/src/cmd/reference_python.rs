//! Where the benchmarks find their Python side: the repository's venv and `tools/` scripts.
use anyhow::{bail, Context, Result};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

/// The repository root: `$TEMPER_ROOT`, else the source tree this binary was built from.
fn repo_root() -> PathBuf {
    match std::env::var_os("TEMPER_ROOT").filter(|v| !v.is_empty()) {
        Some(r) => PathBuf::from(r),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.."),
    }
}

/// The Python to run (`--python`, else the repository's `.venv/bin/python`) and the path of
/// `tools/<script>`, which must exist.
pub fn python_and_script(python: Option<&Path>, script: &str) -> Result<(PathBuf, PathBuf)> {
    let root = repo_root();
    let python = python
        .map(Path::to_path_buf)
        .unwrap_or_else(|| root.join(".venv/bin/python"));
    let script = root.join("tools").join(script);
    if !script.is_file() {
        bail!(
            "{} not found (set TEMPER_ROOT to the repository)",
            script.display()
        );
    }
    Ok((python, script))
}

/// A Python reference running as a worker process (`python tools/<script> ARGS`): it prints one
/// JSON line when it is ready, then answers each request line on its stdin with one JSON line
/// (`{"error": ...}` on failure). Killed when dropped.
pub struct PyWorker {
    script: String,
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl PyWorker {
    /// Start `tools/<script>` with `args` under `python` (see [`python_and_script`]) and wait for
    /// its ready line, which is returned.
    pub fn start(
        python: Option<&Path>,
        script: &str,
        args: &[String],
    ) -> Result<(Self, serde_json::Value)> {
        let (python, path) = python_and_script(python, script)?;
        let mut child = Command::new(&python)
            .arg(&path)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {} {}", python.display(), path.display()))?;
        let stdin = child.stdin.take().context("worker stdin")?;
        let stdout = BufReader::new(child.stdout.take().context("worker stdout")?);
        let mut worker = PyWorker {
            script: format!("tools/{script}"),
            child,
            stdin,
            stdout,
        };
        let ready = worker.read()?;
        Ok((worker, ready))
    }

    /// Send one request line and return the reply.
    pub fn request(&mut self, line: &str) -> Result<serde_json::Value> {
        writeln!(self.stdin, "{line}")
            .and_then(|_| self.stdin.flush())
            .with_context(|| format!("{} stopped reading requests", self.script))?;
        self.read()
    }

    fn read(&mut self) -> Result<serde_json::Value> {
        let mut line = String::new();
        if self.stdout.read_line(&mut line)? == 0 {
            bail!(
                "{} exited early (run it by hand to see its error)",
                self.script
            );
        }
        let v: serde_json::Value = serde_json::from_str(&line)
            .with_context(|| format!("{} said {line:?}", self.script))?;
        if let Some(e) = v.get("error") {
            bail!("{}: {e}", self.script);
        }
        Ok(v)
    }
}

impl Drop for PyWorker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
