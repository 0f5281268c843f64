//! The compute dtype: what `model.dtype` (`float32`, `bfloat16`, `auto`) becomes on this machine,
//! and which kernels the trainer and the sampler then run.

use anyhow::{bail, Result};
use tch::{Device, Kind, Tensor};
use temper_kernels::{
    fp16_linear_available, packed_linear_supports, sampling_linear_kernel, CpuFeatures,
    LinearKernel,
};

/// The dtype matmuls and attention run in. Weights are always f32 master copies; with `Bf16` they
/// are cast to bf16 at each use (tch has no CPU autocast), activations entering a matmul or attention
/// are bf16, while the residual stream, the norms and the returned logits stay f32.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ComputeKind {
    F32,
    Bf16,
}

impl ComputeKind {
    pub fn kind(self) -> Kind {
        match self {
            ComputeKind::F32 => Kind::Float,
            ComputeKind::Bf16 => Kind::BFloat16,
        }
    }
}

/// Whether bf16 matmuls run natively on `device`, i.e. faster than f32 rather than emulated:
/// always on CUDA; on CPU only with a bf16 dot product (AVX512_BF16 or AMX-BF16, from CPUID). With
/// AVX-512 alone oneDNN converts bf16 around f32 kernels (a training step's linears measured 3-4x
/// slower than f32 on such a Xeon); on an AVX2-only CPU libtorch's generic bf16 GEMM made a
/// training step 16x slower.
pub fn bf16_is_native(device: Device) -> bool {
    match device {
        Device::Cpu => CpuFeatures::get().bf16_matmul_native(),
        _ => true,
    }
}

impl std::str::FromStr for ComputeKind {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "f32" | "float32" | "fp32" => Ok(ComputeKind::F32),
            "bf16" | "bfloat16" => Ok(ComputeKind::Bf16),
            other => bail!("unknown compute dtype `{other}` (f32 or bf16)"),
        }
    }
}

impl std::fmt::Display for ComputeKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ComputeKind::F32 => "f32",
            ComputeKind::Bf16 => "bf16",
        })
    }
}

/// `model.dtype` on `device`: `auto` is bf16 where bf16 matmuls are native ([`bf16_is_native`]),
/// else f32. An explicit `bfloat16` where bf16 is emulated is kept, and the returned warning gives
/// the slowdown measured on this machine ([`bf16_linear_slowdown`]).
pub fn resolve_compute_kind(dtype: &str, device: Device) -> Result<(ComputeKind, Option<String>)> {
    resolve_with(dtype, bf16_is_native(device), bf16_linear_slowdown)
}

/// [`resolve_compute_kind`] with the machine's answers passed in (tests give the other CPUs').
fn resolve_with(
    dtype: &str,
    native: bool,
    slowdown: impl FnOnce() -> f64,
) -> Result<(ComputeKind, Option<String>)> {
    Ok(match dtype {
        "float32" | "f32" | "fp32" => (ComputeKind::F32, None),
        "auto" if native => (ComputeKind::Bf16, None),
        "auto" => (ComputeKind::F32, None),
        "bfloat16" | "bf16" if native => (ComputeKind::Bf16, None),
        "bfloat16" | "bf16" => {
            let warning = format!(
                "model.dtype = \"bfloat16\" on a CPU without a bf16 dot product ({}): libtorch emulates \
                 bf16 matmuls here, measured {:.1}x slower than float32 (a linear layer's forward and \
                 backward); use \"float32\" or \"auto\"",
                CpuFeatures::get().summary(),
                slowdown()
            );
            (ComputeKind::Bf16, Some(warning))
        }
        other => bail!("model.dtype: unknown dtype `{other}` (float32, bfloat16 or auto)"),
    })
}

