//! The device draw (every processor, the race and the logprob as tensor ops, one read per step)
//! against the host draw (the processed probabilities raced on the CPU, `draw::draw_index`), on
//! the same logits: the same token and the same logprob for every row, over a vocabulary of
//! SmolLM2's size and every sampling setting a row can carry.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use tch::{Kind, Tensor};
use temper_rollout::sample_step::{sample_step_on, DrawOn, RowView};
use temper_rollout::{LogprobKind, SamplingParams};

fn params(rng: &mut ChaCha20Rng) -> SamplingParams {
    let kinds = [
        LogprobKind::Scaled,
        LogprobKind::Raw,
        LogprobKind::Processed,
    ];
    SamplingParams {
        temperature: [0.0, 0.6, 1.0, 1.3][rng.random_range(0..4)],
        top_k: [-1, 1, 20, 500][rng.random_range(0..4)],
        top_p: [1.0, 0.9, 0.5][rng.random_range(0..3)],
        repetition_penalty: [1.0, 1.0, 1.2][rng.random_range(0..3)],
        logprobs: kinds[rng.random_range(0..3)],
        ..Default::default()
    }
}

#[test]
fn device_draw_equals_host_draw() {
    let mut rng = ChaCha20Rng::seed_from_u64(3);
    let vocab = 49_152i64;
    let mut rows_checked = 0;
    for step in 0..12 {
        let rows = [1usize, 7, 16][step % 3];
        tch::manual_seed(step as i64);
        // Logits of a real model's spread (N(0, 3^2)): a long tail and a few likely tokens.
        let logits = Tensor::randn([rows as i64, vocab], (Kind::Float, tch::Device::Cpu)) * 3.0;
        let ps: Vec<SamplingParams> = (0..rows).map(|_| params(&mut rng)).collect();
        let seen: Vec<Vec<i64>> = (0..rows)
            .map(|_| {
                let mut s: Vec<i64> = (0..30).map(|_| rng.random_range(0..vocab)).collect();
                s.sort_unstable();
                s.dedup();
                s
            })
            .collect();
        let banned: Vec<Vec<i64>> = (0..rows)
            .map(|r| if r % 3 == 0 { vec![0, 2] } else { vec![] })
            .collect();
        let views: Vec<RowView> = (0..rows)
            .map(|r| RowView {
                params: &ps[r],
                banned: &banned[r],
                seen: &seen[r],
            })
            .collect();
        let keys: Vec<u64> = (0..rows).map(|_| rng.random()).collect();
        let host = sample_step_on(&logits, &views, &keys, DrawOn::Host).unwrap();
        let device = sample_step_on(&logits, &views, &keys, DrawOn::Device).unwrap();
        assert_eq!(host, device, "step {step}: params {ps:?}");
        rows_checked += rows;
    }
    assert_eq!(rows_checked, 96);
}

/// NaN logits give the same one-line error on both paths.
#[test]
fn nan_logits_fail_on_both_paths() {
    let logits = Tensor::randn([2, 100], (Kind::Float, tch::Device::Cpu));
    let _ = logits.get(1).get(5).fill_(f64::NAN);
    let p = SamplingParams::default();
    let views: Vec<RowView> = (0..2)
        .map(|_| RowView {
            params: &p,
            banned: &[],
            seen: &[],
        })
        .collect();
    for on in [DrawOn::Host, DrawOn::Device] {
        let err = sample_step_on(&logits, &views, &[1, 2], on).unwrap_err();
        assert!(
            err.to_string().starts_with("row 1: no token"),
            "{on:?}: {err}"
        );
    }
}
