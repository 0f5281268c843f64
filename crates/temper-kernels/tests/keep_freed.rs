//! `keep_freed_memory_for_reuse`: a large tensor freed and allocated again comes back from
//! malloc's heap, touched already, instead of a fresh map that faults in every page (glibc only;
//! its own test binary without a harness: the setting is the whole process's, and only the main
//! thread allocates from malloc's main heap).

#![cfg_attr(
    not(all(target_os = "linux", target_env = "gnu")),
    allow(dead_code, unused_imports)
)]

use tch::{Device, Kind, Tensor};
use temper_kernels::memory::keep_freed_memory_for_reuse;

/// Minor page faults of this process so far (`/proc/self/stat`, field 10).
fn minor_faults() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    // The command name (field 2) is in parentheses and may hold spaces: count after it.
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    after.split_whitespace().nth(7).unwrap().parse().unwrap()
}

/// Faults taken while a 64 MiB tensor is allocated, filled and freed.
fn faults_of_a_64_mib_tensor() -> u64 {
    let before = minor_faults();
    let t = Tensor::ones([16 << 20], (Kind::Float, Device::Cpu));
    assert_eq!(t.double_value(&[(16 << 20) - 1]), 1.0);
    drop(t);
    minor_faults() - before
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn main() {
    // glibc's default: 64 MiB is over its largest mmap threshold (32 MiB), so each such tensor is
    // a fresh map, one fault per 4 KiB page (16,384 here).
    let fresh = faults_of_a_64_mib_tensor();
    assert!(fresh > 8_000, "{fresh} faults for a fresh 64 MiB tensor");
    assert!(keep_freed_memory_for_reuse());
    let first = faults_of_a_64_mib_tensor(); // now from the heap: its pages are new once
    let again = faults_of_a_64_mib_tensor();
    assert!(first > 8_000, "{first} faults the first time from the heap");
    assert!(
        again < 1_000,
        "{again} faults for the same 64 MiB again: not reused"
    );
    println!("keep_freed: {fresh} faults fresh, {first} from the heap, {again} reused: ok");
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn main() {}
