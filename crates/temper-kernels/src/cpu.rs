//! What this CPU can do, read once from CPUID, and the kernel choices that follow from it.
//!
//! One place decides, for the trainer and the sampler alike, whether bf16 matmuls are native here.
//! They are when the CPU has a bf16 dot-product instruction: AVX512_BF16 (`vdpbf16ps`) or AMX-BF16
//! (tile matmuls). AVX-512 alone is not enough: oneDNN then converts bf16 to f32 and back around an
//! f32 kernel. Measured on an Intel Xeon with AVX-512F/BW/VL/DQ but neither: a bf16 linear
//! forward+backward at 2048x576x1536 took 425 ms against 100 ms in f32, and `temper bench train`
//! ran bf16 at 0.30x of f32. On an AVX2-only AMD EPYC libtorch's generic bf16 GEMM made a training
//! step 16x slower than f32. Native is necessary, not sufficient: on an Intel Xeon with
//! AVX512_BF16 but no AMX, oneDNN's native bf16 matmuls ran at half the f32 rate, so the dtype
//! choice (`temper_model::resolve_compute_kind`) also measures.

use std::sync::OnceLock;

/// The CPU features temper's kernel choices depend on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CpuFeatures {
    /// AVX2 with FMA and F16C: FBGEMM's fp16 GEMM runs.
    pub avx2: bool,
    /// AVX-512 F, BW, VL and DQ (oneDNN's `avx512_core`).
    pub avx512: bool,
    /// AVX512_BF16: bf16 dot products (CPUID leaf 7 subleaf 1, EAX bit 5).
    pub avx512_bf16: bool,
    /// AMX-BF16 tiles, enabled by the OS (CPUID leaf 7 EDX bit 22, XCR0 tile state).
    pub amx_bf16: bool,
}

impl CpuFeatures {
    /// This machine's features, read once, as far as oneDNN may use them: `ONEDNN_MAX_CPU_ISA`
    /// (oneDNN's own cap, read by libtorch's oneDNN too) below `AVX512_CORE_BF16` turns the bf16
    /// instructions off for temper as well, since oneDNN then emulates bf16. That also makes an
    /// AVX-512 CPU without bf16 reproducible on one that has it.
    pub fn get() -> CpuFeatures {
        static FEATURES: OnceLock<CpuFeatures> = OnceLock::new();
        *FEATURES.get_or_init(|| {
            let cap = std::env::var("ONEDNN_MAX_CPU_ISA").unwrap_or_default();
            detect().capped_by_onednn_isa(&cap)
        })
    }

    /// These features under oneDNN's ISA cap `isa` (a `ONEDNN_MAX_CPU_ISA` value; empty or
    /// `DEFAULT`: no cap). Unknown values leave the features as they are, as oneDNN ignores them.
    pub fn capped_by_onednn_isa(mut self, isa: &str) -> CpuFeatures {
        let isa = isa.trim().to_ascii_uppercase();
        let (bf16, amx) = match isa.as_str() {
            "SSE41" | "AVX" | "AVX2" | "AVX2_VNNI" | "AVX2_VNNI_2" | "AVX512_CORE"
            | "AVX512_CORE_VNNI" => (false, false),
            "AVX512_CORE_BF16" | "AVX512_CORE_FP16" | "AVX10_1_512" => (true, false),
            _ => (true, true),
        };
        self.avx512_bf16 &= bf16;
        self.amx_bf16 &= amx;
        if matches!(
            isa.as_str(),
            "SSE41" | "AVX" | "AVX2" | "AVX2_VNNI" | "AVX2_VNNI_2"
        ) {
            self.avx512 = false;
        }
        self
    }

    /// Whether bf16 matmuls are native here (a bf16 dot product) rather than emulated. Native is
    /// not always faster than f32: `model.dtype = "auto"` measures that
    /// (`temper_model::bf16_linear_speedup`).
    pub fn bf16_matmul_native(&self) -> bool {
        self.avx512_bf16 || self.amx_bf16
    }

