//! How much memory the process has needed: the number verl logs as
//! `perf/max_memory_allocated_gb` (there the CUDA allocator's peak; on CPU the resident peak).

/// The process's peak resident set size in bytes (Linux `VmHWM`), `None` where the kernel does
/// not report it.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The process's current resident set size in bytes (Linux `VmRSS`).
pub fn rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Physical memory of the machine in bytes (`MemTotal`), or the cgroup's limit when lower.
pub fn total_memory_bytes() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let total = line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024;
    let cgroup = std::fs::read_to_string("/sys/fs/cgroup/memory.max")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    Some(cgroup.map_or(total, |c| c.min(total)))
}

#[cfg(test)]
mod tests {
    #[test]
    fn peak_is_at_least_the_current_resident_size() {
        let (peak, now) = (super::peak_rss_bytes(), super::rss_bytes());
        if let (Some(peak), Some(now)) = (peak, now) {
            assert!(peak >= now && now > 0, "peak {peak}, now {now}");
        }
        assert!(super::total_memory_bytes().is_some_and(|t| t > 0));
    }
}
