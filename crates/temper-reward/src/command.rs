//! A reward computed by a long-running external command speaking JSON lines: one request
//! `{"prompt","completion","ground_truth","metadata"}` per line on its stdin, one reply
//! `{"reward": r, ...numeric metrics}` per line on its stdout. The argv is run directly (no
//! shell). A crash, a timeout or a bad reply scores 0, is logged and counted, and the process is
//! restarted on the next call.
use crate::reward::{opt_seconds, Reward, RewardOutput};
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::Mutex;
use std::time::Duration;

struct Running {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<std::io::Result<String>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The external-command reward. Calls are serialised through one process.
pub struct CommandReward {
    argv: Vec<String>,
    timeout: Duration,
    proc: Mutex<Option<Running>>,
    errors: AtomicU64,
    calls: AtomicU64,
}

impl CommandReward {
    /// Options: `cmd` (argv array of strings, required), `timeout_s` (per call, default 10).
    pub fn from_opts(opts: &Value) -> Result<Self> {
        let cmd = opts
            .get("cmd")
            .context("option \"cmd\" (argv array) is required")?;
        let argv: Vec<String> = match cmd {
            Value::Array(items) => items
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    v.as_str()
                        .map(str::to_string)
                        .with_context(|| format!("option \"cmd\"[{i}] must be a string, got {v}"))
                })
                .collect::<Result<_>>()?,
            other => bail!("option \"cmd\" must be an argv array of strings, got {other}"),
        };
        if argv.is_empty() || argv[0].is_empty() {
            bail!("option \"cmd\" must name a program");
        }
        Ok(Self::new(argv, opt_seconds(opts, "timeout_s", 10.0)?))
    }

    pub fn new(argv: Vec<String>, timeout: Duration) -> Self {
        CommandReward {
            argv,
            timeout,
            proc: Mutex::new(None),
            errors: AtomicU64::new(0),
            calls: AtomicU64::new(0),
        }
    }

    /// Calls that failed (crash, timeout, bad reply) so far.
    pub fn error_count(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }

    fn spawn(&self) -> Result<Running> {
        let mut child = Command::new(&self.argv[0])
            .args(&self.argv[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting reward command {:?}", self.argv))?;
        let stdin = child.stdin.take().context("reward command stdin")?;
        let stdout = child.stdout.take().context("reward command stdout")?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Running {
            child,
            stdin,
            lines: rx,
        })
    }

    fn call(&self, request: &Value) -> Result<RewardOutput> {
        let mut guard = self.proc.lock().unwrap_or_else(|p| p.into_inner());
        if guard.is_none() {
            *guard = Some(self.spawn()?);
        }
        let run = guard.as_mut().expect("just started");
        let result = (|| {
            let mut line = serde_json::to_string(request)?;
            line.push('\n');
            run.stdin
                .write_all(line.as_bytes())
                .and_then(|_| run.stdin.flush())
                .context("writing to reward command (it may have exited)")?;
            let reply = match run.lines.recv_timeout(self.timeout) {
                Ok(Ok(l)) => l,
                Ok(Err(e)) => bail!("reading reward command output: {e}"),
                Err(RecvTimeoutError::Timeout) => {
                    bail!("reward command gave no reply within {:?}", self.timeout)
                }
                Err(RecvTimeoutError::Disconnected) => bail!("reward command exited"),
            };
            parse_reply(&reply)
        })();
        if result.is_err() {
            // Kill and restart on the next call so a late reply cannot answer the wrong request.
            *guard = None;
        }
        result
    }
}

/// `{"reward": r, "name": number, ...}` -> output; non-numeric extra fields are ignored.
fn parse_reply(line: &str) -> Result<RewardOutput> {
    let v: Value = serde_json::from_str(line.trim())
        .with_context(|| format!("reward command reply is not JSON: {:?}", truncate(line)))?;
    let obj = v
        .as_object()
        .context("reward command reply must be a JSON object")?;
    let reward = obj.get("reward").and_then(Value::as_f64).with_context(|| {
        format!(
            "reward command reply has no numeric \"reward\": {:?}",
            truncate(line)
        )
    })?;
    if !reward.is_finite() {
        bail!("reward command replied a non-finite reward");
    }
    let mut out = RewardOutput::new(reward);
    for (k, val) in obj {
        if k != "reward" {
            if let Some(x) = val.as_f64() {
                out.metrics.insert(k.clone(), x);
            }
        }
    }
    Ok(out)
}

fn truncate(s: &str) -> String {
    s.chars().take(200).collect()
}

impl Reward for CommandReward {
    fn name(&self) -> &str {
        "command"
    }

    fn score(&self, prompt: &str, completion: &str, gt: &str, metadata: &Value) -> RewardOutput {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let request = json!({
            "prompt": prompt,
            "completion": completion,
            "ground_truth": gt,
            "metadata": metadata,
        });
        match self.call(&request) {
            Ok(out) => out.with("command_error", 0.0),
            Err(e) => {
                let n = self.errors.fetch_add(1, Ordering::Relaxed) + 1;
                tracing::warn!(errors = n, "reward command failed, reward 0: {e:#}");
                RewardOutput::failed(format!("command: {}", truncate(&format!("{e:#}"))))
                    .with("command_error", 1.0)
            }
        }
    }
}
