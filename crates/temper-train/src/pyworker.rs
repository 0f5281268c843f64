//! Python helpers run from the repository's venv and `tools/` scripts: the benchmarks' reference
//! sides and the W&B logger's sidecar.
use anyhow::{bail, Context, Result};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

/// How long a benchmark's Python side may take to answer one request (a whole timed run of the
/// reference on a slow CPU).
pub const BENCH_REPLY_TIMEOUT: Duration = Duration::from_secs(3600);

/// The Python to run ([`temper_base::python::python`]'s rule: `--python` first) and the path of
/// `tools/<script>`, which must exist.
pub fn python_and_script(python: Option<&Path>, script: &str) -> Result<(PathBuf, PathBuf)> {
    Ok((
        temper_base::python::python(python),
        temper_base::python::tool_script(script)?,
    ))
}

/// A Python helper running as a worker process (`python tools/<script> ARGS`): it prints one
/// JSON line when it is ready, then answers each request line on its stdin with one JSON line
/// (`{"error": ...}` on failure). A reply that takes longer than the worker's timeout is an
/// error. Killed when dropped.
pub struct PyWorker {
    script: String,
    child: Child,
    /// `None` once [`PyWorker::finish`] has closed it.
    stdin: Option<ChildStdin>,
    /// Lines of the worker's stdout, read by a thread so that a silent worker cannot block us.
    lines: Receiver<std::io::Result<String>>,
    timeout: Duration,
}

impl PyWorker {
    /// Start `tools/<script>` with `args` under `python` (see [`python_and_script`]) and wait for
    /// its ready line, which is returned; each reply may take up to `timeout`.
    pub fn start(
        python: Option<&Path>,
        script: &str,
        args: &[String],
        timeout: Duration,
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
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines() {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut worker = PyWorker {
            script: format!("tools/{script}"),
            child,
            stdin: Some(stdin),
            lines,
            timeout,
        };
        let ready = worker.read()?;
        Ok((worker, ready))
    }

    /// Send one request line and return the reply.
    pub fn request(&mut self, line: &str) -> Result<serde_json::Value> {
        let stdin = self.stdin.as_mut().context("the worker was finished")?;
        writeln!(stdin, "{line}")
            .and_then(|_| stdin.flush())
            .with_context(|| format!("{} stopped reading requests", self.script))?;
        self.read()
    }

    fn read(&mut self) -> Result<serde_json::Value> {
        let line = match self.lines.recv_timeout(self.timeout) {
            Ok(line) => line.with_context(|| format!("reading {}", self.script))?,
            Err(RecvTimeoutError::Disconnected) => bail!(
                "{} exited early (run it by hand to see its error)",
                self.script
            ),
            Err(RecvTimeoutError::Timeout) => bail!(
                "{} gave no answer within {} s",
                self.script,
                self.timeout.as_secs()
            ),
        };
        let v: serde_json::Value = serde_json::from_str(&line)
            .with_context(|| format!("{} said {line:?}", self.script))?;
        if let Some(e) = v.get("error") {
            bail!("{}: {e}", self.script);
        }
        Ok(v)
    }
}

impl PyWorker {
    /// Close its stdin (the end of the requests) and wait up to the timeout for it to exit.
    pub fn finish(mut self) -> Result<()> {
        let deadline = std::time::Instant::now() + self.timeout;
        // Closing our end of the pipe is what tells the worker there is nothing more.
        drop(self.stdin.take());
        while std::time::Instant::now() < deadline {
            if let Some(status) = self.child.try_wait()? {
                if !status.success() {
                    bail!("{} exited with {status}", self.script);
                }
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        bail!(
            "{} did not exit within {} s",
            self.script,
            self.timeout.as_secs()
        )
    }
}

impl Drop for PyWorker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
