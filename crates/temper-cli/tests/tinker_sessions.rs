//! Tinker sessions end and free what they made: a session without heartbeats for
//! `--session-timeout-s`, or one finished, loses its training models (their threads exit, freeing
//! the model) and sampling sessions; later calls naming them say the session ended; a heartbeat
//! for it gets 410 (what the SDK reads as "finished"). A session that keeps heartbeating keeps
//! its model. Raw HTTP on loopback against a `temper serve` process.
#[path = "../../temper-train/tests/common/mod.rs"]
mod common;
mod serve_util;

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use serve_util::Server;

fn post(s: &Server, route: &str, body: Value) -> (u16, Value) {
    let r = reqwest::blocking::Client::new()
        .post(format!("{}/api/v1/{route}", s.url))
        .header("X-API-Key", "tml-local")
        .json(&body)
        .send()
        .unwrap();
    (r.status().as_u16(), r.json().unwrap_or(Value::Null))
}

/// A future-style call's result.
fn call(s: &Server, route: &str, body: Value) -> Value {
    let (status, v) = post(s, route, body);
    assert_eq!(status, 200, "{route}: {v}");
    let id = v["request_id"].clone();
    loop {
        let (_, r) = post(s, "retrieve_future", json!({"request_id": id}));
        if r["type"] != "try_again" {
            return r;
        }
    }
}

fn session(s: &Server) -> String {
    let (status, v) = post(
        s,
        "create_session",
        json!({"tags": [], "sdk_version": "0.38.0"}),
    );
    assert_eq!(status, 200, "{v}");
    v["session_id"].as_str().unwrap().to_string()
}

/// A LoRA training model of `session`; its id.
fn model(s: &Server, session: &str) -> String {
    let v = call(
        s,
        "create_model",
        json!({"session_id": session, "model_seq_id": 0,
               "base_model": common::tiny_model_dir().display().to_string(),
               "lora_config": {"rank": 4}}),
    );
    v["model_id"]
        .as_str()
        .unwrap_or_else(|| panic!("{v}"))
        .to_string()
}

/// Threads of the server process running a training model (named `tinker-{model_id}`).
fn model_threads(s: &Server) -> usize {
    threads_named(s, "tinker-sess")
}

/// Threads of the server process whose name starts with `prefix`.
fn threads_named(s: &Server, prefix: &str) -> usize {
    std::fs::read_dir(format!("/proc/{}/task", s.pid()))
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with(prefix))
        .count()
}

fn wait_until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn sessions_end_and_free_their_models() {
    let root = common::temp_dir("tinker-sessions");
    let server = serve_util::start(
        &common::tiny_model_dir(),
        &[
            "--root",
            &root.display().to_string(),
            "--session-timeout-s",
            "2",
        ],
    );
    let silent = session(&server);
    let alive = session(&server);
    let finished = session(&server);
    let silent_model = model(&server, &silent);
    let alive_model = model(&server, &alive);
    let finished_model = model(&server, &finished);
    let (status, v) = post(
        &server,
        "create_sampling_session",
        json!({"session_id": silent, "sampling_session_seq_id": 0,
               "base_model": common::tiny_model_dir().display().to_string()}),
    );
    assert_eq!(status, 200, "{v}");
    let sampler = v["sampling_session_id"].as_str().unwrap().to_string();
    assert_eq!(model_threads(&server), 3);
    // Sampling sessions sample on the serving worker: no thread (nor model copy) of their own.
    assert_eq!(threads_named(&server, "tinker-sampler"), 0);

    // Finished: freed at once.
    let (status, _) = post(&server, &format!("sessions/{finished}/finish"), json!({}));
    assert_eq!(status, 200);
    wait_until(
        "the finished session's model thread exits",
        Duration::from_secs(10),
        || model_threads(&server) == 2,
    );
    let (status, v) = post(&server, "get_info", json!({"model_id": finished_model}));
    assert_eq!(status, 404, "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("finished by the client"),
        "{v}"
    );

    // One session heartbeats, the other is silent past the timeout.
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(5) {
        let (status, v) = post(&server, "session_heartbeat", json!({"session_id": alive}));
        assert_eq!(status, 200, "{v}");
        std::thread::sleep(Duration::from_millis(500));
    }
    wait_until(
        "the silent session's model thread exits",
        Duration::from_secs(10),
        || model_threads(&server) == 1,
    );
    let (status, v) = post(&server, "get_info", json!({"model_id": alive_model}));
    assert_eq!(status, 200, "the live session lost its model: {v}");
    let (status, v) = post(&server, "get_info", json!({"model_id": silent_model}));
    assert_eq!(status, 404, "{v}");
    let e = v["error"].as_str().unwrap();
    assert!(
        e.contains("was freed when its session ended (no heartbeat for 2 s"),
        "{e}"
    );
    // A training call and a sample naming what the ended session made: a user error saying why.
    let r = call(
        &server,
        "optim_step",
        json!({"model_id": silent_model, "seq_id": 1, "adam_params": {}}),
    );
    assert!(
        r["error"].as_str().unwrap().contains("session ended"),
        "{r}"
    );
    let r = call(
        &server,
        "asample",
        json!({"sampling_session_id": sampler, "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 2]}]},
               "num_samples": 1, "sampling_params": {"max_tokens": 2}}),
    );
    assert!(
        r["error"].as_str().unwrap().contains("session ended"),
        "{r}"
    );
    // Its heartbeat is 410 (the SDK stops heartbeating), and it cannot make new models.
    let (status, v) = post(&server, "session_heartbeat", json!({"session_id": silent}));
    assert_eq!(status, 410, "{v}");
    let r = call(
        &server,
        "create_model",
        json!({"session_id": silent, "model_seq_id": 1,
               "base_model": common::tiny_model_dir().display().to_string()}),
    );
    assert!(r["error"].as_str().unwrap().contains("has ended"), "{r}");
    // The live session still trains.
    let r = call(
        &server,
        "optim_step",
        json!({"model_id": alive_model, "seq_id": 1, "adam_params": {"learning_rate": 1e-4}}),
    );
    assert!(r.get("error").is_none(), "{r}");
}
