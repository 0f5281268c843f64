//! The request bodies temper's remote backends send (`remote::vllm::completion_body`,
//! `remote::sglang::generate_body`), held to the request schemas of vLLM's `/v1/completions` and
//! SGLang's `/generate` as the servers' sources define them. The schemas are transcribed (field
//! names, JSON types and bounds only) into tests/fixtures/server_request_schemas.json, which names
//! the repository, commit and file each fact was read from.
//!
//! For every request built here (edge values, then seeded pseudo-random combinations; all accepted
//! by temper's own `SamplingParams::validate`), every key a body holds must be a field the server
//! accepts, of the JSON type it declares, null only where it takes null, and within the bounds and
//! cross-field rules the server checks. A key the server does not know fails with its name: vLLM
//! would ignore it without a word (its request model allows extra fields), SGLang would refuse the
//! request (its sampling parameters are built from the dict as keyword arguments).

use std::collections::BTreeMap;

use serde_json::{json, Value};
use temper_rollout::remote::{
    check_for_server, sglang::generate_body, vllm::completion_body, Protocol,
};
use temper_rollout::{LogprobKind, Request, SamplingParams};

#[path = "remote_request_schemas/schema_check.rs"]
mod schema_check;
use schema_check::check;

fn schemas() -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/server_request_schemas.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// splitmix64: a fixed, dependency-free sequence, so any failure reproduces.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn pick<T: Clone>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len() as u64) as usize].clone()
    }
}

/// Requests with the edge values first (seed None / 0 / 2^64 - 1 / 2^63, n up to 64, greedy,
/// top_k -1 / 0 / positive, top_p 1 and below, min_tokens up to max_tokens, stop lists empty and
/// long, stop token ids, ignore_eos both ways, temperatures and repetition penalties temper
/// accepts), then 2000 seeded combinations of them. Every one passes `SamplingParams::validate`:
/// what temper lets through must be what the servers take.
fn requests() -> Vec<Request> {
    let d = SamplingParams::default;
    let mut all = vec![
        d(),
        SamplingParams::greedy(1),
        SamplingParams {
            seed: Some(0),
            ..d()
        },
        SamplingParams {
            seed: Some(u64::MAX),
            ..d()
        },
        SamplingParams {
            seed: Some(1 << 63),
            ..d()
        },
        SamplingParams {
            n: 64,
            top_k: 50,
            top_p: 0.5,
            ..d()
        },
        SamplingParams {
            min_tokens: 7,
            max_tokens: 7,
            ignore_eos: true,
            ..d()
        },
        SamplingParams {
            stop: vec!["\n\n".into()],
            stop_token_ids: vec![0, 151_643],
            ..d()
        },
    ];
    let mut rng = Rng(0x7e3a_5eed);
    for _ in 0..2000 {
        let max_tokens = rng.pick(&[1, 2, 16, 256, 4096, 1 << 20]);
        let any_seed = rng.next();
        all.push(SamplingParams {
            n: 1 + rng.below(64) as usize,
            temperature: rng.pick(&[0.0, 0.005, 0.7, 1.0, 1.5, 2.0, 3.0]),
            top_p: rng.pick(&[1.0, 0.95, 0.5, 1e-3]),
            top_k: rng.pick(&[-1, 0, 1, 50, 1 << 20]),
            min_tokens: rng.pick(&[0, 1, max_tokens / 2, max_tokens]),
            max_tokens,
            repetition_penalty: rng.pick(&[1.0, 0.5, 1.2, 2.0, 3.0]),
            stop: (0..rng.below(7)).map(|i| format!("<stop{i}>")).collect(),
            stop_token_ids: (0..rng.below(4))
                .map(|_| rng.below(152_000) as i64)
                .collect(),
            ignore_eos: rng.below(2) == 1,
            seed: rng.pick(&[None, Some(0), Some(u64::MAX), Some(1 << 63), Some(any_seed)]),
            logprobs: rng.pick(&[
                LogprobKind::Scaled,
                LogprobKind::Raw,
                LogprobKind::Processed,
            ]),
        });
    }
    all.into_iter()
        .enumerate()
        .map(|(i, params)| {
            params
                .validate(None)
                .unwrap_or_else(|e| panic!("case {i}: temper rejects its own test params: {e:#}"));
            let prompt_ids = (0..1 + i % 8)
                .map(|k| ((i * 7919 + k * 104_729) % 152_000) as i64)
                .collect();
            Request { prompt_ids, params }
        })
        .collect()
}