    /// One line for logs and benchmark headers, e.g. `avx2 avx512 avx512_bf16 -amx_bf16`.
    pub fn summary(&self) -> String {
        let flag = |on: bool, name: &str| {
            if on {
                name.to_string()
            } else {
                format!("-{name}")
            }
        };
        [
            flag(self.avx2, "avx2"),
            flag(self.avx512, "avx512"),
            flag(self.avx512_bf16, "avx512_bf16"),
            flag(self.amx_bf16, "amx_bf16"),
        ]
        .join(" ")
    }
}

#[cfg(target_arch = "x86_64")]
fn detect() -> CpuFeatures {
    use std::arch::x86_64::__cpuid_count;
    let avx512 = std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vl")
        && std::arch::is_x86_feature_detected!("avx512dq");
    // Leaf 7 is read only where leaf 0 says it exists.
    let max_leaf = __cpuid_count(0, 0).eax;
    let leaf7 = (max_leaf >= 7).then(|| __cpuid_count(7, 0));
    let amx_cpu = leaf7.is_some_and(|r| r.edx & (1 << 22) != 0);
    CpuFeatures {
        avx2: std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c"),
        avx512,
        // `is_x86_feature_detected` also checks that the OS saves the AVX-512 state.
        avx512_bf16: avx512 && std::arch::is_x86_feature_detected!("avx512bf16"),
        amx_bf16: amx_cpu && os_saves_tile_state(),
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() -> CpuFeatures {
    CpuFeatures::default()
}

/// XCR0 bits 17 (XTILECFG) and 18 (XTILEDATA): the kernel context-switches AMX tiles.
#[cfg(target_arch = "x86_64")]
fn os_saves_tile_state() -> bool {
    if !std::arch::is_x86_feature_detected!("xsave") {
        return false;
    }
    // SAFETY: OSXSAVE is set (`xsave` detected above checks it), so XGETBV may be executed.
    let xcr0 = unsafe { xgetbv0() };
    xcr0 & (0b11 << 17) == 0b11 << 17
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "xsave")]
unsafe fn xgetbv0() -> u64 {
    std::arch::x86_64::_xgetbv(0)
}

/// Which matmul serves a frozen (sampling) linear layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinearKernel {
    /// oneDNN with the weight prepacked once ([`crate::PackedLinear`]).
    OneDnnPacked,
    /// bf16 weights as fp16 in FBGEMM's GEMM, f32 activations ([`crate::Fp16Linear`]).
    FbgemmFp16,
    /// libtorch's `linear`.
    Plain,
}

impl std::fmt::Display for LinearKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LinearKernel::OneDnnPacked => "oneDNN prepacked",
            LinearKernel::FbgemmFp16 => "FBGEMM fp16",
            LinearKernel::Plain => "libtorch linear",
        })
    }
}

