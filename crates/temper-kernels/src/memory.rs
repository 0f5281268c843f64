//! How much memory the process has needed: the number verl logs as
//! `perf/max_memory_allocated_gb` (there the CUDA allocator's peak; on CPU the resident peak).

/// The process's peak resident set size in bytes (Linux `VmHWM`), `None` where the kernel does
/// not report it.
pub fn peak_rss_bytes() -> Option<u64> {
    status_bytes("VmHWM:")
}

/// The process's current resident set size in bytes (Linux `VmRSS`).
pub fn rss_bytes() -> Option<u64> {
    status_bytes("VmRSS:")
}

/// A `kB` field of `/proc/self/status`, in bytes.
fn status_bytes(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    #[test]
    fn peak_is_at_least_the_current_resident_size() {
        let (peak, now) = (super::peak_rss_bytes(), super::rss_bytes());
        if let (Some(peak), Some(now)) = (peak, now) {
            assert!(peak >= now && now > 0, "peak {peak}, now {now}");
        }
    }
}