/// How many times slower a bf16 linear layer's forward and backward runs than f32 on this CPU, on
/// a training-sized shape (256 x 576 -> 1536, SmolLM2's MLP). Best of two after a warm-up; about a
/// second where bf16 is emulated, which is the only place it is called.
pub fn bf16_linear_slowdown() -> f64 {
    let time = |kind: Kind| {
        let opts = (kind, Device::Cpu);
        let x = Tensor::randn([256, 576], opts).set_requires_grad(true);
        let w = Tensor::randn([1536, 576], opts).set_requires_grad(true);
        let mut best = f64::INFINITY;
        for round in 0..3 {
            let t = std::time::Instant::now();
            x.linear(&w, None::<&Tensor>).sum(Kind::Float).backward();
            let secs = t.elapsed().as_secs_f64();
            if round > 0 {
                best = best.min(secs);
            }
        }
        best
    };
    time(Kind::BFloat16) / time(Kind::Float).max(1e-9)
}

/// The kernels a model in `compute` on `device` with heads of `head_dim` runs, for logs and
/// benchmark headers ([`crate::CausalLm::kernel_report`]).
pub fn kernel_report(compute: ComputeKind, device: Device, head_dim: i64) -> String {
    if device != Device::Cpu {
        return format!("{device:?}: {compute} matmuls (cuBLAS), libtorch attention");
    }
    let cpu = CpuFeatures::get();
    let training = match compute {
        ComputeKind::F32 => "f32".to_string(),
        ComputeKind::Bf16 if cpu.bf16_matmul_native() => "bf16 (native, oneDNN)".to_string(),
        ComputeKind::Bf16 => "bf16 (EMULATED: no bf16 dot product)".to_string(),
    };
    let attention = if temper_kernels::decode_attention_is_fast()
        && temper_kernels::decode_attention_supports(head_dim)
    {
        "temper decode-attention kernel"
    } else {
        "libtorch matmuls"
    };
    format!(
        "cpu [{}]; training matmuls: {training}; sampling linears: {}; decode attention: {attention}",
        cpu.summary(),
        sampling_kernel(compute, device)
    )
}

/// The kernel the sampler's frozen linears use for `compute` on `device`
/// ([`temper_kernels::sampling_linear_kernel`]). `TEMPER_NO_ONEDNN=1` keeps plain matmuls.
pub fn sampling_kernel(compute: ComputeKind, device: Device) -> LinearKernel {
    let allowed = device == Device::Cpu
        && std::env::var_os("TEMPER_NO_ONEDNN").is_none_or(|v| v.is_empty() || v == "0");
    if !allowed {
        return LinearKernel::Plain;
    }
    let kind = compute.kind();
    sampling_linear_kernel(
        &CpuFeatures::get(),
        kind == Kind::BFloat16,
        packed_linear_supports(kind),
        kind == Kind::BFloat16 && fp16_linear_available(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_is_bf16_only_where_native_and_explicit_bf16_warns_where_emulated() {
        let never = || panic!("measured where bf16 is native");
        assert_eq!(
            resolve_with("auto", true, never).unwrap(),
            (ComputeKind::Bf16, None)
        );
        assert_eq!(
            resolve_with("auto", false, never).unwrap(),
            (ComputeKind::F32, None)
        );
        assert_eq!(
            resolve_with("float32", false, never).unwrap(),
            (ComputeKind::F32, None)
        );
        assert_eq!(
            resolve_with("bfloat16", true, never).unwrap(),
            (ComputeKind::Bf16, None)
        );
        let (kind, warning) = resolve_with("bfloat16", false, || 3.06).unwrap();
        assert_eq!(kind, ComputeKind::Bf16);
        let warning = warning.expect("emulated bf16 warns");
        assert!(warning.contains("measured 3.1x slower"), "{warning}");
        let e = resolve_with("float16", true, never)
            .unwrap_err()
            .to_string();
        assert!(e.contains("model.dtype") && e.contains("float16"), "{e}");
        // This machine: auto follows the CPU's answer.
        let (auto, _) = resolve_compute_kind("auto", Device::Cpu).unwrap();
        assert_eq!(auto == ComputeKind::Bf16, bf16_is_native(Device::Cpu));
    }

    #[test]
    fn the_slowdown_is_a_measurement() {
        let f = bf16_linear_slowdown();
        assert!(f.is_finite() && f > 0.0, "{f}");
    }
}
