//! How much memory the process has needed: the number verl logs as
//! `perf/max_memory_allocated_gb` (there the CUDA allocator's peak; on CPU the resident peak).

/// The process's peak resident set size in bytes, `None` where the kernel does not report it.
/// Linux updates `VmHWM` lazily (the resident size can run ahead of it between updates), so the
/// peak is the larger of `VmHWM` and `VmRSS`, read from one snapshot of `/proc/self/status`.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let hwm = field_bytes(&status, "VmHWM:")?;
    Some(hwm.max(field_bytes(&status, "VmRSS:").unwrap_or(0)))
}

extern "C" {
    fn temper_cuda_peak_allocated(
        device: std::ffi::c_int,
        reset: std::ffi::c_int,
        peak: *mut i64,
        err: *mut *mut std::ffi::c_char,
    ) -> std::ffi::c_int;
}

extern "C" {
    fn temper_cuda_memory_info(
        device: std::ffi::c_int,
        free_bytes: *mut i64,
        total_bytes: *mut i64,
        err: *mut *mut std::ffi::c_char,
    ) -> std::ffi::c_int;
}

/// `(free, total)` bytes of CUDA device `device` (`torch.cuda.mem_get_info`); `None` on a build
/// or machine without CUDA.
pub fn cuda_memory_bytes(device: usize) -> Option<(u64, u64)> {
    if !crate::cuda_build() || !tch::Cuda::is_available() {
        return None;
    }
    let (mut free, mut total, mut err) = (0i64, 0i64, std::ptr::null_mut());
    // SAFETY: free, total and err are written by the callee; err is freed once.
    let status = unsafe {
        temper_cuda_memory_info(device as std::ffi::c_int, &mut free, &mut total, &mut err)
    };
    if status != 0 {
        unsafe { crate::temper_kernels_free_error(err) };
        return None;
    }
    Some((u64::try_from(free).ok()?, u64::try_from(total).ok()?))
}

/// The CUDA caching allocator's peak of allocated bytes on `device` since the last
/// [`reset_cuda_peak`] (torch.cuda.max_memory_allocated's number); `None` on a build or machine
/// without CUDA.
pub fn cuda_peak_allocated_bytes(device: usize) -> Option<u64> {
    cuda_peak(device, false)
}

/// Restarts the peak [`cuda_peak_allocated_bytes`] reports from the memory in use now.
pub fn reset_cuda_peak(device: usize) {
    cuda_peak(device, true);
}

fn cuda_peak(device: usize, reset: bool) -> Option<u64> {
    if !crate::cuda_build() || !tch::Cuda::is_available() {
        return None;
    }
    let (mut peak, mut err) = (0i64, std::ptr::null_mut());
    // SAFETY: peak and err are written by the callee; err is freed once.
    let status = unsafe {
        temper_cuda_peak_allocated(
            device as std::ffi::c_int,
            std::ffi::c_int::from(reset),
            &mut peak,
            &mut err,
        )
    };
    if status != 0 {
        unsafe { crate::temper_kernels_free_error(err) };
        return None;
    }
    u64::try_from(peak).ok()
}

/// The peak memory a step needed, as verl logs it: the CUDA allocator's peak on `cuda` (when
/// given and reported), else the process's resident peak.
pub fn step_peak_bytes(cuda: Option<usize>) -> Option<u64> {
    cuda.and_then(cuda_peak_allocated_bytes)
        .or_else(peak_rss_bytes)
}

/// Hands the heap's free memory back to the kernel (glibc's `malloc_trim`). Freed tensors stay
/// in malloc's arenas otherwise, so a server that dropped a model's weights, gradients and
/// optimizer state keeps their resident size; call after freeing something large.
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        extern "C" {
            fn malloc_trim(pad: usize) -> std::ffi::c_int;
        }
        // SAFETY: malloc_trim only walks and trims malloc's own arenas.
        unsafe { malloc_trim(0) };
    }
}

/// Maps every block of `bytes` or more fresh from the kernel and unmaps it on free, for the whole
/// process, at a fixed threshold (glibc's `M_MMAP_THRESHOLD`; setting it turns off glibc's
/// dynamic threshold). By default glibc raises the threshold to the size of each mapped block
/// freed, up to 32 MiB, so after the first large tensors are freed, later ones come from the
/// arenas, whose holes a long pass's activations then leave resident: a Tinker client's first
/// LoRA `forward_backward` of one 4,096-token datum on SmolLM2 (f32) peaked at 5.5 GB resident,
/// 2.3 GB at a fixed 4 MiB (BENCHMARKS.md). Returns whether glibc took it (false elsewhere).
pub fn map_large_blocks(bytes: usize) -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        extern "C" {
            fn mallopt(param: std::ffi::c_int, value: std::ffi::c_int) -> std::ffi::c_int;
        }
        const M_MMAP_THRESHOLD: std::ffi::c_int = -3;
        let value = bytes.min(i32::MAX as usize) as std::ffi::c_int;
        // SAFETY: mallopt only changes malloc's own threshold; the value is in its range.
        unsafe { mallopt(M_MMAP_THRESHOLD, value) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        let _ = bytes;
        false
    }
}

