//! `bf16_is_native` (which decides `model.dtype = "auto"`) agrees with the CPU's own feature flags:
//! libtorch sends bf16 matmuls to oneDNN only with AVX-512 BW/VL/DQ or AVX-NE-CONVERT.
use tch::Device;
use temper_model::bf16_is_native;

#[test]
fn bf16_is_native_follows_the_cpu_flags() {
    let flags = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let has = |f: &str| flags.split_whitespace().any(|w| w == f);
    if flags.is_empty() || !cfg!(target_arch = "x86_64") {
        eprintln!("no /proc/cpuinfo or not x86-64: nothing to compare with");
        return;
    }
    let avx512 = has("avx512bw") && has("avx512vl") && has("avx512dq");
    let expected = avx512 || has("avx_ne_convert");
    assert_eq!(
        bf16_is_native(Device::Cpu),
        expected,
        "avx512bw/vl/dq: {avx512}, avx_ne_convert: {}",
        has("avx_ne_convert")
    );
}
