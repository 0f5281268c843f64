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
    let argmax = Vec::<i64>::try_from(processed.argmax(-1, false).to_device(Device::Cpu))?;
    let sampled_rows: Vec<i64> = (0..n)
        .filter(|&r| !rows[r as usize].params.is_greedy())
        .collect();
    let probs: Vec<f32> = if sampled_rows.is_empty() {
        Vec::new()
    } else {
        let idx = Tensor::from_slice(&sampled_rows).to_device(logits.device());
        let p = processed
            .index_select(0, &idx)
            .softmax(-1, Kind::Float)
            .to_device(Device::Cpu);
        Vec::<f32>::try_from(p.flatten(0, -1))?
    };
    let mut tokens = Vec::with_capacity(n as usize);
    let mut k = 0;
    for (r, &key) in keys.iter().enumerate() {
        if rows[r].params.is_greedy() {
            tokens.push(argmax[r]);
            continue;
        }
        let v = vocab as usize;
        match draw_index(&probs[k * v..(k + 1) * v], key) {
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
        let index = Tensor::from_slice(idx).to_device(device);
        let targets: Vec<i64> = idx.iter().map(|&r| tokens[r as usize]).collect();
        let targets = Tensor::from_slice(&targets).to_device(device);
        let lp = logprobs_of(&source.index_select(0, &index), &targets, temperature);
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
