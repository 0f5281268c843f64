//! The padded training batch built from rollout samples, in the one padded layout
//! ([`temper_model::PaddedRows`]): prompts left-padded to the longest prompt `P`, responses
//! right-padded to the longest response `R` (verl's), so that a response token `j` sits at
//! column `P + j` and is predicted by the hidden state at `P + j - 1`.
use super::learner::partition::{MiniBatch, Rows};
use crate::dist::Dist;
use anyhow::Result;
use tch::{Device, Kind, Tensor};
use temper_model::{CausalLm, LayerCheckpoints, PaddedRows, TokenScores};

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
    /// Per row, the first row with the same prompt tokens (`Some` when prompts are shared: see
    /// [`Batch::share_prompts`]).
    prompt_owner: Option<Vec<usize>>,
    /// Per row, its prompt and response tokens when the forwards run packed rows (see
    /// [`Batch::remove_padding`]).
    packed: Option<Vec<(Vec<i64>, Vec<i64>)>>,
}

impl Batch {
    pub fn new(samples: &[(&[i64], &[i64], &[f32])], pad_id: i64, device: Device) -> Self {
        let rows: Vec<(&[i64], &[i64])> = samples.iter().map(|s| (s.0, s.1)).collect();
        // At least one column each, so that a batch of empty prompts or responses has a shape.
        let padded = PaddedRows::with_widths(&rows, 1, 1, pad_id);
        let (p, r, n) = (
            padded.prompt_width,
            padded.continuation_width,
            samples.len(),
        );
        let (mut rmask, mut rlogp) = (vec![0f32; n * r], vec![0f32; n * r]);
        for (i, (_, completion, logprobs)) in samples.iter().enumerate() {
            for j in 0..completion.len() {
                rmask[i * r + j] = 1.0;
                rlogp[i * r + j] = logprobs.get(j).copied().unwrap_or(0.0);
            }
        }
        let (input_ids, attention_mask, position_ids) = padded.tensors(device);
        Batch {
            input_ids,
            position_ids,
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
            prompt_owner: None,
            packed: None,
        }
    }

    /// From now on, [`Batch::response_scores`] runs packed rows (`model.use_remove_padding`,
    /// [`temper_model::packed`]): a micro-batch's sequences side by side, so that its cost follows
    /// its real tokens rather than its rows times the batch's longest prompt and response. The
    /// results are the same, to float rounding.
    pub fn remove_padding(&mut self, samples: &[(&[i64], &[i64], &[f32])]) {
        self.packed = Some(
            samples
                .iter()
                .map(|s| (s.0.to_vec(), s.1.to_vec()))
                .collect(),
        );
    }

    /// Per-row values over the responses (advantages, masks), each row right-padded with 0 to
    /// the batch's response width: (rows, R) f32 on the batch's device.
    pub fn response_values(&self, rows: impl IntoIterator<Item = Vec<f32>>) -> Tensor {
        let r = self.response_len as usize;
        let flat: Vec<f32> = rows
            .into_iter()
            .flat_map(|mut v| {
                v.resize(r, 0.0);
                v
            })
            .collect();
        Tensor::from_slice(&flat)
            .view([self.rows as i64, r as i64])
            .to(self.input_ids.device())
    }

    /// From now on, [`Batch::response_scores`] runs each distinct prompt of a micro-batch once
    /// (`actor.shared_prefix`). Rows share a prompt when their prompt tokens are equal (the samples
    /// of a group, or equal prompts drawn twice), so it needs no knowledge of groups.
    pub fn share_prompts(&mut self, prompts: &[&[i64]]) {
        let mut first: std::collections::HashMap<&[i64], usize> = Default::default();
        let owner = prompts
            .iter()
            .enumerate()
            .map(|(i, p)| *first.entry(p).or_insert(i))
            .collect();
        self.prompt_owner = Some(owner);
    }

