//! Data-parallel training over c10d/Gloo: two ranks (threads of this process, each with its own
//! Trainer, on 127.0.0.1) against one rank with the same global batch, on the tiny model, 3 steps:
//! the same rollouts, the same per-step metrics and the same weights. Then the 2-rank run is
//! resumed by one rank, and a rank that goes away makes the other fail with a message naming it.
mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{tiny_config, weights, AsciiFraction};
use temper_kernels::{Comm, Rendezvous};
use temper_train::dist::Dist;
use temper_train::trainer::Trainer;

type Weights = Vec<(String, tch::Tensor)>;

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

fn connect(port: u16, rank: usize, world: usize) -> Dist {
    Dist::from_comm(
        Comm::connect(&Rendezvous {
            host: "127.0.0.1".into(),
            port,
            rank,
            world,
            store_is_external: false,
            timeout: Duration::from_secs(60),
            backend: temper_kernels::Backend::Gloo,
        })
        .unwrap(),
    )
}

const EXTRA: [&str; 2] = ["trainer.total_training_steps=3", "trainer.save_freq=3"];

/// (run folder of rank 0, final weights of every rank).
fn run(world: usize, root: &Path) -> (PathBuf, Vec<Weights>) {
    run_with(world, root, &[], false)
}

/// A reward that is 1 when the completion starts with an ASCII character: often equal across a
/// group, so DAPO's filter has groups to drop.
struct FirstCharAscii;
impl temper_reward::Reward for FirstCharAscii {
    fn name(&self) -> &str {
        "first_char_ascii"
    }
    fn score(
        &self,
        _: &str,
        c: &str,
        _: &str,
        _: &serde_json::Value,
    ) -> temper_reward::RewardOutput {
        temper_reward::RewardOutput::new(c.chars().next().is_some_and(|x| x.is_ascii()) as u8 as f64)
    }
}

fn run_with(world: usize, root: &Path, extra: &[&str], binary: bool) -> (PathBuf, Vec<Weights>) {
    let extra: Vec<String> = EXTRA.iter().chain(extra).map(|s| s.to_string()).collect();
    let port = free_port();
    let handles: Vec<_> = (0..world)
        .map(|rank| {
            let root = root.to_path_buf();
            let extra = extra.clone();
            std::thread::spawn(move || {
                let dist = if world == 1 {
                    Dist::single()
                } else {
                    connect(port, rank, world)
                };
                let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
                let mut t =
                    Trainer::create_with(tiny_config(&root, &extra), "dp", &[], dist).unwrap();
                t.reward = if binary {
                    Box::new(FirstCharAscii)
                } else {
                    Box::new(AsciiFraction)
                };
                t.fit().unwrap();
                (t.run.root.clone(), weights(&t))
            })
        })
        .collect();
    let results: Vec<(PathBuf, Weights)> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let folder = results[0].0.clone();
    (folder, results.into_iter().map(|r| r.1).collect())
}

fn metrics(folder: &Path) -> Vec<BTreeMap<String, serde_json::Value>> {
    temper_train::rundir::RunDir::new(folder)
        .read_metrics()
        .unwrap()
}

fn rel_diff(a: &Weights, b: &Weights) -> f64 {
    let (mut d, mut n) = (0.0, 0.0);
    for ((na, x), (nb, y)) in a.iter().zip(b) {
        assert_eq!(na, nb);
        d += f64::try_from((x - y).square().sum(tch::Kind::Double)).unwrap();
        n += f64::try_from(x.square().sum(tch::Kind::Double)).unwrap();
    }
    (d / n).sqrt()
}

#[test]
fn two_ranks_train_like_one() {
    let (one_dir, one) = run(1, &common::temp_dir("dp-one"));
    let (two_dir, two) = run(2, &common::temp_dir("dp-two"));
    // Both ranks end with the same weights, equal to the 1-rank run's.
    assert_eq!(rel_diff(&two[0], &two[1]), 0.0);
    let rel = rel_diff(&one[0], &two[0]);
    assert!(rel <= 1e-5, "weights differ by {rel:e} (relative)");
    // The same rollouts, token for token, at every step.
    for step in 1..=3 {
        let read = |d: &Path| -> Vec<serde_json::Value> {
            std::fs::read_to_string(d.join(format!("rollouts/step_{step}.jsonl")))
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect()
        };
        let (a, b) = (read(&one_dir), read(&two_dir));
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(x["completion_ids"], y["completion_ids"], "step {step}");
            assert_eq!(x["prompt_ids"], y["prompt_ids"], "step {step}");
        }
    }
    same_metrics(&one_dir, &two_dir);
    // One checkpoint, written by rank 0; a 2-rank run resumes with one rank.
    let ckpts: Vec<_> = std::fs::read_dir(two_dir.join("checkpoints"))
        .unwrap()
        .collect();
    assert_eq!(ckpts.len(), 1);
    let mut t = Trainer::resume_with(
        &two_dir,
        &["trainer.total_training_steps=4".into()],
        Dist::single(),
    )
    .unwrap();
    t.reward = Box::new(AsciiFraction);
    t.fit().unwrap();
    assert_eq!(metrics(&two_dir).len(), 4);
}

