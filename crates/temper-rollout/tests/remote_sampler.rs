//! `RemoteSampler` against small fake servers on loopback that answer recorded bodies
//! (tests/fixtures): an HTTP error body, a body without token ids, token ids outside the
//! trainer's vocabulary, a failing reload. Each is a one-line error naming the server and the
//! field; a server whose reload fails is left out while another one reloads.
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::time::Duration;

use temper_rollout::remote::{Protocol, RemoteConfig, RemoteSampler};
use temper_rollout::{Request, SamplingParams};

fn fixture(path: &str) -> String {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(path);
    std::fs::read_to_string(p).unwrap()
}

/// A server answering `/v1/models` with model `m` and `POST route` with (status, body); other
/// routes get 404. It serves until the test process ends.
fn fake(answers: Vec<(&'static str, u16, String)>) -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut reader = BufReader::new(conn.try_clone().unwrap());
            let mut head = String::new();
            let mut len = 0usize;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    len = v.trim().parse().unwrap_or(0);
                }
                head.push_str(&line);
            }
            let mut body = vec![0u8; len];
            let _ = reader.read_exact(&mut body);
            let path = head.split_whitespace().nth(1).unwrap_or("").to_string();
            let (status, text) = if path == "/v1/models" {
                (
                    200,
                    r#"{"object": "list", "data": [{"id": "m", "object": "model"}]}"#.to_string(),
                )
            } else {
                answers
                    .iter()
                    .find(|(p, _, _)| *p == path)
                    .map(|(_, s, b)| (*s, b.clone()))
                    .unwrap_or((404, r#"{"error": "no such route"}"#.to_string()))
            };
            let _ = write!(
                conn,
                "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
                text.len()
            );
        }
    });
    url
}

fn sampler(urls: Vec<String>, protocol: Protocol) -> RemoteSampler {
    RemoteSampler::connect(RemoteConfig {
        protocol,
        base_urls: urls,
        timeout: Duration::from_secs(10),
        vllm_reload_method: "reload_weights".into(),
        vocab_size: Some(1000),
    })
    .unwrap()
}

fn request(n: usize) -> Vec<Request> {
    vec![Request {
        prompt_ids: vec![1, 2, 3],
        params: SamplingParams {
            n,
            ..SamplingParams::default()
        },
    }]
}

fn generate_err(url: &str, protocol: Protocol, n: usize) -> String {
    let e = sampler(vec![url.to_string()], protocol)
        .generate(&request(n))
        .unwrap_err();
    let e = format!("{e:#}");
    assert!(!e.contains('\n'), "one line: {e}");
    e
}

#[test]
fn bad_answers_are_one_line_errors_naming_server_and_field() {
    let url = fake(vec![("/v1/completions", 400, fixture("vllm/error.json"))]);
    let e = generate_err(&url, Protocol::Vllm, 2);
    assert!(
        e.contains(&format!(
            "{url}/v1/completions: HTTP 400 Bad Request: This model's maximum context"
        )),
        "{e}"
    );
    let url = fake(vec![(
        "/v1/completions",
        200,
        fixture("vllm/completion_text_only.json"),
    )]);
    let e = generate_err(&url, Protocol::Vllm, 1);
    assert!(
        e.contains(&format!("{url}: choices[0].token_ids is missing")),
        "{e}"
    );
    // completion_ok.json samples ids up to 2068: another model than a 1000-token trainer's.
    let url = fake(vec![(
        "/v1/completions",
        200,
        fixture("vllm/completion_ok.json"),
    )]);
    let e = generate_err(&url, Protocol::Vllm, 2);
    assert!(
        e.contains("token id 2068, outside the trainer's vocabulary of 1000"),
        "{e}"
    );
    let url = fake(vec![("/generate", 400, fixture("sglang/error.json"))]);
    let e = generate_err(&url, Protocol::Sglang, 1);
    assert!(
        e.contains(&format!(
            "{url}/generate: HTTP 400 Bad Request: The input (2100 tokens)"
        )),
        "{e}"
    );
}

#[test]
fn a_server_failing_its_reload_is_left_out() {
    let dir = std::env::temp_dir();
    let good = fake(vec![
        (
            "/update_weights_from_disk",
            200,
            r#"{"success": true}"#.into(),
        ),
        ("/flush_cache", 200, String::new()),
    ]);
    let bad = fake(vec![(
        "/update_weights_from_disk",
        200,
        r#"{"success": false, "message": "shape mismatch"}"#.into(),
    )]);
    let s = sampler(vec![bad.clone(), good.clone()], Protocol::Sglang);
    s.reload(&dir, 1).unwrap();
    assert_eq!(s.live_urls(), vec![good]);
    let s = sampler(vec![bad.clone()], Protocol::Sglang);
    let e = format!("{:#}", s.reload(&dir, 1).unwrap_err());
    assert!(
        e.contains("no rollout server reloaded") && e.contains("shape mismatch"),
        "{e}"
    );
}