    /// The positions a forward of rows `idx` runs the decoder over (each distinct prompt once when
    /// prompts are shared, packed rows without their padding) and those the head scores (the
    /// response positions): the FLOP count's inputs, `perf/update_tflops`.
    pub fn forward_positions(&self, idx: &[i64]) -> (f64, f64) {
        let rows = idx.len() as f64;
        let prompt_runs: Vec<usize> = match &self.prompt_owner {
            Some(owner) => {
                let mut distinct: Vec<usize> = idx.iter().map(|&i| owner[i as usize]).collect();
                distinct.sort_unstable();
                distinct.dedup();
                distinct
            }
            None => idx.iter().map(|&i| i as usize).collect(),
        };
        match &self.packed {
            Some(tokens) => {
                let prompts: usize = prompt_runs.iter().map(|&r| tokens[r].0.len()).sum();
                let responses: usize = idx.iter().map(|&i| tokens[i as usize].1.len()).sum();
                ((prompts + responses) as f64, responses as f64)
            }
            None => {
                let prompts = (prompt_runs.len() as i64 * self.prompt_len) as f64;
                let responses = rows * self.response_len as f64;
                (prompts + responses, responses)
            }
        }
    }

    /// `(logp, entropy)` (rows, R) of the response tokens of rows `idx` under `model`, with
    /// autograd unless called under no_grad (then finish `loss.backward()` with
    /// [`TokenScores::backward`]). Only response positions reach the LM head, `chunk` tokens at a
    /// time.
    /// With `checkpoint_layers` (`actor.gradient_checkpointing`), the decoder keeps only each
    /// layer's input and runs the layers again in the scores' backward.
    pub(crate) fn response_scores<'m>(
        &self,
        model: &'m CausalLm,
        idx: &Rows,
        temperature: f64,
        chunk: i64,
        checkpoint_layers: bool,
    ) -> Result<TokenScores<'m>> {
        let t = if temperature > 0.0 { temperature } else { 1.0 };
        let ids = idx.of(&self.input_ids);
        let (hidden, checkpoints) = match (&self.packed, &self.prompt_owner) {
            (Some(tokens), owner) => {
                let rows: Vec<(&[i64], &[i64])> = idx
                    .iter()
                    .map(|&i| {
                        let (p, r) = &tokens[i as usize];
                        (p.as_slice(), r.as_slice())
                    })
                    .collect();
                model.response_hidden_packed(
                    &rows,
                    self.response_len,
                    owner.is_some(),
                    checkpoint_layers,
                )?
            }
            (None, Some(owner)) => self.shared_hidden(model, idx, owner, checkpoint_layers),
            (None, None) => {
                let mask = idx.of(&self.attention_mask);
                let pos = idx.of(&self.position_ids);
                let (hidden, checkpoints) = if checkpoint_layers {
                    let (h, c) = model.forward_hidden_checkpointed(&ids, &pos, &mask);
                    (h, Some(c))
                } else {
                    (model.forward_hidden(&ids, &pos, &mask, None), None)
                };
                let h = hidden.narrow(1, self.prompt_len - 1, self.response_len);
                (h, checkpoints)
            }
        };
        let targets = ids.narrow(1, self.prompt_len, self.response_len);
        let scores = model.score_tokens(&hidden, &targets, t, chunk);
        Ok(match checkpoints {
            Some(c) => scores.with_checkpoints(c),
            None => scores,
        })
    }

    /// Sweeps over the decoder layers one forward of [`Batch::response_scores`] makes: two with
    /// shared prompts (the prompts, then the responses attending to them; a sweep with nothing
    /// to compute still counts), else one.
    pub(crate) fn forward_sweeps(&self) -> usize {
        match self.prompt_owner {
            Some(_) => 2,
            None => 1,
        }
    }

    /// No-grad (N, R) f32 log-probs of every row under `model`. Each rank computes the rows of its
    /// micro-batches in `parts` (the first update's split, so that the update's forward can
    /// reproduce them bitwise) and the sum over ranks fills in the other ranks' rows.
    /// With `lockstep_layers` (the model gathers its layers from the ranks as it runs them)
    /// a rank with fewer micro-batches than another makes their sweeps over the layers too.
    pub(crate) fn logprobs_by_parts(
        &self,
        model: &CausalLm,
        parts: &[MiniBatch],
        temperature: f64,
        chunk: i64,
        dist: &Dist,
        lockstep_layers: bool,
    ) -> Result<Tensor> {
        let device = self.input_ids.device();
        let out = Tensor::zeros([self.rows as i64, self.response_len], (Kind::Float, device));
        let mine = parts.iter().map(|mb| mb.mine.len()).sum::<usize>();
        let idle = idle_micro_batches(dist, mine, lockstep_layers)?;
        tch::no_grad(|| -> Result<()> {
            for idx in parts.iter().flat_map(|mb| &mb.mine) {
                let (lp, _) = self
                    .response_scores(model, idx, temperature, chunk, false)?
                    .into_parts();
                let _ = out.shallow_clone().index_copy_(0, idx.on_device(), &lp);
            }
            for _ in 0..idle {
                model.sweep_idle_micro_batch(self.forward_sweeps(), false);
            }
            Ok(())
        })?;
        dist.sum_tensor(&out)?;
        Ok(out)
    }

    /// The hidden states that predict the responses of rows `idx` (rows, R, H), with each distinct
    /// prompt run once ([`CausalLm::response_hidden_shared`]).
    fn shared_hidden<'m>(
        &self,
        model: &'m CausalLm,
        idx: &Rows,
        owner: &[usize],
        checkpoint_layers: bool,
    ) -> (Tensor, Option<LayerCheckpoints<'m>>) {
        let (p, r) = (self.prompt_len, self.response_len);
        let mut distinct: Vec<i64> = vec![];
        let prompt_of_row: Vec<i64> = idx
            .iter()
            .map(|&row| {
                let o = owner[row as usize] as i64;
                let k = distinct.iter().position(|&d| d == o).unwrap_or_else(|| {
                    distinct.push(o);
                    distinct.len() - 1
                });
                k as i64
            })
            .collect();
        let cols = |t: &Tensor, rows: &Rows, start: i64, len: i64| rows.of(t).narrow(1, start, len);
        // The distinct prompts and each row's prompt, in one copy to the device.
        let (k, n) = (distinct.len() as i64, prompt_of_row.len() as i64);
        let both = Rows::new([distinct, prompt_of_row].concat(), self.input_ids.device());
        let distinct = both.narrow(0, k);
        let rows = temper_model::SharedPrefixRows {
            prompt_ids: &cols(&self.input_ids, &distinct, 0, p),
            prompt_mask: &cols(&self.attention_mask, &distinct, 0, p),
            prompt_positions: &cols(&self.position_ids, &distinct, 0, p),
            prompt_of_row: &both.on_device().narrow(0, k, n),
            response_ids: &cols(&self.input_ids, idx, p, r),
            response_mask: &cols(&self.attention_mask, idx, p, r),
            response_positions: &cols(&self.position_ids, idx, p, r),
        };
        if checkpoint_layers {
            let (h, c) = model.response_hidden_shared_checkpointed(&rows);
            (h, Some(c))
        } else {
            (model.response_hidden_shared(&rows), None)
        }
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

/// How many micro-batches fewer than the most any rank has this rank has (`mine`), when the
/// ranks' layer sweeps must match (`lockstep`); else 0 (and no collective).
pub(crate) fn idle_micro_batches(dist: &Dist, mine: usize, lockstep: bool) -> Result<usize> {
    if !lockstep || dist.world == 1 {
        return Ok(0);
    }
    let most = dist
        .gather_f64(&[mine as f64])?
        .iter()
        .map(|c| c[0] as usize)
        .max()
        .unwrap_or(mine);
    Ok(most - mine)
}
