//! The fixed-shape decode step (slots, buckets; what CUDA captures as a graph) against the growing
//! cache, on the CPU in f32: the same tokens and logprobs for every sample, through rows joining
//! mid-run, finishing at different lengths, and moving down to smaller buckets.

mod common;

use common::tiny::{reference, tiny_model};
use temper_model::CausalLm;
use temper_rollout::{DecodeMode, Engine, EngineConfig, Incoming, Request, Sample, SamplingParams};

fn engine(model: &CausalLm, mode: DecodeMode, max_rows: usize) -> Engine<'_> {
    // EOS = a token the tiny model emits often, so rows finish at many lengths.
    Engine::new(model, vec![reference().greedy_eos.eos])
        .with_config(EngineConfig {
            max_batch_rows: max_rows,
            ..EngineConfig::default()
        })
        .with_decode_mode(mode)
}

fn requests(count: usize) -> Vec<Request> {
    let prompts = &reference().prompts;
    (0..count)
        .map(|i| Request {
            prompt_ids: prompts[i % prompts.len()].clone(),
            params: SamplingParams {
                n: 1 + i % 3,
                max_tokens: 4 + (i * 7) % 29,
                temperature: [1.0, 0.0, 0.8][i % 3],
                top_p: [1.0, 0.9][i % 2],
                seed: Some(i as u64),
                ..Default::default()
            },
        })
        .collect()
}

/// Tokens equal; logprobs equal to f32 rounding (attention over the whole capacity adds keys of
/// weight exactly 0, but a longer reduction may sum in another order).
fn assert_same(a: &[Sample], b: &[Sample]) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        assert_eq!(
            x.completion_ids, y.completion_ids,
            "request {} sample {}",
            x.request_index, x.sample_index
        );
        assert_eq!(x.finish, y.finish);
        for (p, q) in x.completion_logprobs.iter().zip(&y.completion_logprobs) {
            assert!(
                (p - q).abs() <= 1e-5,
                "request {}: {p} vs {q}",
                x.request_index
            );
        }
    }
}

#[test]
fn static_steps_equal_the_growing_cache() {
    let model = tiny_model();
    let reqs = requests(23);
    // 6 rows at most: work waits, joins running rows, and the batch shrinks to smaller buckets.
    for max_rows in [6, 64] {
        let growing = engine(&model, DecodeMode::Growing, max_rows)
            .generate(&reqs, &mut |_| {})
            .unwrap();
        let fixed = engine(&model, DecodeMode::Static, max_rows)
            .generate(&reqs, &mut |_| {})
            .unwrap();
        assert_same(&growing, &fixed);
        let lengths: std::collections::BTreeSet<usize> =
            growing.iter().map(|s| s.completion_ids.len()).collect();
        assert!(
            lengths.len() >= 5,
            "rows should finish at many lengths: {lengths:?}"
        );
    }
    // The decoder outlives the call: a second call reuses its slots.
    let (rows, capacity) = model.static_decode_room();
    assert!(rows >= 1 && capacity >= 256, "{rows} x {capacity}");
}

/// Continuous batching in slots: requests arriving while others decode get the tokens they get
/// alone (each request's draws depend on its own seed only).
#[test]
fn requests_joining_slots_mid_run_match_alone() {
    let model = tiny_model();
    let reqs = requests(12);
    let alone: Vec<Vec<Sample>> = reqs
        .iter()
        .map(|r| {
            engine(&model, DecodeMode::Growing, 8)
                .generate(std::slice::from_ref(r), &mut |_| {})
                .unwrap()
        })
        .collect();
    let e = engine(&model, DecodeMode::Static, 8);
    let mut pending = reqs.clone().into_iter();
    let mut steps = 0;
    let mut inbox = |_idle: bool| {
        steps += 1;
        // One request every third step, then close.
        if steps % 3 == 1 {
            match pending.next() {
                Some(r) => Incoming::Requests(vec![r]),
                None => Incoming::Close,
            }
        } else {
            Incoming::Requests(vec![])
        }
    };
    let mut got: Vec<Option<Vec<Sample>>> = vec![None; reqs.len()];
    e.generate_continuous(
        &mut inbox,
        &mut |i, r| got[i] = Some(r.expect("sampled")),
        &mut |_| false,
    )
    .unwrap();
    for (i, want) in alone.iter().enumerate() {
        let mine = got[i].as_ref().expect("answered");
        let mine: Vec<Sample> = mine
            .iter()
            .cloned()
            .map(|mut s| {
                s.request_index = 0;
                s
            })
            .collect();
        assert_same(want, &mine);
    }
}

/// A wide call grows the decoder to many slots; a later call that needs far fewer makes it small
/// again (so its steps do not run the wide call's bucket of slots), sampling the same tokens as
/// the growing cache. On the CPU every step runs eagerly and is counted as such.
#[test]
fn the_static_cache_shrinks_when_the_need_falls() {
    let model = tiny_model();
    let before = model.static_decode_counts();
    let wide = requests(40);
    engine(&model, DecodeMode::Static, 64)
        .generate(&wide, &mut |_| {})
        .unwrap();
    let (grown, _) = model.static_decode_room();
    assert!(
        grown >= 32,
        "40 requests of 1-3 samples need 32+ slots, got {grown}"
    );
    let after = model.static_decode_counts();
    assert_eq!(after.graph_replays, 0, "the CPU captures nothing");
    assert!(
        after.eager_steps - before.eager_steps >= 30,
        "every decode step counted: {before:?} -> {after:?}"
    );
    let narrow = requests(2);
    let fixed = engine(&model, DecodeMode::Static, 64)
        .generate(&narrow, &mut |_| {})
        .unwrap();
    let (rows, _) = model.static_decode_room();
    assert!(
        rows <= 4,
        "3 samples shrink {grown} slots to a bucket of 4, got {rows}"
    );
    let growing = engine(&model, DecodeMode::Growing, 64)
        .generate(&narrow, &mut |_| {})
        .unwrap();
    assert_same(&growing, &fixed);
}
