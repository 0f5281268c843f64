//! A decoder layer's parts: its linears (f32 master weights, an optional LoRA adapter, the
//! compute dtype's matmul) and RMSNorm.
use tch::{nn, Kind, Tensor};

use super::Params;
use crate::lora::LoraAdapter;

#[derive(Debug)]
pub(crate) struct Linear {
    pub(crate) weight: Tensor,
    pub(crate) bias: Option<Tensor>,
    pub(crate) lora: Option<LoraAdapter>,
}

impl Linear {
    pub(crate) fn new(p: nn::Path, in_dim: i64, out_dim: i64, bias: bool, params: &Params) -> Self {
        let weight = params.matrix(&p, "weight", &[out_dim, in_dim]);
        let bias = bias.then(|| params.matrix(&p, "bias", &[out_dim]));
        Linear {
            weight,
            bias,
            lora: None,
        }
    }

    /// `x @ W^T + b` (plus the LoRA term) with W (and b) cast to `kind`, the dtype of `x`.
    pub(crate) fn forward(&self, x: &Tensor, kind: Kind) -> Tensor {
        let y = if kind == Kind::Float {
            x.linear(&self.weight, self.bias.as_ref())
        } else {
            x.linear(
                &self.weight.to_kind(kind),
                self.bias.as_ref().map(|b| b.to_kind(kind)),
            )
        };
        match crate::lora::active(&self.lora) {
            Some(l) => y + l.forward(x, kind),
            None => y,
        }
    }

    /// `forward(silu(gate) * up, kind)` as one autograd node that saves `gate` and `up` only
    /// and recomputes the product in the backward ([`temper_kernels::swiglu_down`]): the
    /// decoder MLP's output projection, with the same results and half the MLP's saved
    /// activations.
    pub(crate) fn forward_swiglu(&self, gate: &Tensor, up: &Tensor, kind: Kind) -> Tensor {
        // `to_kind` to the tensor's own dtype is the tensor itself (f32 runs copy nothing).
        let w = self.weight.to_kind(kind);
        let bias = self.bias.as_ref().map(|b| b.to_kind(kind));
        let adapter = crate::lora::active(&self.lora)
            .map(|l| (l.a.to_kind(kind), l.b.to_kind(kind), l.scale));
        let lora = adapter
            .as_ref()
            .map(|(a, b, scale)| temper_kernels::SwigluLora {
                a,
                b,
                scale: *scale,
            });
        temper_kernels::swiglu_down(gate, up, &w, bias.as_ref(), lora)
            .expect("the MLP's shapes are the config's, checked at load")
    }

    /// The weight the layer computes with (LoRA merged in), detached, and the bias.
    pub(crate) fn part(&self) -> (Tensor, Option<&Tensor>) {
        let w = match &self.lora {
            Some(l) => l.merged(&self.weight),
            None => self.weight.shallow_clone(),
        };
        (w, self.bias.as_ref())
    }

    pub(crate) fn in_out(&self) -> (i64, i64) {
        let s = self.weight.size();
        (s[1], s[0])
    }
}

impl Layer {
    /// The LoRA-targetable linears by module name, with their HF path under the layer.
    pub(crate) fn linears_mut(&mut self) -> [(&'static str, &'static str, &mut Linear); 7] {
        [
            ("q_proj", "self_attn", &mut self.q_proj),
            ("k_proj", "self_attn", &mut self.k_proj),
            ("v_proj", "self_attn", &mut self.v_proj),
            ("o_proj", "self_attn", &mut self.o_proj),
            ("gate_proj", "mlp", &mut self.gate_proj),
            ("up_proj", "mlp", &mut self.up_proj),
            ("down_proj", "mlp", &mut self.down_proj),
        ]
    }

    pub(crate) fn linears(&self) -> [(&'static str, &'static str, &Linear); 7] {
        [
            ("q_proj", "self_attn", &self.q_proj),
            ("k_proj", "self_attn", &self.k_proj),
            ("v_proj", "self_attn", &self.v_proj),
            ("o_proj", "self_attn", &self.o_proj),
            ("gate_proj", "mlp", &self.gate_proj),
            ("up_proj", "mlp", &self.up_proj),
            ("down_proj", "mlp", &self.down_proj),
        ]
    }
}

/// RMSNorm in f32 whatever the input dtype; returns f32.
pub(crate) fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Tensor {
    let d = x.size()[x.dim() - 1];
    x.to_kind(Kind::Float).rms_norm([d], Some(weight), eps)
}

#[derive(Debug)]
pub(crate) struct Layer {
    pub(crate) input_layernorm: Tensor,
    pub(crate) q_proj: Linear,
    pub(crate) k_proj: Linear,
    pub(crate) v_proj: Linear,
    pub(crate) o_proj: Linear,
    pub(crate) q_norm: Option<Tensor>,
    pub(crate) k_norm: Option<Tensor>,
    pub(crate) post_attention_layernorm: Tensor,
    pub(crate) gate_proj: Linear,
    pub(crate) up_proj: Linear,
    pub(crate) down_proj: Linear,
}
