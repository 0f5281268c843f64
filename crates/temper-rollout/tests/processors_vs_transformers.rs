//! The logits processors against transformers' own (reference computed by
//! `tools/rollout_reference.py`).

mod common;

use tch::Tensor;
use temper_rollout::processors;

#[test]
fn processors_match_transformers() {
    let case = &common::tiny::reference().processors;
    let rows = &case.rows;
    let vocab = case.logits[0].len();
    let flat: Vec<f32> = case.logits.iter().flatten().copied().collect();
    let logits = Tensor::from_slice(&flat).view([rows.len() as i64, vocab as i64]);
    let pen: Vec<f64> = rows.iter().map(|r| r.repetition_penalty).collect();
    let seen: Vec<Vec<i64>> = rows
        .iter()
        .map(|r| {
            let mut s = r.seen.clone();
            s.sort_unstable();
            s.dedup();
            s
        })
        .collect();
    let seen: Vec<&[i64]> = seen.iter().map(Vec::as_slice).collect();
    let banned: Vec<&[i64]> = rows.iter().map(|r| r.banned.as_slice()).collect();
    let temps: Vec<f64> = rows.iter().map(|r| r.temperature).collect();
    let ks: Vec<Option<usize>> = rows
        .iter()
        .map(|r| (r.top_k > 0).then_some(r.top_k as usize))
        .collect();
    let ps: Vec<f64> = rows.iter().map(|r| r.top_p).collect();
    let x = processors::repetition_penalty(&logits, &pen, &seen);
    let x = processors::ban_tokens(&x, &banned);
    let x = processors::temperature(&x, &temps);
    let got = processors::top_k_top_p(&x, &ks, &ps);

    let mut kept_counts = Vec::new();
    for (r, want_row) in case.processed.iter().enumerate() {
        let got_row = Vec::<f32>::try_from(got.get(r as i64)).unwrap();
        let mut kept = 0;
        for (v, want) in want_row.iter().enumerate() {
            let g = got_row[v];
            match *want {
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
    // The cases really truncate and penalise (otherwise this test could not fail on them).
    assert_eq!(kept_counts[0], vocab);
    assert_eq!(kept_counts[2], 5);
    assert!(
        kept_counts[3] > 1 && kept_counts[3] < vocab,
        "{kept_counts:?}"
    );
    assert_eq!(kept_counts[8], 1);
    let changed = |r: usize| {
        (0..vocab)
            .filter(|&v| case.processed[r][v] != Some(case.logits[r][v] as f64))
            .count()
    };
    assert!(changed(6) > 0, "repetition penalty changed nothing");
}
