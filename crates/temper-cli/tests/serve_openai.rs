//! `temper serve` as a real process on 127.0.0.1 (a free port), driven over HTTP like a vLLM
//! server: `/health`, `/v1/models`, `/v1/completions` with token-id and text prompts,
//! `/v1/chat/completions`. Completions
//! come back as token ids with one logprob per token; seeded requests give the tokens the
//! in-process engine gives for the same seed, alone or while other requests are served; bad
//! requests get a 400 naming the field. The server is stopped at the end, whatever happens.
use temper_testkit as common;
mod serve_util;

use serde_json::{json, Value};
use serve_util::Server;
use temper_model::{CausalLm, ComputeKind, GenerationConfig, Tokenizer};
use temper_rollout::{Engine, Request, SamplingParams};

fn start(extra: &[&str]) -> Server {
    let mut args = vec!["--served-model-name", "tiny"];
    args.extend(extra);
    serve_util::start(&common::tiny_model_dir(), &args)
}

fn post(s: &Server, body: &Value) -> (u16, Value) {
    let r = reqwest::blocking::Client::new()
        .post(format!("{}/v1/completions", s.url))
        .json(body)
        .send()
        .unwrap();
    (r.status().as_u16(), r.json().unwrap())
}

const PROMPT: [i64; 4] = [72, 105, 33, 10];

fn request(seed: u64) -> Value {
    json!({"model": "tiny", "prompt": PROMPT, "n": 2, "max_tokens": 8, "seed": seed, "logprobs": 0,
           "return_token_ids": true, "skip_special_tokens": false, "temperature": 1.0})
}

/// The in-process engine's tokens for the same request.
fn engine_tokens(seed: u64) -> Vec<Vec<i64>> {
    engine_tokens_of(&common::tiny_model_dir(), seed)
}

fn engine_tokens_of(weights: &std::path::Path, seed: u64) -> Vec<Vec<i64>> {
    engine_tokens_for(weights, &PROMPT, seed)
}

fn engine_tokens_for(weights: &std::path::Path, prompt: &[i64], seed: u64) -> Vec<Vec<i64>> {
    let dir = common::tiny_model_dir();
    let model = CausalLm::load(weights, tch::Device::Cpu, ComputeKind::F32).unwrap();
    let tok = Tokenizer::from_dir(&dir).unwrap();
    let eos = GenerationConfig::from_dir(&dir, Some(model.config()), Some(&tok))
        .unwrap()
        .eos_token_ids;
    let params = SamplingParams {
        n: 2,
        max_tokens: 8,
        seed: Some(seed),
        ..SamplingParams::default()
    };
    let mut samples = Engine::new(&model, eos)
        .with_decoder(&tok)
        .generate(
            &[Request {
                prompt_ids: prompt.to_vec(),
                params,
            }],
            &mut |_| {},
        )
        .unwrap();
    samples.sort_by_key(|s| s.sample_index);
    samples.into_iter().map(|s| s.completion_ids).collect()
}

fn tokens(v: &Value) -> Vec<Vec<i64>> {
    v["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| serde_json::from_value(c["token_ids"].clone()).unwrap())
        .collect()
}

#[test]
fn completions_like_vllm() {
    let s = start(&[]);
    let health = reqwest::blocking::get(format!("{}/health", s.url)).unwrap();
    assert_eq!(health.status().as_u16(), 200);
    let models: Value = reqwest::blocking::get(format!("{}/v1/models", s.url))
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(models["data"][0]["id"], "tiny");

    let (status, v) = post(&s, &request(7));
    assert_eq!(status, 200, "{v}");
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 2);
    for c in choices {
        let ids = c["token_ids"].as_array().unwrap();
        let lps = c["logprobs"]["token_logprobs"].as_array().unwrap();
        assert!(!ids.is_empty() && ids.len() <= 8);
        assert_eq!(ids.len(), lps.len());
        assert!(lps.iter().all(|l| l.as_f64().unwrap() <= 0.0));
        assert!(["stop", "length"].contains(&c["finish_reason"].as_str().unwrap()));
        assert_eq!(c["prompt_token_ids"], json!(PROMPT));
    }
    assert_eq!(
        tokens(&v),
        engine_tokens(7),
        "served tokens differ from the engine's"
    );

    // Concurrent requests are batched together and keep their own tokens.
    let handles: Vec<_> = [7u64, 8, 9]
        .iter()
        .map(|&seed| {
            let url = s.url.clone();
            std::thread::spawn(move || {
                let r: Value = reqwest::blocking::Client::new()
                    .post(format!("{url}/v1/completions"))
                    .json(&request(seed))
                    .send()
                    .unwrap()
                    .json()
                    .unwrap();
                (seed, tokens(&r))
            })
        })
        .collect();
    for h in handles {
        let (seed, t) = h.join().unwrap();
        assert_eq!(
            t,
            engine_tokens(seed),
            "seed {seed} changed under concurrency"
        );
    }

    // A text prompt and several prompts at once.
    let (status, v) = post(
        &s,
        &json!({"prompt": ["Hi!\n", "2+2="], "max_tokens": 4, "seed": 1}),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"].as_array().unwrap().len(), 2);
    assert_eq!(v["choices"][0]["prompt_token_ids"], json!(PROMPT));

    // Bad requests name the field.
    let (status, v) = post(&s, &json!({"prompt": [1, 999], "max_tokens": 4}));
    assert_eq!(status, 400);
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .starts_with("prompt[0][1] = 999"),
        "{v}"
    );
    // Up to 20 top logprobs, as vLLM's default max_logprobs (tests/serve_top_logprobs.rs checks
    // their values).
    let (status, v) = post(&s, &json!({"prompt": [1, 2], "logprobs": 21}));
    assert_eq!(status, 400);
    assert!(
        v["message"].as_str().unwrap().starts_with("logprobs: 21"),
        "{v}"
    );
    let (status, v) = post(&s, &json!({"prompt": [1, 2], "model": "other"}));
    assert_eq!(status, 404, "{v}");
    let (status, v) = post(&s, &json!({"prompt": [1, 2], "temperature": -1.0}));
    assert_eq!(status, 400);
    assert!(
        v["message"].as_str().unwrap().contains("temperature"),
        "{v}"
    );
    let r = reqwest::blocking::Client::new()
        .post(format!("{}/v1/completions", s.url))
        .body("{not json")
        .header("content-type", "application/json")
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    // Still serving.
    assert_eq!(post(&s, &request(7)).0, 200);
}

