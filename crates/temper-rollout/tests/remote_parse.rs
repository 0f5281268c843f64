//! The remote backend's parsing of vLLM `/v1/completions` bodies, from fixtures written from vLLM's
//! documented and observed response schema (tests/fixtures/vllm): token ids and one logprob per
//! token taken as they are, EOS kept; a body without token ids, with a logprob count that does not
//! match, an error body, or `finish_reason: "abort"` is an error naming the server and the field.
use temper_rollout::remote::parse_completion;
use temper_rollout::{Finish, Request, SamplingParams};

fn fixture(name: &str) -> serde_json::Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/vllm")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn request(n: usize) -> Request {
    Request {
        prompt_ids: vec![1, 4093, 198, 1780],
        params: SamplingParams {
            n,
            ..SamplingParams::default()
        },
    }
}

const URL: &str = "http://127.0.0.1:30000";

#[test]
fn a_vllm_answer_becomes_samples() {
    let s = parse_completion(&fixture("completion_ok.json"), 3, &request(2), URL).unwrap();
    assert_eq!(s.len(), 2);
    assert_eq!(
        s[0].completion_ids,
        vec![2068, 1042, 216, 39, 26, 40, 28, 346]
    );
    assert_eq!(s[0].completion_logprobs[7], -1.84957);
    assert_eq!((s[0].finish, s[1].finish), (Finish::Length, Finish::Stop));
    assert_eq!(s[1].completion_ids, vec![37, 38, 2], "the EOS id is kept");
    assert_eq!((s[1].request_index, s[1].sample_index), (3, 1));
    assert_eq!(s[0].prompt_ids, request(2).prompt_ids);
}

#[test]
fn malformed_answers_are_errors_naming_server_and_field() {
    let err = |v: serde_json::Value, n: usize| {
        format!(
            "{:#}",
            parse_completion(&v, 0, &request(n), URL).unwrap_err()
        )
    };
    let e = err(fixture("completion_text_only.json"), 1);
    assert!(
        e.starts_with(&format!("{URL}: choices[0].token_ids is missing")),
        "{e}"
    );
    let e = err(fixture("completion_abort.json"), 1);
    assert!(
        e.contains("choices[0].finish_reason is Some(\"abort\")"),
        "{e}"
    );
    let e = err(fixture("error.json"), 1);
    assert!(e.contains("has no `choices`"), "{e}");
    let e = err(fixture("completion_ok.json"), 3);
    assert!(e.contains("2 choices for n = 3"), "{e}");
    let mut v = fixture("completion_ok.json");
    v["choices"][1]["logprobs"]["token_logprobs"] = serde_json::json!([-0.5]);
    let e = err(v, 2);
    assert!(
        e.contains("choices[1].logprobs.token_logprobs has 1 values for 3 tokens"),
        "{e}"
    );
}
