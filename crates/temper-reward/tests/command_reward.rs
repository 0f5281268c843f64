//! The external-command reward against a real child process (a small Python script; skipped
//! with a message when python3 is not installed).
use serde_json::{json, Value};
use std::time::Duration;
use temper_reward::{CommandReward, Reward};

const SCRIPT: &str = r#"
import json, sys, time
for line in sys.stdin:
    req = json.loads(line)
    c = req["completion"]
    if c == "crash":
        sys.exit(3)
    if c == "slow":
        time.sleep(5)
    if c == "garbage":
        print("not json", flush=True)
        continue
    r = 1.0 if c.strip() == req["ground_truth"] else 0.0
    print(json.dumps({"reward": r, "length": len(c), "echo_meta": (req["metadata"] or {}).get("k", 0), "note": "x"}), flush=True)
"#;

fn python() -> Option<String> {
    for p in ["python3", "python"] {
        if std::process::Command::new(p)
            .arg("--version")
            .output()
            .is_ok()
        {
            return Some(p.to_string());
        }
    }
    None
}

#[test]
fn json_lines_protocol_errors_and_restart() {
    let Some(py) = python() else {
        eprintln!("SKIP: no python3 to run the reward command");
        return;
    };
    let r = CommandReward::new(
        vec![py, "-c".into(), SCRIPT.into()],
        Duration::from_millis(1500),
    );
    let meta = json!({"k": 7});
    let ok = r.score("p", "42", "42", &meta);
    assert_eq!(ok.reward, 1.0);
    assert_eq!(ok.metrics["length"], 2.0);
    assert_eq!(ok.metrics["echo_meta"], 7.0);
    assert_eq!(ok.metrics["command_error"], 0.0);
    assert!(
        !ok.metrics.contains_key("note"),
        "non-numeric fields are not metrics"
    );
    assert_eq!(r.score("p", "41", "42", &Value::Null).reward, 0.0);
    assert_eq!(r.error_count(), 0);

    // Crash: reward 0, counted; the next call restarts the process.
    let c = r.score("p", "crash", "42", &Value::Null);
    assert_eq!((c.reward, c.metrics["command_error"]), (0.0, 1.0));
    assert_eq!(r.error_count(), 1);
    assert_eq!(r.score("p", "42", "42", &Value::Null).reward, 1.0);

    // Timeout and a bad reply: both 0 and counted; the process recovers after each.
    assert_eq!(r.score("p", "slow", "slow", &Value::Null).reward, 0.0);
    assert_eq!(r.error_count(), 2);
    assert_eq!(r.score("p", "garbage", "", &Value::Null).reward, 0.0);
    assert_eq!(r.error_count(), 3);
    assert_eq!(r.score("p", "42", "42", &Value::Null).reward, 1.0);

    // Arguments are passed as-is, never through a shell: `$HOME` stays literal.
    let echo = CommandReward::new(
        vec!["python3".into(), "-c".into(), "import sys,json\nfor l in sys.stdin: print(json.dumps({'reward': float(len(sys.argv[1]))}), flush=True)".into(), "$HOME".into()],
        Duration::from_secs(5),
    );
    assert_eq!(echo.score("", "", "", &Value::Null).reward, 5.0);
}

#[test]
fn missing_program_is_an_error_reward() {
    let r = CommandReward::new(
        vec!["/nonexistent/temper-reward-cmd".into()],
        Duration::from_secs(1),
    );
    let out = r.score("p", "c", "g", &Value::Null);
    assert_eq!(out.reward, 0.0);
    assert_eq!(r.error_count(), 1);
}