#[test]
fn an_api_key_is_required_when_set() {
    let s = start(&["--api-key", "sesame"]);
    let (status, v) = post(&s, &request(1));
    assert_eq!(status, 401, "{v}");
    let ok = reqwest::blocking::Client::new()
        .post(format!("{}/v1/completions", s.url))
        .bearer_auth("sesame")
        .json(&request(1))
        .send()
        .unwrap();
    assert_eq!(ok.status().as_u16(), 200);
}

/// Both reload styles swap the served weights between requests; a bad folder is refused and the
/// old weights keep serving.
#[test]
fn weights_reload_from_disk_in_both_styles() {
    let s = start(&[]);
    let before = tokens(&post(&s, &request(7)).1);
    let other = common::temp_dir("serve-reload");
    let cfg = temper_model::ModelConfig::qwen2_like(260, 32, 64, 2, 4, 2, true);
    CausalLm::random(cfg, 99, tch::Device::Cpu, ComputeKind::F32)
        .save(&other)
        .unwrap();
    let want = engine_tokens_of(&other, 7);
    assert_ne!(want, before, "the other weights sample the same tokens");

    let (status, v) = serve_util::post_json(
        &s,
        "/update_weights_from_disk",
        &json!({"model_path": other}),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(tokens(&post(&s, &request(7)).1), want);

    let rpc =
        json!({"method": "reload_weights", "kwargs": {"weights_path": common::tiny_model_dir()}});
    let (status, v) = serve_util::post_json(&s, "/collective_rpc", &rpc);
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        serve_util::post_json(&s, "/reset_prefix_cache", &json!({})).0,
        200
    );
    assert_eq!(tokens(&post(&s, &request(7)).1), before);

    // Another shape, or a folder without weights: refused, nothing changes.
    let wrong = common::temp_dir("serve-wrong");
    let cfg = temper_model::ModelConfig::qwen2_like(260, 16, 64, 2, 4, 2, true);
    CausalLm::random(cfg, 1, tch::Device::Cpu, ComputeKind::F32)
        .save(&wrong)
        .unwrap();
    let (status, v) = serve_util::post_json(
        &s,
        "/update_weights_from_disk",
        &json!({"model_path": wrong}),
    );
    assert_eq!(status, 400, "{v}");
    assert!(
        v["message"].as_str().unwrap().starts_with("model_path: "),
        "{v}"
    );
    let empty = common::temp_dir("serve-empty");
    let (status, _) = serve_util::post_json(
        &s,
        "/collective_rpc",
        &json!({"method": "reload_weights", "kwargs": {"weights_path": empty}}),
    );
    assert_eq!(status, 400);
    let (status, _) = serve_util::post_json(&s, "/collective_rpc", &json!({"method": "other"}));
    assert_eq!(status, 400);
    assert_eq!(tokens(&post(&s, &request(7)).1), before);
}

