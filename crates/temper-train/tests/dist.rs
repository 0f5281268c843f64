//! The data-parallel layer: torchrun's environment contract, sharding, and gradients summed over
//! two ranks (threads of this process on 127.0.0.1) in buckets, against the plain sum of each
//! rank's gradients; small buckets exercise the multi-bucket path, and a parameter the loss did not
//! reach still gets the other rank's gradient.
use std::collections::HashMap;

use tch::{Device, Kind, Tensor};
use temper_kernels::Backend;
use temper_train::dist::{rendezvous_from, Dist};

fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let m: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| m.get(k).cloned()
}

#[test]
fn the_launch_environment() {
    assert!(rendezvous_from(&env(&[])).unwrap().is_none());
    assert!(rendezvous_from(&env(&[("WORLD_SIZE", "1"), ("RANK", "0")]))
        .unwrap()
        .is_none());
    let r = rendezvous_from(&env(&[
        ("WORLD_SIZE", "4"),
        ("RANK", "3"),
        ("MASTER_ADDR", "10.0.0.5"),
        ("MASTER_PORT", "29511"),
        ("TORCHELASTIC_USE_AGENT_STORE", "True"),
    ]))
    .unwrap()
    .unwrap();
    assert_eq!((r.rank, r.world, r.port), (3, 4, 29511));
    assert_eq!(r.host, "10.0.0.5");
    assert!(r.store_is_external);
    // Slurm's names when torchrun's are absent.
    let r = rendezvous_from(&env(&[
        ("SLURM_NTASKS", "2"),
        ("SLURM_PROCID", "1"),
        ("MASTER_PORT", "29500"),
    ]))
    .unwrap()
    .unwrap();
    assert_eq!((r.rank, r.world, r.host.as_str()), (1, 2, "127.0.0.1"));
    assert!(!r.store_is_external);

    let err = |pairs: &[(&str, &str)]| rendezvous_from(&env(pairs)).unwrap_err().to_string();
    assert_eq!(
        err(&[("WORLD_SIZE", "2"), ("RANK", "1")]),
        "rank 1: WORLD_SIZE = 2 but MASTER_PORT is not set"
    );
    assert!(err(&[("WORLD_SIZE", "2"), ("RANK", "2")]).contains("RANK must be below WORLD_SIZE"));
    assert!(err(&[("WORLD_SIZE", "two")]).contains("WORLD_SIZE"));
    assert!(
        err(&[("WORLD_SIZE", "2"), ("RANK", "0"), ("MASTER_PORT", "70000")])
            .contains("not a TCP port")
    );
    // The backend: NCCL on the rank's LOCAL_RANK GPU when asked (or, by default, when this is a
    // CUDA build on a machine with GPUs), else Gloo.
    let two = [("WORLD_SIZE", "2"), ("RANK", "1"), ("MASTER_PORT", "29500")];
    let backend = |extra: &[(&str, &str)]| {
        let mut p = two.to_vec();
        p.extend_from_slice(extra);
        rendezvous_from(&env(&p)).unwrap().unwrap().backend
    };
    assert_eq!(backend(&[("TEMPER_DIST_BACKEND", "gloo")]), Backend::Gloo);
    assert_eq!(
        backend(&[("TEMPER_DIST_BACKEND", "nccl"), ("LOCAL_RANK", "3")]),
        Backend::Nccl { device: 3 }
    );
    if !tch::Cuda::is_available() {
        assert_eq!(backend(&[]), Backend::Gloo);
    }
    let mut p = two.to_vec();
    p.push(("TEMPER_DIST_BACKEND", "mpi"));
    assert!(err(&p).contains("TEMPER_DIST_BACKEND = \"mpi\""));
}

#[test]
fn shards_are_contiguous_and_must_divide() {
    let d = Dist::single();
    assert_eq!(d.shard(&[1, 2, 3], "prompts").unwrap(), &[1, 2, 3]);
    assert!(d.is_root());
}

/// Parameters of rank `rank` with gradients of a rank-dependent loss; on rank 1 the loss leaves the
/// last parameter untouched (no gradient).
fn params_with_grads(rank: usize) -> Vec<(String, Tensor)> {
    let shapes: [&[i64]; 4] = [&[3, 5], &[7], &[2, 2, 2], &[4]];
    let params: Vec<(String, Tensor)> = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let t = Tensor::arange(s.iter().product::<i64>(), (Kind::Float, Device::Cpu)).view(*s)
                * 0.1
                + i as f64;
            (format!("p{i}"), t.set_requires_grad(true))
        })
        .collect();
    let used = if rank == 1 { 3 } else { 4 };
    let loss = params[..used]
        .iter()
        .map(|(_, p)| (p * p * (rank as f64 + 1.0)).sum(Kind::Float))
        .fold(Tensor::zeros([], (Kind::Float, Device::Cpu)), |a, b| a + b);
    loss.backward();
    params
}

#[test]
fn gradients_are_summed_in_buckets() {
    let port = temper_testkit::free_port();
    let ranks: Vec<_> = (0..2)
        .map(|rank| {
            std::thread::spawn(move || {
                let comm = temper_testkit::gloo_comm(port, rank, 2);
                let dist = Dist::from_comm(comm);
                assert_eq!(dist.shard(&[10, 11, 12, 13], "rows").unwrap(), &[10 + 2 * rank as i32, 11 + 2 * rank as i32]);
                let e = dist.shard(&[1, 2, 3], "data.train_batch_size").unwrap_err().to_string();
                assert_eq!(
                    e,
                    format!("rank {rank}: data.train_batch_size = 3 is not divisible by the world size 2")
                );
                let params = params_with_grads(rank);
                // 40-byte buckets: 10 floats, so the 15-element tensor goes alone.
                dist.all_reduce_grads(&params, 40).unwrap();
                let mut values = [rank as f64 + 0.5, 2.0];
                dist.sum_f64(&mut values).unwrap();
                assert_eq!(values, [2.0, 4.0]);
                assert_eq!(
                    dist.gather_f64(&[rank as f64]).unwrap(),
                    vec![vec![0.0], vec![1.0]]
                );
                // A choice each rank made on its own (as `auto`'s measured dtype): rank 0's wins.
                let own = ["bf16", "f32"][rank].to_string();
                assert_eq!(dist.from_root(own).unwrap(), "bf16");
                params
            })
        })
        .collect();
    let results: Vec<Vec<(String, Tensor)>> =
        ranks.into_iter().map(|r| r.join().unwrap()).collect();
    // Reference: d/dp sum_r (r+1) p^2 over the ranks whose loss used p.
    for (i, (name, p)) in results[0].iter().enumerate() {
        let factor = if i == 3 { 2.0 * 1.0 } else { 2.0 * (1.0 + 2.0) };
        let want = p.detach() * factor;
        for r in &results {
            let got = r[i].1.grad();
            let d = f64::try_from((&got - &want).abs().max()).unwrap();
            assert!(d < 1e-6, "{name}: {d}");
        }
    }
}
