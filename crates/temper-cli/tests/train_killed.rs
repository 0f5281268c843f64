//! A run with the in-process sampler working ahead (`rollout.async_steps = 1`) killed with
//! SIGKILL while it trains, then `temper train --resume`: every step's metrics and rollouts up to
//! the last whole checkpoint are kept as they were written, the steps after it are run again
//! once each, the batch in flight at the kill is sampled again by the resumed policy (lag 0 at
//! the first step after the resume), and the lag never exceeds the bound.
use temper_testkit as common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const STEPS: usize = 12;

fn metric_lines(run: &Path) -> Vec<String> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

fn step_of(line: &str) -> usize {
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    v["step"].as_u64().unwrap() as usize
}

#[test]
fn a_killed_async_run_resumes_without_losing_what_it_wrote() {
    let root = common::temp_dir("killed-async");
    let config = root.join("blank.toml");
    std::fs::write(&config, "").unwrap();
    let mut args: Vec<String> = vec!["train".into(), config.display().to_string()];
    args.extend(common::tiny_overrides(&root));
    args.extend([
        format!("trainer.total_training_steps={STEPS}"),
        "trainer.save_freq=1".into(),
        "trainer.test_freq=-1".into(),
        "trainer.check_on_policy=false".into(),
        "rollout.async_steps=1".into(),
    ]);
    let run = root.join("run");
    let checkpoints = run.join("checkpoints");
    let mut child = Command::new(env!("CARGO_BIN_EXE_temper"))
        .args(&args)
        .env_remove("RANK")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Kill it once it has two whole checkpoints (it is then saving, sampling ahead or training).
    let started = Instant::now();
    loop {
        let whole = temper_train::checkpoint::list_checkpoints(&checkpoints).unwrap_or_default();
        if whole.len() >= 2 {
            break;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "the run ended before it could be killed"
        );
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "no checkpoint"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let before = metric_lines(&run);
    let kept = temper_train::checkpoint::list_checkpoints(&checkpoints).unwrap();
    let resumed_from = kept.last().unwrap().0;
    assert!(resumed_from < STEPS, "killed after the last step");
    assert!(before.len() >= resumed_from);
    eprintln!(
        "killed with {} metric lines written, resumed from step {resumed_from}",
        before.len()
    );

    common::output_ok(
        Command::new(env!("CARGO_BIN_EXE_temper"))
            .args(["train", "--resume"])
            .arg(&run),
    );
    let after = metric_lines(&run);
    let steps: Vec<usize> = after.iter().map(|l| step_of(l)).collect();
    assert_eq!(steps, (1..=STEPS).collect::<Vec<_>>(), "one line per step");
    // What was written up to the checkpoint is as it was.
    assert_eq!(after[..resumed_from], before[..resumed_from]);
    for (i, line) in after.iter().enumerate() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let lag = v["rollout/policy_lag_max"].as_f64().unwrap();
        assert!(lag <= 1.0, "step {}: lag {lag}", i + 1);
        if i + 1 == resumed_from + 1 {
            // The batch sampled ahead before the kill is gone: sampled again, by this policy.
            assert_eq!(lag, 0.0, "step {}", i + 1);
        }
        assert!(!common::rollouts(&run, i + 1).is_empty());
    }
}
