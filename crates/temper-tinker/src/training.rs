//! forward / forward_backward / optim_step with Tinker's semantics on a [`CausalLm`].

use std::collections::BTreeMap;

use anyhow::Result;
use tch::{Kind, Tensor};
use temper_algo::TinkerLoss;
use temper_model::{logprobs_of, position_ids_from_mask, CausalLm};
use temper_train::optim::{clip_grad_norm, zero_grad, AdamW};

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
    /// Per datum, the logprob of each target token (Tinker's `loss_fn_outputs[i]["logprobs"]`).
    pub logprobs: Vec<Vec<f32>>,
    /// The loss summed over tokens and datums (`metrics["loss:sum"]`).
    pub loss_sum: f64,
}

/// A model being trained through Tinker's API: gradients accumulate over forward_backward calls
/// until optim_step.
pub struct TrainingModel {
    pub model: CausalLm,
    params: Vec<(String, Tensor)>,
    optimizer: AdamW,
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
        TrainingModel {
            model,
            params,
            optimizer,
        }
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
        let norm = clip_grad_norm(&self.params, p.grad_clip_norm);
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
        if data.is_empty() {
            return Ok(ForwardOutput {
                logprobs: vec![],
                loss_sum: 0.0,
            });
        }
        // One right-padded batch: position t of datum i predicts targets[i][t].
        let device = self.model.device();
        let width = data.iter().map(|d| d.model_input.len()).max().unwrap_or(1);
        let (mut ids, mut mask, mut tgt) = (vec![], vec![], vec![]);
        for (d, t) in data.iter().zip(&targets) {
            let pad = width - d.model_input.len();
            ids.extend(
                d.model_input
                    .iter()
                    .copied()
                    .chain(std::iter::repeat_n(0, pad)),
            );
            mask.extend(
                std::iter::repeat_n(1i64, d.model_input.len()).chain(std::iter::repeat_n(0, pad)),
            );
            tgt.extend(t.iter().copied().chain(std::iter::repeat_n(0, pad)));
        }
        let shape = [data.len() as i64, width as i64];
        let ids = Tensor::from_slice(&ids).view(shape).to(device);
        let mask = Tensor::from_slice(&mask).view(shape).to(device);
        let tgt = Tensor::from_slice(&tgt).view(shape).to(device);
        let pos = position_ids_from_mask(&mask);
        let lp = self.target_logprobs(data, &loss, &ids, &mask, &pos, &tgt);
        let mut total: Option<Tensor> = None;
        let mut logprobs = Vec::with_capacity(data.len());
        for (i, d) in data.iter().enumerate() {
            let n = d.model_input.len() as i64;
            let row = lp.get(i as i64).narrow(0, 0, n);
            let input = |name: &str| -> Tensor {
                let v = d.loss_fn_inputs[name].to_f64();
                Tensor::from_slice(&v).to_kind(Kind::Float).to(device)
            };
            let l = loss.datum_loss(&row, &input);
            total = Some(match total {
                Some(t) => t + l,
                None => l,
            });
            logprobs.push(Vec::<f32>::try_from(row.detach().to(tch::Device::Cpu))?);
        }
        let total = total.expect("data is not empty");
        if backward {
            total.backward();
        }
        let loss_sum = total.to_kind(Kind::Double).double_value(&[]);
        Ok(ForwardOutput { logprobs, loss_sum })
    }
}

impl TrainingModel {
    /// (B, T) logprobs of the targets. Only the positions that contribute to the loss (a nonzero
    /// weight or advantage; every position for dro) run the unembedding with autograd; the
    /// others, typically the prompt, are computed without it in chunks: the loss and its gradient
    /// are the same (their terms are zero), and the (positions, vocabulary) logits of the prompt
    /// are never kept for a backward.
    fn target_logprobs(
        &self,
        data: &[crate::Datum],
        loss: &TinkerLoss,
        ids: &Tensor,
        mask: &Tensor,
        pos: &Tensor,
        tgt: &Tensor,
    ) -> Tensor {
        let hidden = self.model.forward_hidden(ids, pos, mask, None);
        let (b, t, h) = hidden.size3().expect("hidden is (B, T, H)");
        let flat = hidden.reshape([b * t, h]);
        let flat_tgt = tgt.reshape([b * t]);
        let weight_of = match loss {
            TinkerLoss::CrossEntropy => Some("weights"),
            TinkerLoss::Dro { .. } => None,
            _ => Some("advantages"),
        };
        let (mut active, mut inactive) = (vec![], vec![]);
        for (i, d) in data.iter().enumerate() {
            let w = weight_of.map(|name| d.loss_fn_inputs[name].to_f64());
            for k in 0..d.model_input.len() {
                let at = i as i64 * t + k as i64;
                match &w {
                    Some(w) if w[k] == 0.0 => inactive.push(at),
                    _ => active.push(at),
                }
            }
        }
        let device = flat.device();
        let logprobs = |rows: &Tensor, idx: &Tensor| {
            logprobs_of(
                &self.model.logits(rows),
                &flat_tgt.index_select(0, idx),
                1.0,
            )
        };
        let mut out = Tensor::zeros([b * t], (Kind::Float, device));
        tch::no_grad(|| {
            let detached = flat.detach();
            for chunk in inactive.chunks(1024) {
                let idx = Tensor::from_slice(chunk).to(device);
                let lp = logprobs(&detached.index_select(0, &idx), &idx);
                let _ = out.index_copy_(0, &idx, &lp);
            }
        });
        if !active.is_empty() {
            let idx = Tensor::from_slice(&active).to(device);
            let lp = logprobs(&flat.index_select(0, &idx), &idx);
            out = out.index_copy(0, &idx, &lp);
        }
        out.view([b, t])
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
