//! forward / forward_backward / optim_step with Tinker's semantics on a [`CausalLm`].

use std::collections::BTreeMap;

use anyhow::Result;
use tch::{Kind, Tensor};
use temper_algo::optim::{clip_grad_norm, zero_grad, AdamW};
use temper_algo::TinkerLoss;
use temper_model::{CausalLm, PaddedRows};

/// Tinker's `AdamParams` (the SDK's defaults, which differ from torch's: beta2 0.95, eps 1e-12).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamParams {
    pub learning_rate: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    /// Decoupled (AdamW) weight decay.
    pub weight_decay: f64,
    /// Clip the global gradient norm to this first; 0 = no clipping.
    pub grad_clip_norm: f64,
}

impl Default for AdamParams {
    fn default() -> Self {
        AdamParams {
            learning_rate: 1e-4,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-12,
            weight_decay: 0.0,
            grad_clip_norm: 0.0,
        }
    }
}

/// What forward and forward_backward return.
#[derive(Debug, Clone, PartialEq)]
pub struct ForwardOutput {
    /// Per datum, the logprob of each target token (Tinker's `loss_fn_outputs[i]["logprobs"]`),
    /// row-major (N, K) when the targets are (N, K).
    pub logprobs: Vec<Vec<f32>>,
    /// K: the targets per position (1 for (N,) targets), the same for every datum of a request.
    pub width: usize,
    /// The loss summed over tokens and datums (`metrics["loss:sum"]`).
    pub loss_sum: f64,
}

/// The activations one pass of forward / forward_backward may keep: a request runs in passes of
/// at most this many bytes of activations (estimated per token from the model's shape), each of
/// at least one datum. With SmolLM2-135M that is about 2,000 padded tokens per pass; a pass of
/// 16,384 tokens needed over 20 GB and got `temper serve` OOM-killed under llm-debate's summary
/// runs (16 completions of ~1,800 tokens).
const PASS_ACTIVATION_BYTES: u64 = 2 << 30;

/// Padded tokens per pass, whatever the model: small models need no more to use the machine.
const MAX_PASS_TOKENS: usize = 16384;

/// How many padded tokens one pass over a model of this shape may hold.
fn pass_tokens(config: &temper_model::ModelConfig) -> usize {
    let per_token = config.activation_bytes_per_token();
    ((PASS_ACTIVATION_BYTES / per_token) as usize).clamp(256, MAX_PASS_TOKENS)
}

/// A model being trained through Tinker's API: gradients accumulate over forward_backward calls
/// until optim_step.
pub struct TrainingModel {
    pub model: CausalLm,
    params: Vec<(String, Tensor)>,
    optimizer: AdamW,
    /// A forward_backward pass of more padded tokens than this keeps only each layer's input and
    /// runs the layers again in the backward (activation checkpointing, as the trainer's
    /// `gradient_checkpointing`). Passes are cut at [`pass_tokens`], so only a datum longer than
    /// a whole pass gets here: it then costs about its layer inputs, not every activation of
    /// every layer (memory linear in its tokens, and a small slope). Shorter passes keep the
    /// plain backward (faster, and the same numbers as before).
    checkpoint_above: usize,
}

impl TrainingModel {
    /// Trains `model.trainable_parameters()` (the LoRA adapters when it has them).
    pub fn new(model: CausalLm) -> Self {
        let params = model.trainable_parameters();
        let d = AdamParams::default();
        let optimizer = AdamW::new(
            &params,
            d.learning_rate,
            (d.beta1, d.beta2),
            d.eps,
            d.weight_decay,
        );
        let checkpoint_above = pass_tokens(model.config());
        TrainingModel {
            model,
            params,
            optimizer,
            checkpoint_above,
        }
    }

    /// Checkpoint the layers of every forward_backward pass of more than `tokens` padded tokens
    /// (default: passes longer than a pass may be, that is, a datum longer than a pass).
    pub fn set_checkpoint_above(&mut self, tokens: usize) {
        self.checkpoint_above = tokens;
    }

