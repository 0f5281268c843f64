//! `release_free_memory_if_grown`: once freed tensors leave much resident memory in malloc's heap,
//! it hands it back to the kernel, and not before (glibc only).
#![cfg(all(target_os = "linux", target_env = "gnu"))]

use tch::{Device, Kind, Tensor};
use temper_kernels::memory::release_free_memory_if_grown;

fn resident_mib() -> f64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: f64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096.0 / (1 << 20) as f64
}

extern "C" {
    fn mallopt(param: i32, value: i32) -> i32;
}
const M_MMAP_THRESHOLD: i32 = -3;

#[test]
fn trims_resident_holes_once_they_add_up() {
    // 1 MiB tensors from the heap (as after glibc has raised its threshold), not their own maps.
    assert_eq!(unsafe { mallopt(M_MMAP_THRESHOLD, 32 << 20) }, 1);
    release_free_memory_if_grown(); // the least slack seen: before any hole
    let mut blocks: Vec<Option<Tensor>> = (0..800)
        .map(|_| Some(Tensor::ones([256 * 1024], (Kind::Float, Device::Cpu))))
        .collect();
    // Every other block of the first 200 freed: 100 MiB of holes the heap cannot give back from
    // its top, under the 256 MiB step: left resident.
    for b in blocks.iter_mut().take(200).step_by(2) {
        *b = None;
    }
    let before = resident_mib();
    release_free_memory_if_grown();
    let after = resident_mib();
    assert!(
        before - after < 50.0,
        "resident {before:.0} -> {after:.0} MiB: trimmed below the step"
    );
    // 400 MiB of holes: trimmed.
    for b in blocks.iter_mut().step_by(2) {
        *b = None;
    }
    let before = resident_mib();
    release_free_memory_if_grown();
    let after = resident_mib();
    assert!(
        before - after > 300.0,
        "resident {before:.0} MiB -> {after:.0} MiB: the holes were not trimmed"
    );
    // The live blocks are intact.
    for b in blocks.iter().flatten() {
        assert_eq!(b.sum(Kind::Float).double_value(&[]), 256.0 * 1024.0);
    }
}
