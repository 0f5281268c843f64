//! Data parallelism over torch.distributed's c10d ([`temper_kernels::Comm`]): who this process is
//! (torchrun's environment), and the three places a data-parallel step communicates: sharding the
//! prompts, summing gradients (and the token counts the loss divides by), reducing metrics. World
//! size 1 is the no-op case and never touches c10d.

use anyhow::{bail, Context, Result};
use tch::Tensor;
use temper_kernels::{Backend, Comm, Rendezvous};

/// This process's place in the job.
pub struct Dist {
    /// Behind a lock so that a `Dist` can be shared (a sharded optimizer's layers gather and
    /// reduce from inside the model); one thread uses it at a time.
    comm: Option<std::sync::Mutex<Comm>>,
    pub rank: usize,
    pub world: usize,
}

impl Dist {
    /// One process, no communication.
    pub fn single() -> Dist {
        Dist {
            comm: None,
            rank: 0,
            world: 1,
        }
    }

    /// From the launch environment (torchrun, `temper train --nproc`, Slurm); a world of one
    /// when none is set.
    pub fn from_env() -> Result<Dist> {
        match rendezvous_from(&|k| std::env::var(k).ok())? {
            None => Ok(Dist::single()),
            Some(r) => {
                // Before the process group starts its worker threads.
                temper_kernels::memory::use_one_malloc_arena();
                let comm = Comm::connect(&r)?;
                Ok(Dist {
                    rank: r.rank,
                    world: r.world,
                    comm: Some(std::sync::Mutex::new(comm)),
                })
            }
        }
    }

    /// A joined group (tests make one per thread).
    pub fn from_comm(comm: Comm) -> Dist {
        Dist {
            rank: comm.rank(),
            world: comm.world(),
            comm: Some(std::sync::Mutex::new(comm)),
        }
    }

