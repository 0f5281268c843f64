//! `trainer.logger = wandb` with a Python that has no wandb package: the run stops before its
//! first step with a message naming the missing package (a test binary of its own, because it
//! sets TEMPER_PYTHON for the process).
use common::{temp_dir, tiny_config};
use temper_testkit as common;
use temper_train::trainer::Trainer;

#[test]
fn a_wandb_logger_that_cannot_start_stops_the_run_before_its_first_step() {
    let root = temp_dir("loggers-nowandb");
    let cfg = tiny_config(&root, &["trainer.logger=wandb"]);
    let mut t = Trainer::create(cfg, "t", &["temper".into()]).unwrap();
    // A Python without the wandb package.
    let bare = temp_dir("bare-python");
    let py = bare.join("python");
    std::fs::write(&py, "#!/bin/sh\nexec python3 -S -I \"$@\"\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&py, std::fs::Permissions::from_mode(0o755)).unwrap();
    // SAFETY: the only test of this binary, so no other thread reads the environment.
    unsafe { std::env::set_var("TEMPER_PYTHON", &py) };
    let e = t.fit().unwrap_err();
    let msg = format!("{e:#}");
    assert!(
        msg.contains("wandb") && msg.contains("not installed"),
        "{msg}"
    );
    assert!(
        t.run().read_metrics().map(|m| m.is_empty()).unwrap_or(true),
        "metrics were written before the logger failed"
    );
    std::fs::remove_dir_all(&root).ok();
}
