//! Sampler vs trainer: recompute every completion token's logprob with one teacher-forced forward
//! over the padded (prompt + completion) rows, exactly as a trainer does with
//! `CausalLm::token_logprobs`, and compare with what the sampler reported.

use anyhow::{ensure, Result};
use tch::{Device, Kind, Tensor};
use temper_model::{CausalLm, PaddedRows};

use crate::params::Sample;

/// Rows per teacher-forced forward (bounds the (rows, T, V) logits in memory).
const ROWS_PER_FORWARD: usize = 16;

/// Teacher-forced logprobs of each sample's completion tokens under `softmax(logits / temperature)`.
///
/// Layout of a forward: the one padded layout ([`PaddedRows`], verl's): prompts left-padded to
/// the longest prompt, completions right-padded to the longest completion.
pub fn trainer_logprobs(
    model: &CausalLm,
    samples: &[Sample],
    temperature: f64,
) -> Result<Vec<Vec<f32>>> {
    ensure!(
        temperature > 0.0,
        "temperature = {temperature}: the trainer needs a positive temperature"
    );
    let _no_grad = tch::no_grad_guard();
    let device = model.device();
    let mut out = Vec::with_capacity(samples.len());
    for chunk in samples.chunks(ROWS_PER_FORWARD) {
        let rows: Vec<(&[i64], &[i64])> = chunk
            .iter()
            .map(|s| (s.prompt_ids.as_slice(), s.completion_ids.as_slice()))
            .collect();
        let padded = PaddedRows::new(&rows, 0);
        let (p_max, width) = (padded.prompt_width, padded.width());
        let (ids, mask, pos) = padded.tensors(device);
        // Column j predicts column j + 1; the last column's target is a dummy.
        let targets = Tensor::cat(
            &[ids.narrow(1, 1, width as i64 - 1), ids.narrow(1, 0, 1)],
            1,
        );
        let (logp, _entropy) = model
            .token_logprobs(&ids, &mask, &pos, &targets, temperature)
            .into_parts();
        let logp = logp.to_kind(Kind::Float).to_device(Device::Cpu);
        for (r, s) in chunk.iter().enumerate() {
            let n = s.completion_ids.len() as i64;
            let row = logp.get(r as i64).narrow(0, p_max as i64 - 1, n);
            out.push(Vec::<f32>::try_from(row)?);
        }
    }
    Ok(out)
}

/// How far apart sampler and trainer logprobs are, over all completion tokens.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LogprobDiff {
    pub tokens: usize,
    pub max_abs: f64,
    pub mean_abs: f64,
    /// Tokens whose two logprobs are bitwise equal.
    pub bitwise_equal: usize,
}

/// Compare `samples[i].completion_logprobs` with `recomputed[i]`.
pub fn compare(samples: &[Sample], recomputed: &[Vec<f32>]) -> LogprobDiff {
    let reported: Vec<&[f32]> = samples
        .iter()
        .map(|s| s.completion_logprobs.as_slice())
        .collect();
    compare_rows(&reported, recomputed)
}

/// Compare two sets of per-token logprobs, row by row (rows of `a` and `b` line up).
pub fn compare_rows(a: &[impl AsRef<[f32]>], b: &[impl AsRef<[f32]>]) -> LogprobDiff {
    let (mut tokens, mut max_abs, mut sum, mut bitwise_equal) = (0, 0f64, 0f64, 0);
    for (ra, rb) in a.iter().zip(b) {
        for (&a, &b) in ra.as_ref().iter().zip(rb.as_ref()) {
            let d = (a as f64 - b as f64).abs();
            tokens += 1;
            max_abs = max_abs.max(if d.is_nan() { f64::INFINITY } else { d });
            sum += d;
            bitwise_equal += usize::from(a.to_bits() == b.to_bits());
        }
    }
    let mean_abs = if tokens == 0 {
        0.0
    } else {
        sum / tokens as f64
    };
    LogprobDiff {
        tokens,
        max_abs,
        mean_abs,
        bitwise_equal,
    }
}
