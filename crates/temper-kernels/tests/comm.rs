//! c10d through temper's shim: two ranks (threads of this process, each its own TCPStore client
//! and Gloo group on 127.0.0.1) run all_reduce, broadcast and all_gather and get what
//! torch.distributed defines; a rank whose peer never comes fails with an error naming it instead
//! of hanging.
use std::time::Duration;

use tch::{Device, Kind, Tensor};
use temper_kernels::{comm_available, Comm, Rendezvous};

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

fn rendezvous(port: u16, rank: usize, world: usize, secs: u64) -> Rendezvous {
    Rendezvous {
        host: "127.0.0.1".into(),
        port,
        rank,
        world,
        store_is_external: false,
        timeout: Duration::from_secs(secs),
        backend: temper_kernels::Backend::Gloo,
    }
}

#[test]
fn two_ranks_reduce_broadcast_and_gather() {
    assert!(
        comm_available(),
        "temper-kernels was built without c10d: scripts/setup-env.sh installs the gloo headers"
    );
    let port = free_port();
    let ranks: Vec<_> = (0..2)
        .map(|rank| {
            std::thread::spawn(move || {
                let c = Comm::connect(&rendezvous(port, rank, 2, 60)).unwrap();
                assert_eq!((c.rank(), c.world()), (rank, 2));
                let opts = (Kind::Float, Device::Cpu);
                // all_reduce: sum of [1, 10, 100] * (r + 1) over ranks r = 0, 1.
                let t = Tensor::from_slice(&[1.0f32, 10.0, 100.0]) * (rank as f64 + 1.0);
                c.all_reduce_sum(&t).unwrap();
                let got: Vec<f32> = Vec::try_from(&t).unwrap();
                assert_eq!(got, vec![3.0, 30.0, 300.0]);
                // f64 too (metrics are reduced in f64).
                let d = Tensor::from_slice(&[0.1f64 * (rank as f64 + 1.0)]);
                c.all_reduce_sum(&d).unwrap();
                assert!((d.double_value(&[0]) - 0.3).abs() < 1e-15);
                // broadcast from rank 1.
                let b = Tensor::full([2, 2], rank as f64 + 5.0, opts);
                c.broadcast(&b, 1).unwrap();
                assert_eq!(Vec::<f32>::try_from(b.view([-1])).unwrap(), vec![6.0; 4]);
                // all_gather in rank order.
                let g = c
                    .all_gather(&Tensor::from_slice(&[rank as i64, 7]))
                    .unwrap();
                assert_eq!(g.size(), [2, 2]);
                assert_eq!(
                    Vec::<i64>::try_from(g.view([-1])).unwrap(),
                    vec![0, 7, 1, 7]
                );
                c.barrier().unwrap();
            })
        })
        .collect();
    for r in ranks {
        r.join().unwrap();
    }
}

#[test]
fn a_missing_rank_is_an_error_not_a_hang() {
    if !comm_available() {
        return;
    }
    let port = free_port();
    let t = std::time::Instant::now();
    let e = match Comm::connect(&rendezvous(port, 0, 2, 3)) {
        Ok(_) => panic!("joined a 2-rank group alone"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.starts_with("rank 0: cannot join the process group at 127.0.0.1:"),
        "{e}"
    );
    assert!(
        t.elapsed() < Duration::from_secs(60),
        "took {:?}",
        t.elapsed()
    );
    assert!(!e.contains('\n'), "one line: {e}");
    eprintln!("{e}");
}

#[test]
fn a_rank_outside_the_world_is_refused() {
    let e = Comm::connect(&rendezvous(1, 2, 2, 1))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("rank 2") || e.contains("without c10d"), "{e}");
}

#[test]
fn nccl_on_a_build_without_it_is_a_one_line_error() {
    if temper_kernels::nccl_available() {
        return; // a CUDA build: scripts/gpu-check.sh runs NCCL for real
    }
    let r = Rendezvous {
        backend: temper_kernels::Backend::Nccl { device: 0 },
        ..rendezvous(free_port(), 1, 2, 5)
    };
    let e = format!("{:#}", Comm::connect(&r).err().unwrap());
    assert!(
        e.starts_with("rank 1: NCCL was requested but this temper was built without it")
            && !e.contains('\n'),
        "{e}"
    );
}

/// The two collectives sharded training moves weights and gradients with, on three ranks (an odd
/// world size, so the rank order shows): all_gather_into_tensor and reduce_scatter_tensor (SUM),
/// in f32 and bf16; and a wrong size is a one-line error naming the tensors, before any send.
#[test]
fn three_ranks_gather_into_one_tensor_and_reduce_scatter() {
    if !comm_available() {
        return;
    }
    let port = free_port();
    let ranks: Vec<_> = (0..3)
        .map(|rank| {
            std::thread::spawn(move || {
                let c = Comm::connect(&rendezvous(port, rank, 3, 60)).unwrap();
                for kind in [Kind::Float, Kind::BFloat16] {
                    let opts = (kind, Device::Cpu);
                    // Rank r's shard: [10r, 10r + 1].
                    let shard = Tensor::from_slice(&[10.0 * rank as f32, 10.0 * rank as f32 + 1.0])
                        .to_kind(kind);
                    let whole = Tensor::zeros([3, 2], opts);
                    c.all_gather_into(&shard, &whole).unwrap();
                    let got: Vec<f32> =
                        Vec::try_from(whole.view([-1]).to_kind(Kind::Float)).unwrap();
                    assert_eq!(got, vec![0.0, 1.0, 10.0, 11.0, 20.0, 21.0]);
                    // Every rank sends [0, 1, ..., 5] * (r + 1): the sum is [0..6] * 6, and rank r
                    // keeps elements 2r and 2r + 1.
                    let input = Tensor::arange(6, opts) * (rank as f64 + 1.0);
                    let mine = Tensor::zeros([2], opts);
                    c.reduce_scatter_sum(&input, &mine).unwrap();
                    let got: Vec<f32> = Vec::try_from(mine.to_kind(Kind::Float)).unwrap();
                    let r = rank as f32;
                    assert_eq!(got, vec![6.0 * 2.0 * r, 6.0 * (2.0 * r + 1.0)]);
                }
                let shard = Tensor::zeros([2], (Kind::Float, Device::Cpu));
                let e = c
                    .all_gather_into(&shard, &Tensor::zeros([5], (Kind::Float, Device::Cpu)))
                    .unwrap_err()
                    .to_string();
                assert!(
                    e.contains("out has 5") && e.contains("world size (3)"),
                    "{e}"
                );
                c.barrier().unwrap();
            })
        })
        .collect();
    for r in ranks {
        r.join().unwrap();
    }
}

/// `TEMPER_DIST_TIMEOUT`: unset is 300 s; a whole number of seconds >= 1 is taken (spaces
/// trimmed); anything else is an error naming the variable.
#[test]
fn the_collective_timeout_is_read_or_refused() {
    use std::time::Duration;
    use temper_kernels::collective_timeout;
    assert_eq!(collective_timeout(None).unwrap(), Duration::from_secs(300));
    assert_eq!(
        collective_timeout(Some(" 5 ")).unwrap(),
        Duration::from_secs(5)
    );
    for bad in ["0", "-3", "1.5", "soon"] {
        let e = collective_timeout(Some(bad)).unwrap_err().to_string();
        assert!(e.starts_with("TEMPER_DIST_TIMEOUT = "), "{e}");
    }
}
