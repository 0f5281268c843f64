//! The serving worker behind the one sampling seam (`temper_rollout::Sampler`) answers as the
//! trainer's in-process engine does: the same seeded requests give the same tokens and logprobs,
//! numbered in the caller's order, whether the worker batches them together or not; and a request
//! outside the server's limits is refused naming it.
use std::path::PathBuf;

use temper_model::{CausalLm, ComputeKind, ModelConfig, Policy};
use temper_rollout::{Engine, Request, Sample, Sampler, SamplingParams};
use temper_serve::limits::Limits;
use temper_serve::worker::Worker;

fn tiny_model_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("temper-serve-sampler-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cfg = ModelConfig::qwen2_like(97, 32, 64, 2, 4, 2, true);
    CausalLm::random(cfg, 5, tch::Device::Cpu, ComputeKind::F32)
        .save(&dir)
        .unwrap();
    dir
}

fn requests() -> Vec<Request> {
    let prompts: [&[i64]; 3] = [
        &[3, 14, 15, 92, 65],
        &[35, 89],
        &[79, 32, 38, 46, 26, 43, 3],
    ];
    prompts
        .iter()
        .enumerate()
        .map(|(i, p)| Request {
            prompt_ids: p.to_vec(),
            params: SamplingParams {
                n: i + 1,
                max_tokens: 6 + 2 * i,
                temperature: 0.9,
                top_p: 0.95,
                seed: Some(100 + i as u64),
                ..SamplingParams::default()
            },
        })
        .collect()
}

fn key(s: &Sample) -> (usize, usize, Vec<i64>, Vec<f32>) {
    (
        s.request_index,
        s.sample_index,
        s.completion_ids.clone(),
        s.completion_logprobs.clone(),
    )
}

#[test]
fn the_serving_worker_samples_as_the_engine_does_through_the_sampler_seam() {
    let dir = tiny_model_dir();
    let limits = Limits {
        max_model_len: 24,
        ..Limits::default()
    };
    let worker = Worker::start(&dir, tch::Device::Cpu, ComputeKind::F32, 8, limits).unwrap();
    let policy = Policy::load(&dir, tch::Device::Cpu, ComputeKind::F32).unwrap();
    let engine = Engine::new(&policy.model, policy.eos_ids.clone());

    let reqs = requests();
    let want: Vec<_> = engine.sample(&reqs).unwrap().iter().map(key).collect();
    let got: Vec<_> = worker.sample(&reqs).unwrap().iter().map(key).collect();
    assert_eq!(want.len(), 1 + 2 + 3);
    // Same tokens; logprobs to float rounding (the worker batches rows differently).
    for (w, g) in want.iter().zip(&got) {
        assert_eq!((w.0, w.1, &w.2), (g.0, g.1, &g.2));
        for (a, b) in w.3.iter().zip(&g.3) {
            assert!((a - b).abs() <= 1e-5, "{w:?} vs {g:?}");
        }
    }
    // One request alone gets its own samples, numbered 0.
    let alone = worker.sample(&reqs[2..]).unwrap();
    assert!(alone.iter().all(|s| s.request_index == 0));
    assert_eq!(
        alone
            .iter()
            .map(|s| s.completion_ids.clone())
            .collect::<Vec<_>>(),
        got[3..].iter().map(|k| k.2.clone()).collect::<Vec<_>>()
    );

    // Outside the limits: refused, naming the request and the field.
    let mut long = reqs.clone();
    long[1].params.max_tokens = 23;
    let e = format!("{:#}", worker.sample(&long).unwrap_err());
    assert!(
        e.contains("request 1") && e.contains("params.max_tokens") && e.contains("--max-model-len"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