/// SGLang's `/generate`: the same tokens as the engine for the same seed, logprobs as
/// `[logprob, id, null]`, a list for n > 1 or several prompts and an object otherwise.
#[test]
fn sglang_generate() {
    let s = start(&[]);
    let body = json!({"input_ids": PROMPT, "return_logprob": true,
                      "sampling_params": {"max_new_tokens": 8, "n": 2, "sampling_seed": 7, "temperature": 1.0}});
    let (status, v) = serve_util::post_json(&s, "/generate", &body);
    assert_eq!(status, 200, "{v}");
    let outs = v.as_array().unwrap();
    let ids: Vec<Vec<i64>> = outs
        .iter()
        .map(|o| serde_json::from_value(o["output_ids"].clone()).unwrap())
        .collect();
    assert_eq!(ids, engine_tokens(7));
    for o in outs {
        let lps = o["meta_info"]["output_token_logprobs"].as_array().unwrap();
        assert_eq!(lps.len(), o["output_ids"].as_array().unwrap().len());
        assert_eq!(lps[0][1], o["output_ids"][0]);
        assert!(
            ["stop", "length"].contains(&o["meta_info"]["finish_reason"]["type"].as_str().unwrap())
        );
    }
    let one = json!({"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 3}});
    let (status, v) = serve_util::post_json(&s, "/generate", &one);
    assert_eq!(status, 200, "{v}");
    assert!(v["output_ids"].is_array(), "{v}");
    let (status, v) =
        serve_util::post_json(&s, "/generate", &json!({"input_ids": [[1, 2], [3, 400]]}));
    assert_eq!(status, 400);
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .starts_with("input_ids[1][1] = 400"),
        "{v}"
    );
}

/// `/v1/chat/completions`: the conversation rendered as ChatML (the tiny model's template, written
/// out here by hand), then sampled like a completion: the same tokens as the engine on that
/// prompt, the content their decoded text, one logprob per token.
#[test]
fn chat_completions_through_the_chat_template() {
    let s = start(&[]);
    let body = json!({"model": "tiny", "messages": [{"role": "system", "content": "Be brief."},
                                                     {"role": "user", "content": [{"type": "text", "text": "Hi!"}]}],
                      "n": 2, "max_tokens": 8, "seed": 5, "logprobs": true});
    let (status, v) = serve_util::post_json(&s, "/v1/chat/completions", &body);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "chat.completion");
    let dir = common::tiny_model_dir();
    let tok = Tokenizer::from_dir(&dir).unwrap();
    let text = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n";
    let prompt = tok.encode(text, false).unwrap();
    assert_eq!(v["prompt_token_ids"], json!(prompt));
    assert_eq!(tokens(&v), engine_tokens_for(&dir, &prompt, 5));
    for c in v["choices"].as_array().unwrap() {
        let ids: Vec<i64> = serde_json::from_value(c["token_ids"].clone()).unwrap();
        assert_eq!(c["message"]["role"], "assistant");
        assert_eq!(c["message"]["content"], tok.decode(&ids, true).unwrap());
        assert_eq!(
            c["logprobs"]["content"].as_array().unwrap().len(),
            ids.len()
        );
    }
    for (bad, field) in [
        (json!({"messages": []}), "messages: empty"),
        (json!({"messages": [{"content": "x"}]}), "messages[0].role"),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "stream": true}),
            "stream:",
        ),
    ] {
        let (status, v) = serve_util::post_json(&s, "/v1/chat/completions", &bad);
        assert_eq!(status, 400, "{v}");
        assert!(v["message"].as_str().unwrap().starts_with(field), "{v}");
    }
}

/// Continuous batching: a short request sent while a long one is decoding joins the running
/// batch and is answered before the long one ends, with the tokens the engine gives it alone.
#[test]
fn a_request_joins_the_running_batch() {
    let s = start(&[]);
    let url = s.url.clone();
    let long = std::thread::spawn(move || {
        let body = json!({"prompt": PROMPT, "max_tokens": 3000, "ignore_eos": true, "seed": 3});
        let r: Value = reqwest::blocking::Client::new()
            .post(format!("{url}/v1/completions"))
            .json(&body)
            .send()
            .unwrap()
            .json()
            .unwrap();
        r["choices"][0]["token_ids"].as_array().unwrap().len()
    });
    // Let the long request start decoding.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let (status, v) = post(&s, &request(7));
    assert_eq!(status, 200, "{v}");
    assert!(
        !long.is_finished(),
        "the short request waited for the long one to end"
    );
    assert_eq!(tokens(&v), engine_tokens(7));
    assert_eq!(long.join().unwrap(), 3000);
}

/// A client that hangs up mid-request: the server stops sampling for it (and says so), and goes
/// on serving the next request with the tokens the engine gives it.
#[test]
fn a_client_that_hangs_up_mid_request() {
    use std::io::Write;
    let s = start(&[]);
    let addr = s.url.trim_start_matches("http://").to_string();
    let body = json!({"prompt": PROMPT, "max_tokens": 3000, "ignore_eos": true, "seed": 3});
    let body = body.to_string();
    let mut conn = std::net::TcpStream::connect(&addr).unwrap();
    write!(
        conn,
        "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    // Let it start decoding, then hang up.
    std::thread::sleep(std::time::Duration::from_millis(300));
    drop(conn);
    let said = |s: &serve_util::Server| {
        s.log
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains("client went away"))
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !said(&s) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(said(&s), "the server did not stop the request: {:?}", s.log);
    let (status, v) = post(&s, &request(7));
    assert_eq!(status, 200, "{v}");
    assert_eq!(tokens(&v), engine_tokens(7));
}
