//! torch.distributed's c10d, from Rust: a TCPStore rendezvous and a Gloo process group (CPU), with
//! the collectives data-parallel and sharded training need (`csrc/comm.cpp`). The code that runs is
//! libtorch's own; only the glue is temper's. Built when the gloo headers were present at build
//! time (`scripts/setup-env.sh` installs them); [`comm_available`] tells.

use std::ffi::{c_char, c_int, c_long, c_void, CString};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{bail, Result};
use tch::Tensor;

extern "C" {
    fn temper_comm_available() -> c_int;
    fn temper_comm_nccl_available() -> c_int;
    fn temper_comm_new(
        host: *const c_char,
        port: c_int,
        rank: c_int,
        world: c_int,
        store_is_external: c_int,
        timeout_ms: c_long,
        backend: c_int,
        device: c_int,
        out: *mut *mut c_void,
        err: *mut *mut c_char,
    ) -> c_int;
    fn temper_comm_free(comm: *mut c_void);
    fn temper_comm_all_reduce(comm: *mut c_void, t: *mut c_void, err: *mut *mut c_char) -> c_int;
    fn temper_comm_broadcast(
        comm: *mut c_void,
        t: *mut c_void,
        root: c_int,
        err: *mut *mut c_char,
    ) -> c_int;
    fn temper_comm_broadcast_unless(
        comm: *mut c_void,
        t: *mut c_void,
        root: c_int,
        give_up: *const bool,
        err: *mut *mut c_char,
    ) -> c_int;
    fn temper_comm_all_gather(
        comm: *mut c_void,
        t: *mut c_void,
        out: *mut *mut c_void,
        err: *mut *mut c_char,
    ) -> c_int;
    fn temper_comm_all_gather_into(
        comm: *mut c_void,
        shard: *mut c_void,
        out: *mut c_void,
        err: *mut *mut c_char,
    ) -> c_int;
    fn temper_comm_reduce_scatter(
        comm: *mut c_void,
        input: *mut c_void,
        out: *mut c_void,
        err: *mut *mut c_char,
    ) -> c_int;
    fn temper_comm_barrier(comm: *mut c_void, err: *mut *mut c_char) -> c_int;
}

/// Whether this build has c10d's Gloo process group (the gloo headers were found at build time).
/// How long a rank waits for the others (the rendezvous, then each collective) before it fails
/// with an error: `value` is `TEMPER_DIST_TIMEOUT` (seconds), 300 when unset (a step's generation
/// can be long). A value that is not a whole number of seconds of at least 1 is an error.
pub fn collective_timeout(value: Option<&str>) -> Result<Duration> {
    let Some(v) = value else {
        return Ok(Duration::from_secs(300));
    };
    match v.trim().parse::<u64>() {
        Ok(s) if s >= 1 => Ok(Duration::from_secs(s)),
        _ => bail!("TEMPER_DIST_TIMEOUT = {v:?}: expected a whole number of seconds, at least 1"),
    }
}

/// [`collective_timeout`] of this process's `TEMPER_DIST_TIMEOUT`.
pub fn collective_timeout_from_env() -> Result<Duration> {
    collective_timeout(std::env::var("TEMPER_DIST_TIMEOUT").ok().as_deref())
}

pub fn comm_available() -> bool {
    // SAFETY: a constant query.
    unsafe { temper_comm_available() != 0 }
}

/// Whether this build has c10d's NCCL process group (libtorch_cuda, nccl.h and CUDA's headers at
/// build time).
pub fn nccl_available() -> bool {
    // SAFETY: a constant query.
    unsafe { temper_comm_nccl_available() != 0 }
}

/// The process group's transport: Gloo (CPU tensors, any machine) or NCCL (CUDA tensors).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Gloo,
    /// NCCL on the given CUDA device (the rank's `LOCAL_RANK` by default); CPU tensors are
    /// staged through it.
    Nccl {
        device: usize,
    },
}

/// Where and how to rendezvous: torchrun's `MASTER_ADDR`/`MASTER_PORT`, `RANK`, `WORLD_SIZE`.
#[derive(Debug, Clone)]
pub struct Rendezvous {
    pub host: String,
    pub port: u16,
    pub rank: usize,
    pub world: usize,
    /// The store is hosted by someone else (torchrun's agent, `TORCHELASTIC_USE_AGENT_STORE`),
    /// so rank 0 connects as a client too.
    pub store_is_external: bool,
    /// Bounds the rendezvous and every collective: a rank that died makes the others fail with
    /// an error after this long instead of hanging.
    pub timeout: Duration,
    pub backend: Backend,
}

/// One rank's membership in a Gloo process group.
pub struct Comm {
    ptr: *mut c_void,
    rank: usize,
    world: usize,
    /// A collective was given up before it completed ([`Comm::broadcast_unless`]): the group is
    /// left as it is when dropped (freeing it would wait for that collective).
    abandoned: AtomicBool,
}