/// The requests temper sends to a server of `protocol`: those its pre-send check
/// (`remote::check_for_server`) lets through; the others fail before anything is sent, naming the
/// field. A third of them at least are sent (the check must not hide the bodies from the test).
fn sent(protocol: Protocol) -> Vec<Request> {
    let all = requests();
    let total = all.len();
    let kept: Vec<Request> = all
        .into_iter()
        .filter(|r| check_for_server(protocol, &r.params).is_ok())
        .collect();
    assert!(
        kept.len() * 3 > total,
        "{protocol:?}: only {} of {total} requests pass the pre-send check",
        kept.len()
    );
    kept
}

fn vllm_bodies() -> Vec<(Request, Value)> {
    sent(Protocol::Vllm)
        .into_iter()
        .map(|r| {
            let body = completion_body("m", &r);
            (r, body)
        })
        .collect()
}

fn sglang_bodies() -> Vec<(Request, Value)> {
    sent(Protocol::Sglang)
        .into_iter()
        .map(|r| {
            let body = generate_body(&r);
            (r, body)
        })
        .collect()
}

/// What the pre-send check refuses, it refuses naming the request field.
#[test]
fn requests_a_server_would_refuse_fail_before_they_are_sent() {
    let refused = |protocol, params: SamplingParams| {
        check_for_server(protocol, &params)
            .expect_err("refused")
            .to_string()
    };
    let d = SamplingParams::default;
    let e = refused(
        Protocol::Vllm,
        SamplingParams {
            temperature: 3.0,
            ..d()
        },
    );
    assert!(e.starts_with("temperature = 3"), "{e}");
    let e = refused(
        Protocol::Vllm,
        SamplingParams {
            n: 4,
            ..SamplingParams::greedy(1)
        },
    );
    assert!(e.starts_with("n = 4"), "{e}");
    let stops = (0..5).map(|i| i.to_string()).collect();
    let e = refused(Protocol::Vllm, SamplingParams { stop: stops, ..d() });
    assert!(e.starts_with("stop:"), "{e}");
    let e = refused(
        Protocol::Sglang,
        SamplingParams {
            repetition_penalty: 3.0,
            ..d()
        },
    );
    assert!(e.starts_with("repetition_penalty = 3"), "{e}");
    // temper serve takes what the engine takes.
    assert!(check_for_server(
        Protocol::OpenAi,
        &SamplingParams {
            temperature: 3.0,
            ..d()
        }
    )
    .is_ok());
}

