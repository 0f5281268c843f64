//! One sampling step: next-token logits `(rows, V)` in, one `(token, logprob)` per row out.
//!
//! The token is drawn from the processed distribution (processors in `crate::processors`) with the
//! row's own random key (an exponential race, see `crate::draw`); greedy rows (temperature 0) take the argmax of the processed logits.
//! The logprob is taken from the distribution named by `SamplingParams::logprobs`, computed with
//! `temper_model::logprobs_of`, the very function the trainer's `token_logprobs` uses.

use anyhow::{bail, Result};
use tch::{Device, Kind, Tensor};
use temper_model::logprobs_of;

use crate::draw::draw_index;
use crate::params::{LogprobKind, SamplingParams};
use crate::processors;

/// What one row needs for a step.
pub struct RowView<'a> {
    pub params: &'a SamplingParams,
    /// Token ids to ban this step (EOS and stop ids while below `min_tokens`).
    pub banned: &'a [i64],
    /// Sorted unique ids of the row's sequence so far (used when `repetition_penalty != 1`).
    pub seen: &'a [i64],
}

/// Processed logits (before softmax) for each row: penalty, bans, temperature, top-k, top-p.
pub fn processed_logits(logits: &Tensor, rows: &[RowView]) -> Tensor {
    let pens: Vec<f64> = rows.iter().map(|r| r.params.repetition_penalty).collect();
    let seen: Vec<&[i64]> = rows.iter().map(|r| r.seen).collect();
    let banned: Vec<&[i64]> = rows.iter().map(|r| r.banned).collect();
    let temps: Vec<f64> = rows.iter().map(|r| r.params.temperature).collect();
    let ks: Vec<Option<usize>> = rows.iter().map(|r| r.params.top_k_count()).collect();
    let ps: Vec<f64> = rows.iter().map(|r| r.params.top_p).collect();
    let x = processors::repetition_penalty(logits, &pens, &seen);
    let x = processors::ban_tokens(&x, &banned);
    let x = processors::temperature(&x, &temps);
    processors::top_k_top_p(&x, &ks, &ps)
}

/// Draw one token per row and its logprob. `logits`: (rows, V) f32 next-token logits;
/// `keys[r]`: row `r`'s random key for this step (unused by greedy rows; see [`crate::draw`]).
pub fn sample_step(logits: &Tensor, rows: &[RowView], keys: &[u64]) -> Result<Vec<(i64, f32)>> {
    let (n, vocab) = logits.size2().expect("logits must be (rows, vocab)");
    assert_eq!((rows.len(), keys.len()), (n as usize, n as usize));
    let processed = processed_logits(logits, rows);
    let greedy: Vec<bool> = rows.iter().map(|r| r.params.is_greedy()).collect();
    let argmax = if greedy.iter().any(|&g| g) {
        Vec::<i64>::try_from(processed.argmax(-1, false).to_device(Device::Cpu))?
    } else {
        Vec::new()
    };
    let sampled_rows: Vec<i64> = (0..n).filter(|&r| !greedy[r as usize]).collect();
    let probs: Vec<f32> = if sampled_rows.is_empty() {
        Vec::new()
    } else {
        let p = select_rows(&processed, &sampled_rows, n).softmax(-1, Kind::Float);
        Vec::<f32>::try_from(p.to_device(Device::Cpu).flatten(0, -1))?
    };
    let v = vocab as usize;
    let draws = draw_rows(&probs, v, &sampled_rows, keys);
    let mut tokens = Vec::with_capacity(n as usize);
    let mut k = 0;
    for r in 0..n as usize {
        if greedy[r] {
            tokens.push(argmax[r]);
            continue;
        }
        match draws[k] {
            Some(t) => tokens.push(t as i64),
            None => bail!(
                "row {r}: no token has positive probability (the model produced NaN/inf logits?)"
            ),
        }
        k += 1;
    }
    let logprobs = token_logprobs(logits, &processed, rows, &tokens)?;
    Ok(tokens.into_iter().zip(logprobs).collect())
}

/// Logprob of `tokens[r]` in row `r` under the distribution its params ask for.
fn token_logprobs(
    logits: &Tensor,
    processed: &Tensor,
    rows: &[RowView],
    tokens: &[i64],
) -> Result<Vec<f32>> {
    let device = logits.device();
    let n = rows.len() as i64;
    let mut out = vec![0f32; rows.len()];
    // Rows grouped by the temperature their logprob uses (1 for raw and greedy rows).
    let mut groups: Vec<(f64, Vec<i64>)> = Vec::new();
    let mut processed_rows = Vec::new();
    for (r, row) in rows.iter().enumerate() {
        let t = match row.params.logprobs {
            LogprobKind::Processed => {
                if !row.params.is_greedy() {
                    processed_rows.push(r as i64);
                }
                continue;
            }
            LogprobKind::Raw => 1.0,
            LogprobKind::Scaled if row.params.is_greedy() => 1.0,
            LogprobKind::Scaled => row.params.temperature,
        };
        match groups.iter_mut().find(|(gt, _)| *gt == t) {
            Some((_, g)) => g.push(r as i64),
            None => groups.push((t, vec![r as i64])),
        }
    }
    let mut fill = |source: &Tensor, idx: &[i64], temperature: f64| -> Result<()> {
        let targets: Vec<i64> = idx.iter().map(|&r| tokens[r as usize]).collect();
        let targets = Tensor::from_slice(&targets).to_device(device);
        let lp = logprobs_of(&select_rows(source, idx, n), &targets, temperature);
        for (&r, v) in idx
            .iter()
            .zip(Vec::<f32>::try_from(lp.to_device(Device::Cpu))?)
        {
            out[r as usize] = v;
        }
        Ok(())
    };
    for (t, idx) in &groups {
        fill(logits, idx, *t)?;
    }
    if !processed_rows.is_empty() {
        fill(processed, &processed_rows, 1.0)?;
    }
    Ok(out)
}

/// Rows `idx` of `x` (`n` rows), without a copy when they are all of them in order (the usual
/// case: every row sampled, one temperature).
fn select_rows(x: &Tensor, idx: &[i64], n: i64) -> Tensor {
    if idx.len() as i64 == n && idx.iter().enumerate().all(|(i, &r)| r == i as i64) {
        x.shallow_clone()
    } else {
        x.index_select(0, &Tensor::from_slice(idx).to_device(x.device()))
    }
}

/// The exponential-race draw of each sampled row (`probs` holds their rows of `vocab` weights in
/// order; `keys` is indexed by row). One thread: the draw is vectorised, and on two threads the
/// second waits behind libtorch's spinning workers (measured slower).
fn draw_rows(probs: &[f32], vocab: usize, sampled: &[i64], keys: &[u64]) -> Vec<Option<usize>> {
    (0..sampled.len())
        .map(|k| {
            draw_index(
                &probs[k * vocab..(k + 1) * vocab],
                keys[sampled[k] as usize],
            )
        })
        .collect()
}
