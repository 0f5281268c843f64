//! The padded training batch built from rollout samples: prompts left-padded to the longest
//! prompt `P`, responses right-padded to the longest response `R` (verl's layout), so that a
//! response token `j` sits at column `P + j` and is predicted by the hidden state at `P + j - 1`.
use anyhow::Result;
use tch::{Device, Kind, Tensor};
use temper_model::CausalLm;

pub struct Batch {
    /// (N, P + R) i64.
    pub input_ids: Tensor,
    /// (N, P + R) i64, 1 = real token.
    pub attention_mask: Tensor,
    /// (N, P + R) i64.
    pub position_ids: Tensor,
    /// (N, R) f32, 1 on generated tokens.
    pub response_mask: Tensor,
    /// (N, R) f32: the sampler's logprobs (0 on padding).
    pub rollout_logprobs: Tensor,
    pub prompt_len: i64,
    pub response_len: i64,
    pub rows: usize,
}

impl Batch {
    pub fn new(samples: &[(&[i64], &[i64], &[f32])], pad_id: i64, device: Device) -> Self {
        let p = samples.iter().map(|s| s.0.len()).max().unwrap_or(0).max(1);
        let r = samples.iter().map(|s| s.1.len()).max().unwrap_or(0).max(1);
        let n = samples.len();
        let (mut ids, mut mask) = (vec![pad_id; n * (p + r)], vec![0i64; n * (p + r)]);
        let (mut rmask, mut rlogp) = (vec![0f32; n * r], vec![0f32; n * r]);
        for (i, (prompt, completion, logprobs)) in samples.iter().enumerate() {
            let row = i * (p + r);
            let start = p - prompt.len();
            for (j, &t) in prompt.iter().enumerate() {
                ids[row + start + j] = t;
                mask[row + start + j] = 1;
            }
            for (j, &t) in completion.iter().enumerate() {
                ids[row + p + j] = t;
                mask[row + p + j] = 1;
                rmask[i * r + j] = 1.0;
                rlogp[i * r + j] = logprobs.get(j).copied().unwrap_or(0.0);
            }
        }
        let shape = [n as i64, (p + r) as i64];
        let attention_mask = Tensor::from_slice(&mask).view(shape).to(device);
        Batch {
            input_ids: Tensor::from_slice(&ids).view(shape).to(device),
            position_ids: temper_model::position_ids_from_mask(&attention_mask),
            attention_mask,
            response_mask: Tensor::from_slice(&rmask)
                .view([n as i64, r as i64])
                .to(device),
            rollout_logprobs: Tensor::from_slice(&rlogp)
                .view([n as i64, r as i64])
                .to(device),
            prompt_len: p as i64,
            response_len: r as i64,
            rows: n,
        }
    }

    /// Rows `idx` of a (N, ...) tensor of this batch.
    pub fn rows_of(t: &Tensor, idx: &[i64]) -> Tensor {
        let is_range = idx.windows(2).all(|w| w[1] == w[0] + 1);
        if is_range && !idx.is_empty() {
            t.narrow(0, idx[0], idx.len() as i64)
        } else {
            t.index_select(0, &Tensor::from_slice(idx).to(t.device()))
        }
    }

    /// `(logp, entropy)` (rows, R) of the response tokens of rows `idx` under `model`, with
    /// autograd unless called under no_grad. Only response positions reach the LM head.
    pub fn response_logprobs(
        &self,
        model: &CausalLm,
        idx: &[i64],
        temperature: f64,
    ) -> Result<(Tensor, Tensor)> {
        let ids = Self::rows_of(&self.input_ids, idx);
        let mask = Self::rows_of(&self.attention_mask, idx);
        let pos = Self::rows_of(&self.position_ids, idx);
        let hidden = model.forward_hidden(&ids, &pos, &mask, None);
        let h = hidden.narrow(1, self.prompt_len - 1, self.response_len);
        let logits = model.logits(&h);
        let targets = ids.narrow(1, self.prompt_len, self.response_len);
        let t = if temperature > 0.0 { temperature } else { 1.0 };
        Ok(temper_model::logprobs_and_entropy(&logits, &targets, t))
    }
}

/// Values of a (N, R) f32 tensor as rows of f64 (for logs and statistics).
pub fn to_rows(t: &Tensor) -> Vec<Vec<f64>> {
    let t = t.to_kind(Kind::Double).to(Device::Cpu).contiguous();
    let (n, r) = t.size2().expect("2-D");
    let flat: Vec<f64> = Vec::try_from(t.view([-1])).expect("f64 values");
    (0..n as usize)
        .map(|i| flat[i * r as usize..(i + 1) * r as usize].to_vec())
        .collect()
}
