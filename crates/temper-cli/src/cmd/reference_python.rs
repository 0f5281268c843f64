//! Where the benchmarks find their Python side: the repository's venv and `tools/` scripts.
use anyhow::{bail, Result};
use std::path::{Path, PathBuf};

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
