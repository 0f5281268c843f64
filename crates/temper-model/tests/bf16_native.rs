//! `bf16_is_native` (which decides `model.dtype = "auto"` and the sampler's bf16 kernels) agrees
//! with the CPU's flags as Linux lists them: native only with a bf16 dot product (AVX512_BF16 or
//! AMX-BF16). AVX-512 alone emulates bf16 (a training step's matmuls 3-4x slower than f32).
use tch::Device;
use temper_model::bf16_is_native;

#[test]
fn bf16_is_native_follows_the_cpu_flags() {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    if info.is_empty() || !cfg!(target_arch = "x86_64") {
        eprintln!("no /proc/cpuinfo or not x86-64: nothing to compare with");
        return;
    }
    let flags: Vec<&str> = info
        .lines()
        .find(|l| l.starts_with("flags"))
        .map(|l| l.split_whitespace().collect())
        .unwrap_or_default();
    let has = |f: &str| flags.contains(&f);
    let expected = has("avx512_bf16") || has("amx_bf16");
    assert_eq!(
        bf16_is_native(Device::Cpu),
        expected,
        "avx512_bf16: {}, amx_bf16: {}",
        has("avx512_bf16"),
        has("amx_bf16")
    );
}
