//! Whether a new training model fits this machine, checked from its base's config before any
//! weight is loaded: a client asking for more than the machine has gets a user error with the
//! numbers, instead of the server being killed by the kernel (and every other client with it).

use anyhow::{bail, Result};
use temper_model::{LoraConfig, ModelConfig};

/// A training model's f32 state: the base weights (unless a loaded base is shared), and each
/// trained parameter's gradient and two AdamW moments (and its own value, for adapters).
pub(crate) fn bytes_needed(config: &ModelConfig, lora: Option<&LoraConfig>, shared: bool) -> u64 {
    const F32: u64 = 4;
    let base = config.num_params().max(0) as u64 * F32;
    match lora {
        Some(l) => {
            let adapters = l.num_params(config).unwrap_or(0).max(0) as u64;
            let base = if shared { 0 } else { base };
            base + 4 * adapters * F32
        }
        // Weights, gradients and two moments.
        None => 4 * base,
    }
}

/// Refuses a model whose state would not fit the memory this machine has available now.
pub(crate) fn admit(config: &ModelConfig, lora: Option<&LoraConfig>, shared: bool) -> Result<()> {
    let Some(available) = temper_kernels::memory::available_bytes() else {
        return Ok(());
    };
    let need = bytes_needed(config, lora, shared);
    if need > available {
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        bail!(
            "this {} needs about {:.2} GiB (f32 {}), and this machine has {:.2} GiB available: \
             end other clients' sessions, or use a smaller base model{}",
            if lora.is_some() {
                "LoRA model"
            } else {
                "full fine-tune"
            },
            gib(need),
            match (lora, shared) {
                (Some(_), true) => "adapters with their gradients and AdamW moments",
                (Some(_), false) => "base weights, adapters with their gradients and AdamW moments",
                (None, _) => "weights, gradients and AdamW moments",
            },
            gib(available),
            if lora.is_some() {
                " or rank"
            } else {
                " or LoRA"
            }
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_base_costs_only_the_adapters() {
        let cfg = ModelConfig::qwen2_like(1000, 64, 128, 2, 4, 2, true);
        let lora = LoraConfig {
            rank: 4,
            alpha: 4.0,
            target_modules: vec!["all-linear".into()],
        };
        let adapters = lora.num_params(&cfg).unwrap() as u64;
        let base = cfg.num_params() as u64;
        assert_eq!(bytes_needed(&cfg, Some(&lora), true), 16 * adapters);
        assert_eq!(
            bytes_needed(&cfg, Some(&lora), false),
            4 * base + 16 * adapters
        );
        assert_eq!(bytes_needed(&cfg, None, false), 16 * base);
    }
}
