//! Running a PyTorch reference from the repository's tools/ (with the venv's Python that
//! scripts/setup-env.sh makes) and reading the JSON it prints.
use std::path::PathBuf;

/// `tools/<script>`'s standard output, parsed; panics with its stderr when it fails.
pub fn tool_json<T: serde::de::DeserializeOwned>(script: &str) -> T {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = std::process::Command::new(root.join(".venv/bin/python"))
        .arg(root.join("tools").join(script))
        .output()
        .unwrap_or_else(|e| {
            panic!("running tools/{script} (scripts/setup-env.sh makes .venv): {e}")
        });
    assert!(
        out.status.success(),
        "tools/{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}
