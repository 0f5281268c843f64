//! The logits processors against transformers' own (`tools/rollout_processors.py`, run live).

mod common;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::json;
use tch::Tensor;
use temper_rollout::processors;

struct Row {
    temperature: f64,
    top_k: i64,
    top_p: f64,
    repetition_penalty: f64,
    seen: Vec<i64>,
    banned: Vec<i64>,
}

fn ours(logits: &Tensor, rows: &[Row]) -> Tensor {
    let pen: Vec<f64> = rows.iter().map(|r| r.repetition_penalty).collect();
    let seen: Vec<&[i64]> = rows.iter().map(|r| r.seen.as_slice()).collect();
    let banned: Vec<&[i64]> = rows.iter().map(|r| r.banned.as_slice()).collect();
    let temps: Vec<f64> = rows.iter().map(|r| r.temperature).collect();
    let ks: Vec<Option<usize>> = rows
        .iter()
        .map(|r| (r.top_k > 0).then_some(r.top_k as usize))
        .collect();
    let ps: Vec<f64> = rows.iter().map(|r| r.top_p).collect();
    let x = processors::repetition_penalty(logits, &pen, &seen);
    let x = processors::ban_tokens(&x, &banned);
    let x = processors::temperature(&x, &temps);
    processors::top_k_top_p(&x, &ks, &ps)
}

#[test]
fn processors_match_transformers() {
    let vocab = 64;
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let settings: &[(f64, i64, f64, f64, usize, usize)] = &[
        // temperature, top_k, top_p, repetition_penalty, #seen, #banned
        (1.0, -1, 1.0, 1.0, 0, 0),
        (0.7, -1, 1.0, 1.0, 0, 0),
        (1.0, 5, 1.0, 1.0, 0, 0),
        (1.0, -1, 0.8, 1.0, 0, 0),
        (1.3, 10, 0.5, 1.0, 0, 0),
        (0.6, -1, 0.95, 1.2, 12, 0),
        (1.0, -1, 1.0, 0.8, 7, 0),
        (0.9, 3, 0.9, 1.5, 5, 2),
        (1.0, 1, 1.0, 1.0, 0, 1),
        (2.0, vocab as i64 + 5, 0.3, 1.1, 30, 3),
        (0.0, -1, 1.0, 1.3, 4, 1),
    ];
    let rows: Vec<Row> = settings
        .iter()
        .map(
            |&(temperature, top_k, top_p, repetition_penalty, n_seen, n_banned)| Row {
                temperature,
                top_k,
                top_p,
                repetition_penalty,
                seen: (0..n_seen)
                    .map(|_| rng.random_range(0..vocab as i64))
                    .collect(),
                banned: (0..n_banned)
                    .map(|_| rng.random_range(0..vocab as i64))
                    .collect(),
            },
        )
        .collect();
    let logits: Vec<Vec<f32>> = rows
        .iter()
        .map(|_| (0..vocab).map(|_| rng.random_range(-4.0f32..4.0)).collect())
        .collect();
    let input = json!({
        "logits": logits,
        "rows": rows.iter().map(|r| json!({
            "temperature": r.temperature, "top_k": r.top_k, "top_p": r.top_p,
            "repetition_penalty": r.repetition_penalty, "seen": r.seen, "banned": r.banned,
        })).collect::<Vec<_>>(),
    });
    let reference = common::python("rollout_processors.py", &[], &input);
    let flat: Vec<f32> = logits.iter().flatten().copied().collect();
    let got = ours(
        &Tensor::from_slice(&flat).view([rows.len() as i64, vocab as i64]),
        &rows,
    );
    let mut kept_counts = Vec::new();
    for (r, want_row) in reference["logits"].as_array().unwrap().iter().enumerate() {
        let got_row = Vec::<f32>::try_from(got.get(r as i64)).unwrap();
        let mut kept = 0;
        for (v, want) in want_row.as_array().unwrap().iter().enumerate() {
            let g = got_row[v];
            match want.as_f64() {
                None => assert_eq!(
                    g,
                    f32::NEG_INFINITY,
                    "row {r} token {v}: transformers removed it"
                ),
                Some(w) => {
                    kept += 1;
                    assert!(
                        (g as f64 - w).abs() <= 1e-6 * w.abs().max(1.0),
                        "row {r} token {v}: {g} vs {w}"
                    )
                }
            }
        }
        kept_counts.push(kept);
    }
    // The cases really truncate (otherwise this test could not fail on top-k/top-p).
    assert_eq!(kept_counts[0], vocab);
    assert_eq!(kept_counts[2], 5);
    assert!(
        kept_counts[3] < vocab && kept_counts[3] > 1,
        "{kept_counts:?}"
    );
    assert_eq!(kept_counts[8], 1);
}
