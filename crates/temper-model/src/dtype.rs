//! The compute dtype: what `model.dtype` (`float32`, `bfloat16`, `auto`) becomes on this machine,
//! and which kernels the trainer and the sampler then run.

use anyhow::{bail, Result};
use tch::{Device, Kind, Tensor};
use temper_kernels::{
    fp16_linear_available, packed_linear_supports, sampling_linear_kernel, CpuFeatures,
    LinearKernel,
};

/// The dtype matmuls and attention run in. Weights are f32 master copies (a frozen base shared by
/// LoRA models keeps bf16-exact matrices in bf16, [`crate::SharedBase`]); with `Bf16` they are
/// cast to bf16 at each use (tch has no CPU autocast), activations entering a matmul or attention
/// are bf16, while the residual stream, the norms and the returned logits stay f32.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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

/// A floating dtype's name as PyTorch spells it after `torch.` (`float32`, `bfloat16`, ...): the
/// `torch_dtype` of a saved config.json, and the dtypes of SGLang's weight updates.
pub fn torch_dtype_name(kind: Kind) -> Option<&'static str> {
    Some(match kind {
        Kind::Float => "float32",
        Kind::BFloat16 => "bfloat16",
        Kind::Half => "float16",
        Kind::Double => "float64",
        _ => return None,
    })
}

/// The floating dtype PyTorch names `name` (`torch.` prefix and the aliases `float`, `half`,
/// `double` allowed): the inverse of [`torch_dtype_name`].
pub fn kind_from_torch_name(name: &str) -> Option<Kind> {
    Some(match name.trim_start_matches("torch.") {
        "float32" | "float" => Kind::Float,
        "bfloat16" => Kind::BFloat16,
        "float16" | "half" => Kind::Half,
        "float64" | "double" => Kind::Double,
        _ => return None,
    })
}

/// Whether bf16 matmuls run natively on `device` rather than emulated: always on CUDA; on CPU
/// only with a bf16 dot product (AVX512_BF16 or AMX-BF16, from CPUID). Native bf16 can still be
/// slower than f32 on a CPU ([`resolve_compute_kind`] measures it for `auto`). With
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

/// What `model.dtype` became on a device, and what to tell the user about it.
#[derive(Debug, Clone, PartialEq)]
pub struct DtypeChoice {
    pub compute: ComputeKind,
    /// Why `auto` chose what it did where a measurement decided (one line for the log).
    pub note: Option<String>,
    /// A `bfloat16` the user asked for that runs slower than float32 here.
    pub warning: Option<String>,
}

/// What `model.dtype` or a command's `--dtype` asks for, parsed once where it is read;
/// [`resolve_compute_kind`] decides what it computes in on a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DtypeRequest {
    Float32,
    Bfloat16,
    /// bf16 on CUDA, and on CPUs where bf16 linears measure faster; f32 elsewhere.
    Auto,
}

impl std::str::FromStr for DtypeRequest {
    type Err = anyhow::Error;
    /// `auto`, or a compute dtype in any of [`ComputeKind`]'s spellings.
    fn from_str(s: &str) -> Result<Self> {
        if s == "auto" {
            return Ok(DtypeRequest::Auto);
        }
        match s.parse::<ComputeKind>() {
            Ok(ComputeKind::F32) => Ok(DtypeRequest::Float32),
            Ok(ComputeKind::Bf16) => Ok(DtypeRequest::Bfloat16),
            Err(_) => bail!("unknown dtype `{s}` (float32, bfloat16 or auto)"),
        }
    }
}

impl std::fmt::Display for DtypeRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DtypeRequest::Float32 => "float32",
            DtypeRequest::Bfloat16 => "bfloat16",
            DtypeRequest::Auto => "auto",
        })
    }
}

/// `auto` picks bf16 on a CPU only when its bf16 linears measure at least this much faster than
/// f32: below it the gain is within the probe's noise and f32 is the exact choice.
pub const AUTO_BF16_MIN_SPEEDUP: f64 = 1.15;

/// What bf16 is on a device, as far as the dtype choice goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bf16Here {
    /// CUDA: bf16 tensor cores, faster than f32 without asking.
    Gpu,
    /// A CPU with a bf16 dot product (AVX512_BF16 or AMX-BF16). Whether it beats f32 depends on
    /// the core: 1.6x at training shapes on an AMD EPYC (Zen 4), 0.65x on an Intel Xeon with
    /// AVX512_BF16 and AVX10.1 but no AMX, where oneDNN's bf16 brgemm ran at half the f32 rate.
    /// So it is measured.
    CpuDotProduct,
    /// A CPU without one: libtorch/oneDNN emulate bf16 around f32 kernels.
    CpuEmulated,
}

