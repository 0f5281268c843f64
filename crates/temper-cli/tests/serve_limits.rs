//! `temper serve`'s admission limits over HTTP, as a hostile or careless client meets them: a huge
//! `n` (OpenAI, SGLang) or `num_samples` (Tinker), a prompt + max_tokens beyond the context, a
//! body over `--max-request-bytes`, a Tinker call without its key: each refused with the API's
//! error shape naming the field and the limit, and the server keeps answering everyone else.
use temper_testkit as common;
mod serve_util;

use serde_json::{json, Value};
use serve_util::{post_json as post, Server};

fn start(extra: &[&str]) -> Server {
    let mut args = vec!["--served-model-name", "tiny"];
    args.extend(extra);
    serve_util::start(&common::tiny_model_dir(), &args)
}

fn ok_request() -> Value {
    json!({"model": "tiny", "prompt": [72, 105, 33], "max_tokens": 4, "seed": 1})
}

#[test]
fn out_of_range_requests_are_refused_naming_the_field() {
    let s = start(&["--max-n", "8", "--max-model-len", "64"]);
    let (status, v) = post(
        &s,
        "/v1/completions",
        &json!({"prompt": [1, 2], "n": 100000000000u64, "max_tokens": 4}),
    );
    assert_eq!(status, 400, "{v}");
    let msg = v["message"].as_str().unwrap();
    assert!(
        msg.starts_with("n = 100000000000") && msg.contains("--max-n"),
        "{v}"
    );
    assert_eq!(v["object"], "error");

    let (status, v) = post(
        &s,
        "/v1/completions",
        &json!({"prompt": [1, 2, 3], "max_tokens": 62}),
    );
    assert_eq!(status, 400, "{v}");
    let msg = v["message"].as_str().unwrap();
    assert!(msg.contains("max_tokens = 62") && msg.contains("64"), "{v}");

    let (status, v) = post(
        &s,
        "/generate",
        &json!({"input_ids": [1, 2], "sampling_params": {"n": 1e12, "max_new_tokens": 4}}),
    );
    assert_eq!(status, 400, "{v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .starts_with("sampling_params.n ="),
        "{v}"
    );
    let (status, v) = post(
        &s,
        "/generate",
        &json!({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 1e15}}),
    );
    assert_eq!(status, 400, "{v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("sampling_params.max_new_tokens"),
        "{v}"
    );
    // Still serving, with the same answer as before.
    assert_eq!(post(&s, "/v1/completions", &ok_request()).0, 200);
}

#[test]
fn a_body_over_the_limit_gets_a_json_413_naming_it() {
    let s = start(&["--max-request-bytes", "4096"]);
    let prompt: Vec<i64> = (0..3000).map(|i| i % 50).collect();
    let (status, v) = post(&s, "/v1/completions", &json!({"prompt": prompt}));
    assert_eq!(status, 413, "{v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("--max-request-bytes"),
        "{v}"
    );
    let (status, v) = post(
        &s,
        "/api/v1/asample",
        &json!({"prompt": {"chunks": [{"tokens": prompt, "type": "encoded_text"}]}}),
    );
    assert_eq!(status, 413, "{v}");
    assert_eq!(v["category"], "user", "{v}");
    assert!(v["error"].as_str().unwrap().contains("4096 bytes"), "{v}");
    assert_eq!(post(&s, "/v1/completions", &ok_request()).0, 200);
}

#[test]
fn tinker_checks_the_key_before_anything_and_bounds_num_samples() {
    let s = start(&["--api-key", "sesame", "--max-n", "8"]);
    let huge = json!({"num_samples": 100000000000u64, "sampling_session_id": "x",
                      "prompt": {"chunks": []}, "sampling_params": {}});
    let (status, v) = post(&s, "/api/v1/asample", &huge);
    assert_eq!(status, 401, "{v}");
    let r = reqwest::blocking::Client::new()
        .post(format!("{}/api/v1/asample", s.url))
        .header("x-api-key", "sesame")
        .json(&huge)
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let v: Value = r.json().unwrap();
    // No sequence ids for a refused count; the refusal is the future's result.
    assert_eq!(v["sample_sequence_ids"], json!([]), "{v}");
    let id = v["request_id"].as_str().unwrap();
    let r = reqwest::blocking::Client::new()
        .post(format!("{}/api/v1/retrieve_future", s.url))
        .header("x-api-key", "sesame")
        .json(&json!({"request_id": id}))
        .send()
        .unwrap();
    let v: Value = r.json().unwrap();
    assert_eq!(v["category"], "user", "{v}");
    let msg = v["error"].as_str().unwrap();
    assert!(
        msg.starts_with("num_samples = 100000000000") && msg.contains("--max-n"),
        "{v}"
    );
}
