//! Inference-only copies of the weights, built once per sampling call
//! ([`crate::CausalLm::with_sampling_weights`]).
//!
//! A decode step at batch 16 is a handful of skinny matmuls per layer, and most of its time goes
//! into them. Three things make them cheaper than the training path's `linear` on the f32 master
//! weights:
//! - fusion: q/k/v become one (q+2kv, hidden) matrix and gate/up one (2I, hidden) matrix, so a
//!   layer runs 4 matmuls instead of 7;
//! - dtype: the copies are already in the compute dtype (bf16 compute casts once, not per step);
//! - layout: on CPU, oneDNN's prepacked layout ([`temper_kernels::PackedLinear`]); MKL's sgemm
//!   re-packs the weight on every call, a quarter of the decode time at batch 16.
//!
//! The results differ from the training path by float rounding only (summation order), which
//! `temper check-logprobs` measures. Set `TEMPER_NO_ONEDNN=1` to keep the fused copies in plain
//! layout (to compare, or if oneDNN misbehaves on some CPU).

use tch::{Kind, Tensor};
use temper_kernels::{Fp16Linear, LinearKernel, PackedLinear};

use crate::dtype::{sampling_kernel, ComputeKind};

/// One frozen matmul: `x @ W^T + b` with W in the compute dtype.
#[derive(Debug)]
pub(crate) enum FrozenLinear {
    Packed(PackedLinear),
    /// bf16 weights stored as fp16 (the same values), f32 activations: CPUs without a oneDNN bf16
    /// path.
    Fp16(Fp16Linear),
    Plain {
        weight: Tensor,
        bias: Option<Tensor>,
    },
}

impl FrozenLinear {
    /// Stack the `(weight, bias)` parts along the output dimension and cast them to `kind`.
    /// Either every part has a bias or none does.
    pub(crate) fn fuse(parts: &[(Tensor, Option<&Tensor>)], compute: ComputeKind) -> Self {
        let kind = compute.kind();
        let weight = cat_detached(parts.iter().map(|p| &p.0), kind);
        let bias = parts
            .iter()
            .all(|p| p.1.is_some())
            .then(|| cat_detached(parts.iter().filter_map(|p| p.1), kind));
        match sampling_kernel(compute, weight.device()) {
            LinearKernel::OneDnnPacked => match PackedLinear::new(&weight, bias.as_ref()) {
                Ok(p) => return FrozenLinear::Packed(p),
                Err(e) => tracing::warn!("oneDNN packing failed, using plain matmuls: {e}"),
            },
            LinearKernel::FbgemmFp16 => match Fp16Linear::new(&weight, bias.as_ref()) {
                Ok(p) => return FrozenLinear::Fp16(p),
                Err(e) => tracing::warn!("fp16 packing failed, using plain matmuls: {e}"),
            },
            LinearKernel::Plain => {}
        }
        FrozenLinear::Plain { weight, bias }
    }

    /// `x` must be in the compute dtype.
    pub(crate) fn forward(&self, x: &Tensor) -> Tensor {
        match self {
            FrozenLinear::Packed(p) => p.forward(x),
            FrozenLinear::Fp16(p) => p.forward(x),
            FrozenLinear::Plain { weight, bias } => x.linear(weight, bias.as_ref()),
        }
    }
}

fn cat_detached<'a>(parts: impl Iterator<Item = &'a Tensor>, kind: Kind) -> Tensor {
    let parts: Vec<Tensor> = parts.map(|t| t.detach().to_kind(kind)).collect();
    if parts.len() == 1 {
        // `to_kind` to the same kind returns a view of the master weight: copy, so the frozen
        // weight does not change under an optimizer step taken while it lives.
        return parts[0].copy();
    }
    Tensor::cat(&parts, 0)
}

/// A decoder layer's matmuls, fused.
#[derive(Debug)]
pub(crate) struct FrozenLayer {
    /// q, k, v stacked: outputs `[q (heads*d) | k (kv*d) | v (kv*d)]`.
    pub qkv: FrozenLinear,
    pub o: FrozenLinear,
    /// gate, up stacked: outputs `[gate (I) | up (I)]`.
    pub gate_up: FrozenLinear,
    pub down: FrozenLinear,
}

/// Every matmul of the model, frozen for sampling.
#[derive(Debug)]
pub(crate) struct SamplingWeights {
    pub layers: Vec<FrozenLayer>,
    pub head: FrozenLinear,
}

impl FrozenLinear {
    /// The tensors a GPU forward reads (plain copies; the CPU's packed kernels hold their own).
    fn tensors(&self) -> Vec<&Tensor> {
        match self {
            FrozenLinear::Plain { weight, bias } => std::iter::once(weight).chain(bias).collect(),
            _ => Vec::new(),
        }
    }
}

impl SamplingWeights {
    /// Every tensor of the plain copies.
    pub(crate) fn tensors(&self) -> Vec<&Tensor> {
        let mut out = self.head.tensors();
        for l in &self.layers {
            for f in [&l.qkv, &l.o, &l.gate_up, &l.down] {
                out.extend(f.tensors());
            }
        }
        out
    }

    /// Copies `fresh`'s values into these copies, in place (their addresses stay, so a captured
    /// CUDA graph that reads them stays valid); false, changing nothing, unless both are plain
    /// copies of the same shapes.
    pub(crate) fn refresh_from(&self, fresh: &SamplingWeights) -> bool {
        let (mine, theirs) = (self.tensors(), fresh.tensors());
        let plain = |w: &SamplingWeights| {
            std::iter::once(&w.head)
                .chain(
                    w.layers
                        .iter()
                        .flat_map(|l| [&l.qkv, &l.o, &l.gate_up, &l.down]),
                )
                .all(|f| matches!(f, FrozenLinear::Plain { .. }))
        };
        if !plain(self)
            || !plain(fresh)
            || mine.len() != theirs.len()
            || mine
                .iter()
                .zip(&theirs)
                .any(|(a, b)| a.size() != b.size() || a.kind() != b.kind())
        {
            return false;
        }
        for (a, b) in mine.into_iter().zip(theirs) {
            a.shallow_clone().copy_(b);
        }
        true
    }
}
