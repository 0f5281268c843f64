//! On a machine without CUDA (CI's), each way of asking for a GPU fails at once with one line
//! naming what is missing (here: the CPU-only libtorch this build links), never deep in
//! libtorch: `--device cuda`, `trainer.device=cuda` and `TEMPER_DIST_BACKEND=nccl`.
use temper_testkit as common;

use std::process::Command;

fn fails_with_one_line(args: &[String], env: &[(&str, &str)], want: &[&str]) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_temper"));
    cmd.args(args).env_remove("RANK");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "temper {args:?} succeeded:\n{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("error"))
        .unwrap_or_else(|| panic!("no error line:\n{err}"));
    for w in want {
        assert!(line.contains(w), "`{line}` lacks `{w}`\n{err}");
    }
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn asking_for_cuda_without_it_names_what_is_missing() {
    if tch::Cuda::is_available() {
        eprintln!("skipped: this machine has CUDA");
        return;
    }
    let missing = if temper_kernels::cuda_build() {
        "no CUDA device is visible"
    } else {
        "CPU-only libtorch"
    };
    let root = common::temp_dir("no-cuda");
    let model = common::tiny_model_dir().display().to_string();
    let flag = ["check-logprobs", "--model", &model, "--device", "cuda"];
    fails_with_one_line(&flag.map(String::from), &[], &["--device", missing]);
    let serve = [
        "serve", "--model", &model, "--port", "0", "--device", "cuda:1",
    ];
    fails_with_one_line(&serve.map(String::from), &[], &["--device", missing]);
    let config = root.join("blank.toml");
    std::fs::write(&config, "").unwrap();
    let mut train = vec!["train".to_string(), config.display().to_string()];
    train.extend(common::tiny_overrides(&root));
    let mut on_cuda = train.clone();
    on_cuda.push("trainer.device=cuda".into());
    fails_with_one_line(&on_cuda, &[], &["trainer.device", missing]);
    let mut nproc = vec!["train".to_string(), "--nproc".into(), "2".into()];
    nproc.extend(train[1..].iter().cloned());
    if !temper_kernels::nccl_available() {
        fails_with_one_line(
            &nproc,
            &[("TEMPER_DIST_BACKEND", "nccl")],
            &["NCCL was requested but this temper was built without it"],
        );
    }
    std::fs::remove_dir_all(&root).ok();
}
