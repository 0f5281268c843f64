//! One sampling step: next-token logits `(rows, V)` in, one `(token, logprob)` per row out.
//!
//! The token is drawn from the processed distribution (processors in `crate::processors`) with the
//! row's own random key (an exponential race, see `crate::draw`); greedy rows (temperature 0) take
//! the argmax of the processed logits. The race runs on the host for CPU logits and on the
//! logits' device otherwise ([`DrawOn`]): the same tokens either way, and on a GPU only each
//! row's token and logprob are read back.
//! The logprob is taken from the distribution named by `SamplingParams::logprobs`, computed with
//! `temper_model::logprobs_of`, the very function the trainer's `token_logprobs` uses.

use anyhow::{bail, Result};
use tch::{Device, Kind, Tensor};
use temper_model::logprobs_of;

use crate::draw::{draw_index, draw_index_tensor};
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

/// Where a step's tokens are drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DrawOn {
    /// The processed probabilities are read to the host and raced there ([`draw_index`]: pruned
    /// and vectorised, the fastest on a CPU, where "reading" them is free).
    Host,
    /// On the logits' device ([`draw_index_tensor`], the same race with the same uniforms): only
    /// each row's token and logprob are read back, one small copy per step.
    Device,
}

impl DrawOn {
    /// Host for CPU tensors, the device otherwise.
    pub fn for_device(device: Device) -> Self {
        if device == Device::Cpu {
            DrawOn::Host
        } else {
            DrawOn::Device
        }
    }
}

/// Draw one token per row and its logprob. `logits`: (rows, V) f32 next-token logits;
/// `keys[r]`: row `r`'s random key for this step (unused by greedy rows; see [`crate::draw`]).
/// Drawn where [`DrawOn::for_device`] says for the logits' device.
pub fn sample_step(logits: &Tensor, rows: &[RowView], keys: &[u64]) -> Result<Vec<(i64, f32)>> {
    sample_step_on(logits, rows, keys, DrawOn::for_device(logits.device()))
}

/// [`sample_step`] with the draw made `on` the host or the device: both give the same tokens and
/// logprobs from the same logits (`tests/device_draw.rs`).
pub fn sample_step_on(
    logits: &Tensor,
    rows: &[RowView],
    keys: &[u64],
    on: DrawOn,
) -> Result<Vec<(i64, f32)>> {
    let (n, _) = logits.size2().expect("logits must be (rows, vocab)");
    assert_eq!((rows.len(), keys.len()), (n as usize, n as usize));
    let device = logits.device();
    let processed = processed_logits(logits, rows);
    let greedy: Vec<bool> = rows.iter().map(|r| r.params.is_greedy()).collect();
    let tokens = match on {
        DrawOn::Host => {
            Tensor::from_slice(&host_tokens(&processed, &greedy, keys)?).to_device(device)
        }
        DrawOn::Device => device_tokens(&processed, &greedy, keys),
    };
    // A row without a token (-1) gathers entry 0 here and fails below.
    let logprobs = token_logprobs(logits, &processed, rows, &tokens.clamp_min(0));
    // The step's one read: (token, logprob) per row, exact in f64.
    let both = Tensor::stack(
        &[tokens.to_kind(Kind::Double), logprobs.to_kind(Kind::Double)],
        1,
    );
    let both = Vec::<f64>::try_from(both.to_device(Device::Cpu).flatten(0, -1))?;
    let mut out = Vec::with_capacity(n as usize);
    for (r, pair) in both.chunks(2).enumerate() {
        if pair[0] < 0.0 {
            bail!(
                "row {r}: no token has positive probability (the model produced NaN/inf logits?)"
            );
        }
        out.push((pair[0] as i64, pair[1] as f32));
    }
    Ok(out)
}

/// Tokens drawn on the host: the argmax for greedy rows, the race over the processed
/// probabilities (read to the host) for the others; -1 where no token can be drawn.
fn host_tokens(processed: &Tensor, greedy: &[bool], keys: &[u64]) -> Result<Vec<i64>> {
    let (n, vocab) = processed.size2().expect("logits must be (rows, vocab)");
    let argmax = if greedy.iter().any(|&g| g) {
        Vec::<i64>::try_from(processed.argmax(-1, false).to_device(Device::Cpu))?
    } else {
        Vec::new()
    };
    let sampled_rows: Vec<i64> = (0..n).filter(|&r| !greedy[r as usize]).collect();
    let probs: Vec<f32> = if sampled_rows.is_empty() {
        Vec::new()
    } else {
        let p = select_rows(processed, &sampled_rows, n).softmax(-1, Kind::Float);
        Vec::<f32>::try_from(p.to_device(Device::Cpu).flatten(0, -1))?
    };
    let mut draws = draw_rows(&probs, vocab as usize, &sampled_rows, keys).into_iter();
    Ok((0..n as usize)
        .map(|r| match greedy[r] {
            true => argmax[r],
            false => draws.next().flatten().map_or(-1, |t| t as i64),
        })
        .collect())
}

/// Tokens drawn on the processed logits' device: the same choices as [`host_tokens`].
fn device_tokens(processed: &Tensor, greedy: &[bool], keys: &[u64]) -> Tensor {
    let device = processed.device();
    // Each u64 key travels as the i64 of the same bits.
    let keys: Vec<i64> = keys.iter().map(|&k| k as i64).collect();
    let keys = Tensor::from_slice(&keys).to_device(device);
    let raced = draw_index_tensor(&processed.softmax(-1, Kind::Float), &keys);
    if !greedy.iter().any(|&g| g) {
        return raced;
    }
    let mask = Tensor::from_slice(greedy).to_device(device);
    processed.argmax(-1, false).where_self(&mask, &raced)
}

/// Logprob of `tokens[r]` in row `r` under the distribution its params ask for: (rows,) f32 on
/// the logits' device (0 for greedy rows asking for processed logprobs).
fn token_logprobs(
    logits: &Tensor,
    processed: &Tensor,
    rows: &[RowView],
    tokens: &Tensor,
) -> Tensor {
    let device = logits.device();
    let n = rows.len() as i64;
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
    let every_row = |idx: &[i64]| idx.len() as i64 == n;
    // The usual case, every row in one group: no scatter.
    if let [(t, idx)] = groups.as_slice() {
        if every_row(idx) {
            return logprobs_of(logits, tokens, *t);
        }
    }
    if groups.is_empty() && every_row(&processed_rows) {
        return logprobs_of(processed, tokens, 1.0);
    }
    let mut out = Tensor::zeros([n], (Kind::Float, device));
    let mut fill = |source: &Tensor, idx: &[i64], temperature: f64| {
        let at = Tensor::from_slice(idx).to_device(device);
        let lp = logprobs_of(
            &select_rows(source, idx, n),
            &tokens.index_select(0, &at),
            temperature,
        );
        let _ = out.index_copy_(0, &at, &lp);
    };
    for (t, idx) in &groups {
        fill(logits, idx, *t);
    }
    if !processed_rows.is_empty() {
        fill(processed, &processed_rows, 1.0);
    }
    out
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