    /// The process group, when there are other ranks.
    fn comm(&self) -> Option<std::sync::MutexGuard<'_, Comm>> {
        // A panic while it was held poisons nothing it keeps: the group itself reports errors.
        self.comm
            .as_ref()
            .map(|m| m.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Rank 0 owns the run folder, the checkpoints and the console.
    pub fn is_root(&self) -> bool {
        self.rank == 0
    }

    /// This rank's contiguous share of `items` (`what` names them in the error when the world
    /// size does not divide their number).
    pub fn shard<'a, T>(&self, items: &'a [T], what: &str) -> Result<&'a [T]> {
        if !items.len().is_multiple_of(self.world) {
            bail!(
                "rank {}: {what} = {} is not divisible by the world size {}",
                self.rank,
                items.len(),
                self.world
            );
        }
        let k = items.len() / self.world;
        Ok(&items[self.rank * k..(self.rank + 1) * k])
    }

    /// Sum every parameter's gradient over the ranks, in place, packing gradients of one dtype
    /// into flat buckets of at most `bucket_bytes` (one collective per bucket rather than per
    /// tensor, as DDP does). The loss must already be normalised globally (token counts summed
    /// over the ranks, [`Dist::sum_f64`]), so that the sum is the full batch's gradient.
    pub fn all_reduce_grads(&self, params: &[(String, Tensor)], bucket_bytes: usize) -> Result<()> {
        let Some(comm) = self.comm() else {
            return Ok(());
        };
        // A parameter the loss did not reach has no gradient yet: give it zeros, so every rank
        // sends the same layout.
        temper_kernels::zero_grads_if_missing(params)?;
        let grads: Vec<Tensor> = params.iter().map(|(_, p)| p.grad()).collect();
        let mut start = 0;
        while start < grads.len() {
            let kind = grads[start].kind();
            let (mut end, mut bytes) = (start, 0usize);
            while end < grads.len()
                && grads[end].kind() == kind
                && (end == start || bytes + nbytes(&grads[end]) <= bucket_bytes)
            {
                bytes += nbytes(&grads[end]);
                end += 1;
            }
            let flat = Tensor::cat(
                &grads[start..end]
                    .iter()
                    .map(|g| g.reshape([-1]))
                    .collect::<Vec<_>>(),
                0,
            );
            comm.all_reduce_sum(&flat)
                .context("summing gradients over the ranks")?;
            let mut offset = 0;
            for g in &grads[start..end] {
                let n = g.numel() as i64;
                let part = flat.narrow(0, offset, n).view(g.size().as_slice());
                // `g` shares storage with the parameter's gradient.
                tch::no_grad(|| g.shallow_clone().copy_(&part));
                offset += n;
            }
            start = end;
        }
        Ok(())
    }

    /// Element-wise sum over the ranks.
    pub fn sum_f64(&self, values: &mut [f64]) -> Result<()> {
        let Some(comm) = self.comm() else {
            return Ok(());
        };
        let t = Tensor::from_slice(values);
        comm.all_reduce_sum(&t)?;
        values.copy_from_slice(&Vec::<f64>::try_from(&t)?);
        Ok(())
    }

    /// In place: `t` becomes the sum of every rank's `t` (rows one rank computed and the others
    /// left at zero add up to the whole).
    pub fn sum_tensor(&self, t: &Tensor) -> Result<()> {
        match self.comm() {
            Some(c) => c.all_reduce_sum(t),
            None => Ok(()),
        }
    }

    /// In place: `out` (world times `shard`'s elements) becomes every rank's `shard` in rank
    /// order; a copy with one rank.
    pub fn all_gather_into(&self, shard: &Tensor, out: &Tensor) -> Result<()> {
        match self.comm() {
            Some(c) => c.all_gather_into(shard, out),
            None => {
                tch::no_grad(|| out.shallow_clone().copy_(shard));
                Ok(())
            }
        }
    }

    /// In place: `out` (`input`'s elements over the world size) becomes this rank's slice of the
    /// sum over ranks of `input`; a copy with one rank.
    pub fn reduce_scatter_sum(&self, input: &Tensor, out: &Tensor) -> Result<()> {
        match self.comm() {
            Some(c) => c.reduce_scatter_sum(input, out),
            None => {
                tch::no_grad(|| out.shallow_clone().copy_(input));
                Ok(())
            }
        }
    }

    /// Every rank's `values` (the same length everywhere), in rank order.
    pub fn gather_f64(&self, values: &[f64]) -> Result<Vec<Vec<f64>>> {
        let Some(comm) = self.comm() else {
            return Ok(vec![values.to_vec()]);
        };
        let g = comm.all_gather(&Tensor::from_slice(values))?;
        let flat = Vec::<f64>::try_from(g.reshape([-1]))?;
        Ok(flat
            .chunks(values.len().max(1))
            .map(<[f64]>::to_vec)
            .collect())
    }

    /// Every rank's `value`, in rank order (serialized as JSON, gathered as bytes: numbers
    /// round-trip exactly).
    pub fn all_gather_json<T: serde::Serialize + serde::de::DeserializeOwned>(
        &self,
        value: &T,
    ) -> Result<Vec<T>> {
        let bytes = serde_json::to_vec(value)?;
        if self.comm.is_none() {
            return Ok(vec![serde_json::from_slice(&bytes)?]);
        }
        let lens = self.gather_f64(&[bytes.len() as f64])?;
        let max = lens.iter().map(|l| l[0] as usize).max().unwrap_or(0);
        let mut padded = bytes;
        padded.resize(max, 0);
        let all = self
            .comm()
            .map(|c| c.all_gather(&Tensor::from_slice(&padded)))
            .context("a world of one gathers nothing")??;
        (0..self.world)
            .map(|r| {
                let row = Vec::<u8>::try_from(all.get(r as i64))?;
                let len = lens[r][0] as usize;
                serde_json::from_slice(&row[..len])
                    .with_context(|| format!("rank {}: data gathered from rank {r}", self.rank))
            })
            .collect()
    }

    /// Rank 0's `value` on every rank: for a choice each rank could make differently on its own
    /// (`model.dtype = "auto"` measures), so that they all make rank 0's.
    pub fn from_root<T: serde::Serialize + serde::de::DeserializeOwned>(
        &self,
        value: T,
    ) -> Result<T> {
        if self.comm.is_none() {
            return Ok(value);
        }
        Ok(self.all_gather_json(&value)?.swap_remove(0))
    }

    /// Fails on every rank, naming the first rank that differs, unless every rank passes the same
    /// `text` (e.g. the resolved config: ranks launched with different overrides must not train).
    pub fn check_same(&self, text: &str, what: &str) -> Result<()> {
        if self.world == 1 {
            return Ok(());
        }
        let all = self.all_gather_json(&text.to_string())?;
        if let Some(r) = all.iter().position(|t| t != &all[0]) {
            bail!(
                "rank {}: the ranks' {what}s differ (rank {r}'s is not rank 0's); start every rank with the \
                 same command",
                self.rank
            );
        }
        Ok(())
    }

    /// Wait for every rank (bounded by the timeout).
    pub fn barrier(&self) -> Result<()> {
        match self.comm() {
            Some(c) => c.barrier(),
            None => Ok(()),
        }
    }
}

