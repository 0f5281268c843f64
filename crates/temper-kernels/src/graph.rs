//! CUDA graphs (libtorch's `at::cuda::CUDAGraph`, `csrc/graph.cpp`): capture the kernels a
//! closure launches once, then replay them with one launch. The sampling engine's decode step is
//! a few hundred small kernels per token; replayed as a graph, the GPU runs them back to back
//! instead of waiting on the host to launch each one.
//!
//! A captured graph reads and writes the same memory on every replay: its inputs must be tensors
//! that live as long as it does and are updated in place, and the tensors the closure returns
//! are rewritten by each replay. Nothing in the closure may synchronise with the host (reading a
//! value, a data-dependent shape, a host-to-device copy of pageable memory).

use std::ffi::{c_char, c_int, c_void};

use anyhow::{bail, Result};

extern "C" {
    fn temper_graphs_available() -> c_int;
    fn temper_graph_pool(first: *mut u64, second: *mut u64, err: *mut *mut c_char) -> c_int;
    fn temper_graph_begin(
        device: c_int,
        first: u64,
        second: u64,
        out: *mut *mut c_void,
        err: *mut *mut c_char,
    ) -> c_int;
    fn temper_graph_end(graph: *mut c_void, err: *mut *mut c_char) -> c_int;
    fn temper_graph_replay(graph: *mut c_void, err: *mut *mut c_char) -> c_int;
    fn temper_graph_free(graph: *mut c_void);
    fn temper_use_own_stream(device: c_int, err: *mut *mut c_char) -> c_int;
    fn temper_sync_current_stream(device: c_int, err: *mut *mut c_char) -> c_int;
}

/// Whether this build can capture CUDA graphs (a CUDA build; a CPU build has a stub).
pub fn graphs_available() -> bool {
    // SAFETY: no arguments, no state.
    unsafe { temper_graphs_available() == 1 }
}

/// A memory pool that several graphs allocate from: they must be replayed one at a time, each
/// one's outputs read before another replays (what one decoder's buckets do).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GraphPool(u64, u64);

impl GraphPool {
    pub fn new() -> Result<Self> {
        let (mut a, mut b) = (0u64, 0u64);
        let mut err = std::ptr::null_mut();
        // SAFETY: out pointers are valid; errors come back as a message.
        if unsafe { temper_graph_pool(&mut a, &mut b, &mut err) } != 0 {
            bail!(
                "a CUDA graph memory pool: {}",
                first_line(crate::take_error(err))
            );
        }
        Ok(GraphPool(a, b))
    }
}

/// A captured CUDA graph.
#[derive(Debug)]
pub struct CudaGraph {
    ptr: *mut c_void,
}

// SAFETY: a CUDAGraph may be replayed and freed from any thread (one at a time: it is not Sync).
unsafe impl Send for CudaGraph {}

impl CudaGraph {
    /// Captures what `f` launches on CUDA device `device`, allocating from `pool`; returns the
    /// graph and what `f` returned (tensors each replay rewrites). `f` runs once, on a side
    /// stream, and computes nothing while captured: run it eagerly once before (libraries
    /// initialise on first use, which a capture cannot hold). If `f` panics (libtorch refused an
    /// op during capture) or the capture fails, the error says why and no graph exists.
    pub fn capture<T>(device: usize, pool: GraphPool, f: impl FnOnce() -> T) -> Result<(Self, T)> {
        let mut ptr = std::ptr::null_mut();
        let mut err = std::ptr::null_mut();
        // SAFETY: out pointers are valid; errors come back as a message.
        if unsafe { temper_graph_begin(device as c_int, pool.0, pool.1, &mut ptr, &mut err) } != 0 {
            bail!(
                "CUDA graph capture could not begin: {}",
                first_line(crate::take_error(err))
            );
        }
        let graph = CudaGraph { ptr };
        let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        let mut err = std::ptr::null_mut();
        // SAFETY: `ptr` is a graph in capture; end is called exactly once.
        let ended = unsafe { temper_graph_end(graph.ptr, &mut err) };
        match out {
            Err(panic) => {
                if ended != 0 {
                    let _ = crate::take_error(err);
                }
                let what = panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
                    .unwrap_or("a panic");
                bail!(
                    "CUDA graph capture failed: {}",
                    first_line(what.to_string())
                )
            }
            Ok(_) if ended != 0 => {
                bail!(
                    "CUDA graph capture failed: {}",
                    first_line(crate::take_error(err))
                )
            }
            Ok(out) => Ok((graph, out)),
        }
    }

    /// Launches the captured kernels on the current stream.
    pub fn replay(&self) -> Result<()> {
        // SAFETY: `ptr` is a captured graph.
        shim_call("CUDA graph replay", |err| unsafe {
            temper_graph_replay(self.ptr, err)
        })
    }
}

/// From now on the calling thread's work on CUDA device `device` goes to a stream of its own
/// (from libtorch's pool, not synchronised with the default stream): a thread that samples
/// beside another that trains. Tensors it shares with other threads must be complete before it
/// reads them (the writer synchronises), and what it frees must be done with
/// ([`sync_current_stream`]), as the caching allocator hands memory back per stream.
pub fn use_own_stream(device: usize) -> Result<()> {
    // SAFETY: errors come back as a message.
    shim_call("a CUDA stream of its own", |err| unsafe {
        temper_use_own_stream(device as c_int, err)
    })
}

/// Waits until the work queued on the calling thread's current stream on CUDA device `device`
/// is done.
pub fn sync_current_stream(device: usize) -> Result<()> {
    // SAFETY: errors come back as a message.
    shim_call("synchronising the CUDA stream", |err| unsafe {
        temper_sync_current_stream(device as c_int, err)
    })
}

/// Runs a shim call that returns a status and, on failure, a message in `err`: the message's
/// first line, after `what`, as the error.
fn shim_call(what: &str, call: impl FnOnce(*mut *mut c_char) -> c_int) -> Result<()> {
    let mut err = std::ptr::null_mut();
    if call(&mut err) != 0 {
        bail!("{what}: {}", first_line(crate::take_error(err)));
    }
    Ok(())
}

/// libtorch's messages carry a stack trace after their first line; the notice is one line.
fn first_line(message: String) -> String {
    message
        .lines()
        .next()
        .unwrap_or_default()
        .trim_end()
        .to_string()
}

impl Drop for CudaGraph {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from temper_graph_begin and is freed once.
        unsafe { temper_graph_free(self.ptr) }
    }
}