// SAFETY: the process group is used from one thread at a time (`&mut self`/`&self` on one owner);
// c10d's Gloo group is itself thread-safe for sequential collectives.
unsafe impl Send for Comm {}

impl Comm {
    /// Rendezvous and join the group; fails (does not hang) when the others do not come within
    /// the timeout.
    pub fn connect(r: &Rendezvous) -> Result<Comm> {
        if !comm_available() {
            bail!(
                "rank {}: this temper was built without c10d's Gloo (no gloo headers at build time; \
                 run scripts/setup-env.sh)",
                r.rank
            );
        }
        if let Backend::Nccl { device } = r.backend {
            if !nccl_available() {
                bail!(
                    "rank {}: NCCL was requested but this temper was built without it (a CPU-only libtorch, or no \
                     nccl.h / CUDA headers at build time: TEMPER_CUDA=1 scripts/setup-env.sh installs them); use \
                     TEMPER_DIST_BACKEND=gloo",
                    r.rank
                );
            }
            let n = tch::Cuda::device_count() as usize;
            if device >= n {
                bail!(
                    "rank {}: NCCL on CUDA device {device}, but {n} device(s) are visible",
                    r.rank
                );
            }
        }
        if r.world == 0 || r.rank >= r.world {
            bail!("rank {} is not below world size {}", r.rank, r.world);
        }
        let host = CString::new(r.host.as_str())?;
        let (mut out, mut err) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: host outlives the call; out/err are written by the callee.
        let status = unsafe {
            temper_comm_new(
                host.as_ptr(),
                r.port as c_int,
                r.rank as c_int,
                r.world as c_int,
                r.store_is_external as c_int,
                r.timeout.as_millis() as c_long,
                match r.backend {
                    Backend::Gloo => 0,
                    Backend::Nccl { .. } => 1,
                },
                match r.backend {
                    Backend::Gloo => -1,
                    Backend::Nccl { device } => device as c_int,
                },
                &mut out,
                &mut err,
            )
        };
        if status != 0 {
            bail!(
                "rank {}: cannot join the process group at {}:{} (world size {}): {}",
                r.rank,
                r.host,
                r.port,
                r.world,
                first_line(&crate::take_error(err))
            );
        }
        Ok(Comm {
            ptr: out,
            rank: r.rank,
            world: r.world,
            abandoned: AtomicBool::new(false),
        })
    }