/// The sampler's linear kernel for weights in `bf16` (else f32) on a CPU with `cpu`, given what
/// this libtorch can do (`onednn_packs`: oneDNN packs weights of this dtype; `fbgemm_fp16`:
/// FBGEMM's fp16 GEMM works). bf16 goes to oneDNN only where bf16 is native, the same rule as
/// training; elsewhere oneDNN's bf16 path emulates it, and FBGEMM's fp16 GEMM on the same values
/// (exact: every bf16 value of a weight is an fp16 value up to range) is faster (3.5x on AVX2).
pub fn sampling_linear_kernel(
    cpu: &CpuFeatures,
    bf16: bool,
    onednn_packs: bool,
    fbgemm_fp16: bool,
) -> LinearKernel {
    match (bf16, cpu.bf16_matmul_native()) {
        (false, _) | (true, true) if onednn_packs => LinearKernel::OneDnnPacked,
        (true, _) if fbgemm_fp16 && cpu.avx2 => LinearKernel::FbgemmFp16,
        _ => LinearKernel::Plain,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The three CPUs seen on this project's machines.
    const AVX2_ONLY: CpuFeatures = CpuFeatures {
        avx2: true,
        avx512: false,
        avx512_bf16: false,
        amx_bf16: false,
    };
    const AVX512_NO_BF16: CpuFeatures = CpuFeatures {
        avx2: true,
        avx512: true,
        avx512_bf16: false,
        amx_bf16: false,
    };
    const AVX512_BF16: CpuFeatures = CpuFeatures {
        avx2: true,
        avx512: true,
        avx512_bf16: true,
        amx_bf16: false,
    };
    const AMX: CpuFeatures = CpuFeatures {
        avx2: true,
        avx512: true,
        avx512_bf16: false,
        amx_bf16: true,
    };

    #[test]
    fn bf16_is_native_only_with_a_bf16_dot_product() {
        assert!(!AVX2_ONLY.bf16_matmul_native());
        assert!(!AVX512_NO_BF16.bf16_matmul_native());
        assert!(AVX512_BF16.bf16_matmul_native());
        assert!(AMX.bf16_matmul_native());
    }

    #[test]
    fn sampler_kernels_follow_the_same_rule() {
        use LinearKernel::*;
        // f32: oneDNN wherever it packs.
        for cpu in [AVX2_ONLY, AVX512_NO_BF16, AVX512_BF16, AMX] {
            assert_eq!(
                sampling_linear_kernel(&cpu, false, true, true),
                OneDnnPacked
            );
            assert_eq!(sampling_linear_kernel(&cpu, false, false, true), Plain);
        }
        // bf16: oneDNN only where native; on AVX-512 without bf16 oneDNN would pack but emulate.
        assert_eq!(
            sampling_linear_kernel(&AVX512_BF16, true, true, true),
            OneDnnPacked
        );
        assert_eq!(sampling_linear_kernel(&AMX, true, true, true), OneDnnPacked);
        assert_eq!(
            sampling_linear_kernel(&AVX512_NO_BF16, true, true, true),
            FbgemmFp16
        );
        assert_eq!(
            sampling_linear_kernel(&AVX2_ONLY, true, false, true),
            FbgemmFp16
        );
        assert_eq!(
            sampling_linear_kernel(&AVX2_ONLY, true, false, false),
            Plain
        );
        assert_eq!(
            sampling_linear_kernel(&AVX512_BF16, true, false, true),
            FbgemmFp16
        );
    }

    #[test]
    fn onednn_isa_cap_turns_bf16_off_below_avx512_core_bf16() {
        assert_eq!(AMX.capped_by_onednn_isa(""), AMX);
        assert_eq!(AMX.capped_by_onednn_isa("DEFAULT"), AMX);
        assert_eq!(
            AVX512_BF16.capped_by_onednn_isa("avx512_core"),
            AVX512_NO_BF16
        );
        assert_eq!(
            AVX512_BF16.capped_by_onednn_isa("AVX512_CORE_BF16"),
            AVX512_BF16
        );
        assert!(!AMX.capped_by_onednn_isa("AVX512_CORE_BF16").amx_bf16);
        assert_eq!(AVX512_BF16.capped_by_onednn_isa("AVX2"), AVX2_ONLY);
        // A cap never adds what the CPU lacks.
        assert_eq!(AVX2_ONLY.capped_by_onednn_isa("AVX512_CORE_AMX"), AVX2_ONLY);
    }

    #[test]
    fn detection_agrees_with_the_kernels_flags() {
        // Linux lists a flag in /proc/cpuinfo only when the CPU has it and the kernel enables it:
        // an independent reading of the same facts.
        let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") else {
            eprintln!("no /proc/cpuinfo: nothing to compare with");
            return;
        };
        if !cfg!(target_arch = "x86_64") {
            return;
        }
        let flags: Vec<&str> = info
            .lines()
            .find(|l| l.starts_with("flags"))
            .map(|l| l.split_whitespace().collect())
            .unwrap_or_default();
        let has = |f: &str| flags.contains(&f);
        let cpu = detect();
        let avx512 = ["avx512f", "avx512bw", "avx512vl", "avx512dq"]
            .iter()
            .all(|f| has(f));
        assert_eq!(cpu.avx512, avx512, "{}", cpu.summary());
        assert_eq!(
            cpu.avx512_bf16,
            avx512 && has("avx512_bf16"),
            "{}",
            cpu.summary()
        );
        assert_eq!(cpu.amx_bf16, has("amx_bf16"), "{}", cpu.summary());
        assert_eq!(
            cpu.avx2,
            has("avx2") && has("fma") && has("f16c"),
            "{}",
            cpu.summary()
        );
    }
}
