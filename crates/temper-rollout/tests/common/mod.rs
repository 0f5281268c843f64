//! Helpers shared by the integration tests: the reference fixtures made by
//! `tools/rollout_reference.py` (transformers), computed once and cached under target/tmp.
#![allow(dead_code)]

pub mod tiny;

use std::path::{Path, PathBuf};
use std::process::Command;

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repo root")
}

/// Runs `tools/rollout_reference.py <args> --out <dir>` once and returns `<dir>`, cached under
/// target/tmp keyed by a hash of the script and `args`. Written under a temporary name and renamed,
/// so concurrent test binaries never see half a folder.
pub fn reference_output(args: &[&str], file_name: Option<&str>) -> PathBuf {
    let root = repo_root();
    let script = root.join("tools/rollout_reference.py");
    let src = std::fs::read(&script).expect("reading tools/rollout_reference.py");
    let mut h: u64 = 0xcbf29ce484222325; // FNV-1a
    for b in src.iter().chain(args.join("\0").as_bytes()) {
        h = (h ^ u64::from(*b)).wrapping_mul(0x100000001b3);
    }
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("rollout-ref-{h:016x}"));
    if dir.is_dir() {
        return dir;
    }
    let tmp = dir.with_extension(format!("tmp{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).unwrap();
    let out = match file_name {
        Some(f) => tmp.join(f),
        None => tmp.clone(),
    };
    let status = Command::new(root.join(".venv/bin/python"))
        .arg(&script)
        .args(args)
        .arg("--out")
        .arg(&out)
        .env("OMP_NUM_THREADS", "1")
        .output()
        .expect("running .venv/bin/python (set up with scripts/setup-env.sh)");
    assert!(
        status.status.success(),
        "rollout_reference.py failed:\n{}",
        String::from_utf8_lossy(&status.stderr)
    );
    if std::fs::rename(&tmp, &dir).is_err() {
        // Another test binary finished first; use its copy.
        let _ = std::fs::remove_dir_all(&tmp);
    }
    dir
}
