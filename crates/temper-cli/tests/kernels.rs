//! `temper bench train` prints the kernels it ran, and the choice follows the CPU: with oneDNN
//! capped below bf16 (`ONEDNN_MAX_CPU_ISA=AVX512_CORE`, what an AVX-512 CPU without AVX512_BF16
//! offers) bf16 training is reported as emulated and bf16 sampling goes to FBGEMM's fp16 GEMM,
//! whatever CPU runs the test.
use std::process::Command;

fn bench_train_kernels(isa: Option<&str>) -> Vec<String> {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_temper"));
    cmd.args([
        "bench",
        "train",
        "--no-python",
        "--steps",
        "1",
        "--rounds",
        "1",
        "--warmup",
        "0",
        "--batch",
        "1",
        "--seq",
        "8",
        "--vocab",
        "64",
        "--hidden",
        "32",
        "--layers",
        "1",
        "--heads",
        "2",
        "--kv-heads",
        "1",
        "--intermediate",
        "64",
        "--threads",
        "1",
    ]);
    match isa {
        Some(v) => cmd.env("ONEDNN_MAX_CPU_ISA", v),
        None => cmd.env_remove("ONEDNN_MAX_CPU_ISA"),
    };
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .filter(|l| l.starts_with("kernels"))
        .map(String::from)
        .collect()
}

fn cpu_flags() -> Vec<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    info.lines()
        .find(|l| l.starts_with("flags"))
        .map(|l| l.split_whitespace().map(String::from).collect())
        .unwrap_or_default()
}

#[test]
fn bf16_is_emulated_under_an_avx512_core_cap() {
    let lines = bench_train_kernels(Some("AVX512_CORE"));
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(lines[0].contains("temper f32") && lines[0].contains("training matmuls: f32"));
    let bf16 = &lines[1];
    assert!(bf16.contains("training matmuls: bf16 (EMULATED"), "{bf16}");
    assert!(bf16.contains("-avx512_bf16"), "{bf16}");
    if cfg!(target_arch = "x86_64") && cpu_flags().iter().any(|f| f == "avx2") {
        assert!(bf16.contains("sampling linears: FBGEMM fp16"), "{bf16}");
    }
}

#[test]
fn without_a_cap_the_report_follows_the_cpu_flags() {
    let flags = cpu_flags();
    if flags.is_empty() || !cfg!(target_arch = "x86_64") {
        eprintln!("no /proc/cpuinfo flags: nothing to compare with");
        return;
    }
    let native = flags.iter().any(|f| f == "avx512_bf16" || f == "amx_bf16");
    let lines = bench_train_kernels(None);
    let bf16 = &lines[1];
    assert_eq!(
        bf16.contains("training matmuls: bf16 (native"),
        native,
        "{bf16}"
    );
    assert_eq!(
        bf16.contains("sampling linears: oneDNN prepacked"),
        native,
        "{bf16}"
    );
}
