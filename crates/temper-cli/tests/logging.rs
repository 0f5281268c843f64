//! Library warnings reach the terminal: a reward command that fails is a `tracing::warn!` inside
//! temper-reward, which the CLI's subscriber prints on stderr; `RUST_LOG=error` silences it.
use temper_testkit as common;

use std::process::Command;

fn train_stderr(root: &std::path::Path, rust_log: Option<&str>) -> String {
    std::fs::create_dir_all(root).unwrap();
    let config = root.join("blank.toml");
    std::fs::write(&config, "").unwrap();
    let mut args = vec!["train".to_string(), config.display().to_string()];
    args.extend(common::tiny_overrides(root));
    args.extend(
        [
            "reward.name=command",
            r#"reward.kwargs.cmd=["false"]"#,
            "reward.on_error=zero",
            "trainer.total_training_steps=1",
            "trainer.test_freq=0",
            "trainer.save_freq=0",
        ]
        .map(String::from),
    );
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_temper"));
    cmd.args(&args).env_remove("RANK").env_remove("RUST_LOG");
    if let Some(level) = rust_log {
        cmd.env("RUST_LOG", level);
    }
    let out = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "temper train failed:\n{err}");
    err
}

#[test]
fn library_warnings_print_and_rust_log_filters_them() {
    let root = common::temp_dir("logging");
    let err = train_stderr(&root.join("default"), None);
    assert!(
        err.lines()
            .any(|l| l.contains("WARN") && l.contains("reward command failed")),
        "no warning line:\n{err}"
    );
    let quiet = train_stderr(&root.join("quiet"), Some("error"));
    assert!(!quiet.contains("reward command failed"), "{quiet}");
    std::fs::remove_dir_all(&root).ok();
}