    /// [`Comm::connect`], unless `give_up` turns true first (set by another thread that learnt
    /// that a peer will not join, such as a server that refused the group): then an error at
    /// once, the rendezvous left to time out on a thread of its own.
    pub fn connect_unless(r: &Rendezvous, give_up: &AtomicBool) -> Result<Comm> {
        let (joined, join) = std::sync::mpsc::channel();
        let rendezvous = r.clone();
        std::thread::Builder::new()
            .name("c10d-rendezvous".into())
            .spawn(move || {
                let _ = joined.send(Comm::connect(&rendezvous));
            })?;
        loop {
            match join.recv_timeout(Duration::from_millis(20)) {
                Ok(comm) => return comm,
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    bail!("rank {}: the rendezvous thread stopped", r.rank)
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            }
            if give_up.load(Ordering::SeqCst) {
                bail!(
                    "rank {}: gave up the rendezvous at {}:{}: a peer will not join",
                    r.rank,
                    r.host,
                    r.port
                );
            }
        }
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn world(&self) -> usize {
        self.world
    }

    /// Fails once a collective was given up ([`Comm::broadcast_unless`]): the group's peers are
    /// no longer in step.
    fn usable(&self, what: &str) -> Result<()> {
        if self.abandoned.load(Ordering::SeqCst) {
            bail!(
                "rank {}: {what}: this group gave up a collective midway and cannot be used",
                self.rank
            );
        }
        Ok(())
    }

    fn check(&self, status: c_int, err: *mut c_char, what: &str) -> Result<()> {
        if status != 0 {
            bail!(
                "rank {}: {what} failed: {}",
                self.rank,
                first_line(&crate::take_error(err))
            );
        }
        Ok(())
    }

    /// In place: `t` becomes the sum of every rank's `t` (same shape and dtype on every rank).
    pub fn all_reduce_sum(&self, t: &Tensor) -> Result<()> {
        self.usable("all_reduce")?;
        let mut err = std::ptr::null_mut();
        // SAFETY: t outlives the call; the C++ side reduces into its storage.
        let status = unsafe { temper_comm_all_reduce(self.ptr, t.as_ptr() as _, &mut err) };
        self.check(status, err, "all_reduce")
    }

    /// In place: `t` becomes rank `root`'s `t`.
    pub fn broadcast(&self, t: &Tensor, root: usize) -> Result<()> {
        self.usable("broadcast")?;
        let mut err = std::ptr::null_mut();
        // SAFETY: as above.
        let status =
            unsafe { temper_comm_broadcast(self.ptr, t.as_ptr() as _, root as c_int, &mut err) };
        self.check(status, err, "broadcast")
    }

    /// [`Comm::broadcast`], unless `give_up` turns true first (set by another thread that learnt
    /// that a peer will not take part, such as a server that refused a weight push): then
    /// `Ok(false)`, and the group can no longer be used (every later collective fails; it is not
    /// freed when dropped, as freeing would wait for the broadcast left pending).
    pub fn broadcast_unless(&self, t: &Tensor, root: usize, give_up: &AtomicBool) -> Result<bool> {
        self.usable("broadcast")?;
        let mut err = std::ptr::null_mut();
        // SAFETY: t and give_up outlive the call; the C++ side reads give_up atomically.
        let status = unsafe {
            temper_comm_broadcast_unless(
                self.ptr,
                t.as_ptr() as _,
                root as c_int,
                give_up.as_ptr() as *const bool,
                &mut err,
            )
        };
        if status == 2 {
            self.abandoned.store(true, Ordering::SeqCst);
            return Ok(false);
        }
        self.check(status, err, "broadcast").map(|()| true)
    }

    /// Every rank's `t` (same shape everywhere), stacked along a new first dimension in rank order.
    pub fn all_gather(&self, t: &Tensor) -> Result<Tensor> {
        self.usable("all_gather")?;
        let (mut out, mut err) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: as above; on success out is a heap-allocated at::Tensor that tch then owns.
        let status =
            unsafe { temper_comm_all_gather(self.ptr, t.as_ptr() as _, &mut out, &mut err) };
        self.check(status, err, "all_gather")?;
        Ok(unsafe { Tensor::from_ptr(out as _) })
    }

    /// In place: `out` (contiguous, `world` times `shard`'s elements, its dtype) becomes every
    /// rank's `shard` concatenated in rank order (`torch.distributed.all_gather_into_tensor`).
    pub fn all_gather_into(&self, shard: &Tensor, out: &Tensor) -> Result<()> {
        self.usable("all_gather_into")?;
        self.check_sizes("all_gather_into", out, shard, "out", "shard")?;
        let mut err = std::ptr::null_mut();
        // SAFETY: both tensors outlive the call; the C++ side gathers into out's storage.
        let status = unsafe {
            temper_comm_all_gather_into(self.ptr, shard.as_ptr() as _, out.as_ptr() as _, &mut err)
        };
        self.check(status, err, "all_gather_into")
    }

    /// In place: `out` (contiguous, `input`'s elements over `world`, its dtype) becomes this
    /// rank's slice, in rank order, of the sum over ranks of `input`
    /// (`torch.distributed.reduce_scatter_tensor`, SUM).
    pub fn reduce_scatter_sum(&self, input: &Tensor, out: &Tensor) -> Result<()> {
        self.usable("reduce_scatter")?;
        self.check_sizes("reduce_scatter", input, out, "input", "out")?;
        let mut err = std::ptr::null_mut();
        // SAFETY: as above.
        let status = unsafe {
            temper_comm_reduce_scatter(self.ptr, input.as_ptr() as _, out.as_ptr() as _, &mut err)
        };
        self.check(status, err, "reduce_scatter")
    }

    /// `whole` must hold `world` times `part`'s elements, in its dtype.
    fn check_sizes(
        &self,
        what: &str,
        whole: &Tensor,
        part: &Tensor,
        whole_name: &str,
        part_name: &str,
    ) -> Result<()> {
        if whole.numel() != part.numel() * self.world || whole.kind() != part.kind() {
            bail!(
                "rank {}: {what}: {whole_name} has {} {:?} elements, {part_name} {} {:?}; {whole_name} \
                 needs world size ({}) times {part_name}'s, in its dtype",
                self.rank,
                whole.numel(),
                whole.kind(),
                part.numel(),
                part.kind(),
                self.world
            );
        }
        Ok(())
    }

    pub fn barrier(&self) -> Result<()> {
        self.usable("barrier")?;
        let mut err = std::ptr::null_mut();
        // SAFETY: as above.
        let status = unsafe { temper_comm_barrier(self.ptr, &mut err) };
        self.check(status, err, "barrier")
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        if *self.abandoned.get_mut() {
            // Left as it is: its pending collective never completes.
            return;
        }
        // SAFETY: ptr came from temper_comm_new and is freed once.
        unsafe { temper_comm_free(self.ptr) };
    }
}

/// c10d's messages carry a C++ backtrace after the first line, and gloo's start with its source
/// location (`[.../pair.cc:553] Connection closed by peer ...`).
fn first_line(s: &str) -> &str {
    let line = s.lines().next().unwrap_or(s);
    match (line.starts_with('['), line.find("] ")) {
        (true, Some(i)) => &line[i + 2..],
        _ => line,
    }
}
