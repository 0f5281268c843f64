//! 10,000 random and mutated request bodies over every route of `temper serve` (OpenAI, SGLang,
//! reload, Tinker JSON and protobuf), from valid seeds: fields replaced by wrong types, huge,
//! negative and non-finite numbers, empty and absurdly long arrays, invalid UTF-8, truncated and
//! bit-flipped bytes, and plain noise; GET routes and path parameters with hostile ids. The server
//! must answer every one (no crash, no dropped connection), never with a 5xx (every one is a client
//! error or a valid request), and a Tinker future's result is never a `server` failure; `/health`
//! answers throughout, and a valid request still gets the same answer at the end.
use temper_testkit as common;
mod serve_util;

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{json, Value};

const BODIES: usize = 10_000;

/// SplitMix64 (temper's one, `temper_base::seed::mix64`): the test's reproducible randomness.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        use temper_base::seed::{mix64, GOLDEN_GAMMA};
        self.0 = self.0.wrapping_add(GOLDEN_GAMMA);
        mix64(self.0)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Values that break naive parsers.
fn hostile(r: &mut Rng) -> Value {
    match r.below(16) {
        0 => json!(null),
        1 => json!(-1),
        2 => json!(1e300),
        3 => json!(-1e300),
        4 => json!(u64::MAX),
        5 => json!(i64::MIN),
        6 => json!(100_000_000_000u64),
        7 => json!("a string"),
        8 => json!(true),
        9 => json!([]),
        10 => json!({}),
        11 => Value::Array((0..100_000).map(|i| json!(i)).collect()),
        12 => json!([[1, 2], [3, "x"], null]),
        13 => json!(0.5),
        14 => json!("\u{0}\u{ffff}"),
        _ => json!({"nested": {"deeper": [1, {"x": -7}]}}),
    }
}

/// Replaces one field, at any depth, by a hostile value (or removes it).
fn mutate_json(v: &mut Value, r: &mut Rng) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            let keys: Vec<String> = m.keys().cloned().collect();
            let k = &keys[r.below(keys.len())];
            match r.below(4) {
                0 => {
                    m.remove(k);
                }
                1 => mutate_json(m.get_mut(k).unwrap(), r),
                _ => {
                    m.insert(k.clone(), hostile(r));
                }
            }
        }
        Value::Array(a) if !a.is_empty() => {
            let i = r.below(a.len());
            if r.below(2) == 0 {
                mutate_json(&mut a[i], r)
            } else {
                a[i] = hostile(r)
            }
        }
        other => *other = hostile(r),
    }
}

/// Byte-level damage: truncation, flipped bytes, invalid UTF-8, duplicated slices.
fn mutate_bytes(b: &mut Vec<u8>, r: &mut Rng) {
    for _ in 0..1 + r.below(4) {
        if b.is_empty() {
            b.push(r.next() as u8);
            continue;
        }
        let i = r.below(b.len());
        match r.below(5) {
            0 => b.truncate(i),
            1 => b[i] ^= 1 << r.below(8),
            2 => b.insert(i, [0xff, 0xc0, 0x80, 0xfe][r.below(4)]),
            3 => {
                let end = (i + 1 + r.below(16)).min(b.len());
                let slice = b[i..end].to_vec();
                b.splice(i..i, slice);
            }
            _ => b[i] = r.next() as u8,
        }
    }
}

