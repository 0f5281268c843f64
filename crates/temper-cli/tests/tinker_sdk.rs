//! The unmodified tinker SDK (tinker==0.38.0, installed by scripts/setup-env.sh) against a
//! `temper serve` process on loopback: `tools/tinker_sdk_check.py` drives every call and checks
//! each answer against PyTorch and the SDK's own client-side loss path.
#[path = "../../temper-train/tests/common/mod.rs"]
mod common;
mod serve_util;

use std::process::Command;

#[test]
fn the_tinker_sdk_trains_and_samples_on_temper() {
    let root = common::temp_dir("tinker-root");
    let root_arg = root.display().to_string();
    let server = serve_util::start(&common::tiny_model_dir(), &["--root", &root_arg]);
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tools/tinker_sdk_check.py");
    let out = Command::new(common::python())
        .arg(&script)
        .arg(common::tiny_model_dir())
        .env("TINKER_BASE_URL", &server.url)
        .env("TINKER_API_KEY", "tml-local")
        .env("TINKER_TELEMETRY", "0")
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success() && stdout.contains("all checks passed"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