/// The distinct problems of the bodies (shape ones, or value ones): one line per field and kind,
/// with the first request that shows it and how many do.
fn report(server: &str, spec: &Value, bodies: &[(Request, Value)], shape: bool) -> Vec<String> {
    let mut seen: BTreeMap<(String, &'static str), (String, usize)> = BTreeMap::new();
    for (r, body) in bodies {
        for p in check(body, spec) {
            if p.is_shape() != shape {
                continue;
            }
            let first = || format!("{} {} (first in {:?})", p.field, p.what, r.params);
            seen.entry((p.field.clone(), p.kind))
                .or_insert_with(|| (first(), 0))
                .1 += 1;
        }
    }
    seen.into_values()
        .map(|(line, n)| format!("{server}: {line} [{n} of {} requests]", bodies.len()))
        .collect()
}

#[test]
fn every_key_sent_is_a_field_the_server_accepts_with_its_type() {
    let s = schemas();
    let mut lines = report(
        "vLLM /v1/completions",
        &s["vllm_completions"],
        &vllm_bodies(),
        true,
    );
    lines.extend(report(
        "SGLang /generate",
        &s["sglang_generate"],
        &sglang_bodies(),
        true,
    ));
    assert!(
        lines.is_empty(),
        "request bodies break the servers' schemas:\n{}",
        lines.join("\n")
    );
}

/// Every value of `bodies` within what the server's schema (`key` in the fixture) accepts.
fn assert_values_within(server: &str, key: &str, bodies: &[(Request, Value)]) {
    let lines = report(server, &schemas()[key], bodies, false);
    assert!(
        lines.is_empty(),
        "{server} would refuse these requests that temper accepts:\n{}",
        lines.join("\n")
    );
}

#[test]
fn vllm_values_are_within_what_vllm_accepts() {
    assert_values_within("vLLM /v1/completions", "vllm_completions", &vllm_bodies());
}

#[test]
fn sglang_values_are_within_what_sglang_accepts() {
    assert_values_within("SGLang /generate", "sglang_generate", &sglang_bodies());
}

/// The checks themselves: hand-made bodies that a server refuses must fail them, naming the field.
#[test]
fn the_checks_fail_what_the_servers_refuse() {
    let s = schemas();
    let (vllm, sglang) = (&s["vllm_completions"], &s["sglang_generate"]);
    let kinds = |body: &Value, spec: &Value| {
        let mut k: Vec<(String, &'static str)> = check(body, spec)
            .into_iter()
            .map(|p| (p.field, p.kind))
            .collect();
        k.sort();
        k
    };
    let one = |field: &str, kind: &'static str| vec![(field.to_string(), kind)];
    let r = Request {
        prompt_ids: vec![1, 2, 3],
        params: SamplingParams::default(),
    };

    // The defaults pass both, so each case below fails for the one change it makes.
    assert_eq!(kinds(&completion_body("m", &r), vllm), vec![]);
    assert_eq!(kinds(&generate_body(&r), sglang), vec![]);

    // 2^64 - 1 as an unsigned JSON number: vLLM bounds the seed to a signed 64-bit integer.
    let mut b = completion_body("m", &r);
    b["seed"] = json!(u64::MAX);
    assert_eq!(kinds(&b, vllm), one("seed", "max"));

    // A name vLLM does not know (SGLang's seed), and one SGLang does not know (vLLM's), nested.
    let mut b = completion_body("m", &r);
    b["sampling_seed"] = json!(1);
    assert_eq!(kinds(&b, vllm), one("sampling_seed", "unknown"));
    let mut b = generate_body(&r);
    b["sampling_params"]["seed"] = json!(1);
    assert_eq!(kinds(&b, sglang), one("sampling_params.seed", "unknown"));

    // null where the server takes none; a string where it takes an int.
    let mut b = completion_body("m", &r);
    b["n"] = Value::Null;
    b["max_tokens"] = json!("16");
    assert_eq!(
        kinds(&b, vllm),
        vec![
            ("max_tokens".to_string(), "type"),
            ("n".to_string(), "null")
        ]
    );

    // SGLang refuses top_k 0 when sampling, but sets top_k itself when greedy.
    let mut b = generate_body(&r);
    b["sampling_params"]["top_k"] = json!(0);
    assert_eq!(kinds(&b, sglang), one("sampling_params.top_k", "min"));
    b["sampling_params"]["temperature"] = json!(0.0);
    assert_eq!(kinds(&b, sglang), vec![]);

    // vLLM: n > 1 when greedy, and min_tokens above max_tokens (256 by default).
    let mut b = completion_body("m", &r);
    b["temperature"] = json!(0.0);
    b["n"] = json!(2);
    b["min_tokens"] = json!(300);
    assert_eq!(
        kinds(&b, vllm),
        vec![
            ("min_tokens".to_string(), "rule"),
            ("n".to_string(), "rule")
        ]
    );
}
