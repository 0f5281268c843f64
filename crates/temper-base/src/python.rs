//! The Python temper runs (benchmarks' reference sides, the W&B sidecar, `pip download` of the
//! offline models), found by one rule.
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The repository root: `$TEMPER_ROOT`, else the source tree this binary was built from.
pub fn repo_root() -> PathBuf {
    match std::env::var_os("TEMPER_ROOT").filter(|v| !v.is_empty()) {
        Some(r) => PathBuf::from(r),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.."),
    }
}

/// The one rule: `explicit` (a `--python` flag) if given, else `$TEMPER_PYTHON`, else the
/// repository's venv (`.venv/bin/python` under [`repo_root`], which scripts/setup-env.sh makes)
/// when it exists, else `python3` on the PATH.
pub fn python(explicit: Option<&Path>) -> PathBuf {
    python_with(explicit, std::env::var_os("TEMPER_PYTHON"))
}

/// [`python`] with `$TEMPER_PYTHON`'s value given (an empty value counts as unset).
pub fn python_with(explicit: Option<&Path>, temper_python: Option<OsString>) -> PathBuf {
    if let Some(p) = explicit {
        return p.to_path_buf();
    }
    if let Some(p) = temper_python.filter(|v| !v.is_empty()) {
        return PathBuf::from(p);
    }
    let venv = repo_root().join(".venv/bin/python");
    if venv.exists() {
        return venv;
    }
    PathBuf::from("python3")
}

/// `tools/<script>` under [`repo_root`], which must exist.
pub fn tool_script(script: &str) -> anyhow::Result<PathBuf> {
    let path = repo_root().join("tools").join(script);
    if !path.is_file() {
        anyhow::bail!(
            "{} not found (set TEMPER_ROOT to the repository)",
            path.display()
        );
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_explicit_python_wins_then_temper_python_then_the_venv() {
        let flag = Path::new("/opt/py/bin/python");
        assert_eq!(python_with(Some(flag), Some("/x".into())), flag);
        assert_eq!(python_with(None, Some("/x".into())), Path::new("/x"));
        let venv = repo_root().join(".venv/bin/python");
        let fallback = if venv.exists() {
            venv
        } else {
            PathBuf::from("python3")
        };
        assert_eq!(python_with(None, Some("".into())), fallback);
        assert_eq!(python_with(None, None), fallback);
    }
}