/// The metrics of two runs agree (timings aside).
fn same_metrics(one: &Path, two: &Path) {
    let (ma, mb) = (metrics(one), metrics(two));
    assert_eq!(ma.len(), mb.len());
    for (a, b) in ma.iter().zip(&mb) {
        for (k, va) in a {
            if k.starts_with("timing_s/") || k.starts_with("perf/") {
                continue;
            }
            let vb = b
                .get(k)
                .unwrap_or_else(|| panic!("{k} missing in the 2-rank run"));
            match (va.as_f64(), vb.as_f64()) {
                (Some(x), Some(y)) => assert!(
                    (x - y).abs() <= 1e-6 * x.abs().max(1.0),
                    "{k}: {x} (1 rank) vs {y} (2 ranks)"
                ),
                _ => assert_eq!(va, vb, "{k}"),
            }
        }
    }
}

#[test]
fn dapo_filtering_and_sharded_evaluation_run_data_parallel_like_one_rank() {
    let extra = [
        "algorithm.filter_groups.enable=true",
        "algorithm.filter_groups.max_num_gen_batches=3",
        "trainer.test_freq=1",
        "eval.n=2",
    ];
    let (one_dir, one) = run_with(1, &common::temp_dir("dp-dapo-one"), &extra, true);
    let (two_dir, two) = run_with(2, &common::temp_dir("dp-dapo-two"), &extra, true);
    assert_eq!(rel_diff(&two[0], &two[1]), 0.0);
    let rel = rel_diff(&one[0], &two[0]);
    assert!(rel <= 1e-5, "weights differ by {rel:e} (relative)");
    same_metrics(&one_dir, &two_dir);
    let m = metrics(&one_dir);
    assert!(
        m.iter()
            .any(|s| s.get("batch/zero_adv_groups").and_then(|v| v.as_f64()) > Some(0.0)),
        "the filter dropped groups"
    );
    assert!(m.iter().any(|s| s.contains_key("val/accuracy")));
    // One evaluation file per evaluation, written by rank 0, equal to the 1-rank one.
    let eval = |d: &Path| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(d.join("eval/step_3.json")).unwrap()).unwrap()
    };
    assert_eq!(eval(&one_dir)["records"], eval(&two_dir)["records"]);
}

#[test]
fn a_rank_that_goes_away_stops_the_other_with_a_message() {
    let port = free_port();
    let root = common::temp_dir("dp-gone");
    let gone = std::thread::spawn(move || {
        // Joins, then leaves before the first step's collective.
        drop(connect(port, 1, 2));
    });
    let dist = connect(port, 0, 2);
    gone.join().unwrap();
    // Found missing at the config check or at the first step's gather, whichever comes first.
    let e = Trainer::create_with(tiny_config(&root, &EXTRA), "dp", &[], dist)
        .and_then(|mut t| {
            t.reward = Box::new(AsciiFraction);
            t.fit()
        })
        .map(|_| ())
        .unwrap_err();
    let e = format!("{e:#}");
    assert!(e.starts_with("rank 0: all_gather failed: "), "{e}");
    assert!(e.contains("Connection closed by peer"), "{e}");
}

#[test]
fn ranks_with_different_configs_are_refused_on_every_rank() {
    let port = free_port();
    let handles: Vec<_> = (0..2)
        .map(|rank| {
            std::thread::spawn(move || {
                let root = common::temp_dir("dp-mismatch");
                let lr = format!("actor.optim.lr={}", if rank == 0 { 1e-2 } else { 1e-3 });
                let cfg = tiny_config(&root, &[lr.as_str()]);
                match Trainer::create_with(cfg, "dp", &[], connect(port, rank, 2)) {
                    Ok(_) => panic!("rank {rank} started with a different config"),
                    Err(e) => format!("{e:#}"),
                }
            })
        })
        .collect();
    for (rank, h) in handles.into_iter().enumerate() {
        let e = h.join().unwrap();
        assert!(
            e.starts_with(&format!("rank {rank}: the ranks' configs differ (rank 1's")),
            "{e}"
        );
    }
}

#[test]
fn a_world_size_that_does_not_divide_the_batch_is_refused() {
    let cfg = tiny_config(
        &common::temp_dir("dp-div"),
        &["data.train_batch_size=3", "actor.ppo_mini_batch_size=3"],
    );
    let e = format!("{:#}", cfg.check_world_size(2).unwrap_err());
    assert_eq!(
        e,
        "data.train_batch_size = 3 is not divisible by the world size 2"
    );
}
