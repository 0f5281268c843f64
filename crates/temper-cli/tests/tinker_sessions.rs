//! Tinker sessions end and free what they made: a session without heartbeats for
//! `--session-timeout-s`, or one finished, loses its training models (their threads exit, freeing
//! the model) and sampling sessions; later calls naming them say the session ended; a heartbeat
//! for it gets 410 (what the SDK reads as "finished"). A session that keeps heartbeating keeps
//! its model. Raw HTTP on loopback against a `temper serve` process.
use temper_testkit as common;
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

/// A forward_backward call (protobuf both ways, as the SDK makes it): datum 0's logprobs.
fn forward_backward(s: &Server, body: Vec<u8>) -> Vec<f32> {
    use prost::Message;
    let client = reqwest::blocking::Client::new();
    let send = |route: &str, body: Vec<u8>| {
        client
            .post(format!("{}/api/v1/{route}", s.url))
            .header("X-API-Key", "tml-local")
            .body(body)
            .send()
            .unwrap()
    };
    let v: Value = send("forward_backward", body).json().unwrap();
    let poll = serde_json::to_vec(&json!({"request_id": v["request_id"]})).unwrap();
    loop {
        let r = send("retrieve_future", poll.clone());
        let is_proto = r.headers()["content-type"] == "application/x-protobuf";
        let bytes = r.bytes().unwrap();
        if is_proto {
            let out = temper_serve::tinker::proto::ForwardBackwardOutput::decode(bytes).unwrap();
            let logprobs = &out.loss_fn_outputs[0].fields["logprobs"].data;
            return logprobs
                .chunks(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect();
        }
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(v["type"], "try_again", "{v}");
    }
}

/// The server process's resident size (`VmRSS`).
fn resident_bytes(s: &Server) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", s.pid())).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

/// The logprob of each target of the probe datum under `model`'s current weights.
fn probe(s: &Server, model: &str, seq: i32) -> Vec<f32> {
    let input = [1, 2, 3, 4, 5, 6];
    forward_backward(
        s,
        serve_util::forward_backward_body(model, seq, &input, &[2, 3, 4, 5, 6, 7], true),
    )
}

/// One cross-entropy step of `model` on a datum of its own (`k`), then its probe logprobs.
fn train_and_probe(s: &Server, model: &str, k: i32, lr: f64) -> Vec<f32> {
    let input = [10 + k, 20 + k, 30 + k, 40 + k];
    let targets = input.map(|t| (t + 1) as i64);
    forward_backward(
        s,
        serve_util::forward_backward_body(model, 2, &input, &targets, false),
    );
    let r = call(
        s,
        "optim_step",
        json!({"model_id": model, "seq_id": 3, "adam_params": {"learning_rate": lr}}),
    );
    assert!(r.get("error").is_none(), "{r}");
    probe(s, model, 4)
}

/// 32 LoRA training clients of one base model, created and trained at once, each on its own
/// datum: they share the base's weights (one copy in the server, not 32), and each starts from
/// the base and ends where a client trained alone with the same seed and datum does, bit for
/// bit; a full fine-tune of the same base (rank 0: its own copy) trained hard changes none of
/// them.
#[test]
fn lora_clients_of_one_base_share_it_and_train_apart() {
    const CLIENTS: i32 = 32;
    let root = common::temp_dir("tinker-shared-base");
    let server = serve_util::start(
        &common::tiny_model_dir(),
        &["--root", &root.display().to_string()],
    );
    // A base whose weights (61 MB) stand out in the server's resident size.
    let base_dir = root.join("wide-base");
    let cfg = temper_model::ModelConfig::qwen2_like(260, 512, 2048, 4, 8, 2, true);
    temper_model::CausalLm::random(cfg, 5, tch::Device::Cpu, temper_model::ComputeKind::F32)
        .save(&base_dir)
        .unwrap();
    let base_bytes = std::fs::metadata(base_dir.join("model.safetensors"))
        .unwrap()
        .len();
    let sess = session(&server);
    let base = base_dir.display().to_string();
    let rss_before = resident_bytes(&server);
    let create = |seq: i32, seed: i32, rank: i64| -> String {
        let v = call(
            &server,
            "create_model",
            json!({"session_id": sess, "model_seq_id": seq, "base_model": base,
                   "lora_config": {"rank": rank, "seed": seed}}),
        );
        v["model_id"]
            .as_str()
            .unwrap_or_else(|| panic!("{v}"))
            .to_string()
    };
    let runs: Vec<(Vec<f32>, Vec<f32>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..CLIENTS)
            .map(|k| {
                let (server, create) = (&server, &create);
                scope.spawn(move || {
                    let model = create(k, k, 4);
                    (
                        probe(server, &model, 1),
                        train_and_probe(server, &model, k, 1e-2),
                    )
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // One copy of the base for 32 clients: 290 MB measured, where copies of their own grew the
    // server by 3.0 GB (the rest is the clients' adapters and optimizer state, and what their
    // threads' malloc arenas keep of the passes' working memory).
    let grown = resident_bytes(&server).saturating_sub(rss_before);
    let copies = CLIENTS as u64 * base_bytes;
    assert!(
        grown < copies / 3,
        "32 LoRA clients grew the server by {grown} bytes, over a third of 32 copies of the base ({copies})"
    );
    let base_logprobs = runs[0].0.clone();
    assert_eq!(base_logprobs.len(), 6);
    for (k, (before, after)) in runs.iter().enumerate() {
        assert_eq!(
            before, &base_logprobs,
            "client {k} did not start from the base"
        );
        assert_ne!(after, &base_logprobs, "client {k}'s step changed nothing");
    }
    assert_ne!(
        runs[0].1, runs[1].1,
        "two clients trained on different data agree"
    );

    // The first client again, alone: the same seed and datum give the same weights.
    let alone = create(CLIENTS, 0, 4);
    assert_eq!(train_and_probe(&server, &alone, 0, 1e-2), runs[0].1);
    // A full fine-tune of the base, trained hard: its own weights, so no LoRA client moves.
    let full = create(CLIENTS + 1, 0, 0);
    let moved = train_and_probe(&server, &full, 0, 1.0);
    assert_ne!(moved, base_logprobs);
    let fresh = create(CLIENTS + 2, 1, 4);
    assert_eq!(
        probe(&server, &fresh, 1),
        base_logprobs,
        "the shared base changed"
    );
}

/// A training model bigger than the machine's available memory is refused from its base's
/// config, before any weight is read, with the numbers; the server goes on serving.
#[test]
fn a_model_that_cannot_fit_is_refused_with_the_numbers() {
    let root = common::temp_dir("tinker-too-big");
    let server = serve_util::start(
        &common::tiny_model_dir(),
        &["--root", &root.display().to_string()],
    );
    // A config for ~1.6e12 parameters (6.4 TB in f32), and no weights at all.
    let huge = root.join("huge-base");
    std::fs::create_dir_all(&huge).unwrap();
    let cfg = temper_model::ModelConfig::qwen2_like(1 << 20, 1 << 16, 1 << 18, 16, 64, 8, true);
    std::fs::write(huge.join("config.json"), cfg.raw.to_string()).unwrap();
    let sess = session(&server);
    for (seq, rank, what) in [(0, 8, "LoRA model"), (1, 0, "full fine-tune")] {
        let r = call(
            &server,
            "create_model",
            json!({"session_id": sess, "model_seq_id": seq, "base_model": huge.display().to_string(),
                   "lora_config": {"rank": rank}}),
        );
        let e = r["error"].as_str().unwrap_or_else(|| panic!("{r}"));
        assert!(e.contains(what) && e.contains("GiB available"), "{e}");
        assert_eq!(r["category"], "user", "{r}");
    }
    // The server still makes models that fit.
    let m = model(&server, &sess);
    assert!(!m.is_empty());
}
