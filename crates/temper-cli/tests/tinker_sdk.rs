//! The unmodified tinker SDK (tinker==0.38.0, installed by scripts/setup-env.sh) against
//! `temper serve` processes on loopback: `tools/tinker_sdk_check.py` drives every call and checks
//! each answer against PyTorch and the SDK's own client-side loss path, two clients at once; then
//! the server is killed and a new one on the same `--root` continues from a saved state; a server
//! killed with SIGKILL in the middle of a long forward_backward (a save of the same name queued
//! behind it) loses nothing that save_state wrote (`tools/tinker_kill_check.py`: the reloaded
//! logprobs are exactly the first save's, so the second never replaced it). Malformed bodies get
//! Tinker error replies and the server keeps serving. DPO through `forward_backward_custom` matches
//! PyTorch (`tools/tinker_dpo_check.py`).
use temper_testkit as common;
mod serve_util;

use std::path::Path;
use std::process::{Command, Stdio};

use serve_util::{passed, Client};

use serde_json::{json, Value};

fn check_script(url: &str, extra: &[&str]) -> Client {
    run_script("tinker_sdk_check.py", url, extra)
}

fn run_script(name: &str, url: &str, extra: &[&str]) -> Client {
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tools")
        .join(name);
    Client::new(
        Command::new(common::python())
            .arg(&script)
            .arg(common::tiny_model_dir())
            .args(extra)
            .env("TINKER_BASE_URL", url)
            .env("TINKER_API_KEY", "tml-local")
            .env("TINKER_TELEMETRY", "0")
            .env("HF_HUB_OFFLINE", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    )
}

#[test]
fn the_tinker_sdk_trains_and_samples_on_temper() {
    let root = common::temp_dir("tinker-root");
    let root_arg = root.display().to_string();
    let saved = root.join("saved.json");
    let saved_arg = saved.display().to_string();
    let limit = ["--max-model-len", "256"];
    let mut server = serve_util::start(
        &common::tiny_model_dir(),
        &["--root", &root_arg, limit[0], limit[1]],
    );
    // Two clients at once, each with its own session and models.
    let first = check_script(&server.url, &["--save-to", &saved_arg, "--root", &root_arg]);
    let second = check_script(&server.url, &[]);
    passed(first);
    passed(second);
    // Killed: what save_state wrote is all a new server needs.
    server.kill();
    let server = serve_util::start(
        &common::tiny_model_dir(),
        &["--root", &root_arg, limit[0], limit[1]],
    );
    passed(check_script(&server.url, &["--resume-from", &saved_arg]));
}

/// An RL-sized batch (300 datums x 1024 tokens) in one SDK call, cut by the SDK into several
/// requests, updates exactly as the same datums in small calls; all-zero advantages add nothing;
/// a 1024-token prompt's sample request at the largest prompt widths (64 target ids per position).
#[test]
fn the_tinker_sdk_sends_an_rl_sized_batch() {
    let root = common::temp_dir("tinker-scale-root");
    let root_arg = root.display().to_string();
    let server = serve_util::start(&common::tiny_model_dir(), &["--root", &root_arg]);
    passed(run_script("tinker_sdk_scale.py", &server.url, &[]));
}

/// SIGKILL while a long forward_backward runs (with a save_state of the same name queued behind
/// it): a new server on the same `--root` loads the state the first save_state wrote, exactly.
#[test]
fn a_server_killed_mid_forward_backward_loses_nothing_save_state_wrote() {
    use std::io::{BufRead, BufReader};
    let root = common::temp_dir("tinker-kill");
    let root_arg = root.display().to_string();
    let saved = root.join("saved.json").display().to_string();
    let mut server = serve_util::start(&common::tiny_model_dir(), &["--root", &root_arg]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tools/tinker_kill_check.py");
    let phase = |mode: &str, url: &str| {
        Client::new(
            Command::new(common::python())
                .arg(&script)
                .args([
                    mode,
                    &common::tiny_model_dir().display().to_string(),
                    &saved,
                ])
                .env("TINKER_BASE_URL", url)
                .env("TINKER_API_KEY", "tml-local")
                .env("TINKER_TELEMETRY", "0")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        )
    };
    let mut client = phase("save", &server.url);
    let mut lines = BufReader::new(client.child().stdout.take().unwrap()).lines();
    assert_eq!(
        lines.next().map(|l| l.unwrap()).as_deref(),
        Some("BUSY"),
        "the save phase did not get to its long forward_backward"
    );
    std::thread::sleep(std::time::Duration::from_millis(1500));
    server.kill();
    drop(client);
    let server = serve_util::start(&common::tiny_model_dir(), &["--root", &root_arg]);
    passed(phase("resume", &server.url));
}

fn post(url: &str, route: &str, body: Vec<u8>) -> (u16, Value) {
    let r = reqwest::blocking::Client::new()
        .post(format!("{url}/api/v1/{route}"))
        .header("X-API-Key", "tml-local")
        .body(body)
        .send()
        .unwrap();
    (r.status().as_u16(), r.json().unwrap_or(Value::Null))
}

#[test]
fn malformed_requests_get_tinker_errors() {
    let root = common::temp_dir("tinker-bad");
    let server = serve_util::start(
        &common::tiny_model_dir(),
        &["--root", &root.display().to_string()],
    );
    let url = &server.url;
    // A future-style call refused: the reason is the future's result.
    let (status, v) = post(url, "forward_backward", b"\xff\x01not protobuf".to_vec());
    assert_eq!(status, 200, "{v}");
    let id = v["request_id"].as_str().unwrap().to_string();
    let poll = serde_json::to_vec(&json!({"request_id": id, "allow_metadata_only": true})).unwrap();
    let (_, v) = post(url, "retrieve_future", poll.clone());
    assert_eq!(v["category"], "user", "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("not a ForwardBackwardRequest protobuf"),
        "{v}"
    );
    let (_, v) = post(
        url,
        "optim_step",
        br#"{"model_id": "nope:train:0", "seq_id": 1, "adam_params": {}}"#.to_vec(),
    );
    let poll = serde_json::to_vec(&json!({"request_id": v["request_id"]})).unwrap();
    let (_, v) = post(url, "retrieve_future", poll);
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("no model \"nope:train:0\""),
        "{v}"
    );
    // Direct calls: a 400 (or 404) with the error body, never an empty one.
    let (status, v) = post(url, "create_sampling_session", b"{not json".to_vec());
    assert_eq!(status, 400);
    assert!(
        v["error"].as_str().unwrap().starts_with("request body:"),
        "{v}"
    );
    let (status, v) = post(url, "get_info", br#"{"model_id": "nope"}"#.to_vec());
    assert_eq!((status, v["category"].as_str()), (404, Some("user")), "{v}");
    let (status, _) = post(url, "create_session", b"{}".to_vec());
    assert_eq!(status, 200, "still serving");
}

/// DPO as tinker-cookbook's preference recipes train it (`forward_backward_custom`, reference
/// logprobs from a base sampler) gives PyTorch's DPO loss, and one AdamW step lands where
/// PyTorch's does on the same model (`tools/tinker_dpo_check.py`, a full fine-tune).
#[test]
fn dpo_through_forward_backward_custom_matches_pytorch() {
    let root = common::temp_dir("tinker-dpo-root");
    let root_arg = root.display().to_string();
    let server = serve_util::start(
        &common::tiny_model_dir(),
        &["--root", &root_arg, "--dtype", "float32"],
    );
    passed(run_script("tinker_dpo_check.py", &server.url, &[]));
}