#[test]
fn ten_thousand_hostile_bodies_get_client_errors_and_the_server_keeps_serving() {
    let root = common::temp_dir("serve-fuzz");
    let server = serve_util::start(
        &common::tiny_model_dir(),
        &[
            "--root",
            &root.display().to_string(),
            "--max-model-len",
            "64",
            "--max-n",
            "4",
        ],
    );
    let http = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let url = server.url.clone();
    let log = server.log.clone();
    let post = |route: &str, body: Vec<u8>| -> (u16, Vec<u8>) {
        let r = http
            .post(format!("{url}{route}"))
            .header("content-type", "application/json")
            .header("X-API-Key", "tml-local")
            .body(body.clone())
            .send()
            .unwrap_or_else(|e| {
                std::thread::sleep(Duration::from_millis(500));
                panic!(
                    "{route}: no answer: {e}\nbody: {}\nserver log:\n{}",
                    String::from_utf8_lossy(&body[..body.len().min(2000)]),
                    log.lock().unwrap().join("\n")
                )
            });
        (r.status().as_u16(), r.bytes().unwrap().to_vec())
    };
    let json_of = |b: &[u8]| serde_json::from_slice::<Value>(b).unwrap_or(Value::Null);

    // Live ids for the seeds: a session, a training model, a sampling session.
    let (_, b) = post("/api/v1/create_session", br#"{"tags": []}"#.to_vec());
    let session = json_of(&b)["session_id"].as_str().unwrap().to_string();
    let base = common::tiny_model_dir().display().to_string();
    let future = |route: &str, body: Value| -> Value {
        let (_, b) = post(route, serde_json::to_vec(&body).unwrap());
        let id = json_of(&b)["request_id"].clone();
        loop {
            let (_, b) = post(
                "/api/v1/retrieve_future",
                serde_json::to_vec(&json!({"request_id": id})).unwrap(),
            );
            let v = json_of(&b);
            if v["type"] != "try_again" {
                return v;
            }
        }
    };
    let model = future(
        "/api/v1/create_model",
        json!({"session_id": session, "model_seq_id": 0, "base_model": base, "lora_config": {"rank": 2}}),
    )["model_id"]
        .as_str()
        .unwrap()
        .to_string();
    let (_, b) = post(
        "/api/v1/create_sampling_session",
        serde_json::to_vec(
            &json!({"session_id": session, "sampling_session_seq_id": 0, "base_model": base}),
        )
        .unwrap(),
    );
    let sampler = json_of(&b)["sampling_session_id"]
        .as_str()
        .unwrap()
        .to_string();

    // A second session, which the fuzz may finish (the first one's model serves every seed).
    let (_, b) = post("/api/v1/create_session", br#"{"tags": []}"#.to_vec());
    let spare = json_of(&b)["session_id"].as_str().unwrap().to_string();

    let completion = json!({"prompt": [1, 2, 3], "max_tokens": 4, "n": 2, "seed": 5, "logprobs": 0,
                            "temperature": 1.0});
    let seeds: Vec<(&str, Value)> = vec![
        ("/v1/completions", completion.clone()),
        (
            "/v1/completions",
            json!({"prompt": "hi there", "max_tokens": 3, "stop": ["x"]}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}),
        ),
        (
            "/generate",
            json!({"input_ids": [1, 2, 3], "return_logprob": true,
                             "sampling_params": {"max_new_tokens": 4, "n": 2, "sampling_seed": 3}}),
        ),
        (
            "/generate",
            json!({"text": "hello", "sampling_params": {"max_new_tokens": 3}}),
        ),
        (
            "/update_weights_from_disk",
            json!({"model_path": "/nonexistent/folder"}),
        ),
        (
            "/collective_rpc",
            json!({"method": "reload_weights", "kwargs": {"weights_path": "/nonexistent"}}),
        ),
        (
            "/api/v1/create_session",
            json!({"tags": ["a"], "sdk_version": "0.38.0"}),
        ),
        ("/api/v1/session_heartbeat", json!({"session_id": session})),
        ("/api/v1/get_info", json!({"model_id": model})),
        (
            "/api/v1/create_model",
            json!({"session_id": session, "model_seq_id": 9,
                                        "base_model": "/nonexistent/model", "lora_config": {"rank": 2}}),
        ),
        (
            "/api/v1/optim_step",
            json!({"model_id": model, "seq_id": 2, "adam_params": {"learning_rate": 0.0}}),
        ),
        (
            "/api/v1/save_weights",
            json!({"model_id": model, "seq_id": 3, "path": "ckpt"}),
        ),
        (
            "/api/v1/load_weights",
            json!({"model_id": model, "seq_id": 4, "path": "tinker://x/weights/y"}),
        ),
        (
            "/api/v1/create_sampling_session",
            json!({"session_id": session, "sampling_session_seq_id": 1,
                                                   "model_path": "tinker://nope/sampler_weights/x"}),
        ),
        (
            "/api/v1/asample",
            json!({"sampling_session_id": sampler, "num_samples": 2,
                                   "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 2]}]},
                                   "sampling_params": {"max_tokens": 3, "seed": 1}}),
        ),
        // The 0.38 fields: prompt top-k and recording for StableReinforce.
        (
            "/api/v1/asample",
            json!({"sampling_session_id": sampler, "num_samples": 2, "record_stability_info": true,
                   "prompt_logprobs": true, "topk_prompt_logprobs": 3,
                   "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 2, 3]}]},
                   "sampling_params": {"max_tokens": 3, "seed": 1}}),
        ),
        // Target ids (sparse, as the cookbook sends them), draws and sampled top-k.
        (
            "/api/v1/asample",
            json!({"sampling_session_id": sampler, "num_samples": 2, "topk_sample_logprobs": 2,
                   "prompt_alt_tokens_k": 3,
                   "target_prompt_logprobs": {"data": [5, 6], "dtype": "int64", "shape": [3, 2],
                       "sparse_crow_indices": [0, 0, 2, 2], "sparse_col_indices": [0, 1]},
                   "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 2, 3, 4]}]},
                   "sampling_params": {"max_tokens": 3, "seed": 1}}),
        ),
        (
            "/v1/completions",
            json!({"prompt": [1, 2, 3], "max_tokens": 3, "logprobs": 5, "prompt_logprobs": 3}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                   "logprobs": true, "top_logprobs": 4}),
        ),
        (
            "/generate",
            json!({"input_ids": [1, 2, 3], "return_logprob": true, "top_logprobs_num": 3,
                   "logprob_start_len": 0, "sampling_params": {"max_new_tokens": 3}}),
        ),
        (
            "/api/v1/create_custom_loss",
            json!({"model_id": model, "loss_fn": "x"}),
        ),
        ("/api/v1/retrieve_future", json!({"request_id": "nope"})),
        ("/api/v1/client/config", json!({"sdk_version": "0.38.0"})),
        (
            "/reload_weights",
            json!({"weights_path": "/nonexistent/folder"}),
        ),
        ("/reset_prefix_cache", json!({})),
        ("/flush_cache", json!({})),
        (
            "/api/v1/save_weights_for_sampler",
            json!({"model_id": model, "seq_id": 5, "path": "snap", "sampling_session_seq_id": 3}),
        ),
        (
            "/api/v1/sessions/spare/finish",
            json!({"session_id": spare}),
        ),
        ("/api/v1/client/dynamic_config", json!({})),
        ("/api/v1/telemetry", json!({"events": [{"event": "x"}]})),
    ];
    // GET routes, and the path parameters of every route, with hostile ids.
    let gets = [
        "/v1/models",
        "/health",
        "/api/v1/samplers/",
        "/api/v1/get_server_capabilities",
    ];
    let path_ids = [
        sampler.clone(),
        "nope".to_string(),
        "%00%ff".to_string(),
        "..%2F..%2Fetc".to_string(),
        "x".repeat(5000),
    ];
    let fb = serve_util::forward_backward_body(&model, 1, &[1, 2, 3, 4], &[2, 3, 4, 5], true);
    let before = post("/v1/completions", serde_json::to_vec(&completion).unwrap());
    assert_eq!(before.0, 200);

    let mut rng = Rng(2026);
    let (mut statuses, mut futures_checked) = (HashMap::<u16, usize>::new(), 0);
    for i in 0..BODIES {
        let (route, body) = if i % 19 == 0 {
            ("/api/v1/forward_backward", {
                let mut b = fb.clone();
                mutate_bytes(&mut b, &mut rng);
                b
            })
        } else {
            let (route, seed) = &seeds[rng.below(seeds.len())];
            let body = match rng.below(10) {
                0 => (0..rng.below(300)).map(|_| rng.next() as u8).collect(),
                1..=3 => {
                    let mut b = serde_json::to_vec(seed).unwrap();
                    mutate_bytes(&mut b, &mut rng);
                    b
                }
                _ => {
                    let mut v = seed.clone();
                    for _ in 0..1 + rng.below(3) {
                        mutate_json(&mut v, &mut rng);
                    }
                    serde_json::to_vec(&v).unwrap()
                }
            };
            (*route, body)
        };
        let (status, answer) = post(route, body.clone());
        *statuses.entry(status).or_default() += 1;
        assert!(
            status < 500,
            "{route} answered {status} to a client's body: {}\nbody: {}",
            String::from_utf8_lossy(&answer),
            String::from_utf8_lossy(&body[..body.len().min(2000)])
        );
        // Every 25th future-style answer: its result is not a server failure.
        let v = json_of(&answer);
        if i % 25 == 0 && v["request_id"].is_string() {
            futures_checked += 1;
            let poll = serde_json::to_vec(&json!({"request_id": v["request_id"]})).unwrap();
            loop {
                let (s, b) = post("/api/v1/retrieve_future", poll.clone());
                let r = json_of(&b);
                assert!(
                    s < 500 && r["category"] != "server",
                    "{route}: {r}\nbody: {}",
                    String::from_utf8_lossy(&body[..body.len().min(2000)])
                );
                if r["type"] != "try_again" {
                    break;
                }
            }
        }
        if i % 50 == 0 {
            let route = gets[rng.below(gets.len())];
            let path = if route.ends_with('/') {
                format!("{route}{}", path_ids[rng.below(path_ids.len())])
            } else {
                route.to_string()
            };
            let r = http
                .get(format!("{url}{path}"))
                .header("X-API-Key", "tml-local")
                .send()
                .unwrap_or_else(|e| panic!("GET {path}: no answer: {e}"));
            let status = r.status().as_u16();
            assert!(status < 500, "GET {path} answered {status}");
            *statuses.entry(status).or_default() += 1;
            // A finish of an unknown or hostile session id is refused or a no-op, never a 5xx.
            let finish = format!(
                "/api/v1/sessions/{}/finish",
                path_ids[rng.below(path_ids.len())]
            );
            let (status, answer) = post(&finish, b"{}".to_vec());
            assert!(
                status < 500,
                "{finish} answered {status}: {}",
                String::from_utf8_lossy(&answer)
            );
        }
        if i % 1000 == 0 {
            let health = http.get(format!("{url}/health")).send().unwrap();
            assert_eq!(health.status().as_u16(), 200, "after {i} bodies");
        }
    }
    let mut seen: Vec<_> = statuses.into_iter().collect();
    seen.sort();
    println!("{BODIES} bodies: statuses {seen:?}; {futures_checked} futures' results checked");
    // Still serving, and the same answer as before: the same tokens, and logprobs to 1e-4 as in
    // serve_load.rs (fuzzed Tinker samples whose futures were never polled may still be on the
    // worker and share its batch, which changes float rounding in the last bits).
    let after = post("/v1/completions", serde_json::to_vec(&completion).unwrap());
    assert_eq!(after.0, 200);
    let (a, b) = (json_of(&after.1), json_of(&before.1));
    let choices = |v: &Value| v["choices"].as_array().cloned().unwrap_or_default();
    let (ca, cb) = (choices(&a), choices(&b));
    assert_eq!(ca.len(), cb.len(), "{a}\n{b}");
    for (x, y) in ca.iter().zip(&cb) {
        assert_eq!(x["token_ids"], y["token_ids"], "{a}\n{b}");
        assert_eq!(x["text"], y["text"], "{a}\n{b}");
        let logp = |c: &Value| -> Vec<f64> {
            c["logprobs"]["token_logprobs"]
                .as_array()
                .map(|v| v.iter().filter_map(Value::as_f64).collect())
                .unwrap_or_default()
        };
        let (lx, ly) = (logp(x), logp(y));
        assert_eq!(lx.len(), ly.len(), "{a}\n{b}");
        assert!(
            lx.iter().zip(&ly).all(|(p, q)| (p - q).abs() <= 1e-4),
            "{a}\n{b}"
        );
    }
}