/// One malloc arena for the whole process (glibc's `M_ARENA_MAX` = 1), set before other threads
/// start allocating: c10d's Gloo runs each collective's copies on worker threads of its own, and
/// glibc gives every such thread an arena that keeps what it freed, so a data-parallel rank whose
/// layers are gathered and reduced many times a step held 0.45 GiB more resident memory (the main
/// job sharded over 2 ranks: 3.03 GiB per rank, 2.59 with one arena; BENCHMARKS.md). Returns
/// whether glibc took it (false elsewhere).
pub fn use_one_malloc_arena() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        extern "C" {
            fn mallopt(param: std::ffi::c_int, value: std::ffi::c_int) -> std::ffi::c_int;
        }
        const M_ARENA_MAX: std::ffi::c_int = -8;
        // SAFETY: mallopt only changes malloc's own arena limit; 1 is in its range.
        unsafe { mallopt(M_ARENA_MAX, 1) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// [`map_large_blocks`] at `bytes` while it lives, then at glibc's largest dynamic threshold
/// (32 MiB, where a long-running process's dynamic threshold ends up anyway): around a pass that
/// allocates and frees many large activations (a Tinker `forward_backward`), without making every
/// other large allocation of the process (a sampler's logits per step) map fresh pages.
pub struct LargeBlocksMapped(());

impl LargeBlocksMapped {
    pub fn at(bytes: usize) -> Self {
        map_large_blocks(bytes);
        LargeBlocksMapped(())
    }
}

impl Drop for LargeBlocksMapped {
    fn drop(&mut self) {
        map_large_blocks(32 << 20);
    }
}

/// Keeps the memory that freed tensors leave in malloc's heap for the next allocations, instead
/// of glibc's default, which maps every block of 32 MiB or more fresh from the kernel and unmaps
/// it on free, and returns the heap's free top once it passes 128 KiB. A training step allocates
/// and frees the same logits chunks, gradients and activations every step; with the default each
/// of them costs a page fault per 4 KiB on every step (`bench grpo` on SmolLM2: 2.3 M faults and
/// ~1.5 s of kernel time per 4 steps; 0.9 M with this, the first touch of the peak's pages).
/// Sets `M_MMAP_THRESHOLD` to 1 GiB and `M_TRIM_THRESHOLD` to 2 GiB for the whole process: its
/// resident size then stays near its peak between steps. Not for large models, whose backward
/// leaves holes that the next allocations do not fit (there the backward trims the heap instead,
/// [`release_free_memory_if_grown`]). Returns whether glibc took both settings (false elsewhere).
pub fn keep_freed_memory_for_reuse() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        extern "C" {
            fn mallopt(param: std::ffi::c_int, value: std::ffi::c_int) -> std::ffi::c_int;
        }
        const M_TRIM_THRESHOLD: std::ffi::c_int = -1;
        const M_MMAP_THRESHOLD: std::ffi::c_int = -3;
        // SAFETY: mallopt only changes malloc's own thresholds; both values are in its range.
        unsafe {
            mallopt(M_MMAP_THRESHOLD, 1 << 30) == 1 && mallopt(M_TRIM_THRESHOLD, i32::MAX) == 1
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    false
}

extern "C" {
    fn temper_trim_heap_if_grown(err: *mut *mut std::ffi::c_char) -> std::ffi::c_int;
    fn temper_trim_heap_on_grad(
        t: *mut std::ffi::c_void,
        err: *mut *mut std::ffi::c_char,
    ) -> std::ffi::c_int;
}

/// [`release_free_memory`] once the resident memory beyond malloc's live bytes has grown by 256
/// MiB since the last such trim and the process is within 256 MiB of its resident peak (only
/// then can trimming lower the peak): for the middle of a backward, which frees saved
/// activations while it allocates gradients that do not fit their holes (see
/// `csrc/kernels.cpp`). Cheap when it does not trim (a read of `/proc/self/status` and malloc's
/// counters).
pub fn release_free_memory_if_grown() {
    let mut err = std::ptr::null_mut();
    // SAFETY: err is written by the callee on failure.
    if unsafe { temper_trim_heap_if_grown(&mut err) } != 0 {
        let _ = crate::take_error(err);
    }
}

/// [`release_free_memory_if_grown`] each time a backward computes the gradient of `t` (a hook on
/// `t`; the gradient passes unchanged): on a decoder layer's output, as the backward leaves each
/// layer. Nothing for a tensor that takes no gradient.
pub fn release_free_memory_on_grad(t: &tch::Tensor) {
    if !t.requires_grad() {
        return;
    }
    let mut err = std::ptr::null_mut();
    // SAFETY: `t` is a live tensor for the call; err is written by the callee on failure.
    if unsafe { temper_trim_heap_on_grad(t.as_ptr() as _, &mut err) } != 0 {
        // Registering a hook fails only on a tensor that takes no gradient, checked above.
        let _ = crate::take_error(err);
    }
}

/// The memory the machine can still give without swapping, in bytes (Linux `MemAvailable`: free
/// memory plus reclaimable caches), `None` where the kernel does not report it.
pub fn available_bytes() -> Option<u64> {
    field_bytes(
        &std::fs::read_to_string("/proc/meminfo").ok()?,
        "MemAvailable:",
    )
}

/// The process's current resident set size in bytes (Linux `VmRSS`).
pub fn rss_bytes() -> Option<u64> {
    status_bytes("VmRSS:")
}

/// A `kB` field of `/proc/self/status`, in bytes.
fn status_bytes(field: &str) -> Option<u64> {
    field_bytes(&std::fs::read_to_string("/proc/self/status").ok()?, field)
}

fn field_bytes(status: &str, field: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The bounds temper gives libtorch's oneDNN caches, each unless the variable is set already:
/// PyTorch's ideep keeps its own cache of up to 1,024 operations keyed by shape
/// (`LRU_CACHE_CAPACITY`) on top of oneDNN's cache of up to 1,024 compiled kernels
/// (`ONEDNN_PRIMITIVE_CACHE_CAPACITY`). Every new row count (each micro-batch's tokens, each
/// prompt's length, each decode batch) adds entries of ~1 MB, so a bf16 run's resident size grew
/// by ~50 MB per step for hundreds of steps (`summary-smoke`: 2.43 GiB after one step, 3.04 after
/// ten). ideep's cache only saves describing the operation again; oneDNN's saves compiling it.
/// With 1 and 128 the same run levels off at 2.52 GiB from its third step, at the same speed.
const ONEDNN_CACHE_BOUNDS: [(&str, &str); 2] = [
    ("LRU_CACHE_CAPACITY", "1"),
    ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "128"),
];

static BOUNDED_BY_TEMPER: std::sync::OnceLock<Vec<&'static str>> = std::sync::OnceLock::new();

/// Sets [`ONEDNN_CACHE_BOUNDS`] in this process's environment where the user has not, before
/// libtorch reads them (at its first oneDNN call): call first thing in `main`, while no other
/// thread runs.
pub fn bound_onednn_caches() {
    BOUNDED_BY_TEMPER.get_or_init(|| {
        let mut set = Vec::new();
        for (name, value) in ONEDNN_CACHE_BOUNDS {
            if std::env::var_os(name).is_none() {
                std::env::set_var(name, value);
                set.push(name);
            }
        }
        set
    });
}

/// Removes from `cmd`'s environment the cache bounds temper set (not the user's own), so that a
/// peer a benchmark starts (TRL, vLLM) runs with its defaults.
pub fn without_temper_onednn_bounds(cmd: &mut std::process::Command) -> &mut std::process::Command {
    for name in BOUNDED_BY_TEMPER.get().into_iter().flatten() {
        cmd.env_remove(name);
    }
    cmd
}

#[cfg(test)]
mod tests {
    /// A 64 MiB buffer, touched then freed, stays in the peak. Linux keeps its resident counters
    /// per CPU and folds them in batches, so the two readings may differ by a few hundred KiB
    /// (128 KiB seen); 2 MiB of slack is far below the buffer.
    #[test]
    fn the_peak_keeps_a_freed_buffer() {
        let mut buf = vec![0u8; 64 << 20];
        for page in buf.chunks_mut(4096) {
            page[0] = 1;
        }
        let with_buffer = super::rss_bytes();
        drop(std::hint::black_box(buf));
        if let (Some(peak), Some(with_buffer)) = (super::peak_rss_bytes(), with_buffer) {
            assert!(with_buffer > 64 << 20, "resident {with_buffer}");
            assert!(
                peak + (2 << 20) >= with_buffer,
                "peak {peak}, resident with the buffer {with_buffer}"
            );
            assert!(
                super::rss_bytes().unwrap() < peak,
                "the buffer was not freed"
            );
        }
    }
}
