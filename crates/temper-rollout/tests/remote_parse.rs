//! The remote backend's parsing of vLLM `/v1/completions` and SGLang `/generate` bodies, from
//! fixtures written from their documented and observed response schemas (tests/fixtures/vllm,
//! tests/fixtures/sglang): token ids and one logprob per token taken as they are, EOS kept; a body
//! without token ids or logprobs, with a logprob count that does not match, an error body, or an
//! `abort` finish is an error naming the server and the field.
use temper_rollout::remote::parse_completion;
use temper_rollout::remote::sglang::parse_generate;
use temper_rollout::{Finish, Request, SamplingParams};

fn fixture(name: &str) -> serde_json::Value {
    fixture_of("vllm", name)
}

fn fixture_of(server: &str, name: &str) -> serde_json::Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(server)
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

#[test]
fn ids_from_token_strings_when_token_ids_are_absent() {
    // `return_tokens_as_token_ids` renders tokens as `token_id:N` (servers without token_ids).
    let mut v = fixture("completion_ok.json");
    let c = &mut v["choices"][1];
    c.as_object_mut().unwrap().remove("token_ids");
    c["logprobs"]["tokens"] = serde_json::json!(["token_id:37", "token_id:38", "token_id:2"]);
    let s = parse_completion(&v, 0, &request(2), URL).unwrap();
    assert_eq!(s[1].completion_ids, vec![37, 38, 2]);
}

#[test]
fn an_sglang_answer_becomes_samples() {
    let sg = |name: &str| fixture_of("sglang", name);
    let s = parse_generate(&sg("generate_n2.json"), 5, &request(2), URL).unwrap();
    assert_eq!(s[0].completion_ids, vec![2068, 1042, 216, 39]);
    assert_eq!(
        s[0].completion_logprobs,
        vec![-0.93563, -0.6993, -0.40106, -1.84957]
    );
    assert_eq!((s[0].finish, s[1].finish), (Finish::Length, Finish::Stop));
    assert_eq!(
        s[1].completion_ids,
        vec![37, 38, 2],
        "the stop token is kept"
    );
    assert_eq!((s[1].request_index, s[1].sample_index), (5, 1));
    let one = parse_generate(&sg("generate_one.json"), 0, &request(1), URL).unwrap();
    assert_eq!(one[0].completion_logprobs, vec![-0.5, -0.25, -0.125]);
}

#[test]
fn malformed_sglang_answers_are_errors_naming_server_and_field() {
    let sg = |name: &str| fixture_of("sglang", name);
    let err = |v: serde_json::Value, n: usize| {
        format!("{:#}", parse_generate(&v, 0, &request(n), URL).unwrap_err())
    };
    let e = err(sg("generate_abort.json"), 1);
    assert!(
        e.contains("[0].meta_info.finish_reason.type is Some(\"abort\")"),
        "{e}"
    );
    let e = err(sg("generate_no_logprobs.json"), 1);
    assert!(
        e.starts_with(&format!(
            "{URL}: [0].meta_info.output_token_logprobs is missing"
        )),
        "{e}"
    );
    let e = err(sg("error.json"), 1);
    assert!(e.contains("neither a sample nor a list"), "{e}");
    let e = err(sg("generate_n2.json"), 1);
    assert!(e.contains("2 samples for n = 1"), "{e}");
    let mut v = sg("generate_one.json");
    v["meta_info"]["output_token_logprobs"][1][1] = serde_json::json!(99);
    let e = err(v, 1);
    assert!(
        e.contains("output_token_logprobs[1] is for token 99, output_ids has 38"),
        "{e}"
    );
    let mut v = sg("generate_one.json");
    v["meta_info"]["output_token_logprobs"] = serde_json::json!([[-0.5, 37, null]]);
    let e = err(v, 1);
    assert!(e.contains("has 1 entries for 3 tokens"), "{e}");
}