/// `model.dtype` on `device`: `auto` is bf16 on CUDA, and on a CPU with a bf16 dot product
/// when bf16 linears measure at least [`AUTO_BF16_MIN_SPEEDUP`] times f32's speed there
/// ([`bf16_linear_speedup`], about a tenth of a second); else f32. An explicit `bfloat16` is kept,
/// with a warning giving the measured slowdown where it is slower than f32.
pub fn resolve_compute_kind(dtype: DtypeRequest, device: Device) -> Result<DtypeChoice> {
    let here = match device {
        Device::Cpu if bf16_is_native(device) => Bf16Here::CpuDotProduct,
        Device::Cpu => Bf16Here::CpuEmulated,
        _ => Bf16Here::Gpu,
    };
    resolve_with(dtype, here, bf16_linear_speedup)
}

/// [`resolve_compute_kind`] with the machine's answers passed in (tests give the other CPUs').
fn resolve_with(
    dtype: DtypeRequest,
    here: Bf16Here,
    speedup: impl FnOnce() -> f64,
) -> Result<DtypeChoice> {
    let cpu = || CpuFeatures::get().summary();
    let choice = |compute, note, warning| DtypeChoice {
        compute,
        note,
        warning,
    };
    Ok(match (dtype, here) {
        (DtypeRequest::Float32, _) => choice(ComputeKind::F32, None, None),
        (DtypeRequest::Auto | DtypeRequest::Bfloat16, Bf16Here::Gpu) => {
            choice(ComputeKind::Bf16, None, None)
        }
        (DtypeRequest::Auto, Bf16Here::CpuEmulated) => choice(ComputeKind::F32, None, None),
        (DtypeRequest::Auto, Bf16Here::CpuDotProduct) => {
            let s = speedup();
            if s >= AUTO_BF16_MIN_SPEEDUP {
                let note = format!(
                    "model.dtype = \"auto\": bfloat16 (bf16 linears measured {s:.2}x float32's \
                     speed on this CPU [{}])",
                    cpu()
                );
                choice(ComputeKind::Bf16, Some(note), None)
            } else {
                let note = format!(
                    "model.dtype = \"auto\": float32 (this CPU [{}] has a bf16 dot product, but \
                     bf16 linears measured {s:.2}x float32's speed here; bf16 needs \
                     {AUTO_BF16_MIN_SPEEDUP}x)",
                    cpu()
                );
                choice(ComputeKind::F32, Some(note), None)
            }
        }
        (DtypeRequest::Bfloat16, Bf16Here::CpuEmulated) => {
            let warning = format!(
                "model.dtype = \"bfloat16\" on a CPU without a bf16 dot product ({}): libtorch emulates \
                 bf16 matmuls here, measured {:.1}x slower than float32 (a linear layer's forward and \
                 backward); use \"float32\" or \"auto\"",
                cpu(),
                1.0 / speedup().max(1e-9)
            );
            choice(ComputeKind::Bf16, None, Some(warning))
        }
        (DtypeRequest::Bfloat16, Bf16Here::CpuDotProduct) => {
            let s = speedup();
            let warning = (s < 1.0).then(|| {
                format!(
                    "model.dtype = \"bfloat16\": this CPU [{}] has a bf16 dot product, but bf16 \
                     linears measured {:.1}x slower than float32 here (a linear layer's forward and \
                     backward); use \"float32\" or \"auto\"",
                    cpu(),
                    1.0 / s.max(1e-9)
                )
            });
            choice(ComputeKind::Bf16, None, warning)
        }
    })
}

/// How many times faster a bf16 linear layer's forward and backward runs than f32 on this CPU
/// (below 1: slower), on a training-sized shape (512 x 576 -> 1536, SmolLM2's MLP) with the
/// current libtorch threads. The dtypes alternate over four rounds, the first a warm-up, and
/// each keeps its best: about 0.1 s where bf16 is native, a second where it is emulated.
pub fn bf16_linear_speedup() -> f64 {
    let _no_grad_leak = tch::no_grad_guard();
    let make = |kind: Kind| {
        let opts = (kind, Device::Cpu);
        let x = Tensor::randn([512, 576], opts);
        let w = Tensor::randn([1536, 576], opts);
        (x, w)
    };
    let time = |(x, w): &(Tensor, Tensor)| {
        let t = std::time::Instant::now();
        // Forward, then the two backward products (input and weight gradients).
        let y = x.linear(w, None::<&Tensor>);
        let _dx = y.matmul(w);
        let _dw = y.tr().matmul(x);
        t.elapsed().as_secs_f64()
    };
    let (f32s, bf16s) = (make(Kind::Float), make(Kind::BFloat16));
    let (mut best_f32, mut best_bf16) = (f64::INFINITY, f64::INFINITY);
    for round in 0..4 {
        let (a, b) = (time(&f32s), time(&bf16s));
        if round > 0 {
            best_f32 = best_f32.min(a);
            best_bf16 = best_bf16.min(b);
        }
    }
    best_f32 / best_bf16.max(1e-9)
}