    /// The outputs and loss without touching gradients.
    pub fn forward(
        &self,
        data: &[crate::Datum],
        loss_fn: &str,
        config: &BTreeMap<String, f64>,
    ) -> Result<ForwardOutput> {
        tch::no_grad(|| self.run(data, loss_fn, config, false))
    }

    /// The outputs and loss, with the loss's gradient added to the accumulated gradients.
    pub fn forward_backward(
        &mut self,
        data: &[crate::Datum],
        loss_fn: &str,
        config: &BTreeMap<String, f64>,
    ) -> Result<ForwardOutput> {
        self.run(data, loss_fn, config, true)
    }

    /// AdamW on the accumulated gradients (clipped first when `grad_clip_norm > 0`), then the
    /// gradients are zeroed. Returns the gradient norm before clipping.
    pub fn optim_step(&mut self, p: &AdamParams) -> Result<f64> {
        let norm = clip_grad_norm(&self.params, p.grad_clip_norm)?;
        self.optimizer.lr = p.learning_rate;
        self.optimizer.betas = (p.beta1, p.beta2);
        self.optimizer.eps = p.eps;
        self.optimizer.weight_decay = p.weight_decay;
        self.optimizer.step(&self.params)?;
        zero_grad(&self.params);
        Ok(norm)
    }

    pub fn optimizer(&self) -> &AdamW {
        &self.optimizer
    }

    pub fn optimizer_mut(&mut self) -> &mut AdamW {
        &mut self.optimizer
    }

    fn run(
        &self,
        data: &[crate::Datum],
        loss_fn: &str,
        config: &BTreeMap<String, f64>,
        backward: bool,
    ) -> Result<ForwardOutput> {
        let loss = TinkerLoss::from_request(loss_fn, config)?;
        let vocab = self.model.config().vocab_size;
        let targets: Vec<Vec<i64>> = data
            .iter()
            .enumerate()
            .map(|(i, d)| d.validate(i, vocab, loss.inputs()))
            .collect::<Result<_>>()?;
        if loss.needs_provenance() {
            for (i, d) in data.iter().enumerate() {
                d.validate_recorded(i, loss_fn)?;
            }
        }
        // Datums run in passes of at most `pass_tokens` padded tokens (activations are per pass;
        // gradients add up over passes as over forward_backward calls).
        let pass_tokens = pass_tokens(self.model.config());
        let width = data.first().map_or(1, |d| d.width("target_tokens"));
        if let Some(i) = data.iter().position(|d| d.width("target_tokens") != width) {
            anyhow::bail!(
                "datum {i}: loss_fn_inputs.target_tokens has {} targets per position, datum 0 has \
                 {width}: one request's datums share K",
                data[i].width("target_tokens")
            );
        }
        let mut out = ForwardOutput {
            width,
            logprobs: Vec::with_capacity(data.len()),
            loss_sum: 0.0,
        };
        let mut start = 0;
        while start < data.len() {
            let mut end = start + 1;
            let mut width = data[start].model_input.len();
            while end < data.len() {
                let w = width.max(data[end].model_input.len());
                if w * (end + 1 - start) > pass_tokens {
                    break;
                }
                width = w;
                end += 1;
            }
            let part = self.pass(&data[start..end], &targets[start..end], &loss, backward)?;
            out.logprobs.extend(part.logprobs);
            out.loss_sum += part.loss_sum;
            start = end;
        }
        Ok(out)
    }

