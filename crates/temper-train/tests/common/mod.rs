//! Helpers shared by the integration tests.
#![allow(dead_code)]
use std::path::PathBuf;

/// The project venv's Python (set up by scripts/setup-env.sh), the independent reference.
pub fn python() -> PathBuf {
    let root = std::env::var("TEMPER_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.."));
    root.join(".venv/bin/python")
}

/// A fresh, empty temporary folder unique to this test.
pub fn temp_dir(tag: &str) -> PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let d = std::env::temp_dir().join(format!(
        "temper-train-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Runs a reference script from tests/py with arguments; panics with its stderr on failure.
pub fn run_py(script: &str, args: &[&std::path::Path]) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/py")
        .join(script);
    let out = std::process::Command::new(python())
        .arg(path)
        .args(args)
        .output()
        .expect("running python");
    assert!(
        out.status.success(),
        "{script} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
