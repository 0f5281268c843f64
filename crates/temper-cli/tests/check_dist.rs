//! `temper check-dist` over Gloo on CPU: a one-rank group, and two processes joined the torchrun
//! way (WORLD_SIZE, RANK, MASTER_PORT), each checking every value of all_reduce, broadcast and
//! all_gather against what two ranks must produce. On a GPU machine the same command checks NCCL
//! (`scripts/gpu-check.sh`).
use std::process::{Command, Output};

fn check_dist(env: &[(&str, String)]) -> std::process::Child {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_temper"));
    cmd.args([
        "check-dist",
        "--device",
        "cpu",
        "--mib",
        "1",
        "--repeats",
        "2",
    ])
    .env_remove("RANK")
    .env_remove("WORLD_SIZE")
    .env_remove("LOCAL_RANK")
    .env_remove("TEMPER_DIST_BACKEND")
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().unwrap()
}

fn passed(out: &Output) -> String {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "check-dist failed:\n{text}");
    assert!(
        text.contains("every value as expected") && text.lines().any(|l| l == "ok"),
        "{text}"
    );
    text
}

#[test]
fn collectives_are_checked_on_one_and_two_ranks() {
    if !temper_kernels::comm_available() {
        eprintln!("skipped: this build has no c10d");
        return;
    }
    let one = passed(&check_dist(&[]).wait_with_output().unwrap());
    assert!(one.contains("rank 0/1: joined a gloo group"), "{one}");
    assert!(one.contains("no transfer"), "{one}");

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string();
    let ranks: Vec<_> = (0..2)
        .map(|rank| {
            check_dist(&[
                ("WORLD_SIZE", "2".into()),
                ("RANK", rank.to_string()),
                ("LOCAL_RANK", rank.to_string()),
                ("MASTER_ADDR", "127.0.0.1".into()),
                ("MASTER_PORT", port.clone()),
                ("TEMPER_DIST_TIMEOUT", "60".into()),
            ])
        })
        .collect();
    for (rank, child) in ranks.into_iter().enumerate() {
        let text = passed(&child.wait_with_output().unwrap());
        assert!(
            text.contains(&format!("rank {rank}/2: joined a gloo group")),
            "{text}"
        );
        assert!(text.contains("GB/s bus bandwidth"), "{text}");
    }
}
