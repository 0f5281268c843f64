//! `temper check-dist --device cuda`: joins a process group and checks its three collectives on
//! tensors of the device: all_reduce (sum), broadcast and all_gather, every value compared with
//! what it must be, then times an all_reduce of `--mib` MiB. NCCL on CUDA, Gloo on CPU
//! (`TEMPER_DIST_BACKEND` overrides, as in training). Under torchrun or `temper train --nproc`'s
//! environment (`WORLD_SIZE` > 1) it joins that job; otherwise it makes a one-rank group on a
//! free loopback port, which still goes through c10d's store, the backend's init and every
//! collective (a machine with one GPU can check NCCL this way).
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use tch::{Device, Kind, Tensor};
use temper_kernels::{Backend, Comm, Rendezvous};

#[derive(clap::Args)]
pub struct Args {
    /// cpu (Gloo) or cuda / cuda:N (NCCL).
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Size of the timed all_reduce, in MiB of f32.
    #[arg(long, default_value_t = 64)]
    pub mib: i64,
    /// Timed all_reduce repetitions (after one untimed).
    #[arg(long, default_value_t = 5)]
    pub repeats: usize,
}

pub fn run(args: Args) -> Result<()> {
    if args.mib <= 0 || args.mib > 4096 || args.repeats == 0 {
        bail!("--mib must be in 1..=4096 and --repeats positive");
    }
    let device = super::bench_train::device_of(&args.device)?;
    let rendezvous = match temper_train::dist::rendezvous_from(&|k| std::env::var(k).ok())? {
        Some(r) => r,
        None => one_rank(device)?,
    };
    let backend = match rendezvous.backend {
        Backend::Gloo => "gloo".to_string(),
        Backend::Nccl { device } => format!("nccl (cuda:{device})"),
    };
    let started = Instant::now();
    let comm = Comm::connect(&rendezvous)?;
    let (rank, world) = (comm.rank(), comm.world());
    println!(
        "rank {rank}/{world}: joined a {backend} group in {:.2} s; tensors on {device:?}",
        started.elapsed().as_secs_f64()
    );
    let opts = (Kind::Float, device);
    let w = world as f64;

    // all_reduce: rank r contributes r + 1 everywhere; the sum is w (w + 1) / 2.
    let t = Tensor::full([1000], rank as f64 + 1.0, opts);
    comm.all_reduce_sum(&t)?;
    expect_all(&t, w * (w + 1.0) / 2.0, "all_reduce")?;
    // broadcast from rank 0: every rank ends with rank 0's 7.
    let t = Tensor::full([1000], rank as f64 + 7.0, opts);
    comm.broadcast(&t, 0)?;
    expect_all(&t, 7.0, "broadcast")?;
    // all_gather: row r of the result is rank r's tensor (filled with r).
    let t = Tensor::full([16], rank as f64, opts);
    let gathered = comm.all_gather(&t)?;
    if gathered.size() != [world as i64, 16] {
        bail!(
            "all_gather: shape {:?}, expected [{world}, 16]",
            gathered.size()
        );
    }
    for r in 0..world {
        expect_all(&gathered.get(r as i64), r as f64, "all_gather")?;
    }
    comm.barrier()?;
    println!("all_reduce, broadcast, all_gather: every value as expected");

    let numel = args.mib * (1 << 20) / 4;
    let big = Tensor::ones([numel], opts);
    comm.all_reduce_sum(&big)?;
    synchronize(device);
    let start = Instant::now();
    for _ in 0..args.repeats {
        comm.all_reduce_sum(&big)?;
    }
    synchronize(device);
    let secs = start.elapsed().as_secs_f64() / args.repeats as f64;
    // After 1 + repeats sums of ones: w^(1 + repeats), exact in f32 for these sizes.
    expect_all(
        &big.narrow(0, 0, 1000),
        w.powi(1 + args.repeats as i32),
        "the timed all_reduce",
    )?;
    if world == 1 {
        // One rank has nothing to send: the time is the call's overhead, not a bandwidth.
        println!(
            "all_reduce of {} MiB f32 on one rank: {:.3} ms (no transfer)",
            args.mib,
            secs * 1e3
        );
    } else {
        // NCCL's bus bandwidth convention for all_reduce: bytes x 2 (w - 1) / w / time.
        let bytes = (numel * 4) as f64;
        println!(
            "all_reduce of {} MiB f32: {:.3} ms, {:.1} GB/s bus bandwidth",
            args.mib,
            secs * 1e3,
            bytes * 2.0 * (w - 1.0) / w / secs / 1e9
        );
    }
    println!("ok");
    Ok(())
}

/// A group of one on a free loopback port, its transport chosen as training chooses it (NCCL for
/// a CUDA device, else Gloo, unless `TEMPER_DIST_BACKEND` says otherwise).
fn one_rank(device: Device) -> Result<Rendezvous> {
    let (local, on_cuda) = match device {
        Device::Cuda(i) => (i, temper_kernels::nccl_available()),
        _ => (0, false),
    };
    let backend = temper_train::dist::backend_from(&|k| std::env::var(k).ok(), 0, local, on_cuda)?;
    Ok(Rendezvous {
        host: "127.0.0.1".into(),
        port: super::launch::free_port()?,
        rank: 0,
        world: 1,
        store_is_external: false,
        timeout: Duration::from_secs(60),
        backend,
    })
}

fn expect_all(t: &Tensor, want: f64, what: &str) -> Result<()> {
    let t = t.to_device(Device::Cpu).to_kind(Kind::Double);
    let (lo, hi) = (t.min().double_value(&[]), t.max().double_value(&[]));
    if lo != want || hi != want {
        bail!("{what}: values in [{lo}, {hi}], expected {want} everywhere");
    }
    Ok(())
}

fn synchronize(device: Device) {
    if let Device::Cuda(i) = device {
        tch::Cuda::synchronize(i as i64);
    }
}