fn nbytes(t: &Tensor) -> usize {
    t.numel() * t.kind().elt_size_in_bytes()
}

/// The transport `TEMPER_DIST_BACKEND` (gloo | nccl | auto) picks for `rank`, whose GPU is
/// `local`: auto is NCCL when `auto_nccl` (this build has NCCL and the rank works on CUDA), else
/// Gloo. An explicit `nccl` is NCCL whatever is present; joining then says what is missing.
pub fn backend_from(
    var: &dyn Fn(&str) -> Option<String>,
    rank: usize,
    local: usize,
    auto_nccl: bool,
) -> Result<Backend> {
    let nccl = Backend::Nccl { device: local };
    Ok(match var("TEMPER_DIST_BACKEND").as_deref().map(str::trim) {
        None | Some("") | Some("auto") if auto_nccl => nccl,
        None | Some("") | Some("auto") => Backend::Gloo,
        Some("gloo") => Backend::Gloo,
        Some("nccl") => nccl,
        Some(other) => {
            bail!("rank {rank}: TEMPER_DIST_BACKEND = {other:?}: expected gloo, nccl or auto")
        }
    })
}

/// The rendezvous torchrun (or `temper train --nproc`, or Slurm) describes in the environment;
/// `None` for a single process. `RANK`/`WORLD_SIZE` (else `SLURM_PROCID`/`SLURM_NTASKS`),
/// `MASTER_ADDR` (default 127.0.0.1), `MASTER_PORT`, `TORCHELASTIC_USE_AGENT_STORE`.
pub fn rendezvous_from(var: &dyn Fn(&str) -> Option<String>) -> Result<Option<Rendezvous>> {
    let num = |key: &str| -> Result<Option<usize>> {
        match var(key) {
            None => Ok(None),
            Some(v) => v
                .trim()
                .parse()
                .map(Some)
                .with_context(|| format!("environment variable {key} = {v:?} is not a number")),
        }
    };
    let world = match num("WORLD_SIZE")? {
        Some(w) => w,
        None => num("SLURM_NTASKS")?.unwrap_or(1),
    };
    let rank = match num("RANK")? {
        Some(r) => r,
        None => num("SLURM_PROCID")?.unwrap_or(0),
    };
    if world == 0 {
        bail!("WORLD_SIZE is 0");
    }
    if rank >= world {
        bail!("rank {rank}: RANK must be below WORLD_SIZE = {world}");
    }
    if world == 1 {
        return Ok(None);
    }
    let port = num("MASTER_PORT")?
        .with_context(|| format!("rank {rank}: WORLD_SIZE = {world} but MASTER_PORT is not set"))?;
    if port == 0 || port > u16::MAX as usize {
        bail!("rank {rank}: MASTER_PORT = {port} is not a TCP port");
    }
    let timeout = temper_kernels::collective_timeout(var("TEMPER_DIST_TIMEOUT").as_deref())?;
    // NCCL where CUDA is (the rank's GPU is its LOCAL_RANK, as torchrun sets it), else Gloo;
    // TEMPER_DIST_BACKEND = gloo | nccl chooses.
    let local = match num("LOCAL_RANK")? {
        Some(l) => l,
        None => num("SLURM_LOCALID")?.unwrap_or(rank),
    };
    let cuda_here = temper_kernels::nccl_available() && tch::Cuda::is_available();
    let backend = backend_from(var, rank, local, cuda_here)?;
    Ok(Some(Rendezvous {
        backend,
        host: var("MASTER_ADDR").unwrap_or_else(|| "127.0.0.1".into()),
        port: port as u16,
        rank,
        world,
        store_is_external: var("TORCHELASTIC_USE_AGENT_STORE")
            .is_some_and(|v| v.eq_ignore_ascii_case("true") || v == "1"),
        timeout,
    }))
}
