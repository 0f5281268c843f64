//! Rotary position embeddings, computed the way transformers does (f32 `inv_freq`, f32 angles from
//! per-row position ids), so positions of left-padded rows match those of unpadded rows exactly.

use tch::{Device, Kind, Tensor};

use crate::config::{ModelConfig, RopeScaling};

/// The rotary frequencies of one model (`head_dim / 2` of them).
#[derive(Debug)]
pub struct Rope {
    inv_freq: Tensor,
}

impl Rope {
    pub fn new(config: &ModelConfig, device: Device) -> Self {
        let dim = config.head_dim;
        // inv_freq = 1 / theta^(arange(0, dim, 2) / dim), all in f32 like transformers.
        let exponent = Tensor::arange_start_step(0, dim, 2, (Kind::Int64, device))
            .to_kind(Kind::Float)
            / dim as f64;
        let inv_freq = Tensor::pow_scalar(config.rope_theta, &exponent).reciprocal();
        let inv_freq = match config.rope_scaling {
            RopeScaling::Default => inv_freq,
            RopeScaling::Linear { factor } => inv_freq / factor,
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                // transformers' `_compute_llama3_parameters`.
                let old = original_max_position_embeddings;
                let low_freq_wavelen = old / low_freq_factor;
                let high_freq_wavelen = old / high_freq_factor;
                let wavelen = (inv_freq.ones_like() * (2.0 * std::f64::consts::PI)) / &inv_freq;
                let scaled = &inv_freq / factor;
                let inv_freq_llama = scaled.where_self(&wavelen.gt(low_freq_wavelen), &inv_freq);
                let smooth = ((wavelen.ones_like() * old) / &wavelen - low_freq_factor)
                    / (high_freq_factor - low_freq_factor);
                let smoothed = (smooth.ones_like() - &smooth) * &inv_freq_llama / factor
                    + &smooth * &inv_freq_llama;
                let is_medium = wavelen
                    .ge(high_freq_wavelen)
                    .logical_and(&wavelen.le(low_freq_wavelen));
                smoothed.where_self(&is_medium, &inv_freq_llama)
            }
        };
        Rope { inv_freq }
    }

    /// The frequencies (f32, `head_dim / 2`).
    pub fn inv_freq(&self) -> &Tensor {
        &self.inv_freq
    }

    /// `(cos, sin)` of shape (B, 1, T, head_dim) in `kind`, for position ids (B, T).
    pub fn cos_sin(&self, position_ids: &Tensor, kind: Kind) -> (Tensor, Tensor) {
        let freqs = position_ids.to_kind(Kind::Float).unsqueeze(-1) * &self.inv_freq; // (B, T, d/2)
        let emb = Tensor::cat(&[&freqs, &freqs], -1).unsqueeze(1);
        (emb.cos().to_kind(kind), emb.sin().to_kind(kind))
    }
}

/// `x * cos + rotate_half(x) * sin` for x of shape (B, heads, T, head_dim).
pub fn apply_rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Tensor {
    let half = x.size()[3] / 2;
    let x1 = x.narrow(3, 0, half);
    let x2 = x.narrow(3, half, half);
    let rotated = Tensor::cat(&[&(-x2), &x1], 3);
    x * cos + rotated * sin
}
