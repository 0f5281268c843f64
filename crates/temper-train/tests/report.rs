//! `temper report`: PNGs and a self-contained HTML page from a metrics file.
use std::collections::BTreeMap;
use temper_testkit as common;
use temper_train::rundir::RunDir;

#[test]
fn report_draws_pngs_and_a_self_contained_page() {
    let dir = common::temp_dir("report");
    let run = RunDir::new(&dir);
    for step in 0..6usize {
        let mut m = BTreeMap::new();
        m.insert("critic/score/mean".to_string(), step as f64 / 10.0);
        m.insert("actor/entropy".to_string(), 2.0 - step as f64 / 10.0);
        m.insert("actor/ppo_kl".to_string(), f64::NAN); // written as null, skipped when drawing
        if step % 2 == 0 {
            m.insert("val/accuracy".to_string(), 0.25 + step as f64 / 20.0);
            m.insert("timing_s/eval".to_string(), 6.0);
        }
        if step > 0 {
            m.insert("timing_s/step".to_string(), 30.0);
        }
        run.append_metrics(step, &m).unwrap();
    }
    std::fs::write(dir.join("config.toml"), "[model]\npath = \"<x>\"\n").unwrap();
    let index = temper_train::report::render_report(&dir, None).unwrap();
    let html = std::fs::read_to_string(&index).unwrap();
    assert!(
        html.contains("<svg") && html.contains("Held-out accuracy") && html.contains("Entropy")
    );
    assert!(html.contains("&lt;x&gt;"), "config is escaped");
    assert!(
        !html.contains("src=\"http") && !html.contains("href=\"http"),
        "page must be self-contained"
    );
    assert!(html.contains("Reward by wall-clock time") && html.contains("after 2.8 min"));
    for png in [
        "reward.png",
        "accuracy.png",
        "entropy.png",
        "reward_by_time.png",
        "accuracy_by_time.png",
    ] {
        let bytes = std::fs::read(dir.join("report").join(png)).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{png} is not a PNG");
    }
    // The run's own time at each step's end: steps' and evaluations' seconds summed.
    let lines = temper_train::rundir::read_metrics(&dir.join("metrics.jsonl")).unwrap();
    let minutes = temper_train::report::minutes_by_step(&lines);
    let want = [0.1, 0.6, 1.2, 1.7, 2.3, 2.8];
    for (step, w) in want.iter().enumerate() {
        assert!((minutes[&(step as u64)] - w).abs() < 1e-9, "{minutes:?}");
    }
    // No KL data (only NaN): no KL panel.
    assert!(!dir.join("report/kl.png").exists());
    let e = temper_train::report::render_report(&common::temp_dir("empty"), None).unwrap_err();
    assert!(e.to_string().contains("metrics.jsonl"), "{e}");
}
