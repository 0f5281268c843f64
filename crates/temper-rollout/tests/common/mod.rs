//! Helpers shared by the integration tests: the repo root and live Python references.
#![allow(dead_code)]

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repo root")
}

/// Runs `tools/<script>` with the project venv's Python, feeding `input` as JSON on stdin, and
/// parses its stdout as JSON.
pub fn python(script: &str, args: &[&str], input: &serde_json::Value) -> serde_json::Value {
    let root = repo_root();
    let mut child = Command::new(root.join(".venv/bin/python"))
        .arg(root.join("tools").join(script))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start .venv/bin/python (run scripts/setup-env.sh)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{script} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{script} printed bad JSON: {e}"))
}