    /// One forward (and backward) over `data` as one right-padded batch.
    fn pass(
        &self,
        data: &[crate::Datum],
        targets: &[Vec<i64>],
        loss: &TinkerLoss,
        backward: bool,
    ) -> Result<ForwardOutput> {
        // One right-padded batch (continuations alone in the one padded layout): position t of
        // datum i predicts targets[i][t].
        let device = self.model.device();
        let rows: Vec<(&[i64], &[i64])> = data
            .iter()
            .map(|d| (&[][..], d.model_input.as_slice()))
            .collect();
        let padded = PaddedRows::new(&rows, 0);
        let width = padded.width();
        let (mut tgt, mut real) = (vec![], vec![]);
        for (i, (d, t)) in data.iter().zip(targets).enumerate() {
            tgt.extend(t.iter().copied());
            real.extend((0..d.model_input.len()).map(|k| (i * width + k) as i64));
        }
        let (ids, mask, pos) = padded.tensors(device);
        let checkpointed = backward && width * data.len() > self.checkpoint_above;
        let (hidden, checkpoints) = if checkpointed {
            let (h, c) = self.model.forward_hidden_checkpointed(&ids, &pos, &mask);
            (h, Some(c))
        } else {
            (self.model.forward_hidden(&ids, &pos, &mask, None), None)
        };
        // Only the datums' own positions (not the padding) reach the unembedding, in datum order.
        let h = *hidden.size().last().expect("hidden is (B, T, H)");
        let hidden = hidden
            .reshape([-1, h])
            .index_select(0, &Tensor::from_slice(&real).to(device));
        // K targets per position: each position's hidden state scores each of its K targets.
        let k = data[0].width("target_tokens") as i64;
        let hidden = if k > 1 {
            hidden.repeat_interleave_self_int(k, 0, None)
        } else {
            hidden
        };
        let tgt = Tensor::from_slice(&tgt).to(device);
        let scores =
            self.model
                .score_tokens(&hidden, &tgt, 1.0, self.model.default_unembed_chunk());
        let scores = match checkpoints {
            Some(c) => scores.with_checkpoints(c),
            None => scores,
        };
        let mut total: Option<Tensor> = None;
        let mut logprobs = Vec::with_capacity(data.len());
        let mut start = 0;
        for d in data {
            let n = d.model_input.len() as i64 * k;
            let row = scores.logp.narrow(0, start, n);
            start += n;
            let input = |name: &str| -> Tensor {
                let v: Vec<f64> = match (name, &d.recorded) {
                    (temper_algo::tinker_loss::RECORDED_LOGPROBS, Some(r)) => {
                        r.logprobs.iter().map(|&x| x as f64).collect()
                    }
                    (temper_algo::tinker_loss::SAMPLED_MASK, Some(r)) => {
                        r.sampled.iter().map(|&x| f64::from(u8::from(x))).collect()
                    }
                    _ => d.loss_fn_inputs[name].to_f64(),
                };
                Tensor::from_slice(&v).to_kind(Kind::Float).to(device)
            };
            let l = loss.datum_loss(&row, &input)?;
            total = Some(match total {
                Some(t) => t + l,
                None => l,
            });
            logprobs.push(Vec::<f32>::try_from(row.detach().to(tch::Device::Cpu))?);
        }
        let total = total.expect("data is not empty");
        // Positions whose weight or advantage is zero get no gradient and skip the unembedding's
        // backward; a batch where all are zero adds nothing (and has loss 0).
        if backward && total.requires_grad() {
            total.backward();
            scores.backward();
        }
        let loss_sum = total.to_kind(Kind::Double).double_value(&[]);
        Ok(ForwardOutput {
            logprobs,
            loss_sum,
            width: k as usize,
        })
    }
}

impl std::fmt::Debug for TrainingModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrainingModel")
            .field("params", &self.params.len())
            .field("optimizer_steps", &self.optimizer.steps_taken())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use temper_model::ModelConfig;

    /// SmolLM2-135M's shape gets passes of about 2,000 tokens (its activations, about 1.06 MB per
    /// token since the MLP saves two intermediate-size tensors, stay near 2 GiB); a tiny model
    /// gets the cap.
    #[test]
    fn passes_are_sized_by_the_model() {
        let smollm2 = ModelConfig::qwen2_like(49152, 576, 1536, 30, 9, 3, true);
        let per_token = smollm2.activation_bytes_per_token();
        assert!((1_000_000..1_200_000).contains(&per_token), "{per_token}");
        let n = super::pass_tokens(&smollm2);
        assert!((1_800..2_200).contains(&n), "{n}");
        let tiny = ModelConfig::qwen2_like(64, 16, 32, 2, 2, 1, true);
        assert_eq!(super::pass_tokens(&tiny), super::MAX_PASS_TOKENS);
    }
}