/// The kernels a model in `compute` on `device` with heads of `head_dim` runs, for logs and
/// benchmark headers ([`crate::CausalLm::kernel_report`]).
pub fn kernel_report(compute: ComputeKind, device: Device, head_dim: i64) -> String {
    if device != Device::Cpu {
        let graphs = match crate::static_decode::captures_on(device) {
            true => "replayed as CUDA graphs",
            false => "eager",
        };
        let attention = match crate::attention::DecodeAttention::from_env() {
            crate::attention::DecodeAttention::Sdpa => "SDPA",
            crate::attention::DecodeAttention::Matmul => "grouped matmuls",
        };
        return format!(
            "{device:?}: {compute} matmuls (cuBLAS), libtorch attention; decode steps at fixed \
             shapes, {graphs}, {attention} over the cache"
        );
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

    fn never() -> f64 {
        panic!("measured where no measurement decides")
    }

    #[test]
    fn auto_is_bf16_where_native_and_measured_faster_and_explicit_bf16_warns_where_slower() {
        let kind = |d: &str, here, s: f64| resolve_with(d.parse().unwrap(), here, || s).unwrap();
        // CUDA: bf16 without a measurement; a CPU without a bf16 dot product: f32.
        assert_eq!(
            kind("auto", Bf16Here::Gpu, f64::NAN).compute,
            ComputeKind::Bf16
        );
        let emulated = resolve_with(DtypeRequest::Auto, Bf16Here::CpuEmulated, never).unwrap();
        assert_eq!(
            emulated,
            DtypeChoice {
                compute: ComputeKind::F32,
                note: None,
                warning: None
            }
        );
        // A bf16 dot product: the measurement decides (Zen 4 measured 1.6x, an Intel Xeon
        // without AMX 0.65x).
        let fast = kind("auto", Bf16Here::CpuDotProduct, 1.6);
        assert_eq!(fast.compute, ComputeKind::Bf16);
        assert!(fast.note.unwrap().contains("1.60x"));
        let slow = kind("auto", Bf16Here::CpuDotProduct, 0.65);
        assert_eq!(slow.compute, ComputeKind::F32);
        assert!(slow.note.unwrap().contains("0.65x float32's speed"));
        assert_eq!(
            kind("auto", Bf16Here::CpuDotProduct, 1.1).compute,
            ComputeKind::F32
        );
        // float32 never measures; bfloat16 is kept, with a warning only where it is slower.
        let f32 = resolve_with(DtypeRequest::Float32, Bf16Here::CpuDotProduct, never).unwrap();
        assert_eq!(f32.compute, ComputeKind::F32);
        assert_eq!(
            resolve_with(DtypeRequest::Bfloat16, Bf16Here::Gpu, never)
                .unwrap()
                .warning,
            None
        );
        assert_eq!(kind("bfloat16", Bf16Here::CpuDotProduct, 1.6).warning, None);
        let w = kind("bfloat16", Bf16Here::CpuDotProduct, 0.5)
            .warning
            .unwrap();
        assert!(w.contains("2.0x slower"), "{w}");
        let w = kind("bfloat16", Bf16Here::CpuEmulated, 1.0 / 3.06)
            .warning
            .unwrap();
        assert!(w.contains("measured 3.1x slower"), "{w}");
        assert_eq!(
            kind("bfloat16", Bf16Here::CpuEmulated, 0.3).compute,
            ComputeKind::Bf16
        );
        // Aliases parse to the same request; anything else is refused when it is read.
        assert_eq!(
            "bf16".parse::<DtypeRequest>().unwrap(),
            DtypeRequest::Bfloat16
        );
        assert_eq!(
            "fp32".parse::<DtypeRequest>().unwrap(),
            DtypeRequest::Float32
        );
        let e = "float16".parse::<DtypeRequest>().unwrap_err().to_string();
        assert!(
            e.contains("float16") && e.contains("bfloat16 or auto"),
            "{e}"
        );
    }

    #[test]
    fn auto_on_this_machine_follows_the_cpu_and_the_measurement() {
        let auto = resolve_compute_kind(DtypeRequest::Auto, Device::Cpu).unwrap();
        if !bf16_is_native(Device::Cpu) {
            assert_eq!(auto.compute, ComputeKind::F32);
        } else {
            // The note gives the measured factor the choice followed.
            let note = auto.note.expect("a measured choice has a note");
            let chosen = match auto.compute {
                ComputeKind::Bf16 => "bfloat16 (",
                ComputeKind::F32 => "float32 (",
            };
            assert!(note.contains(chosen), "{note}");
        }
    }

    #[test]
    fn the_speedup_is_a_measurement() {
        let f = bf16_linear_speedup();
        assert!(f.is_finite() && f > 0.0, "{f}");
    }
}
