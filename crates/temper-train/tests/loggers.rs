//! `trainer.logger`: a tiny run logs to TensorBoard and to an offline W&B run, and each sink,
//! read back by its own package (tensorboard's EventAccumulator, wandb's datastore reader),
//! holds every metric of every step that metrics.jsonl holds.
use common::{python, temp_dir, tiny_config};
use std::collections::BTreeMap;
use temper_testkit as common;
use temper_train::trainer::Trainer;

fn read_back(run: &std::path::Path) -> serde_json::Value {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/read_loggers.py");
    let out = std::process::Command::new(python())
        .arg(script)
        .arg(run)
        .output()
        .expect("running python");
    assert!(
        out.status.success(),
        "read_loggers.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn tensorboard_and_wandb_hold_every_metric_of_every_step() {
    let root = temp_dir("loggers");
    let cfg = tiny_config(
        &root,
        &[
            "trainer.logger=['console','tensorboard','wandb']",
            "trainer.test_freq=2",
            "trainer.project_name=loggers-test",
        ],
    );
    let mut t = Trainer::create(cfg, "t", &["temper".into()]).unwrap();
    t.fit().unwrap();
    let lines = t.run().read_metrics().unwrap();
    // step -> metric -> value, as metrics.jsonl has them.
    let mut want: BTreeMap<i64, BTreeMap<String, f64>> = BTreeMap::new();
    for line in &lines {
        let step = line["step"].as_i64().unwrap();
        for (k, v) in line {
            if let Some(v) = v.as_f64().filter(|_| k != "step") {
                want.entry(step).or_default().insert(k.clone(), v);
            }
        }
    }
    assert_eq!(want.keys().copied().collect::<Vec<_>>(), [0, 1, 2, 3]);
    let got = read_back(&t.run().root);

    let tb = got["tensorboard"].as_object().unwrap();
    let mut n = 0;
    for (step, metrics) in &want {
        for (k, v) in metrics {
            let series = tb[k]
                .as_array()
                .unwrap_or_else(|| panic!("tensorboard lacks {k}"));
            let hit = series
                .iter()
                .find(|p| p[0].as_i64() == Some(*step))
                .unwrap_or_else(|| panic!("tensorboard {k} lacks step {step}"));
            let tb_value = hit[1].as_f64().unwrap();
            // TensorBoard keeps scalars as f32.
            assert!(
                tb_value == *v as f32 as f64 || (tb_value.is_nan() && v.is_nan()),
                "{k} at step {step}: tensorboard {tb_value}, metrics.jsonl {v}"
            );
            n += 1;
        }
    }
    assert!(n > 40, "only {n} values compared");

    let wandb = &got["wandb"];
    let rows = wandb["history"].as_array().unwrap();
    for (step, metrics) in &want {
        let row = rows
            .iter()
            .find(|r| r["_step"].as_i64() == Some(*step))
            .unwrap_or_else(|| panic!("W&B history has no row for step {step}"));
        for (k, v) in metrics {
            let w = row[k.as_str()]
                .as_f64()
                .unwrap_or_else(|| panic!("W&B step {step} lacks {k}"));
            assert!(
                w == *v || (w.is_nan() && v.is_nan()),
                "{k} at step {step}: W&B {w}, metrics.jsonl {v}"
            );
        }
    }
    assert_eq!(
        wandb["config"]["actor"]["optim"]["lr"].as_f64(),
        Some(1e-2),
        "W&B config: {}",
        wandb["config"]
    );
    let images = wandb["images"].as_array().unwrap();
    assert!(
        images
            .iter()
            .any(|k| k.as_str().unwrap().starts_with("report/")),
        "no report images in W&B: {images:?}"
    );
    std::fs::remove_dir_all(&root).ok();
}

#[test]
fn an_unknown_logger_is_an_error_listing_the_known_ones() {
    let ov = vec![
        "model.path=m".to_string(),
        "data.task=arith".into(),
        "trainer.logger=[console,mlflow]".into(),
    ];
    let e = temper_train::config::load_config(None, &ov).unwrap_err();
    let msg = format!("{e:#}");
    assert!(
        msg.contains("trainer.logger") && msg.contains("mlflow"),
        "{msg}"
    );
    for known in temper_train::config::Logger::known_names() {
        assert!(msg.contains(known), "{msg}");
    }
}
